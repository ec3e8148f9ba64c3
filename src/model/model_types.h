/*
 * model_types.h — the model layer's types, below its parts: the tensors a checkpoint binds (llada,
 * MoE), the loaded model, a forward batch, a tensor-parallel shard, the ctx that binds a model to a
 * backend, KV statistics; and the --quant names. The functions are in model.h (the entry point),
 * model_kv.h, llada.h, moe.h, gguf_model.h. Types only (and two inline name mappings).
 */
#ifndef UM_MODEL_TYPES_H
#define UM_MODEL_TYPES_H

#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "util/dtype.h"

struct tokenizer;     /* text/tokenizer.h */
struct chat_template; /* text/chat_template.h */

/* One MoE layer's tensors (LLaDA-MoE, LLaDA2; model/moe.c). Expert arrays are owned. */
typedef struct moe_layer_tensors {
    const st_tensor  *router;       /* [n_experts, d] */
    const st_tensor  *expert_bias;  /* [n_experts], or NULL */
    const st_tensor **gate, **up;   /* [n_experts] pointers to [moe_ffn, d] */
    const st_tensor **down;         /* [n_experts] pointers to [d, moe_ffn] */
    const st_tensor  *sh_gate;      /* [shared_ffn, d] shared expert, or NULL (then sh_up/sh_down too) */
    const st_tensor  *sh_up;        /* [shared_ffn, d] */
    const st_tensor  *sh_down;      /* [d, shared_ffn] */
} moe_layer_tensors;

/* Host views of the transformer tensors (pointers into the checkpoint mapping). LLaDA, Dream,
 * LLaDA-MoE and LLaDA2 share this layout and forward (model/llada.c, MoE sublayers model/moe.c);
 * they differ in tensor names, Dream's q/k/v biases and shifted logits (handled by the decode
 * layer), the MoE models' QK-norm, LLaDA2's fused qkv and the MoE layers. Comments give the LLaDA
 * names. */
typedef struct llada_layer_tensors {
    const st_tensor *attn_norm;   /* [d] */
    const st_tensor *q_proj;      /* [n_heads*hd, d]; NULL with fused qkv */
    const st_tensor *k_proj;      /* [n_kv*hd, d] */
    const st_tensor *v_proj;      /* [n_kv*hd, d] */
    const st_tensor *q_bias;      /* [n_heads*hd] Dream; NULL for LLaDA (no biases) */
    const st_tensor *k_bias;      /* [n_kv*hd] Dream, else NULL */
    const st_tensor *v_bias;      /* [n_kv*hd] Dream, else NULL */
    const st_tensor *qkv;         /* [(n_heads + 2 n_kv)*hd, d] LLaDA2 query_key_value (rows: q, k, v),
                                     else NULL */
    const st_tensor *q_norm;      /* [hd] per-head QK-norm (MoE models), else NULL */
    const st_tensor *k_norm;      /* [hd] */
    const st_tensor *attn_out;    /* [d, n_heads*hd] */
    const st_tensor *ff_norm;     /* [d] */
    const st_tensor *ff_proj;     /* [ffn, d]  gate (SiLU); NULL in a MoE layer */
    const st_tensor *up_proj;     /* [ffn, d]  up */
    const st_tensor *ff_out;      /* [d, ffn]  down */
    moe_layer_tensors *moe;       /* a MoE layer's router and experts (owned), or NULL (dense) */
} llada_layer_tensors;

typedef struct llada_tensors {
    const st_tensor     *wte;     /* [n_embd_rows, d] */
    const st_tensor     *ln_f;    /* [d] */
    const st_tensor     *lm_head; /* [n_embd_rows, d]; == wte when weight_tying */
    llada_layer_tensors *layers;  /* [n_layers], owned */
} llada_tensors;

typedef struct model {
    char                 *dir;       /* owned: the checkpoint directory, or the GGUF file */
    int                   gguf;      /* 1: loaded from a GGUF file (model/gguf_model.c): messages name
                                        its tensors by their GGUF names */
    model_config          cfg;
    checkpoint            ck;
    llada_tensors         llada;     /* every architecture (the names differ, model/llada.c) */
    struct tokenizer     *tok;       /* NULL when the checkpoint ships no tokenizer files */
    struct chat_template *chat;      /* NULL when tokenizer_config.json has no chat_template */
    struct json_t        *gen_config; /* generation_config.json as read at load (a JSON object, owned),
                                         or NULL: the decode defaults it names (decode.c) come from
                                         here, never from the file again */
    enum dtype            quant;     /* how model_ctx_init stores the matrices of products (attention
                                        q/k/v/o, MLP, experts, shared experts, LM head): DTYPE_Q8_0 /
                                        DTYPE_Q4_0 = quantized once at load, the only copy kept (a
                                        backend with BACKEND_CAP_QUANT); DTYPE_BF16 (model_load's
                                        default) = as the checkpoint stores them. The caller sets it
                                        (--quant) between model_load and model_ctx_init. */
} model;

/* A batch of sequences packed row after row. Positions default to 0..len-1 per sequence.
 * KV caches (kv != NULL): a sequence with a slot (model_kv_open) writes the keys (after RoPE) and
 * values of its rows into the slot at their positions in every layer, then attends over ALL the
 * slot's rows [0, slot rows) — the ones it just wrote and those an earlier forward left there —
 * instead of over its own rows only. A full canvas with a slot fills the cache; a few rows (a
 * block) with a slot reuse it. Rows of one sequence must have distinct positions. */
typedef struct fwd_batch {
    int            n_seqs;
    const int32_t *seq_start;   /* [n_seqs+1] row offsets into tokens */
    const int32_t *tokens;      /* [n_tokens] */
    const int32_t *pos;         /* [n_tokens] absolute positions, or NULL */
    const uint8_t *key_valid;   /* [n_tokens] 0 = padding (excluded as a key), or NULL (required
                                   with kv) */
    int            n_out;       /* rows whose logits are wanted; 0 (with out_rows and kv) = none:
                                   the forward only fills the KV slots (a chunked prefill) */
    const int32_t *out_rows;    /* [n_out] indices into tokens; NULL = all rows (n_out = n_tokens) */
    const int32_t *kv;          /* [n_seqs] KV slot of each sequence, 0 = none; NULL = no caches */
    const int32_t *block_len;   /* [n_seqs] block-causal attention per sequence: B > 0 = query i sees
                                   key j iff pos_j / B <= pos_i / B (blocks aligned to position 0),
                                   0 = bidirectional; NULL = the model's default (cfg.block_causal) */
} fwd_batch;

struct comm; /* backend/comm.h */

/* Tensor parallelism: this ctx is rank `rank` of `world` ranks that each hold a slice of the
 * weights (whole attention heads of q/k/v, a column slice of ff_proj/up_proj; the matching input
 * slices of attn_out / ff_out) and sum their partial outputs with an all-reduce over `comm`.
 * world <= 1 (the zeroed default): unsharded. */
typedef struct model_shard {
    int          rank, world;
    struct comm *comm;
} model_shard;

struct model_tp; /* model/model_tp.h */

typedef struct model_ctx {
    const model *m;
    backend     *be;
    model_shard  shard;
    struct model_tp *tp;        /* set on rank 0 of a tensor-parallel group (model_tp.c, which owns
                                   the ctx): each forward first broadcasts the batch to the
                                   follower ranks (tp_send); NULL otherwise */
    void       (*tp_send)(struct model_tp *tp, const fwd_batch *b); /* with tp: model_tp_send_batch */
    void        *weights;       /* arch-specific backend weights (llada_weights in llada.c) */
    void        *scratch;       /* arch-specific workspace, grown on demand */
    struct model_kv *kv;        /* KV cache slots on this ctx's backend (model_kv.c), owned */
    int          host_sync;     /* 1: a forward waits for the host between its ops (a MoE layer
                                   routed on the host: model/moe.c), so it cannot be captured into a
                                   graph; 0: the forward only enqueues work */
    unsigned     packed;        /* BACKEND_PACK_* the layers' weights were joined for (backend_packs):
                                   q|k|v, gate|up as one matrix and one product each */
} model_ctx;

typedef struct model_kv_stats {
    int64_t  slots;        /* open now */
    int64_t  bytes;        /* their backend memory now */
    int64_t  peak_bytes;   /* the most held at once */
    uint64_t opened, closed;
} model_kv_stats;

/* --quant names: "bf16" -> DTYPE_BF16, "q8_0" -> DTYPE_Q8_0, "q4_0" -> DTYPE_Q4_0, "fp8" ->
 * DTYPE_F8_E4M3; 0, or -1 when the name is unknown. model_quant_name is the inverse. */
#define MODEL_QUANT_NAMES "bf16, q8_0, q4_0, fp8"
static inline int model_quant_parse(const char *name, enum dtype *out) {
    const enum dtype t = !name                    ? DTYPE_OTHER
                         : strcmp(name, "bf16") == 0 ? DTYPE_BF16
                         : strcmp(name, "q8_0") == 0 ? DTYPE_Q8_0
                         : strcmp(name, "q4_0") == 0 ? DTYPE_Q4_0
                         : strcmp(name, "fp8") == 0  ? DTYPE_F8_E4M3
                                                     : DTYPE_OTHER;
    if (t == DTYPE_OTHER) return -1;
    *out = t;
    return 0;
}
/* 1 when --quant q converts the float matrices at load (q8_0, q4_0, fp8; not bf16). */
static inline int model_quant_converts(enum dtype q) { return dtype_is_quant(q) || q == DTYPE_F8_E4M3; }
static inline const char *model_quant_name(enum dtype q) {
    return q == DTYPE_Q8_0 ? "q8_0" : q == DTYPE_Q4_0 ? "q4_0" : q == DTYPE_F8_E4M3 ? "fp8" : "bf16";
}

#endif /* UM_MODEL_TYPES_H */
