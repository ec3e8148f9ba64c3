/*
 * conn_guard.h — limits on connections below HTTP, so that slow or greedy clients cannot hold the
 * server's sockets:
 *   - per client address at most --max-conns-per-address open connections (HTTP, TLS, WebSocket;
 *     IPv6 counted per /64; --trusted-proxies exempt): a connection beyond it is closed as soon as
 *     it is accepted, before TLS or HTTP, without touching other addresses' connections;
 *   - every request must arrive whole (head and body) within --request-timeout seconds of its first
 *     byte (of the accept for a connection's first request): a late one is answered 408 and its
 *     connection closes (closed without an answer when nothing of it arrived or TLS is not up);
 *   - between requests a keep-alive connection may stay idle --keepalive-timeout seconds;
 *   - the bytes a request took on the wire (http.c bounds the headers the library cannot list).
 * While a request is answered (however long: streams, generations) and on a WebSocket no deadline
 * runs; the per-address count includes them.
 *
 * One record per accepted connection, found from its wsi; http.c and ws.c report where the
 * connection is in its request cycle (the functions below taking a wsi). Not here: what requests
 * mean, per-caller quotas (callers.h). Threads: lws service thread only.
 */
#ifndef UM_CONN_GUARD_H
#define UM_CONN_GUARD_H

#include <libwebsockets.h>

#include "server/server_config.h"
#include "util/err.h"

struct metrics;
typedef struct conn_guard conn_guard;

typedef struct conn_guard_stats {
    int       open;           /* accepted connections not yet closed */
    int       addresses;      /* client addresses (IPv6 /64s) with open connections counted */
    long long refused;        /* connections closed at accept: their address was at the cap */
    long long timed_out;      /* requests that missed --request-timeout */
    long long idle_closed;    /* keep-alive connections closed after --keepalive-timeout idle */
} conn_guard_stats;

/* The limits of cfg (request / keep-alive timeouts, the per-address cap, the trusted proxies that
 * are exempt from it). NULL with err when --trusted-proxies is malformed. m: counters (may be NULL). */
conn_guard *conn_guard_new(const server_config *cfg, struct metrics *m, um_err *err);
void        conn_guard_free(conn_guard *g);
/* The lws context the timers run on (after it is created; before any connection). */
void conn_guard_start(conn_guard *g, struct lws_context *ctx);
/* Who answers a request whose deadline passed while its body was arriving (the HTTP layer:
 * http_request_timeout): 1 after answering 408 (the connection closes after it), 0 when wsi holds
 * no such request (the connection is then closed). Set before start. */
typedef int (*conn_guard_late_body_fn)(struct lws *wsi);
void conn_guard_set_late_body(conn_guard *g, conn_guard_late_body_fn fn);
/* Before the lws context is destroyed: every timer cancelled, no answer written any more. */
void conn_guard_stop(conn_guard *g);
void conn_guard_get_stats(const conn_guard *g, conn_guard_stats *out);

/* ---------------------------------------------------------------- lws connection lifecycle */

/* LWS_CALLBACK_FILTER_NETWORK_CONNECTION (args: the peer): 1 = close the connection now (its
 * address is at the cap), 0 = accepted (a record is waiting for the connection's wsi). */
int  conn_guard_on_accept(conn_guard *g, const struct lws_filter_network_conn_args *args);
/* LWS_CALLBACK_WSI_CREATE and LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED: the accepted connection's
 * wsi is created, then adopted (the record is bound to it). */
void conn_guard_on_wsi_create(conn_guard *g, struct lws *wsi);
void conn_guard_on_adopt(conn_guard *g, struct lws *wsi);
/* LWS_CALLBACK_WSI_DESTROY: the connection is gone (its record and count go). */
void conn_guard_on_wsi_destroy(conn_guard *g, struct lws *wsi);
/* LWS_CALLBACK_SSL_INFO: where = SSL_CB_* (the TLS handshake completed). */
void conn_guard_on_tls_info(struct lws *wsi, int where);

/* ---------------------------------------------------------------- the request cycle */

/* The request's head is complete (its body may follow): a keep-alive connection's next request
 * began (no later than now). */
void conn_guard_request_head(struct lws *wsi);
/* The request is being answered (its handler runs, or an error is sent): no deadline. */
void conn_guard_answering(struct lws *wsi);
/* The answer is complete and the connection stays open for the next request (keep-alive). */
void conn_guard_idle(struct lws *wsi);
/* The connection became a WebSocket, or a raw connection answered and closed by http.c: no
 * deadline, only the per-address count. */
void conn_guard_open(struct lws *wsi);
/* Bytes the socket received since the current request began (its head, the body so far, for TLS
 * with the records' overhead; more only when the client pipelined), or -1 when unknown (on TLS
 * before the end of the handshake was seen). */
long long conn_guard_request_bytes(struct lws *wsi);

/* ---------------------------------------------------------------- socket helpers (http.c too) */

/* 1 when the peer closed or reset the connection (seen without reading: POLLRDHUP/HUP/ERR). */
int conn_peer_gone(struct lws *wsi);
/* Reads and drops what the client sent that will never be read (bounded): 1 when the client has
 * closed its side (or the socket failed), 0 when it may still send. */
int conn_drain_unread(struct lws *wsi);

#endif /* UM_CONN_GUARD_H */
