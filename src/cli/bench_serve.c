/*
 * bench_serve.c — `unmask bench --serve`: end-to-end WebSocket serving benchmark. For each
 * --clients value it starts a fresh `unmask serve` (this binary, --port 0, fresh counters), drives
 * it with scripts/bench_serve.mjs (N WebSocket clients, closed loop, npm `ws`), reads the server's
 * own GET /stats (event overhead: engine produced the event -> its frame handed to lws_write;
 * batch sizes; step times) and prints one table row. With --url it measures an already running
 * server instead (its counters are cumulative then).
 *
 * Does not: check correctness (tests do). Main thread; child processes: the server, node.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "cli/args.h"
#include "cli/bench.h"
#include "util/fileio.h"
#include "util/log.h"
#include "util/timeutil.h"

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* GET path from 127.0.0.1:port; returns the malloc'd body of a 200 answer, else NULL. */
static char *http_get_local(int port, const char *path) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return NULL;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return NULL;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return NULL;
    }
    size_t cap = 8192, len = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) buf = xrealloc(buf, (cap *= 2) + 1);
        ssize_t r = read(fd, buf + len, cap - len);
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || !body) {
        free(buf);
        return NULL;
    }
    char *out = xstrdup(body + 4);
    free(buf);
    return out;
}

typedef struct child {
    pid_t pid;
    int   out_fd;   /* its stdout */
} child;

/* Runs argv with its stdout on a pipe (c->out_fd) and its stderr on err_fd (-1: ours). */
static int spawn(const char *const *argv, child *c, int err_fd) {
    int p[2];
    if (pipe(p) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        if (err_fd >= 0) dup2(err_fd, 2);
        execvp(argv[0], (char *const *)argv);
        fprintf(stderr, "error: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(p[1]);
    c->pid = pid;
    c->out_fd = p[0];
    return 0;
}

/* Read c's stdout until EOF (node) — or until `until` appears (server), with a timeout. */
static char *read_output(child *c, const char *until, double timeout_s) {
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap + 1);
    buf[0] = 0;
    uint64_t t0 = time_now_ns();
    for (;;) {
        if (until && strstr(buf, until)) break;
        if (time_ms_since(t0) > timeout_s * 1000) break;
        fd_set rf;
        FD_ZERO(&rf);
        FD_SET(c->out_fd, &rf);
        struct timeval tv = {0, 200000};
        int r = select(c->out_fd + 1, &rf, NULL, NULL, &tv);
        if (r < 0 && errno != EINTR) break;
        if (r <= 0) continue;
        if (len + 1024 > cap) buf = xrealloc(buf, (cap *= 2) + 1);
        ssize_t n = read(c->out_fd, buf + len, cap - len);
        if (n <= 0) break;
        len += (size_t)n;
        buf[len] = 0;
    }
    return buf;
}

static void stop_child(child *c) {
    if (c->pid <= 0) return;
    kill(c->pid, SIGTERM);
    for (int i = 0; i < 200; i++) { /* 10 s, then SIGKILL */
        if (waitpid(c->pid, NULL, WNOHANG) == c->pid) goto done;
        sleep_ms(50);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
done:
    close(c->out_fd);
    c->pid = 0;
}

static double jnum(json_t *o, const char *a, const char *b) {
    json_t *v = json_object_get(o, a);
    if (b) v = json_object_get(v, b);
    return json_number_value(v);
}

/* Flags of `bench --serve`, the parsed --clients list and the paths the runs need. */
typedef struct bs_opts {
    const char *model_dir, *clients_s, *url;
    int  requests, gen, block, steps, max_batch, threads, drafts, serve_flag, eos;
    int *clients;   /* [n_rows], owned */
    int  n_rows;
    char script[PATH_MAX], self[PATH_MAX], web[PATH_MAX];
} bs_opts;

/* Parses argv into o (defaults first). -1 to go on, else the exit code (0 after --help, 2 on error). */
static int bs_opts_parse(bs_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->clients_s = "1,8,32";
    o->requests = 4, o->gen = 32, o->block = 8, o->max_batch = 8;
    arg_spec specs[] = {
        {"serve", ARG_FLAG, &o->serve_flag, "(mode selector)"},
        {"model", ARG_STR, &o->model_dir, "checkpoint directory or GGUF file (required unless --url)"},
        {"clients", ARG_STR, &o->clients_s, "comma-separated numbers of concurrent WebSocket clients [1,8,32]"},
        {"requests", ARG_INT, &o->requests, "generations per client, one after another [4]"},
        {"gen-length", ARG_INT, &o->gen, "gen_length per request [32]"},
        {"block-length", ARG_INT, &o->block, "block_length [8]"},
        {"steps", ARG_INT, &o->steps, "steps, 0 = gen-length [0]"},
        {"drafts", ARG_FLAG, &o->drafts, "stream drafts (bigger step frames)"},
        {"eos", ARG_FLAG, &o->eos, "allow early stop at EOS (default: EOS disabled, every request generates gen-length tokens)"},
        {"max-batch", ARG_INT, &o->max_batch, "server --max-batch [8]"},
        {"threads", ARG_INT, &o->threads, "server --threads, 0 = all cores [0]"},
        {"url", ARG_STR, &o->url, "measure a running server at ws://HOST:PORT/ws instead of starting one"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --serve --model DIR [--clients 1,8,32] [--requests N] [options]\n\n"
                       "End-to-end WebSocket serving benchmark: tokens/s, first-event latency and the server's\n"
                       "per-event overhead for N concurrent clients (needs node + npm ws from tests/node_modules).",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    return -1;
}

/* Checks the flags, parses --clients and finds this executable and the load script. 0, or the
 * exit code with the message printed (2: bad flags, 1: a file is missing). */
static int bs_opts_validate(bs_opts *o) {
    if (!o->model_dir && !o->url) {
        fprintf(stderr, "error: --model DIR (or --url) is required\n");
        return 2;
    }
    if (o->requests < 1 || o->gen < 1 || o->block < 1 || o->max_batch < 1) {
        fprintf(stderr, "error: --requests, --gen-length, --block-length and --max-batch must be >= 1\n");
        return 2;
    }
    o->n_rows = args_parse_int_list("clients", o->clients_s, &o->clients);
    if (o->n_rows < 0) return 2;
    for (int i = 0; i < o->n_rows; i++)
        if (o->clients[i] < 1 || o->clients[i] > 10000) {
            fprintf(stderr, "error: --clients values must be in [1, 10000]\n");
            return 2;
        }
    path_join(o->script, sizeof o->script, UNMASK_SOURCE_DIR, "scripts/bench_serve.mjs");
    path_join(o->web, sizeof o->web, UNMASK_SOURCE_DIR, "web");
    ssize_t sl = readlink("/proc/self/exe", o->self, sizeof o->self - 1);
    if (sl <= 0) {
        fprintf(stderr, "error: cannot find this executable\n");
        return 1;
    }
    o->self[sl] = 0;
    if (!file_exists(o->script)) {
        fprintf(stderr, "error: %s is missing\n", o->script);
        return 1;
    }
    return 0;
}

/* Prints the benchmark's header lines and the table's column names. */
static void bs_print_header(const bs_opts *o) {
    printf("serve benchmark: %s, %d request%s/client of gen_length %d (block %d, steps %s), drafts %s, EOS %s\n",
           o->url ? o->url : o->model_dir, o->requests, o->requests == 1 ? "" : "s", o->gen, o->block,
           o->steps ? "fixed" : "= gen_length", o->drafts ? "on" : "off", o->eos ? "allowed" : "disabled");
    printf("server: --max-batch %d --threads %d; latencies measured by the clients from sending `generate`\n\n",
           o->max_batch, o->threads);
    printf("%8s %6s %7s %8s %9s %8s %13s %13s %13s %9s %8s %8s\n", "clients", "reqs", "tokens", "wall s", "tokens/s",
           "req/s", "accepted p50", "1st step p50", "1st step p99", "ev p50 us", "ev p99", "batch");
    printf("%8s %6s %7s %8s %9s %8s %13s %13s %13s %9s %8s %8s\n", "", "", "", "", "", "", "ms", "ms", "ms", "", "us",
           "mean");
}

/* Starts a fresh `unmask serve` and waits for its /health. 0 with *port and wsurl set, or 1 with the
 * message printed (the child stopped). */
static int bs_server_start(const bs_opts *o, child *srv, int *port, char *wsurl, size_t wsurl_size) {
    char mb[16], th[16];
    snprintf(mb, sizeof mb, "%d", o->max_batch);
    snprintf(th, sizeof th, "%d", o->threads);
    /* its own job store in memory: a bench must not need (or touch) the default store, which a
     * running `unmask serve` in the same directory holds locked */
    const char *sargv[] = {o->self,      "serve", "--model", o->model_dir, "--port", "0", "--host", "127.0.0.1",
                           "--web-root", o->web,  "--max-batch", mb,       "--threads", th, "--max-queue", "100000",
                           "--max-session-generations", "64", "--store", "memory", NULL};
    FILE *log = tmpfile(); /* the child's stderr: shown when it does not start */
    if (!log || spawn(sargv, srv, fileno(log)) != 0) {
        fprintf(stderr, "error: cannot start the server\n");
        if (log) fclose(log);
        return 1;
    }
    char *out = read_output(srv, "/  (open", 30);
    const char *p = strstr(out, "127.0.0.1:");
    *port = p ? atoi(p + 10) : 0;
    free(out);
    if (*port <= 0) {
        stop_child(srv);
        char msg[2048] = "";
        fflush(log);
        long end = (fseek(log, 0, SEEK_END), ftell(log));
        fseek(log, end > (long)sizeof msg - 1 ? end - (long)sizeof msg + 1 : 0, SEEK_SET);
        size_t n = fread(msg, 1, sizeof msg - 1, log);
        msg[n] = 0;
        while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
        fprintf(stderr, "error: the server did not start%s%s\n", n ? "; it said:\n" : " (and said nothing)", msg);
        fclose(log);
        return 1;
    }
    fclose(log); /* its later logs go to the unlinked file until it exits */
    char *h = NULL;
    for (int i = 0; i < 1200 && !(h = http_get_local(*port, "/health")); i++) sleep_ms(50);
    free(h);
    snprintf(wsurl, wsurl_size, "ws://127.0.0.1:%d/ws", *port);
    return 0;
}

/* Runs the node load generator with n_clients clients against wsurl; its JSON result, or NULL when
 * it failed. */
static json_t *bs_run_load(const bs_opts *o, const char *wsurl, int n_clients) {
    char nc[16], nr[16], ng[16], nb[16], ns[16];
    snprintf(nc, sizeof nc, "%d", n_clients);
    snprintf(nr, sizeof nr, "%d", o->requests);
    snprintf(ng, sizeof ng, "%d", o->gen);
    snprintf(nb, sizeof nb, "%d", o->block);
    snprintf(ns, sizeof ns, "%d", o->steps);
    const char *nargv[] = {"node", o->script, "--url", wsurl, "--clients", nc, "--requests", nr, "--gen-length", ng,
                           "--block-length", nb, "--steps", ns, o->drafts ? "--drafts" : NULL, NULL, NULL};
    int k = o->drafts ? 15 : 14;
    if (o->eos) nargv[k++] = "--eos";
    nargv[k] = NULL;
    child node = {0};
    json_t *res = NULL;
    if (spawn(nargv, &node, -1) == 0) {
        char *out = read_output(&node, NULL, 3600);
        int st = 0;
        waitpid(node.pid, &st, 0);
        close(node.out_fd);
        json_error_t je;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) res = json_loads(out, 0, &je);
        free(out);
    }
    return res;
}

/* Prints one table row from the load generator's result and the server's /stats (NULL = none). */
static void bs_print_row(int n_clients, json_t *res, json_t *stats) {
    printf("%8d %6d %7d %8.2f %9.1f %8.2f %13.2f %13.2f %13.2f %9.0f %8.0f %8.2f\n", n_clients,
           (int)jnum(res, "requests", NULL), (int)jnum(res, "tokens", NULL), jnum(res, "wall_s", NULL),
           jnum(res, "tokens_per_s", NULL), jnum(res, "requests_per_s", NULL), jnum(res, "accepted_ms", "p50"),
           jnum(res, "first_step_ms", "p50"), jnum(res, "first_step_ms", "p99"),
           stats ? jnum(stats, "events", "p50_us") : 0, stats ? jnum(stats, "events", "p99_us") : 0,
           stats ? jnum(stats, "scheduler", "mean_batch") : 0);
    if (jnum(res, "failed", NULL) > 0) {
        char *e = json_dumps(json_object_get(res, "errors"), JSON_COMPACT);
        printf("         %d requests failed: %s\n", (int)jnum(res, "failed", NULL), e ? e : "?");
        free(e);
    }
    fflush(stdout);
}

/* One table row: a fresh server (unless --url), the load, its /stats. 0, or 1 with the message printed. */
static int bs_run_row(const bs_opts *o, int n_clients) {
    child srv = {0};
    int port = 0;
    char wsurl[256];
    if (o->url) {
        snprintf(wsurl, sizeof wsurl, "%s", o->url);
        const char *colon = strrchr(o->url, ':');
        port = colon ? atoi(colon + 1) : 0;
    } else if (bs_server_start(o, &srv, &port, wsurl, sizeof wsurl) != 0) {
        return 1;
    }
    json_t *res = bs_run_load(o, wsurl, n_clients);
    char *stats_s = port > 0 ? http_get_local(port, "/stats") : NULL;
    json_t *stats = stats_s ? json_loads(stats_s, 0, NULL) : NULL;
    free(stats_s);
    if (!o->url) stop_child(&srv);
    if (!res) {
        fprintf(stderr, "error: the load generator failed (node and npm ws from tests/node_modules are needed)\n");
        json_decref(stats);
        return 1;
    }
    bs_print_row(n_clients, res, stats);
    json_decref(res);
    json_decref(stats);
    return 0;
}

int bench_serve(int argc, char **argv) {
    bs_opts o;
    int r = bs_opts_parse(&o, argc, argv);
    if (r >= 0) return r;
    if ((r = bs_opts_validate(&o)) != 0) {
        free(o.clients);
        return r;
    }
    bs_print_header(&o);
    int rc = 0;
    for (int row = 0; row < o.n_rows && rc == 0; row++) rc = bs_run_row(&o, o.clients[row]);
    free(o.clients);
    if (rc == 0)
        printf("\ntokens/s: generated tokens of all clients / wall time. ev p50/p99: server-side overhead per event\n"
               "(engine produced it -> frame written), from GET /stats. batch: mean sequences per decode step.\n");
    return rc;
}
