/*
 * cpu_gemm.c — the bf16 GEMM layer (cpu_gemm.h) around the kernel families: packing weights at
 * upload, casting activations to bf16 (with the RMSNorm fused in), cutting a run of products into
 * pool tasks, and the epilogues.
 *
 * A run: every product's output columns are cut into panels (4 groups = 64 outputs; SwiGLU: 2 gate
 * + 2 up groups = 32 outputs) and its rows into chunks of GEMM_MB-row blocks; one task is a group of
 * consecutive panels (about two tasks per slot) over one chunk of rows, so a weight panel is read
 * from memory once per chunk and reused from cache by every block of the chunk, and while a panel's
 * first block runs the kernel prefetches the next panel of the group (block_pf). Chunks are only
 * cut when the panel groups alone cannot keep every slot busy. A block's accumulators land in a
 * 12 KiB buffer on the slot's stack and the epilogue writes them out from there (store, residual
 * add, silu(gate) * up, bias).
 *
 * Does not: pick the kernel family (cpu_backend.c does, from cpu_features), run fp32 products.
 * Threading: entry points on the driving thread; tasks on pool slots.
 */
/* The branch-free helpers in cpu_internal.h only vectorise when float compares may be if-converted;
 * nothing here relies on floating-point exception flags. */
#pragma GCC optimize("no-trapping-math")

#include "backend/cpu/cpu_gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_build.h"
#include "backend/cpu/cpu_elem.h"
#include "backend/cpu/cpu_mem.h"
#include "backend/cpu/cpu_pool.h"
#include "util/log.h"

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---------------------------------------------------------------- packing */

typedef struct pack_run {
    const uint16_t *w;      /* [rows, cols] source, 2-byte aligned at least */
    cpu_packed     *pw;
} pack_run;

static void pack_task(void *arg, int64_t g, int slot) {
    (void)slot;
    const pack_run *r = arg;
    const cpu_packed *pw = r->pw;
    const int64_t kp2 = pw->kpad / 2, R = pw->rows, C = pw->cols;
    uint16_t *dst = pw->p + g * kp2 * 32;
    memset(dst, 0, (size_t)kp2 * 32 * sizeof *dst);
    uint32_t *d32 = (uint32_t *)dst;   /* one input pair of one row = 32 bits */
    for (int rr = 0; rr < 16 && 16 * g + rr < R; rr++) {
        const uint16_t *src = r->w + (16 * g + rr) * C;
        for (int64_t kk = 0; kk < C / 2; kk++) {
            uint32_t v;
            memcpy(&v, src + 2 * kk, sizeof v);
            d32[kk * 16 + rr] = v;
        }
        if (C & 1) dst[(C / 2) * 32 + 2 * rr] = src[C - 1];
    }
}

void cpu_packed_init(cpu_packed *out, const uint16_t *w, int64_t rows, int64_t cols, cpu_pool *pool) {
    CHECK(rows > 0 && cols > 0);
    memset(out, 0, sizeof *out);
    out->rows = rows;
    out->cols = cols;
    out->kpad = round_up(cols, 32);
    out->n_groups = (rows + 15) / 16;
    size_t bytes = (size_t)(out->n_groups * out->kpad * 16) * sizeof(uint16_t);
    out->p = cpu_mem_alloc(bytes);
    pack_run r = {.w = w, .pw = out};
    cpu_pool_run(pool, out->n_groups, 0, pack_task, &r);
}

void cpu_packed_free(cpu_packed *pw) {
    cpu_mem_free(pw->p);
    memset(pw, 0, sizeof *pw);
}

/* fp32 bit patterns over the float tile (a bf16 is the high half of its fp32) */
typedef uint32_t packed_word __attribute__((may_alias));

CPU_HOT_CLONES void cpu_packed_widen(const cpu_packed *pw, int64_t g0, int64_t ng, float *dst) {
    const int64_t kp2 = pw->kpad / 2, C = pw->cols, ld = 16 * ng;
    packed_word *d = (packed_word *)dst;
    for (int64_t kk = 0; kk < (C + 1) / 2; kk++)
        for (int64_t g = 0; g < ng; g++) {
            const packed_word *src = (const packed_word *)pw->p + ((g0 + g) * kp2 + kk) * 16;
            packed_word *de = d + 2 * kk * ld + 16 * g;
#pragma omp simd
            for (int r = 0; r < 16; r++) de[r] = src[r] << 16;
            if (2 * kk + 1 < C) {
#pragma omp simd
                for (int r = 0; r < 16; r++) de[ld + r] = src[r] & 0xffff0000u;
            }
        }
}

/* ---------------------------------------------------------------- activations -> bf16 */

CPU_WIDE_CLONES void cpu_row_to_bf16(const float *x, int64_t cols, int64_t kpad, const float *w, float scale,
                                     uint16_t *dst) {
    if (w) {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) dst[j] = cpu_f32_to_bf16(w[j] * (x[j] * scale));
    } else {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) dst[j] = cpu_f32_to_bf16(x[j]);
    }
    for (int64_t j = cols; j < kpad; j++) dst[j] = 0;
}

CPU_WIDE_CLONES void cpu_row_to_bf16_f32(const float *x, int64_t cols, int64_t kpad, const float *w, float scale,
                                         float *dst) {
    if (w) {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) dst[j] = cpu_bits_f32((uint32_t)cpu_f32_to_bf16(w[j] * (x[j] * scale)) << 16);
    } else {
#pragma omp simd
        for (int64_t j = 0; j < cols; j++) dst[j] = cpu_bits_f32((uint32_t)cpu_f32_to_bf16(x[j]) << 16);
    }
    for (int64_t j = cols; j < kpad; j++) dst[j] = 0.0f;
}

CPU_WIDE_CLONES static float row_sumsq(const float *x, int64_t n) {
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < n; j++) ss += x[j] * x[j];
    return ss;
}

typedef struct act_run {
    const float *x;
    int64_t      n, cols, kpad, rows_per;
    const float *normw;     /* [cols] or NULL */
    float        eps;
    int          f32;       /* dst holds fp32, else bf16 */
    void        *dst;
} act_run;

static void act_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const act_run *r = arg;
    for (int64_t i = t * r->rows_per; i < min64(r->n, (t + 1) * r->rows_per); i++) {
        const float *xr = r->x + i * r->cols;
        float scale = 1.0f;
        if (r->normw) scale = 1.0f / sqrtf(row_sumsq(xr, r->cols) / (float)r->cols + r->eps);
        if (r->f32) cpu_row_to_bf16_f32(xr, r->cols, r->kpad, r->normw, scale, (float *)r->dst + i * r->kpad);
        else cpu_row_to_bf16(xr, r->cols, r->kpad, r->normw, scale, (uint16_t *)r->dst + i * r->kpad);
    }
}

void cpu_act_to_bf16(cpu_pool *pool, const cpu_gemm_kernel *k, const float *x, int64_t n, int64_t cols, int64_t kpad,
                     const bweight *norm, float eps, void *dst) {
    if (n <= 0) return;
    float *wf = NULL;
    if (norm) {
        CHECK(norm->rows * norm->cols == cols);
        wf = xmalloc((size_t)cols * sizeof *wf);
        cpu_weight_to_f32(norm, 0, (size_t)cols, wf);
    }
    /* about 64k elements per task: big enough to be worth a hand-off, small enough to balance */
    int64_t rows_per = (65536 + cols - 1) / cols;
    act_run r = {.x = x, .n = n, .cols = cols, .kpad = kpad, .rows_per = rows_per, .normw = wf, .eps = eps,
                 .f32 = k->act_f32, .dst = dst};
    cpu_pool_run(pool, (n + rows_per - 1) / rows_per, 0, act_task, &r);
    free(wf);
}

/* ---------------------------------------------------------------- epilogues */

/* cpu_gemm.h */
CPU_WIDE_CLONES void cpu_gemm_epi_rows(enum cpu_epi epi, const float *c, int m, int ncols, int half,
                                       const float *bias, float *y, int64_t ldy) {
    for (int i = 0; i < m; i++) {
        const float *ci = c + i * 64;
        float *yi = y + i * ldy;
        if (epi == CPU_EPI_STORE) {
#pragma omp simd
            for (int j = 0; j < ncols; j++) yi[j] = ci[j] + bias[j];
        } else if (epi == CPU_EPI_ADD) {
#pragma omp simd
            for (int j = 0; j < ncols; j++) yi[j] += ci[j] + bias[j];
        } else {
#pragma omp simd
            for (int j = 0; j < ncols; j++) yi[j] = ci[j] / (1.0f + cpu_expf(-ci[j])) * ci[half + j];
        }
    }
}

/* ---------------------------------------------------------------- runs */

typedef struct gemm_run {
    const cpu_gemm_kernel *k;
    const char            *a;              /* activations (k's element type) */
    size_t                 asz;            /* bytes per activation element */
    int64_t                lda, m;
    const cpu_gemm_out    *outs;
    int64_t                pan_start[5];   /* panels of outs[0..o) */
    int64_t                gp;             /* consecutive panels per task */
    int64_t                mc, n_mc;       /* rows per chunk, chunks */
} gemm_run;

static int64_t out_panels(const cpu_gemm_out *o) {
    return o->epi == CPU_EPI_SWIGLU ? (o->w->n_groups + 1) / 2 : (o->w->n_groups + 3) / 4;
}

/* One panel of a run: its product, weight groups and output columns. */
typedef struct gemm_panel {
    const cpu_gemm_out *out;
    const uint16_t     *b[4];
    int                 ng, half;
    int64_t             col0, ncols;
} gemm_panel;

static void panel_of(const gemm_run *r, int64_t pan, gemm_panel *p) {
    int o = 0;
    while (pan >= r->pan_start[o + 1]) o++;
    const cpu_gemm_out *out = &r->outs[o];
    const cpu_packed *w = out->w;
    const int64_t pi = pan - r->pan_start[o], gsz = w->kpad * 16, R = w->rows;
    p->out = out;
    p->half = 0;
    if (out->epi == CPU_EPI_SWIGLU) {
        const int64_t g0 = 2 * pi;
        const int gpp = w->n_groups - g0 < 2 ? 1 : 2;   /* groups per half */
        for (int j = 0; j < gpp; j++) {
            p->b[j] = w->p + (g0 + j) * gsz;
            p->b[gpp + j] = out->w2->p + (g0 + j) * gsz;
        }
        p->ng = 2 * gpp;
        p->half = 16 * gpp;
        p->col0 = 16 * g0;
        p->ncols = min64(p->half, R - p->col0);
    } else {
        const int64_t g0 = 4 * pi;
        p->ng = (int)min64(4, w->n_groups - g0);
        for (int j = 0; j < p->ng; j++) p->b[j] = w->p + (g0 + j) * gsz;
        p->col0 = 16 * g0;
        p->ncols = min64(64, R - p->col0);
    }
}

/* One task: a group of consecutive panels over one chunk of rows. The first block of each panel
 * prefetches the next panel of the group (block_pf). */
static void gemm_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const gemm_run *r = arg;
    const int64_t pg = t / r->n_mc, i_lo = (t % r->n_mc) * r->mc, i_hi = min64(r->m, i_lo + r->mc);
    const int64_t p_lo = pg * r->gp, pan_end = min64(p_lo + r->gp, r->pan_start[4]);
    _Alignas(64) float c[GEMM_MB * 64];
    gemm_panel cur, nxt;
    panel_of(r, p_lo, &cur);
    if (r->k->begin) r->k->begin();
    for (int64_t pan = p_lo; pan < pan_end; pan++) {
        const int has_next = pan + 1 < pan_end;
        if (has_next) panel_of(r, pan + 1, &nxt);
        const cpu_gemm_out *out = cur.out;
        const int64_t R = out->w->rows;
        float bias[64] = {0};
        if (out->bias) cpu_weight_to_f32(out->bias, (size_t)cur.col0, (size_t)cur.ncols, bias);
        for (int64_t i0 = i_lo; i0 < i_hi; i0 += GEMM_MB) {
            const int mb = (int)min64(GEMM_MB, i_hi - i0);
            const int pf = has_next && i0 == i_lo;   /* the panel's first block fetches the next one */
            const void *a = r->a + (size_t)(i0 * r->lda) * r->asz;
            if (r->k->block_pf)
                r->k->block_pf(a, r->lda, mb, cur.b, cur.ng, out->w->kpad, c, pf ? nxt.b : NULL, pf ? nxt.ng : 0);
            else
                r->k->block(a, r->lda, mb, cur.b, cur.ng, out->w->kpad, c);
            cpu_gemm_epi_rows(out->epi, c, mb, (int)cur.ncols, cur.half, bias, out->y + i0 * R + cur.col0, R);
        }
        if (has_next) cur = nxt;
    }
    if (r->k->end) r->k->end();
}

void cpu_gemm_run(cpu_pool *pool, const cpu_gemm_kernel *k, const void *a, int64_t lda, int64_t m,
                  const cpu_gemm_out *outs, int n_out) {
    CHECK(n_out >= 1 && n_out <= 4 && k->block);
    if (m <= 0) return;
    gemm_run r = {.k = k, .a = a, .asz = cpu_gemm_act_size(k), .lda = lda, .m = m, .outs = outs};
    for (int o = 0; o < n_out; o++) {
        const cpu_gemm_out *out = &outs[o];
        CHECK(out->w && out->w->kpad == outs[0].w->kpad && out->w->kpad <= lda);
        CHECK((out->epi == CPU_EPI_SWIGLU) == (out->w2 != NULL) && (!out->w2 || !out->bias));
        CHECK(!out->w2 || (out->w2->rows == out->w->rows && out->w2->kpad == out->w->kpad));
        r.pan_start[o + 1] = r.pan_start[o] + out_panels(out);
    }
    for (int o = n_out; o < 4; o++) r.pan_start[o + 1] = r.pan_start[n_out];
    /* about two tasks per slot: consecutive panels share a task, so each can prefetch the next */
    const int64_t panels = r.pan_start[4], want = 2 * (int64_t)cpu_pool_size(pool);
    r.gp = panels / want > 1 ? panels / want : 1;
    const int64_t n_pg = (panels + r.gp - 1) / r.gp;   /* panel groups */
    r.mc = round_up(m, GEMM_MB);
    while (r.mc > GEMM_MB && n_pg * ((m + r.mc - 1) / r.mc) < want) r.mc = round_up(r.mc / 2, GEMM_MB);
    r.n_mc = (m + r.mc - 1) / r.mc;
    cpu_pool_run(pool, n_pg * r.n_mc, 0, gemm_task, &r);
}
