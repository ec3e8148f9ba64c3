/*
 * gpu_parity.c — CUDA backend vs CPU backend, run on a GPU machine (scripts/gpu/run-checks.sh), and
 * in CI on the CPU CUDA emulator as gpu_parity_emu --quick (ctest emu/gpu_parity, docs/gpu.md
 * Emulator). Every GPU kernel against its CPU counterpart:
 *   ops       embed, rmsnorm (incl. in place), matmul (+bias, several shapes), linear (RMSNorm + one
 *             GEMM per weight, + SwiGLU), rope (full/partial,
 *             cache hit and refresh), swiglu, add, get_rows (incl. in-place compaction), store_rows
 *             (KV cache writes into per-sequence buffers, one sequence without a buffer), the fused
 *             rope_kv (GQA, partial rot_dim, sequences with their own positions, an empty one, one
 *             without a cache; without caches) and add_rmsnorm, each also bit-identical to its single
 *             kernels (--cuda-fuse off): inputs are
 *             bf16-exact so both backends see the same numbers; relative L2 error vs the f32 CPU
 *   skinny    the weight-streaming GEMM of <= 64 rows (kernels/gemm.cu): bf16 vs fp64 and vs cuBLAS,
 *             bit-identical twice, split-K with 1 / 3 / 8 K ranges forced (tile counts left zero),
 *             q/k/v in one launch and the residual-add and SwiGLU epilogues vs cuBLAS + the single
 *             kernels; FP8 weights: the device's per-channel quantization == the host's byte for byte,
 *             per-channel and 128 x 128 block-scaled products vs fp64 through the skinny kernel and the
 *             dequantize + cuBLAS path, FP8 gate/up + SwiGLU
 *   moe       the device MoE dispatch (kernels/moe.cu) on both routers: umk_moe_route vs moe_route on
 *             identical bf16 logits (ties, -inf, bias; the same experts, weights to 1e-6), umk_moe_sort
 *             vs moe.c's counting sort (offsets, slots, tokens, tile map; a held expert range), and
 *             backend_moe_forward vs an fp64 reference of the routed experts (1e-2), with skewed
 *             routing (an expert taking ~90% of the tokens, experts without any)
 *   attention varlen + GQA + key padding, block-causal, queries != keys, keys of some sequences in
 *             their own buffers (KV caches: k_seq / v_seq, == the packed result), a query with no visible
 *             key, head dims 16/32/64/128 (tensor-core kernel) and 80 (generic kernel), a 4096-token
 *             sequence; the tensor-core kernel also against the generic GPU kernel
 *   sampling  umk_sample vs decode/sample.c sample_row on identical bf16 logits (ties, -inf, mask /
 *             eos / eot ids, T = 0, Gumbel, top-k, top-p, both, CFG): x0 bit-exact, conf 1e-9;
 *             Gumbel noise vs sample_gumbel (counter-based rng ported bit for bit)
 *   decoders  umk_decode_commit vs decode/decoders.c (low_confidence, random, threshold, factor) on
 *             random blocks: identical commits, block advance and EOS stop
 *   forward   a make-model bf16 checkpoint (GQA, head_dim 64) and one with head_dim 128: logits of
 *             a packed batch with padding, relative error <= 2e-2 and argmax agreement (>= 99.9%
 *             required, or every disagreement within rounding: the GPU's errors at both logits
 *             within ARGMAX_ERR_RMS x the row's RMS error — random weights give near-ties that bf16
 *             activations legitimately flip; the raw rate is always printed);
 *             the same logits bit for bit with the fused ops off
 *   decodes   temperature 0: device-resident steps replayed from a CUDA graph == direct launches
 *             (bit-exact canvases); teacher-forced per-step comparison with the CPU (on the GPU's
 *             canvas, the CPU forward + sampler + decoder choose the same commits in >= 90% of
 *             steps, a difference only among positions within 2x the block's device-vs-CPU
 *             confidence error of the CPU's cut counting as a near-tie); free-running CPU vs CUDA
 *             (host loop) vs CUDA (device loop) decodes, token agreement reported.
 * Prints one line per check and "gpu_parity: N checks, M failed"; exit 1 on any failure.
 * Usage: gpu_parity [--quick | --emu] [--device cuda:N] [--tmp DIR] [--only NAME[,NAME...]] [--cublas]
 * (--quick: small sizes, for compute-sanitizer; --emu: --quick but the attention cases at full
 * size — several key tiles and query blocks per sequence, without the 4096-token one — for the CPU
 * emulator; --only: some sections or cases, for sanitizer bisects; usage()). Main thread.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/backend_impl.h"   /* drives the ops table directly */
#include "backend/cuda/cuda_backend.h"
#include "decode/device_step.h"
#include "decode/decode.h"
#include "decode/decoder.h"
#include "decode/sample.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/moe.h"
#include "um_kernels.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"

static int g_checks, g_failed, g_quick, g_emu;
static backend *g_cpu, *g_gpu;
static backend_options g_opts;   /* the GPU backend's options (skinny on; --cublas: off) */
static uint64_t g_ctr;

/* --only NAME[,NAME...] (compute-sanitizer bisects, scripts/gpu/run-checks.sh): a NAME equal to a
 * section (SECTIONS below) runs all of it; "SECTION CASE-START" runs that section's cases whose
 * printed name starts with the NAME (rmsnorm, matmul, linear, rope, rope_kv, add_rmsnorm and
 * attention name their cases so; the other sections then run whole). */
#define SECTIONS                                                                                             \
    "embed rmsnorm matmul linear skinny rope rope_kv swiglu_add add_rmsnorm moe attention gumbel sample decoders " \
    "forward decodes"
#define MAX_ONLY 32
static const char *g_only[MAX_ONLY];   /* the NAMEs; none: everything runs */
static int g_n_only;
static int g_section_whole;            /* the running section was named as a whole */

/* 1 when section sec runs (sets g_section_whole for case_on) */
static int section_on(const char *sec) {
    g_section_whole = g_n_only == 0;
    int on = g_section_whole;
    const size_t l = strlen(sec);
    for (int i = 0; i < g_n_only; i++) {
        if (strcmp(g_only[i], sec) == 0) g_section_whole = on = 1;
        else if (strncmp(g_only[i], sec, l) == 0 && g_only[i][l] == ' ') on = 1;
    }
    return on;
}

/* 1 when the case named what (its printed name, or the start of it) of the running section runs */
static int case_on(const char *what) {
    if (g_section_whole) return 1;
    for (int i = 0; i < g_n_only; i++)
        if (strncmp(what, g_only[i], strlen(g_only[i])) == 0) return 1;
    return 0;
}

#define CHECKF(cond, ...)                                      \
    do {                                                       \
        g_checks++;                                            \
        if (!(cond)) {                                         \
            g_failed++;                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
            printf(__VA_ARGS__);                               \
            printf("\n");                                      \
        }                                                      \
    } while (0)

static double urand(void) { return rng_u01(777, 1, g_ctr++); }
static float bfr(float x) { return bf16_to_f32(f32_to_bf16(x)); }

static float *rnd(size_t n, float lo, float hi) {
    float *a = xmalloc((n ? n : 1) * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = bfr(lo + (hi - lo) * (float)urand());
    return a;
}

/* ---------------------------------------------------------------- buffers */

static void *c_up(const float *h, size_t n) {
    float *p = g_cpu->ops->act_alloc(g_cpu, n);
    memcpy(p, h, n * sizeof *h);
    return p;
}

static void *g_up(const float *h, size_t n) {
    void *p = g_gpu->ops->act_alloc(g_gpu, n);
    backend_cuda_act_from_host(g_gpu, p, h, n);
    return p;
}

static void *g_poisoned(size_t n) {
    float *nan = xmalloc((n ? n : 1) * sizeof *nan);
    for (size_t i = 0; i < n; i++) nan[i] = NAN;
    void *p = g_up(nan, n);
    free(nan);
    return p;
}

static float *g_down(const void *d, size_t n) {
    float *h = xmalloc((n ? n : 1) * sizeof *h);
    g_gpu->ops->act_to_host(g_gpu, d, n, h);
    return h;
}

/* relative L2 error; NaN/Inf anywhere -> +inf */
static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) && isfinite(ref[i])) return INFINITY;
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void expect_close(const char *what, const float *gpu, const float *cpu, size_t n, double tol) {
    double e = rel_l2(gpu, cpu, n);
    printf("  %-58s rel %.3g (tol %.0e)\n", what, e, tol);
    CHECKF(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

/* a bf16 weight [rows, cols] uploaded to both backends */
typedef struct pw {
    bweight_src t;
    uint16_t *mem;
    bweight   c, g;
} pw;

static void pw_make(pw *w, int64_t rows, int64_t cols, float scale) {
    memset(w, 0, sizeof *w);
    size_t n = (size_t)(rows * cols);
    w->mem = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) w->mem[i] = f32_to_bf16((float)((urand() - 0.5) * 2 * scale));
    w->t = (bweight_src){.name = "parity", .data = w->mem, .type = DTYPE_BF16, .rows = rows, .cols = cols};
    um_err err;
    CHECK(g_cpu->ops->weight_upload(g_cpu, &w->t, &w->c, &err) == 0);
    CHECK(g_gpu->ops->weight_upload(g_gpu, &w->t, &w->g, &err) == 0);
}

static void pw_free(pw *w) {
    g_cpu->ops->weight_free(g_cpu, &w->c);
    g_gpu->ops->weight_free(g_gpu, &w->g);
    free(w->mem);
}

/* ---------------------------------------------------------------- element-wise ops */

static void test_embed_getrows(void) {
    const int V = 1000;
    const int dims[] = {264, 37};
    for (int di = 0; di < 2; di++) {
        int d = dims[di], n = 77;
        pw w;
        pw_make(&w, V, d, 1.0f);
        int32_t *ids = xmalloc((size_t)n * sizeof *ids);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(urand() * V);
        float *co = g_cpu->ops->act_alloc(g_cpu, (size_t)n * d);
        void *go = g_poisoned((size_t)n * d);
        g_cpu->ops->embed(g_cpu, &w.c, ids, n, co);
        g_gpu->ops->embed(g_gpu, &w.g, ids, n, go);
        float *gh = g_down(go, (size_t)n * d);
        char what[96];
        snprintf(what, sizeof what, "embed d=%d", d);
        expect_close(what, gh, co, (size_t)n * d, 0.0);   /* a copy: exact */
        /* get_rows: separate output, then in-place compaction (rows ascending, as the forward) */
        int m = 30;
        int32_t *rows = xmalloc((size_t)m * sizeof *rows);
        for (int i = 0; i < m; i++) rows[i] = (int32_t)(i * 2 + (i % 3 == 0));
        float *cr = g_cpu->ops->act_alloc(g_cpu, (size_t)m * d);
        void *gr = g_poisoned((size_t)m * d);
        g_cpu->ops->get_rows(g_cpu, co, d, rows, m, cr);
        g_gpu->ops->get_rows(g_gpu, go, d, rows, m, gr);
        float *grh = g_down(gr, (size_t)m * d);
        snprintf(what, sizeof what, "get_rows d=%d", d);
        expect_close(what, grh, cr, (size_t)m * d, 0.0);
        g_cpu->ops->get_rows(g_cpu, co, d, rows, m, co);
        g_gpu->ops->get_rows(g_gpu, go, d, rows, m, go);
        float *gih = g_down(go, (size_t)m * d);
        snprintf(what, sizeof what, "get_rows in place d=%d", d);
        expect_close(what, gih, co, (size_t)m * d, 0.0);
        /* store_rows: 3 sequences of rows of co (now [m, d]); 0 and 2 write into their own buffers
         * at shuffled positions, 1 has none */
        {
            const int32_t st[4] = {0, 10, 17, 30};
            const int cap = 40;
            int32_t pos[30];
            for (int i = 0; i < 30; i++) pos[i] = (int32_t)((i * 7 + 3) % cap);   /* distinct within each sequence */
            float *zero = xcalloc((size_t)cap * d, sizeof *zero);
            void *cd[3] = {c_up(zero, (size_t)cap * d), NULL, c_up(zero, (size_t)cap * d)};
            void *gd[3] = {g_up(zero, (size_t)cap * d), NULL, g_up(zero, (size_t)cap * d)};
            g_cpu->ops->store_rows(g_cpu, co, d, 3, st, pos, cd);
            g_gpu->ops->store_rows(g_gpu, go, d, 3, st, pos, gd);
            for (int s = 0; s < 3; s += 2) {
                float *gh2 = g_down(gd[s], (size_t)cap * d);
                snprintf(what, sizeof what, "store_rows d=%d sequence %d", d, s);
                expect_close(what, gh2, cd[s], (size_t)cap * d, 0.0);
                int moved = 0;   /* the rows really landed at their positions */
                for (int i = st[s]; i < st[s + 1]; i++) moved += memcmp((float *)cd[s] + (size_t)pos[i] * d,
                                                                       co + (size_t)i * d, (size_t)d * sizeof(float)) == 0;
                CHECKF(moved == st[s + 1] - st[s], "store_rows d=%d: %d of %d rows at their positions", d, moved,
                       st[s + 1] - st[s]);
                free(gh2);
                g_cpu->ops->act_free(g_cpu, cd[s]);
                g_gpu->ops->act_free(g_gpu, gd[s]);
            }
            free(zero);
        }
        free(gh), free(grh), free(gih), free(ids), free(rows);
        g_cpu->ops->act_free(g_cpu, co), g_cpu->ops->act_free(g_cpu, cr);
        g_gpu->ops->act_free(g_gpu, go), g_gpu->ops->act_free(g_gpu, gr);
        pw_free(&w);
    }
}

static void test_rmsnorm(void) {
    const int dims[] = {4096, 100, 264};
    for (int di = 0; di < 3; di++) {
        int d = dims[di], n = g_quick ? 5 : 67;
        char what[96];
        snprintf(what, sizeof what, "rmsnorm d=%d", d);
        if (!case_on(what)) continue;
        float *x = rnd((size_t)n * d, -3, 3);
        pw w;
        pw_make(&w, 1, d, 1.5f);
        float *cx = c_up(x, (size_t)n * d), *co = g_cpu->ops->act_alloc(g_cpu, (size_t)n * d);
        void *gx = g_up(x, (size_t)n * d), *go = g_poisoned((size_t)n * d);
        g_cpu->ops->rmsnorm(g_cpu, cx, &w.c, n, d, 1e-5f, co);
        g_gpu->ops->rmsnorm(g_gpu, gx, &w.g, n, d, 1e-5f, go);
        float *gh = g_down(go, (size_t)n * d);
        expect_close(what, gh, co, (size_t)n * d, 1e-2);
        g_gpu->ops->rmsnorm(g_gpu, gx, &w.g, n, d, 1e-5f, gx);   /* in place */
        float *gih = g_down(gx, (size_t)n * d);
        snprintf(what, sizeof what, "rmsnorm in place d=%d", d);
        expect_close(what, gih, co, (size_t)n * d, 1e-2);
        free(x), free(gh), free(gih);
        g_cpu->ops->act_free(g_cpu, cx), g_cpu->ops->act_free(g_cpu, co);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, go);
        pw_free(&w);
    }
}

static void test_matmul(void) {
    struct {
        int n, out, in, bias;
    } cs[] = {{1, 384, 256, 0}, {17, 1000, 4096, 1}, {300, 512, 704, 0}, {64, 126, 264, 1}};
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        int n = g_quick ? (cs[k].n < 8 ? cs[k].n : 8) : cs[k].n, out = cs[k].out, in = cs[k].in;
        char what[96];
        snprintf(what, sizeof what, "matmul n=%d out=%d in=%d%s", n, out, in, cs[k].bias ? " +bias" : "");
        if (!case_on(what)) continue;
        float *x = rnd((size_t)n * in, -1, 1);
        pw w, b;
        pw_make(&w, out, in, 0.05f);
        if (cs[k].bias) pw_make(&b, 1, out, 0.5f);
        float *cx = c_up(x, (size_t)n * in), *cy = g_cpu->ops->act_alloc(g_cpu, (size_t)n * out);
        void *gx = g_up(x, (size_t)n * in), *gy = g_poisoned((size_t)n * out);
        g_cpu->ops->matmul(g_cpu, cx, &w.c, cs[k].bias ? &b.c : NULL, n, cy);
        g_gpu->ops->matmul(g_gpu, gx, &w.g, cs[k].bias ? &b.g : NULL, n, gy);
        float *gh = g_down(gy, (size_t)n * out);
        expect_close(what, gh, cy, (size_t)n * out, 1e-2);
        free(x), free(gh);
        g_cpu->ops->act_free(g_cpu, cx), g_cpu->ops->act_free(g_cpu, cy);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gy);
        pw_free(&w);
        if (cs[k].bias) pw_free(&b);
    }
}

/* backend_linear on the GPU (RMSNorm, then one GEMM per weight, the SwiGLU epilogue) against the
 * CPU's single ops; a GQA-shaped q/k/v has outputs of different widths. */
static void test_linear(void) {
    struct {
        const char *what;
        int n_w, swiglu, out[3];
    } cs[] = {{"q/k/v same shape", 3, 0, {384, 384, 384}},
              {"gate/up + swiglu", 2, 1, {704, 704, 0}},
              {"q/k/v GQA shapes", 3, 0, {256, 128, 128}}};
    const int in = 256, n = g_quick ? 8 : 32;
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        char what[128];
        snprintf(what, sizeof what, "linear %s", cs[k].what);
        if (!case_on(what)) continue;
        float *x = rnd((size_t)n * in, -1, 1);
        pw w[3], nw;
        pw_make(&nw, 1, in, 1.0f);
        for (int j = 0; j < cs[k].n_w; j++) pw_make(&w[j], cs[k].out[j], in, 0.05f);
        void *gx = g_up(x, (size_t)n * in), *gh = g_poisoned((size_t)n * in), *gt = g_poisoned((size_t)n * cs[k].out[0]);
        const int n_out = cs[k].swiglu ? 1 : cs[k].n_w;
        float *res[3];
        void *gy[3] = {0};
        blinear op = {.x = gx, .n = n, .norm = &nw.g, .eps = 1e-5f, .epi = cs[k].swiglu ? BLIN_SWIGLU : BLIN_STORE,
                      .n_w = cs[k].n_w, .tmp_h = gh, .tmp_y = gt};
        for (int j = 0; j < cs[k].n_w; j++) op.w[j] = &w[j].g;
        for (int j = 0; j < n_out; j++) op.y[j] = gy[j] = g_poisoned((size_t)n * cs[k].out[j]);
        backend_linear(g_gpu, &op);
        for (int j = 0; j < n_out; j++) {
            res[j] = g_down(gy[j], (size_t)n * cs[k].out[j]);
            g_gpu->ops->act_free(g_gpu, gy[j]);
        }
        /* the CPU's single ops */
        float *cx = c_up(x, (size_t)n * in), *ch = g_cpu->ops->act_alloc(g_cpu, (size_t)n * in);
        g_cpu->ops->rmsnorm(g_cpu, cx, &nw.c, n, in, 1e-5f, ch);
        if (cs[k].swiglu) {
            float *cg = g_cpu->ops->act_alloc(g_cpu, (size_t)n * cs[k].out[0]);
            float *cu = g_cpu->ops->act_alloc(g_cpu, (size_t)n * cs[k].out[0]);
            g_cpu->ops->matmul(g_cpu, ch, &w[0].c, NULL, n, cg);
            g_cpu->ops->matmul(g_cpu, ch, &w[1].c, NULL, n, cu);
            g_cpu->ops->swiglu(g_cpu, cg, cu, (size_t)n * cs[k].out[0], cg);
            snprintf(what, sizeof what, "linear %s vs CPU", cs[k].what);
            expect_close(what, res[0], cg, (size_t)n * cs[k].out[0], 2e-2);
            g_cpu->ops->act_free(g_cpu, cg), g_cpu->ops->act_free(g_cpu, cu);
        } else {
            for (int j = 0; j < cs[k].n_w; j++) {
                float *cy = g_cpu->ops->act_alloc(g_cpu, (size_t)n * cs[k].out[j]);
                g_cpu->ops->matmul(g_cpu, ch, &w[j].c, NULL, n, cy);
                snprintf(what, sizeof what, "linear %s vs CPU, output %d", cs[k].what, j);
                expect_close(what, res[j], cy, (size_t)n * cs[k].out[j], 2e-2);
                g_cpu->ops->act_free(g_cpu, cy);
            }
        }
        for (int j = 0; j < n_out; j++) free(res[j]);
        free(x);
        g_cpu->ops->act_free(g_cpu, cx), g_cpu->ops->act_free(g_cpu, ch);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gh), g_gpu->ops->act_free(g_gpu, gt);
        for (int j = 0; j < cs[k].n_w; j++) pw_free(&w[j]);
        pw_free(&nw);
    }
}

static void test_rope(void) {
    const int n = g_quick ? 9 : 50, H = 4, hd = 128;
    const int rots[] = {128, 64, 24};   /* 24: half 12, the scalar kernel */
    int32_t *pos = xmalloc((size_t)n * sizeof *pos);
    for (int r = 0; r < 3; r++) {
        char name[64];
        snprintf(name, sizeof name, "rope rot_dim=%d", rots[r]);
        if (!case_on(name)) continue;
        for (int rep = 0; rep < 3; rep++) {   /* 0: fresh table, 1: cache hit, 2: new positions */
            if (rep != 1)
                for (int i = 0; i < n; i++) pos[i] = (int32_t)(urand() * 4000);
            float *x = rnd((size_t)n * H * hd, -2, 2);
            float *cx = c_up(x, (size_t)n * H * hd);
            void *gx = g_up(x, (size_t)n * H * hd);
            g_cpu->ops->rope(g_cpu, cx, n, H, hd, rots[r], pos, 500000.0f);
            g_gpu->ops->rope(g_gpu, gx, n, H, hd, rots[r], pos, 500000.0f);
            float *gh = g_down(gx, (size_t)n * H * hd);
            char what[96];
            snprintf(what, sizeof what, "rope rot_dim=%d %s", rots[r], rep == 0 ? "fresh" : rep == 1 ? "cache hit" : "refresh");
            expect_close(what, gh, cx, (size_t)n * H * hd, 1e-2);
            free(x), free(gh);
            g_cpu->ops->act_free(g_cpu, cx);
            g_gpu->ops->act_free(g_gpu, gx);
        }
    }
    free(pos);
}

/* backend_rope_kv (BACKEND_CAP_FUSED) against the CPU's single ops (rope q, rope k, store_rows k and v)
 * and, bit for bit, against the GPU's single kernels (backend_cuda_fuse off): GQA, rot_dim < head_dim,
 * several sequences with their own row counts and positions (one without rows, one without a
 * buffer), row counts that are not a multiple of any block size, and without caches (ropes only).
 * The kernel's paths: 16-byte accesses (half and head_dim multiples of 8, aligned buffers) or scalar
 * ones (odd shapes; odd = 2: every buffer one bf16 past a 16-byte boundary), cache slots written
 * element by element (odd = 1: only the caches off the boundary), a row's head slots split over
 * blocks (few rows) or one block per row with several slots per thread (rows: x20, >= 256 rows). */
typedef struct rope_kv_case {
    int H, KV, hd, rot;
    int cached;
    int odd;    /* 1: cache slots, 2: q, k, v and cache slots start one bf16 past act_alloc's alignment */
    int rows;   /* row count multiplier */
} rope_kv_case;

/* n bf16 from the host at one bf16 past act_alloc's alignment (off = 1) or at it (off = 0) */
static uint16_t *g_up_at(const float *h, size_t n, int off) {
    uint16_t *p = (uint16_t *)g_gpu->ops->act_alloc(g_gpu, n + 1) + off;
    backend_cuda_act_from_host(g_gpu, p, h, n);
    return p;
}

static void g_free_at(uint16_t *p, int off) { g_gpu->ops->act_free(g_gpu, p - off); }

static void run_rope_kv(const rope_kv_case *rc, const char *name) {
    const int m = rc->rows;
    const int32_t lens[4] = {(g_quick ? 5 : 37) * m, 0, (g_quick ? 7 : 29) * m, (g_quick ? 3 : 11) * m};
    int32_t st[5] = {0};
    for (int q = 0; q < 4; q++) st[q + 1] = st[q] + lens[q];
    int cap = 64;   /* cache rows: a power of two >= every sequence, so the positions below are distinct */
    while (cap < lens[0] || cap < lens[2]) cap *= 2;
    const int n = st[4], S = 4, kvd = rc->KV * rc->hd;
    const int xo = rc->odd == 2, co = rc->odd != 0;   /* q/k/v and cache offsets (bf16) */
    const size_t nq = (size_t)n * rc->H * rc->hd, nk = (size_t)n * kvd, nc = (size_t)cap * kvd;
    int32_t *pos = xmalloc((size_t)n * sizeof *pos);
    for (int q = 0; q < S; q++) {   /* distinct positions within a sequence, a different offset each */
        const int off = (int)(urand() * 16);
        for (int i = st[q]; i < st[q + 1]; i++) pos[i] = (int32_t)((off + (i - st[q]) * 5) % cap);
    }
    float *q = rnd(nq, -2, 2), *k = rnd(nk, -2, 2), *v = rnd(nk, -2, 2), *zero = xcalloc(nc, sizeof *zero);
    /* CPU reference: the single ops */
    float *cq = c_up(q, nq), *ck = c_up(k, nk), *cv = c_up(v, nk);
    void *cd[2][4] = {{NULL}};
    for (int t = 0; t < 2; t++)
        for (int sq = 0; sq < S; sq++) cd[t][sq] = rc->cached && sq != 2 ? c_up(zero, nc) : NULL;
    g_cpu->ops->rope(g_cpu, cq, n, rc->H, rc->hd, rc->rot, pos, 500000.0f);
    g_cpu->ops->rope(g_cpu, ck, n, rc->KV, rc->hd, rc->rot, pos, 500000.0f);
    if (rc->cached) {
        g_cpu->ops->store_rows(g_cpu, ck, kvd, S, st, pos, cd[0]);
        g_cpu->ops->store_rows(g_cpu, cv, kvd, S, st, pos, cd[1]);
    }
    /* GPU: fused (f & 1) and single kernels, from q, k, v or (f & 2) from packed q|k|v rows (one
     * product's; a row stride 8 past the heads), where q, k, v start as garbage and must all be
     * written */
    const int ld = (rc->H + 2 * rc->KV) * rc->hd + 8;
    float *pk = rnd((size_t)n * ld, -2, 2), *junk = rnd(nq, -50, 50);
    for (int i = 0; i < n; i++) {
        memcpy(pk + (size_t)i * ld, q + (size_t)i * rc->H * rc->hd, (size_t)rc->H * rc->hd * sizeof *pk);
        memcpy(pk + (size_t)i * ld + rc->H * rc->hd, k + (size_t)i * kvd, (size_t)kvd * sizeof *pk);
        memcpy(pk + (size_t)i * ld + rc->H * rc->hd + kvd, v + (size_t)i * kvd, (size_t)kvd * sizeof *pk);
    }
    float *res[4][3 + 2 * 4] = {{NULL}};   /* [packed fused][q, k, k caches, v caches, v] */
    for (int f = 0; f < 4; f++) {
        const int packed = f >= 2;
        uint16_t *gq = g_up_at(packed ? junk : q, nq, xo), *gk = g_up_at(packed ? junk : k, nk, xo),
                 *gv = g_up_at(packed ? junk : v, nk, xo), *gp = packed ? g_up_at(pk, (size_t)n * ld, xo) : NULL;
        void *gd[2][4] = {{NULL}};
        for (int t = 0; t < 2; t++)
            for (int sq = 0; sq < S; sq++) gd[t][sq] = rc->cached && sq != 2 ? g_up_at(zero, nc, co) : NULL;
        const brope_kv op = {.q = gq, .k = gk, .v = gv, .qkv = gp, .ld_qkv = packed ? ld : 0, .n = n,
                             .n_heads = rc->H, .n_kv_heads = rc->KV, .head_dim = rc->hd, .rot_dim = rc->rot,
                             .pos = pos, .theta = 500000.0f, .n_seqs = S, .seq_start = st,
                             .k_dst = rc->cached ? gd[0] : NULL, .v_dst = rc->cached ? gd[1] : NULL};
        backend_cuda_fuse(g_gpu, f & 1);
        g_gpu->ops->rope_kv(g_gpu, &op);
        backend_cuda_fuse(g_gpu, 1);
        res[f][0] = g_down(gq, nq);
        res[f][1] = g_down(gk, nk);
        res[f][10] = g_down(gv, nk);
        if (gp) g_free_at(gp, xo);
        for (int t = 0; t < 2; t++)
            for (int sq = 0; sq < S; sq++)
                if (gd[t][sq]) {
                    res[f][2 + t * 4 + sq] = g_down(gd[t][sq], nc);
                    g_free_at(gd[t][sq], co);
                }
        g_free_at(gq, xo), g_free_at(gk, xo), g_free_at(gv, xo);
    }
    char what[128];
    const char *tag[2] = {"k", "v"};
    snprintf(what, sizeof what, "%s%s: q", name, rc->cached ? " cached" : "");
    expect_close(what, res[1][0], cq, nq, 1e-2);
    CHECKF(memcmp(res[1][0], res[0][0], nq * sizeof(float)) == 0, "%s: fused != single kernels", what);
    snprintf(what, sizeof what, "%s%s: k", name, rc->cached ? " cached" : "");
    expect_close(what, res[1][1], ck, nk, 1e-2);
    CHECKF(memcmp(res[1][1], res[0][1], nk * sizeof(float)) == 0, "%s: fused != single kernels", what);
    for (int t = 0; t < 2 && rc->cached; t++)
        for (int sq = 0; sq < S; sq++) {
            const float *fu = res[1][2 + t * 4 + sq], *un = res[0][2 + t * 4 + sq];
            CHECKF(!fu == !cd[t][sq], "rope_kv: %s cache of sequence %d %s", tag[t], sq, fu ? "written" : "missing");
            if (!fu || !cd[t][sq]) continue;
            snprintf(what, sizeof what, "%s: %s cache seq %d (%d rows)", name, tag[t], sq, lens[sq]);
            expect_close(what, fu, cd[t][sq], nc, 1e-2);
            CHECKF(memcmp(fu, un, nc * sizeof(float)) == 0, "%s: fused != single kernels", what);
            int moved = 0;   /* the rows landed at their positions (the CPU's rows, to bf16 rounding) */
            const float *src = t == 0 ? ck : cv;
            for (int i = st[sq]; i < st[sq + 1]; i++) {
                double e = 0, r = 0;
                for (int j = 0; j < kvd; j++) {
                    const double dlt = fu[(size_t)pos[i] * kvd + j] - src[(size_t)i * kvd + j];
                    e += dlt * dlt, r += (double)src[(size_t)i * kvd + j] * src[(size_t)i * kvd + j];
                }
                moved += r > 0 && e <= 1e-4 * r;
            }
            CHECKF(moved == lens[sq], "rope_kv: %s cache of sequence %d: %d of %d rows at their positions", tag[t], sq,
                   moved, lens[sq]);
        }
    /* from packed rows: the same results bit for bit, fused or not, and v unpacked as it was */
    int packed_same = 1;
    for (int f = 2; f < 4; f++) {
        packed_same &= memcmp(res[f][0], res[1][0], nq * sizeof(float)) == 0 &&
                       memcmp(res[f][1], res[1][1], nk * sizeof(float)) == 0 &&
                       memcmp(res[f][10], res[1][10], nk * sizeof(float)) == 0;
        for (int j = 2; j < 10; j++)
            packed_same &= !res[f][j] == !res[1][j] && (!res[f][j] || memcmp(res[f][j], res[1][j], nc * sizeof(float)) == 0);
    }
    printf("  %-58s %s\n", "  from packed q|k|v rows (fused, single kernels)", packed_same ? "bit-identical" : "differ");
    CHECKF(packed_same, "%s: rope_kv from packed q|k|v rows differs from q, k, v", name);
    for (int f = 0; f < 4; f++)
        for (int j = 0; j < 11; j++) free(res[f][j]);
    free(pk), free(junk);
    for (int t = 0; t < 2; t++)
        for (int sq = 0; sq < S; sq++)
            if (cd[t][sq]) g_cpu->ops->act_free(g_cpu, cd[t][sq]);
    g_cpu->ops->act_free(g_cpu, cq), g_cpu->ops->act_free(g_cpu, ck), g_cpu->ops->act_free(g_cpu, cv);
    free(q), free(k), free(v), free(zero), free(pos);
}

static void test_rope_kv(void) {
    CHECKF(backend_has(g_gpu, BACKEND_CAP_FUSED), "the CUDA backend lacks BACKEND_CAP_FUSED");
    const rope_kv_case cs[] = {
        {4, 2, 128, 128, 1, 0, 1}, {4, 2, 128, 64, 1, 0, 1},  {6, 2, 64, 32, 1, 0, 1},  {3, 3, 80, 80, 1, 0, 1},
        {4, 1, 128, 64, 0, 0, 1},  {3, 1, 80, 32, 1, 0, 1},   {2, 2, 72, 24, 1, 0, 1},  {4, 2, 128, 128, 1, 1, 1},
        {4, 2, 128, 64, 1, 2, 1},  {32, 8, 128, 128, 1, 0, 20}, {16, 4, 72, 24, 1, 0, 20},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "rope_kv H=%d KV=%d hd=%d rot=%d%s%s", cs[i].H, cs[i].KV, cs[i].hd, cs[i].rot,
                 cs[i].odd == 1 ? " caches unaligned" : cs[i].odd == 2 ? " unaligned" : "",
                 cs[i].rows > 1 ? " many rows" : "");
        if (case_on(name)) run_rope_kv(&cs[i], name);
    }
}

/* backend_add_rmsnorm against the CPU's add then rmsnorm, and bit for bit against the GPU's two
 * kernels; out == y (as the forward calls it) and a separate out; vector and scalar row widths. */
static void test_add_rmsnorm(void) {
    const int dims[] = {4096, 264, 100, 37};
    for (int di = 0; di < 4; di++) {
        const int d = dims[di], n = g_quick ? 5 : 67;
        const size_t nd = (size_t)n * d;
        char what[96];
        snprintf(what, sizeof what, "add_rmsnorm d=%d", d);
        if (!case_on(what)) continue;
        float *x = rnd(nd, -3, 3), *y = rnd(nd, -3, 3);
        pw w;
        pw_make(&w, 1, d, 1.5f);
        float *cx = c_up(x, nd), *cy = c_up(y, nd), *co = g_cpu->ops->act_alloc(g_cpu, nd);
        g_cpu->ops->add(g_cpu, cx, cy, nd);
        g_cpu->ops->rmsnorm(g_cpu, cx, &w.c, n, d, 1e-5f, co);
        float *res[2][2];   /* [fused][x, out] */
        for (int f = 0; f < 2; f++) {
            void *gx = g_up(x, nd), *gy = g_up(y, nd), *go = f ? gy : g_poisoned(nd);   /* fused: out == y */
            backend_cuda_fuse(g_gpu, f);
            g_gpu->ops->add_rmsnorm(g_gpu, gx, gy, &w.g, n, d, 1e-5f, go);
            backend_cuda_fuse(g_gpu, 1);
            res[f][0] = g_down(gx, nd);
            res[f][1] = g_down(go, nd);
            if (go != gy) g_gpu->ops->act_free(g_gpu, go);
            g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gy);
        }
        snprintf(what, sizeof what, "add_rmsnorm d=%d: x + y", d);
        expect_close(what, res[1][0], cx, nd, 1e-2);
        CHECKF(memcmp(res[1][0], res[0][0], nd * sizeof(float)) == 0, "%s: fused != add kernel", what);
        snprintf(what, sizeof what, "add_rmsnorm d=%d: norm (out == y)", d);
        expect_close(what, res[1][1], co, nd, 1e-2);
        CHECKF(memcmp(res[1][1], res[0][1], nd * sizeof(float)) == 0, "%s: fused != add + rmsnorm kernels", what);
        for (int f = 0; f < 2; f++) free(res[f][0]), free(res[f][1]);
        free(x), free(y);
        g_cpu->ops->act_free(g_cpu, cx), g_cpu->ops->act_free(g_cpu, cy), g_cpu->ops->act_free(g_cpu, co);
        pw_free(&w);
    }
}

static void test_swiglu_add(void) {
    const size_t ns[] = {1000, 1001, 3 * 12288};
    for (int k = 0; k < 3; k++) {
        size_t n = ns[k];
        float *g = rnd(n, -6, 6), *u = rnd(n, -2, 2);
        float *cg = c_up(g, n), *cu = c_up(u, n), *co = g_cpu->ops->act_alloc(g_cpu, n);
        void *gg = g_up(g, n), *gu = g_up(u, n), *go = g_poisoned(n);
        g_cpu->ops->swiglu(g_cpu, cg, cu, n, co);
        g_gpu->ops->swiglu(g_gpu, gg, gu, n, go);
        float *gh = g_down(go, n);
        char what[96];
        snprintf(what, sizeof what, "swiglu n=%zu", n);
        expect_close(what, gh, co, n, 1e-2);
        g_cpu->ops->add(g_cpu, cg, cu, n);
        g_gpu->ops->add(g_gpu, gg, gu, n);
        float *ah = g_down(gg, n);
        snprintf(what, sizeof what, "add n=%zu", n);
        expect_close(what, ah, cg, n, 1e-2);
        free(g), free(u), free(gh), free(ah);
        g_cpu->ops->act_free(g_cpu, cg), g_cpu->ops->act_free(g_cpu, cu), g_cpu->ops->act_free(g_cpu, co);
        g_gpu->ops->act_free(g_gpu, gg), g_gpu->ops->act_free(g_gpu, gu), g_gpu->ops->act_free(g_gpu, go);
    }
}

/* ---------------------------------------------------------------- MoE dispatch */

typedef struct moe_case {
    const char *name;
    int         sigmoid;          /* 0: softmax (LLaDA-MoE), 1: sigmoid group-limited (LLaDA2) */
    int         E, K, G, TG;      /* experts, top-k, groups, groups kept */
    int         d, F, n;          /* width, expert width, tokens */
    int         bias;             /* an expert bias */
    int         levels;           /* > 0: logits from that many values (ties everywhere) */
    int         skew;             /* expert 1 wins ~90% of tokens, expert E-1 never */
    int         e0, e1;           /* experts held ([0, E) unsharded) */
} moe_case;

static model_config moe_cfg(const moe_case *mc) {
    model_config c;
    memset(&c, 0, sizeof c);
    c.n_experts = mc->E;
    c.moe_top_k = mc->K;
    c.router = mc->sigmoid ? MODEL_ROUTER_SIGMOID_GROUP : MODEL_ROUTER_SOFTMAX;
    c.n_group = mc->sigmoid ? mc->G : 1;
    c.topk_group = mc->sigmoid ? mc->TG : 1;
    c.routed_scale = mc->sigmoid ? 2.5f : 1.0f;
    return c;
}

/* router logits [n, E], bf16-exact: random, tied (levels), -inf entries, and the skew */
static float *moe_logits(const moe_case *mc) {
    const int n = mc->n, E = mc->E;
    float *lg = rnd((size_t)n * E, -3, 3);
    for (int i = 0; i < n * E; i++) {
        if (mc->levels) lg[i] = bfr((float)(int)(urand() * mc->levels) * 0.5f - 1.0f);
        if (urand() < 0.01) lg[i] = -INFINITY;
    }
    if (mc->skew)
        for (int t = 0; t < n; t++) {
            if (urand() < 0.9) lg[(size_t)t * E + 1] = 12.0f;
            lg[(size_t)t * E + E - 1] = -40.0f;
        }
    return lg;
}

static void test_moe_case(const moe_case *mc) {
    const int n = mc->n, E = mc->E, K = mc->K, d = mc->d, F = mc->F, nk = n * K;
    const model_config c = moe_cfg(mc);
    cudaStream_t st = backend_cuda_stream(g_gpu);
    float *lg = moe_logits(mc), *bias = NULL;
    if (mc->bias) {
        bias = rnd((size_t)E, -0.05f, 0.05f);
        if (mc->skew) bias[E - 1] = -1.0f;
    }
    /* the host routing (moe_route) and grouping (moe.c's counting sort) */
    int32_t *idx = xmalloc((size_t)nk * sizeof *idx), *slot = xmalloc((size_t)nk * sizeof *slot);
    int32_t *tok = xmalloc((size_t)nk * sizeof *tok), *off = xcalloc((size_t)E + 1, sizeof *off);
    float *w = xmalloc((size_t)nk * sizeof *w);
    for (int t = 0; t < n; t++) moe_route(&c, lg + (size_t)t * E, bias, idx + (size_t)t * K, w + (size_t)t * K);
    for (int i = 0; i < nk; i++) off[idx[i] + 1]++;
    int zero = 0, most = 0;
    for (int e = 0; e < E; e++) zero += off[e + 1] == 0, most = off[e + 1] > most ? off[e + 1] : most;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int32_t *next = xmalloc((size_t)E * sizeof *next);
    memcpy(next, off, (size_t)E * sizeof *next);
    for (int i = 0; i < nk; i++) {
        const int r = next[idx[i]]++;
        slot[i] = idx[i] >= mc->e0 && idx[i] < mc->e1 ? r : -1;
        tok[r] = i / K;
    }
    printf("  %-58s %d experts without a token, the busiest has %d of %d rows\n", mc->name, zero, most, nk);

    /* routing kernel: the same experts, weights within float rounding of the double math */
    void *g_lg = g_up(lg, (size_t)n * E);
    float *g_bias = NULL;
    if (bias) {
        g_bias = backend_cuda_malloc(g_gpu, (size_t)E * sizeof *g_bias);
        backend_cuda_memcpy_h2d(g_gpu, g_bias, bias, (size_t)E * sizeof *g_bias);
    }
    const umk_moe_route_cfg rc = {.n_experts = E, .top_k = K, .sigmoid_group = mc->sigmoid, .n_group = c.n_group,
                                  .topk_group = c.topk_group, .routed_scale = c.routed_scale, .bias = g_bias};
    int32_t *d_idx = backend_cuda_malloc(g_gpu, (size_t)nk * 4), *d_slot = backend_cuda_malloc(g_gpu, (size_t)nk * 4);
    int32_t *d_tok = backend_cuda_malloc(g_gpu, (size_t)nk * 4), *d_off = backend_cuda_malloc(g_gpu, (size_t)(E + 1) * 4);
    float *d_w = backend_cuda_malloc(g_gpu, (size_t)nk * 4);
    CHECK(umk_moe_route(&rc, g_lg, n, d_idx, d_w, st) == cudaSuccess);
    int32_t *h_idx = xmalloc((size_t)nk * 4), *h_slot = xmalloc((size_t)nk * 4), *h_tok = xmalloc((size_t)nk * 4);
    int32_t *h_off = xmalloc((size_t)(E + 1) * 4);
    float *h_w = xmalloc((size_t)nk * 4);
    backend_cuda_memcpy_d2h(g_gpu, h_idx, d_idx, (size_t)nk * 4);
    backend_cuda_memcpy_d2h(g_gpu, h_w, d_w, (size_t)nk * 4);
    int idx_diff = 0;
    double w_err = 0;
    for (int i = 0; i < nk; i++) {
        idx_diff += h_idx[i] != idx[i];
        const double e = fabs((double)h_w[i] - (double)w[i]) / (fabs((double)w[i]) + 1e-30);
        w_err = e > w_err ? e : w_err;
    }
    printf("  %-58s %d of %d experts differ, weights rel %.2g\n", "  route vs moe_route", idx_diff, nk, w_err);
    CHECKF(idx_diff == 0 && w_err <= 1e-6, "%s: routing differs from moe_route (%d experts, weights %.3g)", mc->name,
           idx_diff, w_err);

    /* counting sort (on the host's experts, so a routing difference cannot hide a sort bug) */
    const int rows = umk_moe_tile_rows(), loc = mc->e1 - mc->e0;
    const int max_tiles = nk / rows + (loc < nk ? loc : nk);
    int32_t *d_te = backend_cuda_malloc(g_gpu, (size_t)max_tiles * 4), *d_tr = backend_cuda_malloc(g_gpu, (size_t)max_tiles * 4);
    backend_cuda_memcpy_h2d(g_gpu, d_idx, idx, (size_t)nk * 4);
    CHECK(umk_moe_sort(d_idx, n, K, E, mc->e0, mc->e1, max_tiles, d_off, d_slot, d_tok, d_te, d_tr, st) == cudaSuccess);
    int32_t *te = xmalloc((size_t)max_tiles * 4), *tr = xmalloc((size_t)max_tiles * 4);
    backend_cuda_memcpy_d2h(g_gpu, h_off, d_off, (size_t)(E + 1) * 4);
    backend_cuda_memcpy_d2h(g_gpu, h_slot, d_slot, (size_t)nk * 4);
    backend_cuda_memcpy_d2h(g_gpu, h_tok, d_tok, (size_t)nk * 4);
    backend_cuda_memcpy_d2h(g_gpu, te, d_te, (size_t)max_tiles * 4);
    backend_cuda_memcpy_d2h(g_gpu, tr, d_tr, (size_t)max_tiles * 4);
    int tiles_ok = 1, j = 0;
    for (int e = mc->e0; e < mc->e1; e++)
        for (int r = off[e]; r < off[e + 1]; r += rows, j++) tiles_ok &= j < max_tiles && te[j] == e && tr[j] == r;
    for (; j < max_tiles; j++) tiles_ok &= te[j] == -1;
    const int sort_ok = !memcmp(h_off, off, (size_t)(E + 1) * 4) && !memcmp(h_slot, slot, (size_t)nk * 4) &&
                        !memcmp(h_tok, tok, (size_t)nk * 4);
    printf("  %-58s %s\n", "  sort: offsets, slots, tokens, tile map", sort_ok && tiles_ok ? "equal" : "DIFFER");
    CHECKF(sort_ok && tiles_ok, "%s: device grouping differs (offsets/slots/tokens %d, tile map %d)", mc->name, sort_ok,
           tiles_ok);

    /* the whole dispatch (backend_moe_forward) vs a double reference on the host's routing */
    pw *gate = xcalloc((size_t)E, sizeof *gate), *up = xcalloc((size_t)E, sizeof *up), *down = xcalloc((size_t)E, sizeof *down);
    bweight *bg = xcalloc((size_t)E, sizeof *bg), *bu = xcalloc((size_t)E, sizeof *bu), *bd = xcalloc((size_t)E, sizeof *bd);
    for (int e = mc->e0; e < mc->e1; e++) {
        pw_make(&gate[e], F, d, 0.2f), pw_make(&up[e], F, d, 0.2f), pw_make(&down[e], d, F, 0.2f);
        bg[e] = gate[e].g, bu[e] = up[e].g, bd[e] = down[e].g;
    }
    const bmoe_desc desc = {.router = mc->sigmoid ? BMOE_SIGMOID_GROUP : BMOE_SOFTMAX, .n_experts = E, .top_k = K,
                            .n_group = c.n_group, .topk_group = c.topk_group, .routed_scale = c.routed_scale,
                            .bias = bias, .e0 = mc->e0, .e1 = mc->e1, .gate = bg, .up = bu, .down = bd};
    bmoe *bm = backend_moe_prepare(g_gpu, &desc);
    CHECKF(bm != NULL, "%s: the CUDA backend declined the MoE dispatch", mc->name);
    if (bm) {
        float *h = rnd((size_t)n * d, -1, 1), *x = rnd((size_t)n * d, -1, 1);
        void *gh = g_up(h, (size_t)n * d), *gx = g_up(x, (size_t)n * d);
        void *ws = g_gpu->ops->act_alloc(g_gpu, backend_moe_workspace(g_gpu, bm, n));
        backend_moe_forward(g_gpu, bm, g_lg, gh, n, gx, ws);
        float *got = g_down(gx, (size_t)n * d), *ref = xmalloc((size_t)n * d * sizeof *ref);
        double *act = xmalloc((size_t)F * sizeof *act), *acc = xmalloc((size_t)d * sizeof *acc);
        for (int t = 0; t < n; t++) {
            for (int i = 0; i < d; i++) acc[i] = 0;
            for (int q = 0; q < K; q++) {
                const int e = idx[t * K + q];
                if (e < mc->e0 || e >= mc->e1) continue;
                for (int f = 0; f < F; f++) {
                    double sg = 0, su = 0;
                    for (int i = 0; i < d; i++) {
                        sg += (double)h[(size_t)t * d + i] * bf16_to_f32(gate[e].mem[(size_t)f * d + i]);
                        su += (double)h[(size_t)t * d + i] * bf16_to_f32(up[e].mem[(size_t)f * d + i]);
                    }
                    const float gg = bfr((float)sg), uu = bfr((float)su);
                    act[f] = bfr(gg / (1.0f + expf(-gg)) * uu);
                }
                for (int i = 0; i < d; i++) {
                    double y = 0;
                    for (int f = 0; f < F; f++) y += act[f] * bf16_to_f32(down[e].mem[(size_t)i * F + f]);
                    acc[i] += (double)w[t * K + q] * bfr((float)y);
                }
            }
            for (int i = 0; i < d; i++) ref[(size_t)t * d + i] = (float)((double)x[(size_t)t * d + i] + acc[i]);
        }
        char what[96];
        snprintf(what, sizeof what, "  backend_moe_forward (route, sort, GEMMs, combine) vs fp64");
        expect_close(what, got, ref, (size_t)n * d, 1e-2);
        free(h), free(x), free(got), free(ref), free(act), free(acc);
        g_gpu->ops->act_free(g_gpu, gh), g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, ws);
        backend_moe_release(g_gpu, bm);
    }
    for (int e = mc->e0; e < mc->e1; e++) pw_free(&gate[e]), pw_free(&up[e]), pw_free(&down[e]);
    free(gate), free(up), free(down), free(bg), free(bu), free(bd);
    g_gpu->ops->act_free(g_gpu, g_lg);
    if (g_bias) backend_cuda_free_dev(g_gpu, g_bias);
    backend_cuda_free_dev(g_gpu, d_idx), backend_cuda_free_dev(g_gpu, d_slot), backend_cuda_free_dev(g_gpu, d_tok);
    backend_cuda_free_dev(g_gpu, d_off), backend_cuda_free_dev(g_gpu, d_w), backend_cuda_free_dev(g_gpu, d_te);
    backend_cuda_free_dev(g_gpu, d_tr);
    free(lg), free(bias), free(idx), free(slot), free(tok), free(off), free(w), free(next);
    free(h_idx), free(h_slot), free(h_tok), free(h_off), free(h_w), free(te), free(tr);
}

static void test_moe(void) {
    const moe_case small[] = {
        {"softmax E8 k2 d64 F32 n37 (lladamoe-tiny shape)", 0, 8, 2, 1, 1, 64, 32, 37, 0, 0, 0, 0, 8},
        {"softmax E8 k2, tied logits, bias", 0, 8, 2, 1, 1, 64, 32, 40, 1, 4, 0, 0, 8},
        {"softmax E64 k8 d32 F16 n50, tied logits", 0, 64, 8, 1, 1, 32, 16, 50, 0, 3, 0, 0, 64},
        {"sigmoid E64 G8 TG4 k8 d32 F16 n50, tied logits", 1, 64, 8, 8, 4, 32, 16, 50, 0, 3, 0, 0, 64},
        {"softmax E16 k4 d72 F40 n70, skewed (one busy, one empty)", 0, 16, 4, 1, 1, 72, 40, 70, 0, 0, 1, 0, 16},
        {"sigmoid E8 G2 TG1 k2 d64 F32 n37, bias (llada2-tiny shape)", 1, 8, 2, 2, 1, 64, 32, 37, 1, 0, 0, 0, 8},
        {"sigmoid E16 G4 TG2 k4, tied logits, skewed", 1, 16, 4, 4, 2, 72, 40, 70, 1, 3, 1, 0, 16},
        {"sigmoid E16 k4, experts [4, 12) held (expert parallel)", 1, 16, 4, 4, 2, 72, 40, 70, 1, 0, 1, 4, 12},
        {"softmax E8 k2, experts [0, 4) held", 0, 8, 2, 1, 1, 64, 32, 37, 0, 0, 0, 0, 4},
    };
    const moe_case big[] = {
        {"softmax E64 k8 d1024 F512 n300 (LLaDA-MoE routing)", 0, 64, 8, 1, 1, 1024, 512, 300, 0, 0, 1, 0, 64},
        {"sigmoid E256 G8 TG4 k8 d512 F256 n200 (LLaDA2 routing)", 1, 256, 8, 8, 4, 512, 256, 200, 1, 0, 1, 0, 256},
    };
    for (size_t i = 0; i < sizeof small / sizeof small[0]; i++) test_moe_case(&small[i]);
    if (!g_quick)
        for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) test_moe_case(&big[i]);
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_case {
    const char *name;
    int         n_seqs;
    int         qlen[4], klen[4];   /* klen = 0: same rows as the queries */
    int         H, KV, hd;
    int         block_causal;
    int         pad;                /* mark some keys invalid (and every key of one short sequence) */
    int         own;                /* also: odd sequences' keys/values in their own buffers (k_seq) */
} attn_case;

/* The GPU attention into a poisoned buffer, with knob(g_gpu, on) set for the call and reset to 0
 * after it (knob NULL: the defaults); the n outputs fetched to the host. */
static float *g_attn(const attn_params *p, const void *q, const void *k, const void *v, size_t n,
                     void (*knob)(backend *, int), int on) {
    void *o = g_poisoned(n);
    if (knob) knob(g_gpu, on);
    g_gpu->ops->attention(g_gpu, p, q, k, v, o);
    if (knob) knob(g_gpu, 0);
    float *h = g_down(o, n);
    g_gpu->ops->act_free(g_gpu, o);
    return h;
}

static void run_attn(const attn_case *ac) {
    const int S = ac->n_seqs, H = ac->H, KV = ac->KV, hd = ac->hd;
    int32_t qs[5] = {0}, ks[5] = {0};
    int sep = ac->klen[0] > 0;
    for (int s = 0; s < S; s++) {
        qs[s + 1] = qs[s] + ac->qlen[s];
        ks[s + 1] = ks[s] + (sep ? ac->klen[s] : ac->qlen[s]);
    }
    const int nq = qs[S], nk = ks[S];
    int32_t *qpos = xmalloc((size_t)nq * sizeof *qpos), *kpos = xmalloc((size_t)nk * sizeof *kpos);
    for (int s = 0; s < S; s++) {
        int kl = ks[s + 1] - ks[s], ql = qs[s + 1] - qs[s];
        for (int i = 0; i < kl; i++) kpos[ks[s] + i] = i;
        for (int i = 0; i < ql; i++) qpos[qs[s] + i] = kl - ql + i;   /* queries are the last rows */
    }
    uint8_t *kv = NULL;
    if (ac->pad) {
        kv = xmalloc((size_t)nk);
        for (int j = 0; j < nk; j++) kv[j] = urand() > 0.15;
        if (S > 1)
            for (int j = ks[0]; j < ks[1]; j++) kv[j] = 0;   /* sequence 0 sees no key at all */
    }
    float *q = rnd((size_t)nq * H * hd, -1, 1), *k = rnd((size_t)nk * KV * hd, -1, 1), *v = rnd((size_t)nk * KV * hd, -1, 1);
    attn_params p = {S, qs, ks, qpos, kpos, kv, ac->block_causal, H, KV, hd, 1.0f / sqrtf((float)hd)};
    float *cq = c_up(q, (size_t)nq * H * hd), *ck = c_up(k, (size_t)nk * KV * hd), *cv = c_up(v, (size_t)nk * KV * hd);
    float *co = g_cpu->ops->act_alloc(g_cpu, (size_t)nq * H * hd);
    void *gq = g_up(q, (size_t)nq * H * hd), *gk = g_up(k, (size_t)nk * KV * hd), *gv = g_up(v, (size_t)nk * KV * hd);
    const size_t no = (size_t)nq * H * hd;
    g_cpu->ops->attention(g_cpu, &p, cq, ck, cv, co);
    float *gh = g_attn(&p, gq, gk, gv, no, NULL, 0), *ggh = g_attn(&p, gq, gk, gv, no, backend_cuda_force_generic_attention, 1);
    char what[128];
    snprintf(what, sizeof what, "attention %s", ac->name);
    expect_close(what, gh, co, no, 2e-2);
    snprintf(what, sizeof what, "attention %s (generic kernel)", ac->name);
    expect_close(what, ggh, co, (size_t)nq * H * hd, 2e-2);
    snprintf(what, sizeof what, "attention %s: tensor-core vs generic GPU", ac->name);
    expect_close(what, gh, ggh, (size_t)nq * H * hd, 2e-2);
    /* the key splits (flash-decoding): never split, and 3 splits, against the CPU; the two must
     * differ only by the merge's rounding (auto above splits wherever the grid is small) */
    float *gnh = g_attn(&p, gq, gk, gv, no, backend_cuda_attention_splits, 1);
    float *g3h = g_attn(&p, gq, gk, gv, no, backend_cuda_attention_splits, 3);
    /* 7 (or as many as there are key tiles): the merge reads its partials 4 splits per round */
    float *g7h = g_attn(&p, gq, gk, gv, no, backend_cuda_attention_splits, 7);
    snprintf(what, sizeof what, "attention %s: keys never split", ac->name);
    expect_close(what, gnh, co, (size_t)nq * H * hd, 2e-2);
    snprintf(what, sizeof what, "attention %s: keys in 3 splits", ac->name);
    expect_close(what, g3h, co, (size_t)nq * H * hd, 2e-2);
    snprintf(what, sizeof what, "attention %s: 3 splits vs unsplit GPU", ac->name);
    expect_close(what, g3h, gnh, (size_t)nq * H * hd, 1e-2);
    snprintf(what, sizeof what, "attention %s: keys in 7 splits", ac->name);
    expect_close(what, g7h, co, (size_t)nq * H * hd, 2e-2);
    free(gnh);
    free(g3h);
    free(g7h);
    if (ac->own) {   /* odd sequences read their keys / values from separate buffers (a KV cache) */
        const size_t w = (size_t)KV * hd;
        const void *ck_s[4] = {NULL}, *cv_s[4] = {NULL}, *gk_s[4] = {NULL}, *gv_s[4] = {NULL};
        for (int s = 1; s < S; s += 2) {
            const size_t rows = (size_t)(ks[s + 1] - ks[s]);
            ck_s[s] = c_up(k + (size_t)ks[s] * w, rows * w), cv_s[s] = c_up(v + (size_t)ks[s] * w, rows * w);
            gk_s[s] = g_up(k + (size_t)ks[s] * w, rows * w), gv_s[s] = g_up(v + (size_t)ks[s] * w, rows * w);
        }
        attn_params po = p;
        float *co2 = g_cpu->ops->act_alloc(g_cpu, (size_t)nq * H * hd);
        po.k_seq = ck_s, po.v_seq = cv_s;
        g_cpu->ops->attention(g_cpu, &po, cq, ck, cv, co2);
        po.k_seq = gk_s, po.v_seq = gv_s;
        float *go2h = g_attn(&po, gq, gk, gv, no, NULL, 0);
        float *go3h = g_attn(&po, gq, gk, gv, no, backend_cuda_force_generic_attention, 1);
        snprintf(what, sizeof what, "attention %s: own key buffers, generic GPU kernel vs CPU", ac->name);
        expect_close(what, go3h, co, (size_t)nq * H * hd, 2e-2);
        free(go3h);
        snprintf(what, sizeof what, "attention %s: own key buffers, CPU == packed", ac->name);
        expect_close(what, co2, co, (size_t)nq * H * hd, 0.0);
        snprintf(what, sizeof what, "attention %s: own key buffers, GPU vs CPU", ac->name);
        expect_close(what, go2h, co, (size_t)nq * H * hd, 2e-2);
        for (int s = 1; s < S; s += 2) {
            g_cpu->ops->act_free(g_cpu, (void *)ck_s[s]), g_cpu->ops->act_free(g_cpu, (void *)cv_s[s]);
            g_gpu->ops->act_free(g_gpu, (void *)gk_s[s]), g_gpu->ops->act_free(g_gpu, (void *)gv_s[s]);
        }
        free(go2h);
        g_cpu->ops->act_free(g_cpu, co2);
    }
    if (ac->pad && S > 1) {   /* no visible key: zeros */
        int zero = 1;
        for (size_t i = 0; i < (size_t)(qs[1] - qs[0]) * H * hd; i++) zero &= gh[i] == 0.0f;
        CHECKF(zero, "attention %s: query without visible keys must give zeros", ac->name);
    }
    free(q), free(k), free(v), free(qpos), free(kpos), free(kv), free(gh), free(ggh);
    g_cpu->ops->act_free(g_cpu, cq), g_cpu->ops->act_free(g_cpu, ck), g_cpu->ops->act_free(g_cpu, cv);
    g_cpu->ops->act_free(g_cpu, co);
    void *gb[] = {gq, gk, gv};
    for (int i = 0; i < 3; i++) g_gpu->ops->act_free(g_gpu, gb[i]);
}

static void test_attention(void) {
    attn_case cs[] = {
        {"varlen GQA pad hd128", 3, {5, 70, 200}, {0}, 8, 2, 128, 0, 1},
        {"varlen hd64", 4, {1, 64, 65, 130}, {0}, 4, 4, 64, 0, 0},
        {"block-causal B=32 hd128", 2, {100, 67}, {0}, 4, 2, 128, 32, 0},
        {"block-causal B=4 pad hd64", 2, {9, 37}, {0}, 2, 1, 64, 4, 1},
        {"queries != keys hd128", 2, {32, 16}, {96, 50}, 4, 4, 128, 32, 0},
        {"KV caches: own keys, queries != keys, GQA hd64", 4, {32, 5, 16, 40}, {96, 200, 16, 70}, 4, 2, 64, 0, 0, 1},
        {"KV caches: own keys, block-causal pad hd128", 2, {20, 32}, {64, 130}, 4, 4, 128, 32, 1, 1},
        {"KV caches: own keys hd80 (generic path)", 2, {8, 24}, {40, 50}, 4, 2, 80, 0, 0, 1},
        {"hd32", 2, {40, 41}, {0}, 6, 3, 32, 0, 1},
        {"hd16", 1, {77}, {0}, 4, 4, 16, 0, 0},
        {"hd80 (generic path)", 2, {33, 20}, {0}, 4, 2, 80, 0, 1},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        attn_case c = cs[i];
        char name[96];
        snprintf(name, sizeof name, "attention %s", c.name);
        if (!case_on(name)) continue;
        if (g_quick && !g_emu)   /* --emu keeps these sizes: several key tiles and query blocks */
            for (int s = 0; s < c.n_seqs; s++) {
                c.qlen[s] = c.qlen[s] > 20 ? 20 : c.qlen[s];
                if (c.klen[s]) c.klen[s] = c.klen[s] > 30 ? 30 : c.klen[s];
            }
        run_attn(&c);
    }
    if (!g_quick && case_on("attention one 4096-token sequence hd128")) {
        attn_case lng = {"one 4096-token sequence hd128", 1, {4096}, {0}, 4, 4, 128, 0, 0};
        run_attn(&lng);
    }
}

/* ---------------------------------------------------------------- sampling */

static void test_gumbel(void) {
    const int n = g_quick ? 1000 : 20000, V = 126464;
    double *d = backend_cuda_malloc(g_gpu, (size_t)n * sizeof *d);
    CHECK(umk_gumbel(99, 7, 321, V, n, d, backend_cuda_stream(g_gpu)) == cudaSuccess);
    double *h = xmalloc((size_t)n * sizeof *h);
    backend_cuda_memcpy_d2h(g_gpu, h, d, (size_t)n * sizeof *h);
    double mx = 0;
    for (int t = 0; t < n; t++) {
        double r = sample_gumbel(99, 7, 321, V, t);
        double e = fabs(h[t] - r) / (fabs(r) + 1e-300);
        if (e > mx) mx = e;
    }
    printf("  %-58s max rel %.3g\n", "gumbel noise vs sample_gumbel", mx);
    CHECKF(mx <= 1e-12, "gumbel noise differs from the CPU rng: %.3g", mx);
    free(h);
    backend_cuda_free_dev(g_gpu, d);
}

typedef struct samp_case {
    const char *name;
    double      T, top_p, cfg;
    int         top_k, eos_inf, conf_eot_inf;
    int         quantized;   /* logits from a small set of values: many exact ties */
} samp_case;

static void test_sample(void) {
    const int V = g_quick ? 3001 : 50003, mask = 17, eos = 5, eot = 9;
    const samp_case cs[] = {
        {"argmax", 0, 1, 0, 0, 0, 0, 0},
        {"argmax ties", 0, 1, 0, 0, 0, 0, 1},
        {"argmax eos=-inf conf eot=-inf", 0, 1, 0, 0, 1, 1, 0},
        {"gumbel T=0.7", 0.7, 1, 0, 0, 0, 0, 0},
        {"gumbel T=1.3 ties", 1.3, 1, 0, 0, 0, 0, 1},
        {"top-k 5", 1.0, 1, 0, 5, 0, 0, 0},
        {"top-k 1", 0.8, 1, 0, 1, 0, 0, 0},
        {"top-k 40 ties", 1.0, 1, 0, 40, 0, 0, 1},
        {"top-k > candidates", 1.0, 1, 0, 10000000, 0, 0, 0},
        {"top-p 0.9", 1.0, 0.9, 0, 0, 0, 0, 0},
        {"top-p 0.3 ties", 0.6, 0.3, 0, 0, 0, 0, 1},
        {"top-k 50 + top-p 0.5", 1.2, 0.5, 0, 50, 0, 0, 0},
        {"cfg 1.5 argmax", 0, 1, 1.5, 0, 0, 0, 0},
        {"cfg 0.5 top-p 0.8", 0.9, 0.8, 0.5, 0, 1, 0, 0},
    };
    const int ncs = (int)(sizeof cs / sizeof cs[0]);
    const int per = g_quick ? 3 : 12;   /* rows per case */
    const int rows = ncs * per * 2;     /* each job has a conditional and an unconditional row */
    uint16_t *lg = xmalloc((size_t)rows * V * sizeof *lg);
    for (int r = 0; r < rows; r++) {
        const int quant = cs[(r / 2) / per].quantized;
        for (int v = 0; v < V; v++) {
            double x = (urand() - 0.5) * 12.0;
            if (quant) x = floor(x * 2.0) / 2.0;   /* ~24 distinct values */
            lg[(size_t)r * V + v] = f32_to_bf16((float)x);
        }
        lg[(size_t)r * V + (r * 7 + 3) % V] = f32_to_bf16(-INFINITY);
        lg[(size_t)r * V + mask] = f32_to_bf16(9.0f);   /* a big mask logit: never sampled */
    }
    umk_sample_job *jobs = xcalloc((size_t)ncs * per, sizeof *jobs);
    umk_sample_cfg *cfgs = xcalloc((size_t)ncs, sizeof *cfgs);
    for (int c = 0; c < ncs; c++) {
        cfgs[c].temperature = cs[c].T;
        cfgs[c].top_p = cs[c].top_p;
        cfgs[c].cfg_scale = cs[c].cfg;
        cfgs[c].seed = 1000 + (uint64_t)c;
        cfgs[c].top_k = cs[c].top_k;
        cfgs[c].logits_eos_inf = cs[c].eos_inf;
        cfgs[c].confidence_eos_eot_inf = cs[c].conf_eot_inf;
        for (int i = 0; i < per; i++) {
            umk_sample_job *j = &jobs[c * per + i];
            j->row = 2 * (c * per + i);
            j->urow = cs[c].cfg > 0 ? j->row + 1 : -1;
            j->pos = 100 + 3 * i;
            j->step = 4 + i;
            j->cfg = c;
            j->active = 1;
        }
    }
    /* the argmax-eot case: make eot the argmax in some rows so conf must be 0 */
    for (int i = 0; i < per; i += 2) lg[(size_t)jobs[2 * per + i].row * V + eot] = f32_to_bf16(20.0f);
    const int nj = ncs * per;
    cudaStream_t st = backend_cuda_stream(g_gpu);
    void *dl = backend_cuda_malloc(g_gpu, (size_t)rows * V * 2);
    void *dj = backend_cuda_malloc(g_gpu, (size_t)nj * sizeof *jobs);
    void *dc = backend_cuda_malloc(g_gpu, (size_t)ncs * sizeof *cfgs);
    int32_t *dx = backend_cuda_malloc(g_gpu, (size_t)nj * sizeof(int32_t));
    double *dcf = backend_cuda_malloc(g_gpu, (size_t)nj * sizeof(double));
    backend_cuda_memcpy_h2d(g_gpu, dl, lg, (size_t)rows * V * 2);
    backend_cuda_memcpy_h2d(g_gpu, dj, jobs, (size_t)nj * sizeof *jobs);
    backend_cuda_memcpy_h2d(g_gpu, dc, cfgs, (size_t)ncs * sizeof *cfgs);
    umk_vocab_ids ids = {V, mask, eos, eot};
    CHECK(umk_sample(dl, ids, dj, nj, dc, dx, dcf, st) == cudaSuccess);
    int32_t *gx = xmalloc((size_t)nj * sizeof *gx);
    double *gc = xmalloc((size_t)nj * sizeof *gc);
    backend_cuda_memcpy_d2h(g_gpu, gx, dx, (size_t)nj * sizeof *gx);
    backend_cuda_memcpy_d2h(g_gpu, gc, dcf, (size_t)nj * sizeof *gc);
    float *l = xmalloc((size_t)V * sizeof *l), *u = xmalloc((size_t)V * sizeof *u);
    for (int c = 0; c < ncs; c++) {
        int bad_x = 0;
        double worst = 0;
        for (int i = 0; i < per; i++) {
            const umk_sample_job *j = &jobs[c * per + i];
            for (int v = 0; v < V; v++) {
                l[v] = bf16_to_f32(lg[(size_t)j->row * V + v]);
                u[v] = j->urow >= 0 ? bf16_to_f32(lg[(size_t)j->urow * V + v]) : 0.0f;
            }
            sample_cfg sc = {V, mask, eos, eot, cs[c].cfg, cs[c].eos_inf, cs[c].conf_eot_inf, cs[c].T, cs[c].top_k,
                             cs[c].top_p, cfgs[c].seed};
            int32_t x0;
            double conf;
            sample_row(&sc, l, j->urow >= 0 ? u : NULL, j->step, j->pos, &x0, &conf);
            const int k = c * per + i;
            if (gx[k] != x0) bad_x++;
            double e = fabs(gc[k] - conf) / (fabs(conf) > 1e-300 ? fabs(conf) : 1.0);
            if (gx[k] == x0 && e > worst) worst = e;
        }
        char what[96];
        snprintf(what, sizeof what, "sample %s", cs[c].name);
        printf("  %-58s x0 mismatches %d/%d, conf max rel %.3g\n", what, bad_x, per, worst);
        CHECKF(bad_x == 0, "%s: %d of %d sampled tokens differ from sample_row", what, bad_x, per);
        CHECKF(worst <= 1e-9, "%s: confidence differs from sample_row by %.3g", what, worst);
    }
    free(l), free(u), free(lg), free(jobs), free(cfgs), free(gx), free(gc);
    void *db[] = {dl, dj, dc, dx, dcf};
    for (int i = 0; i < 5; i++) backend_cuda_free_dev(g_gpu, db[i]);
}

/* ---------------------------------------------------------------- decoders */

static void test_decoders(void) {
    const int B = 32, NS = g_quick ? 8 : 64, mask = 3, eos = 1, eot = 2, V = 50;
    int32_t *seq_start = xmalloc((size_t)(NS + 1) * sizeof *seq_start);
    umk_seq_state *st = xcalloc((size_t)NS, sizeof *st);
    seq_start[0] = 0;
    int lens[256];
    for (int s = 0; s < NS; s++) {
        lens[s] = 40 + (int)(urand() * 100);
        seq_start[s + 1] = seq_start[s] + lens[s];
    }
    const int ntok = seq_start[NS];
    int32_t *tok = xmalloc((size_t)ntok * sizeof *tok), *tok0 = xmalloc((size_t)ntok * sizeof *tok0);
    int32_t *x0 = xmalloc((size_t)NS * B * sizeof *x0);
    double *conf = xmalloc((size_t)NS * B * sizeof *conf);
    int32_t blk_tab[256 * 8];
    for (int s = 0; s < NS; s++) {
        umk_seq_state *q = &st[s];
        int L = lens[s], prompt = 5 + (int)(urand() * 20);
        for (int i = 0; i < L; i++) {
            int32_t t = i < prompt ? 10 + (int32_t)(urand() * 30) : (urand() < 0.7 ? mask : 10 + (int32_t)(urand() * 30));
            if (i >= prompt && urand() < 0.02) t = eos;
            tok[seq_start[s] + i] = t;
        }
        q->row0 = seq_start[s];
        q->len = L;
        q->gen_end = L;
        q->block_len = B;
        q->lo = prompt;
        q->hi = prompt + B < L ? prompt + B : L;
        q->decoder = s % 4;
        q->block_steps = 1 + (int)(urand() * 6);
        q->blk_steps_off = s % 3 == 0 ? s * 8 : -1;
        for (int b = 0; b < 8; b++) blk_tab[s * 8 + b] = 1 + (int)(urand() * 5);
        q->stop_at_eos = s % 2;
        q->threshold = 0.3 + 0.5 * urand();
        q->factor = 0.5 + urand();
        q->seed = 42 + (uint64_t)s;
        q->step = (int)(urand() * 10);
        for (int j = 0; j < B; j++) {
            x0[s * B + j] = 10 + (int32_t)(urand() * 30);
            conf[s * B + j] = urand() < 0.2 ? 0.5 : urand();   /* some exact ties */
        }
    }
    memcpy(tok0, tok, (size_t)ntok * sizeof *tok);
    cudaStream_t cs = backend_cuda_stream(g_gpu);
    umk_vocab_ids ids = {V, mask, eos, eot};
    void *dst = backend_cuda_malloc(g_gpu, (size_t)NS * sizeof *st);
    int32_t *dtok = backend_cuda_malloc(g_gpu, (size_t)ntok * sizeof *tok);
    int32_t *dtab = backend_cuda_malloc(g_gpu, sizeof blk_tab);
    int32_t *dx0 = backend_cuda_malloc(g_gpu, (size_t)NS * B * sizeof *x0);
    double *dcf = backend_cuda_malloc(g_gpu, (size_t)NS * B * sizeof *conf);
    size_t evb = umk_event_bytes(B);
    void *dev = backend_cuda_malloc(g_gpu, (size_t)NS * evb);
    void *djobs = backend_cuda_malloc(g_gpu, (size_t)NS * B * sizeof(umk_sample_job));
    int32_t *drows = backend_cuda_malloc(g_gpu, (size_t)NS * B * sizeof(int32_t));
    backend_cuda_memcpy_h2d(g_gpu, dst, st, (size_t)NS * sizeof *st);
    backend_cuda_memcpy_h2d(g_gpu, dtok, tok, (size_t)ntok * sizeof *tok);
    backend_cuda_memcpy_h2d(g_gpu, dtab, blk_tab, sizeof blk_tab);
    backend_cuda_memcpy_h2d(g_gpu, dx0, x0, (size_t)NS * B * sizeof *x0);
    backend_cuda_memcpy_h2d(g_gpu, dcf, conf, (size_t)NS * B * sizeof *conf);
    CHECK(umk_decode_begin(dst, NS, B, ids, dtok, dtab, djobs, drows, cs) == cudaSuccess);
    umk_seq_state *st_b = xcalloc((size_t)NS, sizeof *st_b);
    backend_cuda_memcpy_d2h(g_gpu, st_b, dst, (size_t)NS * sizeof *st_b);
    CHECK(umk_decode_commit(dst, NS, B, ids, dtok, dtab, dx0, dcf, dev, djobs, drows, cs) == cudaSuccess);
    unsigned char *ev = xmalloc((size_t)NS * evb);
    umk_seq_state *st_a = xcalloc((size_t)NS, sizeof *st_a);
    int32_t *tok_a = xmalloc((size_t)ntok * sizeof *tok_a);
    backend_cuda_memcpy_d2h(g_gpu, ev, dev, (size_t)NS * evb);
    backend_cuda_memcpy_d2h(g_gpu, st_a, dst, (size_t)NS * sizeof *st_a);
    backend_cuda_memcpy_d2h(g_gpu, tok_a, dtok, (size_t)ntok * sizeof *tok_a);

    int bad = 0, bad_adv = 0, total_commits = 0;
    for (int s = 0; s < NS; s++) {
        const umk_seq_state *b4 = &st_b[s];   /* after begin: the block actually decoded */
        if (b4->done) continue;
        int lo = b4->lo, hi = b4->hi, nb = hi - lo;
        int32_t *cx = tok + seq_start[s];
        int32_t rpos[64];
        uint8_t rmask[64];
        int32_t rx0[64];
        double rconf[64];
        int nr = 0, m = 0;
        for (int j = 0; j < nb; j++) {
            if (cx[lo + j] != mask) continue;
            rpos[nr] = lo + j, rmask[nr] = 1, rx0[nr] = x0[s * B + j], rconf[nr] = conf[s * B + j];
            nr++, m++;
        }
        decode_params dp = decode_params_default();
        dp.threshold = b4->threshold;
        dp.factor = b4->factor;
        decoder_view v;
        memset(&v, 0, sizeof v);
        v.p = &dp;
        v.x = cx;
        v.mask_id = mask;
        v.lo = lo, v.hi = hi;
        v.block_masks = b4->m0;
        v.block_steps = b4->block_steps;
        v.step_in_block = 0;
        v.step = b4->step;
        v.seed = b4->seed;
        v.n_rows = nr, v.row_pos = rpos, v.row_masked = rmask, v.x0 = rx0, v.conf = rconf, v.vocab = V;
        const decoder_ops *ops = decoder_get((enum decode_decoder)b4->decoder);
        unsigned char state[256] = {0};
        CHECK(ops->state_size <= sizeof state);
        if (ops->block_begin) ops->block_begin(state, &v);
        int32_t wp[64], wt[64];
        int nw = ops->choose(state, &v, wp, wt);
        umk_event_hdr h;
        memcpy(&h, ev + (size_t)s * evb, sizeof h);
        const int32_t *gp = (const int32_t *)(ev + (size_t)s * evb + sizeof h), *gt = gp + B;
        int same = h.n_commit == nw;
        for (int i = 0; same && i < nw; i++) same = gp[i] == wp[i] && gt[i] == wt[i];
        if (!same) {
            if (bad < 5)
                printf("    decoder %d seq %d: GPU %d commits, CPU %d (first GPU pos %d, CPU pos %d)\n", b4->decoder, s,
                       h.n_commit, nw, h.n_commit ? gp[0] : -1, nw ? wp[0] : -1);
            bad++;
        }
        total_commits += nw;
        for (int i = 0; i < nw; i++) cx[wp[i]] = wt[i];
        /* expected state after the step */
        int left = 0, eos_in = 0;
        for (int p = lo; p < hi; p++) {
            left += cx[p] == mask;
            eos_in |= cx[p] == eos || cx[p] == eot;
        }
        int e_done = 0, e_lo = lo, e_hi = hi, e_blk = b4->blk;
        if (left == 0) {
            if (b4->stop_at_eos && eos_in) {
                e_done = 1;
            } else {
                for (;;) {
                    e_lo = e_hi;
                    if (e_lo >= b4->gen_end) {
                        e_done = 1;
                        break;
                    }
                    e_blk++;
                    e_hi = e_lo + B < b4->gen_end ? e_lo + B : b4->gen_end;
                    int mm = 0;
                    for (int p = e_lo; p < e_hi; p++) mm += cx[p] == mask;
                    if (mm > 0) break;
                }
            }
        }
        const umk_seq_state *af = &st_a[s];
        int ok = af->done == e_done && af->step == b4->step + 1 && h.masks_left == left && h.block_done == (left == 0);
        if (!e_done) ok &= af->lo == e_lo && af->hi == e_hi && af->blk == e_blk;
        if (!e_done && e_blk != b4->blk && b4->blk_steps_off >= 0) ok &= af->block_steps == blk_tab[b4->blk_steps_off + e_blk];
        if (!ok) bad_adv++;
    }
    int canvas_same = memcmp(tok_a, tok, (size_t)ntok * sizeof *tok) == 0;
    printf("  %-58s %d/%d sequences differ, %d commits, advance mismatches %d, canvas %s\n",
           "decoders (low_confidence/random/threshold/factor)", bad, NS, total_commits, bad_adv,
           canvas_same ? "identical" : "DIFFERS");
    CHECKF(bad == 0, "device decoders differ from decoders.c in %d of %d sequences", bad, NS);
    CHECKF(bad_adv == 0, "block advance / EOS stop / step counters differ in %d sequences", bad_adv);
    CHECKF(canvas_same, "committed canvas differs");
    free(seq_start), free(st), free(st_b), free(st_a), free(tok), free(tok0), free(tok_a), free(x0), free(conf), free(ev);
    void *db[] = {dst, dtok, dtab, dx0, dcf, dev, djobs, drows};
    for (int i = 0; i < 8; i++) backend_cuda_free_dev(g_gpu, db[i]);
}

/* ---------------------------------------------------------------- forward */

static int make_model(const char *tmp, const char *name, int d, int layers, int heads, int kv, int ffn, model *m) {
    char dir[4096];   /* per process: ctest runs the plain and the shuffled preset at once */
    snprintf(dir, sizeof dir, "%s/%s-%ld", tmp, name, (long)getpid());
    make_model_opts o;
    CHECK(make_model_preset("demo", &o) == 0);
    o.d_model = d, o.n_layers = layers, o.n_heads = heads, o.n_kv_heads = kv, o.ffn_hidden = ffn;
    o.dtype = DTYPE_BF16;
    o.quiet = 1;
    um_err err = {0};
    if (make_model_write(dir, &o, &err) != 0 || model_load(dir, m, &err) != 0) {
        printf("FAIL: model %s: %s\n", name, err.msg);
        g_checks++, g_failed++;
        return -1;
    }
    return 0;
}

/* A disagreeing argmax is rounding when the GPU's errors at both logits are within this many times
 * the row's RMS error (test_forward). Measured on the emulator (the GPU's bf16 rounding points; the
 * full-size forwards, 908 rows of 1344 logits): the errors at a row's two largest CPU logits reach
 * 3.8x the row's RMS, the largest error at any logit of any row 5.2x; 6 is above both, and a
 * corrupted logit (a wrong kernel) is off by far more than 6x a rounding RMS of ~0.01. */
#define ARGMAX_ERR_RMS 6.0

static void test_forward(const model *m, const char *label) {
    const model_config *c = &m->cfg;
    const int lens[] = {33, 100, 257, 64};
    const int S = g_quick ? 2 : 4;
    int32_t ss[5] = {0};
    for (int s = 0; s < S; s++) ss[s + 1] = ss[s] + (g_quick ? lens[s] / 4 + 1 : lens[s]);
    const int n = ss[S], V = c->n_embd_rows;
    int32_t *tok = xmalloc((size_t)n * sizeof *tok);
    uint8_t *kv = xmalloc((size_t)n);
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(urand() * c->vocab_size);
        if (urand() < 0.3) tok[i] = c->mask_id;
        kv[i] = 1;
    }
    kv[ss[1] - 1] = 0;
    fwd_batch b = {S, ss, tok, NULL, kv, n, NULL};
    model_ctx cc, gc;
    um_err err = {0};
    CHECK(model_ctx_init(&cc, m, g_cpu, &err) == 0);
    if (model_ctx_init(&gc, m, g_gpu, &err) != 0) {
        printf("FAIL: CUDA model_ctx_init: %s\n", err.msg);
        g_checks++, g_failed++;
        model_ctx_free(&cc);
        return;
    }
    float *cl = xmalloc((size_t)n * V * sizeof *cl), *gl = xmalloc((size_t)n * V * sizeof *gl);
    for (size_t i = 0; i < (size_t)n * V; i++) gl[i] = NAN;
    CHECK(model_forward(&cc, &b, cl, &err) == 0);
    CHECK(model_forward(&gc, &b, gl, &err) == 0);
    char what[128];
    snprintf(what, sizeof what, "forward logits %s (%d rows)", label, n);
    expect_close(what, gl, cl, (size_t)n * V, 2e-2);
    /* argmax agreement. The GPU picks b over the CPU's a exactly when cpu[a] - cpu[b] <= e[b] - e[a]
     * (e = gpu - cpu): every flip is "explained" by the errors at its two logits, so the question is
     * only whether those errors are ordinary. A disagreement counts as rounding when |e[a]| and
     * |e[b]| are both within ARGMAX_ERR_RMS times the row's RMS error over all V logits: bf16
     * activations spread small errors over every logit, and the two candidates' errors are then of
     * the row's size (somewhat above it: they are the largest logits and bf16 error is relative;
     * the largest ratio over all rows' top-2 tokens is printed as calibration). A wrong kernel that
     * corrupts a few logits puts errors there far outside the row's distribution and fails, and a
     * wrong row shows in the relative error above. Each disagreement that is not rounding is printed
     * with its row, the CPU gap, both errors and the row's RMS and max error. */
    int agree = 0, rounding = 0, hard = 0;
    double worst_gap = 0, worst_top = 0;   /* largest CPU gap of a disagreement; largest top-2 error / RMS */
    for (int i = 0; i < n; i++) {
        const float *cr = cl + (size_t)i * V, *gr = gl + (size_t)i * V;
        int ca = 0, c2 = -1, ga = 0;   /* CPU argmax and runner-up, GPU argmax */
        double rms = 0, emax = 0;
        for (int v = 0; v < V; v++) {
            if (cr[v] > cr[ca]) c2 = ca, ca = v;
            else if (v != ca && (c2 < 0 || cr[v] > cr[c2])) c2 = v;
            if (gr[v] > gr[ga]) ga = v;
            const double e = fabs((double)gr[v] - cr[v]);
            rms += e * e;
            if (e > emax) emax = e;
        }
        rms = sqrt(rms / V);
        const double ea = fabs((double)gr[ca] - cr[ca]), e2 = c2 >= 0 ? fabs((double)gr[c2] - cr[c2]) : 0;
        if (rms > 0 && fmax(ea, e2) / rms > worst_top) worst_top = fmax(ea, e2) / rms;
        if (ca == ga) {
            agree++;
            continue;
        }
        const double gap = (double)cr[ca] - cr[ga], eb = fabs((double)gr[ga] - cr[ga]);
        if (gap > worst_gap) worst_gap = gap;
        if (ea <= ARGMAX_ERR_RMS * rms && eb <= ARGMAX_ERR_RMS * rms) {
            rounding++;
        } else {
            hard++;
            printf("    row %d: CPU argmax %d, GPU argmax %d, CPU gap %.4g; |error| %.4g at %d, %.4g at %d; row RMS error "
                   "%.4g (x%.1f allowed), max %.4g\n",
                   i, ca, ga, gap, ea, ca, eb, ga, rms, ARGMAX_ERR_RMS, emax);
        }
    }
    double rate = (double)agree / n;
    printf("  %-58s %.2f%% (%d of %d disagreements within rounding; largest CPU gap %.3g; top-2 errors <= %.2fx row RMS)\n",
           "  argmax agreement", 100 * rate, rounding, n - agree, worst_gap, worst_top);
    CHECKF(rate >= 0.999 || hard == 0,
           "%s: argmax agreement %.3f%% with %d disagreements whose logit errors exceed %.0fx the row's RMS error", label,
           100 * rate, hard, ARGMAX_ERR_RMS);
    /* staging reuse: every layer stages the same sequence starts and key flags; with reuse on they
     * are copied once per forward, not once per layer, and the logits do not change at all */
    {
        uint64_t c0, r0, c1, r1, c2, r2;
        float *ol = xmalloc((size_t)n * V * sizeof *ol);
        backend_cuda_stage_reuse(g_gpu, 0);
        backend_cuda_stage_stats(g_gpu, &c0, &r0);
        CHECK(model_forward(&gc, &b, ol, &err) == 0);
        backend_cuda_stage_stats(g_gpu, &c1, &r1);
        CHECKF(memcmp(ol, gl, (size_t)n * V * sizeof *ol) == 0, "%s: logits without staging reuse differ", label);
        backend_cuda_stage_reuse(g_gpu, 1);
        CHECK(model_forward(&gc, &b, ol, &err) == 0);
        backend_cuda_stage_stats(g_gpu, &c2, &r2);
        const uint64_t off_copies = c1 - c0, on_copies = c2 - c1, on_reused = r2 - r1;
        printf("  %-58s %llu copies without reuse, %llu + %llu reused with\n", "  staged index arrays per forward",
               (unsigned long long)off_copies, (unsigned long long)on_copies, (unsigned long long)on_reused);
        CHECKF(r1 == r0 && on_reused > 0 && on_copies + on_reused == off_copies &&
                   on_copies * (uint64_t)c->n_layers <= 2 * off_copies,
               "%s: staging reuse: %llu copies without, %llu copies + %llu reused with (%d layers)", label,
               (unsigned long long)off_copies, (unsigned long long)on_copies, (unsigned long long)on_reused,
               c->n_layers);
        free(ol);
    }
    /* BACKEND_CAP_FUSED's ops as one kernel each (the default) or as their single kernels: the same
     * logits bit for bit */
    {
        float *ul = xmalloc((size_t)n * V * sizeof *ul);
        backend_cuda_fuse(g_gpu, 0);
        CHECK(model_forward(&gc, &b, ul, &err) == 0);
        backend_cuda_fuse(g_gpu, 1);
        const int same = memcmp(ul, gl, (size_t)n * V * sizeof *ul) == 0;
        printf("  %-58s %s\n", "  fused ops vs single kernels", same ? "bit-identical" : "differ");
        CHECKF(same, "%s: logits with --cuda-fuse off differ", label);
        free(ul);
    }
    /* q|k|v and gate|up joined, one product each (BACKEND_PACK_*: q|k|v in models without biases or
     * QK-norm, gate|up in dense MLPs left unquantized) or not: the same logits up to the GEMMs'
     * summation order (bit for bit on the emulator) */
    {
        const llada_layer_tensors *L0 = &m->llada.layers[0];
        const unsigned want = (!L0->q_bias && !L0->q_norm ? BACKEND_PACK_QKV : 0) |
                              (!L0->moe && !model_quant_converts(m->quant) ? BACKEND_PACK_GATE_UP : 0);
        CHECKF(gc.packed == want, "%s: joined weights %#x, expected %#x", label, gc.packed, want);
        model_ctx sc;
        backend_cuda_pack(g_gpu, 0);
        CHECK(model_ctx_init(&sc, m, g_gpu, &err) == 0);
        backend_cuda_pack(g_gpu, BACKEND_PACK_QKV | BACKEND_PACK_GATE_UP);
        CHECK(!sc.packed);
        float *sl = xmalloc((size_t)n * V * sizeof *sl), *jl = xmalloc((size_t)n * V * sizeof *jl);
        for (int cub = 0; cub < 2; cub++) {   /* the products on the default path, then all on cuBLAS */
            if (cub) backend_cuda_gemm_cublas(g_gpu, 1);
            CHECK(model_forward(&gc, &b, jl, &err) == 0);
            CHECK(model_forward(&sc, &b, sl, &err) == 0);
            if (cub) backend_cuda_gemm_cublas(g_gpu, !g_opts.cuda_skinny);
            snprintf(what, sizeof what, "joined weights %#x vs none%s %s", gc.packed, cub ? ", cuBLAS" : "", label);
            expect_close(what, jl, sl, (size_t)n * V, 1e-2);
            printf("  %-58s %s\n", "  joined vs separate weights", memcmp(jl, sl, (size_t)n * V * sizeof *sl) ? "differ" : "bit-identical");
        }
        free(sl), free(jl);
        model_ctx_free(&sc);
    }
    /* model_forward_dev == model_forward on the GPU */
    const void *dl = NULL;
    CHECK(model_forward_dev(&gc, &b, &dl, &err) == 0);
    float *dh = g_down(dl, (size_t)n * V);
    snprintf(what, sizeof what, "model_forward_dev vs model_forward %s", label);
    expect_close(what, dh, gl, (size_t)n * V, 1e-2);
    free(dh), free(cl), free(gl), free(tok), free(kv);
    model_ctx_free(&cc);
    model_ctx_free(&gc);
}

/* ---------------------------------------------------------------- decodes */

typedef struct dev_run {
    int32_t *canvas;   /* final packed canvas */
    int      steps;
} dev_run;

static int fwd_dev(void *user, const fwd_batch *b, const void **logits, um_err *err) {
    return model_forward_dev(user, b, logits, err);
}

/* the decode_params of the test decodes */
static decode_params dec_params(enum decode_decoder d) {
    decode_params p = decode_params_default();
    p.gen_length = g_quick ? 16 : 64;
    p.block_length = g_quick ? 8 : 16;
    p.steps = p.gen_length;
    p.decoder = d;
    p.threshold = 0.02;   /* random weights give low confidences: commit a few per step */
    p.stop_at_eos = 0;
    return p;
}

static void build_seqs(const model *m, const decode_params *p, int n, int32_t **prompts, int *plen, int32_t **canv,
                       device_step_seq *sq) {
    const model_config *c = &m->cfg;
    for (int s = 0; s < n; s++) {
        plen[s] = 8 + 5 * s;
        prompts[s] = xmalloc((size_t)plen[s] * sizeof(int32_t));
        for (int i = 0; i < plen[s]; i++) {
            int32_t t = (int32_t)(urand() * c->vocab_size);
            prompts[s][i] = t == c->mask_id ? t + 1 : t;
        }
        int L = plen[s] + p->gen_length, nb = p->gen_length / p->block_length;
        canv[s] = xmalloc((size_t)L * sizeof(int32_t));
        memcpy(canv[s], prompts[s], (size_t)plen[s] * sizeof(int32_t));
        for (int i = plen[s]; i < L; i++) canv[s][i] = c->mask_id;
        sq[s] = (device_step_seq){.tokens = canv[s], .len = L, .lo = plen[s], .hi = plen[s] + p->block_length,
                                  .gen_end = L, .block_steps = p->steps / nb, .decoder = (int)p->decoder,
                                  .threshold = p->threshold, .factor = p->factor, .stop_at_eos = p->stop_at_eos,
                                  .temperature = 0, .top_p = 1, .top_k = 0, .seed = p->seed};
    }
}

static void test_decodes(const model *m) {
    const model_config *c = &m->cfg;
    const int NS = g_quick ? 2 : 6;
    um_err err = {0};
    model_ctx gc, cc;
    CHECK(model_ctx_init(&gc, m, g_gpu, &err) == 0);
    CHECK(model_ctx_init(&cc, m, g_cpu, &err) == 0);
    device_step_ids ids = {c->n_embd_rows, c->mask_id, c->eos_id, c->eot_id};
    const enum decode_decoder decs[] = {DECODER_LOW_CONFIDENCE, DECODER_THRESHOLD};
    for (int di = 0; di < 2; di++) {
        decode_params p = dec_params(decs[di]);
        int32_t *prompts[8], *canv[8];
        int plen[8];
        device_step_seq sq[8];
        build_seqs(m, &p, NS, prompts, plen, canv, sq);
        const int B = p.block_length;
        /* 1. graph replay == direct launches, bit for bit */
        int32_t *fin[2] = {NULL, NULL};
        int steps_run[2] = {0, 0}, ntok = 0;
        for (int g = 0; g < 2; g++) {
            device_step *cd = device_step_create(g_gpu, sq, NS, B, ids, 4, fwd_dev, &gc, &err);
            CHECK(cd);
            if (g) CHECK(device_step_capture(cd, &err) == 0);
            int done = 0, guard = 0;
            while (!done && guard++ < 4 * p.gen_length + 8) {
                CHECK(device_step_enqueue(cd, &err) == 0);
                CHECK(device_step_poll(cd, 1) == 1);
                done = 1;
                for (int s = 0; s < NS; s++) {
                    device_step_event ev;
                    device_step_record(cd, s, &ev);
                    done &= ev.done;
                }
                steps_run[g]++;
            }
            ntok = device_step_batch(cd)->seq_start[NS];
            fin[g] = xmalloc((size_t)ntok * sizeof(int32_t));
            device_step_tokens(cd, fin[g]);
            device_step_free(cd);
        }
        char what[128];
        snprintf(what, sizeof what, "device decode %s: graph vs direct", decode_decoder_name(p.decoder));
        int same = steps_run[0] == steps_run[1] && memcmp(fin[0], fin[1], (size_t)ntok * sizeof(int32_t)) == 0;
        int masks_left = 0;
        for (int i = 0; i < ntok; i++) masks_left += fin[0][i] == c->mask_id;
        printf("  %-58s %s (%d steps), masks left %d\n", what, same ? "identical" : "DIFFER", steps_run[0], masks_left);
        CHECKF(same, "%s: canvases differ", what);
        CHECKF(masks_left == 0, "%s: %d masks left after the decode", what, masks_left);
        if (p.decoder == DECODER_LOW_CONFIDENCE)
            CHECKF(steps_run[0] == p.steps, "%s: %d steps, expected %d", what, steps_run[0], p.steps);

        /* 2. teacher-forced: per step, the CPU (forward + sampler + decoder) on the GPU's canvas */
        device_step *cd = device_step_create(g_gpu, sq, NS, B, ids, 4, fwd_dev, &gc, &err);
        CHECK(cd);
        const fwd_batch *gb = device_step_batch(cd);
        int32_t seq_start[9];   /* gb dies with cd (freed before the free-running decodes below) */
        memcpy(seq_start, gb->seq_start, (size_t)(NS + 1) * sizeof *seq_start);
        int32_t *cur = xmalloc((size_t)ntok * sizeof *cur);
        int step_cmp = 0, step_same = 0, step_tie = 0, tok_cmp = 0, tok_same = 0;
        int *m0 = xcalloc((size_t)NS, sizeof *m0), *sib = xcalloc((size_t)NS, sizeof *sib), *lo_prev = xcalloc((size_t)NS, sizeof *lo_prev);
        int *stepn = xcalloc((size_t)NS, sizeof *stepn);
        float *lg = xmalloc((size_t)B * c->n_embd_rows * sizeof *lg);
        for (int it = 0; it < 4 * p.gen_length + 8; it++) {
            device_step_tokens(cd, cur);
            /* CPU expectation per sequence */
            int32_t exp_pos[8][64], exp_tok[8][64], exp_n[8];
            int active[8], exp_lo[8];
            double exp_conf[8][64], exp_cut[8];   /* CPU confidence per block offset; the commit boundary */
            for (int s = 0; s < NS; s++) {
                int32_t *x = cur + gb->seq_start[s];
                int L = gb->seq_start[s + 1] - gb->seq_start[s], lo = -1;
                for (int b0 = plen[s]; b0 < L && lo < 0; b0 += B)
                    for (int q = b0; q < b0 + B && q < L; q++)
                        if (x[q] == c->mask_id) lo = b0;
                active[s] = lo >= 0;
                exp_n[s] = 0;
                if (!active[s]) continue;
                int hi = lo + B < L ? lo + B : L;
                if (lo != lo_prev[s]) {
                    m0[s] = 0;
                    for (int q = lo; q < hi; q++) m0[s] += x[q] == c->mask_id;
                    sib[s] = 0;
                    lo_prev[s] = lo;
                }
                int32_t rows[64], rpos[64], rx0[64];
                uint8_t rm[64];
                double rc[64];
                int nr = 0;
                for (int q = lo; q < hi; q++)
                    if (x[q] == c->mask_id) rows[nr] = q, rpos[nr] = q, rm[nr] = 1, nr++;
                int32_t st0[2] = {0, L};
                fwd_batch fb = {1, st0, x, NULL, NULL, nr, rows};
                CHECK(model_forward(&cc, &fb, lg, &err) == 0);
                sample_cfg sc = {c->n_embd_rows, c->mask_id, c->eos_id, c->eot_id, 0, 0, 0, 0.0, 0, 1.0, p.seed};
                for (int r = 0; r < nr; r++)
                    sample_row(&sc, lg + (size_t)r * c->n_embd_rows, NULL, stepn[s], rpos[r], &rx0[r], &rc[r]);
                decoder_view v;
                memset(&v, 0, sizeof v);
                v.p = &p, v.x = x, v.mask_id = c->mask_id, v.lo = lo, v.hi = hi, v.block_masks = m0[s];
                v.block_steps = sq[s].block_steps, v.step_in_block = sib[s], v.step = stepn[s], v.seed = p.seed;
                v.n_rows = nr, v.row_pos = rpos, v.row_masked = rm, v.x0 = rx0, v.conf = rc, v.vocab = c->n_embd_rows;
                const decoder_ops *ops = decoder_get(p.decoder);
                unsigned char state[256] = {0};
                v.block_masks = m0[s];
                if (ops->block_begin) ops->block_begin(state, &v);
                exp_n[s] = ops->choose(state, &v, exp_pos[s], exp_tok[s]);
                /* the confidence at which the CPU's commit set is cut: the weakest commit (top-k
                 * decoders) or the threshold (the best candidate when none reaches it) */
                exp_lo[s] = lo;
                for (int j = 0; j < 64; j++) exp_conf[s][j] = -1.0;
                double cmin = INFINITY, cmax = 0.0;
                for (int r = 0; r < nr; r++) {
                    exp_conf[s][rpos[r] - lo] = rc[r];
                    cmax = rc[r] > cmax ? rc[r] : cmax;
                    for (int i = 0; i < exp_n[s]; i++)
                        if (exp_pos[s][i] == rpos[r] && rc[r] < cmin) cmin = rc[r];
                }
                exp_cut[s] = p.decoder == DECODER_THRESHOLD ? (cmax >= p.threshold ? p.threshold : cmax) : cmin;
            }
            int any = 0;
            for (int s = 0; s < NS; s++) any |= active[s];
            if (!any) break;
            CHECK(device_step_enqueue(cd, &err) == 0);
            CHECK(device_step_poll(cd, 1) == 1);
            for (int s = 0; s < NS; s++) {
                if (!active[s]) continue;
                device_step_event ev;
                device_step_record(cd, s, &ev);
                int same_set = ev.n_commit == exp_n[s];
                for (int i = 0; same_set && i < exp_n[s]; i++) same_set = ev.pos[i] == exp_pos[s][i];
                step_cmp++;
                step_same += same_set;
                if (!same_set && ev.lo == exp_lo[s]) {
                    /* A flip of two positions' order by numerical error needs their CPU gap to be at
                     * most the sum of their device-vs-CPU confidence errors: a difference only among
                     * positions within 2 x (largest error of this block) of the CPU's cut is a
                     * near-tie that bf16 activations legitimately flip. */
                    double err_max = 0.0;
                    for (int j = 0; j < ev.hi - ev.lo; j++)
                        if (exp_conf[s][j] >= 0 && ev.draft_tok[j] >= 0)
                            err_max = fmax(err_max, fabs((double)ev.draft_conf[j] - exp_conf[s][j]));
                    int tie = 1;
                    for (int i = 0; i < ev.n_commit; i++) {
                        int in_cpu = 0;
                        for (int k = 0; k < exp_n[s]; k++) in_cpu |= exp_pos[s][k] == ev.pos[i];
                        const double cv = exp_conf[s][ev.pos[i] - exp_lo[s]];
                        if (!in_cpu) tie &= cv >= 0 && fabs(cv - exp_cut[s]) <= 2.0 * err_max;
                    }
                    for (int k = 0; k < exp_n[s]; k++) {
                        int in_dev = 0;
                        for (int i = 0; i < ev.n_commit; i++) in_dev |= exp_pos[s][k] == ev.pos[i];
                        const double cv = exp_conf[s][exp_pos[s][k] - exp_lo[s]];
                        if (!in_dev) tie &= fabs(cv - exp_cut[s]) <= 2.0 * err_max;
                    }
                    step_tie += tie;
                }
                for (int i = 0; i < ev.n_commit; i++)
                    for (int k = 0; k < exp_n[s]; k++)
                        if (exp_pos[s][k] == ev.pos[i]) {
                            tok_cmp++;
                            tok_same += exp_tok[s][k] == ev.tok[i];
                        }
                stepn[s]++;
                sib[s]++;
            }
        }
        device_step_free(cd);
        double rs = step_cmp ? (double)step_same / step_cmp : 0, rt = tok_cmp ? (double)tok_same / tok_cmp : 0;
        double rst = step_cmp ? (double)(step_same + step_tie) / step_cmp : 0;
        snprintf(what, sizeof what, "teacher-forced steps vs CPU, %s", decode_decoder_name(p.decoder));
        printf("  %-58s same commits %.1f%% of %d steps (%.1f%% with near-ties), same tokens %.1f%% of %d\n", what,
               100 * rs, step_cmp, 100 * rst, 100 * rt, tok_cmp);
        CHECKF(step_cmp > 0 && rst >= 0.90, "%s: commit sets agree in only %.1f%% of steps (%.1f%% counting near-ties)",
               what, 100 * rs, 100 * rst);
        CHECKF(tok_cmp > 0 && rt >= 0.95, "%s: tokens agree in only %.1f%%", what, 100 * rt);

        /* 3. free-running decodes: CPU loop, CUDA host loop, CUDA device loop (reported) */
        int agree_cpu = 0, agree_host = 0, total = 0;
        for (int s = 0; s < NS; s++) {
            decode_seq *a = decode_seq_create(m, &p, prompts[s], plen[s], &err);
            decode_seq *b = decode_seq_create(m, &p, prompts[s], plen[s], &err);
            CHECK(a && b);
            CHECK(decode_generate(&cc, a, NULL, &err) == 0);
            CHECK(decode_generate(&gc, b, NULL, &err) == 0);
            int la, lb;
            const int32_t *xa = decode_seq_canvas(a, &la), *xb = decode_seq_canvas(b, &lb);
            const int32_t *xd = fin[1] + seq_start[s];
            for (int i = plen[s]; i < la && i < lb; i++) {
                total++;
                agree_cpu += xa[i] == xd[i];
                agree_host += xb[i] == xd[i];
            }
            decode_seq_free(a);
            decode_seq_free(b);
        }
        printf("  %-58s device vs CPU %.1f%%, device vs CUDA host loop %.1f%% of %d tokens\n", "  free-running decodes",
               total ? 100.0 * agree_cpu / total : 0.0, total ? 100.0 * agree_host / total : 0.0, total);
        for (int s = 0; s < NS; s++) free(prompts[s]), free(canv[s]);
        free(fin[0]), free(fin[1]), free(cur), free(m0), free(sib), free(lo_prev), free(stepn), free(lg);
    }
    decode_thread_scratch_free();
    model_ctx_free(&gc);
    model_ctx_free(&cc);
}

/* ---------------------------------------------------------------- skinny GEMM and FP8 (gemm.cu) */

/* y[m, n] = x[m, k] · wᵀ in double, w given as floats (dequantized FP8 or bf16) */
static float *ref_mm(const float *x, const float *w, int m, int n, int k) {
    float *y = xmalloc((size_t)m * n * sizeof *y);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int c = 0; c < k; c++) acc += (double)x[(size_t)i * k + c] * (double)w[(size_t)j * k + c];
            y[(size_t)i * n + j] = (float)acc;
        }
    return y;
}

/* an FP8 weight on the GPU and its dequantized floats on the host. blk = 0: from a bf16 matrix with
 * --quant fp8 (per output channel, quantized on the device; its bytes and scales are compared with
 * the same quantization on the host); blk = 128: an F8_E4M3 source with 128 x 128 block scales */
typedef struct fp8w {
    bweight g;
    float  *deq;   /* [rows, cols] */
} fp8w;

static void fp8w_make(fp8w *f, int rows, int cols, int blk) {
    memset(f, 0, sizeof *f);
    const size_t n = (size_t)rows * cols;
    f->deq = xmalloc(n * sizeof *f->deq);
    um_err err;
    if (blk == 0) {
        uint16_t *mem = xmalloc(n * 2);
        for (size_t i = 0; i < n; i++) mem[i] = f32_to_bf16((float)((urand() - 0.5) * 0.1 * (1 + (i % 7))));
        bweight_src t = {.name = "parity.fp8", .data = mem, .type = DTYPE_BF16, .rows = rows, .cols = cols,
                         .quant = DTYPE_F8_E4M3};
        CHECK(g_gpu->ops->weight_upload(g_gpu, &t, &f->g, &err) == 0);
        CHECK(f->g.type == DTYPE_F8_E4M3 && f->g.scale_rows == 1 && f->g.scale_cols == cols);
        uint8_t *q = xmalloc(n);
        float *sc = xmalloc((size_t)rows * sizeof *sc);
        CHECK(cudaMemcpy(q, f->g.data, n, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(cudaMemcpy(sc, f->g.scale, (size_t)rows * sizeof *sc, cudaMemcpyDeviceToHost) == cudaSuccess);
        size_t bad_q = 0, bad_s = 0;
        for (int r = 0; r < rows; r++) {
            float amax = 0;
            for (int c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(bf16_to_f32(mem[(size_t)r * cols + c])));
            const float s = amax > 0 ? amax / 448.0f : 1.0f;
            bad_s += sc[r] != s;
            for (int c = 0; c < cols; c++) {
                const size_t i = (size_t)r * cols + c;
                bad_q += q[i] != f32_to_fp8_e4m3(bf16_to_f32(mem[i]) / s);
                f->deq[i] = fp8_e4m3_to_f32(q[i]) * sc[r];
            }
        }
        CHECKF(bad_q == 0 && bad_s == 0, "fp8 quantize %dx%d on the device: %zu bytes and %zu scales differ from the host's",
               rows, cols, bad_q, bad_s);
        free(mem), free(q), free(sc);
    } else {
        const int gr = (rows + blk - 1) / blk, gc = (cols + blk - 1) / blk;
        uint8_t *q = xmalloc(n);
        float *sc = xmalloc((size_t)gr * gc * sizeof *sc);
        for (int i = 0; i < gr * gc; i++) sc[i] = (float)(0.5e-3 + 1.5e-3 * urand());
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)(urand() * 256.0);
            if ((b & 0x7f) == 0x7f) b ^= 1;   /* no NaN codes */
            q[i] = b;
            const int r = (int)(i / (size_t)cols), c = (int)(i % (size_t)cols);
            f->deq[i] = fp8_e4m3_to_f32(b) * sc[(r / blk) * gc + c / blk];
        }
        bweight_src t = {.name = "parity.fp8blk", .data = q, .type = DTYPE_F8_E4M3, .rows = rows, .cols = cols,
                         .scale = sc, .scale_rows = blk, .scale_cols = blk};
        CHECK(g_gpu->ops->weight_upload(g_gpu, &t, &f->g, &err) == 0);
        free(q), free(sc);
    }
}

static void fp8w_free(fp8w *f) {
    g_gpu->ops->weight_free(g_gpu, &f->g);
    free(f->deq);
}

static float *w_floats(const uint16_t *mem, size_t n) {
    float *f = xmalloc(n * sizeof *f);
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(mem[i]);
    return f;
}

static void test_skinny(void) {
    char what[128];
    /* bf16 products through backend_matmul: the skinny kernel (<= 64 rows) vs fp64 and vs cuBLAS;
     * the same launch twice is bit-identical (split-K partials summed in split order) */
    struct {
        int m, n, k;
    } cs[] = {{1, 300, 264}, {7, 128, 512}, {16, 1000, 256}, {33, 257, 1024}, {64, 384, 2048}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int m = cs[c].m, n = cs[c].n, k = g_emu && cs[c].k > 1024 ? 1024 : cs[c].k;
        float *x = rnd((size_t)m * k, -1, 1);
        pw w;
        pw_make(&w, n, k, 0.05f);
        float *wf = w_floats(w.mem, (size_t)n * k), *ref = ref_mm(x, wf, m, n, k);
        void *gx = g_up(x, (size_t)m * k), *gy = g_poisoned((size_t)m * n), *gy2 = g_poisoned((size_t)m * n);
        g_gpu->ops->matmul(g_gpu, gx, &w.g, NULL, m, gy);
        g_gpu->ops->matmul(g_gpu, gx, &w.g, NULL, m, gy2);
        float *a = g_down(gy, (size_t)m * n), *b = g_down(gy2, (size_t)m * n);
        snprintf(what, sizeof what, "skinny bf16 m=%d n=%d k=%d vs fp64", m, n, k);
        expect_close(what, a, ref, (size_t)m * n, 4e-3);
        CHECKF(memcmp(a, b, (size_t)m * n * sizeof *a) == 0, "skinny m=%d n=%d k=%d: two runs differ", m, n, k);
        backend_cuda_gemm_cublas(g_gpu, 1);
        g_gpu->ops->matmul(g_gpu, gx, &w.g, NULL, m, gy2);
        backend_cuda_gemm_cublas(g_gpu, !g_opts.cuda_skinny);
        float *cb = g_down(gy2, (size_t)m * n);
        snprintf(what, sizeof what, "skinny bf16 m=%d n=%d k=%d vs cuBLAS", m, n, k);
        expect_close(what, a, cb, (size_t)m * n, 4e-3);
        free(x), free(wf), free(ref), free(a), free(b), free(cb);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gy), g_gpu->ops->act_free(g_gpu, gy2);
        pw_free(&w);
    }

    /* the split-K reduction itself: 1, 3 and 7 K ranges of one product, launched directly */
    {
        const int m = 20, n = 260, k = 1536;
        float *x = rnd((size_t)m * k, -1, 1);
        pw w;
        pw_make(&w, n, k, 0.05f);
        float *wf = w_floats(w.mem, (size_t)n * k), *ref = ref_mm(x, wf, m, n, k);
        void *gx = g_up(x, (size_t)m * k);
        const size_t ws_floats = (size_t)1 << 20;
        void *ws = g_gpu->ops->act_alloc(g_gpu, 2 * ws_floats), *cnt = g_gpu->ops->act_alloc(g_gpu, 2 * 64);
        backend_act_zero(g_gpu, cnt, 2 * 64);
        const int splits[] = {1, 3, 8};   /* 24 stages: 24, 8 and 3 per range */
        for (int i = 0; i < 3; i++) {
            void *gy = g_poisoned((size_t)m * n);
            backend_synchronize(g_gpu);
            umk_gemm_skinny_args a = {.x = gx, .m = m, .k = k, .n_prod = 1, .w = {w.g.data}, .y = {gy}, .n = {n},
                                      .epi = UMK_GEMM_STORE, .splits = splits[i], .n_sm = 4, .ws = ws,
                                      .ws_floats = ws_floats, .count = cnt, .n_count = 64};
            const int got = umk_gemm_skinny_splits(&a);
            CHECK(umk_gemm_skinny(&a, 0) == cudaSuccess);
            CHECK(cudaDeviceSynchronize() == cudaSuccess);
            float *y = g_down(gy, (size_t)m * n);
            snprintf(what, sizeof what, "skinny bf16 split-K %d ranges (%d asked) vs fp64", got, splits[i]);
            expect_close(what, y, ref, (size_t)m * n, 4e-3);
            CHECKF(got == splits[i], "skinny: %d K ranges asked, %d run", splits[i], got);
            free(y);
            g_gpu->ops->act_free(g_gpu, gy);
        }
        uint32_t counts[64];
        CHECK(cudaMemcpy(counts, cnt, sizeof counts, cudaMemcpyDeviceToHost) == cudaSuccess);
        int dirty = 0;
        for (int i = 0; i < 64; i++) dirty += counts[i] != 0;
        CHECKF(dirty == 0, "skinny: %d tile counts left non-zero after the launches", dirty);
        free(x), free(wf), free(ref);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, ws), g_gpu->ops->act_free(g_gpu, cnt);
        pw_free(&w);
    }

    /* backend_linear's epilogues in one launch vs the same op on cuBLAS + the single kernels */
    struct {
        const char *what;
        int n_w, epi, out[3];
    } ls[] = {{"q/k/v GQA shapes", 3, BLIN_STORE, {384, 128, 128}},
              {"o + residual add", 1, BLIN_ADD, {256, 0, 0}},
              {"gate/up + swiglu", 2, BLIN_SWIGLU, {704, 704, 0}}};
    const int in = 256;
    for (size_t c = 0; c < sizeof ls / sizeof ls[0]; c++)
        for (int mi = 0; mi < 2; mi++) {
            const int m = mi ? 32 : 5;
            float *x = rnd((size_t)m * in, -1, 1), *r0 = rnd((size_t)m * ls[c].out[0], -1, 1);
            pw w[3];
            for (int j = 0; j < ls[c].n_w; j++) pw_make(&w[j], ls[c].out[j], in, 0.05f);
            const int n_out = ls[c].epi == BLIN_STORE ? ls[c].n_w : 1;
            float *res[2][3];
            void *gx = g_up(x, (size_t)m * in), *gt = g_poisoned((size_t)m * ls[c].out[0]);
            for (int mode = 0; mode < 2; mode++) {
                blinear op = {.x = gx, .n = m, .epi = ls[c].epi, .n_w = ls[c].n_w, .tmp_y = gt};
                void *gy[3];
                for (int j = 0; j < ls[c].n_w; j++) op.w[j] = &w[j].g;
                for (int j = 0; j < n_out; j++)
                    op.y[j] = gy[j] = ls[c].epi == BLIN_ADD ? g_up(r0, (size_t)m * ls[c].out[0])
                                                            : g_poisoned((size_t)m * ls[c].out[j]);
                backend_cuda_gemm_cublas(g_gpu, mode);
                backend_linear(g_gpu, &op);
                backend_cuda_gemm_cublas(g_gpu, !g_opts.cuda_skinny);
                for (int j = 0; j < n_out; j++) {
                    res[mode][j] = g_down(gy[j], (size_t)m * ls[c].out[j]);
                    g_gpu->ops->act_free(g_gpu, gy[j]);
                }
            }
            for (int j = 0; j < n_out; j++) {
                snprintf(what, sizeof what, "skinny linear %s m=%d vs cuBLAS + single kernels, out %d", ls[c].what, m, j);
                expect_close(what, res[0][j], res[1][j], (size_t)m * ls[c].out[j], 1e-2);
                free(res[0][j]), free(res[1][j]);
            }
            free(x), free(r0);
            g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gt);
            for (int j = 0; j < ls[c].n_w; j++) pw_free(&w[j]);
        }

    {   /* the kernels' FP8 -> bf16 pair conversion for all 65536 byte pairs == the exact
         * conversion; E4M3's NaN codes (0x7f, 0xff) are not weights */
        void *gt = g_gpu->ops->act_alloc(g_gpu, 131072);   /* 65536 x 4 bytes */
        uint32_t *t = xmalloc(65536 * sizeof *t);
        CHECK(umk_fp8x2_table(gt, backend_cuda_stream(g_gpu)) == cudaSuccess);
        backend_cuda_sync(g_gpu);
        CHECK(cudaMemcpy(t, gt, 65536 * sizeof *t, cudaMemcpyDeviceToHost) == cudaSuccess);
        int bad = 0, first = -1;
        for (int v = 0; v < 65536; v++) {
            const int b[2] = {v & 0xff, v >> 8};
            for (int h = 0; h < 2; h++) {
                if ((b[h] & 0x7f) == 0x7f) continue;
                const uint16_t want = f32_to_bf16(fp8_e4m3_to_f32((uint8_t)b[h])), got = (uint16_t)(t[v] >> (16 * h));
                if (got != want && bad++ == 0) first = v;
            }
        }
        printf("  %-58s %s\n", "fp8 pairs -> bf16, all 65536", bad ? "DIFFER" : "equal");
        CHECKF(bad == 0, "fp8 pair conversion: %d of 131072 values differ, the first at bytes 0x%04x (got 0x%08x)", bad,
               first, first >= 0 ? t[first] : 0);
        free(t);
        g_gpu->ops->act_free(g_gpu, gt);
    }

    /* FP8 weights: per output channel (quantized on the device) and 128 x 128 blocks (as stored),
     * through the skinny kernel (<= 64 rows) and the dequantize + cuBLAS path (more rows) */
    struct {
        int blk, n, k;
    } fs[] = {{0, 300, 512}, {128, 300, 384}, {128, 256, 1024}};
    const int ms[] = {1, 16, 64, 100};
    for (size_t c = 0; c < sizeof fs / sizeof fs[0]; c++) {
        fp8w f;
        fp8w_make(&f, fs[c].n, fs[c].k, fs[c].blk);
        for (int mi = 0; mi < 4; mi++) {
            const int m = ms[mi], n = fs[c].n, k = fs[c].k;
            float *x = rnd((size_t)m * k, -1, 1), *ref = ref_mm(x, f.deq, m, n, k);
            void *gx = g_up(x, (size_t)m * k), *gy = g_poisoned((size_t)m * n);
            g_gpu->ops->matmul(g_gpu, gx, &f.g, NULL, m, gy);
            float *y = g_down(gy, (size_t)m * n);
            snprintf(what, sizeof what, "fp8 %s m=%d n=%d k=%d vs fp64", fs[c].blk ? "128x128 blocks" : "per channel",
                     m, n, k);
            expect_close(what, y, ref, (size_t)m * n, 4e-3);
            free(x), free(ref), free(y);
            g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gy);
        }
        fp8w_free(&f);
    }
    {   /* FP8 gate/up + SwiGLU in one launch vs fp64 of the rounded products */
        const int m = 12, n = 320, k = 256;
        fp8w g, u;
        fp8w_make(&g, n, k, 0);
        fp8w_make(&u, n, k, 0);
        float *x = rnd((size_t)m * k, -1, 1), *rg = ref_mm(x, g.deq, m, n, k), *ru = ref_mm(x, u.deq, m, n, k);
        for (size_t i = 0; i < (size_t)m * n; i++) {
            const float a = bfr(rg[i]), b = bfr(ru[i]);
            rg[i] = a / (1.0f + expf(-a)) * b;
        }
        void *gx = g_up(x, (size_t)m * k), *gy = g_poisoned((size_t)m * n), *gt = g_poisoned((size_t)m * n);
        blinear op = {.x = gx, .n = m, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&g.g, &u.g}, .y = {gy}, .tmp_y = gt};
        backend_linear(g_gpu, &op);
        float *y = g_down(gy, (size_t)m * n);
        expect_close("fp8 gate/up + swiglu m=12 vs fp64", y, rg, (size_t)m * n, 1e-2);
        free(x), free(rg), free(ru), free(y);
        g_gpu->ops->act_free(g_gpu, gx), g_gpu->ops->act_free(g_gpu, gy), g_gpu->ops->act_free(g_gpu, gt);
        fp8w_free(&g), fp8w_free(&u);
    }
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: gpu_parity [--quick | --emu] [--device cuda:N] [--tmp DIR] [--only NAME[,NAME...]] [--cublas]\n"
            "  --quick   small sizes (for compute-sanitizer)\n"
            "  --emu     --quick, the attention cases at full size (the CPU emulator)\n"
            "  --only    run only these sections (%s)\n"
            "            or, as \"SECTION CASE-START\", the cases of a section whose printed name starts so\n"
            "            (e.g. --only rope_kv,\"matmul n=1\"); exit 2 when nothing matched\n"
            "  --cublas  bf16 products of <= 64 rows on cuBLAS too (--cuda-skinny off; e.g. the racecheck repro:\n"
            "            --quick --cublas --only \"matmul n=1\" runs one cuBLAS product, docs/gpu.md)\n",
            SECTIONS);
}

int main(int argc, char **argv) {
    const char *device = "cuda:0", *tmp = getenv("UNMASK_TEST_TMP");
    const char *only = NULL;
    g_opts.cuda_skinny = 1;   /* the skinny kernel in the forward and decode sections too (not the server's default) */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--emu")) g_quick = g_emu = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--tmp") && i + 1 < argc) tmp = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--cublas")) g_opts.cuda_skinny = 0;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    char *names = only ? xstrdup(only) : NULL;   /* g_only points into it until exit */
    for (char *save = NULL, *t = names ? strtok_r(names, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save)) {
        if (g_n_only == MAX_ONLY) {
            fprintf(stderr, "gpu_parity: --only takes at most %d names\n", MAX_ONLY);
            return 2;
        }
        if (*t) g_only[g_n_only++] = t;
    }
    if (only && g_n_only == 0) {
        fprintf(stderr, "gpu_parity: --only needs a name (sections: %s)\n", SECTIONS);
        return 2;
    }
    if (!tmp) tmp = "/tmp";
    setvbuf(stdout, NULL, _IOLBF, 0);   /* progress stays visible when piped (ctest, scripts) */
    um_err err = {0};
    g_gpu = backend_cuda_init(device, &g_opts, &err);
    if (!g_gpu) {
        fprintf(stderr, "gpu_parity: %s\n", err.msg);
        return 1;
    }
    g_cpu = backend_cpu_init(0);
    printf("gpu_parity on %s (%s)%s%s%s\n", device, backend_cuda_device_name(g_gpu),
           g_emu ? ", emulator sizes" : g_quick ? ", quick" : "", g_n_only ? ", only " : "", g_n_only ? only : "");
    /* the sections in order (SECTIONS); a heading is printed before the first section under it */
    static const struct {
        const char *name, *heading;
        void (*run)(void);
    } secs[] = {{"embed", "ops", test_embed_getrows},  {"rmsnorm", "ops", test_rmsnorm},
                {"matmul", "ops", test_matmul},        {"linear", "ops", test_linear},
                {"skinny", "ops", test_skinny},
                {"rope", "ops", test_rope},            {"rope_kv", "ops", test_rope_kv},
                {"swiglu_add", "ops", test_swiglu_add}, {"add_rmsnorm", "ops", test_add_rmsnorm},
                {"moe", "moe", test_moe},              {"attention", "attention", test_attention},
                {"gumbel", "sampling", test_gumbel},   {"sample", "sampling", test_sample},
                {"decoders", "decoders", test_decoders}};
    const char *heading = NULL;
    for (size_t i = 0; i < sizeof secs / sizeof secs[0]; i++) {
        if (!section_on(secs[i].name)) continue;
        if (!heading || strcmp(heading, secs[i].heading) != 0) printf("%s:\n", heading = secs[i].heading);
        secs[i].run();
    }
    const int fwd = section_on("forward"), dec = section_on("decodes");
    if (fwd || dec) {
        model m1, m2;
        int ok1 = make_model(tmp, "parity_gqa_hd64", 256, g_quick ? 2 : 4, 4, 2, 704, &m1) == 0;
        if (fwd) {
            printf("forward:\n");
            if (ok1) test_forward(&m1, "demo-shaped GQA hd64");
            if (!g_quick && make_model(tmp, "parity_hd128", 512, 2, 4, 4, 1376, &m2) == 0) {
                test_forward(&m2, "hd128");
                model_free(&m2);
            }
        }
        if (ok1) {
            if (dec) {
                printf("decodes (temperature 0):\n");
                test_decodes(&m1);
            }
            model_free(&m1);
        }
    }
    backend_free(g_cpu);
    backend_free(g_gpu);
    printf("gpu_parity: %d checks, %d failed\n", g_checks, g_failed);
    if (g_checks == 0) {   /* a misspelt --only must not read as a clean run */
        fprintf(stderr, "gpu_parity: --only %s matched nothing (sections: %s)\n", only ? only : "", SECTIONS);
        free(names);
        return 2;
    }
    free(names);
    return g_failed ? 1 : 0;
}
