/*
 * server.c — lws context + vhost (plain or TLS), the service loop, the engine -> service-thread
 * event hub, the model loader thread, signals and orderly shutdown.
 *
 * Ownership: the server owns the model, backends, model_ctxs, scheduler, the WebSocket state, the
 * hub and the request preparation workers (prep.c: tokenization off this thread; their results come
 * back through server_on_wake too). Engine threads only call hub_emit() (lock, append, unlock,
 * lws_cancel_service()).
 * Everything else here runs on the service thread (the caller of server_run), except
 * loader_main() which builds the model/engines once and publishes them with `ready`.
 *
 * Memory: once the server goes quiet after work (memory_tick) it hands the heap's free pages back
 * to the OS (malloc_trim): glibc keeps what a burst of clients freed — in the service thread's
 * arena and in each engine and worker thread's — so without it the resident set stays at its peak.
 *
 * Not here: HTTP (http.c), static files (static.c), WebSocket protocol and sessions (ws.c,
 * session.c), the scheduler (sched/).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <malloc.h>
#include <netinet/in.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "model/model_tp.h"
#include "api/algo_config.h"
#include "server/callers.h"
#include "server/conn_guard.h"
#include "server/metrics.h"
#include "server/prep.h"
#include "server/server_internal.h"
#include "server/static.h"
#include "util/log.h"
#include "util/timeutil.h"

#define HUB_HIGH_WATER 65536   /* engine events waiting for the service thread before engines wait */
#define LAT_BUCKETS    256      /* event latency histogram: bucket = floor(8 * log2(1 + us)) */
#define MEM_TICK_US    (2000 * LWS_US_PER_MS) /* quiet this long after work: free pages go back */

struct server {
    const server_config *cfg;
    struct lws_context  *ctx;
    struct lws_vhost    *vh;
    int                  port;
    char                 url[300];      /* what to open in a browser: http(s)://host:port/ */
    pthread_t            service_thread;
    struct lws_protocols protocols[3];

    /* --- hub lock { engine threads -> service thread */
    pthread_mutex_t hub_lock;
    pthread_cond_t  hub_cv;        /* engines waiting at the high-water mark */
    sched_event    *hub_head, **hub_tail;
    size_t          hub_n;
    int             hub_closing;
    /* } hub lock --- */

    /* model + engines: written by the loader thread before `ready` = 1, read-only afterwards */
    atomic_int      ready;         /* 0 loading, 1 ready, -1 failed */
    int             ready_seen;    /* service thread: transition logged */
    pthread_t       loader;
    int             loader_started;
    um_err          load_err;
    model           m;
    int             model_loaded;
    backend       **bes;
    model_ctx      *ctxs;
    model_ctx     **ctxp;
    model_tp      **tps;           /* [n_engines] tensor-parallel groups (cfg->tp > 1), else NULL */
    int             n_engines;
    int             max_seq;       /* effective --max-seq (tokens), set by the loader */
    sched          *sc;

    int             stop;          /* service thread: leave the loop */

    /* service thread: event latency histogram */
    uint64_t        lat_count;
    double          lat_sum_us, lat_max_us;
    uint64_t        lat_hist[LAT_BUCKETS];

    struct ws_state *ws;
    conn_guard     *guard;         /* per-address caps, request deadlines, keep-alive idle (owned) */
    prep_pool      *prep;          /* request preparation workers (service thread submits/drains) */

    int             draining;      /* service thread: graceful shutdown in progress */
    lws_sorted_usec_list_t drain_sul;
    /* service thread: returning freed memory (memory_tick) */
    lws_sorted_usec_list_t mem_sul;
    int             mem_armed;
    uint64_t        mem_seen;      /* activity count at the previous tick */
    uint64_t        mem_trimmed;   /* activity count at the last trim */
    uint64_t        mem_trims;     /* trims done */
    size_t          mem_trimmed_bytes; /* resident bytes they gave back */
    double          drain_grace_s; /* server_set_drain (main thread before server_run) */
    void          (*drain_begin)(server *s, void *user);
    int           (*drain_idle)(server *s, void *user);
    void           *drain_user;
    void          (*on_ready)(server *s, void *user);   /* server_set_on_ready */
    void           *on_ready_user;
    void          (*on_wake)(void *user);                /* server_set_on_wake */
    void           *on_wake_user;
    void          (*batch_begin)(void *user);            /* server_set_event_batch */
    void          (*batch_end)(void *user);
    void           *batch_user;
    lws_retry_bo_t  retry;         /* WebSocket ping / hang-up policy of the vhost */

    /* instance state of the layers above (created by server_create, read-only while serving) */
    http_router    *router;        /* HTTP routes + middleware */
    metrics        *metrics;
    api_policy      policy;        /* limits, decoder defaults, default cache of every request */
    callers        *callers;       /* per-caller quotas and rate limit */
    char           *web_root;      /* realpath of --web-root (owned) */
    server_ws_auth_fn ws_auth;     /* handshake check, or NULL */
    void           *ws_auth_user;
    const server_job_hooks *job_hooks; /* async job updates for sessions (static, not owned), or NULL */
    void           *job_hooks_api;
};

/* Signals received (a second one stops at once), capped at 2. Written by on_signal, which runs on
 * whichever thread the kernel picks among those not blocking SIGINT/SIGTERM: the service thread,
 * but also threads that libraries start with the default mask (OpenBLAS's pool), so a
 * `volatile sig_atomic_t` is not enough: it is only safe against a handler on the same thread.
 * Lock-free atomics are async-signal-safe (C11 7.14.1.1). Read by the service thread. */
/* Signals are process-wide, so these two are the server's only globals (one server per process
 * receives them). */
static atomic_int g_signalled;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_POINTER_LOCK_FREE == 2, "signal handler needs lock-free atomics");
/* The context on_signal wakes: set/cleared by the service thread, read by on_signal (any thread). */
static _Atomic(struct lws_context *) g_ctx;

void server_set_drain(server *s, double grace_s, void (*begin)(server *s, void *user), int (*idle)(server *s, void *user),
                      void *user) {
    s->drain_grace_s = grace_s;
    s->drain_begin = begin;
    s->drain_idle = idle;
    s->drain_user = user;
}

void server_set_event_batch(server *s, void (*begin)(void *user), void (*end)(void *user), void *user) {
    s->batch_begin = begin;
    s->batch_end = end;
    s->batch_user = user;
}

void server_set_on_ready(server *s, void (*ready)(server *s, void *user), void *user) {
    s->on_ready = ready;
    s->on_ready_user = user;
}

void server_set_on_wake(server *s, void (*wake)(void *user), void *user) {
    s->on_wake = wake;
    s->on_wake_user = user;
}

void server_wake(server *s) {
    if (s->ctx) lws_cancel_service(s->ctx);
}

/* Also true between the signal and the loop noticing it, so no request slips in meanwhile. */
int server_draining(const server *s) {
    return s->draining || (atomic_load(&g_signalled) && s->drain_grace_s > 0 && server_ready(s));
}

/* ---------------------------------------------------------------- accessors */

const server_config *server_cfg(const server *s) { return s->cfg; }
int server_ready(const server *s) { return atomic_load(&((server *)s)->ready) == 1; }
const model *server_model(const server *s) { return server_ready(s) ? &s->m : NULL; }
sched *server_sched(server *s) { return server_ready(s) ? s->sc : NULL; }
int server_max_seq(const server *s) { return server_ready(s) ? s->max_seq : 0; }
struct ws_state *server_ws(server *s) { return s->ws; }
struct lws_context *server_lws_context(server *s) { return s->ctx; }
http_router *server_router(server *s) { return s->router; }
metrics *server_metrics(server *s) { return s->metrics; }
callers *server_callers(server *s) { return s->callers; }
conn_guard *server_conn_guard(server *s) { return s->guard; }
const api_policy *server_policy(const server *s) { return &s->policy; }

void server_set_ws_auth(server *s, server_ws_auth_fn fn, void *user) {
    s->ws_auth = fn;
    s->ws_auth_user = user;
}

void server_set_job_hooks(server *s, const server_job_hooks *hooks, void *api) {
    s->job_hooks = hooks;
    s->job_hooks_api = hooks ? api : NULL;
}

const server_job_hooks *server_job_hooks_get(server *s, void **api) {
    *api = s->job_hooks_api;
    return s->job_hooks;
}

int server_ws_auth(server *s, struct lws *wsi, char *who, size_t cap) {
    if (s->ws_auth) return s->ws_auth(s->ws_auth_user, wsi, who, cap);
    char peer[128];
    lws_get_peer_simple(wsi, peer, sizeof peer);
    snprintf(who, cap, "ip:%s", peer);
    return 1;
}

int server_submit(server *s, sched_req *r, int *queue_pos, um_err *err) {
    if (!server_ready(s)) return um_err_set(err, UM_ERR_UNSUPPORTED, "the model is still loading; retry shortly");
    return sched_submit(s->sc, r, queue_pos, err);
}

void server_cancel(server *s, sched_req *r) {
    if (s->sc) sched_cancel(s->sc, r);
}

void server_set_background(server *s, sched_req *r, int bg) {
    if (s->sc) sched_set_background(s->sc, r, bg);
}

void server_prep(server *s, prep_job *j) { prep_pool_submit(s->prep, j); }

/* prep wake-up (a preparation worker finished a job): the service loop drains it. */
static void prep_wake(void *user) {
    server *s = user;
    lws_cancel_service(s->ctx);
}

/* ---------------------------------------------------------------- event latency stats */

void server_note_event_written(server *s, uint64_t t_event_ns) {
    if (!t_event_ns) return;
    uint64_t now = time_now_ns();
    double us = now > t_event_ns ? (double)(now - t_event_ns) * 1e-3 : 0.0;
    int b = (int)(8.0 * log2(1.0 + us));
    if (b < 0) b = 0;
    if (b >= LAT_BUCKETS) b = LAT_BUCKETS - 1;
    s->lat_hist[b]++;
    s->lat_count++;
    s->lat_sum_us += us;
    metrics_event_overhead(s->metrics, us * 1e-6);
    if (us > s->lat_max_us) s->lat_max_us = us;
}

static double lat_quantile(const server *s, double q) {
    if (!s->lat_count) return 0;
    uint64_t want = (uint64_t)ceil(q * (double)s->lat_count), acc = 0;
    for (int b = 0; b < LAT_BUCKETS; b++) {
        acc += s->lat_hist[b];
        if (acc >= want) { /* bucket midpoint (log scale), never above the largest value seen */
            double v = exp2(((double)b + 0.5) / 8.0) - 1.0;
            return v < s->lat_max_us ? v : s->lat_max_us;
        }
    }
    return s->lat_max_us;
}

void server_get_event_stats(const server *s, server_event_stats *out) {
    out->count = s->lat_count;
    out->mean_us = s->lat_count ? s->lat_sum_us / (double)s->lat_count : 0;
    out->p50_us = lat_quantile(s, 0.50);
    out->p99_us = lat_quantile(s, 0.99);
    out->max_us = s->lat_max_us;
}

void server_get_conn_stats(const server *s, server_conn_stats *out) {
    memset(out, 0, sizeof *out);
    if (s->ws) ws_get_conn_stats(s->ws, out);
    if (s->guard) {
        conn_guard_stats g;
        conn_guard_get_stats(s->guard, &g);
        out->open = g.open;
        out->addresses = g.addresses;
        out->refused = g.refused;
        out->request_timeouts = g.timed_out;
        out->idle_closed = g.idle_closed;
    }
}

/* ---------------------------------------------------------------- memory */

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, resident = 0;
    int n = f ? fscanf(f, "%lu %lu", &size, &resident) : 0;
    if (f) fclose(f);
    return n == 2 ? (size_t)resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

void server_get_mem_stats(const server *s, server_mem_stats *out) {
    out->rss_bytes = rss_bytes();
    out->trims = s->mem_trims;
    out->trimmed_bytes = s->mem_trimmed_bytes;
}

/* What frees memory in bulk: requests that ended, WebSocket connections and sessions that ended. */
static uint64_t activity(server *s) {
    sched_stats st;
    sched_get_stats(s->sc, &st);
    server_conn_stats cs;
    server_get_conn_stats(s, &cs);
    return st.submitted + st.rejected + st.finished + st.cancelled + st.failed + cs.ws_ended;
}

/* Every 2 s: when something ended since the last trim, nothing happened for a whole tick, and no
 * request runs, waits or is being prepared, return the heap's free pages to the OS (once per quiet
 * period; a trim holds each malloc arena's lock for a moment, so never while requests run). */
static void memory_tick(lws_sorted_usec_list_t *sul) {
    server *s = lws_container_of(sul, server, mem_sul);
    s->mem_armed = 0;
    if (s->draining || s->stop) return;
    if (server_ready(s)) {
        uint64_t now = activity(s);
        sched_stats st;
        sched_get_stats(s->sc, &st);
        if (now == s->mem_seen && now != s->mem_trimmed && st.active == 0 && st.queued == 0 &&
            prep_pool_busy(s->prep) == 0) {
            size_t before = rss_bytes();
            double t0 = time_now_s();
#if defined(__GLIBC__)
            malloc_trim(0);
#endif
            size_t after = rss_bytes();
            s->mem_trims++;
            s->mem_trimmed = now;
            if (after < before) s->mem_trimmed_bytes += before - after;
            log_debug("quiet: returned freed memory to the OS, resident %.1f -> %.1f MB (%.1f ms)", (double)before / 1e6,
                      (double)after / 1e6, (time_now_s() - t0) * 1e3);
        }
        s->mem_seen = now;
    }
    lws_sul_schedule(s->ctx, 0, &s->mem_sul, memory_tick, MEM_TICK_US);
    s->mem_armed = 1;
}

/* ---------------------------------------------------------------- hub */

/* sched emit callback: engine threads (and the service thread for cancels of queued requests). */
static void hub_emit(void *user, sched_event *ev) {
    server *s = user;
    ev->next = NULL;
    int on_service = pthread_equal(pthread_self(), s->service_thread);
    /* --- hub lock { */
    pthread_mutex_lock(&s->hub_lock);
    while (!on_service && s->hub_n >= HUB_HIGH_WATER && !s->hub_closing) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->hub_cv, &s->hub_lock, &ts);
    }
    *s->hub_tail = ev;
    s->hub_tail = &ev->next;
    s->hub_n++;
    pthread_mutex_unlock(&s->hub_lock);
    /* } hub lock --- */
    lws_cancel_service(s->ctx);
}

/* Deliver one event to its request's owner; frees the request after its final event. */
static void hub_deliver(sched_event *ev) {
    sched_req *r = ev->req;
    int final = ev->final;
    if (r->deliver) r->deliver(r, ev);
    else sched_event_free(ev);
    if (final) sched_req_free(r);
}

static int host_is_any(const char *h) { return !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "*"); }
static int host_is_loopback(const char *h) {
    return !strcmp(h, "localhost") || !strncmp(h, "127.", 4) || !strcmp(h, "::1");
}

/* On a terminal, once the model is ready: the URL to open, last and easy to spot. */
static void print_ready_banner(const server *s) {
    if (!isatty(STDOUT_FILENO)) return;
    const int w = (int)strlen(s->url) + 24;
    printf("\n  \x1b[1m+");
    for (int i = 0; i < w; i++) putchar('-');
    printf("+\n  |  unmask is ready:  \x1b[4m%s\x1b[24m    |\n  +", s->url);
    for (int i = 0; i < w; i++) putchar('-');
    printf("+\x1b[0m\n  open it in a browser; Ctrl+C stops the server%s\n\n",
           host_is_loopback(s->cfg->host) ? " (other machines: --host 0.0.0.0)" : "");
    fflush(stdout);
}

void server_on_wake(server *s) {
    int st = atomic_load(&s->ready);
    if (st != 0 && !s->ready_seen) {
        s->ready_seen = 1;
        if (st == 1) {
            log_info("model ready: %s (%d engine%s, max batch %d)", s->cfg->model, s->n_engines,
                     s->n_engines == 1 ? "" : "s", s->cfg->max_batch);
            print_ready_banner(s);
            if (s->on_ready) s->on_ready(s, s->on_ready_user);
        } else {
            log_error("model load failed: %s", s->load_err.msg);
            s->stop = 1;
        }
    }
    /* wake-ups coalesce: take everything that is pending */
    /* --- hub lock { */
    pthread_mutex_lock(&s->hub_lock);
    sched_event *ev = s->hub_head;
    s->hub_head = NULL;
    s->hub_tail = &s->hub_head;
    s->hub_n = 0;
    pthread_cond_broadcast(&s->hub_cv);
    pthread_mutex_unlock(&s->hub_lock);
    /* } hub lock --- */
    const int batch = ev && s->batch_begin;
    if (batch) s->batch_begin(s->batch_user);
    while (ev) {
        sched_event *next = ev->next;
        ev->next = NULL;
        hub_deliver(ev);
        ev = next;
    }
    if (batch) s->batch_end(s->batch_user);
    prep_pool_drain(s->prep); /* prepared requests: submitted (accepted) or refused now */
    if (s->ws) ws_state_on_wake(s->ws); /* followed sessions' live events (Redis pub/sub) */
    if (s->on_wake) s->on_wake(s->on_wake_user);
}

/* ---------------------------------------------------------------- loader thread */

/* sched step observer (engine threads): one batched decode step -> the step-latency histogram. */
static void on_sched_step(void *user, double step_ms, int batch) {
    server *s = user;
    (void)batch;
    metrics_step_latency(s->metrics, step_ms * 1e-3);
}

/* CPU compute threads of one rank: --threads split over every rank of every replica (0 = the
 * machine's cores split the same way, so --tp ranks do not oversubscribe the cores). */
static int threads_per_rank(const server_config *c, int ranks) {
    if (c->threads > 0) return (c->threads + ranks - 1) / ranks;
    if (ranks <= 1) return 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / ranks) : 1;
    return t > 0 ? t : 1;
}

/* The TP options of replica `rep` on this node (devices point into devs[][64]). */
static void tp_opts_of(const server_config *c, int rep, int threads, uint64_t fit_tokens, char (*devs)[64],
                       model_tp_opts *o) {
    memset(o, 0, sizeof *o);
    const int L = server_config_local_ranks(c);
    o->tp = c->tp;
    o->n_local = L;
    o->n_threads = threads;
    o->fit_tokens = fit_tokens;
    o->fit_kv_rows = fit_tokens;   /* every canvas an engine runs at once may hold a KV cache */
    o->max_batch = c->max_batch;   /* max_seq: set by the caller (the effective one) */
    o->dist = (comm_dist_opts){.init_addr = c->dist_init_addr, .nnodes = c->nnodes, .node_rank = c->node_rank};
    for (int j = 0; j < L && j < MODEL_TP_MAX_LOCAL; j++) {
        if (server_config_is_cuda(c)) server_config_engine_device(c, rep * L + j, devs[j], 64);
        else snprintf(devs[j], 64, "cpu");
        o->devices[j] = devs[j];
    }
}

/* Canvas tokens of the largest forward an engine can run, which the fit check sizes activations
 * for: every batch slot holding a max_seq canvas, twice over — a request with classifier-free
 * guidance (cfg_scale > 0, any client may ask) forwards its unconditional canvas in the same
 * batch (decode_step, decode_seq_forward_tokens). The same positions may all hold KV caches
 * (decode_params.cache, any client may ask): the fit check reserves those too. */
static uint64_t fit_tokens_of(const server_config *c, int max_seq) {
    return 2u * (uint64_t)c->max_batch * (uint64_t)max_seq;
}

/* LM-head rows one engine's device-resident decode batch may keep on the GPU (sched_opts.device_rows,
 * reserved by the fit check): every batch slot with the model's default block length. Requests
 * asking for longer blocks still run, on the host loop once the budget is used. */
static int device_rows_of(const server_config *c, const model *m) {
    const decode_params p = decode_params_for_model(m);
    return c->max_batch * (p.block_length > 0 ? p.block_length : 32);
}

/* --cpu-pin, --cuda-fuse and --cuda-skinny: the options of every backend this process opens from now on. */
static void backend_options_select_of(const server_config *c) {
    backend_options o = {.cpu_pin = c->cpu_pin, .cuda_unfused = !c->cuda_fuse, .cuda_skinny = c->cuda_skinny};
    backend_options_select(&o);
}

/* --max-seq against the model: the effective limit, or -1 + err. */
static int effective_max_seq(const server_config *c, const model *m, um_err *err) {
    if (c->max_seq > m->cfg.max_seq)
        return um_err_param(err, "max_seq",
                            "--max-seq %d exceeds the model's maximum sequence length %d (max_sequence_length in %s/"
                            "config.json)",
                            c->max_seq, m->cfg.max_seq, c->model);
    return c->max_seq > 0 ? c->max_seq : m->cfg.max_seq;
}

static void *loader_main(void *arg) {
    server *s = arg;
    const server_config *c = s->cfg;
    um_err *err = &s->load_err;
    uint64_t t0 = time_now_ns();
    if (model_load(c->model, &s->m, err) != 0) goto fail;
    s->model_loaded = 1;
    api_policy_bind(&s->policy, &s->m); /* the serving defaults, once: requests copy them */
    CHECK(model_quant_parse(c->quant, &s->m.quant) == 0);   /* server_config_check validated it */
    backend_options_select_of(c);
    if (!s->m.tok) log_warn("%s has no tokenizer: only prompt_ids requests will work", c->model);
    if ((s->max_seq = effective_max_seq(c, &s->m, err)) < 0) goto fail;
    if (c->tp > 1 && model_tp_check(&s->m, c->tp, err) != 0) goto fail;
    const uint64_t fit_tokens = fit_tokens_of(c, s->max_seq);
    s->n_engines = server_config_replicas(c);
    const int ranks = s->n_engines * (c->tp > 1 ? server_config_local_ranks(c) : 1);
    s->bes = xcalloc((size_t)s->n_engines, sizeof *s->bes);
    s->ctxs = xcalloc((size_t)s->n_engines, sizeof *s->ctxs);
    s->ctxp = xcalloc((size_t)s->n_engines, sizeof *s->ctxp);
    s->tps = xcalloc((size_t)s->n_engines, sizeof *s->tps);
    for (int i = 0; i < s->n_engines; i++) {
        const int threads = threads_per_rank(c, ranks);
        if (c->tp > 1) {
            char devs[MODEL_TP_MAX_LOCAL][64];
            model_tp_opts o;
            tp_opts_of(c, i, threads, fit_tokens, devs, &o);
            o.max_seq = s->max_seq;
            s->tps[i] = model_tp_create(&s->m, &o, err);
            if (!s->tps[i]) {
                um_err_prefix(err, "engine %d (tp %d)", i, c->tp);
                goto fail;
            }
            s->ctxp[i] = model_tp_leader(s->tps[i]);
            continue;
        }
        char dev[64];
        server_config_engine_device(c, i, dev, sizeof dev);
        s->bes[i] = backend_init_device(dev, threads, err);
        if (!s->bes[i]) {
            um_err_prefix(err, "engine %d (%s)", i, dev);
            goto fail;
        }
        if (model_fit_check(s->bes[i], &s->m, 1, fit_tokens, c->device_loop ? (uint64_t)device_rows_of(c, &s->m) : 0,
                            fit_tokens, err) != 0) {
            um_err_prefix(err, "engine %d (--max-batch %d x --max-seq %d)", i, c->max_batch, s->max_seq);
            goto fail;
        }
        if (model_ctx_init(&s->ctxs[i], &s->m, s->bes[i], err) != 0) {
            um_err_prefix(err, "engine %d", i);
            goto fail;
        }
        s->ctxp[i] = &s->ctxs[i];
    }
    sched_opts so = {.max_batch = c->max_batch,
                     .max_queue = c->max_queue,
                     .max_paused = c->max_paused < 0 ? c->max_batch : c->max_paused,
                     .kv_rows = (long)fit_tokens,   /* paused caches live within what the fit check reserved */
                     .host_loop = !c->device_loop,
                     .device_rows = device_rows_of(c, &s->m),
                     .on_step = on_sched_step,
                     .on_step_user = s};
    s->sc = sched_create(s->ctxp, s->n_engines, &so, hub_emit, s);
    log_info("loaded %s in %.0f ms: %d replica%s x tp %d%s, max seq %d", c->model, time_ms_since(t0), s->n_engines,
             s->n_engines == 1 ? "" : "s", c->tp, c->nnodes > 1 ? " (multi-node)" : "", s->max_seq);
    atomic_store(&s->ready, 1);
    lws_cancel_service(s->ctx);
    return NULL;
fail:
    if (err->code == UM_ERR_CANCELLED && comm_stop_signal()) {
        /* SIGINT/SIGTERM interrupted the multi-node rendezvous: a requested stop, not a failed start
         * (the service loop is leaving already; the exit code stays 0) */
        log_warn("stopped before the tensor-parallel group formed: %s", err->msg);
        lws_cancel_service(s->ctx);
        return NULL;
    }
    atomic_store(&s->ready, -1);
    lws_cancel_service(s->ctx);
    return NULL;
}

int server_follow(const server_config *c, um_err *err) {
    model m;
    if (model_load(c->model, &m, err) != 0) return 1;
    CHECK(model_quant_parse(c->quant, &m.quant) == 0);
    backend_options_select_of(c);
    int rc = 1;
    if (effective_max_seq(c, &m, err) < 0) goto out;
    char devs[MODEL_TP_MAX_LOCAL][64];
    model_tp_opts o;
    const int ms = c->max_seq > 0 ? c->max_seq : m.cfg.max_seq;
    tp_opts_of(c, 0, threads_per_rank(c, server_config_local_ranks(c)), fit_tokens_of(c, ms), devs, &o);
    o.max_seq = ms;
    printf("unmask: node %d of %d joining the tensor-parallel group (tp %d, ranks %d..%d here) at %s\n", c->node_rank,
           c->nnodes, c->tp, c->node_rank * o.n_local, c->node_rank * o.n_local + o.n_local - 1, c->dist_init_addr);
    fflush(stdout);
    if (model_tp_follow(&m, &o, err) != 0) {
        if (err->code == UM_ERR_CANCELLED && comm_stop_signal()) {   /* SIGINT/SIGTERM during the rendezvous */
            printf("unmask: node %d: stopped before the group formed (%s)\n", c->node_rank, err->msg);
            rc = 0;
        }
        goto out;
    }
    if (comm_stop_signal())
        printf("unmask: node %d: stopped by %s: node 0 stopped the group; exiting\n", c->node_rank,
               comm_stop_signal() == SIGINT ? "SIGINT" : "SIGTERM");
    else
        printf("unmask: node %d: node 0 stopped the group; exiting\n", c->node_rank);
    fflush(stdout);
    rc = 0;
out:
    model_free(&m);
    return rc;
}

static void engines_free(server *s) {
    if (s->sc) sched_free(s->sc);
    s->sc = NULL;
    for (int i = 0; i < s->n_engines; i++) {
        if (s->tps && s->tps[i]) model_tp_free(s->tps[i]);   /* stops its followers, frees the leader */
        else if (s->ctxp && s->ctxp[i]) model_ctx_free(&s->ctxs[i]);
        if (s->bes && s->bes[i]) backend_free(s->bes[i]);
    }
    free(s->tps);
    s->tps = NULL;
    free(s->bes);
    free(s->ctxs);
    free(s->ctxp);
    s->bes = NULL, s->ctxs = NULL, s->ctxp = NULL;
    if (s->model_loaded) model_free(&s->m);
    s->model_loaded = 0;
}

/* ---------------------------------------------------------------- lws setup */

static void lws_log_emit(int level, const char *line) {
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
    log_msg(level == LLL_ERR ? LOG_LEVEL_ERROR : level == LLL_WARN ? LOG_LEVEL_WARN : LOG_LEVEL_DEBUG, "lws: %.*s",
            (int)n, line);
}

static void on_signal(int sig) {
    int n = atomic_load(&g_signalled);
    while (n < 2 && !atomic_compare_exchange_weak(&g_signalled, &n, n + 1)) {}
    comm_stop_request(sig);   /* interrupts a multi-node rendezvous the loader may be waiting in */
    struct lws_context *ctx = atomic_load(&g_ctx);
    if (ctx) lws_cancel_service(ctx);
}

/* While draining: wake the loop every 100 ms so it can check idleness and the deadline. */
static void drain_tick(lws_sorted_usec_list_t *sul) {
    server *s = lws_container_of(sul, server, drain_sul);
    lws_sul_schedule(s->ctx, 0, &s->drain_sul, drain_tick, 100 * LWS_US_PER_MS);
}


/* --cache: auto or a mode name. */
static int cache_setting(const char *v, int *out, um_err *err) {
    enum decode_cache c;
    *out = DECODE_CACHE_AUTO;
    if (!v || strcmp(v, "auto") == 0) return 0;
    if (decode_cache_parse(v, &c) != 0)
        return um_err_param(err, "cache", "--cache must be auto, none, prefix, dual or vicinity, got '%s'", v);
    *out = (int)c;
    return 0;
}

/* --host as the numeric address lws binds ("localhost" is 127.0.0.1). */
static const char *listen_host(const server_config *cfg) {
    return !strcmp(cfg->host, "localhost") ? "127.0.0.1" : cfg->host;
}

/* The request policy of every transport from the settings. */
static int policy_setup(server *s, um_err *err) {
    const server_config *cfg = s->cfg;
    api_policy_init(&s->policy);
    s->policy.lim.max_gen_length = cfg->max_gen_length;
    s->policy.lim.max_prompt_tokens = cfg->max_prompt_tokens;
    s->policy.lim.max_seq = cfg->max_seq; /* 0 = the model's context */
    if (cache_setting(cfg->cache, &s->policy.cache, err) != 0) return -1;
    if (cfg->algorithm_config && algo_config_load(cfg->algorithm_config, &s->policy.algo, err) != 0) return -1;
    enum decode_decoder d;
    if (cfg->dllm_algorithm && decode_decoder_parse_any(cfg->dllm_algorithm, &d) == 0) { /* checked by the config */
        if (!s->policy.algo) s->policy.algo = json_object();
        const char *named = json_string_value(json_object_get(s->policy.algo, "decoder"));
        if (named && strcmp(named, decode_decoder_name(d)) != 0)
            return um_err_param(err, "dllm_algorithm",
                                "--dllm-algorithm %s is the %s decoder, but %s names algorithm %s; give the algorithm once",
                                cfg->dllm_algorithm, decode_decoder_name(d), cfg->algorithm_config, named);
        json_object_set_new(s->policy.algo, "decoder", json_string(decode_decoder_name(d)));
    }
    return 0;
}

server *server_create(const server_config *cfg, um_err *err) {
    server *s = xcalloc(1, sizeof *s);
    s->cfg = cfg;
    atomic_init(&s->ready, 0);
    pthread_mutex_init(&s->hub_lock, NULL);
    pthread_cond_init(&s->hub_cv, NULL);
    s->hub_tail = &s->hub_head;
    s->router = http_router_new(s, cfg);
    s->metrics = metrics_new();
    s->callers = callers_new(cfg);
    if (!(s->guard = conn_guard_new(cfg, s->metrics, err))) {
        server_free(s);
        return NULL;
    }
    /* the listen address must be a numeric address lws can bind (it defers unusable ones silently) */
    const char *host = listen_host(cfg);
    unsigned char abuf[16];
    if (!host_is_any(host) && inet_pton(strchr(host, ':') ? AF_INET6 : AF_INET, host, abuf) != 1) {
        um_err_param(err, "host", "--host must be a numeric IPv4/IPv6 address or localhost, got '%s'", cfg->host);
        server_free(s);
        return NULL;
    }
    if (!(s->web_root = static_root_resolve(cfg->web_root, err)) || policy_setup(s, err) != 0) {
        server_free(s);
        return NULL;
    }
    http_router_set_limits(s->router, s->guard, s->web_root);
    conn_guard_set_late_body(s->guard, http_request_timeout);
    routes_core_register(s);
    s->ws = ws_state_create(s);
    return s;
}

/* Why a listening socket on host:port cannot be opened: the errno of bind(), or 0 when it can. */
static int bind_errno(const char *host, int is_v6, int port) {
    int fd = socket(is_v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as lws does: TIME_WAIT is no conflict */
    int rc;
    if (is_v6) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        if (!host_is_any(host)) inet_pton(AF_INET6, host, &a.sin6_addr);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        if (!host_is_any(host)) inet_pton(AF_INET, host, &a.sin_addr);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    int e = rc == 0 ? 0 : errno;
    close(fd);
    return e;
}

/* The lws context and vhost (plain or TLS) on --host:--port, the preparation workers, the signal
 * handlers; prints the URL. -1 with err when the port cannot be opened. */
static int server_listen(server *s, um_err *err) {
    const server_config *cfg = s->cfg;
    const char *host = listen_host(cfg);
    const int is_v6 = strchr(host, ':') != NULL;
    lws_set_log_level(LLL_ERR | (cfg->verbose ? LLL_WARN | LLL_NOTICE : 0), lws_log_emit);

    s->protocols[0] = (struct lws_protocols){"http", http_lws_cb, http_conn_size(), 0, 0, NULL, 0};
    s->protocols[1] = (struct lws_protocols){"unmask", ws_lws_cb, ws_conn_size(), 65536, 0, NULL, 0};
    static const struct lws_protocol_vhost_options pvo_default = {NULL, NULL, "default", "1"};
    static const struct lws_protocol_vhost_options pvo = {NULL, &pvo_default, "unmask", ""};
    s->retry.secs_since_valid_ping = (uint16_t)cfg->ping_interval_s;
    s->retry.secs_since_valid_hangup = (uint16_t)(cfg->ping_interval_s + 10);

    struct lws_context_creation_info info;
    memset(&info, 0, sizeof info);
    info.options = LWS_SERVER_OPTION_EXPLICIT_VHOSTS | LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT |
                   LWS_SERVER_OPTION_VALIDATE_UTF8; /* a context option: text frames must be UTF-8 (1007) */
    info.user = s;
    /* request heads: HTTP_HEADER_BYTES in all (beyond it lws closes the connection without an
     * answer), each header cut at HTTP_TOKEN_LIMIT (http.c answers 431 / 414 for a cut one) */
    static struct lws_token_limits token_limits;
    for (int t = 0; t < WSI_TOKEN_COUNT; t++) token_limits.token_limit[t] = HTTP_TOKEN_LIMIT;
    info.token_limits = &token_limits;
    info.max_http_header_data = HTTP_HEADER_BYTES;
    info.server_string = "unmask";
    /* lws's own network timeouts (TLS handshake, body inactivity) are backstops behind the request
     * deadline of conn_guard.c, which answers: a little longer than it */
    info.timeout_secs = (unsigned)ceil(cfg->request_timeout_s) + 5;
    atomic_store(&g_ctx, NULL);
    s->ctx = lws_create_context(&info);
    if (!s->ctx) return um_err_set(err, UM_ERR_RESOURCE, "cannot create the libwebsockets context");
    conn_guard_start(s->guard, s->ctx);

    memset(&info, 0, sizeof info);
    info.vhost_name = "unmask";
    info.user = s->router; /* the HTTP layer's view of this server (http.h) */
    info.port = cfg->port;
    info.iface = host_is_any(host) ? NULL : host;
    info.protocols = s->protocols;
    info.pvo = &pvo;
    info.options = LWS_SERVER_OPTION_HTTP_HEADERS_SECURITY_BEST_PRACTICES_ENFORCE;
    if (!is_v6 && strcmp(host, "::") != 0) info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.retry_and_idle_policy = &s->retry;
    /* heads and idle keep-alive connections: conn_guard.c's deadlines first, lws's as backstops */
    info.timeout_secs_ah_idle = (unsigned)ceil(cfg->request_timeout_s) + 5;
    info.keepalive_timeout = (int)ceil(cfg->keepalive_timeout_s + cfg->request_timeout_s) + 5;
    /* a request with a method lws does not know reaches http.c as raw bytes (answered 405), as
     * CONNECT always does, instead of lws's own text 403 */
    info.options |= LWS_SERVER_OPTION_FALLBACK_TO_APPLY_LISTEN_ACCEPT_CONFIG;
    info.ssl_info_event_mask = SSL_CB_HANDSHAKE_DONE; /* LWS_CALLBACK_SSL_INFO: conn_guard.c */
    info.alpn = "http/1.1";
    if (cfg->tls_cert) {
        info.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
        info.ssl_cert_filepath = cfg->tls_cert;
        info.ssl_private_key_filepath = cfg->tls_key;
        /* TLS 1.2+ only; on 1.2 only forward-secret AEAD suites (no CBC, no static RSA); 1.3 keeps
         * OpenSSL's defaults (all AEAD). HSTS on every response. */
        info.ssl_options_set = SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 | SSL_OP_NO_TLSv1_1 |
                               SSL_OP_CIPHER_SERVER_PREFERENCE;
        info.ssl_cipher_list = TLS12_CIPHERS;
        info.options |= LWS_SERVER_OPTION_STS;
    }
    /* a failure here is reported by us, below: keep lws's own "ERROR on binding fd ..." lines out */
    lws_set_log_level(cfg->verbose ? LLL_ERR | LLL_WARN | LLL_NOTICE : 0, lws_log_emit);
    s->vh = lws_create_vhost(s->ctx, &info);
    lws_set_log_level(LLL_ERR | (cfg->verbose ? LLL_WARN | LLL_NOTICE : 0), lws_log_emit);
    if (!s->vh) {
        int e = bind_errno(host, is_v6, cfg->port);
        if (e == EADDRINUSE)
            um_err_set(err, UM_ERR_IO,
                       "cannot listen on %s:%d: the port is already in use (another server is listening there); "
                       "choose another with --port N, or --port 0 for any free port",
                       cfg->host, cfg->port);
        else if (e)
            um_err_set(err, UM_ERR_IO, "cannot listen on %s:%d: %s", cfg->host, cfg->port, strerror(e));
        else if (cfg->tls_cert)
            um_err_set(err, UM_ERR_IO, "cannot listen on %s:%d with TLS: --tls-cert %s / --tls-key %s could not be "
                       "loaded (unreadable, not PEM, or the key does not match the certificate)",
                       cfg->host, cfg->port, cfg->tls_cert, cfg->tls_key);
        else
            um_err_set(err, UM_ERR_IO, "cannot listen on %s:%d", cfg->host, cfg->port);
        lws_context_destroy(s->ctx);
        s->ctx = NULL;
        return -1;
    }
    s->port = lws_get_vhost_listen_port(s->vh);
    atomic_store(&g_ctx, s->ctx);
    s->prep = prep_pool_create(cfg->prep_workers, prep_wake, s);

    comm_stop_init();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *shown = host_is_any(host) ? "127.0.0.1" : host;
    snprintf(s->url, sizeof s->url, "%s://%s%s%s:%d/", cfg->tls_cert ? "https" : "http", is_v6 ? "[" : "", shown,
             is_v6 ? "]" : "", s->port);
    printf("unmask: listening on %s  (open this URL in a browser; WebSocket at /ws)\n", s->url);
    fflush(stdout);
    return 0;
}

/* The model loader thread (it never takes signals). */
static void loader_start(server *s) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&s->loader, NULL, loader_main, s) != 0) UM_FATAL("cannot start the loader thread");
    s->loader_started = 1;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* One check of a drain in progress: 1 when the loop should end (everything finished, the
 * deadline passed, or a second signal). */
static int drain_done(server *s, double deadline) {
    server_on_wake(s); /* events still in the hub are work in flight too */
    sched_stats st;
    sched_get_stats(s->sc, &st);
    if (atomic_load(&g_signalled) > 1) return 1;
    if (st.queued == 0 && st.active == 0 && prep_pool_busy(s->prep) == 0 && http_responses_in_flight(s->router) == 0 &&
        ws_flushed(s->ws) && (!s->drain_idle || s->drain_idle(s, s->drain_user))) {
        log_info("drained: every request finished");
        return 1;
    }
    if (time_now_s() >= deadline) {
        log_warn("drain deadline passed: cancelling %d running and %d queued requests", st.active, st.queued);
        return 1;
    }
    return 0;
}

/* The service loop, until a signal (and the drain it starts, if any) or a fatal lws error. */
static void server_loop(server *s) {
    double drain_deadline = 0;
    while (!s->stop) {
        if (atomic_load(&g_signalled) && !s->draining) {
            if (s->drain_grace_s <= 0 || !server_ready(s)) break;
            s->draining = 1;
            drain_deadline = time_now_s() + s->drain_grace_s;
            log_info("draining: new work is refused; finishing running requests (up to %.0f s; signal again to stop now)",
                     s->drain_grace_s);
            if (s->drain_begin) s->drain_begin(s, s->drain_user);
            lws_sul_schedule(s->ctx, 0, &s->drain_sul, drain_tick, 100 * LWS_US_PER_MS);
        }
        if (s->draining && drain_done(s, drain_deadline)) break;
        if (lws_service(s->ctx, 0) < 0) break;
    }
}

/* Orderly stop: join the loader, stop the engines (what is left ends "cancelled"), deliver the
 * last events, say goodbye to WebSocket clients (bounded), destroy the lws context. */
static void server_teardown(server *s) {
    log_info("stopping%s", atomic_load(&g_signalled) ? " (signal)" : "");
    pthread_join(s->loader, NULL);
    s->loader_started = 0;
    if (s->sc) {
        sched_stop(s->sc);      /* engines joined: nothing produces events any more */
        sched_finish_all(s->sc); /* remaining requests end with "cancelled" */
    }
    prep_pool_stop(s->prep);     /* requests still being prepared are refused (scheduler stopped) */
    server_on_wake(s);           /* deliver what is left (frees finished requests) */
    /* goodbye: WebSocket clients get what their sessions still hold, then a 1001 close (bounded) */
    if (ws_close_all(s->ws) > 0) {
        if (!s->draining) lws_sul_schedule(s->ctx, 0, &s->drain_sul, drain_tick, 100 * LWS_US_PER_MS);
        s->draining = 1;
        double t_end = time_now_s() + 2.0;
        while (ws_n_conns(s->ws) > 0 && time_now_s() < t_end && atomic_load(&g_signalled) < 2)
            if (lws_service(s->ctx, 0) < 0) break;
    }
    if (s->draining) lws_sul_cancel(&s->drain_sul);
    if (s->mem_armed) lws_sul_cancel(&s->mem_sul);
    s->mem_armed = 0;
    prep_pool_drain(s->prep);    /* requests that arrived meanwhile (refused: workers stopped) */
    atomic_store(&g_ctx, NULL);
    /* --- hub lock { */
    pthread_mutex_lock(&s->hub_lock);
    s->hub_closing = 1;
    pthread_mutex_unlock(&s->hub_lock);
    /* } hub lock --- */
    ws_state_shutdown(s->ws);    /* no lws timers may outlive the context */
    conn_guard_stop(s->guard);
    lws_context_destroy(s->ctx); /* closes every connection (sessions detach) */
    s->ctx = NULL;
}

int server_run(server *s, um_err *err) {
    s->service_thread = pthread_self();
    if (server_listen(s, err) != 0) return 1;
    loader_start(s);
    lws_sul_schedule(s->ctx, 0, &s->mem_sul, memory_tick, MEM_TICK_US);
    s->mem_armed = 1;
    server_loop(s);
    int rc = atomic_load(&s->ready) == -1 ? 1 : 0;
    if (rc) *err = s->load_err;
    server_teardown(s);
    return rc;
}

void server_free(server *s) {
    if (!s) return;
    if (s->loader_started) pthread_join(s->loader, NULL);
    if (s->prep) {
        prep_pool_stop(s->prep);
        prep_pool_drain(s->prep);
        prep_pool_free(s->prep);
    }
    if (s->ws) ws_state_free(s->ws);
    engines_free(s);
    http_router_free(s->router);
    metrics_free(s->metrics);
    callers_free(s->callers);
    conn_guard_free(s->guard);
    api_policy_free(&s->policy);
    free(s->web_root);
    pthread_cond_destroy(&s->hub_cv);
    pthread_mutex_destroy(&s->hub_lock);
    free(s);
}
