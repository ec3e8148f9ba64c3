/*
 * um_kernels.h — the C-callable launchers of the CUDA kernels in kernels/ (*.cu) (sm_90).
 *
 * Every launcher enqueues work on `stream` and returns cudaGetLastError() (cudaSuccess = 0), so the
 * host side (src/backend/cuda/) wraps each call in CUDA_CHECK. Element types: activations and
 * weights are bf16 (passed as uint16_t bit patterns so C code needs no CUDA headers beyond the
 * runtime API); accumulation is fp32 everywhere. All pointers are DEVICE pointers unless a comment
 * says otherwise. Index arrays (ids, rows, positions, sequence offsets) are int32.
 *
 * Does not: allocate, synchronise, or validate per-request input (the host side CHECKs indices
 * before staging them). Any host thread may call a launcher for a stream it owns.
 */
#ifndef UM_KERNELS_H
#define UM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "backend/backend_decode_types.h"   /* umk_seq_state, umk_sample_job, ... (shared with decode/) */

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- skinny GEMM and FP8 (gemm.cu) */

/* y = x · Wᵀ for at most UMK_GEMM_SKINNY_MAX_M rows of x (a decode step's few rows): weights
 * streamed at HBM bandwidth, K split over the SMs, up to three products sharing x in one launch.
 * Weights bf16 (scale[p] NULL) or FP8 E4M3 (scale[p]: f32 per block of scale_rows[p] rows x
 * scale_cols[p] columns, row-major; scale_cols >= k: one per row block; else exactly 128). */
#define UMK_GEMM_SKINNY_MAX_M 64
enum { UMK_GEMM_STORE = 0, UMK_GEMM_ADD = 1, UMK_GEMM_SWIGLU = 2 };
typedef struct umk_gemm_skinny_args {
    const uint16_t *x;            /* [m, k] bf16 */
    int             m, k;
    int             n_prod;       /* 1..3 (ADD: 1; SWIGLU: 2 of one shape) */
    const void     *w[3];         /* [n[p], k] */
    const float    *scale[3];
    int             scale_rows[3], scale_cols[3];
    uint16_t       *y[3];         /* STORE: y[p] = x·w[p]ᵀ ([m, n[p]]); ADD: y[0] += bf16(x·w[0]ᵀ);
                                     SWIGLU: y[0] = silu(bf16(x·w[0]ᵀ)) * bf16(x·w[1]ᵀ), each rounding
                                     as the single kernels' */
    int             n[3];
    int             epi;          /* UMK_GEMM_* */
    int             splits;       /* K ranges; 0 = chosen from n_sm */
    int             n_sm;         /* the device's SMs */
    float          *ws;           /* split-K workspace: umk_gemm_skinny_ws_floats() floats */
    size_t          ws_floats;
    unsigned       *count;        /* >= tiles of all products (umk_gemm_skinny_tiles) zeroed once; each
                                     launch leaves them zero */
    int             n_count;
} umk_gemm_skinny_args;
/* 1 when a product of m rows, k inputs and this weight type (0 bf16, 1 fp8) and scale block runs */
int         umk_gemm_skinny_supported(int m, int k, int wtype, int scale_rows, int scale_cols);
size_t      umk_gemm_skinny_ws_floats(const umk_gemm_skinny_args *p);
int         umk_gemm_skinny_splits(const umk_gemm_skinny_args *p);
/* output-column tiles of the launch over all its products (how many counts it may use) */
int         umk_gemm_skinny_tiles(const umk_gemm_skinny_args *p);
cudaError_t umk_gemm_skinny(const umk_gemm_skinny_args *p, cudaStream_t s);
/* Raise the kernel's shared-memory limit on the current device: once per device before the first
 * umk_gemm_skinny (the backend's init), never while a stream captures. */
cudaError_t umk_gemm_skinny_prepare(void);
/* FP8 per output channel: scale[r] = amax(x[r, :]) / 448 (1 for a zero row), q[r, c] = e4m3(x[r, c] / scale[r])
 * (round to nearest even, saturating) */
cudaError_t umk_fp8_quantize_rows(const uint16_t *x, int64_t rows, int64_t k, unsigned char *q, float *scale,
                                  cudaStream_t s);
/* out[i, :] = bf16(q[r0 + i, :] * scale of its block) for i < n (scale blocks as umk_gemm_skinny_args) */
cudaError_t umk_fp8_dequantize(const unsigned char *q, const float *scale, int scale_rows, int scale_cols, int64_t k,
                               int64_t r0, int64_t n, uint16_t *out, cudaStream_t s);
/* out[v] = the two bf16 (low half first) of the FP8 bytes v (low byte first), for v < 65536, as the
 * skinny kernel converts them (a test of that conversion) */
cudaError_t umk_fp8x2_table(uint32_t *out, cudaStream_t s);

/* ---------------------------------------------------------------- element-wise (ops.cu) */

/* out[i, :] = wte[ids[i], :], rows of d bf16 */
cudaError_t umk_embed(const uint16_t *wte, int64_t d, const int32_t *ids, int n, uint16_t *out, cudaStream_t s);
/* out[i, :] = w * bf16(x[i, :] * rsqrt(mean(x[i]^2) + eps))  (docs/model-spec.md §1; out may equal x) */
cudaError_t umk_rmsnorm(const uint16_t *x, const uint16_t *w, int n, int d, float eps, uint16_t *out,
                        cudaStream_t s);
/* x[i, :] += y[i, :] (bf16 sum, as umk_add), then out[i, :] = umk_rmsnorm of the new x[i, :]: the residual add
 * and the next norm in one launch (out may equal y, not x) */
cudaError_t umk_add_rmsnorm(uint16_t *x, const uint16_t *y, const uint16_t *w, int n, int d, float eps, uint16_t *out,
                            cudaStream_t s);
/* tab[i*half + j] = (cos, sin)(pos[i] * theta^(-2j/rot_dim)), angles in double (half = rot_dim/2) */
cudaError_t umk_rope_table(const int32_t *pos, int n, int half, float theta, float *tab, cudaStream_t s);
/* rotate-half RoPE in place on x[n, n_heads, head_dim] (first rot_dim dims) with a umk_rope_table */
cudaError_t umk_rope_apply(uint16_t *x, int n, int n_heads, int head_dim, int rot_dim, const float *tab,
                           cudaStream_t s);
/* One launch for umk_rope_apply on q[n, n_heads, head_dim] and on k[n, n_kv_heads, head_dim] (same table), then
 * — k_dst not NULL — umk_store_rows of the rotated k rows into k_dst and of v[n, n_kv_heads, head_dim] into
 * v_dst (row width n_kv_heads * head_dim; k_dst[s] / v_dst[s] NULL: sequence s is not stored). seq_start
 * [n_seqs+1] and pos [n] are read only with k_dst. Bit-identical to the four separate launches.
 * qkv not NULL: q, k and v are outputs, unpacked from qkv's rows (row i at qkv + i * ld_qkv holds the q
 * heads, then the k heads, then the v heads: one product of q|k|v-concatenated weights) — rotated as
 * above, v copied; tab NULL then unpacks without rotating (the single kernels' first step). */
cudaError_t umk_rope_kv(uint16_t *q, uint16_t *k, uint16_t *v, const uint16_t *qkv, int64_t ld_qkv, int n, int n_heads,
                        int n_kv_heads, int head_dim, int rot_dim, const float *tab, int n_seqs,
                        const int32_t *seq_start, const int32_t *pos, uint16_t *const *k_dst, uint16_t *const *v_dst,
                        cudaStream_t s);
/* out[i] = silu(gate[i]) * up[i] (out may equal gate or up) */
cudaError_t umk_swiglu(const uint16_t *gate, const uint16_t *up, size_t n, uint16_t *out, cudaStream_t s);
/* umk_swiglu on the rows of one joined gate|up product: out[r, j] = silu(gu[r*ld + j]) * gu[r*ld + f + j]
 * for r < n, j < f (ld >= 2f; out [n, f] dense, not overlapping gu); the same roundings */
cudaError_t umk_swiglu_rows(const uint16_t *gu, int n, int f, int64_t ld, uint16_t *out, cudaStream_t s);
/* MoE combine: x[t, :] += sum_j w[t*k + j] * y[slot[t*k + j], :] for t < n (fp32 sum, slot < 0 skipped) */
cudaError_t umk_moe_combine(uint16_t *x, const uint16_t *y, int d, int n, int k, const int32_t *slot, const float *w,
                            cudaStream_t s);
/* x[i] += y[i] */
cudaError_t umk_add(uint16_t *x, const uint16_t *y, size_t n, cudaStream_t s);
/* out[i, :] = x[rows[i], :] (out must not overlap x) */
cudaError_t umk_get_rows(const uint16_t *x, int d, const int32_t *rows, int n, uint16_t *out, cudaStream_t s);
/* dst[s][pos[i], :] = x[i, :] for the rows i of every sequence s (seq_start[s] .. seq_start[s+1]-1) whose
 * dst[s] is not NULL; max_rows: the most rows one sequence has (sets the grid). */
cudaError_t umk_store_rows(const uint16_t *x, int d, int n_seqs, const int32_t *seq_start, const int32_t *pos,
                           uint16_t *const *dst, int max_rows, cudaStream_t s);
/* y[i, j] += b[j] for y[n, m] */
cudaError_t umk_bias_add(uint16_t *y, const uint16_t *b, int n, int m, cudaStream_t s);
/* dst[i] = bf16(src[i]) for src of F32 (src_is_f16 = 0) or F16 (src_is_f16 = 1) */
cudaError_t umk_to_bf16(const void *src, int src_is_f16, size_t n, uint16_t *dst, cudaStream_t s);
/* dst[i] = f32(src[i]) */
cudaError_t umk_bf16_to_f32(const uint16_t *src, size_t n, float *dst, cudaStream_t s);

/* ---------------------------------------------------------------- MoE dispatch (moe.cu) */

/* Largest n_experts the MoE kernels take (shared-memory tables); the backend routes larger
 * routers on the host. */
#define UMK_MOE_MAX_EXPERTS 1024

/* A MoE layer's routing rules (docs/model-spec.md §2c, model/moe.c moe_route). */
typedef struct umk_moe_route_cfg {
    int          n_experts, top_k;
    int          sigmoid_group;     /* 0: softmax (+ bias); 1: sigmoid, group-limited, renormalised */
    int          n_group, topk_group;
    float        routed_scale;
    const float *bias;              /* [n_experts] device f32, or NULL */
} umk_moe_route_cfg;

/* idx[n, top_k] (best first) and w[n, top_k] from logits[n, n_experts], per token exactly as
 * moe_route (same experts, same order, same ties; double math). */
cudaError_t umk_moe_route(const umk_moe_route_cfg *c, const uint16_t *logits, int n, int32_t *idx, float *w,
                          cudaStream_t s);
/* Counting sort of the n*k pairs idx[] by expert, token order inside an expert: offsets[E+1] (rows of
 * expert e: offsets[e] .. offsets[e+1]-1), slot[i] = row of pair i (-1 when its expert is outside
 * [e0, e1)), tok[row] = pair / k, and the row tiles of the experts [e0, e1) for umk_moe_gemm:
 * tile_e[j] = expert (-1 past the last tile), tile_r[j] = its first row, for j < max_tiles
 * (at least the bound under umk_moe_tile_rows). One block. */
cudaError_t umk_moe_sort(const int32_t *idx, int n, int k, int n_experts, int e0, int e1, int max_tiles,
                         int32_t *offsets, int32_t *slot, int32_t *tok, int32_t *tile_e, int32_t *tile_r,
                         cudaStream_t s);
/* Rows per tile of umk_moe_gemm. A bound on the tiles of n*k rows over e experts:
 * floor(n*k / rows) + min(e, n*k). */
int    umk_moe_tile_rows(void);
/* Grouped GEMM over the tile map: for every row r of expert e in a tile,
 *   gated: y[r, :] = bf16(silu(bf16(x[tok[r]]·w0[e]ᵀ)) * bf16(x[tok[r]]·w1[e]ᵀ))   (x: [*, kd])
 *   else:  y[r, :] = bf16(x[r]·w0[e]ᵀ)                                              (x: [rows, kd])
 * w0 / w1: device arrays of E device pointers to [N, kd] bf16 weights. kd % 8 == 0; x and the weights
 * 16-byte aligned. Grid: max_tiles x ceil(N / 64) blocks; a block without a tile exits. */
cudaError_t umk_moe_gemm(int gated, const uint16_t *x, const int32_t *tok, const uint16_t *const *w0,
                         const uint16_t *const *w1, const int32_t *offsets, const int32_t *tile_e,
                         const int32_t *tile_r, int max_tiles, int N, int kd, uint16_t *y, cudaStream_t s);
/* dynamic shared memory of the two small kernels (checked against the device limit by the caller) */
size_t umk_moe_route_smem(int n_experts, int top_k, int n_group);
size_t umk_moe_sort_smem(int n_experts);

/* ---------------------------------------------------------------- attention (attention.cu) */

/* Device-side view of backend.h's attn_params. */
typedef struct umk_attn {
    int            n_seqs;
    const int32_t *q_start, *k_start;  /* [n_seqs+1] */
    const int32_t *q_pos, *k_pos;      /* [n_q], [n_k]; only read when block_causal > 0 */
    const uint8_t *key_valid;          /* [n_k] or NULL */
    const uint16_t *const *k_seq;      /* [n_seqs] or NULL: non-NULL k_seq[s] / v_seq[s] hold sequence s's
                                          keys / values (rows 0..k_start[s+1]-k_start[s]-1) instead of k / v */
    const uint16_t *const *v_seq;
    int            block_causal;
    int            n_heads, n_kv_heads, head_dim;
    float          scale;
    int            n_q;                /* host-computed: total query rows (q_start[n_seqs]) */
    int            max_q_len;          /* host-computed: longest query range (sets the grid) */
    int            max_k_len;          /* host-computed: longest key range (bounds the key splits) */
} umk_attn;

/* Where the tensor-core kernel may split each (query tile, head) over its keys (flash-decoding):
 * ws holds the partial outputs (fp32) and their running max / sum, merged by a second kernel. */
typedef struct umk_attn_split {
    float  *ws;         /* device workspace, ws_bytes long; NULL = never split */
    size_t  ws_bytes;
    int     n_sm;       /* multiprocessors: auto splits only while query tiles x heads x sequences < n_sm */
    int     force;      /* 0 = auto, 1 = never split, n > 1 = n splits (capped by key tiles and ws) */
} umk_attn_split;

/* out[n_q, n_heads*head_dim] = softmax(q kᵀ scale + mask) v, bf16 in/out, fp32 online softmax.
 * Tensor-core (mma.sync bf16) flash kernel for head_dim in {16, 32, 64, 128}; any other head_dim
 * up to 256 (or force_generic) runs a plain fp32 kernel. Queries that see no key get zeros. With
 * split (may be NULL) the tensor-core kernel splits the keys when the grid would leave SMs idle. */
cudaError_t umk_attention(const umk_attn *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          uint16_t *out, int force_generic, const umk_attn_split *split, cudaStream_t s);

/* ---------------------------------------------------------------- sampling + decoding (decode.cu) */

/* Fused confidence: per job, the effective logits row (CFG, eos flag), x0 = argmax (T <= 0) or
 * Gumbel-max over the top-k / top-p candidates (noise = util/rng.h ported bit-exactly), and
 * conf = softmax(noise-free effective logits)[x0] in double — without writing the row back.
 * Semantics are exactly decode/sample.c's sample_row (ties: lower token id). A job whose cfg has
 * dream_score also gets that Dream decoder's score (decoders.c dream_confidence) at
 * conf[n_jobs + job]: conf then holds 2 * n_jobs doubles, and umk_decode_commit reads them there. */
cudaError_t umk_sample(const uint16_t *logits, umk_vocab_ids ids, const umk_sample_job *jobs, int n_jobs,
                       const umk_sample_cfg *cfgs, int32_t *x0, double *conf, cudaStream_t s);
/* Gumbel noise -log(-log(rng_u01(seed, step, pos*vocab + token))) for n tokens 0..n-1 (tests). */
cudaError_t umk_gumbel(uint64_t seed, int step, int pos, int vocab, int n, double *out, cudaStream_t s);

size_t umk_event_bytes(int block_len);

/* blk_steps: per-block step budgets of the fixed-step decoders (decode.c plan_steps), indexed by
 * umk_seq_state.blk_steps_off + block index; may be NULL when no sequence uses it.
 * One decode step for n_seqs sequences: reads x0/conf laid out [n_seqs][B] (row s*B + j = block
 * offset j), commits into tokens (the packed canvas, in place), advances blocks, writes the step
 * records into events and the next step's sample jobs ([n_seqs][B]) and LM-head rows
 * (out_rows[n_seqs*B], valid rows even for finished sequences) — no host synchronisation. */
cudaError_t umk_decode_commit(umk_seq_state *st, int n_seqs, int block_len, umk_vocab_ids ids, int32_t *tokens,
                              const int32_t *blk_steps, const int32_t *x0, const double *conf, void *events,
                              umk_sample_job *next_jobs, int32_t *out_rows, cudaStream_t s);
/* Prepare step 0: skip blocks without masks, set m0, write the first jobs and out_rows. */
cudaError_t umk_decode_begin(umk_seq_state *st, int n_seqs, int block_len, umk_vocab_ids ids,
                             const int32_t *tokens, const int32_t *blk_steps, umk_sample_job *jobs,
                             int32_t *out_rows, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* UM_KERNELS_H */
