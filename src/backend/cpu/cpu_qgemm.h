/*
 * cpu_qgemm.h — the quantized GEMM layer of the CPU backend: products y = x · Wᵀ with W in Q8_0 or
 * Q4_0 (blocks of 32 weights with an f16 scale, util/quant.h), activations quantized per row into
 * blocks of 32 int8 with an f32 scale, int32 dot products per block and fp32 accumulation, with the
 * bf16 layer's epilogues (store, residual add, SwiGLU, bias: cpu_gemm.h). Kernel families: scalar
 * (the reference), AVX2 (vpmaddubsw / vpmaddwd), AVX-VNNI (vpdpbusd on ymm), AVX512-VNNI (vpdpbusd
 * on zmm); cpu_features picks one at run time. docs/cpu-kernels.md, "Quantized weights".
 *
 * Packed layout of a quantized weight W[R, C] (R outputs, C inputs; kpad = C rounded up to 32, nb =
 * kpad / 32 blocks per row): groups of 16 output rows (zero rows past R). A group holds its blocks
 * in pairs; pair p is the 16 scales of block 2p then the 16 of block 2p+1 (f16, 64 bytes), then the
 * quants of block 2p, then those of block 2p+1 (QB bytes each; an odd last block pairs with nothing):
 *   Q8_0 (QB = 512): byte 64 s + 4 r + c = q[16 g + r][32 b + 4 s + c]            (s < 8: 4 inputs)
 *   Q4_0 (QB = 256): byte 64 p + 4 r + c = GGUF byte qs[4 p + c] of row 16 g + r's block b       (p < 4):
 *                    low nibble = input 32 b + 4 p + c, high nibble = input 32 b + 16 + 4 p + c
 * So a 64-byte line is 16 outputs x 4 inputs — one zmm vpdpbusd, two ymm ones — and the bytes are
 * the GGUF blocks' own, reordered: a Q8_0 / Q4_0 tensor is repacked, not converted, and takes the
 * memory it takes in the file (plus zero rows up to a multiple of 16).
 *
 * Numerics, the same in every family (so each one equals the scalar reference bit for bit, and 1 or
 * n threads, or any row count, give identical results): activation row i, block b is
 * qx = rint(x / dx) with dx = max|x| / 127 (int8 in [-127, 127], dx f32), and
 *     y[i][r] = fma(dot_b, dw_b * dx_b, ... fma(dot_0, dw_0 * dx_0, 0))
 * over the blocks in order, dot_b the exact int32 dot product of the block's quants (Q4_0: q - 8),
 * dw_b the weight block's scale as f32 and each product / fma rounded to f32.
 *
 * Does not: choose the family (cpu_backend.c, from cpu_features), handle bf16/f32 weights (cpu_gemm.h,
 * cpu_matmul.c), own threads (cpu_pool).
 * Threading: cpu_qpacked_init, cpu_act_to_q8 and cpu_qgemm_run are called by the driving thread and
 * fan out on the pool; the kernels run on pool slots.
 */
#ifndef UM_CPU_QGEMM_H
#define UM_CPU_QGEMM_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_gemm.h"

typedef struct cpu_pool cpu_pool;

/* A Q8_0 / Q4_0 weight in the packed layout. */
typedef struct cpu_qpacked {
    enum dtype type;       /* DTYPE_Q8_0 or DTYPE_Q4_0 */
    uint8_t   *p;          /* [n_groups * gbytes] owned, 64-byte aligned */
    int64_t    rows;       /* R */
    int64_t    cols;       /* C */
    int64_t    kpad;       /* C rounded up to 32 */
    int64_t    nb;         /* kpad / 32 blocks per row */
    int64_t    n_groups;   /* ceil(R / 16) */
    int64_t    gbytes;     /* bytes of one group */
} cpu_qpacked;

/* Quant bytes of one block of 16 rows: 512 (Q8_0) or 256 (Q4_0). */
static inline int64_t cpu_qblock_bytes(enum dtype t) { return t == DTYPE_Q8_0 ? 512 : 256; }
/* Block b's 16 scales (f16) and its quants inside a group starting at g. */
static inline const uint16_t *cpu_qblock_d(const uint8_t *g, enum dtype t, int64_t b) {
    return (const uint16_t *)(g + (b / 2) * (64 + 2 * cpu_qblock_bytes(t)) + (b & 1) * 32);
}
static inline const uint8_t *cpu_qblock_qs(const uint8_t *g, enum dtype t, int64_t b) {
    return g + (b / 2) * (64 + 2 * cpu_qblock_bytes(t)) + 64 + (b & 1) * cpu_qblock_bytes(t);
}

/* Activations quantized for the kernels: rows of kpad int8 (zero past the row's columns), one scale
 * and the sum of the quants per block of 32. */
typedef struct cpu_qact {
    const int8_t  *q;      /* [m, kpad] */
    const float   *d;      /* [m, nb] */
    const int32_t *s;      /* [m, nb] sum of the block's 32 quants */
    int64_t        kpad, nb;
} cpu_qact;

/* A kernel family. block(): c[i][16 j + l] for rows i0 .. i0 + m - 1 of a (m <= GEMM_MB) and the
 * groups b[0 .. ng) (ng <= 4, each a group's start in a packed weight of type t with a->nb blocks),
 * computed as the module comment says; c is [m][64] (columns past 16 ng untouched). */
typedef struct cpu_qgemm_kernel {
    const char *name;
    void (*block)(enum dtype t, const cpu_qact *a, int64_t i0, int m, const uint8_t *const *b, int ng, float *c);
} cpu_qgemm_kernel;

extern const cpu_qgemm_kernel cpu_qgemm_scalar;
extern const cpu_qgemm_kernel cpu_qgemm_avx2;        /* .block NULL when not compiled in */
extern const cpu_qgemm_kernel cpu_qgemm_avxvnni;
extern const cpu_qgemm_kernel cpu_qgemm_avx512vnni;

/* Pack a weight [rows, cols] (row-major, any alignment) of type src_type into *out (allocated), type
 * `type` (Q8_0 / Q4_0): a float source (F32, BF16, F16) is quantized row by row (util/quant.h, the
 * GGUF reference rounding; columns past cols are zeros), a source of type `type` is repacked as it
 * is (cols a multiple of 32). Parallel over groups on the pool. */
void cpu_qpacked_init(cpu_qpacked *out, enum dtype type, const void *src, enum dtype src_type, int64_t rows,
                      int64_t cols, cpu_pool *pool);
void cpu_qpacked_free(cpu_qpacked *w);
/* Row r's blocks back in the GGUF layout (nb blocks of 34 / 18 bytes at dst): what was packed. */
void cpu_qpacked_row(const cpu_qpacked *w, int64_t r, void *dst);

/* Bytes of the activation buffer for n rows of kpad inputs (q, d and s, each 64-byte aligned). */
size_t cpu_qact_bytes(int64_t n, int64_t kpad);
/* Quantize n rows of x ([n, cols]) into buf (cpu_qact_bytes) and describe them in *a; with norm, x
 * is RMS-normalised first (as cpu_act_to_bf16 does). Parallel over rows on the pool. */
void cpu_act_to_q8(cpu_pool *pool, const float *x, int64_t n, int64_t cols, int64_t kpad, const bweight *norm,
                   float eps, void *buf, cpu_qact *a);

/* One product of a cpu_qgemm_run: y[i, :] = epi(a[i, :] . w^T). */
typedef struct cpu_qgemm_out {
    const cpu_qpacked *w;
    const cpu_qpacked *w2;     /* CPU_EPI_SWIGLU: the up weight (same shape and type as w), else NULL */
    enum cpu_epi       epi;
    const bweight     *bias;   /* [w.rows] or NULL (not with SWIGLU) */
    float             *y;      /* [m, w.rows] */
} cpu_qgemm_out;

/* Run the products outs[0 .. n_out) (n_out <= 4, every weight with a->kpad inputs) on the m rows of a
 * as one parallel run on the pool (panels of 64 outputs, rows in chunks, as cpu_gemm_run). */
void cpu_qgemm_run(cpu_pool *pool, const cpu_qgemm_kernel *k, const cpu_qact *a, int64_t m, const cpu_qgemm_out *outs,
                   int n_out);

/* The kernels of int8 family k (cpu_features.h: cpu_qkernels_resolve() picks k). */
const cpu_qgemm_kernel *cpu_qkernels_family(enum cpu_qkernels k);

#endif /* UM_CPU_QGEMM_H */
