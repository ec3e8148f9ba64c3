/*
 * test_decode_device_apply.c — decode_seq_apply(), the one function that turns a step record into
 * sequence state and events (host steps and the device-resident loop both go through it):
 *   - hand-built records on a tiny checkpoint WITH its tokenizer: STEP commits / drafts / mask
 *     counts, BLOCK text (checked against tokenizer_decode of the committed ids, not against our
 *     incremental text path), EOS stop at the end of the block (DONE stop, usage), draft_every,
 *     length finish, the cursor a device runner resumes from;
 *   - replay: the records read back from a host decode_step run, applied to a fresh sequence,
 *     give a byte-identical event stream (JSON of every event, timings aside);
 *   - a record for the wrong step aborts (a caller bug), checked in a forked child.
 * CPU only.
 */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "decode/event_json.h"
#include "model/make_model.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

/* ---------------------------------------------------------------- event log */

#define MAX_EV 512

typedef struct ev_log {
    int     n;
    char   *json[MAX_EV];             /* decode_event_to_json without timings, owned */
    int     type[MAX_EV];
    int     step[MAX_EV], block[MAX_EV];
    int     n_commits[MAX_EV], n_drafts[MAX_EV];
    int32_t commit_pos[MAX_EV][64], commit_tok[MAX_EV][64];
    float   commit_conf[MAX_EV][64];
    int32_t draft_pos[MAX_EV][64], draft_tok[MAX_EV][64];
    float   draft_conf[MAX_EV][64];
    int     masks_left[MAX_EV], block_masks_left[MAX_EV];
    char    text[MAX_EV][256];
    enum decode_finish finish;
    decode_usage usage;               /* DONE's */
    int     after_done;               /* events after DONE */
} ev_log;

static void log_free(ev_log *l) {
    for (int i = 0; i < l->n; i++) free(l->json[i]);
}

static void on_ev(void *user, const decode_event *ev) {
    ev_log *l = user;
    if (l->n > 0 && l->type[l->n - 1] == DECODE_EVENT_DONE) l->after_done++;
    if (l->n >= MAX_EV) return;
    int i = l->n++;
    json_t *o = decode_event_to_json(ev);
    json_object_del(o, "timings");
    l->json[i] = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(o);
    l->type[i] = ev->type;
    l->step[i] = ev->step;
    l->block[i] = ev->block;
    l->n_commits[i] = ev->n_commits;
    l->n_drafts[i] = ev->n_drafts;
    for (int k = 0; k < ev->n_commits && k < 64; k++) {
        l->commit_pos[i][k] = ev->commits[k].pos;
        l->commit_tok[i][k] = ev->commits[k].token;
        l->commit_conf[i][k] = ev->commits[k].confidence;
    }
    for (int k = 0; k < ev->n_drafts && k < 64; k++) {
        l->draft_pos[i][k] = ev->drafts[k].pos;
        l->draft_tok[i][k] = ev->drafts[k].token;
        l->draft_conf[i][k] = ev->drafts[k].confidence;
    }
    l->masks_left[i] = ev->masks_left;
    l->block_masks_left[i] = ev->block_masks_left;
    if (ev->text) snprintf(l->text[i], sizeof l->text[i], "%.*s", (int)ev->text_len, ev->text);
    if (ev->type == DECODE_EVENT_DONE) {
        l->finish = ev->finish;
        l->usage = ev->usage;
    }
}

/* ---------------------------------------------------------------- records */

static void apply(decode_seq *s, int step, int nc, const int32_t *cpos, const int32_t *ctok, const float *cconf,
                  int nr, const int32_t *rpos, const int32_t *rtok, const float *rconf, ev_log *l) {
    decode_record r;
    memset(&r, 0, sizeof r);
    r.step = step;
    r.n_commits = nc;
    r.commit_pos = cpos;
    r.commit_tok = ctok;
    r.commit_conf = cconf;
    r.n_rows = nr;
    r.row_pos = rpos;
    r.row_tok = rtok;
    r.row_conf = rconf;
    decode_sink sink = {on_ev, l};
    decode_seq_apply(s, &r, &sink);
}

/* ids of a text (no special tokens) */
static int encode(const model *m, const char *t, int32_t **ids) {
    size_t n = 0;
    um_err err = {0};
    CHECK(tokenizer_encode(m->tok, t, strlen(t), 0, ids, &n, &err) == 0);
    return (int)n;
}

static char *decode_ids(const model *m, const int32_t *ids, int n) {
    char *t = NULL;
    size_t len = 0;
    tokenizer_decode(m->tok, ids, (size_t)n, 1, &t, &len);
    return t;
}

/* Two blocks of 4; block 0 committed over 2 steps with drafts, block 1 holds an EOS: stop. */
static void test_hand_records_eos(const model *m) {
    int32_t *w = NULL;
    int nw = encode(m, "hello world, this is", &w);
    CHECK(nw >= 6);
    const int Lp = 3, eos = m->cfg.eos_id;
    int32_t prompt[3] = {w[0], w[1], w[2]};
    decode_params p = decode_params_default();
    p.gen_length = 8;
    p.block_length = 4;
    p.decoder = DECODER_THRESHOLD;
    p.stream_drafts = 1;
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &p, prompt, Lp, &err);
    CHECK(s);
    ev_log l;
    memset(&l, 0, sizeof l);

    /* step 0: commit position Lp+1; rows = the whole block */
    int32_t c0p[1] = {Lp + 1}, c0t[1] = {w[1]};
    float c0c[1] = {0.75f};
    int32_t r0p[4] = {Lp, Lp + 1, Lp + 2, Lp + 3}, r0t[4] = {w[0], w[1], w[4], w[5]};
    float r0c[4] = {0.25f, 0.75f, 0.5f, 0.125f};
    apply(s, 0, 1, c0p, c0t, c0c, 4, r0p, r0t, r0c, &l);
    TEST_CHECK(l.n == 1 && l.type[0] == DECODE_EVENT_STEP, "one STEP event, got %d", l.n);
    TEST_CHECK(l.step[0] == 0 && l.block[0] == 0, "step 0 of block 0");
    TEST_CHECK(l.n_commits[0] == 1 && l.commit_pos[0][0] == Lp + 1 && l.commit_tok[0][0] == w[1] &&
                   l.commit_conf[0][0] == 0.75f,
               "the commit as recorded");
    TEST_CHECK(l.n_drafts[0] == 3, "drafts = the 3 rows still masked, got %d", l.n_drafts[0]);
    TEST_CHECK(l.draft_pos[0][0] == Lp && l.draft_pos[0][1] == Lp + 2 && l.draft_pos[0][2] == Lp + 3 &&
                   l.draft_tok[0][1] == w[4] && l.draft_conf[0][2] == 0.125f,
               "draft positions / tokens / confidences from the rows");
    TEST_CHECK(l.masks_left[0] == 7 && l.block_masks_left[0] == 3, "masks left 7 / 3, got %d / %d",
               l.masks_left[0], l.block_masks_left[0]);
    decode_seq_cursor c;
    decode_seq_cursor_get(s, &c);
    TEST_CHECK(c.block == 0 && c.step == 1 && c.step_in_block == 1 && c.block_m0 == 4 && c.gen_end == Lp + 8,
               "cursor after one step: block %d step %d in-block %d m0 %d", c.block, c.step, c.step_in_block,
               c.block_m0);

    /* step 1: the other three -> STEP (no drafts: nothing masked), BLOCK 0 */
    int32_t c1p[3] = {Lp, Lp + 2, Lp + 3}, c1t[3] = {w[0], w[2], w[3]};
    float c1c[3] = {0.5f, 0.5f, 0.5f};
    apply(s, 1, 3, c1p, c1t, c1c, 3, c1p, c1t, c1c, &l);
    TEST_CHECK(l.n == 3 && l.type[1] == DECODE_EVENT_STEP && l.type[2] == DECODE_EVENT_BLOCK, "STEP then BLOCK");
    TEST_CHECK(l.n_drafts[1] == 0 && l.block_masks_left[1] == 0 && l.masks_left[1] == 4, "block 0 full");
    int32_t blk0[4] = {w[0], w[1], w[2], w[3]};
    char *t0 = decode_ids(m, blk0, 4);
    TEST_CHECK(strcmp(l.text[2], t0) == 0, "BLOCK 0 text '%s' == tokenizer_decode '%s'", l.text[2], t0);
    TEST_CHECK(l.block[2] == 0 && !decode_seq_done(s), "block 0 finalized, not done");
    decode_seq_cursor_get(s, &c);
    TEST_CHECK(c.block == 1 && c.step == 2 && c.block_m0 == -1, "cursor: block 1 not begun");

    /* step 2: block 1 = [w4, EOS, w5, w4] in one step: STEP, BLOCK (text up to EOS), DONE stop */
    int32_t c2p[4] = {Lp + 4, Lp + 5, Lp + 6, Lp + 7}, c2t[4] = {w[4], eos, w[5], w[4]};
    float c2c[4] = {0.9f, 0.95f, 0.8f, 0.7f};
    apply(s, 2, 4, c2p, c2t, c2c, 4, c2p, c2t, c2c, &l);
    TEST_CHECK(l.n == 6 && l.type[3] == DECODE_EVENT_STEP && l.type[4] == DECODE_EVENT_BLOCK &&
                   l.type[5] == DECODE_EVENT_DONE,
               "STEP, BLOCK, DONE (got %d events)", l.n);
    char *t1 = decode_ids(m, &w[4], 1);
    TEST_CHECK(strcmp(l.text[4], t1) == 0, "BLOCK 1 text stops at EOS: '%s' vs '%s'", l.text[4], t1);
    char full[512];
    snprintf(full, sizeof full, "%s%s", t0, t1);
    TEST_CHECK(strcmp(l.text[5], full) == 0, "DONE text = the blocks' texts: '%s'", l.text[5]);
    TEST_CHECK(l.finish == DECODE_FINISH_STOP && decode_seq_done(s), "finish stop");
    TEST_CHECK(l.usage.completion_tokens == 5 && l.usage.steps == 3 && l.usage.committed == 8 &&
                   l.usage.prompt_tokens == Lp,
               "usage: completion %d steps %d committed %d", l.usage.completion_tokens, l.usage.steps,
               l.usage.committed);
    TEST_CHECK(l.after_done == 0, "nothing after DONE");
    int len;
    const int32_t *x = decode_seq_canvas(s, &len);
    TEST_CHECK(len == Lp + 8 && x[Lp + 5] == eos && x[Lp + 1] == w[1], "canvas holds the commits");
    free(t0);
    free(t1);
    free(w);
    log_free(&l);
    decode_seq_free(s);
}

/* Fixed-step decoder, draft_every 2, no EOS: drafts only on even steps, DONE length. */
static void test_hand_records_length(const model *m) {
    int32_t *w = NULL;
    int nw = encode(m, "abc def ghi", &w);
    CHECK(nw >= 4);
    int32_t prompt[2] = {w[0], w[1]};
    decode_params p = decode_params_default();
    p.gen_length = 4;
    p.block_length = 4;
    p.steps = 4;
    p.stream_drafts = 1;
    p.draft_every = 2;
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, &p, prompt, 2, &err);
    CHECK(s);
    ev_log l;
    memset(&l, 0, sizeof l);
    int32_t ids[4] = {w[2], w[3], w[2], w[3]};
    for (int st = 0; st < 4; st++) {
        int32_t cp[1] = {2 + st}, ct[1] = {ids[st]};
        float cc[1] = {0.5f};
        int32_t rp[4], rt[4];
        float rc[4];
        int nr = 0;
        for (int q = st; q < 4; q++, nr++) rp[nr] = 2 + q, rt[nr] = ids[q], rc[nr] = 0.25f;
        apply(s, st, 1, cp, ct, cc, nr, rp, rt, rc, &l);
    }
    int steps_seen = 0;
    for (int i = 0; i < l.n; i++) {
        if (l.type[i] != DECODE_EVENT_STEP) continue;
        int want = (l.step[i] % 2 == 0 && l.step[i] < 3) ? 3 - l.step[i] : 0;
        TEST_CHECK(l.n_drafts[i] == want, "step %d: %d drafts, want %d", l.step[i], l.n_drafts[i], want);
        steps_seen++;
    }
    TEST_CHECK(steps_seen == 4, "4 STEP events");
    TEST_CHECK(l.finish == DECODE_FINISH_LENGTH && l.usage.completion_tokens == 4 && l.usage.steps == 4,
               "DONE length, 4 tokens, 4 steps");
    char *t = decode_ids(m, ids, 4);
    TEST_CHECK(strcmp(l.text[l.n - 1], t) == 0, "text '%s' == '%s'", l.text[l.n - 1], t);
    free(t);
    free(w);
    log_free(&l);
    decode_seq_free(s);
}

/* Records read back from a host run (STEP events: commits; drafts = the rows that stay masked)
 * replayed on a fresh sequence give the identical event stream. */
static void replay_case(const model *m, model_ctx *ctx, decode_params p, const char *label) {
    int32_t *w = NULL;
    int nw = encode(m, "the quick brown fox", &w);
    CHECK(nw >= 3);
    um_err err = {0};
    decode_seq *a = decode_seq_create(m, &p, w, nw, &err);
    decode_seq *b = decode_seq_create(m, &p, w, nw, &err);
    CHECK(a && b);
    ev_log *la = xcalloc(1, sizeof *la), *lb = xcalloc(1, sizeof *lb);
    decode_sink sa = {on_ev, la};
    CHECK(decode_generate(ctx, a, &sa, &err) == 0);
    for (int i = 0; i < la->n; i++) {
        if (la->type[i] != DECODE_EVENT_STEP) continue;
        apply(b, la->step[i], la->n_commits[i], la->commit_pos[i], la->commit_tok[i], la->commit_conf[i],
              la->n_drafts[i], la->draft_pos[i], la->draft_tok[i], la->draft_conf[i], lb);
    }
    int same = la->n == lb->n && la->n > 0;
    for (int i = 0; same && i < la->n; i++)
        if (strcmp(la->json[i], lb->json[i]) != 0) {
            fprintf(stderr, "%s: event %d differs:\n  host   %s\n  replay %s\n", label, i, la->json[i], lb->json[i]);
            same = 0;
        }
    TEST_CHECK(same, "%s: replayed records give the host's %d events (got %d)", label, la->n, lb->n);
    TEST_CHECK(decode_seq_done(b) && decode_seq_finish_reason(b) == decode_seq_finish_reason(a), "%s: same finish",
               label);
    int la_n, lb_n;
    const int32_t *xa = decode_seq_canvas(a, &la_n), *xb = decode_seq_canvas(b, &lb_n);
    TEST_CHECK(la_n == lb_n && memcmp(xa, xb, (size_t)la_n * sizeof *xa) == 0, "%s: same canvas", label);
    log_free(la);
    log_free(lb);
    free(la);
    free(lb);
    decode_seq_free(a);
    decode_seq_free(b);
    free(w);
}

static void test_replay(const model *m, model_ctx *ctx) {
    decode_params p = decode_params_default();
    p.gen_length = 12;
    p.block_length = 4;
    p.stream_drafts = 1;
    replay_case(m, ctx, p, "low_confidence greedy");
    p.decoder = DECODER_THRESHOLD;
    p.threshold = 0.05;
    p.temperature = 0.8;
    p.seed = 7;
    replay_case(m, ctx, p, "threshold T=0.8");
    p.decoder = DECODER_RANDOM;
    p.steps = 6;
    p.draft_every = 2;
    replay_case(m, ctx, p, "random steps 6, drafts every 2");
    p.decoder = DECODER_FACTOR;
    p.layout = DECODE_LAYOUT_ALIGNED;
    p.stop_at_eos = 0;
    replay_case(m, ctx, p, "factor aligned");
}

/* A record for another step than the sequence's is a caller bug: abort. */
static void test_wrong_step_aborts(const model *m) {
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        int32_t prompt[1] = {1};
        decode_params p = decode_params_default();
        p.gen_length = 4;
        p.block_length = 4;
        um_err err = {0};
        decode_seq *s = decode_seq_create(m, &p, prompt, 1, &err);
        int32_t cp[1] = {1}, ct[1] = {2};
        float cc[1] = {0.5f};
        ev_log *l = xcalloc(1, sizeof *l);
        freopen("/dev/null", "w", stderr);
        apply(s, 5, 1, cp, ct, cc, 0, NULL, NULL, NULL, l); /* the sequence is at step 0 */
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    TEST_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "wrong step: abort (status %d)", st);
}

int main(void) {
    make_model_opts o = test_model_opts();
    o.dtype = DTYPE_F32;
    um_err err = {0};
    model m;
    if (test_model_make("test_decode_device_apply_model", &o, &m, &err) != 0) {
        fprintf(stderr, "model: %s\n", err.msg);
        return 1;
    }
    CHECK(m.tok && m.cfg.eos_id >= 0);
    test_hand_records_eos(&m);
    test_hand_records_length(&m);
    test_wrong_step_aborts(&m);
    backend *be = backend_cpu_init(1);
    model_ctx ctx;
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "model_ctx_init: %s\n", err.msg);
        return 1;
    }
    test_replay(&m, &ctx);
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    decode_thread_scratch_free();
    return test_report();
}
