/*
 * fault.c — TEST HOOKS (fault.h): the table of fault points — each one's variable, the grammar of
 * its value, its parser and its check. Does not: fail anything itself (the seams do, decode/,
 * jobs/, backend/). Threads: see fault.h.
 */
#include "util/fault.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/log.h"

/* ---------------------------------------------------------------- the points' state */

/* FORWARD_FAIL: one rule per ';'-separated item */
typedef struct forward_rule {
    uint64_t   seed;    /* sequences with this decode seed ... */
    int        after;   /* ... that have taken at least this many steps */
    atomic_int left;    /* failures still to inject; -1 = every time */
} forward_rule;

static struct {
    forward_rule *rule;        /* FORWARD_FAIL: [n] rules, owned; n = 0: off */
    int           n;
    char         *file;        /* STORE_FAIL: writes fail while this file exists (owned), NULL = off */
    char          trial[32];   /* CPU_TRIAL: the path whose trial faults, "" = off */
    int           trial_segv;  /* CPU_TRIAL: 1 = with SIGSEGV, 0 = SIGILL */
    int           nccl_rank;   /* NCCL_INIT_RANK: the rank whose init fails, -1 = off */
} g_fault = {NULL, 0, NULL, "", 0, -1};   /* written by fault_set / fault_reset only (fault.h: threads) */

/* ---------------------------------------------------------------- parsing */

/* A whole non-negative decimal number in s[0..n) no larger than max: 0 with *out, else -1. */
static int parse_count(const char *s, size_t n, unsigned long long max, unsigned long long *out) {
    if (n == 0 || n > 20) return -1;
    char buf[24];
    memcpy(buf, s, n);
    buf[n] = 0;
    if (buf[0] < '0' || buf[0] > '9') return -1;
    char *end = NULL;
    errno = 0;
    const unsigned long long v = strtoull(buf, &end, 10);
    if (errno != 0 || *end || v > max) return -1;
    *out = v;
    return 0;
}

static int bad(um_err *err, enum fault_point p, const char *value, const char *what) {
    return um_err_param(err, fault_name(p), "%s=%s: %s", fault_name(p), value, what);
}

/* seed=S[,after=A][,times=K] rules separated by ';' */
static int forward_parse(const char *v, um_err *err) {
    forward_rule *rule = NULL;
    int n = 0;
    for (const char *p = v;; p++) {
        const size_t len = strcspn(p, ";");
        unsigned long long seed = 0, after = 0, times = 0;
        int have_seed = 0, have_times = 0, ok = len > 0;
        for (const char *q = p; ok && q < p + len;) {   /* key=value items separated by ',' */
            size_t item = strcspn(q, ",;");
            const char *eq = memchr(q, '=', item);
            if (!eq) {
                ok = 0;
                break;
            }
            const size_t key = (size_t)(eq - q), vlen = item - key - 1;
            if (key == 4 && memcmp(q, "seed", 4) == 0 && !have_seed && q == p)
                ok = parse_count(eq + 1, vlen, UINT64_MAX, &seed) == 0, have_seed = 1;
            else if (key == 5 && memcmp(q, "after", 5) == 0 && have_seed)
                ok = parse_count(eq + 1, vlen, 1000000000, &after) == 0;
            else if (key == 5 && memcmp(q, "times", 5) == 0 && have_seed)
                ok = parse_count(eq + 1, vlen, 1000000000, &times) == 0, have_times = 1;
            else
                ok = 0;
            q += item;
            if (*q == ',' && ++q == p + len) ok = 0;   /* a trailing ',' */
        }
        if (!ok || !have_seed) {
            free(rule);
            return bad(err, FAULT_FORWARD_FAIL, v,
                       "expected rules seed=S[,after=A][,times=K] separated by ';' (S, A, K whole numbers >= 0)");
        }
        rule = xrealloc(rule, (size_t)(n + 1) * sizeof *rule);
        rule[n].seed = seed;
        rule[n].after = (int)after;
        atomic_init(&rule[n].left, have_times ? (int)times : -1);
        n++;
        p += len;
        if (!*p) break;
    }
    free(g_fault.rule);
    g_fault.rule = rule;
    g_fault.n = n;
    for (int r = 0; r < n; r++) {
        char how[48] = "every time";
        const int left = atomic_load(&rule[r].left);
        if (left >= 0) snprintf(how, sizeof how, "the first %d times", left);
        log_warn("TEST HOOK %s: decode steps of seed %llu after %d steps fail, %s", fault_name(FAULT_FORWARD_FAIL),
                 (unsigned long long)rule[r].seed, rule[r].after, how);
    }
    return 0;
}

/* FILE */
static int store_parse(const char *v, um_err *err) {
    (void)err;
    free(g_fault.file);
    g_fault.file = xstrdup(v);
    log_warn("TEST HOOK %s: job-store writes fail while %s exists", fault_name(FAULT_STORE_FAIL), v);
    return 0;
}

/* PATH or PATH:segv, PATH a CPU kernel path (fp32 has no trial: nothing faults) */
static int trial_parse(const char *v, um_err *err) {
    static const char *const paths[] = {"amx", "avx512bf16", "avx512vnni", "avxvnni", "fp32"};
    const char *colon = strchr(v, ':');
    const size_t n = colon ? (size_t)(colon - v) : strlen(v);
    int known = 0;
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        known |= strlen(paths[i]) == n && strncmp(v, paths[i], n) == 0;
    if (!known || (colon && strcmp(colon, ":segv") != 0))
        return bad(err, FAULT_CPU_TRIAL, v,
                   "expected PATH or PATH:segv, PATH one of amx, avx512bf16, avx512vnni, avxvnni, fp32");
    snprintf(g_fault.trial, sizeof g_fault.trial, "%.*s", (int)n, v);
    g_fault.trial_segv = colon != NULL;
    /* no warning: what it does is reported where it happens (the one-line --cpu-kernels error
     * naming the signal, or auto's fallback), and a CLI error stays one line */
    return 0;
}

/* R */
static int nccl_parse(const char *v, um_err *err) {
    unsigned long long r = 0;
    if (parse_count(v, strlen(v), 4095, &r) != 0) return bad(err, FAULT_NCCL_INIT_RANK, v, "expected a rank 0..4095");
    g_fault.nccl_rank = (int)r;
    /* no warning: the injected failure's message names the variable */
    return 0;
}

static void point_off(enum fault_point p) {
    switch (p) {
    case FAULT_FORWARD_FAIL:
        free(g_fault.rule);
        g_fault.rule = NULL;
        g_fault.n = 0;
        break;
    case FAULT_STORE_FAIL:
        free(g_fault.file);
        g_fault.file = NULL;
        break;
    case FAULT_CPU_TRIAL: g_fault.trial[0] = 0; break;
    case FAULT_NCCL_INIT_RANK: g_fault.nccl_rank = -1; break;
    case FAULT_POINT_COUNT: break;
    }
}

/* ---------------------------------------------------------------- the table */

static const struct {
    const char *name;                               /* the environment variable */
    int (*parse)(const char *value, um_err *err);   /* a non-empty value: 0, or -1 + err (state kept) */
} k_points[FAULT_POINT_COUNT] = {
    [FAULT_FORWARD_FAIL] = {"UNMASK_FAULT_FORWARD_FAIL", forward_parse},
    [FAULT_STORE_FAIL] = {"UNMASK_FAULT_STORE_FAIL", store_parse},
    [FAULT_CPU_TRIAL] = {"UNMASK_FAULT_CPU_TRIAL", trial_parse},
    [FAULT_NCCL_INIT_RANK] = {"UNMASK_FAULT_NCCL_INIT_RANK", nccl_parse},
};

const char *fault_name(enum fault_point p) {
    CHECK((unsigned)p < FAULT_POINT_COUNT);
    return k_points[p].name;
}

int fault_set(enum fault_point p, const char *value, um_err *err) {
    CHECK((unsigned)p < FAULT_POINT_COUNT);
    if (!value || !*value) {
        point_off(p);
        return 0;
    }
    return k_points[p].parse(value, err);
}

int fault_init_env(um_err *err) {
    for (int p = 0; p < FAULT_POINT_COUNT; p++)
        if (fault_set((enum fault_point)p, getenv(k_points[p].name), err) != 0) return -1;
    return 0;
}

void fault_reset(void) {
    for (int p = 0; p < FAULT_POINT_COUNT; p++) point_off((enum fault_point)p);
}

/* ---------------------------------------------------------------- the checks */

static int forward_hit(const fault_at *at) {
    for (int r = 0; r < g_fault.n; r++) {
        forward_rule *f = &g_fault.rule[r];
        if (at->seed != f->seed || at->steps < f->after) continue;
        int left = atomic_load(&f->left);
        while (left > 0 && !atomic_compare_exchange_weak(&f->left, &left, left - 1)) {}
        if (left != 0) return FAULT_HIT_FAIL;   /* -1: every time; > 0: one of the first K */
    }
    return FAULT_HIT_NONE;
}

int fault_hit(enum fault_point p, const fault_at *at) {
    switch (p) {
    case FAULT_FORWARD_FAIL: return g_fault.n > 0 && forward_hit(at);
    case FAULT_STORE_FAIL: return g_fault.file && access(g_fault.file, F_OK) == 0;
    case FAULT_CPU_TRIAL:
        if (!g_fault.trial[0] || strcmp(at->path, g_fault.trial) != 0) return FAULT_HIT_NONE;
        return g_fault.trial_segv ? FAULT_HIT_SEGV : FAULT_HIT_FAIL;
    case FAULT_NCCL_INIT_RANK: return g_fault.nccl_rank >= 0 && at->rank == g_fault.nccl_rank;
    case FAULT_POINT_COUNT: break;
    }
    UM_FATAL("unknown fault point %d", (int)p);
}
