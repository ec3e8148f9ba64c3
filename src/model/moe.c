/*
 * moe.c — the mixture-of-experts sublayer (moe.h): tensor binding, upload, routing and the grouped
 * expert forward of LLaDA-MoE and LLaDA2, written against backend ops.
 *
 * Per MoE layer: router logits h·Wgᵀ on the backend, then one of two dispatches of the routed
 * experts. Device (a backend with BACKEND_CAP_MOE that takes the layer's shapes: CUDA):
 * backend_moe_forward routes, groups, runs the expert GEMMs and combines on the device — nothing
 * comes back to the host, so the forward can be captured into a graph. Host (the CPU backend, and
 * shapes the device kernels do not take): the logits are copied to the host; the routing
 * (moe_route, docs/model-spec.md §2c) picks each token's k experts and weights; a counting sort
 * groups the (token, expert) pairs by expert; one backend_get_rows gathers the routed rows; each
 * expert with tokens runs one fused gate/up SwiGLU GEMM and one down GEMM over exactly its rows;
 * backend_moe_combine adds each token's weighted outputs to x. Both route and order rows alike
 * (the CUDA routing kernel follows moe_route rule for rule). The shared expert runs over all
 * tokens with the ordinary ops, before the routed outputs are added.
 * Expert + tensor parallel (a shard of W ranks): every rank routes every token the same way, holds
 * and runs a contiguous range of the experts over all their tokens, and a 1/W slice of the shared
 * expert's width; its routed and shared outputs form a partial sum, one all-reduce per layer adds
 * them up (docs/parallel.md "Mixture of experts").
 * Does not: implement kernels (the backend does). Threads: binding and upload at load time (any
 * thread); forward on the engine thread owning the ctx.
 */
#include "model/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "model/llada_weights.h"
#include "util/log.h"

/* ---------------------------------------------------------------- binding */

int moe_tensors_bind(model *m, int l, const moe_names *nm, llada_layer_tensors *L, um_err *err) {
    const model_config *c = &m->cfg;
    const int64_t d = c->d_model, E = c->n_experts, F = c->moe_ffn, SF = c->shared_ffn;
    moe_layer_tensors *t = xcalloc(1, sizeof *t);
    L->moe = t;
    t->gate = xcalloc((size_t)E, sizeof *t->gate);
    t->up = xcalloc((size_t)E, sizeof *t->up);
    t->down = xcalloc((size_t)E, sizeof *t->down);
    char name[256];
    snprintf(name, sizeof name, nm->router, l);
    if (!(t->router = llada_bind_one(m, name, E, d, err))) return -1;
    snprintf(name, sizeof name, nm->expert_bias, l);
    if (c->expert_bias) {
        if (!(t->expert_bias = llada_bind_one(m, name, E, -1, err))) return -1;
    } else if (checkpoint_find(&m->ck, name)) {
        /* a bias the config does not enable is not applied by the official code: refuse rather
         * than silently ignore trained values */
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: tensor '%s' exists but config.json does not set moe_router_enable_expert_bias", m->dir,
                          name);
    }
    for (int e = 0; e < E; e++) {
        snprintf(name, sizeof name, nm->gate, l, e);
        if (!(t->gate[e] = llada_bind_one(m, name, F, d, err))) return -1;
        snprintf(name, sizeof name, nm->up, l, e);
        if (!(t->up[e] = llada_bind_one(m, name, F, d, err))) return -1;
        snprintf(name, sizeof name, nm->down, l, e);
        if (!(t->down[e] = llada_bind_one(m, name, d, F, err))) return -1;
    }
    if (SF > 0) {
        snprintf(name, sizeof name, nm->sh_gate, l);
        if (!(t->sh_gate = llada_bind_one(m, name, SF, d, err))) return -1;
        snprintf(name, sizeof name, nm->sh_up, l);
        if (!(t->sh_up = llada_bind_one(m, name, SF, d, err))) return -1;
        snprintf(name, sizeof name, nm->sh_down, l);
        if (!(t->sh_down = llada_bind_one(m, name, d, SF, err))) return -1;
    }
    return 0;
}

void moe_tensors_free(llada_layer_tensors *L) {
    if (!L->moe) return;
    free(L->moe->gate);
    free(L->moe->up);
    free(L->moe->down);
    free(L->moe);
    L->moe = NULL;
}

/* ---------------------------------------------------------------- weights */

struct moe_layer_w {
    bweight  router;                     /* [E, d] */
    float   *bias;                       /* [E] host f32 expert bias, or NULL */
    bweight *gate, *up, *down;           /* [E] experts: [F, d], [F, d], [d, F]; data NULL outside
                                            this rank's range */
    bweight  sh_gate, sh_up, sh_down;    /* shared expert (this rank's slice of its width: [SF/W, d],
                                            [SF/W, d], [d, SF/W]); data NULL when none */
    int      world;                      /* ranks sharing the layer (1 = unsharded) */
    int      e0, e1;                     /* this rank's experts [e0, e1) */
    void    *sh_down_part;               /* world > 1: host copy of sh_down's column slice (a backend
                                            may keep a view of what it uploads), owned */
    bmoe    *dev;                        /* the backend's device dispatch of the routed experts, or
                                            NULL: routing on the host */
};

static int upload_t(llada_loader *ld, const st_tensor *t, enum llada_wkind kind, bweight *w, um_err *err) {
    const int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    return llada_upload(ld, t, t->data, 0, 0, rows, cols, t->n_elems, kind, w, err);
}

/* Rows [r*R/W, (r+1)*R/W) of a 2-d matrix: a view. */
static int upload_rows(llada_loader *ld, const st_tensor *t, int r, int W, bweight *w, um_err *err) {
    const int64_t lr = t->shape[0] / W, cols = t->shape[1];
    return llada_upload(ld, t, (const char *)t->data + (size_t)(r * lr) * dtype_row_bytes(t->type, cols), r * lr, 0, lr,
                        cols, lr * cols, LLADA_W_MATRIX, w, err);
}

moe_layer_w *moe_layer_upload(llada_loader *ld, const moe_layer_tensors *t, um_err *err) {
    backend *be = ld->ctx->be;
    const model_config *c = &ld->ctx->m->cfg;
    const model_shard *shard = &ld->ctx->shard;
    const int E = c->n_experts;
    const int W = shard->world > 1 ? shard->world : 1, r = W > 1 ? shard->rank : 0;
    moe_layer_w *w = xcalloc(1, sizeof *w);
    w->gate = xcalloc((size_t)E, sizeof *w->gate);
    w->up = xcalloc((size_t)E, sizeof *w->up);
    w->down = xcalloc((size_t)E, sizeof *w->down);
    w->world = W;
    w->e0 = (int)((int64_t)E * r / W);
    w->e1 = (int)((int64_t)E * (r + 1) / W);
    if (upload_t(ld, t->router, LLADA_W_PLAIN, &w->router, err)) goto fail;
    if (t->expert_bias) {
        w->bias = xmalloc((size_t)E * sizeof *w->bias);
        dtype_to_f32(t->expert_bias->type, t->expert_bias->data, w->bias, (size_t)E);
    }
    for (int e = w->e0; e < w->e1; e++)
        if (upload_t(ld, t->gate[e], LLADA_W_MATRIX, &w->gate[e], err) ||
            upload_t(ld, t->up[e], LLADA_W_MATRIX, &w->up[e], err) ||
            upload_t(ld, t->down[e], LLADA_W_MATRIX, &w->down[e], err))
            goto fail;
    if (t->sh_gate && W == 1 &&
        (upload_t(ld, t->sh_gate, LLADA_W_MATRIX, &w->sh_gate, err) ||
         upload_t(ld, t->sh_up, LLADA_W_MATRIX, &w->sh_up, err) ||
         upload_t(ld, t->sh_down, LLADA_W_MATRIX, &w->sh_down, err)))
        goto fail;
    const bmoe_desc desc = {.router = c->router == MODEL_ROUTER_SOFTMAX ? BMOE_SOFTMAX : BMOE_SIGMOID_GROUP,
                            .n_experts = E, .top_k = c->moe_top_k, .n_group = c->n_group,
                            .topk_group = c->topk_group, .routed_scale = c->routed_scale, .bias = w->bias,
                            .e0 = w->e0, .e1 = w->e1, .gate = w->gate, .up = w->up, .down = w->down};
    w->dev = backend_moe_prepare(be, &desc);
    if (t->sh_gate && W > 1) {   /* rows of gate / up, the matching columns of down (copied) */
        CHECK(t->sh_gate->shape[0] % W == 0);   /* model_ctx_init_shard checked shared_ffn */
        const st_tensor *sd = t->sh_down;
        const int64_t d = sd->shape[0], cols = sd->shape[1], lc = cols / W;
        if (dtype_is_quant(sd->type) && lc % DTYPE_QBLOCK != 0) {
            um_err_param(err, "tp", "--tp %d: tensor '%s' is %s and its %lld columns would split into %lld per rank, "
                         "not whole blocks of %d", W, sd->name, dtype_name(sd->type), (long long)cols, (long long)lc,
                         DTYPE_QBLOCK);
            goto fail;
        }
        const size_t rb = dtype_row_bytes(sd->type, cols), lb = dtype_row_bytes(sd->type, lc);
        const size_t off = dtype_row_bytes(sd->type, r * lc);
        char *part = xmalloc((size_t)d * lb);
        for (int64_t i = 0; i < d; i++) memcpy(part + (size_t)i * lb, (const char *)sd->data + (size_t)i * rb + off, lb);
        w->sh_down_part = part;
        if (upload_rows(ld, t->sh_gate, r, W, &w->sh_gate, err) || upload_rows(ld, t->sh_up, r, W, &w->sh_up, err) ||
            llada_upload(ld, sd, part, 0, r * lc, d, lc, d * lc, LLADA_W_MATRIX, &w->sh_down, err))
            goto fail;
        checkpoint_release(&ld->ctx->m->ck, sd->data, (size_t)d * rb);
        if (!backend_weight_keeps_source(be, &w->sh_down)) {   /* the backend copied it */
            free(w->sh_down_part);
            w->sh_down_part = NULL;
        }
    }
    return w;
fail:
    moe_layer_free(be, c, w);
    return NULL;
}

void moe_layer_free(backend *be, const model_config *c, moe_layer_w *w) {
    if (!w) return;
    backend_moe_release(be, w->dev);
    bweight *one[] = {&w->router, &w->sh_gate, &w->sh_up, &w->sh_down};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        if (one[i]->data) backend_weight_free(be, one[i]);
    for (int e = 0; e < c->n_experts; e++) {
        bweight *ex[] = {&w->gate[e], &w->up[e], &w->down[e]};
        for (int i = 0; i < 3; i++)
            if (ex[i]->data) backend_weight_free(be, ex[i]);
    }
    free(w->gate);
    free(w->up);
    free(w->down);
    free(w->bias);
    free(w->sh_down_part);
    free(w);
}

/* ---------------------------------------------------------------- routing */

/* The k largest of v[0..n) not excluded (v = -INFINITY counts as excluded only if fewer remain),
 * best first, ties to the lower index: idx[0..k). O(n k), k is small. */
static void top_k(const double *v, int n, int k, int32_t *idx) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int q = 0; q < j && !used; q++) used = idx[q] == i;
            if (!used && (best < 0 || v[i] > v[best])) best = i;
        }
        idx[j] = best;
    }
}

void moe_route(const model_config *c, const float *logits, const float *bias, int32_t *idx, float *weights) {
    const int E = c->n_experts, K = c->moe_top_k;
    double *p = xmalloc((size_t)E * sizeof *p);
    if (c->router == MODEL_ROUTER_SOFTMAX) {
        /* softmax over all experts, + bias; the (biased) top-k values are the weights */
        double mx = logits[0], sum = 0;
        for (int e = 1; e < E; e++) mx = logits[e] > mx ? logits[e] : mx;
        for (int e = 0; e < E; e++) sum += (p[e] = exp((double)logits[e] - mx));
        for (int e = 0; e < E; e++) p[e] = p[e] / sum + (bias ? bias[e] : 0.0);
        top_k(p, E, K, idx);
        for (int j = 0; j < K; j++) weights[j] = (float)p[idx[j]];
    } else {
        CHECK(c->router == MODEL_ROUTER_SIGMOID_GROUP);
        /* selection on sigmoid + bias within the topk_group best groups (a group scores the sum of
         * its two best biased values); weights = the unbiased sigmoids, renormalised, scaled */
        const int G = c->n_group, per = E / G;
        double *sg = xmalloc((size_t)E * sizeof *sg), *gs = xmalloc((size_t)G * sizeof *gs);
        for (int e = 0; e < E; e++) {
            p[e] = 1.0 / (1.0 + exp(-(double)logits[e]));
            sg[e] = p[e] + (bias ? bias[e] : 0.0);
        }
        int32_t two[2], *gk = xmalloc((size_t)c->topk_group * sizeof *gk);
        for (int g = 0; g < G; g++) {
            top_k(sg + g * per, per, 2, two);
            gs[g] = sg[g * per + two[0]] + sg[g * per + two[1]];
        }
        top_k(gs, G, c->topk_group, gk);
        for (int g = 0; g < G; g++) {
            int keep = 0;
            for (int q = 0; q < c->topk_group; q++) keep |= gk[q] == g;
            if (!keep)
                for (int e = g * per; e < (g + 1) * per; e++) sg[e] = -INFINITY;
        }
        top_k(sg, E, K, idx);
        double sum = 0;
        for (int j = 0; j < K; j++) sum += p[idx[j]];
        for (int j = 0; j < K; j++)
            weights[j] = (float)((K > 1 ? p[idx[j]] / (sum + 1e-20) : p[idx[j]]) * (double)c->routed_scale);
        free(sg);
        free(gs);
        free(gk);
    }
    free(p);
}

/* ---------------------------------------------------------------- forward */

struct moe_scratch {
    int      cap_tok;      /* tokens lg, sg, su, tmp hold */
    int      cap_host;     /* tokens the host dispatch's buffers hold (0: none allocated) */
    size_t   cap_ws;       /* elements of ws */
    void    *lg;           /* [cap_tok, E] router logits (backend) */
    void    *sg, *su;      /* [cap_tok, SF] shared expert gate / up (NULL without one) */
    void    *tmp;          /* [cap_tok, d] shared expert down product before the add; a sharded
                              layer's partial sum */
    void    *ws;           /* [cap_ws] device dispatch workspace (backend_moe_workspace), or NULL */
    /* host dispatch */
    float   *lg_h;         /* [cap_host, E] host copy of the logits */
    int32_t *idx;          /* [cap_host, K] chosen experts (host) */
    float   *w;            /* [cap_host, K] their weights (host) */
    int32_t *slot;         /* [cap_host, K] row of each (token, choice) in the expert-sorted buffers */
    int32_t *lslot;        /* [cap_host, K] sharded layer: slot, or -1 for another rank's expert */
    int32_t *tok;          /* [cap_host * K] token of each sorted row */
    int32_t *count;        /* [E + 1] rows per expert, then offsets */
    void    *xs;           /* [cap_host * K, d] routed input rows, grouped by expert */
    void    *g, *u;        /* [cap_host * K, F] gate (-> SwiGLU output) / up */
    void    *ys;           /* [cap_host * K, d] expert outputs */
};

static void act_replace(backend *be, void **p, size_t n) {
    if (*p) backend_act_free(be, *p);
    *p = n ? backend_act_alloc(be, n) : NULL;
}

/* buffers for n tokens: the common ones, and the dispatch's (device workspace or host buffers) */
static void scratch_grow(backend *be, const model_config *c, const moe_layer_w *w, moe_scratch *s, int n) {
    const size_t N = (size_t)n, K = (size_t)c->moe_top_k, d = (size_t)c->d_model, F = (size_t)c->moe_ffn;
    const size_t E = (size_t)c->n_experts, SF = (size_t)c->shared_ffn;
    if (n > s->cap_tok) {
        act_replace(be, &s->lg, N * E);
        act_replace(be, &s->sg, N * SF);
        act_replace(be, &s->su, N * SF);
        act_replace(be, &s->tmp, N * d);
        s->cap_tok = n;
    }
    if (w->dev) {
        const size_t need = backend_moe_workspace(be, w->dev, n);
        if (need > s->cap_ws) {
            act_replace(be, &s->ws, need);
            s->cap_ws = need;
        }
        return;
    }
    if (n <= s->cap_host) return;
    act_replace(be, &s->xs, N * K * d);
    act_replace(be, &s->g, N * K * F);
    act_replace(be, &s->u, N * K * F);
    act_replace(be, &s->ys, N * K * d);
    s->lg_h = xrealloc(s->lg_h, N * E * sizeof *s->lg_h);
    s->idx = xrealloc(s->idx, N * K * sizeof *s->idx);
    s->w = xrealloc(s->w, N * K * sizeof *s->w);
    s->slot = xrealloc(s->slot, N * K * sizeof *s->slot);
    s->lslot = xrealloc(s->lslot, N * K * sizeof *s->lslot);
    s->tok = xrealloc(s->tok, N * K * sizeof *s->tok);
    s->count = xrealloc(s->count, (E + 1) * sizeof *s->count);
    s->cap_host = n;
}

void moe_scratch_free(backend *be, moe_scratch *s) {
    if (!s) return;
    void *bufs[] = {s->lg, s->sg, s->su, s->tmp, s->ws, s->xs, s->g, s->u, s->ys};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) backend_act_free(be, bufs[i]);
    free(s->lg_h);
    free(s->idx);
    free(s->w);
    free(s->slot);
    free(s->lslot);
    free(s->tok);
    free(s->count);
    free(s);
}

int moe_layer_on_device(const moe_layer_w *w) { return w->dev != NULL; }

/* The routed experts' weighted outputs added to acc[n, d] (x, or a sharded layer's partial sum),
 * routed on the host: this rank's experts only when sharded (the others' slots are -1). */
static void routed_host(backend *be, const model_config *c, const moe_layer_w *w, const void *h, int n, void *acc,
                        moe_scratch *s) {
    const int E = c->n_experts, K = c->moe_top_k, d = c->d_model, F = c->moe_ffn;
    const size_t es = dtype_size(backend_act_dtype(be));
    backend_act_to_host(be, s->lg, (size_t)n * (size_t)E, s->lg_h);
    for (int t = 0; t < n; t++)
        moe_route(c, s->lg_h + (size_t)t * E, w->bias, s->idx + (size_t)t * K, s->w + (size_t)t * K);

    /* group the (token, choice) pairs by expert: counting sort, token order inside an expert */
    memset(s->count, 0, (size_t)(E + 1) * sizeof *s->count);
    for (int i = 0; i < n * K; i++) s->count[s->idx[i] + 1]++;
    for (int e = 0; e < E; e++) s->count[e + 1] += s->count[e];   /* count[e] = first row of expert e */
    for (int i = 0; i < n * K; i++) {
        const int r = s->count[s->idx[i]]++;
        s->slot[i] = r;
        s->tok[r] = i / K;
    }
    for (int e = E; e > 0; e--) s->count[e] = s->count[e - 1];   /* back to offsets */
    s->count[0] = 0;

    /* one gather of this rank's rows (all of them unsharded; expert-sorted, so a contiguous range),
     * then per expert one SwiGLU GEMM pair over its rows */
    const int r0 = s->count[w->e0], r1 = s->count[w->e1];
    if (r1 > r0) backend_get_rows(be, h, d, s->tok + r0, r1 - r0, (char *)s->xs + (size_t)r0 * (size_t)d * es);
    for (int e = w->e0; e < w->e1; e++) {
        const int q0 = s->count[e], cnt = s->count[e + 1] - q0;
        if (cnt == 0) continue;
        char *xs = (char *)s->xs + (size_t)q0 * (size_t)d * es, *ys = (char *)s->ys + (size_t)q0 * (size_t)d * es;
        char *g = (char *)s->g + (size_t)q0 * (size_t)F * es, *u = (char *)s->u + (size_t)q0 * (size_t)F * es;
        const blinear op = {.x = xs, .n = cnt, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&w->gate[e], &w->up[e]},
                            .y = {g}, .tmp_y = u};
        backend_linear(be, &op);
        backend_matmul(be, g, &w->down[e], NULL, cnt, ys);
    }
    const int32_t *slot = s->slot;
    if (w->world > 1) {
        for (int i = 0; i < n * K; i++) s->lslot[i] = s->idx[i] >= w->e0 && s->idx[i] < w->e1 ? s->slot[i] : -1;
        slot = s->lslot;
    }
    backend_moe_combine(be, acc, s->ys, d, n, K, slot, s->w);
}

/* The routed experts' weighted outputs added to acc: on the device when the backend took the
 * layer, else routed on the host. */
static void routed(backend *be, const model_config *c, const moe_layer_w *w, const void *h, int n, void *acc,
                   moe_scratch *s) {
    if (w->dev) backend_moe_forward(be, w->dev, s->lg, h, n, acc, s->ws);
    else routed_host(be, c, w, h, n, acc, s);
}

void moe_forward(backend *be, const model_config *c, const moe_layer_w *w, const void *h, int n, void *x,
                 struct comm *cm, moe_scratch **sp) {
    if (n <= 0) return;
    if (!*sp) *sp = xcalloc(1, sizeof **sp);
    moe_scratch *s = *sp;
    scratch_grow(be, c, w, s, n);
    const int d = c->d_model;

    backend_matmul(be, h, &w->router, NULL, n, s->lg);
    if (w->world > 1) {   /* partial sum: this rank's shared-expert slice and experts; all-reduce; add */
        CHECK(cm && comm_world(cm) == w->world);
        const size_t nd = (size_t)n * (size_t)d;
        if (w->sh_gate.data) {
            const blinear sh = {.x = h, .n = n, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&w->sh_gate, &w->sh_up},
                                .y = {s->sg}, .tmp_y = s->su};
            backend_linear(be, &sh);
            backend_matmul(be, s->sg, &w->sh_down, NULL, n, s->tmp);
        } else {
            backend_act_zero(be, s->tmp, nd);
        }
        routed(be, c, w, h, n, s->tmp, s);
        comm_all_reduce_act(cm, s->tmp, nd);
        backend_add(be, x, s->tmp, nd);
        return;
    }

    /* shared expert over every token, then the weighted routed outputs */
    if (w->sh_gate.data) {
        const blinear sh = {.x = h, .n = n, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&w->sh_gate, &w->sh_up},
                            .y = {s->sg}, .tmp_y = s->su};
        backend_linear(be, &sh);
        const blinear dn = {.x = s->sg, .n = n, .epi = BLIN_ADD, .n_w = 1, .w = {&w->sh_down}, .y = {x},
                            .tmp_y = s->tmp};
        backend_linear(be, &dn);
    }
    routed(be, c, w, h, n, x, s);
}
