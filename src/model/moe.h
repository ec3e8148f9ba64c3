/*
 * moe.h — the mixture-of-experts sublayer of LLaDA-MoE and LLaDA2 (model/moe.c), used by the
 * transformer forward in model/llada.c; not used by other layers.
 *
 * A MoE layer replaces the dense SwiGLU MLP: a router picks moe_top_k of n_experts experts per token
 * (cfg.router: LLaDA-MoE's softmax, LLaDA2's grouped sigmoid), the tokens are grouped by expert so
 * each expert runs one gate/up + down GEMM over all its tokens, and each token's k weighted expert
 * outputs (plus the shared expert) are added to the residual stream. docs/model-spec.md §2c.
 * Binding and upload: load time, any thread. Forward: the engine thread owning the ctx.
 */
#ifndef UM_MOE_H
#define UM_MOE_H

#include "backend/backend.h"
#include "model/llada_weights.h"
#include "model/model_types.h"

/* Tensor names of one architecture's MoE layers: printf patterns, %d = layer (then expert). */
typedef struct moe_names {
    const char *router;       /* "model.layers.%d.mlp.gate.weight" */
    const char *expert_bias;  /* per layer */
    const char *gate, *up, *down;            /* "...experts.%d.gate_proj.weight" (layer, expert) */
    const char *sh_gate, *sh_up, *sh_down;   /* shared expert */
} moe_names;

/* Find and shape-check layer l's MoE tensors (cfg sizes); L->moe is allocated. -1 + err naming
 * the tensor. */
int  moe_tensors_bind(model *m, int l, const moe_names *nm, llada_layer_tensors *L, um_err *err);
void moe_tensors_free(llada_layer_tensors *L);

/* A MoE layer's weights on the backend (opaque; moe.c). */
typedef struct moe_layer_w moe_layer_w;
struct llada_loader;
/* Upload layer tensors t to the loader's ctx (and keep a host f32 copy of the expert bias); the
 * experts and the shared expert are matrices (quantized when the model asks), the router is not. The
 * ctx's shard (world 1: everything) = rank r of W (expert + tensor parallel, docs/parallel.md
 * "Mixture of experts"): the router and bias whole, only the experts [E*r/W, E*(r+1)/W), and a 1/W
 * slice of the shared expert's width (rows of its gate/up, the matching columns of its down;
 * shared_ffn % W == 0). NULL + err on failure. */
moe_layer_w *moe_layer_upload(struct llada_loader *ld, const moe_layer_tensors *t, um_err *err);
void         moe_layer_free(backend *be, const model_config *c, moe_layer_w *w);

/* 1 when the layer's routed experts run on the backend's device dispatch (BACKEND_CAP_MOE): its
 * forward never synchronises the host. 0: routed on the host (a copy of the router logits per
 * forward). */
int          moe_layer_on_device(const moe_layer_w *w);

/* Workspace of the MoE sublayer (grown on demand, per ctx). */
typedef struct moe_scratch moe_scratch;
void moe_scratch_free(backend *be, moe_scratch *s);

/* x[n, d] += MoE(h) where h[n, d] = RMSNorm(x) (already computed by the caller): the router
 * logits, the shared expert, then the routed experts — on the device (moe_layer_on_device: routing,
 * grouping, expert GEMMs and the weighted combine without the host) or routed on the host (one
 * gather of the routed rows, per expert one SwiGLU GEMM pair over its tokens, one weighted combine
 * into x). *sp is created on first use.
 * A sharded layer (moe_layer_upload with world > 1; cm = the rank's comm) routes every token (the
 * same on every rank), runs its own experts over all their tokens and its slice of the shared
 * expert into a partial sum, all-reduces it over cm and adds it to x: every rank ends with the
 * same x. */
void moe_forward(backend *be, const model_config *c, const moe_layer_w *w, const void *h, int n, void *x,
                 struct comm *cm, moe_scratch **sp);

/* The routing of one token (exposed for unit tests): logits[n_experts] -> idx[top_k] (best first)
 * and weights[top_k], per cfg.router (docs/model-spec.md §2c). bias may be NULL. */
void moe_route(const model_config *c, const float *logits, const float *bias, int32_t *idx, float *weights);

#endif /* UM_MOE_H */
