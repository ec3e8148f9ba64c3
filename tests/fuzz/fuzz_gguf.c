/*
 * fuzz_gguf.c — libFuzzer target for GGUF files: the reader (model/gguf.c) on the raw bytes, every
 * metadata value read back through the typed accessors, then — the bytes written to a file — serve's
 * check before listening (model_dir_check), the whole load of a model from it (model_load: config
 * from the metadata, tensor mapping, tokenizer, chat template, binding) and the tokenizer alone.
 * Nothing may crash, leak or read outside the buffer: a bad file is an error. Seeds:
 * tests/fuzz/corpus/fuzz_gguf/ (small files written by tests/reference/gguf_convert.py).
 * Build and run with scripts/fuzz.sh (FUZZ_ONLY=gguf).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void read_all_values(const gguf_file *f) {
    for (int i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        int64_t v;
        double x;
        int b;
        const char *s;
        uint64_t len;
        (void)gguf_kv_int(f, kv, INT64_MIN, INT64_MAX, &v, NULL);
        (void)gguf_kv_float(f, kv, &x, NULL);
        (void)gguf_kv_bool(f, kv, &b, NULL);
        (void)gguf_kv_str(f, kv, &s, &len, NULL);
        if (kv->type != GGUF_ARRAY) continue;
        for (uint64_t j = 0; j < kv->n && j < 64; j++) {
            if (kv->arr_type == GGUF_STRING) gguf_arr_str(kv, j, &s, &len);
            else if (kv->arr_type != GGUF_F32 && kv->arr_type != GGUF_F64 && kv->arr_type != GGUF_BOOL)
                (void)gguf_arr_int(kv, j);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz_gguf_%d.gguf", (int)getpid());
        log_level_set(LOG_LEVEL_ERROR);
    }
    gguf_file f;
    if (gguf_parse(data, size, "fuzz", &f, NULL) != 0) return 0;   /* the load would fail the same way */
    read_all_values(&f);
    gguf_free(&f);
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    const int ok = fwrite(data, 1, size, fp) == size;
    fclose(fp);
    if (ok) (void)model_dir_check(path, NULL);
    model m;
    if (ok && model_load(path, &m, NULL) == 0) model_free(&m);
    struct tokenizer *tok;
    struct chat_template *chat;
    if (ok && model_tokenizer_load(path, &tok, &chat, NULL) == 0) {
        tokenizer_free(tok);
        chat_template_free(chat);
    }
    return 0;
}
