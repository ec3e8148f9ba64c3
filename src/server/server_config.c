/*
 * server_config.c — defaults, JSON config file, validation for `unmask serve`.
 * Not here: flag parsing (cli/cmd_serve.c). Main thread only, before the server starts.
 */
#include "server/server_config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "model/config.h"
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

void server_config_defaults(server_config *c) {
    memset(c, 0, sizeof *c);
    server_config_set_str(&c->model, "models/bundled");
    server_config_set_str(&c->host, "127.0.0.1");
    c->port = 8080;
    server_config_set_str(&c->web_root, "web");
    c->threads = 0;
    c->engines = 1;
    server_config_set_str(&c->devices, "cpu");
    c->tp = 1;
    c->nnodes = 1;
    c->node_rank = 0;
    c->max_seq = 0;
    c->device_loop = 1;
    c->max_batch = 8;
    c->max_queue = 256;
    c->session_retention_s = 120.0;
    c->session_max_bytes = 8u << 20;
    c->session_max_events = 8192;
    c->max_sessions = 1024;
    c->max_session_generations = 16;
    c->max_message_bytes = 1u << 20;
    c->ping_interval_s = 30;
}

void server_config_free(server_config *c) {
    free(c->model);
    free(c->host);
    free(c->web_root);
    free(c->devices);
    free(c->dist_init_addr);
    free(c->tls_cert);
    free(c->tls_key);
    if (c->file) json_decref(c->file);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- JSON keys */

enum key_kind { K_STR, K_INT, K_SIZE, K_SECONDS, K_BOOL };

typedef struct key_spec {
    const char   *name;
    enum key_kind kind;
    size_t        off;
} key_spec;

#define F(field) offsetof(server_config, field)
static const key_spec k_keys[] = {
    {"model", K_STR, F(model)},
    {"host", K_STR, F(host)},
    {"port", K_INT, F(port)},
    {"web_root", K_STR, F(web_root)},
    {"threads", K_INT, F(threads)},
    {"engines", K_INT, F(engines)},
    {"devices", K_STR, F(devices)},
    {"tp", K_INT, F(tp)},
    {"dist_init_addr", K_STR, F(dist_init_addr)},
    {"nnodes", K_INT, F(nnodes)},
    {"node_rank", K_INT, F(node_rank)},
    {"max_seq", K_INT, F(max_seq)},
    {"max_batch", K_INT, F(max_batch)},
    {"device_loop", K_BOOL, F(device_loop)},
    {"max_queue", K_INT, F(max_queue)},
    {"session_retention", K_SECONDS, F(session_retention_s)},
    {"session_max_bytes", K_SIZE, F(session_max_bytes)},
    {"session_max_events", K_INT, F(session_max_events)},
    {"max_sessions", K_INT, F(max_sessions)},
    {"max_session_generations", K_INT, F(max_session_generations)},
    {"max_message_bytes", K_SIZE, F(max_message_bytes)},
    {"ping_interval", K_INT, F(ping_interval_s)},
    {"tls_cert", K_STR, F(tls_cert)},
    {"tls_key", K_STR, F(tls_key)},
    {"verbose", K_BOOL, F(verbose)},
};
#undef F

static int apply_key(server_config *c, const key_spec *k, json_t *v, const char *label, um_err *err) {
    char *base = (char *)c;
    switch (k->kind) {
    case K_STR:
        if (json_is_null(v)) {
            server_config_set_str((char **)(base + k->off), NULL);
            return 0;
        }
        if (!json_is_string(v)) return um_err_param(err, k->name, "%s: \"%s\" must be a string", label, k->name);
        server_config_set_str((char **)(base + k->off), json_string_value(v));
        return 0;
    case K_INT:
        if (!json_is_integer(v) || json_integer_value(v) < -1000000000 || json_integer_value(v) > 1000000000)
            return um_err_param(err, k->name, "%s: \"%s\" must be an integer", label, k->name);
        *(int *)(base + k->off) = (int)json_integer_value(v);
        return 0;
    case K_SIZE:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return um_err_param(err, k->name, "%s: \"%s\" must be a non-negative integer (bytes)", label, k->name);
        *(size_t *)(base + k->off) = (size_t)json_integer_value(v);
        return 0;
    case K_SECONDS:
        if (!json_is_number(v))
            return um_err_param(err, k->name, "%s: \"%s\" must be a number of seconds", label, k->name);
        *(double *)(base + k->off) = json_number_value(v);
        return 0;
    case K_BOOL:
        if (!json_is_boolean(v)) return um_err_param(err, k->name, "%s: \"%s\" must be true or false", label, k->name);
        *(int *)(base + k->off) = json_is_true(v);
        return 0;
    }
    return 0;
}

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
        const key_spec *k = NULL;
        for (size_t i = 0; i < sizeof k_keys / sizeof k_keys[0]; i++)
            if (strcmp(k_keys[i].name, key) == 0) k = &k_keys[i];
        if (!k) {
            if (key[0] != '_') log_debug("%s: key \"%s\" is not a server key (left to other modules)", label, key);
            continue;
        }
        if (apply_key(c, k, v, label, err) != 0) {
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

/* --tp, --device/--gpus, --engines and the multi-node flags together. */
static int server_config_check_parallel(const server_config *c, um_err *err) {
    if (c->tp < 1 || c->tp > 64) return um_err_param(err, "tp", "--tp must be in [1, 64], got %d", c->tp);
    if (c->nnodes < 1 || c->nnodes > 64) return um_err_param(err, "nnodes", "--nnodes must be in [1, 64], got %d", c->nnodes);
    if (c->node_rank < 0 || c->node_rank >= c->nnodes)
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
    if (!c->model || !c->model[0]) return um_err_param(err, "model", "--model: a checkpoint directory is required");
    if (!c->host || !c->host[0]) return um_err_param(err, "host", "--host must not be empty");
    if (c->port < 0 || c->port > 65535) return um_err_param(err, "port", "--port must be in [0, 65535], got %d", c->port);
    if (!c->web_root || !c->web_root[0]) return um_err_param(err, "web_root", "--web-root must not be empty");
    if (c->threads < 0 || c->threads > 1024) return um_err_param(err, "threads", "--threads must be in [0, 1024], got %d", c->threads);
    if (c->engines < 1 || c->engines > 64) return um_err_param(err, "engines", "--engines must be in [1, 64], got %d", c->engines);
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
    if (c->max_seq < 0 || c->max_seq > 1000000)
        return um_err_param(err, "max_seq", "--max-seq must be in [0, 1000000] tokens (0 = the model's maximum), got %d",
                            c->max_seq);
    if (c->max_batch < 1 || c->max_batch > 4096)
        return um_err_param(err, "max_batch", "--max-batch must be in [1, 4096], got %d", c->max_batch);
    if (c->max_queue < 0 || c->max_queue > 1000000)
        return um_err_param(err, "max_queue", "--max-queue must be in [0, 1000000], got %d", c->max_queue);
    if (!(c->session_retention_s >= 0) || c->session_retention_s > 7 * 86400.0 || isnan(c->session_retention_s))
        return um_err_param(err, "session_retention", "--session-retention must be in [0, 604800] seconds, got %g",
                            c->session_retention_s);
    if (c->session_max_bytes < 65536)
        return um_err_param(err, "session_max_bytes", "--session-max-bytes must be at least 65536, got %zu",
                            c->session_max_bytes);
    if (c->session_max_events < 64)
        return um_err_param(err, "session_max_events", "--session-max-events must be at least 64, got %d",
                            c->session_max_events);
    if (c->max_sessions < 1) return um_err_param(err, "max_sessions", "--max-sessions must be at least 1, got %d", c->max_sessions);
    if (c->max_session_generations < 1)
        return um_err_param(err, "max_session_generations", "--max-session-generations must be at least 1, got %d",
                            c->max_session_generations);
    if (c->max_message_bytes < 4096 || c->max_message_bytes > (256u << 20))
        return um_err_param(err, "max_message_bytes", "--max-message-bytes must be in [4096, 268435456], got %zu",
                            c->max_message_bytes);
    if (c->ping_interval_s < 1 || c->ping_interval_s > 3600)
        return um_err_param(err, "ping_interval", "--ping-interval must be in [1, 3600] seconds, got %d", c->ping_interval_s);
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
    if (c->tp > 1 && model_tp_check_config(&mc, c->model, c->tp, err) != 0) return -1;
    if (c->max_seq > mc.max_seq)
        return um_err_param(err, "max_seq",
                            "--max-seq %d exceeds the model's maximum sequence length %d (max_sequence_length in %s)",
                            c->max_seq, mc.max_seq, path);
    return 0;
}
