/*
 * http_api.h — the HTTP APIs other clients already speak, on the server's route table:
 *   POST /v1/chat/completions, /v1/completions, /v1/fim/completions   (OpenAI / Mistral FIM)
 *   GET  /v1/models, /v1/models/{id}
 *   POST /generate                                                      (SGLang)
 *   POST /infill                                                        (llama.cpp)
 *   POST /v1/jobs, GET /v1/jobs/{id}, GET /v1/jobs/{id}/events, DELETE /v1/jobs/{id}
 *   GET  /metrics                                                       (Prometheus)
 * plus the middleware every HTTP request passes: x-request-id, CORS (+ preflight), API keys,
 * per-key rate limits, 503 while draining, request metrics; and the graceful-shutdown policy.
 * docs/http-api.md is the user-facing reference.
 *
 * Settings: rows of the server's settings table (server_config.h: --api-keys, --rate-limit,
 * --cors-origin, --algorithm-config, --cache, --webhook-*, --max-gen-length, --max-jobs, ...).
 *
 * Not here: request parsing / response shapes (api/), the scheduler (sched/), lws plumbing
 * (server/http.c). Threads: configure/free on the main thread; everything else on the lws service
 * thread, except the webhook worker (jobs/webhook.c).
 */
#ifndef UM_HTTP_API_H
#define UM_HTTP_API_H

#include "util/err.h"

struct server;
typedef struct http_api http_api;

/* The HTTP APIs of server s, configured from its settings (server_config.h: --api-keys,
 * --rate-limit, --cors-origin, --webhook-*, --max-jobs, ...): loads the key file, registers the
 * routes, the middleware, the drain hooks, the metrics gauges and the WebSocket handshake check
 * on s. NULL with err (e.g. an unreadable key file). Main thread, before server_run. */
http_api *http_api_create(struct server *s, um_err *err);
/* After server_run returned, before server_free. */
void      http_api_free(http_api *a);

#endif /* UM_HTTP_API_H */
