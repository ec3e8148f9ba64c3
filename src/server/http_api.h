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
 * Settings: the values given on the command line (http_api_flags, filled by `unmask serve`)
 * override the same keys in the JSON config file (cfg->file), e.g. "api_keys": "keys.txt",
 * "rate_limit": 5.
 *
 * Not here: request parsing / response shapes (api/), the scheduler (sched/), lws plumbing
 * (server/http.c). Threads: configure/free on the main thread; everything else on the lws service
 * thread, except the webhook worker (sched/webhook.c).
 */
#ifndef UM_HTTP_API_H
#define UM_HTTP_API_H

#include "server/server_config.h"
#include "util/err.h"

/* The HTTP APIs' settings as given on the command line; "not given" is NULL / NaN / INT_MIN (then
 * the config file's key, then the default applies). Strings are borrowed (argv). */
typedef struct http_api_flags {
    const char *api_keys, *cors_origin, *algorithm_config, *webhook_secret, *served_model_name;
    const char *cache;   /* --cache: auto | none | prefix | dual | vicinity */
    double      rate_limit, rate_burst, shutdown_grace, webhook_retry_base;
    int         max_gen_length, max_prompt_tokens, max_jobs, job_attempts, webhook_attempts;
} http_api_flags;

/* Every field "not given". */
void http_api_flags_init(http_api_flags *f);
/* Resolve settings (flags > config file > defaults), load the key file and the algorithm config,
 * register the routes and the middleware. flags may be NULL (none given). Main thread, after
 * server_config_check. */
int  http_api_configure(const server_config *cfg, const http_api_flags *flags, um_err *err);
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
