/*
 * bench_decode.c — `unmask bench --decode`: end-to-end decode throughput on the CPU backend. For
 * each decoder and batch size it decodes `batch` different random prompts together (one batched
 * forward per step, as the server's scheduler does) and prints tokens/s, steps/s, tokens per step
 * and ms per step. Does not: measure queueing, HTTP, or CUDA. Main thread (+ backend workers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "decode/decode.h"
#include "model/model.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/timeutil.h"

typedef struct bench_row {
    int    batch;
    int    fwd_steps;      /* batched forward passes */
    long   tokens;         /* generated positions committed, all sequences */
    long   seq_steps;      /* sum over sequences of their steps */
    double wall_s;
} bench_row;

static int run_one(model_ctx *ctx, const model *m, const decode_params *p, int batch, int prompt_len,
                   uint64_t seed, bench_row *row, um_err *err) {
    decode_seq **s = xcalloc((size_t)batch, sizeof *s);
    int32_t *prompt = xmalloc((size_t)prompt_len * sizeof *prompt);
    int rc = 0;
    int V = m->cfg.vocab_size < m->cfg.n_embd_rows ? m->cfg.vocab_size : m->cfg.n_embd_rows;
    for (int b = 0; b < batch && rc == 0; b++) {
        for (int i = 0; i < prompt_len; i++) {
            int32_t t = (int32_t)(rng_u64(seed + (uint64_t)b, 0, (uint64_t)i) % (uint64_t)V);
            if (t == m->cfg.mask_id) t = (t + 1) % V;
            prompt[i] = t;
        }
        decode_params q = *p;
        q.seed = seed + (uint64_t)b;
        s[b] = decode_seq_create(m, &q, prompt, prompt_len, err);
        if (!s[b]) rc = -1;
    }
    memset(row, 0, sizeof *row);
    row->batch = batch;
    uint64_t t0 = time_now_ns();
    while (rc == 0) {
        decode_seq **act = xmalloc((size_t)batch * sizeof *act);
        int n = 0;
        for (int b = 0; b < batch; b++)
            if (!decode_seq_done(s[b])) act[n++] = s[b];
        if (n > 0) {
            rc = decode_step(ctx, act, n, NULL, err);
            row->fwd_steps++;
        }
        free(act);
        if (n == 0) break;
    }
    row->wall_s = (double)(time_now_ns() - t0) * 1e-9;
    for (int b = 0; b < batch; b++) {
        if (!s[b]) continue;
        int len;
        const int32_t *x = decode_seq_canvas(s[b], &len);
        for (int i = prompt_len; i < len; i++) row->tokens += x[i] != m->cfg.mask_id;
        row->seq_steps += decode_seq_steps(s[b]);
        decode_seq_free(s[b]);
    }
    free(s);
    free(prompt);
    return rc;
}

int bench_decode(int argc, char **argv) {
    const char *model_dir = NULL, *batch_s = "1,8", *decoders_s = "low_confidence,random,threshold,factor";
    int gen = 128, block = 32, steps = 0, prompt_len = 32, threads = 0, decode_flag = 0, reps = 1;
    double threshold = 0.9, factor = 1.0, temperature = 0.0;
    arg_spec specs[] = {
        {"decode", ARG_FLAG, &decode_flag, "(selects this benchmark)"},
        {"model", ARG_STR, &model_dir, "checkpoint directory [required]"},
        {"batch", ARG_STR, &batch_s, "comma-separated batch sizes [1,8]"},
        {"gen", ARG_INT, &gen, "gen_length [128]"},
        {"block", ARG_INT, &block, "block_length [32]"},
        {"steps", ARG_INT, &steps, "fixed-step decoders: total steps, 0 = gen [0]"},
        {"prompt", ARG_INT, &prompt_len, "random prompt length in tokens [32]"},
        {"decoders", ARG_STR, &decoders_s, "comma-separated decoders [low_confidence,random,threshold,factor]"},
        {"threshold", ARG_FLOAT, &threshold, "threshold decoder tau [0.9]"},
        {"factor", ARG_FLOAT, &factor, "factor decoder f [1.0]"},
        {"temperature", ARG_FLOAT, &temperature, "sampling temperature [0]"},
        {"threads", ARG_INT, &threads, "CPU threads (0 = all cores) [0]"},
        {"reps", ARG_INT, &reps, "runs per row, the fastest is reported (noisy machines) [1]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --decode --model DIR [--batch 1,8] [--gen 128] [--block 32] [--steps N]\n\n"
                       "Decodes batches of random prompts (EOS early stop off) and prints tokens/s, steps/s,\n"
                       "tokens per step and ms per step for each decoder and batch size.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (reps < 1 || threads < 0 || prompt_len < 1) {
        fprintf(stderr, "error: --reps and --prompt must be >= 1, --threads >= 0\n");
        return 2;
    }
    int *batches = NULL;
    int n_batches = args_parse_int_list("batch", batch_s, &batches);
    if (n_batches < 0) return 2;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] < 1 || batches[i] > 1024) {
            fprintf(stderr, "error: --batch sizes must be between 1 and 1024, got %d\n", batches[i]);
            free(batches);
            return 2;
        }
    enum decode_decoder decs[DECODER_COUNT_];
    int n_decs = 0;
    {
        char *list = xstrdup(decoders_s), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n_decs >= DECODER_COUNT_ || decode_decoder_parse(t, &decs[n_decs]) != 0) {
                fprintf(stderr, "error: --decoders: unknown or repeated decoder '%s' (low_confidence, random, "
                                "threshold, factor)\n", t);
                free(list);
                free(batches);
                return 2;
            }
            n_decs++;
        }
        free(list);
    }
    um_err err = {0};
    model m;
    if (model_load(model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(batches);
        return 1;
    }
    decode_params base = decode_params_default();
    base.gen_length = gen, base.block_length = block, base.steps = steps;
    base.threshold = threshold, base.factor = factor, base.temperature = temperature;
    base.stop_at_eos = 0; /* a fixed amount of work per run */
    for (int d = 0; d < n_decs; d++) {
        decode_params p = base;
        p.decoder = decs[d];
        if (decode_params_validate(&p, &m.cfg, prompt_len, &err) != 0) {
            fprintf(stderr, "error: %s\n", err.msg);
            model_free(&m);
            free(batches);
            return 2;
        }
    }
    backend *be = backend_cpu_init(threads);
    model_ctx ctx;
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        backend_free(be);
        model_free(&m);
        free(batches);
        return 1;
    }
    printf("decode benchmark: %s (%s, d_model %d, %d layers, vocab %d), backend %s, %d threads\n", model_dir,
           model_arch_name(m.cfg.arch), m.cfg.d_model, m.cfg.n_layers, m.cfg.n_embd_rows, backend_name(be), backend_n_threads(be));
    printf("prompt %d tokens, gen_length %d, block_length %d, steps %d, temperature %g, EOS early stop off\n\n",
           prompt_len, gen, block, steps ? steps : gen, temperature);
    printf("%-15s %5s %7s %9s %9s %9s %9s %10s %9s\n", "decoder", "batch", "steps", "tokens", "wall s", "tokens/s",
           "steps/s", "tok/step", "ms/step");
    /* warm-up: one untimed batch-1 run of the first decoder (thread pools, page faults; a single
     * forward was not enough to reach steady state) */
    {
        bench_row w;
        decode_params p = base;
        p.decoder = decs[0];
        if (run_one(&ctx, &m, &p, 1, prompt_len, 99, &w, &err) != 0) fprintf(stderr, "warm-up: %s\n", err.msg);
    }
    int rc = 0;
    for (int d = 0; d < n_decs && rc == 0; d++) {
        for (int bi = 0; bi < n_batches; bi++) {
            decode_params p = base;
            p.decoder = decs[d];
            bench_row row, best;
            for (int k = 0; k < reps && rc == 0; k++) {
                if (run_one(&ctx, &m, &p, batches[bi], prompt_len, 1000, &row, &err) != 0) {
                    fprintf(stderr, "error: %s\n", err.msg);
                    rc = 1;
                } else if (k == 0 || row.wall_s < best.wall_s) {
                    best = row;
                }
            }
            if (rc != 0) break;
            row = best;
            double tps = row.tokens / row.wall_s, sps = row.fwd_steps / row.wall_s;
            double tok_per_step = row.seq_steps ? (double)row.tokens / (double)row.seq_steps : 0;
            printf("%-15s %5d %7d %9ld %9.2f %9.1f %9.2f %10.2f %9.1f\n", decode_decoder_name(p.decoder), row.batch,
                   row.fwd_steps, row.tokens, row.wall_s, tps, sps, tok_per_step, 1e3 * row.wall_s / row.fwd_steps);
            fflush(stdout);
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\npeak RSS %.1f MiB. steps = batched forward passes; tok/step = tokens committed per sequence per step;\n"
           "fastest of %d run(s) per row.\n",
           (double)ru.ru_maxrss / 1024.0, reps);
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
    decode_thread_scratch_free();
    free(batches);
    return rc;
}
