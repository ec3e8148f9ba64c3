/*
 * fuzz_loaders.c — libFuzzer target for the checkpoint parsers that read untrusted bytes:
 * safetensors headers, config.json, model.safetensors.index.json. The first input byte picks the
 * parser. Build and run with scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t which = data[0] % 3;
    data++, size--;
    if (which == 0) {
        st_file f;
        if (safetensors_parse(data, size, "fuzz", &f, NULL) == 0) safetensors_free(&f);
    } else if (which == 1) {
        model_config c;
        model_config_parse((const char *)data, size, "fuzz", &c, NULL);
    } else {
        char **shards;
        int n;
        if (checkpoint_index_parse((const char *)data, size, "fuzz", &shards, &n, NULL) == 0) {
            for (int i = 0; i < n; i++) free(shards[i]);
            free(shards);
        }
    }
    return 0;
}
