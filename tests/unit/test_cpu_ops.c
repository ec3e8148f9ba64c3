/*
 * test_cpu_ops.c — every CPU backend op against a naive double-precision loop written here:
 * matmul (F32/BF16/F16 weights, odd sizes, bias, misaligned data), attention (varlen sequences,
 * GQA, key_valid, block_causal, queries != keys), RoPE (partial rotation, table cache refresh),
 * RMSNorm, SwiGLU, embed, get_rows, add, host_parallel_for (each index once); the branch-free f16
 * and exp helpers; and the LLaDA forward batching contract (packed sequences == separate
 * forwards, default positions, out_rows, scratch reuse) on a small make-model checkpoint. All on
 * the fp32 kernel path (--cpu-kernels fp32), the numerical reference; the bf16 kernels are
 * tests/unit/test_cpu_gemm.c's, except attention, which also runs on each bf16 path this CPU has
 * (avx2, avx512bf16, amx) and on the AMX kernel over emulated tiles (amx_emu.h).
 * Single thread driving the backend (its pool slots run inside).
 */
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"

/* cpu_gemm_amx.c compiled with UM_AMX_EMULATE into this test (tests/CMakeLists.txt) */
extern const cpu_gemm_kernel cpu_gemm_amx_emulated;
extern _Atomic long amx_emu_dp_total;

static uint64_t g_ctr;
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)rng_u01(42, 7, g_ctr++); }
static void fill(float *a, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) a[i] = urand(lo, hi);
}

/* A weight in the given dtype built from f32 values; vals is overwritten with the values the
 * stored dtype actually holds (so references use exactly what the backend sees). */
typedef struct test_weight {
    bweight_src t;
    void       *mem;   /* storage (+1 byte when misaligned) */
    bweight   w;
} test_weight;

static void tw_make(backend *be, test_weight *tw, enum dtype dt, int64_t rows, int64_t cols, float *vals,
                    int misalign) {
    size_t n = (size_t)(rows * cols), es = dtype_size(dt);
    memset(tw, 0, sizeof *tw);
    tw->mem = xmalloc(n * es + 8);
    uint8_t *base = (uint8_t *)tw->mem + (misalign ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        if (dt == DTYPE_F32) {
            memcpy(base + 4 * i, &vals[i], 4);
        } else {
            uint16_t h = dt == DTYPE_BF16 ? f32_to_bf16(vals[i]) : f32_to_f16(vals[i]);
            memcpy(base + 2 * i, &h, 2);
            vals[i] = dt == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
    }
    tw->t = (bweight_src){.name = "test", .data = base, .type = dt, .rows = rows, .cols = cols};
    um_err err = {0};
    int rc = be->ops->weight_upload(be, &tw->t, &tw->w, &err);
    TEST_CHECK(rc == 0, "weight_upload: %s", err.msg);
}

static void tw_free(backend *be, test_weight *tw) {
    be->ops->weight_free(be, &tw->w);
    free(tw->mem);
}

/* ---------------------------------------------------------------- helpers */

/* Exact in the default floating-point mode and under FTZ/DAZ (the mode the backend's pool runs
 * in: a denormal intermediate would be read as zero there). */
static void test_f16_exhaustive(void) {
    for (int daz = 0; daz < 2; daz++) {
        unsigned old = _mm_getcsr();
        if (daz) _mm_setcsr(old | 0x8040u);
        int bad = 0;
        for (uint32_t h = 0; h < 65536; h++) {
            float a = cpu_f16_to_f32((uint16_t)h), b = f16_to_f32((uint16_t)h);
            uint32_t ua, ub;
            memcpy(&ua, &a, 4);
            memcpy(&ub, &b, 4);
            if (ua != ub && !(isnan(a) && isnan(b))) bad++;
        }
        _mm_setcsr(old);
        TEST_CHECK(bad == 0, "%d half values convert differently from util/dtype.h (FTZ/DAZ %d)", bad, daz);
    }
}

static void test_expf(void) {
    double worst = 0;
    for (int i = 0; i <= 200000; i++) {
        float x = -87.0f + 175.0f * (float)i / 200000.0f;
        double ref = exp((double)x), got = cpu_expf(x);
        double rel = fabs(got - ref) / ref;
        if (rel > worst) worst = rel;
    }
    TEST_CHECK(worst < 5e-7, "cpu_expf worst relative error %.3e", worst);
    TEST_CHECK(cpu_expf(-1e30f) >= 0.0f && cpu_expf(-1e30f) < 1e-37f, "exp(-huge) = %g", (double)cpu_expf(-1e30f));
    TEST_CHECK(isfinite(cpu_expf(1e30f)), "exp(+huge) must stay finite (clamped)");
}

/* ---------------------------------------------------------------- matmul */

static void check_matmul(backend *be, enum dtype dt, int n, int R, int C, int with_bias, int misalign) {
    float *x = xmalloc((size_t)n * C * sizeof *x), *wv = xmalloc((size_t)R * C * sizeof *wv);
    float *bv = xmalloc((size_t)R * sizeof *bv), *y = be->ops->act_alloc(be, (size_t)n * R);
    fill(x, (size_t)n * C, -1, 1);
    fill(wv, (size_t)R * C, -1, 1);
    fill(bv, (size_t)R, -1, 1);
    test_weight w, b;
    tw_make(be, &w, dt, R, C, wv, misalign);
    if (with_bias) tw_make(be, &b, DTYPE_BF16, 1, R, bv, 0);
    float *xa = be->ops->act_alloc(be, (size_t)n * C);
    memcpy(xa, x, (size_t)n * C * sizeof *x);
    be->ops->matmul(be, xa, &w.w, with_bias ? &b.w : NULL, n, y);
    double worst = 0;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < R; r++) {
            double acc = with_bias ? bv[r] : 0, mag = with_bias ? fabs(bv[r]) : 0;
            for (int c = 0; c < C; c++) {
                acc += (double)x[(size_t)i * C + c] * wv[(size_t)r * C + c];
                mag += fabs((double)x[(size_t)i * C + c] * wv[(size_t)r * C + c]);
            }
            double e = fabs(y[(size_t)i * R + r] - acc) / (mag + 1e-30);
            if (e > worst) worst = e;
        }
    TEST_CHECK(worst < 2e-6, "matmul %s n=%d R=%d C=%d bias=%d misalign=%d: worst error %.3e", dtype_name(dt), n, R,
               C, with_bias, misalign, worst);
    tw_free(be, &w);
    if (with_bias) tw_free(be, &b);
    be->ops->act_free(be, xa);
    be->ops->act_free(be, y);
    free(x);
    free(wv);
    free(bv);
}

static void test_matmul(backend *be) {
    static const int shapes[][3] = {{1, 1, 1}, {1, 300, 64}, {5, 7, 13}, {37, 333, 259}, {130, 97, 100},
                                    {3, 1031, 17}, {70, 16, 300}};
    enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int d = 0; d < 3; d++) check_matmul(be, dts[d], shapes[s][0], shapes[s][1], shapes[s][2], (int)s % 2, 0);
    check_matmul(be, DTYPE_BF16, 9, 40, 33, 0, 1);   /* misaligned data section -> aligned copy */
    check_matmul(be, DTYPE_F32, 9, 40, 33, 1, 1);
}

/* ---------------------------------------------------------------- attention */

static void naive_attention(const attn_params *p, const float *q, const float *k, const float *v, double *out) {
    int H = p->n_heads, KV = p->n_kv_heads, hd = p->head_dim, g = H / KV;
    for (int s = 0; s < p->n_seqs; s++)
        for (int i = p->q_start[s]; i < p->q_start[s + 1]; i++)
            for (int h = 0; h < H; h++) {
                int kh = h / g, k0 = p->k_start[s], k1 = p->k_start[s + 1];
                double *o = out + ((size_t)i * H + h) * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                double m = -INFINITY, sum = 0;
                double *sc = xmalloc((size_t)(k1 - k0 + 1) * sizeof *sc);
                for (int j = k0; j < k1; j++) {
                    int vis = (!p->key_valid || p->key_valid[j]) &&
                              (!p->block_causal || p->k_pos[j] / p->block_causal <= p->q_pos[i] / p->block_causal);
                    double a = 0;
                    for (int d = 0; d < hd; d++)
                        a += (double)q[((size_t)i * H + h) * hd + d] * k[((size_t)j * KV + kh) * hd + d];
                    sc[j - k0] = vis ? a * p->scale : -INFINITY;
                    if (sc[j - k0] > m) m = sc[j - k0];
                }
                if (m == -INFINITY) {
                    free(sc);
                    continue;
                }
                for (int j = k0; j < k1; j++) sum += sc[j - k0] == -INFINITY ? 0 : exp(sc[j - k0] - m);
                for (int j = k0; j < k1; j++) {
                    if (sc[j - k0] == -INFINITY) continue;
                    double pj = exp(sc[j - k0] - m) / sum;
                    for (int d = 0; d < hd; d++) o[d] += pj * v[((size_t)j * KV + kh) * hd + d];
                }
                free(sc);
            }
}

/* worst absolute error allowed in attention outputs: fp32 path, or the bf16 paths (q, k, v and the
 * probabilities rounded to bf16, as attention on bf16 tiles on a GPU) */
static double g_attn_tol = 2e-6;

/* own_seq0: sequence 0's keys/values come from its own buffers (attn_params.k_seq/v_seq, a KV
 * cache), copies of its packed rows, so the reference is unchanged */
static void check_attention(backend *be, const char *label, int n_seqs, const int32_t *qs, const int32_t *ks,
                            const int32_t *qpos, const int32_t *kpos, const uint8_t *valid, int block, int H, int KV,
                            int hd, int zero_rows_from, int own_seq0) {
    int nq = qs[n_seqs], nk = ks[n_seqs];
    float *q = be->ops->act_alloc(be, (size_t)nq * H * hd), *k = be->ops->act_alloc(be, (size_t)nk * KV * hd);
    float *v = be->ops->act_alloc(be, (size_t)nk * KV * hd), *o = be->ops->act_alloc(be, (size_t)nq * H * hd);
    fill(q, (size_t)nq * H * hd, -2, 2);
    fill(k, (size_t)nk * KV * hd, -2, 2);
    fill(v, (size_t)nk * KV * hd, -1, 1);
    for (size_t i = 0; i < (size_t)nq * H * hd; i++) o[i] = NAN;   /* every output must be written */
    attn_params p = {.n_seqs = n_seqs, .q_start = qs, .k_start = ks, .q_pos = qpos, .k_pos = kpos,
                     .key_valid = valid, .block_causal = block, .n_heads = H, .n_kv_heads = KV, .head_dim = hd,
                     .scale = 1.0f / sqrtf((float)hd)};
    void *kseq[8] = {NULL}, *vseq[8] = {NULL};
    float *own_k = NULL, *own_v = NULL;
    if (own_seq0) {
        size_t row = (size_t)KV * hd, n0 = (size_t)(ks[1] - ks[0]);
        own_k = be->ops->act_alloc(be, n0 * row);
        own_v = be->ops->act_alloc(be, n0 * row);
        memcpy(own_k, k + (size_t)ks[0] * row, n0 * row * sizeof *k);
        memcpy(own_v, v + (size_t)ks[0] * row, n0 * row * sizeof *v);
        kseq[0] = own_k;
        vseq[0] = own_v;
        p.k_seq = (const void *const *)kseq;
        p.v_seq = (const void *const *)vseq;
    }
    be->ops->attention(be, &p, q, k, v, o);
    double *ref = xcalloc((size_t)nq * H * hd, sizeof *ref);
    naive_attention(&p, q, k, v, ref);
    double worst = 0;
    int nan_seen = 0;
    for (size_t i = 0; i < (size_t)nq * H * hd; i++) {
        if (isnan(o[i])) nan_seen = 1;
        double e = fabs(o[i] - ref[i]);
        if (e > worst) worst = e;
    }
    TEST_CHECK(!nan_seen && worst < g_attn_tol, "attention %s: worst abs error %.3e (tol %.0e) nan=%d", label, worst,
               g_attn_tol, nan_seen);
    if (zero_rows_from >= 0) {
        int nz = 0;
        for (size_t i = (size_t)zero_rows_from * H * hd; i < (size_t)nq * H * hd; i++) nz += o[i] != 0.0f;
        TEST_CHECK(nz == 0, "attention %s: rows without visible keys must be zero (%d nonzero)", label, nz);
    }
    free(ref);
    if (own_k) be->ops->act_free(be, own_k);
    if (own_v) be->ops->act_free(be, own_v);
    be->ops->act_free(be, q);
    be->ops->act_free(be, k);
    be->ops->act_free(be, v);
    be->ops->act_free(be, o);
}

static void test_attention(backend *be) {
    /* three sequences of different lengths, GQA 6/2, head_dim 20 */
    int32_t st[] = {0, 1, 18, 88};
    int32_t pos[88];
    uint8_t valid[88];
    for (int s = 0; s < 3; s++)
        for (int i = st[s]; i < st[s + 1]; i++) pos[i] = i - st[s];
    check_attention(be, "varlen GQA 6/2", 3, st, st, pos, pos, NULL, 0, 6, 2, 20, -1, 0);
    for (int i = 0; i < 88; i++) valid[i] = (uint8_t)(i % 5 != 3 && i < 80);
    valid[0] = 1;
    check_attention(be, "varlen + key_valid", 3, st, st, pos, pos, valid, 0, 6, 2, 20, -1, 0);
    check_attention(be, "block_causal 8 + key_valid", 3, st, st, pos, pos, valid, 8, 6, 2, 20, -1, 0);
    check_attention(be, "block_causal 4, MHA", 3, st, st, pos, pos, NULL, 4, 3, 3, 16, -1, 0);
    /* queries are a subset of the keys (cache layout): 2 and 3 queries over 10 and 20 keys */
    int32_t qs[] = {0, 2, 5}, ks[] = {0, 10, 30};
    int32_t qp[] = {8, 9, 17, 18, 19}, kp[30];
    for (int i = 0; i < 30; i++) kp[i] = i < 10 ? i : i - 10;
    check_attention(be, "queries != keys, block_causal 8", 2, qs, ks, qp, kp, NULL, 8, 4, 1, 8, -1, 0);
    /* a sequence whose keys are all padding -> zero outputs; and a single-head long sequence */
    int32_t st2[] = {0, 40, 43};
    uint8_t v2[43];
    for (int i = 0; i < 43; i++) v2[i] = i < 40;
    int32_t p2[43];
    for (int i = 0; i < 43; i++) p2[i] = i < 40 ? i : i - 40;
    check_attention(be, "all keys padded", 2, st2, st2, p2, p2, v2, 0, 2, 1, 8, 40, 0);
    int32_t st3[] = {0, 300};
    int32_t p3[300];
    for (int i = 0; i < 300; i++) p3[i] = i;
    check_attention(be, "300 tokens, 1 head", 1, st3, st3, p3, p3, NULL, 0, 1, 1, 32, -1, 0);
    /* sequence 0's keys in its own buffers (a KV cache), 100 keys; head_dim 128 */
    check_attention(be, "own K/V buffers, GQA 4/2", 3, st, st, pos, pos, NULL, 0, 4, 2, 20, -1, 1);
    int32_t st4[] = {0, 100, 130};
    int32_t p4[130];
    for (int i = 0; i < 130; i++) p4[i] = i < 100 ? i : i - 100;
    check_attention(be, "own K/V buffers, head_dim 128", 2, st4, st4, p4, p4, NULL, 0, 2, 2, 128, -1, 1);
}

/* ---------------------------------------------------------------- rope, norms, element-wise */

static void check_rope(backend *be, const int32_t *pos, int n, int H, int hd, int rot, float theta) {
    float *x = be->ops->act_alloc(be, (size_t)n * H * hd), *x0 = xmalloc((size_t)n * H * hd * sizeof *x0);
    fill(x0, (size_t)n * H * hd, -1, 1);
    memcpy(x, x0, (size_t)n * H * hd * sizeof *x);
    be->ops->rope(be, x, n, H, hd, rot, pos, theta);
    double worst = 0;
    int half = rot / 2;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            const float *a = x0 + ((size_t)i * H + h) * hd;
            const float *b = x + ((size_t)i * H + h) * hd;
            for (int d = 0; d < hd; d++) {
                double ref;
                if (d >= rot) {
                    ref = a[d];
                } else {
                    int j = d % half;
                    double ang = pos[i] * pow((double)theta, -2.0 * j / rot);
                    double rh = d < half ? -(double)a[d + half] : (double)a[d - half];   /* rotate_half */
                    ref = a[d] * cos(ang) + rh * sin(ang);
                }
                double e = fabs(b[d] - ref);
                if (e > worst) worst = e;
            }
        }
    TEST_CHECK(worst < 2e-6, "rope n=%d H=%d hd=%d rot=%d theta=%g: worst %.3e", n, H, hd, rot, (double)theta, worst);
    be->ops->act_free(be, x);
    free(x0);
}

static void test_rope(backend *be) {
    int32_t a[9] = {0, 1, 2, 7, 100, 511, 1000, 2047, 4095}, b[9] = {3, 3, 9, 4000, 0, 1, 2, 50, 60};
    check_rope(be, a, 9, 3, 12, 8, 10000.0f);   /* partial rotation */
    check_rope(be, b, 9, 3, 12, 8, 10000.0f);   /* same n, new positions: cache must refresh */
    check_rope(be, b, 9, 3, 12, 8, 500000.0f);  /* new theta */
    check_rope(be, a, 9, 2, 64, 64, 500000.0f); /* full rotation */
    int32_t c[2] = {5, 6};
    check_rope(be, c, 2, 1, 64, 64, 500000.0f);  /* shorter: cache resized */
}

static void test_rmsnorm(backend *be) {
    int n = 5, d = 37;
    float *x = be->ops->act_alloc(be, (size_t)n * d), *x0 = xmalloc((size_t)n * d * sizeof *x0), wv[37];
    fill(x0, (size_t)n * d, -3, 3);
    fill(wv, (size_t)d, 0.5f, 1.5f);
    test_weight w;
    tw_make(be, &w, DTYPE_BF16, 1, d, wv, 0);
    memcpy(x, x0, (size_t)n * d * sizeof *x);
    be->ops->rmsnorm(be, x, &w.w, n, d, 1e-5f, x);   /* in place */
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)x0[i * d + j] * x0[i * d + j];
        double r = 1.0 / sqrt(ss / d + 1e-5);
        for (int j = 0; j < d; j++) {
            double ref = wv[j] * (x0[i * d + j] * r);
            double e = fabs(x[i * d + j] - ref) / (fabs(ref) + 1e-6);
            if (e > worst) worst = e;
        }
    }
    TEST_CHECK(worst < 1e-5, "rmsnorm worst relative error %.3e", worst);
    tw_free(be, &w);
    be->ops->act_free(be, x);
    free(x0);
}

static void test_elementwise(backend *be) {
    size_t n = 1100001;   /* above the parallel thresholds, not a multiple of the chunk */
    float *g = be->ops->act_alloc(be, n), *u = be->ops->act_alloc(be, n), *o = be->ops->act_alloc(be, n);
    fill(g, n, -30, 30);
    fill(u, n, -2, 2);
    g[0] = -100, g[1] = 100, g[2] = 0;
    be->ops->swiglu(be, g, u, n, o);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double ref = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double e = fabs(o[i] - ref) / (fabs(ref) + 1e-6);
        if (e > worst) worst = e;
    }
    TEST_CHECK(worst < 1e-5, "swiglu worst relative error %.3e", worst);
    float *x = be->ops->act_alloc(be, n);
    memcpy(x, g, n * sizeof *x);
    be->ops->add(be, x, u, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += x[i] != g[i] + u[i];
    TEST_CHECK(bad == 0, "add: %d wrong elements", bad);
    /* swiglu in place (out == gate) */
    memcpy(x, g, n * sizeof *x);
    be->ops->swiglu(be, x, u, n, x);
    TEST_CHECK(memcmp(x, o, n * sizeof *x) == 0, "swiglu in place differs from out of place");
    be->ops->act_free(be, g);
    be->ops->act_free(be, u);
    be->ops->act_free(be, o);
    be->ops->act_free(be, x);
}

/* backend_host_parallel_for: every index of [0, n) exactly once, in chunks of at most grain. */
typedef struct hp_run {
    _Atomic int *hits;
    _Atomic int  bad_chunk;
    int64_t      grain;
} hp_run;

static void hp_range(void *arg, int64_t lo, int64_t hi) {
    hp_run *r = arg;
    if (hi <= lo || hi - lo > r->grain) atomic_fetch_add(&r->bad_chunk, 1);
    for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&r->hits[i], 1);
}

static void test_host_parallel_for(backend *be) {
    const int64_t ns[] = {1, 2, 7, 64, 1001}, grains[] = {1, 3, 64, 5000};
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
        for (size_t b = 0; b < sizeof grains / sizeof grains[0]; b++) {
            hp_run r = {.hits = xcalloc((size_t)ns[a], sizeof *r.hits), .grain = grains[b]};
            backend_host_parallel_for(be, ns[a], grains[b], hp_range, &r);
            int wrong = 0;
            for (int64_t i = 0; i < ns[a]; i++) wrong += r.hits[i] != 1;
            TEST_CHECK(wrong == 0 && r.bad_chunk == 0, "host_parallel_for n=%lld grain=%lld on %d threads: %d indices "
                       "not run exactly once, %d bad chunks", (long long)ns[a], (long long)grains[b],
                       backend_n_threads(be), wrong, (int)r.bad_chunk);
            free(r.hits);
        }
}

static void test_rows(backend *be) {
    int V = 50, d = 19;
    float *wv = xmalloc((size_t)V * d * sizeof *wv);
    enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    int32_t ids[] = {3, 49, 0, 3, 17};
    for (int t = 0; t < 3; t++) {
        fill(wv, (size_t)V * d, -1, 1);
        test_weight w;
        tw_make(be, &w, dts[t], V, d, wv, 0);
        float *o = be->ops->act_alloc(be, 5 * (size_t)d);
        be->ops->embed(be, &w.w, ids, 5, o);
        int bad = 0;
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < d; j++) bad += o[i * d + j] != wv[ids[i] * d + j];
        TEST_CHECK(bad == 0, "embed %s: %d wrong elements", dtype_name(dts[t]), bad);
        tw_free(be, &w);
        be->ops->act_free(be, o);
    }
    float *x = be->ops->act_alloc(be, (size_t)V * d), *o = be->ops->act_alloc(be, 5 * (size_t)d);
    fill(x, (size_t)V * d, -1, 1);
    be->ops->get_rows(be, x, d, ids, 5, o);
    int bad = 0;
    for (int i = 0; i < 5; i++) bad += memcmp(o + i * d, x + ids[i] * d, (size_t)d * sizeof *o) != 0;
    TEST_CHECK(bad == 0, "get_rows: %d wrong rows", bad);
    float h[5 * 19];
    be->ops->act_to_host(be, o, 5 * (size_t)d, h);
    TEST_CHECK(memcmp(h, o, sizeof h) == 0, "act_to_host copies");
    be->ops->act_free(be, x);
    be->ops->act_free(be, o);
    free(wv);
}

/* ---------------------------------------------------------------- forward batching */

static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > m) m = fabs(a[i] - b[i]);
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    return m / (s + 1e-30);
}

static void test_forward_batching(backend *be) {
    make_model_opts o = test_model_opts();
    o.dtype = DTYPE_BF16;
    o.n_kv_heads = 2;
    o.no_tokenizer = 1;
    um_err err = {0};
    model m;
    if (test_model_make("test_cpu_ops_model", &o, &m, &err) != 0) {
        TEST_CHECK(0, "model: %s", err.msg);
        return;
    }
    model_ctx ctx;
    TEST_CHECK(model_ctx_init(&ctx, &m, be, &err) == 0, "model_ctx_init: %s", err.msg);
    int V = m.cfg.n_embd_rows, la = 13, lb = 29;
    int32_t toks[42];
    for (int i = 0; i < 42; i++) toks[i] = (int32_t)((i * 37 + 11) % m.cfg.vocab_size);
    float *sa = xmalloc((size_t)la * V * sizeof *sa), *sb = xmalloc((size_t)lb * V * sizeof *sb);
    float *pk = xmalloc((size_t)(la + lb) * V * sizeof *pk);
    /* separately, the long one first so the short call reuses bigger scratch */
    int32_t s1[2] = {0, lb};
    fwd_batch b = {.n_seqs = 1, .seq_start = s1, .tokens = toks + la, .n_out = lb};
    TEST_CHECK(model_forward(&ctx, &b, sb, &err) == 0, "forward b: %s", err.msg);
    s1[1] = la;
    b = (fwd_batch){.n_seqs = 1, .seq_start = s1, .tokens = toks, .n_out = la};
    TEST_CHECK(model_forward(&ctx, &b, sa, &err) == 0, "forward a: %s", err.msg);
    /* packed */
    int32_t s2[3] = {0, la, la + lb};
    b = (fwd_batch){.n_seqs = 2, .seq_start = s2, .tokens = toks, .n_out = la + lb};
    TEST_CHECK(model_forward(&ctx, &b, pk, &err) == 0, "forward packed: %s", err.msg);
    double ea = max_rel(pk, sa, (size_t)la * V), eb = max_rel(pk + (size_t)la * V, sb, (size_t)lb * V);
    TEST_CHECK(ea < 1e-5 && eb < 1e-5, "packed vs separate: %.3e %.3e", ea, eb);
    /* explicit positions equal to the defaults, and out_rows picking rows from both sequences */
    int32_t pos[42], rows[3] = {la + lb - 1, 0, la};
    for (int i = 0; i < 42; i++) pos[i] = i < la ? i : i - la;
    b.pos = pos;
    b.out_rows = rows;
    b.n_out = 3;
    float *sel = xmalloc(3 * (size_t)V * sizeof *sel);
    TEST_CHECK(model_forward(&ctx, &b, sel, &err) == 0, "forward out_rows: %s", err.msg);
    double e0 = max_rel(sel, pk + (size_t)rows[0] * V, (size_t)V), e1 = max_rel(sel + V, pk, (size_t)V);
    double e2 = max_rel(sel + 2 * (size_t)V, pk + (size_t)la * V, (size_t)V);
    TEST_CHECK(e0 < 1e-5 && e1 < 1e-5 && e2 < 1e-5, "out_rows vs packed: %.3e %.3e %.3e", e0, e1, e2);
    /* shifted positions change the result (positions are really used) */
    for (int i = 0; i < 42; i++) pos[i] += 100;
    float *sh = xmalloc(3 * (size_t)V * sizeof *sh);
    TEST_CHECK(model_forward(&ctx, &b, sh, &err) == 0, "forward shifted: %s", err.msg);
    TEST_CHECK(max_rel(sh, sel, 3 * (size_t)V) < 1e-4, "RoPE is relative: a common shift keeps logits (%.3e)",
               max_rel(sh, sel, 3 * (size_t)V));
    for (int i = la; i < 42; i++) pos[i] = (i - la) * 3;   /* stretched positions in sequence b */
    TEST_CHECK(model_forward(&ctx, &b, sh, &err) == 0, "forward stretched: %s", err.msg);
    TEST_CHECK(max_rel(sh, sel, (size_t)V) > 1e-3, "stretched positions must change sequence b's logits");
    TEST_CHECK(max_rel(sh + V, sel + V, (size_t)V) < 1e-5, "and leave sequence a's alone");
    /* per-request errors */
    int32_t bad_tok[2] = {0, V};
    s1[1] = 2;
    b = (fwd_batch){.n_seqs = 1, .seq_start = s1, .tokens = bad_tok, .n_out = 2};
    TEST_CHECK(model_forward(&ctx, &b, sh, &err) != 0 && err.code == UM_ERR_INVALID_ARG, "token id >= vocab rejected");
    free(sa);
    free(sb);
    free(pk);
    free(sel);
    free(sh);
    model_ctx_free(&ctx);
    model_free(&m);
}

int main(void) {
    /* the fp32 reference path: its tolerances are fp32's (the bf16 kernels: test_cpu_gemm.c) */
    um_err err = {0};
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_FP32, &err) == 0, "select fp32: %s", err.msg);
    backend *be = backend_cpu_init(2);
    TEST_CHECK(backend_cpu_kernels_of(be) == BACKEND_CPU_KERNELS_FP32, "fp32 kernels in use");
    test_f16_exhaustive();
    test_expf();
    test_matmul(be);
    test_attention(be);
    test_rope(be);
    test_rmsnorm(be);
    test_elementwise(be);
    test_rows(be);
    test_host_parallel_for(be);
    test_forward_batching(be);
    backend_free(be);
    backend *be1 = backend_cpu_init(1);   /* single-thread path too */
    test_matmul(be1);
    test_attention(be1);
    test_host_parallel_for(be1);
    backend_free(be1);
    /* attention on the bf16 kernel paths this CPU has (q, k, v and probabilities in bf16: the
     * GPU path's attention tolerance) */
    const enum backend_cpu_kernels bf16_paths[] = {BACKEND_CPU_KERNELS_AVX2, BACKEND_CPU_KERNELS_AVX512BF16,
                                                   BACKEND_CPU_KERNELS_AMX};
    for (int i = 0; i < 3; i++) {
        if (backend_cpu_kernels_select(bf16_paths[i], &err) != 0) {
            printf("SKIP attention on %s: %s\n", backend_cpu_kernels_name(bf16_paths[i]), err.msg);
            continue;
        }
        g_attn_tol = 1e-2;
        for (int t = 1; t <= 2; t++) {
            backend *bb = backend_cpu_init(t);
            test_attention(bb);
            backend_free(bb);
        }
        g_attn_tol = 2e-6;
    }
    /* and on the AMX kernel running on emulated tiles (tests/unit/amx_emu.h), where AVX512-BF16
     * runs (its blocks under 16 rows) */
    if (backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AVX512BF16, &err) != 0) {
        printf("SKIP attention on emulated AMX tiles: %s\n", err.msg);
    } else {
        const long dp0 = amx_emu_dp_total;
        g_attn_tol = 1e-2;
        for (int t = 1; t <= 2; t++) {
            backend *bb = backend_cpu_init(t);
            ((cpu_impl *)bb->impl)->gemm = ((cpu_impl *)bb->impl)->attn = &cpu_gemm_amx_emulated;
            test_attention(bb);
            backend_free(bb);
        }
        g_attn_tol = 2e-6;
        TEST_CHECK(amx_emu_dp_total > dp0, "attention ran on the emulated tiles (%ld TDPBF16PS)",
                   (long)(amx_emu_dp_total - dp0));
    }
    return test_report();
}
