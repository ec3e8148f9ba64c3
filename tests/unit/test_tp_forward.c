/*
 * test_tp_forward.c — tensor-parallel LLaDA forward on the thread-local comm: a make-model f32
 * checkpoint with GQA (8 query heads, 4 KV heads) run as world 1, 2 and 4 ranks (one thread per
 * rank, each with its own CPU backend holding only its weight slices) gives the same logits as the
 * unsharded forward within 1e-5 relative, on every rank, for a packed batch of two sequences with
 * a padding key and a subset of output rows; repeated forwards reuse the scratch; a world that does
 * not divide the heads is refused with a clear error; model_forward_dev leaves the same logits on
 * the backend.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/comm.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

#define LA 23
#define LB 14
#define N_TOK (LA + LB)
#define N_OUT 9

static model g_m;
static int32_t g_tokens[N_TOK], g_seq_start[3] = {0, LA, N_TOK}, g_out_rows[N_OUT];
static uint8_t g_key_valid[N_TOK];

static fwd_batch batch(void) {
    fwd_batch b = {0};
    b.n_seqs = 2;
    b.seq_start = g_seq_start;
    b.tokens = g_tokens;
    b.key_valid = g_key_valid;
    b.n_out = N_OUT;
    b.out_rows = g_out_rows;
    return b;
}

static double rel_err(const float *a, const float *ref, size_t n, double *maxrel) {
    double num = 0, den = 0, mx = 0, mref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx || isnan(d)) mx = isnan(d) ? INFINITY : fabs(d);
        if (fabs(ref[i]) > mref) mref = fabs(ref[i]);
    }
    *maxrel = mx / (mref + 1e-30);
    return sqrt(num / (den + 1e-300));
}

typedef struct rank_job {
    comm  *c;
    int    rank, world;
    float *logits;   /* [N_OUT, V] */
    int    rc;
    um_err err;
} rank_job;

static void *rank_main(void *p) {
    rank_job *j = p;
    backend *be = backend_cpu_init(1);
    model_shard sh = {j->rank, j->world, j->c};
    model_ctx ctx;
    j->rc = model_ctx_init_shard(&ctx, &g_m, be, &sh, &j->err);
    if (j->rc == 0) {
        fwd_batch b = batch();
        for (int rep = 0; rep < 2 && j->rc == 0; rep++)   /* second pass reuses the scratch */
            j->rc = model_forward(&ctx, &b, j->logits, &j->err);
        model_ctx_free(&ctx);
    }
    backend_free(be);
    return NULL;
}

int main(void) {
    make_model_opts o = test_model_opts_tp();
    um_err err = {0};
    if (test_model_make("test_tp_forward_model", &o, &g_m, &err) != 0) {
        TEST_CHECK(0, "model: %s", err.msg);
        return test_report();
    }
    const int V = g_m.cfg.n_embd_rows;
    for (int i = 0; i < N_TOK; i++) {
        g_tokens[i] = (int32_t)((i * 53 + 7) % g_m.cfg.vocab_size);
        g_key_valid[i] = 1;
    }
    g_key_valid[LA - 1] = 0;   /* a padding key at the end of sequence 0 */
    for (int i = 0; i < N_OUT; i++) g_out_rows[i] = (int32_t)((i * 5 + 2) % N_TOK);

    /* unsharded reference */
    float *ref = xmalloc((size_t)N_OUT * V * sizeof *ref);
    {
        backend *be = backend_cpu_init(1);
        model_ctx ctx;
        TEST_CHECK(model_ctx_init(&ctx, &g_m, be, &err) == 0, "init: %s", err.msg);
        fwd_batch b = batch();
        TEST_CHECK(model_forward(&ctx, &b, ref, &err) == 0, "forward: %s", err.msg);
        /* model_forward_dev: same logits, left in a backend buffer */
        const void *dl = NULL;
        TEST_CHECK(model_forward_dev(&ctx, &b, &dl, &err) == 0 && dl, "forward_dev: %s", err.msg);
        float *dev = xmalloc((size_t)N_OUT * V * sizeof *dev);
        backend_act_to_host(be, dl, (size_t)N_OUT * V, dev);
        double mr = 0, r = rel_err(dev, ref, (size_t)N_OUT * V, &mr);
        TEST_CHECK(r < 1e-6 && mr < 1e-6, "model_forward_dev differs from model_forward: rel %.3g max %.3g", r, mr);
        free(dev);
        model_ctx_free(&ctx);
        backend_free(be);
    }
    double ref_norm = 0;
    for (size_t i = 0; i < (size_t)N_OUT * V; i++) ref_norm += fabs(ref[i]);
    TEST_CHECK(ref_norm > 0, "reference logits are not all zero");

    for (int W = 1; W <= 4; W *= 2) {
        comm_local_group *g = comm_local_group_create(W);
        rank_job jobs[4];
        pthread_t th[4];
        for (int r = 0; r < W; r++) {
            memset(&jobs[r], 0, sizeof jobs[r]);
            jobs[r].c = comm_local_get(g, r);
            jobs[r].rank = r;
            jobs[r].world = W;
            jobs[r].logits = xmalloc((size_t)N_OUT * V * sizeof(float));
            for (size_t i = 0; i < (size_t)N_OUT * V; i++) jobs[r].logits[i] = NAN;   /* poison */
            pthread_create(&th[r], NULL, rank_main, &jobs[r]);
        }
        for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
        for (int r = 0; r < W; r++) {
            TEST_CHECK(jobs[r].rc == 0, "world %d rank %d: %s", W, r, jobs[r].err.msg);
            double mr = 0, rel = rel_err(jobs[r].logits, ref, (size_t)N_OUT * V, &mr);
            TEST_CHECK(rel <= 1e-5 && mr <= 1e-5, "world %d rank %d: logits rel %.3g (max %.3g) vs unsharded", W, r,
                       rel, mr);
            if (r > 0)
                TEST_CHECK(memcmp(jobs[r].logits, jobs[0].logits, (size_t)N_OUT * V * sizeof(float)) == 0,
                           "world %d: rank %d logits identical to rank 0", W, r);
            printf("world %d rank %d: rel L2 %.3g, max rel %.3g\n", W, r, rel, mr);
        }
        for (int r = 0; r < W; r++) free(jobs[r].logits);
        comm_local_group_free(g);
    }

    /* 3 ranks cannot split 8 heads */
    {
        comm_local_group *g = comm_local_group_create(3);
        backend *be = backend_cpu_init(1);
        model_shard sh = {0, 3, comm_local_get(g, 0)};
        model_ctx ctx;
        um_err e3 = {0};
        TEST_CHECK(model_ctx_init_shard(&ctx, &g_m, be, &sh, &e3) < 0 && e3.code == UM_ERR_UNSUPPORTED &&
                       strstr(e3.msg, "divisible by 3"),
                   "world 3 refused: %s", e3.msg);
        backend_free(be);
        comm_local_group_free(g);
    }
    free(ref);
    model_free(&g_m);
    return test_report();
}
