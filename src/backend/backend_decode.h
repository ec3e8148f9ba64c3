/*
 * backend_decode.h — the primitives a backend with BACKEND_CAP_DEVICE_DECODE offers the device
 * decode step (decode/device_step.c): raw device buffers and asynchronous copies, pinned host
 * memory, events with timing, device-resident inputs (aliases), and the three decode kernels
 * (begin / sample / commit over the layouts of backend_decode_types.h). Graph capture is
 * BACKEND_CAP_GRAPHS (backend.h).
 *
 * Everything is enqueued on the backend's one queue (CUDA: its stream) in call order; nothing here
 * synchronises except backend_event_wait and backend_synchronize. Calling any of these on a backend
 * without the capability is a bug (aborts).
 *
 * Not here: what a decode step is (decode/), the kernels (kernels/decode.cu).
 * Threading: the thread driving the backend.
 */
#ifndef UM_BACKEND_DECODE_H
#define UM_BACKEND_DECODE_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/backend_decode_types.h"

typedef struct backend_event backend_event;

/* The device arrays of one batch of sequences, for the decode kernels. All pointers are device
 * buffers from backend_buf_alloc. */
typedef struct bdec_launch {
    umk_seq_state        *state;      /* [n_seqs] */
    int                   n_seqs;
    int                   block_len;  /* B: rows per sequence in jobs / x0 / conf / out_rows */
    umk_vocab_ids         ids;
    int32_t              *tokens;     /* the packed canvas, committed in place */
    const int32_t        *blk_steps;  /* per-block step budgets, or NULL */
    umk_sample_job       *jobs;       /* [n_seqs * B] rows to sample (written by begin / commit) */
    int32_t              *out_rows;   /* [n_seqs * B] LM-head rows of the next forward */
    const umk_sample_cfg *cfg;        /* [n_seqs] */
    int32_t              *x0;         /* [n_seqs * B] sampled tokens */
    double               *conf;       /* [2][n_seqs * B] their confidences, then (sequences whose cfg
                                         has dream_score) Dream's decoder scores */
    void                 *events;     /* [n_seqs] step records of UMK_EVENT_BYTES(B) */
} bdec_launch;

/* Device buffers (never NULL; aborts when the device is out of memory) and their release. */
void *backend_buf_alloc(backend *be, size_t bytes);
void  backend_buf_free(backend *be, void *p);
/* Queue a copy host -> device / device -> host. The host side must stay valid (and, for a get,
 * unread) until the queue has passed the copy: pinned memory from backend_host_alloc, or wait. */
void  backend_buf_set_async(backend *be, void *dst, const void *src, size_t bytes);
void  backend_buf_get_async(backend *be, void *dst, const void *src, size_t bytes);
/* Pinned host memory for asynchronous copies. */
void *backend_host_alloc(backend *be, size_t bytes);
void  backend_host_free(backend *be, void *p);

/* Events: a mark in the queue. query: 1 when the queue has passed it, 0 not yet. wait: block until
 * it has. elapsed_ms: device time between two passed events. */
backend_event *backend_event_new(backend *be);
void           backend_event_free(backend *be, backend_event *ev);
void           backend_event_record(backend *be, backend_event *ev);
int            backend_event_query(backend *be, backend_event *ev);
void           backend_event_wait(backend *be, backend_event *ev);
double         backend_event_elapsed_ms(backend *be, backend_event *a, backend_event *b);

/* Per-op timing (`bench --profile 1`): after start, every op launched directly (not in a graph
 * capture) is timed with an event pair and summed by op name; report prints a markdown table (ms
 * per `per` steps, share of the ops' total and of wall_ms) and clears the totals; stop frees it all
 * (backend_free does too). start: 0, or -1 on a backend without the timed-event members (the CPU
 * backend has them, as host clocks, without the rest of the device-decode group). */
int  backend_profile_available(const backend *be);   /* 1 when start would succeed */
int  backend_profile_start(backend *be);
void backend_profile_report(backend *be, FILE *f, double per, double wall_ms);
void backend_profile_stop(backend *be);

/* Device-resident inputs: while an alias is registered, any op given a HOST index array that lies
 * inside [host, host + bytes) reads the same offset of the device array dev instead of staging the
 * host copy (the host contents are then ignored). This is how a device decode step feeds its device
 * canvas (embed ids) and LM-head rows (get_rows) to the unchanged forward pass. */
void backend_alias_add(backend *be, const void *host, const void *dev, size_t bytes);
void backend_alias_clear(backend *be);

/* The decode kernels (semantics of decode/sample.c and decode/decoders.c):
 * begin:  before the first step: skip blocks without masks, set each block's mask count, write
 *         the first sample jobs and LM-head rows;
 * sample: x0 / conf of every job from logits [n_seqs * B, ids.vocab] (activation dtype);
 * commit: the decoder rule, commits into tokens, block advance, EOS stop, the step records and
 *         the next step's jobs and rows. */
void backend_decode_begin(backend *be, const bdec_launch *l);
void backend_decode_sample(backend *be, const bdec_launch *l, const void *logits);
void backend_decode_commit(backend *be, const bdec_launch *l);

#endif /* UM_BACKEND_DECODE_H */
