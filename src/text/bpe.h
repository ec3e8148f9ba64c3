/*
 * bpe.h — the BPE model of a byte-level tokenizer: vocabulary (string <-> id), merge ranks, and
 * the merge loop that turns one pre-tokenized word into ids, plus a bounded word cache.
 *
 * Not here: added tokens, normalizers, pre-tokenizers, file parsing (tokenizer.c). The merge loop
 * reproduces HF tokenizers' `Word::merge_all` exactly: a min-heap of (rank, position, new id),
 * stale entries validated by the new id, O(n log n) per word.
 *
 * Threads: after bpe_finish() the model is read-only except the word cache, which has its own
 * mutex, and a per-thread cache of merge lookups (thread-specific data, freed at thread exit);
 * bpe_encode_word may run on any thread concurrently.
 */
#ifndef UM_BPE_H
#define UM_BPE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- string -> int map */

typedef struct strmap_entry {
    const char *key;          /* not owned: points into storage that outlives the map */
    uint32_t    len;
    uint32_t    hash;
    int32_t     val;
} strmap_entry;

typedef struct strmap {
    strmap_entry *slots;      /* open addressing, linear probing; key == NULL = empty */
    size_t        cap;        /* power of two */
    size_t        n;
} strmap;

/* Hash of s[0..len) for the map's slots (multiply-xor over 8-byte words; stable across runs). */
uint32_t strmap_hash(const char *s, size_t len);
/* An empty map sized for `expected` keys without regrowth. */
void     strmap_init(strmap *m, size_t expected);
/* Free the slot array (never the keys, which the map does not own). */
void     strmap_free(strmap *m);
/* Insert or overwrite key -> val (val >= 0); the key bytes are NOT copied and must outlive the
 * map. Grows as needed. Returns the previous value or -1. */
int32_t  strmap_put(strmap *m, const char *key, size_t len, int32_t val);
/* The value of key, or -1 when absent. Read-only: safe from any thread once filling is done. */
int32_t  strmap_get(const strmap *m, const char *key, size_t len);

/* ---------------------------------------------------------------- int32 vector */

typedef struct idvec {
    int32_t *v;
    size_t   n, cap;
} idvec;

/* Append one id / n ids, growing v (xrealloc: aborts on OOM). A zeroed idvec is empty; the caller
 * frees iv->v. */
void idvec_push(idvec *iv, int32_t id);
void idvec_append(idvec *iv, const int32_t *ids, size_t n);

/* ---------------------------------------------------------------- model */

typedef struct bpe_merge {
    uint64_t key;             /* (uint64)left << 32 | right; UINT64_MAX = empty slot */
    uint32_t rank;
    int32_t  id;              /* merged token */
} bpe_merge;

typedef struct bpe_pair {
    uint32_t rank;            /* UINT32_MAX = no merge */
    int32_t  id;
} bpe_pair;

typedef struct bpe_cache bpe_cache;

typedef struct bpe_model {
    int32_t   n_ids;          /* max model id + 1 */
    char    **piece;          /* [n_ids] vocabulary strings (owned), NULL for unused ids */
    uint32_t *piece_len;      /* [n_ids] bytes */
    strmap    vocab;          /* piece -> id */
    bpe_merge *merges;        /* hash table, cap_merges slots (power of two) */
    size_t    cap_merges, n_merges;
    int       byte_level;     /* initial symbols = bytes through the GPT-2 byte->char map */
    int32_t   byte_id[256];   /* byte_level: id of each byte's mapped character, -1 if absent */
    int       ignore_merges;  /* a word found whole in the vocabulary is one token */
    int32_t   unk_id;         /* -1: unknown characters are dropped (HF without unk_token) */
    int       fuse_unk;
    uint32_t  uid;            /* unique per model (tags thread-local pair-cache entries) */
    bpe_pair *byte_pairs;     /* byte_level with all 256 byte tokens: [a << 8 | b] merge of two bytes */
    bpe_cache *cache;
} bpe_model;

/* An empty model: no pieces, no merges, not byte-level, unk_id = -1. */
void bpe_init(bpe_model *b);
/* Free pieces, maps, merge tables and the word cache; b may be bpe_init'ed again. */
void bpe_free(bpe_model *b);
/* Set id -> piece (copied). Returns -1 if the id already has a different piece. */
int  bpe_add_piece(bpe_model *b, int32_t id, const char *piece, size_t len);
/* Add merge (left, right) -> merged at rank (its index in the merges list). A pair listed twice
 * keeps the later rank, as HF's HashMap collect does. */
void bpe_add_merge(bpe_model *b, int32_t left, int32_t right, int32_t merged, uint32_t rank);
/* Build derived tables (byte ids, cache). Call once after all pieces/merges are in. */
void bpe_finish(bpe_model *b);
/* Look up a merge: returns NULL when (left, right) has none. */
const bpe_merge *bpe_merge_get(const bpe_model *b, int32_t left, int32_t right);

/* Encode one pre-tokenized word (raw bytes; byte-level mapping applied inside) and append its ids
 * to out. Needs bpe_finish(); any thread (the word cache is locked inside). */
void bpe_encode_word(const bpe_model *b, const char *w, size_t len, idvec *out);

/* GPT-2 bytes_to_unicode: the code point byte b is shown as; and the inverse (-1 if none). */
uint32_t bpe_byte_to_cp(uint8_t b);
int      bpe_cp_to_byte(uint32_t cp);

#endif /* UM_BPE_H */
