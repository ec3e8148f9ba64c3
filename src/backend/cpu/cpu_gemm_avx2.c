/*
 * cpu_gemm_avx2.c — the AVX2 (+FMA) kernel family of the GEMM layer (cpu_gemm.h): fp32 FMAs on the
 * packed bf16 weights, widened in registers, for CPUs without AVX512-BF16 (AMD Zen 2/3, Intel
 * Haswell..Comet Lake). The layer's dispatch (cpu_dispatch.c) runs it where it beats the fp32 path:
 * products of few rows, whose time is reading the weights (half the bytes of fp32).
 *
 * A packed group's input pair kk is 16 32-bit words, word r = (W[r][2kk+1] << 16) | W[r][2kk]: one
 * ymm load is 8 outputs' pairs; `w << 16` is the even input as fp32 (a bf16 is the high half of an
 * fp32), `w & 0xffff0000` the odd one. Activations come as fp32 rows holding bf16 values (act_f32:
 * cast once per product, not once per weight panel) and are broadcast from memory.
 * Micro-kernel: MR (<= 5) rows x 1 group (16 outputs) = 10 ymm accumulators, plus 2 widened
 * weight vectors (the even inputs for all rows, then the odd ones), the mask and one broadcast: 14
 * of the 16 ymm registers (6 rows spill). Both inputs of a pair accumulate into the same register;
 * with 10 independent accumulators the two dependent FMAs per pair do not stall (docs/cpu-kernels.md,
 * version log: separate even/odd accumulators cost registers, hence rows, and measured slower). One row: 1 row x 2 groups with separate even/odd accumulators (8), so a
 * single row still has enough independent chains to stream its weights.
 * The whole K runs in registers; the block is stored once. Prefetching as the AVX512-BF16 family
 * (block_pf): the first pass over a panel prefetches its own streams ahead, the later passes the
 * next panel.
 *
 * Compiled for every x86-64 (target attributes, no global -m flags); only called after
 * cpu_features says the CPU (and OS) has AVX2 and FMA. Does not: pack, convert, apply epilogues.
 * Threading: pure functions of their arguments, run on pool slots.
 */
#include <string.h>

#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_build.h"

#if UM_CPU_BUILD_X86
#include <immintrin.h>

#define AVX2_TARGET __attribute__((target("avx2,fma")))

/* Rows per pass of the main micro-kernel (10 accumulators). */
#define MR_MAX 5
/* Pairs ahead of the first pass's own loads its prefetches run (2 KiB per stream, as AVX512-BF16). */
#define PF_AHEAD 32

/* Prefetch, for pair kk, one 64-byte line of each of the npf (<= 4) streams pf[s] (a group's bytes
 * over the whole K: one line per pair). */
AVX2_TARGET __attribute__((always_inline)) static inline void pf_pair(const uint16_t *const *pf, int npf, int64_t kk) {
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++)
        if (s < npf) _mm_prefetch((const char *)(pf[s] + kk * 32), _MM_HINT_T0);
}

/* c[i][0..16) = sum over kp2 pairs of a[i] x group b, for i < MR (rows of a lda floats apart). MR
 * is a constant at every call site, so acc[][] lives in registers. */
AVX2_TARGET __attribute__((always_inline)) static inline void
ukernel(const int MR, const float *a, int64_t lda, const uint16_t *b, int64_t kp2, float *c,
        const uint16_t *const *pf, int npf) {
    __m256 acc[MR_MAX][2];
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 5
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) acc[i][v] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kp2; kk++) {
        pf_pair(pf, npf, kk);
        /* the even inputs for every row, then the odd ones: 2 widened vectors live, not 4 */
        __m256 wv[2];
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++)
            wv[v] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256((const __m256i *)(b + kk * 32 + 16 * v)), 16));
#pragma GCC unroll 5
        for (int i = 0; i < MR; i++) {
            const __m256 x = _mm256_broadcast_ss(a + i * lda + 2 * kk);
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) acc[i][v] = _mm256_fmadd_ps(x, wv[v], acc[i][v]);
        }
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++)
            wv[v] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_load_si256((const __m256i *)(b + kk * 32 + 16 * v)), hi));
#pragma GCC unroll 5
        for (int i = 0; i < MR; i++) {
            const __m256 x = _mm256_broadcast_ss(a + i * lda + 2 * kk + 1);
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) acc[i][v] = _mm256_fmadd_ps(x, wv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 5
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) _mm256_store_ps(c + i * 64 + 8 * v, acc[i][v]);
}

/* One row x NG (1 or 2) groups b[0..NG): c[0][16 j ..] = ..., with separate accumulators for the
 * even and the odd input (8 independent chains for NG = 2). */
AVX2_TARGET __attribute__((always_inline)) static inline void
ukernel_row(const int NG, const float *a, const uint16_t *const *b, int64_t kp2, float *c,
            const uint16_t *const *pf, int npf) {
    __m256 ae[4], ao[4];
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 4
    for (int v = 0; v < 2 * NG; v++) ae[v] = ao[v] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < kp2; kk++) {
        pf_pair(pf, npf, kk);
        const __m256 xe = _mm256_broadcast_ss(a + 2 * kk), xo = _mm256_broadcast_ss(a + 2 * kk + 1);
#pragma GCC unroll 4
        for (int v = 0; v < 2 * NG; v++) {
            const __m256i w = _mm256_load_si256((const __m256i *)(b[v / 2] + kk * 32 + 16 * (v % 2)));
            ae[v] = _mm256_fmadd_ps(xe, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)), ae[v]);
            ao[v] = _mm256_fmadd_ps(xo, _mm256_castsi256_ps(_mm256_and_si256(w, hi)), ao[v]);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < 2 * NG; v++) _mm256_store_ps(c + 8 * v, _mm256_add_ps(ae[v], ao[v]));
}

typedef void (*ukernel_fn)(const float *a, int64_t lda, const uint16_t *b, int64_t kp2, float *c,
                           const uint16_t *const *pf, int npf);

#define UK(mr)                                                                                         \
    AVX2_TARGET static void uk_##mr(const float *a, int64_t lda, const uint16_t *b, int64_t kp2, float *c, \
                                    const uint16_t *const *pf, int npf) {                              \
        ukernel(mr, a, lda, b, kp2, c, pf, npf);                                                       \
    }
UK(2) UK(3) UK(4) UK(5)
#undef UK
static const ukernel_fn k_uk[MR_MAX + 1] = {NULL, NULL, uk_2, uk_3, uk_4, uk_5};

AVX2_TARGET static void uk_row1(const float *a, const uint16_t *const *b, int64_t kp2, float *c,
                                const uint16_t *const *pf, int npf) {
    ukernel_row(1, a, b, kp2, c, pf, npf);
}
AVX2_TARGET static void uk_row2(const float *a, const uint16_t *const *b, int64_t kp2, float *c,
                                const uint16_t *const *pf, int npf) {
    ukernel_row(2, a, b, kp2, c, pf, npf);
}

/* The block in passes of up to MR_MAX rows over the same groups, group by group. Only the first pass
 * reads the groups from memory and prefetches its own streams PF_AHEAD pairs ahead; the later passes
 * prefetch the next panel's groups (next[0..next_ng)), spread over those passes (with a single pass,
 * nothing of the next panel is fetched). */
static void avx2_block_pf(const void *act, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c,
                          const uint16_t *const *next, int next_ng) {
    const float *a = act;
    const int64_t kp2 = kpad / 2;
    const int passes = (m + MR_MAX - 1) / MR_MAX, later = passes - 1;
    int given = 0;   /* next-panel streams handed to passes so far */
    for (int p = 0, i = 0; i < m; p++, i += MR_MAX) {
        const int mr = m - i < MR_MAX ? m - i : MR_MAX;
        const uint16_t *nxt[4];
        int nn = 0;
        if (p > 0 && next) {
            const int upto = (int)(((int64_t)next_ng * p + later - 1) / later);   /* streams due by pass p */
            while (given < upto && nn < 4) nxt[nn++] = next[given++];
        }
        const float *ai = a + (int64_t)i * lda;
        float *ci = c + (int64_t)i * 64;
        for (int j = 0; j < ng; j += mr == 1 ? 2 : 1) {
            const int nj = mr == 1 && j + 1 < ng ? 2 : 1;   /* groups in this call */
            const uint16_t *own[2] = {b[j] + PF_AHEAD * 32, nj == 2 ? b[j + 1] + PF_AHEAD * 32 : NULL};
            /* the first call of a later pass carries the next panel's streams */
            const uint16_t *const *pf = p == 0 ? own : nxt;
            const int npf = p == 0 ? nj : j == 0 ? nn : 0;
            if (mr > 1) k_uk[mr](ai, lda, b[j], kp2, ci + 16 * j, pf, npf);
            else if (nj == 2) uk_row2(ai, b + j, kp2, ci + 16 * j, pf, npf);
            else uk_row1(ai, b + j, kp2, ci + 16 * j, pf, npf);
        }
    }
}

static void avx2_block(const void *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c) {
    avx2_block_pf(a, lda, m, b, ng, kpad, c, NULL, 0);
}

const cpu_gemm_kernel cpu_gemm_avx2 = {.name = "avx2", .act_f32 = 1, .block = avx2_block, .block_pf = avx2_block_pf};

#else /* not x86-64 + GCC: the family exists but is never selected (cpu_features reports it absent) */

const cpu_gemm_kernel cpu_gemm_avx2 = {.name = "avx2", .act_f32 = 1, .block = NULL};   /* not compiled in */

#endif
