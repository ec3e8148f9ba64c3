/*
 * http.c — the lws "http" protocol (protocols[0]): request framing checks, route table dispatch,
 * request bodies, queued responses and streams written one lws_write per WRITEABLE, static files
 * for unclaimed GETs. What it needs of the server (routes, limits, the web root, the connection
 * guard) comes with the http_router, the vhost's user data; it knows nothing else of the server.
 *
 * Pipelining. libwebsockets 4.1.6 cannot run a pipelined request safely: bytes that arrive
 * before the current response is complete are fed back through the current request's callbacks
 * (LWS_CALLBACK_HTTP again with the old headers, or BODY_COMPLETION again, in a loop), and a
 * pipelined request with a body read from its buffer is handed its own head as body. So a
 * request is dispatched exactly once ("dispatched"); any callback of that transaction after that
 * is such a re-delivery: reading stops (rx flow control), the current response goes out with
 * "Connection: close" and the connection closes. Requests sent one after another on a keep-alive
 * connection (each after its response) are unaffected. lws re-delivers in the same service round
 * that dispatched the request (its buffered-input pass runs after the socket pass), before this
 * file writes a byte, so every response is covered; that is why static files go through this
 * writer too instead of lws_serve_http_file.
 *
 * Closing. A connection that ends after an answer closes gracefully: the answer is flushed, our
 * sending side is shut down, and what the client still sends is read and dropped until it closes
 * too (at most HTTP_LINGER_S) — closing with unread input would reset the connection and can
 * destroy the answer in flight.
 *
 * Methods lws does not take. CONNECT, and (with the vhost's fallback option) methods lws does not
 * know, reach this protocol as a raw connection instead of a request: they get a JSON 405 here
 * and close like any other answer (on_raw).
 *
 * Connection limits. Where a connection is in its request cycle (head parsed, request answered,
 * idle between requests) is reported to conn_guard.c, which times requests and idle connections
 * and asks back for a 408 when a body is late (http_request_timeout).
 *
 * Not here: route handlers (routes.c and other route modules), static path checks (static.c),
 * WebSocket (ws.c), per-address caps and deadlines (conn_guard.c). Threads: lws service thread only.
 */
#include "server/http.h"

#include <ctype.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/conn_guard.h"
#include "server/http_wire.h"
#include "server/server_config.h"
#include "server/static.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/timeutil.h"

#define HTTP_CHUNK          (16u << 10)   /* bytes per body lws_write */
#define HTTP_STREAM_MAX     (16u << 20)   /* queued stream bytes before http_stream_write fails */
#define HTTP_PATH_MAX       2048
#define HTTP_MAX_ROUTE_SETS 64
#define HTTP_PEER_WATCH_US  (250 * 1000)  /* while reading is stopped: how often to look for a hang-up */
#define HTTP_LINGER_POLL_US (20 * 1000)   /* lingering close: how often to drop what the client still sends */
#define HTTP_LINGER_S       2.0           /* ... and for how long at most before closing anyway */

struct http_conn {
    struct lws *wsi;
    http_router *rt;            /* the vhost's routes (not owned) */
    int         rx_paused;      /* lws_rx_flow_control(wsi, 0) is in force (see rx_update) */
    int         closing;        /* the last response is written: close once lws flushed it */
    int         lingering;      /* our side is shut down; dropping input until the client closes */
    double      linger_until;   /* monotonic seconds: close anyway then */
    int         pipelined;      /* lws re-delivered this transaction: the client sent more bytes */
    int         raw;            /* lws handed the connection over as raw bytes (CONNECT or an unknown
                                 * method): one 405 answer (out) is written, then it closes */
    /* current transaction */
    int         in_txn;
    int         dispatched;     /* the request was answered or handed to its handler: any later
                                 * request callback of this transaction is an lws re-delivery */
    enum http_method method;
    char        method_name[12];
    char        path[HTTP_PATH_MAX];
    const http_route *route;    /* NULL: no route (static file, 404 or 405) */
    void       *route_user;     /* the route's set's user (http_routes_add) */
    int         path_known;     /* no route, but some route has this path with another method */
    char       *body;           /* owned, NUL-terminated */
    size_t      body_len, body_cap;
    /* response */
    int         responded;      /* a response or stream was set up */
    int         deferred;       /* the handler will respond later (http_respond_later) */
    int         hdr_sent;
    int         status;
    char        ctype[128];
    char      **hdrs;           /* owned "Name: value" strings, NULL-terminated, or NULL */
    char      **mw_hdrs;        /* middleware headers of this transaction (owned, [n_mw_hdrs]) */
    int         n_mw_hdrs;
    int         streaming;      /* body length unknown: chunked (HTTP/1.1) or closed at the end */
    int         chunked;        /* the stream is sent with Transfer-Encoding: chunked */
    int         stream_ended;
    int         close_after;    /* close the connection once the response is written */
    unsigned char *out;         /* queued body bytes [out_off, out_len) */
    size_t      out_len, out_off, out_cap;
    size_t      content_len;    /* one-shot responses */
    unsigned char *wbuf;        /* LWS_PRE + HTTP_CHUNK */
    void      (*close_fn)(void *user);
    void       *close_user;
};

size_t http_conn_size(void) { return sizeof(http_conn); }

/* ---------------------------------------------------------------- route table */

/* One server's routes and middleware (server.c owns it; service thread after setup). */
struct http_router {
    struct server    *srv;                        /* handed to handlers as http_req.srv (opaque here) */
    const server_config *cfg;                     /* limits: message bytes, request timeout */
    struct conn_guard *guard;                     /* connection limits, or NULL */
    const char       *web_root;                   /* static files' root, or NULL (not owned) */
    const http_route *sets[HTTP_MAX_ROUTE_SETS];  /* route tables, each ending with {NULL} */
    void             *users[HTTP_MAX_ROUTE_SETS]; /* their http_req.user */
    int               n_sets;
    http_middleware   mw;                         /* all NULL: none */
    int               inflight;                   /* responses set up and not yet completely written */
};

http_router *http_router_new(struct server *srv, const server_config *cfg) {
    http_router *r = xcalloc(1, sizeof(http_router));
    r->srv = srv;
    r->cfg = cfg;
    return r;
}

void http_router_set_limits(http_router *r, struct conn_guard *guard, const char *web_root) {
    r->guard = guard;
    r->web_root = web_root;
}

/* The router of wsi's vhost (the vhost's user data; every callback's wsi has a vhost, the fake wsi
 * of a broadcast included). */
static http_router *router_at(struct lws *wsi) {
    struct lws_vhost *vh = lws_get_vhost(wsi);
    return vh ? lws_vhost_user(vh) : NULL;
}
void http_router_free(http_router *r) { free(r); }

static http_router *router_of(http_conn *c) { return c->rt; }

int http_responses_in_flight(const http_router *r) { return r->inflight; }

void http_set_middleware(http_router *r, const http_middleware *mw) {
    if (mw) r->mw = *mw;
    else memset(&r->mw, 0, sizeof r->mw);
}

void http_add_header(http_conn *c, const char *line) {
    c->mw_hdrs = xrealloc(c->mw_hdrs, (size_t)(c->n_mw_hdrs + 1) * sizeof *c->mw_hdrs);
    c->mw_hdrs[c->n_mw_hdrs++] = xstrdup(line);
}

const http_route *http_conn_route(const http_conn *c) { return c->route; }
const char *http_conn_method(const http_conn *c) { return c->method_name; }

void http_routes_add(http_router *r, const http_route *routes, void *user) {
    for (int i = 0; i < r->n_sets; i++)
        if (r->sets[i] == routes) return;
    CHECK(r->n_sets < HTTP_MAX_ROUTE_SETS);
    r->users[r->n_sets] = user;
    r->sets[r->n_sets++] = routes;
}

void http_routes_allowed(const http_router *rt, const char *path, unsigned flags, char *allow, size_t cap) {
    allow[0] = 0;
    for (int i = 0; i < rt->n_sets; i++)
        for (const http_route *r = rt->sets[i]; r->path; r++) {
            if ((r->flags & flags) != flags) continue;
            int match = r->prefix ? strncmp(path, r->path, strlen(r->path)) == 0 : strcmp(path, r->path) == 0;
            if (match && !strstr(allow, r->method))
                snprintf(allow + strlen(allow), cap - strlen(allow), "%s%s", allow[0] ? ", " : "", r->method);
        }
}

static int method_matches(const char *want, const char *have) {
    return strcmp(want, "*") == 0 || strcmp(want, have) == 0 ||
           (strcmp(want, "GET") == 0 && strcmp(have, "HEAD") == 0);
}

/* Best route for (method, path) and its set's user; *path_known = 1 when some route claims the
 * path with another method (-> 405). */
static const http_route *route_find(const http_router *rt, const char *method, const char *path, int *path_known,
                                    void **user) {
    const http_route *best = NULL;
    size_t best_len = 0;
    int best_exact = 0;
    *path_known = 0;
    *user = NULL;
    for (int i = 0; i < rt->n_sets; i++)
        for (const http_route *r = rt->sets[i]; r->path; r++) {
            size_t n = strlen(r->path);
            int exact = !r->prefix && strcmp(r->path, path) == 0;
            int pre = r->prefix && strncmp(r->path, path, n) == 0;
            if (!exact && !pre) continue;
            if (!method_matches(r->method, method)) {
                *path_known = 1;
                continue;
            }
            if (exact && !best_exact) {
                best = r, best_len = n, best_exact = 1, *user = rt->users[i];
            } else if (!best_exact && n > best_len) {
                best = r, best_len = n, *user = rt->users[i];
            }
        }
    return best;
}

/* ---------------------------------------------------------------- request helpers */

int http_header(http_conn *c, const char *name, char *buf, size_t cap) {
    if (!c->wsi || cap < 2 || cap > 0x7fffffff) return -1;
    char want[96];
    size_t n = strlen(name);
    if (n + 2 > sizeof want) return -1;
    for (size_t i = 0; i < n; i++) want[i] = (char)tolower((unsigned char)name[i]);
    want[n] = ':';
    want[n + 1] = 0;
    for (int t = 0; t < WSI_TOKEN_COUNT; t++) {
        const unsigned char *s = lws_token_to_string((enum lws_token_indexes)t);
        if (!s || strcmp((const char *)s, want) != 0) continue;
        int len = lws_hdr_total_length(c->wsi, (enum lws_token_indexes)t);
        if (len <= 0) return -1;
        if ((size_t)len >= cap || lws_hdr_copy(c->wsi, buf, (int)cap, (enum lws_token_indexes)t) < 0) return -2;
        return strlen(buf) == (size_t)len ? len : -2; /* a NUL inside: lws's copy stops there */
    }
#if defined(LWS_WITH_CUSTOM_HEADERS)
    int len = lws_hdr_custom_length(c->wsi, want, (int)n + 1);
    if (len <= 0) return -1;
    if ((size_t)len >= cap || lws_hdr_custom_copy(c->wsi, buf, (int)cap, want, (int)n + 1) < 0) return -2;
    return strlen(buf) == (size_t)len ? len : -2;
#else
    return -1;
#endif
}

int http_query(http_conn *c, const char *name, char *buf, size_t cap) {
    if (!c->wsi || cap < 2 || cap > 0x7fffffff) return -1;
    size_t nl = strlen(name);
    char frag[4096];
    for (int i = 0;; i++) {
        int n = lws_hdr_copy_fragment(c->wsi, frag, sizeof frag, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (n < 0) return -1;
        if ((size_t)n > nl && strncmp(frag, name, nl) == 0 && frag[nl] == '=') {
            size_t vl = (size_t)n - nl - 1;
            if (vl >= cap) return -1;
            memcpy(buf, frag + nl + 1, vl);
            buf[vl] = 0;
            return (int)vl;
        }
        if ((size_t)n == nl && strncmp(frag, name, nl) == 0) {
            buf[0] = 0;
            return 0;
        }
    }
}

void http_peer(http_conn *c, char *buf, size_t cap) {
    buf[0] = 0;
    if (c->wsi) lws_get_peer_simple(c->wsi, buf, cap);
}

/* ---------------------------------------------------------------- pipelined input */

static void txn_reset(http_conn *c);

/* 1 when lws may hold unread input for this connection (bytes beyond the current request). lws
 * 4.1.6 has no accessor for one connection; lws_service_adjust_timeout() returns 0 when any
 * connection has buffered input waiting (or TLS records decrypted but unread). "Some connection"
 * is taken as "maybe this one": a wrong yes costs one closed keep-alive connection, a wrong no a
 * misread request. */
static int input_pending(http_conn *c) {
    if (c->pipelined) return 1;
    return lws_service_adjust_timeout(lws_get_context(c->wsi), 1, 0) == 0;
}

/* Reading is off while a transaction waits for its handler's answer or for stream bytes, and on
 * while there is something to write (lws 4.1.6 holds back WRITEABLE on a connection whose reading
 * is disabled). That keeps pipelined bytes (read together with this request) parked in lws's
 * buffer: with reading on, lws would re-deliver this request's callbacks for them in every
 * service round, spinning the service thread for as long as a generation runs. Disabling reading
 * from inside the request's own callbacks, before lws buffers the rest of its input, also avoids
 * lws's writable request for buffered input (a POLLOUT it could not clear while reading is off).
 * While reading is off a timer looks for the hang-up that a read would have shown. */
static void rx_update(http_conn *c) {
    if (!c->wsi || c->lingering) return;
    int pause = (c->deferred && !c->responded) ||
                (c->streaming && c->hdr_sent && c->out_off == c->out_len && !c->stream_ended);
    if (pause == c->rx_paused) return;
    c->rx_paused = pause;
    lws_rx_flow_control(c->wsi, !pause);
    if (pause) lws_set_timer_usecs(c->wsi, HTTP_PEER_WATCH_US);
}

/* A callback of an already dispatched transaction: lws re-delivers it because the client sent
 * more bytes (a pipelined request) before this response was complete. A response being written
 * goes out with "Connection: close" and the connection closes after it; a stream is cut at once
 * (-1: it could run for minutes with the re-deliveries spinning). See the file comment. */
static int on_pipelined(http_conn *c) {
    if (!c->pipelined) log_debug("http: %s %s: pipelined bytes; closing after this response", c->method_name, c->path);
    c->pipelined = c->close_after = 1;
    if (c->streaming) return -1;
    return 0;
}

/* One look at a lingering connection: drop what arrived; -1 (close now) once the client closed
 * its side, the socket failed, or the linger time is over; else 0 and look again soon. */
static int linger_poll(http_conn *c) {
    if (conn_drain_unread(c->wsi) || time_now_s() >= c->linger_until) return -1; /* (unread input would reset) */
    lws_set_timer_usecs(c->wsi, HTTP_LINGER_POLL_US);
    return 0;
}

/* Lingering close, as web servers do it: closing a socket that still has unread input (a client
 * that kept sending after an answer that ends the connection: the rest of a refused body,
 * pipelined requests) makes the kernel send a reset, and a reset can destroy the answer still in
 * flight. So: shut our sending side down (the client reads the whole answer, then the end), drop
 * whatever it still sends, and close when it closes or after HTTP_LINGER_S. lws does not read the
 * connection meanwhile (reading stays off); a timer drives linger_poll. */
static int linger_begin(http_conn *c) {
    int fd = (int)lws_get_socket_fd(c->wsi);
    if (fd < 0 || shutdown(fd, SHUT_WR) != 0) {
        (void)conn_drain_unread(c->wsi);
        return -1;
    }
    c->lingering = 1;
    c->linger_until = time_now_s() + HTTP_LINGER_S;
    if (!c->rx_paused) {
        c->rx_paused = 1;
        lws_rx_flow_control(c->wsi, 0);
    }
    return linger_poll(c);
}

/* The response is written and the connection closes: once lws has sent what it buffered of it
 * (a partial write), linger (above) and close; until then wait for WRITEABLE. */
static int close_when_flushed(http_conn *c) {
    c->closing = 1;
    if (c->lingering) return 0;
    if (lws_partial_buffered(c->wsi)) {
        lws_callback_on_writable(c->wsi);
        return 0;
    }
    return linger_begin(c);
}

/* The response is completely written: next transaction (keep-alive) or close. */
static int txn_finish(http_conn *c) {
    if (c->close_after || c->raw || input_pending(c)) return close_when_flushed(c);
    struct lws *wsi = c->wsi;
    txn_reset(c);
    /* (lws rebinds the protocol: c is freed and a fresh one allocated for the next request) */
    if (lws_http_transaction_completed(wsi)) return -1;
    conn_guard_idle(wsi); /* waiting for the next request: its own deadline, an idle timeout */
    return 0;
}

/* ---------------------------------------------------------------- responses */

static void txn_reset(http_conn *c) {
    if (c->responded) router_of(c)->inflight--;
    free(c->body);
    c->body = NULL;
    c->body_len = c->body_cap = 0;
    if (c->hdrs) {
        for (char **h = c->hdrs; *h; h++) free(*h);
        free(c->hdrs);
    }
    c->hdrs = NULL;
    for (int i = 0; i < c->n_mw_hdrs; i++) free(c->mw_hdrs[i]);
    free(c->mw_hdrs);
    c->mw_hdrs = NULL;
    c->n_mw_hdrs = 0;
    free(c->out);
    c->out = NULL;
    c->out_len = c->out_off = c->out_cap = 0;
    c->in_txn = c->responded = c->hdr_sent = c->streaming = c->stream_ended = c->close_after = c->pipelined = 0;
    c->chunked = 0;
    c->deferred = c->dispatched = 0;
    c->status = 0;
    c->content_len = 0;
    c->route = NULL;
    c->route_user = NULL;
    c->path_known = 0;
    c->close_fn = NULL;
    c->close_user = NULL;
}

static void conn_free(http_conn *c) {
    txn_reset(c);
    free(c->wbuf);
    c->wbuf = NULL;
}

static void set_headers(http_conn *c, const char *const *headers) {
    if (!headers) return;
    int n = 0;
    while (headers[n]) n++;
    c->hdrs = xcalloc((size_t)n + 1, sizeof *c->hdrs);
    for (int i = 0; i < n; i++) c->hdrs[i] = xstrdup(headers[i]);
}

static void out_append(http_conn *c, const void *data, size_t len) {
    if (c->out_off > 0 && c->out_off == c->out_len) c->out_off = c->out_len = 0;
    if (c->out_len + len > c->out_cap) {
        if (c->out_off > 0) { /* compact first */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        if (c->out_len + len > c->out_cap) {
            size_t cap = c->out_cap ? c->out_cap : 4096;
            while (cap < c->out_len + len) cap *= 2;
            c->out = xrealloc(c->out, cap);
            c->out_cap = cap;
        }
    }
    memcpy(c->out + c->out_len, data, len);
    c->out_len += len;
}

int http_respond(http_conn *c, int status, const char *content_type, const char *body, size_t len,
                 const char *const *headers) {
    if (!c->wsi || c->responded) return -1;
    c->responded = 1;
    router_of(c)->inflight++;
    c->status = status;
    snprintf(c->ctype, sizeof c->ctype, "%s", content_type ? content_type : "text/plain; charset=utf-8");
    set_headers(c, headers);
    if (len && c->method != HTTP_HEAD) out_append(c, body, len);
    c->content_len = len;
    rx_update(c);
    lws_callback_on_writable(c->wsi);
    return 0;
}

int http_respond_json(http_conn *c, int status, json_t *obj, const char *const *headers) {
    char *s = json_dumps(obj, UM_JSON_COMPACT);
    json_decref(obj);
    CHECK(s);
    size_t n = strlen(s);
    char *t = xmalloc(n + 2);
    memcpy(t, s, n);
    t[n] = '\n';
    free(s);
    int rc = http_respond(c, status, "application/json", t, n + 1, headers);
    free(t);
    return rc;
}

int http_respond_error(http_conn *c, int status, const char *code, const char *type, const char *param,
                       const char *msg, const char *const *headers) {
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "type", json_string(type ? type : "invalid_request_error"));
    json_object_set_new(e, "param", param && param[0] ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    return http_respond_json(c, status, json_pack("{s:o}", "error", e), headers);
}

int http_stream_begin(http_conn *c, int status, const char *content_type, const char *const *headers) {
    if (!c->wsi || c->responded) return -1;
    c->responded = 1;
    router_of(c)->inflight++;
    c->streaming = 1;
    c->status = status;
    snprintf(c->ctype, sizeof c->ctype, "%s", content_type ? content_type : "text/event-stream");
    set_headers(c, headers);
    rx_update(c);
    lws_callback_on_writable(c->wsi);
    return 0;
}

int http_stream_write(http_conn *c, const void *data, size_t len) {
    if (!c->wsi || !c->streaming || c->stream_ended) return -1;
    if (c->out_len - c->out_off + len > HTTP_STREAM_MAX) return -1;
    out_append(c, data, len);
    rx_update(c);
    lws_callback_on_writable(c->wsi);
    return 0;
}

void http_stream_end(http_conn *c) {
    if (!c->wsi || !c->streaming || c->stream_ended) return;
    c->stream_ended = 1;
    c->close_fn = NULL; /* the owner is done with c */
    c->close_user = NULL;
    rx_update(c);
    lws_callback_on_writable(c->wsi);
}

size_t http_stream_pending(const http_conn *c) { return c->out_len - c->out_off; }

void http_respond_later(http_conn *c) {
    c->deferred = 1;
    rx_update(c);
}

void http_stream_on_close(http_conn *c, void (*fn)(void *user), void *user) {
    c->close_fn = fn;
    c->close_user = user;
}

/* Add "Name: value" header lines. */
static int add_header_lines(http_conn *c, char **lines, int n, unsigned char **pp, unsigned char *end) {
    for (int i = 0; i < n; i++) {
        const char *h = lines[i];
        const char *colon = strchr(h, ':');
        if (!colon || colon == h || colon - h > 80) continue;
        char name[96];
        size_t nl = (size_t)(colon - h);
        for (size_t k = 0; k < nl; k++) name[k] = (char)tolower((unsigned char)h[k]);
        name[nl] = ':';
        name[nl + 1] = 0;
        const char *v = colon + 1;
        while (*v == ' ') v++;
        if (lws_add_http_header_by_name(c->wsi, (const unsigned char *)name, (const unsigned char *)v, (int)strlen(v),
                                        pp, end))
            return -1;
    }
    return 0;
}

/* 1 when the request was HTTP/1.1 (a streamed answer may then use chunked transfer-encoding). */
static int is_http11(http_conn *c) {
    char v[16];
    return lws_hdr_copy(c->wsi, v, sizeof v, WSI_TOKEN_HTTP) > 0 && strcmp(v, "HTTP/1.1") == 0;
}

/* The reason phrase for status codes libwebsockets 4.1 leaves without one, or NULL. */
static const char *reason_phrase(int code) {
    switch (code) {
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 503: return "Service Unavailable";
    case 507: return "Insufficient Storage";
    default: return NULL;
    }
}

/* lws writes "HTTP/1.1 202 \r\n" for codes outside its small table: put the phrase in the status
 * line that starts the headers at start (p: their end, moved by the insertion). */
static int status_line_fix(int code, unsigned char *start, unsigned char **p, unsigned char *end) {
    unsigned char *eol = memmem(start, (size_t)(*p - start), "\r\n", 2);
    const char *phrase = reason_phrase(code);
    if (!eol || eol == start || eol[-1] != ' ' || !phrase) return 0;
    size_t n = strlen(phrase);
    if (*p + n >= end) return -1;
    memmove(eol + n, eol, (size_t)(*p - eol));
    memcpy(eol, phrase, n);
    *p += n;
    return 0;
}

/* Headers (one lws_write). A stream is chunked on HTTP/1.1 (the connection stays open after it),
 * close-delimited otherwise. */
static int write_headers(http_conn *c) {
    unsigned char hb[LWS_PRE + 4096];
    unsigned char *start = hb + LWS_PRE, *p = start, *end = hb + sizeof hb - 1;
    if (!c->close_after && input_pending(c)) c->close_after = 1; /* pipelined: see the file comment */
    c->chunked = c->streaming && !c->close_after && is_http11(c);
    if (c->chunked) {
        if (lws_add_http_header_status(c->wsi, (unsigned)c->status, &p, end) ||
            lws_add_http_header_by_token(c->wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, (const unsigned char *)c->ctype,
                                         (int)strlen(c->ctype), &p, end) ||
            lws_add_http_header_by_token(c->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING, (const unsigned char *)"chunked", 7,
                                         &p, end))
            return -1;
    } else {
        /* (no length: lws adds "connection: close" itself and the end of the stream closes) */
        lws_filepos_t clen = c->streaming ? LWS_ILLEGAL_HTTP_CONTENT_LEN : (lws_filepos_t)c->content_len;
        if (lws_add_http_common_headers(c->wsi, (unsigned)c->status, c->ctype, clen, &p, end)) return -1;
        if (c->streaming) c->close_after = 1;
        else if (c->close_after &&
                 lws_add_http_header_by_token(c->wsi, WSI_TOKEN_CONNECTION, (const unsigned char *)"close", 5, &p, end))
            return -1;
    }
    if (status_line_fix(c->status, start, &p, end) != 0) return -1;
    int n_hdrs = 0;
    while (c->hdrs && c->hdrs[n_hdrs]) n_hdrs++;
    if (add_header_lines(c, c->mw_hdrs, c->n_mw_hdrs, &p, end) || add_header_lines(c, c->hdrs, n_hdrs, &p, end))
        return -1;
    if (c->streaming &&
        lws_add_http_header_by_name(c->wsi, (const unsigned char *)"cache-control:", (const unsigned char *)"no-cache",
                                    8, &p, end))
        return -1;
    if (lws_finalize_write_http_header(c->wsi, start, &p, end)) return -1;
    return 0;
}

/* Writes the last chunk of a chunked stream; then the transaction is complete. */
static int write_last_chunk(http_conn *c) {
    unsigned char b[LWS_PRE + 8];
    memcpy(b + LWS_PRE, "0\r\n\r\n", 5);
    if (lws_write(c->wsi, b + LWS_PRE, 5, LWS_WRITE_HTTP_FINAL) < 5) return -1;
    return txn_finish(c);
}

/* One WRITEABLE: headers (and the first body chunk of a one-shot response), or one body chunk.
 * Returns the callback's return value. */
static int on_writeable(http_conn *c) {
    if (c->closing) return close_when_flushed(c);
    if (!c->responded) return 0;
    if (!c->hdr_sent) {
        if (write_headers(c) != 0) return -1;
        c->hdr_sent = 1;
        const http_middleware *mw = &router_of(c)->mw;
        if (mw->after) mw->after(c, c->status, mw->user);
        if (!c->streaming && c->out_len == c->out_off) return txn_finish(c); /* empty body: done */
        rx_update(c);
        /* a one-shot body starts in the same callback when the head went out whole: between two
         * callbacks lws may read the end of a client that half-closed after its request and
         * close the connection, which would leave the client a head without its body */
        if (c->streaming || lws_partial_buffered(c->wsi)) {
            lws_callback_on_writable(c->wsi);
            return 0;
        }
    }
    size_t avail = c->out_len - c->out_off;
    if (avail == 0) {
        if (c->streaming && c->stream_ended) /* a close-delimited body ends by closing */
            return c->chunked ? write_last_chunk(c) : close_when_flushed(c);
        return 0;
    }
    /* wbuf: LWS_PRE | chunk size line (chunked) | data | CRLF (chunked) */
    if (!c->wbuf) c->wbuf = xmalloc(LWS_PRE + 16 + HTTP_CHUNK + 2);
    size_t n = avail < HTTP_CHUNK ? avail : HTTP_CHUNK;
    unsigned char *data = c->wbuf + LWS_PRE + 16;
    memcpy(data, c->out + c->out_off, n);
    c->out_off += n;
    unsigned char *w = data;
    size_t wn = n;
    if (c->chunked) {
        char line[16];
        int hl = snprintf(line, sizeof line, "%zx\r\n", n);
        w = data - hl;
        memcpy(w, line, (size_t)hl);
        memcpy(data + n, "\r\n", 2);
        wn = (size_t)hl + n + 2;
    }
    int last = !c->streaming && c->out_off == c->out_len;
    if (lws_write(c->wsi, w, wn, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) < (int)wn) return -1;
    if (last) return txn_finish(c);
    if (c->out_off < c->out_len || (c->streaming && c->stream_ended)) lws_callback_on_writable(c->wsi);
    rx_update(c);
    return 0;
}

/* ---------------------------------------------------------------- dispatch */

static const struct {
    enum lws_token_indexes tok;
    enum http_method       m;
    const char            *name;
} k_methods[] = {
    {WSI_TOKEN_GET_URI, HTTP_GET, "GET"},
    {WSI_TOKEN_POST_URI, HTTP_POST, "POST"},
#if defined(LWS_WITH_HTTP_UNCOMMON_HEADERS)
    {WSI_TOKEN_OPTIONS_URI, HTTP_OPTIONS, "OPTIONS"},
    {WSI_TOKEN_PUT_URI, HTTP_PUT, "PUT"},
    {WSI_TOKEN_PATCH_URI, HTTP_PATCH, "PATCH"},
    {WSI_TOKEN_DELETE_URI, HTTP_DELETE, "DELETE"},
#endif
    {WSI_TOKEN_HEAD_URI, HTTP_HEAD, "HEAD"},
};

static void detect_method(http_conn *c) {
    c->method = HTTP_OTHER;
    snprintf(c->method_name, sizeof c->method_name, "OTHER");
    for (size_t i = 0; i < sizeof k_methods / sizeof k_methods[0]; i++)
        if (lws_hdr_total_length(c->wsi, k_methods[i].tok) > 0) {
            c->method = k_methods[i].m;
            snprintf(c->method_name, sizeof c->method_name, "%s", k_methods[i].name);
            return;
        }
}

/* The request is answered from now on (by its handler or an error): exactly once (see the file
 * comment); its arrival deadline no longer runs (conn_guard.h). */
static void txn_dispatch(http_conn *c) {
    c->dispatched = 1;
    conn_guard_answering(c->wsi);
}

static int run_handler(http_conn *c) {
    txn_dispatch(c);
    http_req rq = {
        .method = c->method,
        .method_name = c->method_name,
        .path = c->path,
        .body = c->body ? c->body : "",
        .body_len = c->body_len,
        .srv = c->rt->srv,
        .user = c->route_user,
    };
    int rc = c->route->fn(c, &rq);
    if (rc < 0) return -1;
    if (!c->responded && !c->deferred) {
        log_error("http: handler for %s %s produced no response", c->method_name, c->path);
        return http_respond_error(c, 500, "internal_error", "server_error", NULL, "the handler produced no response",
                                  NULL);
    }
    return 0;
}

/* An answer without running a handler (errors, static files): the transaction is dispatched. */
static int answer_error(http_conn *c, int status, const char *code, const char *msg, int close_after) {
    txn_dispatch(c);
    if (close_after) c->close_after = 1;
    return http_respond_error(c, status, code, status >= 500 ? "server_error" : "invalid_request_error", NULL, msg,
                              NULL);
}

static int answer_static(http_conn *c) {
    txn_dispatch(c);
    static_file f;
    int status = static_lookup(c->rt->web_root, c->path, &f);
    if (status) { /* static.c decided on an error status: answer in JSON */
        const char *msg = status == 404 ? "not found" : status == 403 ? "forbidden" : "bad request";
        return answer_error(c, status, status == 404 ? "not_found" : status == 403 ? "forbidden" : "bad_path", msg, 0);
    }
    static const char *const hdrs[] = {"Cache-Control: no-cache", NULL};
    int rc = http_respond(c, 200, f.mime, f.data, f.len, hdrs);
    free(f.data);
    return rc;
}

/* No route claims (method, path): a static file for GET/HEAD, else 405 or 404. */
static int answer_unrouted(http_conn *c) {
    if (c->method == HTTP_GET || c->method == HTTP_HEAD) return answer_static(c);
    if (c->path_known) return answer_error(c, 405, "method_not_allowed", "method not allowed for this path", 0);
    return answer_error(c, 404, "not_found", "no such endpoint", 0);
}

/* 1 when every byte of s is a decimal digit (and there is at least one). */
static int all_digits(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (*s < '0' || *s > '9') return 0;
    return 1;
}

/* Request framing (RFC 9112 section 6): how long the body is, refusing what lws would misread. */
typedef struct framing {
    long long   want;       /* body bytes announced by Content-Length */
    int         wait_body;  /* the handler waits for LWS_CALLBACK_HTTP_BODY_COMPLETION */
    int         status;     /* 0, or the error to answer (the connection then closes) */
    const char *code, *msg;
} framing;

static framing check_framing(http_conn *c) {
    framing f = {0};
    int has_te = lws_hdr_total_length(c->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) > 0;
    int cl_len = lws_hdr_total_length(c->wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH);
    if (has_te && cl_len > 0) {
        f.status = 400, f.code = "bad_framing";
        f.msg = "a request must not carry both Transfer-Encoding and Content-Length";
    } else if (has_te) {
        f.status = 411, f.code = "length_required";
        f.msg = "chunked or other transfer-encoded request bodies are not supported: send Content-Length";
    } else if (cl_len > 0) {
        char cl[32];
        if (cl_len >= (int)sizeof cl || lws_hdr_copy(c->wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH) <= 0 ||
            !all_digits(cl) || strlen(cl) > 15) {
            f.status = 400, f.code = "bad_content_length", f.msg = "Content-Length must be one decimal number";
        } else {
            f.want = atoll(cl);
            /* lws delivers BODY_COMPLETION for a non-empty body, and for an explicit 0 on POST only */
            f.wait_body = f.want > 0 || c->method == HTTP_POST;
        }
    }
    /* no length and no transfer-encoding: no body (RFC 9112 6.3); lws however expects one on
     * POST/PUT/PATCH and would read the next request as its body, so such a connection closes
     * after its response, as does every connection whose framing was refused */
    if (f.status || (!has_te && cl_len <= 0 &&
                     (c->method == HTTP_POST || c->method == HTTP_PUT || c->method == HTTP_PATCH)))
        c->close_after = 1;
    return f;
}

/* 1 when some request header reached its token limit (lws cuts it there): answer 431 / 414. */
static int headers_truncated(http_conn *c, int *uri) {
    *uri = 0;
    for (int t = 0; t < WSI_TOKEN_COUNT; t++) {
        int n = lws_hdr_total_length(c->wsi, (enum lws_token_indexes)t);
        if (n >= HTTP_TOKEN_LIMIT - 1) {
            *uri = t == WSI_TOKEN_GET_URI || t == WSI_TOKEN_POST_URI || t == WSI_TOKEN_HTTP_URI_ARGS ||
                   t == WSI_TOKEN_HEAD_URI
#if defined(LWS_WITH_HTTP_UNCOMMON_HEADERS)
                   || t == WSI_TOKEN_OPTIONS_URI || t == WSI_TOKEN_PUT_URI || t == WSI_TOKEN_PATCH_URI ||
                   t == WSI_TOKEN_DELETE_URI
#endif
                ;
            return 1;
        }
    }
    return 0;
}

/* 1 for the tokens of the request line (method + URI, query, version). */
static int request_line_token(int t) {
    return t == WSI_TOKEN_GET_URI || t == WSI_TOKEN_POST_URI || t == WSI_TOKEN_HEAD_URI || t == WSI_TOKEN_HTTP ||
           t == WSI_TOKEN_HTTP_URI_ARGS || t == WSI_TOKEN_CONNECT
#if defined(LWS_WITH_HTTP_UNCOMMON_HEADERS)
           || t == WSI_TOKEN_OPTIONS_URI || t == WSI_TOKEN_PUT_URI || t == WSI_TOKEN_PATCH_URI || t == WSI_TOKEN_DELETE_URI
#endif
        ;
}

/* Headers lws 4.1.6 does not know by name are kept without a size limit of their own (only the
 * 32 KB head bounds them) and cannot be listed. So they are measured together: the request's
 * bytes on the wire (conn_guard_request_bytes, body_len of them body) minus an upper bound of what
 * the known parts took — the request line as if every byte were percent-encoded, each known header
 * line with room for its name, spaces and line end, TLS record overhead — which leaves a lower
 * bound of the unknown headers' bytes: 1 when that is over HTTP_TOKEN_LIMIT (one header's limit).
 * Never more than the real size, so a request within the limit is never refused. */
static int unknown_headers_too_large(http_conn *c, size_t body_len) {
    if (input_pending(c)) return 0; /* bytes of a pipelined request would count too */
    long long wire = conn_guard_request_bytes(c->wsi);
    if (wire < 0) return 0;
    long long head = wire - (long long)body_len, known = 64; /* request line's spaces, version, line ends */
    for (int t = 0; t < WSI_TOKEN_COUNT; t++) {
        int n = lws_hdr_total_length(c->wsi, (enum lws_token_indexes)t);
        if (n <= 0) continue;
        if (request_line_token(t)) {
            known += 3LL * n + 16;
            continue;
        }
        const unsigned char *name = lws_token_to_string((enum lws_token_indexes)t);
        int frags = 1; /* one header line per fragment (a repeated header has several) */
        while (frags < 4096 && lws_hdr_fragment_length(c->wsi, (enum lws_token_indexes)t, frags) > 0) frags++;
        known += n + (long long)frags * ((name ? (long long)strlen((const char *)name) : 32) + 8);
    }
    if (lws_is_ssl(c->wsi)) known += 64 * (1 + head / 16384); /* per TLS record, at most 16 KB each */
    return head - known > HTTP_TOKEN_LIMIT;
}

static int answer_headers_too_large(http_conn *c) {
    return answer_error(c, 431, "headers_too_large",
                        "request header fields are too large: 8 KB per header (headers this server does not use: "
                        "8 KB together)",
                        1);
}

static int on_http(http_conn *c, const char *uri, size_t len) {
    txn_reset(c);
    c->in_txn = 1;
    conn_guard_request_head(c->wsi); /* its body (if any) must arrive before the deadline too */
    detect_method(c);
    int uri_long = 0;
    if (headers_truncated(c, &uri_long))
        return uri_long ? answer_error(c, 414, "uri_too_long", "the request URI is too long", 1)
                        : answer_headers_too_large(c);
    if (len >= sizeof c->path || len == 0 || uri[0] != '/') {
        if (len >= sizeof c->path) return answer_error(c, 414, "uri_too_long", "the request path is too long", 1);
        return answer_error(c, 400, "bad_path", "the request path is malformed", 1);
    }
    memcpy(c->path, uri, len);
    c->path[len] = 0;
    if (strlen(c->path) != len) /* embedded NUL */
        return answer_error(c, 400, "bad_path", "the request path is malformed", 1);
    framing f = check_framing(c);
    if (!f.status && !f.wait_body && unknown_headers_too_large(c, 0)) return answer_headers_too_large(c);
    /* lws armed a 30 s timeout for a body; without one it must not cut a long answer */
    if (!f.wait_body) lws_set_timeout(c->wsi, NO_PENDING_TIMEOUT, 0);
    int path_known = 0;
    const http_router *rt = router_of(c);
    c->route = route_find(rt, c->method_name, c->path, &path_known, &c->route_user);
    if (rt->mw.before) {
        http_req rq = {.method = c->method, .method_name = c->method_name, .path = c->path, .body = "", .srv = c->rt->srv,
                       .user = rt->mw.user};
        if (rt->mw.before(c, &rq, c->route)) {
            txn_dispatch(c);
            if (f.wait_body) c->close_after = 1; /* the unread body must not become the next request */
            if (!c->responded)
                return http_respond_error(c, 500, "internal_error", "server_error", NULL,
                                          "the middleware produced no response", NULL);
            return 0;
        }
    }
    if (f.status) return answer_error(c, f.status, f.code, f.msg, 1);
    const server_config *cfg = c->rt->cfg;
    if ((unsigned long long)f.want > cfg->max_message_bytes) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", cfg->max_message_bytes);
        return answer_error(c, 413, "body_too_large", msg, 1);
    }
    c->path_known = path_known;
    if (!c->route && !f.wait_body) return answer_unrouted(c);
    if (f.wait_body) { /* the handler (or 404/405) runs on LWS_CALLBACK_HTTP_BODY_COMPLETION */
        c->body_cap = (size_t)f.want + 1;
        c->body = xmalloc(c->body_cap);
        c->body[0] = 0;
        return 0;
    }
    return run_handler(c);
}

static int on_body(http_conn *c, const void *in, size_t len) {
    if (!c->in_txn) return 0;
    if (c->dispatched) /* an answered request's unread body, or an lws re-delivery */
        return c->close_after ? 0 : on_pipelined(c);
    const server_config *cfg = c->rt->cfg;
    if (c->body_len + len > cfg->max_message_bytes)
        return answer_error(c, 413, "body_too_large", "the request body is too large", 1);
    if (c->body_len + len + 1 > c->body_cap) {
        c->body_cap = (c->body_len + len + 1) * 2;
        c->body = xrealloc(c->body, c->body_cap);
    }
    if (len) memcpy(c->body + c->body_len, in, len);
    c->body_len += len;
    c->body[c->body_len] = 0;
    return 0;
}

static int on_body_complete(http_conn *c) {
    if (!c->in_txn) return 0;
    if (c->dispatched) /* the body of an answered request ended, or an lws re-delivery */
        return on_pipelined(c);
    if (unknown_headers_too_large(c, c->body_len)) return answer_headers_too_large(c);
    return c->route ? run_handler(c) : answer_unrouted(c);
}

/* ---------------------------------------------------------------- answers below the HTTP layer */

int http_request_timeout(struct lws *wsi) {
    const struct lws_protocols *p = lws_get_protocol(wsi);
    http_conn *c = p && p->callback == http_lws_cb ? lws_wsi_user(wsi) : NULL;
    if (!c || c->wsi != wsi || !c->in_txn || c->dispatched || c->lingering) return 0;
    char msg[160];
    snprintf(msg, sizeof msg, "the request body did not arrive within %g s (--request-timeout)",
             c->rt->cfg->request_timeout_s);
    if (answer_error(c, 408, "request_timeout", msg, 1) != 0) return 0;
    return 1;
}

/* CONNECT, and methods lws does not know (it hands such a connection over as raw bytes, the head
 * included): 405 with the methods the target allows, then the connection closes. The method and
 * target are read from the first bytes; the answer is ready before them (they may not come). */
static void raw_answer(http_conn *c, const char *head, size_t len) {
    char method[16] = "", target[256] = "", allow[160] = "", hdr[200], msg[200];
    size_t m = 0;
    while (m < len && m < sizeof method - 1 && head[m] >= 'A' && head[m] <= 'Z') method[m] = head[m], m++;
    method[m] = 0;
    if (m && m < len && head[m] == ' ') {
        size_t t = 0;
        for (size_t i = m + 1; i < len && t < sizeof target - 1 && head[i] > ' ' && head[i] < 0x7f; i++) target[t++] = head[i];
        target[t] = 0;
    }
    if (target[0] == '/') { /* a path: its routes' methods, GET/HEAD for the static files otherwise */
        char path[sizeof target];
        snprintf(path, sizeof path, "%.*s", (int)strcspn(target, "?#"), target);
        http_routes_allowed(c->rt, path, 0, allow, sizeof allow);
        if (!allow[0]) snprintf(allow, sizeof allow, "GET, HEAD");
    } else { /* CONNECT's host:port (or nothing): no resource here, say what the server takes */
        snprintf(allow, sizeof allow, "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS");
    }
    int known = strcmp(method, "CONNECT") == 0;
    snprintf(c->method_name, sizeof c->method_name, "%s", known ? "CONNECT" : "OTHER"); /* bounded metric labels */
    snprintf(msg, sizeof msg, "the method %s is not supported (allowed: %s)", method[0] ? method : "of this request",
             allow);
    snprintf(hdr, sizeof hdr, "Allow: %s\r\n", allow);
    char buf[1024];
    size_t n = http_error_bytes(buf, sizeof buf, 405, "method_not_allowed", msg, hdr);
    c->out_len = c->out_off = 0;
    out_append(c, buf, n);
    c->status = 405;
}

/* Raw role callbacks of such a connection (see raw_answer). */
static int on_raw(http_conn *c, struct lws *wsi, http_router *rt, enum lws_callback_reasons reason, const void *in,
                  size_t len) {
    switch (reason) {
    case LWS_CALLBACK_RAW_ADOPT:
        c->wsi = wsi;
        c->rt = rt;
        c->raw = 1;
        conn_guard_open(wsi); /* answered at once: no deadline */
        raw_answer(c, "", 0);
        lws_callback_on_writable(wsi);
        return 0;
    case LWS_CALLBACK_RAW_RX: /* the head (first call), then whatever follows: dropped */
        if (c->raw == 1 && !c->hdr_sent) raw_answer(c, in, len);
        c->raw = 2;
        return 0;
    case LWS_CALLBACK_RAW_WRITEABLE: {
        if (c->lingering) return 0;
        if (c->closing || c->hdr_sent) return close_when_flushed(c);
        size_t n = c->out_len - c->out_off;
        unsigned char *b = xmalloc(LWS_PRE + n);
        memcpy(b + LWS_PRE, c->out + c->out_off, n);
        int w = lws_write(wsi, b + LWS_PRE, n, LWS_WRITE_RAW);
        free(b);
        if (w < (int)n) return -1;
        c->hdr_sent = 1;
        const http_middleware *mw = &router_of(c)->mw;
        if (mw->after) mw->after(c, c->status, mw->user);
        return close_when_flushed(c);
    }
    default:
        return 0;
    }
}

int http_confirm_upgrade(struct lws *wsi) {
    /* WebSocket only on /ws (a new connection is bound to the default protocol, so both the
     * http and the ws callback route LWS_CALLBACK_HTTP_CONFIRM_UPGRADE here). Anything else gets
     * a 404 written at once and the connection closes (lws would otherwise complete the
     * transaction here, in the middle of its input, where pipelined bytes would be misread). */
    char uri[256];
    int n = lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI);
    if (n <= 0 || strcmp(uri, "/ws") != 0) {
        (void)lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND, "the WebSocket endpoint is /ws");
        return -1;
    }
    return 0;
}

int http_lws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    http_conn *c = user;
    http_router *rt = router_at(wsi);
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return http_confirm_upgrade(wsi);
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        /* a WebSocket that asked for the subprotocol "http" would bind to this protocol: no session,
         * no key check, not counted. WebSockets speak "unmask" (ws.c) or nothing. */
        log_info("websocket handshake refused: subprotocol \"http\" is not a WebSocket protocol here");
        return 1;
    case LWS_CALLBACK_ESTABLISHED:
        return -1;
    /* connection limits (conn_guard.h): protocols[0] hears of every accepted socket */
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return rt && rt->guard ? conn_guard_on_accept(rt->guard, user) : 0;
    case LWS_CALLBACK_WSI_CREATE:
        if (rt && rt->guard) conn_guard_on_wsi_create(rt->guard, wsi);
        return 0;
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED: /* (normally on the default protocol, ws.c) */
        if (rt && rt->guard) conn_guard_on_adopt(rt->guard, wsi);
        return 0;
    case LWS_CALLBACK_WSI_DESTROY:
        if (rt && rt->guard) conn_guard_on_wsi_destroy(rt->guard, wsi);
        return 0;
    case LWS_CALLBACK_SSL_INFO:
        conn_guard_on_tls_info(wsi, ((const struct lws_ssl_info *)in)->where);
        return 0;
    case LWS_CALLBACK_RAW_ADOPT:
    case LWS_CALLBACK_RAW_RX:
    case LWS_CALLBACK_RAW_WRITEABLE:
        if (!c) return -1;
        return on_raw(c, wsi, rt, reason, in, len);
    case LWS_CALLBACK_RAW_CLOSE:
        if (c) {
            conn_free(c);
            c->wsi = NULL;
        }
        return 0;
    case LWS_CALLBACK_HTTP:
        if (!c) return -1;
        if (c->lingering) return 0; /* the connection is closing: its input is dropped */
        if (c->in_txn && c->dispatched) /* lws re-delivers the current request: pipelined bytes */
            return on_pipelined(c);
        c->wsi = wsi;
        c->rt = rt;
        return on_http(c, in, len) < 0 ? -1 : 0;
    case LWS_CALLBACK_HTTP_BODY:
        if (!c) return -1;
        if (c->lingering) return 0;
        return on_body(c, in, len) < 0 ? -1 : 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (!c) return -1;
        if (c->lingering) return 0;
        return on_body_complete(c) < 0 ? -1 : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (!c || c->lingering) return 0;
        return on_writeable(c);
    case LWS_CALLBACK_TIMER: /* reading is stopped: look for a hang-up the reads would have seen */
        if (!c || !c->wsi || !c->rx_paused) return 0;
        if (c->lingering) return linger_poll(c);
        if (conn_peer_gone(wsi)) return -1;
        lws_set_timer_usecs(wsi, HTTP_PEER_WATCH_US);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        if (c) {
            if (c->close_fn) {
                void (*fn)(void *) = c->close_fn;
                void *u = c->close_user;
                c->close_fn = NULL;
                fn(u);
            }
            conn_free(c);
            c->wsi = NULL;
        }
        return 0;
    default:
        return 0;
    }
}
