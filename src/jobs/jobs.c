/*
 * jobs.c — the async job store (see jobs.h). Thread-safe: one mutex guards every job, and the
 * job backend (jobs/job_backend.h: SQLite or Redis) is only called under it — except `take`, which
 * the job feed thread calls without it (job_store_take).
 *
 * With a shared backend (Redis) this process holds in memory only the jobs it took from the queue
 * (it runs them and is the only writer of their documents); jobs held elsewhere are read from the
 * backend on every request (lookup()), and changes to them (a cancel, a webhook state) are written
 * back read-modify-write.
 */
#include "jobs/jobs.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "jobs/job_backend.h"
#include "util/json_util.h"
#include "util/hash.h"
#include "util/log.h"

typedef struct job {
    struct job *hnext;             /* hash chain */
    int64_t     seq;               /* creation order (the durable store's ordering key) */
    struct job *prev, *next;       /* creation order (oldest first) */
    char        id[40];
    char       *owner;             /* owned */
    char       *idem_key;          /* owned or NULL */
    json_t     *request;           /* owned */
    char       *webhook;           /* owned or NULL */
    enum job_status status;
    int         attempts;
    int         cancel_requested;
    double      created_at, started_at, completed_at;   /* unix seconds, 0 = not yet */
    double      gen_length;
    long        steps, committed;
    json_t     *result;            /* owned or NULL */
    char       *error;             /* owned or NULL */
    char        webhook_status[16];
    int         webhook_attempts;
    /* event log: the events first_kept_id .. next_event_id - 1 at ring[id % ring_cap]; the ring
     * grows by doubling up to max_events */
    int64_t     next_event_id;     /* id of the next event (starts at 1) */
    int64_t     first_kept_id;     /* oldest id still in the ring */
    char      **ring;              /* [ring_cap] compact JSON, owned; NULL = an event the store lost */
    int         ring_cap;
    int64_t     stored_next_id;    /* while its events are read back (load_event): the document's
                                      next_event_id, applied by load_finish(); 0 otherwise */
    int         detached;          /* a copy read from a shared store (lookup()): no ring, its events are
                                      written to the store only */
    size_t      bytes;             /* what this job holds (request, result, events), for max_bytes */
    char        qentry[40];        /* shared backend: the queue entry this server took it under ("" none) */
    double      touched;           /* monotonic time of its last write-through (re-sent after an outage) */
} job;

#define JOB_OVERHEAD 512           /* bytes charged per job besides its JSON */

#define JOB_HASH 4096

struct job_store {
    job_store_opts  o;
    pthread_mutex_t lock;
    /* --- lock { */
    job  *buckets[JOB_HASH];
    job  *oldest, *newest;
    int   n, n_active;
    int64_t next_seq;
    job_backend *be;               /* durable store (owned) or NULL (memory only) */
    int   shared;                  /* be is shared by several servers (it has a queue: be->iface->take) */
    uint64_t synced_epoch;         /* be's connection epoch whose losses were written again */
    double dirty_since;            /* monotonic time writes started failing (0 = they work) */
    long  errors_seen;             /* be's write_errors at the last check */
    size_t bytes;                  /* sum of every job's bytes */
    /* } lock --- */
};

const char *job_status_name(enum job_status s) {
    switch (s) {
    case JOB_QUEUED: return "queued";
    case JOB_RUNNING: return "running";
    case JOB_SUCCEEDED: return "succeeded";
    case JOB_FAILED: return "failed";
    case JOB_CANCELLED: return "cancelled";
    }
    return "unknown";
}

static double unix_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned hash_id(const char *s) { return hash_str_fnv1a(s) % JOB_HASH; }

job_store *job_store_new(const job_store_opts *o) {
    job_store *js = xcalloc(1, sizeof *js);
    js->o.max_jobs = o && o->max_jobs > 0 ? o->max_jobs : 10000;
    js->o.max_active = o && o->max_active > 0 ? o->max_active : 1000;
    js->o.max_events = o && o->max_events > 0 ? o->max_events : 4096;
    js->o.max_attempts = o && o->max_attempts > 0 ? o->max_attempts : 3;
    js->o.max_bytes = o && o->max_bytes > 0 ? o->max_bytes : (256u << 20);
    js->be = o ? o->backend : NULL;
    js->shared = js->be && js->be->iface->take != NULL;
    js->synced_epoch = js->be && js->be->iface->epoch ? js->be->iface->epoch(js->be) : 0;
    js->next_seq = 1;
    pthread_mutex_init(&js->lock, NULL);
    return js;
}

static void job_free(job_store *js, job *j) {
    js->bytes -= j->bytes;
    free(j->owner);
    free(j->idem_key);
    json_decref(j->request);
    free(j->webhook);
    json_decref(j->result);
    free(j->error);
    for (int i = 0; i < j->ring_cap; i++) free(j->ring[i]);
    free(j->ring);
    free(j);
}

void job_store_free(job_store *js) {
    if (!js) return;
    job *j = js->oldest;
    while (j) {
        job *nx = j->next;
        job_free(js, j);
        j = nx;
    }
    job_backend_free(js->be);
    pthread_mutex_destroy(&js->lock);
    free(js);
}

/* ---------------------------------------------------------------- the durable copy (job_db) */

/* Reals in a row document keep every digit (17): a time written with the API's 9 digits would come
 * back up to 10 s off after a restart. */
#define JOB_DOC_JSON (JSON_COMPACT | JSON_REAL_PRECISION(17))

/* j's state (everything but its events) as the durable store's row document. */
static char *job_doc(const job *j) {
    json_t *o = json_pack("{s:s, s:s?, s:O, s:s?, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:O?, s:s?, s:s, s:i, "
                          "s:I, s:I}",
                          "owner", j->owner, "idem_key", j->idem_key, "request", j->request, "webhook", j->webhook,
                          "status", (int)j->status, "attempts", j->attempts, "cancel_requested", j->cancel_requested,
                          "created_at", j->created_at, "started_at", j->started_at, "completed_at", j->completed_at,
                          "gen_length", j->gen_length, "steps", (json_int_t)j->steps, "committed",
                          (json_int_t)j->committed, "result", j->result, "error", j->error, "webhook_status",
                          j->webhook_status, "webhook_attempts", j->webhook_attempts, "next_event_id",
                          (json_int_t)j->next_event_id, "first_kept_id", (json_int_t)j->first_kept_id);
    CHECK(o != NULL);
    char *doc = json_dumps(o, JOB_DOC_JSON);
    json_decref(o);
    return doc;
}

/* Writes j's state through to the durable store; lock held. */
static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void persist(job_store *js, job *j) {
    if (!js->be) return;
    char *doc = job_doc(j);
    js->be->iface->put_job(js->be, j->id, j->seq, j->owner, doc, job_status_terminal(j->status));
    free(doc);
    j->touched = mono_now();
}

/* Lookup under the lock. */
static job *find(job_store *js, const char *id) {
    if (!id) return NULL;
    for (job *j = js->buckets[hash_id(id)]; j; j = j->hnext)
        if (strcmp(j->id, id) == 0) return j;
    return NULL;
}

static void unlink_job(job_store *js, job *j) {
    job **pp = &js->buckets[hash_id(j->id)];
    while (*pp != j) pp = &(*pp)->hnext;
    *pp = j->hnext;
    if (j->prev) j->prev->next = j->next;
    else js->oldest = j->next;
    if (j->next) j->next->prev = j->prev;
    else js->newest = j->prev;
    js->n--;
}

/* Forgets a finished job, here and in the durable store; lock held. */
static void evict(job_store *js, job *j) {
    if (js->be && !js->shared) js->be->iface->delete_job(js->be, j->id); /* shared: kept there until retention ends */
    unlink_job(js, j);
    job_free(js, j);
}

/* Bytes of j's compact JSON text (what the store charges for it), without building the text. */
static size_t json_bytes(const json_t *v) { return v ? json_dumpb(v, NULL, 0, UM_JSON_COMPACT) : 0; }

static void charge(job_store *js, job *j, long delta) {
    j->bytes = (size_t)((long)j->bytes + delta);
    js->bytes = (size_t)((long)js->bytes + delta);
}

/* Evicts finished jobs, oldest first and never keep, until need more bytes fit in max_bytes;
 * lock held. 1 when they fit. */
static int make_room(job_store *js, size_t need, const job *keep) {
    for (job *j = js->oldest; j && js->bytes + need > js->o.max_bytes;) {
        job *nx = j->next;
        if (j != keep && job_status_terminal(j->status)) evict(js, j);
        j = nx;
    }
    return js->bytes + need <= js->o.max_bytes;
}

/* Drops j's oldest kept event (there is one: first_kept_id < next_event_id); lock held. */
static void drop_oldest_event(job_store *js, job *j) {
    CHECK(j->first_kept_id < j->next_event_id && j->ring_cap > 0);
    int slot = (int)(j->first_kept_id % j->ring_cap);
    if (j->ring[slot]) charge(js, j, -(long)strlen(j->ring[slot]));
    free(j->ring[slot]);
    j->ring[slot] = NULL;
    j->first_kept_id++;
}

/* Room for need (<= max_events) events in j's ring, which grows by doubling; the events it holds,
 * ids [first_kept_id, next_event_id) — the ring never holds any other id — are laid out for the
 * new capacity. Lock held. */
static void ring_reserve(job_store *js, job *j, int64_t need) {
    CHECK(need <= js->o.max_events);
    if (need <= j->ring_cap) return;
    CHECK(j->next_event_id - j->first_kept_id <= j->ring_cap);
    int cap = j->ring_cap ? j->ring_cap : 16;
    while (cap < need) cap *= 2;
    if (cap > js->o.max_events) cap = js->o.max_events;
    char **ring = xcalloc((size_t)cap, sizeof *ring);
    for (int64_t id = j->first_kept_id; id < j->next_event_id; id++) ring[id % cap] = j->ring[id % j->ring_cap];
    free(j->ring);
    j->ring = ring;
    j->ring_cap = cap;
}

/* Moves the end of j's log to next (> next_event_id; the ids in between hold no event yet),
 * dropping the oldest events so the window [first_kept_id, next) stays within max_events, and
 * makes room for it in the ring. Lock held. */
static void log_extend(job_store *js, job *j, int64_t next) {
    if (next <= j->next_event_id) return;
    const int64_t first = next - js->o.max_events; /* the oldest id the new window can keep */
    while (j->first_kept_id < first && j->first_kept_id < j->next_event_id) drop_oldest_event(js, j);
    if (j->first_kept_id < first) j->first_kept_id = first; /* nothing left to drop */
    ring_reserve(js, j, next - j->first_kept_id);
    j->next_event_id = next;
}

/* Append an event under the lock; returns its id. The log keeps max_events events at most, and
 * loses its oldest ones when the store's max_bytes would be exceeded otherwise. */
static int64_t log_event(job_store *js, job *j, const json_t *ev) {
    char *s = json_dumps(ev, UM_JSON_COMPACT);
    CHECK(s != NULL);
    size_t len = strlen(s);
    const int64_t first_before = j->first_kept_id;
    const int64_t id = j->next_event_id;
    if (j->detached) { /* another server's job (a cancel asked here): its log is in the store */
        js->be->iface->put_event(js->be, j->id, id, s);
        j->next_event_id++;
        free(s);
        return id;
    }
    log_extend(js, j, id + 1);
    if (!make_room(js, len, j))
        while (j->first_kept_id < id && js->bytes + len > js->o.max_bytes) drop_oldest_event(js, j);
    j->ring[id % j->ring_cap] = s;
    charge(js, j, (long)len);
    if (js->be) {
        if (j->first_kept_id > first_before) js->be->iface->drop_events_before(js->be, j->id, j->first_kept_id);
        js->be->iface->put_event(js->be, j->id, id, s);
        j->touched = mono_now();
    }
    return id;
}

static void log_status(job_store *js, job *j) {
    json_t *ev = json_pack("{s:s, s:s, s:i}", "type", "status", "status", job_status_name(j->status), "attempts",
                           j->attempts);
    if (j->error) json_object_set_new(ev, "error", json_string(j->error));
    log_event(js, j, ev);
    json_decref(ev);
}

/* Shared backend: a job this server took is done with once it is terminal and its webhook (if
 * any) settled: the queue entry is acknowledged. Until then a server that takes over from a dead
 * one finds it (and sends its webhook again). Lock held. */
static void maybe_ack(job_store *js, job *j) {
    if (!js->shared || !j->qentry[0] || !job_status_terminal(j->status)) return;
    if (j->webhook && strcmp(j->webhook_status, "pending") == 0) return;
    js->be->iface->ack(js->be, j->qentry);
}

/* Ends j: its final status event, then its document (after the event: it names the log's end
 * exactly, and a reader of a shared store never sees the job finished before its last event). */
static void set_terminal(job_store *js, job *j, enum job_status st) {
    if (!job_status_terminal(j->status)) js->n_active--;
    j->status = st;
    j->completed_at = unix_now();
    log_status(js, j);
    persist(js, j);
    maybe_ack(js, j);
}

static void resync_check(job_store *js);
static job *job_parse(const char *id, int64_t seq, const char *doc, um_err *err);
static void link_job(job_store *js, job *j);
static int load_event(void *user, const char *id, int64_t eid, const char *doc, um_err *err);

/* One durable transaction around a mutation (no-ops without a durable store); lock held. A write
 * that failed marks the time; once the backend connects again (a new epoch) or writes work again,
 * what changed since is written again (resync). */
static void db_begin(job_store *js) {
    if (js->be) js->be->iface->begin(js->be);
}
static void db_end(job_store *js) {
    if (!js->be) return;
    js->be->iface->end(js->be);
    long e = js->be->iface->write_errors(js->be);
    if (e != js->errors_seen) {
        if (!js->dirty_since) js->dirty_since = mono_now() - 1.0; /* the failed batch began before now */
        js->errors_seen = e;
    } else if (js->dirty_since || (js->be->iface->epoch && js->be->iface->epoch(js->be) != js->synced_epoch)) {
        resync_check(js);
    }
}

/* j held here, or — shared backend — a detached copy read from the store (*tmp; free it with
 * drop_tmp); NULL when unknown. Lock held. */
static job *lookup(job_store *js, const char *id, job **tmp) {
    *tmp = NULL;
    job *j = find(js, id);
    if (j || !js->shared || !id) return j;
    char *doc = NULL;
    int64_t seq = 0;
    if (js->be->iface->fetch(js->be, id, &doc, &seq) != 1) return NULL;
    um_err err = {0};
    *tmp = job_parse(id, seq, doc, &err);
    if (*tmp) (*tmp)->detached = 1;
    else log_warn("job store: job %.40s has a damaged document in the store (%s); it reads as unknown", id, err.msg);
    free(doc);
    return *tmp;
}

static void drop_tmp(job_store *js, job *tmp) {
    if (tmp) job_free(js, tmp);
}

int job_store_has_idem(job_store *js, const char *owner, const char *idem_key) {
    int found = 0;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    if (js->shared) {
        char existing[40];
        found = js->be->iface->idem_lookup(js->be, owner ? owner : "", idem_key, existing) == 1;
    }
    for (job *j = js->oldest; j && !found; j = j->next)
        found = j->idem_key && strcmp(j->idem_key, idem_key) == 0 && strcmp(j->owner, owner ? owner : "") == 0;
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return found;
}

/* The job created earlier under (owner, idem_key): 0 with id_out when its request equals request,
 * -1 with err otherwise. Lock held. */
static int idem_replay(const job *j, const char *idem_key, const json_t *request, char id_out[40], um_err *err) {
    if (!json_equal(j->request, (json_t *)request))
        return um_err_param(err, "Idempotency-Key",
                            "Idempotency-Key '%.64s' was already used with a different request body", idem_key);
    snprintf(id_out, 40, "%s", j->id);
    return 0;
}

/* Forgets a job that was never accepted (its write-through failed, or another server holds its
 * Idempotency-Key); lock held. */
static void discard_new(job_store *js, job *j) {
    js->n_active--;
    if (js->be) js->be->iface->delete_job(js->be, j->id);
    unlink_job(js, j);
    job_free(js, j);
}

int job_store_create(job_store *js, const char *owner, const char *idem_key, const json_t *request,
                     const char *webhook, char id_out[40], int *existed, um_err *err) {
    *existed = 0;
    owner = owner ? owner : "";
    pthread_mutex_lock(&js->lock); /* --- lock { */
    if (idem_key && idem_key[0]) {
        for (job *j = js->oldest; j; j = j->next) {
            if (j->idem_key && strcmp(j->idem_key, idem_key) == 0 && strcmp(j->owner, owner) == 0) {
                int rc = idem_replay(j, idem_key, request, id_out, err);
                *existed = rc == 0;
                pthread_mutex_unlock(&js->lock);
                return rc;
            }
        }
    }
    if (js->n_active >= js->o.max_active) {
        pthread_mutex_unlock(&js->lock);
        return um_err_set(err, UM_ERR_RESOURCE, "too many unfinished jobs (%d); retry later", js->o.max_active);
    }
    size_t req_bytes = json_bytes(request) + JOB_OVERHEAD;
    if (!make_room(js, req_bytes, NULL)) {
        size_t have = js->bytes;
        pthread_mutex_unlock(&js->lock);
        return um_err_set(err, UM_ERR_RESOURCE,
                          "the job store is full (%zu MB of unfinished jobs' requests and events; --jobs-max-bytes); "
                          "retry later",
                          have >> 20);
    }
    /* evict the oldest finished jobs beyond max_jobs */
    for (job *j = js->oldest; j && js->n >= js->o.max_jobs;) {
        job *nx = j->next;
        if (job_status_terminal(j->status)) evict(js, j);
        j = nx;
    }
    job *j = xcalloc(1, sizeof *j);
    unsigned char rnd[12];
    if (RAND_bytes(rnd, sizeof rnd) != 1) UM_FATAL("RAND_bytes failed");
    char *p = j->id + snprintf(j->id, sizeof j->id, "job_");
    for (size_t i = 0; i < sizeof rnd; i++) p += sprintf(p, "%02x", rnd[i]);
    j->owner = xstrdup(owner);
    j->idem_key = idem_key && idem_key[0] ? xstrdup(idem_key) : NULL;
    j->request = json_deep_copy(request);
    j->webhook = webhook ? xstrdup(webhook) : NULL;
    j->status = JOB_QUEUED;
    j->created_at = unix_now();
    j->next_event_id = 1;
    j->first_kept_id = 1;
    snprintf(j->webhook_status, sizeof j->webhook_status, "%s", webhook ? "pending" : "");
    j->seq = js->next_seq++;
    link_job(js, j);
    const long failed_before = js->be ? js->be->iface->write_errors(js->be) : 0;
    json_t *ev = json_pack("{s:s, s:s}", "type", "status", "status", "queued");
    if (js->shared) { /* one atomic write: the job, its event, its queue entry, its key (first to claim wins) */
        char *evs = json_dumps(ev, UM_JSON_COMPACT);
        j->next_event_id = 2;
        char *doc = job_doc(j), other[40] = "";
        int r = js->be->iface->create(js->be, j->id, j->seq, owner, doc, evs, j->idem_key, other);
        free(doc);
        free(evs);
        json_decref(ev);
        if (r == 0) { /* another server's job holds the key */
            discard_new(js, j);
            job *tmp = NULL, *o = lookup(js, other, &tmp);
            int rc = o ? idem_replay(o, idem_key, request, id_out, err)
                       : um_err_set(err, UM_ERR_IO, "the job of Idempotency-Key '%.64s' is not readable; retry later",
                                    idem_key);
            *existed = rc == 0;
            drop_tmp(js, tmp);
            pthread_mutex_unlock(&js->lock);
            return rc;
        }
    } else {
        db_begin(js);
        log_event(js, j, ev);
        json_decref(ev);
        persist(js, j); /* after its event: a queued job's document names its next event id exactly */
        db_end(js);     /* durable before the 202 */
    }
    if (js->be && js->be->iface->write_errors(js->be) != failed_before) { /* not durable: not accepted */
        const char *why = js->be->iface->failing(js->be);
        char msg[300];
        snprintf(msg, sizeof msg, "%s", why ? why : "write failed");
        discard_new(js, j);
        pthread_mutex_unlock(&js->lock);
        return um_err_set(err, UM_ERR_IO, "the job store cannot write (%s); the job was not accepted, retry later", msg);
    }
    snprintf(id_out, 40, "%s", j->id);
    if (js->shared) { /* the server that takes it from the queue holds it; this one reads it from the store */
        js->n_active--;
        unlink_job(js, j);
        job_free(js, j);
    }
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return 0;
}

int job_store_exists(job_store *js, const char *id, const char *owner) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    int ok = j && strcmp(j->owner, owner ? owner : "") == 0;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return ok;
}

static json_t *time_or_null(double t) { return t > 0 ? json_integer((json_int_t)t) : json_null(); }

/* j's status as the API names it: a running job asked to stop says so until its engine work ends
 * (at the next step). */
static const char *api_status(const job *j) {
    return j->status == JOB_RUNNING && j->cancel_requested ? "cancelling" : job_status_name(j->status);
}

/* The API object of j. Caller holds the lock. */
static json_t *job_json(const job *j) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(j->id));
    json_object_set_new(o, "object", json_string("job"));
    json_object_set_new(o, "status", json_string(api_status(j)));
    json_object_set_new(o, "created_at", time_or_null(j->created_at));
    json_object_set_new(o, "started_at", time_or_null(j->started_at));
    json_object_set_new(o, "completed_at", time_or_null(j->completed_at));
    json_object_set_new(o, "attempts", json_integer(j->attempts));
    double frac = j->status == JOB_SUCCEEDED ? 1.0 : j->gen_length > 0 ? (double)j->committed / j->gen_length : 0.0;
    if (frac > 1) frac = 1;
    json_object_set_new(o, "progress",
                        json_pack("{s:f, s:I, s:I, s:I, s:I}", "fraction", frac, "steps", (json_int_t)j->steps,
                                  "committed", (json_int_t)j->committed, "gen_length", (json_int_t)j->gen_length,
                                  "events", (json_int_t)(j->next_event_id - 1)));
    json_object_set_new(o, "result", j->result ? json_deep_copy(j->result) : json_null());
    json_object_set_new(o, "error",
                        j->error ? json_pack("{s:s, s:s, s:n, s:s}", "message", j->error, "type", "server_error",
                                             "param", "code", "engine_failure")
                                 : json_null());
    if (j->webhook)
        json_object_set_new(o, "webhook",
                            json_pack("{s:s, s:s, s:i}", "url", j->webhook, "status", j->webhook_status, "attempts",
                                      j->webhook_attempts));
    else
        json_object_set_new(o, "webhook", json_null());
    json_object_set_new(o, "request", json_deep_copy(j->request));
    return o;
}

json_t *job_store_get_json(job_store *js, const char *id, const char *owner) {
    pthread_mutex_lock(&js->lock); /* --- lock { */
    job *tmp, *j = lookup(js, id, &tmp);
    json_t *o = j && strcmp(j->owner, owner ? owner : "") == 0 ? job_json(j) : NULL;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return o;
}

int job_store_peek(job_store *js, const char *id, const char *owner, char status[16], int *attempts) {
    pthread_mutex_lock(&js->lock); /* --- lock { */
    job *tmp, *j = lookup(js, id, &tmp);
    int ok = j && strcmp(j->owner, owner ? owner : "") == 0;
    if (ok) {
        snprintf(status, 16, "%s", api_status(j));
        *attempts = j->attempts;
    }
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return ok;
}

/* Shared backend: owner's jobs from the store, newest first, as a detached chain (prev links);
 * lock held. */
static job *list_shared(job_store *js, const char *owner) {
    char(*ids)[40] = NULL;
    int n = js->be->iface->list(js->be, owner ? owner : "", &ids);
    job *newest = NULL, *last = NULL;
    for (int i = 0; i < n; i++) {
        job *tmp, *j = lookup(js, ids[i], &tmp);
        if (!j) continue;
        if (!tmp) { /* held here: a detached copy of its current state */
            char *doc = job_doc(j);
            tmp = job_parse(j->id, j->seq, doc, NULL); /* a document of ours */
            free(doc);
            if (!tmp) continue;
        }
        if (last) last->prev = tmp;
        else newest = tmp;
        last = tmp;
    }
    free(ids);
    return newest;
}

int job_store_list(job_store *js, const char *owner, int status, const char *after, int limit, json_t **out) {
    json_t *data = json_array();
    int has_more = 0, found_after = !after || !after[0];
    pthread_mutex_lock(&js->lock); /* --- lock { */
    job *chain = js->shared ? list_shared(js, owner) : NULL;
    for (job *j = js->shared ? chain : js->newest; j; j = j->prev) {
        if (strcmp(j->owner, owner ? owner : "") != 0) continue;
        if (!found_after) {
            found_after = strcmp(j->id, after) == 0;
            continue;
        }
        if (status >= 0 && (int)j->status != status) continue;
        if ((int)json_array_size(data) == limit) {
            has_more = 1;
            break;
        }
        json_array_append_new(data, job_json(j));
    }
    while (chain) {
        job *p = chain->prev;
        job_free(js, chain);
        chain = p;
    }
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    if (!found_after) {
        json_decref(data);
        return -1;
    }
    size_t n = json_array_size(data);
    *out = json_pack("{s:s, s:o, s:b, s:o, s:o}", "object", "list", "data", data, "has_more", has_more, "first_id",
                     n ? json_incref(json_object_get(json_array_get(data, 0), "id")) : json_null(), "last_id",
                     n ? json_incref(json_object_get(json_array_get(data, n - 1), "id")) : json_null());
    return 0;
}

char *job_store_owner(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    char *o = j ? xstrdup(j->owner) : NULL;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return o;
}

json_t *job_store_request(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    json_t *r = j ? json_deep_copy(j->request) : NULL;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return r;
}

enum job_status job_store_status(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    enum job_status s = j ? j->status : JOB_FAILED;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return s;
}

int job_store_start(job_store *js, const char *id, double gen_length) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    if (!j || j->status != JOB_QUEUED) {
        pthread_mutex_unlock(&js->lock);
        return -1;
    }
    j->status = JOB_RUNNING;
    j->attempts++;
    if (!j->started_at) j->started_at = unix_now();
    j->gen_length = gen_length;
    j->steps = j->committed = 0;
    db_begin(js);
    persist(js, j); /* the attempt count survives a crash */
    json_t *ev = json_pack("{s:s, s:s, s:i}", "type", "status", "status", "running", "attempt", j->attempts);
    log_event(js, j, ev);
    json_decref(ev);
    db_end(js);
    pthread_mutex_unlock(&js->lock);
    return 0;
}

int64_t job_store_append(job_store *js, const char *id, const json_t *ev, const job_progress *pr) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    int64_t eid = 0;
    if (j && !job_status_terminal(j->status)) {
        if (pr) {
            j->steps = pr->steps;
            j->committed = pr->committed;
        }
        eid = log_event(js, j, ev);
    }
    pthread_mutex_unlock(&js->lock);
    return eid;
}

void job_store_succeed(job_store *js, const char *id, const json_t *result) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    if (j && !job_status_terminal(j->status)) {
        json_decref(j->result);
        j->result = json_deep_copy(result);
        size_t len = json_bytes(result);
        make_room(js, len, j); /* the result is kept even when nothing else can go */
        charge(js, j, (long)len);
        j->committed = (long)j->gen_length;
        db_begin(js);
        set_terminal(js, j, JOB_SUCCEEDED);
        db_end(js);
    }
    pthread_mutex_unlock(&js->lock);
}

void job_store_cancelled(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    if (j && !job_status_terminal(j->status)) {
        db_begin(js);
        set_terminal(js, j, JOB_CANCELLED);
        db_end(js);
    }
    pthread_mutex_unlock(&js->lock);
}

int job_store_attempt_failed(job_store *js, const char *id, const char *message) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    int retry = 0;
    if (j && !job_status_terminal(j->status)) {
        if (j->attempts < js->o.max_attempts && !j->cancel_requested) {
            j->status = JOB_QUEUED;
            db_begin(js);
            json_t *ev = json_pack("{s:s, s:i, s:s}", "type", "retry", "attempt", j->attempts, "error",
                                   message ? message : "engine failure");
            log_event(js, j, ev);
            json_decref(ev);
            persist(js, j);
            db_end(js);
            retry = 1;
        } else {
            free(j->error);
            j->error = xstrdup(message ? message : "engine failure");
            db_begin(js);
            set_terminal(js, j, JOB_FAILED);
            db_end(js);
        }
    }
    pthread_mutex_unlock(&js->lock);
    return retry;
}

int job_store_fail_unfinished(job_store *js, const char *message, char (**ids_out)[40]) {
    pthread_mutex_lock(&js->lock); /* --- lock { */
    char(*ids)[40] = xmalloc((size_t)(js->n_active > 0 ? js->n_active : 1) * sizeof *ids);
    int n = 0;
    for (job *j = js->oldest; j; j = j->next) {
        if (job_status_terminal(j->status)) continue;
        free(j->error);
        j->error = xstrdup(message);
        set_terminal(js, j, JOB_FAILED);
        memcpy(ids[n++], j->id, sizeof ids[0]);
    }
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    *ids_out = ids;
    return n;
}

int job_store_cancel(job_store *js, const char *id, const char *owner) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    int r = 0;
    if (j && strcmp(j->owner, owner ? owner : "") == 0 && !job_status_terminal(j->status)) {
        j->cancel_requested = 1;
        db_begin(js);
        if (tmp) { /* held by another server (or still in the queue): tell whoever runs it, write it back */
            js->be->iface->cancel_signal(js->be, id);
            if (j->status == JOB_QUEUED) {
                j->status = JOB_CANCELLED;
                j->completed_at = unix_now();
                r = 1;
            } else {
                r = 2;
            }
            if (r == 1) log_status(js, j);
            persist(js, j);
        } else if (j->status == JOB_QUEUED) {
            set_terminal(js, j, JOB_CANCELLED);
            r = 1;
        } else {
            persist(js, j); /* a cancel asked for survives a restart: the job is not run again */
            r = 2;
        }
        db_end(js);
    }
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return r;
}

int job_store_cancel_requested(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *j = find(js, id);
    int r = j ? j->cancel_requested : 0;
    pthread_mutex_unlock(&js->lock);
    return r;
}

void job_store_webhook_state(job_store *js, const char *id, const char *status, int attempts) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    if (j) {
        snprintf(j->webhook_status, sizeof j->webhook_status, "%s", status);
        j->webhook_attempts = attempts;
        db_begin(js);
        persist(js, j);
        maybe_ack(js, j);
        db_end(js);
    }
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
}

char *job_store_webhook(job_store *js, const char *id) {
    pthread_mutex_lock(&js->lock);
    job *tmp, *j = lookup(js, id, &tmp);
    char *w = j && j->webhook ? xstrdup(j->webhook) : NULL;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock);
    return w;
}

/* Events from..from+max-1 of a job another server holds, read from the store: the ones present,
 * up to the first gap (its document may lag its newest events; the terminal document and its
 * last event are written in one transaction). Lock held. */
static int remote_events(job_store *js, const job *j, int64_t from, int max, job_event_copy **out, int *terminal) {
    if (max > 256) max = 256;
    char **docs = xcalloc((size_t)max, sizeof *docs);
    int n = 0;
    if (js->be->iface->fetch_events(js->be, j->id, from, max, docs) == 0)
        while (n < max && docs[n]) n++;
    job_event_copy *ev = n ? xcalloc((size_t)n, sizeof *ev) : NULL;
    for (int i = 0; i < n; i++) ev[i].id = from + i, ev[i].json = docs[i], docs[i] = NULL;
    for (int i = 0; i < max; i++) free(docs[i]);
    free(docs);
    *terminal = job_status_terminal(j->status) && n < max;
    *out = ev;
    return n;
}

int job_store_events_since(job_store *js, const char *id, int64_t after_id, int max, job_event_copy **out,
                           int *terminal, um_err *err) {
    *out = NULL;
    *terminal = 0;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    job *tmp, *j = lookup(js, id, &tmp);
    if (!j) {
        pthread_mutex_unlock(&js->lock);
        return um_err_set(err, UM_ERR_INVALID_ARG, "no job '%s'", id);
    }
    if (after_id < 0) after_id = 0;
    if (tmp && after_id + 1 >= j->first_kept_id) { /* held by another server: its log in the store */
        int n = remote_events(js, j, after_id + 1, max, out, terminal);
        drop_tmp(js, tmp);
        pthread_mutex_unlock(&js->lock);
        return n;
    }
    if (after_id + 1 < j->first_kept_id) {
        int64_t first = j->first_kept_id;
        drop_tmp(js, tmp);
        pthread_mutex_unlock(&js->lock);
        return um_err_param(err, "Last-Event-ID",
                            "events after %lld are no longer retained (the oldest kept is %lld); fetch the job "
                            "with GET /v1/jobs/%s",
                            (long long)after_id, (long long)first, id);
    }
    int64_t from = after_id + 1, to = j->next_event_id; /* [from, to) */
    int n = to > from ? (int)(to - from) : 0;
    if (n > max) n = max;
    job_event_copy *ev = n ? xcalloc((size_t)n, sizeof *ev) : NULL;
    for (int i = 0; i < n; i++) {
        int64_t eid = from + i;
        ev[i].id = eid;
        const char *e = j->ring[eid % j->ring_cap];
        ev[i].json = xstrdup(e ? e : "{\"type\":\"lost\"}"); /* a write the durable store failed */
    }
    *terminal = job_status_terminal(j->status) && from + n >= to;
    drop_tmp(js, tmp);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    *out = ev;
    return n;
}

void job_events_free(job_event_copy *ev, int n) {
    for (int i = 0; i < n; i++) free(ev[i].json);
    free(ev);
}

size_t job_store_bytes(job_store *js) {
    pthread_mutex_lock(&js->lock);
    size_t b = js->bytes;
    pthread_mutex_unlock(&js->lock);
    return b;
}

void job_store_counts(job_store *js, int *queued, int *running, int *total) {
    pthread_mutex_lock(&js->lock);
    int q = 0, r = 0;
    for (job *j = js->oldest; j; j = j->next) {
        q += j->status == JOB_QUEUED;
        r += j->status == JOB_RUNNING;
    }
    if (queued) *queued = q;
    if (running) *running = r;
    if (total) *total = js->n;
    pthread_mutex_unlock(&js->lock);
}

/* ---------------------------------------------------------------- loading it back */

/* The largest event id or seq a stored job may carry: far beyond what any job reaches (2^53 ids
 * at a million events a second last 285 years), exact in every JSON client, and small enough that
 * id arithmetic (id + 1, id - window) never overflows. A stored value beyond it is damage. */
#define JOB_ID_NUM_MAX ((int64_t)1 << 53)
#define JOB_ATTEMPTS_MAX 1000000   /* attempts / webhook attempts a stored job may carry */

/* doc's integer field key into *out, within [lo, hi]; absent (or null) = dflt. -1 with err when
 * present but not such an integer. */
static int doc_int(const json_t *doc, const char *key, int64_t lo, int64_t hi, int64_t dflt, int64_t *out, um_err *err) {
    const json_t *v = json_object_get(doc, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return um_err_set(err, UM_ERR_FORMAT, "\"%s\" must be an integer in [%lld, %lld]", key, (long long)lo,
                          (long long)hi);
    *out = json_integer_value(v);
    return 0;
}

/* doc's field key as a time or length (a number >= 0, finite); absent = 0. */
static int doc_num(const json_t *doc, const char *key, double *out, um_err *err) {
    const json_t *v = json_object_get(doc, key);
    *out = 0;
    if (!v || json_is_null(v)) return 0;
    double x = json_number_value(v);
    if (!json_is_number(v) || !(x >= 0 && x < 1e15))
        return um_err_set(err, UM_ERR_FORMAT, "\"%s\" must be a number >= 0", key);
    *out = x;
    return 0;
}

/* doc's field key as a string or absent/null (*out NULL). */
static int doc_str(const json_t *doc, const char *key, const char **out, um_err *err) {
    const json_t *v = json_object_get(doc, key);
    *out = json_string_value(v);
    if (v && !json_is_null(v) && !json_is_string(v)) return um_err_set(err, UM_ERR_FORMAT, "\"%s\" must be a string", key);
    return 0;
}

/* A job from its durable document (detached: in no list, charged nothing), or NULL with err saying
 * what is wrong with it: not JSON, a field of the wrong type, or a value this server never writes
 * (a status out of range, negative or absurd ids and counts). A document is never repaired here:
 * what a damaged one meant cannot be known. */
static job *job_parse(const char *id, int64_t seq, const char *doc, um_err *err) {
    size_t idlen = strlen(id);
    if (idlen == 0 || idlen >= sizeof ((job *)0)->id) {
        um_err_set(err, UM_ERR_FORMAT, "its id is %zu bytes (1 to %zu expected)", idlen, sizeof ((job *)0)->id - 1);
        return NULL;
    }
    if (seq < 1 || seq > JOB_ID_NUM_MAX) {
        um_err_set(err, UM_ERR_FORMAT, "its seq %lld is out of range [1, 2^53]", (long long)seq);
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loads(doc ? doc : "", 0, &je);
    if (!json_is_object(o)) {
        um_err_set(err, UM_ERR_FORMAT, "its document is not a JSON object (%s)", o ? "another JSON value" : je.text);
        json_decref(o);
        return NULL;
    }
    const json_t *req = json_object_get(o, "request"), *res = json_object_get(o, "result");
    const char *owner = NULL, *idem = NULL, *webhook = NULL, *error = NULL, *wh_status = NULL;
    int64_t status = 0, attempts = 0, cancel = 0, steps = 0, committed = 0, wh_attempts = 0, next = 1, first = 1;
    double created = 0, started = 0, completed = 0, gen_length = 0;
    int bad = !json_is_object(req) ? um_err_set(err, UM_ERR_FORMAT, "\"request\" must be an object") : 0;
    if (!bad && res && !json_is_null(res) && !json_is_object(res))
        bad = um_err_set(err, UM_ERR_FORMAT, "\"result\" must be an object or null");
    if (!bad && !json_is_integer(json_object_get(o, "status")))
        bad = um_err_set(err, UM_ERR_FORMAT, "\"status\" must be an integer");
    bad = bad || doc_str(o, "owner", &owner, err) || doc_str(o, "idem_key", &idem, err) ||
          doc_str(o, "webhook", &webhook, err) || doc_str(o, "error", &error, err) ||
          doc_str(o, "webhook_status", &wh_status, err) ||
          doc_int(o, "status", JOB_QUEUED, JOB_CANCELLED, JOB_QUEUED, &status, err) ||
          doc_int(o, "attempts", 0, JOB_ATTEMPTS_MAX, 0, &attempts, err) ||
          doc_int(o, "cancel_requested", 0, 1, 0, &cancel, err) ||
          doc_int(o, "steps", 0, JOB_ID_NUM_MAX, 0, &steps, err) ||
          doc_int(o, "committed", 0, JOB_ID_NUM_MAX, 0, &committed, err) ||
          doc_int(o, "webhook_attempts", 0, JOB_ATTEMPTS_MAX, 0, &wh_attempts, err) ||
          doc_int(o, "first_kept_id", 1, JOB_ID_NUM_MAX, 1, &first, err) ||
          doc_int(o, "next_event_id", first, JOB_ID_NUM_MAX, first, &next, err) ||
          doc_num(o, "created_at", &created, err) || doc_num(o, "started_at", &started, err) ||
          doc_num(o, "completed_at", &completed, err) || doc_num(o, "gen_length", &gen_length, err);
    if (!bad && wh_status && strcmp(wh_status, "") != 0 && strcmp(wh_status, "pending") != 0 &&
        strcmp(wh_status, "delivered") != 0 && strcmp(wh_status, "failed") != 0)
        bad = um_err_set(err, UM_ERR_FORMAT, "\"webhook_status\" '%.32s' is not one of pending, delivered, failed",
                         wh_status);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    job *j = xcalloc(1, sizeof *j);
    memcpy(j->id, id, idlen + 1);
    j->seq = seq;
    j->owner = xstrdup(owner ? owner : "");
    j->idem_key = idem ? xstrdup(idem) : NULL;
    j->request = json_incref((json_t *)req);
    j->webhook = webhook ? xstrdup(webhook) : NULL;
    j->status = (enum job_status)status;
    j->attempts = (int)attempts;
    j->cancel_requested = (int)cancel;
    j->created_at = created;
    j->started_at = started;
    j->completed_at = completed;
    j->gen_length = gen_length;
    j->steps = (long)steps;
    j->committed = (long)committed;
    j->result = json_is_object(res) ? json_incref((json_t *)res) : NULL;
    j->error = error ? xstrdup(error) : NULL;
    snprintf(j->webhook_status, sizeof j->webhook_status, "%s", wh_status ? wh_status : "");
    j->webhook_attempts = (int)wh_attempts;
    j->next_event_id = next;
    j->first_kept_id = first;
    json_decref(o);
    return j;
}

/* Adds a job to the store (newest); lock held. */
static void link_job(job_store *js, job *j) {
    charge(js, j, (long)(json_bytes(j->request) + JOB_OVERHEAD + json_bytes(j->result)));
    unsigned h = hash_id(j->id);
    j->hnext = js->buckets[h];
    js->buckets[h] = j;
    j->prev = js->newest;
    if (js->newest) js->newest->next = j;
    else js->oldest = j;
    js->newest = j;
    js->n++;
    if (!job_status_terminal(j->status)) js->n_active++;
    if (j->seq >= js->next_seq) js->next_seq = j->seq + 1;
}

/* A parsed job about to be held here: its event log is empty until load_event() puts the stored
 * events back and load_finish() moves its end to the document's next_event_id (which may lag the
 * newest events: the row is written less often than they are). A detached copy (lookup()) keeps
 * the document's ids and no ring: its events are read from the store. */
static void load_begin(job *j) {
    j->stored_next_id = j->next_event_id;
    j->next_event_id = j->first_kept_id;
}

static int load_job(void *user, const char *id, int64_t seq, const char *doc, um_err *err) {
    job_store *js = user;
    if (find(js, id)) return um_err_set(err, UM_ERR_FORMAT, "it is stored twice");
    if (js->newest && seq <= js->newest->seq) /* rows come in creation order: equal seqs collide */
        return um_err_set(err, UM_ERR_FORMAT, "its seq %lld is also that of job %.40s (seqs are unique)", (long long)seq,
                          js->newest->id);
    job *j = job_parse(id, seq, doc, err);
    if (!j) return -1;
    load_begin(j);
    link_job(js, j);
    return 0;
}

/* One stored event of a job being read back (events come in ascending eid; older ones than the
 * window keeps are dropped as newer ones arrive). Events of a job that is not stored (a delete
 * cut short by a crash) are ignored. -1 with err for an id or a document this server never writes. */
static int load_event(void *user, const char *id, int64_t eid, const char *doc, um_err *err) {
    job_store *js = user;
    size_t len = doc ? strlen(doc) : 0;
    if (eid < 1 || eid >= JOB_ID_NUM_MAX) /* eid + 1 must stay a valid id */
        return um_err_set(err, UM_ERR_FORMAT, "the event id is out of range [1, 2^53)");
    if (len < 2 || doc[0] != '{' || doc[len - 1] != '}')
        return um_err_set(err, UM_ERR_FORMAT, "the event is not a JSON object");
    job *j = find(js, id);
    if (!j || eid < j->first_kept_id) return 0;
    log_extend(js, j, eid + 1);
    if (eid < j->first_kept_id) return 0;
    char **slot = &j->ring[eid % j->ring_cap];
    if (*slot) charge(js, j, -(long)strlen(*slot)), free(*slot);
    *slot = xstrdup(doc);
    charge(js, j, (long)len);
    return 0;
}

/* Once j's stored events are read: the log ends at the document's next_event_id or after the
 * newest event read, whichever is later (ids without a stored event read as "lost"). */
static void load_finish(job_store *js, job *j) {
    log_extend(js, j, j->stored_next_id);
    j->stored_next_id = 0;
}

int job_store_load(job_store *js, um_err *err) {
    if (!js->be || !js->be->iface->load) return 0;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    int rc = js->be->iface->load(js->be, load_job, load_event, js, err);
    for (job *j = js->oldest; j; j = j->next) load_finish(js, j);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return rc;
}

/* A job found running with no server running it (this one restarted, or a dead replica's):
 * cancelled when `cancel`, failed when its attempts are used up, else queued again with a retry
 * event. Others are left as they are. Under the store's lock. */
static void recover_job(job_store *js, job *j, int cancel, const char *why) {
    if (cancel) {
        set_terminal(js, j, JOB_CANCELLED);
    } else if (j->status == JOB_RUNNING && j->attempts >= js->o.max_attempts) {
        free(j->error);
        j->error = xstrdup(why);
        set_terminal(js, j, JOB_FAILED);
    } else if (j->status == JOB_RUNNING) {
        j->status = JOB_QUEUED;
        json_t *ev = json_pack("{s:s, s:i, s:s}", "type", "retry", "attempt", j->attempts, "error", why);
        log_event(js, j, ev);
        json_decref(ev);
        persist(js, j);
    }
}

int job_store_recover(job_store *js, const char *why, char (**queued_out)[40], char (**hooks_out)[40], int *n_hooks) {
    pthread_mutex_lock(&js->lock); /* --- lock { */
    char(*q)[40] = xmalloc((size_t)(js->n > 0 ? js->n : 1) * sizeof *q);
    char(*h)[40] = xmalloc((size_t)(js->n > 0 ? js->n : 1) * sizeof *h);
    int nq = 0, nh = 0;
    db_begin(js);
    for (job *j = js->oldest; j; j = j->next) {
        recover_job(js, j, j->status == JOB_RUNNING && j->cancel_requested, why);
        if (j->status == JOB_QUEUED) memcpy(q[nq++], j->id, sizeof q[0]);
        if (job_status_terminal(j->status) && j->webhook && strcmp(j->webhook_status, "pending") == 0)
            memcpy(h[nh++], j->id, sizeof h[0]);
    }
    db_end(js);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    *queued_out = q;
    *hooks_out = h;
    *n_hooks = nh;
    return nq;
}

int job_store_durable(job_store *js) { return js->be != NULL; }
int job_store_shared(job_store *js) { return js->shared; }

int job_store_failing(job_store *js, char *buf, size_t cap) {
    pthread_mutex_lock(&js->lock);
    const char *why = js->be ? js->be->iface->failing(js->be) : NULL;
    if (why) snprintf(buf, cap, "%s", why);
    pthread_mutex_unlock(&js->lock);
    return why != NULL;
}

long job_store_write_errors(job_store *js) {
    pthread_mutex_lock(&js->lock);
    long n = js->be ? js->be->iface->write_errors(js->be) : 0;
    pthread_mutex_unlock(&js->lock);
    return n;
}

void job_store_batch_begin(job_store *js) {
    pthread_mutex_lock(&js->lock);
    db_begin(js);
    pthread_mutex_unlock(&js->lock);
}

void job_store_batch_end(job_store *js) {
    pthread_mutex_lock(&js->lock);
    db_end(js);
    pthread_mutex_unlock(&js->lock);
}

/* ---------------------------------------------------------------- outages and shared stores */

/* Writes again every job that changed since writes began failing (since > 0), and with all_active
 * every unfinished job with its kept events (a store that came back may have lost them); lock
 * held. */
static void resync(job_store *js, double since, int all_active) {
    int n = 0;
    js->be->iface->begin(js->be);
    for (job *j = js->oldest; j; j = j->next) {
        if (!((since > 0 && j->touched >= since) || (all_active && !job_status_terminal(j->status)))) continue;
        persist(js, j);
        for (int64_t id = j->first_kept_id; id < j->next_event_id && j->ring_cap; id++)
            if (j->ring[id % j->ring_cap]) js->be->iface->put_event(js->be, j->id, id, j->ring[id % j->ring_cap]);
        maybe_ack(js, j);
        n++;
    }
    js->be->iface->end(js->be);
    js->errors_seen = js->be->iface->write_errors(js->be);
    if (n) log_info("job store: %d job%s written again after the store came back", n, n == 1 ? "" : "s");
}

/* After a reconnection, or once writes work again: write what the store missed. Lock held. */
static void resync_check(job_store *js) {
    if (!js->be || js->be->iface->failing(js->be)) return;
    uint64_t ep = js->be->iface->epoch ? js->be->iface->epoch(js->be) : 0;
    int reconnected = ep != js->synced_epoch;
    if (!reconnected && !js->dirty_since) return;
    double since = js->dirty_since;
    js->synced_epoch = ep;
    js->dirty_since = 0;
    resync(js, since, reconnected);
}

int job_store_tick(job_store *js, char (**cancel_ids)[40]) {
    *cancel_ids = NULL;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    if (js->be && js->be->iface->tick) js->be->iface->tick(js->be);
    resync_check(js);
    int n = 0;
    if (js->shared && !js->be->iface->failing(js->be)) { /* cancels asked on other servers for jobs held here */
        for (job *j = js->oldest; j; j = j->next) {
            if (job_status_terminal(j->status) || j->cancel_requested || !js->be->iface->cancel_signalled(js->be, j->id))
                continue;
            j->cancel_requested = 1;
            persist(js, j);
            *cancel_ids = xrealloc(*cancel_ids, (size_t)(n + 1) * sizeof **cancel_ids);
            memcpy((*cancel_ids)[n++], j->id, 40);
        }
    }
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return n;
}

/* Reads a taken job's kept events into its ring (from first_kept_id until the first gap); lock held. */
static void adopt_events(job_store *js, job *j) {
    enum { CHUNK = 256 };
    char *docs[CHUNK];
    for (int64_t from = j->first_kept_id;; from += CHUNK) {
        memset(docs, 0, sizeof docs);
        if (js->be->iface->fetch_events(js->be, j->id, from, CHUNK, docs) != 0) return;
        int i = 0;
        for (; i < CHUNK && docs[i]; i++) {
            um_err err = {0};
            if (load_event(js, j->id, from + i, docs[i], &err) != 0)
                log_warn("job store: event %lld of job %s is damaged (%s); it reads as lost", (long long)(from + i), j->id,
                         err.msg);
            free(docs[i]);
        }
        for (int k = i; k < CHUNK; k++) free(docs[k]);
        if (i < CHUNK) return;
    }
}

int job_store_take(job_store *js, int max, int timeout_ms, const char *why, char (**ids_out)[40], char (**hooks_out)[40],
                   int *n_hooks) {
    *ids_out = NULL;
    *hooks_out = NULL;
    *n_hooks = 0;
    if (!js->shared) return 0;
    if (max <= 0) /* full: nothing is taken, but the heartbeat goes on (the backend's take renews it) */
        return js->be->iface->take(js->be, 0, timeout_ms, NULL) < 0 ? -1 : 0;
    job_taken *t = xcalloc((size_t)max, sizeof *t);
    int n = js->be->iface->take(js->be, max, timeout_ms, t); /* the feed thread's own connection: no lock */
    if (n <= 0) {
        free(t);
        return n;
    }
    char(*q)[40] = xcalloc((size_t)n, sizeof *q), (*h)[40] = xcalloc((size_t)n, sizeof *h);
    int nq = 0, nh = 0;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    db_begin(js);
    for (int i = 0; i < n; i++) {
        job *j = find(js, t[i].id);
        if (j) { /* ours already (delivered again): keep the newer entry */
            snprintf(j->qentry, sizeof j->qentry, "%s", t[i].entry);
            continue;
        }
        char *doc = NULL;
        int64_t seq = 0;
        int r = js->be->iface->fetch(js->be, t[i].id, &doc, &seq);
        um_err err = {0};
        j = r == 1 ? job_parse(t[i].id, seq, doc, &err) : NULL;
        free(doc);
        if (!j) {
            if (r == 1) log_error("job store: job %.40s has a damaged document in the store (%s); it is not run", t[i].id, err.msg);
            if (r >= 0) js->be->iface->ack(js->be, t[i].entry); /* expired, never written or damaged: nothing to run */
            continue;
        }
        snprintf(j->qentry, sizeof j->qentry, "%s", t[i].entry);
        load_begin(j);
        link_job(js, j);
        adopt_events(js, j);
        load_finish(js, j);
        if (!job_status_terminal(j->status) && js->be->iface->cancel_signalled(js->be, j->id)) j->cancel_requested = 1;
        recover_job(js, j, j->cancel_requested && !job_status_terminal(j->status), why);
        if (j->status == JOB_QUEUED) memcpy(q[nq++], j->id, 40);
        else if (j->webhook && strcmp(j->webhook_status, "pending") == 0) memcpy(h[nh++], j->id, 40);
        else maybe_ack(js, j);
    }
    db_end(js);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    free(t);
    *ids_out = q;
    *hooks_out = h;
    *n_hooks = nh;
    return nq;
}

int job_store_release(job_store *js, const char *why) {
    if (!js->shared) return 0;
    int n = 0;
    pthread_mutex_lock(&js->lock); /* --- lock { */
    db_begin(js);
    for (job *j = js->oldest; j; j = j->next) {
        if (job_status_terminal(j->status) || !j->qentry[0]) continue;
        if (j->status == JOB_RUNNING) { /* interrupted, not failed: the attempt is not counted */
            j->status = JOB_QUEUED;
            if (j->attempts > 0) j->attempts--;
            json_t *ev = json_pack("{s:s, s:i, s:s}", "type", "retry", "attempt", j->attempts, "error", why);
            log_event(js, j, ev);
            json_decref(ev);
        }
        persist(js, j);
        js->be->iface->requeue(js->be, j->id, j->qentry);
        j->qentry[0] = 0;
        n++;
    }
    db_end(js);
    pthread_mutex_unlock(&js->lock); /* } lock --- */
    return n;
}
