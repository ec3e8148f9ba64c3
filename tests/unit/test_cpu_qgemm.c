/*
 * test_cpu_qgemm.c — the CPU backend's quantized GEMM layer (cpu_qgemm.h) and its kernel families,
 * against references written here:
 *   - packing: the packed bytes sit where the documented layout says (written out here, not through
 *     the layer's address helpers); a float source packs the bytes util/quant.h quantizes (bf16, f32,
 *     f16 sources, columns padded to 32); a Q8_0 / Q4_0 source (GGUF rows) packs back to itself;
 *   - activation quantization: cpu_act_to_q8 equals this file's reading of the rule (rint(x / d),
 *     d = max|x| / 127, the block sums), and with RMSNorm agrees with a double RMSNorm;
 *   - the scalar family against double dot products of the same quantized values, for both types;
 *   - every other family (avx2, avxvnni, avx512vnni; one this CPU lacks is skipped, saying why)
 *     equal to the scalar family bit for bit: the raw block for every row count 1..GEMM_MB and 1..4
 *     groups, and the backend's matmul (odd shapes, bias) and fused linear op (q/k with RMSNorm,
 *     SwiGLU, residual add) — which are also checked against double references;
 *   - 1 vs 2 threads bit-identical; a gathered quantized embedding row equals its dequantization;
 *     backend_weight_keeps_source says 0 for a quantized matrix and 1 for a view.
 * Single thread driving each backend.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_qgemm.h"
#include "test.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/quant.h"
#include "util/rng.h"

static uint64_t g_ctr;
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)rng_u01(5, 17, g_ctr++); }

static const enum dtype k_types[] = {DTYPE_Q8_0, DTYPE_Q4_0};
static const char *tname(enum dtype t) { return dtype_name(t); }

/* ---------------------------------------------------------------- packing */

/* Where the documented layout puts block b's scale of row r and quant k (cpu_qgemm.h). */
static size_t doc_pair_bytes(enum dtype t) { return 64 + 2 * (t == DTYPE_Q8_0 ? 512 : 256); }
static size_t doc_d_at(enum dtype t, int64_t gbytes, int64_t r, int64_t b) {
    return (size_t)((r / 16) * gbytes) + (size_t)(b / 2) * doc_pair_bytes(t) + (size_t)(b % 2) * 32 + (size_t)(r % 16) * 2;
}
static size_t doc_qs_at(enum dtype t, int64_t gbytes, int64_t r, int64_t b, int k /* Q8_0: input; Q4_0: byte */) {
    const size_t qb = t == DTYPE_Q8_0 ? 512 : 256;
    return (size_t)((r / 16) * gbytes) + (size_t)(b / 2) * doc_pair_bytes(t) + 64 + (size_t)(b % 2) * qb +
           (size_t)(k / 4) * 64 + (size_t)(r % 16) * 4 + (size_t)(k % 4);
}

static void test_pack(cpu_pool *pool) {
    const int64_t shapes[][2] = {{1, 32}, {17, 64}, {33, 96}, {5, 200}, {40, 7}};
    const enum dtype srcs[] = {DTYPE_BF16, DTYPE_F32, DTYPE_F16};
    for (size_t ti = 0; ti < 2; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t si = 0; si < 3; si++) {
                const enum dtype t = k_types[ti], st = srcs[si];
                const int64_t R = shapes[s][0], C = shapes[s][1], kpad = (C + 31) / 32 * 32, nb = kpad / 32;
                const size_t bb = dtype_row_bytes(t, 32);
                uint8_t *src = xmalloc((size_t)(R * C) * 4);
                float *row = xcalloc((size_t)kpad, sizeof *row);
                uint8_t *want = xmalloc((size_t)nb * bb), *got = xmalloc((size_t)nb * bb);
                for (int64_t i = 0; i < R * C; i++) {
                    const float v = urand(-2, 2) * (i % 97 == 0 ? 0.0f : 1.0f);
                    if (st == DTYPE_BF16) ((uint16_t *)src)[i] = f32_to_bf16(v);
                    else if (st == DTYPE_F16) ((uint16_t *)src)[i] = f32_to_f16(v);
                    else ((float *)src)[i] = v;
                }
                cpu_qpacked w;
                cpu_qpacked_init(&w, t, src, st, R, C, pool);
                int bad = w.kpad != kpad || w.nb != nb || w.n_groups != (R + 15) / 16, bad_layout = 0;
                for (int64_t r = 0; r < R; r++) {
                    dtype_to_f32(st, src + (size_t)(r * C) * dtype_size(st), row, (size_t)C);
                    quant_row_quantize(t, row, want, kpad);
                    cpu_qpacked_row(&w, r, got);
                    bad += memcmp(want, got, (size_t)nb * bb) != 0;
                    for (int64_t b = 0; b < nb; b++) {   /* the documented byte positions */
                        const uint8_t *blk = want + b * (int64_t)bb;
                        bad_layout += memcmp(w.p + doc_d_at(t, w.gbytes, r, b), blk, 2) != 0;
                        for (int k = 0; k < (t == DTYPE_Q8_0 ? 32 : 16); k++)
                            bad_layout += w.p[doc_qs_at(t, w.gbytes, r, b, k)] != blk[2 + k];
                    }
                }
                TEST_CHECK(bad == 0 && bad_layout == 0, "pack %s from %s %lldx%lld: %d rows differ, %d bytes misplaced",
                           tname(t), dtype_name(st), (long long)R, (long long)C, bad, bad_layout);
                cpu_qpacked_free(&w);
                free(src);
                free(row);
                free(want);
                free(got);
            }
    /* a quantized source (GGUF rows) is repacked as it is */
    for (size_t ti = 0; ti < 2; ti++) {
        const enum dtype t = k_types[ti];
        const int64_t R = 21, C = 160, nb = C / 32;
        const size_t rb = dtype_row_bytes(t, C);
        uint8_t *blocks = xmalloc((size_t)R * rb), *got = xmalloc(rb);
        float *row = xmalloc((size_t)C * sizeof *row);
        for (int64_t r = 0; r < R; r++) {
            for (int64_t c = 0; c < C; c++) row[c] = urand(-1, 1);
            quant_row_quantize(t, row, blocks + r * (int64_t)rb, C);
        }
        cpu_qpacked w;
        cpu_qpacked_init(&w, t, blocks, t, R, C, pool);
        int bad = w.nb != nb;
        for (int64_t r = 0; r < R; r++) {
            cpu_qpacked_row(&w, r, got);
            bad += memcmp(got, blocks + r * (int64_t)rb, rb) != 0;
        }
        TEST_CHECK(bad == 0, "repack of %s rows: %d differ", tname(t), bad);
        cpu_qpacked_free(&w);
        free(blocks);
        free(got);
        free(row);
    }
}

/* ---------------------------------------------------------------- activations */

/* This file's reading of the activation rule (cpu_qgemm.h) for one block of 32 values. */
static void spec_block(const float *v, int8_t *q, float *d, int32_t *s) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
        q[j] = (int8_t)rintf(v[j] * id);
        sum += q[j];
    }
    *d = dd;
    *s = sum;
}

static void test_act(cpu_pool *pool) {
    const int64_t n = 37, C = 300, kpad = 320, nb = 10;
    float *x = xmalloc((size_t)(n * C) * sizeof *x), v[32];
    for (int64_t i = 0; i < n * C; i++) x[i] = urand(-3, 3) * (i % 50 == 0 ? 40.0f : 1.0f);
    for (int64_t j = 0; j < C; j++) x[5 * C + j] = 0.0f;   /* an all-zero row: scale 0, quants 0 */
    void *buf = xmalloc(cpu_qact_bytes(n, kpad));
    cpu_qact a;
    cpu_act_to_q8(pool, x, n, C, kpad, NULL, 0, buf, &a);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < nb; b++) {
            for (int j = 0; j < 32; j++) v[j] = 32 * b + j < C ? x[i * C + 32 * b + j] : 0.0f;
            int8_t q[32];
            float d;
            int32_t s;
            spec_block(v, q, &d, &s);
            bad += memcmp(q, a.q + i * kpad + 32 * b, 32) != 0 || d != a.d[i * nb + b] || s != a.s[i * nb + b];
        }
    TEST_CHECK(bad == 0, "activation quantization: %d blocks differ from the rule", bad);

    /* with RMSNorm: the dequantized row is the double RMSNorm within half a quant step */
    float *g = xmalloc((size_t)C * sizeof *g);
    for (int64_t j = 0; j < C; j++) g[j] = urand(0.5f, 1.5f);
    bweight norm = {.data = g, .type = DTYPE_F32, .rows = 1, .cols = C};
    cpu_act_to_q8(pool, x, n, C, kpad, &norm, 1e-5f, buf, &a);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double ss = 0;
        for (int64_t j = 0; j < C; j++) ss += (double)x[i * C + j] * x[i * C + j];
        const double r = 1.0 / sqrt(ss / C + 1e-5);
        for (int64_t j = 0; j < C; j++) {
            const double want = g[j] * x[i * C + j] * r, d = a.d[i * nb + j / 32];
            const double e = fabs(a.q[i * kpad + j] * d - want) / (d > 0 ? d : 1);
            worst = fmax(worst, e);
        }
    }
    TEST_CHECK(worst <= 0.5001, "activation quantization with RMSNorm: worst error %.4f quant steps", worst);
    free(g);
    free(x);
    free(buf);
}

/* ---------------------------------------------------------------- kernels */

/* The families, with why one cannot run here. */
static const enum cpu_qkernels k_fams[] = {CPU_QKERNELS_SCALAR, CPU_QKERNELS_AVX2, CPU_QKERNELS_AVXVNNI,
                                           CPU_QKERNELS_AVX512VNNI};

/* Double reference of c[i][16 j + l] from the packed weight's rows and the quantized activations. */
static double ref_dot(const cpu_qpacked *w, const cpu_qact *a, int64_t i, int64_t r, double *mag) {
    uint8_t *blocks = xmalloc(dtype_row_bytes(w->type, w->kpad));
    float *wv = xmalloc((size_t)w->kpad * sizeof *wv);
    cpu_qpacked_row(w, r, blocks);
    quant_row_dequantize(w->type, blocks, wv, w->kpad);
    double acc = 0;
    *mag = 0;
    for (int64_t k = 0; k < w->kpad; k++) {
        const double p = (double)wv[k] * a->q[i * a->kpad + k] * a->d[i * a->nb + k / 32];
        acc += p;
        *mag += fabs(p);
    }
    free(blocks);
    free(wv);
    return acc;
}

static void test_blocks(cpu_pool *pool) {
    const int64_t C = 352, R = 64, kpad = 352, nb = 11;   /* an odd number of blocks: a lone last pair */
    float *wf = xmalloc((size_t)(R * C) * sizeof *wf), *x = xmalloc((size_t)(GEMM_MB * C) * sizeof *x);
    for (int64_t i = 0; i < R * C; i++) wf[i] = urand(-1, 1);
    for (int64_t i = 0; i < GEMM_MB * C; i++) x[i] = urand(-2, 2);
    void *buf = xmalloc(cpu_qact_bytes(GEMM_MB, kpad));
    cpu_qact a;
    cpu_act_to_q8(pool, x, GEMM_MB, C, kpad, NULL, 0, buf, &a);
    TEST_CHECK(a.nb == nb, "blocks per row");
    for (size_t ti = 0; ti < 2; ti++) {
        const enum dtype t = k_types[ti];
        cpu_qpacked w;
        cpu_qpacked_init(&w, t, wf, DTYPE_F32, R, C, pool);
        _Alignas(64) float c0[GEMM_MB * 64], c1[GEMM_MB * 64];
        /* the scalar family against double */
        double worst = 0;
        for (int m = 1; m <= GEMM_MB; m += 7) {
            const uint8_t *b[4];
            for (int j = 0; j < 4; j++) b[j] = w.p + (3 - j) * w.gbytes;   /* groups in reverse */
            cpu_qgemm_scalar.block(t, &a, 0, m, b, 4, c0);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < 4; j++)
                    for (int l = 0; l < 16; l++) {
                        double mag;
                        const double want = ref_dot(&w, &a, i, (3 - j) * 16 + l, &mag);
                        worst = fmax(worst, fabs(c0[i * 64 + 16 * j + l] - want) / (mag + 1e-30));
                    }
        }
        TEST_CHECK(worst < 1e-5, "scalar %s block vs double: worst relative error %.3e", tname(t), worst);
        /* every family equals the scalar one */
        for (size_t f = 1; f < sizeof k_fams / sizeof k_fams[0]; f++) {
            um_err err = {0};
            if (cpu_qkernels_select(k_fams[f], &err) != 0) {
                printf("SKIP %s blocks: %s\n", cpu_qkernels_name(k_fams[f]), err.msg);
                continue;
            }
            const cpu_qgemm_kernel *k = cpu_qkernels_family(k_fams[f]);
            int diff = 0, runs = 0;
            for (int m = 1; m <= GEMM_MB; m++)
                for (int ng = 1; ng <= 4; ng++) {
                    const uint8_t *b[4];
                    for (int j = 0; j < ng; j++) b[j] = w.p + (int64_t)((j + m) % 4) * w.gbytes;
                    const int64_t i0 = m < GEMM_MB ? (GEMM_MB - m) / 2 : 0;   /* rows not at the buffer's start */
                    cpu_qgemm_scalar.block(t, &a, i0, m, b, ng, c0);
                    memset(c1, 0xff, sizeof c1);
                    k->block(t, &a, i0, m, b, ng, c1);
                    for (int i = 0; i < m; i++) diff += memcmp(c0 + i * 64, c1 + i * 64, (size_t)ng * 16 * sizeof(float)) != 0;
                    runs++;
                }
            TEST_CHECK(diff == 0, "%s %s block: %d rows of %d blocks differ from scalar", k->name, tname(t), diff, runs);
            printf("ran %s %s blocks\n", k->name, tname(t));
        }
        cpu_qpacked_free(&w);
    }
    um_err err = {0};
    TEST_CHECK(cpu_qkernels_select(CPU_QKERNELS_AUTO, &err) == 0, "auto");
    free(wf);
    free(x);
    free(buf);
}

/* ---------------------------------------------------------------- through the backend */

typedef struct qw {
    float  *vals;   /* [rows, cols] source values (bf16-rounded) */
    bweight w;
} qw;

static void qw_make(backend *be, qw *t, int64_t rows, int64_t cols, enum dtype quant) {
    const size_t n = (size_t)(rows * cols);
    uint16_t *mem = xmalloc(n * 2);
    t->vals = xmalloc(n * sizeof *t->vals);
    for (size_t i = 0; i < n; i++) {
        mem[i] = f32_to_bf16(urand(-1, 1));
        t->vals[i] = bf16_to_f32(mem[i]);
    }
    bweight_src src = {.name = "test", .data = mem, .type = DTYPE_BF16, .rows = rows, .cols = cols, .quant = quant};
    um_err err = {0};
    TEST_CHECK(backend_weight_upload(be, &src, &t->w, &err) == 0, "upload: %s", err.msg);
    if (dtype_is_quant(quant)) {
        TEST_CHECK(cpu_weight_qpacked(&t->w) && t->w.type == quant, "a %s matrix is quantized", dtype_name(quant));
        TEST_CHECK(backend_weight_keeps_source(be, &t->w) == 0, "a quantized matrix does not keep its source");
        memset(mem, 0xff, n * 2);   /* the source is not read again */
    }
    free(mem);
}

static void qw_free(backend *be, qw *t) {
    backend_weight_free(be, &t->w);
    free(t->vals);
}

/* p[n, R] = sum over blocks of the quantized activations x the packed weight, in double */
static void ref_prod(const qw *w, const cpu_qact *a, int n, double *p) {
    const cpu_qpacked *pw = cpu_weight_qpacked(&w->w);
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < pw->rows; r++) {
            double mag;
            p[i * pw->rows + r] = ref_dot(pw, a, i, r, &mag);
        }
}

static double rel_diff(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return num / (den + 1e-30);
}

/* The backend's results of one family: matmuls and every fused epilogue, written to out (appended);
 * each checked against double references. Returns the floats written. */
static size_t run_ops(backend *be, enum dtype t, float *out, const char *fam) {
    cpu_impl *ci = be->impl;
    size_t o = 0;
    static const int shapes[][3] = {{1, 1, 32}, {5, 7, 13}, {37, 333, 259}, {3, 1031, 17}, {70, 16, 300}, {49, 200, 96}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], R = shapes[s][1], C = shapes[s][2], with_bias = (int)s % 2;
        g_ctr = 100 * s;
        qw w;
        qw_make(be, &w, R, C, t);
        float *bias = xmalloc((size_t)R * sizeof *bias);
        for (int r = 0; r < R; r++) bias[r] = urand(-1, 1);
        bweight bw = {.data = bias, .type = DTYPE_F32, .rows = 1, .cols = R};
        float *x = backend_act_alloc(be, (size_t)n * C), *y = backend_act_alloc(be, (size_t)n * R);
        for (int64_t i = 0; i < (int64_t)n * C; i++) x[i] = urand(-1, 1);
        backend_matmul(be, x, &w.w, with_bias ? &bw : NULL, n, y);
        const cpu_qpacked *pw = cpu_weight_qpacked(&w.w);
        cpu_qact a;
        void *buf = xmalloc(cpu_qact_bytes(n, pw->kpad));
        cpu_act_to_q8(ci->pool, x, n, C, pw->kpad, NULL, 0, buf, &a);
        double *p = xmalloc((size_t)n * R * sizeof *p);
        ref_prod(&w, &a, n, p);
        if (with_bias)
            for (int i = 0; i < n; i++)
                for (int r = 0; r < R; r++) p[i * R + r] += bias[r];
        const double e = rel_diff(y, p, (size_t)n * R);
        TEST_CHECK(e < 1e-5, "%s %s matmul n=%d R=%d C=%d bias=%d: %.3e", fam, tname(t), n, R, C, with_bias, e);
        memcpy(out + o, y, (size_t)n * R * sizeof *y);
        o += (size_t)n * R;
        free(p);
        free(buf);
        free(bias);
        backend_act_free(be, x);
        backend_act_free(be, y);
        qw_free(be, &w);
    }

    /* the fused op: q/k with RMSNorm, SwiGLU with RMSNorm, residual add */
    const int n = 53, d = 96, F = 160;
    g_ctr = 7000;
    qw q, k, g, u, dn;
    qw_make(be, &q, d, d, t);
    qw_make(be, &k, d / 2 + 3, d, t);
    qw_make(be, &g, F, d, t);
    qw_make(be, &u, F, d, t);
    qw_make(be, &dn, d, F, t);
    float *nw = xmalloc((size_t)d * sizeof *nw);
    for (int j = 0; j < d; j++) nw[j] = urand(0.5f, 1.5f);
    bweight norm = {.data = nw, .type = DTYPE_F32, .rows = 1, .cols = d};
    const size_t nd = (size_t)n * d, nf = (size_t)n * F;
    float *x = backend_act_alloc(be, nd), *yq = backend_act_alloc(be, nd), *yk = backend_act_alloc(be, (size_t)n * k.w.rows);
    float *ys = backend_act_alloc(be, nf), *res = backend_act_alloc(be, nd), *tmp = backend_act_alloc(be, nf + nd);
    for (size_t i = 0; i < nd; i++) x[i] = urand(-2, 2);
    for (size_t i = 0; i < nd; i++) res[i] = urand(-1, 1);
    double *p = xmalloc((nf + nd) * sizeof *p), *p2 = xmalloc(nf * sizeof *p2);
    void *buf = xmalloc(cpu_qact_bytes(n, 160));
    cpu_qact a;
    cpu_act_to_q8(ci->pool, x, n, d, 96, &norm, 1e-5f, buf, &a);   /* what the op quantizes */

    blinear qk = {.x = x, .n = n, .norm = &norm, .eps = 1e-5f, .epi = BLIN_STORE, .n_w = 2, .w = {&q.w, &k.w},
                  .y = {yq, yk}, .tmp_h = tmp};
    backend_linear(be, &qk);
    ref_prod(&q, &a, n, p);
    const double e1 = rel_diff(yq, p, nd);
    ref_prod(&k, &a, n, p);
    const double e2 = rel_diff(yk, p, (size_t)n * k.w.rows);
    TEST_CHECK(e1 < 1e-5 && e2 < 1e-5, "%s %s linear STORE x2 + RMSNorm: %.3e %.3e", fam, tname(t), e1, e2);

    blinear sw = {.x = x, .n = n, .norm = &norm, .eps = 1e-5f, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&g.w, &u.w},
                  .y = {ys}, .tmp_h = tmp, .tmp_y = tmp + nd};
    backend_linear(be, &sw);
    ref_prod(&g, &a, n, p);
    ref_prod(&u, &a, n, p2);
    for (size_t i = 0; i < nf; i++) p[i] = p[i] / (1.0 + exp(-p[i])) * p2[i];
    const double e3 = rel_diff(ys, p, nf);
    TEST_CHECK(e3 < 1e-5, "%s %s linear SWIGLU: %.3e", fam, tname(t), e3);

    cpu_act_to_q8(ci->pool, ys, n, F, 160, NULL, 0, buf, &a);
    ref_prod(&dn, &a, n, p);
    for (size_t i = 0; i < nd; i++) p[i] += res[i];
    blinear add = {.x = ys, .n = n, .epi = BLIN_ADD, .n_w = 1, .w = {&dn.w}, .y = {res}, .tmp_y = tmp};
    backend_linear(be, &add);
    const double e4 = rel_diff(res, p, nd);
    TEST_CHECK(e4 < 1e-5, "%s %s linear ADD: %.3e", fam, tname(t), e4);

    float *all[] = {yq, yk, ys, res};
    size_t cnt[] = {nd, (size_t)n * k.w.rows, nf, nd};
    for (int i = 0; i < 4; i++) {
        memcpy(out + o, all[i], cnt[i] * sizeof(float));
        o += cnt[i];
    }
    free(p);
    free(p2);
    free(buf);
    free(nw);
    float *bufs[] = {x, yq, yk, ys, res, tmp};
    for (int i = 0; i < 6; i++) backend_act_free(be, bufs[i]);
    qw *ws[] = {&q, &k, &g, &u, &dn};
    for (int i = 0; i < 5; i++) qw_free(be, ws[i]);
    return o;
}

#define OUT_CAP (1u << 20)

static void test_backend_families(void) {
    for (size_t ti = 0; ti < 2; ti++) {
        const enum dtype t = k_types[ti];
        float *ref = xmalloc(OUT_CAP * sizeof(float)), *got = xmalloc(OUT_CAP * sizeof(float));
        size_t n_ref = 0;
        for (size_t f = 0; f < sizeof k_fams / sizeof k_fams[0]; f++) {
            um_err err = {0};
            if (cpu_qkernels_select(k_fams[f], &err) != 0) {
                printf("SKIP %s ops: %s\n", cpu_qkernels_name(k_fams[f]), err.msg);
                continue;
            }
            for (int threads = 1; threads <= 2; threads++) {
                if (f > 0 && threads == 1) continue;   /* threads are compared on the scalar family */
                backend *be = backend_cpu_init(threads);
                TEST_CHECK(((cpu_impl *)be->impl)->qgemm == cpu_qkernels_family(k_fams[f]), "backend runs %s",
                           cpu_qkernels_name(k_fams[f]));
                float *dst = n_ref ? got : ref;
                const size_t n = run_ops(be, t, dst, cpu_qkernels_name(k_fams[f]));
                CHECK(n <= OUT_CAP);
                if (!n_ref) {
                    n_ref = n;
                } else {
                    TEST_CHECK(n == n_ref && memcmp(ref, got, n * sizeof(float)) == 0,
                               "%s %s, %d threads: results differ from scalar on 1 thread", cpu_qkernels_name(k_fams[f]),
                               tname(t), threads);
                }
                backend_free(be);
            }
        }
        free(ref);
        free(got);
    }
    um_err err = {0};
    TEST_CHECK(cpu_qkernels_select(CPU_QKERNELS_AUTO, &err) == 0, "auto");
}

/* A gather-only quantized source (a GGUF embedding) stays a view; its rows are dequantized. A float
 * weight uploaded without quant keeps its source (fp32 path view). */
static void test_embed_and_views(void) {
    backend *be = backend_cpu_init(2);
    for (size_t ti = 0; ti < 2; ti++) {
        const enum dtype t = k_types[ti];
        const int64_t V = 40, d = 96;
        const size_t rb = dtype_row_bytes(t, d);
        uint8_t *blocks = xmalloc((size_t)V * rb);
        float *row = xmalloc((size_t)d * sizeof *row), *want = xmalloc((size_t)d * sizeof *want);
        for (int64_t r = 0; r < V; r++) {
            for (int64_t c = 0; c < d; c++) row[c] = urand(-1, 1);
            quant_row_quantize(t, row, blocks + r * (int64_t)rb, d);
        }
        bweight_src src = {.name = "wte", .data = blocks, .type = t, .rows = V, .cols = d, .rows_only = 1};
        bweight w;
        um_err err = {0};
        TEST_CHECK(backend_weight_upload(be, &src, &w, &err) == 0, "upload %s embedding", tname(t));
        TEST_CHECK(backend_weight_keeps_source(be, &w) == 1 && !cpu_weight_qpacked(&w), "a gathered %s table is a view",
                   tname(t));
        const int32_t ids[3] = {7, 0, 39};
        float *out = backend_act_alloc(be, 3 * (size_t)d);
        backend_embed(be, &w, ids, 3, out);
        int bad = 0;
        for (int i = 0; i < 3; i++) {
            quant_row_dequantize(t, blocks + ids[i] * (int64_t)rb, want, d);
            bad += memcmp(want, out + i * d, (size_t)d * sizeof *want) != 0;
        }
        TEST_CHECK(bad == 0, "%s embedding rows: %d differ from their dequantization", tname(t), bad);
        backend_act_free(be, out);
        backend_weight_free(be, &w);
        free(blocks);
        free(row);
        free(want);
    }
    float *f = xcalloc(64 * 32, sizeof *f);
    bweight_src src = {.name = "f32", .data = f, .type = DTYPE_F32, .rows = 64, .cols = 32};
    bweight w;
    um_err err = {0};
    TEST_CHECK(backend_weight_upload(be, &src, &w, &err) == 0, "upload f32");
    TEST_CHECK(backend_weight_keeps_source(be, &w) == 1, "an F32 matrix is read in place");
    backend_weight_free(be, &w);
    free(f);
    TEST_CHECK(backend_has(be, BACKEND_CAP_QUANT), "the CPU backend takes quantized weights");
    backend_free(be);
}

int main(void) {
    cpu_pool *pool = cpu_pool_init(2, 0);
    test_pack(pool);
    test_act(pool);
    test_blocks(pool);
    cpu_pool_free(pool);
    test_backend_families();
    test_embed_and_views();
    return test_report();
}
