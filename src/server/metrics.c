/*
 * metrics.c — Prometheus counters / gauges / histograms of one server (see metrics.h).
 * Thread-safe: one mutex per instance.
 */
#include "server/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"
#include "util/strbuf.h"

/* ---------------------------------------------------------------- storage */

typedef struct labelled {
    char   labels[192];   /* rendered label set, e.g. route="/v1/models",method="GET",status="200" */
    double value;
} labelled;

typedef struct counter_vec {
    const char *name, *help;
    labelled   *items;    /* [n], owned */
    int         n, cap;
} counter_vec;

#define HIST_BUCKETS 14
typedef struct histogram {
    const char *name, *help;
    double      le[HIST_BUCKETS];     /* upper bounds, seconds, ascending (+Inf implied) */
    double      counts[HIST_BUCKETS]; /* non-cumulative counts per bucket */
    double      inf_count;            /* above the last bound */
    double      sum;
    double      count;
} histogram;

typedef struct gauge {
    char            *name, *help;     /* owned */
    metrics_gauge_fn fn;
    void            *user;
} gauge;

struct metrics {
    pthread_mutex_t lock;
    /* --- lock { */
    counter_vec http, finished, webhooks, conn_limits;
    double      prompt_tokens, gen_tokens, steps;
    double      ws_follow_pubsub; /* followed sessions' events that arrived through Redis pub/sub */
    histogram   step_lat, evt_overhead;
    gauge      *gauges;   /* [n_gauges], owned */
    int         n_gauges;
    /* } lock --- */
};

static const histogram k_step_lat = {
    "unmask_step_latency_seconds", "Time of one batched denoising step (one forward + decoders): wall time on the host loop, GPU time (cudaEvent) on the device-resident loop.",
    {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}, {0}, 0, 0, 0};
static const histogram k_evt_overhead = {
    "unmask_event_overhead_seconds",
    "Per streamed event: time from the engine producing it to its bytes reaching the socket.",
    {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1},
    {0}, 0, 0, 0};

metrics *metrics_new(void) {
    metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    m->http = (counter_vec){"unmask_http_requests_total", "HTTP responses by route pattern, method and status.", NULL, 0, 0};
    m->finished = (counter_vec){"unmask_requests_finished_total", "Generation sequences finished, by finish reason.", NULL, 0, 0};
    m->webhooks = (counter_vec){"unmask_webhook_deliveries_total", "Webhook delivery attempts by result.", NULL, 0, 0};
    m->conn_limits = (counter_vec){"unmask_connection_limits_total",
                                   "Connections refused or closed by a connection limit: per_address (at accept), "
                                   "request_timeout, keepalive_idle.", NULL, 0, 0};
    m->step_lat = k_step_lat;
    m->evt_overhead = k_evt_overhead;
    return m;
}

void metrics_free(metrics *m) {
    if (!m) return;
    metrics_gauge_unregister_all(m);
    free(m->http.items);
    free(m->finished.items);
    free(m->webhooks.items);
    free(m->conn_limits.items);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* Label values: escape backslash, quote and newline (exposition format rules). */
static void label_escape(char *dst, size_t cap, const char *v) {
    size_t o = 0;
    for (; *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') dst[o++] = '\\', dst[o++] = *v;
        else if (*v == '\n') dst[o++] = '\\', dst[o++] = 'n';
        else dst[o++] = *v;
    }
    dst[o] = 0;
}

static void counter_add(counter_vec *c, const char *labels, double v) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->items[i].labels, labels) == 0) {
            c->items[i].value += v;
            return;
        }
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 16;
        c->items = xrealloc(c->items, (size_t)c->cap * sizeof *c->items);
    }
    snprintf(c->items[c->n].labels, sizeof c->items[c->n].labels, "%s", labels);
    c->items[c->n].value = v;
    c->n++;
}

static void hist_observe(histogram *h, double v) {
    int i = 0;
    while (i < HIST_BUCKETS && v > h->le[i]) i++;
    if (i < HIST_BUCKETS) h->counts[i] += 1;
    else h->inf_count += 1;
    h->sum += v;
    h->count += 1;
}

static void hist_reset(histogram *h) {
    memset(h->counts, 0, sizeof h->counts);
    h->inf_count = h->sum = h->count = 0;
}

/* ---------------------------------------------------------------- updates */

void metrics_reset(metrics *m) {
    pthread_mutex_lock(&m->lock);
    m->http.n = m->finished.n = m->webhooks.n = m->conn_limits.n = 0;
    m->prompt_tokens = m->gen_tokens = m->steps = 0;
    m->ws_follow_pubsub = 0;
    hist_reset(&m->step_lat);
    hist_reset(&m->evt_overhead);
    pthread_mutex_unlock(&m->lock);
}

void metrics_http_request(metrics *mx, const char *route, const char *method, int status) {
    char r[96], m[24], labels[192];
    label_escape(r, sizeof r, route ? route : "other");
    label_escape(m, sizeof m, method ? method : "OTHER");
    snprintf(labels, sizeof labels, "route=\"%s\",method=\"%s\",status=\"%d\"", r, m, status);
    pthread_mutex_lock(&mx->lock);
    counter_add(&mx->http, labels, 1);
    pthread_mutex_unlock(&mx->lock);
}

void metrics_tokens(metrics *m, long prompt_tokens, long generated_tokens) {
    pthread_mutex_lock(&m->lock);
    m->prompt_tokens += (double)prompt_tokens;
    m->gen_tokens += (double)generated_tokens;
    pthread_mutex_unlock(&m->lock);
}

void metrics_ws_follow_pubsub(metrics *m, long n) {
    pthread_mutex_lock(&m->lock);
    m->ws_follow_pubsub += (double)n;
    pthread_mutex_unlock(&m->lock);
}

void metrics_steps(metrics *m, long steps) {
    pthread_mutex_lock(&m->lock);
    m->steps += (double)steps;
    pthread_mutex_unlock(&m->lock);
}

static void labelled_add(metrics *m, counter_vec *c, const char *key, const char *value) {
    char v[64], labels[192];
    label_escape(v, sizeof v, value ? value : "unknown");
    snprintf(labels, sizeof labels, "%s=\"%s\"", key, v);
    pthread_mutex_lock(&m->lock);
    counter_add(c, labels, 1);
    pthread_mutex_unlock(&m->lock);
}

void metrics_finished(metrics *m, const char *finish_reason) { labelled_add(m, &m->finished, "finish_reason", finish_reason); }
void metrics_webhook(metrics *m, const char *result) { labelled_add(m, &m->webhooks, "result", result); }
void metrics_conn_limit(metrics *m, const char *limit) { labelled_add(m, &m->conn_limits, "limit", limit); }

void metrics_finished_event(metrics *m, const decode_event *done) {
    metrics_tokens(m, done->usage.prompt_tokens, done->usage.completion_tokens);
    metrics_steps(m, done->usage.steps);
    metrics_finished(m, decode_finish_name(done->finish));
}

void metrics_step_latency(metrics *m, double seconds) {
    pthread_mutex_lock(&m->lock);
    hist_observe(&m->step_lat, seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_event_overhead(metrics *m, double seconds) {
    pthread_mutex_lock(&m->lock);
    hist_observe(&m->evt_overhead, seconds);
    pthread_mutex_unlock(&m->lock);
}

void metrics_gauge_register(metrics *m, const char *name, const char *help, metrics_gauge_fn fn, void *user) {
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->n_gauges; i++)
        if (strcmp(m->gauges[i].name, name) == 0) {
            m->gauges[i].fn = fn;
            m->gauges[i].user = user;
            pthread_mutex_unlock(&m->lock);
            return;
        }
    m->gauges = xrealloc(m->gauges, (size_t)(m->n_gauges + 1) * sizeof *m->gauges);
    m->gauges[m->n_gauges] = (gauge){xstrdup(name), xstrdup(help), fn, user};
    m->n_gauges++;
    pthread_mutex_unlock(&m->lock);
}

void metrics_gauge_unregister_all(metrics *m) {
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->n_gauges; i++) free(m->gauges[i].name), free(m->gauges[i].help);
    free(m->gauges);
    m->gauges = NULL;
    m->n_gauges = 0;
    pthread_mutex_unlock(&m->lock);
}

/* ---------------------------------------------------------------- rendering */

/* Prometheus float formatting: integers without exponent, others with %.17g. */
static void tb_value(strbuf *b, double v) {
    if (v == (double)(long long)v && v < 1e15 && v > -1e15) strbuf_printf(b, "%lld", (long long)v);
    else strbuf_printf(b, "%.17g", v);
}

static void render_counter_vec(strbuf *b, const counter_vec *c) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s counter\n", c->name, c->help, c->name);
    for (int i = 0; i < c->n; i++) {
        strbuf_printf(b, "%s{%s} ", c->name, c->items[i].labels);
        tb_value(b, c->items[i].value);
        strbuf_printf(b, "\n");
    }
}

static void render_counter(strbuf *b, const char *name, const char *help, double v) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s ", name, help, name, name);
    tb_value(b, v);
    strbuf_printf(b, "\n");
}

static void render_hist(strbuf *b, const histogram *h) {
    strbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    double cum = 0;
    for (int i = 0; i < HIST_BUCKETS; i++) {
        cum += h->counts[i];
        strbuf_printf(b, "%s_bucket{le=\"%g\"} ", h->name, h->le[i]);
        tb_value(b, cum);
        strbuf_printf(b, "\n");
    }
    strbuf_printf(b, "%s_bucket{le=\"+Inf\"} ", h->name);
    tb_value(b, h->count);
    strbuf_printf(b, "\n%s_sum ", h->name);
    tb_value(b, h->sum);
    strbuf_printf(b, "\n%s_count ", h->name);
    tb_value(b, h->count);
    strbuf_printf(b, "\n");
}

char *metrics_render(metrics *m, size_t *len) {
    strbuf b = STRBUF_INIT;
    /* Gauges first, outside the lock: their callbacks take their owners' locks. */
    pthread_mutex_lock(&m->lock);
    int ng = m->n_gauges;
    gauge *gs = xcalloc((size_t)(ng ? ng : 1), sizeof *gs);
    for (int i = 0; i < ng; i++) {
        gs[i] = m->gauges[i];
        gs[i].name = xstrdup(m->gauges[i].name);
        gs[i].help = xstrdup(m->gauges[i].help);
    }
    pthread_mutex_unlock(&m->lock);
    for (int i = 0; i < ng; i++) {
        double v = gs[i].fn ? gs[i].fn(gs[i].user) : 0;
        strbuf_printf(&b, "# HELP unmask_%s %s\n# TYPE unmask_%s gauge\nunmask_%s ", gs[i].name, gs[i].help,
                  gs[i].name, gs[i].name);
        tb_value(&b, v);
        strbuf_printf(&b, "\n");
        free(gs[i].name);
        free(gs[i].help);
    }
    free(gs);

    pthread_mutex_lock(&m->lock);
    render_counter_vec(&b, &m->http);
    render_counter_vec(&b, &m->finished);
    render_counter_vec(&b, &m->webhooks);
    render_counter_vec(&b, &m->conn_limits);
    render_counter(&b, "unmask_prompt_tokens_total", "Prompt tokens of finished sequences.", m->prompt_tokens);
    render_counter(&b, "unmask_generated_tokens_total", "Completion tokens of finished sequences.", m->gen_tokens);
    render_counter(&b, "unmask_decode_steps_total", "Denoising steps taken, summed over sequences.", m->steps);
    render_counter(&b, "unmask_ws_follow_pubsub_events_total",
                   "Events of WebSocket sessions followed from another replica that arrived through Redis pub/sub.",
                   m->ws_follow_pubsub);
    render_hist(&b, &m->step_lat);
    render_hist(&b, &m->evt_overhead);
    pthread_mutex_unlock(&m->lock);
    return strbuf_take(&b, len);
}
