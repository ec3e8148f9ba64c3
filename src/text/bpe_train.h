/*
 * bpe_train.h — a small deterministic byte-level BPE trainer (for the built-in tokenizer that
 * make-model writes): split a corpus with a pre-tokenizer regex, count words, repeatedly merge the
 * most frequent adjacent pair (ties: lowest left id, then lowest right id).
 *
 * Not here: HF-compatible training (HF's trainer orders ties differently), unicode alphabets.
 * Threads: any; no shared state.
 */
#ifndef UM_BPE_TRAIN_H
#define UM_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct bpe_trained {
    int      n_tokens;        /* 256 byte tokens (id = byte value) + merged tokens */
    char   **token;           /* [n_tokens] byte-level strings (GPT-2 byte->char map), owned */
    int      n_merges;
    int32_t (*merge)[2];      /* [n_merges] (left id, right id); merge i makes a token listed in order */
} bpe_trained;

/* Split corpus[0..len) with split_regex, then learn up to max_merges merges (stopping early when
 * no pair occurs min_count times) into *out (caller frees with bpe_trained_free). The result is
 * a function of the inputs only. -1 + err when the regex does not compile or matches pathologically. */
int  bpe_train(const char *corpus, size_t len, const char *split_regex, int max_merges, int min_count,
               bpe_trained *out, um_err *err);
/* Free the token strings and merge list of a bpe_train() result (zeroed: freeing twice is safe). */
void bpe_trained_free(bpe_trained *t);

#endif /* UM_BPE_TRAIN_H */
