/*
 * test_api_infill.c — native infilling in the decode loop (decode_seq_create_infill): the canvas is
 * prompt ++ masks ++ suffix, the suffix never changes, only the middle is generated (events,
 * text, usage), CFG works with a suffix, and the context / vocabulary limits name the parameter.
 * Runs on a tiny make-model checkpoint on the CPU backend.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

typedef struct sink_rec {
    int n_step, n_block, n_done;
    int min_index, max_index;     /* over commits */
    int done_completion_tokens;
} sink_rec;

static void on_event(void *user, const decode_event *ev) {
    sink_rec *r = user;
    if (ev->type == DECODE_EVENT_STEP) {
        r->n_step++;
        for (int i = 0; i < ev->n_commits; i++) {
            if (ev->commits[i].index < r->min_index) r->min_index = ev->commits[i].index;
            if (ev->commits[i].index > r->max_index) r->max_index = ev->commits[i].index;
        }
    } else if (ev->type == DECODE_EVENT_BLOCK) {
        r->n_block++;
    } else {
        r->n_done++;
        r->done_completion_tokens = ev->usage.completion_tokens;
    }
}

int main(void) {
    make_model_opts o = test_model_opts();
    um_err err = {0};
    model m;
    if (test_model_make("test_api_infill_model", &o, &m, &err) != 0) {
        TEST_CHECK(0, "model: %s", err.msg);
        return test_report();
    }
    backend *be = backend_cpu_init(1);
    model_ctx ctx;
    TEST_CHECK(model_ctx_init(&ctx, &m, be, &err) == 0, "ctx: %s", err.msg);

    int32_t prompt[5] = {10, 11, 12, 13, 14}, suffix[4] = {20, 21, 22, 23};
    for (int cfg_on = 0; cfg_on < 2; cfg_on++) {
        decode_params p = decode_params_default();
        p.gen_length = 8;
        p.block_length = 4;
        p.stop_at_eos = 0;
        p.cfg_scale = cfg_on ? 1.5 : 0;
        decode_seq *s = decode_seq_create_infill(&m, &p, prompt, 5, suffix, 4, &err);
        TEST_CHECK(s != NULL, "create: %s", err.msg);
        if (!s) continue;
        int len = 0;
        decode_seq_canvas(s, &len);
        TEST_CHECK(len == 5 + 8 + 4, "canvas length %d", len);
        sink_rec r = {.min_index = 1 << 30, .max_index = -1};
        decode_sink sink = {on_event, &r};
        TEST_CHECK(decode_generate(&ctx, s, &sink, &err) == 0, "generate: %s", err.msg);
        const int32_t *x = decode_seq_canvas(s, &len);
        TEST_CHECK(memcmp(x, prompt, sizeof prompt) == 0, "prompt intact");
        TEST_CHECK(memcmp(x + 13, suffix, sizeof suffix) == 0, "suffix intact (cfg %d)", cfg_on);
        for (int i = 5; i < 13; i++) TEST_CHECK(x[i] != m.cfg.mask_id, "middle %d decoded", i);
        TEST_CHECK(r.n_block == 2 && r.n_done == 1, "2 blocks + done, got %d/%d", r.n_block, r.n_done);
        TEST_CHECK(r.min_index == 0 && r.max_index == 7, "commits cover the middle [0, 8): %d..%d", r.min_index,
                   r.max_index);
        TEST_CHECK(decode_seq_forward_tokens(s) == 0, "done");
        decode_seq_free(s);
    }

    /* the suffix counts against the context */
    decode_params p = decode_params_default();
    p.gen_length = m.cfg.max_seq - 5 - 2;
    p.block_length = p.gen_length;
    decode_seq *s = decode_seq_create_infill(&m, &p, prompt, 5, suffix, 4, &err);
    TEST_CHECK(!s && strcmp(err.param, "gen_length") == 0 && strstr(err.msg, "4 suffix tokens"), "context: %s", err.msg);
    decode_seq_free(s);
    p = decode_params_default();
    p.gen_length = 8;
    p.block_length = 8;
    int32_t bad_suffix[2] = {20, m.cfg.mask_id};
    s = decode_seq_create_infill(&m, &p, prompt, 5, bad_suffix, 2, &err);
    TEST_CHECK(!s && strcmp(err.param, "suffix") == 0 && strstr(err.msg, "mask token"), "mask in suffix: %s", err.msg);
    decode_seq_free(s);
    /* n_suffix = 0 is the plain canvas */
    s = decode_seq_create_infill(&m, &p, prompt, 5, NULL, 0, &err);
    int len = 0;
    if (s) decode_seq_canvas(s, &len);
    TEST_CHECK(s && len == 13, "no suffix: len %d", len);
    decode_seq_free(s);

    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    return test_report();
}
