/*
 * cpu_pool.c — the CPU backend's thread pool (cpu_pool.h): pthreads, a futex per worker, tasks
 * handed out by one atomic counter.
 *
 * A run: the caller writes the run (fn, arg, n_tasks), marks each helper slot "assigned" and bumps
 * its futex word; idle helpers spin (then yield) for up to SPIN_NS on that word before sleeping on it. A helper
 * claims its assignment (assigned -> active) when it wakes, takes tasks until none are left and
 * reports done. The caller takes tasks too; when they run out it revokes every assignment not yet
 * claimed (assigned -> idle), so a helper that was descheduled (a busy machine) never delays the
 * run — the caller simply did its share — and waits only for active helpers.
 *
 * Does not: steal across pools, nest.
 * Threading: cpu_pool_run from the one thread driving the backend; workers are our own threads
 * (signals blocked, as every thread of ours).
 */
#include "backend/cpu/cpu_pool.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "util/log.h"

/* How an idle slot waits: FAST_NS of pause-spinning (the gap between two ops of one forward is a
 * few µs), then sched_yield() between checks until SPIN_NS (a thread of ours, or of another
 * process, that shares the core runs instead of us spinning against it), then a futex sleep (far
 * shorter than a scheduler tick, so idle workers give the cores back). */
#define FAST_NS 5000
#define SPIN_NS 100000

enum { CLAIM_IDLE, CLAIM_ASSIGNED, CLAIM_ACTIVE };

typedef struct pool_slot {
    _Alignas(64) _Atomic uint32_t gen;   /* futex word: bumped when the slot is assigned a run */
    _Atomic uint32_t sleeping;           /* 1 while the worker sleeps (or is about to) on gen */
    _Atomic uint32_t claim;              /* CLAIM_*: who owns the slot's share of the current run */
    int              index;              /* slot number (1..n-1) */
    pthread_t        tid;
    cpu_pool        *pool;
} pool_slot;

struct cpu_pool {
    int        n;                        /* slots, the caller's included */
    int        pin;                      /* pin slots to CPUs */
    int       *cpus;                     /* [n] CPU of each slot when pinning */
    pool_slot *slots;                    /* [n]; slot 0 (the caller) has no thread */
    pid_t      pinned_caller;            /* thread id of the caller pinned last (0 = none) */
    /* the current run: written by the caller before assigning slots, read-only during the run */
    cpu_pool_fn fn;
    void       *arg;
    int64_t     n_tasks;
    _Alignas(64) _Atomic int64_t next;   /* next task to hand out */
    _Alignas(64) _Atomic uint32_t pending;          /* claimed helpers not finished yet (+ unrevoked) */
    _Atomic uint32_t caller_sleeping;    /* 1 while the caller sleeps on pending */
    _Atomic int      stop;               /* workers exit at their next wake-up */
};

/* ---------------------------------------------------------------- small helpers */

static void futex_wait(_Atomic uint32_t *w, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w, int n) { syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0); }

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    _mm_pause();
#endif
}

/* Flush denormals to zero (FTZ) and read denormal inputs as zero (DAZ); returns the old mode. */
static unsigned fp_mode_enter(void) {
#if defined(__x86_64__)
    unsigned old = _mm_getcsr();
    if ((old & 0x8040u) != 0x8040u) _mm_setcsr(old | 0x8040u);
    return old;
#else
    return 0;
#endif
}

static void fp_mode_leave(unsigned old) {
#if defined(__x86_64__)
    if (_mm_getcsr() != old) _mm_setcsr(old);
#else
    (void)old;
#endif
}

static void pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);   /* best effort: a cgroup may refuse */
}

/* One step of spin-waiting that began at t0: 0 while spinning should go on (having paused or
 * yielded), 1 once SPIN_NS have passed. */
static int spin_step(unsigned i, uint64_t t0) {
    if ((i & 63) == 0) {
        uint64_t t = now_ns();
        if (t - t0 > SPIN_NS) return 1;
        if (t - t0 > FAST_NS) sched_yield();
    }
    cpu_relax();
    return 0;
}

/* Spin, then sleep, until *w differs from val; returns the new value (acquire). */
static uint32_t wait_change(_Atomic uint32_t *w, uint32_t val, _Atomic uint32_t *sleeping) {
    const uint64_t t0 = now_ns();
    for (unsigned i = 1;; i++) {
        uint32_t v = atomic_load_explicit(w, memory_order_acquire);
        if (v != val) return v;
        if (spin_step(i, t0)) break;
    }
    for (;;) {
        atomic_store(sleeping, 1);   /* seq_cst: pairs with the waker's bump-then-check */
        uint32_t v = atomic_load(w);
        if (v == val) futex_wait(w, val);
        atomic_store_explicit(sleeping, 0, memory_order_relaxed);
        v = atomic_load_explicit(w, memory_order_acquire);
        if (v != val) return v;
    }
}

/* ---------------------------------------------------------------- runs */

static void run_tasks(cpu_pool *p, int slot) {
    const int64_t n = p->n_tasks;
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= n) return;
        p->fn(p->arg, t, slot);
    }
}

/* One helper (or the caller revoking it) is done with the run. */
static void pending_done(cpu_pool *p, int from_worker) {
    if (atomic_fetch_sub(&p->pending, 1) == 1 && from_worker && atomic_load(&p->caller_sleeping))
        futex_wake(&p->pending, 1);
}

static void *worker_main(void *arg) {
    pool_slot *s = arg;
    cpu_pool *p = s->pool;
    fp_mode_enter();
    if (p->pin) pin_to(p->cpus[s->index]);
    uint32_t seen = 0;
    for (;;) {
        seen = wait_change(&s->gen, seen, &s->sleeping);
        if (atomic_load(&p->stop)) break;
        uint32_t want = CLAIM_ASSIGNED;
        if (!atomic_compare_exchange_strong(&s->claim, &want, CLAIM_ACTIVE)) continue;   /* revoked */
        run_tasks(p, s->index);
        atomic_store_explicit(&s->claim, CLAIM_IDLE, memory_order_relaxed);
        pending_done(p, 1);
    }
    return NULL;
}

/* The caller waits until every claimed helper finished (revoking the unclaimed ones first). */
static void run_join(cpu_pool *p, int k) {
    for (int i = 1; i < k; i++) {
        uint32_t want = CLAIM_ASSIGNED;
        if (atomic_compare_exchange_strong(&p->slots[i].claim, &want, CLAIM_IDLE)) pending_done(p, 0);
    }
    const uint64_t t0 = now_ns();
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) != 0; i++)
        if (spin_step(i, t0)) break;
    for (;;) {
        uint32_t v = atomic_load(&p->pending);
        if (v == 0) break;
        atomic_store(&p->caller_sleeping, 1);
        v = atomic_load(&p->pending);
        if (v) futex_wait(&p->pending, v);
        atomic_store(&p->caller_sleeping, 0);
    }
    atomic_thread_fence(memory_order_acquire);
}

void cpu_pool_run(cpu_pool *p, int64_t n_tasks, int max_slots, cpu_pool_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    int k = max_slots <= 0 || max_slots > p->n ? p->n : max_slots;
    if (k > n_tasks) k = (int)n_tasks;
    unsigned mode = fp_mode_enter();
    if (p->pin) {
        pid_t me = (pid_t)syscall(SYS_gettid);
        if (me != p->pinned_caller) {
            pin_to(p->cpus[0]);
            p->pinned_caller = me;
        }
    }
    if (k <= 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        fp_mode_leave(mode);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, (uint32_t)(k - 1), memory_order_relaxed);
    for (int i = 1; i < k; i++) {
        pool_slot *s = &p->slots[i];
        atomic_store_explicit(&s->claim, CLAIM_ASSIGNED, memory_order_relaxed);
        atomic_fetch_add(&s->gen, 1);   /* seq_cst: publishes the run; pairs with the sleeper's check */
        if (atomic_load(&s->sleeping)) futex_wake(&s->gen, 1);
    }
    run_tasks(p, 0);
    run_join(p, k);
    fp_mode_leave(mode);
}

/* ---------------------------------------------------------------- lifetime */

/* The first n CPUs this process may run on, repeated when there are fewer. */
static void pool_cpus(cpu_pool *p) {
    cpu_set_t set;
    int list[CPU_SETSIZE], m = 0;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &set)) list[m++] = c;
    for (int i = 0; i < p->n; i++) p->cpus[i] = m ? list[i % m] : i;
}

cpu_pool *cpu_pool_init(int n_threads, int pin) {
    CHECK(n_threads >= 1);
    cpu_pool *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof *p) != 0) UM_FATAL("out of memory");
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    p->pin = pin;
    p->cpus = xcalloc((size_t)n_threads, sizeof *p->cpus);
    if (pin) pool_cpus(p);
    if (posix_memalign((void **)&p->slots, 64, (size_t)n_threads * sizeof *p->slots) != 0) UM_FATAL("out of memory");
    memset(p->slots, 0, (size_t)n_threads * sizeof *p->slots);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);   /* workers inherit a full mask */
    for (int i = 1; i < n_threads; i++) {
        pool_slot *s = &p->slots[i];
        s->index = i;
        s->pool = p;
        int rc = pthread_create(&s->tid, NULL, worker_main, s);
        if (rc != 0) UM_FATAL("cpu pool: pthread_create: %s", strerror(rc));
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return p;
}

void cpu_pool_free(cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    for (int i = 1; i < p->n; i++) {
        atomic_fetch_add(&p->slots[i].gen, 1);
        futex_wake(&p->slots[i].gen, 1);
    }
    for (int i = 1; i < p->n; i++) pthread_join(p->slots[i].tid, NULL);
    free(p->slots);
    free(p->cpus);
    free(p);
}

int cpu_pool_size(const cpu_pool *p) { return p->n; }
