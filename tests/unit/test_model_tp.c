/*
 * test_model_tp.c — a tensor-parallel group behind one model_ctx (model/model_tp.c) on CPU threads:
 * the leader ctx of --tp 2 and --tp 4 groups (followers on their own threads, fed by the batch
 * broadcast) gives the logits of an unsharded ctx within 1e-5 relative, for several batches of
 * different shapes (packed sequences, padding keys, explicit positions, all rows or a subset,
 * model_forward and model_forward_dev); a batch the leader refuses (bad token id) is never sent to
 * the followers and the group keeps working; model_tp_free stops and joins the followers; a tp that
 * does not divide the heads and multi-node on the CPU are refused with clear errors; the memory
 * sizing (model_weight_bytes) matches the checkpoint's own tensor sizes, per rank. On the fp32 kernel path
 * (the reference): the bf16 paths round activations, so a partial-sum order change can flip a rounding
 * and the 1e-5 bound would test bf16, not the sharding.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/model_tp.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

static model g_m;

typedef struct shape {
    int     n_seqs;
    int32_t seq_start[4];
    int     with_pos, with_valid, n_out;   /* n_out 0: every row */
} shape;

static const shape k_shapes[] = {
    {2, {0, 23, 37}, 0, 1, 9},
    {1, {0, 5}, 1, 0, 0},
    {3, {0, 11, 12, 40}, 1, 1, 7},
    {1, {0, 64}, 0, 0, 3},
};

typedef struct batch_buf {
    int32_t tokens[128], pos[128], rows[128];
    uint8_t valid[128];
    fwd_batch b;
} batch_buf;

static void make_batch(const shape *s, int salt, batch_buf *bb) {
    int n = s->seq_start[s->n_seqs];
    for (int i = 0; i < n; i++) {
        bb->tokens[i] = (int32_t)((i * 53 + 7 + salt * 101) % g_m.cfg.vocab_size);
        bb->valid[i] = (uint8_t)(i % 7 != 3);
        bb->pos[i] = (int32_t)(i * 3 % 97);
    }
    for (int i = 0; i < s->n_out; i++) bb->rows[i] = (int32_t)((i * 5 + 2 + salt) % n);
    memset(&bb->b, 0, sizeof bb->b);
    bb->b.n_seqs = s->n_seqs;
    bb->b.seq_start = s->seq_start;
    bb->b.tokens = bb->tokens;
    bb->b.pos = s->with_pos ? bb->pos : NULL;
    bb->b.key_valid = s->with_valid ? bb->valid : NULL;
    bb->b.n_out = s->n_out ? s->n_out : n;
    bb->b.out_rows = s->n_out ? bb->rows : NULL;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += isnan(d) ? INFINITY : d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den + 1e-300));
}

/* bytes the CUDA backend holds for one rank: every checkpoint tensor as bf16, the sharded ones
 * divided by world, plus a second copy of wte when the LM head is tied (uploaded twice) */
static uint64_t ref_weight_bytes(int world) {
    uint64_t n = 0;
    const char *sharded[] = {"q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out.weight"};
    for (int f = 0; f < g_m.ck.n_files; f++)
        for (int i = 0; i < g_m.ck.files[f].n_tensors; i++) {
            const st_tensor *t = &g_m.ck.files[f].tensors[i];
            int sh = 0;
            for (size_t k = 0; k < sizeof sharded / sizeof sharded[0]; k++)
                sh |= strstr(t->name, ".blocks.") && strstr(t->name, sharded[k]);
            n += (uint64_t)t->n_elems / (sh ? (uint64_t)world : 1u);
            if (g_m.cfg.weight_tying && strcmp(t->name, "model.transformer.wte.weight") == 0) n += (uint64_t)t->n_elems;
        }
    return 2u * n;
}

static void run_group(int tp, float *const *ref, float *out) {
    const int V = g_m.cfg.n_embd_rows;
    model_tp_opts o = {.tp = tp, .n_local = tp, .n_threads = 1, .dist = {.nnodes = 1}};
    for (int i = 0; i < tp; i++) o.devices[i] = "cpu";
    um_err err = {0};
    model_tp *g = model_tp_create(&g_m, &o, &err);
    TEST_CHECK(g != NULL, "tp %d: model_tp_create: %s", tp, err.msg);
    if (!g) return;
    model_ctx *ctx = model_tp_leader(g);
    TEST_CHECK(ctx->shard.world == tp && ctx->shard.rank == 0 && ctx->tp == g, "tp %d: leader is rank 0 of %d", tp,
               ctx->shard.world);
    const int n_shapes = (int)(sizeof k_shapes / sizeof k_shapes[0]);
    for (int rep = 0; rep < 2; rep++)   /* the second round reuses every rank's scratch */
        for (int s = 0; s < n_shapes; s++) {
            batch_buf bb;
            make_batch(&k_shapes[s], s, &bb);
            size_t n = (size_t)bb.b.n_out * (size_t)V;
            for (size_t i = 0; i < n; i++) out[i] = NAN;
            if (rep == 0) {
                TEST_CHECK(model_forward(ctx, &bb.b, out, &err) == 0, "tp %d shape %d: %s", tp, s, err.msg);
            } else {   /* model_forward_dev: the logits stay in the leader's backend buffer */
                const void *dl = NULL;
                TEST_CHECK(model_forward_dev(ctx, &bb.b, &dl, &err) == 0 && dl, "tp %d shape %d dev: %s", tp, s, err.msg);
                if (dl) backend_act_to_host(ctx->be, dl, n, out);
            }
            double r = rel_err(out, ref[s], n);
            TEST_CHECK(r <= 1e-5, "tp %d shape %d rep %d: logits rel %.3g vs unsharded", tp, s, rep, r);
            printf("tp %d shape %d (%s): rel L2 %.3g\n", tp, s, rep ? "forward_dev" : "forward", r);
            if (s == 1) {   /* a refused batch in between: validated on the leader, never broadcast */
                batch_buf bad;
                make_batch(&k_shapes[0], 0, &bad);
                bad.tokens[4] = V + 3;
                um_err e2 = {0};
                TEST_CHECK(model_forward(ctx, &bad.b, out, &e2) < 0 && e2.code == UM_ERR_INVALID_ARG &&
                               strstr(e2.msg, "outside the vocabulary"),
                           "tp %d: bad token refused: %s", tp, e2.msg);
            }
        }
    model_tp_free(g);   /* returns only once every follower has received the stop and exited */
}

int main(void) {
    make_model_opts o = test_model_opts_tp();
    um_err err = {0};
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_FP32, &err) == 0, "select fp32: %s", err.msg);
    if (test_model_make("test_model_tp_model", &o, &g_m, &err) != 0) {
        TEST_CHECK(0, "model: %s", err.msg);
        return test_report();
    }
    const int V = g_m.cfg.n_embd_rows;
    const int n_shapes = (int)(sizeof k_shapes / sizeof k_shapes[0]);
    float *ref[8];
    {   /* unsharded references */
        backend *be = backend_cpu_init(1);
        model_ctx ctx;
        TEST_CHECK(model_ctx_init(&ctx, &g_m, be, &err) == 0, "init: %s", err.msg);
        for (int s = 0; s < n_shapes; s++) {
            batch_buf bb;
            make_batch(&k_shapes[s], s, &bb);
            ref[s] = xmalloc((size_t)bb.b.n_out * (size_t)V * sizeof(float));
            TEST_CHECK(model_forward(&ctx, &bb.b, ref[s], &err) == 0, "reference %d: %s", s, err.msg);
            double a = 0;
            for (size_t i = 0; i < (size_t)bb.b.n_out * (size_t)V; i++) a += fabs(ref[s][i]);
            TEST_CHECK(a > 0, "reference %d is not all zero", s);
        }
        model_ctx_free(&ctx);
        backend_free(be);
    }
    float *out = xmalloc((size_t)128 * (size_t)V * sizeof *out);
    run_group(2, ref, out);
    run_group(4, ref, out);
    run_group(2, ref, out);   /* a second group after the first was torn down */

    /* refusals */
    {
        model_tp_opts bad = {.tp = 3, .n_local = 3, .n_threads = 1, .dist = {.nnodes = 1}};
        for (int i = 0; i < 3; i++) bad.devices[i] = "cpu";
        um_err e = {0};
        TEST_CHECK(!model_tp_create(&g_m, &bad, &e) && e.code == UM_ERR_UNSUPPORTED && strstr(e.msg, "--tp 3") &&
                       strstr(e.msg, "divisible by 3"),
                   "tp 3 refused: %s", e.msg);
        model_tp_opts mn = {.tp = 2, .n_local = 1, .n_threads = 1,
                            .dist = {.init_addr = "127.0.0.1:1", .nnodes = 2, .node_rank = 0}};
        mn.devices[0] = "cpu";
        um_err e2 = {0};
        TEST_CHECK(!model_tp_create(&g_m, &mn, &e2) && e2.code == UM_ERR_UNSUPPORTED &&
                       strstr(e2.msg, "multi-node tensor parallelism needs CUDA + NCCL"),
                   "multi-node on the CPU refused: %s", e2.msg);
        mn.dist.node_rank = 1;
        um_err e3 = {0};
        TEST_CHECK(model_tp_follow(&g_m, &mn, &e3) < 0 && strstr(e3.msg, "needs CUDA + NCCL"),
                   "follower on the CPU refused: %s", e3.msg);
        model_tp_opts one = {.tp = 2, .n_local = 1, .n_threads = 1, .dist = {.nnodes = 1}};
        one.devices[0] = "cpu";
        um_err e4 = {0};
        TEST_CHECK(!model_tp_create(&g_m, &one, &e4) && strstr(e4.msg, "--tp 2"), "ranks per node checked: %s", e4.msg);
    }
    /* sizing */
    for (int w = 1; w <= 4; w *= 2) {
        uint64_t got = model_weight_bytes(&g_m, w), want = ref_weight_bytes(w);
        TEST_CHECK(got == want, "model_weight_bytes(world %d) = %llu, checkpoint says %llu", w, (unsigned long long)got,
                   (unsigned long long)want);
    }
    TEST_CHECK(model_act_bytes(&g_m, 2, 1000) < model_act_bytes(&g_m, 1, 1000) &&
                   model_act_bytes(&g_m, 1, 2000) > model_act_bytes(&g_m, 1, 1000),
               "activation bytes shrink with tp and grow with tokens");
    for (int s = 0; s < n_shapes; s++) free(ref[s]);
    free(out);
    model_free(&g_m);
    return test_report();
}
