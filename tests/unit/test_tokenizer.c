/*
 * test_tokenizer.c — tokenizer engine units: tokenizer_load_json on malformed and mutated
 * buffers (errors, never crashes), encode/decode of a small hand-built byte-level BPE, lossy
 * decoding of split and invalid UTF-8, the incremental decoder against whole decoding, added
 * token flags, invalid input, the regex engine's semantics (possessive, lookahead, lazy, case
 * folding) and refusals, NFC on textbook cases.
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text/unicode_regex.h"
#include "test.h"
#include "util/rng.h"

/* ------------------------------------------------------------------ a small tokenizer */

static char *byte_char(int b) {
    static char buf[256][4];
    uint32_t cp = bpe_byte_to_cp((uint8_t)b);
    int n = utf8_encode(cp, buf[b]);
    buf[b][n] = 0;
    return buf[b];
}

/* 256 byte tokens + merges for " the", "he", "ll", "llo" + added tokens. */
static json_t *small_tokenizer_json(void) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) json_object_set_new(vocab, byte_char(b), json_integer(b));
    const char *merged[][3] = {
        {"Ġ", "t", "Ġt"}, {"h", "e", "he"}, {"Ġt", "he", "Ġthe"}, {"l", "l", "ll"}, {"ll", "o", "llo"},
        {"â", "Ĥ", "âĤ"}, {"âĤ", "¬", "âĤ¬"}, /* the euro sign's three bytes */
    };
    json_t *merges = json_array();
    int id = 256;
    for (size_t i = 0; i < sizeof merged / sizeof merged[0]; i++) {
        json_object_set_new(vocab, merged[i][2], json_integer(id++));
        json_array_append_new(merges, json_pack("[s,s]", merged[i][0], merged[i][1]));
    }
    json_t *added = json_array();
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id, "content", "<|eot|>", "special", 1,
                                           "lstrip", 0, "rstrip", 0, "single_word", 0, "normalized", 0));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b,s:b,s:b,s:b,s:b}", "id", id + 1, "content", "<x>", "special", 0,
                                           "lstrip", 1, "rstrip", 1, "single_word", 0, "normalized", 0));
    json_t *pre = json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},{s:s,s:b,s:b,s:b}]}", "type", "Sequence", "pretokenizers",
                            "type", "Split", "pattern", "Regex",
                            "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|"
                            "\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
                            "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
                            "trim_offsets", 0, "use_regex", 0);
    return json_pack("{s:o,s:n,s:o,s:{s:s},s:{s:s,s:o,s:o}}", "added_tokens", added, "normalizer", "pre_tokenizer", pre,
                     "decoder", "type", "ByteLevel", "model", "type", "BPE", "vocab", vocab, "merges", merges);
}

static tokenizer *load_value(json_t *j, um_err *err) {
    char *s = json_dumps(j, JSON_COMPACT);
    tokenizer *t = NULL;
    if (tokenizer_load_json(s, strlen(s), "test", &t, err) != 0) t = NULL;
    free(s);
    return t;
}

static int ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void test_encode_decode(void) {
    json_t *j = small_tokenizer_json();
    um_err err = {0};
    tokenizer *t = load_value(j, &err);
    json_decref(j);
    TEST_CHECK(t != NULL, "load: %s", err.msg);
    if (!t) return;
    TEST_CHECK(tokenizer_n_vocab(t) == 256 + 7 + 2, "n_vocab %d", tokenizer_n_vocab(t));
    int the = tokenizer_token_id(t, "Ġthe"), eot = tokenizer_token_id(t, "<|eot|>"), x = tokenizer_token_id(t, "<x>");
    TEST_CHECK(the == 258 && eot == 263 && x == 264, "ids %d %d %d", the, eot, x);
    TEST_CHECK(tokenizer_is_special(t, eot) && !tokenizer_is_special(t, x) && !tokenizer_is_special(t, the), "special");
    size_t bl;
    const uint8_t *b = tokenizer_token_bytes(t, the, &bl);
    TEST_CHECK(b && bl == 4 && memcmp(b, " the", 4) == 0, "token bytes of Ġthe");
    TEST_CHECK(tokenizer_token_bytes(t, 99999, &bl) == NULL && bl == 0, "unknown id has no bytes");
    TEST_CHECK(strcmp(tokenizer_token_piece(t, eot), "<|eot|>") == 0, "piece");

    int32_t *ids;
    size_t n;
    TEST_CHECK(tokenizer_encode(t, "hello the<|eot|>", 16, 1, &ids, &n, &err) == 0, "%s", err.msg);
    /* "he" (rank 1) and "ll" then "llo" (ranks 3, 4) */
    int32_t want[] = {tokenizer_token_id(t, "he"), tokenizer_token_id(t, "llo"), the, eot};
    TEST_CHECK(ids_equal(ids, n, want, 4), "hello the<|eot|>: got %zu ids", n);
    char *text;
    size_t len;
    tokenizer_decode(t, ids, n, 0, &text, &len);
    TEST_CHECK(len == 16 && strcmp(text, "hello the<|eot|>") == 0, "decode '%s'", text);
    free(text);
    tokenizer_decode(t, ids, n, 1, &text, &len);
    TEST_CHECK(strcmp(text, "hello the") == 0, "skip_special '%s'", text);
    free(text);
    free(ids);

    /* parse_special = 0: the special token is text, the non-special one still matches */
    TEST_CHECK(tokenizer_encode(t, "<|eot|>", 7, 0, &ids, &n, &err) == 0, "%s", err.msg);
    TEST_CHECK(n > 1, "special token split into pieces when not parsed (%zu)", n);
    free(ids);
    /* lstrip / rstrip absorb the surrounding spaces */
    TEST_CHECK(tokenizer_encode(t, "a  <x>  b", 9, 0, &ids, &n, &err) == 0, "%s", err.msg);
    TEST_CHECK(n == 3 && ids[0] == 'a' && ids[1] == x && ids[2] == 'b', "lstrip/rstrip: %zu ids", n);
    free(ids);

    /* invalid UTF-8 is refused, with the offset */
    TEST_CHECK(tokenizer_encode(t, "ab\xff", 3, 1, &ids, &n, &err) == -1 && err.code == UM_ERR_INVALID_ARG &&
                   strstr(err.msg, "byte 2"),
               "invalid UTF-8: %s", err.msg);
    TEST_CHECK(tokenizer_encode(t, "", 0, 1, &ids, &n, &err) == 0 && n == 0, "empty text");
    free(ids);

    /* euro sign = three byte tokens or one merged token */
    int32_t euro_bytes[] = {0xE2, 0x82, 0xAC};
    tokenizer_decode(t, euro_bytes, 3, 0, &text, &len);
    TEST_CHECK(strcmp(text, "\xE2\x82\xAC") == 0, "euro from bytes");
    free(text);
    tokenizer_decode(t, euro_bytes, 2, 0, &text, &len);
    TEST_CHECK(strcmp(text, UTF8_REPLACEMENT) == 0, "truncated euro -> one U+FFFD, got %zu bytes", len);
    free(text);
    int32_t bad[] = {0xE2, 'A', 0xFF, 0x80, 0xF0, 0x9F, 0x98, 0x80, 99999, -5};
    tokenizer_decode(t, bad, 10, 0, &text, &len);
    TEST_CHECK(strcmp(text, UTF8_REPLACEMENT "A" UTF8_REPLACEMENT UTF8_REPLACEMENT "\xF0\x9F\x98\x80") == 0,
               "maximal subparts, unknown ids skipped");
    free(text);

    /* incremental decoding == whole decoding, never half a character */
    uint64_t seed = 42;
    for (int trial = 0; trial < 300; trial++) {
        int32_t seq[40];
        int m = 1 + (int)(rng_u64(seed, (uint64_t)trial, 0) % 40);
        for (int i = 0; i < m; i++) {
            uint64_t r = rng_u64(seed, (uint64_t)trial, (uint64_t)i + 1);
            int pick = (int)(r % 10);
            seq[i] = pick < 5 ? (int32_t)(0x80 + (r >> 8) % 0x80) : pick < 8 ? (int32_t)((r >> 8) % 265)
                                                                               : euro_bytes[(r >> 8) % 3];
        }
        char *whole;
        size_t wl;
        tokenizer_decode(t, seq, (size_t)m, trial & 1, &whole, &wl);
        tok_stream s;
        tok_stream_init(&s, t, trial & 1);
        char acc[1024];
        size_t al = 0;
        int chunks_valid = 1;
        for (int i = 0; i < m; i++) {
            const char *p;
            size_t pl;
            tok_stream_push(&s, seq[i], &p, &pl);
            if (!utf8_validate(p, pl, NULL)) chunks_valid = 0;
            memcpy(acc + al, p, pl);
            al += pl;
        }
        const char *p;
        size_t pl;
        tok_stream_flush(&s, &p, &pl);
        memcpy(acc + al, p, pl);
        al += pl;
        tok_stream_free(&s);
        TEST_CHECK(chunks_valid, "stream chunk with broken UTF-8 (trial %d)", trial);
        TEST_CHECK(al == wl && memcmp(acc, whole, wl) == 0, "stream != decode (trial %d)", trial);
        free(whole);
    }
    /* a held partial character is not emitted until it completes */
    tok_stream s;
    tok_stream_init(&s, t, 0);
    const char *p;
    size_t pl;
    tok_stream_push(&s, 0xE2, &p, &pl);
    TEST_CHECK(pl == 0, "first byte held");
    tok_stream_push(&s, 0x82, &p, &pl);
    TEST_CHECK(pl == 0, "second byte held");
    tok_stream_push(&s, 0xAC, &p, &pl);
    TEST_CHECK(pl == 3 && memcmp(p, "\xE2\x82\xAC", 3) == 0, "completed character emitted");
    tok_stream_push(&s, 0xE2, &p, &pl);
    tok_stream_flush(&s, &p, &pl);
    TEST_CHECK(pl == 3 && memcmp(p, UTF8_REPLACEMENT, 3) == 0, "flush of a partial character -> U+FFFD");
    tok_stream_free(&s);
    tokenizer_free(t);
}

/* ------------------------------------------------------------------ malformed input */

static void expect_fail(const char *label, const char *json, enum um_err_code code) {
    tokenizer *t = (tokenizer *)0x1;
    um_err err = {0};
    int rc = tokenizer_load_json(json, strlen(json), label, &t, &err);
    TEST_CHECK(rc == -1 && t == NULL, "%s: accepted", label);
    TEST_CHECK(err.code == code, "%s: code %s, message '%s'", label, um_err_code_name(err.code), err.msg);
    TEST_CHECK(strstr(err.msg, label) != NULL, "%s: message names the source: '%s'", label, err.msg);
    if (rc == 0) tokenizer_free(t);
}

#define DEC "\"decoder\":{\"type\":\"ByteLevel\"}"

static void test_malformed(void) {
    expect_fail("empty", "", UM_ERR_FORMAT);
    expect_fail("truncated", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0", UM_ERR_FORMAT);
    expect_fail("not-object", "[1,2,3]", UM_ERR_FORMAT);
    expect_fail("no-model", "{" DEC "}", UM_ERR_FORMAT);
    expect_fail("model-string", "{\"model\":\"BPE\"," DEC "}", UM_ERR_FORMAT);
    expect_fail("wordpiece", "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}," DEC "}", UM_ERR_UNSUPPORTED);
    expect_fail("vocab-array", "{\"model\":{\"type\":\"BPE\",\"vocab\":[1],\"merges\":[]}," DEC "}", UM_ERR_FORMAT);
    expect_fail("vocab-string-id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("negative-id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}," DEC "}", UM_ERR_FORMAT);
    expect_fail("huge-id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":4000000000},\"merges\":[]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("sparse-id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":9000000},\"merges\":[]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("dup-id", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("merge-unknown",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a c\"]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("merge-result-unknown",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("merge-no-space", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"aa\"]}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("merge-type", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}," DEC "}", UM_ERR_FORMAT);
    expect_fail("merges-object", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":{}}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("no-decoder", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", UM_ERR_UNSUPPORTED);
    expect_fail("wordpiece-decoder",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"decoder\":{\"type\":\"WordPiece\"}}",
                UM_ERR_UNSUPPORTED);
    expect_fail("normalizer-lowercase",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"Lowercase\"}," DEC
                "}",
                UM_ERR_UNSUPPORTED);
    expect_fail("normalizer-untyped",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{}," DEC "}", UM_ERR_FORMAT);
    expect_fail("bad-regex",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
                "\"pattern\":{\"Regex\":\"(a\"},\"behavior\":\"Isolated\"}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("regex-anchor",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
                "\"pattern\":{\"Regex\":\"^a\"},\"behavior\":\"Isolated\"}," DEC "}",
                UM_ERR_UNSUPPORTED);
    expect_fail("split-behavior",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\","
                "\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("metaspace",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Metaspace\"},"
                DEC "}",
                UM_ERR_UNSUPPORTED);
    expect_fail("added-no-content",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":1}]," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("added-huge-id",
                "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":99999999999,"
                "\"content\":\"x\"}]," DEC "}",
                UM_ERR_FORMAT);
    expect_fail("byte-fallback",
                "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"a\":0},\"merges\":[]}," DEC "}",
                UM_ERR_UNSUPPORTED);
}

/* Mutations of a valid tokenizer.json: truncations and byte flips must load or fail, never crash. */
static void test_mutations(void) {
    json_t *j = small_tokenizer_json();
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t len = strlen(s);
    char *buf = malloc(len + 1);
    int loaded = 0, failed = 0;
    for (size_t cut = 0; cut < len; cut += 37) {
        tokenizer *t;
        um_err err;
        if (tokenizer_load_json(s, cut, "cut", &t, &err) == 0) loaded++, tokenizer_free(t);
        else failed++;
    }
    for (int trial = 0; trial < 400; trial++) {
        memcpy(buf, s, len + 1);
        for (int k = 0; k < 3; k++) {
            uint64_t r = rng_u64(7, (uint64_t)trial, (uint64_t)k);
            buf[r % len] = "{}[]\":,0123456789-aÿ\\ "[(r >> 32) % 23];
        }
        tokenizer *t;
        um_err err;
        if (tokenizer_load_json(buf, len, "mutant", &t, &err) == 0) {
            int32_t *ids;
            size_t n;
            if (tokenizer_encode(t, "hello the world 123 <|eot|>", 27, 1, &ids, &n, &err) == 0) free(ids);
            loaded++;
            tokenizer_free(t);
        } else {
            failed++;
        }
    }
    TEST_CHECK(failed > 0, "mutations exercised the error paths (%d loaded, %d failed)", loaded, failed);
    free(buf);
    free(s);
}

/* ------------------------------------------------------------------ regex engine */

static int find_all(const char *pat, const char *text, char *out, size_t cap) {
    uregex *re;
    um_err err;
    if (uregex_compile(pat, strlen(pat), &re, &err) != 0) return -1;
    size_t pos = 0, ms, me, o = 0, len = strlen(text);
    out[0] = 0;
    while (uregex_find(re, text, len, pos, &ms, &me, &err) == 1) {
        o += (size_t)snprintf(out + o, cap - o, "[%.*s]", (int)(me - ms), text + ms);
        pos = me;
    }
    uregex_free(re);
    return 0;
}

static void expect_matches(const char *pat, const char *text, const char *want) {
    char got[512];
    int rc = find_all(pat, text, got, sizeof got);
    TEST_CHECK(rc == 0 && strcmp(got, want) == 0, "/%s/ on '%s': got %s want %s", pat, text, rc ? "(compile error)" : got,
               want);
}

static void test_regex(void) {
    expect_matches("\\s+(?!\\S)|\\s+", "a   b  ", "[  ][ ][  ]");
    expect_matches("a?+a", "aa", "[aa]");
    expect_matches("a?+a", "a", "");                 /* possessive ? takes the only 'a' and keeps it */
    expect_matches("a?a", "a", "[a]");
    expect_matches("[^\\s\\p{L}]++x", "!!x", "[!!x]");
    expect_matches("[^\\s\\p{L}]++!", "!!!", "");    /* possessive + never gives back */
    expect_matches("a+?b", "aaab", "[aaab]");
    expect_matches("(?i:'s|'ll)", "'S 'LL 'ſ", "['S]['LL]['ſ]");
    expect_matches("\\p{N}{1,3}", "12345", "[123][45]");
    expect_matches("\\p{L}+", "héllo wörld 中文", "[héllo][wörld][中文]");
    expect_matches("(?:ab)+c|b", "ababc abx", "[ababc][b]");
    expect_matches("(?=a)\\w+", "xa ab", "[a][ab]");
    expect_matches("[a-c\\d]+", "abcd0123", "[abc][0123]");
    expect_matches("\\x41\\u00e9\\x{4e2d}", "Aé中", "[Aé中]");
    expect_matches(".+", "ab\ncd", "[ab][cd]");
    const char *refused[] = {"^a", "a$", "\\bfoo", "(a)\\1", "(?<=a)b", "(?<n>a)", "\\p{Han}", "(?i)a", "[[a]]", "(?>a)",
                             "a{2}+", "\\q"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        uregex *re;
        um_err err = {0};
        int rc = uregex_compile(refused[i], strlen(refused[i]), &re, &err);
        TEST_CHECK(rc == -1 && err.code == UM_ERR_UNSUPPORTED, "/%s/ must be refused as unsupported (%s)", refused[i],
                   err.msg);
        if (rc == 0) uregex_free(re);
    }
    const char *broken[] = {"(a", "a)", "[abc", "*a", "a{3,2}", "\\p{L", "[z-a]"};
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        uregex *re;
        um_err err = {0};
        int rc = uregex_compile(broken[i], strlen(broken[i]), &re, &err);
        TEST_CHECK(rc == -1 && err.msg[0], "/%s/ must fail to compile", broken[i]);
        if (rc == 0) uregex_free(re);
    }
}

/* ------------------------------------------------------------------ unicode */

static void expect_nfc(const char *in, const char *want) {
    size_t n;
    char *out = unicode_nfc(in, strlen(in), &n);
    TEST_CHECK(n == strlen(want) && strcmp(out, want) == 0, "NFC('%s') = '%s', want '%s'", in, out, want);
    free(out);
}

static void test_unicode(void) {
    /* textbook cases from UAX #15 */
    expect_nfc("e\xCC\x81", "\xC3\xA9");                                 /* e + acute -> é */
    expect_nfc("\xE2\x84\xAB", "\xC3\x85");                              /* ANGSTROM SIGN -> Å */
    expect_nfc("\xE1\xBA\x9B\xCC\xA3", "\xE1\xBA\x9B\xCC\xA3");          /* ẛ + dot below stays */
    expect_nfc("q\xCC\x87\xCC\xA3", "q\xCC\xA3\xCC\x87");                /* reordered, no composite */
    expect_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"); /* jamo L V T -> 각 */
    expect_nfc("a\xCC\x88\xCC\x81 x", "\xC3\xA4\xCC\x81 x");            /* ä + acute */
    expect_nfc("plain ascii", "plain ascii");
    expect_nfc("\xC3\xA9\xCC\xA3", "\xE1\xBA\xB9\xCC\x81");            /* é + dot below -> ẹ́ */
    size_t n;
    char *s = utf8_sanitize("a\xE2\x82" "b\xFF\xC0\xAF", 7, &n);
    TEST_CHECK(strcmp(s, "a" UTF8_REPLACEMENT "b" UTF8_REPLACEMENT UTF8_REPLACEMENT UTF8_REPLACEMENT) == 0,
               "sanitize: maximal subparts");
    free(s);
    size_t bad;
    TEST_CHECK(!utf8_validate("\xED\xA0\x80", 3, &bad) && bad == 0, "surrogates are invalid");
    TEST_CHECK(!utf8_validate("ok\xC0\x80", 4, &bad) && bad == 2, "overlong is invalid");
    TEST_CHECK(unicode_is_letter(0x4E2D) && unicode_is_number('7') && unicode_is_space(0x3000) &&
                   !unicode_is_space(0x200B),
               "properties");
    TEST_CHECK(unicode_fold('K') == 'k' && unicode_fold(0x17F) == 's', "case folding");
}

/* Fuzz finding (fuzz_tokenizer_load, tests/fuzz/corpus/fuzz_tokenizer_load/regress-empty-word-ids.json):
 * a word whose characters are all outside the vocabulary (no ByteLevel, no unk_token) encodes to no
 * ids; storing that empty result in the word cache did pointer arithmetic / memcpy on the still-NULL
 * id vector (undefined behaviour, reported by UBSan). Encoding it — twice, the second time from
 * the cache — must give zero ids, and mixed text must keep the known pieces. */
static void test_word_without_ids(void) {
    static const char json[] = "{\"decoder\":{\"type\":\"ByteLevel\"},\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}}";
    tokenizer *t = NULL;
    um_err err = {0};
    TEST_CHECK(tokenizer_load_json(json, strlen(json), "test", &t, &err) == 0, "load: %s", err.msg);
    if (!t) return;
    for (int round = 0; round < 2; round++) {
        int32_t *ids = NULL;
        size_t n = 99;
        TEST_CHECK(tokenizer_encode(t, "xyz", 3, 1, &ids, &n, &err) == 0, "encode: %s", err.msg);
        TEST_CHECK(n == 0, "a word with no known character gives no ids, got %zu", n);
        free(ids);
        ids = NULL;
        TEST_CHECK(tokenizer_encode(t, "ab", 2, 1, &ids, &n, &err) == 0 && n == 1 && ids[0] == 2, "ab -> [2]");
        free(ids);
    }
    tokenizer_free(t);
}

int main(void) {
    test_encode_decode();
    test_malformed();
    test_mutations();
    test_regex();
    test_unicode();
    test_word_without_ids();
    return test_report();
}
