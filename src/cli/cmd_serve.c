/*
 * cmd_serve.c — `unmask serve`: settings from built-in defaults, then the JSON config file
 * (config/unmask.json or --config), then command-line flags; then server_run().
 * Not here: the server itself (server/). Main thread (it becomes the lws service thread).
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/comm.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "server/http_api.h"
#include "server/server.h"
#include "server/server_config.h"
#include "util/fileio.h"
#include "util/log.h"

static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A follower node's SIGINT/SIGTERM (runs on whichever thread the kernel picks; async-signal-safe):
 * the first asks node 0, over the liveness link, to stop the whole group (comm_stop_request; the
 * follower keeps serving until node 0's stop message, then exits 0), or interrupts the rendezvous;
 * a second one ends this node at once (exit 1; node 0 then reports it as disconnected). */
static atomic_int g_follow_signals;

static void on_follower_signal(int sig) {
    if (atomic_fetch_add(&g_follow_signals, 1) == 0) {
        comm_stop_request(sig);
        return;
    }
    static const char m[] = "unmask: second signal: exiting now\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    _exit(1);
}

static const char k_usage[] =
    "usage: unmask serve [--model DIR] [--port N] [options]\n"
    "\n"
    "Serves the browser UI (web/), the WebSocket protocol (ws[s]://HOST:PORT/ws, docs/protocol.md) and the\n"
    "HTTP routes (GET /health, GET /stats, ...) on one port. Prints the URL to open once listening;\n"
    "GET /health answers 503 {\"status\":\"loading\"} until the model is loaded, then 200 {\"status\":\"ok\"}.\n"
    "\n"
    "Settings come from built-in defaults, then the JSON config file (config/unmask.json when it exists,\n"
    "or --config FILE; keys are the option names with '_' for '-', e.g. \"max_batch\": 8,\n"
    "\"session_retention\": 120), then these flags. SIGINT/SIGTERM stop the server cleanly.\n"
    "\n"
    "Parallelism (docs/parallel.md): every GPU in --device/--gpus, or --engines on the CPU, is a data-parallel\n"
    "replica; --tp N splits each replica over N ranks (CPU: threads; GPUs: NCCL). Multi-node: run the same\n"
    "command on every node with --dist-init-addr HOST:PORT --nnodes N --node-rank R; node 0 serves HTTP, the\n"
    "others join, print that they joined and exit when node 0 stops (SIGINT/SIGTERM on a follower asks node 0\n"
    "to stop the whole group; a second signal ends the follower at once). Config keys: tp, dist_init_addr, nnodes,\n"
    "node_rank, max_seq, device_loop (true/false).";

int cmd_serve(int argc, char **argv) {
    const char *config = NULL, *model_dir = NULL, *host = NULL, *web_root = NULL, *tls_cert = NULL, *tls_key = NULL;
    const char *device = NULL, *gpus = NULL, *dist_addr = NULL, *device_loop = NULL;
    int tp = INT_MIN, nnodes = INT_MIN, node_rank = INT_MIN, max_seq = INT_MIN;
    int port = INT_MIN, threads = INT_MIN, engines = INT_MIN, max_batch = INT_MIN, max_queue = INT_MIN;
    int max_bytes = INT_MIN, max_events = INT_MIN, max_sessions = INT_MIN, max_gens = INT_MIN, max_msg = INT_MIN;
    int ping = INT_MIN, verbose = 0;
    double retention = NAN;
    http_api_flags hf;   /* the HTTP APIs' own settings (server/http_api.h) */
    http_api_flags_init(&hf);
    arg_spec specs[] = {
        {"config", ARG_STR, &config, "JSON config file [config/unmask.json if present]"},
        {"model", ARG_STR, &model_dir, "checkpoint directory [models/bundled]"},
        {"host", ARG_STR, &host, "listen address: 127.0.0.1, 0.0.0.0, ::, localhost [127.0.0.1]"},
        {"port", ARG_INT, &port, "listen port, 0 = any free port (printed) [8080]"},
        {"web-root", ARG_STR, &web_root, "directory of the browser UI [web]"},
        {"threads", ARG_INT, &threads, "CPU compute threads in total, 0 = all cores [0]"},
        {"engines", ARG_INT, &engines, "CPU engine threads [1]"},
        {"device", ARG_STR, &device, "cpu, or GPUs cuda:0,cuda:1,... (one engine = model replica per GPU) [cpu]"},
        {"gpus", ARG_STR, &gpus, "shorthand for --device: 0,1 = cuda:0,cuda:1"},
        {"tp", ARG_INT, &tp,
         "tensor-parallel ranks per replica: CPU threads, or GPUs (--gpus 0,1,2,3 --tp 2 = 2 replicas of 2) [1]"},
        {"dist-init-addr", ARG_STR, &dist_addr, "multi-node TP (CUDA + NCCL): host:port node 0 listens on for the others"},
        {"nnodes", ARG_INT, &nnodes, "multi-node TP: nodes in the group, --tp / --nnodes GPUs each [1]"},
        {"node-rank", ARG_INT, &node_rank, "multi-node TP: this node, 0 = serves HTTP, others follow [0]"},
        {"max-seq", ARG_INT, &max_seq,
         "longest prompt + gen (+ suffix) per request, tokens; sizes GPU buffers [the model's maximum]"},
        {"max-batch", ARG_INT, &max_batch, "sequences per decode step per engine [8]"},
        {"device-loop", ARG_STR, &device_loop,
         "CUDA: on = device-resident decode loop where supported, off = host loop (docs/decode.md) [on]"},
        {"max-queue", ARG_INT, &max_queue, "requests waiting beyond free batch slots; more -> queue_full [256]"},
        {"session-retention", ARG_FLOAT, &retention, "seconds a disconnected session (and its generations) lives [120]"},
        {"session-max-bytes", ARG_INT, &max_bytes, "per-session event buffer, bytes [8388608]"},
        {"session-max-events", ARG_INT, &max_events, "per-session event buffer, events [8192]"},
        {"max-sessions", ARG_INT, &max_sessions, "sessions alive at once, connected + retained [1024]"},
        {"max-session-generations", ARG_INT, &max_gens, "running generations per session [16]"},
        {"max-message-bytes", ARG_INT, &max_msg, "largest WebSocket message / HTTP body, bytes [1048576]"},
        {"ping-interval", ARG_INT, &ping, "seconds of silence before a WebSocket ping; hang up 10 s later [30]"},
        {"tls-cert", ARG_STR, &tls_cert, "PEM certificate (chain): serve https:// and wss:// (TLS 1.2+)"},
        {"tls-key", ARG_STR, &tls_key, "PEM private key for --tls-cert"},
        {"verbose", ARG_FLAG, &verbose, "debug logging (also libwebsockets warnings)"},
        {"api-keys", ARG_STR, &hf.api_keys, "file of API keys, one per line; none = open access"},
        {"rate-limit", ARG_FLOAT, &hf.rate_limit, "HTTP requests per second per API key (or client address); 0 = off [0]"},
        {"rate-burst", ARG_FLOAT, &hf.rate_burst, "rate-limit burst (bucket size) [2 x rate, at least 1]"},
        {"cors-origin", ARG_STR, &hf.cors_origin, "allowed browser Origin for the HTTP APIs ('*' = any); none = no CORS"},
        {"algorithm-config", ARG_STR, &hf.algorithm_config,
         "server-wide decoder defaults, YAML (flat key: value) or JSON, like SGLang's --dllm-algorithm-config"},
        {"cache", ARG_STR, &hf.cache,
         "default KV cache of requests: auto (the model's generation_config.json, else dual) | none | prefix | dual | "
         "vicinity [auto]"},
        {"webhook-secret", ARG_STR, &hf.webhook_secret,
         "HMAC-SHA256 key for job webhooks' X-Unmask-Signature [$UNMASK_WEBHOOK_SECRET]"},
        {"webhook-attempts", ARG_INT, &hf.webhook_attempts, "webhook delivery attempts [5]"},
        {"webhook-retry-base", ARG_FLOAT, &hf.webhook_retry_base, "seconds before the first webhook retry, doubling [0.5]"},
        {"served-model-name", ARG_STR, &hf.served_model_name, "model id reported by /v1/models [the model directory name]"},
        {"max-gen-length", ARG_INT, &hf.max_gen_length, "largest max_tokens / gen_length a request may ask [8192]"},
        {"max-prompt-tokens", ARG_INT, &hf.max_prompt_tokens, "largest prompt in tokens, 0 = the model's context [0]"},
        {"max-jobs", ARG_INT, &hf.max_jobs, "async jobs kept (finished ones expire oldest first) [10000]"},
        {"job-attempts", ARG_INT, &hf.job_attempts, "engine attempts per async job before it fails [3]"},
        {"shutdown-grace", ARG_FLOAT, &hf.shutdown_grace,
         "on SIGTERM: seconds to finish running work while refusing new requests with 503; 0 = stop at once [30]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv, k_usage, specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (device_loop && strcmp(device_loop, "on") != 0 && strcmp(device_loop, "off") != 0) {
        fprintf(stderr, "error: --device-loop must be on or off, got '%s'\n", device_loop);
        return 2;
    }

    server_config cfg;
    server_config_defaults(&cfg);
    um_err err = {0};
    const char *cfg_path = config;
    char fallback[4096];
    if (!cfg_path) {
        if (file_exists("config/unmask.json")) cfg_path = "config/unmask.json";
    }
    if (cfg_path && server_config_load_file(&cfg, cfg_path, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return 2;
    }
    int web_root_given = web_root != NULL || (cfg.file && json_object_get(cfg.file, "web_root"));
    if (model_dir) server_config_set_str(&cfg.model, model_dir);
    if (host) server_config_set_str(&cfg.host, host);
    if (web_root) server_config_set_str(&cfg.web_root, web_root);
    if (tls_cert) server_config_set_str(&cfg.tls_cert, tls_cert);
    if (tls_key) server_config_set_str(&cfg.tls_key, tls_key);
    if (port != INT_MIN) cfg.port = port;
    if (threads != INT_MIN) cfg.threads = threads;
    if (engines != INT_MIN) cfg.engines = engines;
    if (device) server_config_set_str(&cfg.devices, device);
    if (gpus) {
        char list[512] = "";
        size_t at = 0;
        for (const char *p = gpus; *p && at < sizeof list - 16;) {
            size_t n = strcspn(p, ",");
            at += (size_t)snprintf(list + at, sizeof list - at, "%scuda:%.*s", at ? "," : "", (int)n, p);
            p += n + (p[n] == ',');
        }
        server_config_set_str(&cfg.devices, list);
    }
    if (tp != INT_MIN) cfg.tp = tp;
    if (dist_addr) server_config_set_str(&cfg.dist_init_addr, dist_addr);
    if (nnodes != INT_MIN) cfg.nnodes = nnodes;
    if (node_rank != INT_MIN) cfg.node_rank = node_rank;
    if (max_seq != INT_MIN) cfg.max_seq = max_seq;
    if (max_batch != INT_MIN) cfg.max_batch = max_batch;
    if (device_loop) cfg.device_loop = strcmp(device_loop, "on") == 0;
    if (max_queue != INT_MIN) cfg.max_queue = max_queue;
    if (!isnan(retention)) cfg.session_retention_s = retention;
    if (max_bytes != INT_MIN) cfg.session_max_bytes = max_bytes < 0 ? 0 : (size_t)max_bytes;
    if (max_events != INT_MIN) cfg.session_max_events = max_events;
    if (max_sessions != INT_MIN) cfg.max_sessions = max_sessions;
    if (max_gens != INT_MIN) cfg.max_session_generations = max_gens;
    if (max_msg != INT_MIN) cfg.max_message_bytes = max_msg < 0 ? 0 : (size_t)max_msg;
    if (ping != INT_MIN) cfg.ping_interval_s = ping;
    if (verbose) cfg.verbose = 1;
    /* the UI ships with the sources: when run from elsewhere, fall back to the source tree's web/ */
    if (!web_root_given && !is_dir(cfg.web_root)) {
        path_join(fallback, sizeof fallback, UNMASK_SOURCE_DIR, "web");
        if (is_dir(fallback)) server_config_set_str(&cfg.web_root, fallback);
    }
    if (server_config_check(&cfg, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return 2;
    }
    if (server_config_check_model(&cfg, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return 2;
    }
    if (cfg.node_rank > 0) {   /* a follower node: no HTTP, serves its ranks until node 0 stops */
        if (cfg.verbose) log_level_set(LOG_LEVEL_DEBUG);
        comm_stop_init();
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_follower_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        int frc = server_follow(&cfg, &err);
        if (frc != 0) fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return frc;
    }
    if (cfg.verbose) log_level_set(LOG_LEVEL_DEBUG);
    if (!is_dir(cfg.model)) {
        fprintf(stderr, "error: --model %s: no such checkpoint directory (make one with: unmask make-model --out %s)\n",
                cfg.model, cfg.model);
        server_config_free(&cfg);
        return 2;
    }
    if (http_api_configure(&cfg, &hf, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return 2;
    }
    int rc = server_run(&cfg, &err);
    if (rc != 0) fprintf(stderr, "error: %s\n", err.msg);
    http_api_shutdown();
    server_config_free(&cfg);
    return rc;
}
