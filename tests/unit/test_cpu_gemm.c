/*
 * test_cpu_gemm.c — the CPU backend's bf16 GEMM layer (cpu_gemm.h) and its kernel paths, against
 * double-precision loops written here:
 *   - the branch-free f32 -> bf16 cast equals util/dtype.h's on specials and 2M random bit patterns;
 *   - packing puts every weight element where the documented layout says (odd shapes, zero padding);
 *   - per available path (avx2, avx512bf16, amx — a path this CPU lacks is skipped, saying why —
 *     and the AMX kernel on the software tile unit of amx_emu.h, wherever AVX512-BF16 runs):
 *     the raw kernel block for every row count 1..GEMM_MB and 1..4 groups; backend matmul (odd
 *     shapes, bias, misaligned weight data) and the fused linear op (q/k/v with RMSNorm, residual
 *     add, SwiGLU, the LM head) against references computed from the bf16-rounded inputs the
 *     kernels see (so the tolerance is fp32 accumulation, not bf16); a weight without a packed
 *     layout in the op falls back to the single ops; 1 and 2 threads give bit-identical results;
 *   - auto's dispatch by shape on an AVX2-only CPU (cpu_dispatch.c): avx2 up to the crossover, fp32
 *     above, seen both as bit-identity with the forced paths and against the double references.
 * Single thread driving each backend.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_internal.h"
#include "test.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"

/* cpu_gemm_amx.c compiled with UM_AMX_EMULATE into this test (tests/CMakeLists.txt) */
extern const cpu_gemm_kernel cpu_gemm_amx_emulated;
extern _Atomic long amx_emu_dp_total;

static uint64_t g_ctr;
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)rng_u01(7, 11, g_ctr++); }
static float bf(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* ---------------------------------------------------------------- cast and packing */

static void test_cast(void) {
    const uint32_t specials[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu,
                                 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu};
    int bad = 0;
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        bad += cpu_f32_to_bf16(cpu_bits_f32(specials[i])) != f32_to_bf16(cpu_bits_f32(specials[i]));
    for (uint64_t i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rng_u64(3, 5, i);
        bad += cpu_f32_to_bf16(cpu_bits_f32(u)) != f32_to_bf16(cpu_bits_f32(u));
    }
    TEST_CHECK(bad == 0, "%d values cast differently from util/dtype.h", bad);
}

static void test_pack(cpu_pool *pool) {
    const int64_t shapes[][2] = {{1, 1}, {17, 33}, {64, 32}, {100, 77}, {5, 200}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t R = shapes[s][0], C = shapes[s][1];
        uint16_t *w = xmalloc((size_t)(R * C) * sizeof *w);
        for (int64_t i = 0; i < R * C; i++) w[i] = (uint16_t)(i * 2654435761u >> 7);
        cpu_packed pw;
        cpu_packed_init(&pw, w, R, C, pool);
        const int64_t kp2 = pw.kpad / 2;
        int bad = pw.kpad % 32 != 0 || pw.kpad < C || pw.n_groups != (R + 15) / 16;
        for (int64_t g = 0; g < pw.n_groups; g++)
            for (int64_t kk = 0; kk < kp2; kk++)
                for (int r = 0; r < 16; r++)
                    for (int e = 0; e < 2; e++) {
                        int64_t row = 16 * g + r, col = 2 * kk + e;
                        uint16_t want = row < R && col < C ? w[row * C + col] : 0;
                        bad += pw.p[(g * kp2 + kk) * 32 + 2 * r + e] != want;
                    }
        TEST_CHECK(bad == 0, "pack %lldx%lld: %d misplaced elements", (long long)R, (long long)C, bad);
        cpu_packed_free(&pw);
        free(w);
    }
}

/* ---------------------------------------------------------------- one kernel path */

/* The raw block: c[i][16j+l] against a double dot product of the same bf16 values. */
static void test_block(const cpu_gemm_kernel *k, cpu_pool *pool) {
    const int64_t C = 300, R = 64;   /* 160 input pairs, 10 AMX k-steps */
    const int64_t kpad = 320;
    uint16_t *a = xcalloc((size_t)(GEMM_MB * kpad), sizeof *a), *w = xmalloc((size_t)(R * C) * sizeof *w);
    for (int i = 0; i < GEMM_MB; i++)
        for (int64_t c = 0; c < C; c++) a[i * kpad + c] = f32_to_bf16(urand(-1, 1));
    for (int64_t i = 0; i < R * C; i++) w[i] = f32_to_bf16(urand(-1, 1));
    cpu_packed pw;
    cpu_packed_init(&pw, w, R, C, pool);
    /* the activations in the family's type: bf16, or the same values as fp32 */
    float *af = xcalloc((size_t)(GEMM_MB * kpad), sizeof *af);
    for (int64_t i = 0; i < GEMM_MB * kpad; i++) af[i] = bf16_to_f32(a[i]);
    const void *act = k->act_f32 ? (const void *)af : (const void *)a;
    _Alignas(64) float c[GEMM_MB * 64];
    double worst = 0;
    int pf_runs = 0, pf_diff = 0;
    if (k->begin) k->begin();
    for (int m = 1; m <= GEMM_MB; m++)
        for (int ng = 1; ng <= 4; ng++) {
            const uint16_t *b[4];
            for (int j = 0; j < ng; j++) b[j] = pw.p + (int64_t)(3 - j) * kpad * 16;   /* groups in reverse */
            k->block(act, kpad, m, b, ng, kpad, c);
            if (k->block_pf) {   /* prefetching the next panel's groups changes nothing */
                _Alignas(64) float c2[GEMM_MB * 64];
                const uint16_t *next[4];
                for (int j = 0; j < 4; j++) next[j] = pw.p + (int64_t)j * kpad * 16;
                k->block_pf(act, kpad, m, b, ng, kpad, c2, next, 1 + (m + ng) % 4);
                for (int i = 0; i < m; i++)   /* columns 16 ng .. 63 are not written */
                    pf_diff += memcmp(c + i * 64, c2 + i * 64, (size_t)ng * 16 * sizeof *c) != 0;
                pf_runs++;
            }
            for (int i = 0; i < m; i++)
                for (int j = 0; j < ng; j++)
                    for (int l = 0; l < 16; l++) {
                        double acc = 0, mag = 0;
                        for (int64_t x = 0; x < C; x++) {
                            double p = (double)bf16_to_f32(a[i * kpad + x]) * bf16_to_f32(w[((3 - j) * 16 + l) * C + x]);
                            acc += p;
                            mag += fabs(p);
                        }
                        double e = fabs(c[i * 64 + 16 * j + l] - acc) / (mag + 1e-30);
                        if (e > worst) worst = e;
                    }
        }
    if (k->end) k->end();
    TEST_CHECK(worst < 1e-6, "%s block: worst relative error %.3e", k->name, worst);
    if (k->block_pf) TEST_CHECK(pf_runs > 0 && pf_diff == 0, "%s block_pf: %d rows of %d blocks differ from block", k->name, pf_diff, pf_runs);
    cpu_packed_free(&pw);
    free(a);
    free(af);
    free(w);
}

typedef struct tw {
    uint16_t *mem;    /* bf16 storage (+1 byte when misaligned) */
    float    *vals;   /* the bf16 values as floats */
    bweight   w;
} tw;

static void tw_make(backend *be, tw *t, int64_t rows, int64_t cols, int misalign) {
    size_t n = (size_t)(rows * cols);
    t->mem = xmalloc(n * 2 + 8);
    t->vals = xmalloc(n * sizeof *t->vals);
    uint8_t *base = (uint8_t *)t->mem + (misalign ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        uint16_t h = f32_to_bf16(urand(-1, 1));
        memcpy(base + 2 * i, &h, 2);
        t->vals[i] = bf16_to_f32(h);
    }
    bweight_src src = {.name = "test", .data = base, .type = DTYPE_BF16, .rows = rows, .cols = cols};
    um_err err = {0};
    TEST_CHECK(be->ops->weight_upload(be, &src, &t->w, &err) == 0, "upload: %s", err.msg);
}

static void tw_free(backend *be, tw *t) {
    be->ops->weight_free(be, &t->w);
    free(t->mem);
    free(t->vals);
}

/* worst |y - ref| / sum|terms| over n x R, ref = bias + bf16(x) . w^T in double (round_x 0: x . w^T,
 * what the fp32 path computes) */
static double matmul_err_r(const float *x, const tw *w, const float *bias, const float *y, int n, int round_x) {
    const int64_t R = w->w.rows, C = w->w.cols;
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < R; r++) {
            double acc = bias ? bias[r] : 0, mag = bias ? fabs(bias[r]) : 0;
            for (int64_t c = 0; c < C; c++) {
                double p = (double)(round_x ? bf(x[i * C + c]) : x[i * C + c]) * w->vals[r * C + c];
                acc += p;
                mag += fabs(p);
            }
            double e = fabs(y[i * R + r] - acc) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    return worst;
}

static double matmul_err(const float *x, const tw *w, const float *bias, const float *y, int n) {
    return matmul_err_r(x, w, bias, y, n, 1);
}

static void test_matmul(backend *be, const char *path) {
    static const int shapes[][3] = {{1, 1, 1}, {1, 300, 64}, {5, 7, 13}, {37, 333, 259}, {130, 97, 100},
                                    {3, 1031, 17}, {70, 16, 300}, {49, 200, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], R = shapes[s][1], C = shapes[s][2], with_bias = (int)s % 2, mis = s == 4;
        tw w, b;
        tw_make(be, &w, R, C, mis);
        if (with_bias) tw_make(be, &b, 1, R, 0);
        TEST_CHECK(cpu_weight_packed(&w.w) != NULL, "%s: a %dx%d bf16 weight is packed", path, R, C);
        float *x = be->ops->act_alloc(be, (size_t)n * C), *y = be->ops->act_alloc(be, (size_t)n * R);
        for (int64_t i = 0; i < (int64_t)n * C; i++) x[i] = urand(-1, 1);
        be->ops->matmul(be, x, &w.w, with_bias ? &b.w : NULL, n, y);
        double e = matmul_err(x, &w, with_bias ? b.vals : NULL, y, n);
        TEST_CHECK(e < 1e-5, "%s matmul n=%d R=%d C=%d bias=%d misalign=%d: worst %.3e", path, n, R, C, with_bias, mis, e);
        be->ops->act_free(be, x);
        be->ops->act_free(be, y);
        tw_free(be, &w);
        if (with_bias) tw_free(be, &b);
    }
}

/* h = bf16(RMSNorm(x, g)) in double, rounded as the kernels round it */
static void ref_norm(const float *x, const float *g, int n, int d, float eps, float *h) {
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int j = 0; j < d; j++) h[i * d + j] = bf((float)(g[j] * (x[i * d + j] * r)));
    }
}

/* max |a - b| / max |b| */
static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / (den + 1e-30);
}

/* product p[n, R] = h . w^T in double (h already bf16-rounded) */
static void ref_prod(const float *h, const tw *w, int n, double *p) {
    const int64_t R = w->w.rows, C = w->w.cols;
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < R; r++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) acc += (double)h[i * C + c] * w->vals[r * C + c];
            p[i * R + r] = acc;
        }
}

/* The fused linear op, each epilogue, against references from the same bf16 inputs. */
static void test_linear(backend *be, const char *path, int n, int d, int F) {
    tw q, k, g, u, dn, norm;
    tw_make(be, &q, d, d, 0);
    tw_make(be, &k, d / 2 + 3, d, 0);
    tw_make(be, &g, F, d, 0);
    tw_make(be, &u, F, d, 0);
    tw_make(be, &dn, d, F, 0);
    tw_make(be, &norm, 1, d, 0);
    const size_t nd = (size_t)n * d, nf = (size_t)n * F;
    float *x = be->ops->act_alloc(be, nd), *h = xmalloc(nd * sizeof *h), *yq = be->ops->act_alloc(be, nd);
    float *yk = be->ops->act_alloc(be, (size_t)n * k.w.rows), *ys = be->ops->act_alloc(be, nf);
    float *tmp = be->ops->act_alloc(be, nf + nd), *res = be->ops->act_alloc(be, nd);
    float *ref = xmalloc((nf + nd) * sizeof *ref);
    double *p = xmalloc((nf + nd) * sizeof *p), *p2 = xmalloc(nf * sizeof *p2);
    for (size_t i = 0; i < nd; i++) x[i] = urand(-2, 2);
    ref_norm(x, norm.vals, n, d, 1e-5f, h);

    blinear qk = {.x = x, .n = n, .norm = &norm.w, .eps = 1e-5f, .epi = BLIN_STORE, .n_w = 2, .w = {&q.w, &k.w},
                  .y = {yq, yk}, .tmp_h = tmp};
    backend_linear(be, &qk);
    ref_prod(h, &q, n, p);
    for (size_t i = 0; i < nd; i++) ref[i] = (float)p[i];
    double e1 = rel_diff(yq, ref, nd);
    ref_prod(h, &k, n, p);
    for (size_t i = 0; i < (size_t)n * k.w.rows; i++) ref[i] = (float)p[i];
    double e2 = rel_diff(yk, ref, (size_t)n * k.w.rows);
    TEST_CHECK(e1 < 2e-3 && e2 < 2e-3, "%s linear STORE x2 + RMSNorm n=%d d=%d: %.3e %.3e", path, n, d, e1, e2);

    blinear sw = {.x = x, .n = n, .norm = &norm.w, .eps = 1e-5f, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&g.w, &u.w},
                  .y = {ys}, .tmp_h = tmp, .tmp_y = tmp + nd};
    backend_linear(be, &sw);
    ref_prod(h, &g, n, p);
    ref_prod(h, &u, n, p2);
    for (size_t i = 0; i < nf; i++) ref[i] = (float)(p[i] / (1.0 + exp(-p[i])) * p2[i]);
    double e3 = rel_diff(ys, ref, nf);
    TEST_CHECK(e3 < 2e-3, "%s linear SWIGLU n=%d F=%d: %.3e", path, n, F, e3);

    for (size_t i = 0; i < nd; i++) res[i] = urand(-1, 1);
    memcpy(ref, res, nd * sizeof *ref);
    float *hs = xmalloc(nf * sizeof *hs);
    for (size_t i = 0; i < nf; i++) hs[i] = bf(ys[i]);
    ref_prod(hs, &dn, n, p);
    for (size_t i = 0; i < nd; i++) ref[i] = (float)(ref[i] + p[i]);
    blinear add = {.x = ys, .n = n, .epi = BLIN_ADD, .n_w = 1, .w = {&dn.w}, .y = {res}, .tmp_y = tmp};
    backend_linear(be, &add);
    double e4 = rel_diff(res, ref, nd);
    TEST_CHECK(e4 < 1e-5, "%s linear ADD n=%d F=%d: %.3e", path, n, F, e4);

    free(hs);
    free(ref);
    free(p);
    free(p2);
    free(h);
    be->ops->act_free(be, x);
    be->ops->act_free(be, yq);
    be->ops->act_free(be, yk);
    be->ops->act_free(be, ys);
    be->ops->act_free(be, tmp);
    be->ops->act_free(be, res);
    tw *all[] = {&q, &k, &g, &u, &dn, &norm};
    for (int i = 0; i < 6; i++) tw_free(be, all[i]);
}

/* A weight of the op without a packed layout (F32): the op runs as the single ops, fp32 products. */
static void test_linear_fallback(backend *be, const char *path) {
    const int n = 7, d = 40, R = 24;
    float *wv = xmalloc((size_t)R * d * sizeof *wv);
    for (int i = 0; i < R * d; i++) wv[i] = urand(-1, 1);
    bweight_src src = {.name = "f32", .data = wv, .type = DTYPE_F32, .rows = R, .cols = d};
    bweight w;
    um_err err = {0};
    TEST_CHECK(be->ops->weight_upload(be, &src, &w, &err) == 0, "upload f32");
    TEST_CHECK(cpu_weight_packed(&w) == NULL, "%s: an F32 weight is not packed", path);
    float *x = be->ops->act_alloc(be, (size_t)n * d), *y = be->ops->act_alloc(be, (size_t)n * R);
    for (int i = 0; i < n * d; i++) x[i] = urand(-1, 1);
    blinear op = {.x = x, .n = n, .epi = BLIN_STORE, .n_w = 1, .w = {&w}, .y = {y}};
    backend_linear(be, &op);
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < R; r++) {
            double acc = 0;
            for (int c = 0; c < d; c++) acc += (double)x[i * d + c] * wv[r * d + c];
            worst = fmax(worst, fabs(y[i * R + r] - acc));
        }
    TEST_CHECK(worst < 1e-5, "%s: F32 weight through linear: fp32 result, worst abs error %.3e", path, worst);
    be->ops->act_free(be, x);
    be->ops->act_free(be, y);
    be->ops->weight_free(be, &w);
    free(wv);
}

/* A backend on path kern, running kernel family gemm instead of the path's own when not NULL (the
 * emulated AMX kernel: the weights' packed layout is the same for every family). */
static backend *backend_with(enum backend_cpu_kernels kern, const cpu_gemm_kernel *gemm, int n_threads) {
    um_err err = {0};
    TEST_CHECK(backend_cpu_kernels_select(kern, &err) == 0, "select %s", backend_cpu_kernels_name(kern));
    backend *be = backend_cpu_init(n_threads);
    if (gemm) ((cpu_impl *)be->impl)->gemm = ((cpu_impl *)be->impl)->attn = gemm;
    return be;
}

/* The same fused SwiGLU op on 1 and on 2 threads: bit-identical. */
static void test_threads_identical(enum backend_cpu_kernels kern, const cpu_gemm_kernel *gemm, const char *path) {
    float *out[2];
    const int n = 61, d = 96, F = 160;
    for (int t = 0; t < 2; t++) {
        backend *be = backend_with(kern, gemm, t + 1);
        g_ctr = 1000;   /* the same weights and inputs for both */
        tw g, u;
        tw_make(be, &g, F, d, 0);
        tw_make(be, &u, F, d, 0);
        float *x = be->ops->act_alloc(be, (size_t)n * d), *tmp = be->ops->act_alloc(be, (size_t)n * F);
        out[t] = xmalloc((size_t)n * F * sizeof(float));
        for (int i = 0; i < n * d; i++) x[i] = urand(-1, 1);
        blinear op = {.x = x, .n = n, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&g.w, &u.w}, .y = {out[t]}, .tmp_y = tmp};
        backend_linear(be, &op);
        be->ops->act_free(be, x);
        be->ops->act_free(be, tmp);
        tw_free(be, &g);
        tw_free(be, &u);
        backend_free(be);
    }
    TEST_CHECK(memcmp(out[0], out[1], (size_t)n * F * sizeof(float)) == 0, "%s: 1 vs 2 threads differ", path);
    free(out[0]);
    free(out[1]);
}

/* ---------------------------------------------------------------- dispatch by shape */

/* One backend_linear (epi, with norm for STORE/SWIGLU) of n rows on backend be with fresh weights and
 * inputs drawn from seed: the outputs, [n, rows of the first weight] floats (malloc'd). */
static float *run_linear(backend *be, enum blinear_epi epi, int n, int d, int F, uint64_t seed) {
    g_ctr = seed;
    const int nw = epi == BLIN_SWIGLU ? 2 : 1, in = epi == BLIN_ADD ? F : d, out = epi == BLIN_ADD ? d : F;
    tw w[2], norm;
    for (int j = 0; j < nw; j++) tw_make(be, &w[j], out, in, 0);
    tw_make(be, &norm, 1, in, 0);
    float *x = be->ops->act_alloc(be, (size_t)n * in), *tmp = be->ops->act_alloc(be, (size_t)n * (in + out));
    float *y = xmalloc((size_t)n * out * sizeof *y);
    for (int64_t i = 0; i < (int64_t)n * in; i++) x[i] = urand(-1, 1);
    for (int64_t i = 0; i < (int64_t)n * out; i++) y[i] = urand(-1, 1);   /* the residual of ADD */
    blinear op = {.x = x, .n = n, .norm = epi == BLIN_ADD ? NULL : &norm.w, .eps = 1e-5f, .epi = epi, .n_w = nw,
                  .w = {&w[0].w, &w[1].w}, .y = {y}, .tmp_h = tmp, .tmp_y = tmp + (size_t)n * in};
    backend_linear(be, &op);
    be->ops->act_free(be, x);
    be->ops->act_free(be, tmp);
    for (int j = 0; j < nw; j++) tw_free(be, &w[j]);
    tw_free(be, &norm);
    return y;
}

/* The plan AUTO gets on an AVX2-only CPU (cpu_dispatch.c), built here on any CPU with AVX2: products
 * of up to gemm_max_m rows run on the AVX2 family and give exactly what --cpu-kernels avx2 gives,
 * products of more rows run on the fp32 path (on the packed weights) and give exactly what
 * --cpu-kernels fp32 gives (unpacked weights), for every epilogue. */
static void test_dispatch(void) {
    um_err err = {0};
    if (backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AVX2, &err) != 0) {
        printf("SKIP dispatch by shape: %s\n", err.msg);
        return;
    }
    backend *fp = backend_with(BACKEND_CPU_KERNELS_FP32, NULL, 2), *av = backend_with(BACKEND_CPU_KERNELS_AVX2, NULL, 2);
    backend *au = backend_with(BACKEND_CPU_KERNELS_FP32, NULL, 2);
    cpu_impl *ci = au->impl;
    cpu_dispatch_init(ci, BACKEND_CPU_KERNELS_AUTO, 1, cpu_qkernels_resolve());
    au->description = ci->description;
    const int64_t mx = ci->gemm_max_m;
    TEST_CHECK(backend_cpu_kernels_of(au) == BACKEND_CPU_KERNELS_AUTO && mx >= 1 && mx < 100000, "auto plan: max %lld rows",
               (long long)mx);
    TEST_CHECK(cpu_dispatch_gemm(ci, 1, 768, 768) == &cpu_gemm_avx2 && cpu_dispatch_gemm(ci, mx, 768, 768) == &cpu_gemm_avx2 &&
               cpu_dispatch_gemm(ci, mx + 1, 768, 768) == NULL, "auto: avx2 up to %lld rows, fp32 above", (long long)mx);
    TEST_CHECK(strstr(backend_description(au), "auto") != NULL, "description names the dispatch: %s", backend_description(au));
    const int ns[] = {1, 7, (int)mx, (int)mx + 1, (int)mx + 37};
    const enum blinear_epi epis[] = {BLIN_STORE, BLIN_ADD, BLIN_SWIGLU};
    int bad = 0, runs = 0;
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (int e = 0; e < 3; e++) {
            const int n = ns[i], d = 80, F = 144;
            const size_t cnt = (size_t)n * (epis[e] == BLIN_ADD ? d : F);
            float *ya = run_linear(au, epis[e], n, d, F, 500 + (uint64_t)i);
            float *yr = run_linear(n <= mx ? av : fp, epis[e], n, d, F, 500 + (uint64_t)i);
            const int same = memcmp(ya, yr, cnt * sizeof *ya) == 0;
            if (!same) printf("auto differs from %s: n=%d epilogue %d\n", n <= mx ? "avx2" : "fp32", n, (int)epis[e]);
            bad += !same;
            runs++;
            free(ya);
            free(yr);
        }
    TEST_CHECK(bad == 0, "auto: %d of %d ops differ from the path the dispatch names", bad, runs);
    /* a matmul the same way */
    for (int s = 0; s < 2; s++) {
        const int n = s ? (int)mx + 5 : 3, R = 70, C = 90;
        float *y[2];
        backend *bes[2] = {au, s ? fp : av};
        for (int b = 0; b < 2; b++) {
            g_ctr = 900;
            tw w;
            tw_make(bes[b], &w, R, C, 0);
            float *x = bes[b]->ops->act_alloc(bes[b], (size_t)n * C);
            y[b] = bes[b]->ops->act_alloc(bes[b], (size_t)n * R);
            for (int64_t i = 0; i < (int64_t)n * C; i++) x[i] = urand(-1, 1);
            bes[b]->ops->matmul(bes[b], x, &w.w, NULL, n, y[b]);
            bes[b]->ops->act_free(bes[b], x);
            tw_free(bes[b], &w);
        }
        TEST_CHECK(memcmp(y[0], y[1], (size_t)n * R * sizeof(float)) == 0, "auto matmul n=%d equals %s", n, s ? "fp32" : "avx2");
        au->ops->act_free(au, y[0]);
        bes[1]->ops->act_free(bes[1], y[1]);
    }
    /* from outside, against the double reference, on both sides of each crossover (odd sizes: rows
     * not a multiple of the AVX2 kernel's 5, 97 / 33 outputs, 259 / wide_k + 3 inputs): where the
     * dispatch names avx2, auto meets the reference of bf16-rounded activations at fp32 accumulation
     * and misses the unrounded one (the avx2 family ran); above, it meets the unrounded one (fp32
     * ran); forced avx2 meets the rounded reference at every row count */
    const int64_t mw = ci->gemm_max_m_wide, wk = ci->gemm_wide_k;
    TEST_CHECK(wk > 768 && wk < 100000 && mw >= mx && cpu_dispatch_gemm(ci, mw, 768, wk) == &cpu_gemm_avx2 &&
                   cpu_dispatch_gemm(ci, mw + 1, 768, wk) == NULL && cpu_dispatch_gemm(ci, mx + 1, 768, wk - 1) == NULL,
               "auto: avx2 up to %lld rows from %lld inputs", (long long)mw, (long long)wk);
    const int cases[][3] = {{1, 97, 259},  {4, 97, 259},       {7, 97, 259},           {13, 97, 259},
                            {(int)mx - 1, 97, 259}, {(int)mx, 97, 259}, {(int)mx + 1, 97, 259}, {(int)mx + 3, 97, 259},
                            {(int)mx + 1, 33, (int)wk + 3}, {(int)mw, 33, (int)wk + 3}, {(int)mw + 1, 33, (int)wk + 3}};
    for (size_t s = 0; s < sizeof cases / sizeof cases[0]; s++) {
        const int n = cases[s][0], R = cases[s][1], C = cases[s][2];
        const int64_t lim = C >= wk ? mw : mx;
        if (n < 1) continue;
        backend *bes[2] = {au, av};
        for (int b = 0; b < 2; b++) {
            g_ctr = 1300 + (uint64_t)s;
            tw w;
            tw_make(bes[b], &w, R, C, 0);
            float *x = bes[b]->ops->act_alloc(bes[b], (size_t)n * C), *y = bes[b]->ops->act_alloc(bes[b], (size_t)n * R);
            for (int64_t i = 0; i < (int64_t)n * C; i++) x[i] = urand(-1, 1);
            bes[b]->ops->matmul(bes[b], x, &w.w, NULL, n, y);
            const double er = matmul_err_r(x, &w, NULL, y, n, 1), eu = matmul_err_r(x, &w, NULL, y, n, 0);
            if (b == 1)
                TEST_CHECK(er < 1e-5, "forced avx2 n=%d R=%d C=%d: worst %.3e against bf16(x) . w", n, R, C, er);
            else if (n <= lim)
                TEST_CHECK(er < 1e-5 && eu > 1e-5,
                           "auto n=%d <= %lld (C=%d) runs avx2: %.3e against bf16(x) . w, %.3e against x . w", n,
                           (long long)lim, C, er, eu);
            else
                TEST_CHECK(eu < 1e-5, "auto n=%d > %lld (C=%d) runs fp32: %.3e against x . w", n, (long long)lim, C, eu);
            bes[b]->ops->act_free(bes[b], x);
            bes[b]->ops->act_free(bes[b], y);
            tw_free(bes[b], &w);
        }
    }
    backend_free(fp);
    backend_free(av);
    backend_free(au);
    printf("ran dispatch by shape (avx2 up to %lld rows, %lld from %lld inputs, fp32 above)\n", (long long)mx,
           (long long)mw, (long long)wk);
}

/* Every check on path kern; with gemm, on that kernel family instead of the path's own. */
static void test_path(enum backend_cpu_kernels kern, const cpu_gemm_kernel *gemm) {
    const char *path = gemm ? gemm->name : backend_cpu_kernels_name(kern);
    um_err err = {0};
    if (backend_cpu_kernels_select(kern, &err) != 0) {
        printf("SKIP %s: %s\n", path, err.msg);
        return;
    }
    backend *be = backend_with(kern, gemm, 2);
    TEST_CHECK(backend_cpu_kernels_of(be) == kern, "%s: backend runs %s", path,
               backend_cpu_kernels_name(backend_cpu_kernels_of(be)));
    const cpu_impl *ci = be->impl;
    test_block(ci->gemm, ci->pool);
    test_matmul(be, path);
    test_linear(be, path, 1, 64, 96);
    test_linear(be, path, 50, 96, 160);
    test_linear(be, path, 131, 128, 200);
    test_linear_fallback(be, path);
    backend_free(be);
    test_threads_identical(kern, gemm, path);
    printf("ran %s\n", path);
}

int main(void) {
    test_cast();
    cpu_pool *pool = cpu_pool_init(2, 0);
    test_pack(pool);
    cpu_pool_free(pool);
    test_path(BACKEND_CPU_KERNELS_AVX2, NULL);
    test_dispatch();
    test_path(BACKEND_CPU_KERNELS_AVX512BF16, NULL);
    test_path(BACKEND_CPU_KERNELS_AMX, NULL);
    /* the AMX kernel on emulated tiles (blocks under 16 rows are its AVX512-BF16 fallback) */
    um_err err = {0};
    test_path(BACKEND_CPU_KERNELS_AVX512BF16, &cpu_gemm_amx_emulated);
    if (backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AVX512BF16, &err) == 0)
        TEST_CHECK(amx_emu_dp_total > 0, "the emulated tiles ran (%ld TDPBF16PS)", (long)amx_emu_dp_total);
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_FP32, &err) == 0, "fp32 is always available");
    return test_report();
}
