/*
 * make_model.h — write a seeded random checkpoint in exactly the LLaDA-8B-Instruct (or Dream-7B) layout
 * (config.json with the real keys, real tensor names, bf16/f32/f16 or FP8 E4M3 matrices with block
 * scales, optional shards + index) plus
 * the built-in tokenizer files. Used by `unmask make-model`, tests and benchmarks. Main thread;
 * generation is parallelised with OpenMP and streamed to disk (an 8B-shaped model never sits in RAM).
 * The same writer exports trained weights (tools/train/): `weights` names an F32 safetensors file
 * holding every tensor of the layout, which replaces the random values (converted to `dtype`), and
 * the tokenizer may be trained on a corpus or copied from another checkpoint.
 */
#ifndef UM_MAKE_MODEL_H
#define UM_MAKE_MODEL_H

#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"

typedef struct make_model_opts {
    int        dream;           /* 1: the Dream-v0-Instruct-7B layout (Qwen2 config keys and tensor names,
                                   q/k/v biases, the Qwen2 slow tokenizer with Dream's added tokens) */
    int        moe;             /* 0: dense; MAKE_MOE_LLADA_MOE: the LLaDA-MoE-7B-A1B layout; MAKE_MOE_LLADA2:
                                   the LLaDA2.0 layout (both with the built-in Ling-style tokenizer) */
    int        d_model, n_layers, n_heads, n_kv_heads, ffn_hidden;   /* ffn_hidden: dense layers */
    int        n_experts, moe_top_k, moe_ffn;   /* MoE: experts per layer, per token, expert width */
    int        shared_ffn;      /* MoE: shared expert width, 0 = none (LLaDA2: a multiple of moe_ffn) */
    int        first_dense;     /* MoE: leading dense layers */
    int        n_group, topk_group;   /* LLaDA2 grouped routing */
    double     routed_scale;    /* LLaDA2 routed_scaling_factor */
    int        expert_bias;     /* MoE: write an expert-bias vector per MoE layer */
    double     partial_rotary;  /* MoE: partial_rotary_factor (fraction of head_dim rotated) */
    int        vocab_size;      /* used only when no built-in tokenizer is available */
    int        embd_rows;       /* 0, or embedding / LM-head rows past the tokenizer's (a real
                                   checkpoint's embedding_size: the 8b preset's 126464) */
    int        max_seq;
    double     rope_theta;
    enum dtype dtype;
    uint64_t   seed;
    int        weight_tying;
    int        fp8;             /* 1: the linear layers' matrices (q/k/v/o, MLP, experts) as F8_E4M3 with
                                   an F32 "<name>_scale_inv" of 128 x 128 block scales (amax / 448 of
                                   each block) and config.json's quantization_config, the common FP8
                                   checkpoint layout; embedding, LM head, router and norms stay dtype */
    int        shards;          /* 1 = model.safetensors; N > 1 = N shards + index */
    int        no_tokenizer;    /* skip tokenizer files */
    int        quiet;           /* no progress on stderr */
    const char *tokenizer_corpus; /* train the tokenizer on this text file (NULL: built-in one) */
    int        tokenizer_merges;  /* with tokenizer_corpus: BPE merges (0 = 8000) */
    const char *tokenizer_dir;    /* copy tokenizer files from this checkpoint directory instead */
    int        tokenizer_only;    /* write the tokenizer files only (no config, no weights) */
    const char *weights;          /* F32 safetensors with every tensor's values (NULL: random) */
} make_model_opts;

enum { MAKE_MOE_NONE, MAKE_MOE_LLADA_MOE, MAKE_MOE_LLADA2 };

/* Fill opts from a preset name ("tiny", "small" ~100M, "8b" LLaDA-8B shape; "dream-tiny", "dream-7b"
 * Dream-v0-Instruct-7B shape: the Dream layout; "lladamoe-tiny", "lladamoe-7b": the LLaDA-MoE layout;
 * "llada2-tiny", "llada2-mini", "llada2-flash": the LLaDA2.0 layout). -1 if unknown. */
int make_model_preset(const char *name, make_model_opts *opts);
int make_model_write(const char *dir, const make_model_opts *opts, um_err *err);

#endif /* UM_MAKE_MODEL_H */
