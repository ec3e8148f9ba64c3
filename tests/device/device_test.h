/*
 * device_test.h — what the device-loop C suites (tests/device/test_*.c) share: event streams
 * recorded as JSON (timings removed) per sequence, the host-loop reference run, stream comparison,
 * and the fixture (a tiny make-model checkpoint, the CUDA backend named by UNMASK_TEST_DEVICE
 * (default cuda:0: the emulator in CI, a GPU under scripts/gpu/run-checks.sh), a tokenized prompt).
 * Test code only; single-threaded.
 */
#ifndef UM_DEVICE_TEST_H
#define UM_DEVICE_TEST_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/decode.h"
#include "decode/event_json.h"
#include "model/make_model.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "../unit/test_model.h"
#include "../unit/test.h"
#include "util/log.h"

/* ---------------------------------------------------------------- event streams */

typedef struct stream {
    int    n, cap;
    char **ev;           /* JSON of each event (timings removed), owned */
    int    done_at;      /* index of DONE, -1 */
    int    after_done;   /* events after DONE */
    enum decode_finish finish;
} stream;

static inline void stream_free(stream *s) {
    for (int i = 0; i < s->n; i++) free(s->ev[i]);
    free(s->ev);
    memset(s, 0, sizeof *s);
}

/* decode sink: appends the event to the sequence's stream (decode_seq_user) or to user's */
static inline void on_ev(void *user, const decode_event *ev) {
    stream *s = ev->seq_user ? ev->seq_user : user;
    if (s->done_at >= 0) s->after_done++;
    json_t *o = decode_event_to_json(ev);
    json_object_del(o, "timings");
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->ev = xrealloc(s->ev, (size_t)s->cap * sizeof *s->ev);
    }
    s->ev[s->n++] = json_dumps(o, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(o);
    if (ev->type == DECODE_EVENT_DONE) {
        s->done_at = s->n - 1;
        s->finish = ev->finish;
    }
}

/* a sequence recording into st (exits on a creation error: the cases build valid ones) */
static inline decode_seq *mk(const model *m, const decode_params *p, const int32_t *prompt, int n, stream *st) {
    um_err err = {0};
    decode_seq *s = decode_seq_create(m, p, prompt, n, &err);
    if (!s) {
        fprintf(stderr, "decode_seq_create: %s\n", err.msg);
        exit(1);
    }
    memset(st, 0, sizeof *st);
    st->done_at = -1;
    decode_seq_set_user(s, st);
    return s;
}

/* the host loop alone: the reference stream */
static inline void run_host(model_ctx *ctx, const decode_params *p, const int32_t *prompt, int n, stream *out) {
    decode_seq *s = mk(ctx->m, p, prompt, n, out);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    CHECK(decode_generate(ctx, s, &sink, &err) == 0);
    decode_seq_free(s);
}

/* One sequence alone on a fresh device loop, stepped until done (at most 1000 steps), its events
 * into out (the caller frees it): checks it is eligible for the device loop, leaves the loop's
 * stats in *ds and returns the sequence's step count. */
static inline int run_device_alone(model_ctx *ctx, const decode_params *p, const int32_t *prompt, int n,
                                   const char *label, stream *out, decode_device_stats *ds) {
    decode_seq *s = mk(ctx->m, p, prompt, n, out);
    TEST_CHECK(decode_device_eligible(ctx, s), "%s: eligible", label);
    decode_device *dd = decode_device_create(ctx, 1);
    decode_sink sink = {on_ev, NULL};
    um_err err = {0};
    int guard = 0;
    while (!decode_seq_done(s) && guard++ < 1000) CHECK(decode_device_step(dd, &s, 1, &sink, &err) == 0);
    decode_device_get_stats(dd, ds);
    const int steps = decode_seq_steps(s);
    decode_device_free(dd);
    decode_seq_free(s);
    return steps;
}

/* 1 when both streams are non-empty and equal event for event; else prints the first difference */
static inline int streams_equal(const char *label, const stream *a, const stream *b) {
    if (a->n != b->n) fprintf(stderr, "%s: %d events on the host, %d on the device\n", label, a->n, b->n);
    int n = a->n < b->n ? a->n : b->n;
    for (int i = 0; i < n; i++)
        if (strcmp(a->ev[i], b->ev[i]) != 0) {
            fprintf(stderr, "%s: event %d differs\n  host   %s\n  device %s\n", label, i, a->ev[i], b->ev[i]);
            return 0;
        }
    return a->n == b->n && a->n > 0;
}

/* ---------------------------------------------------------------- fixture */

typedef struct device_fixture {
    model    m;
    backend *be;          /* owned */
    int32_t *prompt;      /* [n_prompt] token ids, owned */
    int      n_prompt;
} device_fixture;

/* Writes make-model preset `preset` to $UNMASK_TEST_TMP/<name>_model, loads it, opens the device
 * and tokenizes the shared prompt (at most 12 tokens). Exits 1 with the error on failure. */
static inline void device_fixture_open_preset(device_fixture *fx, const char *name, const char *preset) {
    const char *dev = getenv("UNMASK_TEST_DEVICE");
    char dir[256];
    snprintf(dir, sizeof dir, "%s_model", name);
    make_model_opts o;
    CHECK(make_model_preset(preset, &o) == 0);
    o.quiet = 1;
    um_err err = {0};
    memset(fx, 0, sizeof *fx);
    if (test_model_make(dir, &o, &fx->m, &err) != 0) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        exit(1);
    }
    /* The suites compare a sequence decoded in a batch with others against itself alone, bit for bit:
     * that holds within one GEMM path, and the skinny kernel takes products of <= 64 rows while cuBLAS
     * takes more, so a batch crossing 64 rows would differ in rounding from the same sequence alone
     * (docs/gpu.md, "Batch invariance"). These suites keep every product on cuBLAS (--cuda-skinny
     * off); gpu_parity checks the skinny kernel, in decodes and graphs too. */
    const backend_options bo = {.cuda_skinny = 0};
    backend_options_select(&bo);
    fx->be = backend_init_device(dev && *dev ? dev : "cuda:0", 1, &err);
    if (!fx->be) {
        fprintf(stderr, "backend_init_device: %s\n", err.msg);
        exit(1);
    }
    size_t n = 0;
    const char *text = "Diffusion models denoise a canvas of masks, block by block.";
    CHECK(tokenizer_encode(fx->m.tok, text, strlen(text), 0, &fx->prompt, &n, &err) == 0 && n >= 8);
    fx->n_prompt = n > 12 ? 12 : (int)n;
}

/* The tiny (LLaDA) preset. */
static inline void device_fixture_open(device_fixture *fx, const char *name) {
    device_fixture_open_preset(fx, name, "tiny");
}

static inline void device_fixture_close(device_fixture *fx) {
    free(fx->prompt);
    backend_free(fx->be);
    model_free(&fx->m);
    decode_thread_scratch_free();
}

#endif /* UM_DEVICE_TEST_H */
