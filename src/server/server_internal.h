/*
 * server_internal.h — glue between server.c and the files built on its lifecycle (ws.c and session.c
 * through session.h, routes.c, http_api.c): the wake-up, the WebSocket auth hook, the ws state, TLS
 * suites. The HTTP layer (http.c, static.c, http_wire.c, conn_guard.c) does not use it: it reaches
 * the server only through its router (http.h). Threads: lws service thread only.
 */
#ifndef UM_SERVER_INTERNAL_H
#define UM_SERVER_INTERNAL_H

#include <jansson.h>
#include <libwebsockets.h>

#include "server/http.h"
#include "server/server.h"

/* server.c: drain the hub (every pending engine event) and handle readiness changes. Called on
 * LWS_CALLBACK_EVENT_WAIT_CANCELLED (wake-ups coalesce: this always takes everything). */
void server_on_wake(server *s);

/* TLS 1.2 cipher suites: ECDHE/DHE key exchange with AES-GCM or ChaCha20-Poly1305 only. */
#define TLS12_CIPHERS                                                                                     \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"             \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:"               \
    "DHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES256-GCM-SHA384"

/* The WebSocket handshake check (server/http_api.c installs it: API keys): 1 = allow, and *who
 * (cap bytes) = the caller's identity (server/callers.h). Without a check every handshake on /ws
 * is allowed and the caller is the client address. */
typedef int (*server_ws_auth_fn)(void *user, struct lws *wsi, char *who, size_t cap);
void server_set_ws_auth(server *s, server_ws_auth_fn fn, void *user);
int  server_ws_auth(server *s, struct lws *wsi, char *who, size_t cap);

/* Async job updates for WebSocket sessions (server/http_jobs.c installs the hooks, the job store's
 * owner; server/ws_jobs.c calls them). watch(api, id, who, fn, user, &handle, &code): the job's API
 * object (GET /v1/jobs/{id}, a new reference) now, or NULL with *code "unknown_job" (no such job of
 * caller who) / "store_unavailable"; while the job is not finished *handle is a watch that calls
 * fn(user, job, note) with its object (stolen) on each status change: SERVER_JOB_FINAL with the
 * last one, after which the watch is gone. A finished job gets no watch (*handle NULL).
 * SERVER_JOB_GONE (job NULL): the job vanished from the store; SERVER_JOB_CLOSED (job NULL): the
 * job API shuts down. Both end the watch too. unwatch(api, handle) ends it early. */
enum server_job_note { SERVER_JOB_UPDATE, SERVER_JOB_FINAL, SERVER_JOB_GONE, SERVER_JOB_CLOSED };
typedef void (*server_job_fn)(void *user, json_t *job, enum server_job_note note);
typedef struct server_job_hooks {
    json_t *(*watch)(void *api, const char *id, const char *who, server_job_fn fn, void *user, void **handle,
                     const char **code);
    void    (*unwatch)(void *api, void *handle);
} server_job_hooks;
/* hooks NULL: uninstall (the job API is gone). */
void server_set_job_hooks(server *s, const server_job_hooks *hooks, void *api);
/* The hooks (NULL when none) and their api pointer. */
const server_job_hooks *server_job_hooks_get(server *s, void **api);

/* routes.c: GET /health and GET /stats on s. */
void routes_core_register(server *s);

/* server.c: the connection limits (server/conn_guard.h), for ws.c. */
struct conn_guard *server_conn_guard(server *s);

/* ws.c */
int    ws_lws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len);
size_t ws_conn_size(void);
struct ws_state *ws_state_create(server *s);
/* Close every session (shutdown, after the lws context is gone): cancels nothing (engines are
 * stopped), frees frames and generations' requests. */
void ws_state_free(struct ws_state *w);
/* Before lws_context_destroy: cancel every session timer and stop scheduling new ones. */
void ws_state_shutdown(struct ws_state *w);
void ws_get_conn_stats(const struct ws_state *w, server_conn_stats *out);
/* --store redis://: the sessions' event logs go to st (owned by w from now on; server/ws_store.h). */
struct ws_store;
void ws_state_set_store(struct ws_state *w, struct ws_store *st);
/* Every wake-up (service thread): the live events the store's subscriber thread received for the
 * sessions followed here (session.c). */
void ws_state_on_wake(struct ws_state *w);
/* 1 when every connected session has written all its events (graceful shutdown waits for it). */
int  ws_flushed(const struct ws_state *w);
/* Shutdown: every WebSocket connection writes what its session still holds, then closes with
 * 1001 (going away). Returns the number of connections; ws_n_conns() counts those still open. */
int  ws_close_all(struct ws_state *w);
int  ws_n_conns(const struct ws_state *w);
/* The trace of a WebSocket generation (server/trace.h) as JSON, or NULL (unknown / not who's). */
json_t *ws_trace_get(struct ws_state *w, const char *id, const char *who);

#endif /* UM_SERVER_INTERNAL_H */
