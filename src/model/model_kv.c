/*
 * model_kv.c — KV cache slots of a model_ctx (model.h "KV cache slots"): one backend buffer per
 * open slot holding every layer's keys and values for a canvas, the id -> slot table, the memory
 * counters, and the list of slots a tensor-parallel leader closed that its followers must close too.
 *
 * Does not: decide when a cache is refreshed or read (decode/), run the forward (llada.c reads and
 * writes slots through model_kv_layer), or size memory budgets (model_tp.c's fit check).
 * Threads: the table belongs to the engine thread driving the ctx; the counters are atomics read
 * by model_kv_get_stats on any thread.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_types.h"
#include "model/model_kv.h"
#include "util/log.h"

typedef struct kv_slot {
    int   id;        /* > 0 */
    int   rows;      /* canvas positions */
    void *buf;       /* backend activation buffer [n_layers][2][rows][kvd]: K then V of each layer */
} kv_slot;

struct model_kv {
    kv_slot *slots;           /* [n] open slots, unordered */
    int      n, cap;
    int      next_id;         /* last id handed out (ids are never reused while the ctx lives) */
    int      n_layers;
    size_t   kvd;             /* this rank's key/value width: n_kv_heads / world * head_dim */
    int32_t *released;        /* [n_released] tensor-parallel leader: ids closed since the last
                                 batch broadcast (model_kv_take_released) */
    int      n_released, cap_released;
    _Atomic int64_t  a_slots, a_bytes, a_peak;
    _Atomic uint64_t a_opened, a_closed;
};

uint64_t model_kv_bytes(const model_config *c, int world, uint64_t rows, int elem_bytes) {
    const uint64_t W = world > 1 ? (uint64_t)world : 1;
    const uint64_t kvd = (uint64_t)c->n_kv_heads / W * (uint64_t)c->head_dim;
    return rows * 2u * (uint64_t)c->n_layers * kvd * (uint64_t)elem_bytes;
}

void model_kv_init(model_ctx *ctx) {
    const model_config *c = &ctx->m->cfg;
    const int W = ctx->shard.world > 1 ? ctx->shard.world : 1;
    model_kv *kv = xcalloc(1, sizeof *kv);
    kv->n_layers = c->n_layers;
    kv->kvd = (size_t)(c->n_kv_heads / W) * (size_t)c->head_dim;
    ctx->kv = kv;
}

static kv_slot *slot_find(const model_kv *kv, int id) {
    for (int i = 0; id > 0 && i < kv->n; i++)
        if (kv->slots[i].id == id) return &kv->slots[i];
    return NULL;
}

static size_t slot_elems(const model_kv *kv, int rows) { return (size_t)rows * 2u * (size_t)kv->n_layers * kv->kvd; }

static void slot_add(model_ctx *ctx, int id, int rows) {
    model_kv *kv = ctx->kv;
    CHECK(rows >= 1 && rows <= ctx->m->cfg.max_seq && !slot_find(kv, id));
    if (kv->n == kv->cap) {
        kv->cap = kv->cap ? 2 * kv->cap : 8;
        kv->slots = xrealloc(kv->slots, (size_t)kv->cap * sizeof *kv->slots);
    }
    kv_slot *sl = &kv->slots[kv->n++];
    sl->id = id;
    sl->rows = rows;
    sl->buf = backend_act_alloc(ctx->be, slot_elems(kv, rows));
    const int64_t bytes = (int64_t)(slot_elems(kv, rows) * dtype_size(backend_act_dtype(ctx->be)));
    const int64_t now = atomic_fetch_add(&kv->a_bytes, bytes) + bytes;
    int64_t peak = atomic_load(&kv->a_peak);
    while (now > peak && !atomic_compare_exchange_weak(&kv->a_peak, &peak, now)) {}
    atomic_fetch_add(&kv->a_slots, 1);
    atomic_fetch_add(&kv->a_opened, 1);
}

int model_kv_open(model_ctx *ctx, int rows) {
    model_kv *kv = ctx->kv;
    CHECK(kv && kv->next_id < 0x7fffffff);
    slot_add(ctx, ++kv->next_id, rows);
    return kv->next_id;
}

void model_kv_ensure(model_ctx *ctx, int id, int rows) {
    kv_slot *sl = slot_find(ctx->kv, id);
    if (sl) {
        CHECK(sl->rows == rows);
        return;
    }
    slot_add(ctx, id, rows);
}

static void slot_free(model_ctx *ctx, int i) {
    model_kv *kv = ctx->kv;
    kv_slot *sl = &kv->slots[i];
    backend_act_free(ctx->be, sl->buf);
    atomic_fetch_sub(&kv->a_bytes, (int64_t)(slot_elems(kv, sl->rows) * dtype_size(backend_act_dtype(ctx->be))));
    atomic_fetch_sub(&kv->a_slots, 1);
    atomic_fetch_add(&kv->a_closed, 1);
    kv->slots[i] = kv->slots[--kv->n];
}

void model_kv_close(model_ctx *ctx, int id) {
    model_kv *kv = ctx->kv;
    if (id == 0 || !kv) return;
    kv_slot *sl = slot_find(kv, id);
    CHECK(sl);
    slot_free(ctx, (int)(sl - kv->slots));
    if (ctx->tp) {   /* the followers hold a mirror of it: they close it with the next batch */
        if (kv->n_released == kv->cap_released) {
            kv->cap_released = kv->cap_released ? 2 * kv->cap_released : 16;
            kv->released = xrealloc(kv->released, (size_t)kv->cap_released * sizeof *kv->released);
        }
        kv->released[kv->n_released++] = id;
    }
}

int model_kv_take_released(model_ctx *ctx, const int32_t **ids) {
    model_kv *kv = ctx->kv;
    *ids = kv ? kv->released : NULL;
    int n = kv ? kv->n_released : 0;
    if (kv) kv->n_released = 0;   /* the array stays valid until the next model_kv_close */
    return n;
}

int model_kv_rows(const model_ctx *ctx, int id) {
    const kv_slot *sl = ctx->kv ? slot_find(ctx->kv, id) : NULL;
    return sl ? sl->rows : 0;
}

void model_kv_layer(const model_ctx *ctx, int id, int layer, void **k, void **v) {
    const model_kv *kv = ctx->kv;
    const kv_slot *sl = slot_find(kv, id);
    CHECK(sl && layer >= 0 && layer < kv->n_layers);
    const size_t es = dtype_size(backend_act_dtype(ctx->be)), per = (size_t)sl->rows * kv->kvd * es;
    *k = (char *)sl->buf + (size_t)(2 * layer) * per;
    *v = (char *)sl->buf + (size_t)(2 * layer + 1) * per;
}

void model_kv_get_stats(const model_ctx *ctx, model_kv_stats *out) {
    memset(out, 0, sizeof *out);
    const model_kv *kv = ctx->kv;
    if (!kv) return;
    out->slots = atomic_load(&kv->a_slots);
    out->bytes = atomic_load(&kv->a_bytes);
    out->peak_bytes = atomic_load(&kv->a_peak);
    out->opened = atomic_load(&kv->a_opened);
    out->closed = atomic_load(&kv->a_closed);
}

void model_kv_free(model_ctx *ctx) {
    model_kv *kv = ctx->kv;
    if (!kv) return;
    while (kv->n > 0) slot_free(ctx, kv->n - 1);
    free(kv->slots);
    free(kv->released);
    free(kv);
    ctx->kv = NULL;
}
