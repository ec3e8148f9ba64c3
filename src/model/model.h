/*
 * model.h — a loaded checkpoint (host side) and a model bound to a backend for forward passes.
 *
 * model_load(): config.json (+ generation_config.json), the safetensors checkpoint (mmapped) and,
 * when present, the tokenizer files — or a GGUF file holding all of it (model/gguf_model.h). It validates that every tensor the architecture needs exists
 * with the expected shape and a usable dtype, naming the tensor in the error.
 * model_ctx: the model's weights uploaded to one backend plus that backend's scratch buffers; one
 * engine thread drives a model_ctx at a time. The host model is shared read-only by all ctxs.
 */
#ifndef UM_MODEL_H
#define UM_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "util/err.h"

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

/* dir: a checkpoint directory, or a GGUF file (model/gguf_model.h: llama.cpp's converter output). */
int  model_load(const char *dir, model *m, um_err *err);
/* --quant names: "bf16" -> DTYPE_BF16, "q8_0" -> DTYPE_Q8_0, "q4_0" -> DTYPE_Q4_0; 0, or -1 when the
 * name is unknown. model_quant_name is the inverse. */
#define MODEL_QUANT_NAMES "bf16, q8_0, q4_0"
int         model_quant_parse(const char *name, enum dtype *out);
const char *model_quant_name(enum dtype q);
/* Checks that dir looks like a checkpoint directory before anything else is done with it (no
 * reading beyond stat): it exists, is a directory, has config.json and model.safetensors or
 * model.safetensors.index.json. On failure -1 with err (UM_ERR_IO) saying what is wrong and what
 * to run or pass instead, e.g. for a path to config.json itself: its directory. model_load()
 * calls it first; `serve` calls it before it starts listening. */
int  model_dir_check(const char *dir, um_err *err);
/* The tokenizer and chat template of a checkpoint directory or GGUF file, without the weights
 * (*tok NULL when there is none; chat may be NULL when not wanted). */
int  model_tokenizer_load(const char *path, struct tokenizer **tok, struct chat_template **chat, um_err *err);
/* The name of tensor `name` (a Hugging Face name) in m's files, for messages: name itself, or its
 * GGUF name (in buf) for a GGUF model. */
const char *model_tensor_label(const model *m, const char *name, char *buf, size_t cap);
void model_free(model *m);

/* ---------------------------------------------------------------- forward */

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
                                   follower ranks; NULL otherwise */
    void        *weights;       /* arch-specific backend weights (llada_weights in llada.c) */
    void        *scratch;       /* arch-specific workspace, grown on demand */
    struct model_kv *kv;        /* KV cache slots on this ctx's backend (model_kv.c), owned */
    int          host_sync;     /* 1: a forward waits for the host between its ops (a MoE layer
                                   routed on the host: model/moe.c), so it cannot be captured into a
                                   graph; 0: the forward only enqueues work */
} model_ctx;

/* 0 when be can hold m's weights as m->quant asks, else -1 + err (param "quant": a backend without
 * BACKEND_CAP_QUANT, a GPU today; or a tensor the checkpoint stores in another block type than
 * m->quant — stored Q8_0 / Q4_0 run as stored, never requantized). model_ctx_init checks it;
 * callers check it before a fit check. */
int  model_quant_check(const model *m, backend *be, um_err *err);
/* Uploads m's weights to be (quantized when m->quant asks; model_quant_check first). */
int  model_ctx_init(model_ctx *ctx, const model *m, backend *be, um_err *err);
/* As model_ctx_init for one rank of a tensor-parallel group (heads / FFN width must divide by
 * world: -1 + UM_ERR_UNSUPPORTED otherwise). */
int  model_ctx_init_shard(model_ctx *ctx, const model *m, backend *be, const model_shard *shard, um_err *err);
void model_ctx_free(model_ctx *ctx);
/* Logits (f32, host) for the requested rows: logits[n_out, cfg.n_embd_rows]. Validates token ids
 * and lengths (per-request errors), then runs the forward. */
int  model_forward(model_ctx *ctx, const fwd_batch *b, float *logits, um_err *err);
/* Same validation and forward, but the logits stay on the backend: *logits = an activation buffer
 * [n_out, n_embd_rows] owned by the ctx, valid until the next forward. Never synchronises the
 * device (the CUDA decode step captures it in a graph) — except on a tensor-parallel leader
 * (ctx->tp), whose batch broadcast to the followers synchronises the stream (no graph capture), and
 * on a ctx with host_sync (MoE layers routed on the host). */
int  model_forward_dev(model_ctx *ctx, const fwd_batch *b, const void **logits, um_err *err);

/* ---------------------------------------------------------------- KV cache slots
 *
 * A slot holds, for one canvas of `rows` positions, every layer's keys (after RoPE: positions are
 * fixed) and values of this ctx's heads, in the backend's memory (activation dtype). The decode
 * loop opens one per cached canvas, passes it in fwd_batch.kv and closes it when the sequence
 * ends. On a tensor-parallel leader every rank mirrors the slot with its own heads: followers open
 * it at the first batch naming it and close it with the batch after model_kv_close. Engine thread
 * of the ctx (open/close/forward); model_kv_get_stats from any thread. */

/* A new slot of rows positions (1 .. cfg.max_seq): its id (> 0). */
int  model_kv_open(model_ctx *ctx, int rows);
/* Free a slot's memory now (id 0: no-op). */
void model_kv_close(model_ctx *ctx, int id);
/* Positions a slot holds (0 when id is not an open slot). */
int  model_kv_rows(const model_ctx *ctx, int id);
/* Backend bytes of a slot of `rows` positions on a backend whose activations take elem_bytes each
 * (this rank's heads with `world` ranks): for memory sizing. */
uint64_t model_kv_bytes(const model_config *c, int world, uint64_t rows, int elem_bytes);

typedef struct model_kv_stats {
    int64_t  slots;        /* open now */
    int64_t  bytes;        /* their backend memory now */
    int64_t  peak_bytes;   /* the most held at once */
    uint64_t opened, closed;
} model_kv_stats;
void model_kv_get_stats(const model_ctx *ctx, model_kv_stats *out);

#endif /* UM_MODEL_H */
