/*
 * metrics.h — one server's counters, gauges and histograms, rendered as Prometheus text
 * (exposition format 0.0.4) for GET /metrics.
 *
 * Metric names (all prefixed unmask_):
 *   http_requests_total{route,method,status}   counter: every HTTP response, by route pattern
 *   prompt_tokens_total / generated_tokens_total  counters (from each finished sequence's usage)
 *   decode_steps_total                          counter: denoising steps (per sequence)
 *   step_latency_seconds                        histogram: one batched decode_step() wall time
 *   event_overhead_seconds                      histogram: event produced on the engine thread ->
 *                                               its bytes handed to the socket (queueing, encode,
 *                                               write) — the server's per-event overhead
 *   requests_finished_total{finish_reason}      counter
 *   webhook_deliveries_total{result}            counter
 *   ws_follow_pubsub_events_total               counter: events of WebSocket sessions followed from
 *                                               another replica (--store redis://) that arrived
 *                                               through Redis pub/sub (not the fallback poll)
 *   plus gauges registered with metrics_gauge_register() (queue depth, active sequences, ...),
 *   read at render time through a callback so the owner keeps its own bookkeeping.
 *
 * Not here: HTTP (server/http_api.c serves the text). Thread-safe: any thread may update; one
 * mutex guards everything (updates are a few per step, far below contention levels).
 */
#ifndef UM_METRICS_H
#define UM_METRICS_H

#include <stddef.h>

#include <jansson.h>

#include "decode/decode.h"

typedef struct metrics metrics;

metrics *metrics_new(void);
void     metrics_free(metrics *m);
/* Reset every metric (tests). Registered gauges are kept. */
void metrics_reset(metrics *m);

void metrics_http_request(metrics *m, const char *route, const char *method, int status);
void metrics_tokens(metrics *m, long prompt_tokens, long generated_tokens);
void metrics_steps(metrics *m, long steps);
void metrics_ws_follow_pubsub(metrics *m, long n);
void metrics_finished(metrics *m, const char *finish_reason);
void metrics_webhook(metrics *m, const char *result);            /* "delivered" | "retry" | "failed" */
/* A connection limit acted (server/conn_guard.h): "per_address" (closed at accept),
 * "request_timeout", "keepalive_idle". */
void metrics_conn_limit(metrics *m, const char *limit);
/* A sequence's final (DONE) decode event: tokens, steps and the finish reason, whatever transport
 * carried it. */
void metrics_finished_event(metrics *m, const decode_event *done);
void metrics_step_latency(metrics *m, double seconds);
void metrics_event_overhead(metrics *m, double seconds);

/* A gauge whose value is fn(user) at render time. name without the unmask_ prefix; help one line.
 * Registering the same name again replaces the callback. fn runs on the rendering thread (the lws
 * service thread) with no metrics lock held. */
typedef double (*metrics_gauge_fn)(void *user);
void metrics_gauge_register(metrics *m, const char *name, const char *help, metrics_gauge_fn fn, void *user);
void metrics_gauge_unregister_all(metrics *m);

/* The whole exposition text, malloc'd and NUL-terminated (caller frees). */
char *metrics_render(metrics *m, size_t *len);

#endif /* UM_METRICS_H */
