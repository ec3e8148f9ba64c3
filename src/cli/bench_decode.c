/*
 * bench_decode.c — `unmask bench --decode`: end-to-end decode throughput on the CPU backend, or
 * with --device cuda:N on a GPU. For each decoder and batch size it decodes `batch` different
 * random prompts together (one batched step at a time, as the server's engine does: on a GPU the
 * device-resident loop advances the sequences it supports, KV cache modes included, and the host
 * loop the rest) and prints tokens/s, steps/s, tokens per step and ms per step; with --cache a,b,c
 * the KV cache modes are run interleaved per rep and each row's tokens/s is also given as a ratio
 * to `none` of the same decoder and batch (when listed).
 * Does not: measure queueing or HTTP. Main thread (+ backend workers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "backend/backend.h"
#include "backend/backend_decode.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/tp_cli.h"
#include "decode/decode.h"
#include "decode/decode_device.h"
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

/* max_blocks > 0: stop once every sequence finished that many blocks (the rest is not timed).
 * dd: the device-resident loop for the sequences it can run (NULL: host loop only). */
static int run_one(model_ctx *ctx, decode_device *dd, const model *m, const decode_params *p, int batch,
                   int prompt_len, int max_blocks, uint64_t seed, bench_row *row, um_err *err) {
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
    decode_seq **dev = xmalloc((size_t)batch * sizeof *dev), **host = xmalloc((size_t)batch * sizeof *host);
    decode_device_stats ds0, ds1;
    if (dd) decode_device_get_stats(dd, &ds0);
    while (rc == 0) {
        int nd = 0, nh = 0;
        for (int b = 0; b < batch; b++)
            if (!decode_seq_done(s[b]) && (max_blocks <= 0 || decode_seq_blocks_done(s[b]) < max_blocks)) {
                if (dd && decode_device_eligible(ctx, s[b])) dev[nd++] = s[b];
                else host[nh++] = s[b];
            }
        if (nd == 0 && nh == 0) break;
        if (nd > 0 || (dd && decode_device_holding(dd))) rc = decode_device_step(dd, dev, nd, NULL, err);
        if (rc == 0 && nh > 0) {
            rc = decode_step(ctx, host, nh, NULL, err);
            row->fwd_steps++;
        }
    }
    if (dd) {   /* the pipeline's last steps (sequences past --max-blocks), then release the batch */
        decode_device_drain(dd, NULL);
        decode_device_reset(dd);
        decode_device_get_stats(dd, &ds1);
        row->fwd_steps += (int)(ds1.steps - ds0.steps);   /* device steps enqueued (one behind the records) */
    }
    free(dev);
    free(host);
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

/* Flags of `bench --decode`, and the lists parsed from them. */
typedef struct bd_opts {
    const char *model_dir, *batch_s, *decoders_s, *caches_s, *cpu_kernels, *cpu_pin, *cuda_fuse, *cuda_skinny, *device;
    const char *device_loop, *quant_s;
    enum dtype quant;                          /* --quant, parsed */
    int    gen, block, steps, prompt_len, threads, decode_flag, reps, profile;
    int    cache_refresh, prefix_look, after_look, warmup, max_blocks, prefill_chunk;
    double threshold, factor, temperature;
    int   *batches;                            /* [n_batches], owned */
    int    n_batches;
    enum decode_decoder decs[DECODER_COUNT_];  /* [n_decs] */
    int    n_decs;
    enum decode_cache caches[DECODE_CACHE_COUNT_]; /* [n_caches] */
    int    n_caches, none_at;                  /* none_at: index of `none` in caches, -1 = not listed */
} bd_opts;

/* Parses argv into o (defaults first). -1 to go on, else the exit code (0 after --help, 2 on error). */
static int bd_opts_parse(bd_opts *o, int argc, char **argv) {
    *o = (bd_opts){.batch_s = "1,8", .decoders_s = "low_confidence,random,threshold,factor", .caches_s = "none",
                   .gen = 128, .block = 32, .prompt_len = 32, .reps = 1, .threshold = 0.9, .factor = 1.0,
                   .none_at = -1, .prefill_chunk = -1, .device = "cpu", .device_loop = "on"};
    arg_spec specs[] = {
        {"decode", ARG_FLAG, &o->decode_flag, "(selects this benchmark)"},
        {"model", ARG_STR, &o->model_dir, "checkpoint directory or GGUF file [required]"},
        {"batch", ARG_STR, &o->batch_s, "comma-separated batch sizes [1,8]"},
        {"gen", ARG_INT, &o->gen, "gen_length [128]"},
        {"block", ARG_INT, &o->block, "block_length [32]"},
        {"steps", ARG_INT, &o->steps, "fixed-step decoders: total steps, 0 = gen [0]"},
        {"prompt", ARG_INT, &o->prompt_len, "random prompt length in tokens [32]"},
        {"decoders", ARG_STR, &o->decoders_s, "comma-separated decoders [low_confidence,random,threshold,factor]"},
        {"threshold", ARG_FLOAT, &o->threshold, "threshold decoder tau [0.9]"},
        {"factor", ARG_FLOAT, &o->factor, "factor decoder f [1.0]"},
        {"temperature", ARG_FLOAT, &o->temperature, "sampling temperature [0]"},
        {"threads", ARG_INT, &o->threads, "CPU threads (0 = all cores) [0]"},
        {"reps", ARG_INT, &o->reps, "runs per row, the fastest is reported (noisy machines) [1]"},
        {"profile", ARG_INT, &o->profile, "1 = after each row, run it again on the host loop with every op timed (device events, or the clock on the CPU) and print the table [0]"},
        {"cache", ARG_STR, &o->caches_s, "comma-separated KV cache modes: none, prefix, dual, vicinity [none]"},
        {"cache-refresh", ARG_INT, &o->cache_refresh, "refresh the cache every N steps inside a block too [0]"},
        {"prefix-look", ARG_INT, &o->prefix_look, "vicinity: positions before the block [0]"},
        {"after-look", ARG_INT, &o->after_look, "vicinity: positions after the block [0]"},
        {"warmup-steps", ARG_INT, &o->warmup, "cache-free steps at the start of each sequence [0]"},
        {"prefill-chunk", ARG_INT, &o->prefill_chunk,
         "block-causal models with a cache: rows per prompt-prefill forward, 0 = one forward [the default, 256]"},
        {"max-blocks", ARG_INT, &o->max_blocks, "time only the first N blocks of each sequence, 0 = all [0]"},
        {"cpu-kernels", ARG_STR, &o->cpu_kernels, CLI_CPU_KERNELS_HELP},
        {"cpu-pin", ARG_STR, &o->cpu_pin, CLI_CPU_PIN_HELP},
        {"cuda-fuse", ARG_STR, &o->cuda_fuse, CLI_CUDA_FUSE_HELP},
        {"cuda-skinny", ARG_STR, &o->cuda_skinny, CLI_CUDA_SKINNY_HELP},
        {"quant", ARG_STR, &o->quant_s, CLI_QUANT_HELP},
        {"device", ARG_STR, &o->device, "cpu | cuda | cuda:N [cpu]"},
        {"device-loop", ARG_STR, &o->device_loop,
         "CUDA: on = device-resident decode loop for the sequences it supports (as the server), off = host loop [on]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --decode --model DIR [--batch 1,8] [--gen 128] [--block 32] [--steps N]\n"
                       "                    [--cache none,prefix,dual,vicinity] [--device cuda:N]\n\n"
                       "Decodes batches of random prompts (EOS early stop off) and prints tokens/s, steps/s,\n"
                       "tokens per step and ms per step for each decoder, batch size and KV cache mode.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    return -1;
}

/* --decoders a,b,c -> o->decs. 0, or 2 with the message printed. */
static int bd_parse_decoders(bd_opts *o) {
    char *list = xstrdup(o->decoders_s), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_decs >= DECODER_COUNT_ || decode_decoder_parse(t, &o->decs[o->n_decs]) != 0) {
            fprintf(stderr, "error: --decoders: unknown or repeated decoder '%s' (low_confidence, random, "
                            "threshold, factor)\n", t);
            free(list);
            return 2;
        }
        o->n_decs++;
    }
    free(list);
    return 0;
}

/* --cache a,b,c -> o->caches (no repeats) and o->none_at. 0, or 2 with the message printed. */
static int bd_parse_caches(bd_opts *o) {
    char *list = xstrdup(o->caches_s), *save = NULL;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int dup = 0, n = o->n_caches;
        if (n < DECODE_CACHE_COUNT_ && decode_cache_parse(t, &o->caches[n]) == 0)
            for (int i = 0; i < n; i++) dup |= o->caches[i] == o->caches[n];
        if (n >= DECODE_CACHE_COUNT_ || decode_cache_parse(t, &o->caches[n]) != 0 || dup) {
            fprintf(stderr, "error: --cache: unknown or repeated mode '%s' (none, prefix, dual, vicinity)\n", t);
            free(list);
            return 2;
        }
        if (o->caches[n] == DECODE_CACHE_NONE) o->none_at = n;
        o->n_caches++;
    }
    free(list);
    return 0;
}

/* Checks the flags and parses the lists (after --cpu-kernels is applied). 0, or 2 with the message
 * printed. */
static int bd_opts_validate(bd_opts *o) {
    if (cli_cpu_kernels_apply(o->cpu_kernels) != 0 ||
        cli_backend_options_apply(o->cpu_pin, o->cuda_fuse, o->cuda_skinny) != 0 ||
        cli_quant_parse(o->quant_s, &o->quant) != 0)
        return 2;
    if (!o->model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (strcmp(o->device_loop, "on") != 0 && strcmp(o->device_loop, "off") != 0) {
        fprintf(stderr, "error: --device-loop must be on or off, got '%s'\n", o->device_loop);
        return 2;
    }
    if (o->reps < 1 || o->threads < 0 || o->prompt_len < 1 || o->max_blocks < 0) {
        fprintf(stderr, "error: --reps and --prompt must be >= 1, --threads and --max-blocks >= 0\n");
        return 2;
    }
    o->n_batches = args_parse_int_list("batch", o->batch_s, &o->batches);
    if (o->n_batches < 0) return 2;
    for (int i = 0; i < o->n_batches; i++)
        if (o->batches[i] < 1 || o->batches[i] > 1024) {
            fprintf(stderr, "error: --batch sizes must be between 1 and 1024, got %d\n", o->batches[i]);
            return 2;
        }
    if (bd_parse_decoders(o) != 0 || bd_parse_caches(o) != 0) return 2;
    return 0;
}

/* The decode parameters every row shares (the decoder and cache mode are set per row). */
static decode_params bd_base_params(const bd_opts *o, const model *m) {
    decode_params base = decode_params_default();
    if (m->cfg.block_causal > 0) base.layout = DECODE_LAYOUT_ALIGNED;   /* LLaDA2: its aligned blocks */
    base.gen_length = o->gen, base.block_length = o->block, base.steps = o->steps;
    base.threshold = o->threshold, base.factor = o->factor, base.temperature = o->temperature;
    base.stop_at_eos = 0; /* a fixed amount of work per run */
    base.cache_refresh = o->cache_refresh, base.prefix_look = o->prefix_look, base.after_look = o->after_look;
    base.warmup_steps = o->warmup;
    if (o->prefill_chunk >= 0) base.prefill_chunk = o->prefill_chunk;
    return base;
}

/* Validates every decoder x cache combination against the model. 0, or -1 with err. */
static int bd_validate_params(const bd_opts *o, const decode_params *base, const model *m, um_err *err) {
    for (int d = 0; d < o->n_decs * o->n_caches; d++) {
        decode_params p = *base;
        p.decoder = o->decs[d / o->n_caches];
        p.cache = o->caches[d % o->n_caches];
        if (decode_params_validate(&p, &m->cfg, o->prompt_len, err) != 0) return -1;
    }
    return 0;
}

/* Prints the benchmark's header lines and the table's column names. */
static void bd_print_header(const bd_opts *o, const model *m, backend *be) {
    printf("decode benchmark: %s (%s, d_model %d, %d layers, vocab %d, %s weights), backend %s, %d threads\n",
           o->model_dir, model_arch_name(m->cfg.arch), m->cfg.d_model, m->cfg.n_layers, m->cfg.n_embd_rows,
           model_quant_name(m->quant), backend_description(be), backend_n_threads(be));
    printf("prompt %d tokens, gen_length %d, block_length %d, steps %d, temperature %g, EOS early stop off%s\n",
           o->prompt_len, o->gen, o->block, o->steps ? o->steps : o->gen, o->temperature,
           o->max_blocks ? "; timed: the first blocks only" : "");
    if (o->max_blocks) printf("(--max-blocks %d: each run stops after every sequence finished %d blocks)\n",
                              o->max_blocks, o->max_blocks);
    printf("KV cache: refresh every %d steps (0 = at block start), prefix_look %d, after_look %d, warmup %d steps",
           o->cache_refresh, o->prefix_look, o->after_look, o->warmup);
    if (m->cfg.block_causal > 0) printf(", prefill chunk %d rows", o->prefill_chunk >= 0 ? o->prefill_chunk : decode_params_default().prefill_chunk);
    printf("\n\n");
    printf("%-15s %-9s %5s %7s %9s %9s %9s %9s %10s %9s %8s\n", "decoder", "cache", "batch", "steps", "tokens", "wall s",
           "tokens/s", "steps/s", "tok/step", "ms/step", "x none");
}

/* Runs one row group (decoder d, batch size `batch`): every cache mode, interleaved per rep, and
 * prints a row each with the fastest rep. 0, or 1 with the message printed. */
static int bd_run_group(model_ctx *ctx, decode_device *dd, const model *m, const bd_opts *o, const decode_params *base,
                        int d, int batch, um_err *err) {
    /* the cache modes of one row group run interleaved, each rep: a load change hits all */
    bench_row best[DECODE_CACHE_COUNT_];
    for (int k = 0; k < o->reps; k++) {
        for (int c = 0; c < o->n_caches; c++) {
            decode_params p = *base;
            p.decoder = o->decs[d];
            p.cache = o->caches[c];
            bench_row row;
            if (run_one(ctx, dd, m, &p, batch, o->prompt_len, o->max_blocks, 1000, &row, err) != 0) {
                fprintf(stderr, "error: %s\n", err->msg);
                return 1;
            } else if (k == 0 || row.wall_s < best[c].wall_s) {
                best[c] = row;
            }
        }
    }
    for (int c = 0; c < o->n_caches; c++) {
        const bench_row *row = &best[c];
        double tps = row->tokens / row->wall_s, sps = row->fwd_steps / row->wall_s;
        double tok_per_step = row->seq_steps ? (double)row->tokens / (double)row->seq_steps : 0;
        char ratio[16] = "-";
        if (o->none_at >= 0)
            snprintf(ratio, sizeof ratio, "%.2f", tps / (best[o->none_at].tokens / best[o->none_at].wall_s));
        printf("%-15s %-9s %5d %7d %9ld %9.2f %9.1f %9.2f %10.2f %9.1f %8s\n", decode_decoder_name(o->decs[d]),
               decode_cache_name(o->caches[c]), row->batch, row->fwd_steps, row->tokens, row->wall_s, tps, sps,
               tok_per_step, 1e3 * row->wall_s / row->fwd_steps, ratio);
    }
    for (int c = 0; c < o->n_caches && o->profile; c++) {   /* again, op by op (no graphs), timed per op */
        decode_params p = *base;
        p.decoder = o->decs[d];
        p.cache = o->caches[c];
        bench_row row;
        CHECK(backend_profile_start(ctx->be) == 0);   /* checked at start: a backend with timed events */
        const int rc = run_one(ctx, NULL, m, &p, batch, o->prompt_len, o->max_blocks, 1000, &row, err);
        if (rc == 0) {
            printf("\nprofile: %s, cache %s, batch %d, host loop (%d steps, %.3f ms/step wall):\n",
                   decode_decoder_name(p.decoder), decode_cache_name(p.cache), batch, row.fwd_steps,
                   1e3 * row.wall_s / (row.fwd_steps ? row.fwd_steps : 1));
            backend_profile_report(ctx->be, stdout, row.fwd_steps ? row.fwd_steps : 1, 1e3 * row.wall_s);
            printf("\n");
        }
        backend_profile_stop(ctx->be);
        if (rc != 0) {
            fprintf(stderr, "error: %s\n", err->msg);
            return 1;
        }
    }
    fflush(stdout);
    return 0;
}

int bench_decode(int argc, char **argv) {
    bd_opts o;
    int r = bd_opts_parse(&o, argc, argv);
    if (r >= 0) return r;
    if (bd_opts_validate(&o) != 0) {
        free(o.batches);
        return 2;
    }
    um_err err = {0};
    model m;
    if (model_load(o.model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(o.batches);
        return 1;
    }
    m.quant = o.quant;
    decode_params base = bd_base_params(&o, &m);
    if (bd_validate_params(&o, &base, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        model_free(&m);
        free(o.batches);
        return 2;
    }
    int max_batch = 1;
    for (int i = 0; i < o.n_batches; i++) max_batch = o.batches[i] > max_batch ? o.batches[i] : max_batch;
    cli_model_ctx mc;
    if (cli_model_ctx_open(&mc, &m, o.device, 1, o.threads, (uint64_t)max_batch * (uint64_t)(o.prompt_len + o.gen), 0,
                           &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        model_free(&m);
        free(o.batches);
        return cli_model_ctx_exit_code(&err);
    }
    model_ctx *ctx = mc.ctx;
    if (o.profile && !backend_profile_available(ctx->be)) {
        fprintf(stderr, "error: --profile: backend %s has no timed events\n", backend_name(ctx->be));
        cli_model_ctx_close(&mc);
        model_free(&m);
        free(o.batches);
        return 2;
    }
    decode_device *dd = strcmp(o.device_loop, "on") == 0 && decode_device_supported(ctx) ? decode_device_create(ctx, 1)
                                                                                         : NULL;
    bd_print_header(&o, &m, ctx->be);
    if (dd) printf("(device-resident decode loop for the sequences it supports, the host loop for the rest)\n");
    /* warm-up: one untimed batch-1 run of the first decoder (thread pools, page faults; a single
     * forward was not enough to reach steady state) */
    {
        bench_row w;
        decode_params p = base;
        p.decoder = o.decs[0];
        if (run_one(ctx, dd, &m, &p, 1, o.prompt_len, o.max_blocks, 99, &w, &err) != 0)
            fprintf(stderr, "warm-up: %s\n", err.msg);
    }
    int rc = 0;
    for (int d = 0; d < o.n_decs && rc == 0; d++)
        for (int bi = 0; bi < o.n_batches && rc == 0; bi++) rc = bd_run_group(ctx, dd, &m, &o, &base, d, o.batches[bi], &err);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("\npeak RSS %.1f MiB. steps = batched forward passes; tok/step = tokens committed per sequence per step;\n"
           "x none = tokens/s over the `none` row of the same decoder and batch; fastest of %d run(s) per row.\n",
           (double)ru.ru_maxrss / 1024.0, o.reps);
    if (backend_has(ctx->be, BACKEND_CAP_DEVICE_MEMORY)) {   /* the allocator keeps what the largest row took */
        size_t fb = 0, tb = 0;
        backend_mem_info(ctx->be, &fb, &tb);
        printf("device memory in use after the rows: %.2f GiB of %.2f GiB (weights, activations, caches)\n",
               (double)(tb - fb) / (double)(1ull << 30), (double)tb / (double)(1ull << 30));
    }
    if (ctx->packed)
        printf("joined weights, one product each: %s%s%s (UNMASK_CUDA_PACK=none: separate)\n",
               ctx->packed & BACKEND_PACK_QKV ? "q|k|v" : "", ctx->packed == (BACKEND_PACK_QKV | BACKEND_PACK_GATE_UP) ? ", " : "",
               ctx->packed & BACKEND_PACK_GATE_UP ? "gate|up" : "");
    if (dd) {
        decode_device_stats ds;
        decode_device_get_stats(dd, &ds);
        printf("device loop: %llu steps, %llu graph captures, %llu replays\n", (unsigned long long)ds.steps,
               (unsigned long long)ds.graph_captures, (unsigned long long)ds.graph_replays);
        decode_device_free(dd);
    }
    cli_model_ctx_close(&mc);
    model_free(&m);
    decode_thread_scratch_free();
    free(o.batches);
    return rc;
}
