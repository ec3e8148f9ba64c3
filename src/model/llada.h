/*
 * llada.h — the LLaDA dense forward pass written against backend ops (model/llada.c).
 * Called through model_ctx_init / model_forward; not used directly by other layers.
 */
#ifndef UM_LLADA_H
#define UM_LLADA_H

#include "model/model_types.h"

int  llada_tensors_bind(model *m, um_err *err);      /* find + shape-check every tensor */
void llada_tensors_free(model *m);

int  llada_ctx_init(model_ctx *ctx, um_err *err);    /* upload weights to ctx->be */
void llada_ctx_free(model_ctx *ctx);
/* Batch already validated by model_forward. */
int  llada_forward(model_ctx *ctx, const fwd_batch *b, float *logits, um_err *err);
/* Logits left on the backend (model_forward_dev). */
int  llada_forward_dev(model_ctx *ctx, const fwd_batch *b, const void **logits, um_err *err);
/* Embedding and every layer only (with their all-reduces), no LM head: what a tensor-parallel
 * follower rank runs for each batch the leader broadcasts (model/model_tp.c). */
void llada_forward_shard(model_ctx *ctx, const fwd_batch *b);

#endif /* UM_LLADA_H */
