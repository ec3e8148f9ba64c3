/*
 * http.h — HTTP on the server port: a route table dispatched from the lws "http" protocol
 * (protocols[0]), responses written one lws_write per WRITEABLE, streaming bodies (SSE), and
 * static files from the web root for every GET that no route claims.
 *
 * Adding routes (e.g. OpenAI/SGLang APIs in another file):
 *   static int h_generate(http_conn *c, const http_req *rq) { my_api *a = rq->user; ... }
 *   static const http_route k_routes[] = {{"POST", "/generate", 0, h_generate}, {NULL}};
 *   http_routes_add(server_router(srv), k_routes, my_api);   (once, before server_run)
 * Routes and middleware belong to one server instance (no process-wide tables). A handler must
 * produce exactly one response: http_respond*() (possibly later, from a request's deliver hook on
 * the service thread) or http_stream_begin() + http_stream_write()* + http_stream_end(). Returning
 * -1 closes the connection without a response.
 *
 * Request bodies are collected up to max_message_bytes (413 beyond) before the handler runs.
 * Streams: the handler keeps the http_conn pointer until the stream ends or the on_close callback
 * runs (the client went away: cancel the generation there). Stream bytes are queued and written
 * in chunks as the socket allows.
 *
 * Not here: WebSocket (ws.c), JSON request parsing (api/). Threads: lws service thread only.
 */
#ifndef UM_HTTP_H
#define UM_HTTP_H

#include <jansson.h>
#include <libwebsockets.h>
#include <stddef.h>

#include "server/server_config.h"

struct server;
struct conn_guard;

/* Request head limits (server.c sets them on the lws context, http.c answers 431 / 414). */
#define HTTP_HEADER_BYTES (32 << 10) /* all request header bytes, per connection while parsing */
#define HTTP_TOKEN_LIMIT  8192       /* one header's (or the URI's) bytes */

/* ---------------------------------------------------------------- the router
 * One server's routes, middleware and what the HTTP layer needs of it (its limits, the connection
 * guard, the web root): server.c creates it and makes it its vhost's user data; route modules add
 * their routes to it. */
typedef struct http_router http_router;
/* srv is handed to handlers as http_req.srv; cfg gives the message size and request timeout. */
http_router *http_router_new(struct server *srv, const server_config *cfg);
/* The connection guard (NULL: none) and the web root (NULL: no static files); before serving. */
void         http_router_set_limits(http_router *r, struct conn_guard *guard, const char *web_root);
void         http_router_free(http_router *r);

/* The lws "http" protocol (protocols[0]) of the router's vhost, its per-connection size. */
int    http_lws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len);
size_t http_conn_size(void);
/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: 0 to allow (path /ws), 1 after answering 404, -1 to close. */
int    http_confirm_upgrade(struct lws *wsi);
/* The deadline of the request on wsi passed while its body was arriving: 1 after answering 408
 * (the connection closes after it), 0 when wsi holds no such request (conn_guard's late-body hook). */
int    http_request_timeout(struct lws *wsi);

typedef struct http_conn http_conn;

enum http_method { HTTP_GET, HTTP_HEAD, HTTP_POST, HTTP_PUT, HTTP_PATCH, HTTP_DELETE, HTTP_OPTIONS, HTTP_OTHER };

typedef struct http_req {
    enum http_method method;
    const char      *method_name;  /* "GET", ... */
    const char      *path;         /* decoded path without the query, starts with '/' */
    const char      *body;         /* complete body (NUL-terminated), "" when none */
    size_t           body_len;
    struct server   *srv;
    void            *user;         /* the route set's user (http_routes_add), or the middleware's */
} http_req;

typedef int (*http_handler)(http_conn *c, const http_req *rq);

typedef struct http_route {
    const char  *method;   /* "GET", "POST", ..., or "*" for any method */
    const char  *path;     /* exact path, or a prefix when prefix = 1 (e.g. "/v1/jobs/") */
    int          prefix;
    http_handler fn;
    unsigned     flags;    /* HTTP_ROUTE_* */
} http_route;
#define HTTP_ROUTE_API     1u  /* the API middleware's policy applies: API keys, rate limits, drain */
#define HTTP_ROUTE_NO_AUTH 2u  /* ... except API keys and rate limits (e.g. /metrics) */

/* Register routes on server s (array ending with a {NULL} entry; must stay valid); their handlers
 * get user as rq->user. Main thread, before server_run. Exact matches win over prefixes; longer
 * prefixes win over shorter ones. Adding the same array again does nothing. */
void http_routes_add(http_router *r, const http_route *routes, void *user);

/* ---------------------------------------------------------------- middleware */

/* One middleware per server (server/http_api.c installs it): cross-cutting policy of every HTTP
 * request. */
typedef struct http_middleware {
    /* Every request, once method and path are known and the route is chosen (NULL: none matched:
     * static file, 404 or 405), before its body is read (rq->body is "", rq->user is user below).
     * It may add response headers (http_add_header) and may answer itself: return 1 and the
     * handler is not run (an unread request body then closes the connection after the response). */
    int  (*before)(http_conn *c, const http_req *rq, const http_route *route);
    /* Every response, with its status (metrics). */
    void (*after)(http_conn *c, int status, void *user);
    void  *user;
} http_middleware;
void http_set_middleware(http_router *r, const http_middleware *mw);
/* Add a "Name: value" header to the current transaction's response, whatever answers it. */
void http_add_header(http_conn *c, const char *line);
/* The methods of s's routes that have all of flags and claim path, as "GET, POST" into allow
 * ("" when none). */
void http_routes_allowed(const http_router *r, const char *path, unsigned flags, char *allow, size_t cap);
/* The current transaction's route (NULL: none) and method name. */
const http_route *http_conn_route(const http_conn *c);
const char       *http_conn_method(const http_conn *c);

/* Responses set up but not completely written yet, over all of s's connections (graceful shutdown
 * waits for 0 so that no answer is cut off). */
int http_responses_in_flight(const http_router *r);

/* ---------------------------------------------------------------- request helpers */

/* Request header by lowercase name ("authorization", "content-type", "x-api-key", ...): copies
 * into buf (NUL-terminated) and returns its length; -1 when absent, -2 when present but unusable:
 * longer than cap - 1, or holding a NUL byte (which would cut the C string short). */
int  http_header(http_conn *c, const char *name, char *buf, size_t cap);
/* URL query argument ("?name=value", decoded): like http_header. */
int  http_query(http_conn *c, const char *name, char *buf, size_t cap);
/* The peer's address as text ("127.0.0.1"). */
void http_peer(http_conn *c, char *buf, size_t cap);

/* ---------------------------------------------------------------- responses */

/* Extra headers: NULL or an array of "Name: value" strings ending with NULL. */
int http_respond(http_conn *c, int status, const char *content_type, const char *body, size_t len,
                 const char *const *headers);
/* JSON body (steals obj). */
int http_respond_json(http_conn *c, int status, json_t *obj, const char *const *headers);
/* {"error":{"message":msg,"type":type,"param":param|null,"code":code}} with status. */
int http_respond_error(http_conn *c, int status, const char *code, const char *type, const char *param,
                       const char *msg, const char *const *headers);

/* The handler answers later (from a deliver hook, on the service thread) with http_respond*() or a
 * stream; until then http_stream_on_close() tells when the client goes away. */
void http_respond_later(http_conn *c);

/* Streaming response (SSE or chunked-style close-delimited body). */
int  http_stream_begin(http_conn *c, int status, const char *content_type, const char *const *headers);
/* Queue bytes; -1 when the stream is closed or over its buffer limit (the caller should stop). */
int  http_stream_write(http_conn *c, const void *data, size_t len);
void http_stream_end(http_conn *c);
/* Bytes queued but not yet written (back-pressure hint). */
size_t http_stream_pending(const http_conn *c);
/* Called once if the connection closes before http_stream_end() was flushed (client went away).
 * After it returns the http_conn is gone. */
void http_stream_on_close(http_conn *c, void (*fn)(void *user), void *user);

#endif /* UM_HTTP_H */
