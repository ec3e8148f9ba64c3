/*
 * cmd_bench.c — `unmask bench`. With --tokenizer / --decode / --serve as the first flag it hands
 * over to that mode (cli/bench.h; the mode flag is removed, so the mode sees argv[0] = "bench" and
 * its own flags). Otherwise: the forward benchmark — full LLaDA forward passes on the CPU backend
 * for each --seq length, a printed table of ms/forward, tokens/s, GFLOP/s and peak RSS.
 * GFLOP counted: 2 x (matmul params per token) x tokens, the LM head only for the rows whose logits
 * are computed, plus attention 4 x L^2 x n_heads x head_dim per sequence and layer.
 * Does not: check numerics (tests do), time the decode loop (--decode does).
 * Main thread (+ the backend's OpenMP workers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "cli/tp_cli.h"
#include "model/model.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/timeutil.h"

static double peak_rss_mib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;   /* ru_maxrss is in KiB on Linux */
}

/* 1-minute load average (-1 if unknown): a busy machine explains noisy rows. */
static double load_avg_1m(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static double forward_gflop(const model_config *c, int seq, int batch, int out_rows) {
    double d = c->d_model, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double per_layer = d * qd + 2.0 * d * kvd + qd * d + 3.0 * d * c->ffn_hidden;
    double tokens = (double)seq * batch;
    double mm = 2.0 * per_layer * c->n_layers * tokens + 2.0 * d * c->n_embd_rows * out_rows * batch;
    double att = 4.0 * (double)seq * seq * qd * c->n_layers * batch;
    return (mm + att) * 1e-9;
}

/* Flags of the forward benchmark, and the parsed --seq list. */
typedef struct bf_opts {
    const char *model_dir, *seq_s, *cpu_kernels, *cpu_pin, *cuda_fuse, *cuda_skinny, *quant_s;
    enum dtype quant;   /* --quant, parsed */
    int  threads, reps, batch, warmup, out_rows, tp;
    int *seqs;    /* [n_seqs], owned */
    int  n_seqs;
} bf_opts;

/* Parses argv into o (defaults first). -1 to go on, else the exit code (0 after --help, 2 on error). */
static int bf_opts_parse(bf_opts *o, int argc, char **argv) {
    *o = (bf_opts){.seq_s = "64,256,1024", .reps = 3, .batch = 1, .warmup = 1, .tp = 1};
    arg_spec specs[] = {
        {"model", ARG_STR, &o->model_dir, "checkpoint directory or GGUF file [required]"},
        {"seq", ARG_STR, &o->seq_s, "comma-separated sequence lengths [64,256,1024]"},
        {"batch", ARG_INT, &o->batch, "sequences packed per forward [1]"},
        {"threads", ARG_INT, &o->threads, "CPU threads (0 = all cores) [0]"},
        {"reps", ARG_INT, &o->reps, "timed forwards per row [3]"},
        {"warmup", ARG_INT, &o->warmup, "untimed forwards before timing [1]"},
        {"out-rows", ARG_INT, &o->out_rows, "logit rows per sequence (0 = all; the decode loop uses a block) [0]"},
        {"tp", ARG_INT, &o->tp, "tensor-parallel ranks: CPU threads of one process, --threads split over them [1]"},
        {"cpu-kernels", ARG_STR, &o->cpu_kernels, CLI_CPU_KERNELS_HELP},
        {"cpu-pin", ARG_STR, &o->cpu_pin, CLI_CPU_PIN_HELP},
        {"cuda-fuse", ARG_STR, &o->cuda_fuse, CLI_CUDA_FUSE_HELP},
        {"cuda-skinny", ARG_STR, &o->cuda_skinny, CLI_CUDA_SKINNY_HELP},
        {"quant", ARG_STR, &o->quant_s, CLI_QUANT_HELP},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --model DIR [--seq 64,256,1024] [--batch N] [--threads N] [--reps N] [--tp N]\n"
                       "       unmask bench --tokenizer ... | --decode ... | --serve ...   (other modes)\n\n"
                       "Forward benchmark: LLaDA forward passes on the CPU backend, one table row per --seq.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    return -1;
}

/* Applies --cpu-kernels, checks the flags and parses --seq. 0, or 2 with the message printed. */
static int bf_opts_validate(bf_opts *o) {
    if (cli_cpu_kernels_apply(o->cpu_kernels) != 0 ||
        cli_backend_options_apply(o->cpu_pin, o->cuda_fuse, o->cuda_skinny) != 0 ||
        cli_quant_parse(o->quant_s, &o->quant) != 0)
        return 2;
    if (!o->model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (o->threads < 0 || o->reps < 1 || o->batch < 1 || o->warmup < 0 || o->out_rows < 0) {
        fprintf(stderr, "error: --threads/--warmup/--out-rows must be >= 0, --reps and --batch >= 1\n");
        return 2;
    }
    o->n_seqs = args_parse_int_list("seq", o->seq_s, &o->seqs);
    if (o->n_seqs < 0) return 2;
    for (int i = 0; i < o->n_seqs; i++)
        if (o->seqs[i] < 1) {
            fprintf(stderr, "error: --seq entries must be >= 1, got %d\n", o->seqs[i]);
            return 2;
        }
    return 0;
}

/* Prints the header lines (model, backend, settings) and the table's column names. */
static void bf_print_header(const bf_opts *o, const model *m, backend *be) {
    const model_config *c = &m->cfg;
    const st_tensor *q0 = m->llada.layers[0].attn_out;   /* (q_proj is NULL with a fused qkv; the LM head of an
                                                            FP8 checkpoint often stays BF16) */
    printf("unmask bench (forward): %s — %.1fM params, %s weights%s%s, d_model %d, %d layers, %d/%d heads, ffn %d, "
           "vocab rows %d\n",
           o->model_dir, (double)model_config_n_params(c) * 1e-6, q0->type_name,
           model_quant_converts(m->quant) ? " quantized to " : "", model_quant_converts(m->quant) ? model_quant_name(m->quant) : "",
           c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_hidden, c->n_embd_rows);
    printf("backend %s, %d threads%s, %d warmup + %d timed reps per row; peak RSS after loading: %.0f MiB; "
           "load average %.2f\n\n",
           backend_description(be), backend_n_threads(be), o->tp > 1 ? " per rank x tp" : "", o->warmup, o->reps,
           peak_rss_mib(), load_avg_1m());
    if (o->tp > 1) printf("tensor parallel: %d ranks (CPU threads, comm_local)\n\n", o->tp);
    printf("%7s %6s %9s %12s %12s %10s %9s %14s\n", "seq", "batch", "out rows", "ms/forward", "min ms", "tokens/s",
           "GFLOP/s", "peak RSS MiB");
}

/* Times warmup + reps forwards of batch random sequences of length L and prints the row. 0, or 1
 * with the message printed. */
static int bf_run_row(const bf_opts *o, model_ctx *ctx, const model_config *c, int L, um_err *err) {
    int batch = o->batch, n = L * batch, per = o->out_rows && o->out_rows < L ? o->out_rows : L, n_out = per * batch;
    int32_t *tok = xmalloc((size_t)n * sizeof *tok), *start = xmalloc((size_t)(batch + 1) * sizeof *start);
    int32_t *rows = xmalloc((size_t)n_out * sizeof *rows);
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(rng_u64(7, (uint64_t)L, (uint64_t)i) % (uint64_t)c->vocab_size);
    for (int b = 0; b <= batch; b++) start[b] = b * L;
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < per; j++) rows[b * per + j] = b * L + (L - per) + j;   /* last rows: a block */
    float *logits = xmalloc((size_t)n_out * (size_t)c->n_embd_rows * sizeof *logits);
    fwd_batch fb = {.n_seqs = batch, .seq_start = start, .tokens = tok, .n_out = n_out,
                    .out_rows = per < L ? rows : NULL};
    double total = 0, best = 1e30;
    int rc = 0;
    for (int it = 0; it < o->warmup + o->reps && rc == 0; it++) {
        uint64_t t0 = time_now_ns();
        if (model_forward(ctx, &fb, logits, err) != 0) {
            fprintf(stderr, "error: %s\n", err->msg);
            rc = 1;
            break;
        }
        double ms = time_ms_since(t0);
        if (it >= o->warmup) {
            total += ms;
            if (ms < best) best = ms;
        }
    }
    if (rc == 0) {
        double ms = total / o->reps;
        printf("%7d %6d %9d %12.1f %12.1f %10.0f %9.1f %14.0f\n", L, batch, per, ms, best, (double)n / (ms * 1e-3),
               forward_gflop(c, L, batch, per) / (ms * 1e-3), peak_rss_mib());
        fflush(stdout);
    }
    free(tok);
    free(start);
    free(rows);
    free(logits);
    return rc;
}

/* The forward benchmark (no mode flag). */
static int bench_forward(int argc, char **argv) {
    bf_opts o;
    int r = bf_opts_parse(&o, argc, argv);
    if (r >= 0) return r;
    if (bf_opts_validate(&o) != 0) {
        free(o.seqs);
        return 2;
    }
    um_err err = {0};
    model m;
    if (model_load(o.model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(o.seqs);
        return 1;
    }
    m.quant = o.quant;
    const model_config *c = &m.cfg;
    for (int i = 0; i < o.n_seqs; i++)
        if (o.seqs[i] > c->max_seq) {
            fprintf(stderr, "error: --seq %d exceeds the model's maximum sequence length %d\n", o.seqs[i], c->max_seq);
            model_free(&m);
            free(o.seqs);
            return 2;
        }
    cli_model_ctx mc;
    if (cli_model_ctx_open(&mc, &m, "cpu", o.tp, o.threads, 0, 0, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        model_free(&m);
        free(o.seqs);
        return cli_model_ctx_exit_code(&err);
    }
    bf_print_header(&o, &m, mc.ctx->be);
    int rc = 0;
    for (int si = 0; si < o.n_seqs && rc == 0; si++) rc = bf_run_row(&o, mc.ctx, c, o.seqs[si], &err);
    cli_model_ctx_close(&mc);
    model_free(&m);
    free(o.seqs);
    return rc;
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--decode") == 0) {   /* takes --device itself (CPU or one GPU) */
        argv[1] = argv[0];
        return bench_decode(argc - 1, argv + 1);
    }
    for (int i = 1; i < argc; i++) {   /* --device other than cpu: the device decode-step bench (cli/bench_device.c) */
        const char *dev = strcmp(argv[i], "--device") == 0 && i + 1 < argc ? argv[i + 1]
                          : strncmp(argv[i], "--device=", 9) == 0   ? argv[i] + 9
                                                                    : NULL;
        if (dev && backend_device_parse(dev, NULL) != 0) {
            for (int j = 1; j < argc; j++)
                if (strcmp(argv[j], "--tp") == 0 || strncmp(argv[j], "--tp=", 5) == 0) {
                    fprintf(stderr, "error: bench --device cuda times the device-resident decode step on one GPU; "
                                    "--tp is for the CPU forward bench (tensor-parallel GPUs: unmask serve --tp)\n");
                    return 2;
                }
            return bench_device(argc, argv);
        }
        int k = strcmp(argv[i], "--device=cpu") == 0 ? 1
                : (strcmp(argv[i], "--device") == 0 && i + 1 < argc && strcmp(argv[i + 1], "cpu") == 0) ? 2 : 0;
        if (k) {   /* --device cpu: the default; drop it */
            memmove(argv + i, argv + i + k, (size_t)(argc - i - k) * sizeof *argv);
            argc -= k;
            i--;
        }
    }
    if (argc >= 2) {
        int (*mode)(int, char **) = NULL;
        if (strcmp(argv[1], "--tokenizer") == 0) mode = bench_tokenizer;
        else if (strcmp(argv[1], "--serve") == 0) mode = bench_serve;
        if (mode) {
            argv[1] = argv[0];   /* drop the mode flag: the mode sees "bench" + its own flags */
            return mode(argc - 1, argv + 1);
        }
    }
    return bench_forward(argc, argv);
}
