/*
 * sched.h — admission queue, step-level continuous batching and the engine thread pool.
 *
 * A sched_req wraps one decode_seq (a generation). Transports (WebSocket sessions, HTTP/SSE
 * handlers) create requests, sched_submit() them and receive their events through the `emit`
 * callback given to sched_create(); the server forwards those to the service thread (server/hub).
 *
 * Engines: one thread per device (today: the CPU backend; N model_ctx for N devices). Each engine
 * loops: drop cancelled sequences, admit waiting requests up to max_batch (fair between owner keys
 * — callers —: the owner with the fewest sequences running goes first, round robin among equals,
 * so one caller's burst cannot starve others), run ONE decode_step over all its active sequences,
 * let finished ones leave. Requests join and leave between steps.
 *
 * Preemption at step boundaries: when the batch is full and a request waits whose owner has
 * nothing running (or any request waits while the batch holds a *background* sequence — a
 * detached session's: sched_set_background), the engine pauses one running sequence — a
 * background one first, else the latest admitted of the owner with the most running (at least
 * two, so the pause never leaves that owner with nothing) — and admits the waiting request in its
 * place. A paused sequence keeps everything (canvas, decoder state, KV cache slots on the engine's
 * ctx), stays on that engine, waits at the front of its owner's requests, and resumes exactly
 * where it stopped once it is admitted again: its output is identical to an unpaused run (its
 * randomness is keyed by its own step index, decode.h). Bounded: at most sched_opts.max_paused
 * paused per engine, and the KV rows of an engine's running + paused sequences within
 * sched_opts.kv_rows. Background requests are admitted only when no other request waits.
 * On a CUDA engine the sequences the device-resident loop supports (decode_device_eligible) are
 * advanced by it instead (events one step behind the GPU; same events otherwise), the rest by
 * decode_step; sched_opts.host_loop forces decode_step for all.
 *
 * Every submitted request produces exactly one final event (kind SCHED_EV_DONE, final = 1) —
 * finished, cancelled (queued or running) or failed. Requests are reference counted: the creator
 * holds one reference (dropped with sched_req_free, normally after consuming the final event) and
 * the scheduler one while the request is queued or active, so DONE goes out the moment it is
 * produced.
 *
 * Not here: sockets, JSON (events are typed until a transport sends or stores them: api/event.h),
 * sessions, tokenization (server/, api/). Decoding (decode/).
 *
 * Threads: sched_create/sched_stop/sched_free on the main thread; sched_submit/sched_cancel from
 * any thread (the lws service thread in practice); `emit` runs on engine threads and, for requests
 * cancelled while still queued, on the thread that called sched_cancel. All shared state is under
 * sched.lock.
 */
#ifndef UM_SCHED_H
#define UM_SCHED_H

#include <stdatomic.h>
#include <stdint.h>

#include "decode/decode.h"
#include "decode/decode_device.h"
#include "model/model.h"
#include "util/err.h"

typedef struct sched sched;
typedef struct sched_req sched_req;

enum sched_ev_kind {
    SCHED_EV_STEP,   /* decode STEP event */
    SCHED_EV_BLOCK,  /* decode BLOCK event */
    SCHED_EV_DONE,   /* decode DONE event: always the request's last event (final = 1) */
};

/* One event of one request, handed from an engine thread to whoever consumes it. */
typedef struct sched_event {
    struct sched_event *next;   /* list link for the consumer's queues */
    sched_req          *req;
    enum sched_ev_kind  kind;
    int                 final;  /* 1: last event of req; the scheduler has let go of req */
    decode_event        ev;     /* owned copy of the decode event (decode/event_copy.h; ev.seq is
                                   NULL, ev.seq_user is req): consumers read its fields, and the
                                   transports turn it into JSON where they send or store it
                                   (api/event.h) */
    double              queue_ms;  /* DONE: submission -> first admission (never admitted: ->
                                      this event), ms */
    double              paused_ms; /* DONE: time spent paused at step boundaries, ms */
    uint64_t            t_ns;   /* time_now_ns() when the engine produced it */
} sched_event;

void sched_event_free(sched_event *ev);

/* Called for every event (engine threads, or sched_cancel's caller). Takes ownership of ev. Must
 * not block for long and must not call back into the scheduler. */
typedef void (*sched_emit_fn)(void *user, sched_event *ev);

/* Service-thread delivery hook of a request (see server/hub): set by the transport that owns the
 * request; never called by the scheduler itself. */
typedef void (*sched_deliver_fn)(sched_req *r, sched_event *ev);

struct sched_owner;

struct sched_req {
    /* --- set at creation, immutable afterwards (read by any thread) */
    decode_seq *seq;            /* owned */
    uint64_t    owner_key;      /* fairness key (the caller); requests with equal keys share a
                                   round-robin turn */
    uint64_t    id;             /* unique, assigned by sched_req_create */
    uint64_t    t_create_ns;
    int         kv_rows;        /* decode_seq_kv_rows(seq): KV cache rows it holds while running
                                   or paused (0 without a cache) */

    /* --- transport-owned (service thread only; the scheduler never reads these) */
    sched_deliver_fn deliver;   /* NULL = events are dropped (owner gone) */
    void            *owner;     /* the transport's object (session generation, HTTP stream) */

    /* --- scheduler-owned (under sched.lock, or the owning engine thread once admitted) */
    atomic_int  cancel;         /* 1: stop at the next step boundary (set by sched_cancel) */
    atomic_int  refs;           /* creator + scheduler (while queued/active) */
    int         state;          /* SCHED_REQ_* */
    int         background;     /* 1: yields to every other request (sched_set_background) */
    int         engine;         /* engine whose batch holds it (ACTIVE) or that paused it (PAUSED,
                                   it resumes only there), else -1 */
    struct sched_owner *own;    /* its owner's record while queued, active or paused */
    uint64_t    t_submit_ns;
    uint64_t    t_admit_ns;     /* first admission */
    uint64_t    t_run_ns;       /* latest admission or resumption */
    uint64_t    t_pause_ns;     /* when it was paused (PAUSED only) */
    uint64_t    paused_ns;      /* time spent paused, in total */
    int         n_pauses;
    sched_req  *q_next;         /* waiting-list link (within its owner) */
};

/* NEW -> QUEUED -> ACTIVE <-> PAUSED -> FINISHED (cancelled while queued: QUEUED -> FINISHED) */
enum { SCHED_REQ_NEW, SCHED_REQ_QUEUED, SCHED_REQ_ACTIVE, SCHED_REQ_PAUSED, SCHED_REQ_FINISHED };

/* Observer of every batched decode step (engine threads, outside the scheduler's lock), batch the
 * number of sequences it advanced. step_ms: for a host-loop step the wall time inside decode_step;
 * for a device-loop step (reported when its records are applied, one engine iteration after it
 * was enqueued) its GPU time, cudaEvent-timed from the start of its forward to its records being
 * copied back (the host's enqueue of the step takes next to no time and is not reported). An
 * engine iteration that runs both loops reports two steps. Must be cheap and thread-safe (the
 * server feeds its step-latency histogram from it). */
typedef void (*sched_step_fn)(void *user, double step_ms, int batch);

/* A step check (sched_opts.step_check): 0 lets the step run, -1 + err fails it. */
typedef int (*sched_check_fn)(void *user, decode_seq **seqs, int n, um_err *err);

typedef struct sched_opts {
    int           max_batch;   /* sequences per decode_step per engine (>= 1) */
    int           max_queue;   /* requests waiting for admission in total (>= 0) */
    sched_step_fn on_step;     /* optional step observer (NULL: none) */
    void         *on_step_user;
    int           host_loop;   /* 1: always the host loop (decode_step), even where the
                                  device-resident loop (decode/decode_device.h) could run; for
                                  comparisons and debugging. 0 (default): device loop for eligible
                                  sequences on CUDA engines (serve --device-loop on|off). */
    int           device_rows; /* LM-head rows (sum of block lengths) one engine's device batch may
                                  hold: the device loop keeps every active-block row's logits on the
                                  GPU, and the fit check reserved this many; eligible sequences
                                  beyond it (in admission order) take the host loop. 0 = no limit */
    sched_check_fn step_check; /* NULL in production (the fault hooks do not use it: util/fault.h).
                                  Unit tests' step gate: called on the engine thread before each
                                  batched step with its sequences (the device loop drained first, so
                                  step counts are exact — a different schedule, hence tests only);
                                  -1 + err fails the step: every sequence of it finishes with the error */
    void         *step_check_user;
    int           max_paused;  /* sequences one engine may hold paused (preemption, above); 0 = never
                                  pause (a waiting request waits for a free slot) */
    long          kv_rows;     /* KV cache rows one engine's running and paused sequences may hold
                                  together (sched_req.kv_rows summed; what the fit check reserved):
                                  a pause that would exceed it does not happen. 0 = no limit */
} sched_opts;

/* Aggregate counters (a consistent snapshot taken under the lock). */
typedef struct sched_stats {
    int      queued, active;        /* now */
    int      paused;                /* now: paused at a step boundary (preemption) */
    uint64_t submitted, rejected, finished, cancelled, failed;
    uint64_t preempted;             /* pauses, in total */
    uint64_t resumed;               /* paused sequences admitted again */
    uint64_t steps;                 /* batched steps over all engines: host decode_step calls +
                                       device steps applied (what on_step reports) */
    uint64_t step_seqs;             /* sum of batch sizes over those steps */
    int      max_batch_seen;        /* most sequences one engine iteration advanced */
    double   step_ms_total;         /* their step times summed (see sched_step_fn), ms */
    uint64_t host_steps;            /* of those, host-loop decode_step calls */
    double   host_step_ms_total;    /* wall time inside decode_step, summed, ms */
    /* device-resident loop (CUDA engines; all 0 on the host loop) */
    int      device_loop_engines;   /* engines that run eligible sequences on it: CUDA, not
                                       tensor-parallel, not host_loop (fixed at sched_create) */
    decode_device_stats device;     /* its counters summed over the engines (decode_device.h) */
    model_kv_stats kv;              /* KV cache slots of the engines' ctxs, summed (model.h; peak_bytes
                                       is the sum of each engine's peak); read live, not under the lock */
} sched_stats;

/* ctxs[0..n_engines): one model_ctx per engine, all for the same model; the scheduler borrows
 * them (the caller frees them after sched_free). Engines start immediately. */
sched *sched_create(model_ctx **ctxs, int n_engines, const sched_opts *o, sched_emit_fn emit, void *emit_user);
/* Stop engines after their current step and join them. Idempotent. */
void sched_stop(sched *s);
/* After sched_stop: finish every request still queued or active (DONE, finish_reason "cancelled"),
 * emitted through `emit` from the calling thread; then the scheduler holds nothing. */
void sched_finish_all(sched *s);
void sched_free(sched *s);

/* New request around seq (ownership of seq moves to the request). */
sched_req *sched_req_create(decode_seq *seq, uint64_t owner_key);
/* Drop the creator's reference: after consuming the final event, or for a request that was never
 * submitted. The request is freed when the scheduler has let go of it too. */
void sched_req_free(sched_req *r);

/* Queue r. On success *queue_pos = requests that must be admitted before it (0: it joins at the
 * next step boundary). The queue holds max_queue waiting requests beyond the free batch slots;
 * when full: -1, UM_ERR_RESOURCE. After sched_stop: -1, UM_ERR_INTERNAL. On failure r is
 * untouched (the caller frees it). */
int sched_submit(sched *s, sched_req *r, int *queue_pos, um_err *err);
/* Cancel r: queued -> removed now and its final DONE (finish_reason "cancelled") emitted from this
 * thread; running or paused -> stops at the next step boundary of its engine (final DONE from the
 * engine, which owns a paused sequence's KV slots). No-op once it finished. Call it from the
 * thread that consumes r's events (so r cannot be freed meanwhile). */
void sched_cancel(sched *s, sched_req *r);
/* Mark r background (bg 1: its client is gone for now — a detached session) or not (bg 0, the
 * default). A background request is admitted only when no other request waits, and is the first
 * to be paused when one does; it resumes as soon as it is foreground again and its owner's turn
 * comes, or when there is free capacity. Any state, any thread (under the lock); before
 * sched_submit it sets how r starts. */
void sched_set_background(sched *s, sched_req *r, int bg);

void sched_get_stats(sched *s, sched_stats *out);
int  sched_n_engines(const sched *s);
const sched_opts *sched_get_opts(const sched *s);

#endif /* UM_SCHED_H */
