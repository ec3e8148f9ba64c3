/*
 * http_api_internal.h — what the HTTP API's files share: the instance state (struct http_api,
 * one per server, reached as the routes' and the middleware's user pointer), the generation
 * stream that both plain requests and async jobs run, and the common responders.
 *
 *   http_api.c   create/free, middleware (request ids, CORS, API keys, rate limits, drain),
 *                /v1/models, /metrics, WebSocket handshake authorization, graceful shutdown
 *   http_gen.c   the generation endpoints (OpenAI, SGLang, llama.cpp) and their streams
 *   http_jobs.c  /v1/jobs: creation, the runner that submits queued jobs, event streams, webhooks
 *
 * Threads: the lws service thread, except where a function says otherwise.
 */
#ifndef UM_HTTP_API_INTERNAL_H
#define UM_HTTP_API_INTERNAL_H

#include <stdint.h>

#include <jansson.h>
#include <libwebsockets.h>

#include "api/openai.h"
#include "jobs/jobs.h"
#include "jobs/webhook.h"
#include "server/auth.h"
#include "server/callers.h"
#include "server/http.h"
#include "server/http_api.h"
#include "server/job_feed.h"
#include "server/server.h"

typedef struct gen_stream gen_stream;
typedef struct job_sub    job_sub;

#define API_WHO_MAX CALLER_WHO_MAX

/* A metrics gauge's user pointer: the instance and which of two values it reads. */
typedef struct gauge_ref {
    struct http_api *api;
    int              which;
} gauge_ref;

struct http_api {
    server         *srv;
    auth_keys       keys;
    net_cidr       *proxies;       /* [n_proxies] --trusted-proxies (owned) */
    int             n_proxies;
    char           *cors_origin;        /* owned or NULL */
    char            served_name[256];   /* /v1/models id */
    double          shutdown_grace;
    int             secret_set;         /* a webhook secret was configured */
    long            created;            /* unix time of configuration (models' "created") */
    job_store      *jobs;
    webhook_sender *wh;
    int             n_streams;          /* open generation responses */
    /* jobs waiting to be submitted (FIFO of ids) */
    char          (*job_q)[40];
    int             job_q_n, job_q_cap;
    /* webhooks of jobs that ended inside a batch of engine events, sent once the batch is
     * committed (a receiver never hears of an end the store could still lose) */
    char          (*wh_held)[40];
    int             wh_held_n, wh_held_cap;
    int             in_batch;           /* between jobs_batch_begin and jobs_batch_end */
    lws_sorted_usec_list_t pump_sul;
    int             pump_scheduled;
    int             job_starting;       /* a queued job's attempt is being built (one at a time) */
    job_sub        *subs;               /* job event streams */
    gen_stream     *job_runs;           /* running jobs */
    job_feed       *feed;               /* shared store: the thread taking jobs from it (owned), else NULL */
    lws_sorted_usec_list_t subs_sul;    /* job event streams: polled for new events while any is open */
    int             subs_scheduled;
    gauge_ref       gauges[3];          /* user pointers of the metrics gauges */
};

/* ---------------------------------------------------------------- generation streams (http_gen.c) */

typedef struct gen_choice {
    gen_stream *gs;
    int         i;
    sched_req  *req;          /* NULL once its final event was delivered (or never submitted) */
} gen_choice;

/* One request's choices on their way through the scheduler, answered to an HTTP client (c) or
 * recorded for a job (job_id). */
struct gen_stream {
    http_api   *api;
    http_conn  *c;            /* NULL: no client (a job) or the client went away */
    server     *srv;
    api_resp   *resp;
    gen_choice *ch;           /* [n] */
    int         n, n_live;    /* choices; choices whose final event is still to come */
    int         stream;       /* SSE response */
    char       *ignored_hdr;  /* "x-unmask-ignored-fields: a, b" for the response (owned) or NULL */
    int         ended;        /* the response is complete (or abandoned) */
    char        job_id[40];   /* "" = an HTTP request */
    char       *job_owner;    /* owned */
    char       *who;          /* the caller its generations are counted for (owned; gen_submit) */
    int         submit_failed; /* a job whose submission failed half-way: it stays queued */
    int         job_started;  /* a job: its attempt began (its first decode step ran; job_store_start) */
    double      job_gen_length; /* a job: tokens its choices generate in all (the attempt's gen_length) */
    gen_stream *next_run;     /* api->job_runs list (submitted jobs, started or still waiting for a batch slot) */
};

/* "x-unmask-ignored-fields: a, b" (malloc'd) naming what request g set that the server does not
 * use (api_gen_ignored: after the build), or NULL. The names are the table's, never client bytes. */
char       *gen_ignored_header(const api_gen *g);
/* A new stream of n choices for request g (its response state from seqs). */
gen_stream *gen_stream_new(http_api *a, const api_gen *g, const api_seq *seqs, int n, const model *m);
void        gen_free(gen_stream *gs);
void        gen_cancel_all(gen_stream *gs);
/* Submit every built sequence (taken) for caller who (its generation quota, its fairness turn).
 * On failure nothing stays submitted (the submitted ones are cancelled; their final events arrive
 * later) and e says why (429 quota_exceeded, 503 queue_full, model_loading). */
int         gen_submit(gen_stream *gs, api_seq *seqs, int n, const char *who, api_error *e);
void        http_gen_register(http_api *a);

/* ---------------------------------------------------------------- jobs (http_jobs.c) */

/* An engine event of a job's run (choice i): the first one begins the job's attempt (queued ->
 * running: a job waiting for a batch slot has spent nothing), then every event goes to its log. */
void jobs_run_event(gen_stream *gs, int choice, const sched_event *ev);
/* A job's run finished (every choice's final event delivered): record the result or retry, free
 * gs, start what waits. */
void jobs_run_finished(http_api *a, gen_stream *gs);
/* Start waiting jobs while the scheduler takes them. */
void jobs_pump(http_api *a);
/* Graceful shutdown: end job event streams (clients resume with Last-Event-ID). */
void jobs_drain_begin(http_api *a);
void jobs_shutdown(http_api *a);   /* after the server stopped: unfinished jobs fail (webhooks sent) unless the
                                      store is durable (they wait there for the next start) */
void jobs_recover(http_api *a);    /* at start, durable store: queue what a previous run left, resend webhooks */
void jobs_on_ready(server *s, void *user);   /* the model is ready: start queued jobs */
void jobs_batch_begin(void *user);           /* around a batch of engine events: one store commit */
void jobs_batch_end(void *user);
void jobs_on_wake(void *user);               /* service thread, every wake-up: what the job feed took */
void http_jobs_register(http_api *a);      /* the /v1/jobs routes and the WebSocket sessions' job watches */
void jobs_watches_close(http_api *a);      /* the job API goes away: end every watch (sessions are told) */

/* ---------------------------------------------------------------- common (http_api.c) */

/* Error response with the OpenAI error object and the retry headers its status calls for. */
int  api_respond_error(http_conn *c, const api_error *e);
int  api_respond_error_fmt(http_conn *c, int status, const char *code, const char *param, const char *msg);
/* One JSON record as an SSE frame on c's stream. */
int  api_stream_json(http_conn *c, const json_t *obj, const char *id);
/* The decode parameters every request on this server starts from (server policy). */
decode_params api_defaults(const http_api *a, const model *m);
/* The caller (server/callers.h): "key:<SHA-256 of the API key presented>" when keys are on, else
 * the client address "ip:<addr>": jobs' owner, the quota and rate-limit key, the fairness key. */
const char *api_caller_identity(const http_api *a, http_conn *c, char *buf, size_t cap);
/* 503 answers a request gets while the model loads / the server drains. */
int  api_respond_loading(http_conn *c);
int  api_respond_shutting_down(http_conn *c);

extern const char *const k_sse_headers[];

#endif /* UM_HTTP_API_INTERNAL_H */
