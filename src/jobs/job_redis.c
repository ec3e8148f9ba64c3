/*
 * job_redis.c — the job store in Redis (--store redis://HOST:PORT[/DB]), shared by every server
 * pointed at it: a job_backend (jobs/job_backend.h) with a queue.
 *
 * Keys (prefix "unmask:"):
 *   job:<id>            hash  doc (the job's document, jobs.c), seq, owner
 *   ev:<id>             hash  <event id> -> event JSON (the SSE log)
 *   owner:<owner>       zset  job ids by creation time (ms): GET /v1/jobs on any server
 *   idem:<owner>:<key>  string the job id of an Idempotency-Key (the first server to create wins)
 *   cancel:<id>         string a DELETE asked on a server that does not run the job
 *   queue               stream one entry per job to run, consumer group "unmask": XADD on create,
 *                       XREADGROUP by each server as its capacity allows, XACK + XDEL when done
 *   alive:<consumer>    string a server's heartbeat (PX HEARTBEAT_MS, refreshed every 0.5 s); the
 *                       pending entries of a consumer without one are XCLAIMed by a live server
 * A new job's job:, ev:, owner: and idem: entries and its queue entry are written by one Lua script
 * (be_create): a server that dies while creating a job leaves all of it or nothing — never a job
 * that no queue entry will run, or a key that names no job.
 * A finished job's job:/ev: keys expire after the retention (--job-retention); idem: and cancel:
 * keys expire after it from their creation.
 *
 * Two connections. The command connection writes through and reads jobs held elsewhere; jobs.c
 * calls it under the job store's lock (the lws service thread, the webhook workers, the feed
 * thread), with 0.5 s to connect and 1 s per command, so a Redis that stops answering holds the
 * caller at most that long once; then calls fail at once (counted, /health not ready, new jobs
 * 503) until the next reconnection attempt (backoff 0.1 s doubling to 2 s). Writes are pipelined
 * between begin and end (one round trip per decode step). The queue connection blocks in
 * XREADGROUP; only the job feed thread (server/job_feed.c) uses it, through take().
 *
 * Not here: what a job document says (jobs.c), running jobs (server/).
 */
#include "jobs/job_redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <openssl/rand.h>

#include "util/log.h"

#define PREFIX        "unmask:"
#define GROUP         "unmask"
#define HEARTBEAT_MS  3000      /* a server whose heartbeat is older is dead: its jobs are taken over */
#define BEAT_EVERY_S  0.5
#define RECLAIM_EVERY 1.0       /* seconds between looks for a dead server's jobs */
#define MAX_PIPE      100000    /* writes pipelined before a forced flush */

typedef struct job_redis {
    char    *url;               /* owned, for messages */
    char     host[256];
    int      port, db;
    double   retention_s;
    char     me[96];            /* this server's consumer name: host-pid-random */
    /* command connection: under the job store's lock */
    redisContext *cmd;          /* owned, NULL while disconnected */
    int      depth;             /* begin/end nesting */
    int      pending;           /* replies of pipelined writes still to read */
    long     write_errors;
    int      failing;           /* the last flush failed, or disconnected */
    char     last_error[200];
    double   retry_at, backoff; /* next reconnection attempt (monotonic s), its delay */
    double   last_ok;           /* monotonic time of the last good reply (tick pings after 1 s) */
    uint64_t epoch;             /* connections made */
    /* queue connection: the feed thread only */
    redisContext *q;            /* owned, NULL while disconnected */
    double   q_retry_at, q_backoff, q_since, last_beat, last_reclaim;
    int      q_own;             /* after a (re)connection: this server's own pending entries are read
                                   again (a delivery whose reply, or whose job's read, an outage cut
                                   is pending for this server, and no other takes it while it is alive) */
    char     q_own_after[40];   /* ... from after this entry id ("0": from the start) */
} job_redis;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double unix_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static struct timeval tv_ms(int ms) { return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}; }

int job_redis_parse_url(const char *url, char *host, size_t cap, int *port, int *db, um_err *err) {
    *port = 6379;
    *db = 0;
    if (strncmp(url, "redis://", 8) != 0)
        return um_err_param(err, "store", "--store %s: a Redis URL is redis://HOST:PORT[/DB]", url);
    const char *p = url + 8, *end;
    if (*p == '[') { /* [IPv6]:port */
        end = strchr(p, ']');
        if (!end) return um_err_param(err, "store", "--store %s: unterminated [IPv6 address]", url);
        snprintf(host, cap, "%.*s", (int)(end - p - 1), p + 1);
        p = end + 1;
    } else {
        size_t n = strcspn(p, ":/");
        snprintf(host, cap, "%.*s", (int)n, p);
        p += n;
    }
    if (!host[0]) return um_err_param(err, "store", "--store %s: no host", url);
    char *e;
    if (*p == ':') {
        long v = strtol(p + 1, &e, 10);
        if (e == p + 1 || v < 1 || v > 65535 || (*e && *e != '/'))
            return um_err_param(err, "store", "--store %s: the port must be 1..65535", url);
        *port = (int)v;
        p = e;
    }
    if (*p == '/' && p[1]) {
        long v = strtol(p + 1, &e, 10);
        if (*e || v < 0 || v > 1000000) return um_err_param(err, "store", "--store %s: the database must be a number", url);
        *db = (int)v;
    } else if (*p && strcmp(p, "/") != 0) {
        return um_err_param(err, "store", "--store %s: a Redis URL is redis://HOST:PORT[/DB]", url);
    }
    return 0;
}

/* A connection (timeouts set, database selected) or NULL with why. */
static redisContext *connect_to(job_redis *r, int cmd_timeout_ms, char *why, size_t cap) {
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv_ms(500));
    if (!c || c->err) {
        snprintf(why, cap, "cannot reach Redis at %s: %s", r->url, c ? c->errstr : "out of memory");
        if (c) redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv_ms(cmd_timeout_ms));
    redisReply *rep = redisCommand(c, "SELECT %d", r->db);
    int ok = rep && rep->type != REDIS_REPLY_ERROR;
    if (!ok) snprintf(why, cap, "Redis at %s: SELECT %d: %s", r->url, r->db, rep ? rep->str : c->errstr);
    if (rep) freeReplyObject(rep);
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* ---------------------------------------------------------------- the command connection */

static void cmd_lost(job_redis *r, const char *why) {
    if (!r->failing || r->cmd) log_error("job store %s: lost (%s); new jobs are refused until it is back", r->url, why);
    snprintf(r->last_error, sizeof r->last_error, "Redis %s: %s", r->url, why);
    if (r->cmd) redisFree(r->cmd);
    r->cmd = NULL;
    r->pending = 0;
    r->failing = 1;
    r->backoff = r->backoff > 0 ? r->backoff * 2 : 0.1;
    if (r->backoff > 2.0) r->backoff = 2.0;
    r->retry_at = mono() + r->backoff;
}

/* The command connection, reconnecting when its backoff allows; NULL while Redis is unreachable. */
static redisContext *cmd_conn(job_redis *r) {
    if (r->cmd) return r->cmd;
    if (mono() < r->retry_at) return NULL;
    char why[256];
    r->cmd = connect_to(r, 1000, why, sizeof why);
    if (!r->cmd) {
        r->failing = 1;
        snprintf(r->last_error, sizeof r->last_error, "%s", why);
        r->backoff = r->backoff > 0 ? r->backoff * 2 : 0.1;
        if (r->backoff > 2.0) r->backoff = 2.0;
        r->retry_at = mono() + r->backoff;
        return NULL;
    }
    r->epoch++;
    r->backoff = 0;
    r->failing = 0;
    r->last_ok = mono();
    if (r->epoch > 1) log_info("job store %s: connected again", r->url);
    return r->cmd;
}

/* Reads the replies of the pipelined writes. */
static void flush(job_redis *r) {
    int bad = 0;
    while (r->pending > 0 && r->cmd) {
        redisReply *rep = NULL;
        if (redisGetReply(r->cmd, (void **)&rep) != REDIS_OK) {
            r->write_errors += r->pending;
            cmd_lost(r, r->cmd->errstr[0] ? r->cmd->errstr : "connection closed");
            return;
        }
        r->pending--;
        if (rep->type == REDIS_REPLY_ERROR) {
            if (!bad) log_error("job store %s: write failed: %s", r->url, rep->str);
            snprintf(r->last_error, sizeof r->last_error, "Redis %s: %s", r->url, rep->str);
            bad = 1;
            r->write_errors++;
        }
        freeReplyObject(rep);
    }
    if (bad) r->failing = 1;
    else if (r->cmd) {
        r->failing = 0;
        r->last_ok = mono();
    }
}

/* Appends one write (argv) to the pipeline; outside begin/end it is sent at once. */
static void write_argv(job_redis *r, int argc, const char **argv, const size_t *lens) {
    redisContext *c = cmd_conn(r);
    if (!c) {
        r->write_errors++;
        return;
    }
    if (redisAppendCommandArgv(c, argc, argv, lens) != REDIS_OK) {
        r->write_errors++;
        cmd_lost(r, "out of memory");
        return;
    }
    r->pending++;
    if (r->depth == 0 || r->pending >= MAX_PIPE) flush(r);
}

/* One command answered now (pending writes are sent first). NULL when the connection failed. */
static redisReply *command(job_redis *r, int argc, const char **argv, const size_t *lens) {
    flush(r);
    redisContext *c = cmd_conn(r);
    if (!c) return NULL;
    redisReply *rep = redisCommandArgv(c, argc, argv, lens);
    if (!rep) {
        cmd_lost(r, c->errstr[0] ? c->errstr : "connection closed");
        return NULL;
    }
    r->last_ok = mono();
    return rep;
}

#define ARGV(...)                                                                                                     \
    const char *argv[] = {__VA_ARGS__};                                                                               \
    size_t lens[sizeof argv / sizeof argv[0]];                                                                        \
    for (size_t i_ = 0; i_ < sizeof argv / sizeof argv[0]; i_++) lens[i_] = strlen(argv[i_]);                          \
    const int argc = (int)(sizeof argv / sizeof argv[0])

static job_redis *ctx(job_backend *b) { return b->context; }

static void be_put_job(job_backend *b, const char *id, int64_t seq, const char *owner, const char *doc, int terminal) {
    job_redis *r = ctx(b);
    char key[128], seqs[32], okey[512], ms[32], ret[32], evkey[128];
    snprintf(key, sizeof key, PREFIX "job:%s", id);
    snprintf(seqs, sizeof seqs, "%lld", (long long)seq);
    {
        ARGV("HSET", key, "doc", doc, "seq", seqs, "owner", owner);
        write_argv(r, argc, argv, lens);
    }
    snprintf(okey, sizeof okey, PREFIX "owner:%s", owner);
    snprintf(ms, sizeof ms, "%.0f", unix_ms());
    {
        ARGV("ZADD", okey, "NX", ms, id);
        write_argv(r, argc, argv, lens);
    }
    snprintf(ret, sizeof ret, "%.0f", r->retention_s);
    if (terminal) {
        snprintf(evkey, sizeof evkey, PREFIX "ev:%s", id);
        ARGV("EXPIRE", key, ret);
        write_argv(r, argc, argv, lens);
        const char *a2[] = {"EXPIRE", evkey, ret};
        size_t l2[] = {6, strlen(evkey), strlen(ret)};
        write_argv(r, 3, a2, l2);
        char old[32];
        snprintf(old, sizeof old, "%.0f", unix_ms() - r->retention_s * 1e3);
        const char *a3[] = {"ZREMRANGEBYSCORE", okey, "-inf", old};
        size_t l3[] = {16, strlen(okey), 4, strlen(old)};
        write_argv(r, 4, a3, l3);
        const char *a4[] = {"EXPIRE", okey, ret};
        size_t l4[] = {6, strlen(okey), strlen(ret)};
        write_argv(r, 3, a4, l4);
    }
}

static void be_put_event(job_backend *b, const char *id, int64_t eid, const char *doc) {
    char key[128], f[32];
    snprintf(key, sizeof key, PREFIX "ev:%s", id);
    snprintf(f, sizeof f, "%lld", (long long)eid);
    ARGV("HSET", key, f, doc);
    write_argv(ctx(b), argc, argv, lens);
}

static void be_drop(job_backend *b, const char *id, int64_t first) {
    static const char lua[] = "for _, k in ipairs(redis.call('HKEYS', KEYS[1])) do "
                              "if tonumber(k) < tonumber(ARGV[1]) then redis.call('HDEL', KEYS[1], k) end end";
    char key[128], f[32];
    snprintf(key, sizeof key, PREFIX "ev:%s", id);
    snprintf(f, sizeof f, "%lld", (long long)first);
    ARGV("EVAL", lua, "1", key, f);
    write_argv(ctx(b), argc, argv, lens);
}

static void be_delete(job_backend *b, const char *id) {
    char key[128], ev[128];
    snprintf(key, sizeof key, PREFIX "job:%s", id);
    snprintf(ev, sizeof ev, PREFIX "ev:%s", id);
    ARGV("DEL", key, ev);
    write_argv(ctx(b), argc, argv, lens);
}

static void be_begin(job_backend *b) { ctx(b)->depth++; }
static void be_end(job_backend *b) {
    job_redis *r = ctx(b);
    if (r->depth > 0 && --r->depth == 0) flush(r);
}
static long be_errors(job_backend *b) { return ctx(b)->write_errors; }
static const char *be_failing(job_backend *b) { return ctx(b)->failing ? ctx(b)->last_error : NULL; }
static uint64_t be_epoch(job_backend *b) { return ctx(b)->epoch; }

static void be_tick(job_backend *b) {
    job_redis *r = ctx(b);
    if (r->cmd && mono() - r->last_ok < 1.0) return;
    ARGV("PING");
    redisReply *rep = command(r, argc, argv, lens);
    if (rep) freeReplyObject(rep);
}

static int be_idem_lookup(job_backend *b, const char *owner, const char *k, char existing[40]) {
    char key[1024];
    snprintf(key, sizeof key, PREFIX "idem:%s:%s", owner, k);
    ARGV("GET", key);
    redisReply *rep = command(ctx(b), argc, argv, lens);
    if (!rep) return -1;
    int r = rep->type == REDIS_REPLY_STRING ? 1 : rep->type == REDIS_REPLY_NIL ? 0 : -1;
    if (r == 1) snprintf(existing, 40, "%.*s", (int)rep->len, rep->str);
    freeReplyObject(rep);
    return r;
}

static int be_create(job_backend *b, const char *id, int64_t seq, const char *owner, const char *doc, const char *event,
                     const char *k, char existing[40]) {
    /* KEYS: job, ev, owner index, queue, idem claim ("" none); ARGV: id, doc, seq, owner, ms, event,
     * retention. A script runs whole or not at all. */
    static const char lua[] =
        "if KEYS[5] ~= '' then local cur = redis.call('GET', KEYS[5]) if cur then return {0, cur} end end "
        "redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'seq', ARGV[3], 'owner', ARGV[4]) "
        "redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[1]) "
        "redis.call('HSET', KEYS[2], '1', ARGV[6]) "
        "redis.call('XADD', KEYS[4], '*', 'job', ARGV[1]) "
        "if KEYS[5] ~= '' then redis.call('SET', KEYS[5], ARGV[1], 'EX', ARGV[7]) end "
        "return {1, ARGV[1]}";
    job_redis *r = ctx(b);
    char key[128], evkey[128], okey[512], ikey[1024] = "", seqs[32], ms[32], ret[32];
    snprintf(key, sizeof key, PREFIX "job:%s", id);
    snprintf(evkey, sizeof evkey, PREFIX "ev:%s", id);
    snprintf(okey, sizeof okey, PREFIX "owner:%s", owner);
    if (k) snprintf(ikey, sizeof ikey, PREFIX "idem:%s:%s", owner, k);
    snprintf(seqs, sizeof seqs, "%lld", (long long)seq);
    snprintf(ms, sizeof ms, "%.0f", unix_ms());
    snprintf(ret, sizeof ret, "%.0f", r->retention_s);
    ARGV("EVAL", lua, "5", key, evkey, okey, PREFIX "queue", ikey, id, doc, seqs, owner, ms, event, ret);
    redisReply *rep = command(r, argc, argv, lens);
    int rc = -1;
    if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_INTEGER &&
        rep->element[1]->type == REDIS_REPLY_STRING) {
        rc = (int)rep->element[0]->integer;
        if (rc == 0) snprintf(existing, 40, "%.*s", (int)rep->element[1]->len, rep->element[1]->str);
    } else if (rep) {
        snprintf(r->last_error, sizeof r->last_error, "Redis %s: %s", r->url,
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply to the job creation");
        log_error("job store %s: creating a job failed: %s", r->url, r->last_error);
        r->failing = 1;
    }
    if (rc < 0) r->write_errors++;
    if (rep) freeReplyObject(rep);
    return rc;
}

static int be_enqueue(job_backend *b, const char *id) {
    job_redis *r = ctx(b);
    long before = r->write_errors;
    ARGV("XADD", PREFIX "queue", "*", "job", id);
    write_argv(r, argc, argv, lens);
    flush(r);
    return r->write_errors == before ? 0 : -1;
}

static void be_ack(job_backend *b, const char *entry) {
    job_redis *r = ctx(b);
    {
        ARGV("XACK", PREFIX "queue", GROUP, entry);
        write_argv(r, argc, argv, lens);
    }
    ARGV("XDEL", PREFIX "queue", entry);
    write_argv(r, argc, argv, lens);
}

static int be_requeue(job_backend *b, const char *id, const char *entry) {
    int rc = be_enqueue(b, id);
    if (rc == 0) be_ack(b, entry);
    return rc;
}

static int be_fetch(job_backend *b, const char *id, char **doc, int64_t *seq) {
    char key[128];
    snprintf(key, sizeof key, PREFIX "job:%s", id);
    ARGV("HMGET", key, "doc", "seq");
    redisReply *rep = command(ctx(b), argc, argv, lens);
    *doc = NULL;
    if (!rep) return -1;
    int r = -1;
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2) {
        r = rep->element[0]->type == REDIS_REPLY_STRING;
        if (r) {
            *doc = xstrdup(rep->element[0]->str);
            *seq = rep->element[1]->type == REDIS_REPLY_STRING ? strtoll(rep->element[1]->str, NULL, 10) : 0;
        }
    }
    freeReplyObject(rep);
    return r;
}

static int be_fetch_events(job_backend *b, const char *id, int64_t from, int n, char **docs) {
    char key[128];
    snprintf(key, sizeof key, PREFIX "ev:%s", id);
    const char **argv = xcalloc((size_t)n + 2, sizeof *argv);
    size_t *lens = xcalloc((size_t)n + 2, sizeof *lens);
    char(*f)[24] = xcalloc((size_t)n, sizeof *f);
    argv[0] = "HMGET", argv[1] = key;
    for (int i = 0; i < n; i++) {
        snprintf(f[i], sizeof f[i], "%lld", (long long)(from + i));
        argv[2 + i] = f[i];
    }
    for (int i = 0; i < n + 2; i++) lens[i] = strlen(argv[i]);
    redisReply *rep = command(ctx(b), n + 2, argv, lens);
    free(argv);
    free(lens);
    free(f);
    if (!rep) return -1;
    int rc = -1;
    if (rep->type == REDIS_REPLY_ARRAY && (int)rep->elements == n) {
        for (int i = 0; i < n; i++)
            docs[i] = rep->element[i]->type == REDIS_REPLY_STRING ? xstrdup(rep->element[i]->str) : NULL;
        rc = 0;
    }
    freeReplyObject(rep);
    return rc;
}

static int be_list(job_backend *b, const char *owner, char (**ids)[40]) {
    char key[512];
    snprintf(key, sizeof key, PREFIX "owner:%s", owner);
    ARGV("ZREVRANGE", key, "0", "9999");
    redisReply *rep = command(ctx(b), argc, argv, lens);
    *ids = NULL;
    if (!rep) return -1;
    int n = 0;
    if (rep->type == REDIS_REPLY_ARRAY) {
        *ids = xcalloc(rep->elements + 1, sizeof **ids);
        for (size_t i = 0; i < rep->elements; i++)
            if (rep->element[i]->type == REDIS_REPLY_STRING && rep->element[i]->len < 40)
                snprintf((*ids)[n++], 40, "%s", rep->element[i]->str);
    }
    freeReplyObject(rep);
    return n;
}

static void be_cancel_signal(job_backend *b, const char *id) {
    job_redis *r = ctx(b);
    char key[128], ret[32];
    snprintf(key, sizeof key, PREFIX "cancel:%s", id);
    snprintf(ret, sizeof ret, "%.0f", r->retention_s);
    ARGV("SET", key, "1", "EX", ret);
    write_argv(r, argc, argv, lens);
}

static int be_cancel_signalled(job_backend *b, const char *id) {
    char key[128];
    snprintf(key, sizeof key, PREFIX "cancel:%s", id);
    ARGV("EXISTS", key);
    redisReply *rep = command(ctx(b), argc, argv, lens);
    int r = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0;
    if (rep) freeReplyObject(rep);
    return r;
}

/* ---------------------------------------------------------------- the queue (feed thread) */

static void q_lost(job_redis *r, const char *why) {
    if (r->q) log_warn("job store %s: queue connection lost (%s); reconnecting", r->url, why);
    if (r->q) redisFree(r->q);
    r->q = NULL;
    r->q_backoff = r->q_backoff > 0 ? r->q_backoff * 2 : 0.1;
    if (r->q_backoff > 2.0) r->q_backoff = 2.0;
    r->q_retry_at = mono() + r->q_backoff;
}

static redisReply *q_cmd(job_redis *r, int argc, const char **argv, const size_t *lens) {
    redisReply *rep = redisCommandArgv(r->q, argc, argv, lens);
    if (!rep) q_lost(r, r->q->errstr[0] ? r->q->errstr : "connection closed");
    return rep;
}

/* Entries [id, [field, value, ...]] -> out (the "job" field). */
static int q_entries(const redisReply *arr, job_taken *out, int max) {
    int n = 0;
    for (size_t i = 0; arr && arr->type == REDIS_REPLY_ARRAY && i < arr->elements && n < max; i++) {
        const redisReply *e = arr->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[0]->type != REDIS_REPLY_STRING) continue;
        const redisReply *kv = e->element[1];
        for (size_t k = 0; kv->type == REDIS_REPLY_ARRAY && k + 1 < kv->elements; k += 2)
            if (strcmp(kv->element[k]->str, "job") == 0 && kv->element[k + 1]->len < 40) {
                snprintf(out[n].id, 40, "%s", kv->element[k + 1]->str);
                snprintf(out[n].entry, 40, "%s", e->element[0]->str);
                n++;
            }
    }
    return n;
}

/* Pending entries of consumers without a heartbeat (dead servers) -> claimed for this one. */
static int q_reclaim(job_redis *r, job_taken *out, int max) {
    ARGV("XPENDING", PREFIX "queue", GROUP, "-", "+", "100");
    redisReply *rep = q_cmd(r, argc, argv, lens);
    if (!rep) return -1;
    int n = 0;
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements && n < max && r->q; i++) {
        const redisReply *p = rep->element[i];
        if (p->type != REDIS_REPLY_ARRAY || p->elements < 4 || strcmp(p->element[1]->str, r->me) == 0 ||
            p->element[2]->integer < HEARTBEAT_MS)
            continue;
        char alive[160], idle[16];
        snprintf(alive, sizeof alive, PREFIX "alive:%s", p->element[1]->str);
        const char *a1[] = {"EXISTS", alive};
        size_t l1[] = {6, strlen(alive)};
        redisReply *ex = q_cmd(r, 2, a1, l1);
        if (!ex) break;
        int dead = ex->type == REDIS_REPLY_INTEGER && ex->integer == 0;
        freeReplyObject(ex);
        if (!dead) continue;
        /* min-idle: of two servers claiming at once, the second finds it idle no more */
        snprintf(idle, sizeof idle, "%d", HEARTBEAT_MS);
        const char *a2[] = {"XCLAIM", PREFIX "queue", GROUP, r->me, idle, p->element[0]->str};
        size_t l2[6];
        for (int k = 0; k < 6; k++) l2[k] = strlen(a2[k]);
        redisReply *cl = q_cmd(r, 6, a2, l2);
        if (!cl) break;
        int got = q_entries(cl, out + n, max - n);
        if (got) log_warn("job store: took over job %s of %s (its server stopped answering)", out[n].id, p->element[1]->str);
        n += got;
        freeReplyObject(cl);
    }
    freeReplyObject(rep);
    return r->q ? n : -1;
}

static int be_take(job_backend *b, int max, int timeout_ms, job_taken *out) {
    job_redis *r = ctx(b);
    double now = mono();
    if (!r->q) {
        if (now < r->q_retry_at) return -1;
        char why[256];
        r->q = connect_to(r, timeout_ms + 2000, why, sizeof why);
        if (!r->q) {
            q_lost(r, why);
            return -1;
        }
        ARGV("XGROUP", "CREATE", PREFIX "queue", GROUP, "0", "MKSTREAM");
        redisReply *rep = q_cmd(r, argc, argv, lens);
        if (!rep) return -1;
        freeReplyObject(rep); /* BUSYGROUP: it exists */
        r->q_backoff = 0;
        r->q_since = now;
        r->last_beat = r->last_reclaim = 0;
        r->q_own = 1;
        snprintf(r->q_own_after, sizeof r->q_own_after, "0");
    }
    if (now - r->last_beat >= BEAT_EVERY_S) {
        char key[160], ttl[16];
        snprintf(key, sizeof key, PREFIX "alive:%s", r->me);
        snprintf(ttl, sizeof ttl, "%d", HEARTBEAT_MS);
        ARGV("SET", key, "1", "PX", ttl);
        redisReply *rep = q_cmd(r, argc, argv, lens);
        if (!rep) return -1;
        freeReplyObject(rep);
        r->last_beat = now;
    }
    int n = 0;
    if (max > 0 && r->q_own) { /* its own pending entries (XREADGROUP with an id reads them again) */
        char count[16];
        snprintf(count, sizeof count, "%d", max);
        ARGV("XREADGROUP", "GROUP", GROUP, r->me, "COUNT", count, "STREAMS", PREFIX "queue", r->q_own_after);
        redisReply *rep = q_cmd(r, argc, argv, lens);
        if (!rep) return -1;
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 && rep->element[0]->elements == 2) {
            const redisReply *arr = rep->element[0]->element[1];
            n = q_entries(arr, out, max);
            if (arr->type == REDIS_REPLY_ARRAY && arr->elements > 0) { /* the next read starts after the last */
                const redisReply *last = arr->element[arr->elements - 1];
                if (last->type == REDIS_REPLY_ARRAY && last->elements == 2 && last->element[0]->type == REDIS_REPLY_STRING)
                    snprintf(r->q_own_after, sizeof r->q_own_after, "%s", last->element[0]->str);
            }
            if (arr->type != REDIS_REPLY_ARRAY || (int)arr->elements < max) r->q_own = 0; /* all read */
        } else {
            r->q_own = 0;
        }
        freeReplyObject(rep);
        if (n > 0) log_debug("job store: %d pending entr%s of this server read again", n, n == 1 ? "y" : "ies");
    }
    /* only once this server has been connected for two heartbeats: after an outage every server
     * first renews its own heartbeat, so none takes over the jobs of one that is alive */
    if (n < max && now - r->q_since >= 2e-3 * HEARTBEAT_MS && now - r->last_reclaim >= RECLAIM_EVERY) {
        r->last_reclaim = now;
        int got = q_reclaim(r, out + n, max - n);
        if (got < 0) return -1;
        n += got;
    }
    if (n < max) {
        char count[16], block[16];
        snprintf(count, sizeof count, "%d", max - n);
        snprintf(block, sizeof block, "%d", n ? 1 : (timeout_ms > 0 ? timeout_ms : 1));
        ARGV("XREADGROUP", "GROUP", GROUP, r->me, "COUNT", count, "BLOCK", block, "STREAMS", PREFIX "queue", ">");
        redisReply *rep = q_cmd(r, argc, argv, lens);
        if (!rep) return -1;
        if (rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "NOGROUP")) { /* Redis restarted empty */
            freeReplyObject(rep);
            q_lost(r, "the consumer group is gone");
            return -1;
        }
        /* [[stream, [entries]]] */
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 && rep->element[0]->elements == 2)
            n += q_entries(rep->element[0]->element[1], out + n, max - n);
        freeReplyObject(rep);
    } else if (max <= 0 && timeout_ms > 0) {
        usleep((useconds_t)timeout_ms * 1000);
    }
    return n;
}

static void be_free(job_backend *b) {
    job_redis *r = ctx(b);
    if (r->cmd) {
        flush(r);
        redisFree(r->cmd);
    }
    if (r->q) {
        char key[160];
        snprintf(key, sizeof key, PREFIX "alive:%s", r->me);
        redisReply *rep = redisCommand(r->q, "DEL %s", key); /* gone: others may take over at once */
        if (rep) freeReplyObject(rep);
        redisFree(r->q);
    }
    free(r->url);
    free(r);
    free(b);
}

static const struct job_backend_i k_redis_iface = {
    .name = "redis",
    .free = be_free,
    .put_job = be_put_job,
    .put_event = be_put_event,
    .drop_events_before = be_drop,
    .delete_job = be_delete,
    .begin = be_begin,
    .end = be_end,
    .write_errors = be_errors,
    .failing = be_failing,
    .create = be_create,
    .idem_lookup = be_idem_lookup,
    .requeue = be_requeue,
    .ack = be_ack,
    .fetch = be_fetch,
    .fetch_events = be_fetch_events,
    .list = be_list,
    .cancel_signal = be_cancel_signal,
    .cancel_signalled = be_cancel_signalled,
    .take = be_take,
    .tick = be_tick,
    .epoch = be_epoch,
};

const char *job_redis_consumer(const job_backend *b) {
    if (!b || b->iface != &k_redis_iface) return NULL;
    return ((const job_redis *)b->context)->me;
}

int job_redis_open(const char *url, double retention_s, job_backend **out, um_err *err) {
    *out = NULL;
    job_redis *r = xcalloc(1, sizeof *r);
    if (job_redis_parse_url(url, r->host, sizeof r->host, &r->port, &r->db, err) != 0) {
        free(r);
        return -1;
    }
    r->url = xstrdup(url);
    r->retention_s = retention_s > 0 ? retention_s : 86400;
    char host[64] = "unmask";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = 0;
    unsigned char rnd[4];
    if (RAND_bytes(rnd, sizeof rnd) != 1) UM_FATAL("RAND_bytes failed");
    snprintf(r->me, sizeof r->me, "%s-%d-%02x%02x%02x%02x", host, (int)getpid(), rnd[0], rnd[1], rnd[2], rnd[3]);
    char why[256];
    if (!(r->cmd = connect_to(r, 1000, why, sizeof why))) {
        um_err_set(err, UM_ERR_IO, "%s", why);
        free(r->url);
        free(r);
        return -1;
    }
    redisReply *rep = redisCommand(r->cmd, "PING");
    int ok = rep && rep->type != REDIS_REPLY_ERROR;
    if (!ok) um_err_set(err, UM_ERR_IO, "Redis at %s does not answer PING: %s", url, rep ? rep->str : r->cmd->errstr);
    if (rep) freeReplyObject(rep);
    if (!ok) {
        redisFree(r->cmd);
        free(r->url);
        free(r);
        return -1;
    }
    r->epoch = 1;
    r->last_ok = mono();
    job_backend *b = xcalloc(1, sizeof *b);
    b->iface = &k_redis_iface;
    b->context = r;
    *out = b;
    log_info("job store: %s (Redis, shared; this server is %s)", url, r->me);
    return 0;
}
