/*
 * job_redis.h — the job store in Redis, shared by several servers (--store redis://HOST:PORT[/DB]):
 * a job_backend (jobs/job_backend.h) with a queue (a Redis stream and consumer group), jobs and
 * event logs in hashes with a retention TTL, Idempotency-Keys claimed with SET NX, and heartbeats
 * so the jobs of a server that died are taken over. Layout and threads: job_redis.c's header.
 */
#ifndef UM_JOB_REDIS_H
#define UM_JOB_REDIS_H

#include <stddef.h>

#include "jobs/job_backend.h"
#include "util/err.h"

/* redis://HOST[:PORT][/DB] (PORT 6379, DB 0 by default; [IPv6] in brackets); -1 with err (param
 * "store") otherwise. */
int job_redis_parse_url(const char *url, char *host, size_t cap, int *port, int *db, um_err *err);

/* Connects (0.5 s) and checks that Redis answers; -1 with err naming the URL when it does not.
 * retention_s: how long a finished job (result, event log) is kept. */
int job_redis_open(const char *url, double retention_s, job_backend **out, um_err *err);

/* This server's consumer name in a Redis store (its heartbeat is unmask:alive:<name>); NULL when b
 * is not a Redis store. */
const char *job_redis_consumer(const job_backend *b);

#endif /* UM_JOB_REDIS_H */
