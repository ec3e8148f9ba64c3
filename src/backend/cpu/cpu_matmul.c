/*
 * cpu_matmul.c — y[n, R] = x[n, C] · Wᵀ (+ bias) for a weight W[R, C] in F32, BF16 or F16.
 *
 * The output is cut into tiles of W rows (and, when W has too few rows to keep every thread busy,
 * also into chunks of x rows). Each OpenMP worker takes a tile, converts that slice of W to f32 in
 * its own scratch buffer (BF16/F16 only; F32 weights are read in place) and runs one
 * single-threaded cblas_sgemm on it. So a bf16 model never exists in f32 as a whole, and each W
 * tile is converted once per call however many rows x has.
 *
 * Does not: validate shapes beyond CHECKs (callers pass consistent sizes).
 * Threading: called by the backend's engine thread; the tiles run on OpenMP workers.
 */
#include <cblas.h>
#include <omp.h>

#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

#define TILE_MAX_FLOATS (1u << 20)   /* converted W tile per thread: at most 4 MiB */

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

void cpu_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y) {
    if (n <= 0) return;
    cpu_impl *ci = cpu_impl_of(be);
    const float *xs = x;
    float *ys = y;
    const int64_t R = w->rows, C = w->cols;
    const int nt = be->n_threads;
    CHECK(R > 0 && C > 0);
    CHECK(!bias || bias->rows * bias->cols == R);

    /* Tile height: tall tiles amortise the packing of x inside sgemm when x has many rows; short
     * tiles when x is small (then the work is streaming W, and more tiles balance better). */
    int64_t tr = n >= 32 ? 256 : 64;
    int64_t cap = (int64_t)TILE_MAX_FLOATS / C;
    if (cap < 8) cap = 8;
    int64_t fair = round_up((R + 2 * nt - 1) / (2 * nt), 8);   /* >= 2 tiles per thread if possible */
    if (tr > cap) tr = cap;
    if (tr > fair) tr = fair;
    tr = tr / 8 * 8;
    if (tr < 8) tr = 8;
    int64_t n_rt = (R + tr - 1) / tr;
    /* Chunks of x rows, only when W tiles alone cannot occupy the threads. */
    int64_t n_xc = 1;
    if (n_rt < 2 * nt && n >= 64) {
        n_xc = (2 * nt + n_rt - 1) / n_rt;
        if (n_xc > n / 32) n_xc = n / 32;
        if (n_xc < 1) n_xc = 1;
    }
    int64_t xc = (n + n_xc - 1) / n_xc;
    int64_t n_tiles = n_rt * n_xc;

#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (n_tiles > 1)
    for (int64_t t = 0; t < n_tiles; t++) {
        int64_t rt = t / n_xc, c = t % n_xc;
        int64_t r0 = rt * tr, nr = R - r0 < tr ? R - r0 : tr;
        int64_t i0 = c * xc, ni = n - i0 < xc ? n - i0 : xc;
        if (ni <= 0) continue;
        const float *wt;
        if (w->type == DTYPE_F32) {
            wt = (const float *)w->data + r0 * C;
        } else {
            float *buf = cpu_tbuf_reserve(&ci->wtile[omp_get_thread_num()], (size_t)(nr * C));
            cpu_weight_to_f32(w, (size_t)(r0 * C), (size_t)(nr * C), buf);
            wt = buf;
        }
        float *yt = ys + i0 * R + r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nr, (int)C, 1.0f, xs + i0 * C, (int)C,
                    wt, (int)C, 0.0f, yt, (int)R);
        if (bias) {
            float bb[256];
            for (int64_t j0 = 0; j0 < nr; j0 += 256) {
                int64_t nj = nr - j0 < 256 ? nr - j0 : 256;
                cpu_weight_to_f32(bias, (size_t)(r0 + j0), (size_t)nj, bb);
                for (int64_t i = 0; i < ni; i++) {
                    float *row = yt + i * R + j0;
#pragma omp simd
                    for (int64_t j = 0; j < nj; j++) row[j] += bb[j];
                }
            }
        }
    }
}
