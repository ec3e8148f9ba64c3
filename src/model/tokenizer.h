/*
 * tokenizer.h — text <-> token ids for the tokenizers real checkpoints ship (tokenizer.json, or
 * vocab.json + merges.txt). STUB: the tokenizer issue replaces this with the real engine; the
 * functions below are the contract model.c relies on.
 */
#ifndef UM_TOKENIZER_H
#define UM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct tokenizer tokenizer;

/* Load the tokenizer files found in dir. *out = NULL (and 0 returned) when the directory has none;
 * -1 with err when files exist but are malformed. */
int  tokenizer_load_dir(const char *dir, tokenizer **out, um_err *err);
void tokenizer_free(tokenizer *tok);
/* Id of a token given by its exact vocabulary string (added or regular), or -1. */
int  tokenizer_token_id(const tokenizer *tok, const char *piece);

/* Special-token ids of the built-in tokenizer that make-model writes. */
typedef struct tokenizer_special {
    int vocab_size;   /* total ids used by the tokenizer (0 = no built-in tokenizer available) */
    int bos, eos, eot, mask, pad;
} tokenizer_special;

/* Write the built-in byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json with the real
 * LLaDA-8B-Instruct chat template, special_tokens_map.json) into dir and report its special ids. */
int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err);

#endif /* UM_TOKENIZER_H */
