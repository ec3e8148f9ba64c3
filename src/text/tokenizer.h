/*
 * tokenizer.h — text <-> token ids for the tokenizers real checkpoints ship: a Hugging Face
 * tokenizer.json (byte-level BPE: added tokens, NFC/Sequence normalizers, Split/ByteLevel
 * pre-tokenizers, BPE model, ByteLevel decoder) or GPT-2 style vocab.json + merges.txt (+ the
 * added tokens of added_tokens.json / tokenizer_config.json, NFC + Qwen2 regex as Dream does), or
 * the same byte-level BPE given as arrays (a GGUF file's tokenizer.ggml.* metadata: model/gguf_model.c).
 *
 * Not here: chat templates (chat_template.h), post-processors (templates that add BOS — callers
 * encode with "add_special_tokens=False" semantics, as the reference code does), other models
 * (WordPiece, Unigram), byte_fallback.
 *
 * Threads: a loaded tokenizer is immutable except for an internal, mutex-guarded word cache (and
 * a small per-thread cache of merge lookups, freed at thread exit), so every function below may be
 * called from any thread concurrently. A tok_stream belongs to one thread at a time.
 */
#ifndef UM_TOKENIZER_H
#define UM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct tokenizer tokenizer;

/* ---------------------------------------------------------------- loading */

/* Load the tokenizer files found in dir: tokenizer.json if present, else vocab.json + merges.txt
 * (+ added_tokens.json); tokenizer_config.json adds added_tokens_decoder entries and the
 * bos/eos/... token strings. *out = NULL (and 0 returned) when the directory has none;
 * -1 with err (UM_ERR_FORMAT / UM_ERR_UNSUPPORTED / UM_ERR_IO) when files exist but are bad. */
int  tokenizer_load_dir(const char *dir, tokenizer **out, um_err *err);
/* Parse a tokenizer.json held in memory (buf need not be NUL-terminated). label names the source
 * in error messages. Safe on arbitrary bytes (fuzzable). */
int  tokenizer_load_json(const char *buf, size_t len, const char *label, tokenizer **out, um_err *err);
/* The pre-tokenizer split regexes known by name; each is followed by the byte-level mapping. */
enum tokenizer_split {
    TOKENIZER_SPLIT_GPT2,       /* GPT-2's ByteLevel regex */
    TOKENIZER_SPLIT_QWEN2,      /* Qwen2 / Dream (with NFC before it: tokenizer_vocab.nfc) */
    TOKENIZER_SPLIT_BAILING,    /* LLaDA and the Ling / Bailing family (LLaDA-MoE, LLaDA2) */
};
/* The regex of a split (the same text HF tokenizer.json files carry). */
const char *tokenizer_split_regex(enum tokenizer_split s);

/* Token kinds, numbered as GGUF's tokenizer.ggml.token_type. */
enum tokenizer_token_kind {
    TOKENIZER_TOKEN_NORMAL = 1,        /* a BPE vocabulary entry */
    TOKENIZER_TOKEN_UNKNOWN = 2,       /* read as NORMAL */
    TOKENIZER_TOKEN_CONTROL = 3,       /* an added token marked special */
    TOKENIZER_TOKEN_USER_DEFINED = 4,  /* an added token not marked special */
    TOKENIZER_TOKEN_UNUSED = 5,        /* an id with no token (padding rows): not in the vocabulary */
    TOKENIZER_TOKEN_BYTE = 6,          /* read as NORMAL */
};

/* A byte-level BPE tokenizer given as arrays. Added tokens (CONTROL, USER_DEFINED) are matched
 * before the split as HF matches added tokens with lstrip / rstrip / single_word / normalized all
 * false; every token that is not UNUSED is also a BPE vocabulary entry. */
typedef struct tokenizer_vocab {
    int32_t              n_tokens;    /* ids 0..n_tokens-1 */
    const char *const   *token;       /* [n_tokens] vocabulary strings (byte-level form), token_len bytes each */
    const uint32_t      *token_len;   /* [n_tokens] */
    const int32_t       *kind;        /* [n_tokens] enum tokenizer_token_kind, or NULL: all NORMAL */
    int64_t              n_merges;    /* merge rank = index */
    const char *const   *merge;       /* [n_merges] "left right" */
    const uint32_t      *merge_len;   /* [n_merges] */
    enum tokenizer_split split;
    int                  nfc;         /* 1: normalize text to NFC before splitting */
    const char          *bos_token, *eos_token, *pad_token, *unk_token, *mask_token;   /* token strings
                                         for tokenizer_config_token (NULL: none) */
} tokenizer_vocab;

/* Build a tokenizer from arrays (copied; safe on arbitrary contents). label names the source in
 * error messages (UM_ERR_FORMAT: empty or repeated token strings, a bad token kind, merges that are
 * not "a b" or name tokens not in the vocabulary). */
int  tokenizer_load_vocab(const tokenizer_vocab *v, const char *label, tokenizer **out, um_err *err);
/* Free a tokenizer and everything it owns (vocabulary, merges, regexes, word cache). NULL is a
 * no-op. No other thread may still be using tok. */
void tokenizer_free(tokenizer *tok);

/* ---------------------------------------------------------------- vocabulary */

/* Number of ids: max id + 1 over the model vocabulary and the added tokens. */
int  tokenizer_n_vocab(const tokenizer *tok);
/* Id of a token given by its exact vocabulary string (added or regular), or -1. */
int  tokenizer_token_id(const tokenizer *tok, const char *piece);
/* 1 when id is an added token marked "special" (skipped by skip_special decoding), else 0. */
int  tokenizer_is_special(const tokenizer *tok, int id);
/* The vocabulary string of id (e.g. "Ġthe", "<|eot_id|>"), NUL-terminated, owned by tok; NULL
 * for ids not in the vocabulary. */
const char *tokenizer_token_piece(const tokenizer *tok, int id);
/* The raw bytes id decodes to (after the ByteLevel mapping: "Ġthe" -> " the"), owned by tok; may
 * be an incomplete UTF-8 sequence. NULL (and *len = 0) for ids not in the vocabulary. */
const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int id, size_t *len);
/* A token string named in tokenizer_config.json / special_tokens_map.json: name is "bos_token",
 * "eos_token", "pad_token", "unk_token", "mask_token", "cls_token", ... NULL when absent. */
const char *tokenizer_config_token(const tokenizer *tok, const char *name);

/* ---------------------------------------------------------------- encode / decode */

/* Encode len bytes of UTF-8 text into *ids (malloc'd, caller frees; *ids may be NULL when *n == 0).
 * parse_special: 1 = added tokens marked special are recognised in the text (HF default);
 * 0 = only non-special added tokens are, special ones are tokenized as plain text
 * (HF split_special_tokens=True). No BOS/EOS is added. Invalid UTF-8 -> -1, UM_ERR_INVALID_ARG
 * naming the byte offset (see utf8_sanitize() in text/unicode.h for lossy input). */
int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int parse_special, int32_t **ids,
                     size_t *n, um_err *err);

/* Decode ids to text: the concatenated token bytes with invalid / incomplete UTF-8 replaced by
 * U+FFFD per maximal subpart (Rust String::from_utf8_lossy, as HF does). Ids not in the vocabulary
 * are skipped (as HF does); skip_special drops special added tokens. *text is malloc'd and
 * NUL-terminated (caller frees); *len excludes the NUL. */
void tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                      size_t *len);

/* Incremental decoder: push ids one at a time, get back only complete UTF-8 text; bytes of a
 * character split across tokens are held until it completes. Concatenating every push() result
 * and flush() equals tokenizer_decode() of all the ids.
 *   tok_stream s; tok_stream_init(&s, tok, 1);
 *   for each id: tok_stream_push(&s, id, &p, &n); send(p, n);
 *   tok_stream_flush(&s, &p, &n); send(p, n); tok_stream_free(&s);
 * The returned pointer is owned by the stream and valid until its next call. */
typedef struct tok_stream {
    const tokenizer *tok;
    int      skip_special;
    uint8_t  pend[4];      /* bytes of an incomplete UTF-8 character (a valid prefix) */
    int      n_pend;
    char    *buf;          /* output buffer, grown as needed (owned) */
    size_t   cap;
} tok_stream;

/* Start an empty stream over tok (borrowed: it must outlive the stream); skip_special as in
 * tokenizer_decode(). */
void tok_stream_init(tok_stream *s, const tokenizer *tok, int skip_special);
/* Append the bytes of id and return, through text/len, the complete UTF-8 text they finish (maybe
 * empty: *len = 0). Invalid bytes become U+FFFD as in tokenizer_decode(); unknown ids add nothing. */
void tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len);
/* Emit what is held (an incomplete character becomes U+FFFD) and reset to the initial state. */
void tok_stream_flush(tok_stream *s, const char **text, size_t *len);
/* Release the stream's output buffer; s may be initialised again afterwards. */
void tok_stream_free(tok_stream *s);

/* ---------------------------------------------------------------- built-in tokenizer */

/* Special-token ids of the built-in tokenizer that make-model writes. */
typedef struct tokenizer_special {
    int vocab_size;   /* total ids used by the tokenizer (0 = no built-in tokenizer available) */
    int bos, eos, eot, mask, pad;
} tokenizer_special;

/* Write the built-in byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json with the real
 * LLaDA-8B-Instruct chat template, special_tokens_map.json) into dir and report its special ids. */
int tokenizer_write_builtin(const char *dir, tokenizer_special *sp, um_err *err);
/* The same files for a byte-level BPE trained on corpus[0..len) by bpe_train() (Bailing split regex,
 * up to max_merges merges of pairs seen at least min_count times; deterministic), with LLaDA's
 * special tokens followed by the infilling markers <|fim_prefix|>, <|fim_middle|>, <|fim_suffix|>.
 * -1 + err (param "merges") for a merge count outside 1..1000000 or a failed training. */
int tokenizer_write_trained(const char *dir, const char *corpus, size_t len, int max_merges, int min_count,
                            tokenizer_special *sp, um_err *err);
/* The built-in corpus trained with the Qwen2 split regex, written in the Qwen2 / Dream slow-tokenizer
 * layout: vocab.json, merges.txt, added_tokens.json (Dream's 24 added tokens, ids after the BPE
 * vocabulary), tokenizer_config.json with Dream-v0-Instruct-7B's chat template, and
 * special_tokens_map.json. eos = pad = <|endoftext|>, eot = <|im_end|>, bos = <|beginoftext|>,
 * mask = <|mask|>. */
int tokenizer_write_builtin_qwen2(const char *dir, tokenizer_special *sp, um_err *err);
/* The built-in corpus and Bailing regex as tokenizer_write_builtin(), with the Ling-2.0 family's
 * added tokens (<|startoftext|>, <|endoftext|>, [CLS], [gMASK], <|mask|>, <|role_end|>, <role>,
 * </role>) and its role-tag chat template: the tokenizer of the LLaDA-MoE / LLaDA2 layouts.
 * eos = pad = <|endoftext|>, mask = <|mask|>, eot = <|role_end|>, bos = <|startoftext|>. */
int tokenizer_write_builtin_ling(const char *dir, tokenizer_special *sp, um_err *err);

#endif /* UM_TOKENIZER_H */
