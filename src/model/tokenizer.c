/*
 * tokenizer.c — STUB until the tokenizer engine lands: reports "no tokenizer". The full API of
 * tokenizer.h is present so callers can link against it.
 */
#include "model/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int tokenizer_load_dir(const char *dir, tokenizer **out, um_err *err) {
    (void)dir;
    (void)err;
    *out = NULL;
    return 0;
}
int tokenizer_load_json(const char *buf, size_t len, const char *label, tokenizer **out, um_err *err) {
    (void)buf;
    (void)len;
    *out = NULL;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tokenizer not implemented yet", label);
}
void tokenizer_free(tokenizer *tok) { (void)tok; }
int tokenizer_n_vocab(const tokenizer *tok) { (void)tok; return 0; }
int tokenizer_token_id(const tokenizer *tok, const char *piece) {
    (void)tok;
    (void)piece;
    return -1;
}
int tokenizer_is_special(const tokenizer *tok, int id) { (void)tok; (void)id; return 0; }
const char *tokenizer_token_piece(const tokenizer *tok, int id) { (void)tok; (void)id; return NULL; }
const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int id, size_t *len) {
    (void)tok;
    (void)id;
    *len = 0;
    return NULL;
}
size_t tokenizer_max_token_bytes(const tokenizer *tok) { (void)tok; return 0; }
const char *tokenizer_config_token(const tokenizer *tok, const char *name) { (void)tok; (void)name; return NULL; }
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int parse_special, int32_t **ids,
                     size_t *n, um_err *err) {
    (void)tok, (void)text, (void)len, (void)parse_special;
    *ids = NULL;
    *n = 0;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "tokenizer not implemented yet");
}
void tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                      size_t *len) {
    (void)tok, (void)ids, (void)n, (void)skip_special;
    *text = xstrdup("");
    *len = 0;
}
void tok_stream_init(tok_stream *s, const tokenizer *tok, int skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
}
void tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len) {
    (void)s, (void)id;
    *text = "";
    *len = 0;
}
void tok_stream_flush(tok_stream *s, const char **text, size_t *len) {
    (void)s;
    *text = "";
    *len = 0;
}
void tok_stream_free(tok_stream *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}
int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err) {
    (void)dir;
    (void)err;
    sp->vocab_size = 0;
    return 0;
}
