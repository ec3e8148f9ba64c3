/*
 * http_gen.c — the generation endpoints: POST /v1/chat/completions, /v1/completions,
 * /v1/fim/completions (OpenAI / Mistral FIM), /generate (SGLang), /infill (llama.cpp).
 *
 * A request: parse (api/, here) -> build one decode_seq per choice on a preparation worker (server/gen_prep.h:
 * chat template + tokenizer off the service thread) -> one sched_req each, submitted through the
 * server; the scheduler's events come back on the service thread through the request's deliver
 * hook (gen_deliver), are encoded by api_resp and written as SSE records (stream) or, once every
 * choice finished, as one JSON body. A client that goes away cancels its generations; a stop
 * string cancels its choice. Async jobs run the same gen_stream without a connection
 * (http_jobs.c).
 *
 * Not here: request parsing and response shapes (api/), the middleware (http_api.c).
 * Threads: the lws service thread (the build runs on a preparation worker: server/gen_prep.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/algo_config.h"
#include "api/infill.h"
#include "api/sglang.h"
#include "api/sse.h"
#include "server/http_api_internal.h"
#include "server/callers.h"
#include "server/metrics.h"
#include "server/gen_prep.h"
#include "util/log.h"
#include "util/strbuf.h"

#define SLOW_CLIENT_BYTES (1u << 20)   /* queued SSE bytes beyond which diffusing frames are skipped */

void gen_free(gen_stream *gs) {
    free(gs->who);
    free(gs->ignored_hdr);
    api_resp_free(gs->resp);
    free(gs->ch);
    free(gs->job_owner);
    free(gs);
}

static void gen_maybe_free(gen_stream *gs) {
    if (gs->n_live == 0 && (gs->ended || !gs->c)) gen_free(gs);
}

void gen_cancel_all(gen_stream *gs) {
    for (int i = 0; i < gs->n; i++)
        if (gs->ch[i].req) server_cancel(gs->srv, gs->ch[i].req);
}

/* The client went away before the response completed: cancel its generations. */
static void gen_on_close(void *user) {
    gen_stream *gs = user;
    gs->c = NULL;
    if (!gs->ended) gs->api->n_streams--;
    gs->ended = 1;
    gen_cancel_all(gs);
    gen_maybe_free(gs);
}

/* Every choice finished: complete the HTTP response. */
static void gen_complete(gen_stream *gs) {
    if (gs->ended) return;
    http_conn *c = gs->c;
    gs->ended = 1;
    gs->api->n_streams--;
    if (!c) return;
    const char *err = api_resp_error(gs->resp);
    if (gs->stream) {
        if (err) {
            api_error e;
            oai_error_set(&e, 500, "generation_failed", NULL, "%s", err);
            json_t *eo = oai_error_json(&e);
            api_stream_json(c, eo, NULL);
            json_decref(eo);
        } else {
            json_t *out = json_array();
            api_resp_end(gs->resp, out);
            size_t i;
            json_t *rec;
            json_array_foreach(out, i, rec) api_stream_json(c, rec, NULL);
            json_decref(out);
            if (api_resp_sse_done(gs->resp)) {
                out_chunk *d = sse_frame_done();
                http_stream_write(c, out_chunk_data(d), d->len);
                out_chunk_free(d);
            }
        }
        http_stream_end(c);
    } else if (err) {
        api_respond_error_fmt(c, 500, "generation_failed", NULL, err);
    } else {
        const char *hdrs[] = {gs->ignored_hdr, NULL};
        http_respond_json(c, 200, api_resp_body(gs->resp), hdrs);
    }
    http_stream_on_close(c, NULL, NULL);
    gs->c = NULL;
}

static void gen_deliver(sched_req *r, sched_event *ev) {
    gen_choice *gc = r->owner;
    gen_stream *gs = gc->gs;
    int final = ev->final;
    if (!gs->ended || gs->job_id[0]) {
        int slow = gs->c && gs->stream && http_stream_pending(gs->c) > SLOW_CLIENT_BYTES;
        json_t *out = gs->c && gs->stream ? json_array() : NULL;
        int stop = api_resp_event(gs->resp, gc->i, ev, slow, out);
        if (out) {
            size_t i;
            json_t *rec;
            int failed = 0;
            json_array_foreach(out, i, rec) if (!failed && api_stream_json(gs->c, rec, NULL) != 0) failed = 1;
            json_decref(out);
            server_note_event_written(gs->srv, ev->t_ns);
            if (failed) { /* the client cannot keep up with even the committed text: give up on it */
                log_warn("http: dropping a stream whose client stopped reading");
                http_conn *c = gs->c;
                http_stream_on_close(c, NULL, NULL);
                gs->c = NULL;
                gs->ended = 1;
                gs->api->n_streams--;
                http_stream_end(c);
                gen_cancel_all(gs);
            }
        }
        if (gs->job_id[0] && !gs->submit_failed) jobs_run_event(gs, gc->i, ev);
        if (stop && !final) server_cancel(gs->srv, r);
    }
    if (final) {
        metrics_finished_event(server_metrics(gs->srv), &ev->ev);
        gc->req = NULL;
        r->owner = NULL;
        r->deliver = NULL;
        gs->n_live--;
        if (gs->who) callers_give(server_callers(gs->srv), gs->who, CALLER_GENERATIONS, 1);
    }
    sched_event_free(ev);
    http_api *a = gs->api;
    if (final && gs->n_live == 0) {
        if (gs->job_id[0]) {
            jobs_run_finished(a, gs);
            return;
        }
        gen_complete(gs);
        gen_maybe_free(gs);
    }
    if (final) jobs_pump(a); /* a slot freed: waiting jobs may start */
}

int gen_submit(gen_stream *gs, api_seq *seqs, int n, const char *who, api_error *e) {
    callers *cs = server_callers(gs->srv);
    int limit = 0, held = 0;
    if (callers_take(cs, who, CALLER_GENERATIONS, n, &limit, &held) != 0) {
        oai_error_set(e, 429, "quota_exceeded", NULL,
                      "this API key (or address) already has %d generation%s queued or running and may have %d "
                      "(%s); retry when one finished",
                      held, held == 1 ? "" : "s", limit, callers_res_flag(CALLER_GENERATIONS));
        e->retry_after_ms = 1000;
        return -1;
    }
    free(gs->who);
    gs->who = xstrdup(who);
    uint64_t owner = callers_owner_key(who);
    for (int i = 0; i < n; i++) {
        sched_req *r = sched_req_create(seqs[i].seq, owner);
        seqs[i].seq = NULL;
        int qpos = 0;
        um_err ue = {0};
        if (server_submit(gs->srv, r, &qpos, &ue) != 0) {
            sched_req_free(r);
            callers_give(cs, who, CALLER_GENERATIONS, n - i); /* the submitted ones give theirs when final */
            gen_cancel_all(gs);
            if (ue.code == UM_ERR_RESOURCE) {
                oai_error_set(e, 503, "queue_full", NULL, "the server is at capacity (%s); retry shortly", ue.msg);
                e->retry_after_ms = 1000;
            } else if (ue.code == UM_ERR_UNSUPPORTED) {
                oai_error_set(e, 503, "model_loading", NULL, "%s", ue.msg);
                e->retry_after_ms = 1000;
            } else {
                oai_error_set(e, 503, "unavailable", NULL, "%s", ue.msg);
                e->retry_after_ms = 1000;
            }
            return -1;
        }
        r->owner = &gs->ch[i];
        r->deliver = gen_deliver;
        gs->ch[i].req = r;
        gs->n_live++;
    }
    return 0;
}

typedef int (*gen_parse_fn)(const char *, size_t, const decode_params *, const api_limits *, api_gen *, api_error *);

char *gen_ignored_header(const api_gen *g) {
    json_t *ign = api_gen_ignored(g);
    if (!ign) return NULL;
    strbuf h = STRBUF_INIT;
    strbuf_puts(&h, "x-unmask-ignored-fields: ");
    size_t i;
    json_t *v;
    json_array_foreach(ign, i, v) {
        if (i) strbuf_puts(&h, ", ");
        strbuf_puts(&h, json_string_value(v));
    }
    json_decref(ign);
    return strbuf_take(&h, NULL);
}

gen_stream *gen_stream_new(http_api *a, const api_gen *g, const api_seq *seqs, int n, const model *m) {
    gen_stream *gs = xcalloc(1, sizeof *gs);
    gs->api = a;
    gs->srv = a->srv;
    gs->stream = g->stream;
    gs->resp = api_resp_new(g, seqs, n, m, a->served_name);
    const int max_seq = server_policy(a->srv)->lim.max_seq;   /* what one request may hold here */
    if (max_seq > 0 && max_seq < gs->resp->n_ctx) gs->resp->n_ctx = max_seq;
    gs->ignored_hdr = gen_ignored_header(g);
    gs->n = n;
    gs->ch = xcalloc((size_t)(n ? n : 1), sizeof *gs->ch);
    for (int i = 0; i < n; i++) gs->ch[i].gs = gs, gs->ch[i].i = i;
    return gs;
}

/* Start a built request: response state, submission, response headers / first records. The
 * caller frees seqs afterwards (submitted ones are taken). */
static int gen_start(http_conn *c, http_api *a, const api_gen *g, const model *m, api_seq *seqs, int n,
                     const char *who) {
    api_error e;
    memset(&e, 0, sizeof e);
    gen_stream *gs = gen_stream_new(a, g, seqs, n, m);
    gs->c = c;
    if (n == 0) { /* /infill warm-up: nothing to generate */
        http_respond_json(c, 200, api_resp_body(gs->resp), NULL);
        gen_free(gs);
        return 0;
    }
    if (gen_submit(gs, seqs, n, who, &e) != 0) {
        gs->c = NULL;
        gs->ended = 1;
        int rc = api_respond_error(c, &e);
        gen_maybe_free(gs);
        return rc;
    }
    gs->api->n_streams++;
    http_stream_on_close(c, gen_on_close, gs);
    if (!gs->stream) http_respond_later(c);
    if (gs->stream) {
        char idh[96];
        snprintf(idh, sizeof idh, "x-unmask-id: %s", api_resp_id(gs->resp));
        const char *hdrs[] = {k_sse_headers[0], idh, gs->ignored_hdr, NULL};
        http_stream_begin(c, 200, "text/event-stream", hdrs);
        json_t *out = json_array();
        api_resp_begin(gs->resp, out);
        size_t i;
        json_t *rec;
        json_array_foreach(out, i, rec) api_stream_json(c, rec, NULL);
        json_decref(out);
    }
    return 0;
}

/* A generation request being built (chat template, tokenizer, decode_seqs: tens of ms for a large
 * prompt) on a preparation worker (server/gen_prep.h), so the service thread keeps serving others. */
typedef struct http_prep {
    gen_prep     gp;         /* first member: the request and the worker's results */
    http_conn   *c;          /* service thread: NULL once the client went away */
    http_api    *api;
    char         who[API_WHO_MAX]; /* the caller */
} http_prep;

/* The client went away while its request was being built: drop the result. */
static void http_prep_on_close(void *user) {
    http_prep *p = user;
    p->c = NULL;
    atomic_store(&p->gp.job.cancel, 1);
}

/* Service thread: answer the error or start the generation. */
static void http_prep_done(prep_job *j) {
    http_prep *p = (http_prep *)j;
    http_conn *c = p->c;
    if (c) {
        http_stream_on_close(c, NULL, NULL);
        if (j->skipped) api_respond_shutting_down(c);
        else if (p->gp.rc != 0) api_respond_error(c, &p->gp.e);
        else gen_start(c, p->api, &p->gp.g, p->gp.m, p->gp.seqs, p->gp.n, p->who);
    }
    gen_prep_release(&p->gp);
    free(p);
}

/* The common handler of every generation endpoint: parse here (errors answer at once), build on a
 * preparation worker (http_prep_done answers or starts the generation). */
static int handle_generation(http_conn *c, const http_req *rq, gen_parse_fn parse) {
    http_api *a = rq->user;
    const model *m = server_model(rq->srv);
    if (!m) return api_respond_loading(c);
    api_gen g;
    api_error e;
    memset(&e, 0, sizeof e);
    decode_params defaults = api_defaults(a, m);
    if (parse(rq->body, rq->body_len, &defaults, &server_policy(rq->srv)->lim, &g, &e) != 0) {
        api_gen_free(&g);
        return api_respond_error(c, &e);
    }
    char who[API_WHO_MAX];
    api_caller_identity(a, c, who, sizeof who);
    uint64_t owner = callers_owner_key(who);
    if (g.warmup) { /* /infill n_predict 0: nothing to build */
        int rc = gen_start(c, a, &g, m, NULL, 0, who);
        api_gen_free(&g);
        return rc;
    }
    http_prep *p = xcalloc(1, sizeof *p);
    gen_prep_init(&p->gp, owner, http_prep_done);
    p->gp.m = m;
    p->gp.lim = &server_policy(rq->srv)->lim;
    p->gp.g = g; /* moved */
    p->c = c;
    p->api = a;
    snprintf(p->who, sizeof p->who, "%s", who);
    http_respond_later(c);
    http_stream_on_close(c, http_prep_on_close, p);
    server_prep(rq->srv, &p->gp.job);
    return 0;
}

static int h_chat(http_conn *c, const http_req *rq) { return handle_generation(c, rq, openai_parse_chat); }
static int h_completions(http_conn *c, const http_req *rq) { return handle_generation(c, rq, openai_parse_completion); }
static int h_fim(http_conn *c, const http_req *rq) { return handle_generation(c, rq, infill_parse_fim); }
static int h_generate(http_conn *c, const http_req *rq) { return handle_generation(c, rq, sglang_parse_generate); }
static int h_infill(http_conn *c, const http_req *rq) { return handle_generation(c, rq, infill_parse); }

static const http_route k_gen_routes[] = {
    {"POST", "/v1/chat/completions", 0, h_chat, HTTP_ROUTE_API},
    {"POST", "/v1/completions", 0, h_completions, HTTP_ROUTE_API},
    {"POST", "/v1/fim/completions", 0, h_fim, HTTP_ROUTE_API},
    {"POST", "/generate", 0, h_generate, HTTP_ROUTE_API},
    {"POST", "/infill", 0, h_infill, HTTP_ROUTE_API},
    {NULL, NULL, 0, NULL, 0},
};

void http_gen_register(http_api *a) { http_routes_add(server_router(a->srv), k_gen_routes, a); }
