/*
 * backend_prof.c — per-op device timing for `unmask bench --device cuda:N --profile`: an event pair
 * around every op the backend.c wrappers launch, summed by op name. Off unless started (one pointer
 * test per op). Paused while a graph is captured: a profiled run launches its ops directly, so the
 * gaps between launches count toward the ops that waited on them.
 * On the CPU the events are the host clock (every CPU op is done when its call returns).
 * Does not: see inside an op (a fused op counts once; cuBLAS calls count under the op that made
 * them) or work on backends without timed events.
 * Threading: the thread driving the backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_decode.h"
#include "backend/backend_impl.h"
#include "util/log.h"

enum { PROF_PAIRS = 4096, PROF_NAMES = 64 };

struct backend_prof {
    backend_event *a[PROF_PAIRS], *b[PROF_PAIRS];   /* event pairs, created on first use, reused */
    const char    *slot_name[PROF_PAIRS];           /* op of each recorded pair (static strings) */
    int            n;                               /* pairs recorded since the last flush */
    int            open;                            /* pair begun and not ended, -1 */
    int            paused;                          /* > 0 while a graph is captured */
    const char    *name[PROF_NAMES];                /* totals by op name */
    double         ms[PROF_NAMES];
    long           calls[PROF_NAMES];
    int            n_names;
    uint64_t       staged0, reused0;                /* ops->stage_stats at the start / last report */
};

static void stage_counts(backend *be, uint64_t *copies, uint64_t *reused) {
    *copies = *reused = 0;
    if (be->ops->stage_stats) be->ops->stage_stats(be, copies, reused);
}

int backend_profile_available(const backend *be) {
    const backend_ops *o = be->ops;
    return o->event_new && o->event_free && o->event_record && o->event_wait && o->event_elapsed_ms;
}

int backend_profile_start(backend *be) {
    if (!backend_profile_available(be)) return -1;
    if (!be->prof) {
        be->prof = xcalloc(1, sizeof *be->prof);
        be->prof->open = -1;
    }
    stage_counts(be, &be->prof->staged0, &be->prof->reused0);
    return 0;
}

/* Reads the recorded pairs into the totals (waits for the last one). */
static void prof_flush(backend *be) {
    backend_prof *p = be->prof;
    if (p->n == 0) return;
    backend_event_wait(be, p->b[p->n - 1]);
    for (int i = 0; i < p->n; i++) {
        int k = 0;
        while (k < p->n_names && strcmp(p->name[k], p->slot_name[i]) != 0) k++;
        if (k == p->n_names) {
            CHECK(p->n_names < PROF_NAMES);
            p->name[p->n_names++] = p->slot_name[i];
        }
        p->ms[k] += backend_event_elapsed_ms(be, p->a[i], p->b[i]);
        p->calls[k]++;
    }
    p->n = 0;
}

int backend_prof_begin(backend *be, const char *op) {
    backend_prof *p = be->prof;
    if (!p || p->paused || p->open >= 0) return -1;   /* nested ops (linear → matmul) count once */
    if (p->n == PROF_PAIRS) prof_flush(be);
    const int i = p->n;
    if (!p->a[i]) {
        p->a[i] = backend_event_new(be);
        p->b[i] = backend_event_new(be);
    }
    p->slot_name[i] = op;
    backend_event_record(be, p->a[i]);
    p->open = i;
    return i;
}

void backend_prof_end(backend *be, int i) {
    if (i < 0) return;
    backend_prof *p = be->prof;
    backend_event_record(be, p->b[i]);
    p->open = -1;
    p->n++;
}

void backend_prof_pause(backend *be, int on) {
    if (be->prof) be->prof->paused += on ? 1 : -1;
}

static int by_ms_desc(const void *x, const void *y, void *arg) {
    const backend_prof *p = arg;
    const double a = p->ms[*(const int *)x], b = p->ms[*(const int *)y];
    return a < b ? 1 : a > b ? -1 : 0;
}

void backend_profile_report(backend *be, FILE *f, double per, double wall_ms) {
    backend_prof *p = be->prof;
    if (!p) return;
    prof_flush(be);
    int idx[PROF_NAMES];
    double total = 0;
    for (int k = 0; k < p->n_names; k++) idx[k] = k, total += p->ms[k];
    qsort_r(idx, (size_t)p->n_names, sizeof *idx, by_ms_desc, p);
    fprintf(f, "| op | calls/step | ms/step | %% of ops | %% of wall |\n|---|---|---|---|---|\n");
    for (int j = 0; j < p->n_names; j++) {
        const int k = idx[j];
        fprintf(f, "| %s | %.1f | %.3f | %.1f | %.1f |\n", p->name[k], (double)p->calls[k] / per, p->ms[k] / per,
                total > 0 ? 100.0 * p->ms[k] / total : 0.0, wall_ms > 0 ? 100.0 * p->ms[k] / wall_ms : 0.0);
    }
    fprintf(f, "| (all ops) | | %.3f | 100.0 | %.1f |\n", total / per, wall_ms > 0 ? 100.0 * total / wall_ms : 0.0);
    if (be->ops->stage_stats) {   /* each copy is one small host-to-device transfer on the op's stream */
        uint64_t c, r;
        stage_counts(be, &c, &r);
        fprintf(f, "host index arrays staged for the ops: %.1f copies and %.1f reused per step\n",
                (double)(c - p->staged0) / per, (double)(r - p->reused0) / per);
        p->staged0 = c, p->reused0 = r;
    }
    memset(p->ms, 0, sizeof p->ms);
    memset(p->calls, 0, sizeof p->calls);
    p->n_names = 0;
}

void backend_profile_stop(backend *be) {
    backend_prof *p = be->prof;
    if (!p) return;
    for (int i = 0; i < PROF_PAIRS && p->a[i]; i++) {
        backend_event_free(be, p->a[i]);
        backend_event_free(be, p->b[i]);
    }
    free(p);
    be->prof = NULL;
}
