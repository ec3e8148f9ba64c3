/*
 * fuzz_tokenizer_load.c — libFuzzer target: tokenizer_load_json on arbitrary bytes (a checkpoint's
 * tokenizer.json is untrusted input). A tokenizer that loads is then exercised: encode of a few
 * fixed strings (both parse_special modes), decode of every id, the incremental decoder.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"
#include "util/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    log_level_set(LOG_LEVEL_ERROR);
    tokenizer *tok = NULL;
    um_err err = {0};
    if (tokenizer_load_json((const char *)data, size, "fuzz", &tok, &err) != 0) {
        if (tok) abort(); /* failure leaves *out NULL */
        return 0;
    }
    if (!tok) abort();
    static const char *const texts[] = {"Hello, world! 123  \n\tx", "<|endoftext|>a<|eot_id|>", "h\xc3\xa9llo \xe4\xb8\xad",
                                        "", "    ", "'s 're 'll"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        for (int ps = 0; ps < 2; ps++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (tokenizer_encode(tok, texts[i], strlen(texts[i]), ps, &ids, &n, &err) == 0) {
                char *s = NULL;
                size_t len = 0;
                tokenizer_decode(tok, ids, n, 0, &s, &len);
                free(s);
            }
            free(ids);
        }
    int nv = tokenizer_n_vocab(tok);
    if (nv > 4096) nv = 4096;
    tok_stream st;
    tok_stream_init(&st, tok, 1);
    for (int id = -1; id <= nv; id++) {
        size_t bl;
        (void)tokenizer_token_piece(tok, id);
        (void)tokenizer_token_bytes(tok, id, &bl);
        (void)tokenizer_is_special(tok, id);
        const char *p;
        size_t pl;
        tok_stream_push(&st, id, &p, &pl);
    }
    const char *p;
    size_t pl;
    tok_stream_flush(&st, &p, &pl);
    tok_stream_free(&st);
    (void)tokenizer_config_token(tok, "eos_token");
    tokenizer_free(tok);
    return 0;
}
