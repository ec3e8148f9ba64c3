/*
 * cpu_kernels_bench.c — microbenchmarks of the CPU backend's kernel paths against this machine's
 * measured limits (docs/perf.md, "CPU kernels"):
 *   peaks    register-only loops of the instruction each path is built on, one thread:
 *            fp32 FMA (ymm, and zmm where AVX-512 exists), vdpbf16ps, tdpbf16ps (AMX, where
 *            present), and the int8 steps of quantized weights: vpdpbusd zmm / ymm, vpmaddubsw +
 *            vpmaddwd + vpaddd ymm; OpenBLAS sgemm 1024^3 on 1 and all threads; memory read bandwidth
 *   gemm     each path (fp32 / avx2 / avx512bf16 / amx, the ones this CPU has, and auto: the
 *            per-shape dispatch the backend would use) through the backend's own ops (activation
 *            cast included) on a model's products — q/k/v fused, attn_out + residual, gate/up +
 *            SwiGLU, down + residual, LM head — at M = 1, 32, 256, 1024 rows (--ms): GFLOP/s, % of
 *            the path's peak x threads, and for M = 1 the weight bytes per second vs the bandwidth
 *   attn     each path's attention (backend_attention: the bf16 paths pack K/Vᵀ and run the kernel
 *            blocks, fp32 runs two sgemms per item) on one sequence of a model's heads: a full
 *            forward's (L queries over L keys, L = 64, 256, 1024) and a cached decode step's
 *            (32 queries over 160 keys, batch 1 and 8)
 *   denormal the backend's SwiGLU loop with and without FTZ/DAZ (GCC's branch-free sigmoid computes a
 *            hidden denormal for ordinary gates)
 * Timings are the minimum over --reps runs (the machine may be shared); everything measured on one
 * thread uses thread CPU time (a busy machine cannot stretch it), several threads wall time.
 * Not a test: prints tables, asserts nothing.
 *
 * usage: cpu_kernels_bench [--threads N] [--reps N] [--d D] [--ffn F] [--vocab V] [--only peaks|gemm|attn|denormal]
 *                          [--path fp32|avx2|avx512bf16|amx|auto] [--cold 1] [--ms 1,32,256,1024]
 *                          [--quant q8_0|q4_0 [--qkernels FAMILY]]
 * UNMASK_CPU_ISA=avx2 makes an AVX-512 machine pass for an AVX2-only one (docs/cpu-kernels.md).
 * --only gemm skips the peaks (no "of peak" column) unless --quant is given.
 * --quant: the gemm table on weights quantized at upload, run by the int8 family --qkernels names
 * (auto, avx512vnni, avxvnni, avx2, scalar); GOP/s count 2 operations per weight and row as GFLOP/s
 * do, "of peak" is against that family's int8 instruction peak, and M = 1 counts the quantized bytes
 * --cold 1: every M runs over enough weight copies (> 128 MiB) that they come from memory, as in a
 * model's forward (by default only M = 1 does; the others reuse one copy from cache)
 * Main thread (+ the backends' pool slots).
 */
/* as in the backend's sources: lets the branch-free helpers of cpu_internal.h vectorise, so the
 * SwiGLU loop timed here is the backend's loop */
#pragma GCC optimize("no-trapping-math")

#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/rng.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- peaks */

#define PEAK_ITERS 20000000L

/* 24 (ymm: 12, so that they and the two operands fit the 16 registers: 16 spilled and measured
 * 68 instead of 100 GFLOP/s on Zen 5) independent accumulator chains hide the latency; the result is kept live through *sink. */
__attribute__((target("avx512f"))) static double peak_fma512(float *sink) {
    __m512 a[24], b = _mm512_set1_ps(1.0000001f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps((float)i);
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    double t = cpu_s() - t0;
    for (int i = 1; i < 24; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    *sink += _mm512_reduce_add_ps(a[0]);
    return 24.0 * 16 * 2 * PEAK_ITERS / t;
}

__attribute__((target("avx2,fma"))) static double peak_fma256(float *sink) {
    __m256 a[12], b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    double t = cpu_s() - t0;
    float f[8];
    for (int i = 1; i < 12; i++) a[0] = _mm256_add_ps(a[0], a[i]);
    _mm256_storeu_ps(f, a[0]);
    *sink += f[0];
    return 12.0 * 8 * 2 * PEAK_ITERS / t;
}

__attribute__((target("avx512f,avx512bf16"))) static double peak_dpbf16(float *sink) {
    __m512 a[24];
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = (__m512bh)_mm512_set1_epi32(0x33803380);
    for (int i = 0; i < 24; i++) a[i] = _mm512_set1_ps((float)i);
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
#pragma GCC unroll 24
        for (int i = 0; i < 24; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
    double t = cpu_s() - t0;
    for (int i = 1; i < 24; i++) a[0] = _mm512_add_ps(a[0], a[i]);
    *sink += _mm512_reduce_add_ps(a[0]);
    return 24.0 * 32 * 2 * PEAK_ITERS / t;   /* 16 lanes x 2 products x (mul + add) */
}

/* int8 multiply-adds per second x 2 (one "operation" per multiply and per add, as flops are counted).
 * Written in assembly: GCC kept an array of integer vector accumulators in memory (a store per
 * instruction) and measured the store port instead. The register values are whatever they are:
 * integer arithmetic runs at one speed for all of them. */
#define R4(op, a, b, c) op " " a ", " b ", " c "\n\t"
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double peak_dpbusd512(void) {
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
        __asm__ volatile(
#define D(n) R4("vpdpbusd", "%%zmm30", "%%zmm31", "%%zmm" #n)
            D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11) D(12) D(13) D(14) D(15) D(16) D(17) D(18)
            D(19) D(20) D(21) D(22) D(23)
#undef D
            ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
            "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23");
    return 24.0 * 64 * 2 * PEAK_ITERS / (cpu_s() - t0);
}

__attribute__((target("avx2,avxvnni"))) static double peak_dpbusd256(void) {
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
        __asm__ volatile(
#define D(n) R4("%{vex%} vpdpbusd", "%%ymm14", "%%ymm15", "%%ymm" #n)
            D(0) D(1) D(2) D(3) D(4) D(5) D(6) D(7) D(8) D(9) D(10) D(11)
#undef D
            ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
    return 12.0 * 32 * 2 * PEAK_ITERS / (cpu_s() - t0);
}

/* the AVX2 step as the kernel issues it: vpmaddubsw (byte pairs to int16), vpmaddwd by ones (to
 * int32), vpaddd into an accumulator; 6 independent steps per iteration */
__attribute__((target("avx2"))) static double peak_maddubs256(void) {
    double t0 = cpu_s();
    for (long it = 0; it < PEAK_ITERS; it++)
        __asm__ volatile(
#define D(t, acc) R4("vpmaddubsw", "%%ymm15", "%%ymm14", "%%ymm" #t) R4("vpmaddwd", "%%ymm13", "%%ymm" #t, "%%ymm" #t) \
    R4("vpaddd", "%%ymm" #t, "%%ymm" #acc, "%%ymm" #acc)
            D(6, 0) D(7, 1) D(8, 2) D(9, 3) D(10, 4) D(11, 5)
#undef D
            ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11");
    return 6.0 * 32 * 2 * PEAK_ITERS / (cpu_s() - t0);
}
#undef R4

#if defined(__GNUC__) && !defined(__clang__)
typedef struct bench_tilecfg {
    uint8_t  palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t  rows[16];
} bench_tilecfg;

/* 4 accumulator tiles x the same A/B tiles: the TMUL unit's throughput with operands in tiles */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(void) {
    _Alignas(64) bench_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    _Alignas(64) static uint16_t buf[16 * 32];
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    const long iters = PEAK_ITERS / 8;
    double t0 = cpu_s();
    for (long it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 5);
        _tile_dpbf16ps(1, 4, 5);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(3, 4, 5);
    }
    double t = cpu_s() - t0;
    _tile_release();
    return 4.0 * iters * 16 * 16 * 32 * 2 / t;   /* 16x16 outputs x 32 products x 2 flops per tile op */
}
#endif

static double sgemm_gflops(int threads, int reps) {
    const int n = 1024;
    float *a = xmalloc((size_t)n * n * 4), *b = xmalloc((size_t)n * n * 4), *c = xmalloc((size_t)n * n * 4);
    for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
    openblas_set_num_threads(threads);
    double (*clock_s)(void) = threads == 1 ? cpu_s : now_s;   /* one thread runs on this one */
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = clock_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = clock_s() - t0;
        if (r && t < best) best = t;
    }
    openblas_set_num_threads(1);
    free(a);
    free(b);
    free(c);
    return 2.0 * n * n * n / best;
}

typedef struct bw_arg {
    const float *p;
    size_t       n;
    double       sum;
} bw_arg;

/* sum of a->n floats with 8 independent 256-bit chains (the loads, not the adds, are the limit) */
__attribute__((target("avx2"))) static void bw_sum(bw_arg *a) {
    __m256 s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm256_setzero_ps();
    for (size_t i = 0; i + 64 <= a->n; i += 64)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++) s[k] = _mm256_add_ps(s[k], _mm256_load_ps(a->p + i + 8 * k));
    for (int k = 1; k < 8; k++) s[0] = _mm256_add_ps(s[0], s[k]);
    float f[8];
    _mm256_storeu_ps(f, s[0]);
    a->sum = f[0];
}

typedef struct bw_run {
    float  *p;
    size_t  n;
    int     threads;
    double  sum;
} bw_run;

static void bw_task(void *arg, int64_t t, int slot) {
    (void)slot;
    bw_run *r = arg;
    bw_arg a = {r->p + r->n / (size_t)r->threads * (size_t)t, r->n / (size_t)r->threads, 0};
    bw_sum(&a);
    r->sum += a.sum;   /* racy on purpose: only keeps the loads alive */
}

/* read bandwidth over 1 GiB with `threads` pool slots, bytes/s (best of reps; one thread: thread
 * CPU time, which a shared machine cannot stretch) */
static double mem_bw(int threads, int reps) {
    const size_t n = (size_t)1 << 28;   /* floats */
    bw_run r = {.n = n, .threads = threads};
    if (posix_memalign((void **)&r.p, 64, n * 4) != 0) UM_FATAL("oom");
    for (size_t i = 0; i < n; i++) r.p[i] = 1.0f;
    cpu_pool *pool = cpu_pool_init(threads, 0);
    double (*clock_s)(void) = threads == 1 ? cpu_s : now_s;
    double best = 1e30;
    for (int k = 0; k < reps + 1; k++) {
        double t0 = clock_s();
        cpu_pool_run(pool, threads, 0, bw_task, &r);
        double t = clock_s() - t0;
        if (k && t < best) best = t;
    }
    cpu_pool_free(pool);
    free(r.p);
    return n * 4.0 / best;
}

typedef struct peaks {
    double fma, fma256, dpbf16, amx, sgemm1, sgemm_all, bw1, bw_all;
    double dpbusd512, dpbusd256, maddubs256;   /* int8 operations per second, one core */
} peaks;

static void run_peaks(int threads, int reps, peaks *pk) {
    const cpu_features *f = cpu_features_get();
    float sink = 0;
    memset(pk, 0, sizeof *pk);
    const int zmm = __builtin_cpu_supports("avx512f") && !(f->hidden & CPU_HID_AVX512BF16);
    for (int r = 0; r < 3; r++) {   /* best of 3: a shared core only ever lowers these */
        double v = peak_fma256(&sink);
        pk->fma256 = v > pk->fma256 ? v : pk->fma256;
        v = zmm ? peak_fma512(&sink) : v;
        pk->fma = v > pk->fma ? v : pk->fma;
        v = f->avx512bf16 ? peak_dpbf16(&sink) : 0;
        pk->dpbf16 = v > pk->dpbf16 ? v : pk->dpbf16;
#if defined(__GNUC__) && !defined(__clang__)
        v = f->amx_bf16 ? peak_amx() : 0;
        pk->amx = v > pk->amx ? v : pk->amx;
#endif
        v = f->avx512vnni ? peak_dpbusd512() : 0;
        pk->dpbusd512 = v > pk->dpbusd512 ? v : pk->dpbusd512;
        v = f->avxvnni ? peak_dpbusd256() : 0;
        pk->dpbusd256 = v > pk->dpbusd256 ? v : pk->dpbusd256;
        v = f->avx2 ? peak_maddubs256() : 0;
        pk->maddubs256 = v > pk->maddubs256 ? v : pk->maddubs256;
    }
    pk->sgemm1 = sgemm_gflops(1, reps);
    pk->sgemm_all = sgemm_gflops(threads, reps);
    pk->bw1 = mem_bw(1, reps);
    pk->bw_all = mem_bw(threads, reps);
    printf("peaks (one core unless noted; sink %g)\n", (double)sink);
    printf("  fp32 FMA (ymm)          %8.1f GFLOP/s\n", pk->fma256 * 1e-9);
    if (zmm) printf("  fp32 FMA (zmm)          %8.1f GFLOP/s\n", pk->fma * 1e-9);
    if (pk->dpbf16) printf("  vdpbf16ps               %8.1f GFLOP/s\n", pk->dpbf16 * 1e-9);
    else printf("  vdpbf16ps               (no AVX512-BF16)\n");
    if (pk->amx) printf("  tdpbf16ps (AMX)         %8.1f GFLOP/s\n", pk->amx * 1e-9);
    else printf("  tdpbf16ps (AMX)         (%s)\n", f->amx_why);
    printf("  vpdpbusd zmm            %8.1f GOP/s\n", pk->dpbusd512 * 1e-9);
    printf("  vpdpbusd ymm            %8.1f GOP/s\n", pk->dpbusd256 * 1e-9);
    printf("  vpmaddubsw+vpmaddwd ymm %8.1f GOP/s\n", pk->maddubs256 * 1e-9);
    printf("  OpenBLAS sgemm 1024^3   %8.1f GFLOP/s, %d threads %8.1f\n", pk->sgemm1 * 1e-9, threads,
           pk->sgemm_all * 1e-9);
    printf("  memory read             %8.1f GB/s, %d threads %8.1f\n\n", pk->bw1 * 1e-9, threads, pk->bw_all * 1e-9);
}

/* ---------------------------------------------------------------- gemm through the backend */

typedef struct bench_w {
    uint16_t *mem;
    bweight   w;
} bench_w;

static enum dtype g_quant = DTYPE_BF16;   /* --quant: matrices quantized at upload */

static void bw_make(backend *be, bench_w *b, int64_t rows, int64_t cols, uint64_t seed) {
    b->mem = xmalloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) b->mem[i] = f32_to_bf16((float)(rng_u01(seed, 1, (uint64_t)i) - 0.5) * 0.1f);
    bweight_src src = {.name = "bench", .data = b->mem, .type = DTYPE_BF16, .rows = rows, .cols = cols,
                       .quant = rows > 1 ? g_quant : DTYPE_F32};
    um_err err = {0};
    CHECK(backend_weight_upload(be, &src, &b->w, &err) == 0);
}

static void bw_free(backend *be, bench_w *b) {
    backend_weight_free(be, &b->w);
    free(b->mem);
}

enum { OP_QKV, OP_ATTN_OUT, OP_GATE_UP, OP_DOWN, OP_LM_HEAD, OP_COUNT };
static const char *const k_op_names[OP_COUNT] = {"q/k/v + norm", "attn_out + add", "gate/up + swiglu",
                                                 "down + add", "LM head + norm"};

/* One row of the table: path x op x M. At M = 1 the product streams its weights: it runs over
 * enough copies of them (> 128 MiB in all) that every run reads them from memory, not from L3. */
#define COLD_BYTES (128.0 * 1024 * 1024)
static int g_cold;   /* --cold 1: every M streams its weights from memory, as in a model's forward */
static void bench_op(backend *be, int op, int M, int d, int F, int V, int reps, double peak, double bw, int threads) {
    bench_w norm;
    int64_t shapes[OP_COUNT][3][2] = {{{d, d}, {d, d}, {d, d}}, {{d, d}}, {{F, d}, {F, d}}, {{d, F}}, {{V, d}}};
    int n_w = op == OP_QKV ? 3 : op == OP_GATE_UP ? 2 : 1;
    double flops = 0, bytes = 0;
    for (int j = 0; j < n_w; j++) {
        flops += 2.0 * M * (double)shapes[op][j][0] * (double)shapes[op][j][1];
        bytes += (double)shapes[op][j][0] * (double)dtype_row_bytes(dtype_is_quant(g_quant) ? g_quant : DTYPE_BF16,
                                                                   shapes[op][j][1]);
    }
    int copies = M == 1 || g_cold ? (int)(COLD_BYTES / bytes) + 1 : 1;
    bench_w *w = xmalloc((size_t)(copies * 3) * sizeof *w);
    for (int c = 0; c < copies; c++)
        for (int j = 0; j < n_w; j++)
            bw_make(be, &w[c * 3 + j], shapes[op][j][0], shapes[op][j][1], (uint64_t)(op * 10 + j + 100 * c));
    bw_make(be, &norm, 1, d, 99);
    const int64_t in = shapes[op][0][1], out = shapes[op][0][0];
    float *x = backend_act_alloc(be, (size_t)M * (size_t)in), *y[3], *tmp = backend_act_alloc(be, (size_t)M * (size_t)(in > out ? in : out));
    for (int64_t i = 0; i < (int64_t)M * in; i++) x[i] = (float)(rng_u01(5, 5, (uint64_t)i) - 0.5);
    for (int j = 0; j < n_w; j++) y[j] = backend_act_alloc(be, (size_t)M * (size_t)shapes[op][j][0]);
    blinear l = {.x = x, .n = M, .eps = 1e-5f, .n_w = n_w, .tmp_h = tmp, .tmp_y = tmp};
    for (int j = 0; j < n_w; j++) l.y[j] = y[j];
    l.norm = op == OP_QKV || op == OP_GATE_UP || op == OP_LM_HEAD ? &norm.w : NULL;
    l.epi = op == OP_GATE_UP ? BLIN_SWIGLU : (op == OP_ATTN_OUT || op == OP_DOWN) ? BLIN_ADD : BLIN_STORE;
    if (l.epi == BLIN_SWIGLU) l.n_w = 2, l.tmp_y = y[1];
    if (l.epi == BLIN_ADD) l.y[0] = backend_act_alloc(be, (size_t)M * (size_t)out), l.tmp_y = y[0];
    /* one thread: thread CPU time (robust on a shared machine); more: wall time */
    double (*clock_s)(void) = threads == 1 ? cpu_s : now_s;
    double best = 1e30;
    int n_rep = reps * (M <= 32 ? 20 : M <= 256 ? 4 : 1);
    if (n_rep < copies) n_rep = copies;
    for (int r = 0; r < n_rep + 1; r++) {
        for (int j = 0; j < n_w; j++) l.w[j] = &w[(r % copies) * 3 + j].w;
        double t0 = clock_s();
        backend_linear(be, &l);
        double t = clock_s() - t0;
        if (r && t < best) best = t;
    }
    double gf = flops / best;
    printf("  %-18s %5d %9.3f %9.1f", k_op_names[op], M, best * 1e3, gf * 1e-9);
    if (peak > 0) printf(" %7.1f%%", 100.0 * gf / (peak * threads));
    else printf(" %8s", "-");
    if (M == 1 && bw > 0) printf("   %6.1f GB/s = %5.1f%% of %d-thread bandwidth", bytes / best * 1e-9, 100.0 * bytes / best / bw, threads);
    printf("\n");
    if (l.epi == BLIN_ADD) backend_act_free(be, l.y[0]);
    for (int j = 0; j < n_w; j++) backend_act_free(be, y[j]);
    for (int c = 0; c < copies; c++)
        for (int j = 0; j < n_w; j++) bw_free(be, &w[c * 3 + j]);
    free(w);
    bw_free(be, &norm);
    backend_act_free(be, x);
    backend_act_free(be, tmp);
}

/* The gemm table on quantized weights: the int8 family qk (its instruction peak). */
static void run_qgemm(int threads, int reps, int d, int F, int V, const peaks *pk, enum cpu_qkernels qk,
                      const int *Ms, int n_ms) {
    um_err err = {0};
    if (cpu_qkernels_select(qk, &err) != 0) {
        printf("int8 kernels %s: skipped (%s)\n\n", cpu_qkernels_name(qk), err.msg);
        return;
    }
    qk = cpu_qkernels_resolve();
    const double peak = qk == CPU_QKERNELS_AVX512VNNI ? pk->dpbusd512 : qk == CPU_QKERNELS_AVXVNNI ? pk->dpbusd256
                        : qk == CPU_QKERNELS_AVX2     ? pk->maddubs256
                                                      : pk->fma;
    backend *be = backend_cpu_init(threads);
    printf("%s weights, int8 kernels %s, %d threads, d %d, ffn %d, vocab %d; GOP/s, %% of the %s peak x threads\n",
           dtype_name(g_quant), cpu_qkernels_name(qk), threads, d, F, V,
           qk == CPU_QKERNELS_SCALAR ? "fp32 FMA" : "int8 instruction");
    printf("  %-18s %5s %9s %9s %8s\n", "product", "M", "ms", "GOP/s", "of peak");
    for (int op = 0; op < OP_COUNT; op++)
        for (int m = 0; m < n_ms; m++) bench_op(be, op, Ms[m], d, F, V, reps, peak, pk->bw_all, threads);
    printf("\n");
    backend_free(be);
    fflush(stdout);
}

static void run_gemm(int threads, int reps, int d, int F, int V, const peaks *pk, const char *only_path,
                     const int *Ms, int n_ms) {
    const enum backend_cpu_kernels paths[] = {BACKEND_CPU_KERNELS_FP32, BACKEND_CPU_KERNELS_AVX2,
                                              BACKEND_CPU_KERNELS_AVX512BF16, BACKEND_CPU_KERNELS_AMX,
                                              BACKEND_CPU_KERNELS_AUTO};
    for (int p = 0; p < 5; p++) {
        um_err err = {0};
        if (only_path && strcmp(only_path, backend_cpu_kernels_name(paths[p])) != 0) continue;
        if (backend_cpu_kernels_select(paths[p], &err) != 0) {
            printf("path %s: skipped (%s)\n\n", backend_cpu_kernels_name(paths[p]), err.msg);
            continue;
        }
        backend *be = backend_cpu_init(threads);
        /* auto: the path it resolved to, or (dispatch by shape) the 1-thread sgemm peak */
        const enum backend_cpu_kernels k = backend_cpu_kernels_of(be);
        double peak = k == BACKEND_CPU_KERNELS_AMX ? pk->amx : k == BACKEND_CPU_KERNELS_AVX512BF16 ? pk->dpbf16
                      : k == BACKEND_CPU_KERNELS_AVX2 ? pk->fma256 : pk->sgemm1;
        printf("path %s: %s, %d threads, d %d, ffn %d, vocab %d; %% of %s x threads\n",
               backend_cpu_kernels_name(paths[p]), backend_description(be), threads, d, F, V,
               k == BACKEND_CPU_KERNELS_AVX2 ? "the ymm FMA peak" : peak == pk->sgemm1 ? "the 1-thread sgemm peak"
                                                                                       : "the instruction peak");
        printf("  %-18s %5s %9s %9s %8s\n", "product", "M", "ms", "GFLOP/s", "of peak");
        for (int op = 0; op < OP_COUNT; op++)
            for (int m = 0; m < n_ms; m++) bench_op(be, op, Ms[m], d, F, V, reps, peak, pk->bw_all, threads);
        printf("\n");
        backend_free(be);
        fflush(stdout);
    }
}

/* ---------------------------------------------------------------- attention */

/* n_seqs sequences of nq queries over nk keys each (the queries are the last nq key positions), the
 * model's heads (hd 64, d / 64 heads, no GQA): ms per call, the minimum over the reps. */
static double bench_attn(backend *be, int d, int n_seqs, int nq, int nk, int reps, int threads) {
    const int hd = 64, H = d / hd, n_q = n_seqs * nq, n_k = n_seqs * nk;
    int32_t *qs = xmalloc((size_t)(n_seqs + 1) * sizeof *qs), *ks = xmalloc((size_t)(n_seqs + 1) * sizeof *ks);
    for (int s = 0; s <= n_seqs; s++) qs[s] = s * nq, ks[s] = s * nk;
    float *q = backend_act_alloc(be, (size_t)n_q * d), *k = backend_act_alloc(be, (size_t)n_k * d);
    float *v = backend_act_alloc(be, (size_t)n_k * d), *o = backend_act_alloc(be, (size_t)n_q * d);
    for (size_t i = 0; i < (size_t)n_q * d; i++) q[i] = (float)(rng_u01(1, 2, i) - 0.5);
    for (size_t i = 0; i < (size_t)n_k * d; i++) {
        k[i] = (float)(rng_u01(1, 3, i) - 0.5);
        v[i] = (float)(rng_u01(1, 4, i) - 0.5);
    }
    attn_params p = {.n_seqs = n_seqs, .q_start = qs, .k_start = ks, .n_heads = H, .n_kv_heads = H, .head_dim = hd,
                     .scale = 0.125f};
    double (*clock_s)(void) = threads == 1 ? cpu_s : now_s;
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = clock_s();
        backend_attention(be, &p, q, k, v, o);
        double t = clock_s() - t0;
        if (r && t < best) best = t;
    }
    backend_act_free(be, q);
    backend_act_free(be, k);
    backend_act_free(be, v);
    backend_act_free(be, o);
    free(qs);
    free(ks);
    return best * 1e3;
}

static void run_attn(int threads, int reps, int d, const char *only_path) {
    const enum backend_cpu_kernels paths[] = {BACKEND_CPU_KERNELS_FP32, BACKEND_CPU_KERNELS_AVX2,
                                              BACKEND_CPU_KERNELS_AVX512BF16, BACKEND_CPU_KERNELS_AMX};
    const int shapes[][3] = {{1, 64, 64}, {1, 256, 256}, {1, 1024, 1024}, {1, 32, 160}, {8, 32, 160}};
    for (int p = 0; p < 4; p++) {
        um_err err = {0};
        if (only_path && strcmp(only_path, backend_cpu_kernels_name(paths[p])) != 0) continue;
        if (backend_cpu_kernels_select(paths[p], &err) != 0) continue;
        backend *be = backend_cpu_init(threads);
        printf("attention, path %s: %s, %d threads, %d heads of 64\n", backend_cpu_kernels_name(paths[p]),
               backend_description(be), threads, d / 64);
        printf("  %-10s %6s %6s %9s\n", "sequences", "q", "keys", "ms");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            printf("  %-10d %6d %6d %9.3f\n", shapes[s][0], shapes[s][1], shapes[s][2],
                   bench_attn(be, d, shapes[s][0], shapes[s][1], shapes[s][2], reps * (shapes[s][1] < 1024 ? 10 : 2),
                              threads));
        printf("\n");
        backend_free(be);
        fflush(stdout);
    }
}

/* ---------------------------------------------------------------- denormals */

/* the SwiGLU loop of the backend (cpu_backend.c swiglu_range), here to time it in both FP modes */
CPU_HOT_CLONES static void swiglu_loop(const float *g, const float *u, float *o, size_t n) {
#pragma omp simd
    for (size_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + cpu_expf(-g[i])) * u[i];
}

static void run_denormal(int reps) {
    const size_t n = 1 << 20;
    float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *o = xmalloc(n * 4);
    printf("SwiGLU element loop, one thread, %zu elements: ns per element. GCC if-converts the sigmoid's\n"
           "exp clamp into a second, constant divide g / (1 + e^88.3), computed for every element and blended\n"
           "away: for |g| < 2.5 its result is denormal, so without FTZ/DAZ typical gates take the slow path.\n", n);
    printf("  %-44s %10s %10s %8s\n", "gate values", "default", "FTZ/DAZ", "ratio");
    for (int dist = 0; dist < 3; dist++) {
        for (size_t i = 0; i < n; i++) {
            double r = rng_u01(9, (uint64_t)dist, i);
            g[i] = dist == 0 ? (float)(4 * r - 2) : dist == 1 ? (float)(-90 - 10 * r) : (float)(r < 0.1 ? -95 : 4 * r - 2);
            u[i] = 1.0f;
        }
        double best[2] = {1e30, 1e30};
        for (int mode = 0; mode < 2; mode++) {
            unsigned old = _mm_getcsr();
            if (mode) _mm_setcsr(old | 0x8040u);
            for (int r = 0; r < reps + 1; r++) {
                double t0 = cpu_s();
                swiglu_loop(g, u, o, n);
                double t = cpu_s() - t0;
                if (r && t < best[mode]) best[mode] = t;
            }
            _mm_setcsr(old);
        }
        static const char *const names[] = {"uniform in [-2, 2] (typical gates)", "all in [-100, -90] (exp clamped)",
                                            "10% at -95, rest in [-2, 2]"};
        printf("  %-44s %10.2f %10.2f %7.1fx\n", names[dist], best[0] / n * 1e9, best[1] / n * 1e9, best[0] / best[1]);
    }
    printf("\n");
    free(g);
    free(u);
    free(o);
}

int main(int argc, char **argv) {
    int threads = 0, reps = 3, d = 768, F = 2048, V = 8192;
    const char *only = NULL, *path = NULL, *qk_s = "auto";
    int Ms[32] = {1, 32, 256, 1024}, n_ms = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--d") == 0) d = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ffn") == 0) F = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--vocab") == 0) V = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
        else if (strcmp(argv[i], "--cold") == 0) g_cold = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--path") == 0) path = argv[i + 1];
        else if (strcmp(argv[i], "--ms") == 0) {
            n_ms = 0;
            for (char *t = strtok(argv[i + 1], ","); t && n_ms < 32; t = strtok(NULL, ",")) Ms[n_ms++] = atoi(t);
        } else if (strcmp(argv[i], "--quant") == 0) g_quant = strcmp(argv[i + 1], "q4_0") == 0 ? DTYPE_Q4_0 : DTYPE_Q8_0;
        else if (strcmp(argv[i], "--qkernels") == 0) qk_s = argv[i + 1];
        else {
            fprintf(stderr, "usage: cpu_kernels_bench [--threads N] [--reps N] [--d D] [--ffn F] [--vocab V] "
                            "[--only peaks|gemm|attn|denormal] [--path fp32|avx2|avx512bf16|amx|auto] [--cold 1] "
                            "[--ms 1,32,256,1024] [--quant q8_0|q4_0 [--qkernels auto|avx512vnni|avxvnni|avx2|scalar]]\n");
            return 2;
        }
    }
    enum cpu_qkernels qk;
    if (cpu_qkernels_parse(qk_s, &qk) != 0) {
        fprintf(stderr, "--qkernels: unknown family %s\n", qk_s);
        return 2;
    }
    backend *probe = backend_cpu_init(threads);   /* resolves threads = 0 to the allowed CPUs */
    threads = backend_n_threads(probe);
    backend_free(probe);
    peaks pk;
    memset(&pk, 0, sizeof pk);
    const int quant = dtype_is_quant(g_quant);
    if (!only || strcmp(only, "peaks") == 0 || quant) run_peaks(threads, reps, &pk);   /* --only gemm: no % of peak */
    if ((!only || strcmp(only, "gemm") == 0) && quant) run_qgemm(threads, reps, d, F, V, &pk, qk, Ms, n_ms);
    else if (!only || strcmp(only, "gemm") == 0) run_gemm(threads, reps, d, F, V, &pk, path, Ms, n_ms);
    if (!quant && (!only || strcmp(only, "attn") == 0)) run_attn(threads, reps, d, path);
    if (!only || strcmp(only, "denormal") == 0) run_denormal(reps);
    return 0;
}
