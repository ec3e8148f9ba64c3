/*
 * bpe_builtin.c — STUB: tokenizer_write_builtin() reports "no built-in tokenizer" until the
 * trainer lands.
 */
#include "model/tokenizer.h"

int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err) {
    (void)dir;
    (void)err;
    sp->vocab_size = 0;
    return 0;
}
