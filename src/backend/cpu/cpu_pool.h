/*
 * cpu_pool.h — the CPU backend's one thread pool: every parallel loop of the backend (GEMM tiles,
 * attention items, element-wise chunks) runs on it, so there is never more than one compute
 * thread per pool slot (OpenBLAS is kept single-threaded and only called from inside tasks).
 * The thread that calls cpu_pool_run (the engine thread driving the backend) is slot 0 and works
 * too; slots 1..n-1 are workers that spin briefly after a run, then sleep on a futex.
 *
 * Every participant runs with FTZ/DAZ set (denormals are flushed: the GEMM epilogues and the
 * softmax otherwise stall on them); the caller's MXCSR is restored when cpu_pool_run returns.
 * Optional pinning puts slot i on the i-th CPU the process may use (the caller when it first runs).
 *
 * Does not: nest (a task must not call cpu_pool_run), balance between pools of different backends.
 * Threading: one driving thread at a time per pool (the backend's contract); tasks run on any slot.
 */
#ifndef UM_CPU_POOL_H
#define UM_CPU_POOL_H

#include <stdint.h>

typedef struct cpu_pool cpu_pool;

/* task t of a run, on pool slot `slot` (0 = the caller) */
typedef void (*cpu_pool_fn)(void *arg, int64_t t, int slot);

/* A pool of n_threads slots (n_threads - 1 worker threads are started now). pin: 1 = pin slot i
 * to the i-th allowed CPU. */
cpu_pool *cpu_pool_init(int n_threads, int pin);
void      cpu_pool_free(cpu_pool *p);
int       cpu_pool_size(const cpu_pool *p);

/* Run fn(arg, t, slot) for every t in [0, n_tasks) on at most max_slots slots (<= 0: all), tasks
 * handed out in increasing order as slots become free; returns when all are done (every write of a
 * task is visible to the caller then). One task or one slot: runs inline on the caller. */
void cpu_pool_run(cpu_pool *p, int64_t n_tasks, int max_slots, cpu_pool_fn fn, void *arg);

#endif /* UM_CPU_POOL_H */
