/*
 * cpu_backend.c — the CPU backend: fp32 activations in ordinary host memory, weights used in place
 * from the mmapped checkpoint (F32 directly, BF16/F16 converted per tile inside matmul, never
 * expanded for the whole model), OpenMP for parallel loops, single-threaded OpenBLAS per tile.
 * This file: init/free, weights, buffers and the element-wise ops (embed, rmsnorm, rope, swiglu,
 * add, get_rows, store_rows). matmul is in cpu_matmul.c, attention in cpu_attention.c.
 *
 * Does not: validate per-request input (model_forward does; a bad index here is a bug -> CHECK).
 * Threading: called from the engine thread that owns the backend; loops fan out to OpenMP workers.
 */
/* The branch-free helpers in cpu_internal.h (clamps, selects) only vectorise when float compares
 * may be if-converted; nothing here relies on floating-point exception flags. */
#pragma GCC optimize("no-trapping-math")

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

/* Below this many elements an element-wise op runs on the calling thread only: a parallel region
 * costs more than these memory-bound loops save, and much more when cores are oversubscribed. */
#define PAR_MIN_ELEMS (1 << 18)

static void *aligned_alloc64(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) UM_FATAL("out of memory (%zu bytes)", bytes);
    return p;
}

float *cpu_tbuf_reserve(cpu_tbuf *b, size_t n) {
    if (n > b->cap) {
        free(b->p);
        b->cap = n + n / 4;
        b->p = aligned_alloc64(b->cap * sizeof(float));
    }
    return b->p;
}

CPU_HOT_CLONES void cpu_weight_to_f32(const bweight *w, size_t off, size_t n, float *dst) {
    if (w->type == DTYPE_F32) {
        memcpy(dst, (const float *)w->data + off, n * sizeof(float));
    } else if (w->type == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)w->data + off;
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        CHECK(w->type == DTYPE_F16);
        const uint16_t *s = (const uint16_t *)w->data + off;
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = cpu_f16_to_f32(s[i]);
    }
}

/* ---------------------------------------------------------------- weights and buffers */

static int cpu_weight_upload(backend *be, const bweight_src *src, bweight *out, um_err *err) {
    (void)be, (void)err;
    memset(out, 0, sizeof *out);
    CHECK((src->type == DTYPE_F32 || src->type == DTYPE_BF16 || src->type == DTYPE_F16) && src->rows > 0 &&
          src->cols > 0);
    const size_t es = dtype_size(src->type), nbytes = (size_t)(src->rows * src->cols) * es;
    out->type = src->type;
    out->rows = src->rows;
    out->cols = src->cols;
    if ((uintptr_t)src->data % es == 0) {
        out->data = src->data;   /* a view into the mapping: no copy */
    } else {                     /* misaligned data section (legal in safetensors): aligned copy */
        out->owned = aligned_alloc64(nbytes);
        memcpy(out->owned, src->data, nbytes);
        out->data = out->owned;
    }
    return 0;
}

static void cpu_weight_free(backend *be, bweight *w) {
    (void)be;
    free(w->owned);
    memset(w, 0, sizeof *w);
}

static void *cpu_act_alloc(backend *be, size_t n) {
    (void)be;
    return aligned_alloc64(n * sizeof(float));
}

static void cpu_act_free(backend *be, void *p) {
    (void)be;
    free(p);
}

static void cpu_act_to_host(backend *be, const void *src, size_t n, float *dst) {
    (void)be;
    if (src != dst) memcpy(dst, src, n * sizeof(float));
}

/* ---------------------------------------------------------------- element-wise ops */

static void cpu_embed(backend *be, const bweight *wte, const int32_t *ids, int n, void *out) {
    float *o = out;
    int64_t d = wte->cols;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if ((int64_t)n * d >= PAR_MIN_ELEMS)
    for (int i = 0; i < n; i++) {
        CHECK(ids[i] >= 0 && ids[i] < wte->rows);
        cpu_weight_to_f32(wte, (size_t)ids[i] * (size_t)d, (size_t)d, o + (size_t)i * (size_t)d);
    }
}

static void cpu_rmsnorm(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out) {
    CHECK(w->rows * w->cols == d);
    float *wf = aligned_alloc64((size_t)d * sizeof(float));
    cpu_weight_to_f32(w, 0, (size_t)d, wf);
    const float *xs = x;
    float *o = out;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if ((int64_t)n * d >= PAR_MIN_ELEMS)
    for (int i = 0; i < n; i++) {
        const float *xr = xs + (size_t)i * (size_t)d;
        float *orow = o + (size_t)i * (size_t)d;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < d; j++) ss += xr[j] * xr[j];
        float r = 1.0f / sqrtf(ss / (float)d + eps);
#pragma omp simd
        for (int j = 0; j < d; j++) orow[j] = wf[j] * (xr[j] * r);
    }
    free(wf);
}

/* cos/sin table for these positions (cached across calls with the same positions). Angles are
 * computed in double so long positions keep full fp32 accuracy. */
static void rope_table(cpu_impl *ci, int n, int half, const int32_t *pos, float theta) {
    if (ci->rope_pos && ci->rope_n == n && ci->rope_half == half && ci->rope_theta == theta &&
        memcmp(ci->rope_pos, pos, (size_t)n * sizeof *pos) == 0)
        return;
    if ((int64_t)n * half > ci->rope_cap || n > ci->rope_pos_cap) {
        free(ci->rope_pos);
        free(ci->rope_cos);
        free(ci->rope_sin);
        ci->rope_cap = (int)((int64_t)n * half);
        ci->rope_pos_cap = n;
        ci->rope_pos = xmalloc((size_t)(n ? n : 1) * sizeof *ci->rope_pos);
        ci->rope_cos = aligned_alloc64((size_t)ci->rope_cap * sizeof(float));
        ci->rope_sin = aligned_alloc64((size_t)ci->rope_cap * sizeof(float));
    }
    double *inv = xmalloc((size_t)half * sizeof *inv);
    for (int j = 0; j < half; j++) inv[j] = pow((double)theta, -2.0 * j / (2.0 * half));
#pragma omp parallel for schedule(static) num_threads(ci->n_threads) if ((int64_t)n * half >= 4096)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < half; j++) {
            double a = (double)pos[i] * inv[j];
            ci->rope_cos[(size_t)i * half + j] = (float)cos(a);
            ci->rope_sin[(size_t)i * half + j] = (float)sin(a);
        }
    free(inv);
    memcpy(ci->rope_pos, pos, (size_t)n * sizeof *pos);
    ci->rope_n = n;
    ci->rope_half = half;
    ci->rope_theta = theta;
}

static void cpu_rope(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                     float theta) {
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim);
    cpu_impl *ci = cpu_impl_of(be);
    int half = rot_dim / 2;
    rope_table(ci, n, half, pos, theta);
    float *xs = x;
    const float *ct = ci->rope_cos, *st = ci->rope_sin;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if ((int64_t)n * n_heads * head_dim >= PAR_MIN_ELEMS)
    for (int i = 0; i < n; i++) {
        const float *c = ct + (size_t)i * half, *s = st + (size_t)i * half;
        for (int h = 0; h < n_heads; h++) {
            float *x1 = xs + ((size_t)i * n_heads + h) * head_dim, *x2 = x1 + half;
#pragma omp simd
            for (int j = 0; j < half; j++) {
                float a = x1[j], b = x2[j];
                x1[j] = a * c[j] - b * s[j];
                x2[j] = b * c[j] + a * s[j];
            }
        }
    }
}

CPU_HOT_CLONES static void swiglu_span(const float *g, const float *u, float *o, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
}

static void cpu_swiglu(backend *be, const void *gate, const void *up, size_t n, void *out) {
    const float *g = gate, *u = up;
    float *o = out;
    const size_t CH = 4096;
    size_t n_ch = (n + CH - 1) / CH;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n >= PAR_MIN_ELEMS)
    for (size_t c = 0; c < n_ch; c++) {
        size_t lo = c * CH, hi = lo + CH < n ? lo + CH : n;
        swiglu_span(g + lo, u + lo, o + lo, hi - lo);
    }
}

static void cpu_add(backend *be, void *x, const void *y, size_t n) {
    float *a = x;
    const float *b = y;
    const size_t CH = 8192;
    size_t n_ch = (n + CH - 1) / CH;
#pragma omp parallel for schedule(static) num_threads(be->n_threads) if (n >= 4 * PAR_MIN_ELEMS)
    for (size_t c = 0; c < n_ch; c++) {
        size_t lo = c * CH, hi = lo + CH < n ? lo + CH : n;
#pragma omp simd
        for (size_t i = lo; i < hi; i++) a[i] += b[i];
    }
}

static void cpu_get_rows(backend *be, const void *x, int d, const int32_t *rows, int n, void *out) {
    (void)be;
    const float *xs = x;
    float *o = out;
    for (int i = 0; i < n; i++) {
        CHECK(rows[i] >= 0);
        memmove(o + (size_t)i * d, xs + (size_t)rows[i] * d, (size_t)d * sizeof(float));
    }
}

static void cpu_store_rows(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start,
                           const int32_t *pos, void *const *dst) {
    (void)be;
    const float *xs = x;
    for (int s = 0; s < n_seqs; s++) {
        if (!dst[s]) continue;
        float *o = dst[s];
        for (int i = seq_start[s]; i < seq_start[s + 1]; i++) {
            CHECK(pos[i] >= 0);
            memcpy(o + (size_t)pos[i] * d, xs + (size_t)i * d, (size_t)d * sizeof(float));
        }
    }
}

static void cpu_free(backend *be) {
    cpu_impl *ci = cpu_impl_of(be);
    for (int t = 0; t < ci->n_threads; t++) {
        free(ci->wtile[t].p);
        free(ci->scores[t].p);
    }
    free(ci->wtile);
    free(ci->scores);
    free(ci->rope_pos);
    free(ci->rope_cos);
    free(ci->rope_sin);
    free(ci);
    free(be);
}

static const backend_ops k_cpu_ops = {
    .name = "cpu",
    .weight_upload = cpu_weight_upload,
    .weight_free = cpu_weight_free,
    .act_alloc = cpu_act_alloc,
    .act_free = cpu_act_free,
    .act_to_host = cpu_act_to_host,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .store_rows = cpu_store_rows,
    .free = cpu_free,
};

backend *backend_cpu_init(int n_threads) {
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    if (n_threads < 1) n_threads = 1;
    /* Parallelism comes from our OpenMP loops over tiles; each BLAS call stays on its thread. */
    openblas_set_num_threads(1);
    backend *be = xcalloc(1, sizeof *be);
    cpu_impl *ci = xcalloc(1, sizeof *ci);
    ci->n_threads = n_threads;
    ci->wtile = xcalloc((size_t)n_threads, sizeof *ci->wtile);
    ci->scores = xcalloc((size_t)n_threads, sizeof *ci->scores);
    be->ops = &k_cpu_ops;
    be->name = "cpu";
    be->act_dtype = DTYPE_F32;
    be->n_threads = n_threads;
    be->impl = ci;
    return be;
}
