/*
 * test_cpu_mem.c — the CPU backend's large-buffer memory (cpu_mem.h): alignment and sizes of small
 * and big blocks; a big block is 2 MiB-aligned and, where transparent huge pages are enabled,
 * its first writes take far fewer page faults than one per 4 KiB page (unless the kernel says, in
 * /proc/vmstat, that it tried huge pages and had none free); the cache hands a freed big
 * block back (same pointer, no new faults) for a request of between half its size and its size,
 * keeps small blocks out, and holds to its block and byte limits; the CPU backend's activation
 * buffers (KV cache slots) go through that cache.
 * Main thread only.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_mem.h"
#include "test.h"

static long minor_faults(void) {
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_minflt;
}

/* faults taken by writing every byte of p[0, n) */
static long faults_writing(void *p, size_t n) {
    const long f0 = minor_faults();
    memset(p, 0x5a, n);
    return minor_faults() - f0;
}

/* a counter of /proc/vmstat (0 when absent) */
static long vmstat(const char *name) {
    FILE *f = fopen("/proc/vmstat", "r");
    char key[64];
    long v = 0, val;
    while (f && fscanf(f, "%63s %ld", key, &val) == 2)
        if (strcmp(key, name) == 0) v = val;
    if (f) fclose(f);
    return v;
}

static int thp_enabled(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char buf[128] = {0};
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    return strstr(buf, "[always]") || strstr(buf, "[madvise]");
}

int main(void) {
    /* small blocks: heap, 64-byte aligned, at least the size asked */
    for (size_t n = 0; n < 5000; n += 777) {
        char *p = cpu_mem_alloc(n);
        TEST_CHECK((uintptr_t)p % 64 == 0, "small block %zu at %p", n, (void *)p);
        TEST_CHECK(cpu_mem_size(p) >= n, "small block %zu usable %zu", n, cpu_mem_size(p));
        memset(p, 1, n);
        cpu_mem_free(p);
    }
    cpu_mem_free(NULL);

    /* a big block: its header page starts a 2 MiB-aligned mapping */
    const size_t MB = (size_t)1 << 20, big = 8 * MB + 12345;
    char *b = cpu_mem_alloc(big);
    TEST_CHECK((uintptr_t)b % 64 == 0 && ((uintptr_t)b - 64) % (2 * MB) == 0, "big block at %p", (void *)b);
    TEST_CHECK(cpu_mem_size(b) >= big && cpu_mem_size(b) < big + 4096, "usable %zu for %zu", cpu_mem_size(b), big);
    const long fb0 = vmstat("thp_fault_fallback");
    const long f_big = faults_writing(b, big), pages = (long)(big / 4096);
    const long fallbacks = vmstat("thp_fault_fallback") - fb0;
    if (thp_enabled() && f_big >= pages / 2 && fallbacks > 0) {
        /* the kernel tried huge pages for the block and had none free (fragmented memory): the
         * advice worked, the machine could not follow it */
        printf("transparent huge pages on, but %ld huge-page faults fell back to 4 KiB pages "
               "(no free huge pages): %ld faults writing %ld pages\n", fallbacks, f_big, pages);
    } else if (thp_enabled()) {
        printf("transparent huge pages on: %ld faults writing %ld pages\n", f_big, pages);
        TEST_CHECK(f_big < pages / 2, "%ld faults writing %ld 4 KiB pages of a huge-page-advised block", f_big, pages);
    } else {
        printf("transparent huge pages off here: %ld faults writing %ld pages (4 KiB pages expected)\n", f_big, pages);
        TEST_CHECK(f_big <= pages + 16, "%ld faults writing %ld pages", f_big, pages);
    }
    TEST_CHECK(b[0] == 0x5a && b[big - 1] == 0x5a, "written");
    cpu_mem_free(b);

    /* the cache: a freed big block comes back, mapped, for a request between half its size and it */
    cpu_mem_cache c;
    cpu_mem_cache_init(&c);
    char *a = cpu_mem_cache_alloc(&c, 8 * MB);
    TEST_CHECK(c.misses == 1 && c.hits == 0, "first big request maps (misses %lu)", c.misses);
    faults_writing(a, 8 * MB);
    cpu_mem_cache_put(&c, a);
    TEST_CHECK(c.n == 1 && c.bytes == cpu_mem_size(a), "kept: n %d bytes %zu", c.n, c.bytes);
    char *a2 = cpu_mem_cache_alloc(&c, 6 * MB);
    TEST_CHECK(a2 == a && c.hits == 1 && c.n == 0 && c.bytes == 0, "reused for 6 MiB (hits %lu, n %d)", c.hits, c.n);
    const long f_reuse = faults_writing(a2, 6 * MB);
    TEST_CHECK(f_reuse <= 4, "%ld faults writing a reused block", f_reuse);
    cpu_mem_cache_put(&c, a2);
    char *s3 = cpu_mem_cache_alloc(&c, 3 * MB);   /* 8 MiB is more than twice 3 MiB: not handed out */
    TEST_CHECK(s3 != a && c.n == 1, "a block over twice the request stays cached");
    char *s9 = cpu_mem_cache_alloc(&c, 9 * MB);   /* too small */
    TEST_CHECK(s9 != a && c.n == 1, "a block smaller than the request stays cached");
    char *small = cpu_mem_cache_alloc(&c, 1000);
    cpu_mem_cache_put(&c, small);
    TEST_CHECK(c.n == 1, "small blocks are freed, not cached (n %d)", c.n);
    /* best fit: with 8, 9 and 3 MiB blocks cached, a 4.5 MiB request takes the 8 MiB one */
    cpu_mem_cache_put(&c, s9);
    cpu_mem_cache_put(&c, s3);
    char *fit = cpu_mem_cache_alloc(&c, 4 * MB + MB / 2);
    TEST_CHECK(fit == a, "best fit took %p, want the 8 MiB block %p", (void *)fit, (void *)a);
    cpu_mem_cache_put(&c, fit);

    /* limits: at most CPU_MEM_CACHE_BLOCKS blocks, the oldest leave */
    for (int i = 0; i < CPU_MEM_CACHE_BLOCKS + 3; i++) cpu_mem_cache_put(&c, cpu_mem_alloc(2 * MB));
    TEST_CHECK(c.n == CPU_MEM_CACHE_BLOCKS, "block limit: n %d", c.n);
    size_t sum = 0;
    int has_a = 0;
    for (int i = 0; i < c.n; i++) sum += cpu_mem_size(c.blocks[i]), has_a |= c.blocks[i] == a;
    TEST_CHECK(sum == c.bytes && !has_a, "bytes %zu = sum %zu, oldest evicted (%d)", c.bytes, sum, has_a);
    /* ... and of at most CPU_MEM_CACHE_BYTES (address space only: these blocks are never touched) */
    const size_t huge = CPU_MEM_CACHE_BYTES / 2 + MB;
    cpu_mem_cache_put(&c, cpu_mem_alloc(huge));
    cpu_mem_cache_put(&c, cpu_mem_alloc(huge));
    TEST_CHECK(c.bytes <= CPU_MEM_CACHE_BYTES && c.n >= 1 && cpu_mem_size(c.blocks[c.n - 1]) >= huge,
               "byte limit: %zu cached in %d blocks", c.bytes, c.n);
    const int n_before = c.n;
    cpu_mem_cache_put(&c, cpu_mem_alloc(CPU_MEM_CACHE_BYTES + MB));
    TEST_CHECK(c.n == n_before, "a block over the byte limit is freed, not cached");
    cpu_mem_cache_free(&c);

    /* the backend's activation buffers (KV cache slots) come back from its cache */
    backend *be = backend_cpu_init(1);
    float *k1 = backend_act_alloc(be, 3 * MB);
    faults_writing(k1, 3 * MB * sizeof(float));
    backend_act_free(be, k1);
    float *k2 = backend_act_alloc(be, 3 * MB);
    TEST_CHECK(k2 == k1, "the backend reused a freed 12 MiB activation buffer");
    const long f_slot = faults_writing(k2, 3 * MB * sizeof(float));
    TEST_CHECK(f_slot <= 4, "%ld faults writing a reused activation buffer", f_slot);
    backend_act_free(be, k2);
    backend_free(be);
    return test_report();
}
