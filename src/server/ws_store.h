/*
 * ws_store.h — WebSocket sessions' event logs in Redis (--store redis://), so that a
 * session.resume on any replica can replay what the client missed and follow the rest.
 *
 * Keys (prefix "unmask:"):
 *   wslog:<token>   list  the session's events, serialized exactly as sent (with their seq), in
 *                         seq order (RPUSH); index i holds seq i + 1
 *   wsmeta:<token>  hash  who (the caller that may resume it), owner (the replica's consumer name:
 *                         its heartbeat is unmask:alive:<owner>, jobs/job_redis.c)
 * Both expire --session-retention seconds after the session's last event (refreshed on each batch
 * and when the connection goes away).
 * Channel (pub/sub):
 *   wsch:<token>    each event, the same text, PUBLISHed right after its RPUSH (same pipeline):
 *                   the live relay to replicas following the session. The list stays the source
 *                   of truth: a follower subscribes, then reads the list (once the subscription is
 *                   confirmed), and takes notifications by seq (duplicates dropped, a gap read
 *                   from the list).
 *
 * Threads and connections:
 *   - the writer thread (this file) owns the write connection: ws_store_append/touch (lws service
 *     thread) only queue under a mutex; the writer takes everything queued at each wake-up (all the
 *     events of a decode step) and sends it as one pipeline, one round trip. It never blocks the
 *     service thread. While Redis is unreachable it drops batches (counted, logged) and retries
 *     the connection every second.
 *   - the subscriber thread owns the subscriber connection (SUBSCRIBE / UNSUBSCRIBE wsch:<token>
 *     as the service thread starts and stops following sessions: ws_store_follow/unfollow). It
 *     sleeps in poll() on that socket and a wake-up pipe, queues what arrives (ws_note) under a
 *     mutex and calls wake() (server_wake: lws_cancel_service), so the service thread takes the
 *     notes (ws_store_take) on its next wake-up, as engine events. Lost connection: reconnect every
 *     second and subscribe again (each confirmation is a note: the follower reads the list for what
 *     it missed meanwhile).
 *   - the read connection belongs to the lws service thread (ws_store_load / ws_store_alive): a
 *     resume on a replica that does not hold the session, the catch-up after a subscription, and
 *     the slow fallback poll (every 2 s: the owner's heartbeat, anything pub/sub lost) do a command
 *     or two with 0.5 s timeouts — a bounded wait, as the job store's command connection.
 *
 * Not here: what a session is (session.c), the resume handshake (ws.c).
 */
#ifndef UM_WS_STORE_H
#define UM_WS_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct ws_store ws_store;

/* Connects the read and write connections and starts the writer and subscriber threads; -1 with
 * err naming the URL. owner: this replica's consumer name (job_redis_consumer). retention_s: the
 * keys' TTL. wake(wake_user): called on the subscriber thread when notes are waiting (the service
 * thread then calls ws_store_take). */
int  ws_store_open(const char *url, const char *owner, double retention_s, void (*wake)(void *user), void *wake_user,
                   ws_store **out, um_err *err);
void ws_store_free(ws_store *st);

/* Service thread: queue one event of session token (who: its caller) for the log. */
void ws_store_append(ws_store *st, const char *token, const char *who, const char *json, size_t len);
/* Service thread: refresh the TTL of token's keys (its connection went away). */
void ws_store_touch(ws_store *st, const char *token);

/* Service thread. The session's caller and owner replica, and its events from list index `from`
 * on (*docs malloc'd array of malloc'd strings, *n of them): 1 found, 0 unknown, -1 Redis error.
 * who/owner may be NULL (only the events are read). */
int  ws_store_load(ws_store *st, const char *token, long from, char *who, size_t who_cap, char *owner,
                   size_t owner_cap, char ***docs, int *n);
/* Service thread: relay session token's live events (refcounted; the subscriber thread
 * SUBSCRIBEs, and UNSUBSCRIBEs when the last follower stops). */
void ws_store_follow(ws_store *st, const char *token);
void ws_store_unfollow(ws_store *st, const char *token);

/* What the subscriber thread received, oldest first. */
typedef struct ws_note {
    struct ws_note *next;
    char            token[80];
    char           *json;          /* an event as published (owned); NULL: token's subscription is
                                    * confirmed (read the list for what came before it) */
} ws_note;
/* Service thread: every waiting note (the caller frees them with ws_store_notes_free). */
ws_note *ws_store_take(ws_store *st);
void     ws_store_notes_free(ws_note *n);

/* Service thread: 1 when replica owner's heartbeat key exists, 0 when it expired, -1 on error. */
int  ws_store_alive(ws_store *st, const char *owner);

#endif /* UM_WS_STORE_H */
