/*
 * test_cpu_pool.c — the CPU backend's thread pool (cpu_pool.h): every task of a run executes
 * exactly once, on a valid slot, before cpu_pool_run returns (many runs of random sizes, back to
 * back and after the workers went to sleep); max_slots = 1 keeps a run on the caller; tasks run
 * with FTZ/DAZ and the caller's floating-point mode is restored afterwards; a 4-slot pool on this
 * machine (oversubscribed when it has fewer cores) still completes every run.
 * Main thread drives the pools.
 */
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_pool.h"
#include "test.h"
#include "util/log.h"
#include "util/rng.h"

typedef struct count_run {
    _Atomic int *hits;        /* [n_tasks] times each task ran */
    _Atomic int  bad_slot;    /* tasks that saw a slot outside [0, n_slots) or not 0 when expected */
    _Atomic int  no_ftz;      /* tasks that ran without FTZ/DAZ */
    int          n_slots;
    int          only_caller;
} count_run;

static void count_task(void *arg, int64_t t, int slot) {
    count_run *r = arg;
    atomic_fetch_add(&r->hits[t], 1);
    if (slot < 0 || slot >= r->n_slots || (r->only_caller && slot != 0)) atomic_fetch_add(&r->bad_slot, 1);
    if ((_mm_getcsr() & 0x8040u) != 0x8040u) atomic_fetch_add(&r->no_ftz, 1);
}

/* runs of random sizes; returns the number of tasks that did not run exactly once */
static int runs(cpu_pool *p, int n_runs, int max_slots, uint64_t seed, count_run *r) {
    int wrong = 0;
    for (int k = 0; k < n_runs; k++) {
        int64_t n = (int64_t)(rng_u64(seed, 1, (uint64_t)k) % 300);
        memset(r->hits, 0, (size_t)(n ? n : 1) * sizeof *r->hits);
        cpu_pool_run(p, n, max_slots, count_task, r);
        for (int64_t t = 0; t < n; t++) wrong += atomic_load(&r->hits[t]) != 1;
    }
    return wrong;
}

static void test_pool(int n_slots) {
    cpu_pool *p = cpu_pool_init(n_slots, 0);
    TEST_CHECK(cpu_pool_size(p) == n_slots, "size %d", cpu_pool_size(p));
    count_run r = {.hits = xcalloc(300, sizeof *r.hits), .n_slots = n_slots};
    unsigned before = _mm_getcsr();
    int wrong = runs(p, 2000, 0, 1, &r);
    TEST_CHECK(wrong == 0 && r.bad_slot == 0, "%d slots: %d tasks not run exactly once, %d bad slots", n_slots, wrong,
               r.bad_slot);
    TEST_CHECK(r.no_ftz == 0, "%d slots: %d tasks ran without FTZ/DAZ", n_slots, r.no_ftz);
    TEST_CHECK(_mm_getcsr() == before, "caller MXCSR restored (%#x -> %#x)", before, _mm_getcsr());
    /* Idle long enough for the workers to stop spinning and sleep on their futex (the assertion
     * does not depend on it: a run completes either way; this only exercises the wake-up path). */
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
    wrong = runs(p, 50, 0, 2, &r);
    TEST_CHECK(wrong == 0, "%d slots after sleeping: %d tasks wrong", n_slots, wrong);
    r.only_caller = 1;
    wrong = runs(p, 200, 1, 3, &r);
    TEST_CHECK(wrong == 0 && r.bad_slot == 0, "max_slots 1: %d wrong, %d not on the caller", wrong, r.bad_slot);
    free(r.hits);
    cpu_pool_free(p);
}

int main(void) {
    test_pool(1);
    test_pool(2);
    test_pool(4);
    return test_report();
}
