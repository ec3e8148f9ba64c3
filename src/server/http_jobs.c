/*
 * http_jobs.c — async jobs over HTTP: POST /v1/jobs (validated like a generation, then stored and
 * answered 202), GET /v1/jobs/{id} and its resumable SSE event stream, DELETE /v1/jobs/{id}; the
 * runner that submits queued jobs to the scheduler one build at a time (retrying while the
 * scheduler is full), marks a job running when its first decode step ran (not when it was
 * submitted: a job waiting for a batch slot spends no attempt) and records its events and results
 * in the job store; webhooks on terminal states; the watches behind WebSocket `job.subscribe`
 * (server/ws_jobs.c, through server_job_hooks): one list of subscribers, event streams and watches,
 * told of a job's changes here at once and polled for changes made on other replicas.
 *
 * Not here: the store and the webhook client (jobs/), the generation streams (http_gen.c).
 * Threads: the lws service thread, except webhook_done
 * (the webhook worker: it only touches the thread-safe job store and metrics).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/algo_config.h"
#include "api/event.h"
#include "api/sse.h"
#include "server/http_api_internal.h"
#include "server/server_internal.h"
#include "server/callers.h"
#include "server/metrics.h"
#include "server/gen_prep.h"
#include "server/prep.h"
#include "util/json_util.h"
#include "util/log.h"

#define JOB_PUMP_US (200 * 1000) /* retry submitting waiting jobs while the queue is full */
#define SUBS_POLL_US (250 * 1000) /* open event streams look for new events (a job's steps, or the log
                                     in a shared store of a job another replica runs) */

static void job_prep_done(prep_job *j);

/* A subscriber of one job: an SSE event stream (c), or a watch (fn: a WebSocket subscription),
 * which is told of the job's status changes with its API object. */
struct job_sub {
    job_sub        *next;
    http_conn      *c;        /* the event stream, or NULL for a watch */
    char            id[40];
    int64_t         last;     /* stream: last event id sent */
    http_api       *api;
    server_job_fn   fn;       /* watch: called with each new status */
    void           *user;
    char            who[API_WHO_MAX]; /* watch: the caller (the job's owner) */
    char            status[16];       /* watch: status and attempts last told ("cancelling" included) */
    int             attempts;
};

static void sub_remove(job_sub *s) {
    for (job_sub **pp = &s->api->subs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            free(s);
            return;
        }
}

static void sub_on_close(void *user) { sub_remove(user); }

static int job_status_final(const char *st) {
    return strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0;
}

/* A watch: tell it the job's object when its status (or attempt) changed since it was last told;
 * the final status ends it. A job that cannot be read while the store fails is looked at again at
 * the next poll. 0 = still watching. */
static int watch_flush(job_sub *s) {
    char st[16];
    int att = 0;
    if (!job_store_peek(s->api->jobs, s->id, s->who, st, &att)) {
        char why[200];
        if (job_store_failing(s->api->jobs, why, sizeof why)) return 0;
        server_job_fn fn = s->fn;
        void *user = s->user;
        sub_remove(s);
        fn(user, NULL, SERVER_JOB_GONE);
        return 1;
    }
    if (strcmp(st, s->status) == 0 && att == s->attempts) return 0;
    json_t *o = job_store_get_json(s->api->jobs, s->id, s->who);
    if (!o) return 0; /* gone between the two reads: the next poll says so */
    snprintf(s->status, sizeof s->status, "%s", json_string_value(json_object_get(o, "status")));
    s->attempts = (int)json_integer_value(json_object_get(o, "attempts"));
    if (!job_status_final(s->status)) {
        s->fn(s->user, o, SERVER_JOB_UPDATE);
        return 0;
    }
    server_job_fn fn = s->fn;
    void *user = s->user;
    sub_remove(s);
    fn(user, o, SERVER_JOB_FINAL);
    return 1;
}

/* Send what sub has not seen; end the stream once the job is terminal. 0 = still open. */
static int sub_flush(job_sub *s) {
    if (!s->c) return watch_flush(s);
    for (;;) {
        job_event_copy *ev = NULL;
        int term = 0;
        um_err ue = {0};
        int n = job_store_events_since(s->api->jobs, s->id, s->last, 256, &ev, &term, &ue);
        if (n < 0) {
            api_error e;
            oai_error_set(&e, 410, "events_expired", ue.param, "%s", ue.msg);
            json_t *eo = oai_error_json(&e);
            api_stream_json(s->c, eo, NULL);
            json_decref(eo);
            term = 1;
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            char id[32];
            snprintf(id, sizeof id, "%lld", (long long)ev[i].id);
            out_chunk *ch = sse_frame(id, NULL, ev[i].json, strlen(ev[i].json));
            http_stream_write(s->c, out_chunk_data(ch), ch->len);
            out_chunk_free(ch);
            s->last = ev[i].id;
        }
        job_events_free(ev, n);
        if (term) {
            http_stream_on_close(s->c, NULL, NULL);
            http_stream_end(s->c);
            sub_remove(s);
            return 1;
        }
        if (n < 256) return 0;
    }
}

static void subs_poll_cb(lws_sorted_usec_list_t *sul) {
    http_api *a = lws_container_of(sul, http_api, subs_sul);
    a->subs_scheduled = 0;
    for (job_sub *s = a->subs; s;) {
        job_sub *next = s->next;
        sub_flush(s);
        s = next;
    }
    if (a->subs && server_lws_context(a->srv)) {
        a->subs_scheduled = 1;
        lws_sul_schedule(server_lws_context(a->srv), 0, &a->subs_sul, subs_poll_cb, SUBS_POLL_US);
    }
}

static void subs_poll_later(http_api *a) {
    if (a->subs && !a->subs_scheduled && server_lws_context(a->srv)) {
        a->subs_scheduled = 1;
        lws_sul_schedule(server_lws_context(a->srv), 0, &a->subs_sul, subs_poll_cb, SUBS_POLL_US);
    }
}

static void subs_notify(http_api *a, const char *job_id) {
    job_sub *s = a->subs;
    while (s) {
        job_sub *next = s->next;
        if (strcmp(s->id, job_id) == 0) sub_flush(s);
        s = next;
    }
}

/* The webhook worker thread: only the thread-safe job store and metrics. */
static void webhook_done(void *user, const char *delivery_id, int ok, int attempts, int last_status) {
    http_api *a = user;
    (void)last_status;
    char job_id[40];
    snprintf(job_id, sizeof job_id, "%.*s", (int)strcspn(delivery_id, "."), delivery_id);
    job_store_webhook_state(a->jobs, job_id, ok ? "delivered" : "failed", attempts);
    metrics_webhook(server_metrics(a->srv), ok ? "delivered" : "failed");
}

static void job_q_push(http_api *a, const char *id) {
    if (a->job_q_n == a->job_q_cap) {
        a->job_q_cap = a->job_q_cap ? 2 * a->job_q_cap : 16;
        a->job_q = xrealloc(a->job_q, (size_t)a->job_q_cap * sizeof *a->job_q);
    }
    snprintf(a->job_q[a->job_q_n++], 40, "%s", id);
}

/* Queue the webhook of a job that just became terminal (when it has one). Inside a batch of engine
 * events the job's end is not committed yet: the webhook waits for jobs_batch_end. */
static void job_webhook_send(http_api *a, const char *id, const char *owner) {
    if (a->in_batch) {
        if (a->wh_held_n == a->wh_held_cap) {
            a->wh_held_cap = a->wh_held_cap ? 2 * a->wh_held_cap : 16;
            a->wh_held = xrealloc(a->wh_held, (size_t)a->wh_held_cap * sizeof *a->wh_held);
        }
        snprintf(a->wh_held[a->wh_held_n++], 40, "%s", id);
        return;
    }
    char *url = job_store_webhook(a->jobs, id);
    if (!url) return;
    json_t *obj = job_store_get_json(a->jobs, id, owner);
    if (obj) {
        json_object_del(obj, "request");
        char *body = json_dumps(obj, UM_JSON_COMPACT);
        char event[48], delivery[64];
        snprintf(event, sizeof event, "job.%s", json_string_value(json_object_get(obj, "status")));
        snprintf(delivery, sizeof delivery, "%s.%s", id, json_string_value(json_object_get(obj, "status")));
        um_err ue = {0};
        if (webhook_enqueue(a->wh, url, event, delivery, body, strlen(body), webhook_done, a, &ue) != 0)
            log_warn("job %s: webhook not sent: %s", id, ue.msg);
        free(body);
        json_decref(obj);
    }
    free(url);
}

/* A job reached a terminal state: notify streams, send its webhook. */
static void job_terminal(http_api *a, const char *id, const char *owner) {
    if (!job_store_shared(a->jobs)) callers_give(server_callers(a->srv), owner, CALLER_JOBS, 1); /* taken when it was created */
    job_feed_kick(a->feed); /* room for another job from the shared queue */
    subs_notify(a, id);
    job_webhook_send(a, id, owner);
}

void jobs_run_event(gen_stream *gs, int choice, const sched_event *ev) {
    http_api *a = gs->api;
    if (!gs->job_started) {
        /* the run's sequences were cancelled before any step (the server stops, or the job was
         * cancelled while it waited for a batch slot): nothing ran, nothing is logged */
        if (ev->kind == SCHED_EV_DONE && ev->ev.finish == DECODE_FINISH_CANCELLED) return;
        gs->job_started = job_store_start(a->jobs, gs->job_id, gs->job_gen_length) == 0;
        if (!gs->job_started) return; /* cancelled meanwhile: it ended already */
        subs_notify(a, gs->job_id); /* queued -> running */
    }
    json_t *jev = api_event_json(ev, NULL);
    if (gs->n > 1) json_object_set_new(jev, "choice", json_integer(choice));
    const job_progress pr = {.steps = ev->ev.step + 1, .committed = ev->ev.usage.committed};
    job_store_append(a->jobs, gs->job_id, jev, ev->kind == SCHED_EV_STEP ? &pr : NULL);
    json_decref(jev);
}

/* Cancels the engine work of job id, if it was submitted (started or waiting for a batch slot). */
static void job_stop_run(http_api *a, const char *id) {
    for (gen_stream *gs = a->job_runs; gs; gs = gs->next_run)
        if (strcmp(gs->job_id, id) == 0) gen_cancel_all(gs);
}

static void job_on_finished(http_api *a, gen_stream *gs) {
    const char *err = api_resp_error(gs->resp);
    const char *id = gs->job_id;
    if (gs->submit_failed) return; /* never started: still queued, the pump retries it */
    if (!gs->job_started) {
        /* no step ran: it was cancelled while it waited for a batch slot (it ended then), or the
         * server is stopping (it stays queued: no attempt spent, nothing logged) */
        return;
    }
    if (job_store_cancel_requested(a->jobs, id)) {
        job_store_cancelled(a->jobs, id);
    } else if (err) {
        if (job_store_attempt_failed(a->jobs, id, err)) { /* back to queued: run it again */
            log_warn("job %s: attempt failed (%s); retrying", id, err);
            subs_notify(a, id);
            job_q_push(a, id);
            return;
        }
    } else {
        json_t *body = api_resp_body(gs->resp);
        json_object_set_new(body, "id", json_string(id)); /* the completion is known by its job's id */
        job_store_succeed(a->jobs, id, body);
        json_decref(body);
    }
    job_terminal(a, id, gs->job_owner);
}

void jobs_run_finished(http_api *a, gen_stream *gs) {
    for (gen_stream **pp = &a->job_runs; *pp; pp = &(*pp)->next_run)
        if (*pp == gs) {
            *pp = gs->next_run;
            break;
        }
    job_on_finished(a, gs);
    gen_free(gs);
    jobs_pump(a);
}

/* A job's tokenization (chat template, tokenizer, building the canvas) runs on a preparation
 * worker (server/prep.h), like every other generation request, never on the service thread: for
 * POST /v1/jobs (validation: the same parse + build the run will do, so bad input fails with 400
 * before a job exists) and for each attempt's start (the build whose sequences are submitted). */
typedef struct job_prep {
    gen_prep     gp;         /* first member: the build (and, for a new job, its webhook check) on a worker */
    prep_job     job;        /* first member */
    http_api    *api;
    int          start;      /* 0: POST /v1/jobs validation; 1: an attempt of queued job `id` */
    http_conn   *c;          /* validation: the client, NULL once it went away */
    json_t      *req;        /* validation: the request body (owned) */
    char        *who;        /* the caller (validation) / the job's owner (start), owned */
    char        *idem;       /* validation: Idempotency-Key or NULL, owned */
    char         id[40];     /* start: the job */
} job_prep;

static void job_prep_free(job_prep *p) {
    gen_prep_release(&p->gp);
    json_decref(p->req);
    free(p->who);
    free(p->idem);
    free(p);
}

static void job_q_push_front(http_api *a, const char *id) {
    job_q_push(a, id);
    memmove(a->job_q + 1, a->job_q, (size_t)(a->job_q_n - 1) * sizeof *a->job_q);
    snprintf(a->job_q[0], 40, "%s", id);
}

static void pump_cb(lws_sorted_usec_list_t *sul) {
    http_api *a = lws_container_of(sul, http_api, pump_sul);
    a->pump_scheduled = 0;
    jobs_pump(a);
}

static void jobs_pump_later(http_api *a) {
    if (a->job_q_n > 0 && !a->pump_scheduled && server_lws_context(a->srv)) {
        a->pump_scheduled = 1;
        lws_sul_schedule(server_lws_context(a->srv), 0, &a->pump_sul, pump_cb, JOB_PUMP_US);
    }
}

/* Service thread: an attempt's sequences are built; submit them. */
static void job_start_done(job_prep *p) {
    http_api *a = p->api;
    const char *id = p->id;
    a->job_starting = 0;
    if (p->gp.job.skipped) { /* shutting down: the job stays queued */
        job_q_push_front(a, id);
        return;
    }
    if (job_store_status(a->jobs, id) != JOB_QUEUED) { /* cancelled while it was being built */
        jobs_pump(a);
        return;
    }
    if (p->gp.rc != 0) { /* validated at creation: only a changed model lands here */
        job_store_start(a->jobs, id, 0);
        job_store_attempt_failed(a->jobs, id, p->gp.e.message);
        if (job_store_status(a->jobs, id) == JOB_FAILED) {
            job_terminal(a, id, p->who);
        } else {
            subs_notify(a, id); /* its attempt count changed */
            job_q_push(a, id);
        }
        jobs_pump(a);
        return;
    }
    int n = p->gp.n;
    gen_stream *gs = gen_stream_new(a, &p->gp.g, p->gp.seqs, n, p->gp.m);
    gs->stream = 0;
    snprintf(gs->job_id, sizeof gs->job_id, "%s", id);
    gs->job_owner = xstrdup(p->who);
    gs->ended = 1; /* no HTTP response */
    api_error e;
    if (gen_submit(gs, p->gp.seqs, n, p->who, &e) != 0) { /* scheduler full or the owner's quota: retry later */
        if (gs->n_live == 0) gen_free(gs);
        else gs->submit_failed = 1; /* the cancelled choices' final events free it */
        job_q_push_front(a, id);
        jobs_pump_later(a);
        return;
    }
    /* the job stays queued until its first decode step runs (jobs_run_event): only then is an
     * attempt spent, so jobs waiting for a batch slot lose nothing when the server stops */
    gs->job_gen_length = (double)p->gp.g.params.gen_length * n;
    gs->next_run = a->job_runs;
    a->job_runs = gs;
    jobs_pump(a);
}

/* Start queued job id (service thread): parse here, build on a preparation worker (job_start_done
 * submits). 1 handed over (or finished with: unknown, or failed for good), 0 not now (no model). */
static int job_start(http_api *a, const char *id) {
    const model *m = server_model(a->srv);
    if (!m) return 0;
    json_t *req = job_store_request(a->jobs, id);
    char *owner = job_store_owner(a->jobs, id);
    if (!req || !owner) {
        json_decref(req);
        free(owner);
        return 1;
    }
    int chat = json_object_get(req, "messages") != NULL;
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    job_prep *p = xcalloc(1, sizeof *p);
    p->api = a;
    decode_params defaults = api_defaults(a, m);
    const api_limits *lim = &server_policy(a->srv)->lim;
    p->gp.rc = chat ? openai_parse_chat(body, strlen(body), &defaults, lim, &p->gp.g, &p->gp.e)
                 : openai_parse_completion(body, strlen(body), &defaults, lim, &p->gp.g, &p->gp.e);
    free(body);
    p->start = 1;
    p->gp.m = m;
    p->who = owner;
    snprintf(p->id, sizeof p->id, "%s", id);
    if (p->gp.rc != 0) { /* validated at creation: only changed limits land here */
        job_store_start(a->jobs, id, 0);
        if (job_store_attempt_failed(a->jobs, id, p->gp.e.message)) {
            subs_notify(a, id); /* its attempt count changed */
            job_q_push(a, id);
        } else {
            job_terminal(a, id, owner);
        }
        job_prep_free(p);
        return 1;
    }
    p->gp.g.stream = 0;
    p->gp.lim = &server_policy(a->srv)->lim;
    gen_prep_init(&p->gp, callers_owner_key(owner), job_prep_done);
    a->job_starting = 1;
    server_prep(a->srv, &p->gp.job);
    return 1;
}

/* Start waiting jobs in order, one build at a time (service thread); job_start_done continues,
 * or retries later when the scheduler is full. */
void jobs_pump(http_api *a) {
    while (a->job_q_n > 0 && !a->job_starting) {
        char id[40];
        snprintf(id, sizeof id, "%s", a->job_q[0]);
        memmove(a->job_q, a->job_q + 1, (size_t)(a->job_q_n - 1) * sizeof *a->job_q);
        a->job_q_n--;
        if (job_store_status(a->jobs, id) != JOB_QUEUED) continue;
        if (!job_start(a, id)) {
            job_q_push_front(a, id);
            break;
        }
    }
    if (!a->job_starting) jobs_pump_later(a);
}

/* Service thread: POST /v1/jobs validated; create the job (or replay it) and answer 202. */
static void job_create_done(job_prep *p) {
    http_api *a = p->api;
    http_conn *c = p->c;
    api_error e;
    if (!c) return; /* the client went away before its job was created: no job */
    http_stream_on_close(c, NULL, NULL);
    if (p->gp.job.skipped) {
        api_respond_shutting_down(c);
        return;
    }
    if (p->gp.rc != 0) {
        api_respond_error(c, &p->gp.e);
        return;
    }
    const json_t *wh = json_object_get(p->req, "webhook");
    if (wh && !json_is_null(wh)) {
        webhook_url u;
        um_err ue = {0};
        int bad = 0;
        if (!json_is_string(wh)) bad = oai_error_set(&e, 400, "invalid_type", "webhook", "webhook must be a string URL");
        else if (webhook_url_parse(json_string_value(wh), &u, &ue) != 0) bad = oai_error_from_um(&e, &ue);
        else if (!a->secret_set)
            bad = oai_error_set(&e, 400, "webhooks_disabled", "webhook",
                                "webhooks are off on this server: it has no signing key (--webhook-secret or "
                                "$UNMASK_WEBHOOK_SECRET), and unsigned webhooks could be forged");
        if (bad) {
            api_respond_error(c, &e);
            return;
        }
    }
    char id[40];
    int existed = 0, limit = 0, held = 0;
    um_err ue = {0};
    callers *cs = server_callers(a->srv);
    int taken = callers_take(cs, p->who, CALLER_JOBS, 1, &limit, &held) == 0;
    if (!taken && !(p->idem && job_store_has_idem(a->jobs, p->who, p->idem))) { /* a replay needs no quota */
        oai_error_set(&e, 429, "quota_exceeded", NULL,
                      "this API key (or address) has %d unfinished jobs and may have %d (%s); retry when one finished",
                      held, limit, callers_res_flag(CALLER_JOBS));
        e.retry_after_ms = 5000;
        api_respond_error(c, &e);
        return;
    }
    if (job_store_create(a->jobs, p->who, p->idem, p->req, json_is_string(wh) ? json_string_value(wh) : NULL, id,
                         &existed, &ue) != 0) {
        if (taken) callers_give(cs, p->who, CALLER_JOBS, 1);
        if (ue.code == UM_ERR_RESOURCE) {
            oai_error_set(&e, 503, "too_many_jobs", NULL, "%s", ue.msg);
            e.retry_after_ms = 5000;
        } else if (ue.code == UM_ERR_IO) {
            oai_error_set(&e, 503, "store_unavailable", NULL, "%s", ue.msg);
            e.retry_after_ms = 5000;
        } else {
            oai_error_set(&e, 422, "idempotency_key_reused", "Idempotency-Key", "%s", ue.msg);
        }
        api_respond_error(c, &e);
        return;
    }
    if (existed || job_store_shared(a->jobs)) {
        /* a replay: no new job; a shared store: whichever replica runs it, the quota of unfinished
         * jobs per key is not kept across replicas (documented) */
        if (taken) callers_give(cs, p->who, CALLER_JOBS, 1);
    } else {
        job_q_push(a, id);
        jobs_pump(a);
    }
    json_t *obj = job_store_get_json(a->jobs, id, p->who);
    char loc[96];
    snprintf(loc, sizeof loc, "Location: /v1/jobs/%s", id);
    char *ignored = gen_ignored_header(&p->gp.g); /* what the validation build found unused */
    const char *hdrs[4] = {loc, NULL, NULL, NULL};
    int nh = 1;
    if (existed) hdrs[nh++] = "Idempotent-Replayed: true";
    if (ignored) hdrs[nh++] = ignored;
    http_respond_json(c, 202, obj, hdrs);
    free(ignored);
}

static void job_prep_done(prep_job *j) {
    job_prep *p = (job_prep *)j;
    if (p->start) job_start_done(p);
    else job_create_done(p);
    job_prep_free(p);
}

/* The client went away while its job request was being validated: drop it. */
static void job_prep_on_close(void *user) {
    job_prep *p = user;
    p->c = NULL;
    atomic_store(&p->gp.job.cancel, 1);
}

/* POST /v1/jobs: parse here (errors answer at once), validate the build on a preparation worker;
 * job_create_done creates the job and answers 202. */
static int h_jobs_create(http_conn *c, const http_req *rq) {
    http_api *a = rq->user;
    const model *m = server_model(rq->srv);
    api_error e;
    if (!m) return api_respond_loading(c);
    json_t *o = api_parse_body(rq->body, rq->body_len, &e);
    if (!o) return api_respond_error(c, &e);
    job_prep *p = xcalloc(1, sizeof *p);
    p->api = a;
    p->req = o;
    decode_params defaults = api_defaults(a, m);
    const api_limits *lim = &server_policy(rq->srv)->lim;
    int chat = json_object_get(o, "messages") != NULL;
    int rc = chat ? openai_parse_chat(rq->body, rq->body_len, &defaults, lim, &p->gp.g, &e)
                  : openai_parse_completion(rq->body, rq->body_len, &defaults, lim, &p->gp.g, &e);
    if (rc == 0 && p->gp.g.stream)
        rc = oai_error_set(&e, 400, "invalid_value", "stream", "stream is not supported for jobs: read GET /v1/jobs/{id}/events instead");
    if (rc != 0) {
        job_prep_free(p);
        return api_respond_error(c, &e);
    }
    char who[API_WHO_MAX], idem[256];
    api_caller_identity(a, c, who, sizeof who);
    p->who = xstrdup(who);
    if (http_header(c, "idempotency-key", idem, sizeof idem) > 0) p->idem = xstrdup(idem);
    p->c = c;
    p->gp.m = m;
    p->gp.lim = lim;
    p->gp.wh = a->wh;
    p->gp.webhook = json_string_value(json_object_get(o, "webhook")); /* o is p->req: lives as long as p */
    gen_prep_init(&p->gp, callers_owner_key(who), job_prep_done); /* one caller's jobs are created in request order */
    http_respond_later(c);
    http_stream_on_close(c, job_prep_on_close, p);
    server_prep(rq->srv, &p->gp.job);
    return 0;
}

/* /v1/jobs/{id}[/events] -> id (validated shape) and whether it is the events path. */
static int job_path(const char *path, char id[40], int *events) {
    const char *p = path + strlen("/v1/jobs/");
    size_t n = strcspn(p, "/");
    *events = 0;
    if (n == 0 || n >= 40) return -1;
    memcpy(id, p, n);
    id[n] = 0;
    if (p[n] == 0) return 0;
    if (strcmp(p + n, "/events") == 0) {
        *events = 1;
        return 0;
    }
    return -1;
}

static int job_not_found(http_conn *c, const char *id) {
    char msg[128];
    snprintf(msg, sizeof msg, "no job '%.60s'", id);
    return api_respond_error_fmt(c, 404, "job_not_found", "id", msg);
}

static int h_jobs_get(http_conn *c, const http_req *rq) {
    http_api *a = rq->user;
    char id[40], who[API_WHO_MAX];
    int events = 0;
    if (job_path(rq->path, id, &events) != 0) return api_respond_error_fmt(c, 404, "not_found", NULL, "no such endpoint");
    api_caller_identity(a, c, who, sizeof who);
    if (!events) {
        json_t *o = job_store_get_json(a->jobs, id, who);
        if (!o) return job_not_found(c, id);
        return http_respond_json(c, 200, o, NULL);
    }
    if (!job_store_exists(a->jobs, id, who)) return job_not_found(c, id);
    char last[32];
    long long after = 0;
    if (http_header(c, "last-event-id", last, sizeof last) > 0 || http_query(c, "after", last, sizeof last) >= 0) {
        char *end;
        after = strtoll(last, &end, 10);
        if (*end || after < 0)
            return api_respond_error_fmt(c, 400, "invalid_value", "Last-Event-ID", "Last-Event-ID must be a non-negative event id");
    }
    job_sub *s = xcalloc(1, sizeof *s);
    s->api = a;
    s->c = c;
    s->last = after;
    snprintf(s->id, sizeof s->id, "%s", id);
    s->next = a->subs;
    a->subs = s;
    http_stream_begin(c, 200, "text/event-stream", k_sse_headers);
    http_stream_on_close(c, sub_on_close, s);
    if (!sub_flush(s)) subs_poll_later(a);
    return 0;
}

/* server_job_hooks.watch (a WebSocket job.subscribe, server/ws_jobs.c): the job's object now, and
 * a watch on it unless it is finished. */
static json_t *watch_add(void *api, const char *id, const char *who, server_job_fn fn, void *user, void **handle,
                         const char **code) {
    http_api *a = api;
    char why[200];
    *handle = NULL;
    json_t *o = strlen(id) < sizeof ((job_sub *)0)->id ? job_store_get_json(a->jobs, id, who) : NULL;
    if (!o) {
        *code = job_store_failing(a->jobs, why, sizeof why) ? "store_unavailable" : "unknown_job";
        return NULL;
    }
    const char *st = json_string_value(json_object_get(o, "status"));
    if (job_status_final(st)) return o;
    job_sub *s = xcalloc(1, sizeof *s);
    s->api = a;
    s->fn = fn;
    s->user = user;
    snprintf(s->id, sizeof s->id, "%s", id);
    snprintf(s->who, sizeof s->who, "%s", who);
    snprintf(s->status, sizeof s->status, "%s", st);
    s->attempts = (int)json_integer_value(json_object_get(o, "attempts"));
    s->next = a->subs;
    a->subs = s;
    subs_poll_later(a); /* a job run by another replica changes in the shared store only */
    *handle = s;
    return o;
}

static void watch_end(void *api, void *handle) {
    (void)api;
    sub_remove(handle);
}

static const server_job_hooks k_job_hooks = {watch_add, watch_end};

/* The job API goes away (http_api_free): every watch ends, its session is told. */
void jobs_watches_close(http_api *a) {
    server_set_job_hooks(a->srv, NULL, NULL);
    for (job_sub **pp = &a->subs; *pp;) {
        job_sub *sub = *pp;
        if (sub->c) {
            pp = &sub->next;
            continue;
        }
        server_job_fn fn = sub->fn;
        void *user = sub->user;
        sub_remove(sub);
        fn(user, NULL, SERVER_JOB_CLOSED);
    }
}

/* GET /v1/jobs?status=&limit=&after=: the caller's jobs, newest first (OpenAI's list shape). */
static int h_jobs_list(http_conn *c, const http_req *rq) {
    http_api *a = rq->user;
    char who[API_WHO_MAX], st[16] = "", lim[16] = "", after[40] = "";
    api_caller_identity(a, c, who, sizeof who);
    int status = -1;
    if (http_query(c, "status", st, sizeof st) >= 0 && st[0]) {
        for (int s = JOB_QUEUED; s <= JOB_CANCELLED; s++)
            if (strcmp(st, job_status_name((enum job_status)s)) == 0) status = s;
        if (status < 0)
            return api_respond_error_fmt(c, 400, "invalid_value", "status",
                                         "status must be one of queued, running, succeeded, failed, cancelled");
    }
    int limit = 20;
    if (http_query(c, "limit", lim, sizeof lim) >= 0 && lim[0]) {
        char *end;
        long v = strtol(lim, &end, 10);
        if (*end || v < 1 || v > 100)
            return api_respond_error_fmt(c, 400, "invalid_value", "limit", "limit must be an integer between 1 and 100");
        limit = (int)v;
    }
    if (http_query(c, "after", after, sizeof after) < 0) after[0] = 0;
    json_t *list = NULL;
    if (job_store_list(a->jobs, who, status, after, limit, &list) != 0)
        return api_respond_error_fmt(c, 400, "invalid_value", "after", "after must be the id of one of your jobs");
    return http_respond_json(c, 200, list, NULL);
}

static int h_jobs_delete(http_conn *c, const http_req *rq) {
    http_api *a = rq->user;
    char id[40], who[API_WHO_MAX];
    int events = 0;
    if (job_path(rq->path, id, &events) != 0 || events) return api_respond_error_fmt(c, 404, "not_found", NULL, "no such endpoint");
    api_caller_identity(a, c, who, sizeof who);
    if (!job_store_exists(a->jobs, id, who)) return job_not_found(c, id);
    int r = job_store_cancel(a->jobs, id, who);
    if (r == 0) {
        json_t *o = job_store_get_json(a->jobs, id, who);
        char msg[160];
        snprintf(msg, sizeof msg, "job '%s' already finished (%s)", id, json_string_value(json_object_get(o, "status")));
        json_decref(o);
        return api_respond_error_fmt(c, 409, "job_finished", "id", msg);
    }
    if (r == 1) job_terminal(a, id, who); /* queued: cancelled now (its run, if it waits for a slot, is dropped) */
    else subs_notify(a, id);              /* running -> cancelling */
    job_stop_run(a, id); /* running: its sequences stop at the next step, then the job turns cancelled */
    return http_respond_json(c, 200, job_store_get_json(a->jobs, id, who), NULL);
}

/* Drain starts: job event streams are long-lived; end them (clients reconnect with Last-Event-ID
 * to another instance or after the restart). */
void jobs_drain_begin(http_api *a) {
    job_feed_stop(a->feed); /* take no more jobs from a shared store */
    for (job_sub **pp = &a->subs; *pp;) { /* watches stay: the jobs that finish meanwhile are told */
        job_sub *sub = *pp;
        if (!sub->c) {
            pp = &sub->next;
            continue;
        }
        out_chunk *ch = sse_frame_comment("server shutting down; reconnect with Last-Event-ID");
        http_stream_write(sub->c, out_chunk_data(ch), ch->len);
        out_chunk_free(ch);
        http_stream_on_close(sub->c, NULL, NULL);
        http_stream_end(sub->c);
        sub_remove(sub);
    }
}

/* The server stopped (its engines are gone, the event streams closed): jobs that never finished
 * fail now, so their webhooks still say so (delivered within the sender's drain), instead of
 * vanishing with the process. */
void jobs_shutdown(http_api *a) {
    if (job_store_shared(a->jobs)) { /* hand what this replica took back to the shared queue */
        job_feed_stop(a->feed);
        int n = job_store_release(a->jobs, "the server running the job shut down; another replica runs it");
        if (n > 0) log_info("shutdown: %d unfinished job%s handed back to the shared queue", n, n == 1 ? "" : "s");
        a->job_q_n = 0;
        return;
    }
    if (job_store_durable(a->jobs)) { /* queued and interrupted jobs wait in the store for the next start */
        int q = 0, r = 0, total = 0;
        job_store_counts(a->jobs, &q, &r, &total);
        if (q + r > 0) log_info("shutdown: %d unfinished job%s kept in the store; they run when a server starts on it", q + r,
                                q + r == 1 ? "" : "s");
        a->job_q_n = 0;
        return;
    }
    char(*ids)[40] = NULL;
    int n = job_store_fail_unfinished(a->jobs, "the server shut down before the job finished; submit it again", &ids);
    if (n > 0) log_warn("shutdown: %d unfinished job%s failed", n, n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        char *owner = job_store_owner(a->jobs, ids[i]);
        job_webhook_send(a, ids[i], owner);
        free(owner);
    }
    free(ids);
    a->job_q_n = 0;
}

void jobs_recover(http_api *a) {
    if (!job_store_durable(a->jobs)) return;
    char(*q)[40] = NULL, (*h)[40] = NULL;
    int nh = 0;
    int nq = job_store_recover(a->jobs, "the server stopped while the job ran", &q, &h, &nh);
    for (int i = 0; i < nq; i++) {
        char *owner = job_store_owner(a->jobs, q[i]);
        callers_take(server_callers(a->srv), owner ? owner : "", CALLER_JOBS, 1, NULL, NULL); /* given back at the end */
        free(owner);
        job_q_push(a, q[i]);
    }
    for (int i = 0; i < nh; i++) {
        char *owner = job_store_owner(a->jobs, h[i]);
        job_webhook_send(a, h[i], owner);
        free(owner);
    }
    if (nq || nh)
        log_info("job store: %d job%s to run again, %d webhook%s to deliver again", nq, nq == 1 ? "" : "s", nh,
                 nh == 1 ? "" : "s");
    free(q);
    free(h);
}

void jobs_batch_begin(void *user) {
    http_api *a = user;
    job_store_batch_begin(a->jobs);
    a->in_batch = 1;
}

void jobs_batch_end(void *user) {
    http_api *a = user;
    job_store_batch_end(a->jobs); /* committed: the ends of this batch are durable now */
    a->in_batch = 0;
    for (int i = 0; i < a->wh_held_n; i++) {
        char *owner = job_store_owner(a->jobs, a->wh_held[i]);
        if (owner) job_webhook_send(a, a->wh_held[i], owner);
        free(owner);
    }
    a->wh_held_n = 0;
}

static void feed_wake(void *user) { server_wake(((http_api *)user)->srv); }

void jobs_on_ready(server *s, void *user) {
    http_api *a = user;
    if (job_store_shared(a->jobs) && !a->feed) { /* take jobs once the model can run them */
        const server_config *cfg = server_cfg(s);
        /* default: a full batch running and the next one ready to start as slots free */
        a->feed = job_feed_start(a->jobs, cfg->job_capacity > 0 ? cfg->job_capacity : 2 * cfg->max_batch, feed_wake, a);
    }
    jobs_pump(a);
}

void jobs_on_wake(void *user) {
    http_api *a = user;
    job_feed_batch b;
    if (!job_feed_drain(a->feed, &b)) return;
    for (int i = 0; i < b.n_run; i++) job_q_push(a, b.run[i]);
    for (int i = 0; i < b.n_hooks; i++) {
        char *owner = job_store_owner(a->jobs, b.hooks[i]);
        job_webhook_send(a, b.hooks[i], owner);
        free(owner);
    }
    for (int i = 0; i < b.n_cancel; i++) { /* asked on another replica */
        if (job_store_status(a->jobs, b.cancel[i]) == JOB_QUEUED) { /* not started: it ends now */
            job_store_cancelled(a->jobs, b.cancel[i]);
            char *owner = job_store_owner(a->jobs, b.cancel[i]);
            job_terminal(a, b.cancel[i], owner ? owner : "");
            free(owner);
        }
        else subs_notify(a, b.cancel[i]); /* running -> cancelling */
        job_stop_run(a, b.cancel[i]); /* running: its sequences stop at the next step */
    }
    job_feed_batch_free(&b);
    jobs_pump(a);
}

static const http_route k_job_routes[] = {
    {"POST", "/v1/jobs", 0, h_jobs_create, HTTP_ROUTE_API},
    {"GET", "/v1/jobs", 0, h_jobs_list, HTTP_ROUTE_API},
    {"GET", "/v1/jobs/", 1, h_jobs_get, HTTP_ROUTE_API},
    {"DELETE", "/v1/jobs/", 1, h_jobs_delete, HTTP_ROUTE_API},
    {NULL, NULL, 0, NULL, 0},
};

void http_jobs_register(http_api *a) {
    http_routes_add(server_router(a->srv), k_job_routes, a);
    server_set_job_hooks(a->srv, &k_job_hooks, a);
}
