/*
 * webhook.h — signed webhook deliveries for async jobs, on a worker thread with retries.
 *
 * A delivery is an HTTP/1.1 POST of a JSON body to an http:// URL with the headers
 *   Content-Type: application/json
 *   X-Unmask-Signature: sha256=<lowercase hex HMAC-SHA256(secret, raw body)>
 *   X-Unmask-Event: <event name, e.g. job.succeeded>
 *   X-Unmask-Delivery: <delivery id>   (same on every retry of one delivery)
 * A 2xx answer completes it; anything else (connect error, timeout, non-2xx) is retried with
 * exponential backoff (base_delay * 2^(attempt-1), capped at 60 s) up to max_attempts.
 * https:// targets are refused at enqueue time (no TLS client here; documented gap).
 *
 * Targets (SSRF guard): the host is resolved before every attempt and every address it resolves
 * to must be globally reachable unicast by the IANA special-purpose registries (util/netaddr.h:
 * not loopback, private, shared, link-local/metadata, documentation, multicast, reserved, and no
 * IPv6 form leading to such an IPv4 address: IPv4-mapped addresses are judged as the IPv4 address,
 * the NAT64 prefix by its embedded address; the local NAT64 prefix, IPv4-compatible/-translated,
 * 6to4 and Teredo are refused) unless an allow-list network (--webhook-allow) contains it. The
 * delivery connects to exactly the addresses it checked (no second lookup). A pool of workers
 * delivers; one target has at most one delivery in flight, so a target that stalls holds one
 * worker, not the queue.
 *
 * Not here: what the body says (jobs/jobs.c builds it). Threads: webhook_enqueue() from any
 * thread; deliveries and the done callback run on the sender's worker threads, which never touch
 * lws.
 */
#ifndef UM_WEBHOOK_H
#define UM_WEBHOOK_H

#include <stddef.h>

#include "util/err.h"
#include "util/netaddr.h"

/* HMAC-SHA256(secret, body) as 64 lowercase hex chars + NUL. */
void webhook_sign(const char *secret, const void *body, size_t len, char out_hex[65]);

typedef struct webhook_url {
    char host[256];       /* hostname or IPv4/IPv6 literal (no brackets) */
    char port[8];         /* decimal, "80" by default */
    char path[1024];      /* "/..." including the query, "/" by default */
} webhook_url;

/* Accepts http://host[:port][/path]; -1 with UM_ERR_INVALID_ARG (param "webhook") otherwise. */
int webhook_url_parse(const char *url, webhook_url *u, um_err *err);

/* Networks a webhook may reach besides public addresses: "127.0.0.1/32,10.0.0.0/8,fd00::/8"
 * (a bare address = one host). *out malloc'd (caller frees); -1 with err on a bad entry. */
typedef net_cidr webhook_net;   /* util/netaddr.h */
int webhook_allow_parse(const char *list, webhook_net **out, int *n, um_err *err);

/* One blocking POST attempt (timeout_s for resolve + connect + send + response) to an address of
 * u that the policy allows (allow: the extra networks, may be NULL). 0 with *http_status set when
 * a response status line was read, -1 with err on network failure / timeout / a refused target. */
int webhook_post(const webhook_url *u, const webhook_net *allow, int n_allow, const char *extra_headers,
                 const void *body, size_t len, double timeout_s, int *http_status, um_err *err);

typedef struct webhook_sender webhook_sender;

/* Called once per delivery on the worker thread when it succeeded (ok = 1) or gave up.
 * last_status = the last HTTP status (0 when none was received). */
typedef void (*webhook_done_fn)(void *user, const char *delivery_id, int ok, int attempts, int last_status);

typedef struct webhook_config {
    const char *secret;        /* HMAC key (copied); "" = sign with the empty key */
    int         max_attempts;  /* >= 1; default 5 */
    double      base_delay_s;  /* first retry delay; default 0.5 */
    double      timeout_s;     /* per attempt; default 5 */
    const char *allow;         /* extra allowed networks (webhook_allow_parse), NULL = public only */
    int         workers;       /* delivery threads; default 4 */
} webhook_config;

/* NULL with err when cfg->allow is malformed. */
webhook_sender *webhook_sender_new(const webhook_config *cfg, um_err *err);
/* Stop the worker: deliveries still waiting get up to drain_s seconds (their remaining retries are
 * abandoned after that), then the thread is joined. */
void webhook_sender_free(webhook_sender *w, double drain_s);

/* 0 when url is a valid target now (parsed, resolved, every address allowed); -1 with err
 * (param "webhook") otherwise. For refusing a job's webhook when it is created. */
int webhook_check_target(const webhook_sender *w, const char *url, um_err *err);

/* Queue a delivery (body copied). done may be NULL. -1 with err when the URL is invalid. */
int webhook_enqueue(webhook_sender *w, const char *url, const char *event, const char *delivery_id,
                    const char *body, size_t len, webhook_done_fn done, void *user, um_err *err);

/* Deliveries queued or in flight (tests). */
int webhook_pending(webhook_sender *w);

#endif /* UM_WEBHOOK_H */
