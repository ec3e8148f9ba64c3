/*
 * ratelimit.h — per-key token buckets (requests per second with a burst).
 *
 * Each key (an API key, or "ip:<addr>" under open access) owns a bucket of capacity `burst` that
 * refills at `rate` tokens per second; a request takes `cost` tokens (1 per HTTP request). When
 * the bucket holds less, the request is refused and the caller gets the exact wait until it would
 * succeed (-> 429 with Retry-After / retry-after-ms). Buckets idle long enough to be full again
 * are dropped, so memory stays bounded by the recently active keys.
 *
 * Not here: deciding which key a request belongs to (server/http_api.c). Thread-safe (one mutex).
 */
#ifndef UM_RATELIMIT_H
#define UM_RATELIMIT_H

typedef struct ratelimit ratelimit;

/* rate <= 0: unlimited (ratelimit_take always succeeds). burst < 1 is raised to 1. */
ratelimit *ratelimit_new(double rate_per_s, double burst);
void       ratelimit_free(ratelimit *rl);

/* Take cost tokens from key's bucket at time now_s (monotonic seconds). Returns 1 when allowed;
 * 0 when limited, with *retry_after_s = seconds until cost tokens are available (> 0). */
int ratelimit_take(ratelimit *rl, const char *key, double cost, double now_s, double *retry_after_s);

/* Buckets currently tracked (for tests and metrics). */
int ratelimit_n_keys(ratelimit *rl);

#endif /* UM_RATELIMIT_H */
