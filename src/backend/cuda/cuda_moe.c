/*
 * cuda_moe.c — BACKEND_CAP_MOE of the CUDA backend (backend.h "MoE dispatch"): a MoE layer's
 * routing, expert grouping and expert GEMMs on the device with kernels/moe.cu, so the forward never
 * waits for the host and can be captured into a CUDA graph.
 *
 * Per forward (all enqueued on the backend's stream, sizes from n, k and the expert count only):
 * umk_moe_route (top-k experts and weights per token) -> umk_moe_sort (rows grouped by expert,
 * offsets and the GEMM tile map in device memory) -> umk_moe_gemm gated (gate/up + SwiGLU over the
 * rows gathered by token) -> umk_moe_gemm (down) -> umk_moe_combine (each token's weighted rows
 * into x). The workspace (one activation buffer from the caller) holds every intermediate.
 *
 * Does not: handle more than UMK_MOE_MAX_EXPERTS experts, or d / ffn that are not multiples of 8
 * (moe_prepare returns NULL and model/moe.c routes such layers on the host with per-expert cuBLAS
 * GEMMs); run the router GEMM or the shared expert (model/moe.c, with the ordinary ops).
 * Threads: as the backend (one driving thread); prepare / release at load / unload time.
 */
#include "backend/cuda/cuda_backend.h"

#ifdef UNMASK_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

#define MOE_SMEM_MAX (48u << 10)   /* dynamic shared memory without an opt-in attribute */

struct bmoe {
    umk_moe_route_cfg rc;           /* routing rules; rc.bias = bias_dev */
    int               e0, e1;       /* experts held here */
    int               d, ffn;       /* model width, expert width */
    float            *bias_dev;     /* [n_experts] device f32, or NULL */
    const uint16_t  **w_tab;        /* device [3][n_experts] weight pointers: gate, up, down (NULL
                                       outside [e0, e1)) */
};

/* the workspace of n tokens, byte offsets of its parts (256-byte aligned) */
typedef struct moe_ws_layout {
    size_t idx, w, slot, tok, offsets, tile_e, tile_r, g, ys, bytes;
    int    max_tiles;
} moe_ws_layout;

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

static moe_ws_layout ws_layout(const bmoe *m, int n) {
    moe_ws_layout L;
    const size_t nk = (size_t)n * (size_t)m->rc.top_k, E = (size_t)m->rc.n_experts;
    const size_t e_loc = (size_t)(m->e1 - m->e0), rows = (size_t)umk_moe_tile_rows();
    /* each expert with rows adds at most one partial tile */
    L.max_tiles = (int)(nk / rows + (e_loc < nk ? e_loc : nk));
    size_t off = 0;
    L.idx = off, off += al256(nk * 4);
    L.w = off, off += al256(nk * 4);
    L.slot = off, off += al256(nk * 4);
    L.tok = off, off += al256(nk * 4);
    L.offsets = off, off += al256((E + 1) * 4);
    L.tile_e = off, off += al256((size_t)L.max_tiles * 4);
    L.tile_r = off, off += al256((size_t)L.max_tiles * 4);
    L.g = off, off += al256(nk * (size_t)m->ffn * 2);
    L.ys = off, off += al256(nk * (size_t)m->d * 2);
    L.bytes = off;
    return L;
}

bmoe *cuda_moe_prepare(backend *be, const bmoe_desc *desc) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(!ci->capturing);
    const int E = desc->n_experts, K = desc->top_k;
    CHECK(E > 0 && K > 0 && K <= E && desc->e0 >= 0 && desc->e0 <= desc->e1 && desc->e1 <= E);
    const int G = desc->router == BMOE_SIGMOID_GROUP ? desc->n_group : 1;
    CHECK(G > 0 && E % G == 0);
    int d = 0, ffn = 0;
    for (int e = desc->e0; e < desc->e1; e++) {   /* FP8 experts: the host path (their products are matmuls) */
        if (desc->gate[e].type != DTYPE_BF16 || desc->up[e].type != DTYPE_BF16 || desc->down[e].type != DTYPE_BF16)
            return NULL;
        if (e == desc->e0) ffn = (int)desc->gate[e].rows, d = (int)desc->gate[e].cols;
        CHECK(desc->gate[e].rows == ffn && desc->up[e].rows == ffn && desc->gate[e].cols == d &&
              desc->up[e].cols == d && desc->down[e].rows == d && desc->down[e].cols == ffn);
    }
    /* shapes the kernels do not take stay on the host path */
    if (ci->force_host_moe || E > UMK_MOE_MAX_EXPERTS || d % 8 != 0 || ffn % 8 != 0 ||
        umk_moe_route_smem(E, K, G) > MOE_SMEM_MAX || umk_moe_sort_smem(E) > MOE_SMEM_MAX)
        return NULL;
    bmoe *m = xcalloc(1, sizeof *m);
    m->rc.n_experts = E;
    m->rc.top_k = K;
    m->rc.sigmoid_group = desc->router == BMOE_SIGMOID_GROUP;
    m->rc.n_group = G;
    m->rc.topk_group = desc->router == BMOE_SIGMOID_GROUP ? desc->topk_group : 1;
    m->rc.routed_scale = desc->routed_scale;
    m->e0 = desc->e0;
    m->e1 = desc->e1;
    m->d = d;
    m->ffn = ffn;
    if (desc->bias) {
        CUDA_CHECK(cudaMalloc((void **)&m->bias_dev, (size_t)E * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(m->bias_dev, desc->bias, (size_t)E * sizeof(float), cudaMemcpyHostToDevice));
        m->rc.bias = m->bias_dev;
    }
    const void **tab = xcalloc((size_t)3 * (size_t)E, sizeof *tab);
    for (int e = desc->e0; e < desc->e1; e++) {
        tab[e] = desc->gate[e].data;
        tab[E + e] = desc->up[e].data;
        tab[2 * E + e] = desc->down[e].data;
    }
    CUDA_CHECK(cudaMalloc((void **)&m->w_tab, (size_t)3 * (size_t)E * sizeof *tab));
    CUDA_CHECK(cudaMemcpy(m->w_tab, tab, (size_t)3 * (size_t)E * sizeof *tab, cudaMemcpyHostToDevice));
    free(tab);
    return m;
}

void cuda_moe_release(backend *be, bmoe *m) {
    cuda_use_device(cuda_impl_of(be));
    if (m->bias_dev) CUDA_CHECK(cudaFree(m->bias_dev));
    CUDA_CHECK(cudaFree((void *)m->w_tab));
    free(m);
}

size_t cuda_moe_workspace(backend *be, const bmoe *m, int n) {
    (void)be;
    return (ws_layout(m, n > 0 ? n : 1).bytes + 1) / 2;   /* bf16 activation elements */
}

void cuda_moe_forward(backend *be, const bmoe *m, const void *logits, const void *h, int n, void *x, void *ws) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    const moe_ws_layout L = ws_layout(m, n);
    char *b = ws;
    int32_t *idx = (int32_t *)(b + L.idx), *slot = (int32_t *)(b + L.slot), *tok = (int32_t *)(b + L.tok);
    int32_t *offsets = (int32_t *)(b + L.offsets), *tile_e = (int32_t *)(b + L.tile_e);
    int32_t *tile_r = (int32_t *)(b + L.tile_r);
    float *w = (float *)(b + L.w);
    uint16_t *g = (uint16_t *)(b + L.g), *ys = (uint16_t *)(b + L.ys);
    const int E = m->rc.n_experts, K = m->rc.top_k;
    const uint16_t *const *tab = m->w_tab;
    CUDA_CHECK(umk_moe_route(&m->rc, logits, n, idx, w, ci->stream));
    CUDA_CHECK(umk_moe_sort(idx, n, K, E, m->e0, m->e1, L.max_tiles, offsets, slot, tok, tile_e, tile_r, ci->stream));
    CUDA_CHECK(umk_moe_gemm(1, h, tok, tab, tab + E, offsets, tile_e, tile_r, L.max_tiles, m->ffn, m->d, g,
                            ci->stream));
    CUDA_CHECK(umk_moe_gemm(0, g, NULL, tab + 2 * E, NULL, offsets, tile_e, tile_r, L.max_tiles, m->d, m->ffn, ys,
                            ci->stream));
    CUDA_CHECK(umk_moe_combine(x, ys, m->d, n, K, slot, w, ci->stream));
}

void backend_cuda_force_host_moe(backend *be, int on) { cuda_impl_of(be)->force_host_moe = on; }

#else /* !UNMASK_HAVE_CUDA */

#include "util/log.h"

void backend_cuda_force_host_moe(backend *be, int on) {
    (void)be, (void)on;
    UM_FATAL("CUDA backend function called in a build without CUDA");
}

#endif /* UNMASK_HAVE_CUDA */
