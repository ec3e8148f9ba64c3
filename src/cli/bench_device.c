/*
 * bench_device.c — `unmask bench --device cuda:N`: device-resident diffusion decode steps on one
 * accelerator (decode/device_step.h; a backend with BACKEND_CAP_DEVICE_DECODE). For each --batch it decodes `batch` random prompts of --prompt
 * tokens with --gen masked positions in blocks of --block, temperature 0, the whole step (forward,
 * fused confidence, decoder commits) on the device and replayed from a CUDA graph, and prints
 * ms/step, tokens/s and the HBM floor: every step reads all weights once, so
 * floor = weight bytes / device copy bandwidth (measured here: bytes read + written per second).
 * Does not: check numerics (tests/gpu/gpu_parity.c does), run without a GPU (clear error, exit 1).
 * Main thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "decode/device_step.h"
#include "cli/args.h"
#include "cli/bench.h"
#include "decode/decode.h"
#include "model/model.h"
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
                     enum decode_decoder dec, double threshold, int graph, uint64_t seed, device_row *row, um_err *err) {
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
    size_t fb = 0, tb = 0;
    backend_mem_info(be, &fb, &tb);
    row->mem_gib = (double)(tb - fb) / (double)(1ull << 30);
    free(done);
    device_step_free(cd);
    free(canvas);
    return rc;
}

int bench_device(int argc, char **argv) {
    const char *device = "cuda:0", *model_dir = NULL, *batch_s = "1,8,32", *dec_s = "low_confidence";
    int gen = 256, block = 32, prompt = 64, steps = 0, graph = 1, bw_mib = 2048;
    double threshold = 0.9;
    arg_spec specs[] = {
        {"device", ARG_STR, &device, "cuda or cuda:N [cuda:0]"},
        {"model", ARG_STR, &model_dir, "checkpoint directory [required]"},
        {"batch", ARG_STR, &batch_s, "comma-separated batch sizes [1,8,32]"},
        {"gen", ARG_INT, &gen, "generated (masked) positions per sequence [256]"},
        {"block", ARG_INT, &block, "block length [32]"},
        {"prompt", ARG_INT, &prompt, "random prompt tokens per sequence [64]"},
        {"steps", ARG_INT, &steps, "fixed-step decoders: total steps (0 = gen: one token per step) [0]"},
        {"decoder", ARG_STR, &dec_s, "low_confidence | random | threshold | factor [low_confidence]"},
        {"threshold", ARG_FLOAT, &threshold, "threshold decoder tau [0.9]"},
        {"graph", ARG_INT, &graph, "1: replay the step from a CUDA graph; 0: launch every op [1]"},
        {"bw-mib", ARG_INT, &bw_mib, "buffer size of the copy-bandwidth measurement (MiB) [2048]"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask bench --device cuda:N --model DIR [--batch 1,8,32] [--gen 256] [--block 32]\n\n"
                       "GPU decode benchmark: whole diffusion steps on the device (forward + fused confidence +\n"
                       "decoder), one table row per batch size, with the HBM floor of a step.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!model_dir) {
        fprintf(stderr, "error: --model DIR is required (see --help)\n");
        return 2;
    }
    enum decode_decoder dec;
    if (decode_decoder_parse(dec_s, &dec) != 0 || dec > DECODER_FACTOR) {
        fprintf(stderr, "error: --decoder must be low_confidence, random, threshold or factor\n");
        return 2;
    }
    if (gen < 1 || block < 1 || block > 1024 || prompt < 1 || steps < 0 || bw_mib < 1) {
        fprintf(stderr, "error: --gen, --prompt >= 1, --block 1..1024, --steps >= 0, --bw-mib >= 1\n");
        return 2;
    }
    if (steps == 0) steps = gen;
    int *batches = NULL;
    int nb = args_parse_int_list("batch", batch_s, &batches);
    if (nb < 0) return 2;
    int max_batch = 0;
    for (int i = 0; i < nb; i++) {
        if (batches[i] < 1) {
            fprintf(stderr, "error: --batch entries must be >= 1, got %d\n", batches[i]);
            free(batches);
            return 2;
        }
        if (batches[i] > max_batch) max_batch = batches[i];
    }

    um_err err = {0};
    backend *be = backend_init_device(device, 1, &err);
    if (be && !backend_has(be, BACKEND_CAP_DEVICE_DECODE | BACKEND_CAP_GRAPHS | BACKEND_CAP_DEVICE_MEMORY)) {
        um_err_set(&err, UM_ERR_UNSUPPORTED, "%s has no device-resident decode step", backend_name(be));
        backend_free(be);
        be = NULL;
    }
    if (!be) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(batches);
        return 1;
    }
    model m;
    if (model_load(model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        backend_free(be);
        free(batches);
        return 1;
    }
    const model_config *c = &m.cfg;
    if (prompt + gen > c->max_seq) {
        fprintf(stderr, "error: --prompt + --gen = %d exceeds the model's maximum sequence length %d\n", prompt + gen,
                c->max_seq);
        model_free(&m);
        backend_free(be);
        free(batches);
        return 2;
    }
    const uint64_t wbytes = (uint64_t)model_config_n_params(c) * 2u;
    const uint64_t tok = (uint64_t)max_batch * (uint64_t)(prompt + gen);
    const uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_dim, kvd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim;
    const uint64_t per_tok = 2u * (2u * (uint64_t)c->d_model + 2u * qd + 2u * kvd + 2u * (uint64_t)c->ffn_hidden);
    const uint64_t out = (uint64_t)max_batch * (uint64_t)block;
    const uint64_t abytes = tok * per_tok + out * 2u * ((uint64_t)c->n_embd_rows + (uint64_t)c->d_model);
    int rc = 0;
    model_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    if (backend_check_fit(be, wbytes, abytes, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    backend_set_upload_total(be, wbytes, "weights");
    if (model_ctx_init(&ctx, &m, be, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = 1;
        goto out;
    }
    const double bw = backend_mem_bandwidth(be, (size_t)bw_mib << 20, 10);
    const double floor_ms = bw > 0 ? (double)wbytes / bw * 1e3 : 0.0;
    printf("device %s (%s); model %s: %.2f B params, %.2f GiB bf16 weights\n", backend_name(be), backend_description(be),
           model_dir, (double)model_config_n_params(c) * 1e-9, (double)wbytes / (double)(1ull << 30));
    printf("device copy bandwidth %.0f GB/s (read + write) -> HBM floor %.3f ms/step (weights read once per step)\n",
           bw * 1e-9, floor_ms);
    printf("decoder %s, gen %d, block %d, prompt %d, steps %d, temperature 0, %s\n\n", decode_decoder_name(dec), gen,
           block, prompt, steps, graph ? "CUDA graph" : "direct launches");
    printf("| batch | canvas | steps | ms/step | tokens/s | steps/s | TFLOP/s | HBM floor ms/step | floor/actual | GPU mem GiB |\n");
    printf("|------:|-------:|------:|--------:|---------:|--------:|--------:|------------------:|-------------:|------------:|\n");
    for (int i = 0; i < nb && rc == 0; i++) {
        device_row row;
        if (run_batch(be, &ctx, &m, batches[i], prompt, gen, block, steps, dec, threshold, graph, 1000u + (uint64_t)i,
                      &row, &err) != 0) {
            fprintf(stderr, "error: batch %d: %s\n", batches[i], err.msg);
            rc = 1;
            break;
        }
        const double ms = row.steps ? row.wall_s * 1e3 / row.steps : 0.0;
        const double tf = step_tflop(c, row.batch, row.canvas, block);
        printf("| %5d | %6d | %5d | %7.3f | %8.1f | %7.1f | %7.1f | %17.3f | %11.1f%% | %11.2f |\n", row.batch,
               row.canvas, row.steps, ms, row.wall_s > 0 ? (double)row.tokens / row.wall_s : 0.0,
               row.wall_s > 0 ? row.steps / row.wall_s : 0.0, ms > 0 ? tf / (ms * 1e-3) : 0.0, floor_ms,
               ms > 0 ? 100.0 * floor_ms / ms : 0.0, row.mem_gib);
        fflush(stdout);
    }
out:
    if (ctx.weights || ctx.scratch) model_ctx_free(&ctx);
    model_free(&m);
    backend_free(be);
    free(batches);
    return rc;
}
