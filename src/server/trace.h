/*
 * trace.h — the denoising trace of every WebSocket generation, for GET /v1/generations/{id}/trace:
 * its events (step, block, done) as the engine produced them — before a slow reader's unsent step
 * frames merge — with the parameters it ran with. A trace gets a server-wide id (gen_<24 hex>,
 * sent in `accepted` as trace_id), is visible to the caller that ran it, and lives as long as its
 * session (it goes when the session is destroyed) within a byte budget (the oldest traces go
 * first when it is exceeded).
 *
 * Not here: HTTP (http_api.c answers the route), frames and replay of the session itself
 * (session.c). Threads: lws service thread only.
 */
#ifndef UM_TRACE_H
#define UM_TRACE_H

#include <jansson.h>
#include <stddef.h>

typedef struct trace_store trace_store;

#define TRACE_ID_MAX 40

trace_store *trace_store_new(size_t max_bytes);
void         trace_store_free(trace_store *t);

/* A new trace of generation gen_id of session `session` (its token) run by owner, with its
 * effective params (copied); id_out receives the trace id. */
void trace_begin(trace_store *t, const char *owner, const char *session, const char *gen_id, const json_t *params,
                 char id_out[TRACE_ID_MAX]);
/* Appends an event (serialized now: later changes to ev do not show); final: the generation's last
 * event (its done), which completes the trace. Unknown id: ignored. */
void trace_add(trace_store *t, const char *id, const json_t *ev, int final);
/* Forgets the traces of a destroyed session. */
void trace_session_gone(trace_store *t, const char *session);

/* {"id","object":"generation.trace","generation","params","complete","events":[...]} (new
 * reference), or NULL when unknown, expired or not owner's. */
json_t *trace_get(trace_store *t, const char *id, const char *owner);

#endif /* UM_TRACE_H */
