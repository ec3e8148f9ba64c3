/*
 * server_internal.h — glue between the server's own files (server.c, http.c, static.c, ws.c,
 * session.c): the lws callbacks and hooks that carry lws types. Route modules use http.h only.
 * Threads: lws service thread only.
 */
#ifndef UM_SERVER_INTERNAL_H
#define UM_SERVER_INTERNAL_H

#include <libwebsockets.h>

#include "server/http.h"
#include "server/server.h"

/* server.c: drain the hub (every pending engine event) and handle readiness changes. Called on
 * LWS_CALLBACK_EVENT_WAIT_CANCELLED (wake-ups coalesce: this always takes everything). */
void server_on_wake(server *s);

/* http.c */
int    http_lws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len);
size_t http_conn_size(void);
/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: 0 to allow (path /ws), 1 after answering 404, -1 to close. */
int    http_confirm_upgrade(struct lws *wsi);

/* static.c: serve path (decoded, starting with '/') from the web root through lws. Returns what an
 * LWS_CALLBACK_HTTP handler returns (0 keep going, -1 close). */
int static_serve(struct lws *wsi, server *s, const char *path, int head_only, int *status_out);
/* Resolve the web root once at startup (realpath); -1 with err when it is not a directory. */
int static_init(const char *web_root, um_err *err);
void static_free(void);

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
/* 1 when every connected session has written all its events (graceful shutdown waits for it). */
int  ws_flushed(const struct ws_state *w);
/* Shutdown: every WebSocket connection writes what its session still holds, then closes with
 * 1001 (going away). Returns the number of connections; ws_n_conns() counts those still open. */
int  ws_close_all(struct ws_state *w);
int  ws_n_conns(const struct ws_state *w);

#endif /* UM_SERVER_INTERNAL_H */
