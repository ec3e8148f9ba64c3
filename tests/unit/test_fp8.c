/*
 * test_fp8.c — the FP8 E4M3 conversions of util/dtype.h against a reference written here from the
 * OCP FP8 definition (E4M3 "fn": bias 7, subnormals m x 2^-9, no infinities, S.1111.111 = NaN, largest
 * finite 448): every one of the 256 codes decodes to the value the definition gives and encodes
 * back to itself (both NaN codes to 0x7f); the encoder equals a brute-force search for the nearest
 * finite value (ties to the even code, saturating at +-448) on every code value, every midpoint
 * between neighbours and the floats one ulp either side of both, on hand-computed values and on
 * random floats of every magnitude. Then dtype_to_f32 / dtype_size / dtype_name of the type.
 * Single-threaded.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "test.h"
#include "util/dtype.h"
#include "util/rng.h"

/* The definition: (-1)^s x 2^(e-7) x (1 + m/8) for e > 0, (-1)^s x 2^-6 x m/8 for e = 0, NaN when
 * e = 15 and m = 7. */
static double spec_value(int code) {
    const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return NAN;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

/* Nearest finite code by exhaustive search, ties to the even code; beyond 448 the largest (the
 * saturating conversion); the sign kept (a negative value that rounds to zero gives -0, 0x80). */
static int spec_encode(float x) {
    if (isnan(x)) return 0x7f;
    const int neg = signbit(x) != 0;
    const double a = fabs((double)x);
    int best = 0;
    double bd = INFINITY;
    for (int k = 0; k <= 0x7e; k++) {
        const double d = fabs(spec_value(k) - a);   /* exact: both fit a double's mantissa */
        if (d < bd || (d == bd && (k & 1) == 0)) bd = d, best = k;
    }
    if (isinf(x)) best = 0x7e;
    return best | (neg ? 0x80 : 0);
}

static int n_checked;

static unsigned f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static void check_encode(float x) {
    const int want = spec_encode(x), got = f32_to_fp8_e4m3(x);
    n_checked++;
    TEST_CHECK(got == want, "f32_to_fp8_e4m3(%.9g = 0x%08x) = 0x%02x, the definition gives 0x%02x", (double)x,
               f32_bits(x), got, want);
}

int main(void) {
    /* 1. decoding: every code */
    for (int c = 0; c < 256; c++) {
        const float got = fp8_e4m3_to_f32((uint8_t)c);
        const double want = spec_value(c);
        if (isnan(want)) {
            TEST_CHECK(isnan(got), "code 0x%02x decodes to %g, expected NaN", c, (double)got);
            TEST_CHECK(f32_to_fp8_e4m3(got) == 0x7f, "NaN code 0x%02x re-encodes to 0x%02x, expected 0x7f", c,
                       f32_to_fp8_e4m3(got));
            continue;
        }
        TEST_CHECK((double)got == want && !signbit(got) == !signbit(want), "code 0x%02x decodes to %.9g, expected %.9g", c,
                   (double)got, want);
        TEST_CHECK(f32_to_fp8_e4m3(got) == c, "code 0x%02x: %.9g re-encodes to 0x%02x", c, (double)got,
                   f32_to_fp8_e4m3(got));
    }
    TEST_CHECK(spec_value(0x7e) == 448.0 && spec_value(0x01) == ldexp(1, -9) && spec_value(0x08) == ldexp(1, -6),
               "the definition's extremes");

    /* 2. encoding at and around every code value and every midpoint between neighbours */
    for (int k = 0; k <= 0x7e; k++) {
        const float v = (float)spec_value(k);
        const float pts[] = {v, nextafterf(v, 0), nextafterf(v, INFINITY)};
        for (int i = 0; i < 3; i++) check_encode(pts[i]), check_encode(-pts[i]);
        if (k == 0x7e) break;
        const float mid = (float)((spec_value(k) + spec_value(k + 1)) / 2);   /* exact in f32 */
        const float around[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 3; i++) check_encode(around[i]), check_encode(-around[i]);
    }

    /* 3. hand-computed values */
    static const struct { float x; uint8_t code; } hand[] = {
        {1.0f, 0x38},   {-2.0f, 0xc0},   {0.0625f, 0x18},   {240.0f, 0x77},   {256.0f, 0x78},   {448.0f, 0x7e},
        {1.0625f, 0x38},   /* midpoint of 1 and 1.125: to the even 1.0 */
        {1.1875f, 0x3a},   /* midpoint of 1.125 and 1.25: to the even 1.25 */
        {0x1.0p-6f, 0x08}, {0x1.0p-9f, 0x01}, {0x1.cp-7f, 0x07},   /* smallest normal, smallest and largest subnormal */
        {0x1.0p-10f, 0x00},   /* half the smallest subnormal: to the even zero */
        {0x1.8p-9f, 0x02},    /* 1.5 x 2^-9: to the even 2 x 2^-9 */
        {0x1.000002p-10f, 0x01}, {-0x1.0p-12f, 0x80}, {0.0f, 0x00}, {-0.0f, 0x80},
        {460.0f, 0x7e}, {464.0f, 0x7e}, {480.0f, 0x7e}, {1e30f, 0x7e}, {-1e30f, 0xfe}, {INFINITY, 0x7e},
        {-INFINITY, 0xfe}, {NAN, 0x7f}, {-NAN, 0x7f},
    };
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++)
        TEST_CHECK(f32_to_fp8_e4m3(hand[i].x) == hand[i].code, "f32_to_fp8_e4m3(%.9g) = 0x%02x, expected 0x%02x",
                   (double)hand[i].x, f32_to_fp8_e4m3(hand[i].x), hand[i].code);

    /* 4. random floats of every magnitude from 2^-14 to 2^10 (both signs) */
    for (uint64_t i = 0; i < 400000; i++) {
        const double e = -14.0 + 24.0 * rng_u01(7, 1, i), m = 1.0 + rng_u01(7, 2, i);
        const float x = (float)ldexp(m, (int)floor(e)) * (rng_u01(7, 3, i) < 0.5 ? -1.0f : 1.0f);
        check_encode(x);
    }
    printf("%d encodings checked against the definition\n", n_checked);

    /* 5. the type in the dtype table */
    uint8_t all[256];
    float f[256];
    for (int c = 0; c < 256; c++) all[c] = (uint8_t)c;
    dtype_to_f32(DTYPE_F8_E4M3, all, f, 256);
    int same = 1;
    for (int c = 0; c < 256; c++) {
        const float g = fp8_e4m3_to_f32((uint8_t)c);
        same &= isnan(g) ? isnan(f[c]) : memcmp(&g, &f[c], 4) == 0;
    }
    TEST_CHECK(same, "dtype_to_f32(DTYPE_F8_E4M3) decodes like fp8_e4m3_to_f32");
    TEST_CHECK(dtype_size(DTYPE_F8_E4M3) == 1 && dtype_row_bytes(DTYPE_F8_E4M3, 300) == 300, "one byte per element");
    TEST_CHECK(strcmp(dtype_name(DTYPE_F8_E4M3), "F8_E4M3") == 0, "named as safetensors names it");
    return test_report();
}
