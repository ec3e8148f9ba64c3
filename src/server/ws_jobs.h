/*
 * ws_jobs.h — a WebSocket session's async job subscriptions (job.subscribe / job.unsubscribe,
 * docs/protocol.md): which jobs it follows, the `job.update` events it gets (the job's
 * GET /v1/jobs/{id} object, at once on subscribe and on every status change until the final one),
 * the per-session bound (--max-session-job-subscriptions).
 *
 * The changes come from the job API's watches (server_job_hooks, server/http_jobs.c: the same
 * subscriber list as the SSE event streams, told at once of what happens to a job on this server
 * and polling the shared store for jobs other replicas run). The set belongs to the session, not
 * to its connection: while the client is away the updates queue in the session like its
 * generations' events, and a resume replays them.
 *
 * Not here: message parsing (api/ws_protocol.c), the session's buffer (session.c).
 * Threads: lws service thread only.
 */
#ifndef UM_WS_JOBS_H
#define UM_WS_JOBS_H

#include <jansson.h>

#include "server/server.h"

typedef struct ws_jobs ws_jobs;

/* The subscriptions of one session of caller who; push(user, ev) queues a session event (steals
 * ev). */
ws_jobs *ws_jobs_new(server *srv, const char *who, void (*push)(void *user, json_t *ev), void *user);
/* Ends every subscription (nothing is pushed). NULL is fine. */
void     ws_jobs_free(ws_jobs *j);

/* The jobs followed now (0 for NULL). */
int      ws_jobs_count(const ws_jobs *j);

/* job.subscribe: a `job.update` with the job's object now (event_id echoed; the final one when the
 * job already finished), then one per status change; or an `error`: unknown_job (no such job of
 * this caller), too_many_subscriptions, store_unavailable. Subscribing again to a job already
 * followed sends its object again (one subscription either way). */
void ws_jobs_subscribe(ws_jobs *j, const char *job_id, const char *event_id);
/* job.unsubscribe: no more updates of that job; answered `job.unsubscribed` with "subscribed":
 * whether it was followed (a job not followed, or already finished, is no error). */
void ws_jobs_unsubscribe(ws_jobs *j, const char *job_id, const char *event_id);

#endif /* UM_WS_JOBS_H */
