/*
 * server_config.c — `unmask serve` settings: the table of every setting, and from it the
 * defaults, the JSON config file, the flags, --help, range checks and the /stats report; then the
 * rules that tie settings together.
 * Not here: what the settings do (the server's modules read the struct). Main thread only,
 * before the server starts.
 */
#include "server/server_config.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "decode/params.h"
#include "model/config.h"
#include "model/model.h"
#include "model/model_tp.h"
#include "util/fileio.h"
#include "util/log.h"

#define CONFIG_FILE_MAX_BYTES (1u << 20)

void server_config_set_str(char **field, const char *v) {
    free(*field);
    *field = v ? xstrdup(v) : NULL;
}

int server_config_engine_count(const server_config *c) {
    if (!c->devices || strcmp(c->devices, "cpu") == 0) return c->engines;
    int n = 1;
    for (const char *p = c->devices; *p; p++) n += *p == ',';
    return n;
}

const char *server_config_engine_device(const server_config *c, int i, char *buf, size_t cap) {
    if (!c->devices || strcmp(c->devices, "cpu") == 0) {
        snprintf(buf, cap, "cpu");
        return buf;
    }
    const char *p = c->devices;
    for (int k = 0; k < i && p; k++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    size_t n = p ? strcspn(p, ",") : 0;
    snprintf(buf, cap, "%.*s", (int)n, p ? p : "");
    return buf;
}

int server_config_is_cuda(const server_config *c) { return c->devices && strcmp(c->devices, "cpu") != 0; }

int server_config_local_ranks(const server_config *c) {
    int nn = c->nnodes > 1 ? c->nnodes : 1, tp = c->tp > 1 ? c->tp : 1;
    return tp / nn > 0 ? tp / nn : 1;
}

int server_config_replicas(const server_config *c) {
    if (!server_config_is_cuda(c)) return c->engines;
    int n = server_config_engine_count(c) / server_config_local_ranks(c);
    return n > 0 ? n : 1;
}

/* ---------------------------------------------------------------- the settings table */

typedef enum setting_type {
    SET_STR,     /* char *; "" as a default = NULL */
    SET_INT,     /* int */
    SET_SIZE,    /* size_t (bytes) */
    SET_NUM,     /* double */
    SET_ONOFF,   /* int 0/1: flag value on|off, config true|false */
    SET_FLAG,    /* int 0/1: a flag without value, config true|false */
} setting_type;

typedef struct setting setting;
struct setting {
    const char  *name;      /* --name; the config key is name with '_' for '-' */
    setting_type type;
    size_t       off;       /* field in server_config */
    const char  *def;       /* default, written as the flag's value */
    double       min, max;  /* range of numbers (checked after every source) */
    const char  *help;      /* --help line */
    const char  *def_doc;   /* the default as --help shows it when def alone would mislead, or NULL */
    const char  *key;       /* config key when it differs from the name's, or NULL */
    unsigned     flags;     /* SETTING_* */
    /* (optional) custom text form: sets the field from a flag value; -1 + err when invalid */
    int        (*parse)(server_config *c, const setting *s, const char *text, um_err *err);
};
#define SETTING_SECRET   1u  /* reported as set / not set only */
#define SETTING_CLI_ONLY 2u  /* a flag without a config key */

static int parse_gpus(server_config *c, const setting *s, const char *text, um_err *err);

#define F(field) offsetof(server_config, field)
#define INF 1e300
static const setting k_settings[] = {
    {"model", SET_STR, F(model), "models/unmask-code-13m", 0, 0, "checkpoint directory or GGUF file", NULL, NULL, 0, NULL},
    {"model-path", SET_STR, F(model), "", 0, 0, "SGLang's name for --model", NULL, NULL, SETTING_CLI_ONLY, NULL},
    {"host", SET_STR, F(host), "127.0.0.1", 0, 0, "listen address: 127.0.0.1, 0.0.0.0, ::, localhost", NULL, NULL, 0, NULL},
    {"port", SET_INT, F(port), "8080", 0, 65535, "listen port, 0 = any free port (printed)", NULL, NULL, 0, NULL},
    {"web-root", SET_STR, F(web_root), "web", 0, 0, "directory of the browser UI", NULL, NULL, 0, NULL},
    {"threads", SET_INT, F(threads), "0", 0, 1024, "CPU compute threads in total, 0 = all cores", NULL, NULL, 0, NULL},
    {"engines", SET_INT, F(engines), "1", 1, 64, "CPU engine threads", NULL, NULL, 0, NULL},
    {"device", SET_STR, F(devices), "cpu", 0, 0, "cpu, or GPUs cuda:0,cuda:1,... (one engine = model replica per GPU)",
     NULL, "devices", 0, NULL},
    {"gpus", SET_STR, F(devices), "", 0, 0, "shorthand for --device: 0,1 = cuda:0,cuda:1", NULL, NULL, SETTING_CLI_ONLY,
     parse_gpus},
    {"tp", SET_INT, F(tp), "1", 1, 64,
     "tensor-parallel ranks per replica: CPU threads, or GPUs (--gpus 0,1,2,3 --tp 2 = 2 replicas of 2)", NULL, NULL, 0,
     NULL},
    {"dist-init-addr", SET_STR, F(dist_init_addr), "", 0, 0,
     "multi-node TP (CUDA + NCCL): host:port node 0 listens on for the others", NULL, NULL, 0, NULL},
    {"nnodes", SET_INT, F(nnodes), "1", 1, 64, "multi-node TP: nodes in the group, --tp / --nnodes GPUs each", NULL, NULL,
     0, NULL},
    {"node-rank", SET_INT, F(node_rank), "0", 0, 63, "multi-node TP: this node, 0 = serves HTTP, others follow", NULL,
     NULL, 0, NULL},
    {"max-seq", SET_INT, F(max_seq), "0", 0, 1000000,
     "longest prompt + gen (+ suffix) per request, tokens; sizes GPU buffers", "the model's maximum", NULL, 0, NULL},
    {"max-batch", SET_INT, F(max_batch), "8", 1, 4096, "sequences per decode step per engine", NULL, NULL, 0, NULL},
    {"device-loop", SET_ONOFF, F(device_loop), "on", 0, 1,
     "CUDA: on = device-resident decode loop where supported, off = host loop (docs/decode.md)", NULL, NULL, 0, NULL},
    {"quant", SET_STR, F(quant), "bf16", 0, 0,
     "weights of the matrix products: bf16 = as the checkpoint stores them (an FP8 checkpoint: FP8 on CUDA, "
     "dequantized on the CPU), q8_0 | q4_0 = quantized at load, 8 / 4.5 bits per weight (CPU only; "
     "docs/cpu-kernels.md), fp8 = E4M3 with a scale per output channel (CUDA only; docs/gpu.md)", NULL, NULL, 0, NULL},
    {"cpu-pin", SET_ONOFF, F(cpu_pin), "off", 0, 1,
     "CPU: on = pin compute thread i to the i-th CPU the process may use, off = the OS places them (a pinned "
     "thread cannot leave a core another process keeps busy; docs/cpu-kernels.md)", NULL, NULL, 0, NULL},
    {"cuda-fuse", SET_ONOFF, F(cuda_fuse), "on", 0, 1,
     "CUDA: on = RoPE of q and k with the KV cache write, and the residual add with the next RMSNorm, one kernel "
     "each; off = their single kernels (an A/B switch, docs/gpu.md)", NULL, NULL, 0, NULL},
    {"cuda-skinny", SET_ONOFF, F(cuda_skinny), "off", 0, 1,
     "CUDA: on = bf16 matrix products of <= 64 rows (cached decode steps) on the weight-streaming kernel; off = on "
     "cuBLAS, faster on the H200 so far (docs/gpu.md; FP8 weights always stream)", NULL, NULL, 0, NULL},
    {"max-queue", SET_INT, F(max_queue), "256", 0, 1000000, "requests waiting beyond free batch slots; more -> queue_full",
     NULL, NULL, 0, NULL},
    {"max-paused", SET_INT, F(max_paused), "-1", -1, 4096,
     "running sequences one engine may pause (state and KV cache kept) so that a caller with nothing running, or an "
     "attached session over a detached one, goes first; 0 = never pause, -1 = --max-batch", "same as --max-batch", NULL, 0,
     NULL},
    {"prep-workers", SET_INT, F(prep_workers), "2", 1, 64,
     "threads that apply chat templates and tokenize requests, off the network thread", NULL, NULL, 0, NULL},
    {"session-retention", SET_NUM, F(session_retention_s), "120", 0, 604800,
     "seconds a disconnected session (and its generations) lives", NULL, NULL, 0, NULL},
    {"session-max-bytes", SET_SIZE, F(session_max_bytes), "8388608", 65536, INF, "per-session event buffer, bytes", NULL,
     NULL, 0, NULL},
    {"sessions-max-bytes", SET_SIZE, F(sessions_max_bytes), "536870912", 1048576, INF,
     "every session's event buffers together, bytes (bounds memory whatever --max-sessions is)", NULL, NULL, 0, NULL},
    {"traces-max-bytes", SET_SIZE, F(traces_max_bytes), "67108864", 0, INF,
     "denoising traces of WebSocket generations kept for GET /v1/generations/{id}/trace, bytes (oldest go first)", NULL,
     NULL, 0, NULL},
    {"session-max-events", SET_INT, F(session_max_events), "8192", 64, INF, "per-session event buffer, events", NULL,
     NULL, 0, NULL},
    {"max-sessions", SET_INT, F(max_sessions), "1024", 1, INF, "sessions alive at once, connected + retained", NULL,
     NULL, 0, NULL},
    {"max-session-generations", SET_INT, F(max_session_generations), "16", 1, INF, "running generations per session",
     NULL, NULL, 0, NULL},
    {"max-session-job-subscriptions", SET_INT, F(max_session_job_subscriptions), "64", 1, 100000,
     "async jobs one WebSocket session may follow at once (job.subscribe)", NULL, NULL, 0, NULL},
    {"max-message-bytes", SET_SIZE, F(max_message_bytes), "1048576", 4096, 268435456,
     "largest WebSocket message / HTTP body, bytes", NULL, NULL, 0, NULL},
    {"ping-interval", SET_INT, F(ping_interval_s), "30", 1, 3600,
     "seconds of silence before a WebSocket ping; hang up 10 s later", NULL, NULL, 0, NULL},
    {"request-timeout", SET_NUM, F(request_timeout_s), "30", 0.1, 3600,
     "seconds an HTTP request (head and body; a WebSocket's upgrade request) may take to arrive, from its "
     "first byte; a late one gets 408 and its connection closes. Answers (streams) are not limited",
     NULL, NULL, 0, NULL},
    {"keepalive-timeout", SET_NUM, F(keepalive_timeout_s), "30", 0.1, 3600,
     "seconds an HTTP connection may stay idle between two requests before it is closed", NULL, NULL, 0, NULL},
    {"max-conns-per-address", SET_INT, F(max_conns_per_address), "256", 0, 1000000,
     "open connections (HTTP, TLS, WebSocket) per client address, IPv6 per /64; more are closed as soon as they "
     "are accepted; --trusted-proxies are not counted (limit per client at the proxy); 0 = no cap", NULL, NULL, 0,
     NULL},
    {"tls-cert", SET_STR, F(tls_cert), "", 0, 0, "PEM certificate (chain): serve https:// and wss:// (TLS 1.2+)", NULL,
     NULL, 0, NULL},
    {"tls-key", SET_STR, F(tls_key), "", 0, 0, "PEM private key for --tls-cert", NULL, NULL, 0, NULL},
    {"verbose", SET_FLAG, F(verbose), "0", 0, 1, "debug logging (also libwebsockets warnings)", NULL, NULL, 0, NULL},
    {"api-keys", SET_STR, F(api_keys), "", 0, 0, "file of API keys, one per line; none = open access", NULL, NULL, 0, NULL},
    {"rate-limit", SET_NUM, F(rate_limit), "0", 0, INF, "HTTP requests per second per API key (or client address); 0 = off",
     NULL, NULL, 0, NULL},
    {"rate-burst", SET_NUM, F(rate_burst), "0", 0, INF, "rate-limit burst (bucket size)", "2 x rate, at least 1", NULL, 0,
     NULL},
    {"trusted-proxies", SET_STR, F(trusted_proxies), "", 0, 0,
     "reverse proxies (addresses / CIDR blocks) whose X-Forwarded-For names the client: per-address quotas and "
     "rate limits then see the client, not the proxy", NULL, NULL, 0, NULL},
    {"cors-origin", SET_STR, F(cors_origin), "", 0, 0, "allowed browser Origin for the HTTP APIs ('*' = any); none = no CORS",
     NULL, NULL, 0, NULL},
    {"algorithm-config", SET_STR, F(algorithm_config), "", 0, 0,
     "server-wide decoder defaults, YAML (flat key: value) or JSON, like SGLang's --dllm-algorithm-config", NULL, NULL, 0,
     NULL},
    {"dllm-algorithm-config", SET_STR, F(algorithm_config), "", 0, 0, "SGLang's name for --algorithm-config", NULL, NULL,
     SETTING_CLI_ONLY, NULL},
    {"dllm-algorithm", SET_STR, F(dllm_algorithm), "", 0, 0,
     "decoder of every request, by its name or SGLang's (LowConfidence = threshold, JointThreshold, HierarchyBlock); "
     "its parameters: --algorithm-config",
     "the model's", NULL, 0, NULL},
    {"cache", SET_STR, F(cache), "auto", 0, 0,
     "default KV cache of requests: auto (the model's generation_config.json, else dual) | none | prefix | dual | vicinity",
     NULL, NULL, 0, NULL},
    {"webhook-secret", SET_STR, F(webhook_secret), "", 0, 0, "HMAC-SHA256 key for job webhooks' X-Unmask-Signature",
     "$UNMASK_WEBHOOK_SECRET", NULL, SETTING_SECRET, NULL},
    {"webhook-attempts", SET_INT, F(webhook_attempts), "5", 1, 100, "webhook delivery attempts", NULL, NULL, 0, NULL},
    {"webhook-retry-base", SET_NUM, F(webhook_retry_base_s), "0.5", 1e-9, INF,
     "seconds before the first webhook retry, doubling", NULL, NULL, 0, NULL},
    {"webhook-timeout", SET_NUM, F(webhook_timeout_s), "5", 0.01, 600,
     "seconds one webhook attempt may take (resolve, connect, send, answer)", NULL, NULL, 0, NULL},
    {"webhook-allow", SET_STR, F(webhook_allow), "", 0, 0,
     "networks webhooks may reach besides globally reachable unicast addresses, e.g. 10.0.0.0/8,127.0.0.1 "
     "(private, loopback, link-local/metadata, reserved and other special-purpose addresses are refused "
     "otherwise, also when a name resolves to them)", NULL, NULL, 0, NULL},
    {"webhook-workers", SET_INT, F(webhook_workers), "4", 1, 64,
     "webhook delivery threads (one target holds one at most)", NULL, NULL, 0, NULL},
    {"served-model-name", SET_STR, F(served_model_name), "", 0, 0, "model id reported by /v1/models",
     "the model directory name", NULL, 0, NULL},
    {"max-gen-length", SET_INT, F(max_gen_length), "8192", 1, INF, "largest max_tokens / gen_length a request may ask",
     NULL, NULL, 0, NULL},
    {"max-prompt-tokens", SET_INT, F(max_prompt_tokens), "0", 0, INF, "largest prompt in tokens, 0 = the model's context",
     NULL, NULL, 0, NULL},
    {"max-jobs", SET_INT, F(max_jobs), "10000", 1, INF, "async jobs kept (finished ones expire oldest first)", NULL, NULL,
     0, NULL},
    {"jobs-max-bytes", SET_SIZE, F(jobs_max_bytes), "268435456", 1048576, INF,
     "async jobs' requests, results and event logs together, bytes (finished jobs are evicted first)", NULL, NULL, 0,
     NULL},
    {"job-attempts", SET_INT, F(job_attempts), "3", 1, 100, "engine attempts per async job before it fails", NULL, NULL,
     0, NULL},
    {"store", SET_STR, F(store), "sqlite", 0, 0,
     "where async jobs live: sqlite (DATA_DIR/jobs.db) | sqlite:PATH (durable: survive restarts and crashes; one server "
     "per file) | redis://HOST:PORT[/DB] (shared by every replica pointed at it: one queue, jobs readable on any) | "
     "memory (lost at exit)", NULL, NULL, 0, NULL},
    {"job-retention", SET_NUM, F(job_retention_s), "86400", 1, INF,
     "--store redis: seconds a finished job (result, event log) and an Idempotency-Key are kept", NULL, NULL, 0, NULL},
    {"job-capacity", SET_INT, F(job_capacity), "0", 0, 100000,
     "--store redis: unfinished jobs this replica takes from the shared queue at a time (0 = 2 x --max-batch: a batch running, the next ready)", NULL, NULL,
     0, NULL},
    {"data-dir", SET_STR, F(data_dir), "unmask-data", 0, 0, "directory of the default durable files (created)", NULL, NULL,
     0, NULL},
    {"shutdown-grace", SET_NUM, F(shutdown_grace_s), "30", 0, INF,
     "on SIGTERM: seconds to finish running work while refusing new requests with 503; 0 = stop at once", NULL, NULL, 0,
     NULL},
    {"key-max-generations", SET_INT, F(key_max_generations), "128", 0, INF,
     "generations queued or running per API key (or client address), HTTP + WebSocket + jobs; 0 = no limit", NULL,
     NULL, 0, NULL},
    {"key-max-sessions", SET_INT, F(key_max_sessions), "256", 0, INF,
     "WebSocket sessions alive per API key (or client address); 0 = no limit", NULL, NULL, 0, NULL},
    {"key-max-jobs", SET_INT, F(key_max_jobs), "1000", 0, INF,
     "async jobs not finished per API key (or client address); 0 = no limit", NULL, NULL, 0, NULL},
};
#undef F
#define N_SETTINGS (sizeof k_settings / sizeof k_settings[0])

/* The config-file key of s into buf (name with '_' for '-', or its own key). */
static const char *setting_key(const setting *s, char *buf, size_t cap) {
    if (s->key) return s->key;
    snprintf(buf, cap, "%s", s->name);
    for (char *p = buf; *p; p++)
        if (*p == '-') *p = '_';
    return buf;
}

static const setting *setting_by_flag(const char *name, size_t len) {
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (strlen(k_settings[i].name) == len && strncmp(k_settings[i].name, name, len) == 0) return &k_settings[i];
    return NULL;
}

/* --gpus 0,1 -> devices "cuda:0,cuda:1". */
static int parse_gpus(server_config *c, const setting *s, const char *text, um_err *err) {
    char list[512] = "";
    size_t at = 0;
    for (const char *p = text; *p && at < sizeof list - 16;) {
        size_t n = strcspn(p, ",");
        at += (size_t)snprintf(list + at, sizeof list - at, "%scuda:%.*s", at ? "," : "", (int)n, p);
        p += n + (p[n] == ',');
    }
    (void)err;
    server_config_set_str((char **)((char *)c + s->off), list);
    return 0;
}

/* Sets s's field from a flag value (the defaults are written the same way). */
static int setting_set_text(server_config *c, const setting *s, const char *v, um_err *err) {
    char *f = (char *)c + s->off;
    char *end;
    if (s->parse) return s->parse(c, s, v, err);
    switch (s->type) {
    case SET_STR: server_config_set_str((char **)f, v[0] ? v : NULL); return 0;
    case SET_INT:
    case SET_SIZE: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || *end || end == v || x < INT_MIN || x > INT_MAX)
            return um_err_param(err, s->name, "--%s expects an integer, got '%s'", s->name, v);
        if (s->type == SET_INT) *(int *)f = (int)x;
        else *(size_t *)f = x < 0 ? 0 : (size_t)x;
        return 0;
    }
    case SET_NUM: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || *end || end == v) return um_err_param(err, s->name, "--%s expects a number, got '%s'", s->name, v);
        *(double *)f = x;
        return 0;
    }
    case SET_ONOFF:
    case SET_FLAG:
        if (strcmp(v, "on") == 0 || strcmp(v, "1") == 0) *(int *)f = 1;
        else if (strcmp(v, "off") == 0 || strcmp(v, "0") == 0) *(int *)f = 0;
        else return um_err_param(err, s->name, "--%s must be on or off, got '%s'", s->name, v);
        return 0;
    }
    return 0;
}

/* Sets s's field from a config-file value. */
static int setting_set_json(server_config *c, const setting *s, json_t *v, const char *key, const char *label,
                            um_err *err) {
    char *f = (char *)c + s->off;
    switch (s->type) {
    case SET_STR:
        if (json_is_null(v)) {
            server_config_set_str((char **)f, NULL);
            return 0;
        }
        if (!json_is_string(v)) return um_err_param(err, key, "%s: \"%s\" must be a string", label, key);
        server_config_set_str((char **)f, json_string_value(v));
        return 0;
    case SET_INT:
        if (!json_is_integer(v) || json_integer_value(v) < -1000000000 || json_integer_value(v) > 1000000000)
            return um_err_param(err, key, "%s: \"%s\" must be an integer", label, key);
        *(int *)f = (int)json_integer_value(v);
        return 0;
    case SET_SIZE:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return um_err_param(err, key, "%s: \"%s\" must be a non-negative integer (bytes)", label, key);
        *(size_t *)f = (size_t)json_integer_value(v);
        return 0;
    case SET_NUM:
        if (!json_is_number(v)) return um_err_param(err, key, "%s: \"%s\" must be a number", label, key);
        *(double *)f = json_number_value(v);
        return 0;
    case SET_ONOFF:
    case SET_FLAG:
        if (!json_is_boolean(v)) return um_err_param(err, key, "%s: \"%s\" must be true or false", label, key);
        *(int *)f = json_is_true(v);
        return 0;
    }
    return 0;
}

/* The numeric value of s in c (for range checks and reports). */
static double setting_number(const server_config *c, const setting *s) {
    const char *f = (const char *)c + s->off;
    switch (s->type) {
    case SET_INT:
    case SET_ONOFF:
    case SET_FLAG: return *(const int *)f;
    case SET_SIZE: return (double)*(const size_t *)f;
    case SET_NUM: return *(const double *)f;
    case SET_STR: return 0;
    }
    return 0;
}

/* s's range check: "--name must be in [min, max], got v" (or ">= min"). */
static int setting_check_range(const server_config *c, const setting *s, um_err *err) {
    if (s->type == SET_STR || s->type == SET_ONOFF || s->type == SET_FLAG) return 0;
    double v = setting_number(c, s);
    if (v >= s->min && v <= s->max) return 0;
    char buf[64];
    const char *key = setting_key(s, buf, sizeof buf);
    if (s->max >= INF) return um_err_param(err, key, "--%s must be >= %.10g, got %.10g", s->name, s->min, v);
    return um_err_param(err, key, "--%s must be in [%.10g, %.10g], got %.10g", s->name, s->min, s->max, v);
}

void server_config_defaults(server_config *c) {
    memset(c, 0, sizeof *c);
    um_err err = {0};
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (!(k_settings[i].flags & SETTING_CLI_ONLY)) CHECK(setting_set_text(c, &k_settings[i], k_settings[i].def, &err) == 0);
}

void server_config_free(server_config *c) {
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (k_settings[i].type == SET_STR) server_config_set_str((char **)((char *)c + k_settings[i].off), NULL);
    if (c->file) json_decref(c->file);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- sources */

int server_config_apply_json(server_config *c, const char *text, size_t len, const char *label, um_err *err) {
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return um_err_set(err, UM_ERR_FORMAT, "%s:%d:%d: %s", label, je.line, je.column, je.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return um_err_set(err, UM_ERR_FORMAT, "%s: the config must be a JSON object", label);
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        const setting *s = NULL;
        char buf[64];
        for (size_t i = 0; i < N_SETTINGS && !s; i++)
            if (!(k_settings[i].flags & SETTING_CLI_ONLY) && strcmp(setting_key(&k_settings[i], buf, sizeof buf), key) == 0)
                s = &k_settings[i];
        if (!s) {
            if (key[0] != '_') log_warn("%s: unknown key \"%s\" ignored (see unmask serve --help)", label, key);
            continue;
        }
        if (setting_set_json(c, s, v, key, label, err) != 0) {
            json_decref(root);
            return -1;
        }
    }
    if (c->file) json_decref(c->file);
    c->file = root;
    return 0;
}

int server_config_load_file(server_config *c, const char *path, um_err *err) {
    char *text;
    size_t len;
    if (file_read_all(path, CONFIG_FILE_MAX_BYTES, &text, &len, err) != 0) return -1;
    int rc = server_config_apply_json(c, text, len, path, err);
    free(text);
    return rc;
}

static void print_help(const char *usage) {
    printf("%s\n\nOptions:\n", usage);
    printf("  %-26s %s\n", "--config S", "JSON config file [config/unmask.json if present]");
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting *s = &k_settings[i];
        const char *meta = s->type == SET_STR ? " S" : s->type == SET_NUM ? " X" : s->type == SET_ONOFF ? " on|off"
                         : s->type == SET_FLAG ? "" : " N";
        char left[64];
        snprintf(left, sizeof left, "--%s%s", s->name, meta);
        const char *d = s->def_doc ? s->def_doc : s->type == SET_FLAG ? "" : s->def;
        if (d[0]) printf("  %-26s %s [%s]\n", left, s->help, d);
        else printf("  %-26s %s\n", left, s->help);
    }
    printf("  %-26s %s\n", "--help", "show this help");
}

int server_config_from_args(server_config *c, int argc, char **argv, const char *usage, const char *default_config,
                            um_err *err) {
    const char *config = NULL;
    for (int pass = 0; pass < 2; pass++) {   /* 0: --help and --config; 1: apply the flags */
        if (pass == 1) {
            const char *path = config ? config : (default_config && file_exists(default_config) ? default_config : NULL);
            if (path && server_config_load_file(c, path, err) != 0) return -1;
        }
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
                print_help(usage);
                return 1;
            }
            if (strncmp(a, "--", 2) != 0)
                return um_err_set(err, UM_ERR_INVALID_ARG, "unexpected argument '%s' (see --help)", a);
            a += 2;
            const char *eq = strchr(a, '=');
            size_t nl = eq ? (size_t)(eq - a) : strlen(a);
            const setting *s = setting_by_flag(a, nl);
            int is_config = nl == 6 && strncmp(a, "config", 6) == 0;
            if (!s && !is_config) return um_err_set(err, UM_ERR_INVALID_ARG, "unknown option '--%.*s' (see --help)", (int)nl, a);
            if (s && s->type == SET_FLAG) {
                if (eq) return um_err_set(err, UM_ERR_INVALID_ARG, "--%s takes no value", s->name);
                if (pass == 1) *(int *)((char *)c + s->off) = 1;
                continue;
            }
            const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v) return um_err_set(err, UM_ERR_INVALID_ARG, "--%.*s needs a value", (int)nl, a);
            if (is_config) config = v;
            else if (pass == 1 && setting_set_text(c, s, v, err) != 0) return -1;
        }
    }
    return 0;
}

json_t *server_config_to_json(const server_config *c) {
    json_t *o = json_object();
    for (size_t i = 0; i < N_SETTINGS; i++) {
        const setting *s = &k_settings[i];
        if (s->flags & SETTING_CLI_ONLY) continue;
        char buf[64];
        const char *key = setting_key(s, buf, sizeof buf);
        const char *f = (const char *)c + s->off;
        json_t *v;
        if (s->type == SET_STR) {
            const char *str = *(char *const *)f;
            v = (s->flags & SETTING_SECRET) ? json_boolean(str && str[0]) : str ? json_string(str) : json_null();
        } else if (s->type == SET_ONOFF || s->type == SET_FLAG) {
            v = json_boolean(*(const int *)f);
        } else if (s->type == SET_NUM) {
            v = json_real(*(const double *)f);
        } else {
            v = json_integer((json_int_t)setting_number(c, s));
        }
        json_object_set_new(o, key, v);
    }
    return o;
}

/* --tp, --device/--gpus, --engines and the multi-node flags together. */
static int server_config_check_parallel(const server_config *c, um_err *err) {
    if (c->node_rank >= c->nnodes)
        return um_err_param(err, "node_rank", "--node-rank must be in [0, %d] (--nnodes %d), got %d", c->nnodes - 1,
                            c->nnodes, c->node_rank);
    const int cuda = server_config_is_cuda(c);
    if (c->nnodes > 1 || c->dist_init_addr) {
        if (!cuda)
            return um_err_set(err, UM_ERR_UNSUPPORTED,
                              "multi-node tensor parallelism needs CUDA + NCCL (--device cuda:N / --gpus); on the CPU "
                              "--tp runs threads of one process, without --nnodes/--dist-init-addr");
        if (c->nnodes > 1 && !c->dist_init_addr)
            return um_err_param(err, "dist_init_addr", "--nnodes %d needs --dist-init-addr host:port (node 0's address)",
                                c->nnodes);
        if (c->dist_init_addr) {
            comm_dist_opts o = {.init_addr = c->dist_init_addr, .nnodes = c->nnodes, .node_rank = c->node_rank};
            if (comm_dist_opts_check(&o, err) != 0) return -1;
        }
    }
    if (cuda) {
        int gpus = server_config_engine_count(c);
        if (c->tp % c->nnodes)
            return um_err_param(err, "tp", "--tp %d must be a multiple of --nnodes %d (the same number of GPUs per node)",
                                c->tp, c->nnodes);
        int per_node = c->tp / c->nnodes;
        if (per_node > gpus)
            return um_err_param(err, "tp", "--tp %d needs %d GPU%s on this node but --device/--gpus lists %d", c->tp,
                                per_node, per_node > 1 ? "s" : "", gpus);
        if (gpus % per_node)
            return um_err_param(err, "tp",
                                "--device/--gpus lists %d GPUs, not a multiple of --tp %d%s: every replica needs %d",
                                gpus, c->tp, c->nnodes > 1 ? " / --nnodes" : "", per_node);
        for (int i = 0; per_node > 1 && i < gpus; i++)   /* NCCL: one rank per GPU within a group */
            for (int j = i - i % per_node; j < i; j++) {
                char a[64], b[64];
                server_config_engine_device(c, i, a, sizeof a);
                server_config_engine_device(c, j, b, sizeof b);
                if (backend_device_same(a, b))
                    return um_err_param(err, "tp", "--tp %d: %s appears twice in one tensor-parallel group (GPUs %d..%d of "
                                        "--device/--gpus); each rank needs its own GPU", c->tp, a, j - j % per_node,
                                        j - j % per_node + per_node - 1);
            }
        if (c->nnodes > 1 && gpus != per_node)
            return um_err_param(err, "tp",
                                "multi-node: --tp %d over --nnodes %d is one replica of %d GPUs per node; --device/--gpus "
                                "lists %d",
                                c->tp, c->nnodes, per_node, gpus);
    } else if (c->tp > 1 && c->engines * c->tp > 256) {
        return um_err_param(err, "tp", "--engines %d x --tp %d = %d CPU ranks, at most 256", c->engines, c->tp,
                            c->engines * c->tp);
    }
    return 0;
}

int server_config_check(const server_config *c, um_err *err) {
    for (size_t i = 0; i < N_SETTINGS; i++)
        if (setting_check_range(c, &k_settings[i], err) != 0) return -1;
    if (!c->model || !c->model[0]) return um_err_param(err, "model", "--model: a checkpoint directory is required");
    if (!c->host || !c->host[0]) return um_err_param(err, "host", "--host must not be empty");
    if (!c->web_root || !c->web_root[0]) return um_err_param(err, "web_root", "--web-root must not be empty");
    if (!c->devices || !c->devices[0]) return um_err_param(err, "devices", "--device must not be empty");
    if (strcmp(c->devices, "cpu") != 0) {
        int n = server_config_engine_count(c);
        if (n > 64) return um_err_param(err, "devices", "--device lists %d GPUs, at most 64", n);
        for (int i = 0; i < n; i++) {
            char d[64];
            server_config_engine_device(c, i, d, sizeof d);
            if (backend_device_parse(d, NULL) != 1)
                return um_err_param(err, "devices", "--device must be cpu or a list like cuda:0,cuda:1; '%s' is not a GPU", d);
        }
    }
    if (server_config_check_parallel(c, err) != 0) return -1;
    enum decode_decoder dec;
    if (c->dllm_algorithm && decode_decoder_parse_any(c->dllm_algorithm, &dec) != 0) {
        char names[256];
        decode_decoder_list(names, sizeof names, ", ", " or ");
        return um_err_param(err, "dllm_algorithm",
                            "--dllm-algorithm must be LowConfidence, JointThreshold, HierarchyBlock or one of %s, got "
                            "'%.64s'", names, c->dllm_algorithm);
    }
    enum dtype quant;
    if (model_quant_parse(c->quant, &quant) != 0)
        return um_err_param(err, "quant", "--quant must be one of %s, got '%s'", MODEL_QUANT_NAMES,
                            c->quant ? c->quant : "");
    if (dtype_is_quant(quant) && server_config_is_cuda(c))
        return um_err_param(err, "quant",
                            "--quant %s: GPUs have no kernels for quantized weights yet; use --quant bf16 with --device "
                            "%s (quantized weights run on the CPU)", c->quant, c->devices);
    if (quant == DTYPE_F8_E4M3 && !server_config_is_cuda(c))
        return um_err_param(err, "quant", "--quant fp8 needs a CUDA device (Hopper FP8 weights); on the CPU use q8_0 or "
                            "q4_0");
    if (!!c->tls_cert != !!c->tls_key)
        return um_err_param(err, c->tls_cert ? "tls_key" : "tls_cert", "--tls-cert and --tls-key must be given together");
    if (c->tls_cert && !file_exists(c->tls_cert))
        return um_err_set(err, UM_ERR_IO, "--tls-cert: %s: no such file", c->tls_cert);
    if (c->tls_key && !file_exists(c->tls_key))
        return um_err_set(err, UM_ERR_IO, "--tls-key: %s: no such file", c->tls_key);
    return 0;
}

int server_config_check_model(const server_config *c, um_err *err) {
    if (c->tp <= 1 && c->max_seq <= 0) return 0;
    char path[4096];
    path_join(path, sizeof path, c->model, "config.json");
    char *text = NULL;
    size_t len = 0;
    um_err ignore = {0};
    if (file_read_all(path, 4u << 20, &text, &len, &ignore) != 0) return 0;
    model_config mc;
    int rc = model_config_parse(text, len, path, &mc, &ignore);
    free(text);
    if (rc != 0) return 0;   /* the loader reports a bad config.json with the rest of the checkpoint */
    if (c->tp > 1 && model_config_check_tp(&mc, c->model, c->tp, err) != 0) return -1;
    if (c->max_seq > mc.max_seq)
        return um_err_param(err, "max_seq",
                            "--max-seq %d exceeds the model's maximum sequence length %d (max_sequence_length in %s)",
                            c->max_seq, mc.max_seq, path);
    return 0;
}
