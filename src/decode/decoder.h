/*
 * decoder.h — the interface between the decode loop (decode.c) and the decoders (decoders.c):
 * which positions of the active block to write in this step. Internal to decode/.
 *
 * The loop owns the canvas, blocks, forward pass and sampling; per step it hands the decoder a
 * view of the active block: for every row it asked logits for (the masked positions of the block,
 * or all block positions for decoders with DECODER_F_ALL_ROWS), the sampled token x0, its
 * confidence and, for decoders that need them, the effective logits. The decoder returns the
 * writes (position, token) — normally masked positions, but an editing decoder (LLaDA2.1 T2T) may
 * rewrite committed ones — and may decide when the block is finished (default: no MASK left).
 * New decoders (joint_threshold A9, ...) add a decoder_ops entry; the loop does not change. Engine thread (whoever owns the sequence).
 */
#ifndef UM_DECODER_H
#define UM_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "decode/decode.h"

enum {
    DECODER_F_FIXED_STEPS = 1u << 0, /* uses decode_params.steps (quota per step) */
    DECODER_F_ALL_ROWS    = 1u << 1, /* wants rows for committed block positions too */
    DECODER_F_LOGITS      = 1u << 2, /* reads view.logits (kept after sampling) */
    DECODER_F_RESAMPLE    = 1u << 3, /* may rewrite view.x0_w / view.conf_w in choose (a decoder that
                                        samples from its own adjusted logits, e.g. credit A6); events
                                        then report the rewritten values */
    DECODER_F_MAY_SKIP    = 1u << 4, /* a step may commit nothing (Dream's schedule); the step budget
                                        still finishes the block (its last step commits every mask) */
};

typedef struct decoder_view {
    const decode_params *p;
    const int32_t *x;          /* canvas [L] (before this step's writes) */
    int      mask_id;
    int      eos_id, eot_id;   /* -1 when unknown */
    int      lo, hi;           /* active block [lo, hi), absolute positions */
    int      start;            /* where the block begins: its aligned start (aligned layout; the
                                  first block's prompt tail lies in [start, lo)), else lo */
    int      shift;            /* 1: position p's x0 / confidence come from logits row p - 1 (the
                                  loop's shift, decode_seq_logit_row) */
    int      block;            /* block index */
    int      block_masks;      /* masked positions in [lo, hi) */
    int      block_steps;      /* fixed-step decoders: steps budgeted to this block */
    int      quota_len;        /* > 0 (block-causal models, LLaDA2 rule): step i's quota is
                                  decoder_quota(quota_len = block_length, block_steps, i), not from
                                  the block's masks; the threshold decoder then commits every
                                  c > threshold when at least the quota clear it, else the quota's
                                  most confident */
    int      step_in_block;    /* steps already taken in this block (0 on its first step) */
    int      step;             /* the sequence's step index (rng stream) */
    uint64_t seed;
    /* rows with logits this step, ascending position */
    int            n_rows;
    const int32_t *row_pos;    /* [n_rows] absolute positions */
    const uint8_t *row_masked; /* [n_rows] 1 = x[row_pos] is MASK */
    const int32_t *x0;         /* [n_rows] sampled token (never the mask id) */
    const double  *conf;       /* [n_rows] softmax(noise-free effective logits)[x0] */
    const float   *logits;     /* [n_rows, vocab] effective logits (DECODER_F_LOGITS), else NULL */
    int32_t       *x0_w;       /* DECODER_F_RESAMPLE: writable x0 / conf (same arrays), else NULL */
    double        *conf_w;
    int            vocab;
} decoder_view;

typedef struct decoder_ops {
    unsigned    flags;                 /* DECODER_F_* */
    size_t      state_size;            /* zeroed state allocated per sequence (0 = none) */
    /* called before the first step of each block (optional) */
    void (*block_begin)(void *state, const decoder_view *v);
    /* writes for this step: out_pos/out_tok have room for hi - lo entries; returns the count.
     * Must return >= 1 while the block has masks (progress guarantee), unless DECODER_F_MAY_SKIP. */
    int  (*choose)(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok);
    /* after the writes: 1 when the block is finished. NULL = when no MASK is left. masks_left =
     * masked positions left in the block. */
    int  (*block_done)(void *state, const decoder_view *v, int masks_left);
    void (*free_state)(void *state);   /* optional: free what the state owns */
} decoder_ops;

const decoder_ops *decoder_get(enum decode_decoder d);

/* Quota of the fixed-step decoders for step i of a block with m masks and s steps (the
 * reference get_num_transfer_tokens): floor(m/s) + (i < m mod s). */
int decoder_quota(int m, int s, int i);

/* Dream's schedule: timesteps[i] of a float32 linspace(1, eps, steps + 1) as torch computes it
 * (step = (eps - 1) / steps; the first half 1 + step*i, the second half eps - step*(steps - i)). */
float decoder_dream_timestep(int steps, double eps, int i);
/* Positions Dream commits at step i (0-based) of `steps` with n masked: int(float32(n) *
 * (1 - s/t)) in float32 with t, s = timesteps[i], timesteps[i+1]; n at the last step. */
int   decoder_dream_quota(int n, int steps, double eps, int i);

#endif /* UM_DECODER_H */
