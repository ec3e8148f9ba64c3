/*
 * onednn_matmul.c — what Debian's oneDNN (libdnnl-dev 2.6) does on our products, so the choice
 * between it and our own kernels rests on numbers (docs/perf.md, "CPU kernels"). For each model
 * product (q/k/v as one [3d, d] weight, attn_out, gate/up as one [2F, d], down, LM head) and
 * M = 1, 32, 256, 1024 rows: y[M, N] f32 = x[M, K] bf16 . W[K, N] bf16, the weights reordered once
 * into oneDNN's preferred layout outside the timing (as we pack once at load), the cast of x from
 * f32 to bf16 timed with the product (as ours is). Minimum of --reps runs, wall clock.
 * oneDNN threads with OpenMP here: run it with OMP_NUM_THREADS=N OMP_WAIT_POLICY=active.
 *
 * Built only when libdnnl is found (CMakeLists.txt, target onednn_matmul). Not a test.
 * usage: onednn_matmul [--d D] [--ffn F] [--vocab V] [--reps N] [--cpu-time]   (--cpu-time: thread CPU
 * time instead of wall time, meaningful with OMP_NUM_THREADS=1)
 * Main thread (+ oneDNN's OpenMP threads).
 */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DN(call)                                                                                  \
    do {                                                                                          \
        dnnl_status_t st_ = (call);                                                               \
        if (st_ != dnnl_success) {                                                                \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #call, (int)st_);      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* wall clock, or (--cpu-time, for OMP_NUM_THREADS=1 on a shared machine) this thread's CPU time */
static clockid_t g_clock = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(g_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dnnl_memory_t mem_new(dnnl_engine_t eng, const dnnl_memory_desc_t *md) {
    dnnl_memory_t m;
    DN(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE));
    return m;
}

static void *mem_ptr(dnnl_memory_t m) {
    void *p;
    DN(dnnl_memory_get_data_handle(m, &p));
    return p;
}

static void reorder(dnnl_engine_t eng, dnnl_stream_t s, dnnl_memory_t from, dnnl_memory_t to) {
    const dnnl_memory_desc_t *a, *b;
    DN(dnnl_memory_get_memory_desc(from, &a));
    DN(dnnl_memory_get_memory_desc(to, &b));
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    DN(dnnl_reorder_primitive_desc_create(&pd, a, eng, b, eng, NULL));
    DN(dnnl_primitive_create(&p, pd));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    DN(dnnl_primitive_execute(p, s, 2, args));
    DN(dnnl_stream_wait(s));
    dnnl_primitive_destroy(p);
    dnnl_primitive_desc_destroy(pd);
}

/* seconds per y = bf16(x) . W for M rows, N outputs, K inputs (minimum of reps) */
static double bench_one(dnnl_engine_t eng, dnnl_stream_t s, int M, int N, int K, int reps) {
    dnnl_memory_desc_t x32_md, x16_md, w_user_md, w_any_md, y_md;
    dnnl_dims_t xd = {M, K}, wd = {K, N}, yd = {M, N};
    DN(dnnl_memory_desc_init_by_tag(&x32_md, 2, xd, dnnl_f32, dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&x16_md, 2, xd, dnnl_bf16, dnnl_ab));
    DN(dnnl_memory_desc_init_by_tag(&w_user_md, 2, wd, dnnl_bf16, dnnl_ba));   /* W stored [N][K], as checkpoints */
    DN(dnnl_memory_desc_init_by_tag(&w_any_md, 2, wd, dnnl_bf16, dnnl_format_tag_any));
    DN(dnnl_memory_desc_init_by_tag(&y_md, 2, yd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &x16_md, &w_any_md, NULL, &y_md));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    const dnnl_memory_desc_t *w_md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_t x32 = mem_new(eng, &x32_md), x16 = mem_new(eng, &x16_md), wu = mem_new(eng, &w_user_md);
    dnnl_memory_t w = mem_new(eng, w_md), y = mem_new(eng, &y_md);
    float *xp = mem_ptr(x32);
    for (long i = 0; i < (long)M * K; i++) xp[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    unsigned short *wp = mem_ptr(wu);
    for (long i = 0; i < (long)K * N; i++) wp[i] = 0x3c00 + (unsigned short)(i % 256);
    reorder(eng, s, wu, w);   /* once, like our packing at load */
    dnnl_primitive_desc_t cpd;
    dnnl_primitive_t cast, mm;
    DN(dnnl_reorder_primitive_desc_create(&cpd, &x32_md, eng, &x16_md, eng, NULL));
    DN(dnnl_primitive_create(&cast, cpd));
    DN(dnnl_primitive_create(&mm, pd));
    dnnl_exec_arg_t cargs[2] = {{DNNL_ARG_FROM, x32}, {DNNL_ARG_TO, x16}};
    dnnl_exec_arg_t margs[3] = {{DNNL_ARG_SRC, x16}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, y}};
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        DN(dnnl_primitive_execute(cast, s, 2, cargs));
        DN(dnnl_primitive_execute(mm, s, 3, margs));
        DN(dnnl_stream_wait(s));
        double t = now_s() - t0;
        if (r && t < best) best = t;
    }
    dnnl_primitive_destroy(cast);
    dnnl_primitive_destroy(mm);
    dnnl_primitive_desc_destroy(cpd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(x32);
    dnnl_memory_destroy(x16);
    dnnl_memory_destroy(wu);
    dnnl_memory_destroy(w);
    dnnl_memory_destroy(y);
    return best;
}

int main(int argc, char **argv) {
    int d = 768, F = 2048, V = 8192, reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--d") == 0) d = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--ffn") == 0) F = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--vocab") == 0) V = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) reps = atoi(argv[i + 1]);
    }
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--cpu-time") == 0) g_clock = CLOCK_THREAD_CPUTIME_ID;
    dnnl_engine_t eng;
    dnnl_stream_t s;
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&s, eng, dnnl_stream_default_flags));
    const struct { const char *name; int N, K; } ops[] = {
        {"q/k/v (one [3d, d])", 3 * d, d}, {"attn_out", d, d}, {"gate/up (one [2F, d])", 2 * F, d}, {"down", d, F},
        {"LM head", V, d}};
    const int Ms[] = {1, 32, 256, 1024};
    const dnnl_version_t *v = dnnl_version();
    printf("oneDNN %d.%d.%d (%s), bf16 x bf16 -> f32 matmul + f32->bf16 cast of x; d %d, ffn %d, vocab %d\n", v->major,
           v->minor, v->patch, v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other runtime", d, F, V);
    printf("  %-22s %5s %9s %9s\n", "product", "M", "ms", "GFLOP/s");
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
        for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
            int M = Ms[m];
            double t = bench_one(eng, s, M, ops[o].N, ops[o].K, reps * (M <= 32 ? 20 : M <= 256 ? 4 : 1));
            printf("  %-22s %5d %9.3f %9.1f\n", ops[o].name, M, t * 1e3, 2.0 * M * ops[o].N * ops[o].K / t * 1e-9);
            fflush(stdout);
        }
    dnnl_stream_destroy(s);
    dnnl_engine_destroy(eng);
    return 0;
}
