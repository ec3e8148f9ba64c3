/*
 * backend_decode_types.h — the data layout the device decode kernels (kernels/decode.cu) share with
 * the device decode step (decode/device_step.c): per-sequence state, sampling settings, sample jobs
 * and the fixed-size step record. Plain C, no CUDA headers, so decode/ can fill and read them and
 * kernels/um_kernels.h can use the very same definitions.
 *
 * Not here: the kernels, the launch functions (backend_decode.h, um_kernels.h). Any thread.
 */
#ifndef UM_BACKEND_DECODE_TYPES_H
#define UM_BACKEND_DECODE_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* Sampling settings of one sequence (decode/sample.h's sample_cfg without the model ids). */
typedef struct umk_sample_cfg {
    double   temperature;     /* <= 0: argmax */
    double   top_p;           /* 1 = off */
    double   cfg_scale;       /* > 0 with urow >= 0: l = u + (cfg+1)(c - u) */
    uint64_t seed;
    int32_t  top_k;           /* 0 = off */
    int32_t  logits_eos_inf;
    int32_t  confidence_eos_eot_inf;
    int32_t  dream_score;     /* UMK_DEC_MASKGIT_PLUS / _TOPK_MARGIN / _ENTROPY: umk_sample also writes
                                 that decoder's score (decode/decoders.c dream_confidence, no top-k /
                                 top-p) at conf[n_jobs + job]; 0: none */
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

/* Decoders run on the device (decode/decoders.c semantics). */
enum umk_decoder {
    UMK_DEC_LOW_CONFIDENCE = 0,
    UMK_DEC_RANDOM = 1,
    UMK_DEC_THRESHOLD = 2,
    UMK_DEC_FACTOR = 3,
    /* Dream's (4, 5: hierarchy, credit are host-only) */
    UMK_DEC_ORIGIN = 6,
    UMK_DEC_MASKGIT_PLUS = 7,
    UMK_DEC_TOPK_MARGIN = 8,
    UMK_DEC_ENTROPY = 9
};

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
    int32_t logit_shift;   /* 1: position p > 0 is scored by LM-head row p - 1 (shifted-logit models:
                              Dream), as decode_seq_logit_row; 0: by row p */
    double  threshold;     /* threshold decoder tau */
    double  factor;        /* factor decoder f */
    uint64_t seed;         /* random decoder scores; Dream's origin draws and alg_temp noise */
    double  eps;           /* Dream decoders: the schedule's final timestep */
    double  alg_temp;      /* Dream confidence decoders: > 0 Gumbel top-k selection */
    int32_t quota_len;     /* block-diffusion rules (LLaDA2): > 0 = a fixed-step quota comes from this
                              length (the block length: quota(quota_len, block_steps, step_in_block)),
                              not from m0, and the threshold decoder commits every masked position
                              with conf > threshold when at least that quota clear it, else the
                              quota's most confident; 0 = the ordinary rules */
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

/* Bytes of one sequence's step record for block length B (header + 5 arrays of B, 16-aligned). */
#define UMK_EVENT_BYTES(B) \
    ((sizeof(umk_event_hdr) + (size_t)(B) * (4 * sizeof(int32_t) + sizeof(float)) + 15) & ~(size_t)15)

#endif /* UM_BACKEND_DECODE_TYPES_H */
