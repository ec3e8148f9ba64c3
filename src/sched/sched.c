/*
 * sched.c — admission queue (round-robin over owner keys), engine threads, step-level batching.
 *
 * Not here: transports, sessions, JSON protocol (server/, api/); the decode loop (decode/).
 * Failure injection is not here: sched_opts.step_check (NULL in production) may fail a step like a
 * failing forward; decode/fault_inject.c is the test hook that uses it.
 * Host or device loop: engine_step() is the one switch; eligible sequences on a CUDA engine go
 * through decode/decode_device.h (events one step behind the GPU), the others through decode_step.
 * Threads: engine_main() runs on one thread per engine; submit/cancel on any thread (the service
 * thread); everything shared lives under sched.lock. An admitted request's decode_seq is touched
 * only by its engine thread (and by sched_cancel's caller while it is still queued, after
 * unlinking it under the lock).
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
#include "decode/event_json.h"
#include "util/log.h"
#include "util/timeutil.h"

#define ENGINE_NICE 5   /* engine threads' nice value relative to the process (see engine_main) */

/* Requests of one owner key waiting for admission; buckets form a ring served round-robin. */
typedef struct bucket {
    uint64_t       key;
    sched_req     *head, *tail;
    int            n;
    struct bucket *next, *prev;
} bucket;

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
    sched_req   **gone;         /* [max_batch] scratch: requests that left the active set */
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
    bucket         *rr;         /* next bucket to serve, NULL when nothing is queued */
    int             n_queued;
    int             n_active;   /* over all engines */
    sched_stats     st;
    uint64_t        next_id;

};

void sched_event_free(sched_event *ev) {
    if (!ev) return;
    if (ev->obj) json_decref(ev->obj);
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

/* ---------------------------------------------------------------- queue (under lock) */

static bucket *bucket_find(sched *s, uint64_t key) {
    bucket *b = s->rr;
    if (!b) return NULL;
    do {
        if (b->key == key) return b;
        b = b->next;
    } while (b != s->rr);
    return NULL;
}

static void queue_push(sched *s, sched_req *r) {
    bucket *b = bucket_find(s, r->owner_key);
    if (!b) {
        b = xcalloc(1, sizeof *b);
        b->key = r->owner_key;
        if (!s->rr) {
            b->next = b->prev = b;
            s->rr = b;
        } else { /* join the ring just before the next to serve: served last in this round */
            b->next = s->rr;
            b->prev = s->rr->prev;
            s->rr->prev->next = b;
            s->rr->prev = b;
        }
    }
    r->q_next = NULL;
    if (b->tail) b->tail->q_next = r;
    else b->head = r;
    b->tail = r;
    b->n++;
    s->n_queued++;
    r->state = SCHED_REQ_QUEUED;
}

static void bucket_unlink_if_empty(sched *s, bucket *b) {
    if (b->n) return;
    if (b->next == b) s->rr = NULL;
    else {
        b->prev->next = b->next;
        b->next->prev = b->prev;
        if (s->rr == b) s->rr = b->next;
    }
    free(b);
}

/* Round-robin: one request from the bucket whose turn it is, then the turn passes on. */
static sched_req *queue_pop_rr(sched *s) {
    bucket *b = s->rr;
    if (!b) return NULL;
    sched_req *r = b->head;
    b->head = r->q_next;
    if (!b->head) b->tail = NULL;
    b->n--;
    s->n_queued--;
    r->q_next = NULL;
    s->rr = b->next;
    bucket_unlink_if_empty(s, b);
    return r;
}

static int queue_remove(sched *s, sched_req *r) {
    bucket *b = bucket_find(s, r->owner_key);
    if (!b) return 0;
    sched_req **pp = &b->head, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->q_next;
    }
    if (!*pp) return 0;
    *pp = r->q_next;
    if (b->tail == r) b->tail = prev;
    b->n--;
    s->n_queued--;
    r->q_next = NULL;
    bucket_unlink_if_empty(s, b);
    return 1;
}

/* ---------------------------------------------------------------- events */

static sched_event *event_new(sched_req *r, const decode_event *ev) {
    sched_event *e = xcalloc(1, sizeof *e);
    e->req = r;
    e->t_ns = time_now_ns();
    e->obj = decode_event_to_json(ev);
    switch (ev->type) {
    case DECODE_EVENT_STEP: e->kind = SCHED_EV_STEP; break;
    case DECODE_EVENT_BLOCK: e->kind = SCHED_EV_BLOCK; break;
    case DECODE_EVENT_DONE: {
        e->kind = SCHED_EV_DONE;
        e->final = 1;
        json_t *t = json_object_get(e->obj, "timings");
        if (!json_is_object(t)) {
            t = json_object();
            json_object_set_new(e->obj, "timings", t);
        }
        double queue_ms = r->t_admit_ns ? (double)(r->t_admit_ns - r->t_submit_ns) * 1e-6
                                        : (double)(e->t_ns - r->t_submit_ns) * 1e-6;
        json_object_set_new(t, "queue_ms", json_real(queue_ms));
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
    if (s->o.step_check) { /* off in production: the check sees exact step counts, so nothing may lag */
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
    for (int i = 0; i < n; i++) {
        const long b = decode_seq_params(seqs[i])->block_length;
        if (e->dev && decode_device_eligible(e->ctx, seqs[i]) && (s->o.device_rows <= 0 || rows + b <= s->o.device_rows)) {
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
        while (!s->stop && e->n_active == 0 && s->n_queued == 0) pthread_cond_wait(&s->cv, &s->lock);
        if (s->stop) {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        uint64_t now = time_now_ns();
        while (e->n_active < s->o.max_batch && s->n_queued > 0) {
            sched_req *r = queue_pop_rr(s);
            r->state = SCHED_REQ_ACTIVE;
            r->t_admit_ns = now;
            e->active[e->n_active++] = r;
            s->n_active++;
        }
        pthread_mutex_unlock(&s->lock);
        /* } sched lock --- */

        /* Cancelled sequences leave before the step: they use no more compute. */
        for (int i = 0; i < e->n_active; i++) {
            sched_req *r = e->active[i];
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
        int k = 0, n_gone = 0;
        for (int i = 0; i < e->n_active; i++) {
            sched_req *r = e->active[i];
            if (decode_seq_done(r->seq)) {
                e->gone[n_gone++] = r;
                r->state = SCHED_REQ_FINISHED;
                s->n_active--;
                s->st.finished++;
                enum decode_finish f = decode_seq_finish_reason(r->seq);
                if (f == DECODE_FINISH_CANCELLED) s->st.cancelled++;
                else if (f == DECODE_FINISH_ERROR) s->st.failed++;
            } else {
                e->active[k++] = r;
            }
        }
        e->n_active = k;
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
    CHECK(n_engines >= 1 && o->max_batch >= 1 && o->max_queue >= 0 && emit);
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
        e->gone = xcalloc((size_t)o->max_batch, sizeof *e->gone);
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
    int cap = s->n_engines * s->o.max_batch, n = 0;
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    CHECK(s->stop);
    cap += s->n_queued;
    sched_req **all = xcalloc((size_t)cap + 1, sizeof *all);
    sched_req *r;
    while ((r = queue_pop_rr(s))) all[n++] = r;
    for (int i = 0; i < s->n_engines; i++) {
        engine *e = &s->engines[i];
        for (int j = 0; j < e->n_active; j++) all[n++] = e->active[j];
        s->n_active -= e->n_active;
        e->n_active = 0;
    }
    for (int i = 0; i < n; i++) {
        all[i]->state = SCHED_REQ_FINISHED;
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
            held->obj = json_pack("{s:s,s:s}", "type", "done", "finish_reason", "cancelled");
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
    CHECK(s->n_queued == 0 && s->n_active == 0);
    for (int i = 0; i < s->n_engines; i++) {
        free(s->engines[i].active);
        free(s->engines[i].seqs);
        free(s->engines[i].dseqs);
        free(s->engines[i].hseqs);
        free(s->engines[i].gone);
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
        queue_push(s, r);
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
        unqueued = queue_remove(s, r);
        CHECK(unqueued);
        r->state = SCHED_REQ_FINISHED;
        s->st.finished++;
        s->st.cancelled++;
    } else if (r->state == SCHED_REQ_ACTIVE) {
        atomic_store(&r->cancel, 1);
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

void sched_get_stats(sched *s, sched_stats *out) {
    /* --- sched lock { */
    pthread_mutex_lock(&s->lock);
    *out = s->st;
    out->queued = s->n_queued;
    out->active = s->n_active;
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
