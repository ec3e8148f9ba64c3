/*
 * test_moe_device.c — the MoE forward on the CUDA backend without the host (model/moe.c on
 * BACKEND_CAP_MOE: kernels/moe.cu), on lladamoe-tiny (softmax router) and llada2-tiny (grouped
 * sigmoid router, shared expert, block-causal):
 *   - every MoE layer took the device dispatch (ctx.host_sync == 0) and LLaDA-MoE sequences are
 *     eligible for the device-resident loop (LLaDA2 too: block diffusion, tests/device/test_device_loop);
 *   - a whole forward (model_forward_dev) is captured into a graph: a device->host copy or a stream
 *     synchronisation inside the MoE layers aborts the capture (act_to_host refuses it, the runtime
 *     invalidates it), so passing proves none happens; the replayed logits equal a direct forward's
 *     bit for bit, also after the inputs' rows were overwritten by another forward in between;
 *   - the device dispatch's logits vs the host-routed path of the same backend
 *     (backend_cuda_force_host_moe: router logits copied to the host, moe_route, per-expert cuBLAS):
 *     relative L2 <= 1e-2 and the same argmax on every row that is not a near-tie; the forced ctx has
 *     host_sync = 1 and is not eligible;
 *   - a batch of two sequences of different lengths (routing that differs per token and per
 *     sequence) equals each sequence's forward alone;
 *   - an expert width the kernels do not take (36) falls back to the host dispatch: host_sync = 1,
 *     the host loop, a forward that still runs.
 * Needs a binary linked with a CUDA-capable core (the emulated core library in CI); device
 * UNMASK_TEST_DEVICE (default cuda:0).
 */
#include <math.h>

#include "backend/cuda/cuda_backend.h"
#include "decode/decode_device.h"
#include "device_test.h"

#define T_MAX 24

/* logits [n, V] of tokens (one sequence, positions 0.., block length B: 0 = bidirectional) through
 * model_forward_dev, copied to out */
static void fwd_dev(model_ctx *ctx, const int32_t *toks, int n, int B, float *out) {
    int32_t start[2] = {0, n}, pos[T_MAX], bl = B;
    CHECK(n <= T_MAX);
    for (int i = 0; i < n; i++) pos[i] = i;
    const fwd_batch b = {.n_seqs = 1, .seq_start = start, .tokens = toks, .pos = pos, .n_out = n,
                         .block_len = B ? &bl : NULL};
    const void *lg = NULL;
    um_err err = {0};
    CHECK(model_forward_dev(ctx, &b, &lg, &err) == 0);
    backend_act_to_host(ctx->be, lg, (size_t)n * (size_t)ctx->m->cfg.n_embd_rows, out);
}

static double rel_l2(const float *a, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* argmax of a differs from ref's on a row whose top-2 gap in ref exceeds 2 x the row's largest
 * |a - ref| (a real disagreement, not a near-tie): the count */
static int argmax_flips(const float *a, const float *ref, int n, int V) {
    int flips = 0;
    for (int r = 0; r < n; r++) {
        const float *x = a + (size_t)r * V, *y = ref + (size_t)r * V;
        int ax = 0, ay = 0;
        double err = 0;
        for (int j = 0; j < V; j++) {
            ax = x[j] > x[ax] ? j : ax;
            ay = y[j] > y[ay] ? j : ay;
            err = fmax(err, fabs((double)x[j] - y[j]));
        }
        double second = -INFINITY;
        for (int j = 0; j < V; j++)
            if (j != ay) second = fmax(second, y[j]);
        flips += ax != ay && (double)y[ay] - second > 2 * err;
    }
    return flips;
}

static void test_family(const char *preset, int B) {
    fprintf(stderr, "-- %s --\n", preset);
    device_fixture fx;
    char name[96];
    snprintf(name, sizeof name, "test_moe_device_%s", preset);
    device_fixture_open_preset(&fx, name, preset);
    const int V = fx.m.cfg.n_embd_rows;
    model_ctx ctx, host;
    um_err err = {0};
    CHECK(model_ctx_init(&ctx, &fx.m, fx.be, &err) == 0);
    TEST_CHECK(ctx.host_sync == 0, "%s: every MoE layer on the device dispatch (host_sync 0)", preset);

    stream st;
    decode_params p = decode_params_for_model(&fx.m);   /* LLaDA2: the aligned layout */
    p.gen_length = 8;
    p.block_length = B ? B : 4;
    decode_seq *s = mk(ctx.m, &p, fx.prompt, fx.n_prompt, &st);
    TEST_CHECK(decode_device_eligible(&ctx, s), "%s: eligible for the device-resident loop", preset);
    decode_seq_free(s);
    stream_free(&st);

    int32_t toks[T_MAX], other[T_MAX];
    const int n = 20;
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 37 + 11) % 480) + 1, other[i] = (int32_t)((i * 91 + 5) % 470) + 2;
    float *direct = xmalloc((size_t)n * V * sizeof *direct), *replay = xmalloc((size_t)n * V * sizeof *replay);
    float *hostp = xmalloc((size_t)n * V * sizeof *hostp), *scratch = xmalloc((size_t)n * V * sizeof *scratch);

    /* capture: the forward's buffers exist (direct run first), then begin / forward / end */
    fwd_dev(&ctx, toks, n, B, direct);
    int32_t start[2] = {0, n}, pos[T_MAX], bl = B;
    for (int i = 0; i < n; i++) pos[i] = i;
    const fwd_batch b = {.n_seqs = 1, .seq_start = start, .tokens = toks, .pos = pos, .n_out = n,
                         .block_len = B ? &bl : NULL};
    const void *lg = NULL;
    backend_graph_begin(fx.be);
    const int rc = model_forward_dev(&ctx, &b, &lg, &err);
    backend_graph *g = backend_graph_end(fx.be);
    TEST_CHECK(rc == 0 && g != NULL, "%s: the forward was captured into a graph", preset);
    fwd_dev(&ctx, other, n, B, scratch);   /* same shapes, other tokens: the buffers are overwritten */
    backend_graph_launch(fx.be, g);
    backend_act_to_host(fx.be, lg, (size_t)n * V, replay);
    TEST_CHECK(memcmp(direct, replay, (size_t)n * V * sizeof *direct) == 0,
               "%s: graph replay == direct forward (bit for bit)", preset);
    TEST_CHECK(memcmp(direct, scratch, (size_t)n * V * sizeof *direct) != 0, "%s: other tokens, other logits",
               preset);
    backend_graph_free(fx.be, g);

    /* batched with another sequence (another length): each sequence's logits as alone */
    int32_t both[2 * T_MAX], bstart[3] = {0, 13, 13 + n}, bpos[2 * T_MAX];
    for (int i = 0; i < 13; i++) both[i] = other[i], bpos[i] = i;
    for (int i = 0; i < n; i++) both[13 + i] = toks[i], bpos[13 + i] = i;
    int32_t bbl[2] = {B, B};
    const fwd_batch bb = {.n_seqs = 2, .seq_start = bstart, .tokens = both, .pos = bpos, .n_out = 13 + n,
                          .block_len = B ? bbl : NULL};
    float *blg = xmalloc((size_t)(13 + n) * V * sizeof *blg);
    CHECK(model_forward(&ctx, &bb, blg, &err) == 0);
    const double eb = rel_l2(blg + (size_t)13 * V, direct, (size_t)n * V);
    TEST_CHECK(eb <= 1e-2 && argmax_flips(blg + (size_t)13 * V, direct, n, V) == 0,
               "%s: batched (13 + 20 tokens) == alone: rel %.3g", preset, eb);
    free(blg);

    /* the host-routed path of the same backend */
    backend_cuda_force_host_moe(fx.be, 1);
    CHECK(model_ctx_init(&host, &fx.m, fx.be, &err) == 0);
    backend_cuda_force_host_moe(fx.be, 0);
    TEST_CHECK(host.host_sync == 1, "%s: forced host routing sets host_sync", preset);
    s = mk(host.m, &p, fx.prompt, fx.n_prompt, &st);
    TEST_CHECK(!decode_device_eligible(&host, s), "%s: host-routed ctx: not eligible", preset);
    decode_seq_free(s);
    stream_free(&st);
    fwd_dev(&host, toks, n, B, hostp);
    const double e = rel_l2(direct, hostp, (size_t)n * V);
    const int flips = argmax_flips(direct, hostp, n, V);
    fprintf(stderr, "%s: device dispatch vs host routing: rel %.3g, %d decisive argmax flips\n", preset, e, flips);
    TEST_CHECK(e <= 1e-2 && flips == 0, "%s: device dispatch == host routing (rel %.3g, %d flips)", preset, e, flips);

    model_ctx_free(&host);
    model_ctx_free(&ctx);
    free(direct), free(replay), free(hostp), free(scratch);
    device_fixture_close(&fx);
}

/* An expert width the device kernels do not take (36: not a multiple of 8): the layer routes on the
 * host, the ctx says so (host_sync), the decode stays on the host loop, and the forward still runs. */
static void test_fallback(void) {
    fprintf(stderr, "-- lladamoe-tiny, expert width 36 (host dispatch) --\n");
    make_model_opts o;
    CHECK(make_model_preset("lladamoe-tiny", &o) == 0);
    o.quiet = 1;
    o.moe_ffn = 36;
    model m;
    um_err err = {0};
    if (test_model_make("test_moe_device_ffn36_model", &o, &m, &err) != 0) {
        fprintf(stderr, "make-model: %s\n", err.msg);
        exit(1);
    }
    const char *dev = getenv("UNMASK_TEST_DEVICE");
    backend *be = backend_init_device(dev && *dev ? dev : "cuda:0", 1, &err);
    CHECK(be);
    model_ctx ctx;
    CHECK(model_ctx_init(&ctx, &m, be, &err) == 0);
    TEST_CHECK(ctx.host_sync == 1, "ffn 36: routed on the host (host_sync 1)");
    int32_t prompt[6] = {5, 9, 14, 2, 77, 31};
    decode_params p = decode_params_default();
    p.gen_length = 8;
    p.block_length = 4;
    stream st;
    decode_seq *s = mk(ctx.m, &p, prompt, 6, &st);
    TEST_CHECK(!decode_device_eligible(&ctx, s), "ffn 36: host loop");
    decode_seq_free(s);
    stream_free(&st);
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg = xmalloc((size_t)8 * m.cfg.n_embd_rows * sizeof *lg);
    fwd_dev(&ctx, toks, 8, 0, lg);
    int finite = 1;
    for (size_t i = 0; i < (size_t)8 * m.cfg.n_embd_rows; i++) finite &= isfinite(lg[i]) != 0;
    TEST_CHECK(finite, "ffn 36: the host-dispatched forward runs");
    free(lg);
    model_ctx_free(&ctx);
    backend_free(be);
    model_free(&m);
}

int main(void) {
    test_family("lladamoe-tiny", 0);
    test_family("llada2-tiny", 4);
    test_fallback();
    return test_report();
}
