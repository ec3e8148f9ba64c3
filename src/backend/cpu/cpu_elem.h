/*
 * cpu_elem.h — element conversions of the CPU backend below its GEMM layers and ops: a weight's
 * elements as fp32 (cpu_elem.c), and branch-free scalar helpers (bf16 / f16 / fp32 bits, expf)
 * inlined into `#pragma omp simd` loops. Pure; any thread.
 */
#ifndef UM_CPU_ELEM_H
#define UM_CPU_ELEM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"

/* Convert n elements of a weight (F32 / BF16 / F16, or a view of Q8_0 / Q4_0 rows: whole blocks)
 * starting at element offset off into dst. */
void cpu_weight_to_f32(const bweight *w, size_t off, size_t n, float *dst);

/* ---------------------------------------------------------------- scalar helpers (inlined into
 * `#pragma omp simd` loops, so they are written without branches) */

static inline float cpu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t cpu_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* float -> bf16, round to nearest even, NaN kept quiet: util/dtype.h's f32_to_bf16 without the
 * branch, so it vectorises. */
static inline uint16_t cpu_f32_to_bf16(float f) {
    uint32_t u = cpu_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* IEEE half -> float without branches and without denormal arithmetic (the pool runs with
 * FTZ/DAZ, which would zero a denormal intermediate): normal halves are rebiased in the integer
 * domain, subnormal ones are their integer mantissa times 2^-24 (exact), Inf/NaN keep their payload.
 * Exact for all 65536 inputs in either floating-point mode. */
static inline float cpu_f16_to_f32(uint16_t h) {
    uint32_t a = h & 0x7fffu;
    float sub = (float)(int32_t)a * cpu_bits_f32(0x33800000u);   /* a * 2^-24, used when a < 0x400 */
    uint32_t u = a >= 0x7c00u ? (a << 13) | 0x7f800000u : (a << 13) + 0x38000000u;
    u = a < 0x400u ? cpu_f32_bits(sub) : u;
    u |= (uint32_t)(h & 0x8000u) << 16;
    return cpu_bits_f32(u);
}

/* exp(x) for x in float range, relative error ~2 ulp; x <= -87 gives ~1.6e-38 (callers zero
 * masked entries themselves). Polynomial from the classic Cephes expf. */
static inline float cpu_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.3f ? 88.3f : x;
    float fx = x * 1.44269504088896341f;
    float n = (fx + 12582912.0f) - 12582912.0f;   /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    return p * cpu_bits_f32((uint32_t)e << 23);
}

#endif /* UM_CPU_ELEM_H */
