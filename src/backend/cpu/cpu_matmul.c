/*
 * cpu_matmul.c — y[n, R] = x[n, C] · Wᵀ (+ bias) for a weight W[R, C] in F32, BF16, F16, Q8_0 or Q4_0.
 *
 * A quantized weight (Q8_0 / Q4_0, cpu_qgemm.h) runs on the int8 kernels: x quantized per row block
 * once, one run. A weight packed for the bf16 kernels (cpu_gemm.h) runs there when the backend's
 * dispatch (cpu_dispatch.c) gives its shape a kernel family: x cast to bf16 once, one GEMM run.
 * Everything else is the fp32 reference path: the output is cut into tiles of W rows (and, when W
 * has too few rows to keep every slot busy, also into chunks of x rows). Each pool slot takes a
 * tile, converts that slice of W to f32 in its own scratch buffer (BF16/F16 only; F32 weights are
 * read in place; a packed weight is widened from its packed copy, input-major, so the checkpoint's
 * pages are not read again) and runs one single-threaded cblas_sgemm on it. So a bf16 model never
 * exists in f32 as a whole, and each W tile is converted once per call however many rows x has.
 *
 * Does not: validate shapes beyond CHECKs (callers pass consistent sizes).
 * Threading: called by the backend's engine thread; the tiles run on pool slots.
 */
#include <cblas.h>

#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

#define TILE_MAX_FLOATS (1u << 20)   /* converted W tile per slot: at most 4 MiB */

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

typedef struct mm_run {
    cpu_impl      *ci;
    const float   *x;
    const bweight *w, *bias;
    const cpu_packed *pw;          /* w's packed copy (tiles are widened from it), or NULL */
    float         *y;
    int64_t        n, R, C;
    int64_t        tr, n_xc, xc;   /* W rows per tile, x chunks, x rows per chunk */
} mm_run;

static void mm_task(void *arg, int64_t t, int slot) {
    const mm_run *r = arg;
    const int64_t R = r->R, C = r->C;
    int64_t rt = t / r->n_xc, c = t % r->n_xc;
    int64_t r0 = rt * r->tr, nr = R - r0 < r->tr ? R - r0 : r->tr;
    int64_t i0 = c * r->xc, ni = r->n - i0 < r->xc ? r->n - i0 : r->xc;
    if (ni <= 0) return;
    float *yt = r->y + i0 * R + r0;
    if (r->pw) {   /* tr is a multiple of 16: the tile is whole groups, widened input-major */
        const int64_t ng = (nr + 15) / 16;
        float *buf = cpu_tbuf_reserve(&r->ci->wtile[slot], (size_t)(16 * ng * C));
        cpu_packed_widen(r->pw, r0 / 16, ng, buf);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)ni, (int)nr, (int)C, 1.0f, r->x + i0 * C, (int)C,
                    buf, (int)(16 * ng), 0.0f, yt, (int)R);
    } else {
        const float *wt;
        if (r->w->type == DTYPE_F32) {
            wt = (const float *)r->w->data + r0 * C;
        } else {
            float *buf = cpu_tbuf_reserve(&r->ci->wtile[slot], (size_t)(nr * C));
            cpu_weight_to_f32(r->w, (size_t)(r0 * C), (size_t)(nr * C), buf);
            wt = buf;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nr, (int)C, 1.0f, r->x + i0 * C, (int)C, wt,
                    (int)C, 0.0f, yt, (int)R);
    }
    if (r->bias) {
        float bb[256];
        for (int64_t j0 = 0; j0 < nr; j0 += 256) {
            int64_t nj = nr - j0 < 256 ? nr - j0 : 256;
            cpu_weight_to_f32(r->bias, (size_t)(r0 + j0), (size_t)nj, bb);
            for (int64_t i = 0; i < ni; i++) {
                float *row = yt + i * R + j0;
#pragma omp simd
                for (int64_t j = 0; j < nj; j++) row[j] += bb[j];
            }
        }
    }
}

/* The fp32 reference product (module comment); pw: w's packed copy or NULL. */
static void matmul_fp32(cpu_impl *ci, const float *x, const bweight *w, const cpu_packed *pw, const bweight *bias, int n,
                        float *y) {
    const int64_t R = w->rows, C = w->cols;
    const int nt = ci->n_threads;
    /* Tile height: tall tiles amortise the packing of x inside sgemm when x has many rows; short
     * tiles when x is small (then the work is streaming W, and more tiles balance better). */
    int64_t tr = n >= 32 ? 256 : 64;
    int64_t cap = (int64_t)TILE_MAX_FLOATS / C;
    if (cap < 8) cap = 8;
    int64_t fair = round_up((R + 2 * nt - 1) / (2 * nt), 16);   /* >= 2 tiles per slot if possible */
    if (tr > cap) tr = cap;
    if (tr > fair) tr = fair;
    /* whole packed groups; the same tiles with and without a packed copy, so the fp32 path gives the
     * same bits on packed weights (auto on an AVX2-only CPU) as on unpacked ones (--cpu-kernels fp32):
     * OpenBLAS's sums depend on the tile width */
    tr = tr / 16 * 16;
    if (tr < 16) tr = 16;
    int64_t n_rt = (R + tr - 1) / tr;
    /* Chunks of x rows, only when W tiles alone cannot occupy the slots. */
    int64_t n_xc = 1;
    if (n_rt < 2 * nt && n >= 64) {
        n_xc = (2 * nt + n_rt - 1) / n_rt;
        if (n_xc > n / 32) n_xc = n / 32;
        if (n_xc < 1) n_xc = 1;
    }
    mm_run r = {.ci = ci, .x = x, .w = w, .pw = pw, .bias = bias, .y = y, .n = n, .R = R, .C = C, .tr = tr, .n_xc = n_xc,
                .xc = (n + n_xc - 1) / n_xc};
    cpu_pool_run(ci->pool, n_rt * n_xc, 0, mm_task, &r);
}

void cpu_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y) {
    if (n <= 0) return;
    cpu_impl *ci = cpu_impl_of(be);
    CHECK(w->rows > 0 && w->cols > 0);
    CHECK(!bias || bias->rows * bias->cols == w->rows);
    const cpu_qpacked *qw = cpu_weight_qpacked(w);
    if (qw) {   /* quantized: activations quantized per row block, int8 products (cpu_qgemm.h) */
        cpu_qact a;
        cpu_act_to_q8(ci->pool, x, n, w->cols, qw->kpad, NULL, 0.0f, cpu_qbuf_reserve(ci, n, qw->kpad), &a);
        const cpu_qgemm_out out = {.w = qw, .epi = CPU_EPI_STORE, .bias = bias, .y = y};
        cpu_qgemm_run(ci->pool, ci->qgemm, &a, n, &out, 1);
        return;
    }
    const cpu_packed *pw = cpu_weight_packed(w);
    const cpu_gemm_kernel *k = pw ? cpu_dispatch_gemm(ci, n, w->rows, w->cols) : NULL;
    if (!k) {
        matmul_fp32(ci, x, w, pw, bias, n, y);
        return;
    }
    void *a = cpu_abuf_reserve(ci, (size_t)n * (size_t)pw->kpad * cpu_gemm_act_size(k));
    cpu_act_to_bf16(ci->pool, k, x, n, w->cols, pw->kpad, NULL, 0.0f, a);
    const cpu_gemm_out out = {.w = pw, .epi = CPU_EPI_STORE, .bias = bias, .y = y};
    cpu_gemm_run(ci->pool, k, a, pw->kpad, n, &out, 1);
}
