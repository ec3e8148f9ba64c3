/*
 * callers.h — what one caller may hold at once, and how fast it may ask: per-caller quotas and
 * the request rate limit, shared by every transport (HTTP APIs, WebSocket, jobs).
 *
 * A caller is an identity string: "key:<sha-256 of the API key, hex>" when API keys are on, else
 * "ip:<client address>" (server/http_api.c computes it; the whole key is hashed, so keys that
 * share a prefix are different callers). Quotas (serve settings): generations queued or running
 * (--key-max-generations), WebSocket sessions alive (--key-max-sessions), async jobs not finished
 * (--key-max-jobs). callers_take() reserves, callers_give() returns; a caller whose counts are all
 * zero is forgotten, so memory follows the active callers. The rate limit (--rate-limit,
 * --rate-burst) is one token bucket per caller over every HTTP request and WebSocket generation.
 *
 * Not here: authentication, what a generation is. Thread-safe (one mutex): the service thread and
 * the job runner use it.
 */
#ifndef UM_CALLERS_H
#define UM_CALLERS_H

#include <stdint.h>

#include "server/server_config.h"

typedef struct callers callers;

#define CALLER_WHO_MAX 128   /* identity buffers: "key:" + 64 hex digits, or "ip:" + an address */

enum caller_res {
    CALLER_GENERATIONS,   /* sequences queued or running (one per choice) */
    CALLER_SESSIONS,      /* WebSocket sessions alive (connected or retained) */
    CALLER_JOBS,          /* async jobs queued or running */
    CALLER_N_RES,
};

callers *callers_new(const server_config *cfg);
void     callers_free(callers *cs);

/* Reserve n of res for who: 0, or -1 when that would exceed the quota (nothing reserved; *limit
 * and *held say why). */
int  callers_take(callers *cs, const char *who, enum caller_res res, int n, int *limit, int *held);
/* Return n of res (never below zero). */
void callers_give(callers *cs, const char *who, enum caller_res res, int n);
/* The rate limit: 1 when who may make one more request at now_s (monotonic seconds); 0 with
 * *retry_after_s when not. Always 1 without --rate-limit. */
int  callers_rate_take(callers *cs, const char *who, double now_s, double *retry_after_s);
/* --rate-limit (requests per second; 0 = off), for messages. */
double callers_rate(const callers *cs);
/* The scheduler's fairness key of a caller (its generations share one round-robin turn). */
uint64_t callers_owner_key(const char *who);
/* The name of res's quota setting as a flag ("--key-max-generations"). */
const char *callers_res_flag(enum caller_res res);

#endif /* UM_CALLERS_H */
