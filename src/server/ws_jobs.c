/*
 * ws_jobs.c — a WebSocket session's async job subscriptions (ws_jobs.h): one record per followed
 * job, holding the job API's watch; the watch's notes become `job.update` events (or an `error`
 * when the job vanished), and a final one ends the record.
 *
 * Not here: noticing changes (server/http_jobs.c), the event shapes (api/ws_protocol.c).
 * Threads: lws service thread only (the watches call back on it too).
 */
#include "server/ws_jobs.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/ws_protocol.h"
#include "server/callers.h"
#include "server/server_internal.h"
#include "util/log.h"

typedef struct ws_job_sub ws_job_sub;
struct ws_job_sub {
    ws_job_sub *next;
    ws_jobs    *set;
    char        id[API_ID_MAX + 1];   /* the job */
    void       *watch;                /* the job API's watch (server_job_hooks) */
};

struct ws_jobs {
    server     *srv;
    char        who[CALLER_WHO_MAX];  /* the session's caller: only its jobs can be followed */
    void      (*push)(void *user, json_t *ev);
    void       *user;
    ws_job_sub *subs;                 /* owned */
    int         n;
};

ws_jobs *ws_jobs_new(server *srv, const char *who, void (*push)(void *user, json_t *ev), void *user) {
    ws_jobs *j = xcalloc(1, sizeof *j);
    j->srv = srv;
    snprintf(j->who, sizeof j->who, "%s", who);
    j->push = push;
    j->user = user;
    return j;
}

int ws_jobs_count(const ws_jobs *j) { return j ? j->n : 0; }

static ws_job_sub *sub_find(ws_jobs *j, const char *id) {
    for (ws_job_sub *s = j->subs; s; s = s->next)
        if (strcmp(s->id, id) == 0) return s;
    return NULL;
}

static void sub_unlink(ws_job_sub *s) {
    ws_jobs *j = s->set;
    for (ws_job_sub **pp = &j->subs; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            j->n--;
            free(s);
            return;
        }
    CHECK(!"subscription not in its set");
}

/* Ends s's watch (when it still has one) and forgets s. */
static void sub_end(ws_job_sub *s) {
    void *api = NULL;
    const server_job_hooks *h = server_job_hooks_get(s->set->srv, &api);
    if (s->watch && h) h->unwatch(api, s->watch);
    sub_unlink(s);
}

void ws_jobs_free(ws_jobs *j) {
    if (!j) return;
    while (j->subs) sub_end(j->subs);
    free(j);
}

/* An error about job id; param "id" (the job) or "" (the session's state). */
#define push_error(j, code, param, event_id, id, ...) \
    (j)->push((j)->user, api_ev_errorf((code), (param), (event_id), (id), __VA_ARGS__))

/* The watch's note (server_job_fn). */
static void on_note(void *user, json_t *job, enum server_job_note note) {
    ws_job_sub *s = user;
    ws_jobs *j = s->set;
    switch (note) {
    case SERVER_JOB_UPDATE: j->push(j->user, api_ev_job_update(s->id, NULL, job, 0)); return;
    case SERVER_JOB_FINAL: j->push(j->user, api_ev_job_update(s->id, NULL, job, 1)); break;
    case SERVER_JOB_GONE:
        push_error(j, "unknown_job", "id", NULL, s->id, "job '%s' is no longer in the job store (its retention ended); "
                   "the subscription ended", s->id);
        break;
    case SERVER_JOB_CLOSED: break; /* shutdown: the session goes too */
    }
    s->watch = NULL; /* the watch is gone with its last note */
    sub_unlink(s);
}

void ws_jobs_subscribe(ws_jobs *j, const char *job_id, const char *event_id) {
    void *api = NULL;
    const server_job_hooks *h = server_job_hooks_get(j->srv, &api);
    if (!h) {
        push_error(j, "unavailable", "", event_id, job_id, "this server has no job API");
        return;
    }
    ws_job_sub *old = sub_find(j, job_id);
    if (old) sub_end(old); /* subscribed again: the object now, one subscription */
    const int max = server_cfg(j->srv)->max_session_job_subscriptions;
    if (j->n >= max) {
        push_error(j, "too_many_subscriptions", "", event_id, job_id,
                   "this session already follows %d jobs (--max-session-job-subscriptions); unsubscribe from one, or "
                   "wait until one finishes",
                   j->n);
        return;
    }
    ws_job_sub *s = xcalloc(1, sizeof *s);
    s->set = j;
    snprintf(s->id, sizeof s->id, "%s", job_id);
    const char *code = "unknown_job";
    json_t *job = h->watch(api, job_id, j->who, on_note, s, &s->watch, &code);
    if (!job) {
        free(s);
        if (strcmp(code, "store_unavailable") == 0)
            push_error(j, code, "", event_id, job_id, "the job store did not answer; try again");
        else
            push_error(j, code, "id", event_id, job_id, "no job '%.60s'", job_id);
        return;
    }
    if (!s->watch) { /* finished already: this is its final update */
        free(s);
        j->push(j->user, api_ev_job_update(job_id, event_id, job, 1));
        return;
    }
    s->next = j->subs;
    j->subs = s;
    j->n++;
    j->push(j->user, api_ev_job_update(job_id, event_id, job, 0));
}

void ws_jobs_unsubscribe(ws_jobs *j, const char *job_id, const char *event_id) {
    ws_job_sub *s = sub_find(j, job_id);
    const int was = s != NULL;
    if (s) sub_end(s);
    j->push(j->user, api_ev_job_unsubscribed(job_id, event_id, was));
}
