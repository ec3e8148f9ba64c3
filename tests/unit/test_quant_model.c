/*
 * test_quant_model.c — models with quantized weights (model.quant, model/llada.c's loader, the CPU
 * backend's quantized layer):
 *   - a checkpoint whose matrices are already Q8_0 / Q4_0 (what a GGUF file hands over: the tensors'
 *     blocks in place of their floats) gives bit for bit the logits of the same float checkpoint
 *     quantized at load — the two routes store the same bytes;
 *   - tensor parallel on such a checkpoint: --tp 2 (column slices on block boundaries) equals --tp 1
 *     within fp32 summation order; --tp 4 would cut the attention output's blocks and is refused with
 *     an error naming --tp;
 *   - memory: after a quantized load the checkpoint mapping's resident pages are a small part of its
 *     matrices (the loader dropped them), while the fp32 path (views of the mapping) keeps them;
 *   - the MoE families (LLaDA-MoE, LLaDA2 with its fused qkv) and Dream (q/k/v biases) run quantized
 *     with experts + shared experts quantized, within the quantization's tolerance of the checkpoint's
 *     weights (per row: a MoE router near a tie switches experts), and an expert-parallel MoE group
 *     (--tp 2) gives its single rank's rows;
 *   - a model with quantized weights on a backend without BACKEND_CAP_QUANT is refused up front
 *     (here: the check itself; a GPU is not needed).
 * Single engine thread per ctx (a TP group's followers on their own threads).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "model/make_model.h"
#include "model/model.h"
#include "model/model_tp.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"
#include "util/quant.h"

static int32_t g_tok[64];

/* Logits of one 40-token sequence ([40, rows]) on ctx. */
static float *run(model_ctx *ctx, const model *m) {
    const int T = 40;
    for (int i = 0; i < T; i++) g_tok[i] = (int32_t)((i * 37 + 11) % m->cfg.vocab_size);
    int32_t start[2] = {0, T};
    fwd_batch b = {.n_seqs = 1, .seq_start = start, .tokens = g_tok, .n_out = T};
    float *out = xmalloc((size_t)T * (size_t)m->cfg.n_embd_rows * sizeof *out);
    um_err err = {0};
    TEST_CHECK(model_forward(ctx, &b, out, &err) == 0, "forward: %s", err.msg);
    return out;
}

static float *run_single(const model *m) {
    backend *be = backend_cpu_init(2);
    model_ctx ctx;
    um_err err = {0};
    TEST_CHECK(model_ctx_init(&ctx, m, be, &err) == 0, "ctx: %s", err.msg);
    float *out = run(&ctx, m);
    model_ctx_free(&ctx);
    backend_free(be);
    return out;
}

/* max |a - b| / max |b| over n */
static double rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)b[i]));
    }
    return num / (den + 1e-30);
}

/* ---------------------------------------------------------------- pre-quantized checkpoints */

/* Replace t's floats by its rows' blocks of type q (a buffer kept in *keep): what a GGUF file holds. */
static void requantize(const st_tensor *ct, enum dtype q, void **keep) {
    st_tensor *t = (st_tensor *)ct;
    CHECK(t->type == DTYPE_F32 && t->ndim == 2 && t->shape[1] % 32 == 0);
    const int64_t R = t->shape[0], C = t->shape[1];
    const size_t rb = dtype_row_bytes(q, C);
    uint8_t *buf = xmalloc((size_t)R * rb);
    for (int64_t r = 0; r < R; r++) quant_row_quantize(q, (const float *)t->data + r * C, buf + (size_t)r * rb, C);
    t->type = q;
    snprintf(t->type_name, sizeof t->type_name, "%s", dtype_name(q));
    t->data = buf;
    t->nbytes = (size_t)R * rb;
    *keep = buf;
}

static void test_prequantized(enum dtype q) {
    make_model_opts o = test_model_opts_tp();   /* d 64, 8 heads of 8, GQA 4, ffn 192, f32 */
    o.weight_tying = 0;
    o.vocab_size = 300;
    model a, b;
    um_err err = {0};
    TEST_CHECK(test_model_make("quant_model_pre", &o, &a, &err) == 0, "make: %s", err.msg);
    TEST_CHECK(test_model_make("quant_model_pre", &o, &b, &err) == 0, "load: %s", err.msg);
    a.quant = q;   /* quantized at load */
    void *keep[64];
    int n_keep = 0;
    requantize(b.llada.lm_head, q, &keep[n_keep++]);
    for (int l = 0; l < b.cfg.n_layers; l++) {
        const llada_layer_tensors *L = &b.llada.layers[l];
        const st_tensor *mats[] = {L->q_proj, L->k_proj, L->v_proj, L->attn_out, L->ff_proj, L->up_proj, L->ff_out};
        for (int i = 0; i < 7; i++) requantize(mats[i], q, &keep[n_keep++]);
    }
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_FP32, &err) == 0, "fp32: %s", err.msg);
    const size_t n = 40 * (size_t)a.cfg.n_embd_rows;
    float *la = run_single(&a), *lb = run_single(&b);
    TEST_CHECK(memcmp(la, lb, n * sizeof *la) == 0, "%s: stored blocks vs quantized at load: max rel diff %.3e",
               dtype_name(q), rel(lb, la, n));

    /* tensor parallel on the stored blocks */
    model_tp_opts o2 = {.tp = 2, .n_local = 2, .n_threads = 1, .dist = {.nnodes = 1}};
    model_tp *g = model_tp_create(&b, &o2, &err);
    TEST_CHECK(g != NULL, "%s --tp 2: %s", dtype_name(q), err.msg);
    if (g) {
        float *l2 = run(model_tp_leader(g), &b);
        const double e = rel(l2, la, n);
        TEST_CHECK(e < 1e-5, "%s stored blocks, --tp 2 vs 1: %.3e", dtype_name(q), e);
        free(l2);
        model_tp_free(g);
    }
    model_tp_opts o4 = {.tp = 4, .n_local = 4, .n_threads = 1, .dist = {.nnodes = 1}};
    um_err e4 = {0};
    g = model_tp_create(&b, &o4, &e4);
    TEST_CHECK(!g && strstr(e4.msg, "--tp 4") && strstr(e4.msg, "blocks"),
               "%s stored blocks, --tp 4 (16 of 64 columns per rank) refused: %s", dtype_name(q), e4.msg);
    if (g) model_tp_free(g);
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AUTO, &err) == 0, "auto");
    free(la);
    free(lb);
    model_free(&a);
    model_free(&b);
    for (int i = 0; i < n_keep; i++) free(keep[i]);
}

/* ---------------------------------------------------------------- memory */

/* kB of this process's resident pages in mappings of a file whose path ends with suffix. */
static long rss_of_mapping(const char *suffix) {
    FILE *fp = fopen("/proc/self/smaps", "r");
    if (!fp) return -1;
    char line[4096];
    int in = 0;
    long kb = 0;
    const size_t sl = strlen(suffix);
    while (fgets(line, sizeof line, fp)) {
        size_t n = strlen(line);
        while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') && strchr(line, ' ') < line + 40) {
            in = n >= sl && strcmp(line + n - sl, suffix) == 0;
            continue;
        }
        long v;
        if (in && sscanf(line, "Rss: %ld kB", &v) == 1) kb += v;
    }
    fclose(fp);
    return kb;
}

static void test_memory(void) {
    make_model_opts o = test_model_opts();
    o.dtype = DTYPE_BF16;
    o.d_model = 256;
    o.n_heads = 8;
    o.n_kv_heads = 4;
    o.ffn_hidden = 768;
    o.n_layers = 2;
    o.no_tokenizer = 1;
    o.vocab_size = 512;
    model m;
    um_err err = {0};
    TEST_CHECK(test_model_make("quant_model_mem", &o, &m, &err) == 0, "make: %s", err.msg);
    const long mats_kb = (long)((m.ck.total_bytes - m.llada.wte->nbytes) / 1024);
    long rss[2];
    for (int quant = 0; quant < 2; quant++) {
        /* quantized; or bf16 on the fp32 path, where every product reads the mapping */
        m.quant = quant ? DTYPE_Q4_0 : DTYPE_BF16;
        TEST_CHECK(backend_cpu_kernels_select(quant ? BACKEND_CPU_KERNELS_AUTO : BACKEND_CPU_KERNELS_FP32, &err) == 0,
                   "select");
        backend *be = backend_cpu_init(2);
        model_ctx ctx;
        TEST_CHECK(model_ctx_init(&ctx, &m, be, &err) == 0, "ctx: %s", err.msg);
        free(run(&ctx, &m));
        rss[quant] = rss_of_mapping("/quant_model_mem/model.safetensors");
        model_ctx_free(&ctx);
        backend_free(be);
    }
    printf("checkpoint mapping resident: %ld kB on the fp32 path, %ld kB quantized (%ld kB of tensors besides the "
           "embedding)\n", rss[0], rss[1], mats_kb);
    TEST_CHECK(rss[0] > mats_kb * 3 / 4, "fp32 path reads the mapping: %ld of %ld kB resident", rss[0], mats_kb);
    TEST_CHECK(rss[1] >= 0 && rss[1] < mats_kb / 8, "quantized: the checkpoint's pages were dropped: %ld of %ld kB "
               "resident", rss[1], mats_kb);
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AUTO, &err) == 0, "auto");
    model_free(&m);
}

/* ---------------------------------------------------------------- families */

/* Per-row comparison of out against ref ([40, V]): the median over rows of max|out - ref| / max|ref|,
 * and the rows whose argmax agrees. A MoE router near a tie picks other experts for a row when its
 * input moves a little, so MoE models are judged per row, not by their worst row. */
static double row_median(const float *out, const float *ref, int V, int *agree) {
    double e[40], den = 0;
    for (size_t i = 0; i < 40 * (size_t)V; i++) den = fmax(den, fabs(ref[i]));
    *agree = 0;
    for (int i = 0; i < 40; i++) {
        const float *o = out + (size_t)i * V, *r = ref + (size_t)i * V;
        int a = 0, b = 0;
        e[i] = 0;
        for (int v = 0; v < V; v++) {
            e[i] = fmax(e[i], fabs((double)o[v] - r[v]) / (den + 1e-30));
            if (o[v] > o[a]) a = v;
            if (r[v] > r[b]) b = v;
        }
        *agree += a == b;
    }
    for (int i = 1; i < 40; i++)   /* insertion sort */
        for (int j = i; j > 0 && e[j] < e[j - 1]; j--) {
            const double t = e[j];
            e[j] = e[j - 1];
            e[j - 1] = t;
        }
    return (e[19] + e[20]) / 2;
}

static void test_family(const char *preset, const char *name, int tp) {
    make_model_opts o;
    CHECK(make_model_preset(preset, &o) == 0);
    o.quiet = 1;
    if (o.moe == MAKE_MOE_LLADA2) o.ffn_hidden = 192, o.shared_ffn = 64;   /* 96 and 32 columns per rank of the
                                                                              dense and shared down: whole blocks */
    o.no_tokenizer = o.moe ? 0 : 1;   /* the MoE presets read their mask id from the tokenizer */
    model m;
    um_err err = {0};
    TEST_CHECK(test_model_make(name, &o, &m, &err) == 0, "%s: %s", preset, err.msg);
    const int V = m.cfg.n_embd_rows;
    /* the fp32 path: attention in fp32, so what differs is the quantization (and, with --tp, the order
     * of the partial sums) */
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_FP32, &err) == 0, "fp32");
    float *ref = run_single(&m);   /* the checkpoint's weights */
    for (int qi = 0; qi < 2; qi++) {
        m.quant = qi ? DTYPE_Q4_0 : DTYPE_Q8_0;
        float *out = run_single(&m);
        int agree;
        const double e = row_median(out, ref, V, &agree);
        printf("%s %s: median row rel diff to unquantized %.3e, argmax agrees on %d/40 rows\n", preset,
               model_quant_name(m.quant), e, agree);
        TEST_CHECK(e > 1e-4 && e < (qi ? 0.3 : 0.05), "%s %s ran quantized, within tolerance: median %.3e", preset,
                   model_quant_name(m.quant), e);
        if (tp > 1) {   /* expert / tensor parallel on the same quantized blocks (splits: whole rows or experts) */
            model_tp_opts to = {.tp = tp, .n_local = tp, .n_threads = 1, .dist = {.nnodes = 1}};
            model_tp *g = model_tp_create(&m, &to, &err);
            TEST_CHECK(g != NULL, "%s %s --tp %d: %s", preset, model_quant_name(m.quant), tp, err.msg);
            if (g) {
                float *lt = run(model_tp_leader(g), &m);
                int ag;
                const double et = row_median(lt, out, V, &ag);
                printf("%s %s --tp %d vs 1: median row rel diff %.3e, argmax agrees on %d/40 rows\n", preset,
                       model_quant_name(m.quant), tp, et, ag);
                TEST_CHECK(et < 1e-5 && ag >= 36, "%s %s --tp %d vs 1: median %.3e, %d/40 argmax", preset,
                           model_quant_name(m.quant), tp, et, ag);
                free(lt);
                model_tp_free(g);
            }
        }
        free(out);
    }
    TEST_CHECK(backend_cpu_kernels_select(BACKEND_CPU_KERNELS_AUTO, &err) == 0, "auto");
    free(ref);
    model_free(&m);
}

static void test_refused_without_cap(void) {
    model m;
    make_model_opts o = test_model_opts_tp();
    um_err err = {0};
    TEST_CHECK(test_model_make("quant_model_cap", &o, &m, &err) == 0, "make: %s", err.msg);
    m.quant = DTYPE_Q8_0;
    backend *be = backend_cpu_init(1);
    TEST_CHECK(model_quant_check(&m, be, &err) == 0, "the CPU takes q8_0");
    backend_free(be);
    TEST_CHECK(model_quant_parse("q4_0", &m.quant) == 0 && m.quant == DTYPE_Q4_0 && model_quant_parse("int4", &m.quant) < 0,
               "names");
    model_free(&m);
}

int main(void) {
    test_prequantized(DTYPE_Q8_0);
    test_prequantized(DTYPE_Q4_0);
    test_memory();
    test_family("lladamoe-tiny", "quant_model_moe", 2);
    test_family("llada2-tiny", "quant_model_llada2", 2);
    test_family("dream-tiny", "quant_model_dream", 1);
    test_refused_without_cap();
    return test_report();
}
