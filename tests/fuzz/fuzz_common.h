/*
 * fuzz_common.h — shared set-up of the libFuzzer targets that need a loaded model or tokenizer:
 * a tiny random checkpoint (make-model "tiny" + the built-in tokenizer and LLaDA chat template)
 * is written to a temporary directory on first use, loaded, and the files are removed again (the
 * mapping stays valid). Everything the targets then fuzz works on buffers, without I/O.
 */
#ifndef UM_FUZZ_COMMON_H
#define UM_FUZZ_COMMON_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "model/make_model.h"
#include "model/model.h"
#include "util/log.h"

static int fuzz_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* The shared tiny model (never freed: it lives as long as the fuzzer process). */
static const model *fuzz_model(void) {
    static model m;
    static int loaded;
    if (loaded) return &m;
    log_level_set(LOG_LEVEL_ERROR);
    char dir[] = "/tmp/unmask-fuzz-XXXXXX";
    if (!mkdtemp(dir)) abort();
    make_model_opts o;
    if (make_model_preset("tiny", &o) != 0) abort();
    o.quiet = 1;
    um_err err = {0};
    if (make_model_write(dir, &o, &err) != 0 || model_load(dir, &m, &err) != 0) {
        fprintf(stderr, "fuzz: tiny model: %s\n", err.msg);
        abort();
    }
    nftw(dir, fuzz_rm_cb, 8, FTW_DEPTH | FTW_PHYS);
    if (!m.tok || !m.chat) abort();
    loaded = 1;
    return &m;
}

#endif /* UM_FUZZ_COMMON_H */
