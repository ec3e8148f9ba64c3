/*
 * ws_store.c — WebSocket session event logs in Redis (ws_store.h): a writer thread with its own
 * connection that pipelines queued events (one round trip per wake-up: RPUSH + PUBLISH of each
 * event), a subscriber thread with its own connection that relays the live events of the sessions
 * this replica follows, and a read connection for the lws service thread (resume and the slow
 * fallback poll on a replica that does not hold the session).
 *
 * Not here: sessions (session.c), resume (ws.c). Threads: ws_store_append/touch/load/alive/
 * follow/unfollow/take on the lws service thread; writer_main on the writer thread (its queue
 * under `mu`); sub_main on the subscriber thread (the wanted channels and the notes it hands over
 * under `sub_mu`, woken through `sub_pipe`).
 */
#include "server/ws_store.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "jobs/job_redis.h"
#include "util/log.h"

#define PREFIX "unmask:"
#define CHANNEL PREFIX "wsch:"   /* + token: the session's live events (PUBLISH after each RPUSH) */

/* A channel the service thread wants (refs: its followers here). */
typedef struct ws_sub {
    struct ws_sub *next;
    char           token[80];
    int            refs;
} ws_sub;

typedef struct ws_item {
    struct ws_item *next;
    char            token[80];
    char            who[128];
    char           *json;          /* owned; NULL: a TTL refresh only */
    size_t          len;
} ws_item;

struct ws_store {
    char           *url;           /* owned, for messages */
    char            host[256];
    int             port, db;
    char            owner[96];     /* this replica's consumer name */
    long            ttl_s;
    redisContext   *rd;            /* read connection: service thread only (owned; NULL while lost) */
    redisContext   *wr;            /* write connection: writer thread only (owned; NULL while lost) */
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    ws_item        *head, *tail;   /* queued for the writer (owned, under mu) */
    int             stop;          /* under mu */
    long            dropped;       /* writer thread: events lost while Redis was unreachable */
    /* subscriber thread */
    pthread_t       sub_thread;
    pthread_mutex_t sub_mu;
    int             sub_pipe[2];   /* written to wake sub_main (want changed, stop) */
    void          (*wake)(void *user); /* any thread: the service thread takes the notes */
    void           *wake_user;
    ws_sub         *want;          /* under sub_mu: channels to be subscribed (owned) */
    int             want_dirty;    /* under sub_mu */
    int             sub_stop;      /* under sub_mu */
    ws_note        *notes, *notes_tail; /* under sub_mu: for the service thread (owned) */
    redisContext   *sub;           /* subscriber thread only (owned; NULL while lost) */
    char          (*have)[80];     /* subscriber thread only: tokens subscribed on `sub` */
    int             n_have, cap_have;
};

static redisContext *ws_connect(ws_store *st, char *why, size_t cap) {
    redisContext *c = redisConnectWithTimeout(st->host, st->port, (struct timeval){0, 500000});
    if (!c || c->err) {
        snprintf(why, cap, "cannot reach Redis at %s: %s", st->url, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, (struct timeval){0, 500000});
    redisReply *rep = redisCommand(c, "SELECT %d", st->db);
    int ok = rep && rep->type != REDIS_REPLY_ERROR;
    if (!ok) snprintf(why, cap, "Redis at %s: SELECT %d failed", st->url, st->db);
    if (rep) freeReplyObject(rep);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* ---------------------------------------------------------------- writer thread */

static void batch_free(ws_item *it) {
    while (it) {
        ws_item *n = it->next;
        free(it->json);
        free(it);
        it = n;
    }
}

/* One pipeline: RPUSH + PUBLISH every event, then per session (in batch order) HSET meta + EXPIRE both. */
static int batch_send(ws_store *st, ws_item *batch) {
    redisContext *c = st->wr;
    int pending = 0;
    for (ws_item *it = batch; it; it = it->next) {
        if (it->json) {
            redisAppendCommand(c, "RPUSH " PREFIX "wslog:%s %b", it->token, it->json, it->len);
            /* after the RPUSH: a follower that sees the note finds the event in the list too */
            redisAppendCommand(c, "PUBLISH " CHANNEL "%s %b", it->token, it->json, it->len);
            pending += 2;
        }
        int first = 1; /* the session's meta and TTL once per batch */
        for (ws_item *p = batch; p != it; p = p->next)
            if (strcmp(p->token, it->token) == 0) first = 0;
        if (!first) continue;
        if (it->who[0]) {
            redisAppendCommand(c, "HSET " PREFIX "wsmeta:%s who %s owner %s", it->token, it->who, st->owner);
            pending++;
        }
        redisAppendCommand(c, "EXPIRE " PREFIX "wslog:%s %ld", it->token, st->ttl_s);
        redisAppendCommand(c, "EXPIRE " PREFIX "wsmeta:%s %ld", it->token, st->ttl_s);
        pending += 2;
    }
    int ok = 1;
    for (int i = 0; i < pending; i++) {
        redisReply *rep = NULL;
        if (redisGetReply(c, (void **)&rep) != REDIS_OK) return -1;
        if (rep->type == REDIS_REPLY_ERROR) ok = 0;
        freeReplyObject(rep);
    }
    return ok ? 0 : -1;
}

static void *writer_main(void *arg) {
    ws_store *st = arg;
    double retry_at = 0;
    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (!st->head && !st->stop) pthread_cond_wait(&st->cv, &st->mu);
        ws_item *batch = st->head;
        st->head = st->tail = NULL;
        int stop = st->stop;
        pthread_mutex_unlock(&st->mu);
        if (batch) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
            char why[256];
            if (!st->wr && now >= retry_at && !(st->wr = ws_connect(st, why, sizeof why))) {
                log_warn("session store: %s (retrying in 1 s)", why);
                retry_at = now + 1.0;
            }
            int ok = st->wr && batch_send(st, batch) == 0;
            if (!ok) {
                long n = 0;
                for (ws_item *it = batch; it; it = it->next) n += it->json != NULL;
                st->dropped += n;
                log_warn("session store: %ld session events not written to Redis at %s (%ld so far)", n, st->url,
                         st->dropped);
                if (st->wr && st->wr->err) {
                    redisFree(st->wr);
                    st->wr = NULL;
                    retry_at = now + 1.0;
                }
            }
            batch_free(batch);
        }
        if (stop && !batch) break;
    }
    return NULL;
}

static void enqueue(ws_store *st, ws_item *it) {
    pthread_mutex_lock(&st->mu);
    if (st->tail) st->tail->next = it;
    else st->head = it;
    st->tail = it;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

void ws_store_append(ws_store *st, const char *token, const char *who, const char *json, size_t len) {
    ws_item *it = xcalloc(1, sizeof *it);
    snprintf(it->token, sizeof it->token, "%s", token);
    snprintf(it->who, sizeof it->who, "%s", who);
    it->json = xmalloc(len + 1);
    memcpy(it->json, json, len);
    it->json[len] = 0;
    it->len = len;
    enqueue(st, it);
}

void ws_store_touch(ws_store *st, const char *token) {
    ws_item *it = xcalloc(1, sizeof *it);
    snprintf(it->token, sizeof it->token, "%s", token);
    enqueue(st, it);
}

/* ---------------------------------------------------------------- reads (service thread) */

static redisReply *rd_cmd(ws_store *st, const char *fmt, ...) {
    char why[256];
    if (!st->rd && !(st->rd = ws_connect(st, why, sizeof why))) {
        log_warn("session store: %s", why);
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    redisReply *rep = redisvCommand(st->rd, fmt, ap);
    va_end(ap);
    if (!rep) {
        redisFree(st->rd);
        st->rd = NULL;
    }
    return rep;
}

int ws_store_load(ws_store *st, const char *token, long from, char *who, size_t who_cap, char *owner,
                  size_t owner_cap, char ***docs, int *n) {
    *docs = NULL;
    *n = 0;
    if (who) {
        redisReply *m = rd_cmd(st, "HMGET " PREFIX "wsmeta:%s who owner", token);
        if (!m) return -1;
        int found = m->type == REDIS_REPLY_ARRAY && m->elements == 2 && m->element[0]->type == REDIS_REPLY_STRING;
        if (found) {
            snprintf(who, who_cap, "%s", m->element[0]->str);
            snprintf(owner, owner_cap, "%s", m->element[1]->type == REDIS_REPLY_STRING ? m->element[1]->str : "");
        }
        freeReplyObject(m);
        if (!found) return 0;
    }
    redisReply *r = rd_cmd(st, "LRANGE " PREFIX "wslog:%s %ld -1", token, from);
    if (!r) return -1;
    if (r->type != REDIS_REPLY_ARRAY) {
        freeReplyObject(r);
        return -1;
    }
    if (r->elements) {
        *docs = xcalloc(r->elements, sizeof **docs);
        for (size_t i = 0; i < r->elements; i++)
            (*docs)[i] = xstrdup(r->element[i]->type == REDIS_REPLY_STRING ? r->element[i]->str : "{}");
    }
    *n = (int)r->elements;
    freeReplyObject(r);
    return 1;
}

int ws_store_alive(ws_store *st, const char *owner) {
    redisReply *r = rd_cmd(st, "EXISTS " PREFIX "alive:%s", owner);
    if (!r) return -1;
    int v = r->type == REDIS_REPLY_INTEGER ? (r->integer > 0) : -1;
    freeReplyObject(r);
    return v;
}

/* ---------------------------------------------------------------- subscriber thread */

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sub_wake(ws_store *st) {
    char b = 1;
    ssize_t r = write(st->sub_pipe[1], &b, 1); /* non-blocking: a full pipe already wakes it */
    (void)r;
}

/* Subscriber thread: hand a note to the service thread (json NULL: token's subscription confirmed). */
static void note_push(ws_store *st, const char *token, const char *json, size_t len) {
    ws_note *n = xcalloc(1, sizeof *n);
    snprintf(n->token, sizeof n->token, "%s", token);
    if (json) {
        n->json = xmalloc(len + 1);
        memcpy(n->json, json, len);
        n->json[len] = 0;
    }
    pthread_mutex_lock(&st->sub_mu);
    if (st->notes_tail) st->notes_tail->next = n;
    else st->notes = n;
    st->notes_tail = n;
    pthread_mutex_unlock(&st->sub_mu);
    if (st->wake) st->wake(st->wake_user);
}

static void sub_lost(ws_store *st, const char *why) {
    log_warn("session store: the subscriber connection to %s went away (%s); live events of followed sessions "
             "arrive by the fallback poll until it is back",
             st->url, why);
    redisFree(st->sub);
    st->sub = NULL;
    st->n_have = 0;
}

/* SUBSCRIBE what is wanted and not subscribed, UNSUBSCRIBE the reverse (one command each). */
static int sub_sync(ws_store *st) {
    int n_add = 0, n_del = 0;
    const char **add = NULL, **del = NULL;
    char (*was)[80] = NULL;
    pthread_mutex_lock(&st->sub_mu);
    st->want_dirty = 0;
    int n_want = 0;
    for (ws_sub *w = st->want; w; w = w->next) n_want++;
    add = xcalloc((size_t)n_want + 1, sizeof *add);
    del = xcalloc((size_t)st->n_have + 1, sizeof *del);
    was = xcalloc((size_t)st->n_have + 1, sizeof *was);
    if (st->n_have) memcpy(was, st->have, (size_t)st->n_have * sizeof *was); /* have is NULL before the first */
    for (ws_sub *w = st->want; w; w = w->next) {
        int have = 0;
        for (int i = 0; i < st->n_have && !have; i++) have = strcmp(st->have[i], w->token) == 0;
        if (!have) add[n_add++] = xstrdup(w->token);
    }
    for (int i = 0; i < st->n_have; i++) {
        int want = 0;
        for (ws_sub *w = st->want; w && !want; w = w->next) want = strcmp(st->have[i], w->token) == 0;
        if (!want) del[n_del++] = was[i];
    }
    /* have := want */
    if (n_want > st->cap_have) {
        st->cap_have = n_want * 2;
        st->have = xrealloc(st->have, (size_t)st->cap_have * sizeof *st->have);
    }
    st->n_have = 0;
    for (ws_sub *w = st->want; w; w = w->next) snprintf(st->have[st->n_have++], 80, "%s", w->token);
    pthread_mutex_unlock(&st->sub_mu);
    for (int k = 0; k < 2; k++) {
        int n = k ? n_del : n_add;
        if (!n) continue;
        const char **argv = xcalloc((size_t)n + 1, sizeof *argv);
        char **chans = xcalloc((size_t)n, sizeof *chans);
        argv[0] = k ? "UNSUBSCRIBE" : "SUBSCRIBE";
        for (int i = 0; i < n; i++) {
            size_t l = strlen(CHANNEL) + strlen(k ? del[i] : add[i]) + 1;
            chans[i] = xmalloc(l);
            snprintf(chans[i], l, "%s%s", CHANNEL, k ? del[i] : add[i]);
            argv[i + 1] = chans[i];
        }
        redisAppendCommandArgv(st->sub, n + 1, argv, NULL);
        for (int i = 0; i < n; i++) free(chans[i]);
        free(chans);
        free(argv);
    }
    for (int i = 0; i < n_add; i++) free((char *)add[i]);
    free(add);
    free(del);
    free(was);
    int done = 0;
    while (!done)
        if (redisBufferWrite(st->sub, &done) != REDIS_OK) return -1;
    return 0;
}

static void sub_reply(ws_store *st, redisReply *r) {
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 || r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = r->element[0]->str, *chan = r->element[1]->str;
    if (strncmp(chan, CHANNEL, strlen(CHANNEL)) != 0) return;
    const char *token = chan + strlen(CHANNEL);
    if (strcmp(kind, "message") == 0 && r->element[2]->type == REDIS_REPLY_STRING)
        note_push(st, token, r->element[2]->str, r->element[2]->len);
    else if (strcmp(kind, "subscribe") == 0)
        note_push(st, token, NULL, 0);
}

static void *sub_main(void *arg) {
    ws_store *st = arg;
    double retry_at = 0;
    int resync = 0;
    for (;;) {
        pthread_mutex_lock(&st->sub_mu);
        int stop = st->sub_stop, dirty = st->want_dirty;
        pthread_mutex_unlock(&st->sub_mu);
        if (stop) break;
        if (!st->sub && mono_s() >= retry_at) {
            char why[256];
            if (!(st->sub = ws_connect(st, why, sizeof why))) {
                log_warn("session store: subscriber: %s (retrying in 1 s)", why);
                retry_at = mono_s() + 1.0;
            } else {
                st->n_have = 0;
                resync = 1;
                log_info("session store: subscriber connected to %s", st->url);
            }
        }
        if (st->sub && (dirty || resync)) {
            resync = 0;
            if (sub_sync(st) != 0) {
                sub_lost(st, st->sub->errstr);
                retry_at = mono_s() + 1.0;
            }
        }
        struct pollfd pf[2] = {{.fd = st->sub_pipe[0], .events = POLLIN}, {.fd = st->sub ? st->sub->fd : -1, .events = POLLIN}};
        int rc = poll(pf, st->sub ? 2 : 1, st->sub ? -1 : 1000);
        if (rc < 0 && errno != EINTR) UM_FATAL("poll failed");
        if (rc <= 0) continue;
        if (pf[0].revents) {
            char b[64];
            while (read(st->sub_pipe[0], b, sizeof b) > 0) {
            }
        }
        if (st->sub && pf[1].revents) {
            if (redisBufferRead(st->sub) != REDIS_OK) {
                sub_lost(st, st->sub->errstr[0] ? st->sub->errstr : "connection closed");
                retry_at = mono_s() + 1.0;
                continue;
            }
            void *rep = NULL;
            while (redisReaderGetReply(st->sub->reader, &rep) == REDIS_OK && rep) {
                sub_reply(st, rep);
                freeReplyObject(rep);
                rep = NULL;
            }
        }
    }
    return NULL;
}

void ws_store_follow(ws_store *st, const char *token) {
    pthread_mutex_lock(&st->sub_mu);
    ws_sub *w = st->want;
    while (w && strcmp(w->token, token) != 0) w = w->next;
    if (!w) {
        w = xcalloc(1, sizeof *w);
        snprintf(w->token, sizeof w->token, "%s", token);
        w->next = st->want;
        st->want = w;
        st->want_dirty = 1;
    }
    w->refs++;
    pthread_mutex_unlock(&st->sub_mu);
    sub_wake(st);
}

void ws_store_unfollow(ws_store *st, const char *token) {
    pthread_mutex_lock(&st->sub_mu);
    for (ws_sub **p = &st->want; *p; p = &(*p)->next) {
        ws_sub *w = *p;
        if (strcmp(w->token, token) != 0) continue;
        if (--w->refs == 0) {
            *p = w->next;
            free(w);
            st->want_dirty = 1;
        }
        break;
    }
    pthread_mutex_unlock(&st->sub_mu);
    sub_wake(st);
}

ws_note *ws_store_take(ws_store *st) {
    pthread_mutex_lock(&st->sub_mu);
    ws_note *n = st->notes;
    st->notes = st->notes_tail = NULL;
    pthread_mutex_unlock(&st->sub_mu);
    return n;
}

void ws_store_notes_free(ws_note *n) {
    while (n) {
        ws_note *next = n->next;
        free(n->json);
        free(n);
        n = next;
    }
}

/* ---------------------------------------------------------------- lifetime */

int ws_store_open(const char *url, const char *owner, double retention_s, void (*wake)(void *user), void *wake_user,
                  ws_store **out, um_err *err) {
    *out = NULL;
    ws_store *st = xcalloc(1, sizeof *st);
    if (job_redis_parse_url(url, st->host, sizeof st->host, &st->port, &st->db, err) != 0) {
        free(st);
        return -1;
    }
    st->url = xstrdup(url);
    snprintf(st->owner, sizeof st->owner, "%s", owner);
    st->ttl_s = retention_s >= 1 ? (long)retention_s : 1;
    char why[256];
    if (!(st->rd = ws_connect(st, why, sizeof why)) || !(st->wr = ws_connect(st, why, sizeof why))) {
        um_err_set(err, UM_ERR_IO, "%s", why);
        if (st->rd) redisFree(st->rd);
        free(st->url);
        free(st);
        return -1;
    }
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    pthread_mutex_init(&st->sub_mu, NULL);
    st->wake = wake;
    st->wake_user = wake_user;
    if (pipe(st->sub_pipe) != 0) UM_FATAL("pipe failed");
    for (int i = 0; i < 2; i++) {
        fcntl(st->sub_pipe[i], F_SETFL, fcntl(st->sub_pipe[i], F_GETFL) | O_NONBLOCK);
        fcntl(st->sub_pipe[i], F_SETFD, FD_CLOEXEC);
    }
    if (pthread_create(&st->thread, NULL, writer_main, st) != 0) UM_FATAL("pthread_create failed");
    if (pthread_create(&st->sub_thread, NULL, sub_main, st) != 0) UM_FATAL("pthread_create failed");
    *out = st;
    return 0;
}

void ws_store_free(ws_store *st) {
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    pthread_mutex_lock(&st->sub_mu);
    st->sub_stop = 1;
    pthread_mutex_unlock(&st->sub_mu);
    sub_wake(st);
    pthread_join(st->sub_thread, NULL);
    if (st->sub) redisFree(st->sub);
    close(st->sub_pipe[0]);
    close(st->sub_pipe[1]);
    while (st->want) {
        ws_sub *w = st->want;
        st->want = w->next;
        free(w);
    }
    free(st->have);
    ws_store_notes_free(st->notes);
    pthread_mutex_destroy(&st->sub_mu);
    batch_free(st->head);
    if (st->rd) redisFree(st->rd);
    if (st->wr) redisFree(st->wr);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st->url);
    free(st);
}
