/*
 * test_gguf.c — the GGUF reader and the Q8_0 / Q4_0 reference quantizers against a file written by
 * the tests' own Python writer (tests/fixtures/gguf/vectors.gguf, tests/reference/gguf_fixture.py):
 * every metadata value type read back, the tensors found with their types, shapes and data; then
 * util/quant.c's quantization of the float rows must be byte-identical to the NumPy quantizers'
 * (an independent check of both), and dequantization must give what the spec's formula gives.
 * Also in-memory edge cases of the parser (truncation at every length, alignment, version).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "test.h"
#include "util/fileio.h"
#include "util/log.h"
#include "util/quant.h"

#define FIXTURE UNMASK_SOURCE_DIR "/tests/fixtures/gguf/vectors.gguf"

static void check_metadata(const gguf_file *f) {
    um_err err = {0};
    int64_t v;
    double x;
    int b;
    const char *s;
    uint64_t len;
    static const struct { const char *key; int64_t want; } ints[] = {
        {"test.u8", 200}, {"test.i8", -100}, {"test.u16", 60000}, {"test.i16", -30000},
        {"test.u32", 4000000000LL}, {"test.i32", -2000000000LL}, {"test.i64", -(1LL << 40)}, {"test.u64", INT64_MAX},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const gguf_kv *kv = gguf_find_kv(f, ints[i].key);
        TEST_CHECK(kv && gguf_kv_int(f, kv, INT64_MIN, INT64_MAX, &v, &err) == 0 && v == ints[i].want,
                   "%s: %lld (%s)", ints[i].key, (long long)v, err.msg);
    }
    const gguf_kv *kv = gguf_find_kv(f, "test.u32");
    TEST_CHECK(gguf_kv_int(f, kv, 0, 100, &v, &err) == -1 && strstr(err.msg, "test.u32") &&
                   strstr(err.msg, "between 0 and 100"),
               "range error: %s", err.msg);
    TEST_CHECK(gguf_kv_float(f, gguf_find_kv(f, "test.f32"), &x, &err) == 0 && x == 0.15625, "f32 %g", x);
    TEST_CHECK(gguf_kv_float(f, gguf_find_kv(f, "test.f64"), &x, &err) == 0 && x == -2.5e-300, "f64 %g", x);
    TEST_CHECK(gguf_kv_bool(f, gguf_find_kv(f, "test.bool"), &b, &err) == 0 && b == 1, "bool");
    TEST_CHECK(gguf_kv_str(f, gguf_find_kv(f, "test.string"), &s, &len, &err) == 0 && len == strlen("naïve ✓") &&
                   memcmp(s, "naïve ✓", len) == 0,
               "string");
    TEST_CHECK(gguf_kv_str(f, gguf_find_kv(f, "test.u8"), &s, &len, &err) == -1 &&
                   strstr(err.msg, "key 'test.u8' has type u8, expected a string") && strstr(err.msg, "vectors.gguf"),
               "wrong type: %s", err.msg);
    TEST_CHECK(gguf_kv_int(f, gguf_find_kv(f, "test.strings"), 0, 1, &v, &err) == -1 &&
                   strstr(err.msg, "is an array of string, expected an integer"),
               "array as int: %s", err.msg);
    kv = gguf_find_kv(f, "test.ints");
    TEST_CHECK(kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_I32 && kv->n == 3 && gguf_arr_int(kv, 0) == 3 &&
                   gguf_arr_int(kv, 1) == -1 && gguf_arr_int(kv, 2) == 7,
               "int array");
    kv = gguf_find_kv(f, "test.strings");
    const char *want[] = {"a", "", "bc d"};
    for (int i = 0; kv && i < 3; i++) {
        gguf_arr_str(kv, (uint64_t)i, &s, &len);
        TEST_CHECK(len == strlen(want[i]) && memcmp(s, want[i], len) == 0, "strings[%d]", i);
    }
    TEST_CHECK(f->alignment == 64 && f->data_start % 64 == 0, "alignment %u, data at %zu", f->alignment, f->data_start);
}

/* util/quant.c on the float rows == the Python quantizer's bytes; dequantization follows the spec */
static void check_quant(const gguf_file *f) {
    const gguf_tensor *x = gguf_find_tensor(f, "x"), *q8 = gguf_find_tensor(f, "x.q8_0"),
                      *q4 = gguf_find_tensor(f, "x.q4_0");
    TEST_CHECK(x && q8 && q4, "tensors present");
    if (!x || !q8 || !q4) return;
    TEST_CHECK(x->type == DTYPE_F32 && q8->type == DTYPE_Q8_0 && q4->type == DTYPE_Q4_0, "types");
    TEST_CHECK(x->n_dims == 2 && x->ne[0] == 64 && x->ne[1] == 48 && q8->ne[0] == 64 && q4->ne[1] == 48, "shapes");
    TEST_CHECK(q8->nbytes == dtype_row_bytes(DTYPE_Q8_0, 64) * 48 && q4->nbytes == dtype_row_bytes(DTYPE_Q4_0, 64) * 48,
               "sizes %zu %zu", q8->nbytes, q4->nbytes);
    const int64_t n = 64 * 48;
    float *xf = xmalloc((size_t)n * sizeof *xf), *deq = xmalloc((size_t)n * sizeof *deq);
    memcpy(xf, x->data, (size_t)n * sizeof *xf);
    uint8_t *mine = xmalloc(q8->nbytes);
    const gguf_tensor *qs[2] = {q8, q4};
    for (int k = 0; k < 2; k++) {
        const gguf_tensor *q = qs[k];
        for (int64_t r = 0; r < 48; r++)
            quant_row_quantize(q->type, xf + r * 64, mine + r * dtype_row_bytes(q->type, 64), 64);
        int first = -1;
        for (size_t i = 0; i < q->nbytes && first < 0; i++)
            if (mine[i] != q->data[i]) first = (int)i;
        TEST_CHECK(first < 0, "%s: util/quant.c and the NumPy quantizer differ first at byte %d (row %d)",
                   dtype_name(q->type), first, first / (int)dtype_row_bytes(q->type, 64));
        /* dequantize: x = d * q (Q8_0), d * (q - 8) (Q4_0), d the f16 scale */
        quant_row_dequantize(q->type, q->data, deq, n);
        int bad = 0;
        const size_t bb = q->type == DTYPE_Q8_0 ? 34 : 18;
        for (int64_t i = 0; i < n && !bad; i++) {
            const uint8_t *blk = q->data + (size_t)(i / 32) * bb;
            const float d = f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
            const int j = (int)(i % 32);
            const float want = q->type == DTYPE_Q8_0 ? d * (float)(int8_t)blk[2 + j]
                                                     : d * (float)(((j < 16 ? blk[2 + j] : blk[2 + j - 16] >> 4) & 15) - 8);
            bad = !(deq[i] == want || (isnan(deq[i]) && isnan(want)));
        }
        TEST_CHECK(!bad, "%s dequantization", dtype_name(q->type));
    }
    free(mine);
    free(xf);
    free(deq);
}

/* A well-formed file cut short at every length fails cleanly, naming the file. */
static void check_truncation(const uint8_t *buf, size_t len) {
    int fails = 0, named = 0;
    for (size_t cut = 0; cut < len; cut += (cut < 1024 ? 1 : 97)) {
        gguf_file f;
        um_err err = {0};
        if (gguf_parse(buf, cut, "cut.gguf", &f, &err) == 0) {
            gguf_free(&f);
            continue;
        }
        fails++;
        named += strstr(err.msg, "cut.gguf") != NULL;
    }
    TEST_CHECK(fails > 0 && named == fails, "%d truncations failed, %d named the file", fails, named);
    gguf_file f;
    um_err err = {0};
    TEST_CHECK(gguf_parse(buf, len - 1, "cut.gguf", &f, &err) == -1 && strstr(err.msg, "x.q4_0") &&
                   strstr(err.msg, "truncated"),
               "last byte missing: %s", err.msg);
}

static void expect_parse_error(uint8_t *buf, size_t len, const char *needle) {
    gguf_file f;
    um_err err = {0};
    int rc = gguf_parse(buf, len, "e.gguf", &f, &err);
    TEST_CHECK(rc == -1 && strstr(err.msg, needle) && strstr(err.msg, "e.gguf"), "want '%s', got '%s'", needle,
               rc ? err.msg : "success");
    if (rc == 0) gguf_free(&f);
}

static void check_header_errors(const uint8_t *orig, size_t len) {
    uint8_t *b = xmalloc(len);
    memcpy(b, orig, len);
    b[0] = 'X';
    expect_parse_error(b, len, "not a GGUF file");
    memcpy(b, orig, len);
    b[4] = 1;
    expect_parse_error(b, len, "GGUF version 1 is not supported");
    memcpy(b, orig, len);
    b[4] = 0, b[7] = 3;
    expect_parse_error(b, len, "big-endian");
    memcpy(b, orig, len);
    b[15] = 0x40;   /* tensor count 2^62 */
    expect_parse_error(b, len, "more than unmask reads");
    memcpy(b, orig, len);
    b[16] = 200;    /* metadata count 200: the entries run past the metadata into the tensor infos */
    gguf_file f;
    um_err err = {0};
    TEST_CHECK(gguf_parse(b, len, "e.gguf", &f, &err) == -1, "wrong metadata count: %s", err.msg);
    free(b);
}

int main(void) {
    file_map map;
    um_err err = {0};
    if (file_map_open(FIXTURE, &map, &err) != 0) {
        fprintf(stderr, "FAIL %s\n", err.msg);
        return 1;
    }
    gguf_file f;
    int rc = gguf_parse(map.data, map.len, "vectors.gguf", &f, &err);
    TEST_CHECK(rc == 0, "parse: %s", err.msg);
    if (rc == 0) {
        TEST_CHECK(f.version == 3 && f.n_tensors == 3 && f.n_kv == 16, "version %u, %d tensors, %d keys", f.version,
                   f.n_tensors, f.n_kv);
        check_metadata(&f);
        check_quant(&f);
        gguf_free(&f);
    }
    check_truncation(map.data, map.len);
    check_header_errors(map.data, map.len);
    file_map_close(&map);
    return test_report();
}
