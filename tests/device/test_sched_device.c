/*
 * test_sched_device.c — preemption at step boundaries on the device-resident decode loop (CUDA;
 * the emulator in CI): the scheduler's engine runs owner A's two sequences on the device loop
 * with steps in flight; owner B arrives; one of A's is paused while a step of it is still
 * pending on the device (the runner drains it: its events are applied, nothing is lost), B runs,
 * and the paused one resumes from the host's state. Every sequence's event stream (timings
 * aside) equals its run alone on the same engine — cache none (two steps in flight), dual
 * (host-planned steps), greedy and seeded sampling, and LLaDA2 (block diffusion, with and without
 * its exact block cache); the device loop really ran them.
 */
#include <pthread.h>

#include "decode/decode_device.h"
#include "decode/event_json.h"
#include "device_test.h"
#include "sched/sched.h"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t  g_cv = PTHREAD_COND_INITIALIZER;
static int g_order;

/* One request's events as the scheduler emitted them (engine thread, under g_mu). */
typedef struct rec {
    stream st;           /* JSON of each event, timings removed */
    int    n_steps;
    int    first_step;   /* global order of its first step event, -1 before */
    int    done;         /* global order of its DONE, -1 before */
    double paused_ms;
} rec;

static void rec_init(rec *r) {
    memset(r, 0, sizeof *r);
    r->st.done_at = -1;
    r->first_step = r->done = -1;
}

static void on_emit(void *user, sched_event *ev) {
    (void)user;
    rec *r = ev->req->owner;
    pthread_mutex_lock(&g_mu);
    const int order = g_order++;
    if (ev->kind == SCHED_EV_DONE) {
        r->done = order;
        r->paused_ms = ev->paused_ms;
    }
    if (ev->kind == SCHED_EV_STEP && r->first_step < 0) r->first_step = order;
    r->n_steps += ev->kind == SCHED_EV_STEP;
    json_t *obj = decode_event_to_json(&ev->ev);
    json_object_del(obj, "timings");
    if (r->st.n == r->st.cap) {
        r->st.cap = r->st.cap ? 2 * r->st.cap : 64;
        r->st.ev = xrealloc(r->st.ev, (size_t)r->st.cap * sizeof *r->st.ev);
    }
    r->st.ev[r->st.n++] = json_dumps(obj, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(obj);
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    sched_event_free(ev);
}

static sched_req *req_make(const model *m, const decode_params *p, const int32_t *prompt, int n, uint64_t owner,
                           rec *r) {
    um_err err = {0};
    decode_seq *seq = decode_seq_create(m, p, prompt, n, &err);
    CHECK(seq);
    rec_init(r);
    sched_req *q = sched_req_create(seq, owner);
    q->owner = r;
    return q;
}

static void submit(sched *s, sched_req *q) {
    um_err err = {0};
    CHECK(sched_submit(s, q, NULL, &err) == 0);
}

static sched *sched_make(model_ctx *ctx) {
    sched_opts o = {.max_batch = 2, .max_queue = 8, .max_paused = 2};
    return sched_create(&ctx, 1, &o, on_emit, NULL);
}

/* until r has n step events (or finished) */
static void wait_steps(rec *r, int n) {
    pthread_mutex_lock(&g_mu);
    while (r->n_steps < n && r->done < 0) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void wait_done(rec *r) {
    pthread_mutex_lock(&g_mu);
    while (r->done < 0) pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

static void run_alone(model_ctx *ctx, const decode_params *p, const int32_t *prompt, int n, rec *out) {
    sched *s = sched_make(ctx);
    sched_req *q = req_make(ctx->m, p, prompt, n, 1, out);
    TEST_CHECK(decode_device_eligible(ctx, q->seq), "eligible for the device loop");
    submit(s, q);
    wait_done(out);
    sched_free(s);
    sched_req_free(q);
}

static void test_pause_on_device(model_ctx *ctx, const int32_t *prompt, int n_prompt, const char *what,
                                 decode_params pa) {
    decode_params pa2 = pa, pb = pa;
    pa2.seed = pa.seed + 1;
    pb.gen_length = 16, pb.block_length = 8, pb.steps = 16, pb.seed = 3;
    const int np[3] = {n_prompt, n_prompt - 1, n_prompt - 2};
    const decode_params *ps[3] = {&pa, &pa2, &pb};
    rec alone[3], got[3];
    for (int i = 0; i < 3; i++) run_alone(ctx, ps[i], prompt, np[i], &alone[i]);

    sched *s = sched_make(ctx);
    sched_req *q[3];
    for (int i = 0; i < 3; i++) q[i] = req_make(ctx->m, ps[i], prompt, np[i], i < 2 ? 1 : 2, &got[i]);
    submit(s, q[0]);
    submit(s, q[1]);
    wait_steps(&got[0], 2);   /* both of A's run on the device (steps in flight) */
    wait_steps(&got[1], 2);
    submit(s, q[2]);
    for (int i = 0; i < 3; i++) wait_done(&got[i]);
    sched_stats st;
    sched_get_stats(s, &st);
    sched_free(s);
    TEST_CHECK(st.preempted == 1 && st.resumed == 1, "%s: preempted %llu resumed %llu", what,
               (unsigned long long)st.preempted, (unsigned long long)st.resumed);
    TEST_CHECK(st.device.steps > 0 && st.device.rebuilds >= 2, "%s: the device loop ran them (%llu steps, %llu rebuilds)",
               what, (unsigned long long)st.device.steps, (unsigned long long)st.device.rebuilds);
    TEST_CHECK(got[2].first_step < got[0].done && got[2].first_step < got[1].done,
               "%s: B's first step before A's finished", what);
    TEST_CHECK((got[0].paused_ms > 0) + (got[1].paused_ms > 0) == 1 && got[2].paused_ms == 0,
               "%s: one of A's paused (%.3f, %.3f ms)", what, got[0].paused_ms, got[1].paused_ms);
    const char *names[3] = {"a1", "a2", "b"};
    for (int i = 0; i < 3; i++) {
        char label[160];
        snprintf(label, sizeof label, "%s: %s", what, names[i]);
        TEST_CHECK(streams_equal(label, &alone[i].st, &got[i].st), "%s: events equal to its run alone", label);
        stream_free(&alone[i].st);
        stream_free(&got[i].st);
        sched_req_free(q[i]);
    }
}

int main(void) {
    log_level_set(LOG_LEVEL_WARN);
    device_fixture fx;
    device_fixture_open(&fx, "test_sched_device");
    um_err err = {0};
    model_ctx ctx;
    CHECK(model_ctx_init(&ctx, &fx.m, fx.be, &err) == 0);
    CHECK(decode_device_supported(&ctx));
    decode_params p = decode_params_default();
    p.gen_length = 48, p.block_length = 8, p.steps = 48, p.stop_at_eos = 0;
    p.temperature = 0.8, p.seed = 17;
    test_pause_on_device(&ctx, fx.prompt, fx.n_prompt, "low_confidence, sampled, no cache (two steps in flight)", p);
    p.temperature = 0, p.cache = DECODE_CACHE_DUAL;
    test_pause_on_device(&ctx, fx.prompt, fx.n_prompt, "low_confidence, greedy, dual cache (host-planned steps)", p);
    p.decoder = DECODER_THRESHOLD, p.threshold = 0.3, p.temperature = 1.0, p.cache = DECODE_CACHE_PREFIX;
    test_pause_on_device(&ctx, fx.prompt, fx.n_prompt, "threshold, sampled, prefix cache", p);
    model_ctx_free(&ctx);
    device_fixture_close(&fx);

    /* LLaDA2 (block diffusion: host-planned steps cut at the active block; the exact block cache
     * with its chunked prefill) */
    device_fixture_open_preset(&fx, "test_sched_device_llada2", "llada2-tiny");
    CHECK(model_ctx_init(&ctx, &fx.m, fx.be, &err) == 0);
    p = decode_params_for_model(&fx.m);
    p.gen_length = 48, p.block_length = 8, p.steps = 48, p.stop_at_eos = 0;
    p.temperature = 0.8, p.seed = 17;
    test_pause_on_device(&ctx, fx.prompt, fx.n_prompt, "llada2 low_confidence, sampled, no cache", p);
    p.decoder = DECODER_THRESHOLD, p.threshold = 0.02, p.temperature = 0, p.cache = DECODE_CACHE_DUAL;
    p.prefill_chunk = 8;
    test_pause_on_device(&ctx, fx.prompt, fx.n_prompt, "llada2 threshold, greedy, block cache, chunks of 8", p);
    model_ctx_free(&ctx);
    device_fixture_close(&fx);
    return test_report();
}
