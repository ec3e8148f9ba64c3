/*
 * test_model.h — the small checkpoints C tests run on: `make-model` presets written to
 * $UNMASK_TEST_TMP/<name> (default /tmp) and loaded. Header-only; any thread. Each test names its
 * own folder (ctest runs test binaries in parallel; one binary is one test).
 */
#ifndef UM_TEST_MODEL_H
#define UM_TEST_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "model/make_model.h"
#include "model/model.h"
#include "util/log.h"

/* The tiny preset, quiet: edit the fields a test needs, then test_model_make(). */
static inline make_model_opts test_model_opts(void) {
    make_model_opts o;
    CHECK(make_model_preset("tiny", &o) == 0);
    o.quiet = 1;
    return o;
}

/* The tiny preset reshaped so heads (8, GQA 4) and the FFN (192) split evenly over 1, 2 and 4
 * tensor-parallel ranks; f32, no tokenizer. */
static inline make_model_opts test_model_opts_tp(void) {
    make_model_opts o = test_model_opts();
    o.dtype = DTYPE_F32;
    o.d_model = 64;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.ffn_hidden = 192;
    o.n_layers = 2;
    o.no_tokenizer = 1;
    return o;
}

/* Writes o to $UNMASK_TEST_TMP/<name> and loads it into m. 0, or -1 with err set (the message
 * names the step; nothing to free then). */
static inline int test_model_make(const char *name, const make_model_opts *o, model *m, um_err *err) {
    const char *tmp = getenv("UNMASK_TEST_TMP");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", tmp ? tmp : "/tmp", name);
    if (make_model_write(dir, o, err) != 0) return -1;
    return model_load(dir, m, err);
}

#endif /* UM_TEST_MODEL_H */
