/*
 * tokenizer.c — STUB until the tokenizer issue lands: reports "no tokenizer".
 */
#include "model/tokenizer.h"

#include <stddef.h>

#include "model/chat_template.h"

int tokenizer_load_dir(const char *dir, tokenizer **out, um_err *err) {
    (void)dir;
    (void)err;
    *out = NULL;
    return 0;
}
void tokenizer_free(tokenizer *tok) { (void)tok; }
int tokenizer_token_id(const tokenizer *tok, const char *piece) {
    (void)tok;
    (void)piece;
    return -1;
}
int chat_template_load_dir(const char *dir, const tokenizer *tok, chat_template **out, um_err *err) {
    (void)dir;
    (void)tok;
    (void)err;
    *out = NULL;
    return 0;
}
void chat_template_free(chat_template *t) { (void)t; }
int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err) {
    (void)dir;
    (void)err;
    sp->vocab_size = 0;
    return 0;
}
