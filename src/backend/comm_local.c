/*
 * comm_local.c — the comm interface for N ranks that are N threads of one process (comm.h).
 *
 * Collectives publish each rank's buffer pointer in a shared slot table, meet at a barrier, work
 * directly on the other ranks' buffers, and meet again before returning (so no rank touches its
 * buffer while another still reads it). all_reduce splits the elements into `world` contiguous
 * ranges; rank r sums range r over ranks 0, 1, ..., world-1 in that order (f32 accumulation; bf16
 * rounded once at the end) and writes the sum into every rank's buffer — deterministic and the
 * same on every rank. broadcast: the other ranks copy root's buffer. Sizes are checked across
 * ranks (a mismatch is a bug: abort).
 * Threading: each rank's handle is used by that rank's thread only.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "util/log.h"

struct comm_local_group {
    int               world;
    pthread_barrier_t bar;
    void            **slot;     /* [world] buffer published by each rank for the current collective */
    size_t           *size;     /* [world] its element count / byte count */
    comm             *ranks;    /* [world] handles */
};

typedef struct local_impl {
    comm_local_group *g;
} local_impl;

static comm_local_group *group_of(comm *c) { return ((local_impl *)c->impl)->g; }

static void local_barrier(comm *c) {
    int rc = pthread_barrier_wait(&group_of(c)->bar);
    CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
}

/* publish (p, n) and wait for everyone; checks that all ranks passed the same n */
static void publish(comm *c, void *p, size_t n) {
    comm_local_group *g = group_of(c);
    g->slot[c->rank] = p;
    g->size[c->rank] = n;
    local_barrier(c);
    for (int r = 0; r < g->world; r++)
        if (g->size[r] != n)
            UM_FATAL("comm_local: rank %d passed %zu elements/bytes, rank %d passed %zu", c->rank, n, r, g->size[r]);
}

static void local_all_reduce_sum(comm *c, void *buf, size_t n, enum dtype t) {
    comm_local_group *g = group_of(c);
    publish(c, buf, n);
    const int W = g->world;
    const size_t per = (n + (size_t)W - 1) / (size_t)W;
    const size_t lo = per * (size_t)c->rank < n ? per * (size_t)c->rank : n;
    const size_t hi = lo + per < n ? lo + per : n;
    if (t == DTYPE_F32) {
        float **b = (float **)g->slot;
        for (size_t i = lo; i < hi; i++) {
            float s = b[0][i];
            for (int r = 1; r < W; r++) s += b[r][i];
            for (int r = 0; r < W; r++) b[r][i] = s;
        }
    } else {
        CHECK(t == DTYPE_BF16);
        uint16_t **b = (uint16_t **)g->slot;
        for (size_t i = lo; i < hi; i++) {
            float s = bf16_to_f32(b[0][i]);
            for (int r = 1; r < W; r++) s += bf16_to_f32(b[r][i]);
            uint16_t h = f32_to_bf16(s);
            for (int r = 0; r < W; r++) b[r][i] = h;
        }
    }
    local_barrier(c);
}

static void local_all_gather(comm *c, const void *send, size_t bytes, void *recv) {
    comm_local_group *g = group_of(c);
    publish(c, (void *)send, bytes);
    for (int r = 0; r < g->world; r++)
        if ((char *)recv + (size_t)r * bytes != g->slot[r]) memcpy((char *)recv + (size_t)r * bytes, g->slot[r], bytes);
    local_barrier(c);
}

/* every rank publishes its buffer; the others copy from root's, then all meet again so root's
 * buffer is not reused before every copy is done */
static void local_broadcast(comm *c, void *buf, size_t bytes, int root) {
    comm_local_group *g = group_of(c);
    publish(c, buf, bytes);
    if (c->rank != root && g->slot[root] != buf) memcpy(buf, g->slot[root], bytes);
    local_barrier(c);
}

static void local_free(comm *c) {
    (void)c;   /* handles belong to the group: comm_local_group_free releases them */
}

static const comm_ops k_local_ops = {
    .name = "local",
    .all_reduce_sum = local_all_reduce_sum,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .free = local_free,
};

comm_local_group *comm_local_group_create(int world) {
    CHECK(world >= 1);
    comm_local_group *g = xcalloc(1, sizeof *g);
    g->world = world;
    CHECK(pthread_barrier_init(&g->bar, NULL, (unsigned)world) == 0);
    g->slot = xcalloc((size_t)world, sizeof *g->slot);
    g->size = xcalloc((size_t)world, sizeof *g->size);
    g->ranks = xcalloc((size_t)world, sizeof *g->ranks);
    local_impl *impl = xcalloc((size_t)world, sizeof *impl);
    for (int r = 0; r < world; r++) {
        impl[r].g = g;
        g->ranks[r].ops = &k_local_ops;
        g->ranks[r].rank = r;
        g->ranks[r].world = world;
        g->ranks[r].act_dtype = DTYPE_F32;
        g->ranks[r].impl = &impl[r];
    }
    return g;
}

comm *comm_local_get(comm_local_group *g, int rank) {
    CHECK(rank >= 0 && rank < g->world);
    return &g->ranks[rank];
}

void comm_local_group_free(comm_local_group *g) {
    if (!g) return;
    pthread_barrier_destroy(&g->bar);
    free(g->ranks[0].impl);
    free(g->ranks);
    free(g->slot);
    free(g->size);
    free(g);
}
