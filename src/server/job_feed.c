/*
 * job_feed.c — the job feed thread (job_feed.h): takes jobs from a shared store as this server's
 * capacity allows and hands them to the service thread.
 *
 * Not here: the queue itself (jobs/job_redis.c), running jobs (http_jobs.c).
 * Threads: feed_main on its own thread; drain / batch_free on the service thread; kick / stop from
 * any thread.
 */
#include "server/job_feed.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/log.h"

#define TAKE_WAIT_MS 500     /* a take blocks this long at most (stop is noticed after it) */
#define TICK_EVERY_S 0.5     /* keep-alive, reconnection, cancels */
#define IDLE_WAIT_MS 200     /* full, or the store unreachable: look again after this (or a kick) */

struct job_feed {
    job_store      *js;          /* not owned */
    int             capacity;
    void          (*wake)(void *user);
    void           *wake_user;
    pthread_t       thread;
    int             started;
    pthread_mutex_t lock;
    pthread_cond_t  cv;
    /* --- lock { */
    int             stop;
    int             kicked;
    job_feed_batch  out;          /* waiting for the service thread (owned) */
    /* } lock --- */
};

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void append(char (**list)[40], int *n, char (*ids)[40], int k) {
    if (k <= 0) return;
    *list = xrealloc(*list, (size_t)(*n + k) * sizeof **list);
    memcpy(*list + *n, ids, (size_t)k * sizeof *ids);
    *n += k;
}

/* Waits up to ms for a kick or stop; lock held. */
static void wait_ms(job_feed *f, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    while (!f->stop && !f->kicked)
        if (pthread_cond_timedwait(&f->cv, &f->lock, &ts) == ETIMEDOUT) break;
    f->kicked = 0;
}

static void *feed_main(void *arg) {
    job_feed *f = arg;
    double last_tick = 0;
    for (;;) {
        pthread_mutex_lock(&f->lock);
        int stop = f->stop;
        pthread_mutex_unlock(&f->lock);
        if (stop) break;
        if (mono() - last_tick >= TICK_EVERY_S) {
            last_tick = mono();
            char(*cancel)[40] = NULL;
            int nc = job_store_tick(f->js, &cancel);
            if (nc > 0) {
                pthread_mutex_lock(&f->lock);
                append(&f->out.cancel, &f->out.n_cancel, cancel, nc);
                pthread_mutex_unlock(&f->lock);
                f->wake(f->wake_user);
            }
            free(cancel);
        }
        int q = 0, r = 0;
        job_store_counts(f->js, &q, &r, NULL);
        int room = f->capacity - q - r;
        char(*ids)[40] = NULL, (*hooks)[40] = NULL;
        int nh = 0;
        /* full: nothing is taken (not even a dead server's jobs) until a job ends here (a kick), but
         * the take without room still renews this server's heartbeat (without it the others would
         * take this one for dead after 3 s and claim the jobs it runs) */
        int n = job_store_take(f->js, room > 0 ? room : 0, room > 0 ? TAKE_WAIT_MS : 0,
                               "the server running the job stopped (replica lost)", &ids, &hooks, &nh);
        if (n > 0 || nh > 0) {
            pthread_mutex_lock(&f->lock);
            append(&f->out.run, &f->out.n_run, ids, n);
            append(&f->out.hooks, &f->out.n_hooks, hooks, nh);
            pthread_mutex_unlock(&f->lock);
            f->wake(f->wake_user);
        }
        free(ids);
        free(hooks);
        if (room <= 0 || n < 0) {
            pthread_mutex_lock(&f->lock);
            wait_ms(f, IDLE_WAIT_MS);
            pthread_mutex_unlock(&f->lock);
        }
    }
    return NULL;
}

job_feed *job_feed_start(job_store *js, int capacity, void (*wake)(void *user), void *user) {
    job_feed *f = xcalloc(1, sizeof *f);
    f->js = js;
    f->capacity = capacity > 0 ? capacity : 1;
    f->wake = wake;
    f->wake_user = user;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cv, NULL);
    if (pthread_create(&f->thread, NULL, feed_main, f) != 0) UM_FATAL("job feed: cannot start its thread");
    f->started = 1;
    log_info("job feed: taking up to %d job%s at a time from the shared store", f->capacity, f->capacity == 1 ? "" : "s");
    return f;
}

int job_feed_drain(job_feed *f, job_feed_batch *out) {
    memset(out, 0, sizeof *out);
    if (!f) return 0;
    pthread_mutex_lock(&f->lock);
    *out = f->out;
    memset(&f->out, 0, sizeof f->out);
    pthread_mutex_unlock(&f->lock);
    return out->n_run + out->n_hooks + out->n_cancel;
}

void job_feed_batch_free(job_feed_batch *b) {
    free(b->run);
    free(b->hooks);
    free(b->cancel);
    memset(b, 0, sizeof *b);
}

void job_feed_kick(job_feed *f) {
    if (!f) return;
    pthread_mutex_lock(&f->lock);
    f->kicked = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->lock);
}

void job_feed_stop(job_feed *f) {
    if (!f || !f->started) return;
    pthread_mutex_lock(&f->lock);
    f->stop = 1;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->thread, NULL);
    f->started = 0;
}

void job_feed_free(job_feed *f) {
    if (!f) return;
    job_feed_stop(f);
    job_feed_batch_free(&f->out);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cv);
    free(f);
}
