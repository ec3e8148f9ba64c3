/*
 * cpu_qgemm_avx512.c — the AVX512-VNNI kernel family of the quantized GEMM layer (cpu_qgemm.h):
 * vpdpbusd on zmm, 16 outputs x 4 inputs per instruction, straight from the packed layout.
 *
 * vpdpbusd multiplies unsigned bytes by signed ones, so the weights are made the unsigned operand:
 * a Q8_0 quant q becomes q + 128 (q ^ 0x80), a Q4_0 nibble u is already u in [0, 15]; the activation
 * (int8) is the signed one. The int32 accumulator of a block starts at -128 * sum(x) (Q8_0) or
 * -8 * sum(x) (Q4_0), which takes the offset out exactly: it ends at the block's true dot product.
 * Then, per block, fp32 += fma(float(dot), dw * dx): the numerics of cpu_qgemm.h, bit for bit.
 *
 * Micro-kernel: MR rows x NG groups, MR * NG <= 12 (12 int32 + 12 fp32 accumulators in zmm registers).
 * Per 4-input step it loads NG 64-byte weight lines (Q4_0: one line feeds two steps, low and high
 * nibbles), broadcasts each row's 4 activation bytes and issues MR x NG vpdpbusd. The whole K runs in
 * registers; the block is stored once.
 *
 * Compiled for every x86-64 (target attributes); only called after cpu_features found AVX512-VNNI.
 * Threading: pure functions of their arguments, run on pool slots.
 */
#include <string.h>

#include "backend/cpu/cpu_qgemm.h"
#include "backend/cpu/cpu_build.h"

#if UM_CPU_BUILD_X86
#include <immintrin.h>

#define VNNI512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))

VNNI512_TARGET __attribute__((always_inline)) static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* c[i][16 j + l] for i < MR, j < NG over all blocks; Q4 selects the type. */
VNNI512_TARGET __attribute__((always_inline)) static inline void
ukernel(const int Q4, const int MR, const int NG, const cpu_qact *a, int64_t i0, const uint8_t *const *b, float *c) {
    const enum dtype t = Q4 ? DTYPE_Q4_0 : DTYPE_Q8_0;
    __m512 accf[4][4];
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xs[4];
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        xq[i] = a->q + (i0 + i) * a->kpad;
        xd[i] = a->d + (i0 + i) * a->nb;
        xs[i] = a->s + (i0 + i) * a->nb;
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) accf[i][j] = _mm512_setzero_ps();
    }
    const __m512i m80 = _mm512_set1_epi8((char)0x80), m0f = _mm512_set1_epi8(0x0f);
    for (int64_t bk = 0; bk < a->nb; bk++) {
        __m512i acc[4][4];
        const uint8_t *qs[4];
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) qs[j] = cpu_qblock_qs(b[j], t, bk);
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const __m512i corr = _mm512_set1_epi32(-xs[i][bk] * (Q4 ? 8 : 128));
#pragma GCC unroll 4
            for (int j = 0; j < NG; j++) acc[i][j] = corr;
        }
        const int8_t *xb[4];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) xb[i] = xq[i] + 32 * bk;
        if (!Q4) {
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                __m512i w[4];
#pragma GCC unroll 4
                for (int j = 0; j < NG; j++) w[j] = _mm512_xor_si512(_mm512_load_si512((const void *)(qs[j] + 64 * s)), m80);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m512i x = bcast4(xb[i] + 4 * s);
#pragma GCC unroll 4
                    for (int j = 0; j < NG; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], w[j], x);
                }
            }
        } else {
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                __m512i raw[4], w[4];
#pragma GCC unroll 4
                for (int j = 0; j < NG; j++) {
                    raw[j] = _mm512_load_si512((const void *)(qs[j] + 64 * p));
                    w[j] = _mm512_and_si512(raw[j], m0f);
                }
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m512i x = bcast4(xb[i] + 4 * p);
#pragma GCC unroll 4
                    for (int j = 0; j < NG; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], w[j], x);
                }
#pragma GCC unroll 4
                for (int j = 0; j < NG; j++) w[j] = _mm512_and_si512(_mm512_srli_epi16(raw[j], 4), m0f);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m512i x = bcast4(xb[i] + 16 + 4 * p);
#pragma GCC unroll 4
                    for (int j = 0; j < NG; j++) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], w[j], x);
                }
            }
        }
        __m512 dw[4];
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const void *)cpu_qblock_d(b[j], t, bk)));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const __m512 dx = _mm512_set1_ps(xd[i][bk]);
#pragma GCC unroll 4
            for (int j = 0; j < NG; j++)
                accf[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i][j]), _mm512_mul_ps(dw[j], dx), accf[i][j]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) _mm512_store_ps(c + i * 64 + j * 16, accf[i][j]);
}

typedef void (*ukernel_fn)(const cpu_qact *a, int64_t i0, const uint8_t *const *b, float *c);

#define UK(q4, mr, ng)                                                                                            \
    VNNI512_TARGET static void uk_##q4##_##mr##_##ng(const cpu_qact *a, int64_t i0, const uint8_t *const *b,      \
                                                     float *c) {                                                  \
        ukernel(q4, mr, ng, a, i0, b, c);                                                                         \
    }
/* rows x groups: 1..4 x 1..3 and 1..3 x 4 (at most 12 accumulator pairs) */
#define UK_T(q4)                                                                                                  \
    UK(q4, 1, 1) UK(q4, 1, 2) UK(q4, 1, 3) UK(q4, 1, 4) UK(q4, 2, 1) UK(q4, 2, 2) UK(q4, 2, 3) UK(q4, 2, 4)        \
    UK(q4, 3, 1) UK(q4, 3, 2) UK(q4, 3, 3) UK(q4, 3, 4) UK(q4, 4, 1) UK(q4, 4, 2) UK(q4, 4, 3)
UK_T(0)
UK_T(1)
#undef UK_T
#undef UK

#define UK_ROW(q4, mr) {uk_##q4##_##mr##_1, uk_##q4##_##mr##_2, uk_##q4##_##mr##_3, uk_##q4##_##mr##_4}
static const ukernel_fn k_uk[2][4][4] = {
    {UK_ROW(0, 1), UK_ROW(0, 2), UK_ROW(0, 3), {uk_0_4_1, uk_0_4_2, uk_0_4_3, NULL}},
    {UK_ROW(1, 1), UK_ROW(1, 2), UK_ROW(1, 3), {uk_1_4_1, uk_1_4_2, uk_1_4_3, NULL}},
};
#undef UK_ROW

/* The block in passes of up to 4 rows (3 with 4 groups) over the same groups: the first pass reads
 * them from memory, the later ones from cache. */
static void vnni512_block(enum dtype t, const cpu_qact *a, int64_t i0, int m, const uint8_t *const *b, int ng,
                          float *c) {
    const int q4 = t == DTYPE_Q4_0, mr_max = ng == 4 ? 3 : 4;
    for (int i = 0; i < m; i += mr_max) {
        const int mr = m - i < mr_max ? m - i : mr_max;
        k_uk[q4][mr - 1][ng - 1](a, i0 + i, b, c + (int64_t)i * 64);
    }
}

const cpu_qgemm_kernel cpu_qgemm_avx512vnni = {.name = "avx512vnni", .block = vnni512_block};

#else /* not x86-64 + GCC: never selected (cpu_features reports it absent) */

const cpu_qgemm_kernel cpu_qgemm_avx512vnni = {.name = "avx512vnni", .block = NULL};

#endif
