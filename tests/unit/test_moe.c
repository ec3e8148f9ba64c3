/*
 * test_moe.c — the MoE families on tiny random f32 checkpoints (make_model_write presets
 * lladamoe-tiny, llada2-tiny): the routers on hand-made logits (LLaDA-MoE's biased softmax weights;
 * LLaDA2's group limit choosing other experts than a plain top-k, renormalised and scaled weights),
 * the chunked prompt prefill of the exact block KV cache (LLaDA2: a prompt's blocks filled into a
 * slot forward by forward, then the last block's logits == one block-causal forward over the whole
 * prompt; slot rows not written yet are poisoned with NaN and must never be read), and the decode
 * loop's batched == alone on both models — LLaDA2 sequences with different prompt lengths, block
 * lengths, decoders and the exact block KV cache in one batch, one joining mid-way.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/model_kv.h"
#include "model/moe.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

/* ---------------------------------------------------------------- routers */

static void test_routers(void) {
    model_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = 8, c.moe_top_k = 2;
    int32_t idx[2];
    float w[2];

    /* LLaDA2: the best two experts (0 and 4) lie in different groups; group 1's two best sum higher
     * than group 0's, so the group limit (keep 1 of 2 groups) picks 4 and 5 */
    c.router = MODEL_ROUTER_SIGMOID_GROUP, c.n_group = 2, c.topk_group = 1, c.routed_scale = 2.5f;
    const float lg[8] = {3, -5, -5, -5, 2, 1.9f, -5, -5};
    moe_route(&c, lg, NULL, idx, w);
    const double s4 = 1 / (1 + exp(-2.0)), s5 = 1 / (1 + exp(-1.9));
    TEST_CHECK(idx[0] == 4 && idx[1] == 5, "group limit: experts %d, %d (want 4, 5)", idx[0], idx[1]);
    TEST_CHECK(fabs(w[0] - s4 / (s4 + s5) * 2.5) < 1e-6 && fabs(w[1] - s5 / (s4 + s5) * 2.5) < 1e-6,
               "renormalised, scaled weights %g %g", w[0], w[1]);
    c.topk_group = 2;   /* both groups kept: a plain top-k */
    moe_route(&c, lg, NULL, idx, w);
    TEST_CHECK(idx[0] == 0 && idx[1] == 4, "no limit: experts %d, %d (want 0, 4)", idx[0], idx[1]);
    /* the bias moves the selection, the weights stay the unbiased sigmoids */
    const float bias[8] = {0, 0, 0, 0, 0, 0, 0, 2.0f};
    const float lg2[8] = {3, -5, -5, -5, 2, 1.9f, -5, 0};
    moe_route(&c, lg2, bias, idx, w);
    const double s0 = 1 / (1 + exp(-3.0)), s7 = 0.5;
    TEST_CHECK(idx[0] == 7 && idx[1] == 0, "bias selects expert 7 first: %d, %d", idx[0], idx[1]);
    TEST_CHECK(fabs(w[0] - s7 / (s7 + s0) * 2.5) < 1e-6, "weight of the biased choice is unbiased: %g", w[0]);

    /* LLaDA-MoE: softmax + bias; the biased values are the weights, not renormalised */
    c.router = MODEL_ROUTER_SOFTMAX;
    const float lg3[8] = {2, 1, 0, 0, 0, 0, 0, 0};
    const float b3[8] = {0, 0, 0.5f, 0, 0, 0, 0, 0};
    double z = exp(2.0) + exp(1.0) + 6.0;
    moe_route(&c, lg3, b3, idx, w);
    TEST_CHECK(idx[0] == 2 && idx[1] == 0, "softmax + bias: experts %d, %d (want 2, 0)", idx[0], idx[1]);
    TEST_CHECK(fabs(w[0] - (1.0 / z + 0.5)) < 1e-6 && fabs(w[1] - exp(2.0) / z) < 1e-6,
               "biased weights %g %g, no renormalisation", w[0], w[1]);
}

/* ---------------------------------------------------------------- batched == alone */

#define MAX_REC 2048
typedef struct rec {
    int     n, n_done;
    int32_t step[MAX_REC], pos[MAX_REC], tok[MAX_REC];
    char    text[1024];
} rec;

static void on_ev(void *user, const decode_event *ev) {
    rec *r = ev->seq_user ? ev->seq_user : user;
    if (ev->type == DECODE_EVENT_STEP)
        for (int i = 0; i < ev->n_commits && r->n < MAX_REC; i++, r->n++) {
            r->step[r->n] = ev->step;
            r->pos[r->n] = ev->commits[i].pos;
            r->tok[r->n] = ev->commits[i].token;
        }
    if (ev->type == DECODE_EVENT_DONE) {
        r->n_done++;
        snprintf(r->text, sizeof r->text, "%s", ev->text);
    }
}

typedef struct req {
    int32_t       prompt[24];
    int           n_prompt;
    decode_params p;
} req;

static decode_seq *mk(const model *m, const req *q, rec *r) {
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &q->p, q->prompt, q->n_prompt, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (s) decode_seq_set_user(s, r);
    return s;
}

/* decode_seq_max_forward_tokens (what `generate` sizes a device for) bounds every step's forward,
 * and is reached: stepping each request alone, before every step. */
static void forward_bound(const char *label, const model *m, model_ctx *ctx, const req *q, int n) {
    for (int i = 0; i < n; i++) {
        rec r;
        memset(&r, 0, sizeof r);
        decode_seq *s = mk(m, &q[i], &r);
        if (!s) continue;
        const int bound = decode_seq_max_forward_tokens(s);
        int most = 0, guard = 0;
        um_err err = {0};
        while (!decode_seq_done(s) && guard++ < 10000) {
            const int t = decode_seq_forward_tokens(s);
            most = t > most ? t : most;
            TEST_CHECK(t <= bound, "%s request %d: a step forwards %d tokens, over the bound %d", label, i, t, bound);
            if (decode_step(ctx, &s, 1, NULL, &err) != 0) {
                TEST_CHECK(0, "%s request %d: %s", label, i, err.msg);
                break;
            }
        }
        TEST_CHECK(most == bound || q[i].p.cache != DECODE_CACHE_NONE,
                   "%s request %d: without a cache the last block's step runs the bound (%d), most %d", label, i,
                   bound, most);
        decode_seq_free(s);
    }
}

static void batched_vs_alone(const char *label, const model *m, model_ctx *ctx, req *q, int n) {
    decode_sink sink = {on_ev, NULL};
    rec *alone = xcalloc((size_t)n, sizeof *alone), *batch = xcalloc((size_t)n, sizeof *batch);
    um_err err = {0};
    for (int i = 0; i < n; i++) {
        decode_seq *s = mk(m, &q[i], &alone[i]);
        if (s && decode_generate(ctx, s, &sink, &err) != 0) TEST_CHECK(0, "%s generate: %s", label, err.msg);
        decode_seq_free(s);
        TEST_CHECK(alone[i].n_done == 1 && alone[i].n > 0, "%s seq %d alone: %d commits", label, i, alone[i].n);
    }
    decode_seq **s = xcalloc((size_t)n, sizeof *s);
    for (int i = 0; i + 1 < n; i++) s[i] = mk(m, &q[i], &batch[i]);
    int steps = 0;
    for (;;) {   /* the last request joins after two steps */
        if (steps == 2) s[n - 1] = mk(m, &q[n - 1], &batch[n - 1]);
        decode_seq **act = xcalloc((size_t)n, sizeof *act);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (s[i] && !decode_seq_done(s[i])) act[k++] = s[i];
        int rc = k ? decode_step(ctx, act, k, &sink, &err) : 0;
        free(act);
        if (k == 0) break;
        if (rc != 0) {
            TEST_CHECK(0, "%s decode_step: %s", label, err.msg);
            break;
        }
        steps++;
    }
    for (int i = 0; i < n; i++) {
        int same = alone[i].n == batch[i].n;
        for (int j = 0; same && j < alone[i].n; j++)
            same = alone[i].step[j] == batch[i].step[j] && alone[i].pos[j] == batch[i].pos[j] &&
                   alone[i].tok[j] == batch[i].tok[j];
        TEST_CHECK(same, "%s seq %d: batched differs from alone (%d vs %d commits)", label, i, batch[i].n, alone[i].n);
        decode_seq_free(s[i]);
    }
    free(s);
    free(alone);
    free(batch);
}

/* ---------------------------------------------------------------- chunked prefill */

/* Rows [r0, r1) of toks through ctx with slot (positions r0.., block size B); logits of all of
 * them into out, or none (out NULL: only the slot is filled). */
static int fwd_rows(model_ctx *ctx, const int32_t *toks, int r0, int r1, int slot, int B, float *out, um_err *err) {
    int32_t pos[64], rows[64], start[2] = {0, r1 - r0}, kv = slot, bl = B;
    CHECK(r1 - r0 <= 64);
    for (int i = r0; i < r1; i++) pos[i - r0] = i, rows[i - r0] = i - r0;
    const fwd_batch b = {.n_seqs = 1, .seq_start = start, .tokens = toks + r0, .pos = pos, .n_out = out ? r1 - r0 : 0,
                         .out_rows = rows, .kv = slot ? &kv : NULL, .block_len = &bl};
    return model_forward(ctx, &b, out, err);
}

/* A T-token prompt's last block [a, T) with block size B: one forward over [0, T) without a cache,
 * vs prefilling [0, a) into a NaN-poisoned T-row slot in chunks of `chunk` rows (each may only read
 * the rows written before it and its own) and running [a, T) with it. */
static void test_chunked_prefill(model_ctx *ctx, int T, int B, int chunk) {
    const model_config *c = &ctx->m->cfg;
    const int V = c->n_embd_rows, a = (T - 1) / B * B, n = T - a;
    int32_t toks[64];
    CHECK(T <= 64);
    for (int i = 0; i < T; i++) toks[i] = (int32_t)((i * 53 + 7) % 500);
    float *want = xmalloc((size_t)T * (size_t)V * sizeof *want), *got = xmalloc((size_t)n * (size_t)V * sizeof *got);
    um_err err = {0};
    int rc = fwd_rows(ctx, toks, 0, T, 0, B, want, &err);
    const int slot = model_kv_open(ctx, T);
    for (int l = 0; l < c->n_layers; l++) {   /* a row read before it is written poisons the logits */
        void *k, *v;
        model_kv_layer(ctx, slot, l, &k, &v);
        const size_t e = (size_t)T * (size_t)c->n_kv_heads * (size_t)c->head_dim;
        for (size_t i = 0; i < e; i++) ((float *)k)[i] = ((float *)v)[i] = NAN;
    }
    for (int r0 = 0; rc == 0 && r0 < a; r0 += chunk) rc = fwd_rows(ctx, toks, r0, r0 + chunk < a ? r0 + chunk : a, slot, B, NULL, &err);
    if (rc == 0) rc = fwd_rows(ctx, toks, a, T, slot, B, got, &err);
    model_kv_close(ctx, slot);
    TEST_CHECK(rc == 0, "chunked prefill T=%d B=%d chunk=%d: %s", T, B, chunk, err.msg);
    double mx = 0, mref = 0;
    for (int i = 0; rc == 0 && i < n; i++)
        for (int j = 0; j < V; j++) {
            const double d = fabs((double)got[(size_t)i * V + j] - want[(size_t)(a + i) * V + j]);
            mx = isnan(d) || d > mx ? (isnan(d) ? INFINITY : d) : mx;
            mref = fmax(mref, fabs(want[(size_t)(a + i) * V + j]));
        }
    TEST_CHECK(rc == 0 && mx <= 1e-5 * mref, "chunked prefill T=%d B=%d chunk=%d: last block's logits max rel err %.2e", T,
               B, chunk, mx / mref);
    free(want);
    free(got);
}

static int open_model(const char *preset, const char *name, model *m, model_ctx *ctx, backend **be) {
    make_model_opts o;
    CHECK(make_model_preset(preset, &o) == 0);
    o.quiet = 1, o.dtype = DTYPE_F32, o.no_tokenizer = 1;
    um_err err = {0};
    if (test_model_make(name, &o, m, &err) != 0) {
        TEST_CHECK(0, "%s: %s", preset, err.msg);
        return -1;
    }
    *be = backend_cpu_init(1);
    if (model_ctx_init(ctx, m, *be, &err) != 0) {
        TEST_CHECK(0, "%s ctx: %s", preset, err.msg);
        return -1;
    }
    return 0;
}

static void close_model(model *m, model_ctx *ctx, backend *be) {
    model_ctx_free(ctx);
    backend_free(be);
    model_free(m);
}

static void fill_prompt(req *r, int n, int salt) {
    r->n_prompt = n;
    for (int j = 0; j < n; j++) r->prompt[j] = (int32_t)((j * 37 + salt * 11 + 5) % 500);
}

int main(void) {
    test_routers();

    model m;
    model_ctx ctx;
    backend *be;
    if (open_model("llada2-tiny", "test_moe_llada2", &m, &ctx, &be) == 0) {
        req q[4];
        for (int i = 0; i < 4; i++) q[i].p = decode_params_for_model(&m);
        fill_prompt(&q[0], 5, 0);
        q[0].p.gen_length = 20, q[0].p.block_length = 8, q[0].p.steps_per_block = 4;
        fill_prompt(&q[1], 12, 1);   /* threshold with sampling (separates near-ties) */
        q[1].p.gen_length = 17, q[1].p.block_length = 4, q[1].p.decoder = DECODER_THRESHOLD;
        q[1].p.threshold = 0.012, q[1].p.steps_per_block = 2, q[1].p.temperature = 0.8, q[1].p.seed = 9;
        fill_prompt(&q[2], 9, 2);    /* exact block KV */
        q[2].p.gen_length = 24, q[2].p.block_length = 8, q[2].p.steps_per_block = 8, q[2].p.cache = DECODE_CACHE_DUAL;
        fill_prompt(&q[3], 16, 3);   /* joins later; cached, threshold */
        q[3].p.gen_length = 16, q[3].p.block_length = 16, q[3].p.decoder = DECODER_THRESHOLD;
        q[3].p.threshold = 0.011, q[3].p.steps_per_block = 5, q[3].p.cache = DECODE_CACHE_PREFIX;
        test_chunked_prefill(&ctx, 45, 8, 8);    /* block by block */
        test_chunked_prefill(&ctx, 45, 8, 16);   /* two blocks per forward, the last chunk one */
        test_chunked_prefill(&ctx, 37, 4, 12);
        test_chunked_prefill(&ctx, 33, 32, 32);  /* the model's block size: one prefill forward */
        batched_vs_alone("llada2", &m, &ctx, q, 4);
        forward_bound("llada2", &m, &ctx, q, 4);
        req ch = q[2];   /* exact block KV with 8-row prefill chunks over a longer prompt */
        fill_prompt(&ch, 23, 4);
        ch.p.prefill_chunk = 8;
        forward_bound("llada2 chunked", &m, &ctx, &ch, 1);
        model_kv_stats k;
        model_kv_get_stats(&ctx, &k);
        TEST_CHECK(k.opened > 0 && k.slots == 0, "llada2: caches used (%llu opened) and all closed",
                   (unsigned long long)k.opened);
        close_model(&m, &ctx, be);
    }
    if (open_model("lladamoe-tiny", "test_moe_lladamoe", &m, &ctx, &be) == 0) {
        req q[3];
        for (int i = 0; i < 3; i++) q[i].p = decode_params_for_model(&m);
        fill_prompt(&q[0], 4, 0);
        q[0].p.gen_length = 16, q[0].p.block_length = 8, q[0].p.steps = 8;
        fill_prompt(&q[1], 10, 1);
        q[1].p.gen_length = 12, q[1].p.block_length = 4, q[1].p.decoder = DECODER_THRESHOLD, q[1].p.threshold = 0.02;
        q[1].p.temperature = 0.7, q[1].p.seed = 4;
        fill_prompt(&q[2], 7, 2);
        q[2].p.gen_length = 16, q[2].p.block_length = 16, q[2].p.steps_per_block = 4;
        batched_vs_alone("lladamoe", &m, &ctx, q, 3);
        close_model(&m, &ctx, be);
    }
    decode_thread_scratch_free();
    return test_report();
}
