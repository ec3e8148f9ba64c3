/*
 * cpu_mem.c — large host buffers for the CPU backend (cpu_mem.h): 2 MiB-aligned huge-page-advised
 * mappings for big blocks, posix_memalign for the rest, and a small cache of freed big blocks.
 *
 * Every block carries a 64-byte header just before the pointer handed out, so cpu_mem_free knows
 * how it was made and how big it is.
 * Does not: zero memory, count memory for limits.
 * Threads: any; a cache's list is under its mutex.
 */
#include "backend/cpu/cpu_mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "util/log.h"

#define HDR 64
#define HUGE_ALIGN ((size_t)2 << 20)
#define MEM_MAGIC 0x756d6b6d656d3031ull   /* "umkmem01" */

typedef struct mem_hdr {
    uint64_t magic;
    void    *base;     /* what to free / unmap */
    size_t   len;      /* mapped bytes from base (0: base is a posix_memalign block) */
    size_t   usable;   /* bytes from the user pointer */
} mem_hdr;
_Static_assert(sizeof(mem_hdr) <= HDR, "header fits its 64 bytes");

static mem_hdr *hdr_of(const void *p) {
    mem_hdr *h = (mem_hdr *)((char *)p - HDR);
    CHECK(h->magic == MEM_MAGIC);
    return h;
}

static size_t round_up(size_t a, size_t m) { return (a + m - 1) / m * m; }

void *cpu_mem_alloc(size_t bytes) {
    if (bytes > SIZE_MAX / 2) UM_FATAL("out of memory (%zu bytes)", bytes);
    if (bytes < CPU_MEM_BIG) {
        void *b = NULL;
        if (posix_memalign(&b, 64, HDR + (bytes ? bytes : 64)) != 0) UM_FATAL("out of memory (%zu bytes)", bytes);
        mem_hdr *h = b;
        *h = (mem_hdr){MEM_MAGIC, b, 0, bytes};
        return (char *)b + HDR;
    }
    /* map 2 MiB more than needed, keep the 2 MiB-aligned part: transparent huge pages only back
     * aligned 2 MiB ranges; the tail past the last full one stays in 4 KiB pages (no waste) */
    const size_t len = round_up(HDR + bytes, 4096), map_len = len + HUGE_ALIGN;
    char *m = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) UM_FATAL("out of memory (%zu bytes)", bytes);
    char *a = (char *)round_up((uintptr_t)m, HUGE_ALIGN);
    if (a > m) munmap(m, (size_t)(a - m));
    if (a + len < m + map_len) munmap(a + len, (size_t)(m + map_len - (a + len)));
    (void)madvise(a, len, MADV_HUGEPAGE);   /* a kernel without THP says EINVAL: 4 KiB pages then */
    mem_hdr *h = (mem_hdr *)a;
    *h = (mem_hdr){MEM_MAGIC, a, len, len - HDR};
    return a + HDR;
}

void cpu_mem_free(void *p) {
    if (!p) return;
    mem_hdr *h = hdr_of(p);
    h->magic = 0;
    if (h->len) {
        CHECK(munmap(h->base, h->len) == 0);
    } else {
        free(h->base);
    }
}

size_t cpu_mem_size(const void *p) { return hdr_of(p)->usable; }

/* ---------------------------------------------------------------- the cache of freed big blocks */

void cpu_mem_cache_init(cpu_mem_cache *c) {
    memset(c, 0, sizeof *c);
    CHECK(pthread_mutex_init(&c->lock, NULL) == 0);
}

void cpu_mem_cache_free(cpu_mem_cache *c) {
    for (int i = 0; i < c->n; i++) cpu_mem_free(c->blocks[i]);
    pthread_mutex_destroy(&c->lock);
    memset(c, 0, sizeof *c);
}

void *cpu_mem_cache_alloc(cpu_mem_cache *c, size_t bytes) {
    if (bytes < CPU_MEM_BIG) return cpu_mem_alloc(bytes);
    void *p = NULL;
    pthread_mutex_lock(&c->lock);
    /* locked: c->blocks, c->n, c->bytes, counters */
    int best = -1;
    for (int i = 0; i < c->n; i++) {
        const size_t s = cpu_mem_size(c->blocks[i]);
        if (s >= bytes && s / 2 <= bytes && (best < 0 || s < cpu_mem_size(c->blocks[best]))) best = i;
    }
    if (best >= 0) {
        p = c->blocks[best];
        c->bytes -= cpu_mem_size(p);
        memmove(&c->blocks[best], &c->blocks[best + 1], (size_t)(c->n - best - 1) * sizeof c->blocks[0]);
        c->n--;
        c->hits++;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->lock);
    return p ? p : cpu_mem_alloc(bytes);
}

void cpu_mem_cache_put(cpu_mem_cache *c, void *p) {
    if (!p) return;
    const size_t s = cpu_mem_size(p);
    if (s < CPU_MEM_BIG || s > CPU_MEM_CACHE_BYTES) {
        cpu_mem_free(p);
        return;
    }
    void *evict[CPU_MEM_CACHE_BLOCKS + 1];
    int n_evict = 0;
    pthread_mutex_lock(&c->lock);
    /* locked: c->blocks, c->n, c->bytes; the oldest blocks leave until the new one fits */
    while (c->n > 0 && (c->n == CPU_MEM_CACHE_BLOCKS || c->bytes + s > CPU_MEM_CACHE_BYTES)) {
        evict[n_evict++] = c->blocks[0];
        c->bytes -= cpu_mem_size(c->blocks[0]);
        memmove(&c->blocks[0], &c->blocks[1], (size_t)(c->n - 1) * sizeof c->blocks[0]);
        c->n--;
    }
    c->blocks[c->n++] = p;
    c->bytes += s;
    pthread_mutex_unlock(&c->lock);
    for (int i = 0; i < n_evict; i++) cpu_mem_free(evict[i]);   /* munmap outside the lock */
}
