/*
 * llada.c — the dense bidirectional transformers: LLaDA (LLaDAModelLM, block_type "llama") and
 * Dream (DreamModel, the Qwen2 layout: q/k/v biases, GQA): tensor names/shapes and the forward pass
 * written against backend ops (docs/model-spec.md). The forward returns raw output rows for both:
 * Dream's logit shift (row i predicts token i+1) is the decode layer's (decode/decode.c).
 * Binding runs at load time (any thread); the forward runs on the engine thread owning the ctx.
 */
#include "model/llada.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/comm.h"
#include "model/gguf_model.h"
#include "model/llada_weights.h"
#include "model/model_kv.h"
#include "model/moe.h"
#include "util/log.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- tensor binding */


/* Tensor names of one architecture: top-level names and per-layer printf patterns (%d = layer). */
typedef struct dense_names {
    const char *wte, *ln_f, *lm_head;
    const char *attn_norm, *q, *k, *v, *attn_out, *ff_norm, *gate, *up, *down;
    const char *q_bias, *k_bias, *v_bias;   /* NULL: no biases */
    const char *qkv;                        /* fused query_key_value (then q, k, v are NULL) */
    const char *q_norm, *k_norm;            /* per-head QK-norm weights (when cfg.qk_norm) */
    const moe_names *moe;                   /* MoE layers' names, NULL for dense architectures */
} dense_names;

static const dense_names k_llada_names = {
    "model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight",
    "model.transformer.blocks.%d.attn_norm.weight", "model.transformer.blocks.%d.q_proj.weight",
    "model.transformer.blocks.%d.k_proj.weight", "model.transformer.blocks.%d.v_proj.weight",
    "model.transformer.blocks.%d.attn_out.weight", "model.transformer.blocks.%d.ff_norm.weight",
    "model.transformer.blocks.%d.ff_proj.weight", "model.transformer.blocks.%d.up_proj.weight",
    "model.transformer.blocks.%d.ff_out.weight", NULL, NULL, NULL,
};

/* Dream = Qwen2 (modeling_dream.py): q/k/v with bias, o_proj without. */
static const dense_names k_dream_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight", "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", "model.layers.%d.self_attn.q_proj.bias",
    "model.layers.%d.self_attn.k_proj.bias", "model.layers.%d.self_attn.v_proj.bias",
    NULL, NULL, NULL, NULL,
};

/* LLaDA-MoE (modeling_lladamoe.py, OLMoE names): the expert bias is a buffer of the MoE block, the
 * shared expert sits beside it in the decoder layer. */
static const moe_names k_llada_moe_moe_names = {
    "model.layers.%d.mlp.gate.weight", "model.layers.%d.mlp.expert_bias",
    "model.layers.%d.mlp.experts.%d.gate_proj.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight",
    "model.layers.%d.mlp.experts.%d.down_proj.weight", "model.layers.%d.shared_expert.gate_proj.weight",
    "model.layers.%d.shared_expert.up_proj.weight", "model.layers.%d.shared_expert.down_proj.weight",
};

static const dense_names k_llada_moe_names = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight", "model.layers.%d.self_attn.q_proj.weight",
    "model.layers.%d.self_attn.k_proj.weight", "model.layers.%d.self_attn.v_proj.weight",
    "model.layers.%d.self_attn.o_proj.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", NULL, NULL, NULL, NULL,
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight", &k_llada_moe_moe_names,
};

/* LLaDA2 (modeling_llada2_moe.py, BailingMoeV2 names): fused query_key_value, the expert bias is a
 * buffer of the gate, shared experts inside the MoE block. */
static const moe_names k_llada2_moe_names = {
    "model.layers.%d.mlp.gate.weight", "model.layers.%d.mlp.gate.expert_bias",
    "model.layers.%d.mlp.experts.%d.gate_proj.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight",
    "model.layers.%d.mlp.experts.%d.down_proj.weight", "model.layers.%d.mlp.shared_experts.gate_proj.weight",
    "model.layers.%d.mlp.shared_experts.up_proj.weight", "model.layers.%d.mlp.shared_experts.down_proj.weight",
};

static const dense_names k_llada2_names = {
    "model.word_embeddings.weight", "model.norm.weight", "lm_head.weight",
    "model.layers.%d.input_layernorm.weight", NULL, NULL, NULL,
    "model.layers.%d.attention.dense.weight", "model.layers.%d.post_attention_layernorm.weight",
    "model.layers.%d.mlp.gate_proj.weight", "model.layers.%d.mlp.up_proj.weight",
    "model.layers.%d.mlp.down_proj.weight", NULL, NULL, NULL,
    "model.layers.%d.attention.query_key_value.weight", "model.layers.%d.attention.query_layernorm.weight",
    "model.layers.%d.attention.key_layernorm.weight", &k_llada2_moe_names,
};

static const dense_names *names_of(enum model_arch a) {
    switch (a) {
    case MODEL_ARCH_DREAM: return &k_dream_names;
    case MODEL_ARCH_LLADA_MOE: return &k_llada_moe_names;
    case MODEL_ARCH_LLADA2: return &k_llada2_names;
    default: return &k_llada_names;
    }
}

/* 1 when layer l is a MoE layer */
static int layer_is_moe(const model_config *c, int l) { return c->n_experts > 0 && l >= c->first_dense; }

int llada_tensors_bind(model *m, um_err *err) {
    const model_config *c = &m->cfg;
    const dense_names *nm = names_of(c->arch);
    llada_tensors *w = &m->llada;
    int64_t d = c->d_model, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t V = c->n_embd_rows, F = c->ffn_hidden;
    if (!(w->wte = llada_bind_one(m, nm->wte, V, d, err))) return -1;
    if (!(w->ln_f = llada_bind_one(m, nm->ln_f, d, -1, err))) return -1;
    if (c->weight_tying)
        w->lm_head = w->wte;
    else if (!(w->lm_head = llada_bind_one(m, nm->lm_head, V, d, err)))
        return -1;
    w->layers = xcalloc((size_t)c->n_layers, sizeof *w->layers);
    char name[256];
#define BIND(field, pattern, a, b)                                 \
    do {                                                           \
        snprintf(name, sizeof name, pattern, l);                   \
        if (!(L->field = llada_bind_one(m, name, a, b, err))) return -1; \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        llada_layer_tensors *L = &w->layers[l];
        BIND(attn_norm, nm->attn_norm, d, -1);
        if (c->fused_qkv) {
            BIND(qkv, nm->qkv, qd + 2 * kvd, d);
        } else {
            BIND(q_proj, nm->q, qd, d);
            BIND(k_proj, nm->k, kvd, d);
            BIND(v_proj, nm->v, kvd, d);
        }
        if (c->qk_norm) {
            BIND(q_norm, nm->q_norm, c->head_dim, -1);
            BIND(k_norm, nm->k_norm, c->head_dim, -1);
        }
        BIND(attn_out, nm->attn_out, d, qd);
        BIND(ff_norm, nm->ff_norm, d, -1);
        if (layer_is_moe(c, l)) {
            if (moe_tensors_bind(m, l, nm->moe, L, err) != 0) return -1;
        } else {
            BIND(ff_proj, nm->gate, F, d);
            BIND(up_proj, nm->up, F, d);
            BIND(ff_out, nm->down, d, F);
        }
        if (nm->q_bias) {
            BIND(q_bias, nm->q_bias, qd, -1);
            BIND(k_bias, nm->k_bias, kvd, -1);
            BIND(v_bias, nm->v_bias, kvd, -1);
        }
    }
#undef BIND
    return 0;
}

void llada_tensors_free(model *m) {
    for (int l = 0; m->llada.layers && l < m->cfg.n_layers; l++) moe_tensors_free(&m->llada.layers[l]);
    free(m->llada.layers);
    memset(&m->llada, 0, sizeof m->llada);
}

/* ---------------------------------------------------------------- forward */

/* The weights of one layer on the backend. */
typedef struct llada_layer_w {
    bweight attn_norm;   /* [1, d] */
    bweight q, k, v;     /* [n_heads*hd, d], [n_kv*hd, d], [n_kv*hd, d]; data NULL when packed */
    bweight qkv;         /* [(n_heads + 2 n_kv)*hd, d]: q | k | v as one weight (BACKEND_PACK_QKV),
                            or data NULL */
    bweight qb, kb, vb;  /* biases [1, n_heads*hd], [1, n_kv*hd], [1, n_kv*hd] (Dream); data NULL
                            when the model has none */
    bweight qn, kn;      /* [1, hd] per-head QK-norm weights; data NULL without QK-norm */
    bweight attn_out;    /* [d, n_heads*hd] */
    bweight ff_norm;     /* [1, d] */
    bweight gate, up;    /* [ffn, d] (ff_proj, up_proj); data NULL in a MoE layer; views of gate_up
                            when joined */
    bweight gate_up;     /* [2 ffn, d]: gate | up as one weight (BACKEND_PACK_GATE_UP), or data NULL */
    bweight down;        /* [d, ffn] (ff_out) */
    moe_layer_w *moe;    /* a MoE layer's router and experts, or NULL */
} llada_layer_w;

typedef struct llada_weights {
    bweight        wte;      /* [n_embd_rows, d] */
    bweight        ln_f;     /* [1, d] */
    bweight        lm_head;  /* [n_embd_rows, d]; a second view of wte when weight_tying */
    llada_layer_w *layers;   /* [n_layers] */
    llada_host_parts parts;  /* host copies a backend may keep views of (column slices for tensor
                                parallelism, FP8 weights dequantized on the host) */
} llada_weights;

/* Tensor parallel (ctx->shard, model.h): every rank holds whole heads of q/k/v and a slice of the
 * MLP width (column-parallel: rows of q_proj/k_proj/v_proj/ff_proj/up_proj, or of each part of a
 * fused query_key_value), the matching input columns of attn_out and ff_out (row-parallel), and
 * full copies of the embedding, norms and LM head. Each rank's attn_out / ff_out product is a
 * partial sum: one all-reduce after each. A MoE layer is expert parallel instead (moe.c: a range
 * of the experts and a slice of the shared expert per rank, one all-reduce). */
enum shard_split { SPLIT_NONE, SPLIT_ROWS, SPLIT_COLS };

/* Workspace, grown on demand and reused across forwards (the decode loop calls every step).
 * Activation buffers live on the backend; index arrays on the host. */
typedef struct llada_scratch {
    int      cap_tok;      /* rows the token-sized buffers hold */
    int      cap_out;      /* rows the output-sized buffers hold */
    void    *x;            /* [cap_tok, d] residual stream */
    void    *h;            /* [cap_tok, d] normed input / sublayer output */
    void    *q;            /* [cap_tok, n_heads*hd] */
    void    *k, *v;        /* [cap_tok, n_kv*hd] */
    void    *att;          /* [cap_tok, n_heads*hd] attention output */
    void    *gate;         /* [cap_tok, ffn] */
    void    *up;           /* [cap_tok, ffn], or [cap_tok, 2 ffn] when gate|up are joined (their product) */
    void    *qkv;          /* [cap_tok, (n_heads + 2 n_kv)*hd] a packed q|k|v product (llada_layer_w.qkv):
                              up when its rows are that wide (free until the MLP), else qkv_own */
    void    *qkv_own;      /* owned, or NULL */
    void    *xo;           /* [cap_out, d] gathered output rows (one LM-head chunk) */
    void    *lg;           /* [cap_out, n_embd_rows] logits of one chunk on the backend */
    int32_t *pos;          /* [cap_tok] host: default positions */
    int32_t *rows;         /* [cap_tok] host: default out rows (0..n-1) */
    /* KV caches (fwd_batch.kv), host, grown on demand */
    int      cap_seq;      /* sequences the arrays below hold */
    int32_t *kstart;       /* [cap_seq+1] key numbering: a cached sequence counts its slot's rows */
    void   **kseq, **vseq; /* [cap_seq] this layer's slot K / V of each sequence, NULL = none */
    int      cap_kpos;
    int32_t *kpos;         /* [cap_kpos] key positions (block-causal masks) */
    int32_t *qblk;         /* [cap_tok] block index of each query row (per-sequence block sizes) */
    int      cap_kblk;
    int32_t *kblk;         /* [cap_kblk] block index of each key */
    moe_scratch *moe;      /* MoE sublayer workspace (moe.c), NULL until a MoE layer runs */
} llada_scratch;

/* ---------------------------------------------------------------- upload */

static int upload(llada_loader *ld, const st_tensor *t, enum llada_wkind kind, bweight *w, um_err *err) {
    const int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    return llada_upload(ld, t, t->data, 0, 0, rows, cols, t->n_elems, kind, w, err);
}

/* Upload t, or this rank's slice of it: SPLIT_ROWS rows [r*R/W, (r+1)*R/W) (a view of the
 * checkpoint), SPLIT_COLS columns [r*C/W, (r+1)*C/W) (gathered into a host copy, kept in w->parts
 * while the backend reads it). A quantized tensor's columns split on block boundaries only. */
static int upload_part(llada_loader *ld, llada_weights *w, const st_tensor *t, enum shard_split split,
                       enum llada_wkind kind, bweight *out, um_err *err) {
    const model_ctx *ctx = ld->ctx;
    const int W = ctx->shard.world, r = ctx->shard.rank;
    if (split == SPLIT_NONE || W <= 1) return upload(ld, t, kind, out, err);
    if (t->ndim == 1) {   /* a bias of row-split outputs: the same element range as the rows */
        CHECK(split == SPLIT_ROWS && !dtype_is_quant(t->type));   /* vectors are never quantized */
        const int64_t ln = t->shape[0] / W;
        return llada_upload(ld, t, (const char *)t->data + (uint64_t)dtype_row_bytes(t->type, r * ln), 0, r * ln, 1, ln, ln,
                            kind, out, err);
    }
    CHECK(t->ndim == 2);
    const int64_t rows = t->shape[0], cols = t->shape[1];
    const size_t rb = dtype_row_bytes(t->type, cols);
    if (split == SPLIT_ROWS) {
        const int64_t lr = rows / W;
        return llada_upload(ld, t, (const char *)t->data + (size_t)(r * lr) * rb, r * lr, 0, lr, cols, lr * cols, kind, out,
                            err);
    }
    const int64_t lc = cols / W;
    char label[160];
    if (dtype_is_quant(t->type) && lc % DTYPE_QBLOCK != 0)
        return um_err_param(err, "tp",
                            "--tp %d: tensor '%s' is %s and its %lld columns would split into %lld per rank, not whole "
                            "blocks of %d; use a --tp that divides %lld blocks, or an unquantized checkpoint",
                            W, model_tensor_label(ctx->m, t->name, label, sizeof label), dtype_name(t->type),
                            (long long)cols, (long long)lc, DTYPE_QBLOCK, (long long)(cols / DTYPE_QBLOCK));
    const size_t lb = dtype_row_bytes(t->type, lc), off = dtype_row_bytes(t->type, r * lc);
    char *buf = xmalloc((size_t)rows * lb);
    for (int64_t i = 0; i < rows; i++) memcpy(buf + (size_t)i * lb, (const char *)t->data + (size_t)i * rb + off, lb);
    if (llada_upload(ld, t, buf, 0, r * lc, rows, lc, rows * lc, kind, out, err) != 0) {
        free(buf);
        return -1;
    }
    checkpoint_release(&ctx->m->ck, t->data, (size_t)rows * rb);   /* every row was read for the slice */
    if (!backend_weight_keeps_source(ctx->be, out)) {
        free(buf);
        return 0;
    }
    llada_host_parts_add(&w->parts, buf);
    return 0;
}

/* Layer L's q, k and v weights (with tensor parallelism this rank's heads of each): one weight of
 * rows q | k | v where the backend packs them (BACKEND_PACK_QKV: a layer without biases or QK-norm,
 * float weights), else three — from q_proj / k_proj / v_proj, or row ranges (views) of a fused
 * query_key_value. */
static int upload_qkv(llada_loader *ld, llada_weights *w, const llada_layer_tensors *L, llada_layer_w *W,
                      um_err *err) {
    const model_ctx *ctx = ld->ctx;
    const model_config *c = &ctx->m->cfg;
    const int64_t TW = ctx->shard.world > 1 ? ctx->shard.world : 1, r = TW > 1 ? ctx->shard.rank : 0;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t lq = qd / TW, lkv = kvd / TW;
    const st_tensor *t[3];
    const void *data[3];
    const int64_t rows[3] = {lq, lkv, lkv};
    int64_t row0[3];
    if (L->qkv) {   /* fused query_key_value: q | k | v */
        t[0] = t[1] = t[2] = L->qkv;
        row0[0] = r * lq, row0[1] = qd + r * lkv, row0[2] = qd + kvd + r * lkv;
    } else {
        t[0] = L->q_proj, t[1] = L->k_proj, t[2] = L->v_proj;
        row0[0] = r * lq, row0[1] = row0[2] = r * lkv;
    }
    const int64_t cols = t[0]->shape[1];
    for (int j = 0; j < 3; j++) data[j] = (const char *)t[j]->data + (size_t)row0[j] * dtype_row_bytes(t[j]->type, cols);
    if ((backend_packs(ctx->be) & BACKEND_PACK_QKV) && !L->q_bias && !L->q_norm && t[1]->shape[1] == cols &&
        t[2]->shape[1] == cols) {
        char name[200];
        snprintf(name, sizeof name, "%s (q|k|v)", t[0]->name);
        const int rc = llada_upload_rows_concat(ld, t, data, rows, 3, cols, LLADA_W_MATRIX, name, &W->qkv, err);
        if (rc <= 0) return rc;   /* 1: not float weights of one dtype, three weights below */
    }
    if (L->qkv) {
        bweight *out[3] = {&W->q, &W->k, &W->v};
        for (int j = 0; j < 3; j++)
            if (llada_upload(ld, L->qkv, data[j], row0[j], 0, rows[j], cols, rows[j] * cols, LLADA_W_MATRIX, out[j], err))
                return -1;
        return 0;
    }
    return upload_part(ld, w, L->q_proj, SPLIT_ROWS, LLADA_W_MATRIX, &W->q, err) ||
                   upload_part(ld, w, L->k_proj, SPLIT_ROWS, LLADA_W_MATRIX, &W->k, err) ||
                   upload_part(ld, w, L->v_proj, SPLIT_ROWS, LLADA_W_MATRIX, &W->v, err)
               ? -1
               : 0;
}

/* Layer L's gate and up weights (this rank's rows of each): one weight of rows gate | up, with gate
 * and up views of its halves, where the backend packs them (BACKEND_PACK_GATE_UP; float weights that
 * stay as they are — a quantized pair keeps two weights), else two. */
static int upload_gate_up(llada_loader *ld, llada_weights *w, const llada_layer_tensors *L, llada_layer_w *W,
                          um_err *err) {
    const model_ctx *ctx = ld->ctx;
    const int64_t TW = ctx->shard.world > 1 ? ctx->shard.world : 1, r = TW > 1 ? ctx->shard.rank : 0;
    const st_tensor *t[2] = {L->ff_proj, L->up_proj};
    const int64_t cols = t[0]->shape[1], lr = t[0]->shape[0] / TW;
    if ((backend_packs(ctx->be) & BACKEND_PACK_GATE_UP) && !model_quant_converts(ld->quant) &&
        t[1]->shape[0] == t[0]->shape[0] && t[1]->shape[1] == cols) {
        const void *data[2];
        const int64_t rows[2] = {lr, lr};
        for (int j = 0; j < 2; j++) data[j] = (const char *)t[j]->data + (size_t)(r * lr) * dtype_row_bytes(t[j]->type, cols);
        char name[200];
        snprintf(name, sizeof name, "%s (gate|up)", t[0]->name);
        const int rc = llada_upload_rows_concat(ld, t, data, rows, 2, cols, LLADA_W_MATRIX, name, &W->gate_up, err);
        if (rc < 0) return -1;
        if (rc == 0) {   /* views of the two halves (not owned) */
            W->gate = W->up = W->gate_up;
            W->gate.owned = W->up.owned = NULL;
            W->gate.rows = W->up.rows = lr;
            W->up.data = (const char *)W->gate_up.data + (size_t)lr * dtype_row_bytes(W->gate_up.type, cols);
            CHECK(!W->gate_up.scale);   /* not quantized: no scales to split */
            return 0;
        }
    }
    return upload_part(ld, w, L->ff_proj, SPLIT_ROWS, LLADA_W_MATRIX, &W->gate, err) ||
                   upload_part(ld, w, L->up_proj, SPLIT_ROWS, LLADA_W_MATRIX, &W->up, err)
               ? -1
               : 0;
}

/* Source bytes of the matrices this ctx quantizes (the progress line's total). */
static uint64_t quantized_bytes(const model_ctx *ctx) {
    const model_config *c = &ctx->m->cfg;
    const llada_tensors *t = &ctx->m->llada;
    const uint64_t W = ctx->shard.world > 1 ? (uint64_t)ctx->shard.world : 1;
    uint64_t n = t->lm_head->nbytes;
    for (int l = 0; l < c->n_layers; l++) {
        const llada_layer_tensors *L = &t->layers[l];
        const st_tensor *split[] = {L->qkv, L->q_proj, L->k_proj, L->v_proj, L->attn_out, L->ff_proj, L->up_proj, L->ff_out};
        for (size_t i = 0; i < sizeof split / sizeof split[0]; i++) n += split[i] ? split[i]->nbytes / W : 0;
        if (L->moe) {
            const moe_layer_tensors *M = L->moe;
            for (int e = 0; e < c->n_experts; e++) n += (M->gate[e]->nbytes + M->up[e]->nbytes + M->down[e]->nbytes) / W;
            if (M->sh_gate) n += (M->sh_gate->nbytes + M->sh_up->nbytes + M->sh_down->nbytes) / W;
        }
    }
    return n;
}

int llada_ctx_init(model_ctx *ctx, um_err *err) {
    const model *m = ctx->m;
    const model_config *c = &m->cfg;
    llada_weights *w = xcalloc(1, sizeof *w);
    w->layers = xcalloc((size_t)c->n_layers, sizeof *w->layers);
    ctx->weights = w;
    ctx->scratch = xcalloc(1, sizeof(llada_scratch));
    llada_loader ld = {.ctx = ctx, .parts = &w->parts, .quant = m->quant, .t0_ns = time_now_ns()};
    if (model_quant_converts(ld.quant)) ld.total = quantized_bytes(ctx);
    const llada_tensors *t = &m->llada;
    /* the embedding stays a view: only the rows of tokens seen become resident (docs/cpu-kernels.md) */
    if (upload(&ld, t->wte, LLADA_W_GATHER, &w->wte, err) || upload(&ld, t->ln_f, LLADA_W_PLAIN, &w->ln_f, err) ||
        upload(&ld, t->lm_head, LLADA_W_MATRIX, &w->lm_head, err))
        goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        const llada_layer_tensors *L = &t->layers[l];
        llada_layer_w *W = &w->layers[l];
        if (upload(&ld, L->attn_norm, LLADA_W_PLAIN, &W->attn_norm, err) ||
            upload_part(&ld, w, L->attn_out, SPLIT_COLS, LLADA_W_MATRIX, &W->attn_out, err) ||
            upload(&ld, L->ff_norm, LLADA_W_PLAIN, &W->ff_norm, err))
            goto fail;
        if (upload_qkv(&ld, w, L, W, err)) goto fail;
        if (W->qkv.data) ctx->packed |= BACKEND_PACK_QKV;
        if (L->q_norm && (upload(&ld, L->q_norm, LLADA_W_PLAIN, &W->qn, err) ||
                          upload(&ld, L->k_norm, LLADA_W_PLAIN, &W->kn, err)))
            goto fail;
        if (L->moe) {
            if (!(W->moe = moe_layer_upload(&ld, L->moe, err))) goto fail;
            if (!moe_layer_on_device(W->moe)) ctx->host_sync = 1;
        } else if (upload_gate_up(&ld, w, L, W, err) ||
                   upload_part(&ld, w, L->ff_out, SPLIT_COLS, LLADA_W_MATRIX, &W->down, err)) {
            goto fail;
        }
        if (W->gate_up.data) ctx->packed |= BACKEND_PACK_GATE_UP;
        if (L->q_bias && (upload_part(&ld, w, L->q_bias, SPLIT_ROWS, LLADA_W_PLAIN, &W->qb, err) ||
                          upload_part(&ld, w, L->k_bias, SPLIT_ROWS, LLADA_W_PLAIN, &W->kb, err) ||
                          upload_part(&ld, w, L->v_bias, SPLIT_ROWS, LLADA_W_PLAIN, &W->vb, err)))
            goto fail;
    }
    llada_loader_report(&ld);
    if (model_quant_converts(ld.quant) && ctx->shard.rank == 0)
        log_info("%s: weights quantized to %s in %.1f s: %.2f GiB read, %.2f GiB kept", m->dir,
                 model_quant_name(ld.quant), (double)(time_now_ns() - ld.t0_ns) * 1e-9, (double)ld.done / (1u << 30),
                 (double)ld.qbytes / (1u << 30));
    return 0;
fail:
    um_err_prefix(err, "%s", m->dir);
    llada_ctx_free(ctx);
    return -1;
}

static void scratch_release(backend *be, llada_scratch *s) {
    void **bufs[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->gate, &s->up, &s->qkv_own, &s->xo, &s->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i]) backend_act_free(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    s->qkv = NULL;
    free(s->pos);
    free(s->rows);
    free(s->kstart);
    free(s->kseq);
    free(s->vseq);
    free(s->kpos);
    free(s->qblk);
    free(s->kblk);
    moe_scratch_free(be, s->moe);
    s->moe = NULL;
    s->qblk = s->kblk = NULL;
    s->cap_kblk = 0;
    s->pos = s->rows = s->kstart = s->kpos = NULL;
    s->kseq = s->vseq = NULL;
    s->cap_tok = s->cap_out = s->cap_seq = s->cap_kpos = 0;
}

void llada_ctx_free(model_ctx *ctx) {
    backend *be = ctx->be;
    llada_weights *w = ctx->weights;
    if (w) {
        bweight *top[] = {&w->wte, &w->ln_f, &w->lm_head};
        for (int i = 0; i < 3; i++)
            if (top[i]->data) backend_weight_free(be, top[i]);
        for (int l = 0; w->layers && l < ctx->m->cfg.n_layers; l++) {
            llada_layer_w *W = &w->layers[l];
            bweight *all[] = {&W->attn_norm, &W->q,    &W->k,  &W->v,  &W->qkv, &W->attn_out, &W->ff_norm, &W->gate,
                              &W->up,        &W->down, &W->qb, &W->kb, &W->vb,  &W->qn,       &W->kn,      &W->gate_up};
            moe_layer_free(be, &ctx->m->cfg, W->moe);
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                if (all[i]->data) backend_weight_free(be, all[i]);
        }
        free(w->layers);
        llada_host_parts_free(&w->parts);
        free(w);
    }
    if (ctx->scratch) {
        scratch_release(be, ctx->scratch);
        free(ctx->scratch);
    }
    ctx->weights = NULL;
    ctx->scratch = NULL;
}

/* Output rows per LM-head pass: the backend logits buffer holds at most ~16M floats. */
static int lm_chunk_rows(const model_config *c) {
    int r = (int)((16u << 20) / (unsigned)c->n_embd_rows);
    return r < 16 ? 16 : r;
}

/* world: tensor-parallel ranks (the head / MLP buffers hold this rank's slice); packed: the
 * BACKEND_PACK_* the layers' weights were joined for (q|k|v: s->qkv; gate|up: s->up twice as wide,
 * the joined product) */
static void scratch_reserve(backend *be, const model_config *c, int world, unsigned packed, llada_scratch *s, int n_tok,
                            int n_out) {
    size_t d = (size_t)c->d_model, qd = (size_t)(c->n_heads / world) * (size_t)c->head_dim;
    size_t kvd = (size_t)(c->n_kv_heads / world) * (size_t)c->head_dim, F = (size_t)(c->ffn_hidden / world);
    if (F == 0) F = 1;   /* a MoE model without dense layers */
    const size_t up = packed & BACKEND_PACK_GATE_UP ? 2 * F : F;
    const int pqkv = (packed & BACKEND_PACK_QKV) != 0;
    const size_t own = pqkv && up < qd + 2 * kvd ? qd + 2 * kvd : 0;   /* s->qkv's own width, 0: in s->up */
    if (n_tok > s->cap_tok) {
        int cap = n_tok;
        void **bufs[] = {&s->x, &s->h, &s->q, &s->k, &s->v, &s->att, &s->gate, &s->up, &s->qkv_own};
        size_t width[] = {d, d, qd, kvd, kvd, qd, F, up, own};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
            if (*bufs[i]) backend_act_free(be, *bufs[i]);
            *bufs[i] = width[i] ? backend_act_alloc(be, (size_t)cap * width[i]) : NULL;
        }
        s->qkv = !pqkv ? NULL : own ? s->qkv_own : s->up;
        free(s->pos);
        free(s->rows);
        free(s->qblk);
        s->pos = xmalloc((size_t)cap * sizeof *s->pos);
        s->rows = xmalloc((size_t)cap * sizeof *s->rows);
        s->qblk = xmalloc((size_t)cap * sizeof *s->qblk);
        s->cap_tok = cap;
    }
    if (n_out > s->cap_out) {
        int cap = n_out;
        if (s->xo) backend_act_free(be, s->xo);
        if (s->lg) backend_act_free(be, s->lg);
        s->xo = backend_act_alloc(be, (size_t)cap * d);
        s->lg = backend_act_alloc(be, (size_t)cap * (size_t)c->n_embd_rows);
        s->cap_out = cap;
    }
}

/* Keys of a sequence with a KV slot: the slot's rows [0, n) — with block-causal attention (block
 * size B > 0) only up to the end of the last block its rows are in, as no row may see later keys:
 * those slot rows may not be written yet (a chunked prefill, the blocks after the active one), and
 * are neither read nor scored. */
static int kv_key_rows(const model_ctx *ctx, const fwd_batch *b, const int32_t *pos, int q, int B) {
    const int rows = model_kv_rows(ctx, b->kv[q]);
    if (B <= 0) return rows;
    int last = 0;
    for (int i = b->seq_start[q]; i < b->seq_start[q + 1]; i++) last = pos[i] > last ? pos[i] : last;
    const long long end = ((long long)last / B + 1) * B;
    return end < rows ? (int)end : rows;
}

/* KV caches of batch b (fwd_batch.kv): key numbering and (block-causal) key positions in ap, where
 * a sequence with a slot has the slot's rows as keys (kv_key_rows). 0 when no sequence has a slot. */
static int kv_attn_setup(model_ctx *ctx, const fwd_batch *b, const int32_t *pos, llada_scratch *s, attn_params *ap) {
    int any = 0;
    for (int q = 0; b->kv && q < b->n_seqs; q++) any |= b->kv[q] != 0;
    if (!any) return 0;
    if (b->n_seqs > s->cap_seq) {
        s->cap_seq = b->n_seqs;
        s->kstart = xrealloc(s->kstart, (size_t)(s->cap_seq + 1) * sizeof *s->kstart);
        s->kseq = xrealloc(s->kseq, (size_t)s->cap_seq * sizeof *s->kseq);
        s->vseq = xrealloc(s->vseq, (size_t)s->cap_seq * sizeof *s->vseq);
    }
    s->kstart[0] = 0;
    const model_config *c = &ctx->m->cfg;
    for (int q = 0; q < b->n_seqs; q++) {
        const int B = !ap->block_causal ? 0 : b->block_len ? b->block_len[q] : c->block_causal;
        s->kstart[q + 1] = s->kstart[q] + (b->kv[q] ? kv_key_rows(ctx, b, pos, q, B) : b->seq_start[q + 1] - b->seq_start[q]);
    }
    ap->k_start = s->kstart;
    ap->k_seq = (const void *const *)s->kseq;
    ap->v_seq = (const void *const *)s->vseq;
    if (ap->block_causal) {
        const int nk = s->kstart[b->n_seqs];
        if (nk > s->cap_kpos) {
            s->cap_kpos = nk;
            s->kpos = xrealloc(s->kpos, (size_t)nk * sizeof *s->kpos);
        }
        for (int q = 0; q < b->n_seqs; q++)
            for (int j = s->kstart[q]; j < s->kstart[q + 1]; j++)
                s->kpos[j] = b->kv[q] ? j - s->kstart[q] : pos[b->seq_start[q] + j - s->kstart[q]];
        ap->k_pos = s->kpos;
    }
    return 1;
}

/* Point kseq / vseq (kv_attn_setup's arrays) at layer l's slot of every sequence with one, NULL
 * for the others: where the fresh keys / values are stored. */
static void kv_layer_slots(model_ctx *ctx, const fwd_batch *b, llada_scratch *s, int l) {
    for (int q = 0; q < b->n_seqs; q++) {
        s->kseq[q] = s->vseq[q] = NULL;
        if (b->kv[q]) model_kv_layer(ctx, b->kv[q], l, &s->kseq[q], &s->vseq[q]);
    }
}

/* After the store: a sequence without a slot, whose key numbering no longer matches its packed
 * rows, reads its own rows of the fresh k / v. */
static void kv_layer_fresh(model_ctx *ctx, const fwd_batch *b, llada_scratch *s, int kvd) {
    const size_t row = (size_t)kvd * dtype_size(backend_act_dtype(ctx->be));
    for (int q = 0; q < b->n_seqs; q++)
        if (!b->kv[q]) {
            s->kseq[q] = (char *)s->k + (size_t)b->seq_start[q] * row;
            s->vseq[q] = (char *)s->v + (size_t)b->seq_start[q] * row;
        }
}

/* RoPE on layer l's q and k, then — cached — the write of the fresh keys / values of every sequence
 * with a slot into that slot at the rows' positions, and the attention pointed at each sequence's
 * keys (kv_layer_slots, kv_layer_fresh). The single ops in that order, or one backend_rope_kv on a
 * backend with BACKEND_CAP_FUSED (the same results). packed: q, k, v are first unpacked from the
 * layer's q|k|v product in s->qkv (by the same backend_rope_kv). */
static void rope_kv_layer(model_ctx *ctx, const fwd_batch *b, const int32_t *pos, llada_scratch *s, int l,
                          int cached, int H, int KV, int packed) {
    const model_config *c = &ctx->m->cfg;
    backend *be = ctx->be;
    const int hd = c->head_dim, kvd = KV * hd;
    if (cached) kv_layer_slots(ctx, b, s, l);
    CHECK(!packed || backend_has(be, BACKEND_CAP_FUSED));   /* backend_packs */
    if (backend_has(be, BACKEND_CAP_FUSED)) {
        const brope_kv op = {.q = s->q, .k = s->k, .v = s->v, .qkv = packed ? s->qkv : NULL,
                             .ld_qkv = packed ? (H + 2 * KV) * hd : 0, .n = b->seq_start[b->n_seqs], .n_heads = H,
                             .n_kv_heads = KV, .head_dim = hd, .rot_dim = c->rot_dim, .pos = pos,
                             .theta = c->rope_theta, .n_seqs = b->n_seqs, .seq_start = b->seq_start,
                             .k_dst = cached ? s->kseq : NULL, .v_dst = cached ? s->vseq : NULL};
        backend_rope_kv(be, &op);
    } else {
        const int n = b->seq_start[b->n_seqs];
        backend_rope(be, s->q, n, H, hd, c->rot_dim, pos, c->rope_theta);
        backend_rope(be, s->k, n, KV, hd, c->rot_dim, pos, c->rope_theta);
        if (cached) {
            backend_store_rows(be, s->k, kvd, b->n_seqs, b->seq_start, pos, s->kseq);
            backend_store_rows(be, s->v, kvd, b->n_seqs, b->seq_start, pos, s->vseq);
        }
    }
    if (cached) kv_layer_fresh(ctx, b, s, kvd);
}

/* s->x += in . w^T: one fused op, or — tensor parallel, where each rank's product is a partial
 * sum — the product into s->h, an all-reduce, then the add. With next_norm, on a backend with
 * BACKEND_CAP_FUSED, the add and the next sublayer's RMSNorm are one op that leaves
 * s->h = RMSNorm(s->x, next_norm); returns 1 then, 0 when the caller still has to norm s->x. */
static int residual_linear(model_ctx *ctx, const void *in, const bweight *w, int n, llada_scratch *s,
                           const bweight *next_norm) {
    backend *be = ctx->be;
    const size_t nd = (size_t)n * (size_t)w->rows;
    const int fuse_norm = next_norm && backend_has(be, BACKEND_CAP_FUSED);
    if (ctx->shard.world > 1 || fuse_norm) {
        backend_matmul(be, in, w, NULL, n, s->h);
        if (ctx->shard.world > 1) comm_all_reduce_act(ctx->shard.comm, s->h, nd);
        if (fuse_norm) backend_add_rmsnorm(be, s->x, s->h, next_norm, n, (int)w->rows, ctx->m->cfg.norm_eps, s->h);
        else backend_add(be, s->x, s->h, nd);
        return fuse_norm;
    }
    const blinear op = {.x = in, .n = n, .epi = BLIN_ADD, .n_w = 1, .w = {w}, .y = {s->x}, .tmp_y = s->h};
    backend_linear(be, &op);
    return 0;
}

/* Embedding and every layer: leaves the final residual stream in s->x. out_cap: output rows the
 * LM-head buffers must hold. */
static void forward_layers(model_ctx *ctx, const fwd_batch *b, int out_cap) {
    const model_config *c = &ctx->m->cfg;
    backend *be = ctx->be;
    llada_weights *w = ctx->weights;
    llada_scratch *s = ctx->scratch;
    CHECK(w && s);
    const int n = b->seq_start[b->n_seqs];
    const int TP = ctx->shard.world > 1 ? ctx->shard.world : 1;   /* heads and MLP width per rank */
    const int H = c->n_heads / TP, KV = c->n_kv_heads / TP, hd = c->head_dim;
    scratch_reserve(be, c, TP, ctx->packed, s, n, out_cap);

    const int32_t *pos = b->pos;
    if (!pos) {
        for (int q = 0; q < b->n_seqs; q++)
            for (int i = b->seq_start[q]; i < b->seq_start[q + 1]; i++) s->pos[i] = i - b->seq_start[q];
        pos = s->pos;
    }
    attn_params ap = {
        .n_seqs = b->n_seqs,
        .q_start = b->seq_start,
        .k_start = b->seq_start,
        .q_pos = pos,
        .k_pos = pos,
        .key_valid = b->key_valid,
        .n_heads = H,
        .n_kv_heads = KV,
        .head_dim = hd,
        .scale = 1.0f / sqrtf((float)hd),
    };
    /* block-causal attention: each sequence's block size (fwd_batch.block_len, else the model's);
     * the attention compares block indices (pos / B, 0 for a bidirectional sequence) with B = 1 */
    int any_blk = 0;
    for (int q = 0; q < b->n_seqs; q++) any_blk |= (b->block_len ? b->block_len[q] : c->block_causal) > 0;
    ap.block_causal = any_blk;
    const int cached = kv_attn_setup(ctx, b, pos, s, &ap);
    if (any_blk) {
        for (int q = 0; q < b->n_seqs; q++) {
            const int B = b->block_len ? b->block_len[q] : c->block_causal;
            for (int i = b->seq_start[q]; i < b->seq_start[q + 1]; i++) s->qblk[i] = B > 0 ? pos[i] / B : 0;
        }
        ap.q_pos = s->qblk;
        ap.k_pos = s->qblk;
        if (cached) {   /* keys numbered by kv_attn_setup, their positions in s->kpos */
            const int nk = s->kstart[b->n_seqs];
            if (nk > s->cap_kblk) {
                s->cap_kblk = nk;
                s->kblk = xrealloc(s->kblk, (size_t)nk * sizeof *s->kblk);
            }
            for (int q = 0; q < b->n_seqs; q++) {
                const int B = b->block_len ? b->block_len[q] : c->block_causal;
                for (int j = s->kstart[q]; j < s->kstart[q + 1]; j++) s->kblk[j] = B > 0 ? s->kpos[j] / B : 0;
            }
            ap.k_pos = s->kblk;
        }
    }

    backend_embed(be, &w->wte, b->tokens, n, s->x);
    int normed = 0;   /* 1: s->h already holds RMSNorm(s->x, this sublayer's norm) (residual_linear) */
    for (int l = 0; l < c->n_layers; l++) {
        const llada_layer_w *L = &w->layers[l];
        /* attention sublayer: x += attn_out(attention(rope(q, k), v)), q/k/v from RMSNorm(x) */
        if (L->qb.data) {   /* with biases (Dream): the norm, then one product + bias each */
            if (!normed) backend_rmsnorm(be, s->x, &L->attn_norm, n, c->d_model, c->norm_eps, s->h);
            backend_matmul(be, s->h, &L->q, &L->qb, n, s->q);
            backend_matmul(be, s->h, &L->k, &L->kb, n, s->k);
            backend_matmul(be, s->h, &L->v, &L->vb, n, s->v);
        } else {   /* three products, or one into s->qkv (joined: rope_kv_layer unpacks its rows) */
            blinear qkv = {.x = normed ? s->h : s->x, .n = n, .norm = normed ? NULL : &L->attn_norm,
                           .eps = c->norm_eps, .epi = BLIN_STORE, .n_w = 3, .w = {&L->q, &L->k, &L->v},
                           .y = {s->q, s->k, s->v}, .tmp_h = s->h};
            if (L->qkv.data) qkv.n_w = 1, qkv.w[0] = &L->qkv, qkv.y[0] = s->qkv;
            backend_linear(be, &qkv);
        }
        if (L->qn.data) {   /* per-head QK-norm, before RoPE: rows of hd elements */
            backend_rmsnorm(be, s->q, &L->qn, n * H, hd, c->norm_eps, s->q);
            backend_rmsnorm(be, s->k, &L->kn, n * KV, hd, c->norm_eps, s->k);
        }
        rope_kv_layer(ctx, b, pos, s, l, cached, H, KV, L->qkv.data != NULL);
        backend_attention(be, &ap, s->q, s->k, s->v, s->att);
        normed = residual_linear(ctx, s->att, &L->attn_out, n, s, &L->ff_norm);
        if (L->moe) {   /* MoE sublayer: x += routed experts + shared expert of h = RMSNorm(x) */
            if (!normed) backend_rmsnorm(be, s->x, &L->ff_norm, n, c->d_model, c->norm_eps, s->h);
            moe_forward(be, c, L->moe, s->h, n, s->x, ctx->shard.world > 1 ? ctx->shard.comm : NULL, &s->moe);
            normed = 0;
            continue;
        }
        /* SwiGLU MLP sublayer: x += down(silu(gate(h)) * up(h)), h = RMSNorm(x) */
        const blinear mlp = {.x = normed ? s->h : s->x, .n = n, .norm = normed ? NULL : &L->ff_norm,
                             .eps = c->norm_eps, .epi = BLIN_SWIGLU, .n_w = 2, .w = {&L->gate, &L->up},
                             .y = {s->gate}, .tmp_h = s->h, .tmp_y = s->up,
                             .wide_tmp = (ctx->packed & BACKEND_PACK_GATE_UP) != 0};
        backend_linear(be, &mlp);
        normed = residual_linear(ctx, s->gate, &L->down, n, s,
                                 l + 1 < c->n_layers ? &w->layers[l + 1].attn_norm : NULL);
    }
}

/* The caller's output rows, or 0..n-1. */
static const int32_t *out_rows_of(const fwd_batch *b, llada_scratch *s, int n) {
    if (b->out_rows) return b->out_rows;
    for (int i = 0; i < n; i++) s->rows[i] = i;
    return s->rows;
}

/* logits s->lg[nr, vocab rows] = RMSNorm(s->xo rows, ln_f) . lm_head^T (s->xo is overwritten) */
static void lm_head(model_ctx *ctx, int nr) {
    llada_weights *w = ctx->weights;
    llada_scratch *s = ctx->scratch;
    const blinear op = {.x = s->xo, .n = nr, .norm = &w->ln_f, .eps = ctx->m->cfg.norm_eps, .epi = BLIN_STORE,
                        .n_w = 1, .w = {&w->lm_head}, .y = {s->lg}, .tmp_h = s->xo};
    backend_linear(ctx->be, &op);
}

int llada_forward(model_ctx *ctx, const fwd_batch *b, float *logits, um_err *err) {
    (void)err;
    const model_config *c = &ctx->m->cfg;
    backend *be = ctx->be;
    llada_scratch *s = ctx->scratch;
    const int n = b->seq_start[b->n_seqs];
    const int n_out = b->out_rows ? b->n_out : n;
    const int d = c->d_model;
    forward_layers(ctx, b, n_out < lm_chunk_rows(c) ? n_out : lm_chunk_rows(c));
    /* Only the rows the caller wants go through ln_f and the LM head, in chunks so the logits
     * staging buffer stays bounded for long outputs over a big vocabulary. */
    const int32_t *rows = out_rows_of(b, s, n);
    const int chunk = lm_chunk_rows(c);
    for (int r0 = 0; r0 < n_out; r0 += chunk) {
        int nr = n_out - r0 < chunk ? n_out - r0 : chunk;
        backend_get_rows(be, s->x, d, rows + r0, nr, s->xo);
        lm_head(ctx, nr);
        backend_act_to_host(be, s->lg, (size_t)nr * (size_t)c->n_embd_rows,
                        logits + (size_t)r0 * (size_t)c->n_embd_rows);
    }
    return 0;
}

int llada_forward_dev(model_ctx *ctx, const fwd_batch *b, const void **logits, um_err *err) {
    (void)err;
    const model_config *c = &ctx->m->cfg;
    backend *be = ctx->be;
    llada_scratch *s = ctx->scratch;
    const int n = b->seq_start[b->n_seqs];
    const int n_out = b->out_rows ? b->n_out : n;
    forward_layers(ctx, b, n_out);   /* LM-head buffers hold every output row: one pass, no copy-out */
    backend_get_rows(be, s->x, c->d_model, out_rows_of(b, s, n), n_out, s->xo);
    lm_head(ctx, n_out);
    *logits = s->lg;
    return 0;
}

void llada_forward_shard(model_ctx *ctx, const fwd_batch *b) { forward_layers(ctx, b, 1); }
