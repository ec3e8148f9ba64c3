/*
 * test_device_loop.c — the device-resident decode loop (decode/decode_device.h) against the host
 * loop (decode_step) on the SAME CUDA backend (the CPU emulator of our CUDA code in CI, a real GPU
 * when there is one): identical tokens and identical event streams (every event's JSON, timings
 * aside) for every eligible decoder at temperature 0 and > 0 with seeds, with drafts; sequences
 * joining and leaving the device batch at different steps (different block lengths and layouts
 * in one batch), a sequence continued on the device after host steps (mid-block: rng step, quota
 * state), a cancelled one (its stream is a prefix of the host stream, then DONE cancelled, nothing
 * after), an early EOS stop, what is not eligible (CFG, hierarchy, infill), and that graphs were
 * captured and replayed. KV caches: every mode alone (prefix, dual, vicinity with warmup, a refresh
 * interval; fixed steps and threshold, greedy and sampled) and mixed with cache-free sequences in
 * one joining batch, each stream equal to the host loop's, graphs replayed for the window steps, and
 * no cache slot left open afterwards. The identities run on the tiny LLaDA preset and again on
 * dream-tiny (shifted logits) and lladamoe-tiny (MoE layers on the device dispatch); on dream-tiny
 * also Dream's own decoders (origin, maskgit_plus, topk_margin, entropy; greedy, sampled, alg_temp).
 * On llada2-tiny the block-diffusion rules (quota from the block length, LLaDA2's threshold rule,
 * the padded canvas, forwards cut at the active block — counted —, EOS stop, the exact block cache
 * with its chunked prefill into NaN-poisoned slots), alone and batched, against the host loop.
 *
 * Needs a binary linked with a CUDA-capable core (the emulated core library, or UNMASK_CUDA on a
 * GPU machine); device UNMASK_TEST_DEVICE (default cuda:0).
 */
#include "backend/backend_decode.h"
#include "decode/decode_device.h"
#include "device_test.h"
#include "model/model_kv.h"

/* ---------------------------------------------------------------- cases */

typedef struct tcase {
    const char *label;
    decode_params p;
    int32_t prompt[16];
    int n_prompt;
} tcase;

static decode_params base_params(void) {
    decode_params p = decode_params_default();
    p.gen_length = 8;
    p.block_length = 4;
    p.stream_drafts = 1;
    return p;
}

/* Every eligible decoder, greedy and sampled, one sequence alone: device == host. */
static void test_alone(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    const enum decode_decoder decs[4] = {DECODER_LOW_CONFIDENCE, DECODER_RANDOM, DECODER_THRESHOLD, DECODER_FACTOR};
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 2; t++) {
            decode_params p = base_params();
            p.decoder = decs[d];
            p.threshold = 0.3;
            p.factor = 1.5;
            p.steps = decs[d] == DECODER_LOW_CONFIDENCE || decs[d] == DECODER_RANDOM ? 4 : 0;
            if (t) {
                p.temperature = 0.9;
                p.top_k = d == 1 ? 0 : 40;
                p.top_p = d == 2 ? 0.9 : 1.0;
                p.seed = 1000 + (uint64_t)d;
            }
            char label[96];
            snprintf(label, sizeof label, "%s T=%g alone", decode_decoder_name(p.decoder), p.temperature);
            stream h, g;
            run_host(ctx, &p, prompt, n_prompt, &h);
            decode_device_stats ds;
            run_device_alone(ctx, &p, prompt, n_prompt, label, &g, &ds);
            TEST_CHECK(streams_equal(label, &h, &g), "%s: device stream == host stream", label);
            TEST_CHECK(g.after_done == 0 && g.finish == h.finish, "%s: same finish, nothing after DONE", label);
            TEST_CHECK(ds.graph_captures == 1 && ds.graph_replays + 1 == ds.steps && ds.rebuilds == 1,
                       "%s: one batch, one graph, replayed from the 2nd step (captures %llu replays %llu steps "
                       "%llu)",
                       label, (unsigned long long)ds.graph_captures, (unsigned long long)ds.graph_replays,
                       (unsigned long long)ds.steps);
            stream_free(&h);
            stream_free(&g);
        }
}

/* Dream's decoders (origin, maskgit_plus, topk_margin, entropy: its step schedule, steps that commit
 * nothing, its confidences, alg_temp's Gumbel selection), greedy and sampled, several blocks and one
 * long block, one sequence alone: eligible, run on the device (device steps > 0, one per host step),
 * device stream == host stream. */
static void test_dream_decoders(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    const enum decode_decoder decs[4] = {DECODER_ORIGIN, DECODER_MASKGIT_PLUS, DECODER_TOPK_MARGIN, DECODER_ENTROPY};
    for (int d = 0; d < 4; d++)
        for (int t = 0; t < 3; t++)
            for (int shape = 0; shape < 2; shape++) {
                decode_params p = base_params();
                p.decoder = decs[d];
                if (shape) {   /* one block of 8, 8 steps: early steps commit int(8 * 0.125) = 0 */
                    p.block_length = 8;
                    p.steps = 8;
                } else {
                    p.steps = 6;
                }
                if (t >= 1) {
                    p.temperature = 0.9;
                    p.seed = 2000 + (uint64_t)(d * 10 + t);
                    if (decs[d] == DECODER_ORIGIN) p.top_k = 40;   /* origin reads no confidence */
                }
                if (t == 2) {
                    p.alg_temp = 0.5;
                    p.eps = 0.01;
                }
                char label[128];
                snprintf(label, sizeof label, "%s T=%g alg_temp=%g block %d", decode_decoder_name(p.decoder),
                         p.temperature, p.alg_temp, p.block_length);
                stream h, g;
                run_host(ctx, &p, prompt, n_prompt, &h);
                decode_device_stats ds;
                const int seq_steps = run_device_alone(ctx, &p, prompt, n_prompt, label, &g, &ds);
                TEST_CHECK(streams_equal(label, &h, &g), "%s: device stream == host stream", label);
                TEST_CHECK(g.after_done == 0 && g.finish == h.finish, "%s: same finish, nothing after DONE", label);
                TEST_CHECK(ds.steps > 0 && ds.steps_applied == (uint64_t)seq_steps && ds.rebuilds == 1,
                           "%s: every step ran on the device (device steps %llu applied %llu, sequence steps %d)",
                           label, (unsigned long long)ds.steps, (unsigned long long)ds.steps_applied, seq_steps);
                stream_free(&h);
                stream_free(&g);
            }
    /* Dream's confidence filters with its own top-p / top-k rules: those stay on the host loop */
    decode_params p = base_params();
    p.decoder = DECODER_MASKGIT_PLUS;
    p.temperature = 0.9;
    p.top_p = 0.9;
    stream st;
    decode_seq *s = mk(ctx->m, &p, prompt, n_prompt, &st);
    TEST_CHECK(!decode_device_eligible(ctx, s), "maskgit_plus with top_p: not eligible");
    decode_seq_free(s);
    stream_free(&st);
}

/* Dream's decoders batched with each other and with low_confidence (the scores of the Dream rows
 * sit beside the other rows' confidences), joining at different iterations, one continued on the
 * device mid-block after host steps (its schedule position and rng step continue): each stream
 * equals its host-alone stream. */
static void test_dream_mixed(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    enum { N = 4 };
    tcase c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].p = base_params();
        c[i].n_prompt = n_prompt - (i % 3);
        memcpy(c[i].prompt, prompt + (i % 3), (size_t)c[i].n_prompt * sizeof(int32_t));
    }
    c[0].label = "maskgit_plus B8 T0.8 alg_temp 0.3";
    c[0].p.decoder = DECODER_MASKGIT_PLUS;
    c[0].p.block_length = 8;
    c[0].p.gen_length = 16;
    c[0].p.steps = 10;
    c[0].p.temperature = 0.8;
    c[0].p.alg_temp = 0.3;
    c[0].p.seed = 21;
    c[1].label = "entropy B4 T0, 2 host steps first (mid-block)";
    c[1].p.decoder = DECODER_ENTROPY;
    c[1].p.gen_length = 12;
    c[1].p.steps = 9;
    c[2].label = "origin B4 T0.6 top_p";
    c[2].p.decoder = DECODER_ORIGIN;
    c[2].p.steps = 6;
    c[2].p.temperature = 0.6;
    c[2].p.top_p = 0.9;
    c[2].p.seed = 8;
    c[3].label = "topk_margin B4 T0 beside low_confidence";
    c[3].p.decoder = DECODER_TOPK_MARGIN;
    c[3].p.steps = 8;
    const int join_at[N] = {0, 0, 2, 3};
    stream h[N + 1], g[N + 1];
    for (int i = 0; i < N; i++) run_host(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, &h[i]);
    decode_params lc = base_params();
    lc.steps = 4;
    run_host(ctx, &lc, prompt, n_prompt, &h[N]);
    decode_seq *s[N + 1];
    for (int i = 0; i < N; i++) s[i] = mk(ctx->m, &c[i].p, c[i].prompt, c[i].n_prompt, &g[i]);
    s[N] = mk(ctx->m, &lc, prompt, n_prompt, &g[N]);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    for (int k = 0; k < 2; k++) CHECK(decode_step(ctx, &s[1], 1, &sink, &err) == 0);
    decode_device *dd = decode_device_create(ctx, 1);
    for (int it = 0; it < 2000; it++) {
        decode_seq *set[N + 1];
        int n = 0;
        for (int i = 0; i <= N; i++)
            if ((i == N || it >= join_at[i]) && !decode_seq_done(s[i])) set[n++] = s[i];
        if (n == 0 && !decode_device_holding(dd)) break;
        for (int i = 0; i < n; i++) TEST_CHECK(decode_device_eligible(ctx, set[i]), "mixed: eligible");
        CHECK(decode_device_step(dd, set, n, &sink, &err) == 0);
    }
    for (int i = 0; i <= N; i++) {
        const char *label = i < N ? c[i].label : "low_confidence beside Dream decoders";
        TEST_CHECK(decode_seq_done(s[i]) && g[i].after_done == 0, "%s: done, nothing after DONE", label);
        TEST_CHECK(streams_equal(label, &h[i], &g[i]), "%s: batched device stream == host alone", label);
    }
    decode_device_stats ds;
    decode_device_get_stats(dd, &ds);
    TEST_CHECK(ds.steps > 0 && ds.rebuilds >= 3, "mixed: device steps %llu, rebuilds %llu",
               (unsigned long long)ds.steps, (unsigned long long)ds.rebuilds);
    decode_device_free(dd);
    for (int i = 0; i <= N; i++) {
        decode_seq_free(s[i]);
        stream_free(&h[i]);
        stream_free(&g[i]);
    }
}

/* Sequences joining at different iterations, leaving when done, one cancelled; one continued from
 * host steps. Each finished stream equals its host-alone stream. */
static void test_join_leave_cancel(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    enum { N = 5 };
    tcase c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].p = base_params();
        c[i].n_prompt = n_prompt - (i % 3);
        memcpy(c[i].prompt, prompt + (i % 3), (size_t)c[i].n_prompt * sizeof(int32_t));
    }
    c[0].label = "low_confidence B4 T0";
    c[0].p.gen_length = 12;
    c[0].p.steps = 6;
    c[1].label = "threshold B3 aligned T0.7";
    c[1].p.decoder = DECODER_THRESHOLD;
    c[1].p.threshold = 0.25;
    c[1].p.block_length = 3;
    c[1].p.gen_length = 7;
    c[1].p.layout = DECODE_LAYOUT_ALIGNED;
    c[1].p.temperature = 0.7;
    c[1].p.seed = 11;
    c[2].label = "random B8 drafts every 2 (cancelled)";
    c[2].p.decoder = DECODER_RANDOM;
    c[2].p.block_length = 8;
    c[2].p.gen_length = 16;
    c[2].p.steps = 16;
    c[2].p.draft_every = 2;
    c[2].p.seed = 5;
    c[3].label = "factor B4 T0.5 top_k logits_eos_inf";
    c[3].p.logits_eos_inf = 1;
    c[3].p.decoder = DECODER_FACTOR;
    c[3].p.factor = 2.0;
    c[3].p.temperature = 0.5;
    c[3].p.top_k = 20;
    c[3].p.seed = 99;
    c[4].label = "low_confidence B4 T1, 3 host steps first";
    c[4].p.gen_length = 12;
    c[4].p.steps = 6;
    c[4].p.temperature = 1.0;
    c[4].p.seed = 3;
    /* sequence 4: 3 blocks of 4 in 6 steps = 2 per block; 3 host steps end mid-block 1 */
    const int join_at[N] = {0, 2, 3, 5, 0};
    const int cancel_seq = 2, cancel_at = 7;

    stream h[N], g[N];
    for (int i = 0; i < N; i++) run_host(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, &h[i]);
    decode_seq *s[N];
    for (int i = 0; i < N; i++) s[i] = mk(ctx->m, &c[i].p, c[i].prompt, c[i].n_prompt, &g[i]);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    /* sequence 4: three host steps, then the device continues it mid-block */
    for (int k = 0; k < 3; k++) CHECK(decode_step(ctx, &s[4], 1, &sink, &err) == 0);
    decode_device *dd = decode_device_create(ctx, 1);
    int cancelled_events = -1;
    for (int it = 0; it < 2000; it++) {
        if (it == cancel_at) {
            decode_seq_finish(s[cancel_seq], DECODE_FINISH_CANCELLED, NULL, &sink);
            cancelled_events = g[cancel_seq].n;
        }
        decode_seq *set[N];
        int n = 0;
        for (int i = 0; i < N; i++)
            if (it >= join_at[i] && !decode_seq_done(s[i])) set[n++] = s[i];
        int waiting = 0;
        for (int i = 0; i < N; i++) waiting += it < join_at[i];
        if (n == 0 && !waiting && !decode_device_holding(dd)) break;
        CHECK(decode_device_step(dd, set, n, &sink, &err) == 0);
    }
    for (int i = 0; i < N; i++) {
        TEST_CHECK(decode_seq_done(s[i]), "%s: done", c[i].label);
        TEST_CHECK(g[i].after_done == 0, "%s: nothing after DONE", c[i].label);
        if (i == cancel_seq) continue;
        TEST_CHECK(streams_equal(c[i].label, &h[i], &g[i]), "%s: batched device stream == host alone", c[i].label);
    }
    /* the cancelled one: a prefix of its host stream, then DONE cancelled (no event after it) */
    stream *gc = &g[cancel_seq], *hc = &h[cancel_seq];
    TEST_CHECK(gc->finish == DECODE_FINISH_CANCELLED && gc->done_at == gc->n - 1 && cancelled_events == gc->n,
               "cancelled: DONE cancelled is its last event (%d events, DONE at %d)", gc->n, gc->done_at);
    int prefix_ok = gc->n >= 2 && gc->n - 1 < hc->n;
    for (int i = 0; prefix_ok && i < gc->n - 1; i++) prefix_ok = strcmp(gc->ev[i], hc->ev[i]) == 0;
    TEST_CHECK(prefix_ok, "cancelled: its %d events before DONE are the host stream's first ones", gc->n - 1);
    decode_device_stats ds;
    decode_device_get_stats(dd, &ds);
    TEST_CHECK(ds.rebuilds >= 5 && ds.graph_captures >= 1 && ds.graph_replays >= 1,
               "rebuilt on every set change (%llu), graphs captured (%llu) and replayed (%llu)",
               (unsigned long long)ds.rebuilds, (unsigned long long)ds.graph_captures,
               (unsigned long long)ds.graph_replays);
    decode_device_free(dd);
    for (int i = 0; i < N; i++) {
        decode_seq_free(s[i]);
        stream_free(&h[i]);
        stream_free(&g[i]);
    }
}

/* EOS stop on the device: sampling at the highest temperature (T = 2) until a seed makes the host loop stop on
 * an EOS/EOT before the last block; the device loop must stop at the same step with the same
 * events (and the reference quirk flags on too). */
static void test_eos_stop(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    decode_params p = base_params();
    p.decoder = DECODER_RANDOM;
    p.gen_length = 32;
    p.block_length = 4;
    p.steps = 16;
    p.temperature = DECODE_MAX_TEMPERATURE;
    p.confidence_eos_eot_inf = 1;
    int found = 0;
    for (uint64_t seed = 1; seed <= 400 && !found; seed++) {
        p.seed = seed;
        stream h;
        run_host(ctx, &p, prompt, n_prompt, &h);
        /* stopped early: fewer than the 8 blocks were decoded */
        int blocks = 0;
        for (int i = 0; i < h.n; i++) blocks += strstr(h.ev[i], "\"type\":\"block\"") != NULL;
        if (h.finish == DECODE_FINISH_STOP && blocks < 8) {
            found = 1;
            stream g;
            char label[64];
            snprintf(label, sizeof label, "EOS stop (seed %llu, %d blocks)", (unsigned long long)seed, blocks);
            decode_device_stats ds;
            run_device_alone(ctx, &p, prompt, n_prompt, label, &g, &ds);
            TEST_CHECK(streams_equal(label, &h, &g), "%s: device stream == host stream", label);
            TEST_CHECK(g.finish == DECODE_FINISH_STOP && g.after_done == 0, "%s: stop, nothing after DONE", label);
            stream_free(&g);
        }
        stream_free(&h);
    }
    TEST_CHECK(found, "a seed with an early EOS stop within 400 (near-uniform sampling over the vocabulary)");
}

/* The cases c[0..n) decoded together on the device loop, case i joining at iteration join_at[i]
 * (its KV rows poisoned first when poison: rows[i] canvas rows each): every stream == the host
 * loop's h[i] (g[i] collects the device's), no KV slot left open; frees h and g. */
static void kv_poison(model_ctx *ctx, const int *rows, int n);
static void run_joined(model_ctx *ctx, const tcase *c, int n_cases, const int *join_at, stream *h, stream *g,
                       const int *rows, int poison, const char *tag) {
    decode_seq *s[16];
    CHECK(n_cases <= 16);
    for (int i = 0; i < n_cases; i++) s[i] = mk(ctx->m, &c[i].p, c[i].prompt, c[i].n_prompt, &g[i]);
    if (poison) kv_poison(ctx, rows, n_cases);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    decode_device *dd = decode_device_create(ctx, 1);
    for (int it = 0; it < 2000; it++) {
        decode_seq *set[16];
        int n = 0, waiting = 0;
        for (int i = 0; i < n_cases; i++) {
            if (it >= join_at[i] && !decode_seq_done(s[i])) set[n++] = s[i];
            waiting += it < join_at[i];
        }
        if (n == 0 && !waiting && !decode_device_holding(dd)) break;
        CHECK(decode_device_step(dd, set, n, &sink, &err) == 0);
    }
    for (int i = 0; i < n_cases; i++)
        TEST_CHECK(decode_seq_done(s[i]) && streams_equal(c[i].label, &h[i], &g[i]),
                   "%s batched: device stream == host alone", c[i].label);
    model_kv_stats ks;
    model_kv_get_stats(ctx, &ks);
    TEST_CHECK(ks.slots == 0 && ks.bytes == 0 && ks.opened > 0, "%sno KV slot left open (%lld open, %llu opened)", tag,
               (long long)ks.slots, (unsigned long long)ks.opened);
    decode_device_free(dd);
    for (int i = 0; i < n_cases; i++) {
        decode_seq_free(s[i]);
        stream_free(&h[i]);
        stream_free(&g[i]);
    }
}

/* KV caches on the device loop: host-planned steps (refresh / window) equal the host loop. */
static void test_caches(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    enum { N = 5 };
    tcase c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].p = base_params();
        c[i].p.gen_length = 16;
        c[i].p.steps = 16;
        c[i].n_prompt = n_prompt - (i % 3);
        memcpy(c[i].prompt, prompt + (i % 3), (size_t)c[i].n_prompt * sizeof(int32_t));
    }
    c[0].label = "dual, low_confidence 4 steps per block";
    c[0].p.cache = DECODE_CACHE_DUAL;
    c[1].label = "prefix, threshold T0.8";
    c[1].p.cache = DECODE_CACHE_PREFIX;
    c[1].p.decoder = DECODER_THRESHOLD;
    c[1].p.threshold = 0.3;
    c[1].p.temperature = 0.8;
    c[1].p.seed = 21;
    c[2].label = "vicinity P2 A3 warmup 2, random, B8";
    c[2].p.cache = DECODE_CACHE_VICINITY;
    c[2].p.prefix_look = 2, c[2].p.after_look = 3, c[2].p.warmup_steps = 2;
    c[2].p.decoder = DECODER_RANDOM;
    c[2].p.block_length = 8;
    c[2].p.seed = 8;
    c[3].label = "dual refresh every 2, factor aligned B3";
    c[3].p.cache = DECODE_CACHE_DUAL;
    c[3].p.cache_refresh = 2;
    c[3].p.decoder = DECODER_FACTOR;
    c[3].p.factor = 1.5;
    c[3].p.block_length = 3;
    c[3].p.layout = DECODE_LAYOUT_ALIGNED;
    c[4].label = "no cache beside cached ones";
    stream h[N], g[N];
    for (int i = 0; i < N; i++) run_host(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, &h[i]);
    /* each alone */
    for (int i = 0; i < 4; i++) {
        decode_device_stats ds;
        run_device_alone(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, c[i].label, &g[i], &ds);
        TEST_CHECK(streams_equal(c[i].label, &h[i], &g[i]), "%s alone: device stream == host stream", c[i].label);
        TEST_CHECK(ds.graph_replays >= 1 && ds.graph_captures >= 1 && ds.steps_applied == ds.steps,
                   "%s: graphs captured (%llu) and replayed (%llu) over %llu steps, each applied", c[i].label,
                   (unsigned long long)ds.graph_captures, (unsigned long long)ds.graph_replays,
                   (unsigned long long)ds.steps);
        stream_free(&g[i]);
    }
    /* all together, joining at different iterations */
    const int join_at[N] = {0, 1, 3, 0, 2};
    run_joined(ctx, c, N, join_at, h, g, NULL, 0, "");
}

/* What is not eligible stays on the host loop. */
static void test_eligibility(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    stream st;
    decode_params p = base_params();
    p.cfg_scale = 1.0;
    decode_seq *s = mk(ctx->m, &p, prompt, n_prompt, &st);
    TEST_CHECK(!decode_device_eligible(ctx, s), "CFG: not eligible");
    decode_seq_free(s);
    p = base_params();
    p.decoder = DECODER_HIERARCHY;
    s = mk(ctx->m, &p, prompt, n_prompt, &st);
    TEST_CHECK(!decode_device_eligible(ctx, s), "hierarchy: not eligible");
    decode_seq_free(s);
    um_err err = {0};
    p = base_params();
    s = decode_seq_create_infill(ctx->m, &p, prompt, n_prompt, prompt, 2, &err);
    CHECK(s);
    TEST_CHECK(!decode_device_eligible(ctx, s), "infill suffix: not eligible");
    decode_seq_free(s);
}

/* ---------------------------------------------------------------- LLaDA2 (block diffusion) */

/* A LLaDA2 request: the model's parameters (aligned blocks), then the case's. */
static decode_params bd_params(const model *m, int block, int gen, enum decode_decoder d, double tau, double temp,
                               uint64_t seed) {
    decode_params p = decode_params_for_model(m);
    p.block_length = block;
    p.gen_length = gen;
    p.decoder = d;
    if (tau > 0) p.threshold = tau;
    p.temperature = temp;
    p.seed = seed;
    p.stream_drafts = 1;
    p.cache = DECODE_CACHE_NONE;
    return p;
}

/* Block diffusion without a KV cache on the device loop (docs/decode.md "LLaDA2"): one sequence
 * alone per case — prompt tails inside the first block (prompts not multiples of B), gen lengths
 * that leave padding after the generation, low_confidence / random (the quota from the block
 * length, steps and steps_per_block) and threshold (LLaDA2's rule: all c > tau when at least the
 * quota clear it, else the quota), greedy and sampled — eligible, every step on the device (graphs
 * captured and replayed, a shape per active block), stream == host stream. The threshold cases
 * must see steps of both kinds of the rule (more commits than the quota, and exactly the quota). */
static void test_llada2_alone(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    typedef struct bcase {
        int n_prompt, block, gen, steps, spb;
        enum decode_decoder d;
        double tau, temp;
    } bcase;
    const bcase cs[] = {
        {10, 4, 7, 0, 0, DECODER_LOW_CONFIDENCE, 0, 0},      /* tail of 2 in block [8, 12); pad to 20 */
        {12, 4, 8, 0, 2, DECODER_LOW_CONFIDENCE, 0, 0.8},    /* whole prompt blocks; 2 steps per block */
        {11, 8, 13, 0, 3, DECODER_LOW_CONFIDENCE, 0, 0},     /* tail of 3 in [8, 16); 24 -> 24 */
        {9, 8, 10, 6, 0, DECODER_LOW_CONFIDENCE, 0, 1.0},    /* steps plan over 3 blocks; pad to 24 */
        {9, 4, 9, 0, 3, DECODER_RANDOM, 0, 0.7},             /* tail of 1 in [8, 12); pad to 20 */
        {10, 4, 7, 0, 2, DECODER_THRESHOLD, 0.02, 0},
        {11, 8, 13, 0, 4, DECODER_THRESHOLD, 0.015, 0},
        {9, 4, 10, 0, 2, DECODER_THRESHOLD, 0.01, 0.6},
        {12, 8, 9, 0, 0, DECODER_THRESHOLD, 0.95, 0},        /* the reference's tau: quotas only */
        {10, 4, 7, 0, 0, DECODER_FACTOR, 1.0, 0},            /* factor (tau: its f), until each block is full */
        {11, 8, 13, 0, 0, DECODER_FACTOR, 2.5, 0.7},
    };
    int over_quota = 0, at_quota = 0;
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        const bcase *c = &cs[k];
        CHECK(c->n_prompt <= n_prompt);
        decode_params p = bd_params(ctx->m, c->block, c->gen, c->d, c->d == DECODER_FACTOR ? 0 : c->tau, c->temp,
                                    300 + (uint64_t)k);
        if (c->d == DECODER_FACTOR) p.factor = c->tau;
        p.steps = c->steps;
        p.steps_per_block = c->spb;
        char label[160];
        snprintf(label, sizeof label, "llada2 %s prompt %d B%d gen %d steps %d/blk %d tau %g T=%g",
                 decode_decoder_name(p.decoder), c->n_prompt, c->block, c->gen, c->steps, c->spb, c->tau, c->temp);
        stream h, g;
        run_host(ctx, &p, prompt, c->n_prompt, &h);
        decode_device_stats ds;
        const int seq_steps = run_device_alone(ctx, &p, prompt, c->n_prompt, label, &g, &ds);
        TEST_CHECK(streams_equal(label, &h, &g), "%s: device stream == host stream", label);
        TEST_CHECK(g.after_done == 0 && g.finish == h.finish, "%s: same finish, nothing after DONE", label);
        TEST_CHECK(ds.steps_applied == (uint64_t)seq_steps && ds.steps == ds.steps_applied && ds.rebuilds == 1,
                   "%s: every step on the device (device steps %llu applied %llu, sequence steps %d)", label,
                   (unsigned long long)ds.steps, (unsigned long long)ds.steps_applied, seq_steps);
        TEST_CHECK(seq_steps < 3 || (ds.graph_captures >= 1 && ds.graph_replays >= 1),
                   "%s: graphs captured (%llu) and replayed (%llu)", label, (unsigned long long)ds.graph_captures,
                   (unsigned long long)ds.graph_replays);
        /* the forward cut: each step's forward ran the canvas up to its active block's end (the
         * block event's end, a generated-region index, rounded up to whole blocks), not the padded
         * canvas (which, block-causal, would give the same logits: only this counter tells) */
        uint64_t rows = 0;
        for (int i = 0, steps_in_block = 0; i < h.n; i++) {
            json_t *o = json_loads(h.ev[i], 0, NULL);
            CHECK(o);
            const char *type = json_string_value(json_object_get(o, "type"));
            if (strcmp(type, "step") == 0) steps_in_block++;
            if (strcmp(type, "block") == 0) {
                const int end = c->n_prompt + (int)json_integer_value(json_object_get(o, "end"));
                rows += (uint64_t)steps_in_block * (uint64_t)((end + c->block - 1) / c->block * c->block);
                steps_in_block = 0;
            }
            json_decref(o);
        }
        TEST_CHECK(ds.fwd_rows == rows, "%s: forwards cut at the active block's end (%llu rows, expected %llu)",
                   label, (unsigned long long)ds.fwd_rows, (unsigned long long)rows);
        if (c->d == DECODER_THRESHOLD) {   /* commits per step against the step's quota */
            const int spb = c->spb > 0 ? c->spb : 0;
            for (int i = 0; spb > 0 && i < h.n; i++) {
                json_t *o = json_loads(h.ev[i], 0, NULL);
                CHECK(o);
                if (strcmp(json_string_value(json_object_get(o, "type")), "step") == 0) {
                    const int nc = (int)json_array_size(json_object_get(o, "commits"));
                    const int left = (int)json_integer_value(json_object_get(json_object_get(o, "progress"), "block_masks_left"));
                    if (nc > (c->block + spb - 1) / spb) over_quota++;
                    else if (left > 0) at_quota++;
                }
                json_decref(o);
            }
        }
        stream_free(&h);
        stream_free(&g);
    }
    TEST_CHECK(over_quota > 0 && at_quota > 0,
               "llada2 threshold: steps above the quota (%d: every c > tau) and at it (%d: the quota)", over_quota,
               at_quota);
}

/* LLaDA2 sequences batched on the device with each other: different prompt lengths, block lengths
 * (4 and 8: the batch's B is the largest, each forward sequence keeps its own attention block) and
 * gen lengths, both decoders, joining at different iterations, one continued on the device
 * mid-block after host steps (its rng step and block step continue), one cancelled: each finished
 * stream equals its host-alone stream, the cancelled one is a prefix of it. */
static void test_llada2_batch(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    enum { N = 6 };
    tcase c[N];
    memset(c, 0, sizeof c);
    const int np[N] = {10, 12, 9, 11, 7, 8};
    for (int i = 0; i < N; i++) {
        c[i].n_prompt = np[i] <= n_prompt ? np[i] : n_prompt;
        memcpy(c[i].prompt, prompt, (size_t)c[i].n_prompt * sizeof(int32_t));
    }
    c[0].label = "llada2 low_confidence B4 gen 7 2/blk";
    c[0].p = bd_params(ctx->m, 4, 7, DECODER_LOW_CONFIDENCE, 0, 0, 0);
    c[0].p.steps_per_block = 2;
    c[1].label = "llada2 threshold B8 gen 13 T0.7";
    c[1].p = bd_params(ctx->m, 8, 13, DECODER_THRESHOLD, 0.015, 0.7, 41);
    c[1].p.steps_per_block = 4;
    c[2].label = "llada2 low_confidence B4 gen 10 2/blk, 3 host steps first";
    c[2].p = bd_params(ctx->m, 4, 10, DECODER_LOW_CONFIDENCE, 0, 0.9, 42);
    c[2].p.steps_per_block = 3;
    c[3].label = "llada2 threshold B4 gen 9 (cancelled)";
    c[3].p = bd_params(ctx->m, 4, 9, DECODER_THRESHOLD, 0.02, 0, 0);
    c[3].p.steps_per_block = 2;
    c[4].label = "llada2 random B8 gen 12";
    c[4].p = bd_params(ctx->m, 8, 12, DECODER_RANDOM, 0, 0.5, 43);
    c[4].p.steps = 6;
    c[5].label = "llada2 factor B8 gen 11 f1.5 T0.6";
    c[5].p = bd_params(ctx->m, 8, 11, DECODER_FACTOR, 0, 0.6, 44);
    c[5].p.factor = 1.5;
    const int join_at[N] = {0, 1, 0, 2, 4, 3};
    const int cancel_seq = 3, cancel_at = 6;
    stream h[N], g[N];
    for (int i = 0; i < N; i++) run_host(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, &h[i]);
    decode_seq *s[N];
    for (int i = 0; i < N; i++) s[i] = mk(ctx->m, &c[i].p, c[i].prompt, c[i].n_prompt, &g[i]);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    for (int k = 0; k < 3; k++) CHECK(decode_step(ctx, &s[2], 1, &sink, &err) == 0);
    decode_device *dd = decode_device_create(ctx, 1);
    int cancelled_events = -1;
    for (int it = 0; it < 2000; it++) {
        if (it == cancel_at) {
            decode_seq_finish(s[cancel_seq], DECODE_FINISH_CANCELLED, NULL, &sink);
            cancelled_events = g[cancel_seq].n;
        }
        decode_seq *set[N];
        int n = 0, waiting = 0;
        for (int i = 0; i < N; i++) {
            if (it >= join_at[i] && !decode_seq_done(s[i])) set[n++] = s[i];
            waiting += it < join_at[i];
        }
        if (n == 0 && !waiting && !decode_device_holding(dd)) break;
        for (int i = 0; i < n; i++) TEST_CHECK(decode_device_eligible(ctx, set[i]), "llada2 batch: eligible");
        CHECK(decode_device_step(dd, set, n, &sink, &err) == 0);
    }
    for (int i = 0; i < N; i++) {
        TEST_CHECK(decode_seq_done(s[i]) && g[i].after_done == 0, "%s: done, nothing after DONE", c[i].label);
        if (i != cancel_seq)
            TEST_CHECK(streams_equal(c[i].label, &h[i], &g[i]), "%s: batched device stream == host alone", c[i].label);
    }
    stream *gc = &g[cancel_seq], *hc = &h[cancel_seq];
    int prefix_ok = gc->finish == DECODE_FINISH_CANCELLED && cancelled_events == gc->n && gc->n >= 2 && gc->n - 1 < hc->n;
    for (int i = 0; prefix_ok && i < gc->n - 1; i++) prefix_ok = strcmp(gc->ev[i], hc->ev[i]) == 0;
    TEST_CHECK(prefix_ok, "llada2 cancelled: its %d events before DONE are the host stream's first ones", gc->n - 1);
    decode_device_stats ds;
    decode_device_get_stats(dd, &ds);
    TEST_CHECK(ds.rebuilds >= 4 && ds.graph_captures >= 1 && ds.graph_replays >= 1,
               "llada2 batch: rebuilt on set changes (%llu), graphs captured (%llu) and replayed (%llu)",
               (unsigned long long)ds.rebuilds, (unsigned long long)ds.graph_captures,
               (unsigned long long)ds.graph_replays);
    decode_device_free(dd);
    for (int i = 0; i < N; i++) {
        decode_seq_free(s[i]);
        stream_free(&h[i]);
        stream_free(&g[i]);
    }
}

/* LLaDA2's EOS stop: sampling at T = 2 until a seed makes the host loop stop after a block holding
 * an EOS before the last block; the device loop stops at the same step with the same events. */
static void test_llada2_eos(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    decode_params p = bd_params(ctx->m, 4, 30, DECODER_RANDOM, 0, DECODE_MAX_TEMPERATURE, 0);
    p.steps_per_block = 2;
    const int n = n_prompt < 10 ? n_prompt : 10;   /* blocks [10, 12), [12, 16), ... [36, 40): 8 */
    int found = 0;
    for (uint64_t seed = 1; seed <= 400 && !found; seed++) {
        p.seed = seed;
        stream h;
        run_host(ctx, &p, prompt, n, &h);
        int blocks = 0;
        for (int i = 0; i < h.n; i++) blocks += strstr(h.ev[i], "\"type\":\"block\"") != NULL;
        if (h.finish == DECODE_FINISH_STOP && blocks < 8) {
            found = 1;
            char label[80];
            snprintf(label, sizeof label, "llada2 EOS stop (seed %llu, %d blocks)", (unsigned long long)seed, blocks);
            stream g;
            decode_device_stats ds;
            run_device_alone(ctx, &p, prompt, n, label, &g, &ds);
            TEST_CHECK(streams_equal(label, &h, &g), "%s: device stream == host stream", label);
            TEST_CHECK(g.finish == DECODE_FINISH_STOP && g.after_done == 0, "%s: stop, nothing after DONE", label);
            stream_free(&g);
        }
        stream_free(&h);
    }
    TEST_CHECK(found, "llada2: a seed with an early EOS stop within 400");
}

/* Opens n KV slots of rows[i] canvas rows, fills every layer's keys and values with all-ones bytes
 * (a NaN in bf16 and f32) and closes them: the slots the next sequences of those lengths open (the
 * allocator hands the same blocks back) hold NaN wherever nothing was written, so a step reading a
 * row its prefill did not write poisons its logits instead of finding an earlier run's keys there
 * (the host reference runs the same prompts on the same ctx first). */
static void kv_poison(model_ctx *ctx, const int *rows, int n) {
    const model_config *c = &ctx->m->cfg;
    int ids[8];
    CHECK(n <= 8);
    for (int i = 0; i < n; i++) ids[i] = model_kv_open(ctx, rows[i]);
    for (int i = 0; i < n; i++) {
        const size_t bytes = (size_t)rows[i] * (size_t)c->n_kv_heads * (size_t)c->head_dim *
                             dtype_size(backend_act_dtype(ctx->be));
        unsigned char *ones = xmalloc(bytes);
        memset(ones, 0xff, bytes);
        for (int l = 0; l < c->n_layers; l++) {
            void *k, *v;
            model_kv_layer(ctx, ids[i], l, &k, &v);
            backend_buf_set_async(ctx->be, k, ones, bytes);
            backend_buf_set_async(ctx->be, v, ones, bytes);
        }
        backend_synchronize(ctx->be);
        free(ones);
    }
    for (int i = 0; i < n; i++) model_kv_close(ctx, ids[i]);
}

/* The canvas length (KV slot rows) of a sequence of p on prompt. */
static int canvas_rows(model_ctx *ctx, const decode_params *p, const int32_t *prompt, int n_prompt) {
    stream st;
    decode_seq *s = mk(ctx->m, p, prompt, n_prompt, &st);
    int L = 0;
    decode_seq_canvas(s, &L);
    decode_seq_free(s);
    stream_free(&st);
    return L;
}

/* LLaDA2 with the exact block KV cache on the device loop (docs/decode.md "LLaDA2"): the refresh's
 * chunked prefill (chunks of 4, 8, one forward, more than the prompt), then the active block's rows
 * (the previous block's too on a block's first step) over the cache; a refresh interval and warm-up
 * steps; every cache mode (all run the exact block cache). Each alone and all batched, joining at
 * different iterations: stream == the host loop's, graphs replayed inside blocks of 4 steps or more,
 * no slot left open. */
static void test_llada2_cached(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    enum { N = 5 };
    tcase c[N];
    memset(c, 0, sizeof c);
    const int np[N] = {10, 11, 9, 12, 8};
    for (int i = 0; i < N; i++) {
        c[i].n_prompt = np[i] <= n_prompt ? np[i] : n_prompt;
        memcpy(c[i].prompt, prompt, (size_t)c[i].n_prompt * sizeof(int32_t));
    }
    c[0].label = "llada2 dual, low_confidence B4 4/blk, chunks of 4";
    c[0].p = bd_params(ctx->m, 4, 7, DECODER_LOW_CONFIDENCE, 0, 0, 0);
    c[0].p.cache = DECODE_CACHE_DUAL;
    c[0].p.steps_per_block = 4;
    c[0].p.prefill_chunk = 4;
    c[1].label = "llada2 prefix, threshold B8 4/blk, one prefill forward";
    c[1].p = bd_params(ctx->m, 8, 13, DECODER_THRESHOLD, 0.015, 0, 0);
    c[1].p.cache = DECODE_CACHE_PREFIX;
    c[1].p.steps_per_block = 4;
    c[1].p.prefill_chunk = 0;
    c[2].label = "llada2 dual refresh every 2, threshold B4 T0.6, chunk 1000";
    c[2].p = bd_params(ctx->m, 4, 10, DECODER_THRESHOLD, 0.01, 0.6, 51);
    c[2].p.cache = DECODE_CACHE_DUAL;
    c[2].p.steps_per_block = 3;
    c[2].p.cache_refresh = 2;
    c[2].p.prefill_chunk = 1000;
    c[3].label = "llada2 vicinity warmup 2, random B4 3/blk, chunks of 8";
    c[3].p = bd_params(ctx->m, 4, 9, DECODER_RANDOM, 0, 0.8, 52);
    c[3].p.cache = DECODE_CACHE_VICINITY;
    c[3].p.steps_per_block = 3;
    c[3].p.warmup_steps = 2;
    c[3].p.prefill_chunk = 8;
    c[4].label = "llada2 dual, factor B4 f1, chunks of 4";
    c[4].p = bd_params(ctx->m, 4, 9, DECODER_FACTOR, 0, 0, 0);
    c[4].p.cache = DECODE_CACHE_DUAL;
    c[4].p.factor = 1.0;
    c[4].p.prefill_chunk = 4;
    stream h[N], g[N];
    for (int i = 0; i < N; i++) run_host(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, &h[i]);
    int rows[N];
    for (int i = 0; i < N; i++) rows[i] = canvas_rows(ctx, &c[i].p, c[i].prompt, c[i].n_prompt);
    for (int i = 0; i < N; i++) {
        decode_device_stats ds;
        kv_poison(ctx, &rows[i], 1);
        run_device_alone(ctx, &c[i].p, c[i].prompt, c[i].n_prompt, c[i].label, &g[i], &ds);
        TEST_CHECK(streams_equal(c[i].label, &h[i], &g[i]), "%s alone: device stream == host stream", c[i].label);
        /* a graph per window (its positions: block indices and key counts are baked in): a block's
         * first step runs the previous block too, so a block replays from its 4th step */
        const int replays = c[i].p.steps_per_block >= 4 && c[i].p.cache_refresh == 0;
        TEST_CHECK(ds.steps_applied == ds.steps && (!replays || (ds.graph_replays >= 1 && ds.graph_captures >= 1)),
                   "%s: graphs captured (%llu) and replayed (%llu) over %llu steps, each applied", c[i].label,
                   (unsigned long long)ds.graph_captures, (unsigned long long)ds.graph_replays,
                   (unsigned long long)ds.steps);
        stream_free(&g[i]);
    }
    const int join_at[N] = {0, 1, 0, 3, 2};
    run_joined(ctx, c, N, join_at, h, g, rows, 1, "llada2: ");
}

/* LLaDA2 on the device loop with and without the exact block cache; decoders whose
 * block-diffusion rule the kernel does not implement stay on the host loop. */
static void test_llada2_eligibility(model_ctx *ctx, const int32_t *prompt, int n_prompt) {
    stream st;
    decode_params p = bd_params(ctx->m, 4, 8, DECODER_LOW_CONFIDENCE, 0, 0, 0);
    decode_seq *s;
    const enum decode_cache modes[4] = {DECODE_CACHE_NONE, DECODE_CACHE_PREFIX, DECODE_CACHE_DUAL,
                                        DECODE_CACHE_VICINITY};
    for (int i = 0; i < 4; i++) {
        p.cache = modes[i];
        s = mk(ctx->m, &p, prompt, n_prompt, &st);
        TEST_CHECK(decode_device_eligible(ctx, s), "llada2, cache mode %d: eligible", (int)modes[i]);
        decode_seq_free(s);
    }
    p = bd_params(ctx->m, 4, 8, DECODER_FACTOR, 0, 0, 0);
    s = mk(ctx->m, &p, prompt, n_prompt, &st);
    TEST_CHECK(decode_device_eligible(ctx, s), "llada2 factor: eligible");
    decode_seq_free(s);
    p = bd_params(ctx->m, 4, 8, DECODER_HIERARCHY, 0.9, 0, 0);
    s = mk(ctx->m, &p, prompt, n_prompt, &st);
    TEST_CHECK(!decode_device_eligible(ctx, s), "llada2 hierarchy: host loop");
    decode_seq_free(s);
}

/* The fixture on preset (NULL: the default checkpoint) and a context on it; exits on failure. */
static void open_ctx(device_fixture *fx, model_ctx *ctx, const char *name, const char *preset) {
    if (preset) device_fixture_open_preset(fx, name, preset);
    else device_fixture_open(fx, name);
    um_err err = {0};
    if (model_ctx_init(ctx, &fx->m, fx->be, &err) != 0) {
        fprintf(stderr, "model_ctx_init (%s): %s\n", preset ? preset : "default", err.msg);
        exit(1);
    }
}

static void close_ctx(device_fixture *fx, model_ctx *ctx) {
    model_ctx_free(ctx);
    device_fixture_close(fx);
}

int main(void) {
    device_fixture fx;
    model_ctx ctx;
    open_ctx(&fx, &ctx, "test_device_loop", NULL);
    CHECK(decode_device_supported(&ctx));
    test_eligibility(&ctx, fx.prompt, fx.n_prompt);
    test_alone(&ctx, fx.prompt, fx.n_prompt);
    test_join_leave_cancel(&ctx, fx.prompt, fx.n_prompt);
    test_eos_stop(&ctx, fx.prompt, fx.n_prompt);
    test_caches(&ctx, fx.prompt, fx.n_prompt);
    close_ctx(&fx, &ctx);

    /* Dream (shifted logits: position p is scored by row p - 1; q/k/v biases, GQA): the same
     * device == host identities, so the device loop's LM-head rows follow the host's shift */
    fprintf(stderr, "-- dream-tiny (shifted logits) --\n");
    open_ctx(&fx, &ctx, "test_device_loop_dream", "dream-tiny");
    CHECK(fx.m.cfg.logits_shifted);
    test_dream_decoders(&ctx, fx.prompt, fx.n_prompt);
    test_dream_mixed(&ctx, fx.prompt, fx.n_prompt);
    test_alone(&ctx, fx.prompt, fx.n_prompt);
    test_join_leave_cancel(&ctx, fx.prompt, fx.n_prompt);
    test_caches(&ctx, fx.prompt, fx.n_prompt);
    close_ctx(&fx, &ctx);

    /* LLaDA-MoE (routed experts on the device dispatch, no host synchronisation in the forward):
     * the same identities, the device loop's steps replayed from graphs */
    fprintf(stderr, "-- lladamoe-tiny (MoE) --\n");
    open_ctx(&fx, &ctx, "test_device_loop_moe", "lladamoe-tiny");
    CHECK(fx.m.cfg.n_experts > 0);
    test_alone(&ctx, fx.prompt, fx.n_prompt);
    test_join_leave_cancel(&ctx, fx.prompt, fx.n_prompt);
    test_caches(&ctx, fx.prompt, fx.n_prompt);
    close_ctx(&fx, &ctx);

    /* LLaDA2 (block-causal MoE, block diffusion without a KV cache): quota from the block length,
     * LLaDA2's threshold rule, the padded canvas and the forward cut at the active block's end */
    fprintf(stderr, "-- llada2-tiny (block diffusion) --\n");
    open_ctx(&fx, &ctx, "test_device_loop_llada2", "llada2-tiny");
    CHECK(fx.m.cfg.block_causal > 0 && ctx.host_sync == 0);
    test_llada2_eligibility(&ctx, fx.prompt, fx.n_prompt);
    test_llada2_alone(&ctx, fx.prompt, fx.n_prompt);
    test_llada2_batch(&ctx, fx.prompt, fx.n_prompt);
    test_llada2_eos(&ctx, fx.prompt, fx.n_prompt);
    test_llada2_cached(&ctx, fx.prompt, fx.n_prompt);
    close_ctx(&fx, &ctx);
    return test_report();
}
