/*
 * cpu_qgemm.c — the quantized GEMM layer (cpu_qgemm.h) around its kernel families: packing Q8_0 /
 * Q4_0 weights at upload (quantizing float sources with util/quant.h, repacking quantized ones),
 * quantizing activations per row block (with the RMSNorm fused in), cutting a run of products into
 * pool tasks with the bf16 layer's epilogues, and the scalar kernel family every other one is
 * checked against.
 *
 * A run is cut as cpu_gemm_run cuts one: every product's outputs into panels of 4 groups (64
 * outputs; SwiGLU: 2 gate + 2 up groups = 32 outputs), its rows into chunks of GEMM_MB-row blocks;
 * a task is a group of consecutive panels over one chunk (about two tasks per slot), so a panel is
 * read from memory once per chunk and reused from cache by the chunk's other blocks.
 *
 * Does not: pick the kernel family, run bf16 or fp32 products.
 * Threading: entry points on the driving thread; tasks on pool slots.
 */
/* The branch-free helpers in cpu_internal.h only vectorise when float compares may be if-converted;
 * nothing here relies on floating-point exception flags. */
#pragma GCC optimize("no-trapping-math")
/* the activations' rounding is (x * id + 1.5 * 2^23) - 1.5 * 2^23 with x * id rounded first, in
 * every clone: no fused multiply-add there */
#pragma GCC optimize("fp-contract=off")

#include "backend/cpu/cpu_qgemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_mem.h"
#include "backend/cpu/cpu_pool.h"
#include "util/log.h"
#include "util/quant.h"

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---------------------------------------------------------------- packing */

/* Bytes of one GGUF block: 34 (Q8_0) or 18 (Q4_0). */
static size_t gguf_block_bytes(enum dtype t) { return dtype_row_bytes(t, DTYPE_QBLOCK); }

/* Row rr (< 16) of group grp from nb GGUF blocks at src: its scale, and its quants 4 bytes (one step
 * of 4 inputs, Q4_0: two steps' nibbles) at a time into the 16-row lines. */
static void group_put_row(uint8_t *grp, enum dtype t, int rr, const uint8_t *src, int64_t nb) {
    const size_t bb = gguf_block_bytes(t);
    const int lines = t == DTYPE_Q8_0 ? 8 : 4;
    for (int64_t b = 0; b < nb; b++, src += bb) {
        uint16_t *d = (uint16_t *)cpu_qblock_d(grp, t, b);
        uint8_t *qs = (uint8_t *)cpu_qblock_qs(grp, t, b) + rr * 4;
        memcpy(&d[rr], src, 2);
        for (int s = 0; s < lines; s++) memcpy(qs + s * 64, src + 2 + 4 * s, 4);
    }
}

void cpu_qpacked_row(const cpu_qpacked *w, int64_t r, void *dst) {
    CHECK(r >= 0 && r < w->rows);
    const enum dtype t = w->type;
    const uint8_t *grp = w->p + (r / 16) * w->gbytes;
    const int rr = (int)(r % 16);
    uint8_t *o = dst;
    for (int64_t b = 0; b < w->nb; b++, o += gguf_block_bytes(t)) {
        const uint8_t *qs = cpu_qblock_qs(grp, t, b);
        memcpy(o, &cpu_qblock_d(grp, t, b)[rr], 2);
        if (t == DTYPE_Q8_0) {
            for (int k = 0; k < 32; k++) o[2 + k] = qs[(k / 4) * 64 + rr * 4 + k % 4];
        } else {
            for (int j = 0; j < 16; j++) o[2 + j] = qs[(j / 4) * 64 + rr * 4 + j % 4];
        }
    }
}

typedef struct qpack_run {
    const uint8_t *src;       /* [rows] rows of the source */
    size_t         src_row;   /* bytes of a source row */
    enum dtype     src_type;
    cpu_qpacked   *w;
} qpack_run;

static void qpack_task(void *arg, int64_t g, int slot) {
    (void)slot;
    const qpack_run *r = arg;
    const cpu_qpacked *w = r->w;
    uint8_t *grp = w->p + g * w->gbytes;
    if (16 * g + 16 > w->rows) memset(grp, 0, (size_t)w->gbytes);   /* rows past R: zero weights, zero scales */
    const int quantize = !dtype_is_quant(r->src_type);
    float *f = quantize ? xcalloc((size_t)w->kpad, sizeof *f) : NULL;   /* zeros past cols stay */
    uint8_t *blocks = quantize ? xmalloc(dtype_row_bytes(w->type, w->kpad)) : NULL;
    for (int rr = 0; rr < 16 && 16 * g + rr < w->rows; rr++) {
        const uint8_t *row = r->src + (size_t)(16 * g + rr) * r->src_row;
        if (quantize) {
            dtype_to_f32(r->src_type, row, f, (size_t)w->cols);
            quant_row_quantize(w->type, f, blocks, w->kpad);
            row = blocks;
        }
        group_put_row(grp, w->type, rr, row, w->nb);
    }
    free(f);
    free(blocks);
}

void cpu_qpacked_init(cpu_qpacked *out, enum dtype type, const void *src, enum dtype src_type, int64_t rows,
                      int64_t cols, cpu_pool *pool) {
    CHECK(dtype_is_quant(type) && rows > 0 && cols > 0);
    CHECK(src_type == type || src_type == DTYPE_F32 || src_type == DTYPE_BF16 || src_type == DTYPE_F16);
    CHECK(src_type != type || cols % DTYPE_QBLOCK == 0);
    memset(out, 0, sizeof *out);
    out->type = type;
    out->rows = rows;
    out->cols = cols;
    out->kpad = round_up(cols, DTYPE_QBLOCK);
    out->nb = out->kpad / DTYPE_QBLOCK;
    out->n_groups = (rows + 15) / 16;
    const int64_t qb = cpu_qblock_bytes(type);
    out->gbytes = (out->nb / 2) * (64 + 2 * qb) + (out->nb % 2) * (64 + qb);
    out->p = cpu_mem_alloc((size_t)(out->n_groups * out->gbytes));
    qpack_run r = {.src = src, .src_row = dtype_row_bytes(src_type, cols), .src_type = src_type, .w = out};
    cpu_pool_run(pool, out->n_groups, 0, qpack_task, &r);
}

void cpu_qpacked_free(cpu_qpacked *w) {
    cpu_mem_free(w->p);
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------- activations -> Q8 blocks */

static size_t align64(size_t n) { return (n + 63) / 64 * 64; }

size_t cpu_qact_bytes(int64_t n, int64_t kpad) {
    const size_t nb = (size_t)(kpad / DTYPE_QBLOCK);
    return align64((size_t)(n * kpad)) + 2 * align64((size_t)n * nb * 4);
}

/* One block of 32 values v: quants, scale and their sum (cpu_qgemm.h numerics). 12582912 = 1.5 * 2^23:
 * adding and subtracting it rounds a float of magnitude < 2^22 to the nearest integer, ties to even,
 * without a call and in any vector unit. */
static inline void block_to_q8(const float *v, int8_t *q, float *d, int32_t *s) {
    float amax = 0.0f;
#pragma omp simd reduction(max : amax)
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
    int32_t sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < 32; j++) {
        const int32_t qi = (int32_t)((v[j] * id + 12582912.0f) - 12582912.0f);
        q[j] = (int8_t)qi;
        sum += qi;
    }
    *d = dd;
    *s = sum;
}

/* One row: w == NULL: the values x[j]; else w[j] * (x[j] * scale) (the RMSNorm, as cpu_row_to_bf16
 * computes it), zeros from cols up to kpad. */
CPU_WIDE_CLONES static void row_to_q8(const float *x, int64_t cols, int64_t kpad, const float *w, float scale,
                                      int8_t *q, float *d, int32_t *s) {
    float v[32];
    for (int64_t b = 0; b < kpad / 32; b++) {
        const int64_t k0 = 32 * b;
        if (k0 + 32 <= cols) {
            if (w) {
#pragma omp simd
                for (int j = 0; j < 32; j++) v[j] = w[k0 + j] * (x[k0 + j] * scale);
            } else {
#pragma omp simd
                for (int j = 0; j < 32; j++) v[j] = x[k0 + j];
            }
        } else {
            for (int j = 0; j < 32; j++) v[j] = k0 + j < cols ? (w ? w[k0 + j] * (x[k0 + j] * scale) : x[k0 + j]) : 0.0f;
        }
        block_to_q8(v, q + k0, d + b, s + b);
    }
}

CPU_WIDE_CLONES static float row_sumsq(const float *x, int64_t n) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < n; j++) ss += x[j] * x[j];
    return ss;
}

typedef struct q8_run {
    const float *x;
    int64_t      n, cols, kpad, nb, rows_per;
    const float *normw;   /* [cols] or NULL */
    float        eps;
    int8_t      *q;
    float       *d;
    int32_t     *s;
} q8_run;

static void q8_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const q8_run *r = arg;
    for (int64_t i = t * r->rows_per; i < min64(r->n, (t + 1) * r->rows_per); i++) {
        const float *xr = r->x + i * r->cols;
        float scale = 1.0f;
        if (r->normw) scale = 1.0f / sqrtf(row_sumsq(xr, r->cols) / (float)r->cols + r->eps);
        row_to_q8(xr, r->cols, r->kpad, r->normw, scale, r->q + i * r->kpad, r->d + i * r->nb, r->s + i * r->nb);
    }
}

void cpu_act_to_q8(cpu_pool *pool, const float *x, int64_t n, int64_t cols, int64_t kpad, const bweight *norm,
                   float eps, void *buf, cpu_qact *a) {
    CHECK(kpad % DTYPE_QBLOCK == 0 && kpad >= cols);
    const int64_t nb = kpad / DTYPE_QBLOCK;
    char *p = buf;
    int8_t *q = (int8_t *)p;
    float *d = (float *)(p + align64((size_t)(n * kpad)));
    int32_t *s = (int32_t *)(p + align64((size_t)(n * kpad)) + align64((size_t)n * (size_t)nb * 4));
    *a = (cpu_qact){.q = q, .d = d, .s = s, .kpad = kpad, .nb = nb};
    if (n <= 0) return;
    float *wf = NULL;
    if (norm) {
        CHECK(norm->rows * norm->cols == cols);
        wf = xmalloc((size_t)cols * sizeof *wf);
        cpu_weight_to_f32(norm, 0, (size_t)cols, wf);
    }
    const int64_t rows_per = (65536 + cols - 1) / cols;   /* about 64k elements per task */
    q8_run r = {.x = x, .n = n, .cols = cols, .kpad = kpad, .nb = nb, .rows_per = rows_per, .normw = wf,
                .eps = eps, .q = q, .d = d, .s = s};
    cpu_pool_run(pool, (n + rows_per - 1) / rows_per, 0, q8_task, &r);
    free(wf);
}

/* ---------------------------------------------------------------- the scalar family */

static void scalar_block(enum dtype t, const cpu_qact *a, int64_t i0, int m, const uint8_t *const *b, int ng,
                         float *c) {
    for (int i = 0; i < m; i++) memset(c + i * 64, 0, (size_t)ng * 16 * sizeof *c);
    for (int64_t bk = 0; bk < a->nb; bk++)
        for (int j = 0; j < ng; j++) {
            const uint16_t *dw = cpu_qblock_d(b[j], t, bk);
            const uint8_t *qs = cpu_qblock_qs(b[j], t, bk);
            for (int l = 0; l < 16; l++) {
                int w[32];
                for (int k = 0; k < 32; k++) {
                    if (t == DTYPE_Q8_0) {
                        w[k] = (int8_t)qs[(k / 4) * 64 + l * 4 + k % 4];
                    } else {
                        const uint8_t byte = qs[((k % 16) / 4) * 64 + l * 4 + k % 4];
                        w[k] = (k < 16 ? byte & 15 : byte >> 4) - 8;
                    }
                }
                const float wd = f16_to_f32(dw[l]);
                for (int i = 0; i < m; i++) {
                    const int8_t *x = a->q + (i0 + i) * a->kpad + 32 * bk;
                    int32_t dot = 0;
                    for (int k = 0; k < 32; k++) dot += w[k] * x[k];
                    float *ci = c + i * 64 + 16 * j + l;
                    *ci = fmaf((float)dot, wd * a->d[(i0 + i) * a->nb + bk], *ci);
                }
            }
        }
}

const cpu_qgemm_kernel cpu_qgemm_scalar = {.name = "scalar", .block = scalar_block};

/* ---------------------------------------------------------------- runs */

typedef struct qgemm_run {
    const cpu_qgemm_kernel *k;
    const cpu_qact         *a;
    int64_t                 m;
    const cpu_qgemm_out    *outs;
    int64_t                 pan_start[5];   /* panels of outs[0..o) */
    int64_t                 gp;             /* consecutive panels per task */
    int64_t                 mc, n_mc;       /* rows per chunk, chunks */
} qgemm_run;

static int64_t out_panels(const cpu_qgemm_out *o) {
    return o->epi == CPU_EPI_SWIGLU ? (o->w->n_groups + 1) / 2 : (o->w->n_groups + 3) / 4;
}

/* One panel: its product, weight groups and output columns. */
typedef struct qpanel {
    const cpu_qgemm_out *out;
    const uint8_t       *b[4];
    int                  ng, half;
    int64_t              col0, ncols;
} qpanel;

static void qpanel_of(const qgemm_run *r, int64_t pan, qpanel *p) {
    int o = 0;
    while (pan >= r->pan_start[o + 1]) o++;
    const cpu_qgemm_out *out = &r->outs[o];
    const cpu_qpacked *w = out->w;
    const int64_t pi = pan - r->pan_start[o], R = w->rows;
    p->out = out;
    p->half = 0;
    if (out->epi == CPU_EPI_SWIGLU) {
        const int64_t g0 = 2 * pi;
        const int gpp = w->n_groups - g0 < 2 ? 1 : 2;   /* groups per half */
        for (int j = 0; j < gpp; j++) {
            p->b[j] = w->p + (g0 + j) * w->gbytes;
            p->b[gpp + j] = out->w2->p + (g0 + j) * w->gbytes;
        }
        p->ng = 2 * gpp;
        p->half = 16 * gpp;
        p->col0 = 16 * g0;
        p->ncols = min64(p->half, R - p->col0);
    } else {
        const int64_t g0 = 4 * pi;
        p->ng = (int)min64(4, w->n_groups - g0);
        for (int j = 0; j < p->ng; j++) p->b[j] = w->p + (g0 + j) * w->gbytes;
        p->col0 = 16 * g0;
        p->ncols = min64(64, R - p->col0);
    }
}

static void qgemm_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const qgemm_run *r = arg;
    const int64_t pg = t / r->n_mc, i_lo = (t % r->n_mc) * r->mc, i_hi = min64(r->m, i_lo + r->mc);
    const int64_t p_lo = pg * r->gp, pan_end = min64(p_lo + r->gp, r->pan_start[4]);
    _Alignas(64) float c[GEMM_MB * 64];
    for (int64_t pan = p_lo; pan < pan_end; pan++) {
        qpanel cur;
        qpanel_of(r, pan, &cur);
        const cpu_qgemm_out *out = cur.out;
        const int64_t R = out->w->rows;
        float bias[64] = {0};
        if (out->bias) cpu_weight_to_f32(out->bias, (size_t)cur.col0, (size_t)cur.ncols, bias);
        for (int64_t i0 = i_lo; i0 < i_hi; i0 += GEMM_MB) {
            const int mb = (int)min64(GEMM_MB, i_hi - i0);
            r->k->block(out->w->type, r->a, i0, mb, cur.b, cur.ng, c);
            cpu_gemm_epi_rows(out->epi, c, mb, (int)cur.ncols, cur.half, bias, out->y + i0 * R + cur.col0, R);
        }
    }
}

void cpu_qgemm_run(cpu_pool *pool, const cpu_qgemm_kernel *k, const cpu_qact *a, int64_t m, const cpu_qgemm_out *outs,
                   int n_out) {
    CHECK(n_out >= 1 && n_out <= 4 && k->block);
    if (m <= 0) return;
    qgemm_run r = {.k = k, .a = a, .m = m, .outs = outs};
    for (int o = 0; o < n_out; o++) {
        const cpu_qgemm_out *out = &outs[o];
        CHECK(out->w && out->w->kpad == a->kpad);
        CHECK((out->epi == CPU_EPI_SWIGLU) == (out->w2 != NULL) && (!out->w2 || !out->bias));
        CHECK(!out->w2 || (out->w2->rows == out->w->rows && out->w2->kpad == out->w->kpad &&
                           out->w2->type == out->w->type));
        r.pan_start[o + 1] = r.pan_start[o] + out_panels(out);
    }
    for (int o = n_out; o < 4; o++) r.pan_start[o + 1] = r.pan_start[n_out];
    const int64_t panels = r.pan_start[4], want = 2 * (int64_t)cpu_pool_size(pool);
    r.gp = panels / want > 1 ? panels / want : 1;
    const int64_t n_pg = (panels + r.gp - 1) / r.gp;   /* panel groups */
    r.mc = round_up(m, GEMM_MB);
    while (r.mc > GEMM_MB && n_pg * ((m + r.mc - 1) / r.mc) < want) r.mc = round_up(r.mc / 2, GEMM_MB);
    r.n_mc = (m + r.mc - 1) / r.mc;
    cpu_pool_run(pool, n_pg * r.n_mc, 0, qgemm_task, &r);
}

const cpu_qgemm_kernel *cpu_qkernels_family(enum cpu_qkernels k) {
    switch (k) {
    case CPU_QKERNELS_AVX2: return &cpu_qgemm_avx2;
    case CPU_QKERNELS_AVXVNNI: return &cpu_qgemm_avxvnni;
    case CPU_QKERNELS_AVX512VNNI: return &cpu_qgemm_avx512vnni;
    default: return &cpu_qgemm_scalar;
    }
}
