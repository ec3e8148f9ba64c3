/*
 * server.h — `unmask serve`: one lws context (ONE service thread = the thread that calls
 * server_run) serving static files from web/, HTTP routes (server/http.h) and the WebSocket
 * protocol (server/ws.c) on one port, optionally over TLS.
 *
 * Event path: engine threads (sched/) -> server hub (a locked list) + lws_cancel_service() ->
 * the service thread drains the hub completely on every LWS_CALLBACK_EVENT_WAIT_CANCELLED and
 * hands each event to its request's `deliver` hook (a WebSocket session, an SSE stream, ...),
 * which queues bytes and asks lws for WRITEABLE. Producers never touch lws objects.
 *
 * Startup: the listener opens first (GET /health answers 503 {"status":"loading"}), a loader
 * thread loads the model and starts the engines, then /health answers 200 {"status":"ok"}.
 * SIGINT/SIGTERM stop the loop; engines are joined before the lws context is destroyed.
 *
 * Not here: route handlers (http.c, routes_*.c), the WebSocket protocol (ws.c, session.c).
 * Threads: server_run on the main thread (it becomes the service thread); the accessors below on
 * the service thread (route handlers, ws callbacks) unless noted.
 */
#ifndef UM_SERVER_H
#define UM_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "sched/sched.h"
#include "server/server_config.h"
#include "util/err.h"

typedef struct server server;

/* A server for cfg (which must outlive it): checks the listen address, resolves the web root,
 * builds the request policy (limits, --algorithm-config, --cache) and the core routes. Nothing
 * listens yet. NULL with err on a bad setting. Main thread. */
server *server_create(const server_config *cfg, um_err *err);
/* Listen, load the model, serve until SIGINT/SIGTERM (or a fatal startup error), stop in order.
 * The calling thread becomes the service thread. Returns the process exit code: 0 after a clean
 * stop, 1 when the model failed to load or the port could not be opened (err says why). */
int     server_run(server *s, um_err *err);
/* After server_run returned (or instead of it). */
void    server_free(server *s);
/* A follower node of multi-node tensor parallelism (node_rank > 0): loads the model, joins node
 * 0's group (its GPUs become follower ranks), prints that it joined and serves until node 0 stops.
 * No HTTP listener. 0 after node 0's stop, 1 on setup errors (err says why). Main thread. */
int server_follow(const server_config *cfg, um_err *err);

const server_config *server_cfg(const server *s);
/* 1 once the model is loaded and the engines run (any thread). */
int           server_ready(const server *s);
/* NULL until server_ready(). */
const model  *server_model(const server *s);
sched        *server_sched(server *s);
/* The longest prompt + gen (+ suffix) the server accepts (--max-seq, else the model's maximum);
 * 0 until server_ready(). */
/* Its HTTP routes and middleware (server/http.h: route modules add theirs here). */
struct http_router *server_router(server *s);
int           server_max_seq(const server *s);

/* Submit r (r->deliver / r->owner set by the caller): sched_submit on the running scheduler, or
 * -1 with UM_ERR_UNSUPPORTED "the model is still loading" before server_ready(). */
int  server_submit(server *s, sched_req *r, int *queue_pos, um_err *err);
/* sched_cancel(r) (service thread; r's final event has not been delivered yet). */
void server_cancel(server *s, sched_req *r);
/* sched_set_background(r, bg): bg 1 while the client that reads r's events is gone (a detached
 * WebSocket session), 0 when it is back (service thread). */
void server_set_background(server *s, sched_req *r, int bg);
/* Hand a request's preparation (parse, chat template, tokenize, build: server/prep.h) to the
 * preparation workers; j->done runs later on the service thread. Service thread. */
struct prep_job;
void server_prep(server *s, struct prep_job *j);

/* Graceful shutdown (set on the main thread before server_run; server/http_api.c does it): with
 * grace_s > 0 the first SIGINT/SIGTERM starts draining instead of stopping: server_draining()
 * turns 1 (the HTTP APIs answer new work with 503), begin(s, user) runs once, and the loop keeps
 * serving until the scheduler is idle, every HTTP response is written and idle(s, user) (may be
 * NULL) agrees — or grace_s passed (what is left is cancelled). A second signal stops at once. */
void server_set_drain(server *s, double grace_s, void (*begin)(server *s, void *user),
                      int (*idle)(server *s, void *user), void *user);
int  server_draining(const server *s);
/* ready(s, user) runs once on the service thread when the model is loaded and the server serves
 * (the HTTP APIs start the async jobs a previous run left queued). Main thread, before server_run. */
void server_set_on_ready(server *s, void (*ready)(server *s, void *user), void *user);
/* wake(user) runs on the service thread after every wake-up (after engine events and prepared
 * requests): a layer whose own threads hand it work calls server_wake() (any thread) and takes
 * that work here. Main thread, before server_run. */
void server_set_on_wake(server *s, void (*wake)(void *user), void *user);
void server_wake(server *s);   /* any thread */
/* begin(user) / end(user) bracket each batch of engine events the service thread delivers (one
 * wake-up: typically one decode step of every running sequence), so a layer can group its work
 * per batch (the durable job store commits a step's events together). Main thread, before server_run. */
void server_set_event_batch(server *s, void (*begin)(void *user), void (*end)(void *user), void *user);

/* Server-side event latency (engine produced the event -> its frame handed to lws_write), kept as
 * a histogram; transports call this when they write an event's bytes. Service thread. */
void server_note_event_written(server *s, uint64_t t_event_ns);

typedef struct server_event_stats {
    uint64_t count;
    double   mean_us, p50_us, p99_us, max_us;
} server_event_stats;
void server_get_event_stats(const server *s, server_event_stats *out);

/* Live connections (service thread): WebSocket connections open / sessions alive. */
typedef struct server_conn_stats {
    int ws_connections;
    int sessions;
    int sessions_detached;
    size_t session_bytes;   /* every session's buffered events (--sessions-max-bytes) */
    uint64_t ws_ended;      /* WebSocket connections closed + sessions ended since the start */
    /* connection limits (server/conn_guard.h) */
    int       open;             /* accepted connections (HTTP, TLS, WebSocket) not yet closed */
    int       addresses;        /* client addresses (IPv6 /64s) they are counted under */
    long long refused;          /* closed at accept: their address was at --max-conns-per-address */
    long long request_timeouts; /* requests that did not arrive within --request-timeout */
    long long idle_closed;      /* keep-alive connections closed after --keepalive-timeout */
} server_conn_stats;
void server_get_conn_stats(const server *s, server_conn_stats *out);

/* Returning freed memory to the OS (server.c, memory_tick): the process's resident set now, and
 * the trims done so far with the resident bytes they gave back. Service thread. */
typedef struct server_mem_stats {
    size_t   rss_bytes;
    uint64_t trims;
    size_t   trimmed_bytes;
} server_mem_stats;
void server_get_mem_stats(const server *s, server_mem_stats *out);

/* The server's metrics (server/metrics.h) and the policy every request of every transport starts
 * from (api/algo_config.h: limits, decoder defaults, default KV cache). Any thread. */
struct metrics;
struct metrics *server_metrics(server *s);
struct api_policy;
const struct api_policy *server_policy(const server *s);
/* Per-caller quotas and the rate limit every transport applies (server/callers.h). Any thread. */
struct callers;
struct callers *server_callers(server *s);

/* The WebSocket layer's state (server/ws.c), owned by the server. */
struct ws_state;
struct ws_state *server_ws(server *s);
struct lws_context *server_lws_context(server *s);

#endif /* UM_SERVER_H */
