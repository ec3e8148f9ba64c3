/*
 * cpu_gemm.h — the bf16 GEMM layer of the CPU backend: weights packed once (at upload) into the
 * layout the matrix engines read, activations cast to bf16 once per product (or by the RMSNorm
 * that precedes it), fp32 accumulation, and the epilogue (store, residual add, SwiGLU, bias) done
 * on the accumulator block while it is in cache. Two kernel families behind one dispatch table:
 * AVX512-BF16 (cpu_gemm_avx512.c) and AMX-BF16 tiles (cpu_gemm_amx.c); docs/cpu-kernels.md.
 *
 * Packed layout of a weight W[R, C] (R outputs, C inputs), shared by both families: groups of 16
 * output rows; within a group, for each pair of input columns kk (k = 2kk, 2kk+1), the 16 rows'
 * two values side by side (64 bytes):
 *     p[(g * kp2 + kk) * 32 + 2 r + e] = W[16 g + r][2 kk + e]      (zero outside W)
 * with kpad = C rounded up to 32 and kp2 = kpad / 2. One group over 16 k-pairs is exactly an AMX
 * B tile (16 rows of 64 bytes), and one k-pair of a group is one zmm operand of vdpbf16ps.
 * Activations are bf16 rows of kpad elements (zero past C).
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
 * j < ng (<= 4), where a is m bf16 rows of kpad elements at stride lda and B_j the packed group at
 * b[j]; c is [m][64] fp32 (ldc 64). */
typedef struct cpu_gemm_kernel {
    const char *name;
    void (*block)(const uint16_t *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c);
    /* (optional) block() that, while it runs, also prefetches the next_ng groups at next[] (the
     * panel this slot computes next; next == NULL: none), so that a panel streamed from memory
     * arrives during the previous panel's compute. Same results as block(). */
    void (*block_pf)(const uint16_t *a, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad, float *c,
                     const uint16_t *const *next, int next_ng);
    /* per pool slot, around a run of blocks (AMX: load / release the tile configuration); may be NULL */
    void (*begin)(void);
    void (*end)(void);
} cpu_gemm_kernel;

extern const cpu_gemm_kernel cpu_gemm_avx512bf16;
extern const cpu_gemm_kernel cpu_gemm_amx;

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

/* Run the products outs[0..n_out) on the same bf16 activations a ([m, kpad] rows, lda elements
 * apart) as one parallel run on the pool. Every out's weight has a.kpad == w.kpad. */
void cpu_gemm_run(cpu_pool *pool, const cpu_gemm_kernel *k, const uint16_t *a, int64_t lda, int64_t m,
                  const cpu_gemm_out *outs, int n_out);

/* Activations for the kernels: dst[i, 0..kpad) = bf16(x[i, 0..cols)) then zeros, for n rows; with
 * norm, x is RMS-normalised first (docs/model-spec.md RMSNorm: in fp32, times the weight). */
void cpu_act_to_bf16(cpu_pool *pool, const float *x, int64_t n, int64_t cols, int64_t kpad, const bweight *norm,
                     float eps, uint16_t *dst);

/* One row: dst[0..cols) = bf16(w[j] * (x[j] * scale)) (w == NULL: bf16(x[j]), scale unused), then
 * zeros up to kpad. */
void cpu_row_to_bf16(const float *x, int64_t cols, int64_t kpad, const float *w, float scale, uint16_t *dst);

#endif /* UM_CPU_GEMM_H */
