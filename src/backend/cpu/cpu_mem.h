/*
 * cpu_mem.h — host memory for the CPU backend's large buffers: packed weights, activation buffers
 * and KV cache slots.
 *
 * Two things a plain malloc does badly for them:
 *  - Page faults. A fresh multi-megabyte malloc is a new anonymous mapping; every 4 KiB page then
 *    faults on its first write (~0.5 µs on bare metal, ~20 µs measured on a 2-vCPU VM). A KV cache
 *    slot is such a buffer, allocated per request, so every request paid its faults inside its first
 *    forward. cpu_mem_alloc maps blocks of 2 MiB and up 2 MiB-aligned with MADV_HUGEPAGE, so
 *    where transparent huge pages are enabled ("madvise" or "always") one fault maps 2 MiB.
 *  - Reuse. cpu_mem_cache keeps a few freed large blocks and hands one back for a request of a
 *    similar size, its pages already mapped: a request that follows another one of the same
 *    canvas length takes no fault at all.
 *
 * Does not: track or limit the backend's total memory (model_kv counts KV bytes), zero memory
 * (neither does malloc; callers write before they read).
 * Threads: cpu_mem_alloc/free on any thread; a cache is locked, so any thread may use it.
 */
#ifndef UNMASK_CPU_MEM_H
#define UNMASK_CPU_MEM_H

#include <pthread.h>
#include <stddef.h>

/* Blocks from this size up are mapped on their own (huge-page advised) and may be cached. */
#define CPU_MEM_BIG ((size_t)2 << 20)
/* What a cache may hold: at most this many blocks ... */
#define CPU_MEM_CACHE_BLOCKS 8
/* ... of at most this many bytes in all. */
#define CPU_MEM_CACHE_BYTES ((size_t)2 << 30)

/* 64-byte aligned room for `bytes` (contents undefined). Out of memory is fatal. */
void *cpu_mem_alloc(size_t bytes);
/* Free a cpu_mem_alloc block (NULL is ignored). */
void cpu_mem_free(void *p);
/* Usable bytes of a cpu_mem_alloc block (at least what was asked for). */
size_t cpu_mem_size(const void *p);

typedef struct cpu_mem_cache {
    pthread_mutex_t lock;
    /* locked by `lock`: */
    void  *blocks[CPU_MEM_CACHE_BLOCKS];   /* [n] freed big blocks, oldest first, owned */
    int    n;
    size_t bytes;                          /* sum of their cpu_mem_size */
    unsigned long hits, misses;            /* cpu_mem_cache_alloc of big sizes: reused / mapped */
} cpu_mem_cache;

void cpu_mem_cache_init(cpu_mem_cache *c);
/* Frees every cached block. */
void cpu_mem_cache_free(cpu_mem_cache *c);
/* cpu_mem_alloc, but a big request first takes the smallest cached block of between `bytes` and
 * 2 × `bytes`. */
void *cpu_mem_cache_alloc(cpu_mem_cache *c, size_t bytes);
/* cpu_mem_free, but a big block is kept (the oldest ones leave when the cache is over its limits). */
void cpu_mem_cache_put(cpu_mem_cache *c, void *p);

#endif
