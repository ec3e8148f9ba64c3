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
 * thread, except the webhook worker (sched/webhook.c).
 */
#ifndef UM_HTTP_API_H
#define UM_HTTP_API_H

#include "server/server_config.h"
#include "util/err.h"

/* Apply the settings (server_config: --api-keys, --rate-limit, ...), load the key file and the
 * algorithm config, register the routes and the middleware. Main thread, after server_config_check. */
int  http_api_configure(const server_config *cfg, um_err *err);
/* Release everything (after server_run returned). */
void http_api_shutdown(void);

/* WebSocket handshakes (server/ws.c, LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION): with API keys
 * configured, the key must come as `Authorization: Bearer <key>`, `x-api-key`, or — for browsers,
 * which cannot set headers — a subprotocol entry `unmask-key.<key>` (or
 * `openai-insecure-api-key.<key>`) next to "unmask": new WebSocket(url, ["unmask", "unmask-key." + key]).
 * Returns 1 when the connection may proceed, 0 to refuse it. Service thread. */
struct lws;
int http_api_ws_authorize(struct lws *wsi);

/* Registers the routes + middleware (called from routes_register_all). Idempotent. */
void routes_http_api_register(void);

#endif /* UM_HTTP_API_H */
