/*
 * sched.c — admission queue (round-robin over owner keys), engine threads, step-level batching.
 *
 * Not here: transports, sessions, JSON protocol (server/, api/); the decode loop (decode/).
 * Failure injection is not here: the forward-failure test hook fails decode_step / decode_device_step
 * at their forward (decode_forward_fault), so the scheduler runs the production schedule with it on.
 * sched_opts.step_check (NULL in production) is the unit tests' step gate.
 * Host or device loop: engine_step() is the one switch; eligible sequences on a CUDA engine go
 * through decode/decode_device.h (events one step behind the GPU), the others through decode_step.
 * Policy (sched.h): admission fair between owners (fewest running first, round robin among
 * equals), background requests last; preemption at step boundaries (engine_admit) pauses a
 * sequence for a waiting owner with nothing running, or for any waiting request in place of a
 * background one.
 * Threads: engine_main() runs on one thread per engine; submit/cancel on any thread (the service
 * thread); everything shared lives under sched.lock. An admitted request's decode_seq is touched
 * only by its engine thread — paused or not: a paused sequence's KV slots live on that engine's
 * ctx — (and by sched_cancel's caller while it is still queued, after unlinking it under the
 * lock).
 */
#include "sched/sched.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/decode_device.h"
#include "decode/event_copy.h"
#include "util/log.h"
#include "util/timeutil.h"

#define ENGINE_NICE 5   /* engine threads' nice value relative to the process (see engine_main) */

/* An owner key with requests in the scheduler (queued, running or paused). Owners with waiting
 * requests — queued, or paused on an engine — form the ring admission walks; every owner is on
 * sched.owners until it holds nothing. */
typedef struct sched_owner {
    uint64_t            key;
    sched_req          *head, *tail;  /* waiting: paused ones first (the latest paused first), then
                                         queued ones in submit order; linked by q_next */
    int                 n_running;    /* in some engine's batch */
    int                 n_held;       /* queued + running + paused: the record goes at 0 */
    int                 in_ring;
    struct sched_owner *next, *prev;  /* the ring (while it has waiting requests) */
    struct sched_owner *o_next;       /* sched.owners */
} sched_owner;

typedef struct engine {
    struct sched *s;
    int           index;
    model_ctx    *ctx;          /* borrowed */
    pthread_t     thread;
    int           started;
    /* engine-thread only */
    sched_req   **active;       /* [max_batch] */
    int           n_active;
    decode_seq  **seqs;         /* [max_batch] scratch for decode_step */
    decode_seq  **dseqs;        /* [max_batch] scratch: the device loop's share of a step */
    decode_seq  **hseqs;        /* [max_batch] scratch: the host loop's share */
    sched_req   **gone;         /* [max_batch + max_paused] scratch: requests that finished */
    /* under sched.lock (only this engine's thread changes them) */
    sched_req   **paused;       /* [max_paused] paused here (also on their owners' waiting lists) */
    int           n_paused;
    long          kv_held;      /* kv_rows of active[] and paused[] summed */
    decode_sink   sink;
    int           use_dev;      /* 1: this engine runs the device-resident loop (CUDA, not
                                   tensor-parallel, not host_loop); fixed at sched_create */
    decode_device *dev;         /* device-resident loop when use_dev, else NULL; created and
                                   freed by the engine thread */
    decode_device_stats dev_seen; /* dev's stats already added to sched.st */
    /* timed steps of the current iteration, added to sched.st under the lock (engine thread) */
    uint64_t      it_steps;     /* host decode_step calls + device steps applied */
    uint64_t      it_seqs;      /* sequences those steps advanced */
    double        it_ms;        /* their step times (host: wall time of decode_step; device: GPU
                                   time of the step, cudaEvent), ms */
    uint64_t      it_host_steps;
    double        it_host_ms;
} engine;

struct sched {
    sched_opts      o;
    sched_emit_fn   emit;
    void           *emit_user;
    int             n_engines;
    engine         *engines;    /* [n_engines] */

    pthread_mutex_t lock;
    pthread_cond_t  cv;         /* engines wait here when idle */
    /* --- under lock */
    int             stop;
    sched_owner    *owners;     /* every owner holding something */
    sched_owner    *rr;         /* the ring: next owner to serve, NULL when nothing waits */
    int             n_queued;   /* queued (not paused) over all owners */
    int             n_active;   /* over all engines */
    int             n_paused;   /* over all engines */
    sched_stats     st;
    uint64_t        next_id;

};

void sched_event_free(sched_event *ev) {
    if (!ev) return;
    decode_event_release(&ev->ev);
    free(ev);
}

/* ---------------------------------------------------------------- requests */

static atomic_uint_fast64_t g_req_ids = 1;

sched_req *sched_req_create(decode_seq *seq, uint64_t owner_key) {
    CHECK(seq);
    sched_req *r = xcalloc(1, sizeof *r);
    r->seq = seq;
    r->owner_key = owner_key;
    r->id = atomic_fetch_add(&g_req_ids, 1);
    r->t_create_ns = time_now_ns();
    atomic_init(&r->cancel, 0);
    atomic_init(&r->refs, 1); /* the creator's */
    r->state = SCHED_REQ_NEW;
    r->engine = -1;
    r->kv_rows = decode_seq_kv_rows(seq);
    decode_seq_set_user(seq, r);
    return r;
}

void sched_req_free(sched_req *r) {
    if (!r) return;
    if (atomic_fetch_sub(&r->refs, 1) != 1) return; /* the scheduler still holds it */
    CHECK(r->state == SCHED_REQ_NEW || r->state == SCHED_REQ_FINISHED);
    decode_seq_free(r->seq);
    free(r);
}

/* ---------------------------------------------------------------- owners and waiting lists (under lock) */

static sched_owner *owner_get(sched *s, uint64_t key) {
    for (sched_owner *o = s->owners; o; o = o->o_next)
        if (o->key == key) return o;
    sched_owner *o = xcalloc(1, sizeof *o);
    o->key = key;
    o->o_next = s->owners;
    s->owners = o;
    return o;
}

/* One thing less held by o; the record goes when it holds nothing. */
static void owner_release(sched *s, sched_owner *o) {
    CHECK(o->n_held > 0);
    if (--o->n_held > 0) return;
    CHECK(!o->head && !o->in_ring && o->n_running == 0);
    sched_owner **pp = &s->owners;
    while (*pp != o) pp = &(*pp)->o_next;
    *pp = o->o_next;
    free(o);
}

/* o has waiting requests: join the ring just before the next to serve (served last in this
 * round) unless it is on it. */
static void ring_join(sched *s, sched_owner *o) {
    if (o->in_ring) return;
    o->in_ring = 1;
    if (!s->rr) {
        o->next = o->prev = o;
        s->rr = o;
    } else {
        o->next = s->rr;
        o->prev = s->rr->prev;
        s->rr->prev->next = o;
        s->rr->prev = o;
    }
}

static void ring_leave_if_idle(sched *s, sched_owner *o) {
    if (!o->in_ring || o->head) return;
    o->in_ring = 0;
    if (o->next == o) s->rr = NULL;
    else {
        o->prev->next = o->next;
        o->next->prev = o->prev;
        if (s->rr == o) s->rr = o->next;
    }
    o->next = o->prev = NULL;
}

static void wait_push_back(sched *s, sched_owner *o, sched_req *r) {
    r->q_next = NULL;
    if (o->tail) o->tail->q_next = r;
    else o->head = r;
    o->tail = r;
    ring_join(s, o);
}

static void wait_push_front(sched *s, sched_owner *o, sched_req *r) {
    r->q_next = o->head;
    o->head = r;
    if (!o->tail) o->tail = r;
    ring_join(s, o);
}

static void wait_remove(sched *s, sched_owner *o, sched_req *r) {
    sched_req **pp = &o->head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->q_next;
    }
    CHECK(*pp == r);
    *pp = r->q_next;
    if (o->tail == r) o->tail = prev;
    r->q_next = NULL;
    ring_leave_if_idle(s, o);
}

/* The waiting request engine e should run next: an owner's first request of background class bg
 * that can run there (queued, or paused on e) — with fit_kv only when its KV rows fit e's budget
 * (a paused one always does: it is counted already; an engine holding nothing takes anything).
 * Among the owners that have one, the owner with the fewest running goes first, ties in ring
 * order from the next to serve. *own = its owner. NULL when there is none. */
static sched_req *wait_pick(const sched *s, const engine *e, int bg, int fit_kv, sched_owner **own) {
    sched_owner *best = NULL;
    sched_req *pick = NULL;
    sched_owner *o = s->rr;
    if (!o) return NULL;
    do {
        if (!best || o->n_running < best->n_running) {
            for (sched_req *r = o->head; r; r = r->q_next) {
                if (r->background != bg || (r->state == SCHED_REQ_PAUSED && r->engine != e->index)) continue;
                if (!(fit_kv && r->state == SCHED_REQ_QUEUED && s->o.kv_rows > 0 && e->kv_held > 0 &&
                      e->kv_held + r->kv_rows > s->o.kv_rows))
                    best = o, pick = r;
                break;   /* the owner's first eligible request, or none of its: they go in order */
            }
        }
        o = o->next;
    } while (o != s->rr);
    *own = best;
    return pick;
}

/* Put waiting request r (queued, or paused on e) into e's batch; the turn passes to the next owner. */
static void engine_take(sched *s, engine *e, sched_req *r, uint64_t now) {
    sched_owner *o = r->own;
    s->rr = o->next;
    wait_remove(s, o, r);
    if (r->state == SCHED_REQ_PAUSED) {
        CHECK(r->engine == e->index);
        int k = 0;
        for (int i = 0; i < e->n_paused; i++)
            if (e->paused[i] != r) e->paused[k++] = e->paused[i];
        CHECK(k == e->n_paused - 1);
        e->n_paused = k;
        s->n_paused--;
        r->paused_ns += now - r->t_pause_ns;
        r->t_pause_ns = 0;
        s->st.resumed++;
    } else {
        CHECK(r->state == SCHED_REQ_QUEUED);
        s->n_queued--;
        r->t_admit_ns = now;
        e->kv_held += r->kv_rows;
    }
    r->state = SCHED_REQ_ACTIVE;
    r->engine = e->index;
    r->t_run_ns = now;
    o->n_running++;
    e->active[e->n_active++] = r;
    s->n_active++;
}

/* Pause e->active[i] at this step boundary: it keeps its state (and its KV slots on e's ctx) and
 * waits at the front of its owner's list, to resume on e. */
static void engine_pause(sched *s, engine *e, int i, uint64_t now) {
    sched_req *r = e->active[i];
    memmove(&e->active[i], &e->active[i + 1], (size_t)(e->n_active - i - 1) * sizeof *e->active);
    e->n_active--;
    s->n_active--;
    r->state = SCHED_REQ_PAUSED;
    r->t_pause_ns = now;
    r->n_pauses++;
    r->own->n_running--;
    e->paused[e->n_paused++] = r;
    s->n_paused++;
    s->st.preempted++;
    wait_push_front(s, r->own, r);
}

/* The sequence of e's full batch to pause for waiting owner w: the latest admitted background one
 * (it yields to anyone); else, when w has nothing running, the latest admitted of the owner with
 * the most running — at least two, so that owner keeps one and the two never take turns. -1: none.
 * Cancelled sequences are not chosen (they leave at this boundary anyway). */
static int victim_pick(const engine *e, const sched_owner *w) {
    int v = -1;
    for (int i = 0; i < e->n_active; i++) {
        const sched_req *r = e->active[i];
        if (r->background && !atomic_load(&r->cancel) && (v < 0 || r->t_run_ns >= e->active[v]->t_run_ns)) v = i;
    }
    if (v >= 0 || w->n_running > 0) return v;
    const sched_owner *most = NULL;
    for (int i = 0; i < e->n_active; i++)
        if (!most || e->active[i]->own->n_running > most->n_running) most = e->active[i]->own;
    if (!most || most->n_running < 2) return -1;
    for (int i = 0; i < e->n_active; i++) {
        const sched_req *r = e->active[i];
        if (r->own == most && !atomic_load(&r->cancel) && (v < 0 || r->t_run_ns >= e->active[v]->t_run_ns)) v = i;
    }
    return v;
}

/* At a step boundary: fill e's free batch slots (foreground requests first; a queued request
 * whose KV rows do not fit waits — the engine's paused sequences may still resume), then pause
 * for whoever should not wait (victim_pick), within max_paused and the KV budget. */
static void engine_admit(sched *s, engine *e, uint64_t now) {
    sched_owner *o;
    while (e->n_active < s->o.max_batch) {
        sched_req *r = wait_pick(s, e, 0, 1, &o);
        if (!r) r = wait_pick(s, e, 1, 1, &o);
        if (!r) break;
        engine_take(s, e, r, now);
    }
    while (e->n_active == s->o.max_batch && e->n_paused < s->o.max_paused) {
        sched_req *r = wait_pick(s, e, 0, 1, &o);
        if (!r) break;
        int v = victim_pick(e, o);
        if (v < 0) break;
        engine_pause(s, e, v, now);
        engine_take(s, e, r, now);
    }
}

/* ---------------------------------------------------------------- events */

static sched_event *event_new(sched_req *r, const decode_event *ev) {
    sched_event *e = xcalloc(1, sizeof *e);
    e->req = r;
    e->t_ns = time_now_ns();
    decode_event_copy(&e->ev, ev);
    switch (ev->type) {
    case DECODE_EVENT_STEP: e->kind = SCHED_EV_STEP; break;
    case DECODE_EVENT_BLOCK: e->kind = SCHED_EV_BLOCK; break;
    case DECODE_EVENT_DONE: {
        e->kind = SCHED_EV_DONE;
        e->final = 1;
        e->queue_ms = r->t_admit_ns ? (double)(r->t_admit_ns - r->t_submit_ns) * 1e-6
                                    : (double)(e->t_ns - r->t_submit_ns) * 1e-6;
        const uint64_t paused_ns = r->paused_ns + (r->t_pause_ns ? e->t_ns - r->t_pause_ns : 0);
        e->paused_ms = (double)paused_ns * 1e-6;
        break;
    }
    }
    return e;
}

/* decode sink of an engine (engine thread): every event goes out at once (DONE included: the
 * scheduler keeps its own reference to the request until it left the active set). */
static void engine_sink(void *user, const decode_event *ev) {
    engine *e = user;
    sched_req *r = ev->seq_user;
    CHECK(r);
    e->s->emit(e->s->emit_user, event_new(r, ev));
}

/* sched_cancel of a queued request: collects its DONE, emitted once decode_seq_finish returned. */
static void direct_sink(void *user, const decode_event *ev) {
    sched_event **held = user;
    CHECK(!*held);
    *held = event_new(ev->seq_user, ev);
}

/* ---------------------------------------------------------------- engine thread */

/* Finish every not-done sequence of seqs[0..n) with an error (a failed step). */
static void engine_fail(engine *e, decode_seq **seqs, int n, const char *what, const um_err *err) {
    int k = 0;
    for (int i = 0; i < n; i++) k += !decode_seq_done(seqs[i]);
    log_error("engine %d: %s over %d sequences failed: %s", e->index, what, k, err->msg);
    for (int i = 0; i < n; i++) decode_seq_finish(seqs[i], DECODE_FINISH_ERROR, err->msg, &e->sink);
}

/* A timed batched step: reported to the observer (histograms) and added to the stats. */
static void engine_count_step(engine *e, double ms, int batch) {
    e->it_steps++;
    e->it_seqs += (uint64_t)batch;
    e->it_ms += ms;
    if (e->s->o.on_step) e->s->o.on_step(e->s->o.on_step_user, ms, batch);
}

/* decode_device's applied-step observer: gpu_ms is the step's GPU time (cudaEvent) */
static void engine_on_dev_step(void *user, double gpu_ms, int batch) { engine_count_step(user, gpu_ms, batch); }

/* One step of the engine over seqs[0..n) (not done): the device-resident loop takes the sequences
 * it supports, decode_step the rest; each side that fails finishes its sequences with an error.
 * With the device loop, sequences may finish in a later call (events lag one step) and the loop
 * must see every call, even with n == 0, to drain and let go of sequences that left. */
static void engine_step(engine *e, decode_seq **seqs, int n) {
    sched *s = e->s;
    um_err err = {0};
    if (s->o.step_check) { /* unit tests' gate only (NULL in production, and with the fault hooks): the
                            * check sees exact step counts, so nothing may lag */
        if (e->dev) decode_device_drain(e->dev, &e->sink);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (!decode_seq_done(seqs[i])) seqs[k++] = seqs[i];
        n = k;
        if (n > 0 && s->o.step_check(s->o.step_check_user, seqs, n, &err) != 0) {
            if (e->dev) decode_device_reset(e->dev);
            engine_fail(e, seqs, n, "decode step", &err);
            return;
        }
    }
    int nd = 0, nh = 0;
    long rows = 0; /* LM-head rows of the device batch: within sched_opts.device_rows */
    /* a sequence past its deadline takes its last step on the host loop (decode_step's; leaving the
     * device batch applies its pending device step first) */
    const uint64_t now = time_now_ns();
    for (int i = 0; i < n; i++) {
        const long b = decode_seq_params(seqs[i])->block_length;
        if (e->dev && decode_device_eligible(e->ctx, seqs[i]) && !decode_seq_expired(seqs[i], now) &&
            (s->o.device_rows <= 0 || rows + b <= s->o.device_rows)) {
            e->dseqs[nd++] = seqs[i];
            rows += b;
        } else {
            e->hseqs[nh++] = seqs[i];
        }
    }
    /* device steps are timed by the device (engine_on_dev_step, when their records are applied):
     * here the host only enqueues them */
    if (e->dev && decode_device_step(e->dev, e->dseqs, nd, &e->sink, &err) != 0)
        engine_fail(e, e->dseqs, nd, "device decode step", &err);
    if (nh > 0) {
        uint64_t t0 = time_now_ns();
        int rc = decode_step(e->ctx, e->hseqs, nh, &e->sink, &err);
        double ms = time_ms_since(t0);
        engine_count_step(e, ms, nh);
        e->it_host_steps++;
        e->it_host_ms += ms;
        if (rc != 0) engine_fail(e, e->hseqs, nh, "decode step", &err);
    }
}

static void *engine_main(void *arg) {
    engine *e = arg;
    sched *s = e->s;
    /* Compute yields to socket I/O: the engine (and the worker threads it starts, which inherit
     * this) runs at a lower priority than the lws service thread, so that events reach clients
     * promptly on a machine whose cores are all busy with the forward pass. */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), ENGINE_NICE) != 0)
        log_debug("engine %d: setpriority failed", e->index);
    if (e->use_dev) {
        e->dev = decode_device_create(e->ctx, 1);
        decode_device_set_on_step(e->dev, engine_on_dev_step, e);
        log_info("engine %d: device-resident decode loop on (eligible requests)", e->index);
    }
    for (;;) {
        /* --- sched lock { */
        pthread_mutex_lock(&s->lock);
        while (!s->stop && e->n_active == 0 && e->n_paused == 0 && s->n_queued == 0)
            pthread_cond_wait(&s->cv, &s->lock);
        if (s->stop) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        engine_admit(s, e, time_now_ns());
        pthread_mutex_unlock(&s->lock);
        /* } sched lock --- */

        /* Cancelled sequences leave before the step: they use no more compute. Paused ones too
         * (this thread owns their KV slots). */
        for (int i = 0; i < e->n_active + e->n_paused; i++) {
            sched_req *r = i < e->n_active ? e->active[i] : e->paused[i - e->n_active];
            if (atomic_load(&r->cancel) && !decode_seq_done(r->seq))
                decode_seq_finish(r->seq, DECODE_FINISH_CANCELLED, NULL, &e->sink);
        }
        int n = 0;
        for (int i = 0; i < e->n_active; i++)
            if (!decode_seq_done(e->active[i]->seq)) e->seqs[n++] = e->active[i]->seq;
        e->it_steps = e->it_seqs = e->it_host_steps = 0;
        e->it_ms = e->it_host_ms = 0;
        if (n > 0 || (e->dev && decode_device_holding(e->dev))) engine_step(e, e->seqs, n);
        decode_device_stats ds;
        memset(&ds, 0, sizeof ds);
        if (e->dev) decode_device_get_stats(e->dev, &ds);

        /* --- sched lock { */
        pthread_mutex_lock(&s->lock);
        if (n > 0 && n > s->st.max_batch_seen) s->st.max_batch_seen = n;
        s->st.steps += e->it_steps;
        s->st.step_seqs += e->it_seqs;
        s->st.step_ms_total += e->it_ms;
        s->st.host_steps += e->it_host_steps;
        s->st.host_step_ms_total += e->it_host_ms;
        if (e->dev) {
            decode_device_stats_add_delta(&s->st.device, &ds, &e->dev_seen);
            e->dev_seen = ds;
        }
        /* finished: running ones, and paused ones (cancelled, or done by a device step that was
         * still in flight when they were paused) */
        int k = 0, n_gone = 0;
        for (int i = 0; i < e->n_active; i++) {
            sched_req *r = e->active[i];
            if (decode_seq_done(r->seq)) {
                r->own->n_running--;
                s->n_active--;
                e->gone[n_gone++] = r;
            } else {
                e->active[k++] = r;
            }
        }
        e->n_active = k;
        k = 0;
        for (int i = 0; i < e->n_paused; i++) {
            sched_req *r = e->paused[i];
            if (decode_seq_done(r->seq)) {
                wait_remove(s, r->own, r);
                s->n_paused--;
                r->paused_ns += time_now_ns() - r->t_pause_ns;
                r->t_pause_ns = 0;
                e->gone[n_gone++] = r;
            } else {
                e->paused[k++] = r;
            }
        }
        e->n_paused = k;
        for (int i = 0; i < n_gone; i++) {
            sched_req *r = e->gone[i];
            r->state = SCHED_REQ_FINISHED;
            r->engine = -1;
            e->kv_held -= r->kv_rows;
            owner_release(s, r->own);
            r->own = NULL;
            s->st.finished++;
            enum decode_finish f = decode_seq_finish_reason(r->seq);
            if (f == DECODE_FINISH_CANCELLED) s->st.cancelled++;
            else if (f == DECODE_FINISH_ERROR) s->st.failed++;
        }
        pthread_mutex_unlock(&s->lock);
        /* } sched lock --- */

        for (int i = 0; i < n_gone; i++) sched_req_free(e->gone[i]); /* the scheduler's reference */
    }
    /* steps still in flight are dropped: sched_finish_all cancels their sequences */
    decode_device_free(e->dev);
    e->dev = NULL;
    decode_thread_scratch_free();
    return NULL;
}

/* ---------------------------------------------------------------- lifecycle */

sched *sched_create(model_ctx **ctxs, int n_engines, const sched_opts *o, sched_emit_fn emit, void *emit_user) {
    CHECK(n_engines >= 1 && o->max_batch >= 1 && o->max_queue >= 0 && o->max_paused >= 0 && o->kv_rows >= 0 && emit);
    sched *s = xcalloc(1, sizeof *s);
    s->o = *o;
    s->emit = emit;
    s->emit_user = emit_user;
    s->n_engines = n_engines;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->engines = xcalloc((size_t)n_engines, sizeof *s->engines);
    for (int i = 0; i < n_engines; i++)   /* before any engine thread runs (they write s->st) */
        s->st.device_loop_engines += !o->host_loop && decode_device_supported(ctxs[i]);
    /* Engine threads never take signals: SIGINT/SIGTERM go to the service thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < n_engines; i++) {
        engine *e = &s->engines[i];
        e->s = s;
        e->index = i;
        e->ctx = ctxs[i];
        e->use_dev = !o->host_loop && decode_device_supported(ctxs[i]);
        e->active = xcalloc((size_t)o->max_batch, sizeof *e->active);
        e->seqs = xcalloc((size_t)o->max_batch, sizeof *e->seqs);
        e->dseqs = xcalloc((size_t)o->max_batch, sizeof *e->dseqs);
        e->hseqs = xcalloc((size_t)o->max_batch, sizeof *e->hseqs);
        e->gone = xcalloc((size_t)(o->max_batch + o->max_paused), sizeof *e->gone);
        e->paused = xcalloc((size_t)(o->max_paused > 0 ? o->max_paused : 1), sizeof *e->paused);
        e->sink.fn = engine_sink;
        e->sink.user = e;
        if (pthread_create(&e->thread, NULL, engine_main, e) != 0) UM_FATAL("cannot start engine thread %d", i);
        e->started = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return s;
}

void sched_stop(sched *s) {
    if (!s) return;
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
    for (int i = 0; i < s->n_engines; i++) {
        engine *e = &s->engines[i];
        if (e->started) pthread_join(e->thread, NULL);
        e->started = 0;
    }
}

void sched_finish_all(sched *s) {
    int n = 0;
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    CHECK(s->stop);
    sched_req **all = xcalloc((size_t)(s->n_queued + s->n_active + s->n_paused) + 1, sizeof *all);
    for (sched_owner *o = s->owners; o; o = o->o_next)   /* queued (paused ones: from their engine) */
        for (sched_req *r = o->head; r; r = r->q_next)
            if (r->state == SCHED_REQ_QUEUED) all[n++] = r;
    for (int i = 0; i < s->n_engines; i++) {
        engine *e = &s->engines[i];
        for (int j = 0; j < e->n_active; j++) all[n++] = e->active[j];
        for (int j = 0; j < e->n_paused; j++) all[n++] = e->paused[j];
        e->n_active = e->n_paused = 0;
        e->kv_held = 0;
    }
    while (s->owners) {
        sched_owner *o = s->owners;
        s->owners = o->o_next;
        free(o);
    }
    s->rr = NULL;
    s->n_queued = s->n_active = s->n_paused = 0;
    for (int i = 0; i < n; i++) {
        all[i]->state = SCHED_REQ_FINISHED;
        all[i]->engine = -1;
        all[i]->own = NULL;
        all[i]->q_next = NULL;
        s->st.finished++;
        s->st.cancelled++;
    }
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
    for (int i = 0; i < n; i++) {
        sched_event *held = NULL;
        decode_sink sink = {direct_sink, &held};
        if (!decode_seq_done(all[i]->seq)) decode_seq_finish(all[i]->seq, DECODE_FINISH_CANCELLED, NULL, &sink);
        if (!held) { /* already done (cannot happen between steps); still owe a final event */
            held = xcalloc(1, sizeof *held);
            held->req = all[i];
            held->kind = SCHED_EV_DONE;
            held->ev.type = DECODE_EVENT_DONE;
            held->ev.seq_user = all[i];
            held->ev.block = -1;
            held->ev.finish = DECODE_FINISH_CANCELLED;
            held->t_ns = time_now_ns();
        }
        held->final = 1;
        s->emit(s->emit_user, held);
        sched_req_free(all[i]); /* the scheduler's reference */
    }
    free(all);
}

void sched_free(sched *s) {
    if (!s) return;
    sched_stop(s);
    CHECK(s->n_queued == 0 && s->n_active == 0 && s->n_paused == 0 && !s->owners);
    for (int i = 0; i < s->n_engines; i++) {
        free(s->engines[i].active);
        free(s->engines[i].seqs);
        free(s->engines[i].dseqs);
        free(s->engines[i].hseqs);
        free(s->engines[i].gone);
        free(s->engines[i].paused);
    }
    free(s->engines);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---------------------------------------------------------------- submit / cancel */

int sched_submit(sched *s, sched_req *r, int *queue_pos, um_err *err) {
    CHECK(r->state == SCHED_REQ_NEW);
    int rc = 0;
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    int free_slots = s->n_engines * s->o.max_batch - s->n_active;
    if (free_slots < 0) free_slots = 0;
    if (s->stop) {
        rc = um_err_set(err, UM_ERR_INTERNAL, "the server is shutting down");
    } else if (s->n_queued >= free_slots + s->o.max_queue) {
        s->st.rejected++;
        rc = um_err_set(err, UM_ERR_RESOURCE, "the queue is full (%d requests waiting, max_queue %d); retry later",
                        s->n_queued, s->o.max_queue);
    } else {
        int pos = s->n_queued + 1 - free_slots;
        if (queue_pos) *queue_pos = pos > 0 ? pos : 0;
        r->t_submit_ns = time_now_ns();
        atomic_fetch_add(&r->refs, 1); /* the scheduler's, dropped when it lets go of r */
        r->own = owner_get(s, r->owner_key);
        r->own->n_held++;
        r->state = SCHED_REQ_QUEUED;
        wait_push_back(s, r->own, r);
        s->n_queued++;
        s->st.submitted++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
    return rc;
}

void sched_cancel(sched *s, sched_req *r) {
    int unqueued = 0;
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    if (r->state == SCHED_REQ_QUEUED) {
        wait_remove(s, r->own, r);
        s->n_queued--;
        owner_release(s, r->own);
        r->own = NULL;
        unqueued = 1;
        r->state = SCHED_REQ_FINISHED;
        s->st.finished++;
        s->st.cancelled++;
    } else if (r->state == SCHED_REQ_ACTIVE || r->state == SCHED_REQ_PAUSED) {
        atomic_store(&r->cancel, 1);
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
    if (unqueued) {
        /* Nobody else references r now: finish it here; its DONE is the final event. */
        sched_event *held = NULL;
        decode_sink sink = {direct_sink, &held};
        decode_seq_finish(r->seq, DECODE_FINISH_CANCELLED, NULL, &sink);
        CHECK(held && held->final);
        s->emit(s->emit_user, held);
        sched_req_free(r); /* the scheduler's reference */
    }
}

void sched_set_background(sched *s, sched_req *r, int bg) {
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    r->background = bg != 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
}

void sched_get_stats(sched *s, sched_stats *out) {
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    *out = s->st;
    out->queued = s->n_queued;
    out->active = s->n_active;
    out->paused = s->n_paused;
    pthread_mutex_unlock(&s->lock);
    /* } sched lock --- */
    memset(&out->kv, 0, sizeof out->kv);
    for (int i = 0; i < s->n_engines; i++) {   /* atomics of each ctx's slot table */
        model_kv_stats k;
        model_kv_get_stats(s->engines[i].ctx, &k);
        out->kv.slots += k.slots, out->kv.bytes += k.bytes, out->kv.peak_bytes += k.peak_bytes;
        out->kv.opened += k.opened, out->kv.closed += k.closed;
    }
}

int sched_n_engines(const sched *s) { return s->n_engines; }
const sched_opts *sched_get_opts(const sched *s) { return &s->o; }
