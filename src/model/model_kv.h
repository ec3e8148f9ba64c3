/*
 * model_kv.h — the model layer's own access to KV cache slots (model_kv.c): setup/teardown with
 * the ctx, a slot's per-layer buffers for the forward (llada.c), and the tensor-parallel mirroring
 * (model_tp.c). The public part (open/close/rows/stats) is in model.h. Engine thread of the ctx.
 */
#ifndef UM_MODEL_KV_H
#define UM_MODEL_KV_H

#include <stdint.h>

#include "model/model.h"

typedef struct model_kv model_kv;

void model_kv_init(model_ctx *ctx);   /* an empty table for ctx (its config and shard) */
void model_kv_free(model_ctx *ctx);   /* closes every slot */
/* Layer `layer`'s key / value rows of slot id: [rows, kvd] each, on the backend. */
void model_kv_layer(const model_ctx *ctx, int id, int layer, void **k, void **v);
/* Follower rank: open slot `id` with `rows` positions unless it is open already. */
void model_kv_ensure(model_ctx *ctx, int id, int rows);
/* Leader rank: the ids closed since the last call (*ids valid until the next model_kv_close). */
int  model_kv_take_released(model_ctx *ctx, const int32_t **ids);

#endif /* UM_MODEL_KV_H */
