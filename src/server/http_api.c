/*
 * http_api.c — the HTTP APIs other clients already speak (see http_api.h): the instance
 * (create/free), the middleware in front of every HTTP request (x-request-id, CORS + preflight,
 * API keys, per-key rate limits, 503 while draining, request metrics), /v1/models, /metrics, the
 * WebSocket handshake's key check and the graceful-shutdown hooks. The generation endpoints live
 * in http_gen.c, jobs in http_jobs.c (http_api_internal.h ties them together).
 *
 * Not here: request parsing / response shapes (api/), lws plumbing (http.c), the scheduler.
 * Threads: create/free on the main thread; everything else on the lws service thread.
 */
#include "server/http_api.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "api/algo_config.h"
#include "api/sse.h"
#include "decode/event_json.h"
#include "jobs/job_db.h"
#include "jobs/job_redis.h"
#include "server/http_api_internal.h"
#include "server/callers.h"
#include "server/metrics.h"
#include "server/server_internal.h"
#include "server/trace.h"
#include "server/ws_store.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/netaddr.h"
#include "util/timeutil.h"

/* ================================================================ shared helpers */

decode_params api_defaults(const http_api *a, const model *m) { return api_policy_params(server_policy(a->srv), m); }

/* ================================================================ responses */

int api_respond_error(http_conn *c, const api_error *e) {
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

int api_respond_error_fmt(http_conn *c, int status, const char *code, const char *param, const char *msg) {
    api_error e;
    oai_error_set(&e, status, code, param, "%s", msg);
    return api_respond_error(c, &e);
}

int api_respond_loading(http_conn *c) {
    api_error e;
    oai_error_set(&e, 503, "model_loading", NULL, "the model is still loading; retry shortly");
    e.retry_after_ms = 1000;
    return api_respond_error(c, &e);
}

int api_respond_shutting_down(http_conn *c) {
    api_error e;
    oai_error_set(&e, 503, "shutting_down", NULL, "the server is shutting down and accepts no new work");
    e.retry_after_ms = 5000;
    return api_respond_error(c, &e);
}

/* Unknown model? The "model" field is informational here (one model is served); any name is
 * accepted, as llama.cpp does, so clients configured for other providers keep working. */

const char *const k_sse_headers[] = {"X-Accel-Buffering: no", NULL};

int api_stream_json(http_conn *c, const json_t *obj, const char *id) {
    out_chunk *ch = sse_frame_json(id, NULL, obj);
    int rc = http_stream_write(c, out_chunk_data(ch), ch->len);
    out_chunk_free(ch);
    return rc;
}

/* ================================================================ models, metrics */

static json_t *model_object(const http_api *a) {
    const server *s = a->srv;
    const model *m = server_model((server *)s);
    json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", a->served_name, "object", "model", "created",
                          (json_int_t)a->created, "owned_by", "unmask");
    if (m) {
        const decode_params d = api_defaults(a, m);
        json_object_set_new(o, "meta", json_pack("{s:s, s:i, s:i, s:i, s:b, s:[ssss], s:o}", "family",
                                                 model_arch_name(m->cfg.arch), "context_length",
                                                 server_max_seq(s) > 0 ? server_max_seq(s) : m->cfg.max_seq, "vocab_size",
                                                 m->cfg.n_embd_rows, "block_causal", m->cfg.block_causal,
                                                 "infilling", m->cfg.block_causal == 0, "cache_modes", "none", "prefix",
                                                 "dual", "vicinity", "decode_defaults",
                                                 decode_params_to_json(&d)));
    }
    return o;
}

static int h_models(http_conn *c, const http_req *rq) {
    return http_respond_json(c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_object(rq->user)), NULL);
}

static int h_model_one(http_conn *c, const http_req *rq) {
    const http_api *a = rq->user;
    const char *id = rq->path + strlen("/v1/models/");
    if (strcmp(id, a->served_name) != 0) {
        char msg[400];
        snprintf(msg, sizeof msg, "The model '%.200s' does not exist; this server serves '%.150s'", id, a->served_name);
        return api_respond_error_fmt(c, 404, "model_not_found", "model", msg);
    }
    return http_respond_json(c, 200, model_object(a), NULL);
}

/* GET /v1/generations/{trace id}/trace: a WebSocket generation's denoising trace (server/trace.h),
 * for its caller, while its session is retained. */
static int h_generation_trace(http_conn *c, const http_req *rq) {
    http_api *a = rq->user;
    const char *p = rq->path + strlen("/v1/generations/");
    char id[TRACE_ID_MAX], who[API_WHO_MAX];
    size_t n = strcspn(p, "/");
    if (n == 0 || n >= sizeof id || strcmp(p + n, "/trace") != 0)
        return api_respond_error_fmt(c, 404, "not_found", NULL, "no such endpoint");
    memcpy(id, p, n);
    id[n] = 0;
    api_caller_identity(a, c, who, sizeof who);
    json_t *o = ws_trace_get(server_ws(a->srv), id, who);
    if (!o) {
        char msg[200];
        snprintf(msg, sizeof msg, "no trace '%s' (unknown, gone with its session, or another caller's)", id);
        return api_respond_error_fmt(c, 404, "trace_not_found", "id", msg);
    }
    return http_respond_json(c, 200, o, NULL);
}

static int h_metrics(http_conn *c, const http_req *rq) {
    size_t len = 0;
    char *text = metrics_render(server_metrics(rq->srv), &len);
    static const char *const hdrs[] = {"Cache-Control: no-store", NULL};
    int rc = http_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len, hdrs);
    free(text);
    return rc;
}

/* ================================================================ middleware */

/* "key:" + the SHA-256 of key (hex): the whole key, never a prefix of it, and no key in memory
 * beyond the key file's. */
static const char *key_identity(const char *key, char *buf, size_t cap) {
    unsigned char md[32];
    unsigned int n = 0;
    if (!EVP_Digest(key, strlen(key), md, &n, EVP_sha256(), NULL) || n != sizeof md) UM_FATAL("SHA-256 failed");
    int o = snprintf(buf, cap, "key:");
    for (unsigned i = 0; i < n && (size_t)o + 3 <= cap; i++) o += snprintf(buf + o, cap - (size_t)o, "%02x", md[i]);
    return buf;
}

/* "ip:ADDR" of the client: the peer, or — when the peer is a trusted reverse proxy
 * (--trusted-proxies) that sent X-Forwarded-For — the right-most address of that header that is
 * not itself a trusted proxy (entries further left could be forged by the client). */
static void client_address(const http_api *a, const char *peer, const char *xff, char *buf, size_t cap) {
    const char *addr = peer;
    char pick[128];
    if (xff && net_cidr_list_contains_text(a->proxies, a->n_proxies, peer)) {
        const char *end = xff + strlen(xff);
        while (end > xff) {
            const char *start = end;
            while (start > xff && start[-1] != ',') start--;
            const char *p = start, *q = end;
            while (p < q && (*p == ' ' || *p == '\t')) p++;
            while (q > p && (q[-1] == ' ' || q[-1] == '\t')) q--;
            if (q > p && (size_t)(q - p) < sizeof pick) {
                memcpy(pick, p, (size_t)(q - p));
                pick[q - p] = 0;
                addr = pick;
                if (!net_cidr_list_contains_text(a->proxies, a->n_proxies, pick)) break;
            }
            end = start > xff ? start - 1 : xff;
        }
    }
    snprintf(buf, cap, "ip:%s", addr);
}

const char *api_caller_identity(const http_api *a, http_conn *c, char *buf, size_t cap) {
    char h[512], tok[AUTH_KEY_MAX + 2];
    if (auth_keys_required(&a->keys)) {
        if (http_header(c, "authorization", h, sizeof h) > 0 && auth_bearer_token(h, tok, sizeof tok) == 0)
            return key_identity(tok, buf, cap);
        if (http_header(c, "x-api-key", tok, sizeof tok) > 0) return key_identity(tok, buf, cap);
    }
    char peer[128], xff[512];
    http_peer(c, peer, sizeof peer);
    int has_xff = a->n_proxies && http_header(c, "x-forwarded-for", xff, sizeof xff) > 0;
    client_address(a, peer, has_xff ? xff : NULL, buf, cap);
    return buf;
}

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
static int cors_headers(const http_api *a, http_conn *c) {
    if (!a->cors_origin) return 0;
    char origin[512], line[600];
    if (http_header(c, "origin", origin, sizeof origin) <= 0) return 0;
    int any = strcmp(a->cors_origin, "*") == 0;
    if (!any && strcmp(origin, a->cors_origin) != 0) return 0;
    snprintf(line, sizeof line, "Access-Control-Allow-Origin: %s", any ? "*" : origin);
    http_add_header(c, line);
    if (!any) http_add_header(c, "Vary: Origin");
    http_add_header(c, "Access-Control-Expose-Headers: x-request-id, retry-after, retry-after-ms, x-should-retry, "
                       "x-unmask-id, x-unmask-ignored-fields, location");
    return 1;
}

static int mw_before(http_conn *c, const http_req *rq, const http_route *route) {
    http_api *a = rq->user;
    request_id(c);
    int cors_ok = cors_headers(a, c);
    if (rq->method == HTTP_OPTIONS) { /* CORS preflight (or a plain OPTIONS) */
        char origin[512], req_hdrs[1024], line[1100];
        int has_origin = http_header(c, "origin", origin, sizeof origin) > 0;
        if (has_origin && !cors_ok) {
            metrics_http_request(server_metrics(a->srv), "preflight", "OPTIONS", 403);
            api_respond_error_fmt(c, 403, "cors_origin_not_allowed", NULL,
                              a->cors_origin ? "this Origin is not allowed (see --cors-origin)"
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
        http_routes_allowed(server_router(rq->srv), rq->path, HTTP_ROUTE_API, allow, sizeof allow);
        if (allow[0]) {
            char line[96], msg[160];
            snprintf(line, sizeof line, "Allow: %s", allow);
            http_add_header(c, line);
            snprintf(msg, sizeof msg, "%s is not allowed on %.80s (allowed: %s)", rq->method_name, rq->path, allow);
            api_respond_error_fmt(c, 405, "method_not_allowed", NULL, msg);
            return 1;
        }
    }
    if (!route || !(route->flags & HTTP_ROUTE_API)) {
        /* health checks of load balancers see the drain */
        if (route && strcmp(route->path, "/health") == 0 && server_draining(rq->srv)) {
            static const char *const h[] = {"Retry-After: 5", NULL};
            http_respond_json(c, 503, json_pack("{s:s}", "status", "draining"), h);
            return 1;
        }
        char why[200];
        if (route && strcmp(route->path, "/health") == 0 && server_ready(rq->srv) &&
            job_store_failing(a->jobs, why, sizeof why)) { /* not ready for new jobs: send them elsewhere */
            static const char *const h[] = {"Retry-After: 5", "Cache-Control: no-store", NULL};
            http_respond_json(c, 503, json_pack("{s:s, s:s}", "status", "degraded", "problem", "job store"), h);
            log_debug("/health: job store failing: %s", why);
            return 1;
        }
        return 0;
    }
    api_error e;
    if (!(route->flags & HTTP_ROUTE_NO_AUTH)) {
        char h[512], tok[AUTH_KEY_MAX + 2]; /* room for one byte more than any key: a longer one never matches */
        int hl = http_header(c, "authorization", h, sizeof h); /* -2: too long, or a NUL inside */
        int present = hl != -1;
        int malformed = present && (hl < 0 || auth_bearer_token(h, tok, sizeof tok) != 0);
        if (!present) {
            int xl = http_header(c, "x-api-key", tok, sizeof tok);
            present = xl != -1;
            malformed = xl == -2;
        }
        enum auth_result ar = auth_check(&a->keys, present && !malformed ? tok : NULL, malformed);
        if (ar != AUTH_OK) {
            oai_error_set(&e, 401, ar == AUTH_INVALID ? "invalid_api_key" : "missing_api_key", NULL, "%s",
                          auth_result_message(ar));
            api_respond_error(c, &e);
            return 1;
        }
        callers *cs = server_callers(a->srv);
        {
            char who[API_WHO_MAX];
            double ra = 0;
            if (!callers_rate_take(cs, api_caller_identity(a, c, who, sizeof who), time_now_s(), &ra)) {
                oai_error_set(&e, 429, "rate_limit_exceeded", NULL,
                              "Rate limit reached: %g requests per second per API key; retry in %.0f ms",
                              callers_rate(cs), ceil(ra * 1000));
                e.retry_after_ms = ceil(ra * 1000);
                api_respond_error(c, &e);
                return 1;
            }
        }
    }
    if (rq->method == HTTP_POST && server_draining(rq->srv)) {
        api_respond_shutting_down(c);
        return 1;
    }
    return 0;
}

static void mw_after(http_conn *c, int status, void *user) {
    http_api *a = user;
    const http_route *r = http_conn_route(c);
    metrics_http_request(server_metrics(a->srv), r ? r->path : "other", http_conn_method(c), status);
}

/* ================================================================ the instance */

static double gauge_sched(void *user) {
    const gauge_ref *g = user;
    sched *sc = server_sched(g->api->srv);
    if (!sc) return 0;
    sched_stats st;
    sched_get_stats(sc, &st);
    return g->which == 0 ? st.queued : st.active;
}

static double gauge_jobs(void *user) {
    const gauge_ref *g = user;
    int q = 0, r = 0, t = 0;
    job_store_counts(g->api->jobs, &q, &r, &t);
    return g->which == 0 ? q : g->which == 1 ? r : t;
}

static double gauge_streams(void *user) { return ((const gauge_ref *)user)->api->n_streams; }
static double gauge_ready(void *user) { return server_ready(((const gauge_ref *)user)->api->srv) ? 1 : 0; }
static double gauge_store(void *user) {
    const gauge_ref *g = user;
    char why[8];
    return g->which == 0 ? (double)job_store_write_errors(g->api->jobs) : job_store_failing(g->api->jobs, why, sizeof why);
}

static void gauges_register(http_api *a) {
    metrics *m = server_metrics(a->srv);
    for (int i = 0; i < 3; i++) a->gauges[i] = (gauge_ref){a, i};
    metrics_gauge_register(m, "queue_depth", "Generation requests waiting for admission.", gauge_sched, &a->gauges[0]);
    metrics_gauge_register(m, "active_sequences", "Sequences being denoised now.", gauge_sched, &a->gauges[1]);
    metrics_gauge_register(m, "jobs_queued", "Async jobs waiting to run.", gauge_jobs, &a->gauges[0]);
    metrics_gauge_register(m, "jobs_running", "Async jobs running.", gauge_jobs, &a->gauges[1]);
    metrics_gauge_register(m, "jobs_held", "Async jobs in this server's memory (--store redis: the jobs this replica took "
                           "from the shared queue and has not evicted).", gauge_jobs, &a->gauges[2]);
    metrics_gauge_register(m, "http_streams_open", "Open HTTP generation responses.", gauge_streams, &a->gauges[0]);
    metrics_gauge_register(m, "model_ready", "1 once the model is loaded.", gauge_ready, &a->gauges[0]);
    metrics_gauge_register(m, "job_store_write_errors", "Durable job store writes that failed since start.", gauge_store,
                           &a->gauges[0]);
    metrics_gauge_register(m, "job_store_failing", "1 while the durable job store cannot write (new jobs get 503).",
                           gauge_store, &a->gauges[1]);
}

/* /v1/models id: --served-model-name, else the model directory's last component (a GGUF file's
 * name without ".gguf"). */
static void served_name_set(http_api *a, const server_config *cfg) {
    if (cfg->served_model_name) {
        snprintf(a->served_name, sizeof a->served_name, "%s", cfg->served_model_name);
        return;
    }
    const char *m = cfg->model ? cfg->model : "unmask";
    size_t n = strlen(m);
    while (n > 1 && m[n - 1] == '/') n--;
    const char *b = m + n;
    while (b > m && b[-1] != '/') b--;
    if (m + n - b > 5 && strncmp(m + n - 5, ".gguf", 5) == 0) n -= 5;
    snprintf(a->served_name, sizeof a->served_name, "%.*s", (int)(m + n - b), b);
}

static void drain_begin(server *s, void *user);
/* The session store's subscriber thread has notes for the service thread (server/ws_store.h). */
static void ws_store_wake(void *user) { server_wake(user); }
static int  drain_idle(server *s, void *user);
static int  ws_authorize(void *user, struct lws *wsi, char *who, size_t cap);

static const http_route k_api_routes[] = {
    {"GET", "/v1/models", 0, h_models, HTTP_ROUTE_API},
    {"GET", "/v1/models/", 1, h_model_one, HTTP_ROUTE_API},
    {"GET", "/v1/generations/", 1, h_generation_trace, HTTP_ROUTE_API},
    {"GET", "/metrics", 0, h_metrics, HTTP_ROUTE_API | HTTP_ROUTE_NO_AUTH},
    {NULL, NULL, 0, NULL, 0},
};

/* --store: NULL *db for memory, else the SQLite job store opened (its directory created) or the
 * shared Redis store connected. */
static int job_store_open(const server_config *cfg, job_backend **db, um_err *err) {
    *db = NULL;
    const char *st = cfg->store ? cfg->store : "sqlite";
    if (strcmp(st, "memory") == 0) {
        log_info("job store: memory (async jobs are lost when the server stops; --store sqlite keeps them)");
        return 0;
    }
    char path[4096];
    if (strcmp(st, "sqlite") == 0) {
        const char *dir = cfg->data_dir ? cfg->data_dir : "unmask-data";
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return um_err_set(err, UM_ERR_IO, "--data-dir %s: cannot create it: %s", dir, strerror(errno));
        snprintf(path, sizeof path, "%s/jobs.db", dir);
    } else if (strncmp(st, "sqlite:", 7) == 0 && st[7]) {
        snprintf(path, sizeof path, "%s", st + 7);
    } else if (strncmp(st, "redis://", 8) == 0) {
        return job_redis_open(st, cfg->job_retention_s, db, err);
    } else {
        return um_err_param(err, "store", "--store must be sqlite, sqlite:PATH, redis://HOST:PORT[/DB] or memory, got '%s'",
                            st);
    }
    if (job_db_backend_open(path, db, err) != 0) return -1;
    log_info("job store: %s (SQLite; jobs survive restarts)", path);
    return 0;
}

http_api *http_api_create(server *s, um_err *err) {
    const server_config *cfg = server_cfg(s);
    http_api *a = xcalloc(1, sizeof *a);
    a->srv = s;
    if (cfg->api_keys && auth_keys_load(&a->keys, cfg->api_keys, err) != 0) {
        um_err_prefix(err, "--api-keys");
        goto fail;
    }
    if (net_cidr_list_parse(cfg->trusted_proxies, "trusted-proxies", &a->proxies, &a->n_proxies, err) != 0) goto fail;
    a->shutdown_grace = cfg->shutdown_grace_s;
    if (cfg->cors_origin && cfg->cors_origin[0]) a->cors_origin = xstrdup(cfg->cors_origin);
    served_name_set(a, cfg);
    const char *secret = cfg->webhook_secret ? cfg->webhook_secret : getenv("UNMASK_WEBHOOK_SECRET");
    job_store_opts jo = {.max_jobs = cfg->max_jobs, .max_active = 1000, .max_events = 4096,
                         .max_attempts = cfg->job_attempts, .max_bytes = cfg->jobs_max_bytes};
    if (job_store_open(cfg, &jo.backend, err) != 0) goto fail;
    if (job_redis_consumer(jo.backend)) { /* WebSocket session logs in the same Redis */
        ws_store *wst = NULL;
        if (ws_store_open(cfg->store, job_redis_consumer(jo.backend), cfg->session_retention_s, ws_store_wake,
                          s, &wst, err) != 0) {
            job_backend_free(jo.backend);
            goto fail;
        }
        ws_state_set_store(server_ws(s), wst);
    }
    a->jobs = job_store_new(&jo);
    if (job_store_load(a->jobs, err) != 0) goto fail;
    webhook_config wc = {.secret = secret ? secret : "", .max_attempts = cfg->webhook_attempts,
                         .base_delay_s = cfg->webhook_retry_base_s, .timeout_s = cfg->webhook_timeout_s,
                         .allow = cfg->webhook_allow, .workers = cfg->webhook_workers};
    if (!(a->wh = webhook_sender_new(&wc, err))) goto fail;
    a->secret_set = secret && secret[0];
    jobs_recover(a);
    a->created = (long)time(NULL);
    gauges_register(a);
    http_routes_add(server_router(s), k_api_routes, a);
    http_gen_register(a);
    http_jobs_register(a);
    static const http_middleware mw_template = {mw_before, mw_after, NULL};
    http_middleware mw = mw_template;
    mw.user = a;
    http_set_middleware(server_router(s), &mw);
    server_set_drain(s, a->shutdown_grace, drain_begin, drain_idle, a);
    server_set_on_ready(s, jobs_on_ready, a);
    server_set_on_wake(s, jobs_on_wake, a);
    if (job_store_durable(a->jobs)) server_set_event_batch(s, jobs_batch_begin, jobs_batch_end, a);
    server_set_ws_auth(s, ws_authorize, a);
    if (auth_keys_required(&a->keys)) log_info("HTTP APIs: %d API key%s required", a->keys.n, a->keys.n == 1 ? "" : "s");
    return a;
fail: /* before any route or hook points at a */
    job_store_free(a->jobs);
    free(a->proxies);
    auth_keys_free(&a->keys);
    free(a->cors_origin);
    free(a);
    return NULL;
}

void http_api_free(http_api *a) {
    if (!a) return;
    metrics_gauge_unregister_all(server_metrics(a->srv));
    jobs_watches_close(a);
    jobs_shutdown(a);
    webhook_sender_free(a->wh, 2.0); /* the last webhooks: delivered within 2 s or dropped */
    job_feed_free(a->feed);
    job_store_free(a->jobs);
    auth_keys_free(&a->keys);
    free(a->proxies);
    free(a->cors_origin);
    free(a->job_q);
    free(a->wh_held);
    free(a);
}

/* The WebSocket handshake (server/ws.c asks through server_ws_auth): with API keys configured,
 * the key must come as `Authorization: Bearer <key>`, `x-api-key`, or — for browsers, which cannot
 * set headers — a subprotocol entry `unmask-key.<key>` (or `openai-insecure-api-key.<key>`). */
static int ws_authorize(void *user, struct lws *wsi, char *who, size_t cap) {
    http_api *a = user;
    char peer[128], xff[512];
    lws_get_peer_simple(wsi, peer, sizeof peer);
    int has_xff = a->n_proxies && lws_hdr_copy(wsi, xff, sizeof xff, WSI_TOKEN_X_FORWARDED_FOR) > 0;
    client_address(a, peer, has_xff ? xff : NULL, who, cap);
    if (!auth_keys_required(&a->keys)) return 1;
    char h[1024], tok[AUTH_KEY_MAX + 2];
    int malformed = 0, have = 0, n;
    /* lws copies a header value up to a NUL byte but returns its whole length: a value with a NUL
     * inside ("Bearer <key>\0junk") is malformed, never the part before the NUL */
    if ((n = lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_AUTHORIZATION)) > 0) {
        have = lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_HTTP_AUTHORIZATION) == n && strlen(h) == (size_t)n &&
               auth_bearer_token(h, tok, sizeof tok) == 0;
        malformed = !have;
    }
    if (!have && (n = lws_hdr_custom_copy(wsi, tok, sizeof tok, "x-api-key:", 10)) > 0 && strlen(tok) == (size_t)n)
        have = 1, malformed = 0;
    if (!have && (n = lws_hdr_copy(wsi, h, sizeof h, WSI_TOKEN_PROTOCOL)) > 0 && strlen(h) == (size_t)n &&
        auth_key_from_subprotocols(h, tok, sizeof tok) == 0)
        have = 1, malformed = 0;
    enum auth_result r = auth_check(&a->keys, have ? tok : NULL, malformed);
    if (r != AUTH_OK) log_info("websocket handshake refused: %s", auth_result_message(r));
    else key_identity(tok, who, cap);
    return r == AUTH_OK;
}

/* ================================================================ shutdown */

static void drain_begin(server *s, void *user) {
    (void)s;
    jobs_drain_begin(user);
}

/* Idle once no HTTP generation and no job runs any more. */
static int drain_idle(server *s, void *user) {
    const http_api *a = user;
    (void)s;
    return a->n_streams == 0 && a->job_runs == NULL;
}
