/*
 * server_config.h — `unmask serve` settings: one table of every setting; built-in defaults, then
 * config/unmask.json (jansson), then command-line flags override; server_config_check() validates.
 *
 * Not here: decode defaults for requests (decode/), the HTTP API limits of other route files.
 * Main thread only (filled before the server starts; read-only afterwards from every thread).
 */
#ifndef UM_SERVER_CONFIG_H
#define UM_SERVER_CONFIG_H

#include <stddef.h>

#include "util/err.h"

typedef struct server_config {
    /* strings are owned (malloc'd) or NULL */
    char  *model;                 /* checkpoint directory */
    char  *host;                  /* listen address ("127.0.0.1", "0.0.0.0", "::") */
    int    port;                  /* 0 = pick a free port (printed on startup) */
    char  *web_root;              /* directory of the browser UI */
    int    threads;               /* CPU compute threads per engine, 0 = all cores */
    int    engines;               /* engine threads (one per device; CPU: 1) */
    char  *devices;               /* "cpu", or a comma list of GPUs "cuda:0,cuda:1": one engine
                                     (data-parallel replica) per GPU, overriding engines */
    int    tp;                    /* tensor-parallel ranks per replica (1 = none): CPU threads over
                                     comm_local, or GPUs over NCCL (--device lists replicas x tp
                                     GPUs on one node; tp / nnodes per node across nodes) */
    char  *dist_init_addr;        /* "host:port" of node 0's bootstrap listener (multi-node), or NULL */
    int    nnodes;                /* nodes of the tensor-parallel group (>= 1) */
    int    node_rank;             /* this node, 0..nnodes-1; > 0: a follower without HTTP */
    int    max_seq;               /* longest prompt + gen (+ suffix) a request may have, tokens;
                                     0 = the model's maximum; sizes the activation buffers */
    int    max_batch;             /* sequences per decode step per engine */
    int    device_loop;           /* 1: CUDA engines run eligible sequences on the device-resident
                                     decode loop (docs/decode.md); 0: always the host loop */
    char  *quant;                 /* weights of the matrix products: "bf16" (as stored), "q8_0" or
                                     "q4_0" (quantized at load; CPU engines only) */
    int    cpu_pin;               /* 1: CPU compute threads pinned one per CPU (backend_options) */
    int    cuda_fuse;             /* 1: the CUDA backend's fused ops as one kernel each (backend_options) */
    int    cuda_skinny;           /* 1: products of <= 64 rows on the skinny kernel (backend_options) */
    int    max_queue;             /* requests waiting for admission (all engines) */
    int    max_paused;            /* sequences one engine may hold paused at a step boundary so that
                                     a caller with nothing running (or an attached session) goes
                                     first; 0 = never pause; -1 (default) = max_batch */
    int    prep_workers;          /* threads that tokenize / template requests off the service thread */
    double session_retention_s;   /* how long a disconnected session (and its generations) lives */
    size_t session_max_bytes;     /* per-session buffered events (unsent + sent-unacked), bytes */
    size_t sessions_max_bytes;    /* ... of every session together, bytes */
    size_t traces_max_bytes;      /* WebSocket generations' traces (GET /v1/generations/{id}/trace), bytes */
    int    session_max_events;    /* ... and count */
    int    max_sessions;          /* sessions alive at once (connected + retained) */
    int    max_session_generations; /* running/queued generations per session */
    int    max_session_job_subscriptions; /* jobs one session follows at once (job.subscribe) */
    size_t max_message_bytes;     /* largest client WebSocket message / HTTP body */
    int    ping_interval_s;       /* idle time before a WebSocket protocol ping; hang up 10 s later */
    double request_timeout_s;     /* a request's head + body must arrive within this, from its first
                                     byte (server/conn_guard.h) */
    double keepalive_timeout_s;   /* idle time of an HTTP connection between requests before closing */
    int    max_conns_per_address; /* open connections per client address (IPv6 /64), 0 = no cap */
    char  *tls_cert;              /* PEM server certificate (chain); with tls_key enables https/wss */
    char  *tls_key;               /* PEM private key */
    int    verbose;               /* log level debug */
    /* HTTP APIs (server/http_api.c) */
    char  *api_keys;              /* file of API keys (one per line), or NULL: open access */
    double rate_limit;            /* HTTP requests per second per key (or address), 0 = off */
    double rate_burst;            /* bucket size, 0 = 2 x rate_limit (at least 1) */
    char  *cors_origin;           /* allowed browser Origin ("*" = any), or NULL: no CORS */
    char  *algorithm_config;      /* decoder defaults file (YAML or JSON), or NULL */
    char  *dllm_algorithm;        /* decoder of every request by our name or SGLang's, or NULL */
    char  *cache;                 /* requests' default KV cache: auto | none | prefix | dual | vicinity */
    char  *webhook_secret;        /* HMAC key of job webhooks, or NULL ($UNMASK_WEBHOOK_SECRET) */
    char  *trusted_proxies;       /* CIDR list of reverse proxies whose X-Forwarded-For is believed */
    char  *store;                 /* async jobs' store: sqlite (= DATA_DIR/jobs.db) | sqlite:PATH |
                                     redis://HOST:PORT[/DB] (shared by replicas) | memory */
    double job_retention_s;       /* redis: seconds a finished job (result, events) is kept */
    int    job_capacity;          /* redis: unfinished jobs this server takes at a time, 0 = --max-batch */
    char  *data_dir;              /* where the default durable files live */
    int    webhook_attempts;      /* delivery attempts per webhook */
    double webhook_retry_base_s;  /* first retry delay, doubling */
    double webhook_timeout_s;     /* one attempt: resolve + connect + send + answer */
    char  *webhook_allow;         /* networks webhooks may reach besides public addresses, or NULL */
    int    webhook_workers;       /* delivery threads */
    char  *served_model_name;     /* /v1/models id, or NULL: the model directory's name */
    int    max_gen_length;        /* largest max_tokens / gen_length of a request */
    int    max_prompt_tokens;     /* largest prompt, tokens; 0 = the model's context */
    int    max_jobs;              /* async jobs kept */
    size_t jobs_max_bytes;        /* their requests, results and event logs together, bytes */
    int    job_attempts;          /* engine attempts per job */
    double shutdown_grace_s;      /* SIGTERM: seconds to finish running work */
    /* per caller (an API key, or a client address without keys): server/callers.h; 0 = no limit */
    int    key_max_generations;   /* generations queued or running, HTTP + WebSocket + jobs */
    int    key_max_sessions;      /* WebSocket sessions alive */
    int    key_max_jobs;          /* async jobs not finished */
    struct json_t *file;          /* the config file's object as loaded (owned), or NULL */
} server_config;

/* ---------------------------------------------------------------- the settings table
 *
 * Every `unmask serve` setting is one row of a table (server_config.c): its flag name (the config
 * file key is the same with '_' for '-'), type, field, default, range and help. The table drives
 * the defaults, the JSON config file, the command-line flags, the range checks, `--help` and the
 * settings reported by GET /stats. Adding a setting is one row (and its field above). */

/* Built-in defaults (the table's). */
void server_config_defaults(server_config *c);
/* Settings from the command line: built-in defaults, then the JSON config file (--config FILE,
 * else default_config when that file exists), then the flags. Returns 0, 1 after printing --help
 * (usage first), or -1 with err (a bad flag, value or config file). Main thread. */
int  server_config_from_args(server_config *c, int argc, char **argv, const char *usage, const char *default_config,
                             um_err *err);
/* Apply a JSON config file. Wrong types of known keys are errors naming the key; unknown keys are
 * warned about and ignored. */
int  server_config_load_file(server_config *c, const char *path, um_err *err);
/* Apply a JSON object held in memory (same rules). label names it in messages. */
int  server_config_apply_json(server_config *c, const char *text, size_t len, const char *label,
                              um_err *err);
/* Range checks of every setting (the table's) and the cross-setting rules, after all sources. */
int  server_config_check(const server_config *c, um_err *err);
/* The checks that need the model's config.json (cheap, before listening): --tp divides the heads
 * and MLP width, --max-seq <= the model's maximum. 0 when the file cannot be read (the loader
 * reports that). */
int  server_config_check_model(const server_config *c, um_err *err);
/* Every setting as {"name": value} (config-file keys; secrets as true/false: set or not). */
struct json_t *server_config_to_json(const server_config *c);
void server_config_free(server_config *c);
/* The device of engine i ("cpu" or "cuda:N") into buf; number of engines the config implies
 * (one per GPU listed, or --engines on the CPU; not divided by tp). */
int  server_config_engine_count(const server_config *c);
const char *server_config_engine_device(const server_config *c, int i, char *buf, size_t cap);
/* Data-parallel replicas (engine threads): GPUs / (tp / nnodes) on CUDA, --engines on the CPU. */
int  server_config_replicas(const server_config *c);
/* Tensor-parallel ranks of one replica on this node: tp / nnodes. */
int  server_config_local_ranks(const server_config *c);
/* 1 when --device lists GPUs. */
int  server_config_is_cuda(const server_config *c);
/* Replace a string field (frees the old value; v may be NULL). */
void server_config_set_str(char **field, const char *v);

#endif /* UM_SERVER_CONFIG_H */
