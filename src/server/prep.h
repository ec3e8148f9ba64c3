/*
 * prep.h — the request preparation workers: the expensive, pure part of admitting a generation
 * (JSON -> chat template -> tokenizer -> decode_seq; tens of ms for a 1 MB prompt) runs here, off
 * the lws service thread, so one large prompt never stalls other connections' pings and streams.
 *
 * A transport embeds a prep_job at the start of its own struct, sets owner_key / run / done and
 * submits it (service thread). A worker calls run(j) (worker thread: pure work on data the job
 * owns, no lws, no sessions, no server state); the service thread then calls done(j) from
 * prep_pool_drain() (server_on_wake), where the transport reports errors, submits to the
 * scheduler and sends `accepted` — so a request's `accepted` still precedes its events. done owns
 * j (frees it).
 *
 * Order: jobs of one owner_key (a WebSocket session, an HTTP caller) run one at a time in submit
 * order, so their done()s come in submit order; different owners run in parallel (n workers).
 * Cancel: set j->cancel (service thread) when nobody wants the result any more; a job that has not
 * started then skips run (j->skipped = 1). Shutdown: prep_pool_stop() joins the workers; jobs never
 * started complete as skipped.
 *
 * Threads: create/submit/drain/busy/stop/free on the service (main) thread; run on the workers;
 * the shared queue lives under prep_pool.lock. `wake` is called (any worker) after a job finished.
 */
#ifndef UM_PREP_H
#define UM_PREP_H

#include <stdatomic.h>
#include <stdint.h>

typedef struct prep_pool prep_pool;
typedef struct prep_job  prep_job;
typedef void (*prep_fn)(prep_job *j);

struct prep_job {
    uint64_t   owner_key;  /* jobs with equal keys run one at a time, in submit order */
    prep_fn    run;        /* worker thread */
    prep_fn    done;       /* service thread; owns j afterwards */
    atomic_int cancel;     /* service thread: 1 = result unwanted (run skipped if not started) */
    int        skipped;    /* run was not called (cancelled before it started, or shutdown) */
    prep_job  *next;       /* pool-internal */
};

/* n_threads workers (>= 1); wake(wake_user) after each finished job (lws_cancel_service). */
prep_pool *prep_pool_create(int n_threads, void (*wake)(void *user), void *wake_user);
void       prep_pool_submit(prep_pool *p, prep_job *j);
/* done() of every finished job, in completion order. */
void       prep_pool_drain(prep_pool *p);
/* Jobs submitted whose done() has not run yet (graceful shutdown waits for 0). */
int        prep_pool_busy(const prep_pool *p);
/* Join the workers (after their current job); queued jobs are marked skipped. done() of everything
 * left runs at the next prep_pool_drain(). Idempotent. */
void       prep_pool_stop(prep_pool *p);
/* After stop + drain. */
void       prep_pool_free(prep_pool *p);

#endif /* UM_PREP_H */
