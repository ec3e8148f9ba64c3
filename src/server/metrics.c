/*
 * metrics.c — Prometheus counters / gauges / histograms (see metrics.h). Thread-safe.
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

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* --- g_lock { */
static counter_vec g_http = {"unmask_http_requests_total", "HTTP responses by route pattern, method and status.", NULL, 0, 0};
static counter_vec g_finished = {"unmask_requests_finished_total", "Generation sequences finished, by finish reason.", NULL, 0, 0};
static counter_vec g_webhooks = {"unmask_webhook_deliveries_total", "Webhook delivery attempts by result.", NULL, 0, 0};
static double g_prompt_tokens, g_gen_tokens, g_steps;
static histogram g_step_lat = {
    "unmask_step_latency_seconds", "Time of one batched denoising step (one forward + decoders): wall time on the host loop, GPU time (cudaEvent) on the device-resident loop.",
    {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}, {0}, 0, 0, 0};
static histogram g_evt_overhead = {
    "unmask_event_overhead_seconds",
    "Per streamed event: time from the engine producing it to its bytes reaching the socket.",
    {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1},
    {0}, 0, 0, 0};
static gauge *g_gauges;
static int    g_n_gauges;
/* } g_lock --- */

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

void metrics_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_http.n = g_finished.n = g_webhooks.n = 0;
    g_prompt_tokens = g_gen_tokens = g_steps = 0;
    hist_reset(&g_step_lat);
    hist_reset(&g_evt_overhead);
    pthread_mutex_unlock(&g_lock);
}

void metrics_http_request(const char *route, const char *method, int status) {
    char r[96], m[24], labels[192];
    label_escape(r, sizeof r, route ? route : "other");
    label_escape(m, sizeof m, method ? method : "OTHER");
    snprintf(labels, sizeof labels, "route=\"%s\",method=\"%s\",status=\"%d\"", r, m, status);
    pthread_mutex_lock(&g_lock);
    counter_add(&g_http, labels, 1);
    pthread_mutex_unlock(&g_lock);
}

void metrics_tokens(long prompt_tokens, long generated_tokens) {
    pthread_mutex_lock(&g_lock);
    g_prompt_tokens += (double)prompt_tokens;
    g_gen_tokens += (double)generated_tokens;
    pthread_mutex_unlock(&g_lock);
}

void metrics_steps(long steps) {
    pthread_mutex_lock(&g_lock);
    g_steps += (double)steps;
    pthread_mutex_unlock(&g_lock);
}

static void labelled_add(counter_vec *c, const char *key, const char *value) {
    char v[64], labels[192];
    label_escape(v, sizeof v, value ? value : "unknown");
    snprintf(labels, sizeof labels, "%s=\"%s\"", key, v);
    pthread_mutex_lock(&g_lock);
    counter_add(c, labels, 1);
    pthread_mutex_unlock(&g_lock);
}

void metrics_finished(const char *finish_reason) { labelled_add(&g_finished, "finish_reason", finish_reason); }
void metrics_webhook(const char *result) { labelled_add(&g_webhooks, "result", result); }

void metrics_step_latency(double seconds) {
    pthread_mutex_lock(&g_lock);
    hist_observe(&g_step_lat, seconds);
    pthread_mutex_unlock(&g_lock);
}

void metrics_event_overhead(double seconds) {
    pthread_mutex_lock(&g_lock);
    hist_observe(&g_evt_overhead, seconds);
    pthread_mutex_unlock(&g_lock);
}

void metrics_gauge_register(const char *name, const char *help, metrics_gauge_fn fn, void *user) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_gauges; i++)
        if (strcmp(g_gauges[i].name, name) == 0) {
            g_gauges[i].fn = fn;
            g_gauges[i].user = user;
            pthread_mutex_unlock(&g_lock);
            return;
        }
    g_gauges = xrealloc(g_gauges, (size_t)(g_n_gauges + 1) * sizeof *g_gauges);
    g_gauges[g_n_gauges].name = xstrdup(name);
    g_gauges[g_n_gauges].help = xstrdup(help);
    g_gauges[g_n_gauges].fn = fn;
    g_gauges[g_n_gauges].user = user;
    g_n_gauges++;
    pthread_mutex_unlock(&g_lock);
}

void metrics_gauge_unregister_all(void) {
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_gauges; i++) free(g_gauges[i].name), free(g_gauges[i].help);
    free(g_gauges);
    g_gauges = NULL;
    g_n_gauges = 0;
    pthread_mutex_unlock(&g_lock);
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

char *metrics_render(size_t *len) {
    strbuf b = STRBUF_INIT;
    /* Gauges first, outside the lock: their callbacks take their owners' locks. */
    pthread_mutex_lock(&g_lock);
    int ng = g_n_gauges;
    gauge *gs = xcalloc((size_t)(ng ? ng : 1), sizeof *gs);
    for (int i = 0; i < ng; i++) {
        gs[i] = g_gauges[i];
        gs[i].name = xstrdup(g_gauges[i].name);
        gs[i].help = xstrdup(g_gauges[i].help);
    }
    pthread_mutex_unlock(&g_lock);
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

    pthread_mutex_lock(&g_lock);
    render_counter_vec(&b, &g_http);
    render_counter_vec(&b, &g_finished);
    render_counter_vec(&b, &g_webhooks);
    render_counter(&b, "unmask_prompt_tokens_total", "Prompt tokens of finished sequences.", g_prompt_tokens);
    render_counter(&b, "unmask_generated_tokens_total", "Completion tokens of finished sequences.", g_gen_tokens);
    render_counter(&b, "unmask_decode_steps_total", "Denoising steps taken, summed over sequences.", g_steps);
    render_hist(&b, &g_step_lat);
    render_hist(&b, &g_evt_overhead);
    pthread_mutex_unlock(&g_lock);
    return strbuf_take(&b, len);
}
