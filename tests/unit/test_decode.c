/*
 * test_decode.c — the decode loop on a tiny random f32 checkpoint (written by make_model_write):
 * a request's output is identical alone vs batched with others (different prompts, lengths,
 * decoders, temperatures, CFG; a sequence joining mid-way; one cancelled) — also with KV caches of
 * every mode mixed in one batch (cancel frees the cancelled one's slots at once, none remain at the
 * end) —, seeds, step planning
 * for uneven blocks, event invariants, parameter validation messages, JSON parameter parsing and
 * event encoding, and the per-row sampler (top-k / top-p / CFG / eos flags / confidence).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "decode/decoder.h"
#include "decode/event_json.h"
#include "decode/sample.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

/* ---------------------------------------------------------------- recording sink */

#define MAX_REC 4096

typedef struct rec {
    int     n;                 /* commits recorded */
    int32_t step[MAX_REC], pos[MAX_REC], tok[MAX_REC];
    int     n_steps, n_blocks_ev, n_done;
    int     block_steps[64];   /* steps per block */
    int     last_block_seen;
    enum decode_finish finish;
    int     completion, committed, usage_steps;
    int     order_ok;          /* STEP/BLOCK/DONE ordering and step numbering */
    char    text[1024];
    char    block_text[1024];
} rec;

static void rec_init(rec *r) {
    memset(r, 0, sizeof *r);
    r->order_ok = 1;
    r->last_block_seen = -1;
}

static void on_ev(void *user, const decode_event *ev) {
    rec *r = ev->seq_user ? ev->seq_user : user;
    if (r->n_done) r->order_ok = 0; /* nothing after DONE */
    switch (ev->type) {
    case DECODE_EVENT_STEP:
        if (ev->step != r->n_steps) r->order_ok = 0;
        r->n_steps++;
        if (ev->block >= 0 && ev->block < 64) r->block_steps[ev->block]++;
        for (int i = 0; i < ev->n_commits && r->n < MAX_REC; i++, r->n++) {
            r->step[r->n] = ev->step;
            r->pos[r->n] = ev->commits[i].pos;
            r->tok[r->n] = ev->commits[i].token;
            if (i > 0 && ev->commits[i].pos <= ev->commits[i - 1].pos) r->order_ok = 0;
        }
        break;
    case DECODE_EVENT_BLOCK:
        if (ev->block != r->last_block_seen + 1) r->order_ok = 0;
        r->last_block_seen = ev->block;
        r->n_blocks_ev++;
        strncat(r->block_text, ev->text, sizeof r->block_text - strlen(r->block_text) - 1);
        break;
    case DECODE_EVENT_DONE:
        r->n_done++;
        r->finish = ev->finish;
        r->completion = ev->usage.completion_tokens;
        r->committed = ev->usage.committed;
        r->usage_steps = ev->usage.steps;
        snprintf(r->text, sizeof r->text, "%s", ev->text);
        break;
    }
}

static int rec_equal(const rec *a, const rec *b) {
    if (a->n != b->n || a->n_steps != b->n_steps || a->finish != b->finish) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->step[i] != b->step[i] || a->pos[i] != b->pos[i] || a->tok[i] != b->tok[i]) return 0;
    return 1;
}

/* ---------------------------------------------------------------- fixtures */

typedef struct req {
    int32_t       prompt[16];
    int           n_prompt;
    decode_params p;
} req;

/* Fills r[0..3] (r must hold four; n of them get prompts). */
static void make_reqs(req *r, int n, int caches) {
    for (int i = 0; i < n; i++) {
        r[i].p = decode_params_default();
        r[i].n_prompt = 3 + 2 * i;
        for (int j = 0; j < r[i].n_prompt; j++) r[i].prompt[j] = (int32_t)((j * 37 + i * 11 + 5) % 500);
    }
    /* 0: low_confidence, greedy */
    r[0].p.gen_length = 16, r[0].p.block_length = 8, r[0].p.steps = 8;
    /* 1: threshold, temperature + top_k, CFG */
    r[1].p.gen_length = 24, r[1].p.block_length = 8, r[1].p.decoder = DECODER_THRESHOLD;
    r[1].p.threshold = 0.02, r[1].p.temperature = 0.7, r[1].p.top_k = 50, r[1].p.seed = 77, r[1].p.cfg_scale = 1.0;
    /* 2: random decoder, temperature + top_p, aligned layout */
    r[2].p.gen_length = 20, r[2].p.block_length = 8, r[2].p.steps = 10, r[2].p.decoder = DECODER_RANDOM;
    r[2].p.temperature = 1.0, r[2].p.top_p = 0.9, r[2].p.seed = 3, r[2].p.layout = DECODE_LAYOUT_ALIGNED;
    /* 3: factor with drafts */
    r[3].p.gen_length = 12, r[3].p.block_length = 4, r[3].p.decoder = DECODER_FACTOR, r[3].p.factor = 2.9;
    r[3].p.stream_drafts = 1;
    if (caches) {   /* every mode in one batch, with different block positions and prompt lengths */
        r[0].p.cache = DECODE_CACHE_DUAL;
        r[1].p.cache = DECODE_CACHE_PREFIX;
        r[2].p.cache = DECODE_CACHE_VICINITY, r[2].p.prefix_look = 2, r[2].p.after_look = 3, r[2].p.warmup_steps = 2;
        r[3].p.cache = DECODE_CACHE_NONE;   /* without a cache, after cached ones in the batch */
        r[0].p.cache_refresh = 2;
    }
}

static decode_seq *mk(const model *m, const req *q, rec *r) {
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &q->p, q->prompt, q->n_prompt, &err);
    TEST_CHECK(s != NULL, "create: %s", err.msg);
    if (s) decode_seq_set_user(s, r);
    return s;
}

static void test_batched_vs_alone(const model *m, model_ctx *ctx, int caches) {
    enum { N = 4 };
    req q[N];
    make_reqs(q, N, caches);
    rec alone[N], batch[N], cancelled;
    um_err err = {0};
    decode_sink sink = {on_ev, NULL};
    for (int i = 0; i < N; i++) {
        rec_init(&alone[i]);
        decode_seq *s = mk(m, &q[i], &alone[i]);
        if (!s) return;
        TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "generate: %s", err.msg);
        TEST_CHECK(decode_seq_done(s), "seq %d done", i);
        decode_seq_free(s);
        TEST_CHECK(alone[i].n_done == 1 && alone[i].order_ok, "seq %d: one DONE, ordered events", i);
        TEST_CHECK(alone[i].committed == q[i].p.gen_length, "seq %d committed %d of %d", i, alone[i].committed,
                   q[i].p.gen_length);
        TEST_CHECK(alone[i].usage_steps == alone[i].n_steps, "seq %d usage.steps %d vs %d step events", i,
                   alone[i].usage_steps, alone[i].n_steps);
        TEST_CHECK(strcmp(alone[i].block_text, alone[i].text) == 0, "seq %d block texts == done text", i);
        /* every generated position exactly once */
        int seen[64] = {0}, dup = 0;
        for (int k = 0; k < alone[i].n; k++) {
            int idx = alone[i].pos[k] - q[i].n_prompt;
            if (idx < 0 || idx >= 64 || seen[idx]++) dup = 1;
        }
        TEST_CHECK(!dup, "seq %d: each position committed exactly once", i);
    }
    /* batched: 0, 1, 3 from the start, 2 joins after 2 steps, a 5th is cancelled after 3 steps */
    decode_seq *s[N + 1];
    for (int i = 0; i < N; i++) rec_init(&batch[i]);
    rec_init(&cancelled);
    s[0] = mk(m, &q[0], &batch[0]);
    s[1] = mk(m, &q[1], &batch[1]);
    s[3] = mk(m, &q[3], &batch[3]);
    s[4] = mk(m, &q[1], &cancelled);
    s[2] = NULL;
    int steps = 0, max_batch = 0;
    for (;;) {
        decode_seq *act[N + 1];
        int n = 0;
        if (steps == 2) s[2] = mk(m, &q[2], &batch[2]);
        if (steps == 3) {
            model_kv_stats k0, k1;
            model_kv_get_stats(ctx, &k0);
            decode_seq_finish(s[4], DECODE_FINISH_CANCELLED, NULL, &sink);
            decode_seq_finish(s[4], DECODE_FINISH_CANCELLED, NULL, &sink); /* no-op */
            model_kv_get_stats(ctx, &k1);
            /* the cancelled one (prefix cache + CFG: two slots) gave its cache back at once */
            if (caches)
                TEST_CHECK(k0.slots - k1.slots == 2 && k1.bytes < k0.bytes && k1.closed == k0.closed + 2,
                           "cancel freed %lld slots, %lld bytes", (long long)(k0.slots - k1.slots),
                           (long long)(k0.bytes - k1.bytes));
        }
        for (int i = 0; i <= N; i++)
            if (s[i] && !decode_seq_done(s[i])) act[n++] = s[i];
        if (n == 0) break;
        if (n > max_batch) max_batch = n;
        if (decode_step(ctx, act, n, &sink, &err) != 0) {
            TEST_CHECK(0, "decode_step: %s", err.msg);
            break;
        }
        steps++;
    }
    TEST_CHECK(max_batch == N + 1, "batch reached %d sequences", max_batch);
    for (int i = 0; i < N; i++) {
        TEST_CHECK(rec_equal(&alone[i], &batch[i]), "seq %d: batched output differs from alone (%d vs %d commits)",
                   i, batch[i].n, alone[i].n);
        TEST_CHECK(strcmp(alone[i].text, batch[i].text) == 0, "seq %d text", i);
    }
    TEST_CHECK(cancelled.n_done == 1 && cancelled.finish == DECODE_FINISH_CANCELLED && cancelled.n_steps == 3,
               "cancelled: %d DONE, finish %d, %d steps", cancelled.n_done, cancelled.finish, cancelled.n_steps);
    for (int i = 0; i <= N; i++) decode_seq_free(s[i]);
    model_kv_stats k;
    model_kv_get_stats(ctx, &k);
    TEST_CHECK(k.slots == 0 && k.bytes == 0 && k.opened == k.closed, "no KV slot left (%lld slots, %lld bytes)",
               (long long)k.slots, (long long)k.bytes);
    if (caches) TEST_CHECK(k.opened > 0 && k.peak_bytes > 0, "caches were used: %llu slots opened",
                           (unsigned long long)k.opened);
}

static void test_seeds(const model *m, model_ctx *ctx) {
    req q[4]; /* make_reqs fills four */
    make_reqs(q, 4, 0);
    q[0].p.temperature = 1.0;
    rec a, b, c;
    um_err err = {0};
    decode_sink sink = {on_ev, NULL};
    rec *rs[3] = {&a, &b, &c};
    uint64_t seeds[3] = {42, 42, 43};
    for (int i = 0; i < 3; i++) {
        rec_init(rs[i]);
        q[0].p.seed = seeds[i];
        decode_seq *s = mk(m, &q[0], rs[i]);
        TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "%s", err.msg);
        decode_seq_free(s);
    }
    TEST_CHECK(rec_equal(&a, &b), "same seed -> same output");
    TEST_CHECK(!rec_equal(&a, &c), "different seed -> different output");
}

static void test_step_plan(const model *m, model_ctx *ctx) {
    /* G 20, B 8: blocks of 8, 8, 4; S 10 -> 4, 4, 2 (proportional) */
    req q[4]; /* make_reqs fills four */
    make_reqs(q, 4, 0);
    q[0].p.gen_length = 20, q[0].p.block_length = 8, q[0].p.steps = 10;
    rec r;
    rec_init(&r);
    um_err err = {0};
    decode_sink sink = {on_ev, NULL};
    decode_seq *s = mk(m, &q[0], &r);
    TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "%s", err.msg);
    decode_seq_free(s);
    TEST_CHECK(r.n_steps == 10 && r.block_steps[0] == 4 && r.block_steps[1] == 4 && r.block_steps[2] == 2,
               "steps %d per block %d,%d,%d", r.n_steps, r.block_steps[0], r.block_steps[1], r.block_steps[2]);
    /* S = 3 blocks -> one step per block, commits whole blocks */
    q[0].p.steps = 3;
    rec_init(&r);
    s = mk(m, &q[0], &r);
    TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "%s", err.msg);
    decode_seq_free(s);
    TEST_CHECK(r.n_steps == 3 && r.committed == 20, "steps %d committed %d", r.n_steps, r.committed);
    /* steps 0 = auto = gen_length */
    q[0].p.steps = 0;
    rec_init(&r);
    s = mk(m, &q[0], &r);
    TEST_CHECK(decode_generate(ctx, s, &sink, &err) == 0, "%s", err.msg);
    decode_seq_free(s);
    TEST_CHECK(r.n_steps == 20, "auto steps %d", r.n_steps);
    TEST_CHECK(decoder_quota(12, 5, 0) == 3 && decoder_quota(12, 5, 1) == 3 && decoder_quota(12, 5, 2) == 2 &&
                   decoder_quota(12, 5, 4) == 2,
               "quota 12/5");
}

/* ---------------------------------------------------------------- validation */

static void expect_err(const model_config *cfg, decode_params p, int n_prompt, const char *param,
                       const char *needle) {
    um_err err = {0};
    int rc = decode_params_validate(&p, cfg, n_prompt, &err);
    TEST_CHECK(rc == -1 && err.code == UM_ERR_INVALID_ARG && strcmp(err.param, param) == 0 && strstr(err.msg, needle),
               "%s: rc %d param '%s' msg '%s' (want '%s')", param, rc, err.param, err.msg, needle);
}

static void test_validation(const model *m) {
    const model_config *cfg = &m->cfg;
    decode_params d = decode_params_default(), p;
    um_err err = {0};
    TEST_CHECK(decode_params_validate(&d, cfg, 10, &err) == 0, "defaults valid: %s", err.msg);
    char buf[256];
    p = d, p.gen_length = 0;
    snprintf(buf, sizeof buf, "gen_length must be between 1 and %d", cfg->max_seq - 10);
    expect_err(cfg, p, 10, "gen_length", buf);
    p = d, p.gen_length = cfg->max_seq;
    expect_err(cfg, p, 10, "gen_length", buf);
    expect_err(cfg, d, cfg->max_seq, "prompt", "context");
    p = d, p.block_length = 0;
    expect_err(cfg, p, 10, "block_length", "block_length must be between 1 and 128 (gen_length), got 0");
    p = d, p.block_length = 129;
    expect_err(cfg, p, 10, "block_length", "got 129");
    p = d, p.steps = 3; /* 4 blocks */
    expect_err(cfg, p, 10, "steps", "steps must be between 4 (one per block");
    p = d, p.steps = 129;
    expect_err(cfg, p, 10, "steps", "and 128 (gen_length)");
    p = d, p.steps = 3, p.decoder = DECODER_THRESHOLD; /* ignored by threshold */
    TEST_CHECK(decode_params_validate(&p, cfg, 10, &err) == 0, "threshold ignores steps: %s", err.msg);
    p = d, p.threshold = 0;
    expect_err(cfg, p, 10, "threshold", "threshold must be in (0, 1], got 0");
    p = d, p.threshold = 1.5;
    expect_err(cfg, p, 10, "threshold", "got 1.5");
    p = d, p.threshold = NAN;
    expect_err(cfg, p, 10, "threshold", "(0, 1]");
    p = d, p.temperature = -0.1;
    expect_err(cfg, p, 10, "temperature", "temperature must be between 0 and 2, got -0.1");
    p = d, p.temperature = 2.5;
    expect_err(cfg, p, 10, "temperature", "temperature must be between 0 and 2, got 2.5");
    p = d, p.top_p = 0;
    expect_err(cfg, p, 10, "top_p", "top_p must be in (0, 1], got 0");
    p = d, p.top_p = 1.01;
    expect_err(cfg, p, 10, "top_p", "got 1.01");
    p = d, p.top_k = -1;
    expect_err(cfg, p, 10, "top_k", "top_k must be between 0");
    p = d, p.factor = 0;
    expect_err(cfg, p, 10, "factor", "factor must be");
    p = d, p.cfg_scale = -1;
    expect_err(cfg, p, 10, "cfg_scale", "cfg_scale must be between 0");
    p = d, p.draft_every = 0;
    expect_err(cfg, p, 10, "draft_every", "draft_every must be >= 1");
    /* hierarchy / credit parameters (checked whatever the decoder) */
    TEST_CHECK(d.low_threshold == 0.0 && d.credit_alpha == 0.7 && d.credit_gamma == 0.2 && d.credit_decay == 0.8,
               "hierarchy/credit defaults");
    p = d, p.decoder = DECODER_HIERARCHY, p.low_threshold = -0.1;
    expect_err(cfg, p, 10, "low_threshold", "low_threshold must be in [0, 1] (0 = off), got -0.1");
    p = d, p.low_threshold = 1.5;
    expect_err(cfg, p, 10, "low_threshold", "got 1.5");
    p = d, p.low_threshold = NAN;
    expect_err(cfg, p, 10, "low_threshold", "[0, 1]");
    p = d, p.decoder = DECODER_CREDIT, p.credit_alpha = -1;
    expect_err(cfg, p, 10, "credit_alpha", "credit_alpha must be between 0 and 100, got -1");
    p = d, p.credit_alpha = INFINITY;
    expect_err(cfg, p, 10, "credit_alpha", "between 0 and 100");
    p = d, p.credit_gamma = -0.5;
    expect_err(cfg, p, 10, "credit_gamma", "credit_gamma must be between 0 and 100, got -0.5");
    p = d, p.credit_decay = 1.25;
    expect_err(cfg, p, 10, "credit_decay", "credit_decay must be in [0, 1], got 1.25");
    p = d, p.credit_decay = NAN;
    expect_err(cfg, p, 10, "credit_decay", "[0, 1]");
    p = d, p.decoder = DECODER_HIERARCHY, p.steps = 3, p.low_threshold = 0.5; /* steps ignored */
    TEST_CHECK(decode_params_validate(&p, cfg, 10, &err) == 0, "hierarchy valid: %s", err.msg);
    p = d, p.decoder = DECODER_CREDIT, p.credit_alpha = 0, p.credit_gamma = 0, p.credit_decay = 0;
    TEST_CHECK(decode_params_validate(&p, cfg, 10, &err) == 0, "credit edges valid: %s", err.msg);
    p = d, p.decoder = (enum decode_decoder)DECODER_COUNT_;
    expect_err(cfg, p, 10, "decoder", "hierarchy, credit, origin, maskgit_plus, topk_margin, entropy, joint_threshold or hierarchy_block");
    /* aligned layout: block_length may exceed gen_length */
    p = d, p.layout = DECODE_LAYOUT_ALIGNED, p.block_length = 256;
    TEST_CHECK(decode_params_validate(&p, cfg, 10, &err) == 0, "aligned B > G: %s", err.msg);
    /* prompt checks in create */
    int32_t bad[2] = {1, (int32_t)cfg->mask_id};
    decode_seq *s = decode_seq_create(m, &d, bad, 2, &err);
    TEST_CHECK(!s && strcmp(err.param, "prompt") == 0 && strstr(err.msg, "mask token"), "mask in prompt: %s", err.msg);
    bad[1] = cfg->n_embd_rows;
    s = decode_seq_create(m, &d, bad, 2, &err);
    TEST_CHECK(!s && strstr(err.msg, "outside the vocabulary"), "id outside vocab: %s", err.msg);
}

static void test_json_params(void) {
    decode_params p = decode_params_default();
    um_err err = {0};
    json_t *o = json_pack("{s:i, s:s, s:f, s:b, s:I, s:s, s:n}", "gen_length", 64, "decoder", "threshold", "threshold",
                          0.75, "stream_drafts", 1, "seed", (json_int_t)123456789012LL, "block_layout", "aligned",
                          "top_p", NULL);
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == 0, "apply: %s", err.msg);
    TEST_CHECK(p.gen_length == 64 && p.decoder == DECODER_THRESHOLD && p.threshold == 0.75 && p.stream_drafts &&
                   p.seed == 123456789012ull && p.layout == DECODE_LAYOUT_ALIGNED && p.top_p == 1.0,
               "applied values");
    json_decref(o);
    o = json_pack("{s:s}", "decoder", "nope");
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == -1 && strcmp(err.param, "decoder") == 0, "bad decoder");
    json_decref(o);
    o = json_pack("{s:s}", "steps", "ten");
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == -1 && strcmp(err.param, "steps") == 0, "steps string");
    json_decref(o);
    o = json_pack("{s:f}", "gen_length", 12.5);
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == -1 && strcmp(err.param, "gen_length") == 0, "fractional");
    json_decref(o);
    o = json_pack("{s:s, s:f, s:f, s:f, s:f}", "decoder", "credit", "low_threshold", 0.25, "credit_alpha", 1.5,
                  "credit_gamma", 0.5, "credit_decay", 0.6);
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == 0 && p.decoder == DECODER_CREDIT && p.low_threshold == 0.25 &&
                   p.credit_alpha == 1.5 && p.credit_gamma == 0.5 && p.credit_decay == 0.6,
               "hierarchy/credit fields: %s", err.msg);
    json_decref(o);
    o = json_pack("{s:s}", "credit_decay", "high");
    TEST_CHECK(decode_params_apply_json(&p, o, NULL, &err) == -1 && strcmp(err.param, "credit_decay") == 0, "decay string");
    json_decref(o);
    enum decode_decoder dd;
    TEST_CHECK(decode_decoder_parse("hierarchy", &dd) == 0 && dd == DECODER_HIERARCHY &&
                   strcmp(decode_decoder_name(DECODER_HIERARCHY), "hierarchy") == 0 &&
                   decode_decoder_parse("credit", &dd) == 0 && dd == DECODER_CREDIT &&
                   strcmp(decode_decoder_name(DECODER_CREDIT), "credit") == 0,
               "hierarchy/credit names");
    json_t *back = decode_params_to_json(&p);
    decode_params q = decode_params_default();
    TEST_CHECK(decode_params_apply_json(&q, back, NULL, &err) == 0 && memcmp(&p, &q, sizeof p) == 0, "round trip");
    json_decref(back);
}

static void test_event_json(void) {
    decode_commit c = {.pos = 12, .index = 2, .token = 881, .confidence = 0.5f, .special = 0, .piece = "h\xc3\xa9"};
    decode_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_STEP;
    ev.step = 3;
    ev.n_commits = 1;
    ev.commits = &c;
    ev.masks_left = 7;
    json_t *j = decode_event_to_json(&ev);
    json_t *c0 = json_array_get(json_object_get(j, "commits"), 0);
    TEST_CHECK(strcmp(json_string_value(json_object_get(j, "type")), "step") == 0, "type");
    TEST_CHECK(json_integer_value(json_object_get(c0, "id")) == 881 &&
                   strcmp(json_string_value(json_object_get(c0, "text")), "h\xc3\xa9") == 0,
               "commit fields");
    TEST_CHECK(json_integer_value(json_object_get(json_object_get(j, "progress"), "masks_left")) == 7, "progress");
    TEST_CHECK(json_object_get(j, "drafts") == NULL, "no drafts key without drafts");
    json_decref(j);
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_DONE;
    ev.finish = DECODE_FINISH_STOP;
    ev.text = "abc";
    ev.text_len = 3;
    ev.usage.prompt_tokens = 4, ev.usage.completion_tokens = 3;
    j = decode_event_to_json(&ev);
    TEST_CHECK(strcmp(json_string_value(json_object_get(j, "finish_reason")), "stop") == 0 &&
                   json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")) == 7 &&
                   json_is_null(json_object_get(j, "error")),
               "done fields");
    json_decref(j);
}

/* ---------------------------------------------------------------- sampler */

static sample_cfg scfg(int V) {
    sample_cfg c;
    memset(&c, 0, sizeof c);
    c.vocab = V, c.mask_id = V - 1, c.eos_id = V - 3, c.eot_id = V - 2, c.top_p = 1.0, c.seed = 9;
    return c;
}

static void test_sampler(void) {
    enum { V = 64 };
    float l[V], u[V], w[V];
    for (int v = 0; v < V; v++) l[v] = (float)((v * 7919) % 61) / 10.0f; /* max 6.0 at some v */
    int amax = 0;
    for (int v = 0; v < V - 1; v++)
        if (l[v] > l[amax]) amax = v;
    sample_cfg c = scfg(V);
    int32_t x0;
    double conf;
    /* greedy + confidence */
    memcpy(w, l, sizeof w);
    sample_row(&c, w, NULL, 0, 5, &x0, &conf);
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)l[v] - l[amax]);
    TEST_CHECK(x0 == amax && fabs(conf - 1.0 / z) < 1e-12, "greedy x0 %d conf %g", x0, conf);
    /* the mask token is never sampled, even when it has the largest logit */
    memcpy(w, l, sizeof w);
    w[V - 1] = 100;
    sample_row(&c, w, NULL, 0, 5, &x0, &conf);
    TEST_CHECK(x0 == amax, "mask never sampled (got %d)", x0);
    /* logits_eos_inf */
    memcpy(w, l, sizeof w);
    w[c.eos_id] = 50;
    c.logits_eos_inf = 1;
    sample_row(&c, w, NULL, 0, 5, &x0, &conf);
    TEST_CHECK(x0 == amax && isinf(w[c.eos_id]), "logits_eos_inf");
    c.logits_eos_inf = 0;
    /* confidence_eos_eot_inf: x0 == eot -> 0; others renormalised without eot */
    memcpy(w, l, sizeof w);
    w[c.eot_id] = 50;
    c.confidence_eos_eot_inf = 1;
    sample_row(&c, w, NULL, 0, 5, &x0, &conf);
    TEST_CHECK(x0 == c.eot_id && conf == 0.0, "eot quirk: x0 %d conf %g", x0, conf);
    memcpy(w, l, sizeof w);
    w[c.eot_id] = 5.9f;
    sample_row(&c, w, NULL, 0, 5, &x0, &conf);
    double z_no_eot = z - exp((double)l[c.eot_id] - l[amax]);
    TEST_CHECK(x0 == amax && fabs(conf - 1.0 / z_no_eot) < 1e-9, "eot excluded from the normalisation: conf %g vs %g",
               conf, 1.0 / z_no_eot);
    c.confidence_eos_eot_inf = 0;
    /* CFG: l = u + (s+1)(c-u) */
    for (int v = 0; v < V; v++) u[v] = (float)(v % 5);
    memcpy(w, l, sizeof w);
    c.cfg_scale = 2.0;
    sample_row(&c, w, u, 0, 5, &x0, &conf);
    int ok = 1;
    for (int v = 0; v < V; v++)
        if (fabsf(w[v] - (u[v] + 3.0f * (l[v] - u[v]))) > 1e-5f) ok = 0;
    TEST_CHECK(ok, "cfg combine");
    /* CFG of a token that is -inf in both rows: -inf + 3 * (-inf - -inf) is NaN; the token is
     * impossible (-inf), the others keep a proper softmax confidence */
    memcpy(w, l, sizeof w);
    w[7] = -INFINITY, u[7] = -INFINITY;
    sample_row(&c, w, u, 0, 5, &x0, &conf);
    double zc = 0, mc = -INFINITY;
    for (int v = 0; v < V; v++)
        if (v != 7 && (double)w[v] > mc) mc = w[v];
    for (int v = 0; v < V; v++)
        if (v != 7) zc += exp((double)w[v] - mc);
    TEST_CHECK(isinf(w[7]) && w[7] < 0 && x0 != 7 && conf > 0 && fabs(conf - exp((double)w[x0] - mc) / zc) < 1e-9,
               "cfg of a -inf token: w %g, x0 %d, conf %g", (double)w[7], x0, conf);
    u[7] = (float)(7 % 5);
    c.cfg_scale = 0;
    /* temperature: top_k = 1 -> always the argmax; top_k = 3 -> always among the 3 best;
     * tiny top_p -> argmax; no filtering -> several distinct tokens over positions */
    c.temperature = 2.0;
    int rank[V];
    for (int v = 0; v < V; v++) {
        rank[v] = 0;
        for (int q = 0; q < V - 1; q++)
            if (l[q] > l[v] || (l[q] == l[v] && q < v)) rank[v]++;
    }
    int bad1 = 0, bad3 = 0, badp = 0, distinct = 0, hit[V] = {0};
    for (int pos = 0; pos < 400; pos++) {
        c.top_k = 1;
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 1, pos, &x0, &conf);
        bad1 += x0 != amax;
        c.top_k = 3;
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 1, pos, &x0, &conf);
        bad3 += rank[x0] >= 3;
        c.top_k = 0;
        c.top_p = 1e-6;
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 1, pos, &x0, &conf);
        badp += x0 != amax;
        c.top_p = 1.0;
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 1, pos, &x0, &conf);
        if (!hit[x0]++) distinct++;
    }
    TEST_CHECK(bad1 == 0 && bad3 == 0 && badp == 0, "top_k/top_p filtering: %d %d %d", bad1, bad3, badp);
    TEST_CHECK(distinct >= 10, "temperature 2 samples %d distinct tokens", distinct);
    /* top_k = 17 at a high temperature: exactly the 17 best tokens get sampled */
    c.temperature = 50.0;
    c.top_k = 17;
    int hit17[V] = {0}, outside = 0, covered = 0;
    for (int pos = 0; pos < 2000; pos++) {
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 3, pos, &x0, &conf);
        outside += rank[x0] >= 17;
        if (!hit17[x0]++) covered++;
    }
    TEST_CHECK(outside == 0 && covered == 17, "top_k 17: %d outside, %d of 17 covered", outside, covered);
    c.top_k = 0;
    c.temperature = 2.0;
    /* top_p = 0.5: the nucleus of softmax(l/T) */
    c.top_p = 0.5;
    double pr[V], zz = 0;
    for (int v = 0; v < V - 1; v++) zz += pr[v] = exp(((double)l[v] - l[amax]) / c.temperature);
    int bad_nucleus = 0;
    for (int pos = 0; pos < 300; pos++) {
        memcpy(w, l, sizeof w);
        sample_row(&c, w, NULL, 2, pos, &x0, &conf);
        double above = 0; /* mass of tokens ranked strictly before x0 */
        for (int v = 0; v < V - 1; v++)
            if (rank[v] < rank[x0]) above += pr[v] / zz;
        if (above >= 0.5) bad_nucleus++;
    }
    TEST_CHECK(bad_nucleus == 0, "top_p 0.5: %d samples outside the nucleus", bad_nucleus);
    /* Gumbel noise is keyed by (seed, step, pos*V + token) only */
    TEST_CHECK(sample_gumbel(9, 3, 4, V, 5) == sample_gumbel(9, 3, 4, V, 5) &&
                   sample_gumbel(9, 3, 4, V, 5) != sample_gumbel(9, 4, 4, V, 5),
               "gumbel keying");
}

/* The parameter table's decoders column agrees with the decoders: steps / steps_per_block are read
 * exactly by the decoders that run a step budget (DECODER_F_FIXED_STEPS; under the block-diffusion
 * rules also threshold), and a request's unread parameters are listed as it spelled them. */
static void test_decoder_fields(void) {
    int i_steps = -1, i_spb = -1;
    for (int i = 0; i < decode_param_count(); i++) {
        decode_param_desc d;
        decode_param_at(i, &d);
        if (strcmp(d.name, "steps") == 0) i_steps = i;
        if (strcmp(d.name, "steps_per_block") == 0) i_spb = i;
    }
    TEST_CHECK(i_steps >= 0 && i_spb >= 0, "steps rows");
    for (int d = 0; d < DECODER_COUNT_; d++) {
        int fixed = (decoder_get((enum decode_decoder)d)->flags & DECODER_F_FIXED_STEPS) != 0;
        for (int bd = 0; bd <= 1; bd++) {
            int want = fixed || (bd && d == DECODER_THRESHOLD);
            TEST_CHECK(decode_param_read_by(i_steps, (enum decode_decoder)d, bd) == want, "%s bd %d: steps",
                       decode_decoder_name((enum decode_decoder)d), bd);
            TEST_CHECK(decode_param_read_by(i_spb, (enum decode_decoder)d, bd) == want, "%s bd %d: steps_per_block",
                       decode_decoder_name((enum decode_decoder)d), bd);
        }
    }
    decode_params p = decode_params_default();
    decode_params_src src = {0};
    um_err err = {0};
    json_t *body = json_pack("{s:s, s:i, s:f, s:f}", "decoder", "threshold", "diffusion_steps", 4, "threshold", 0.5,
                            "temperature", 0.0);
    TEST_CHECK(decode_params_apply_json(&p, body, &src, &err) == 0, "apply: %s", err.msg);
    model_config cfg = {0};
    json_t *names = NULL;
    decode_params_unused(&p, &src, &cfg, &names);
    char *s = names ? json_dumps(names, JSON_COMPACT) : NULL;
    TEST_CHECK(s && strcmp(s, "[\"diffusion_steps\"]") == 0, "unused: %s", s ? s : "none");
    free(s);
    json_decref(names);
    json_decref(body);
}

int main(void) {
    test_decoder_fields();
    test_json_params();
    test_event_json();
    test_sampler();

    make_model_opts o = test_model_opts();
    o.dtype = DTYPE_F32;
    o.no_tokenizer = 1;
    um_err err = {0};
    model m;
    if (test_model_make("test_decode_model", &o, &m, &err) != 0) {
        fprintf(stderr, "model: %s\n", err.msg);
        return 1;
    }
    backend *be = backend_cpu_init(1);
    model_ctx ctx;
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "model_ctx_init: %s\n", err.msg);
        return 1;
    }
    test_validation(&m);
    test_batched_vs_alone(&m, &ctx, 0);
    test_batched_vs_alone(&m, &ctx, 1);
    test_seeds(&m, &ctx);
    test_step_plan(&m, &ctx);
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    decode_thread_scratch_free();
    return test_report();
}
