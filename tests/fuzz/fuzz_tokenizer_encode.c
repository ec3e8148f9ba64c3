/*
 * fuzz_tokenizer_encode.c — libFuzzer target: tokenizer_encode / tokenizer_decode / tok_stream on
 * arbitrary text, with two fixed tokenizers: the built-in one make-model writes (byte-level BPE,
 * Bailing regex, LLaDA special tokens), where decode(encode(x)) == x must hold for every valid
 * UTF-8 input, and a small in-memory tokenizer.json with the optional features (NFC normalizer,
 * lstrip/rstrip/single_word/normalized added tokens, GPT-2 regex) that only must not crash.
 * Invalid UTF-8 must be an error (UM_ERR_INVALID_ARG), never a crash.
 * Input: byte 0 = flags (bit 0 parse_special, bit 1 second tokenizer, bit 2 skip_special), rest = text.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "text/bpe.h"
#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *added(int id, const char *content, int special, int lstrip, int rstrip, int single, int normalized) {
    return json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", content, "special", special, "lstrip",
                     lstrip, "rstrip", rstrip, "single_word", single, "normalized", normalized);
}

static char *cp_utf8(uint32_t cp, char *buf) {
    if (cp < 0x80) buf[0] = (char)cp, buf[1] = 0;
    else if (cp < 0x800) buf[0] = (char)(0xc0 | cp >> 6), buf[1] = (char)(0x80 | (cp & 63)), buf[2] = 0;
    else buf[0] = (char)(0xe0 | cp >> 12), buf[1] = (char)(0x80 | ((cp >> 6) & 63)), buf[2] = (char)(0x80 | (cp & 63)), buf[3] = 0;
    return buf;
}

static tokenizer *feature_tokenizer(void) {
    json_t *vocab = json_object();
    char b[8], b2[16];
    for (int i = 0; i < 256; i++) json_object_set_new(vocab, cp_utf8(bpe_byte_to_cp((uint8_t)i), b), json_integer(i));
    snprintf(b2, sizeof b2, "%st", cp_utf8(bpe_byte_to_cp(' '), b));
    json_object_set_new(vocab, b2, json_integer(256));
    json_object_set_new(vocab, "he", json_integer(257));
    json_object_set_new(vocab, b2[0] ? "the" : "x", json_integer(258));
    json_t *merges = json_pack("[s,s,s]", "h e", "t he", "\xc4\xa0 t");
    json_t *add = json_pack("[o,o,o,o,o]", added(300, "<|eot|>", 1, 0, 0, 0, 0), added(301, "<mask>", 1, 1, 1, 0, 0),
                            added(302, "word", 0, 0, 0, 1, 1), added(303, "\xc3\xa9t\xc3\xa9", 0, 0, 1, 0, 1),
                            added(304, "<|x|>", 0, 1, 0, 0, 0));
    json_t *root = json_pack(
        "{s:o,s:{s:s,s:[{s:s},{s:s}]},s:{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]},"
        "s:{s:s,s:b,s:b,s:b},s:{s:s,s:o,s:o,s:b}}",
        "added_tokens", add, "normalizer", "type", "Sequence", "normalizers", "type", "NFC", "type", "NFC",
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", "behavior", "Isolated",
        "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "decoder", "type",
        "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0, "use_regex", 0, "model", "type", "BPE", "vocab", vocab,
        "merges", merges, "ignore_merges", 1);
    if (!root) abort();
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    tokenizer *tok = NULL;
    um_err err = {0};
    if (tokenizer_load_json(s, strlen(s), "feature", &tok, &err) != 0) {
        fprintf(stderr, "fuzz: feature tokenizer: %s\n", err.msg);
        abort();
    }
    free(s);
    return tok;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) k = 1, cp = c & 31;
        else if (c >= 0xe0 && c <= 0xef) k = 2, cp = c & 15;
        else if (c >= 0xf0 && c <= 0xf4) k = 3, cp = c & 7;
        else return 0;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 63);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += k + 1;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tokenizer *feat;
    const model *m = fuzz_model();
    if (!feat) feat = feature_tokenizer();
    if (size < 1) return 0;
    int flags = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int parse_special = flags & 1, second = (flags >> 1) & 1, skip_special = (flags >> 2) & 1;
    const tokenizer *tok = second ? feat : m->tok;
    int32_t *ids = NULL;
    size_t n = 0;
    um_err err = {0};
    int rc = tokenizer_encode(tok, text, len, parse_special, &ids, &n, &err);
    int valid = utf8_valid(data + 1, len);
    if (rc != 0) {
        /* the only reason to fail is invalid UTF-8, and that is an argument error */
        if (valid || err.code != UM_ERR_INVALID_ARG) {
            fprintf(stderr, "encode failed on valid input or with the wrong code: %s\n", err.msg);
            abort();
        }
        free(ids);
        return 0;
    }
    if (!valid) {
        fprintf(stderr, "encode accepted invalid UTF-8\n");
        abort();
    }
    char *s = NULL;
    size_t sl = 0;
    tokenizer_decode(tok, ids, n, 0, &s, &sl);
    if (!second && (sl != len || memcmp(s, text, len) != 0)) {
        fprintf(stderr, "decode(encode(x)) != x (%zu vs %zu bytes)\n", sl, len);
        abort();
    }
    /* the incremental decoder must agree with decode for both skip_special modes */
    char *ref = NULL;
    size_t rl = 0;
    tokenizer_decode(tok, ids, n, skip_special, &ref, &rl);
    tok_stream st;
    tok_stream_init(&st, tok, skip_special);
    char *cat = malloc(rl + 1);
    size_t cl = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pl;
        if (i < n) tok_stream_push(&st, ids[i], &p, &pl);
        else tok_stream_flush(&st, &p, &pl);
        if (cl + pl > rl) {
            fprintf(stderr, "tok_stream produced more than decode\n");
            abort();
        }
        memcpy(cat + cl, p, pl);
        cl += pl;
    }
    tok_stream_free(&st);
    if (cl != rl || memcmp(cat, ref, rl) != 0) {
        fprintf(stderr, "tok_stream != decode\n");
        abort();
    }
    free(cat);
    free(ref);
    free(s);
    free(ids);
    return 0;
}
