/*
 * device_step.h — device-resident diffusion decode steps on a backend with
 * BACKEND_CAP_DEVICE_DECODE (and, for replays, BACKEND_CAP_GRAPHS): for a fixed batch (n sequences,
 * block length B) the canvas, per-sequence decode state, sampling and the decoder's commit decisions
 * all live on the device, so a step is
 *     forward (embed reads the device canvas, LM head only on the B active-block rows)
 *       -> backend_decode_sample (fused softmax confidence / Gumbel-max)
 *       -> backend_decode_commit (decoder rule, commit, block advance, EOS stop, next rows)
 *       -> async copy of the step records into a pinned ring slot + event
 * with no host synchronisation; the steady-state step can be captured once as a graph and
 * replayed. The host polls the ring (backend_event_query) and turns records into decode events
 * one or more steps behind the device.
 *
 * Host-planned steps (KV caches; block diffusion's forwards cut at the active block;
 * device_step_enqueue_planned): the caller chooses each step's forward rows (a sequence's whole
 * canvas, a window of it with its KV slot, or the canvas up to its active block) and the LM-head row
 * of each block position; the arrays are copied to device buffers the forward reads, so a graph
 * captured for one shape of rows replays for every step of that shape (a few shapes are kept: the
 * block-rows-only step is the common one). Sampling and commits stay on the device as above.
 *
 * Semantics equal the CPU reference (decode/sample.c, decode/decoders.c): same candidates, same
 * noise (util/rng.h counters), same commit rules and tie orders. Not covered on the device: CFG
 * (cfg_scale > 0), the LLaDA2.1 editing decoders, infill suffixes with separate layouts — those use
 * the host decode loop. decode_device.h runs a changing set of sequences on top of this; the
 * kernels are the backend's (backend_decode.h).
 *
 * Threading: the engine thread that owns the backend.
 */
#ifndef UM_DEVICE_STEP_H
#define UM_DEVICE_STEP_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "util/err.h"

/* One sequence of the batch. */
typedef struct device_step_seq {
    const int32_t *tokens;        /* canvas [len] (prompt ++ MASK * gen), host; copied */
    int            len;
    int            lo, hi;        /* first block [lo, hi) (absolute positions) */
    int            gen_end;       /* blocks end here (normally len) */
    int            quota_len;     /* block-diffusion rules (LLaDA2): > 0 = fixed-step quotas come from
                                     this length (the block length), not from the block's masks, and
                                     the threshold decoder takes LLaDA2's rule (docs/decode.md);
                                     0 = the ordinary rules */
    int            block_steps;   /* fixed-step decoders: steps per block (when blk_steps is NULL) */
    const int32_t *blk_steps;     /* or [n_blocks] steps of each block from [lo, hi) on (decode.c's
                                     plan), copied; NULL: block_steps for every block */
    int            n_blocks;
    int            decoder;       /* enum decode_decoder (LOW_CONFIDENCE, RANDOM, THRESHOLD, FACTOR,
                                     ORIGIN, MASKGIT_PLUS, TOPK_MARGIN, ENTROPY; the last three without
                                     top_p / top_k) */
    double         threshold, factor;
    double         eps, alg_temp;  /* Dream decoders: schedule end, selection temperature */
    int            stop_at_eos;
    int            logit_shift;   /* 1: position p > 0 is scored by logits row p - 1 (Dream) */
    double         temperature, top_p;
    int            top_k;
    uint64_t       seed;
    int            logits_eos_inf, confidence_eos_eot_inf;
    /* Continuing a sequence mid-way (all 0 for a fresh one): */
    int            block_len;     /* this sequence's block length (<= the batch's block_len), 0 = the
                                     batch's; later blocks are [lo', min(lo' + block_len, gen_end)) */
    int            step;          /* its step index: the rng stream (seed, step, ...) continues here */
    int            step_in_block; /* steps already taken in block [lo, hi) */
    int            block_m0;      /* masks of [lo, hi) when that block began (fixed-step quota);
                                     0 = the block begins now (its masks are counted on the device) */
} device_step_seq;

/* Model token ids. */
typedef struct device_step_ids {
    int vocab;                    /* logits per row (n_embd_rows) */
    int mask_id, eos_id, eot_id;
} device_step_ids;

/* The forward pass: run it for batch b on the backend and return the device logits
 * [b->n_out, vocab] (activation dtype) through *d_logits. Must not synchronise (it may be captured). */
typedef int (*device_step_forward_fn)(void *user, const fwd_batch *b, const void **d_logits, um_err *err);

/* One sequence's record of a completed step. Pointers are valid until the next device_step_poll. */
typedef struct device_step_event {
    int            step;          /* the sequence's step index */
    int            lo, hi;        /* block of the commits */
    int            n_commit;
    int            masks_left;    /* in that block, after the commits */
    int            block_done, done, was_done;
    const int32_t *pos, *tok;     /* [n_commit] ascending positions, committed tokens */
    const float   *conf;          /* [n_commit] */
    const int32_t *draft_tok;     /* [B] by block offset: x0 of still-masked positions, else -1 */
    const float   *draft_conf;    /* [B] */
} device_step_event;

typedef struct device_step device_step;

/* Set up a batch on backend be (BACKEND_CAP_DEVICE_DECODE; else -1 + UM_ERR_INVALID_ARG). ring = step records buffered on the host side (>= 2). */
device_step *device_step_create(backend *be, const device_step_seq *seqs, int n_seqs, int block_len,
                                device_step_ids ids, int ring, device_step_forward_fn fwd, void *fwd_user, um_err *err);
void         device_step_free(device_step *cd);

/* The packed batch the forward runs on (tokens / out_rows are host arrays aliased to the device
 * canvas and the device LM-head row list: their host contents are not used). */
const fwd_batch *device_step_batch(const device_step *cd);

/* Capture forward + sample + commit as a graph (BACKEND_CAP_GRAPHS) (before the first step it runs one uncaptured
 * forward first so buffers exist, its results discarded; after a direct step that step did it).
 * Waits for the pending steps. Later steps replay the graph. */
int  device_step_capture(device_step *cd, um_err *err);
/* Enqueue one step (graph replay or direct launches) and its record copy. A captured graph that
 * went stale (backend_graph_stale: e.g. a bigger forward on the same model_ctx regrew the scratch
 * buffers it was captured with, or the allocator's cache was trimmed) is freed, not replayed, and
 * this step runs directly (counted in stale_graphs). -1 + err when the
 * forward fails; aborts when `ring` steps are pending unpolled (caller bug). */
int  device_step_enqueue(device_step *cd, um_err *err);
/* The oldest unpolled step: 1 when its records are ready (wait = 1 blocks until they are), 0 when
 * nothing is pending / not ready yet. */
int  device_step_poll(device_step *cd, int wait);
/* Sequence s's record of the step returned by the last successful poll. */
void device_step_record(const device_step *cd, int s, device_step_event *ev);
/* Steps enqueued but not yet polled. */
int  device_step_pending(const device_step *cd);
/* Milliseconds of device time of the step returned by the last successful poll: event timing from
 * the start of its forward (when the device got there: earlier queued work excluded) to its
 * records being copied. The device loop reports this as its step time (the host only enqueues a step). */
double device_step_gpu_ms(const device_step *cd);

/* One host-planned step: the forward's rows per sequence and where each block position's logits
 * come from. Arrays are host memory, copied by device_step_enqueue_planned. */
typedef struct device_step_layout {
    const int32_t *seq_start;  /* [n_seqs+1] forward rows of each sequence of the batch */
    const int32_t *tokens;     /* [seq_start[n_seqs]] their tokens */
    const int32_t *pos;        /* [seq_start[n_seqs]] their absolute positions (consecutive within a
                                  sequence: a window of its canvas) */
    const int32_t *kv;         /* [n_seqs] KV slot of each sequence (model_kv_open), 0 = none */
    const int32_t *out_rows;   /* [n_seqs * B] forward row of block offset j of sequence s (a row of
                                  that sequence; any of its rows where j lies outside the block) */
    const int32_t *block_len;  /* [n_seqs] block-causal attention block of each sequence
                                  (fwd_batch.block_len), or NULL: the model's default */
} device_step_layout;

/* Enqueue one host-planned step: its arrays are copied to the device, then forward (with the KV
 * slots) + sample + commit run as a graph replay when a graph of this shape (rows per sequence,
 * which have a slot and each one's attention block) is kept, as a capture + replay when the shape
 * ran once before (graphs = 1), or op by op. No other step may be pending (the caller applies each
 * step before planning the next). -1 + err when the forward fails. */
int  device_step_enqueue_planned(device_step *cd, const device_step_layout *lay, int graphs, um_err *err);

/* Launch counters of this batch. */
typedef struct device_step_stats {
    uint64_t graph_launches;   /* steps replayed from the captured graph */
    uint64_t direct_launches;  /* steps launched op by op */
    uint64_t captures;         /* graphs captured by device_step_enqueue_planned */
    uint64_t stale_graphs;     /* graphs dropped unreplayed because a buffer they use was freed or
                                  replaced since their capture (backend_graph_stale); that step ran
                                  directly, the caller may capture again */
} device_step_stats;
void device_step_get_stats(const device_step *cd, device_step_stats *out);
/* 1 while the batch holds a captured (not stale-dropped) graph. */
int  device_step_has_graph(const device_step *cd);

/* Copy the current device canvas (all sequences, packed as device_step_batch()->tokens) to out;
 * synchronises. */
void device_step_tokens(device_step *cd, int32_t *out);

#endif /* UM_DEVICE_STEP_H */
