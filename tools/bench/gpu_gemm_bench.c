/*
 * gpu_gemm_bench — the products of a decode step on a CUDA device, one op at a time: the weight-
 * streaming skinny kernel (bf16 and FP8) against cuBLAS, at the LLaDA-8B shapes (or --d/--ffn/
 * --vocab) and 1..64 rows, as backend_linear runs them in a forward (q/k/v in one op, o + residual
 * add, gate/up + SwiGLU, down + residual add, the LM head; q|k|v and gate|up also joined into one
 * weight each, as the loader joins them: backend_packs). Each row: microseconds per op (the mean
 * of a CUDA graph of --reps ops, replayed 5 times, the fastest replay; the ops cycle through copies of
 * the weights so that each reads its weights from HBM, not from the L2 the op before filled — up to
 * 16 copies, enough for the 8B shapes), the weight bytes per second
 * and that rate over the device's copy bandwidth (bytes read + written per second of a cudaMemcpy
 * of --bw-mib, 2 GiB by default, as `unmask bench` measures it). --splits N forces the skinny kernel's K ranges (0: its
 * own choice), --sweep adds rows for 1, 2, 4, 8 and 16 ranges at each shape. --attention adds the
 * attention of the 8B decode steps (bench_attention) with the key splits forced and automatic.
 * Does not: check results (tests/gpu/gpu_parity.c does). Main thread only; a lent GPU machine runs
 * it from scripts/gpu/run-checks.sh.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/backend_impl.h"
#include "backend/cuda/cuda_backend.h"
#include "um_kernels.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"
#include "util/timeutil.h"

#define MAX_COPIES 16   /* weight copies per shape (see main) */

typedef struct shape {
    const char      *name;
    int              n_w, out[3], in;
    enum blinear_epi epi;
    int              joined;   /* SwiGLU: w[1] continues w[0]'s rows (views of one weight, bf16 only) */
} shape;

static double copy_gbps(size_t bytes) {
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        const double t0 = time_now_s();
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        const double t = time_now_s() - t0;
        if (t < best) best = t;
    }
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes / best / 1e9;
}

/* nc copies (w[c][j] for c < nc) of one weight of random bf16 values, stored as bf16 or quantized to
 * FP8 per output channel; the host values are made once */
static void upload(backend *be, int rows, int cols, int fp8, int nc, bweight (*w)[3], int j) {
    const size_t n = (size_t)rows * cols;
    uint16_t *h = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16((float)((rng_u01(5, (uint64_t)rows, i) - 0.5) * 0.05));
    bweight_src t = {.name = "bench", .data = h, .type = DTYPE_BF16, .rows = rows, .cols = cols,
                     .quant = fp8 ? DTYPE_F8_E4M3 : DTYPE_F32};
    um_err err;
    for (int c = 0; c < nc; c++)
        if (be->ops->weight_upload(be, &t, &w[c][j], &err) != 0) {
            fprintf(stderr, "gpu_gemm_bench: %s\n", err.msg);
            exit(1);
        }
    free(h);
}

/* microseconds per op: run(be, arg, 0) once outside the capture, then a graph of run(be, arg, r) for
 * r < reps, the fastest of 5 replays over reps */
static double time_graph(backend *be, void (*run)(backend *, const void *, int), const void *arg, int reps) {
    run(be, arg, 0);   /* warm-up, outside the capture */
    backend_synchronize(be);
    backend_graph_begin(be);
    for (int r = 0; r < reps; r++) run(be, arg, r);
    backend_graph *g = backend_graph_end(be);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        backend_synchronize(be);
        const double t0 = time_now_s();
        backend_graph_launch(be, g);
        backend_synchronize(be);
        const double t = time_now_s() - t0;
        if (t < best) best = t;
    }
    backend_graph_free(be, g);
    return best / reps * 1e6;
}

/* a linear op, cycling through the copies of its weights (so that no op finds them in L2 from the
 * op before) */
typedef struct linear_ops {
    const blinear *ops;
    int            nc;
} linear_ops;
static void run_linear(backend *be, const void *arg, int r) {
    const linear_ops *l = arg;
    backend_linear(be, &l->ops[r % l->nc]);
}

typedef struct attn_op {
    const attn_params *p;
    const void        *q, *k, *v;
    void              *o;
} attn_op;
static void run_attention(backend *be, const void *arg, int r) {
    const attn_op *a = arg;
    (void)r;
    be->ops->attention(be, a->p, a->q, a->k, a->v, a->o);
}

/* The attention of a decode step, one op at a time: n_seqs sequences of q_rows query rows over keys
 * keys each (LLaDA-8B heads: 32 query and key/value heads of 128), with the key splits forced to
 * 1, 2, 4, 8, 16 and the backend's own choice (0). us per op and the K/V bytes per second. */
static void bench_attention(backend *be, int reps, double bw) {
    const struct {
        const char *what;
        int         q_rows, keys;
    } shapes[] = {{"dual cache (block rows over the canvas)", 32, 512}, {"no cache (the canvas)", 512, 512}};
    const int seqs[] = {1, 8, 32}, forced[] = {0, 1, 2, 4, 8, 16};
    const int H = 32, KV = 32, hd = 128;
    printf("\n| attention | seqs | q rows | keys | splits | us/op | K/V GB/s | of copy bw |\n");
    printf("|---|---:|---:|---:|---|---:|---:|---:|\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t bi = 0; bi < sizeof seqs / sizeof seqs[0]; bi++) {
            const int S = seqs[bi], nq = shapes[si].q_rows, nk = shapes[si].keys;
            if (nq == nk && S > 8) continue;   /* no cache at 32 sequences: compute-bound, not this table's point */
            int32_t *qs = xmalloc((size_t)(S + 1) * sizeof *qs), *ks = xmalloc((size_t)(S + 1) * sizeof *ks);
            int32_t *qp = xmalloc((size_t)S * nq * sizeof *qp), *kp = xmalloc((size_t)S * nk * sizeof *kp);
            for (int i = 0; i <= S; i++) qs[i] = i * nq, ks[i] = i * nk;
            for (int i = 0; i < S * nq; i++) qp[i] = nk - nq + i % nq;
            for (int i = 0; i < S * nk; i++) kp[i] = i % nk;
            const attn_params p = {.n_seqs = S, .q_start = qs, .k_start = ks, .q_pos = qp, .k_pos = kp,
                                   .n_heads = H, .n_kv_heads = KV, .head_dim = hd, .scale = 0.08838834764f};
            const size_t nqe = (size_t)S * nq * H * hd, nke = (size_t)S * nk * KV * hd;   /* elements */
            void *q = be->ops->act_alloc(be, nqe), *o = be->ops->act_alloc(be, nqe);
            void *k = be->ops->act_alloc(be, nke), *v = be->ops->act_alloc(be, nke);
            backend_act_zero(be, q, nqe);
            backend_act_zero(be, k, nke);
            backend_act_zero(be, v, nke);
            const double kv_bytes = 2.0 * S * nk * KV * hd * 2;
            for (size_t fi = 0; fi < sizeof forced / sizeof forced[0]; fi++) {
                backend_cuda_attention_splits(be, forced[fi]);
                const attn_op op = {.p = &p, .q = q, .k = k, .v = v, .o = o};
                const double us = time_graph(be, run_attention, &op, reps), gbs = kv_bytes / (us * 1e-6) / 1e9;
                char sp[16];
                if (forced[fi]) snprintf(sp, sizeof sp, "%d", forced[fi]);
                else snprintf(sp, sizeof sp, "auto");
                printf("| %s | %d | %d | %d | %s | %.1f | %.0f | %.1f%% |\n", shapes[si].what, S, nq, nk, sp, us, gbs,
                       bw > 0 ? 100.0 * gbs / bw : 0.0);
                fflush(stdout);
            }
            backend_cuda_attention_splits(be, 0);
            be->ops->act_free(be, q), be->ops->act_free(be, o), be->ops->act_free(be, k), be->ops->act_free(be, v);
            free(qs), free(ks), free(qp), free(kp);
        }
}

int main(int argc, char **argv) {
    const char *device = "cuda:0";
    int d = 4096, ffn = 12288, vocab = 126464, reps = 50, splits = 0, sweep = 0, attention = 0, bw_mib = 2048;
    const char *rows_arg = "1,8,32,64";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--d") && i + 1 < argc) d = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ffn") && i + 1 < argc) ffn = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows_arg = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) splits = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sweep")) sweep = 1;
        else if (!strcmp(argv[i], "--attention")) attention = 1;
        else if (!strcmp(argv[i], "--bw-mib") && i + 1 < argc) bw_mib = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gpu_gemm_bench [--device cuda:N] [--d N] [--ffn N] [--vocab N] [--rows 1,8,32,64] "
                            "[--reps N] [--splits N] [--sweep] [--attention] [--bw-mib N]\n");
            return 2;
        }
    }
    if (d < 16 || ffn < 16 || vocab < 16 || reps < 1 || splits < 0 || bw_mib < 1) {
        fprintf(stderr, "gpu_gemm_bench: sizes must be >= 16, --reps >= 1, --splits >= 0, --bw-mib >= 1\n");
        return 2;
    }
    log_level_set(LOG_LEVEL_WARN);
    um_err err = {0};
    backend *be = backend_cuda_init(device, NULL, &err);
    if (!be) {
        fprintf(stderr, "gpu_gemm_bench: %s\n", err.msg);
        return 1;
    }
    const double bw = copy_gbps((size_t)bw_mib << 20);
    const double l2 = (double)backend_cuda_l2_bytes(be);
    printf("gpu_gemm_bench on %s (%s): copy bandwidth %.0f GB/s (read + write), L2 %.0f MiB; d %d, ffn %d, vocab %d; "
           "%d ops per graph over copies of the weights beyond the L2\n\n",
           device, backend_cuda_device_name(be), bw, l2 / 1048576.0, d, ffn, vocab, reps);
    const shape shapes[] = {{"q/k/v", 3, {d, d, d}, d, BLIN_STORE, 0},
                            {"q|k|v joined", 1, {3 * d, 0, 0}, d, BLIN_STORE, 0},
                            {"o + add", 1, {d, 0, 0}, d, BLIN_ADD, 0},
                            {"gate/up + swiglu", 2, {ffn, ffn, 0}, d, BLIN_SWIGLU, 0},
                            {"gate|up joined + swiglu", 2, {ffn, ffn, 0}, d, BLIN_SWIGLU, 1},
                            {"down + add", 1, {d, 0, 0}, ffn, BLIN_ADD},
                            {"LM head", 1, {vocab, 0, 0}, d, BLIN_STORE}};
    printf("| product | rows | weights | path | K ranges | us/op | weight GB/s | of copy bw |\n");
    printf("|---|---:|---|---|---:|---:|---:|---:|\n");
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *sh = &shapes[si];
        for (int fp8 = 0; fp8 < 2 - sh->joined; fp8++) {
            double wbytes = 0;
            for (int j = 0; j < sh->n_w; j++) wbytes += (double)sh->out[j] * sh->in * (fp8 ? 1 : 2);
            /* copies of the weights: between two uses of one copy the others stream more than twice
             * the L2, as a forward streams the other layers' weights (one 4096 x 4096 bf16 matrix,
             * 32 MiB, would otherwise stay in the H200's 50 MB L2 from op to op) */
            const double need = 1.0 + ceil(2.0 * l2 / wbytes);   /* small shapes: capped, partly in L2 */
            const int nc = need < MAX_COPIES ? (int)need : MAX_COPIES;
            bweight w[MAX_COPIES][3];
            if (sh->joined) {   /* one [2 ffn, d] weight per copy (w[c][2] owns it), gate and up views */
                upload(be, 2 * sh->out[0], sh->in, 0, nc, w, 2);
                for (int c = 0; c < nc; c++) {
                    w[c][0] = w[c][1] = w[c][2];
                    w[c][0].owned = w[c][1].owned = NULL;
                    w[c][0].rows = w[c][1].rows = sh->out[0];
                    w[c][1].data = (const char *)w[c][2].data + (size_t)sh->out[0] * sh->in * 2;
                }
            } else {
                for (int j = 0; j < sh->n_w; j++) upload(be, sh->out[j], sh->in, fp8, nc, w, j);
            }
            char buf[256];
            snprintf(buf, sizeof buf, "%s", rows_arg);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                const int m = atoi(tok);
                if (m < 1 || m > 4096) continue;
                void *x = be->ops->act_alloc(be, (size_t)m * sh->in);
                backend_act_zero(be, x, (size_t)m * sh->in);
                void *y[3], *tmp = be->ops->act_alloc(be, (size_t)m * sh->out[0] * (sh->joined ? 2 : 1));
                const int n_out = sh->epi == BLIN_STORE ? sh->n_w : 1;
                for (int j = 0; j < n_out; j++) {
                    y[j] = be->ops->act_alloc(be, (size_t)m * sh->out[j]);
                    backend_act_zero(be, y[j], (size_t)m * sh->out[j]);
                }
                blinear ops[MAX_COPIES];
                for (int c = 0; c < nc; c++) {
                    ops[c] = (blinear){.x = x, .n = m, .epi = sh->epi, .n_w = sh->n_w, .tmp_y = tmp,
                                       .wide_tmp = sh->joined};
                    for (int j = 0; j < sh->n_w; j++) ops[c].w[j] = &w[c][j];
                    for (int j = 0; j < n_out; j++) ops[c].y[j] = y[j];
                }
                /* paths: cuBLAS (bf16 only; -2: with reduced-precision reductions allowed, as PyTorch
                 * runs it, measurement only), the skinny kernel with its own split, forced splits */
                int paths[9], n_paths = 0;
                if (!fp8) paths[n_paths++] = -1, paths[n_paths++] = -2;
                if (m <= UMK_GEMM_SKINNY_MAX_M || fp8) paths[n_paths++] = splits;
                if (sweep && m <= UMK_GEMM_SKINNY_MAX_M)
                    for (int s = 1; s <= 16; s *= 2)
                        if (s != splits) paths[n_paths++] = s;
                for (int pi = 0; pi < n_paths; pi++) {
                    const int p = paths[pi];
                    backend_cuda_gemm_cublas(be, p < 0);
                    backend_cuda_cublas_reduced_precision(be, p == -2);
                    backend_cuda_gemm_splits(be, p < 0 ? 0 : p);
                    const linear_ops lo = {.ops = ops, .nc = nc};
                    const double us = time_graph(be, run_linear, &lo, reps);
                    const double gbs = wbytes / (us * 1e-6) / 1e9;
                    char ranges[16];
                    if (p < 0 || m > UMK_GEMM_SKINNY_MAX_M) snprintf(ranges, sizeof ranges, "-");
                    else if (p == 0) snprintf(ranges, sizeof ranges, "auto %d", backend_cuda_gemm_last_splits(be));
                    else snprintf(ranges, sizeof ranges, "%d", backend_cuda_gemm_last_splits(be));
                    printf("| %s | %d | %s | %s | %s | %.1f | %.0f | %.1f%% |\n", sh->name, m, fp8 ? "fp8" : "bf16",
                           p == -1                            ? "cuBLAS"
                           : p == -2                          ? "cuBLAS, bf16 reductions allowed"
                           : m > UMK_GEMM_SKINNY_MAX_M        ? "dequant + cuBLAS"
                                                              : "skinny",
                           ranges, us, gbs, bw > 0 ? 100.0 * gbs / bw : 0.0);
                    fflush(stdout);
                }
                backend_cuda_gemm_cublas(be, 0);
                backend_cuda_cublas_reduced_precision(be, 0);
                backend_cuda_gemm_splits(be, 0);
                be->ops->act_free(be, x);
                be->ops->act_free(be, tmp);
                for (int j = 0; j < n_out; j++) be->ops->act_free(be, y[j]);
            }
            for (int c = 0; c < nc; c++)
                for (int j = 0; j < (sh->joined ? 3 : sh->n_w); j++) be->ops->weight_free(be, &w[c][j]);
        }
    }
    if (attention) bench_attention(be, reps, bw);
    backend_free(be);
    return 0;
}
