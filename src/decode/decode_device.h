/*
 * decode_device.h — the device-resident decode loop: advances a set of decode_seqs of one
 * model_ctx on a backend with device decode support (BACKEND_CAP_DEVICE_DECODE + _GRAPHS: the
 * CUDA backend) with decode/device_step (canvas, sampling and the decoder's
 * commit rule on the GPU, no host synchronisation inside a step, step records copied back
 * asynchronously, graphs for a stable batch) and turns the records into the SAME events as
 * decode_step() through decode_seq_apply().
 *
 * Pipelining: up to two steps are in flight (one for a batch with a KV-cached or block-diffusion
 * sequence: host-planned steps, device_step_enqueue_planned) — step k+1 is enqueued before step k's records are
 * applied — so events come one step behind the device. Whenever the set of sequences changes (one
 * joins, finishes, is cancelled) the runner drains what is pending (applying it, except to
 * sequences that are done meanwhile: a cancelled sequence gets nothing after its DONE) and
 * rebuilds the device batch from each sequence's current state (canvas, active block, remaining
 * step plan, step index so the rng streams continue exactly). A graph is captured once a batch
 * has run one step unchanged, and replayed after that.
 *
 * Not here: which sequences run (sched/), the forward pass itself (model/), the kernels.
 * Threads: one runner belongs to the thread that owns its model_ctx (the engine thread).
 */
#ifndef UM_DECODE_DEVICE_H
#define UM_DECODE_DEVICE_H

#include <stdint.h>

#include "decode/decode.h"
#include "model/model.h"
#include "util/err.h"

typedef struct decode_device decode_device;

typedef struct decode_device_stats {
    uint64_t steps;           /* device steps enqueued */
    uint64_t steps_overlapped; /* of those, enqueued while the step before was still in flight (its
                                  records applied while the GPU runs this one); none when every step
                                  is drained before the next is enqueued */
    uint64_t rebuilds;        /* device batches built (set changes) */
    /* why: a rebuild counts under each cause present (their sum can exceed rebuilds) */
    uint64_t rebuild_join;       /* a sequence not in the previous batch (incl. the first build) */
    uint64_t rebuild_leave;      /* a sequence of the previous batch finished on the device */
    uint64_t rebuild_cancel;     /* one was finished by the host meanwhile (cancel, error) */
    uint64_t rebuild_ineligible; /* one not done left for the host loop (e.g. the row budget) */
    uint64_t graph_captures;  /* graphs captured (recaptures included) */
    uint64_t graph_replays;   /* steps launched as a graph replay */
    uint64_t graph_stale;     /* captured graphs dropped unreplayed because a buffer they use was
                                 freed/replaced (backend_graph_stale); recaptured on the next step */
    uint64_t records;         /* sequence-step records applied */
    uint64_t lm_rows;         /* LM-head rows the applied steps computed (batch x B each: every
                                 position of each active block, fixed shapes for the graph) */
    uint64_t lm_rows_masked;  /* of those, rows still masked before the step (the ones a
                                 masked-only LM head would need) */
    uint64_t fwd_rows;        /* canvas rows the enqueued steps' forwards ran (every sequence's whole
                                 canvas; a KV-cached step its window; block diffusion up to the end
                                 of the active block) */
    uint64_t steps_applied;   /* device steps whose records were applied */
    double   step_ms_total;   /* GPU time of those steps (device_step_gpu_ms), summed */
} decode_device_stats;

/* Observer of every applied device step: gpu_ms its device time (event timing, from the start of
 * its forward to its records copied), batch the sequences that got a record from it. Runs on the
 * runner's thread inside decode_device_step / _drain. */
typedef void (*decode_device_step_fn)(void *user, double gpu_ms, int batch);

/* 1 when the device loop can run sequence s on ctx: device decode support, not tensor-parallel
 * (ctx->shard.world <= 1), a forward that never waits for the host (ctx->host_sync 0), decoder
 * low_confidence / random / threshold / factor / origin, or maskgit_plus / topk_margin / entropy
 * without top_p / top_k, no CFG, no infill suffix, block_length <= 1024 (any KV cache mode: a batch
 * holding a cached sequence runs host-planned steps, one in flight). A block-causal model (LLaDA2,
 * the block-diffusion rules) with low_confidence / random / threshold: host-planned steps whose
 * forward ends at the active block (with a cache: the exact block KV, its chunked prefill run before
 * the step). Everything else stays on decode_step(). */
int decode_device_eligible(const model_ctx *ctx, const decode_seq *s);
/* 1 when ctx can run the device loop at all (device decode support, not tensor-parallel). */
int decode_device_supported(const model_ctx *ctx);

/* graphs: 1 = capture a graph for a batch that stayed unchanged for a step. */
decode_device *decode_device_create(model_ctx *ctx, int graphs);
/* Set the applied-step observer (NULL: none). */
void decode_device_set_on_step(decode_device *dd, decode_device_step_fn fn, void *user);
/* Drops whatever is pending without applying it (the caller finishes those sequences). */
void decode_device_free(decode_device *dd);

/* Advance seqs[0..n) (each eligible, not done, alive until it is done or left the set) by one
 * device step, applying the records that are due (one step behind) through decode_seq_apply to
 * sink. A sequence may become done here (its last record) or only at a later call. Returns 0, or
 * -1 + err when the forward failed: the steps before it were applied, the batch is dropped, and
 * the caller finishes the sequences that are not done (DECODE_FINISH_ERROR). */
int decode_device_step(decode_device *dd, decode_seq **seqs, int n, const decode_sink *sink, um_err *err);
/* Wait for every pending step and apply its records (to sequences not done). */
void decode_device_drain(decode_device *dd, const decode_sink *sink);
/* Drop the batch and its pending steps WITHOUT applying them: after a failure, when the caller
 * finishes the sequences itself. The next step rebuilds from the sequences' state. */
void decode_device_reset(decode_device *dd);
/* 1 while a batch holds sequences: the caller must keep calling decode_device_step (with the
 * current set, possibly empty) before any of them is freed. */
int  decode_device_holding(const decode_device *dd);
void decode_device_get_stats(const decode_device *dd, decode_device_stats *out);
/* sum += now - seen, field by field: folds what a runner counted since `seen` (an earlier
 * decode_device_get_stats) into a total over several runners. */
void decode_device_stats_add_delta(decode_device_stats *sum, const decode_device_stats *now,
                                   const decode_device_stats *seen);

#endif /* UM_DECODE_DEVICE_H */
