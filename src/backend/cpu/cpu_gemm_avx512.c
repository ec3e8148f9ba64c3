/*
 * cpu_gemm_avx512.c — the AVX512-BF16 kernel family of the GEMM layer (cpu_gemm.h): vdpbf16ps on
 * packed weight groups, fp32 accumulators in zmm registers.
 *
 * Micro-kernel: MR (<= 6) activation rows x NG (<= 4) groups of 16 outputs = up to 24 accumulators.
 * Per input pair kk it loads one 64-byte vector per group (16 outputs x 2 inputs), broadcasts the
 * row's two bf16 inputs (32 bits) and issues MR x NG vdpbf16ps. The whole K runs in registers; the
 * block is stored once (cutting K into L1-sized chunks measured no faster on Zen 5: its 1 MiB L2
 * feeds the four weight streams at full rate). A block runs in passes of 6 rows; with weights that
 * come from memory the first pass waits on DRAM, so it prefetches ahead of itself and the later
 * passes prefetch the panel the slot computes next (block_pf). Version log and timings:
 * docs/cpu-kernels.md.
 *
 * Compiled for every x86-64 (target attributes, no global -m flags); only called after
 * cpu_features says the CPU has AVX512-BF16. Does not: pack, convert, apply epilogues.
 * Threading: pure functions of their arguments, run on pool slots.
 */
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_build.h"

#if UM_CPU_BUILD_X86
#include <immintrin.h>

#define AVX512BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* c[i][16 j + l] for i < MR, j < NG over kp2 input pairs. MR and NG are constants at every call
 * site, so the arrays below live in registers. While it runs, the kernel also prefetches npf (<= 4)
 * streams: the line at pf[s] + 64 kk bytes for every input pair kk (one 64-byte line per stream per
 * pair: exactly a group's bytes over the whole K). */
AVX512BF16_TARGET __attribute__((always_inline)) static inline void
ukernel(const int MR, const int NG, const uint16_t *a, int64_t lda, const uint16_t *const *b, int64_t kp2, float *c,
        const uint16_t *const *pf, int npf) {
    __m512 acc[6][4];
    const uint16_t *bp[4];
    /* every loop but the one over kk is unrolled completely, so acc[][] lives in registers */
#pragma GCC unroll 4
    for (int j = 0; j < NG; j++) bp[j] = b[j];
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < kp2; kk++) {
        __m512bh bv[4];
#pragma GCC unroll 4
        for (int s = 0; s < 4; s++)
            if (s < npf) _mm_prefetch((const char *)(pf[s] + kk * 32), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) bv[j] = (__m512bh)_mm512_load_si512((const void *)(bp[j] + kk * 32));
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            int32_t pair;
            memcpy(&pair, a + i * lda + 2 * kk, sizeof pair);
            __m512bh av = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
            for (int j = 0; j < NG; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int j = 0; j < NG; j++) _mm512_store_ps(c + i * 64 + j * 16, acc[i][j]);
}

typedef void (*ukernel_fn)(const uint16_t *a, int64_t lda, const uint16_t *const *b, int64_t kp2, float *c,
                           const uint16_t *const *pf, int npf);

#define UK(mr, ng)                                                                                          \
    AVX512BF16_TARGET static void uk_##mr##_##ng(const uint16_t *a, int64_t lda, const uint16_t *const *b, \
                                                 int64_t kp2, float *c, const uint16_t *const *pf, int npf) { \
        ukernel(mr, ng, a, lda, b, kp2, c, pf, npf);                                                        \
    }
#define UK_ROW(mr) UK(mr, 1) UK(mr, 2) UK(mr, 3) UK(mr, 4)
UK_ROW(1) UK_ROW(2) UK_ROW(3) UK_ROW(4) UK_ROW(5) UK_ROW(6)
#undef UK_ROW
#undef UK

#define UK_ROW(mr) {uk_##mr##_1, uk_##mr##_2, uk_##mr##_3, uk_##mr##_4}
static const ukernel_fn k_uk[6][4] = {UK_ROW(1), UK_ROW(2), UK_ROW(3), UK_ROW(4), UK_ROW(5), UK_ROW(6)};
#undef UK_ROW

/* Pairs ahead of the first pass's own loads its prefetches run (2 KiB per stream): measured on Zen 5
 * with weights streamed from memory, 32 and 64 were best, 8 and 128+ worse (docs/cpu-kernels.md). */
#define PF_AHEAD 32

/* The block in passes of up to 6 rows over the same weight groups. Only the first pass reads the
 * groups from memory; it prefetches its own streams PF_AHEAD pairs ahead. The later passes find them
 * in cache and prefetch the next panel's groups instead, spread over those passes (with a single
 * pass, nothing of the next panel is fetched). */
static void avx512_block_pf(const void *act, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad,
                            float *c, const uint16_t *const *next, int next_ng) {
    const uint16_t *a = act;
    const int passes = (m + 5) / 6;
    const int later = passes - 1;
    int given = 0;   /* next-panel streams handed to passes so far */
    for (int p = 0, i = 0; i < m; p++, i += 6) {
        const int mr = m - i < 6 ? m - i : 6;
        const uint16_t *pf[4];
        int npf = 0;
        if (p == 0) {
            for (int j = 0; j < ng; j++) pf[npf++] = b[j] + PF_AHEAD * 32;
        } else if (next) {
            const int upto = (int)(((int64_t)next_ng * p + later - 1) / later);   /* streams due by pass p */
            while (given < upto && npf < 4) pf[npf++] = next[given++];
        }
        k_uk[mr - 1][ng - 1](a + (int64_t)i * lda, lda, b, kpad / 2, c + (int64_t)i * 64, pf, npf);
    }
}

static void avx512_block(const void *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad,
                         float *c) {
    avx512_block_pf(a, lda, m, b, ng, kpad, c, NULL, 0);
}

const cpu_gemm_kernel cpu_gemm_avx512bf16 = {.name = "avx512bf16", .block = avx512_block, .block_pf = avx512_block_pf};

#else /* not x86-64 + GCC: the family exists but is never selected (cpu_features reports it absent) */

const cpu_gemm_kernel cpu_gemm_avx512bf16 = {.name = "avx512bf16", .block = NULL};   /* not compiled in */

#endif
