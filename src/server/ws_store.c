/*
 * ws_store.c — WebSocket session event logs in Redis (ws_store.h): a writer thread with its own
 * connection that pipelines queued events (one round trip per wake-up), and a read connection
 * for the lws service thread (resume and follow on a replica that does not hold the session).
 *
 * Not here: sessions (session.c), resume (ws.c). Threads: ws_store_append/touch/load/alive on the
 * lws service thread; writer_main on the writer thread; the queue under `mu`.
 */
#include "server/ws_store.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>

#include "jobs/job_redis.h"
#include "util/log.h"

#define PREFIX "unmask:"

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

/* One pipeline: RPUSH every event, then per session (in batch order) HSET meta + EXPIRE both. */
static int batch_send(ws_store *st, ws_item *batch) {
    redisContext *c = st->wr;
    int pending = 0;
    for (ws_item *it = batch; it; it = it->next) {
        if (it->json) {
            redisAppendCommand(c, "RPUSH " PREFIX "wslog:%s %b", it->token, it->json, it->len);
            pending++;
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

/* ---------------------------------------------------------------- lifetime */

int ws_store_open(const char *url, const char *owner, double retention_s, ws_store **out, um_err *err) {
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
    if (pthread_create(&st->thread, NULL, writer_main, st) != 0) UM_FATAL("pthread_create failed");
    *out = st;
    return 0;
}

const char *ws_store_owner(const ws_store *st) { return st->owner; }

void ws_store_free(ws_store *st) {
    if (!st) return;
    pthread_mutex_lock(&st->mu);
    st->stop = 1;
    pthread_cond_signal(&st->cv);
    pthread_mutex_unlock(&st->mu);
    pthread_join(st->thread, NULL);
    batch_free(st->head);
    if (st->rd) redisFree(st->rd);
    if (st->wr) redisFree(st->wr);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st->url);
    free(st);
}
