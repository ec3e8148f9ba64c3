/*
 * quant.c — the reference quantization of rows into Q8_0 / Q4_0 blocks (GGUF's rounding) and back
 * (quant.h).
 * Pure functions, any thread.
 */
/* x * id + 8.5 must round twice, as the definition does: no fused multiply-add in the AVX2 clone */
#pragma GCC optimize("fp-contract=off")

#include "util/quant.h"

#include <math.h>
#include <string.h>

#include "util/log.h"

/* The loops below are written so that GCC vectorizes them (max by compare, rounding through an
 * integer conversion), with an AVX2 clone picked at load time, and still give the reference's
 * results exactly: quantizing an 8B model's weights at load was half libm calls (roundf, fmaxf).
 * Not under ThreadSanitizer: its runtime is not up when the ifunc resolvers run. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define QUANT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define QUANT_CLONES
#endif

/* max |x[j]| over one block (NaN ignored, as fmaxf does) */
static inline float block_amax(const float *x) {
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int j = 0; j < DTYPE_QBLOCK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* roundf(v), ties away from zero, for |v| < 2^23: the integer part by truncation, exact remainder */
static inline int32_t round_away(float v) {
    const int32_t i = (int32_t)v;
    const float fr = v - (float)i;
    return i + (fr >= 0.5f) - (fr <= -0.5f);
}

QUANT_CLONES static void q8_0_quantize(const float *x, quant_block_q8_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += DTYPE_QBLOCK) {
        const float amax = block_amax(x);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int8_t q[DTYPE_QBLOCK];
#pragma omp simd
        for (int j = 0; j < DTYPE_QBLOCK; j++) q[j] = (int8_t)round_away(x[j] * id);
        y[b].d = f32_to_f16(d);
        memcpy(y[b].qs, q, sizeof q);
    }
}

QUANT_CLONES static void q4_0_quantize(const float *x, quant_block_q4_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += DTYPE_QBLOCK) {
        /* the value of largest magnitude, with its sign: the first one (a strict > scan keeps it) */
        const float amax = block_amax(x);
        float vmax = 0.0f;
        for (int j = 0; j < DTYPE_QBLOCK && amax != 0.0f; j++)
            if (fabsf(x[j]) == amax) {
                vmax = x[j];
                break;
            }
        const float d = vmax / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        uint8_t q[DTYPE_QBLOCK];
#pragma omp simd
        for (int j = 0; j < DTYPE_QBLOCK; j++) {   /* x * id + 8.5 is in [0.5, 16.5]: truncation = (int8_t) */
            const int32_t v = (int32_t)(x[j] * id + 8.5f);
            q[j] = (uint8_t)(v > 15 ? 15 : v);
        }
        for (int j = 0; j < DTYPE_QBLOCK / 2; j++) y[b].qs[j] = (uint8_t)(q[j] | (q[j + DTYPE_QBLOCK / 2] << 4));
    }
}

void quant_row_quantize(enum dtype type, const float *x, void *y, int64_t n) {
    CHECK(n % DTYPE_QBLOCK == 0);
    if (type == DTYPE_Q8_0) q8_0_quantize(x, y, n / DTYPE_QBLOCK);
    else if (type == DTYPE_Q4_0) q4_0_quantize(x, y, n / DTYPE_QBLOCK);
    else UM_FATAL("quant_row_quantize: %s is not a quantized type", dtype_name(type));
}

void quant_row_dequantize(enum dtype type, const void *x, float *y, int64_t n) {
    CHECK(n % DTYPE_QBLOCK == 0);
    const int64_t nb = n / DTYPE_QBLOCK;
    if (type == DTYPE_Q8_0) {
        const quant_block_q8_0 *b = x;
        for (int64_t i = 0; i < nb; i++) {
            const float d = f16_to_f32(b[i].d);
            for (int j = 0; j < DTYPE_QBLOCK; j++) y[i * DTYPE_QBLOCK + j] = d * (float)b[i].qs[j];
        }
    } else if (type == DTYPE_Q4_0) {
        const quant_block_q4_0 *b = x;
        for (int64_t i = 0; i < nb; i++) {
            const float d = f16_to_f32(b[i].d);
            for (int j = 0; j < DTYPE_QBLOCK / 2; j++) {
                y[i * DTYPE_QBLOCK + j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
                y[i * DTYPE_QBLOCK + j + DTYPE_QBLOCK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
    } else {
        UM_FATAL("quant_row_dequantize: %s is not a quantized type", dtype_name(type));
    }
}
