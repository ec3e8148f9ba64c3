/*
 * job_feed.h — the job feed thread of a server on a shared job store (Redis): it takes queued jobs
 * from the store while fewer than `capacity` jobs are unfinished on this server (its engines'
 * share of the work), takes over the jobs of servers that died, keeps the store's connection alive
 * (reconnecting with backoff, writing again what an outage lost) and notices cancels asked on other
 * servers. What it takes is handed to the service thread (server_wake -> job_feed_drain).
 *
 * Not here: running jobs (server/http_jobs.c), the store (jobs/).
 * Threads: the feed thread runs job_store_take/job_store_tick (the store's own locking); the rest
 * is called on the service thread; the hand-over list lives under job_feed.lock.
 */
#ifndef UM_JOB_FEED_H
#define UM_JOB_FEED_H

#include "jobs/jobs.h"

typedef struct job_feed job_feed;

/* What the feed has for the service thread (each list malloc'd, free()). */
typedef struct job_feed_batch {
    char (*run)[40];      /* taken jobs to run here, in order */
    int    n_run;
    char (*hooks)[40];    /* finished jobs whose webhook must be sent again */
    int    n_hooks;
    char (*cancel)[40];   /* jobs running here that another server was asked to cancel */
    int    n_cancel;
} job_feed_batch;

/* Starts the thread; wake(user) (from the feed thread) once something waits in job_feed_drain. */
job_feed *job_feed_start(job_store *js, int capacity, void (*wake)(void *user), void *user);
/* Service thread: takes what waits (0 when nothing). */
int  job_feed_drain(job_feed *f, job_feed_batch *out);
void job_feed_batch_free(job_feed_batch *b);
/* A job ended here: there may be room for another (any thread). */
void job_feed_kick(job_feed *f);
/* Stop taking jobs and join the thread (drain, shutdown); what it took stays in the store's
 * memory. Idempotent; f may be NULL. */
void job_feed_stop(job_feed *f);
void job_feed_free(job_feed *f);

#endif /* UM_JOB_FEED_H */
