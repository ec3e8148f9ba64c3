/*
 * cmd_serve.c — `unmask serve`: settings from built-in defaults, then the JSON config file
 * (config/unmask.json or --config), then command-line flags; then server_run().
 * Not here: the server itself (server/). Main thread (it becomes the lws service thread).
 */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/comm.h"
#include "cli/cli.h"
#include "cli/tp_cli.h"
#include "model/model.h"
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
    "\"session_retention\": 120, \"device_loop\": false; --device is \"devices\"), then these flags.\n"
    "SIGINT/SIGTERM stop the server cleanly.\n"
    "\n"
    "Parallelism (docs/parallel.md): every GPU in --device/--gpus, or --engines on the CPU, is a data-parallel\n"
    "replica; --tp N splits each replica over N ranks (CPU: threads; GPUs: NCCL). Multi-node: run the same\n"
    "command on every node with --dist-init-addr HOST:PORT --nnodes N --node-rank R; node 0 serves HTTP, the\n"
    "others join, print that they joined and exit when node 0 stops (SIGINT/SIGTERM on a follower asks node 0\n"
    "to stop the whole group; a second signal ends the follower at once).\n"
    "\n"
    "--cpu-kernels auto|amx|avx512bf16|avx2|fp32: the CPU backend's matrix kernels for bf16 weights\n"
    "(docs/cpu-kernels.md) [auto: per product by shape and ISA: amx, else avx512bf16; with AVX2 only,\n"
    "avx2 for products of few rows and fp32 above a measured row count].";

int cmd_serve(int argc, char **argv) {
    if (cli_cpu_kernels_take(&argc, argv) != 0) return 2;   /* not a server setting: the process's CPU kernels */
    server_config cfg;
    server_config_defaults(&cfg);
    um_err err = {0};
    int r = server_config_from_args(&cfg, argc, argv, k_usage, "config/unmask.json", &err);
    if (r != 0) {
        if (r < 0) fprintf(stderr, "error: %s\n", err.msg);
        server_config_free(&cfg);
        return r > 0 ? 0 : 2;
    }
    /* the UI ships with the sources: when run from elsewhere and no web root was chosen, fall back
     * to the source tree's web/ */
    char fallback[4096];
    if (strcmp(cfg.web_root, "web") == 0 && !is_dir(cfg.web_root)) {
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
    if (model_dir_check(cfg.model, &err) != 0) { /* before listening: nothing is printed for a wrong path */
        fprintf(stderr, "error: --model: %s\n", err.msg);
        server_config_free(&cfg);
        return 2;
    }
    server *srv = server_create(&cfg, &err);
    http_api *api = srv ? http_api_create(srv, &err) : NULL;
    if (!api) {
        fprintf(stderr, "error: %s\n", err.msg);
        server_free(srv);
        server_config_free(&cfg);
        return 2;
    }
    int rc = server_run(srv, &err);
    if (rc != 0) fprintf(stderr, "error: %s\n", err.msg);
    http_api_free(api);
    server_free(srv);
    server_config_free(&cfg);
    return rc;
}
