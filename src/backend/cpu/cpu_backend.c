/*
 * cpu_backend.c — the CPU backend: fp32 activations in ordinary host memory; BF16 weights packed
 * once at upload for the bf16 kernels (cpu_gemm.h) when this CPU has them, else used in place from
 * the mmapped checkpoint and widened per tile inside the fp32 matmul (F32 weights are read in
 * place; F16 take the fp32 path); matrices quantized to Q8_0 / Q4_0 at upload (or uploaded so)
 * repacked for the int8 kernels (cpu_qgemm.h), their only copy; one thread pool (cpu_pool.h) for
 * every parallel loop, single-threaded OpenBLAS inside its tasks.
 * This file: init/free, weights, buffers, the fused linear op and the element-wise ops (embed,
 * rmsnorm, rope, swiglu, add, get_rows, store_rows). matmul is in cpu_matmul.c, attention in
 * cpu_attention.c.
 *
 * Does not: validate per-request input (model_forward does; a bad index here is a bug -> CHECK).
 * Threading: called from the engine thread that owns the backend; loops fan out to the pool.
 */
/* The branch-free helpers in cpu_internal.h (clamps, selects) only vectorise when float compares
 * may be if-converted; nothing here relies on floating-point exception flags. */
#pragma GCC optimize("no-trapping-math")

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_decode.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/cpu/cpu_mem.h"
#include "util/log.h"
#include "util/quant.h"
#include "util/timeutil.h"

/* Below this many elements an element-wise op runs on the calling thread only: handing it out
 * costs more than these memory-bound loops save, and much more when cores are oversubscribed. */
#define PAR_MIN_ELEMS (1 << 18)
/* Elements per task of the element-wise loops. */
#define EW_GRAIN 16384

typedef struct range_run {
    cpu_range_fn fn;
    void        *arg;
    int64_t      n, grain;
} range_run;

static void range_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const range_run *r = arg;
    int64_t lo = t * r->grain, hi = lo + r->grain < r->n ? lo + r->grain : r->n;
    r->fn(r->arg, lo, hi);
}

void cpu_parallel_for(cpu_impl *ci, int64_t n, int64_t grain, int parallel, cpu_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    range_run r = {.fn = fn, .arg = arg, .n = n, .grain = grain};
    cpu_pool_run(ci->pool, (n + grain - 1) / grain, parallel ? 0 : 1, range_task, &r);
}

void *cpu_qbuf_reserve(cpu_impl *ci, int64_t n, int64_t kpad) {
    const size_t bytes = cpu_qact_bytes(n, kpad);
    if (bytes > ci->qbuf_cap) {
        cpu_mem_free(ci->qbuf);
        ci->qbuf_cap = bytes + bytes / 4;
        ci->qbuf = cpu_mem_alloc(ci->qbuf_cap);
    }
    return ci->qbuf;
}

void *cpu_abuf_reserve(cpu_impl *ci, size_t n) {
    if (n > ci->abuf_cap) {
        cpu_mem_free(ci->abuf);
        ci->abuf_cap = n + n / 4;
        ci->abuf = cpu_mem_alloc(ci->abuf_cap);
    }
    return ci->abuf;
}

float *cpu_tbuf_reserve(cpu_tbuf *b, size_t n) {
    if (n > b->cap) {
        cpu_mem_free(b->p);
        b->cap = n + n / 4;
        b->p = cpu_mem_alloc(b->cap * sizeof(float));
    }
    return b->p;
}


/* ---------------------------------------------------------------- weights and buffers */

/* Pack BF16 weights for the bf16 kernels, unless the caller only gathers rows of them (vectors such
 * as norm weights are packed too: small, and a [1, C] weight may be a product's). */
static int wants_packing(const cpu_impl *ci, const bweight_src *src) {
    return ci->gemm && src->type == DTYPE_BF16 && !src->rows_only;
}

/* The quantized type a matrix is stored in: its own when the source is quantized, else the one the
 * caller asks for; 0 (DTYPE_F32) when it stays as it is. Gather-only weights are not repacked (a
 * quantized embedding stays a view of its blocks, dequantized row by row). */
static enum dtype quant_of(const bweight_src *src) {
    if (src->rows_only) return DTYPE_F32;
    if (dtype_is_quant(src->type)) return src->type;
    return dtype_is_quant(src->quant) ? src->quant : DTYPE_F32;
}

static int cpu_weight_upload(backend *be, const bweight_src *src, bweight *out, um_err *err) {
    (void)err;
    cpu_impl *ci = cpu_impl_of(be);
    memset(out, 0, sizeof *out);
    CHECK((src->type == DTYPE_F32 || src->type == DTYPE_BF16 || src->type == DTYPE_F16 || dtype_is_quant(src->type)) &&
          src->rows > 0 && src->cols > 0);
    CHECK(!dtype_is_quant(src->type) || src->cols % DTYPE_QBLOCK == 0);
    const enum dtype q = quant_of(src);
    if (dtype_is_quant(q)) {   /* the packed quantized blocks are the only copy kept */
        cpu_wmem *m = xcalloc(1, sizeof *m);
        cpu_qpacked_init(&m->qpacked, q, src->data, src->type, src->rows, src->cols, ci->pool);
        *out = (bweight){.data = m->qpacked.p, .type = q, .rows = src->rows, .cols = src->cols, .owned = m};
        return 0;
    }
    if (dtype_is_quant(src->type)) {   /* a gather-only view of quantized rows */
        *out = (bweight){.data = src->data, .type = src->type, .rows = src->rows, .cols = src->cols};
        return 0;
    }
    const size_t es = dtype_size(src->type), nbytes = (size_t)(src->rows * src->cols) * es;
    out->type = src->type;
    out->rows = src->rows;
    out->cols = src->cols;
    out->data = src->data;   /* a view into the mapping: no copy */
    const int pack = wants_packing(ci, src);
    if ((uintptr_t)src->data % es != 0 || pack) {
        cpu_wmem *m = xcalloc(1, sizeof *m);
        if ((uintptr_t)src->data % es != 0) {   /* misaligned data section (legal in safetensors) */
            m->copy = cpu_mem_alloc(nbytes);
            memcpy(m->copy, src->data, nbytes);
            out->data = m->copy;
        }
        if (pack) cpu_packed_init(&m->packed, out->data, src->rows, src->cols, ci->pool);
        out->owned = m;
    }
    return 0;
}

static void cpu_weight_free(backend *be, bweight *w) {
    (void)be;
    cpu_wmem *m = w->owned;
    if (m) {
        cpu_packed_free(&m->packed);
        cpu_qpacked_free(&m->qpacked);
        cpu_mem_free(m->copy);
        free(m);
    }
    memset(w, 0, sizeof *w);
}

/* A quantized or bf16-packed matrix is all its products read; anything else reads bweight.data (a
 * packed [1, C] vector is also a norm weight, read through data). */
static int cpu_weight_keeps_source(backend *be, const bweight *w) {
    (void)be;
    const cpu_wmem *m = w->owned;
    if (m && m->qpacked.p) return 0;
    if (m && m->packed.p && !m->copy && w->rows > 1) return 0;
    return !(m && m->copy);
}

/* Activation buffers and KV cache slots: big ones come back from the cache with their pages mapped */
static void *cpu_act_alloc(backend *be, size_t n) { return cpu_mem_cache_alloc(&cpu_impl_of(be)->act_cache, n * sizeof(float)); }

static void cpu_act_free(backend *be, void *p) { cpu_mem_cache_put(&cpu_impl_of(be)->act_cache, p); }

static void cpu_act_to_host(backend *be, const void *src, size_t n, float *dst) {
    (void)be;
    if (src != dst) memcpy(dst, src, n * sizeof(float));
}

/* ---------------------------------------------------------------- the fused linear op */

/* backend_linear on quantized weights (every w[j] quantized, of one type): the input quantized once
 * (RMSNorm included), every product one run of the quantized layer with its epilogue. */
static void cpu_linear_quant(cpu_impl *ci, const blinear *op, const cpu_qpacked *const *qw) {
    if (op->n <= 0) return;
    cpu_qact a;
    cpu_act_to_q8(ci->pool, op->x, op->n, op->w[0]->cols, qw[0]->kpad, op->norm, op->eps,
                  cpu_qbuf_reserve(ci, op->n, qw[0]->kpad), &a);
    cpu_qgemm_out outs[3];
    int n_out = 1;
    memset(outs, 0, sizeof outs);
    if (op->epi == BLIN_STORE) {
        n_out = op->n_w;
        for (int j = 0; j < n_out; j++) outs[j] = (cpu_qgemm_out){.w = qw[j], .epi = CPU_EPI_STORE, .y = op->y[j]};
    } else if (op->epi == BLIN_ADD) {
        CHECK(op->n_w == 1);
        outs[0] = (cpu_qgemm_out){.w = qw[0], .epi = CPU_EPI_ADD, .y = op->y[0]};
    } else {
        CHECK(op->n_w == 2);
        outs[0] = (cpu_qgemm_out){.w = qw[0], .w2 = qw[1], .epi = CPU_EPI_SWIGLU, .y = op->y[0]};
    }
    cpu_qgemm_run(ci->pool, ci->qgemm, &a, op->n, outs, n_out);
}

/* backend_linear: on quantized weights the quantized layer; on packed weights whose shape the
 * dispatch gives a kernel family, the input is cast to the family's activations once (RMSNorm
 * included) and every product of the op is one run of the GEMM layer with its epilogue; anything
 * else runs as the single ops (the fp32 path). */
static void cpu_linear(backend *be, const blinear *op) {
    cpu_impl *ci = cpu_impl_of(be);
    const cpu_qpacked *qw[3] = {NULL, NULL, NULL};
    int quant = op->n_w >= 1 && op->n_w <= 3;
    for (int j = 0; quant && j < op->n_w; j++)
        quant = (qw[j] = cpu_weight_qpacked(op->w[j])) != NULL && qw[j]->type == qw[0]->type;
    if (quant) {
        cpu_linear_quant(ci, op, qw);
        return;
    }
    const cpu_packed *pw[3] = {NULL, NULL, NULL};
    int packed = op->n_w >= 1 && op->n_w <= 3;
    for (int j = 0; packed && j < op->n_w; j++) packed = (pw[j] = cpu_weight_packed(op->w[j])) != NULL;
    const cpu_gemm_kernel *k = packed ? cpu_dispatch_gemm(ci, op->n, op->w[0]->rows, op->w[0]->cols) : NULL;
    if (!k) {
        backend_linear_unfused(be, op);
        return;
    }
    if (op->n <= 0) return;
    const int64_t C = op->w[0]->cols, kpad = pw[0]->kpad;
    void *a = cpu_abuf_reserve(ci, (size_t)op->n * (size_t)kpad * cpu_gemm_act_size(k));
    cpu_act_to_bf16(ci->pool, k, op->x, op->n, C, kpad, op->norm, op->eps, a);
    cpu_gemm_out outs[3];
    int n_out = 1;
    memset(outs, 0, sizeof outs);
    if (op->epi == BLIN_STORE) {
        n_out = op->n_w;
        for (int j = 0; j < n_out; j++) outs[j] = (cpu_gemm_out){.w = pw[j], .epi = CPU_EPI_STORE, .y = op->y[j]};
    } else if (op->epi == BLIN_ADD) {
        CHECK(op->n_w == 1);
        outs[0] = (cpu_gemm_out){.w = pw[0], .epi = CPU_EPI_ADD, .y = op->y[0]};
    } else {
        CHECK(op->n_w == 2);
        outs[0] = (cpu_gemm_out){.w = pw[0], .w2 = pw[1], .epi = CPU_EPI_SWIGLU, .y = op->y[0]};
    }
    cpu_gemm_run(ci->pool, k, a, kpad, op->n, outs, n_out);
}

/* ---------------------------------------------------------------- element-wise ops */

typedef struct embed_run {
    const bweight *wte;
    const int32_t *ids;
    float         *out;
} embed_run;

static void embed_range(void *arg, int64_t lo, int64_t hi) {
    const embed_run *r = arg;
    const int64_t d = r->wte->cols;
    for (int64_t i = lo; i < hi; i++) {
        CHECK(r->ids[i] >= 0 && r->ids[i] < r->wte->rows);
        cpu_weight_to_f32(r->wte, (size_t)r->ids[i] * (size_t)d, (size_t)d, r->out + i * d);
    }
}

static void cpu_embed(backend *be, const bweight *wte, const int32_t *ids, int n, void *out) {
    embed_run r = {.wte = wte, .ids = ids, .out = out};
    const int64_t d = wte->cols;
    cpu_parallel_for(cpu_impl_of(be), n, (EW_GRAIN + d - 1) / d, (int64_t)n * d >= PAR_MIN_ELEMS, embed_range, &r);
}

typedef struct rmsnorm_run {
    const float *x, *wf;
    float       *out;
    int          d;
    float        eps;
} rmsnorm_run;

CPU_HOT_CLONES static void rmsnorm_range(void *arg, int64_t lo, int64_t hi) {
    const rmsnorm_run *r = arg;
    const int d = r->d;
    for (int64_t i = lo; i < hi; i++) {
        const float *xr = r->x + i * d;
        float *orow = r->out + i * d;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int j = 0; j < d; j++) ss += xr[j] * xr[j];
        float s = 1.0f / sqrtf(ss / (float)d + r->eps);
#pragma omp simd
        for (int j = 0; j < d; j++) orow[j] = r->wf[j] * (xr[j] * s);
    }
}

static void cpu_rmsnorm(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out) {
    CHECK(w->rows * w->cols == d);
    float *wf = cpu_mem_alloc((size_t)d * sizeof(float));
    cpu_weight_to_f32(w, 0, (size_t)d, wf);
    rmsnorm_run r = {.x = x, .wf = wf, .out = out, .d = d, .eps = eps};
    cpu_parallel_for(cpu_impl_of(be), n, (EW_GRAIN + d - 1) / d, (int64_t)n * d >= PAR_MIN_ELEMS, rmsnorm_range, &r);
    cpu_mem_free(wf);
}

typedef struct rope_table_run {
    cpu_impl      *ci;
    const int32_t *pos;
    const double  *inv;
    int            half;
} rope_table_run;

static void rope_table_range(void *arg, int64_t lo, int64_t hi) {
    const rope_table_run *r = arg;
    const int half = r->half;
    for (int64_t i = lo; i < hi; i++)
        for (int j = 0; j < half; j++) {
            double a = (double)r->pos[i] * r->inv[j];
            r->ci->rope_cos[(size_t)i * half + j] = (float)cos(a);
            r->ci->rope_sin[(size_t)i * half + j] = (float)sin(a);
        }
}

/* cos/sin table for these positions (cached across calls with the same positions). Angles are
 * computed in double so long positions keep full fp32 accuracy. */
static void rope_table(cpu_impl *ci, int n, int half, const int32_t *pos, float theta) {
    if (ci->rope_pos && ci->rope_n == n && ci->rope_half == half && ci->rope_theta == theta &&
        memcmp(ci->rope_pos, pos, (size_t)n * sizeof *pos) == 0)
        return;
    if ((int64_t)n * half > ci->rope_cap || n > ci->rope_pos_cap) {
        free(ci->rope_pos);
        cpu_mem_free(ci->rope_cos);
        cpu_mem_free(ci->rope_sin);
        ci->rope_cap = (int)((int64_t)n * half);
        ci->rope_pos_cap = n;
        ci->rope_pos = xmalloc((size_t)(n ? n : 1) * sizeof *ci->rope_pos);
        ci->rope_cos = cpu_mem_alloc((size_t)ci->rope_cap * sizeof(float));
        ci->rope_sin = cpu_mem_alloc((size_t)ci->rope_cap * sizeof(float));
    }
    double *inv = xmalloc((size_t)half * sizeof *inv);
    for (int j = 0; j < half; j++) inv[j] = pow((double)theta, -2.0 * j / (2.0 * half));
    rope_table_run r = {.ci = ci, .pos = pos, .inv = inv, .half = half};
    cpu_parallel_for(ci, n, (256 + half - 1) / half, (int64_t)n * half >= 4096, rope_table_range, &r);
    free(inv);
    memcpy(ci->rope_pos, pos, (size_t)n * sizeof *pos);
    ci->rope_n = n;
    ci->rope_half = half;
    ci->rope_theta = theta;
}

typedef struct rope_run {
    float       *x;
    const float *ct, *st;
    int          n_heads, head_dim, half;
} rope_run;

CPU_HOT_CLONES static void rope_range(void *arg, int64_t lo, int64_t hi) {
    const rope_run *r = arg;
    const int half = r->half;
    for (int64_t i = lo; i < hi; i++) {
        const float *c = r->ct + (size_t)i * half, *s = r->st + (size_t)i * half;
        for (int h = 0; h < r->n_heads; h++) {
            float *x1 = r->x + ((size_t)i * r->n_heads + h) * r->head_dim, *x2 = x1 + half;
#pragma omp simd
            for (int j = 0; j < half; j++) {
                float a = x1[j], b = x2[j];
                x1[j] = a * c[j] - b * s[j];
                x2[j] = b * c[j] + a * s[j];
            }
        }
    }
}

static void cpu_rope(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                     float theta) {
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim);
    cpu_impl *ci = cpu_impl_of(be);
    int half = rot_dim / 2;
    rope_table(ci, n, half, pos, theta);
    rope_run r = {.x = x, .ct = ci->rope_cos, .st = ci->rope_sin, .n_heads = n_heads, .head_dim = head_dim,
                  .half = half};
    const int64_t row = (int64_t)n_heads * head_dim;
    cpu_parallel_for(ci, n, (EW_GRAIN + row - 1) / row, (int64_t)n * row >= PAR_MIN_ELEMS, rope_range, &r);
}

typedef struct ew_run {
    const float *g, *u;
    float       *o;
} ew_run;

/* silu(g) * u; the sigmoid's tail underflows (tiny results, flushed by the pool's FTZ mode) */
CPU_HOT_CLONES static void swiglu_range(void *arg, int64_t lo, int64_t hi) {
    const ew_run *r = arg;
    const float *g = r->g, *u = r->u;
    float *o = r->o;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) o[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
}

static void cpu_swiglu(backend *be, const void *gate, const void *up, size_t n, void *out) {
    ew_run r = {.g = gate, .u = up, .o = out};
    cpu_parallel_for(cpu_impl_of(be), (int64_t)n, EW_GRAIN, n >= PAR_MIN_ELEMS, swiglu_range, &r);
}

CPU_HOT_CLONES static void add_range(void *arg, int64_t lo, int64_t hi) {
    const ew_run *r = arg;
    const float *b = r->g;
    float *a = r->o;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) a[i] += b[i];
}

static void cpu_add(backend *be, void *x, const void *y, size_t n) {
    ew_run r = {.g = y, .o = x};
    cpu_parallel_for(cpu_impl_of(be), (int64_t)n, 4 * EW_GRAIN, n >= 4 * PAR_MIN_ELEMS, add_range, &r);
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

typedef struct combine_run {
    float         *x;
    const float   *y;
    int            d, k;
    const int32_t *slot;
    const float   *w;
} combine_run;

static void combine_range(void *arg, int64_t lo, int64_t hi) {
    const combine_run *r = arg;
    for (int64_t t = lo; t < hi; t++) {
        float *xr = r->x + (size_t)t * (size_t)r->d;
        for (int j = 0; j < r->k; j++) {
            const int32_t sl = r->slot[t * r->k + j];
            if (sl < 0) continue;
            const float wj = r->w[t * r->k + j], *yr = r->y + (size_t)sl * (size_t)r->d;
#pragma omp simd
            for (int i = 0; i < r->d; i++) xr[i] += wj * yr[i];
        }
    }
}

/* f32 activations: accumulating the k terms into the f32 row is the fp32 sum the op asks for */
static void cpu_moe_combine(backend *be, void *x, const void *y, int d, int n, int k, const int32_t *slot,
                            const float *w) {
    cpu_impl *ci = cpu_impl_of(be);
    combine_run r = {.x = x, .y = y, .d = d, .k = k, .slot = slot, .w = w};
    const int64_t work = (int64_t)d * k;
    cpu_parallel_for(ci, n, (EW_GRAIN + work - 1) / work, (int64_t)n * work >= PAR_MIN_ELEMS, combine_range, &r);
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
    cpu_pool_free(ci->pool);
    for (int t = 0; t < ci->n_threads; t++) {
        cpu_mem_free(ci->wtile[t].p);
        cpu_mem_free(ci->scores[t].p);
    }
    free(ci->wtile);
    free(ci->scores);
    cpu_mem_free(ci->abuf);
    cpu_mem_free(ci->qbuf);
    cpu_mem_free(ci->attn_kv.p);
    free(ci->rope_pos);
    cpu_mem_free(ci->rope_cos);
    cpu_mem_free(ci->rope_sin);
    cpu_mem_cache_free(&ci->act_cache);
    free(ci->description);
    free(ci);
    free(be);
}

static void cpu_host_parallel_for(backend *be, int64_t n, int64_t grain, backend_range_fn fn, void *arg) {
    cpu_parallel_for(cpu_impl_of(be), n, grain, 1, fn, arg);
}

/* Timed events (the optional event members without the rest of BACKEND_CAP_DEVICE_DECODE): every
 * CPU op has finished when its call returns, so an event is the host clock when it is recorded
 * (per-op profiles: backend_prof.c). */
struct backend_event {
    uint64_t ns;   /* time_now_ns() at the last record */
};
static backend_event *cpu_event_new(backend *be) {
    (void)be;
    return xcalloc(1, sizeof(backend_event));
}
static void cpu_event_free(backend *be, backend_event *e) {
    (void)be;
    free(e);
}
static void cpu_event_record(backend *be, backend_event *e) {
    (void)be;
    e->ns = time_now_ns();
}
static int cpu_event_query(backend *be, backend_event *e) {
    (void)be, (void)e;
    return 1;
}
static void cpu_event_wait(backend *be, backend_event *e) { (void)be, (void)e; }
static double cpu_event_elapsed_ms(backend *be, backend_event *a, backend_event *b) {
    (void)be;
    return (double)(int64_t)(b->ns - a->ns) * 1e-6;
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
    .moe_combine = cpu_moe_combine,
    .free = cpu_free,
    .linear = cpu_linear,
    .host_parallel_for = cpu_host_parallel_for,
    .weight_keeps_source = cpu_weight_keeps_source,
    .quant_weights = 1,
    .event_new = cpu_event_new,
    .event_free = cpu_event_free,
    .event_record = cpu_event_record,
    .event_query = cpu_event_query,
    .event_wait = cpu_event_wait,
    .event_elapsed_ms = cpu_event_elapsed_ms,
};

enum backend_cpu_kernels backend_cpu_kernels_of(const backend *be) {
    return be->ops == &k_cpu_ops ? ((const cpu_impl *)be->impl)->kernels : BACKEND_CPU_KERNELS_FP32;
}

/* CPUs this process may run on (taskset / cgroup aware). */
static int cpus_allowed(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return (int)sysconf(_SC_NPROCESSORS_ONLN);
}

backend *backend_cpu_init(int n_threads) { return backend_cpu_init_opts(n_threads, NULL); }

/* The pool's slots are pinned to CPUs only with o->cpu_pin (docs/cpu-kernels.md: on a machine shared
 * with other work, pinned threads cannot move away from a busy core). */
backend *backend_cpu_init_opts(int n_threads, const backend_options *o) {
    if (n_threads <= 0) n_threads = cpus_allowed();
    if (n_threads < 1) n_threads = 1;
    /* Parallelism comes from our pool; each BLAS call stays on the slot that makes it. */
    openblas_set_num_threads(1);
    backend *be = xcalloc(1, sizeof *be);
    cpu_impl *ci = xcalloc(1, sizeof *ci);
    ci->n_threads = n_threads;
    cpu_mem_cache_init(&ci->act_cache);
    ci->pool = cpu_pool_init(n_threads, o && o->cpu_pin);
    int automatic = 0;
    const enum backend_cpu_kernels k = cpu_kernels_resolve(&automatic);
    cpu_dispatch_init(ci, k, automatic, cpu_qkernels_resolve());
    ci->wtile = xcalloc((size_t)n_threads, sizeof *ci->wtile);
    ci->scores = xcalloc((size_t)n_threads, sizeof *ci->scores);
    be->ops = &k_cpu_ops;
    be->name = "cpu";
    be->description = ci->description;
    be->act_dtype = DTYPE_F32;
    be->n_threads = n_threads;
    be->impl = ci;
    return be;
}
