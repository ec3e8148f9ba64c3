/*
 * jobs.h — the async job store behind /v1/jobs: ids, client idempotency keys, status, progress,
 * result, an event log for resumable SSE (ids 1, 2, 3, ... per job), engine-failure retries and
 * eviction of old finished jobs.
 *
 * Lifecycle: queued -> running -> succeeded | failed | cancelled (a running job whose cancel was
 * requested shows "cancelling" until its engine work stops). A job is running from its attempt's
 * first decode step; one that waits for a batch slot is queued. An engine failure while
 * attempts < max_attempts puts the job back to queued (a "retry" event is logged) and the runner
 * submits it again; after that it is failed. Events keep increasing ids across attempts, so a
 * client resuming with Last-Event-ID receives exactly what it missed. Each job keeps the last
 * max_events events; older ones are dropped (a resume from before the window gets an error).
 *
 * Not here: running generations (server/http_api.c submits them through the scheduler and feeds
 * the events back here), HTTP, webhooks (jobs/webhook.h; the store only records delivery state).
 *
 * Threads: every function is thread-safe (one mutex). Functions return copies (JSON snapshots,
 * malloc'd strings), never pointers into the store, so callers on any thread stay safe.
 */
#ifndef UM_JOBS_H
#define UM_JOBS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/err.h"

enum job_status { JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED, JOB_CANCELLED };
const char *job_status_name(enum job_status s);
static inline int job_status_terminal(enum job_status s) { return s >= JOB_SUCCEEDED; }

typedef struct job_store job_store;

typedef struct job_store_opts {
    int    max_jobs;        /* jobs kept (finished ones are evicted oldest first); default 10000 */
    int    max_active;      /* queued + running jobs; beyond: job_store_create fails (-> 503); default 1000 */
    int    max_events;      /* event log window per job; default 4096 */
    int    max_attempts;    /* engine attempts per job; default 3 */
    size_t max_bytes;       /* requests + results + event logs of every job; default 256 MB. A job
                               that does not fit once finished ones are evicted is refused (-> 503);
                               a log that outgrows it loses its oldest events */
    struct job_backend *backend; /* durable store (jobs/job_backend.h: SQLite or Redis), owned by the
                               store from then on; NULL = memory only */
} job_store_opts;

job_store *job_store_new(const job_store_opts *o);

/* ---------------------------------------------------------------- durability
 * With opts.backend every change is written through to it. A backend of this server alone
 * (SQLite) is read back at start by job_store_load() (jobs, results, event logs, webhook states,
 * attempt counts, idempotency keys). A shared backend (Redis; job_store_shared) is not loaded:
 * new jobs go to its queue, the job feed thread takes what this server can run (job_store_take),
 * and a job held by another server is read from the backend whenever it is asked for. */
/* -1 with err when the store cannot be read or holds a row with a value this server never writes
 * (a document that is not JSON, a status, count or id out of range, a seq collision): err names the
 * row and the problem; nothing is repaired. */
int  job_store_load(job_store *js, um_err *err);
/* After a load: jobs a previous process left running go back to queued with a "retry" event
 * (reason why) — or fail when their attempts are used up, or end cancelled when a cancel was
 * asked for. Returns how many jobs are queued; *queued_out lists them oldest first, *hooks_out
 * (*n_hooks) the finished jobs whose webhook was never delivered (send them again). Free both. */
int  job_store_recover(job_store *js, const char *why, char (**queued_out)[40], char (**hooks_out)[40], int *n_hooks);
int  job_store_durable(job_store *js);          /* 1 with a durable store */
int  job_store_shared(job_store *js);           /* 1 when the store is shared with other servers (Redis) */
/* Shared store, the job feed thread: take up to max queued jobs (and jobs of servers that died,
 * which are retried — reason why — or fail when their attempts are used up) from the queue,
 * waiting up to timeout_ms, into this server's memory. Returns how many are queued to run here
 * (*ids_out), -1 when the store is unreachable; *hooks_out (*n_hooks) lists finished jobs whose
 * webhook is still to be delivered. Free both. max 0 (this server is full) takes nothing but still
 * renews its heartbeat: a server that stops calling this is taken for dead by the others. */
int  job_store_take(job_store *js, int max, int timeout_ms, const char *why, char (**ids_out)[40],
                    char (**hooks_out)[40], int *n_hooks);
/* About once a second (the feed thread): keep the backend's connection alive / reconnect it, and
 * write again what it missed. Returns how many jobs running here were cancelled from another
 * server (*cancel_ids, free it): stop their engine work. */
int  job_store_tick(job_store *js, char (**cancel_ids)[40]);
/* Shared store, shutdown: every unfinished job taken here goes back to the queue (a running one's
 * interrupted attempt is not counted). Returns how many. */
int  job_store_release(job_store *js, const char *why);
long job_store_write_errors(job_store *js);     /* durable writes that failed since start */
/* 1 while the durable store's writes fail (until one succeeds again), the error in buf. */
int  job_store_failing(job_store *js, char *buf, size_t cap);
/* One durable transaction around many changes (a decode step's events of every job); nests. */
void job_store_batch_begin(job_store *js);
void job_store_batch_end(job_store *js);
void       job_store_free(job_store *js);

/* Bytes the store holds (requests, results, events; for tests and /stats). */
size_t job_store_bytes(job_store *js);

/* Create a job for request (a JSON object, copied) owned by owner (the API key or "" under open
 * access; jobs are visible to their owner only). idem_key (may be NULL): an earlier job of the same
 * owner with that key is returned instead (*existed = 1) when its request is equal; a different
 * request under the same key -> -1, UM_ERR_INVALID_ARG param "Idempotency-Key". Store full of
 * active jobs -> -1, UM_ERR_RESOURCE. The durable store could not write it -> -1, UM_ERR_IO (the
 * job does not exist: a 202 is only given to a job that is on disk). webhook may be NULL. id_out receives the job id. */
int job_store_create(job_store *js, const char *owner, const char *idem_key, const json_t *request,
                     const char *webhook, char id_out[40], int *existed, um_err *err);

/* 1 when owner has a job created with Idempotency-Key idem_key (a POST would replay it). */
int job_store_has_idem(job_store *js, const char *owner, const char *idem_key);

/* 1 when id exists and belongs to owner. */
int job_store_exists(job_store *js, const char *id, const char *owner);

/* The job as its API object (new reference) or NULL when unknown / not owner's:
 *   {"id","object":"job","status" (a status name, or "cancelling"),"created_at","started_at","completed_at","attempts",
 *    "progress":{"fraction","steps","committed","gen_length","events"},"result","error",
 *    "webhook":{"url","status","attempts"}|null,"request"} */
json_t *job_store_get_json(job_store *js, const char *id, const char *owner);
/* The job's status as job_store_get_json names it ("cancelling" included; 16 bytes) and its
 * attempts, without copying its request or result (a change watcher's poll): 1, or 0 when unknown
 * / not owner's. A job held by another server is read from the shared store, as by get_json. */
int job_store_peek(job_store *js, const char *id, const char *owner, char status[16], int *attempts);
/* owner's jobs, newest first, as {"object":"list","data":[job, ...],"has_more","first_id",
 * "last_id"} (*out, new reference): status >= 0 keeps only jobs in that state, after (a job id, or
 * NULL / "") starts after that job, at most limit jobs. -1 when after is not one of owner's jobs. */
int job_store_list(job_store *js, const char *owner, int status, const char *after, int limit, json_t **out);
/* The owner the job was created by (malloc'd) or NULL. */
char *job_store_owner(job_store *js, const char *id);
/* The original request (new reference) or NULL. */
json_t *job_store_request(job_store *js, const char *id);
enum job_status job_store_status(job_store *js, const char *id);

/* ---------------------------------------------------------------- runner side */

/* queued -> running (attempt++, started_at set on the first), logs {"type":"status","status":
 * "running","attempt":n}. The runner calls it when the attempt's first decode step has run, not
 * when it hands the job to the scheduler: an attempt is spent only by work that ran. -1 when not
 * queued. */
int  job_store_start(job_store *js, const char *id, double gen_length);
/* A step's progress, as the runner read it from its typed event (the store never reads it back
 * out of the event's JSON). */
typedef struct job_progress {
    long steps;       /* decode steps the attempt has taken */
    long committed;   /* generated positions unmasked so far */
} job_progress;
/* Append an event object (copied; "type" required) to the log and, when pr is not NULL (a step),
 * update the job's progress; returns the event id (> 0), or 0 when the job is unknown / already
 * terminal. */
int64_t job_store_append(job_store *js, const char *id, const json_t *ev, const job_progress *pr);
/* Finish the attempt: succeeded (result copied) / cancelled. Logs a final "status" event. */
void job_store_succeed(job_store *js, const char *id, const json_t *result);
void job_store_cancelled(job_store *js, const char *id);
/* Engine failure: returns 1 when the job was put back to queued for another attempt (a "retry"
 * event is logged), 0 when it is now failed (terminal, error recorded). */
int  job_store_attempt_failed(job_store *js, const char *id, const char *message);
/* Shutdown: every job not yet terminal becomes failed with `message` (its queued/running work
 * will never run here). Returns how many; *ids_out (malloc'd, free() it) lists their ids. */
int  job_store_fail_unfinished(job_store *js, const char *message, char (**ids_out)[40]);
/* Request cancellation: a queued job becomes cancelled at once (returns 1); a running job is marked
 * (returns 2: the caller cancels the engine work, then calls job_store_cancelled); terminal or
 * unknown: 0. */
int  job_store_cancel(job_store *js, const char *id, const char *owner);
int  job_store_cancel_requested(job_store *js, const char *id);

/* Webhook bookkeeping (any thread, e.g. the webhook worker). status: "pending" | "delivered" | "failed". */
void job_store_webhook_state(job_store *js, const char *id, const char *status, int attempts);
/* The webhook URL (malloc'd) or NULL. */
char *job_store_webhook(job_store *js, const char *id);

/* ---------------------------------------------------------------- event log */

typedef struct job_event_copy {
    int64_t id;
    char   *json;        /* compact JSON of the event, malloc'd */
} job_event_copy;

/* Events with id > after_id, at most max: *out malloc'd array (free each .json and the array).
 * Returns the count, or -1 when after_id is older than the retained window (err says so).
 * *terminal = 1 when the job is terminal (no more events will come). */
int job_store_events_since(job_store *js, const char *id, int64_t after_id, int max, job_event_copy **out,
                           int *terminal, um_err *err);
void job_events_free(job_event_copy *ev, int n);

/* Counts for metrics. */
void job_store_counts(job_store *js, int *queued, int *running, int *total);

#endif /* UM_JOBS_H */
