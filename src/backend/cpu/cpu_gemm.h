/*
 * cpu_gemm.h — the bf16 GEMM layer of the CPU backend: weights packed once (at upload) into the
 * layout the matrix engines read, activations cast to bf16 once per product (or by the RMSNorm
 * that precedes it), fp32 accumulation, and the epilogue (store, residual add, SwiGLU, bias) done
 * on the accumulator block while it is in cache. Three kernel families behind one table:
 * AVX512-BF16 (cpu_gemm_avx512.c), AMX-BF16 tiles (cpu_gemm_amx.c) and AVX2 fp32 FMAs on weights
 * widened in registers (cpu_gemm_avx2.c); docs/cpu-kernels.md.
 *
 * Packed layout of a weight W[R, C] (R outputs, C inputs), shared by all families: groups of 16
 * output rows; within a group, for each pair of input columns kk (k = 2kk, 2kk+1), the 16 rows'
 * two values side by side (64 bytes):
 *     p[(g * kp2 + kk) * 32 + 2 r + e] = W[16 g + r][2 kk + e]      (zero outside W)
 * with kpad = C rounded up to 32 and kp2 = kpad / 2. One group over 16 k-pairs is exactly an AMX
 * B tile (16 rows of 64 bytes), one k-pair of a group is one zmm operand of vdpbf16ps (and two ymm
 * loads of the AVX2 family).
 * Activations are rows of kpad elements (zero past C) holding bf16 values: bf16 for the AMX and
 * AVX512-BF16 families, the same values stored as fp32 for the AVX2 family (act_f32), which
 * broadcasts them into fp32 FMAs without widening them again for every weight panel.
 *
 * Does not: handle F32/F16 weights (cpu_matmul.c's fp32 path does), own threads (cpu_pool).
 * Threading: cpu_gemm_run is called by the driving thread and fans out on the pool; the kernels
 * run on pool slots, each with its own scratch.
 */
#ifndef UM_CPU_GEMM_H
#define UM_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

typedef struct cpu_pool cpu_pool;

/* A BF16 weight in the packed layout. */
typedef struct cpu_packed {
    uint16_t *p;         /* [n_groups * kp2 * 32] owned, 64-byte aligned */
    int64_t   rows;      /* R */
    int64_t   cols;      /* C */
    int64_t   kpad;      /* C rounded up to 32 */
    int64_t   n_groups;  /* ceil(R / 16) */
} cpu_packed;

/* Rows of output per kernel block: the kernels compute at most GEMM_MB x 64 accumulators at once. */
#define GEMM_MB 48

/* A kernel family. block(): c[i][16 j + l] = sum_k a[i][k] * B_j[k][l] for i < m (<= GEMM_MB),
 * j < ng (<= 4), where a is m activation rows of kpad elements at stride lda elements (bf16, or fp32
 * when act_f32) and B_j the packed group at b[j]; c is [m][64] fp32 (ldc 64). */
typedef struct cpu_gemm_kernel {
    const char *name;
    int         act_f32;   /* activations as fp32 (holding bf16 values), else bf16 */
    void (*block)(const void *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c);
    /* (optional) block() that, while it runs, also prefetches the next_ng groups at next[] (the
     * panel this slot computes next; next == NULL: none), so that a panel streamed from memory
     * arrives during the previous panel's compute. Same results as block(). */
    void (*block_pf)(const void *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c,
                     const uint16_t *const *next, int next_ng);
    /* per pool slot, around a run of blocks (AMX: load / release the tile configuration); may be NULL */
    void (*begin)(void);
    void (*end)(void);
} cpu_gemm_kernel;

extern const cpu_gemm_kernel cpu_gemm_avx512bf16;
extern const cpu_gemm_kernel cpu_gemm_amx;
extern const cpu_gemm_kernel cpu_gemm_avx2;

/* Bytes per activation element family k reads. */
static inline size_t cpu_gemm_act_size(const cpu_gemm_kernel *k) { return k->act_f32 ? sizeof(float) : sizeof(uint16_t); }

/* What a product does with its accumulators. */
enum cpu_epi {
    CPU_EPI_STORE,    /* y = acc (+ bias) */
    CPU_EPI_ADD,      /* y += acc (+ bias): the residual add */
    CPU_EPI_SWIGLU,   /* y = silu(acc of w) * (acc of w2): gate and up products fused */
};

/* One product of a cpu_gemm_run: y[i, :] = epi(a[i, :] . w^T) for the run's rows. */
typedef struct cpu_gemm_out {
    const cpu_packed *w;
    const cpu_packed *w2;      /* CPU_EPI_SWIGLU: the up weight (same shape as w), else NULL */
    enum cpu_epi      epi;
    const bweight    *bias;    /* [w.rows] or NULL (not with SWIGLU) */
    float            *y;       /* [m, w.rows] */
} cpu_gemm_out;

/* The epilogue of a block: m rows of the block buffer c ([m][64]) into y (rows ldy apart), ncols
 * columns. SWIGLU: the gate is c[i][0..half), the up product c[i][half..2 half). bias: [ncols]
 * (zeros when there is none). Shared with the quantized layer (cpu_qgemm.h). */
void cpu_gemm_epi_rows(enum cpu_epi epi, const float *c, int m, int ncols, int half, const float *bias, float *y,
                       int64_t ldy);

/* Pack a BF16 weight [rows, cols] (row-major, any alignment) into *out (allocated). Parallel over
 * groups on the pool. */
void cpu_packed_init(cpu_packed *out, const uint16_t *w, int64_t rows, int64_t cols, cpu_pool *pool);
void cpu_packed_free(cpu_packed *pw);

/* Groups g0 .. g0+ng of a packed weight widened to fp32, input-major: dst[k * 16 ng + 16 (g - g0) + r]
 * = W[16 g + r][k] for k < cols (rows past R are zero): the B operand of an sgemm (no transpose,
 * ldb = 16 ng) for the fp32 path on packed weights. */
void cpu_packed_widen(const cpu_packed *pw, int64_t g0, int64_t ng, float *dst);

/* Run the products outs[0..n_out) on the same activations a ([m, kpad] rows, lda elements apart, in
 * k's element type) as one parallel run on the pool. Every out's weight has a.kpad == w.kpad. */
void cpu_gemm_run(cpu_pool *pool, const cpu_gemm_kernel *k, const void *a, int64_t lda, int64_t m,
                  const cpu_gemm_out *outs, int n_out);

/* Activations for family k: dst[i, 0..kpad) = bf16(x[i, 0..cols)) then zeros, for n rows, stored as
 * bf16 or (k->act_f32) as fp32; with norm, x is RMS-normalised first (docs/model-spec.md RMSNorm:
 * in fp32, times the weight). */
void cpu_act_to_bf16(cpu_pool *pool, const cpu_gemm_kernel *k, const float *x, int64_t n, int64_t cols, int64_t kpad,
                     const bweight *norm, float eps, void *dst);

/* One row: dst[0..cols) = bf16(w[j] * (x[j] * scale)) (w == NULL: bf16(x[j]), scale unused), then
 * zeros up to kpad. The _f32 variant stores the same bf16 values as fp32. */
void cpu_row_to_bf16(const float *x, int64_t cols, int64_t kpad, const float *w, float scale, uint16_t *dst);
void cpu_row_to_bf16_f32(const float *x, int64_t cols, int64_t kpad, const float *w, float scale, float *dst);

#endif /* UM_CPU_GEMM_H */
