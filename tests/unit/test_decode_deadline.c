/*
 * test_decode_deadline.c — the time limit's last step (decode_seq_set_deadline,
 * decode_params.time_limit_ms) on tiny random f32 checkpoints (LLaDA layout, Dream's shifted logits,
 * LLaDA2's block-causal rules): for every decoder and cache mode, a sequence whose deadline has passed after its first step commits
 * every still-masked position of its active block in ONE step — at temperature 0 exactly the argmax
 * (mask excluded) of a full forward of the canvas it had, read through decode_seq_logit_row — then
 * finishes that block and ends (DONE time_limited, no later block) — with a KV cache the same
 * ending (the logits then come from the cache's window); a deadline found between blocks ends the sequence without a step; a batch-mate without
 * a deadline decodes exactly as alone; and the parameter time_limit_ms (alias t_max_predict_ms)
 * sets the default deadline. No timing is asserted: deadlines are set in the past.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "decode/event_json.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- recording sink */

#define MAX_POS 64

typedef struct rec {
    int      n_steps, n_blocks_ev, n_done;
    int      last_block;                 /* block of the last STEP event */
    int      last_n;                     /* commits of the last STEP event */
    int32_t  last_pos[MAX_POS], last_tok[MAX_POS];
    int      all_n;                      /* every commit, in order */
    int32_t  all_pos[4 * MAX_POS], all_tok[4 * MAX_POS];
    enum decode_finish finish;
    int      time_limited, usage_steps, committed, after_done;
} rec;

static void on_ev(void *user, const decode_event *ev) {
    rec *r = ev->seq_user ? ev->seq_user : user;
    if (r->n_done) r->after_done = 1;
    switch (ev->type) {
    case DECODE_EVENT_STEP:
        r->n_steps++;
        r->last_block = ev->block;
        r->last_n = ev->n_commits < MAX_POS ? ev->n_commits : MAX_POS;
        for (int i = 0; i < r->last_n; i++) {
            r->last_pos[i] = ev->commits[i].pos;
            r->last_tok[i] = ev->commits[i].token;
        }
        for (int i = 0; i < ev->n_commits && r->all_n < 4 * MAX_POS; i++, r->all_n++) {
            r->all_pos[r->all_n] = ev->commits[i].pos;
            r->all_tok[r->all_n] = ev->commits[i].token;
        }
        break;
    case DECODE_EVENT_BLOCK: r->n_blocks_ev++; break;
    case DECODE_EVENT_DONE:
        r->n_done++;
        r->finish = ev->finish;
        r->time_limited = ev->time_limited;
        r->usage_steps = ev->usage.steps;
        r->committed = ev->usage.committed;
        break;
    }
}

/* ---------------------------------------------------------------- reference */

/* argmax over the vocabulary without the mask token of a forward of the canvas rows x[0..L) (no
 * cache; block_len: block-causal attention with that block size, 0 = bidirectional), at the logits
 * row of every position pos[0..n) (decode_seq_logit_row): into tok. 0, or -1 on a failed forward. */
static int ref_argmax(model_ctx *ctx, const decode_seq *s, const int32_t *x, int L, int block_len, const int32_t *pos,
                      int n, int32_t *tok) {
    const model_config *cfg = &ctx->m->cfg;
    const int V = cfg->n_embd_rows;
    int32_t start[2] = {0, L}, *p = malloc((size_t)L * sizeof *p), *rows = malloc((size_t)n * sizeof *rows);
    for (int i = 0; i < L; i++) p[i] = i;
    for (int i = 0; i < n; i++) rows[i] = decode_seq_logit_row(s, pos[i]);
    float *lg = malloc((size_t)n * (size_t)V * sizeof *lg);
    fwd_batch b;
    memset(&b, 0, sizeof b);
    b.n_seqs = 1, b.seq_start = start, b.tokens = x, b.pos = p, b.n_out = n, b.out_rows = rows;
    b.block_len = &block_len;
    um_err err = {0};
    int rc = model_forward(ctx, &b, lg, &err);
    TEST_CHECK(rc == 0, "reference forward: %s", err.msg);
    for (int i = 0; i < n && rc == 0; i++) {
        const float *l = lg + (size_t)i * (size_t)V;
        int best = -1;
        for (int v = 0; v < V; v++)
            if (v != cfg->mask_id && (best < 0 || l[v] > l[best])) best = v;
        tok[i] = best;
    }
    free(p);
    free(rows);
    free(lg);
    return rc;
}

/* ---------------------------------------------------------------- cases */

/* About one position per step, whatever the decoder: 2 blocks of 8 after an 8-token prompt (block
 * 0 = positions 8..15 in both layouts). */
static decode_params params_for(const model *m, enum decode_decoder d, enum decode_cache cache) {
    decode_params p = decode_params_for_model(m);
    p.gen_length = 16, p.block_length = 8, p.decoder = d, p.cache = cache, p.temperature = 0;
    p.steps = 16;                  /* fixed-step decoders: one token per step */
    p.steps_per_block = 0;
    p.threshold = 0.99;            /* threshold-like decoders: the most confident one per step */
    p.factor = 0.01;
    p.max_post_steps = 2;
    p.sub_block_length = 4;
    p.prefix_look = 2, p.after_look = 3;
    return p;
}

#define N_PROMPT 8
static const int32_t k_prompt[N_PROMPT] = {7, 11, 300, 42, 5, 90, 12, 401};

/* One sequence: a first step, then its deadline is set in the past; the next step must be its last. */
static void test_last_step(const model *m, model_ctx *ctx, enum decode_decoder d, enum decode_cache cache,
                           const char *what) {
    decode_params p = params_for(m, d, cache);
    const char *dn = decode_decoder_name(d), *cn = decode_cache_name(cache);
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &p, k_prompt, N_PROMPT, &err);
    TEST_CHECK(s != NULL, "%s %s %s: create: %s", what, dn, cn, err.msg);
    if (!s) return;
    rec r;
    memset(&r, 0, sizeof r);
    decode_seq_set_user(s, &r);
    decode_sink sink = {on_ev, NULL};
    TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "step 0: %s", err.msg);
    TEST_CHECK(decode_seq_deadline(s) == 0 && !decode_seq_expired(s, time_now_ns()), "no limit: no deadline");
    decode_seq_cursor c;
    decode_seq_cursor_get(s, &c);
    const int lo = c.blk_lo[0], hi = c.blk_hi[0];
    int L;
    const int32_t *canvas = decode_seq_canvas(s, &L);
    int32_t *x = malloc((size_t)L * sizeof *x);
    memcpy(x, canvas, (size_t)L * sizeof *x);
    if (r.n_blocks_ev == 1) {
        /* the credit decoder under LLaDA2's rules commits the whole block at once: the deadline
         * then finds no block in progress and the sequence ends without a step */
        TEST_CHECK(m->cfg.block_causal > 0 && d == DECODER_CREDIT, "%s %s %s: step 0 finished block 0", what, dn, cn);
        decode_seq_set_deadline(s, 1);
        TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "step: %s", err.msg);
        TEST_CHECK(decode_seq_done(s) && r.n_steps == 1 && r.usage_steps == 1 && r.n_blocks_ev == 1 && r.time_limited,
                   "%s %s %s: ended between blocks without a step (%d steps)", what, dn, cn, r.n_steps);
        free(x);
        decode_seq_free(s);
        return;
    }
    TEST_CHECK(c.block == 0 && lo == N_PROMPT && hi == N_PROMPT + 8, "%s %s %s: block 0 is [%d, %d)", what, dn, cn,
               lo, hi);
    int32_t masked[MAX_POS];
    int n_masked = 0;
    for (int q = lo; q < hi; q++)
        if (x[q] == m->cfg.mask_id) masked[n_masked++] = q;
    decode_seq_set_deadline(s, 1);   /* long past */
    TEST_CHECK(decode_seq_expired(s, time_now_ns()), "expired");
    const int steps_before = r.n_steps;
    TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "last step: %s", err.msg);
    TEST_CHECK(decode_seq_done(s) && r.n_done == 1 && !r.after_done, "%s %s %s: done after the deadline's step", what,
               dn, cn);
    TEST_CHECK(r.time_limited && (r.finish == DECODE_FINISH_LENGTH || r.finish == DECODE_FINISH_STOP),
               "%s %s %s: DONE time_limited %d, finish %s", what, dn, cn, r.time_limited, decode_finish_name(r.finish));
    /* one more step, which committed every masked position of block 0 and finished it */
    TEST_CHECK(r.n_steps == steps_before + 1 && r.usage_steps == 2 && r.last_block == 0,
               "%s %s %s: steps %d (usage %d), last block %d", what, dn, cn, r.n_steps, r.usage_steps, r.last_block);
    TEST_CHECK(r.n_blocks_ev == 1 && r.committed == hi - lo, "%s %s %s: %d blocks finished, %d committed", what, dn,
               cn, r.n_blocks_ev, r.committed);
    int same_pos = r.last_n == n_masked;
    for (int i = 0; same_pos && i < n_masked; i++) same_pos = r.last_pos[i] == masked[i];
    TEST_CHECK(same_pos, "%s %s %s: the last step committed %d positions, the %d masked ones expected", what, dn, cn,
               r.last_n, n_masked);
    if (cache == DECODE_CACHE_NONE && same_pos && n_masked > 0) {
        /* what the step's forward saw: the canvas (block-causal rules: up to the block's end) */
        const int bd = m->cfg.block_causal > 0;
        int32_t want[MAX_POS];
        if (ref_argmax(ctx, s, x, bd ? hi : L, bd ? p.block_length : 0, masked, n_masked, want) == 0) {
            int bad = -1;
            for (int i = 0; i < n_masked && bad < 0; i++)
                if (r.last_tok[i] != want[i]) bad = i;
            TEST_CHECK(bad < 0, "%s %s: position %d committed %d, the argmax is %d", what, dn,
                       bad >= 0 ? masked[bad] : -1, bad >= 0 ? r.last_tok[bad] : -1, bad >= 0 ? want[bad] : -1);
        }
    }
    free(x);
    decode_seq_free(s);
}

/* A deadline found between blocks ends the sequence there without a step: after block 0 finished
 * (steps 2 over 2 blocks: one step each), and before the first step. */
static void test_between_blocks(const model *m, model_ctx *ctx) {
    decode_params p = params_for(m, DECODER_LOW_CONFIDENCE, DECODE_CACHE_NONE);
    p.steps = 2;
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &p, k_prompt, N_PROMPT, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (!s) return;
    rec r;
    memset(&r, 0, sizeof r);
    decode_seq_set_user(s, &r);
    decode_sink sink = {on_ev, NULL};
    TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "step 0: %s", err.msg);
    TEST_CHECK(r.n_blocks_ev == 1 && !decode_seq_done(s), "block 0 finished by step 0");
    decode_seq_set_deadline(s, 1);
    TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "step: %s", err.msg);
    TEST_CHECK(decode_seq_done(s) && r.n_steps == 1 && r.usage_steps == 1 && r.n_blocks_ev == 1 && r.committed == 8 &&
                   r.time_limited && r.n_done == 1,
               "between blocks: ends without a step (%d steps, %d blocks, %d committed, time_limited %d)", r.n_steps,
               r.n_blocks_ev, r.committed, r.time_limited);
    decode_seq_free(s);
}

/* A deadline set before the first step ends the sequence with no step at all. */
static void test_before_first_step(const model *m, model_ctx *ctx) {
    decode_params p = params_for(m, DECODER_LOW_CONFIDENCE, DECODE_CACHE_NONE);
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &p, k_prompt, N_PROMPT, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (!s) return;
    rec r;
    memset(&r, 0, sizeof r);
    decode_seq_set_user(s, &r);
    decode_sink sink = {on_ev, NULL};
    decode_seq_set_deadline(s, 1);
    TEST_CHECK(decode_step(ctx, &s, 1, &sink, &err) == 0, "step: %s", err.msg);
    TEST_CHECK(decode_seq_done(s) && r.n_steps == 0 && r.n_done == 1 && r.time_limited && r.committed == 0 &&
                   r.finish == DECODE_FINISH_LENGTH,
               "a deadline before the first step ends it at once: %d steps, time_limited %d, committed %d",
               r.n_steps, r.time_limited, r.committed);
    decode_seq_free(s);
}

/* A batch of two: A's deadline passes after step 1, B has none; B's commits are those of B alone. */
static void test_batch_mate(const model *m, model_ctx *ctx, enum decode_cache cache) {
    decode_params pa = params_for(m, DECODER_LOW_CONFIDENCE, cache), pb = params_for(m, DECODER_THRESHOLD, cache);
    pb.threshold = 0.5;
    const int32_t prompt_b[3] = {99, 3, 17};
    um_err err = {0};
    decode_sink sink = {on_ev, NULL};
    rec alone, ra, rb;
    memset(&alone, 0, sizeof alone);
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    decode_seq *s = decode_seq_create(m, &pb, prompt_b, 3, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (!s) return;
    decode_seq_set_user(s, &alone);
    TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "alone: %s", err.msg);
    decode_seq_free(s);
    decode_seq *v[2];
    v[0] = decode_seq_create(m, &pa, k_prompt, N_PROMPT, &err);
    v[1] = decode_seq_create(m, &pb, prompt_b, 3, &err);
    TEST_CHECK(v[0] && v[1], "create: %s", err.msg);
    if (!v[0] || !v[1]) return;
    decode_seq_set_user(v[0], &ra);
    decode_seq_set_user(v[1], &rb);
    for (int k = 0; k < 200 && !(decode_seq_done(v[0]) && decode_seq_done(v[1])); k++) {
        if (k == 2) decode_seq_set_deadline(v[0], 1);
        TEST_CHECK(decode_step(ctx, v, 2, &sink, &err) == 0, "batched step: %s", err.msg);
    }
    TEST_CHECK(ra.time_limited && ra.usage_steps == 3 && ra.n_blocks_ev == 1,
               "A (cache %s): time limited after 3 steps (%d, %d blocks)", decode_cache_name(cache), ra.usage_steps,
               ra.n_blocks_ev);
    int same = rb.all_n == alone.all_n && rb.n_steps == alone.n_steps && !rb.time_limited && rb.finish == alone.finish;
    for (int i = 0; same && i < rb.all_n; i++) same = rb.all_pos[i] == alone.all_pos[i] && rb.all_tok[i] == alone.all_tok[i];
    TEST_CHECK(same, "B (cache %s): batched with a time-limited A it decodes as alone (%d vs %d commits)",
               decode_cache_name(cache), rb.all_n, alone.all_n);
    decode_seq_free(v[0]);
    decode_seq_free(v[1]);
}

/* time_limit_ms (and llama.cpp's t_max_predict_ms) from JSON; the default deadline counts from the
 * first step; its range. */
static void test_param(const model *m, model_ctx *ctx) {
    decode_params p = params_for(m, DECODER_LOW_CONFIDENCE, DECODE_CACHE_NONE);
    um_err err = {0};
    decode_params_src src;
    memset(&src, 0, sizeof src);
    json_t *o = json_pack("{s:i}", "t_max_predict_ms", 250);
    TEST_CHECK(decode_params_apply_json(&p, o, &src, &err) == 0 && p.time_limit_ms == 250 &&
                   strcmp(decode_params_src_get(&src, "time_limit_ms"), "t_max_predict_ms") == 0,
               "t_max_predict_ms -> time_limit_ms %d", p.time_limit_ms);
    json_decref(o);
    o = json_pack("{s:i}", "t_max_predict_ms", -1);   /* llama.cpp's "off" */
    p.time_limit_ms = 0;
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == 0 && p.time_limit_ms == 0, "-1 = not given");
    json_decref(o);
    p.time_limit_ms = 86400001;
    TEST_CHECK(decode_params_check(&p, &err) != 0 && strcmp(err.param, "time_limit_ms") == 0 &&
                   strstr(err.msg, "between 0 (off) and 86400000") != NULL,
               "range: %s", err.msg);
    p.time_limit_ms = 5000;
    decode_seq *s = decode_seq_create(m, &p, k_prompt, N_PROMPT, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (!s) return;
    TEST_CHECK(decode_seq_deadline(s) == 0, "no deadline before the first step");
    const uint64_t t0 = time_now_ns();
    TEST_CHECK(decode_step(ctx, &s, 1, NULL, &err) == 0, "step: %s", err.msg);
    const uint64_t d = decode_seq_deadline(s);
    TEST_CHECK(d >= t0 + 5000000000ull && d <= time_now_ns() + 5000000000ull, "deadline = first step + 5 s");
    TEST_CHECK(!decode_seq_expired(s, d - 1) && decode_seq_expired(s, d), "expired exactly from the deadline on");
    decode_seq_set_deadline(s, 0);
    TEST_CHECK(decode_seq_deadline(s) == d, "set_deadline(0) restores the default");
    decode_seq_free(s);
}

static int run_model(const char *name, const char *preset) {
    make_model_opts o;
    CHECK(make_model_preset(preset, &o) == 0);
    o.quiet = 1;
    o.dtype = DTYPE_F32;
    o.no_tokenizer = 1;
    um_err err = {0};
    model m;
    if (test_model_make(name, &o, &m, &err) != 0) {
        fprintf(stderr, "model: %s\n", err.msg);
        return 1;
    }
    backend *be = backend_cpu_init(1);
    model_ctx ctx;
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "model_ctx_init: %s\n", err.msg);
        return 1;
    }
    for (int d = 0; d < DECODER_COUNT_; d++)
        for (int cm = 0; cm < DECODE_CACHE_COUNT_; cm++)
            test_last_step(&m, &ctx, (enum decode_decoder)d, (enum decode_cache)cm, preset);
    if (strcmp(preset, "tiny") == 0) {
        test_before_first_step(&m, &ctx);
        test_between_blocks(&m, &ctx);
        test_batch_mate(&m, &ctx, DECODE_CACHE_NONE);
        test_batch_mate(&m, &ctx, DECODE_CACHE_DUAL);
        test_param(&m, &ctx);
    }
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    return 0;
}

int main(void) {
    /* the DONE event's JSON says it */
    decode_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_DONE;
    ev.finish = DECODE_FINISH_LENGTH;
    ev.time_limited = 1;
    json_t *j = decode_event_to_json(&ev);
    TEST_CHECK(json_is_true(json_object_get(j, "time_limited")), "DONE JSON carries time_limited");
    json_decref(j);
    if (run_model("test_decode_deadline_llada", "tiny") || run_model("test_decode_deadline_dream", "dream-tiny") ||
        run_model("test_decode_deadline_llada2", "llada2-tiny"))
        return 1;
    decode_thread_scratch_free();
    return test_report();
}
