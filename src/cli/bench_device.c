/*
 * bench_device.c — `unmask bench --device cuda:N`: device-resident diffusion decode steps on one
 * accelerator (decode/device_step.h; a backend with BACKEND_CAP_DEVICE_DECODE). For each --batch it decodes `batch` random prompts of --prompt
 * tokens with --gen masked positions in blocks of --block, temperature 0, the whole step (forward,
 * fused confidence, decoder commits) on the device and replayed from a CUDA graph, and prints
 * ms/step, tokens/s and two floors: every step reads all weights once, so the HBM floor = weight
 * bytes / device copy bandwidth (measured here: bytes read + written per second), and it does its
 * FLOPs, so the compute floor = step FLOPs / the measured rate of an --peak-n cubed bf16 matmul.
 * Does not: check numerics (tests/gpu/gpu_parity.c does), run without a GPU (clear error, exit 1).
 * Main thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_decode.h"
#include "decode/device_step.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "cli/tp_cli.h"
#include "decode/decode.h"
#include "model/model.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/timeutil.h"

/* FLOPs of one step: every canvas token through every layer, the LM head for the B block rows of
 * each sequence, attention 4 L^2 (heads x head_dim) per sequence and layer. */
static double step_tflop(const model_config *c, int batch, int len, int block) {
    double d = c->d_model, qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double per_layer = d * qd + 2.0 * d * kvd + qd * d + 3.0 * d * c->ffn_hidden;
    double mm = 2.0 * per_layer * c->n_layers * (double)len * batch + 2.0 * d * c->n_embd_rows * (double)block * batch;
    double att = 4.0 * (double)len * len * qd * c->n_layers * batch;
    return (mm + att) * 1e-12;
}

static int fwd_dev(void *user, const fwd_batch *b, const void **logits, um_err *err) {
    return model_forward_dev(user, b, logits, err);
}

typedef struct device_row {
    int    batch, canvas, steps;
    long   tokens;
    double wall_s;
    double mem_gib;
} device_row;

static int run_batch(backend *be, model_ctx *ctx, const model *m, int batch, int prompt, int gen, int block, int steps,
                     enum decode_decoder dec, double threshold, int graph, int profile, uint64_t seed, device_row *row,
                     um_err *err) {
    const model_config *c = &m->cfg;
    const int len = prompt + gen;
    const int nblocks = (gen + block - 1) / block;
    int32_t *canvas = xmalloc((size_t)batch * (size_t)len * sizeof *canvas);
    device_step_seq *sq = xcalloc((size_t)batch, sizeof *sq);
    int V = c->vocab_size < c->n_embd_rows ? c->vocab_size : c->n_embd_rows;
    for (int b = 0; b < batch; b++) {
        int32_t *t = canvas + (size_t)b * (size_t)len;
        for (int i = 0; i < prompt; i++) {
            t[i] = (int32_t)(rng_u64(seed + (uint64_t)b, 0, (uint64_t)i) % (uint64_t)V);
            if (t[i] == c->mask_id) t[i] = (t[i] + 1) % V;
        }
        for (int i = prompt; i < len; i++) t[i] = c->mask_id;
        sq[b] = (device_step_seq){.tokens = t, .len = len, .lo = prompt, .hi = prompt + (block < gen ? block : gen),
                                  .gen_end = len, .block_steps = steps / nblocks > 0 ? steps / nblocks : 1,
                                  .decoder = (int)dec, .threshold = threshold, .factor = 1.0, .stop_at_eos = 0,
                                  .temperature = 0.0, .top_p = 1.0, .top_k = 0, .seed = seed + (uint64_t)b};
    }
    device_step_ids ids = {c->n_embd_rows, c->mask_id, c->eos_id, c->eot_id};
    const int ring = 8;
    device_step *cd = device_step_create(be, sq, batch, block, ids, ring, fwd_dev, ctx, err);
    free(sq);
    if (!cd) {
        free(canvas);
        return -1;
    }
    int rc = 0;
    if (graph) rc = device_step_capture(cd, err);
    /* fixed-step decoders take exactly nblocks * block_steps steps; others run until every
     * sequence reports done (the host sees that a few steps late: extra steps are no-ops) */
    const int bound = dec == DECODER_LOW_CONFIDENCE || dec == DECODER_RANDOM ? nblocks * (steps / nblocks > 0 ? steps / nblocks : 1)
                                                                              : nblocks * block + 1;
    memset(row, 0, sizeof *row);
    row->batch = batch;
    row->canvas = len;
    backend_synchronize(be);
    if (profile) backend_profile_start(be);   /* the backend has timed events (bdev_backend_open) */
    const uint64_t t0 = time_now_ns();
    int enq = 0, n_done = 0;
    char *done = xcalloc((size_t)batch, 1);
    while (rc == 0 && n_done < batch) {
        if (enq < bound && device_step_pending(cd) < ring) {
            rc = device_step_enqueue(cd, err);
            enq++;
        }
        /* read what is ready; block only when no further step can be enqueued */
        const int can_step = enq < bound && device_step_pending(cd) < ring;
        if (!device_step_poll(cd, !can_step)) {
            if (!can_step && device_step_pending(cd) == 0) break;
            continue;
        }
        for (int s = 0; s < batch; s++) {
            device_step_event ev;
            device_step_record(cd, s, &ev);
            row->tokens += ev.n_commit;
            if (ev.done && !done[s]) done[s] = 1, n_done++;
        }
    }
    while (rc == 0 && device_step_poll(cd, 1)) {   /* drain */
        for (int s = 0; s < batch; s++) {
            device_step_event ev;
            device_step_record(cd, s, &ev);
            row->tokens += ev.n_commit;
        }
    }
    backend_synchronize(be);
    row->wall_s = (double)(time_now_ns() - t0) * 1e-9;
    row->steps = enq;
    if (profile) {
        printf("\nprofile, batch %d (%d steps launched op by op, %.3f ms/step wall):\n", batch, enq,
               enq > 0 ? row->wall_s * 1e3 / enq : 0.0);
        backend_profile_report(be, stdout, enq > 0 ? enq : 1, row->wall_s * 1e3);
        backend_profile_stop(be);
        printf("\n");
    }
    size_t fb = 0, tb = 0;
    backend_mem_info(be, &fb, &tb);
    row->mem_gib = (double)(tb - fb) / (double)(1ull << 30);
    free(done);
    device_step_free(cd);
    free(canvas);
    return rc;
}

/* Flags of `bench --device`, and the parsed --batch list. */
typedef struct bdev_opts {
    const char *device, *model_dir, *batch_s, *dec_s, *quant_s;
    enum dtype quant;   /* --quant, parsed: bf16 or fp8 on a GPU */
    int    gen, block, prompt, steps, graph, bw_mib, profile, peak_n;
    double threshold;
    enum decode_decoder dec;
    int   *batches;   /* [nb], owned */
    int    nb, max_batch;
} bdev_opts;

/* Parses argv into o (defaults first). -1 to go on, else the exit code (0 after --help, 2 on error). */
static int bdev_opts_parse(bdev_opts *o, int argc, char **argv) {
    *o = (bdev_opts){.device = "cuda:0", .batch_s = "1,8,32", .dec_s = "low_confidence", .gen = 256, .block = 32,
                     .prompt = 64, .graph = 1, .bw_mib = 2048, .threshold = 0.9, .peak_n = 8192};
    arg_spec specs[] = {
        {"device", ARG_STR, &o->device, "cuda or cuda:N [cuda:0]"},
        {"model", ARG_STR, &o->model_dir, "checkpoint directory or GGUF file [required]"},
        {"batch", ARG_STR, &o->batch_s, "comma-separated batch sizes [1,8,32]"},
        {"gen", ARG_INT, &o->gen, "generated (masked) positions per sequence [256]"},
        {"block", ARG_INT, &o->block, "block length [32]"},
        {"prompt", ARG_INT, &o->prompt, "random prompt tokens per sequence [64]"},
        {"steps", ARG_INT, &o->steps, "fixed-step decoders: total steps (0 = gen: one token per step) [0]"},
        {"decoder", ARG_STR, &o->dec_s, "low_confidence | random | threshold | factor [low_confidence]"},
        {"threshold", ARG_FLOAT, &o->threshold, "threshold decoder tau [0.9]"},
        {"graph", ARG_INT, &o->graph, "1: replay the step from a CUDA graph; 0: launch every op [1]"},
        {"bw-mib", ARG_INT, &o->bw_mib, "buffer size of the copy-bandwidth measurement (MiB) [2048]"},
        {"peak-n", ARG_INT, &o->peak_n, "size n of the n x n x n bf16 matmul whose measured rate sets the compute floor, 0 = none (on the CPU emulator use a small n such as 64) [8192]"},
        {"profile", ARG_INT, &o->profile, "1: after each row, time every op with events (steps launched op by op, no graph) and print the table [0]"},
        {"quant", ARG_STR, &o->quant_s, "bf16 = as the checkpoint stores them, fp8 = E4M3 with a scale per output "
                                         "channel (docs/gpu.md); q8_0 / q4_0 run on the CPU only [bf16]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --device cuda:N --model DIR [--batch 1,8,32] [--gen 256] [--block 32]\n\n"
                       "GPU decode benchmark: whole diffusion steps on the device (forward + fused confidence +\n"
                       "decoder), one table row per batch size, with the HBM floor of a step.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    return -1;
}

/* Checks the flags and parses --decoder and --batch (--steps 0 becomes --gen). 0, or 2 with the
 * message printed. */
static int bdev_opts_validate(bdev_opts *o) {
    if (cli_quant_parse(o->quant_s, &o->quant) != 0) return 2;
    if (dtype_is_quant(o->quant)) {
        fprintf(stderr, "error: --quant %s: GPUs have no kernels for quantized weights yet; use --quant bf16 with "
                        "--device %s (quantized weights run on the CPU: bench --decode / bench without --device)\n",
                o->quant_s, o->device);
        return 2;
    }
    if (!o->model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    if (decode_decoder_parse(o->dec_s, &o->dec) != 0 || o->dec > DECODER_FACTOR) {
        fprintf(stderr, "error: --decoder must be low_confidence, random, threshold or factor\n");
        return 2;
    }
    if (o->gen < 1 || o->block < 1 || o->block > 1024 || o->prompt < 1 || o->steps < 0 || o->bw_mib < 1 ||
        o->peak_n < 0 || o->peak_n > 32768) {
        fprintf(stderr, "error: --gen, --prompt >= 1, --block 1..1024, --steps >= 0, --bw-mib >= 1, --peak-n 0..32768\n");
        return 2;
    }
    if (o->steps == 0) o->steps = o->gen;
    o->nb = args_parse_int_list("batch", o->batch_s, &o->batches);
    if (o->nb < 0) return 2;
    for (int i = 0; i < o->nb; i++) {
        if (o->batches[i] < 1) {
            fprintf(stderr, "error: --batch entries must be >= 1, got %d\n", o->batches[i]);
            return 2;
        }
        if (o->batches[i] > o->max_batch) o->max_batch = o->batches[i];
    }
    return 0;
}

/* The device backend, when it can run the device-resident decode step; NULL with err otherwise. */
static backend *bdev_backend_open(const char *device, um_err *err) {
    backend *be = backend_init_device(device, 1, err);
    if (be && !backend_has(be, BACKEND_CAP_DEVICE_DECODE | BACKEND_CAP_GRAPHS | BACKEND_CAP_DEVICE_MEMORY)) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s has no device-resident decode step", backend_name(be));
        backend_free(be);
        be = NULL;
    }
    return be;
}

/* Activation bytes of the largest step (max_batch sequences of prompt + gen tokens), for the fit check. */
static uint64_t bdev_act_bytes(const model_config *c, const bdev_opts *o) {
    const uint64_t tok = (uint64_t)o->max_batch * (uint64_t)(o->prompt + o->gen);
    const uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_dim, kvd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    const uint64_t per_tok = 2u * (2u * (uint64_t)c->d_model + 2u * qd + 2u * kvd + 2u * (uint64_t)c->ffn_hidden);
    const uint64_t out = (uint64_t)o->max_batch * (uint64_t)o->block;
    return tok * per_tok + out * 2u * ((uint64_t)c->n_embd_rows + (uint64_t)c->d_model);
}

/* Measured rate (FLOP/s) of the backend's matmul on an n x n x n product of random bf16 data, timed
 * with device events over reps products after a warm-up; 0 when n < 16. The operands are made
 * through the backend's own ops (upload, embed), so this is the path the forward's GEMMs take. */
static double bdev_matmul_rate(backend *be, int n, int reps, um_err *err) {
    if (n < 16) return 0.0;
    const size_t nn = (size_t)n * (size_t)n;
    uint16_t *h = xmalloc(nn * sizeof *h);
    for (size_t i = 0; i < nn; i++) h[i] = f32_to_bf16((float)(2.0 * rng_u01(7, 0, i) - 1.0));   /* not zeros */
    int32_t *ids = xmalloc((size_t)n * sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = (n - 1 - i);
    bweight_src sx = {"peak.x", h, DTYPE_BF16, n, n, 1}, sw = {"peak.w", h, DTYPE_BF16, n, n, 0};
    bweight wx, ww;
    double rate = 0.0;
    if (backend_weight_upload(be, &sx, &wx, err) != 0) goto out_h;
    if (backend_weight_upload(be, &sw, &ww, err) != 0) goto out_x;
    void *x = backend_act_alloc(be, nn), *y = backend_act_alloc(be, nn);
    backend_embed(be, &wx, ids, n, x);   /* x = the rows of h in reverse: random, unlike w row by row */
    backend_matmul(be, x, &ww, NULL, n, y);
    backend_event *e0 = backend_event_new(be), *e1 = backend_event_new(be);
    backend_event_record(be, e0);
    for (int r = 0; r < reps; r++) backend_matmul(be, x, &ww, NULL, n, y);
    backend_event_record(be, e1);
    backend_event_wait(be, e1);
    const double ms = backend_event_elapsed_ms(be, e0, e1);
    rate = ms > 0 ? 2.0 * (double)n * (double)n * (double)n * reps / (ms * 1e-3) : 0.0;
    backend_event_free(be, e0);
    backend_event_free(be, e1);
    backend_act_free(be, x);
    backend_act_free(be, y);
    backend_weight_free(be, &ww);
out_x:
    backend_weight_free(be, &wx);
out_h:
    free(ids);
    free(h);
    return rate;
}

/* Prints the header lines (device, bandwidth, floors, run settings) and the table's column names. */
static void bdev_print_header(const bdev_opts *o, backend *be, const model_config *c, uint64_t wbytes, double bw,
                              double floor_ms, double mm_rate) {
    printf("device %s (%s); model %s: %.2f B params, %.2f GiB bf16 weights%s\n", backend_name(be), backend_description(be),
           o->model_dir, (double)model_config_n_params(c) * 1e-9, (double)wbytes / (double)(1ull << 30),
           o->quant == DTYPE_F8_E4M3 ? "; run with --quant fp8 (the floors below are the bf16 weights')" : "");
    printf("device copy bandwidth %.0f GB/s (read + write) -> HBM floor %.3f ms/step (weights read once per step)\n",
           bw * 1e-9, floor_ms);
    if (mm_rate > 0)
        printf("bf16 matmul %.0f TFLOP/s (%d^3, measured) -> compute floor = a step's FLOPs at that rate; "
               "floor/actual uses the larger floor\n", mm_rate * 1e-12, o->peak_n);
    printf("decoder %s, gen %d, block %d, prompt %d, steps %d, temperature 0, %s\n\n", decode_decoder_name(o->dec),
           o->gen, o->block, o->prompt, o->steps, o->graph ? "CUDA graph" : "direct launches");
    printf("| batch | canvas | steps | ms/step | tokens/s | steps/s | TFLOP/s | HBM floor ms/step | compute floor ms/step "
           "| floor/actual | GPU mem GiB |\n");
    printf("|------:|-------:|------:|--------:|---------:|--------:|--------:|------------------:|----------------------:"
           "|-------------:|------------:|\n");
}

/* Prints one table row. */
static void bdev_print_row(const device_row *row, const model_config *c, int block, double floor_ms, double mm_rate) {
    const double ms = row->steps ? row->wall_s * 1e3 / row->steps : 0.0;
    const double tf = step_tflop(c, row->batch, row->canvas, block);
    const double cfloor = mm_rate > 0 ? tf * 1e12 / mm_rate * 1e3 : 0.0;
    const double fl = cfloor > floor_ms ? cfloor : floor_ms;
    printf("| %5d | %6d | %5d | %7.3f | %8.1f | %7.1f | %7.1f | %17.3f | %21.3f | %11.1f%% | %11.2f |\n", row->batch,
           row->canvas, row->steps, ms, row->wall_s > 0 ? (double)row->tokens / row->wall_s : 0.0,
           row->wall_s > 0 ? row->steps / row->wall_s : 0.0, ms > 0 ? tf / (ms * 1e-3) : 0.0, floor_ms, cfloor,
           ms > 0 ? 100.0 * fl / ms : 0.0, row->mem_gib);
    fflush(stdout);
}

/* With the model loaded on be: the fit check, the bandwidth measurement and one row per batch size.
 * 0, or the exit code with the message printed. */
static int bdev_run(const bdev_opts *o, backend *be, const model *m, um_err *err) {
    const model_config *c = &m->cfg;
    if (o->prompt + o->gen > c->max_seq) {
        fprintf(stderr, "error: --prompt + --gen = %d exceeds the model's maximum sequence length %d\n",
                o->prompt + o->gen, c->max_seq);
        return 2;
    }
    const uint64_t wbytes = (uint64_t)model_config_n_params(c) * 2u;
    int rc = 0;
    model_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    if (backend_check_fit(be, wbytes, bdev_act_bytes(c, o), err) != 0) {
        fprintf(stderr, "error: %s\n", err->msg);
        return 1;
    }
    backend_set_upload_total(be, wbytes, "weights");
    if (model_ctx_init(&ctx, m, be, err) != 0) {
        fprintf(stderr, "error: %s\n", err->msg);
        rc = 1;
        goto out;
    }
    const double bw = backend_mem_bandwidth(be, (size_t)o->bw_mib << 20, 10);
    const double floor_ms = bw > 0 ? (double)wbytes / bw * 1e3 : 0.0;
    const double mm_rate = bdev_matmul_rate(be, o->peak_n, 10, err);
    if (o->peak_n >= 16 && mm_rate <= 0) {
        fprintf(stderr, "error: matmul rate measurement: %s\n", err->msg[0] ? err->msg : "no time measured");
        rc = 1;
        goto out;
    }
    bdev_print_header(o, be, c, wbytes, bw, floor_ms, mm_rate);
    for (int i = 0; i < o->nb && rc == 0; i++) {
        device_row row;
        if (run_batch(be, &ctx, m, o->batches[i], o->prompt, o->gen, o->block, o->steps, o->dec, o->threshold, o->graph, 0,
                      1000u + (uint64_t)i, &row, err) != 0) {
            fprintf(stderr, "error: batch %d: %s\n", o->batches[i], err->msg);
            rc = 1;
            break;
        }
        bdev_print_row(&row, c, o->block, floor_ms, mm_rate);
        device_row prow;   /* the same batch again, op by op and timed per op */
        if (o->profile && run_batch(be, &ctx, m, o->batches[i], o->prompt, o->gen, o->block, o->steps, o->dec,
                                    o->threshold, 0, 1, 1000u + (uint64_t)i, &prow, err) != 0) {
            fprintf(stderr, "error: batch %d (profiled): %s\n", o->batches[i], err->msg);
            rc = 1;
        }
    }
out:
    if (ctx.weights || ctx.scratch) model_ctx_free(&ctx);
    return rc;
}

int bench_device(int argc, char **argv) {
    bdev_opts o;
    int r = bdev_opts_parse(&o, argc, argv);
    if (r >= 0) return r;
    if (bdev_opts_validate(&o) != 0) {
        free(o.batches);
        return 2;
    }
    um_err err = {0};
    backend *be = bdev_backend_open(o.device, &err);
    if (!be) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(o.batches);
        return 1;
    }
    model m;
    int rc = 1;
    if (model_load(o.model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
    } else {
        m.quant = o.quant;
        rc = bdev_run(&o, be, &m, &err);
        model_free(&m);
    }
    backend_free(be);
    free(o.batches);
    return rc;
}
