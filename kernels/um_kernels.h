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

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- element-wise (ops.cu) */

/* out[i, :] = wte[ids[i], :], rows of d bf16 */
cudaError_t umk_embed(const uint16_t *wte, int64_t d, const int32_t *ids, int n, uint16_t *out, cudaStream_t s);
/* out[i, :] = w * bf16(x[i, :] * rsqrt(mean(x[i]^2) + eps))  (models.md §0 numerics; out may equal x) */
cudaError_t umk_rmsnorm(const uint16_t *x, const uint16_t *w, int n, int d, float eps, uint16_t *out,
                        cudaStream_t s);
/* tab[i*half + j] = (cos, sin)(pos[i] * theta^(-2j/rot_dim)), angles in double (half = rot_dim/2) */
cudaError_t umk_rope_table(const int32_t *pos, int n, int half, float theta, float *tab, cudaStream_t s);
/* rotate-half RoPE in place on x[n, n_heads, head_dim] (first rot_dim dims) with a umk_rope_table */
cudaError_t umk_rope_apply(uint16_t *x, int n, int n_heads, int head_dim, int rot_dim, const float *tab,
                           cudaStream_t s);
/* out[i] = silu(gate[i]) * up[i] (out may equal gate or up) */
cudaError_t umk_swiglu(const uint16_t *gate, const uint16_t *up, size_t n, uint16_t *out, cudaStream_t s);
/* x[i] += y[i] */
cudaError_t umk_add(uint16_t *x, const uint16_t *y, size_t n, cudaStream_t s);
/* out[i, :] = x[rows[i], :] (out must not overlap x) */
cudaError_t umk_get_rows(const uint16_t *x, int d, const int32_t *rows, int n, uint16_t *out, cudaStream_t s);
/* y[i, j] += b[j] for y[n, m] */
cudaError_t umk_bias_add(uint16_t *y, const uint16_t *b, int n, int m, cudaStream_t s);
/* dst[i] = bf16(src[i]) for src of F32 (src_is_f16 = 0) or F16 (src_is_f16 = 1) */
cudaError_t umk_to_bf16(const void *src, int src_is_f16, size_t n, uint16_t *dst, cudaStream_t s);
/* dst[i] = f32(src[i]) */
cudaError_t umk_bf16_to_f32(const uint16_t *src, size_t n, float *dst, cudaStream_t s);

/* ---------------------------------------------------------------- attention (attention.cu) */

/* Device-side view of backend.h's attn_params. */
typedef struct umk_attn {
    int            n_seqs;
    const int32_t *q_start, *k_start;  /* [n_seqs+1] */
    const int32_t *q_pos, *k_pos;      /* [n_q], [n_k]; only read when block_causal > 0 */
    const uint8_t *key_valid;          /* [n_k] or NULL */
    int            block_causal;
    int            n_heads, n_kv_heads, head_dim;
    float          scale;
    int            n_q;                /* host-computed: total query rows (q_start[n_seqs]) */
    int            max_q_len;          /* host-computed: longest query range (sets the grid) */
} umk_attn;

/* out[n_q, n_heads*head_dim] = softmax(q kᵀ scale + mask) v, bf16 in/out, fp32 online softmax.
 * Tensor-core (mma.sync bf16) flash kernel for head_dim in {16, 32, 64, 128}; any other head_dim
 * up to 256 (or force_generic) runs a plain fp32 kernel. Queries that see no key get zeros. */
cudaError_t umk_attention(const umk_attn *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                          uint16_t *out, int force_generic, cudaStream_t s);

/* ---------------------------------------------------------------- sampling + decoding (decode.cu) */

/* Sampling settings of one sequence (decode/sample.h's sample_cfg without the model ids). */
typedef struct umk_sample_cfg {
    double   temperature;     /* <= 0: argmax */
    double   top_p;           /* 1 = off */
    double   cfg_scale;       /* > 0 with urow >= 0: l = u + (cfg+1)(c - u) */
    uint64_t seed;
    int32_t  top_k;           /* 0 = off */
    int32_t  logits_eos_inf;
    int32_t  confidence_eos_eot_inf;
    int32_t  pad_;
} umk_sample_cfg;

/* One logits row to sample. */
typedef struct umk_sample_job {
    int32_t row;      /* conditional logits row */
    int32_t urow;     /* unconditional row (CFG) or -1 */
    int32_t pos;      /* absolute position: rng counter = pos * vocab + token */
    int32_t step;     /* rng stream */
    int32_t cfg;      /* index into the umk_sample_cfg array */
    int32_t active;   /* 0: skip (x0 = -1, conf = 0) */
} umk_sample_job;

/* Model constants shared by all rows. */
typedef struct umk_vocab_ids {
    int32_t vocab;    /* logits per row (= row stride) */
    int32_t mask_id, eos_id, eot_id;   /* -1 when unknown */
} umk_vocab_ids;

/* Fused confidence: per job, the effective logits row (CFG, eos flag), x0 = argmax (T <= 0) or
 * Gumbel-max over the top-k / top-p candidates (noise = util/rng.h ported bit-exactly), and
 * conf = softmax(noise-free effective logits)[x0] in double — without writing the row back.
 * Semantics are exactly decode/sample.c's sample_row (ties: lower token id). */
cudaError_t umk_sample(const uint16_t *logits, umk_vocab_ids ids, const umk_sample_job *jobs, int n_jobs,
                       const umk_sample_cfg *cfgs, int32_t *x0, double *conf, cudaStream_t s);
/* Gumbel noise -log(-log(rng_u01(seed, step, pos*vocab + token))) for n tokens 0..n-1 (tests). */
cudaError_t umk_gumbel(uint64_t seed, int step, int pos, int vocab, int n, double *out, cudaStream_t s);

/* Decoders run on the device (decode/decoders.c semantics). */
enum umk_decoder { UMK_DEC_LOW_CONFIDENCE = 0, UMK_DEC_RANDOM = 1, UMK_DEC_THRESHOLD = 2, UMK_DEC_FACTOR = 3 };

/* Per-sequence decode state, device resident; advanced by umk_decode_commit every step. */
typedef struct umk_seq_state {
    int32_t row0;          /* packed-batch row of canvas position 0 */
    int32_t len;           /* canvas length L (prompt + generation) */
    int32_t gen_end;       /* blocks end here (normally L) */
    int32_t block_len;     /* B */
    int32_t lo, hi;        /* active block [lo, hi), absolute positions */
    int32_t block_steps;   /* fixed-step decoders: steps budgeted to the active block */
    int32_t blk;           /* index of the active block (0 = the block [lo, hi) given at setup) */
    int32_t blk_steps_off; /* offset of this sequence's per-block steps in the blk_steps table, or
                              -1: every block gets block_steps */
    int32_t step_in_block; /* steps taken in the active block */
    int32_t step;          /* the sequence's step index (rng stream) */
    int32_t m0;            /* masks in the active block when it began */
    int32_t done;          /* 1: finished (no further commits) */
    int32_t decoder;       /* enum umk_decoder */
    int32_t stop_at_eos;   /* finish at the end of the block holding the first EOS/EOT */
    double  threshold;     /* threshold decoder tau */
    double  factor;        /* factor decoder f */
    uint64_t seed;         /* random decoder scores */
} umk_seq_state;

/* The step record of one sequence (fixed size for a block length B; see umk_event_bytes):
 * header, then int32 pos[B], int32 tok[B], float conf[B] (commits, ascending position), then
 * int32 draft_tok[B], float draft_conf[B] for block offsets 0..B-1 (-1 / 0 where not masked). */
typedef struct umk_event_hdr {
    int32_t step;          /* step index of this step (before the increment) */
    int32_t lo, hi;        /* block the commits belong to */
    int32_t n_commit;
    int32_t masks_left;    /* masks left in that block after the commits */
    int32_t block_done;    /* the block finished with this step */
    int32_t done;          /* the sequence finished with (or before) this step */
    int32_t was_done;      /* the sequence was already finished: nothing happened */
} umk_event_hdr;

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
