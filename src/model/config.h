/*
 * config.h — model hyper-parameters from a checkpoint's config.json (+ generation_config.json).
 *
 * model_config_parse() works on a buffer (fuzzable) and validates every field the forward pass
 * relies on (positive sizes, head_dim dividing the model width, GQA divisibility, token ids inside
 * the vocabulary). Architecture dispatch is on "architectures" (LLaDA-MoE also says
 * model_type "llada"), with key names as a fallback. Pure functions, any thread.
 */
#ifndef UM_CONFIG_H
#define UM_CONFIG_H

#include <stddef.h>

#include "util/err.h"

enum model_arch {
    MODEL_ARCH_UNKNOWN,
    MODEL_ARCH_LLADA,        /* LLaDA-8B / LLaDA-1.5 / MMaDA text: dense, bidirectional */
    MODEL_ARCH_LLADA_MOE,    /* LLaDA-MoE-7B-A1B: OLMoE-like MoE, per-head QK-norm, bidirectional */
    MODEL_ARCH_LLADA2,       /* LLaDA2.0/2.1 BailingMoeV2: fused qkv, QK-norm, partial rotary, GQA,
                                dense first layers, grouped sigmoid router, shared expert,
                                block-causal attention */
    MODEL_ARCH_DREAM,        /* Dream-7B: Qwen2 layout (q/k/v biases, GQA), bidirectional, shifted logits */
};

/* How a MoE layer's router turns its logits into expert choices and weights (docs/model-spec.md). */
enum model_router {
    MODEL_ROUTER_NONE,          /* dense model */
    MODEL_ROUTER_SOFTMAX,       /* LLaDA-MoE: softmax over all experts (+ expert bias when present),
                                   top-k of those values, which are the weights (no renormalisation) */
    MODEL_ROUTER_SIGMOID_GROUP, /* LLaDA2: top-k of sigmoid + expert bias within the topk_group best
                                   groups; weights = the unbiased sigmoids renormalised (+1e-20) and
                                   scaled by routed_scale */
};

typedef struct model_config {
    enum model_arch arch;
    char   arch_name[64];         /* architectures[0] as written */
    int    d_model;               /* hidden width */
    int    n_layers;
    int    n_heads;
    int    n_kv_heads;
    int    head_dim;              /* d_model / n_heads */
    int    ffn_hidden;            /* SwiGLU inner size (LLaDA mlp_hidden_size) */
    int    vocab_size;            /* tokenizer vocabulary (config "vocab_size") */
    int    n_embd_rows;           /* rows of the embedding / LM head (LLaDA "embedding_size") */
    int    max_seq;               /* max_sequence_length / max_position_embeddings */
    float  rope_theta;
    int    rot_dim;               /* dims of each head that RoPE rotates (head_dim for LLaDA) */
    float  norm_eps;
    int    weight_tying;          /* LM head = embedding */
    int    logits_shifted;        /* Dream: output row i predicts token i+1 (the decode layer
                                     reads position p's logits from row p-1; model_forward returns
                                     the raw rows) */
    int    block_causal;          /* LLaDA2: default block size of the block-causal mask (a
                                     forward may name another: fwd_batch.block_len), else 0 */
    int    qk_norm;               /* 1: RMSNorm over head_dim of every q / k head, before RoPE */
    int    fused_qkv;             /* 1: one [(n_heads + 2 n_kv) hd, d] query_key_value weight (LLaDA2) */
    /* MoE (n_experts > 0). Layers [0, first_dense) are dense SwiGLU MLPs of ffn_hidden; the others
     * are MoE layers: a router [n_experts, d], n_experts experts of moe_ffn, and a shared expert of
     * shared_ffn when > 0 (added to the routed sum). */
    int    n_experts;             /* routed experts per MoE layer; 0 = dense model */
    int    moe_top_k;             /* experts per token (num_experts_per_tok) */
    int    moe_ffn;               /* one expert's SwiGLU inner size */
    int    shared_ffn;            /* shared expert's SwiGLU inner size; 0 = none */
    int    first_dense;           /* leading dense layers (first_k_dense_replace / moe_layer_freq 0s) */
    int    router;                /* enum model_router */
    int    expert_bias;           /* 1: MoE layers have an expert-bias vector [n_experts] */
    int    n_group, topk_group;   /* SIGMOID_GROUP: experts form n_group equal groups; keep topk_group */
    float  routed_scale;          /* SIGMOID_GROUP: routed_scaling_factor */
    /* FP8 checkpoints (config.json "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
     * "weight_block_size": [r, c]}): a matrix stored as F8_E4M3 carries an F32 X.weight_scale_inv of
     * [ceil(rows / r), ceil(cols / c)] block scales (model/llada_weights.c) */
    int    fp8;                   /* 1: quant_method "fp8" */
    int    fp8_block[2];          /* weight_block_size (rows, cols); 128 x 128 when not given */
    /* token ids (-1 when unknown) */
    int    mask_id;
    int    eos_id;
    int    eot_id;                /* end of turn (<|eot_id|>); resolved from the tokenizer */
    int    bos_id;
    int    pad_id;
} model_config;

/* Parse config.json text. label names the file in messages. */
int model_config_parse(const char *json, size_t len, const char *label, model_config *cfg,
                       um_err *err);
/* Apply generation_config.json (bos/eos overrides); missing keys leave cfg unchanged. */
int model_config_apply_generation(const char *json, size_t len, const char *label,
                                  model_config *cfg, um_err *err);
const char *model_arch_name(enum model_arch arch);
/* Parameter count implied by the config (for bench and make-model messages). */
long long model_config_n_params(const model_config *cfg);

/* tp (tensor-parallel ranks) must divide n_heads, n_kv_heads and the MLP width (and the shared
 * expert's): -1 + UM_ERR_UNSUPPORTED (param "tp") naming them; label names the model. */
int model_config_check_tp(const model_config *c, const char *label, int tp, um_err *err);

#endif /* UM_CONFIG_H */
