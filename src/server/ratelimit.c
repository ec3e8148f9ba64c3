/*
 * ratelimit.c — token buckets in a chained hash table (see ratelimit.h). Thread-safe.
 */
#include "server/ratelimit.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

typedef struct bucket {
    struct bucket *next;
    char          *key;      /* owned */
    double         tokens;   /* tokens available at time t */
    double         t;        /* last refill time, monotonic seconds */
} bucket;

struct ratelimit {
    double          rate, burst;
    pthread_mutex_t lock;
    /* --- lock { */
    bucket        **slots;    /* [n_slots] chains */
    int             n_slots;
    int             n;        /* buckets */
    double          last_sweep;
    /* } lock --- */
};

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

ratelimit *ratelimit_new(double rate, double burst) {
    ratelimit *rl = xcalloc(1, sizeof *rl);
    rl->rate = rate;
    rl->burst = burst < 1 ? 1 : burst;
    rl->n_slots = 256;
    rl->slots = xcalloc((size_t)rl->n_slots, sizeof *rl->slots);
    pthread_mutex_init(&rl->lock, NULL);
    return rl;
}

void ratelimit_free(ratelimit *rl) {
    if (!rl) return;
    for (int i = 0; i < rl->n_slots; i++) {
        bucket *b = rl->slots[i];
        while (b) {
            bucket *nx = b->next;
            free(b->key);
            free(b);
            b = nx;
        }
    }
    free(rl->slots);
    pthread_mutex_destroy(&rl->lock);
    free(rl);
}

/* Drop buckets that would be full by now (they carry no state a fresh bucket would not). */
static void sweep(ratelimit *rl, double now) {
    double full_after = rl->burst / rl->rate;
    for (int i = 0; i < rl->n_slots; i++) {
        bucket **pp = &rl->slots[i];
        while (*pp) {
            bucket *b = *pp;
            if (now - b->t >= full_after) {
                *pp = b->next;
                free(b->key);
                free(b);
                rl->n--;
            } else {
                pp = &b->next;
            }
        }
    }
    rl->last_sweep = now;
}

int ratelimit_take(ratelimit *rl, const char *key, double cost, double now, double *retry_after_s) {
    if (retry_after_s) *retry_after_s = 0;
    if (rl->rate <= 0) return 1;
    int ok;
    pthread_mutex_lock(&rl->lock); /* --- lock { */
    if (rl->n > 4 * rl->n_slots && now - rl->last_sweep > 1.0) sweep(rl, now);
    uint64_t h = hash_str(key) % (uint64_t)rl->n_slots;
    bucket *b = rl->slots[h];
    while (b && strcmp(b->key, key) != 0) b = b->next;
    if (!b) {
        b = xcalloc(1, sizeof *b);
        b->key = xstrdup(key);
        b->tokens = rl->burst;
        b->t = now;
        b->next = rl->slots[h];
        rl->slots[h] = b;
        rl->n++;
    }
    if (now > b->t) {
        b->tokens += (now - b->t) * rl->rate;
        if (b->tokens > rl->burst) b->tokens = rl->burst;
        b->t = now;
    }
    if (b->tokens >= cost) {
        b->tokens -= cost;
        ok = 1;
    } else {
        ok = 0;
        if (retry_after_s) *retry_after_s = (cost - b->tokens) / rl->rate;
    }
    pthread_mutex_unlock(&rl->lock); /* } lock --- */
    return ok;
}

int ratelimit_n_keys(ratelimit *rl) {
    pthread_mutex_lock(&rl->lock);
    int n = rl->n;
    pthread_mutex_unlock(&rl->lock);
    return n;
}
