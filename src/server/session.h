/*
 * session.h — persistent WebSocket sessions: the per-session event log (frames), sequence
 * numbers, acks, bounded buffers, replay on resume, retention after a disconnect, and the
 * generations (and job subscriptions, server/ws_jobs.h) a session owns. Internal to server/ (ws.c
 * drives it).
 *
 * A session's frames form one list, oldest first:
 *   [written, not yet acknowledged ...] [cursor -> not yet written ...]
 * A frame gets its seq (session-wide, +1 each) when it is first written, so seq order is wire
 * order. Written frames stay until the client acks them (ack / session.resume last_seq) so a
 * reconnecting client can get them again byte-for-byte. Unwritten step frames of a generation
 * absorb later steps of that generation (merge: commits accumulate, drafts are the latest) —
 * a slow or absent reader costs at most one step frame per generation plus its block/done frames.
 *
 * Budget (session_max_bytes / session_max_events) over all frames: over it, written-but-unacked
 * frames are released oldest first (replay below that point becomes impossible: "floor"); if
 * never-written frames alone exceed it the session overflows: its generations are cancelled, an
 * error {code:"session_overflow"} is the last frame, and the socket closes with 4008; a detached
 * session is discarded and a later resume is told "session_overflow".
 *
 * With --store redis:// (ws_state.store set) every frame of a session this replica owns gets its
 * seq when it is queued (not when written; no step merging then) and is sent to the store's log
 * (server/ws_store.h), so a resume on another replica can replay it. A session resumed here from
 * the store while another replica owns it is *followed*: its frames are the owner's (with the
 * owner's seqs): the replay read from the store's log, then the live events relayed through Redis
 * pub/sub (the store's subscriber thread, ws_state_on_wake), with a poll of the log every 2 s
 * for the owner's heartbeat and whatever pub/sub lost; frames this replica adds itself
 * (session.resumed, pong, errors about messages) carry no seq, except the `replica_lost` errors
 * written when the owner died (they continue the session's seq and go to the log too). The owner's
 * job subscriptions are followed the same way (their job.update events, until each one's final
 * update or unsubscribe), and end with `replica_lost` too when it died.
 *
 * Not here: lws callbacks and message parsing (ws.c). Threads: lws service thread only.
 */
#ifndef UM_SESSION_H
#define UM_SESSION_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "api/event.h"
#include "api/ws_protocol.h"
#include "server/gen_prep.h"
#include "server/callers.h"
#include "server/server_internal.h"
#include "server/trace.h"
#include "server/ws_store.h"

typedef struct ws_state   ws_state;
typedef struct ws_session ws_session;
typedef struct ws_gen     ws_gen;
typedef struct ws_frame   ws_frame;
typedef struct ws_prep    ws_prep;

#define WS_CLOSE_OVERFLOW  4008   /* session buffer overflow: events could not be kept */
#define WS_CLOSE_REPLACED  4001   /* another connection resumed this session */
#define WS_CLOSE_CAPACITY  1013   /* too many sessions (try again later) */

/* A client message that arrived while an earlier `generate` of its connection was being prepared:
 * handled once that one's reply is queued (ws.c), so replies keep the order of the messages. */
typedef struct ws_pending {
    struct ws_pending *next;
    int                binary;
    size_t             len;
    unsigned char      data[];     /* len bytes + NUL */
} ws_pending;

/* lws per-session data of the "unmask" protocol: one WebSocket connection. */
typedef struct ws_conn {
    struct lws     *wsi;
    ws_session     *sess;          /* NULL after it was taken over by a resume elsewhere */
    unsigned char  *rx;            /* message being assembled (owned) */
    size_t          rx_len, rx_cap;
    int             rx_binary;
    int             rx_in_msg;     /* inside a (possibly fragmented) message */
    int             kicked;        /* its session moved to another connection: close with 4001 */
    int             peer_close_code; /* status of the client's close frame, 0 if none */
    int             going_away;    /* server shutdown: flush, then close with 1001 */
    char            who[CALLER_WHO_MAX]; /* the caller (set at the handshake, server/callers.h) */
    ws_prep        *waiting;       /* its `generate` being prepared: later messages wait (NULL: none) */
    ws_pending     *pend_head, *pend_tail; /* those messages, in arrival order (owned) */
    int             rx_paused;     /* lws_rx_flow_control off while messages wait: TCP pushes back */
    struct ws_conn *next, *prev;   /* ws_state.conns */
} ws_conn;

struct ws_frame {
    ws_frame      *next;
    uint64_t       seq;            /* 0 until first written */
    ws_gen        *gen;            /* generation whose mergeable step this is (unwritten only) */
    json_t        *obj;            /* event object until serialized (owned): a session-level
                                      event, or a generation's block / done (api_event_json); with
                                      step, that one step's JSON when the trace built it already */
    api_step      *step;           /* a generation's step(s), typed until serialized (owned) */
    unsigned char *buf;            /* LWS_PRE + len bytes once serialized (owned) */
    size_t         len;
    size_t         cost;           /* bytes charged to the session budget */
    uint64_t       t_event_ns;     /* engine time for latency stats (0: session-level event) */
    int            written_once;
};

/* A generation being built (tokenized) on a preparation worker (server/gen_prep.h); ws.c parses
 * the request into it and consumes the result. The worker touches gp only. */
struct ws_prep {
    gen_prep        gp;            /* first member: the parsed request, the worker's build */
    ws_gen         *gen;           /* service thread: NULL once the generation is gone (dropped) */
    ws_conn        *conn;          /* service thread: the connection whose later messages wait for its
                                    * reply (ws_conn.waiting); NULL once that connection closed */
    api_gen_opts    opts;          /* stream.every */
    char            event_id[API_EVENT_ID_MAX + 1];
};

struct ws_gen {
    ws_gen     *next;
    ws_session *sess;
    char        id[API_ID_MAX + 1];
    ws_prep    *prep;              /* while its request is being prepared (no `accepted` yet) */
    int         cancel_pending;    /* cancelled while being prepared: cancel once submitted */
    sched_req  *req;               /* until its final event */
    ws_frame   *pending_step;      /* unwritten step frame that absorbs the next steps */
    int         every;             /* stream.every */
    api_step   *held_step;         /* stream.every > 1: steps accumulated before queueing (owned) */
    int         held_n;
    int         counted;           /* holds one of the caller's --key-max-generations */
    char        trace_id[TRACE_ID_MAX]; /* its trace (server/trace.h), "" before `accepted` */
};

struct ws_session {
    ws_session *next, *prev;       /* ws_state.sessions */
    ws_state   *w;
    char        token[API_TOKEN_HEX + 1];
    char        who[CALLER_WHO_MAX]; /* the caller that created it: only it may resume it */
    uint64_t    key;               /* scheduler owner key: the caller's (one turn per caller) */
    ws_conn    *conn;              /* NULL while detached */
    ws_frame   *head, *tail, *cursor; /* cursor: next frame to write (NULL: all written) */
    uint64_t    next_seq;          /* seq of the next frame written */
    uint64_t    acked;             /* client confirmed every seq <= acked */
    uint64_t    floor;             /* frames <= floor were released unacknowledged */
    size_t      bytes;             /* all frames */
    int         n_frames;
    size_t      bytes_unsent;      /* frames never written (no seq yet) */
    int         n_unsent;
    ws_gen     *gens;
    int         n_gens;
    uint64_t    gen_counter;
    struct ws_jobs *jobs;          /* the async jobs it follows (server/ws_jobs.h; owned, NULL until the first) */
    lws_sorted_usec_list_t sul;    /* retention timer while detached */
    int         sul_armed;
    uint64_t    detached_ns;       /* when the connection went away (0 while attached) */
    int         overflowed;        /* close after the final error frame */
    /* followed sessions (another replica owns it; see the top) */
    int         followed;
    char        owner[96];         /* the owner replica's consumer name */
    long        follow_next;       /* next index of the store's log to read */
    uint64_t    follow_seq;        /* highest seq taken from the log */
    json_t     *follow_open;       /* object: generation id -> true, accepted and not finished (owned) */
    json_t     *follow_jobs;       /* object: job id -> true, the owner's job subscriptions not ended yet
                                      (a job.update that is not final seen, no final one since; owned) */
    lws_sorted_usec_list_t sul_follow; /* the 2 s fallback poll of the log */
    int         follow_armed;
    int         follow_sub;        /* subscribed to its live events (ws_store_follow) */
};

struct ws_state {
    server     *srv;
    ws_session *sessions;
    int         n_sessions, n_detached;
    uint64_t    n_ended;           /* connections closed + sessions ended, ever (what freed memory) */
    ws_conn    *conns;
    int         n_conns;
    size_t      bytes;             /* every session's buffered frames (the --sessions-max-bytes budget) */
    trace_store *traces;           /* generations' traces (owned) */
    int         shutting_down;     /* no timers, no new sessions */
    /* tokens of sessions discarded after an overflow (ring), so a resume can say why */
    char        tomb[64][API_TOKEN_HEX + 1];
    int         tomb_next;
    ws_store   *store;             /* --store redis://: session logs in Redis (owned; NULL otherwise) */
};

/* A new session of caller who; NULL when the server has no room (*why: "capacity") or the
 * caller has all its --key-max-sessions (*why: "quota"). */
ws_session *session_create(ws_state *w, const char *who, const char **why);
/* Cancels its generations (their events are dropped) and frees everything. */
void        session_destroy(ws_session *s);
ws_session *session_find(ws_state *w, const char *token);
int         session_tombstoned(const ws_state *w, const char *token);

void session_attach(ws_session *s, ws_conn *c);
/* The connection went away: keep the session for the retention time (or destroy it now when the
 * retention is 0 or it overflowed). */
void session_detach(ws_session *s);

/* Queue a session-level event (steals obj). */
void session_push(ws_session *s, json_t *obj);
/* Write the next frame (one lws_write). Returns -1 to close the connection. */
int  session_write_next(ws_session *s);
/* Client acknowledged everything <= seq. -1 (api_error filled, nothing changed) when seq is ahead
 * of the last seq the session gave out. */
int  session_ack(ws_session *s, uint64_t seq, api_error *e);
/* Rewind the cursor for a replay of everything after last_seq. Returns the number of frames the
 * client missed (written-but-lost and never written, all queued now), or -1 (api_error filled)
 * when last_seq is ahead of what was sent. *gap = 1 when frames after last_seq were already
 * released (replay starts at floor + 1). */
int  session_rewind(ws_session *s, uint64_t last_seq, int *gap, api_error *e);

/* --store redis://: session token (of caller who) is not here; load it from the store as a
 * followed session, its frames after last_seq queued (*replayed of them; *running: the ids of its
 * unfinished generations, a new array). NULL and e filled ("unknown_session": not in the store or
 * another caller's; "store_unavailable": Redis did not answer). The session is not attached. */
ws_session *session_follow_load(ws_state *w, const char *token, const char *who, uint64_t last_seq, int *replayed,
                                json_t **running, api_error *e);
/* Start following (after attach): the replica_lost errors at once when the owner is dead, else
 * the pub/sub relay and the 2 s fallback poll while generations are unfinished. */
void        session_follow_start(ws_session *s);

/* Generations */
ws_gen *session_gen_find(ws_session *s, const char *id);
/* A new generation whose request is being prepared (g->prep set by the caller): it counts
 * towards the session's generations and its id is taken. */
ws_gen *session_gen_add(ws_session *s, const char *id);
/* Its request was admitted or queued: attach it (deliver hook set here). */
void    session_gen_start(ws_gen *g, sched_req *r, int every);
/* Its preparation failed (the error was reported): forget it. */
void    session_gen_remove(ws_gen *g);
/* Running: stop at the next step (its `done` follows). Being prepared: cancelled as soon as it is
 * submitted (`accepted`, then `done` "cancelled"). */
void    session_gen_cancel(ws_gen *g);

#endif /* UM_SESSION_H */
