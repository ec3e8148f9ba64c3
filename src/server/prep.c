/*
 * prep.c — request preparation workers (prep.h): a FIFO of jobs served by a few threads, one job
 * per owner key at a time, finished jobs handed back to the service thread.
 *
 * Not here: what a job does (server/ws.c, server/http_api.c build requests with api/).
 * Threads: prep_worker() on each worker; everything else on the service thread; the queue, the
 * busy owners and the finished list live under prep_pool.lock.
 */
#include "server/prep.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "util/log.h"

#define PREP_MAX_THREADS 16

typedef struct worker {
    prep_pool *p;
    pthread_t  thread;
    int        started;
    int        busy;          /* under lock: running a job of owner `owner` */
    uint64_t   owner;
} worker;

struct prep_pool {
    void          (*wake)(void *user);
    void           *wake_user;
    int             n_workers;
    worker          workers[PREP_MAX_THREADS];
    int             n_pending;    /* service thread: submitted, done() not yet called */

    pthread_mutex_t lock;
    pthread_cond_t  cv;
    /* --- under lock */
    prep_job       *q_head, **q_tail;      /* waiting to run */
    prep_job       *fin_head, **fin_tail;  /* finished (or skipped), waiting for done() */
    int             stop;
};

/* Under lock: the first queued job whose owner is not being served by another worker (so one
 * owner's jobs run in order, one at a time), unlinked; NULL if none. */
static prep_job *take_eligible(prep_pool *p) {
    for (prep_job **pp = &p->q_head; *pp; pp = &(*pp)->next) {
        prep_job *j = *pp;
        int owner_busy = 0;
        for (int i = 0; i < p->n_workers; i++)
            if (p->workers[i].busy && p->workers[i].owner == j->owner_key) owner_busy = 1;
        if (owner_busy) continue;
        /* an earlier queued job of the same owner would have been taken first: the scan is FIFO */
        *pp = j->next;
        if (!*pp) p->q_tail = pp;
        j->next = NULL;
        return j;
    }
    return NULL;
}

static void finish_locked(prep_pool *p, prep_job *j) {
    j->next = NULL;
    *p->fin_tail = j;
    p->fin_tail = &j->next;
}

static void *prep_worker(void *arg) {
    worker *w = arg;
    prep_pool *p = w->p;
    for (;;) {
        /* --- prep lock { */
        pthread_mutex_lock(&p->lock);
        prep_job *j = NULL;
        while (!p->stop && !(j = take_eligible(p))) pthread_cond_wait(&p->cv, &p->lock);
        if (!j) {
            pthread_mutex_unlock(&p->lock);
            break;
        }
        w->busy = 1;
        w->owner = j->owner_key;
        pthread_mutex_unlock(&p->lock);
        /* } prep lock --- */

        if (atomic_load(&j->cancel)) j->skipped = 1;
        else j->run(j);

        /* --- prep lock { */
        pthread_mutex_lock(&p->lock);
        w->busy = 0;
        finish_locked(p, j);
        pthread_cond_broadcast(&p->cv); /* the owner's next job may run now */
        pthread_mutex_unlock(&p->lock);
        /* } prep lock --- */
        p->wake(p->wake_user);
    }
    return NULL;
}

prep_pool *prep_pool_create(int n_threads, void (*wake)(void *user), void *wake_user) {
    CHECK(n_threads >= 1 && wake);
    if (n_threads > PREP_MAX_THREADS) n_threads = PREP_MAX_THREADS;
    prep_pool *p = xcalloc(1, sizeof *p);
    p->wake = wake;
    p->wake_user = wake_user;
    p->n_workers = n_threads;
    p->q_tail = &p->q_head;
    p->fin_tail = &p->fin_head;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cv, NULL);
    /* workers never take signals: SIGINT/SIGTERM go to the service thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < n_threads; i++) {
        p->workers[i].p = p;
        if (pthread_create(&p->workers[i].thread, NULL, prep_worker, &p->workers[i]) != 0)
            UM_FATAL("cannot start request preparation thread %d", i);
        p->workers[i].started = 1;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

void prep_pool_submit(prep_pool *p, prep_job *j) {
    CHECK(j->run && j->done);
    j->next = NULL;
    j->skipped = 0;
    p->n_pending++;
    int skipped = 0; /* j belongs to the workers once queued: not read again after the unlock */
    /* --- prep lock { */
    pthread_mutex_lock(&p->lock);
    if (p->stop) {
        j->skipped = skipped = 1;
        finish_locked(p, j);
    } else {
        *p->q_tail = j;
        p->q_tail = &j->next;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->lock);
    /* } prep lock --- */
    if (skipped) p->wake(p->wake_user);
}

void prep_pool_drain(prep_pool *p) {
    if (!p) return;
    /* --- prep lock { */
    pthread_mutex_lock(&p->lock);
    prep_job *j = p->fin_head;
    p->fin_head = NULL;
    p->fin_tail = &p->fin_head;
    pthread_mutex_unlock(&p->lock);
    /* } prep lock --- */
    while (j) {
        prep_job *next = j->next;
        j->next = NULL;
        p->n_pending--;
        j->done(j);
        j = next;
    }
}

int prep_pool_busy(const prep_pool *p) { return p ? p->n_pending : 0; }

void prep_pool_stop(prep_pool *p) {
    if (!p) return;
    /* --- prep lock { */
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->lock);
    /* } prep lock --- */
    for (int i = 0; i < p->n_workers; i++) {
        if (p->workers[i].started) pthread_join(p->workers[i].thread, NULL);
        p->workers[i].started = 0;
    }
    /* --- prep lock { (no workers left; kept for the invariant) */
    pthread_mutex_lock(&p->lock);
    while (p->q_head) {
        prep_job *j = p->q_head;
        p->q_head = j->next;
        j->skipped = 1;
        finish_locked(p, j);
    }
    p->q_tail = &p->q_head;
    pthread_mutex_unlock(&p->lock);
    /* } prep lock --- */
}

void prep_pool_free(prep_pool *p) {
    if (!p) return;
    prep_pool_stop(p);
    CHECK(!p->fin_head);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
