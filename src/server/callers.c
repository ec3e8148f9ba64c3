/*
 * callers.c — per-caller quotas and the rate limit (see callers.h). A small open hash table of
 * callers with non-zero holdings, under one mutex.
 */
#include "server/callers.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/ratelimit.h"
#include "util/hash.h"
#include "util/log.h"

typedef struct caller {
    struct caller *next;     /* hash chain */
    char          *who;      /* owned */
    int            held[CALLER_N_RES];
} caller;

#define CALLER_BUCKETS 1024

struct callers {
    pthread_mutex_t lock;
    /* --- lock { */
    caller   *buckets[CALLER_BUCKETS];
    int       n;
    /* } lock --- */
    int       limit[CALLER_N_RES];  /* <= 0: no limit */
    ratelimit *rl;                  /* NULL: no rate limit (thread-safe itself) */
    double    rate;
};

static unsigned hash_str(const char *s) { return hash_str_fnv1a(s) % CALLER_BUCKETS; }

callers *callers_new(const server_config *cfg) {
    callers *cs = xcalloc(1, sizeof *cs);
    pthread_mutex_init(&cs->lock, NULL);
    cs->limit[CALLER_GENERATIONS] = cfg->key_max_generations;
    cs->limit[CALLER_SESSIONS] = cfg->key_max_sessions;
    cs->limit[CALLER_JOBS] = cfg->key_max_jobs;
    cs->rate = cfg->rate_limit;
    if (cs->rate > 0)
        cs->rl = ratelimit_new(cs->rate, cfg->rate_burst > 0 ? cfg->rate_burst : (2 * cs->rate < 1 ? 1 : 2 * cs->rate));
    return cs;
}

void callers_free(callers *cs) {
    if (!cs) return;
    for (int b = 0; b < CALLER_BUCKETS; b++)
        while (cs->buckets[b]) {
            caller *c = cs->buckets[b];
            cs->buckets[b] = c->next;
            free(c->who);
            free(c);
        }
    ratelimit_free(cs->rl);
    pthread_mutex_destroy(&cs->lock);
    free(cs);
}

/* The caller entry of who (created when create); lock held. */
static caller *find(callers *cs, const char *who, int create) {
    unsigned b = hash_str(who);
    for (caller *c = cs->buckets[b]; c; c = c->next)
        if (strcmp(c->who, who) == 0) return c;
    if (!create) return NULL;
    caller *c = xcalloc(1, sizeof *c);
    c->who = xstrdup(who);
    c->next = cs->buckets[b];
    cs->buckets[b] = c;
    cs->n++;
    return c;
}

/* Forget c when it holds nothing; lock held. */
static void forget_if_idle(callers *cs, caller *c) {
    for (int r = 0; r < CALLER_N_RES; r++)
        if (c->held[r]) return;
    for (caller **pp = &cs->buckets[hash_str(c->who)]; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            free(c->who);
            free(c);
            cs->n--;
            return;
        }
}

int callers_take(callers *cs, const char *who, enum caller_res res, int n, int *limit, int *held) {
    CHECK(res >= 0 && res < CALLER_N_RES && n >= 0);
    int rc = 0;
    pthread_mutex_lock(&cs->lock);
    /* --- lock { */
    caller *c = find(cs, who, 1);
    if (limit) *limit = cs->limit[res];
    if (held) *held = c->held[res];
    if (cs->limit[res] > 0 && c->held[res] + n > cs->limit[res]) rc = -1;
    else c->held[res] += n;
    forget_if_idle(cs, c);
    /* } lock --- */
    pthread_mutex_unlock(&cs->lock);
    return rc;
}

void callers_give(callers *cs, const char *who, enum caller_res res, int n) {
    pthread_mutex_lock(&cs->lock);
    caller *c = find(cs, who, 0);
    if (c) {
        c->held[res] = c->held[res] > n ? c->held[res] - n : 0;
        forget_if_idle(cs, c);
    }
    pthread_mutex_unlock(&cs->lock);
}

int callers_rate_take(callers *cs, const char *who, double now_s, double *retry_after_s) {
    if (!cs->rl) return 1;
    return ratelimit_take(cs->rl, who, 1, now_s, retry_after_s);
}

double callers_rate(const callers *cs) { return cs->rate; }

uint64_t callers_owner_key(const char *who) {
    uint64_t h = 1469598103934665603ull;
    for (; *who; who++) h = (h ^ (unsigned char)*who) * 1099511628211ull;
    return h ? h : 1;
}

const char *callers_res_flag(enum caller_res res) {
    static const char *const k_flags[CALLER_N_RES] = {"--key-max-generations", "--key-max-sessions", "--key-max-jobs"};
    return k_flags[res];
}
