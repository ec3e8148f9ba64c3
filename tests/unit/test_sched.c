/*
 * test_sched.c — the scheduler's preemption at step boundaries, on a real engine thread over tiny
 * f32 checkpoints of each family the CPU runs (LLaDA, Dream, LLaDA-MoE, LLaDA2):
 *  - owner A fills the batch, owner B arrives: one of A's sequences is paused at the next step
 *    boundary, B's first step comes before any of A's sequences finished, and every output — the
 *    paused one's included — equals its unpaused run alone, commit for commit (every decoder,
 *    cache modes none / prefix / dual / vicinity, CFG, temperature > 0 with seeds); step events stay
 *    numbered 0, 1, 2, ... across the pause;
 *  - max_paused 0 (never pause): B waits until one of A's finished;
 *  - a paused sequence cancelled: its DONE ("cancelled") comes from the engine, no step after the
 *    pause, its KV slots are closed;
 *  - background requests (a detached session's) yield to a request of the same owner, and resume
 *    when the capacity is free again;
 *  - the KV budget (sched_opts.kv_rows) forbids a pause that would exceed it.
 * The engine is held at chosen steps through sched_opts.step_check (a gate on a condition
 * variable), so the interleavings are exact whatever the machine's load.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "model/make_model.h"
#include "model/model.h"
#include "sched/sched.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"
#include "util/strbuf.h"

/* ---------------------------------------------------------------- recording emit + step gate */

/* What one request's events said (filled by the engine thread under g_mu). */
typedef struct rec {
    strbuf  commits;      /* "step:pos=id,pos=id;" per step event */
    int     n_steps;      /* step events */
    int     numbering_ok; /* step events numbered 0, 1, 2, ... */
    int     first_step;   /* global event order of its first step event, -1 before */
    int     done;         /* global event order of its DONE, -1 before */
    char    finish[16];
    int     usage_steps;
    double  paused_ms;
} rec;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  g_cv = PTHREAD_COND_INITIALIZER;
static int g_order;   /* events seen so far, all requests */

/* The step gate (sched_opts.step_check): calls counts the engine's batched steps; the engine
 * blocks before step number hold_at (1-based) until the test moves hold_at. */
static int g_calls, g_hold_at, g_blocked;

static void rec_init(rec *r) {
    memset(r, 0, sizeof *r);
    strbuf_put(&r->commits, "", 0);
    r->numbering_ok = 1;
    r->first_step = r->done = -1;
}

static void on_emit(void *user, sched_event *ev) {
    (void)user;
    rec *r = ev->req->owner;
    pthread_mutex_lock(&g_mu);
    const int order = g_order++;
    if (ev->kind == SCHED_EV_STEP) {
        const int step = ev->ev.step;
        if (step != r->n_steps) r->numbering_ok = 0;
        if (r->first_step < 0) r->first_step = order;
        r->n_steps++;
        strbuf_printf(&r->commits, "%d:", step);
        for (int i = 0; i < ev->ev.n_commits; i++)
            strbuf_printf(&r->commits, "%d=%d,", (int)ev->ev.commits[i].pos, (int)ev->ev.commits[i].token);
        strbuf_put(&r->commits, ";", 1);
    } else if (ev->kind == SCHED_EV_DONE) {
        CHECK(ev->final && ev->ev.type == DECODE_EVENT_DONE);
        r->done = order;
        snprintf(r->finish, sizeof r->finish, "%s", decode_finish_name(ev->ev.finish));
        r->usage_steps = ev->ev.usage.steps;
        r->paused_ms = ev->paused_ms;
    }
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    sched_event_free(ev);
}

static int gate_check(void *user, decode_seq **seqs, int n, um_err *err) {
    (void)user, (void)seqs, (void)n, (void)err;
    pthread_mutex_lock(&g_mu);
    g_calls++;
    while (g_hold_at > 0 && g_calls == g_hold_at) {
        g_blocked = g_calls;
        pthread_cond_broadcast(&g_cv);
        pthread_cond_wait(&g_cv, &g_mu);
    }
    g_blocked = 0;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

/* Hold the engine before its k-th batched step from now (k >= 1). */
static void gate_hold_in(int k) {
    pthread_mutex_lock(&g_mu);
    g_hold_at = g_calls + k;
    pthread_mutex_unlock(&g_mu);
}

/* Wait until the engine is held. */
static void gate_wait_held(void) {
    pthread_mutex_lock(&g_mu);
    while (!g_blocked) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* Let the held engine go on; k > 0: hold it again before its k-th step from here, 0: run freely. */
static void gate_release(int k) {
    pthread_mutex_lock(&g_mu);
    g_hold_at = k > 0 ? g_blocked + k : 0;
    g_blocked = 0;   /* until the engine is held again */
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void wait_done(rec *r) {
    pthread_mutex_lock(&g_mu);
    while (r->done < 0) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------- fixtures */

typedef struct job {
    decode_params p;
    int32_t       prompt[8];
    int           n_prompt;
} job;

static job job_make(decode_params p, int variant) {
    job j;
    j.p = p;
    j.n_prompt = 3 + variant;
    for (int i = 0; i < j.n_prompt; i++) j.prompt[i] = (int32_t)((i * 37 + variant * 11 + 5) % 500);
    return j;
}

static sched_req *req_make(const model *m, const job *j, uint64_t owner, rec *r) {
    um_err err = {0};
    decode_seq *seq = decode_seq_create(m, &j->p, j->prompt, j->n_prompt, &err);
    CHECK(seq);   /* the fixtures are valid */
    sched_req *q = sched_req_create(seq, owner);
    q->owner = r;
    return q;
}

static void submit(sched *s, sched_req *q) {
    um_err err = {0};
    int pos = 0;
    CHECK(sched_submit(s, q, &pos, &err) == 0);
}

static sched *sched_make(model_ctx *ctx, int max_batch, int max_paused, long kv_rows) {
    sched_opts o = {.max_batch = max_batch, .max_queue = 64, .host_loop = 1, .step_check = gate_check,
                    .max_paused = max_paused, .kv_rows = kv_rows};
    pthread_mutex_lock(&g_mu);
    g_calls = g_hold_at = g_blocked = 0;
    pthread_mutex_unlock(&g_mu);
    return sched_create(&ctx, 1, &o, on_emit, NULL);
}

/* Its unpaused run alone (a scheduler of its own, nothing else submitted). */
static void run_alone(model_ctx *ctx, const model *m, const job *j, rec *out) {
    sched *s = sched_make(ctx, 2, 2, 0);
    rec_init(out);
    sched_req *q = req_make(m, j, 1, out);
    submit(s, q);
    wait_done(out);
    sched_free(s);
    sched_req_free(q);
}

static int rec_same(const rec *a, const rec *b) {
    return a->n_steps == b->n_steps && !strcmp(a->finish, b->finish) && !strcmp(a->commits.p, b->commits.p);
}

static void kv_none_left(model_ctx *ctx, const char *what) {
    model_kv_stats k;
    model_kv_get_stats(ctx, &k);
    TEST_CHECK(k.slots == 0 && k.opened == k.closed, "%s: %lld KV slots left open", what, (long long)k.slots);
}

/* The cases' shape: r[0] runs the engine's first step alone, r[1] joins it for the second (r[1]
 * has run 1 step, r[0] 2); the engine is held before its third, and r[2] arrives (owner 1 or 2). */
typedef struct trio {
    rec        got[3];
    sched_req *r[3];
} trio;

static void trio_init(trio *t, const model *m, const job j[3], uint64_t third_owner) {
    for (int i = 0; i < 3; i++) {
        rec_init(&t->got[i]);
        t->r[i] = req_make(m, &j[i], i < 2 ? 1 : third_owner, &t->got[i]);
    }
}

/* Submits r[0] and r[1] and returns with the engine held before its third step (the caller then
 * submits r[2]). r[1] is submitted while the engine is held before its first step (r[0] alone), so
 * it is admitted at the next boundary and both run step two together however the threads are
 * scheduled: submitting both at once let a loaded machine run r[0]'s first steps alone, and r[2]
 * then took the free slot before r[1]. */
static void trio_start(sched *s, trio *t) {
    gate_hold_in(1);
    submit(s, t->r[0]);
    gate_wait_held();
    submit(s, t->r[1]);
    gate_release(2);
    gate_wait_held();
}

static void trio_wait(trio *t) {
    for (int i = 0; i < 3; i++) wait_done(&t->got[i]);
}

/* The trio with the engine never held (B submitted at once): every run to its end, then the
 * scheduler's counters, and the scheduler freed. */
static sched_stats trio_run_free(sched *s, trio *t) {
    trio_start(s, t);
    submit(s, t->r[2]);
    gate_release(0);
    trio_wait(t);
    sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    return st;
}

static void trio_free(trio *t) {
    for (int i = 0; i < 3; i++) {
        strbuf_free(&t->got[i].commits);
        sched_req_free(t->r[i]);
    }
}

/* ---------------------------------------------------------------- cases */

/* A (owner 1) fills a batch of 2 with a1, a2; after a few steps B (owner 2) arrives. */
static void test_pause_for_other_owner(model_ctx *ctx, const model *m, const char *what, decode_params pa,
                                       decode_params pb) {
    job j[3] = {job_make(pa, 0), job_make(pa, 1), job_make(pb, 2)};
    j[1].p.seed = pa.seed + 1;
    rec alone[3];
    for (int i = 0; i < 3; i++) run_alone(ctx, m, &j[i], &alone[i]);

    sched *s = sched_make(ctx, 2, 2, 0);
    trio t;
    trio_init(&t, m, j, 2);
    sched_req *a1 = t.r[0], *a2 = t.r[1], *b = t.r[2];
    rec *got = t.got;
    trio_start(s, &t);   /* A runs two steps, then the engine waits before the third */
    submit(s, b);
    gate_release(2);   /* A's third step; then B is admitted and the engine waits again */
    gate_wait_held();
    sched_stats st;
    sched_get_stats(s, &st);
    TEST_CHECK(st.paused == 1 && st.active == 2 && st.preempted == 1, "%s: paused %d active %d preempted %llu", what,
               st.paused, st.active, (unsigned long long)st.preempted);
    TEST_CHECK(a2->state == SCHED_REQ_PAUSED && a1->state == SCHED_REQ_ACTIVE && b->state == SCHED_REQ_ACTIVE,
               "%s: the latest admitted of A is the one paused (states %d %d %d)", what, a1->state, a2->state, b->state);
    gate_release(0);
    trio_wait(&t);
    sched_get_stats(s, &st);
    TEST_CHECK(st.resumed == 1 && st.paused == 0, "%s: resumed %llu", what, (unsigned long long)st.resumed);
    sched_free(s);
    TEST_CHECK(got[2].first_step >= 0 && got[2].first_step < got[0].done && got[2].first_step < got[1].done,
               "%s: B's first step (event %d) before A finished (events %d, %d)", what, got[2].first_step, got[0].done,
               got[1].done);
    TEST_CHECK(got[1].paused_ms > 0 && got[0].paused_ms == 0, "%s: paused_ms %.3f / %.3f", what, got[1].paused_ms,
               got[0].paused_ms);
    const char *names[3] = {"a1", "a2 (paused)", "b"};
    for (int i = 0; i < 3; i++) {
        TEST_CHECK(rec_same(&alone[i], &got[i]), "%s: %s differs from its run alone (%d vs %d steps, %s vs %s)\n  %s\n  %s",
                   what, names[i], got[i].n_steps, alone[i].n_steps, got[i].finish, alone[i].finish,
                   got[i].commits.p, alone[i].commits.p);
        TEST_CHECK(got[i].numbering_ok && got[i].usage_steps == got[i].n_steps, "%s: %s step numbering", what, names[i]);
    }
    TEST_CHECK(alone[1].n_steps > 4, "%s: the paused one had steps left (%d)", what, alone[1].n_steps);
    for (int i = 0; i < 3; i++) strbuf_free(&alone[i].commits);
    trio_free(&t);
    kv_none_left(ctx, what);
}

/* max_paused 0: nobody is paused; B's first step comes only after one of A's finished. */
static void test_no_pause(model_ctx *ctx, const model *m, decode_params p) {
    job j[3] = {job_make(p, 0), job_make(p, 1), job_make(p, 2)};
    sched *s = sched_make(ctx, 2, 0, 0);
    trio t;
    trio_init(&t, m, j, 2);
    const sched_stats st = trio_run_free(s, &t);
    TEST_CHECK(st.preempted == 0, "max_paused 0: %llu pauses", (unsigned long long)st.preempted);
    TEST_CHECK(t.got[2].first_step > t.got[0].done || t.got[2].first_step > t.got[1].done,
               "max_paused 0: B waits for a free slot (first step %d, A done %d %d)", t.got[2].first_step,
               t.got[0].done, t.got[1].done);
    trio_free(&t);
}

/* A paused sequence is cancelled: its DONE (cancelled) comes from the engine with no step after
 * the pause; the others are unaffected and no KV slot stays open. */
static void test_cancel_paused(model_ctx *ctx, const model *m, decode_params p) {
    job j[3] = {job_make(p, 0), job_make(p, 1), job_make(p, 2)};
    rec alone_a1;
    run_alone(ctx, m, &j[0], &alone_a1);
    sched *s = sched_make(ctx, 2, 2, 0);
    trio t;
    trio_init(&t, m, j, 2);
    rec *got = t.got;
    trio_start(s, &t);
    submit(s, t.r[2]);
    gate_release(2);
    gate_wait_held();   /* a2 is paused now */
    TEST_CHECK(t.r[1]->state == SCHED_REQ_PAUSED, "cancel: a2 paused (state %d)", t.r[1]->state);
    pthread_mutex_lock(&g_mu);
    const int steps_at_pause = got[1].n_steps;
    pthread_mutex_unlock(&g_mu);
    sched_cancel(s, t.r[1]);
    gate_release(0);
    trio_wait(&t);
    sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    TEST_CHECK(!strcmp(got[1].finish, "cancelled") && got[1].n_steps == steps_at_pause && got[1].n_steps == 2,
               "cancel: a2 finish %s after %d steps (%d at the pause)", got[1].finish, got[1].n_steps, steps_at_pause);
    TEST_CHECK(st.cancelled == 1 && st.paused == 0 && st.resumed == 0, "cancel: cancelled %llu, resumed %llu",
               (unsigned long long)st.cancelled, (unsigned long long)st.resumed);
    TEST_CHECK(rec_same(&alone_a1, &got[0]), "cancel: a1 unaffected");
    kv_none_left(ctx, "cancel of a paused sequence");
    strbuf_free(&alone_a1.commits);
    trio_free(&t);
}

/* Background requests (owner 1) fill the batch; a foreground request of the same owner arrives:
 * a background one is paused for it, and resumes once there is room; outputs as alone. */
static void test_background(model_ctx *ctx, const model *m, decode_params p) {
    job j[3] = {job_make(p, 0), job_make(p, 1), job_make(p, 2)};
    rec alone[3];
    for (int i = 0; i < 3; i++) run_alone(ctx, m, &j[i], &alone[i]);
    sched *s = sched_make(ctx, 2, 2, 0);
    trio t;
    trio_init(&t, m, j, 1);
    sched_req *g1 = t.r[0], *g2 = t.r[1], *f = t.r[2];
    trio_start(s, &t);
    sched_set_background(s, g1, 1);   /* their clients went away (a detached session) */
    sched_set_background(s, g2, 1);
    submit(s, f);                     /* same owner, foreground: it does not wait */
    gate_release(2);
    gate_wait_held();
    TEST_CHECK(g2->state == SCHED_REQ_PAUSED && f->state == SCHED_REQ_ACTIVE,
               "background: the latest background one paused for the foreground one (states %d %d)", g2->state,
               f->state);
    sched_set_background(s, g1, 0);   /* g1's client is back: it stays running */
    gate_release(0);
    trio_wait(&t);
    sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    TEST_CHECK(st.preempted == 1 && st.resumed == 1, "background: preempted %llu resumed %llu",
               (unsigned long long)st.preempted, (unsigned long long)st.resumed);
    TEST_CHECK(t.got[2].first_step < t.got[1].done && t.got[2].first_step < t.got[0].done,
               "background: the foreground request's first step before the background ones finished");
    for (int i = 0; i < 3; i++) {
        TEST_CHECK(rec_same(&alone[i], &t.got[i]), "background: request %d differs from its run alone", i);
        strbuf_free(&alone[i].commits);
    }
    trio_free(&t);
    kv_none_left(ctx, "background");
}

/* kv_rows too small for one more cached sequence beside the batch: no pause. */
static void test_kv_budget(model_ctx *ctx, const model *m, decode_params p) {
    job j[3] = {job_make(p, 0), job_make(p, 1), job_make(p, 2)};
    trio t;
    trio_init(&t, m, j, 2);
    const sched_req *a1 = t.r[0];
    TEST_CHECK(a1->kv_rows == decode_seq_kv_rows(a1->seq) && a1->kv_rows > 0, "kv_rows %d", a1->kv_rows);
    sched *s = sched_make(ctx, 2, 2, (long)(t.r[0]->kv_rows + t.r[1]->kv_rows + t.r[2]->kv_rows - 1));
    const sched_stats st = trio_run_free(s, &t);
    TEST_CHECK(st.preempted == 0, "kv budget: %llu pauses beyond the budget", (unsigned long long)st.preempted);
    trio_free(&t);
}

/* ---------------------------------------------------------------- models */

static int run_model(const char *preset) {
    make_model_opts o = test_model_opts();
    CHECK(make_model_preset(preset, &o) == 0);
    o.quiet = 1;
    o.dtype = DTYPE_F32;
    o.no_tokenizer = 1;
    char name[64];
    snprintf(name, sizeof name, "test_sched_%s", preset);
    um_err err = {0};
    model m;
    if (test_model_make(name, &o, &m, &err) != 0) {
        fprintf(stderr, "model %s: %s\n", preset, err.msg);
        return -1;
    }
    backend *be = backend_cpu_init(1);
    model_ctx ctx;
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "model_ctx_init: %s\n", err.msg);
        return -1;
    }
    const int bd = !strcmp(preset, "llada2-tiny");   /* block-causal: aligned layout, its rules */
    const int dream = !strcmp(preset, "dream-tiny");
    decode_params base = decode_params_for_model(&m);
    struct {
        char          what[96];
        decode_params p;
    } cs[16];
    int n = 0;
#define CASE(desc, expr)                                                      \
    do {                                                                      \
        decode_params p = base;                                               \
        p.gen_length = 24, p.block_length = 8, p.steps = 0;                   \
        expr;                                                                 \
        snprintf(cs[n].what, sizeof cs[n].what, "%s %s", preset, desc);       \
        cs[n++].p = p;                                                        \
    } while (0)
    CASE("low_confidence, no cache", (p.decoder = DECODER_LOW_CONFIDENCE, p.cache = DECODE_CACHE_NONE));
    CASE("low_confidence, dual cache", (p.decoder = DECODER_LOW_CONFIDENCE, p.cache = DECODE_CACHE_DUAL));
    CASE("threshold, prefix cache, temperature 0.8 seed 5, no EOS",
         (p.decoder = DECODER_THRESHOLD, p.threshold = 0.3, p.cache = DECODE_CACHE_PREFIX, p.temperature = 0.8,
          p.seed = 5, p.logits_eos_inf = 1));
    CASE("hierarchy_block, dual cache", (p.decoder = DECODER_HIERARCHY_BLOCK, p.cache = DECODE_CACHE_DUAL,
                                         p.threshold = 0.05, p.sub_block_length = 4));
    CASE("joint_threshold, no cache, top_k 40 temperature 1 seed 9",
         (p.decoder = DECODER_JOINT_THRESHOLD, p.threshold = 0.05, p.edit_threshold = 0.5, p.max_post_steps = 2,
          p.temperature = 1.0, p.top_k = 40, p.seed = 9));
    if (!bd) {
        CASE("random, vicinity cache with warmup, temperature 1 top_p 0.9 seed 3",
             (p.decoder = DECODER_RANDOM, p.cache = DECODE_CACHE_VICINITY, p.prefix_look = 2, p.after_look = 3,
              p.warmup_steps = 2, p.temperature = 1.0, p.top_p = 0.9, p.seed = 3));
        CASE("credit, dual cache, CFG 1", (p.decoder = DECODER_CREDIT, p.threshold = 0.05, p.cache = DECODE_CACHE_DUAL,
                                           p.cfg_scale = 1.0));
        CASE("factor, prefix cache, refresh every 2, drafts",
             (p.decoder = DECODER_FACTOR, p.factor = 2.9, p.cache = DECODE_CACHE_PREFIX, p.cache_refresh = 2,
              p.stream_drafts = 1));
        CASE("hierarchy, no cache", (p.decoder = DECODER_HIERARCHY, p.threshold = 0.05));
    }
    if (dream) {
        CASE("origin, dual cache, seed 4", (p.decoder = DECODER_ORIGIN, p.cache = DECODE_CACHE_DUAL, p.seed = 4));
        CASE("entropy, alg_temp 0.5, temperature 0.7 seed 8",
             (p.decoder = DECODER_ENTROPY, p.alg_temp = 0.5, p.temperature = 0.7, p.seed = 8));
        CASE("maskgit_plus, prefix cache", (p.decoder = DECODER_MASKGIT_PLUS, p.cache = DECODE_CACHE_PREFIX));
    }
#undef CASE
    decode_params pb = base;
    pb.gen_length = 16, pb.block_length = 8;
    for (int i = 0; i < n; i++) {
        um_err verr = {0};
        if (decode_params_validate(&cs[i].p, &m.cfg, 4, &verr) != 0) {
            TEST_CHECK(0, "%s: fixture invalid: %s", cs[i].what, verr.msg);
            continue;
        }
        test_pause_for_other_owner(&ctx, &m, cs[i].what, cs[i].p, pb);
    }
    decode_params p = base;
    p.gen_length = 24, p.block_length = 8, p.cache = DECODE_CACHE_DUAL;
    test_no_pause(&ctx, &m, p);
    test_cancel_paused(&ctx, &m, p);
    test_background(&ctx, &m, p);
    test_kv_budget(&ctx, &m, p);
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    return 0;
}

int main(void) {
    log_level_set(LOG_LEVEL_WARN);
    const char *presets[] = {"tiny", "dream-tiny", "lladamoe-tiny", "llada2-tiny"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (run_model(presets[i]) != 0) return 1;
    decode_thread_scratch_free();
    return test_report();
}
