/*
 * test_comm_local.c — the thread-local comm (backend/comm_local.c): all-reduce sums for world
 * 1..4 over odd sizes (0, 1, 7, 1001, 65537) in f32 and bf16, bit-equal to the rank-ordered
 * sequential sum and identical on every rank; repeated calls on changing data; all-gather in rank
 * order; barrier ordering. One thread per rank.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "test.h"
#include "util/dtype.h"
#include "util/rng.h"

static const size_t k_sizes[] = {0, 1, 7, 1001, 65537};
#define N_SIZES (sizeof k_sizes / sizeof k_sizes[0])
#define REPEATS 6

typedef struct rank_arg {
    comm  *c;
    int    fails;        /* checks failed on this rank (asserted on the main thread) */
    int    checks;
    int   *counter;      /* barrier test: shared counter */
    pthread_mutex_t *mu;
} rank_arg;

/* value of element i on rank r in round k: varied magnitudes and signs so order matters in f32 */
static float val(int r, int k, size_t i) {
    double u = rng_u01(42, (uint64_t)(r * 131 + k), i);
    double scale = (i % 3 == 0) ? 1e4 : (i % 3 == 1 ? 1.0 : 1e-3);
    return (float)((u - 0.5) * scale);
}

#define RCHECK(a, cond) ((a)->checks++, (cond) ? 0 : (a)->fails++)

static void *rank_main(void *p) {
    rank_arg *a = p;
    comm *c = a->c;
    const int W = comm_world(c), me = comm_rank(c);
    for (int k = 0; k < REPEATS; k++) {
        for (size_t si = 0; si < N_SIZES; si++) {
            const size_t n = k_sizes[si];
            float *buf = malloc((n ? n : 1) * sizeof *buf);
            for (size_t i = 0; i < n; i++) buf[i] = val(me, k, i);
            comm_all_reduce_sum_f32(c, buf, n);
            for (size_t i = 0; i < n; i++) {
                float s = val(0, k, i);
                for (int r = 1; r < W; r++) s += val(r, k, i);
                RCHECK(a, memcmp(&s, &buf[i], sizeof s) == 0);
            }
            free(buf);
            /* bf16: sum of the bf16 inputs in f32, rounded once */
            uint16_t *hb = malloc((n ? n : 1) * sizeof *hb);
            for (size_t i = 0; i < n; i++) hb[i] = f32_to_bf16(val(me, k + 100, i));
            comm_all_reduce_sum(c, hb, n, DTYPE_BF16);
            for (size_t i = 0; i < n; i++) {
                float s = bf16_to_f32(f32_to_bf16(val(0, k + 100, i)));
                for (int r = 1; r < W; r++) s += bf16_to_f32(f32_to_bf16(val(r, k + 100, i)));
                RCHECK(a, hb[i] == f32_to_bf16(s));
            }
            free(hb);
        }
        /* all-gather: each rank sends 5 + k ints tagged with its rank */
        const size_t m = 5 + (size_t)k;
        int32_t *send = malloc(m * sizeof *send), *recv = malloc((size_t)W * m * sizeof *recv);
        for (size_t i = 0; i < m; i++) send[i] = me * 1000 + (int32_t)i + k;
        comm_all_gather(c, send, m * sizeof *send, recv);
        for (int r = 0; r < W; r++)
            for (size_t i = 0; i < m; i++) RCHECK(a, recv[(size_t)r * m + i] == r * 1000 + (int32_t)i + k);
        free(send);
        free(recv);
        /* barrier: every rank increments, then after the barrier everyone sees W * (k + 1) */
        pthread_mutex_lock(a->mu);
        (*a->counter)++;
        pthread_mutex_unlock(a->mu);
        comm_barrier(c);
        pthread_mutex_lock(a->mu);
        int seen = *a->counter;
        pthread_mutex_unlock(a->mu);
        RCHECK(a, seen >= W * (k + 1));
        comm_barrier(c);   /* nobody starts round k+1 before all have read */
    }
    return NULL;
}

static void run_world(int W) {
    comm_local_group *g = comm_local_group_create(W);
    pthread_t th[4];
    rank_arg args[4];
    int counter = 0;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    for (int r = 0; r < W; r++) {
        args[r] = (rank_arg){comm_local_get(g, r), 0, 0, &counter, &mu};
        TEST_CHECK(comm_rank(args[r].c) == r && comm_world(args[r].c) == W, "rank/world of handle %d", r);
        pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    for (int r = 0; r < W; r++) {
        pthread_join(th[r], NULL);
        TEST_CHECK(args[r].fails == 0, "world %d rank %d: %d of %d element checks failed", W, r, args[r].fails,
                   args[r].checks);
        TEST_CHECK(args[r].checks > 0, "world %d rank %d ran no checks", W, r);
    }
    TEST_CHECK(counter == W * REPEATS, "barrier counter %d", counter);
    comm_local_group_free(g);
}

int main(void) {
    for (int W = 1; W <= 4; W++) run_world(W);
    /* no comm at all behaves as world 1 */
    float x[3] = {1, 2, 3};
    comm_all_reduce_sum_f32(NULL, x, 3);
    TEST_CHECK(x[0] == 1 && x[1] == 2 && x[2] == 3, "NULL comm all-reduce is the identity");
    TEST_CHECK(comm_world(NULL) == 1 && comm_rank(NULL) == 0, "NULL comm is rank 0 of 1");
    return test_report();
}
