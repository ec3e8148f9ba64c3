/*
 * model_kv.h — the model layer's own access to KV cache slots (model_kv.c): setup/teardown with
 * the ctx, a slot's per-layer buffers for the forward (llada.c), and the tensor-parallel mirroring
 * (model_tp.c), and the public part: open / close / rows / bytes / stats. Engine thread of the ctx.
 */
#ifndef UM_MODEL_KV_H
#define UM_MODEL_KV_H

#include <stdint.h>

#include "model/model_types.h"

typedef struct model_kv model_kv;

void model_kv_init(model_ctx *ctx);   /* an empty table for ctx (its config and shard) */
void model_kv_free(model_ctx *ctx);   /* closes every slot */
/* Layer `layer`'s key / value rows of slot id: [rows, kvd] each, on the backend. */
void model_kv_layer(const model_ctx *ctx, int id, int layer, void **k, void **v);
/* Follower rank: open slot `id` with `rows` positions unless it is open already. */
void model_kv_ensure(model_ctx *ctx, int id, int rows);
/* Leader rank: the ids closed since the last call (*ids valid until the next model_kv_close). */
int  model_kv_take_released(model_ctx *ctx, const int32_t **ids);

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

void model_kv_get_stats(const model_ctx *ctx, model_kv_stats *out);

#endif /* UM_MODEL_KV_H */
