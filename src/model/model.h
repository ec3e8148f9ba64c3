/*
 * model.h — a loaded checkpoint (host side) and a model bound to a backend for forward passes.
 *
 * model_load(): config.json (+ generation_config.json), the safetensors checkpoint (mmapped) and,
 * when present, the tokenizer files — or a GGUF file holding all of it (model/gguf_model.h). It validates that every tensor the architecture needs exists
 * with the expected shape and a usable dtype, naming the tensor in the error.
 * model_ctx: the model's weights uploaded to one backend plus that backend's scratch buffers; one
 * engine thread drives a model_ctx at a time. The host model is shared read-only by all ctxs.
 * This is the layer's entry point: the types are model_types.h (below the parts: llada.c, moe.c,
 * model_kv.c, gguf_model.c), the KV slots' API model_kv.h, tensor names gguf_model.h.
 */
#ifndef UM_MODEL_H
#define UM_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/gguf_model.h"
#include "model/model_kv.h"
#include "model/model_types.h"
#include "util/err.h"


/* dir: a checkpoint directory, or a GGUF file (model/gguf_model.h: llama.cpp's converter output). */
int  model_load(const char *dir, model *m, um_err *err);
/* Checks that dir looks like a checkpoint directory before anything else is done with it (no
 * reading beyond stat): it exists, is a directory, has config.json and model.safetensors or
 * model.safetensors.index.json. On failure -1 with err (UM_ERR_IO) saying what is wrong and what
 * to run or pass instead, e.g. for a path to config.json itself: its directory. model_load()
 * calls it first; `serve` calls it before it starts listening. */
int  model_dir_check(const char *dir, um_err *err);
/* The tokenizer and chat template of a checkpoint directory or GGUF file, without the weights
 * (*tok NULL when there is none; chat may be NULL when not wanted). */
int  model_tokenizer_load(const char *path, struct tokenizer **tok, struct chat_template **chat, um_err *err);
void model_free(model *m);

/* ---------------------------------------------------------------- forward (types: model_types.h) */

/* 0 when be can hold m's weights as m->quant asks, else -1 + err (param "quant": q8_0 / q4_0 on a
 * backend without BACKEND_CAP_QUANT, a GPU today; fp8 on one without BACKEND_CAP_FP8, the CPU; or a
 * tensor the checkpoint stores in another block type than m->quant — stored Q8_0 / Q4_0 run as
 * stored, never requantized; stored FP8 is dequantized exactly, so q8_0 / q4_0 may take it).
 * model_ctx_init checks it; callers check it before a fit check. */
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

#endif /* UM_MODEL_H */
