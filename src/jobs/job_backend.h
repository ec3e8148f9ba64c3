/*
 * job_backend.h — the seam between the job store (jobs.c: the jobs this process holds, in memory,
 * authoritative while it runs them) and where jobs are kept beyond the process: an SQLite file
 * (job_db.c, one server per file) or Redis (job_redis.c, shared by several servers).
 *
 * An opaque handle with an interface table (ggml-backend style): the write-through members are
 * required; the others are optional (NULL when the store has no such notion). A store whose
 * `take` is set is *shared*: jobs are created into its queue and each server takes from it what
 * its engines can run; jobs another server holds are read from the store (fetch, fetch_events).
 *
 * Not here: what a job document says (jobs.c writes and reads its JSON).
 * Threads: every member but `take` is called by jobs.c under the job store's lock (any thread that
 * holds it). `take` is called by the job feed thread only (server/job_feed.c), without the lock:
 * an implementation that blocks there uses a connection of its own.
 */
#ifndef UM_JOB_BACKEND_H
#define UM_JOB_BACKEND_H

#include <stdint.h>

#include "util/err.h"

typedef struct job_backend job_backend;

/* What `load` hands over, row by row: 0 to go on, -1 with err (one line: what is wrong with that
 * row) to stop the load — the backend names the file and the row, and load returns -1. */
typedef int (*job_backend_job_fn)(void *user, const char *id, int64_t seq, const char *doc, um_err *err);
typedef int (*job_backend_event_fn)(void *user, const char *id, int64_t eid, const char *doc, um_err *err);

/* One job a shared store handed to this server: the job and its queue entry (acked when done). */
typedef struct job_taken {
    char id[40];
    char entry[40];      /* the store's queue entry id */
} job_taken;

struct job_backend_i {
    const char *name;                                   /* "sqlite", "redis": for logs */
    void (*free)(job_backend *b);
    /* ---- write-through (required). Errors are counted and remembered, not returned. */
    /* owner: the job's owner (for a shared store's per-owner index); terminal: the job ended (a
     * store with retention starts the job's clock) */
    void (*put_job)(job_backend *b, const char *id, int64_t seq, const char *owner, const char *doc, int terminal);
    void (*put_event)(job_backend *b, const char *id, int64_t eid, const char *doc);
    void (*drop_events_before)(job_backend *b, const char *id, int64_t first_kept);
    void (*delete_job)(job_backend *b, const char *id);
    void (*begin)(job_backend *b);                      /* one commit / round trip for many writes; nests */
    void (*end)(job_backend *b);
    long (*write_errors)(job_backend *b);
    const char *(*failing)(job_backend *b);             /* while writes fail: why, else NULL */

    /* ---- optional */
    /* every job (by seq), then every event: a store that is this server's alone. -1 with err when
     * the store cannot be read or a callback refused a row */
    int (*load)(job_backend *b, job_backend_job_fn on_job, job_backend_event_fn on_event, void *user, um_err *err);
    /* shared stores: */
    /* a new job, all or nothing (a server that dies while creating it leaves nothing half-made):
     * its document, its first event (id 1), its owner index, its queue entry (any server may take
     * it) and, with key (NULL: none), its Idempotency-Key claim for (owner, key). 1 created; 0 the
     * key names another job (existing = its id; nothing written); -1 store error (counted) */
    int (*create)(job_backend *b, const char *id, int64_t seq, const char *owner, const char *doc, const char *event,
                  const char *key, char existing[40]);
    int (*idem_lookup)(job_backend *b, const char *owner, const char *key, char existing[40]); /* 1 / 0 / -1 */
    int (*requeue)(job_backend *b, const char *id, const char *entry);  /* hand a taken job back */
    void (*ack)(job_backend *b, const char *entry);     /* a taken job is done with */
    /* a job's document (*doc malloc'd): 1 found, 0 unknown, -1 store error */
    int (*fetch)(job_backend *b, const char *id, char **doc, int64_t *seq);
    /* events from..from+n-1: docs[i] malloc'd or NULL when absent; 0 or -1 */
    int (*fetch_events)(job_backend *b, const char *id, int64_t from, int n, char **docs);
    /* owner's job ids, newest first (*ids malloc'd): count or -1 */
    int (*list)(job_backend *b, const char *owner, char (**ids)[40]);
    /* ask the server running job id to cancel it / whether that was asked */
    void (*cancel_signal)(job_backend *b, const char *id);
    int (*cancel_signalled)(job_backend *b, const char *id);
    /* the feed thread: up to max jobs for this server (queued ones, and those of servers that
     * died), waiting up to timeout_ms; count, or -1 when the store is unreachable. Every call renews
     * this server's heartbeat; max 0 does only that (out unused) */
    int (*take)(job_backend *b, int max, int timeout_ms, job_taken *out);
    /* under the lock, ~1/s: keep the connection alive, reconnect with backoff */
    void (*tick)(job_backend *b);
    /* increases on every (re)connection: jobs.c then writes again what changed while it was lost */
    uint64_t (*epoch)(job_backend *b);
};

struct job_backend {
    const struct job_backend_i *iface;   /* static table */
    void                       *context; /* the implementation's state (owned) */
};

static inline void job_backend_free(job_backend *b) {
    if (b) b->iface->free(b);
}

#endif /* UM_JOB_BACKEND_H */
