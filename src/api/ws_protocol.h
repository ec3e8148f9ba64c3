/*
 * ws_protocol.h — the unmask WebSocket JSON protocol (docs/protocol.md): client message parsing
 * and validation, and the server's own event objects (a generation's step/block/done: api/event.h).
 *
 * Client -> server (one JSON object per text message, "type" required, "event_id" optional and
 * echoed in errors/replies): generate, cancel {id}, session.resume {session, last_seq},
 * ack {seq}, ping, job.subscribe {id}, job.unsubscribe {id}.
 * Server -> client: session.created, session.resumed, accepted, step, block, done, error, pong,
 * job.update, job.unsubscribed.
 * Every server event carries "seq" (added by the session layer when the frame is written).
 *
 * Not here: sessions, buffering, sockets (server/ws.c, server/session.c); request bodies
 * (api/request.h). Pure functions; any thread.
 */
#ifndef UM_API_WS_PROTOCOL_H
#define UM_API_WS_PROTOCOL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api/request.h"

#define API_ID_MAX       64    /* generation ids: [A-Za-z0-9_.:-]{1,64} */
#define API_EVENT_ID_MAX 128   /* client event ids: printable, <= 128 bytes */
#define API_TOKEN_HEX    64    /* session token: 64 hex characters */

enum api_msg_type {
    API_MSG_GENERATE, API_MSG_CANCEL, API_MSG_RESUME, API_MSG_ACK, API_MSG_PING,
    API_MSG_JOB_SUBSCRIBE, API_MSG_JOB_UNSUBSCRIBE
};

typedef struct api_msg {
    enum api_msg_type type;
    json_t     *root;                         /* the parsed object (owned) */
    char        event_id[API_EVENT_ID_MAX + 1]; /* "" when absent */
    char        id[API_ID_MAX + 1];           /* generate (optional) / cancel (required) / job.* (the job's) */
    char        session[API_TOKEN_HEX + 1];   /* session.resume */
    uint64_t    seq;                          /* session.resume: last_seq; ack: seq */
} api_msg;

/* Parse one text message. On error fills e (code: invalid_json, invalid_message, unknown_type,
 * invalid_request) and, when it could be read, m->event_id (so the error can echo it); m->root is
 * then NULL. */
int  api_msg_parse(const char *text, size_t len, api_msg *m, api_error *e);
void api_msg_free(api_msg *m);

/* ---------------------------------------------------------------- server events (new refs) */

/* {"type":"error","error":{"code","message","param"},"event_id"?,"id"?} */
json_t *api_ev_error(const api_error *e, const char *event_id, const char *gen_id);
/* The same, the error made from code, param (NULL: none) and a printf message. */
json_t *api_ev_errorf(const char *code, const char *param, const char *event_id, const char *gen_id, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));
/* {"type":"pong","event_id"?,"time_ms"} */
json_t *api_ev_pong(const char *event_id);
/* {"type":"accepted","id","event_id"?,"queue_position","prompt_tokens","params","ignored_fields"?} */
json_t *api_ev_accepted(const char *gen_id, const char *event_id, int queue_pos, int n_prompt, const json_t *params,
                        const json_t *ignored);
/* {"type":"job.update","id":job_id,"event_id"?,"final","job":job} (steals job: the job's
 * GET /v1/jobs/{id} object). */
json_t *api_ev_job_update(const char *job_id, const char *event_id, json_t *job, int final);
/* {"type":"job.unsubscribed","id":job_id,"event_id"?,"subscribed":was_subscribed} */
json_t *api_ev_job_unsubscribed(const char *job_id, const char *event_id, int was_subscribed);

#endif /* UM_API_WS_PROTOCOL_H */
