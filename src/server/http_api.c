/*
 * http_api.c — the OpenAI / SGLang / llama.cpp / jobs / metrics HTTP endpoints and the middleware
 * in front of every HTTP request (see http_api.h).
 *
 * A generation request: parse (api/) -> build one decode_seq per choice (on a preparation worker,
 * server/prep.h: chat template + tokenizer off the service thread) -> one sched_req each,
 * submitted through the server; the scheduler's events come back on the service thread through
 * the request's deliver hook (gen_deliver), are encoded by api_resp and written as SSE records
 * (stream) or, once every choice finished, as one JSON body. A client that goes away cancels its
 * generations (http_stream_on_close); a stop string cancels its choice. Jobs use the same path with
 * no connection: their events go to the job store (sched/jobs.c), from where job event streams and
 * webhooks are fed.
 *
 * Not here: request parsing and response shapes (api/openai.c, sglang.c, infill.c), lws plumbing
 * (http.c), the scheduler. Threads: the lws service thread, except configure/shutdown (main thread),
 * http_prep_run / job_prep_run (preparation workers: each only builds from its own http_prep /
 * job_prep) and webhook_done (the webhook worker: it only touches the thread-safe job store and
 * metrics).
 */
#include "server/http_api.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libwebsockets.h>
#include <openssl/rand.h>

#include "api/algo_config.h"
#include "decode/event_json.h"
#include "api/api_error.h"
#include "api/infill.h"
#include "api/openai.h"
#include "api/sglang.h"
#include "api/sse.h"
#include "sched/jobs.h"
#include "sched/webhook.h"
#include "server/auth.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/prep.h"
#include "server/ratelimit.h"
#include "server/server.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/timeutil.h"

#define SLOW_CLIENT_BYTES (1u << 20)   /* queued SSE bytes beyond which diffusing frames are skipped */
#define JOB_PUMP_US       (200 * 1000) /* retry submitting waiting jobs while the queue is full */

/* ================================================================ settings */

/* Effective settings and shared state. */
static struct {
    int            configured;
    auth_keys      keys;
    ratelimit     *rl;
    double         rate;
    char          *cors_origin;        /* owned or NULL */
    json_t        *algo;               /* algorithm config overrides (owned) or NULL */
    int            cache;              /* --cache: requests' default KV cache (enum decode_cache) or
                                          DECODE_CACHE_AUTO */
    api_limits     lim;                /* as configured; installed process-wide (api_limits_set) */
    char           served_name[256];
    double         shutdown_grace;
    int            secret_set;         /* a webhook secret was configured */
    long           created;            /* unix time the server was configured (models' "created") */
    job_store     *jobs;
    webhook_sender *wh;
    server        *srv;                /* captured from the first request (service thread) */
    int            n_streams;          /* open generation responses */
    /* jobs waiting to be submitted (FIFO of ids), service thread */
    char         (*job_q)[40];
    int            job_q_n, job_q_cap;
    lws_sorted_usec_list_t pump_sul;
    int            pump_scheduled;
    int            job_starting;       /* a queued job's attempt is being built (one at a time) */
    struct job_sub *subs;              /* job event streams */
    struct gen_stream *job_runs;       /* running jobs */
} G;

static double gauge_sched(void *user) {
    int which = (int)(intptr_t)user;
    sched *sc = G.srv ? server_sched(G.srv) : NULL;
    if (!sc) return 0;
    sched_stats st;
    sched_get_stats(sc, &st);
    return which == 0 ? st.queued : st.active;
}

static double gauge_jobs(void *user) {
    int q = 0, r = 0, t = 0;
    if (G.jobs) job_store_counts(G.jobs, &q, &r, &t);
    return (intptr_t)user == 0 ? q : r;
}

static double gauge_streams(void *user) {
    (void)user;
    return G.n_streams;
}

static double gauge_ready(void *user) {
    (void)user;
    return G.srv && server_ready(G.srv) ? 1 : 0;
}

static void drain_begin(server *s);
static int  drain_idle(server *s);

/* --cache: auto or a mode name. */
static int cache_setting(const char *s, int *out, um_err *err) {
    enum decode_cache c;
    *out = DECODE_CACHE_AUTO;
    if (!s || strcmp(s, "auto") == 0) return 0;
    if (decode_cache_parse(s, &c) != 0)
        return um_err_param(err, "cache", "--cache must be auto, none, prefix, dual or vicinity, got '%s'", s);
    *out = (int)c;
    return 0;
}

/* /v1/models id: --served-model-name, else the model directory's last component. */
static void served_name_set(const server_config *cfg) {
    if (cfg->served_model_name) {
        snprintf(G.served_name, sizeof G.served_name, "%s", cfg->served_model_name);
        return;
    }
    const char *m = cfg->model ? cfg->model : "unmask";
    size_t n = strlen(m);
    while (n > 1 && m[n - 1] == '/') n--;
    const char *b = m + n;
    while (b > m && b[-1] != '/') b--;
    snprintf(G.served_name, sizeof G.served_name, "%.*s", (int)(m + n - b), b);
}

static void metrics_gauges_register(void) {
    metrics_reset();
    metrics_gauge_register("queue_depth", "Generation requests waiting for admission.", gauge_sched, (void *)(intptr_t)0);
    metrics_gauge_register("active_sequences", "Sequences being denoised now.", gauge_sched, (void *)(intptr_t)1);
    metrics_gauge_register("jobs_queued", "Async jobs waiting to run.", gauge_jobs, (void *)(intptr_t)0);
    metrics_gauge_register("jobs_running", "Async jobs running.", gauge_jobs, (void *)(intptr_t)1);
    metrics_gauge_register("http_streams_open", "Open HTTP generation responses.", gauge_streams, NULL);
    metrics_gauge_register("model_ready", "1 once the model is loaded.", gauge_ready, NULL);
}

int http_api_configure(const server_config *cfg, um_err *err) {
    memset(&G, 0, sizeof G);
    G.lim = api_limits_default();
    if (cfg->api_keys && auth_keys_load(&G.keys, cfg->api_keys, err) != 0) return um_err_prefix(err, "--api-keys");
    G.shutdown_grace = cfg->shutdown_grace_s;
    G.lim.max_gen_length = cfg->max_gen_length;
    G.lim.max_prompt_tokens = cfg->max_prompt_tokens;
    G.lim.max_seq = cfg->max_seq; /* serve --max-seq (server_config); 0 = the model's context */
    api_limits_set(&G.lim); /* the WebSocket protocol applies the same limits (api/limits.h) */
    double rate = cfg->rate_limit, burst = cfg->rate_burst;
    G.rate = rate;
    if (rate > 0) G.rl = ratelimit_new(rate, burst > 0 ? burst : (2 * rate < 1 ? 1 : 2 * rate));
    if (cfg->cors_origin && cfg->cors_origin[0]) G.cors_origin = xstrdup(cfg->cors_origin);
    if (cache_setting(cfg->cache, &G.cache, err) != 0) return -1;
    if (cfg->algorithm_config && algo_config_load(cfg->algorithm_config, &G.algo, err) != 0) return -1;
    algo_config_set_defaults(G.algo, G.cache);   /* the algorithm config's "cache" wins over --cache */
    served_name_set(cfg);
    const char *secret = cfg->webhook_secret ? cfg->webhook_secret : getenv("UNMASK_WEBHOOK_SECRET");
    job_store_opts jo = {.max_jobs = cfg->max_jobs, .max_active = 1000, .max_events = 4096,
                         .max_attempts = cfg->job_attempts};
    G.jobs = job_store_new(&jo);
    webhook_config wc = {.secret = secret ? secret : "", .max_attempts = cfg->webhook_attempts,
                         .base_delay_s = cfg->webhook_retry_base_s, .timeout_s = 5};
    G.wh = webhook_sender_new(&wc);
    G.secret_set = secret && secret[0];
    G.created = (long)time(NULL);
    metrics_gauges_register();
    server_set_drain(G.shutdown_grace, drain_begin, drain_idle);
    if (auth_keys_required(&G.keys)) log_info("HTTP APIs: %d API key%s required", G.keys.n, G.keys.n == 1 ? "" : "s");
    G.configured = 1;
    return 0;
}

void http_api_shutdown(void) {
    if (!G.configured) return;
    webhook_sender_free(G.wh, 2.0);
    job_store_free(G.jobs);
    ratelimit_free(G.rl);
    auth_keys_free(&G.keys);
    free(G.cors_origin);
    json_decref(G.algo);
    free(G.job_q);
    metrics_gauge_unregister_all();
    algo_config_set_defaults(NULL, DECODE_CACHE_AUTO);
    api_limits_set(NULL);
    memset(&G, 0, sizeof G);
}

/* ================================================================ responses */

/* Error response with the OpenAI error object and the retry headers its status calls for. */
static int respond_error(http_conn *c, const oai_error *e) {
    char ra[48], ram[48], retry[32];
    const char *hdrs[6];
    int n = 0;
    snprintf(retry, sizeof retry, "x-should-retry: %s", oai_error_should_retry(e) ? "true" : "false");
    hdrs[n++] = retry;
    if (e->retry_after_ms > 0) {
        snprintf(ra, sizeof ra, "Retry-After: %d", (int)ceil(e->retry_after_ms / 1000.0));
        snprintf(ram, sizeof ram, "retry-after-ms: %d", (int)ceil(e->retry_after_ms));
        hdrs[n++] = ra;
        hdrs[n++] = ram;
    }
    if (e->status == 401) hdrs[n++] = "WWW-Authenticate: Bearer";
    hdrs[n] = NULL;
    return http_respond_json(c, e->status, oai_error_json(e), hdrs);
}

static int respond_error_fmt(http_conn *c, int status, const char *code, const char *param, const char *msg) {
    oai_error e;
    oai_error_set(&e, status, code, param, "%s", msg);
    return respond_error(c, &e);
}

/* Unknown model? The "model" field is informational here (one model is served); any name is
 * accepted, as llama.cpp does, so clients configured for other providers keep working. */

static const char *const k_sse_headers[] = {"X-Accel-Buffering: no", NULL};

static int stream_json(http_conn *c, const json_t *obj, const char *id) {
    out_chunk *ch = sse_frame_json(id, NULL, obj);
    int rc = http_stream_write(c, out_chunk_data(ch), ch->len);
    out_chunk_free(ch);
    return rc;
}

/* ================================================================ generations */

typedef struct gen_stream gen_stream;

typedef struct gen_choice {
    gen_stream *gs;
    int         i;
    sched_req  *req;          /* NULL once its final event was delivered (or never submitted) */
} gen_choice;

struct gen_stream {
    http_conn  *c;            /* NULL: no client (a job) or the client went away */
    server     *srv;
    api_resp   *resp;
    gen_choice *ch;
    int         n, n_live;    /* choices; choices whose final event is still to come */
    int         stream;       /* SSE response */
    int         ended;        /* the response is complete (or abandoned) */
    char        job_id[40];   /* "" = an HTTP request */
    char       *job_owner;    /* owned */
    int         submit_failed; /* a job whose submission failed half-way: it stays queued */
    gen_stream *next_run;     /* G.job_runs list (running jobs) */
};

static void job_on_finished(gen_stream *gs);
static void jobs_pump(void);
static void job_q_push(const char *id);
static void job_prep_done(prep_job *j);

static void gen_free(gen_stream *gs) {
    api_resp_free(gs->resp);
    free(gs->ch);
    free(gs->job_owner);
    free(gs);
}

static void gen_maybe_free(gen_stream *gs) {
    if (gs->n_live == 0 && (gs->ended || !gs->c)) gen_free(gs);
}

static void gen_cancel_all(gen_stream *gs) {
    for (int i = 0; i < gs->n; i++)
        if (gs->ch[i].req) server_cancel(gs->srv, gs->ch[i].req);
}

/* The client went away before the response completed: cancel its generations. */
static void gen_on_close(void *user) {
    gen_stream *gs = user;
    gs->c = NULL;
    if (!gs->ended) G.n_streams--;
    gs->ended = 1;
    gen_cancel_all(gs);
    gen_maybe_free(gs);
}

/* Every choice finished: complete the HTTP response. */
static void gen_complete(gen_stream *gs) {
    if (gs->ended) return;
    http_conn *c = gs->c;
    gs->ended = 1;
    G.n_streams--;
    if (!c) return;
    const char *err = api_resp_error(gs->resp);
    if (gs->stream) {
        if (err) {
            oai_error e;
            oai_error_set(&e, 500, "generation_failed", NULL, "%s", err);
            json_t *eo = oai_error_json(&e);
            stream_json(c, eo, NULL);
            json_decref(eo);
        } else {
            json_t *out = json_array();
            api_resp_end(gs->resp, out);
            size_t i;
            json_t *rec;
            json_array_foreach(out, i, rec) stream_json(c, rec, NULL);
            json_decref(out);
            if (api_resp_sse_done(gs->resp)) {
                out_chunk *d = sse_frame_done();
                http_stream_write(c, out_chunk_data(d), d->len);
                out_chunk_free(d);
            }
        }
        http_stream_end(c);
    } else if (err) {
        respond_error_fmt(c, 500, "generation_failed", NULL, err);
    } else {
        http_respond_json(c, 200, api_resp_body(gs->resp), NULL);
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
        int stop = api_resp_event(gs->resp, gc->i, ev->obj, slow, out);
        if (out) {
            size_t i;
            json_t *rec;
            int failed = 0;
            json_array_foreach(out, i, rec) if (!failed && stream_json(gs->c, rec, NULL) != 0) failed = 1;
            json_decref(out);
            server_note_event_written(gs->srv, ev->t_ns);
            if (failed) { /* the client cannot keep up with even the committed text: give up on it */
                log_warn("http: dropping a stream whose client stopped reading");
                http_conn *c = gs->c;
                http_stream_on_close(c, NULL, NULL);
                gs->c = NULL;
                gs->ended = 1;
                G.n_streams--;
                http_stream_end(c);
                gen_cancel_all(gs);
            }
        }
        if (gs->job_id[0] && !gs->submit_failed && ev->obj) {
            json_t *jev = json_deep_copy(ev->obj);
            if (gs->n > 1) json_object_set_new(jev, "choice", json_integer(gc->i));
            job_store_append(G.jobs, gs->job_id, jev);
            json_decref(jev);
        }
        if (stop && !final) server_cancel(gs->srv, r);
    }
    if (final) {
        const json_t *u = json_object_get(ev->obj, "usage");
        metrics_tokens((long)json_integer_value(json_object_get(u, "prompt_tokens")),
                       (long)json_integer_value(json_object_get(u, "completion_tokens")));
        metrics_steps((long)json_integer_value(json_object_get(u, "steps")));
        metrics_finished(json_string_value(json_object_get(ev->obj, "finish_reason")));
        gc->req = NULL;
        r->owner = NULL;
        r->deliver = NULL;
        gs->n_live--;
    }
    sched_event_free(ev);
    if (final && gs->n_live == 0) {
        if (gs->job_id[0]) {
            for (gen_stream **pp = &G.job_runs; *pp; pp = &(*pp)->next_run)
                if (*pp == gs) {
                    *pp = gs->next_run;
                    break;
                }
            job_on_finished(gs);
            gen_free(gs);
            jobs_pump();
            return;
        }
        gen_complete(gs);
        gen_maybe_free(gs);
    }
    if (final) jobs_pump();
}

/* Owner key for fair scheduling: one turn per API key (or client address). */
static uint64_t owner_key_of(const char *who) {
    uint64_t h = 1469598103934665603ull;
    for (; *who; who++) h = (h ^ (unsigned char)*who) * 1099511628211ull;
    return h ? h : 1;
}

/* Submit every built sequence. On failure nothing stays submitted (the submitted ones are
 * cancelled and their final events arrive later) and e says why. */
static int gen_submit(gen_stream *gs, api_seq *seqs, int n, uint64_t owner, oai_error *e) {
    for (int i = 0; i < n; i++) {
        sched_req *r = sched_req_create(seqs[i].seq, owner);
        seqs[i].seq = NULL;
        int qpos = 0;
        um_err ue = {0};
        if (server_submit(gs->srv, r, &qpos, &ue) != 0) {
            sched_req_free(r);
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

static const char *caller_identity(http_conn *c, char *buf, size_t cap);

typedef int (*gen_parse_fn)(const char *, size_t, const decode_params *, const api_limits *, api_gen *, oai_error *);

static decode_params server_defaults(const model *m) { return algo_config_params_for_model(m); }

/* Start a built request: response state, submission, response headers / first records. The
 * caller frees seqs afterwards (submitted ones are taken). */
static int gen_start(http_conn *c, server *srv, const api_gen *g, const model *m, api_seq *seqs, int n,
                     uint64_t owner) {
    oai_error e;
    memset(&e, 0, sizeof e);
    gen_stream *gs = xcalloc(1, sizeof *gs);
    gs->srv = srv;
    gs->c = c;
    gs->stream = g->stream;
    gs->resp = api_resp_new(g, seqs, n, m, G.served_name);
    gs->n = n;
    gs->ch = xcalloc((size_t)(n ? n : 1), sizeof *gs->ch);
    for (int i = 0; i < n; i++) gs->ch[i].gs = gs, gs->ch[i].i = i;
    if (n == 0) { /* /infill warm-up: nothing to generate */
        http_respond_json(c, 200, api_resp_body(gs->resp), NULL);
        gen_free(gs);
        return 0;
    }
    if (gen_submit(gs, seqs, n, owner, &e) != 0) {
        gs->c = NULL;
        gs->ended = 1;
        int rc = respond_error(c, &e);
        gen_maybe_free(gs);
        return rc;
    }
    G.n_streams++;
    http_stream_on_close(c, gen_on_close, gs);
    if (!gs->stream) http_respond_later(c);
    if (gs->stream) {
        char idh[96];
        snprintf(idh, sizeof idh, "x-unmask-id: %s", api_resp_id(gs->resp));
        const char *hdrs[] = {k_sse_headers[0], idh, NULL};
        http_stream_begin(c, 200, "text/event-stream", hdrs);
        json_t *out = json_array();
        api_resp_begin(gs->resp, out);
        size_t i;
        json_t *rec;
        json_array_foreach(out, i, rec) stream_json(c, rec, NULL);
        json_decref(out);
    }
    return 0;
}

/* A generation request being built (chat template, tokenizer, decode_seqs: tens of ms for a large
 * prompt) on a preparation worker (server/prep.h), so the service thread keeps serving others. */
typedef struct http_prep {
    prep_job     job;        /* first member */
    http_conn   *c;          /* service thread: NULL once the client went away */
    server      *srv;
    const model *m;
    api_gen      g;          /* the parsed request (owned; the worker only reads it) */
    uint64_t     owner;      /* scheduler fairness key */
    /* worker results */
    int          rc;
    api_seq     *seqs;       /* owned */
    int          n;
    oai_error    e;
} http_prep;

/* Preparation worker: pure build. */
static void http_prep_run(prep_job *j) {
    http_prep *p = (http_prep *)j;
    p->rc = api_gen_build(&p->g, p->m, api_limits_current(), &p->seqs, &p->n, &p->e);
}

/* The client went away while its request was being built: drop the result. */
static void http_prep_on_close(void *user) {
    http_prep *p = user;
    p->c = NULL;
    atomic_store(&p->job.cancel, 1);
}

/* Service thread: answer the error or start the generation. */
static void http_prep_done(prep_job *j) {
    http_prep *p = (http_prep *)j;
    http_conn *c = p->c;
    if (c) {
        http_stream_on_close(c, NULL, NULL);
        if (j->skipped) {
            oai_error e;
            oai_error_set(&e, 503, "shutting_down", NULL, "the server is shutting down and accepts no new work");
            e.retry_after_ms = 5000;
            respond_error(c, &e);
        } else if (p->rc != 0) {
            respond_error(c, &p->e);
        } else {
            gen_start(c, p->srv, &p->g, p->m, p->seqs, p->n, p->owner);
        }
    }
    api_seqs_free(p->seqs, p->n);
    api_gen_free(&p->g);
    free(p);
}

/* The common handler of every generation endpoint: parse here (errors answer at once), build on a
 * preparation worker (http_prep_done answers or starts the generation). */
static int handle_generation(http_conn *c, const http_req *rq, gen_parse_fn parse) {
    const model *m = server_model(rq->srv);
    if (!m) {
        oai_error e;
        oai_error_set(&e, 503, "model_loading", NULL, "the model is still loading; retry shortly");
        e.retry_after_ms = 1000;
        return respond_error(c, &e);
    }
    api_gen g;
    oai_error e;
    memset(&e, 0, sizeof e);
    decode_params defaults = server_defaults(m);
    if (parse(rq->body, rq->body_len, &defaults, api_limits_current(), &g, &e) != 0) {
        api_gen_free(&g);
        return respond_error(c, &e);
    }
    char who[160];
    uint64_t owner = owner_key_of(caller_identity(c, who, sizeof who));
    if (g.warmup) { /* /infill n_predict 0: nothing to build */
        int rc = gen_start(c, rq->srv, &g, m, NULL, 0, owner);
        api_gen_free(&g);
        return rc;
    }
    http_prep *p = xcalloc(1, sizeof *p);
    p->job.owner_key = owner;
    p->job.run = http_prep_run;
    p->job.done = http_prep_done;
    p->c = c;
    p->srv = rq->srv;
    p->m = m;
    p->g = g; /* moved */
    p->owner = owner;
    http_respond_later(c);
    http_stream_on_close(c, http_prep_on_close, p);
    server_prep(rq->srv, &p->job);
    return 0;
}

static int h_chat(http_conn *c, const http_req *rq) { return handle_generation(c, rq, openai_parse_chat); }
static int h_completions(http_conn *c, const http_req *rq) { return handle_generation(c, rq, openai_parse_completion); }
static int h_fim(http_conn *c, const http_req *rq) { return handle_generation(c, rq, infill_parse_fim); }
static int h_generate(http_conn *c, const http_req *rq) { return handle_generation(c, rq, sglang_parse_generate); }
static int h_infill(http_conn *c, const http_req *rq) { return handle_generation(c, rq, infill_parse); }

/* ================================================================ models, metrics */

static json_t *model_object(const server *s) {
    const model *m = server_model((server *)s);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", G.served_name, "object", "model", "created",
                          (json_int_t)G.created, "owned_by", "unmask");
    if (m) {
        const decode_params d = server_defaults(m);
        json_object_set_new(o, "meta", json_pack("{s:i, s:i, s:i, s:b, s:[ssss], s:o}", "context_length",
                                                 server_max_seq(s) > 0 ? server_max_seq(s) : m->cfg.max_seq, "vocab_size",
                                                 m->cfg.n_embd_rows, "block_causal", m->cfg.block_causal,
                                                 "infilling", m->cfg.block_causal == 0, "cache_modes", "none", "prefix",
                                                 "dual", "vicinity", "decode_defaults",
                                                 decode_params_to_json(&d)));
    }
    return o;
}

static int h_models(http_conn *c, const http_req *rq) {
    return http_respond_json(c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(rq->srv)), NULL);
}

static int h_model_one(http_conn *c, const http_req *rq) {
    const char *id = rq->path + strlen("/v1/models/");
    if (strcmp(id, G.served_name) != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist; this server serves '%.150s'", id, G.served_name);
        return respond_error_fmt(c, 404, "model_not_found", "model", msg);
    }
    return http_respond_json(c, 200, model_object(rq->srv), NULL);
}

static int h_metrics(http_conn *c, const http_req *rq) {
    (void)rq;
    size_t len = 0;
    char *text = metrics_render(&len);
    static const char *const hdrs[] = {"Cache-Control: no-store", NULL};
    int rc = http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, hdrs);
    free(text);
    return rc;
}

/* ================================================================ jobs */

typedef struct job_sub {
    struct job_sub *next;
    http_conn      *c;
    char            id[40];
    int64_t         last;     /* last event id sent */
} job_sub;

static void sub_remove(job_sub *s) {
    for (job_sub **pp = &G.subs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            free(s);
            return;
        }
}

static void sub_on_close(void *user) { sub_remove(user); }

/* Send what sub has not seen; end the stream once the job is terminal. 0 = still open. */
static int sub_flush(job_sub *s) {
    for (;;) {
        job_event_copy *ev = NULL;
        int term = 0;
        um_err ue = {0};
        int n = job_store_events_since(G.jobs, s->id, s->last, 256, &ev, &term, &ue);
        if (n < 0) {
            oai_error e;
            oai_error_set(&e, 410, "events_expired", ue.param, "%s", ue.msg);
            json_t *eo = oai_error_json(&e);
            stream_json(s->c, eo, NULL);
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

static void subs_notify(const char *job_id) {
    job_sub *s = G.subs;
    while (s) {
        job_sub *next = s->next;
        if (strcmp(s->id, job_id) == 0) sub_flush(s);
        s = next;
    }
}

static void webhook_done(void *user, const char *delivery_id, int ok, int attempts, int last_status) {
    (void)user;
    (void)last_status;
    char job_id[40];
    snprintf(job_id, sizeof job_id, "%.*s", (int)strcspn(delivery_id, "."), delivery_id);
    job_store_webhook_state(G.jobs, job_id, ok ? "delivered" : "failed", attempts);
    metrics_webhook(ok ? "delivered" : "failed");
}

static void job_q_push(const char *id) {
    if (G.job_q_n == G.job_q_cap) {
        G.job_q_cap = G.job_q_cap ? 2 * G.job_q_cap : 16;
        G.job_q = xrealloc(G.job_q, (size_t)G.job_q_cap * sizeof *G.job_q);
    }
    snprintf(G.job_q[G.job_q_n++], 40, "%s", id);
}

/* A job reached a terminal state: notify streams, send its webhook. */
static void job_terminal(const char *id, const char *owner) {
    subs_notify(id);
    char *url = job_store_webhook(G.jobs, id);
    if (!url) return;
    json_t *obj = job_store_get_json(G.jobs, id, owner);
    if (obj) {
        json_object_del(obj, "request");
        char *body = json_dumps(obj, UM_JSON_COMPACT);
        char event[48], delivery[64];
        snprintf(event, sizeof event, "job.%s", json_string_value(json_object_get(obj, "status")));
        snprintf(delivery, sizeof delivery, "%s.%s", id, json_string_value(json_object_get(obj, "status")));
        um_err ue = {0};
        if (webhook_enqueue(G.wh, url, event, delivery, body, strlen(body), webhook_done, NULL, &ue) != 0)
            log_warn("job %s: webhook not sent: %s", id, ue.msg);
        free(body);
        json_decref(obj);
    }
    free(url);
}

static void job_on_finished(gen_stream *gs) {
    const char *err = api_resp_error(gs->resp);
    const char *id = gs->job_id;
    if (gs->submit_failed) return; /* never started: still queued, the pump retries it */
    if (job_store_cancel_requested(G.jobs, id)) {
        job_store_cancelled(G.jobs, id);
    } else if (err) {
        if (job_store_attempt_failed(G.jobs, id, err)) { /* back to queued: run it again */
            log_warn("job %s: attempt failed (%s); retrying", id, err);
            subs_notify(id);
            job_q_push(id);
            return;
        }
    } else {
        json_t *body = api_resp_body(gs->resp);
        json_object_del(body, "id");
        job_store_succeed(G.jobs, id, body);
        json_decref(body);
    }
    job_terminal(id, gs->job_owner);
}

/* A job's tokenization (chat template, tokenizer, building the canvas) runs on a preparation
 * worker (server/prep.h), like every other generation request, never on the service thread: for
 * POST /v1/jobs (validation: the same parse + build the run will do, so bad input fails with 400
 * before a job exists) and for each attempt's start (the build whose sequences are submitted). */
typedef struct job_prep {
    prep_job     job;        /* first member */
    int          start;      /* 0: POST /v1/jobs validation; 1: an attempt of queued job `id` */
    http_conn   *c;          /* validation: the client, NULL once it went away */
    const model *m;
    api_gen      g;          /* parsed on the service thread (owned; the worker only reads it) */
    json_t      *req;        /* validation: the request body (owned) */
    char        *who;        /* the caller (validation) / the job's owner (start), owned */
    char        *idem;       /* validation: Idempotency-Key or NULL, owned */
    char         id[40];     /* start: the job */
    /* worker results */
    int          rc;
    api_seq     *seqs;       /* owned */
    int          n;
    oai_error    e;
} job_prep;

/* Preparation worker: pure build (validation keeps nothing of it). */
static void job_prep_run(prep_job *j) {
    job_prep *p = (job_prep *)j;
    p->rc = api_gen_build(&p->g, p->m, api_limits_current(), &p->seqs, &p->n, &p->e);
}

static void job_prep_free(job_prep *p) {
    api_seqs_free(p->seqs, p->n);
    api_gen_free(&p->g);
    json_decref(p->req);
    free(p->who);
    free(p->idem);
    free(p);
}

static void job_q_push_front(const char *id) {
    job_q_push(id);
    memmove(G.job_q + 1, G.job_q, (size_t)(G.job_q_n - 1) * sizeof *G.job_q);
    snprintf(G.job_q[0], 40, "%s", id);
}

static void pump_cb(lws_sorted_usec_list_t *sul) {
    (void)sul;
    G.pump_scheduled = 0;
    jobs_pump();
}

static void jobs_pump_later(void) {
    if (G.job_q_n > 0 && !G.pump_scheduled && G.srv && server_lws_context(G.srv)) {
        G.pump_scheduled = 1;
        lws_sul_schedule(server_lws_context(G.srv), 0, &G.pump_sul, pump_cb, JOB_PUMP_US);
    }
}

/* Service thread: an attempt's sequences are built; submit them. */
static void job_start_done(job_prep *p) {
    const char *id = p->id;
    G.job_starting = 0;
    if (p->job.skipped) { /* shutting down: the job stays queued */
        job_q_push_front(id);
        return;
    }
    if (job_store_status(G.jobs, id) != JOB_QUEUED) { /* cancelled while it was being built */
        jobs_pump();
        return;
    }
    if (p->rc != 0) { /* validated at creation: only a changed model lands here */
        job_store_start(G.jobs, id, 0);
        job_store_attempt_failed(G.jobs, id, p->e.message);
        if (job_store_status(G.jobs, id) == JOB_FAILED) job_terminal(id, p->who);
        else job_q_push(id);
        jobs_pump();
        return;
    }
    int n = p->n;
    gen_stream *gs = xcalloc(1, sizeof *gs);
    gs->srv = G.srv;
    gs->resp = api_resp_new(&p->g, p->seqs, n, p->m, G.served_name);
    gs->n = n;
    gs->ch = xcalloc((size_t)n, sizeof *gs->ch);
    for (int i = 0; i < n; i++) gs->ch[i].gs = gs, gs->ch[i].i = i;
    snprintf(gs->job_id, sizeof gs->job_id, "%s", id);
    gs->job_owner = xstrdup(p->who);
    gs->ended = 1; /* no HTTP response */
    oai_error e;
    if (gen_submit(gs, p->seqs, n, owner_key_of(p->who), &e) != 0) { /* scheduler full: retry later */
        if (gs->n_live == 0) gen_free(gs);
        else gs->submit_failed = 1; /* the cancelled choices' final events free it */
        job_q_push_front(id);
        jobs_pump_later();
        return;
    }
    gs->next_run = G.job_runs;
    G.job_runs = gs;
    job_store_start(G.jobs, id, (double)p->g.params.gen_length * n);
    subs_notify(id);
    jobs_pump();
}

/* Start queued job id (service thread): parse here, build on a preparation worker (job_start_done
 * submits). 1 handed over (or finished with: unknown, or failed for good), 0 not now (no model). */
static int job_start(const char *id) {
    const model *m = G.srv ? server_model(G.srv) : NULL;
    if (!m) return 0;
    json_t *req = job_store_request(G.jobs, id);
    char *owner = job_store_owner(G.jobs, id);
    if (!req || !owner) {
        json_decref(req);
        free(owner);
        return 1;
    }
    int chat = json_object_get(req, "messages") != NULL;
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    job_prep *p = xcalloc(1, sizeof *p);
    decode_params defaults = server_defaults(m);
    p->rc = chat ? openai_parse_chat(body, strlen(body), &defaults, api_limits_current(), &p->g, &p->e)
                 : openai_parse_completion(body, strlen(body), &defaults, api_limits_current(), &p->g, &p->e);
    free(body);
    p->start = 1;
    p->m = m;
    p->who = owner;
    snprintf(p->id, sizeof p->id, "%s", id);
    if (p->rc != 0) { /* validated at creation: only changed limits land here */
        job_store_start(G.jobs, id, 0);
        if (job_store_attempt_failed(G.jobs, id, p->e.message)) job_q_push(id);
        else job_terminal(id, owner);
        job_prep_free(p);
        return 1;
    }
    p->g.stream = 0;
    p->job.owner_key = owner_key_of(owner);
    p->job.run = job_prep_run;
    p->job.done = job_prep_done;
    G.job_starting = 1;
    server_prep(G.srv, &p->job);
    return 1;
}

/* Start waiting jobs in order, one build at a time (service thread); job_start_done continues,
 * or retries later when the scheduler is full. */
static void jobs_pump(void) {
    while (G.job_q_n > 0 && !G.job_starting) {
        char id[40];
        snprintf(id, sizeof id, "%s", G.job_q[0]);
        memmove(G.job_q, G.job_q + 1, (size_t)(G.job_q_n - 1) * sizeof *G.job_q);
        G.job_q_n--;
        if (job_store_status(G.jobs, id) != JOB_QUEUED) continue;
        if (!job_start(id)) {
            job_q_push_front(id);
            break;
        }
    }
    if (!G.job_starting) jobs_pump_later();
}

/* Service thread: POST /v1/jobs validated; create the job (or replay it) and answer 202. */
static void job_create_done(job_prep *p) {
    http_conn *c = p->c;
    oai_error e;
    if (!c) return; /* the client went away before its job was created: no job */
    http_stream_on_close(c, NULL, NULL);
    if (p->job.skipped) {
        oai_error_set(&e, 503, "shutting_down", NULL, "the server is shutting down and accepts no new work");
        e.retry_after_ms = 5000;
        respond_error(c, &e);
        return;
    }
    if (p->rc != 0) {
        respond_error(c, &p->e);
        return;
    }
    const json_t *wh = json_object_get(p->req, "webhook");
    if (wh && !json_is_null(wh)) {
        webhook_url u;
        um_err ue = {0};
        int bad = 0;
        if (!json_is_string(wh)) bad = oai_error_set(&e, 400, "invalid_type", "webhook", "webhook must be a string URL");
        else if (webhook_url_parse(json_string_value(wh), &u, &ue) != 0) bad = oai_error_from_um(&e, &ue);
        else if (!G.secret_set) log_warn("job webhooks are signed with an empty key: set --webhook-secret or $UNMASK_WEBHOOK_SECRET");
        if (bad) {
            respond_error(c, &e);
            return;
        }
    }
    char id[40];
    int existed = 0;
    um_err ue = {0};
    if (job_store_create(G.jobs, p->who, p->idem, p->req, json_is_string(wh) ? json_string_value(wh) : NULL, id,
                         &existed, &ue) != 0) {
        if (ue.code == UM_ERR_RESOURCE) {
            oai_error_set(&e, 503, "too_many_jobs", NULL, "%s", ue.msg);
            e.retry_after_ms = 5000;
        } else {
            oai_error_set(&e, 422, "idempotency_key_reused", "Idempotency-Key", "%s", ue.msg);
        }
        respond_error(c, &e);
        return;
    }
    if (!existed) {
        job_q_push(id);
        jobs_pump();
    }
    json_t *obj = job_store_get_json(G.jobs, id, p->who);
    char loc[96];
    snprintf(loc, sizeof loc, "Location: /v1/jobs/%s", id);
    const char *hdrs[] = {loc, existed ? "Idempotent-Replayed: true" : NULL, NULL};
    http_respond_json(c, 202, obj, hdrs);
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
    atomic_store(&p->job.cancel, 1);
}

/* POST /v1/jobs: parse here (errors answer at once), validate the build on a preparation worker;
 * job_create_done creates the job and answers 202. */
static int h_jobs_create(http_conn *c, const http_req *rq) {
    const model *m = server_model(rq->srv);
    oai_error e;
    if (!m) {
        oai_error_set(&e, 503, "model_loading", NULL, "the model is still loading; retry shortly");
        e.retry_after_ms = 1000;
        return respond_error(c, &e);
    }
    json_t *o = api_parse_body(rq->body, rq->body_len, &e);
    if (!o) return respond_error(c, &e);
    job_prep *p = xcalloc(1, sizeof *p);
    p->req = o;
    decode_params defaults = server_defaults(m);
    int chat = json_object_get(o, "messages") != NULL;
    int rc = chat ? openai_parse_chat(rq->body, rq->body_len, &defaults, api_limits_current(), &p->g, &e)
                  : openai_parse_completion(rq->body, rq->body_len, &defaults, api_limits_current(), &p->g, &e);
    if (rc == 0 && p->g.stream)
        rc = oai_error_set(&e, 400, "invalid_value", "stream", "stream is not supported for jobs: read GET /v1/jobs/{id}/events instead");
    if (rc != 0) {
        job_prep_free(p);
        return respond_error(c, &e);
    }
    char who[160], idem[256];
    caller_identity(c, who, sizeof who);
    p->who = xstrdup(who);
    if (http_header(c, "idempotency-key", idem, sizeof idem) > 0) p->idem = xstrdup(idem);
    p->c = c;
    p->m = m;
    p->job.owner_key = owner_key_of(who); /* one caller's jobs are created in request order */
    p->job.run = job_prep_run;
    p->job.done = job_prep_done;
    http_respond_later(c);
    http_stream_on_close(c, job_prep_on_close, p);
    server_prep(rq->srv, &p->job);
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
    return respond_error_fmt(c, 404, "job_not_found", "id", msg);
}

static int h_jobs_get(http_conn *c, const http_req *rq) {
    char id[40], who[160];
    int events = 0;
    if (job_path(rq->path, id, &events) != 0) return respond_error_fmt(c, 404, "not_found", NULL, "no such endpoint");
    caller_identity(c, who, sizeof who);
    if (!events) {
        json_t *o = job_store_get_json(G.jobs, id, who);
        if (!o) return job_not_found(c, id);
        return http_respond_json(c, 200, o, NULL);
    }
    if (!job_store_exists(G.jobs, id, who)) return job_not_found(c, id);
    char last[32];
    long long after = 0;
    if (http_header(c, "last-event-id", last, sizeof last) > 0 || http_query(c, "after", last, sizeof last) >= 0) {
        char *end;
        after = strtoll(last, &end, 10);
        if (*end || after < 0)
            return respond_error_fmt(c, 400, "invalid_value", "Last-Event-ID", "Last-Event-ID must be a non-negative event id");
    }
    job_sub *s = xcalloc(1, sizeof *s);
    s->c = c;
    s->last = after;
    snprintf(s->id, sizeof s->id, "%s", id);
    s->next = G.subs;
    G.subs = s;
    http_stream_begin(c, 200, "text/event-stream", k_sse_headers);
    http_stream_on_close(c, sub_on_close, s);
    sub_flush(s);
    return 0;
}

static int h_jobs_delete(http_conn *c, const http_req *rq) {
    char id[40], who[160];
    int events = 0;
    if (job_path(rq->path, id, &events) != 0 || events) return respond_error_fmt(c, 404, "not_found", NULL, "no such endpoint");
    caller_identity(c, who, sizeof who);
    if (!job_store_exists(G.jobs, id, who)) return job_not_found(c, id);
    int r = job_store_cancel(G.jobs, id, who);
    if (r == 0) {
        json_t *o = job_store_get_json(G.jobs, id, who);
        char msg[160];
        snprintf(msg, sizeof msg, "job '%s' already finished (%s)", id, json_string_value(json_object_get(o, "status")));
        json_decref(o);
        return respond_error_fmt(c, 409, "job_finished", "id", msg);
    }
    if (r == 1) job_terminal(id, who);
    if (r == 2) /* running: its sequences stop at the next step, then the job turns cancelled */
        for (gen_stream *gs = G.job_runs; gs; gs = gs->next_run)
            if (strcmp(gs->job_id, id) == 0) gen_cancel_all(gs);
    return http_respond_json(c, 200, job_store_get_json(G.jobs, id, who), NULL);
}

/* ================================================================ middleware */

static const http_route k_routes[] = {
    {"POST", "/v1/chat/completions", 0, h_chat},
    {"POST", "/v1/completions", 0, h_completions},
    {"POST", "/v1/fim/completions", 0, h_fim},
    {"GET", "/v1/models", 0, h_models},
    {"GET", "/v1/models/", 1, h_model_one},
    {"POST", "/generate", 0, h_generate},
    {"POST", "/infill", 0, h_infill},
    {"POST", "/v1/jobs", 0, h_jobs_create},
    {"GET", "/v1/jobs/", 1, h_jobs_get},
    {"DELETE", "/v1/jobs/", 1, h_jobs_delete},
    {"GET", "/metrics", 0, h_metrics},
    {NULL, NULL, 0, NULL},
};

static int is_my_route(const http_route *r) {
    return r && r >= k_routes && r < k_routes + sizeof k_routes / sizeof k_routes[0];
}

/* The API key presented (or the client address under open access): jobs' owner, rate-limit key. */
static const char *caller_identity(http_conn *c, char *buf, size_t cap) {
    char h[512], tok[400];
    if (auth_keys_required(&G.keys)) {
        if (http_header(c, "authorization", h, sizeof h) > 0 && auth_bearer_token(h, tok, sizeof tok) == 0) {
            snprintf(buf, cap, "key:%s", tok);
            return buf;
        }
        if (http_header(c, "x-api-key", tok, sizeof tok) > 0) {
            snprintf(buf, cap, "key:%s", tok);
            return buf;
        }
    }
    char peer[128];
    http_peer(c, peer, sizeof peer);
    snprintf(buf, cap, "ip:%s", peer);
    return buf;
}

static int draining(const server *s);

static void request_id(http_conn *c) {
    char id[160], line[200];
    int n = http_header(c, "x-request-id", id, sizeof id);
    int ok = n > 0 && n <= 128;
    for (int i = 0; ok && i < n; i++)
        if (!isgraph((unsigned char)id[i])) ok = 0;
    if (!ok) {
        unsigned char b[12];
        if (RAND_bytes(b, sizeof b) != 1) UM_FATAL("RAND_bytes failed");
        int o = snprintf(id, sizeof id, "req_");
        for (size_t i = 0; i < sizeof b; i++) o += snprintf(id + o, sizeof id - (size_t)o, "%02x", b[i]);
    }
    snprintf(line, sizeof line, "x-request-id: %s", id);
    http_add_header(c, line);
}

/* CORS: response headers for an allowed Origin; 1 when the origin is allowed. */
static int cors_headers(http_conn *c) {
    if (!G.cors_origin) return 0;
    char origin[512], line[600];
    if (http_header(c, "origin", origin, sizeof origin) <= 0) return 0;
    int any = strcmp(G.cors_origin, "*") == 0;
    if (!any && strcmp(origin, G.cors_origin) != 0) return 0;
    snprintf(line, sizeof line, "Access-Control-Allow-Origin: %s", any ? "*" : origin);
    http_add_header(c, line);
    if (!any) http_add_header(c, "Vary: Origin");
    http_add_header(c, "Access-Control-Expose-Headers: x-request-id, retry-after, retry-after-ms, x-should-retry, "
                       "x-unmask-id, location");
    return 1;
}

static int mw_before(http_conn *c, const http_req *rq, const http_route *route) {
    G.srv = rq->srv;
    request_id(c);
    int cors_ok = cors_headers(c);
    if (rq->method == HTTP_OPTIONS) { /* CORS preflight (or a plain OPTIONS) */
        char origin[512], req_hdrs[1024], line[1100];
        int has_origin = http_header(c, "origin", origin, sizeof origin) > 0;
        if (has_origin && !cors_ok) {
            metrics_http_request("preflight", "OPTIONS", 403);
            respond_error_fmt(c, 403, "cors_origin_not_allowed", NULL,
                              G.cors_origin ? "this Origin is not allowed (see --cors-origin)"
                                            : "cross-origin requests are not enabled on this server (--cors-origin)");
            return 1;
        }
        http_add_header(c, "Access-Control-Allow-Methods: GET, POST, DELETE, OPTIONS");
        if (http_header(c, "access-control-request-headers", req_hdrs, sizeof req_hdrs) > 0) {
            snprintf(line, sizeof line, "Access-Control-Allow-Headers: %s", req_hdrs);
            http_add_header(c, line);
        } else {
            http_add_header(c, "Access-Control-Allow-Headers: authorization, content-type, x-api-key, x-request-id, "
                               "idempotency-key, last-event-id");
        }
        http_add_header(c, "Access-Control-Max-Age: 600");
        http_add_header(c, "Allow: GET, POST, DELETE, OPTIONS");
        http_respond(c, 204, "text/plain", "", 0, NULL);
        return 1;
    }
    if (!route && (rq->method == HTTP_GET || rq->method == HTTP_HEAD)) {
        /* a GET on one of our POST-only paths would fall through to the static files: 405 instead */
        char allow[64] = "";
        for (const http_route *r = k_routes; r->path; r++) {
            int match = r->prefix ? strncmp(rq->path, r->path, strlen(r->path)) == 0 : strcmp(rq->path, r->path) == 0;
            if (match && !strstr(allow, r->method))
                snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "", r->method);
        }
        if (allow[0]) {
            char line[96], msg[160];
            snprintf(line, sizeof line, "Allow: %s", allow);
            http_add_header(c, line);
            snprintf(msg, sizeof msg, "%s is not allowed on %.80s (allowed: %s)", rq->method_name, rq->path, allow);
            respond_error_fmt(c, 405, "method_not_allowed", NULL, msg);
            return 1;
        }
    }
    if (!is_my_route(route)) {
        /* health checks of load balancers see the drain */
        if (route && strcmp(route->path, "/health") == 0 && draining(rq->srv)) {
            static const char *const h[] = {"Retry-After: 5", NULL};
            http_respond_json(c, 503, json_pack("{s:s}", "status", "draining"), h);
            return 1;
        }
        return 0;
    }
    oai_error e;
    if (route->fn != h_metrics) {
        char h[512], tok[400];
        int present = http_header(c, "authorization", h, sizeof h) > 0;
        int malformed = present && auth_bearer_token(h, tok, sizeof tok) != 0;
        if (!present && http_header(c, "x-api-key", tok, sizeof tok) > 0) present = 1;
        enum auth_result ar = auth_check(&G.keys, present && !malformed ? tok : NULL, malformed);
        if (ar != AUTH_OK) {
            oai_error_set(&e, 401, ar == AUTH_INVALID ? "invalid_api_key" : "missing_api_key", NULL, "%s",
                          auth_result_message(ar));
            respond_error(c, &e);
            return 1;
        }
        if (G.rl) {
            char who[160];
            double ra = 0;
            if (!ratelimit_take(G.rl, caller_identity(c, who, sizeof who), 1, time_now_s(), &ra)) {
                oai_error_set(&e, 429, "rate_limit_exceeded", NULL,
                              "Rate limit reached: %g requests per second per API key; retry in %.0f ms", G.rate,
                              ceil(ra * 1000));
                e.retry_after_ms = ceil(ra * 1000);
                respond_error(c, &e);
                return 1;
            }
        }
    }
    if (rq->method == HTTP_POST && draining(rq->srv)) {
        oai_error_set(&e, 503, "shutting_down", NULL, "the server is shutting down and accepts no new work");
        e.retry_after_ms = 5000;
        respond_error(c, &e);
        return 1;
    }
    return 0;
}

static void mw_after(http_conn *c, int status) {
    const http_route *r = http_conn_route(c);
    metrics_http_request(r ? r->path : "other", http_conn_method(c), status);
}

int http_api_ws_authorize(struct lws *wsi) {
    if (!auth_keys_required(&G.keys)) return 1;
    char h[1024], tok[400];
    int malformed = 0, have = 0;
    if (lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_HTTP_AUTHORIZATION) > 0) {
        have = auth_bearer_token(h, tok, sizeof tok) == 0;
        malformed = !have;
    }
    if (!have && lws_hdr_custom_copy(wsi, tok, sizeof tok, "x-api-key:", 10) > 0) have = 1, malformed = 0;
    if (!have && lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_PROTOCOL) > 0 && auth_key_from_subprotocols(h, tok, sizeof tok) == 0)
        have = 1, malformed = 0;
    enum auth_result r = auth_check(&G.keys, have ? tok : NULL, malformed);
    if (r != AUTH_OK) log_info("websocket handshake refused: %s", auth_result_message(r));
    return r == AUTH_OK;
}

void routes_http_api_register(void) {
    http_routes_add(k_routes);
    static const http_middleware mw = {mw_before, mw_after};
    http_set_middleware(&mw);
}

/* ================================================================ shutdown */

static int draining(const server *s) { return s && server_draining(s); }

/* Drain starts: job event streams are long-lived; end them (clients reconnect with Last-Event-ID
 * to another instance or after the restart). */
static void drain_begin(server *s) {
    (void)s;
    while (G.subs) {
        job_sub *sub = G.subs;
        out_chunk *ch = sse_frame_comment("server shutting down; reconnect with Last-Event-ID");
        http_stream_write(sub->c, out_chunk_data(ch), ch->len);
        out_chunk_free(ch);
        http_stream_on_close(sub->c, NULL, NULL);
        http_stream_end(sub->c);
        sub_remove(sub);
    }
}

/* Idle once no HTTP generation and no job runs any more. */
static int drain_idle(server *s) {
    (void)s;
    return G.n_streams == 0 && G.job_runs == NULL;
}
