/*
 * fault_inject.c — TEST HOOK (fault_inject.h): parses UNMASK_FAULT_FORWARD_FAIL and fails the
 * decode steps its rules name. Does not: touch the scheduler (it is called through
 * sched_opts.step_check) or the backend. Threads: see fault_inject.h.
 */
#include "decode/fault_inject.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

typedef struct fault_rule {
    uint64_t   seed;
    int        after;
    atomic_int left;   /* failures still to inject; -1 = unlimited */
} fault_rule;

struct decode_faults {
    fault_rule *rule;   /* [n] */
    int         n;
};

decode_faults *decode_faults_from_env(void) {
    const char *v = getenv("UNMASK_FAULT_FORWARD_FAIL");
    if (!v || !*v) return NULL;
    decode_faults *fs = xcalloc(1, sizeof *fs);
    for (const char *p = v; p; p = strchr(p, ';')) {
        if (*p == ';') p++;
        fs->rule = xrealloc(fs->rule, (size_t)(fs->n + 1) * sizeof *fs->rule);
        fault_rule *f = &fs->rule[fs->n++];
        unsigned long long seed = 0;
        int after = 0, times = -1, used = 0;
        if (sscanf(p, "seed=%llu%n", &seed, &used) != 1) UM_FATAL("UNMASK_FAULT_FORWARD_FAIL: expected seed=S at '%s'", p);
        const char *q = p + used;
        while (*q == ',') {
            if (sscanf(q, ",after=%d%n", &after, &used) == 1 && after >= 0) q += used;
            else if (sscanf(q, ",times=%d%n", &times, &used) == 1 && times >= 0) q += used;
            else UM_FATAL("UNMASK_FAULT_FORWARD_FAIL: expected ,after=A or ,times=K at '%s'", q);
        }
        if (*q && *q != ';') UM_FATAL("UNMASK_FAULT_FORWARD_FAIL: unexpected '%s'", q);
        f->seed = seed;
        f->after = after;
        atomic_init(&f->left, times);
        char n_times[32] = "every time";
        if (times >= 0) snprintf(n_times, sizeof n_times, "the first %d times", times);
        log_warn("TEST HOOK UNMASK_FAULT_FORWARD_FAIL: decode steps of seed %llu after %d steps fail, %s", seed, after,
                 n_times);
    }
    return fs;
}

void decode_faults_free(decode_faults *f) {
    if (!f) return;
    free(f->rule);
    free(f);
}

int decode_faults_check(void *user, decode_seq **seqs, int n, um_err *err) {
    decode_faults *fs = user;
    for (int r = 0; r < fs->n; r++) {
        fault_rule *f = &fs->rule[r];
        for (int i = 0; i < n; i++) {
            if (decode_seq_params(seqs[i])->seed != f->seed || decode_seq_steps(seqs[i]) < f->after) continue;
            int left = atomic_load(&f->left);
            while (left > 0 && !atomic_compare_exchange_weak(&f->left, &left, left - 1)) {}
            if (left == 0) break; /* spent */
            return um_err_set(err, UM_ERR_INTERNAL,
                              "forward pass failed (injected by UNMASK_FAULT_FORWARD_FAIL, seed %" PRIu64 ")", f->seed);
        }
    }
    return 0;
}
