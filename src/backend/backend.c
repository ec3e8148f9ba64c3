/*
 * backend.c — the public face of the ops table (backend.h, backend_decode.h): thin wrappers that
 * call the implementation's member, and the documented host-memory / synchronous behaviour where
 * an optional member is absent. Does not: implement any op (cpu/, cuda/ do) or choose a backend
 * (backend_reg.c). Any thread that owns the backend.
 */
#include "backend/backend.h"

#include <string.h>

#include "backend/backend_decode.h"
#include "backend/backend_impl.h"
#include "util/log.h"

/* ---------------------------------------------------------------- instance */

void backend_free(backend *be) {
    if (!be) return;
    backend_profile_stop(be);
    be->ops->free(be);
}

const char *backend_name(const backend *be) { return be->name; }
const char *backend_description(const backend *be) { return be->description ? be->description : be->name; }
int backend_n_threads(const backend *be) { return be->n_threads; }
enum dtype backend_act_dtype(const backend *be) { return be->act_dtype; }

int backend_has(const backend *be, unsigned caps) {
    const backend_ops *o = be->ops;
    unsigned have = 0;
    if (o->mem_info && o->check_fit && o->set_upload_total && o->trim) have |= BACKEND_CAP_DEVICE_MEMORY;
    if (o->synchronize) have |= BACKEND_CAP_ASYNC;
    if (o->graph_begin && o->graph_end && o->graph_launch && o->graph_stale && o->graph_free)
        have |= BACKEND_CAP_GRAPHS;
    if (o->buf_alloc && o->buf_free && o->buf_set_async && o->buf_get_async && o->host_alloc && o->host_free &&
        o->event_new && o->event_free && o->event_record && o->event_query && o->event_wait && o->event_elapsed_ms &&
        o->alias_add && o->alias_clear && o->decode_begin && o->decode_sample && o->decode_commit)
        have |= BACKEND_CAP_DEVICE_DECODE;
    if (o->comm_join) have |= BACKEND_CAP_COMM;
    if (o->moe_prepare && o->moe_release && o->moe_workspace && o->moe_forward) have |= BACKEND_CAP_MOE;
    if (o->quant_weights) have |= BACKEND_CAP_QUANT;
    if (o->fp8_weights) have |= BACKEND_CAP_FP8;
    if (o->rope_kv && o->add_rmsnorm) have |= BACKEND_CAP_FUSED;
    return (have & caps) == caps;
}

/* an op timed while profiling (backend_prof.c) */
#define PROF(be, name, call)                                                                       \
    do {                                                                                           \
        const int prof_i_ = backend_prof_begin((be), (name));                                      \
        call;                                                                                      \
        backend_prof_end((be), prof_i_);                                                           \
    } while (0)

/* A member of an optional group the caller must have checked for (backend_has). */
#define NEED(be, member)                                                                           \
    do {                                                                                           \
        if (!(be)->ops->member) UM_FATAL("backend %s has no %s (check backend_has first)", (be)->name, #member); \
    } while (0)

void backend_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes) {
    if (be->ops->mem_info) {
        be->ops->mem_info(be, free_bytes, total_bytes);
        return;
    }
    if (free_bytes) *free_bytes = 0;
    if (total_bytes) *total_bytes = 0;
}

int backend_check_fit(backend *be, uint64_t weight_bytes, uint64_t act_bytes, um_err *err) {
    return be->ops->check_fit ? be->ops->check_fit(be, weight_bytes, act_bytes, err) : 0;
}

void backend_set_upload_total(backend *be, uint64_t bytes, const char *label) {
    if (be->ops->set_upload_total) be->ops->set_upload_total(be, bytes, label);
}

void backend_synchronize(backend *be) {
    if (be->ops->synchronize) be->ops->synchronize(be);
}

double backend_mem_bandwidth(backend *be, size_t bytes, int reps) {
    return be->ops->mem_bandwidth ? be->ops->mem_bandwidth(be, bytes, reps) : 0.0;
}

size_t backend_trim(backend *be) { return be->ops->trim ? be->ops->trim(be) : 0; }

/* ---------------------------------------------------------------- forward ops */

int backend_weight_upload(backend *be, const bweight_src *src, bweight *out, um_err *err) {
    CHECK(src->n_parts == 0 || (be->ops->packs && !src->data && src->part_data && src->part_rows &&
                                (src->type == DTYPE_F32 || src->type == DTYPE_BF16 || src->type == DTYPE_F16) &&
                                src->quant != DTYPE_Q8_0 && src->quant != DTYPE_Q4_0 && src->quant != DTYPE_F8_E4M3));
    return be->ops->weight_upload(be, src, out, err);
}
void backend_weight_free(backend *be, bweight *w) { be->ops->weight_free(be, w); }
int backend_weight_keeps_source(backend *be, const bweight *w) {
    return be->ops->weight_keeps_source ? be->ops->weight_keeps_source(be, w) : 1;
}
void *backend_act_alloc(backend *be, size_t n) { return be->ops->act_alloc(be, n); }
void backend_act_free(backend *be, void *p) { be->ops->act_free(be, p); }
void backend_act_to_host(backend *be, const void *src, size_t n, float *dst) { be->ops->act_to_host(be, src, n, dst); }
void backend_embed(backend *be, const bweight *wte, const int32_t *ids, int n, void *out) {
    PROF(be, "embed", be->ops->embed(be, wte, ids, n, out));
}
void backend_rmsnorm(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out) {
    PROF(be, "rmsnorm", be->ops->rmsnorm(be, x, w, n, d, eps, out));
}
void backend_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y) {
    PROF(be, "matmul", be->ops->matmul(be, x, w, bias, n, y));
}
void backend_rope(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos, float theta) {
    PROF(be, "rope", be->ops->rope(be, x, n, n_heads, head_dim, rot_dim, pos, theta));
}
void backend_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v, void *out) {
    PROF(be, "attention", be->ops->attention(be, p, q, k, v, out));
}
void backend_linear_unfused(backend *be, const blinear *op) {
    CHECK(op->n_w >= 1 && op->n_w <= 3 && (!op->norm || op->tmp_h));
    CHECK(op->epi == BLIN_STORE || (op->tmp_y && op->n_w == (op->epi == BLIN_SWIGLU ? 2 : 1)));
    const void *h = op->x;
    if (op->norm) {
        be->ops->rmsnorm(be, op->x, op->norm, op->n, (int)op->w[0]->cols, op->eps, op->tmp_h);
        h = op->tmp_h;
    }
    const size_t out = (size_t)op->n * (size_t)op->w[0]->rows;
    switch (op->epi) {
    case BLIN_STORE:
        for (int j = 0; j < op->n_w; j++) be->ops->matmul(be, h, op->w[j], NULL, op->n, op->y[j]);
        break;
    case BLIN_ADD:
        be->ops->matmul(be, h, op->w[0], NULL, op->n, op->tmp_y);
        be->ops->add(be, op->y[0], op->tmp_y, out);
        break;
    case BLIN_SWIGLU:
        be->ops->matmul(be, h, op->w[0], NULL, op->n, op->y[0]);
        be->ops->matmul(be, h, op->w[1], NULL, op->n, op->tmp_y);
        be->ops->swiglu(be, op->y[0], op->tmp_y, out, op->y[0]);
        break;
    }
}

/* profile names of the linear variants: [norm][epilogue], stores by weight count (q/k/v = 3) */
static const char *const k_linear_names[2][3] = {
    {"linear", "linear+add", "linear+swiglu"},
    {"rmsnorm+linear", "rmsnorm+linear+add", "rmsnorm+linear+swiglu"},
};
static const char *const k_linear_store_names[2][3] = {
    {"linear", "linear x2", "linear x3"},
    {"rmsnorm+linear", "rmsnorm+linear x2", "rmsnorm+linear x3"},
};

void backend_linear(backend *be, const blinear *op) {
    const int t = backend_prof_begin(be, op->epi == BLIN_STORE && op->n_w >= 1 && op->n_w <= 3
                                             ? k_linear_store_names[op->norm != NULL][op->n_w - 1]
                                             : k_linear_names[op->norm != NULL][op->epi]);
    if (be->ops->linear) be->ops->linear(be, op);
    else backend_linear_unfused(be, op);
    backend_prof_end(be, t);
}

void backend_swiglu(backend *be, const void *gate, const void *up, size_t n, void *out) {
    PROF(be, "swiglu", be->ops->swiglu(be, gate, up, n, out));
}
void backend_add(backend *be, void *x, const void *y, size_t n) { PROF(be, "add", be->ops->add(be, x, y, n)); }
void backend_act_zero(backend *be, void *p, size_t n) {
    if (be->ops->act_zero) be->ops->act_zero(be, p, n);
    else memset(p, 0, n * dtype_size(backend_act_dtype(be)));
}
void backend_host_parallel_for(backend *be, int64_t n, int64_t grain, backend_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (be->ops->host_parallel_for && n > grain) {
        be->ops->host_parallel_for(be, n, grain, fn, arg);
        return;
    }
    fn(arg, 0, n);
}
void backend_get_rows(backend *be, const void *x, int d, const int32_t *rows, int n, void *out) {
    PROF(be, "get_rows", be->ops->get_rows(be, x, d, rows, n, out));
}

void backend_moe_combine(backend *be, void *x, const void *y, int d, int n, int k, const int32_t *slot,
                         const float *w) {
    if (n > 0 && k > 0) PROF(be, "moe_combine", be->ops->moe_combine(be, x, y, d, n, k, slot, w));
}

void backend_store_rows(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start, const int32_t *pos,
                        void *const *dst) {
    PROF(be, "store_rows", be->ops->store_rows(be, x, d, n_seqs, seq_start, pos, dst));
}

unsigned backend_packs(backend *be) {
    return backend_has(be, BACKEND_CAP_FUSED) && be->ops->packs ? be->ops->packs(be) : 0;
}

void backend_rope_kv(backend *be, const brope_kv *op) {
    NEED(be, rope_kv);
    PROF(be, op->k_dst ? "rope+store_kv" : "rope q+k", be->ops->rope_kv(be, op));
}

void backend_add_rmsnorm(backend *be, void *x, const void *y, const bweight *w, int n, int d, float eps, void *out) {
    NEED(be, add_rmsnorm);
    PROF(be, "add+rmsnorm", be->ops->add_rmsnorm(be, x, y, w, n, d, eps, out));
}

/* ---------------------------------------------------------------- MoE dispatch */

bmoe *backend_moe_prepare(backend *be, const bmoe_desc *desc) {
    return backend_has(be, BACKEND_CAP_MOE) ? be->ops->moe_prepare(be, desc) : NULL;
}

void backend_moe_release(backend *be, bmoe *m) {
    if (m) be->ops->moe_release(be, m);
}

size_t backend_moe_workspace(backend *be, const bmoe *m, int n) {
    NEED(be, moe_workspace);
    return be->ops->moe_workspace(be, m, n);
}

void backend_moe_forward(backend *be, const bmoe *m, const void *logits, const void *h, int n, void *x, void *ws) {
    NEED(be, moe_forward);
    if (n > 0) PROF(be, "moe_forward", be->ops->moe_forward(be, m, logits, h, n, x, ws));
}

/* ---------------------------------------------------------------- graphs */

void backend_graph_begin(backend *be) {
    NEED(be, graph_begin);
    backend_prof_pause(be, 1);
    be->ops->graph_begin(be);
}
backend_graph *backend_graph_end(backend *be) {
    NEED(be, graph_end);
    backend_prof_pause(be, 0);
    return be->ops->graph_end(be);
}
void backend_graph_launch(backend *be, backend_graph *g) {
    NEED(be, graph_launch);
    be->ops->graph_launch(be, g);
}
int backend_graph_stale(backend *be, const backend_graph *g) {
    NEED(be, graph_stale);
    return be->ops->graph_stale(be, g);
}
void backend_graph_free(backend *be, backend_graph *g) {
    if (g) {
        NEED(be, graph_free);
        be->ops->graph_free(be, g);
    }
}

/* ---------------------------------------------------------------- device decode primitives */

void *backend_buf_alloc(backend *be, size_t bytes) {
    NEED(be, buf_alloc);
    return be->ops->buf_alloc(be, bytes);
}
void backend_buf_free(backend *be, void *p) {
    if (p) {
        NEED(be, buf_free);
        be->ops->buf_free(be, p);
    }
}
void backend_buf_set_async(backend *be, void *dst, const void *src, size_t bytes) {
    NEED(be, buf_set_async);
    be->ops->buf_set_async(be, dst, src, bytes);
}
void backend_buf_get_async(backend *be, void *dst, const void *src, size_t bytes) {
    NEED(be, buf_get_async);
    be->ops->buf_get_async(be, dst, src, bytes);
}
void *backend_host_alloc(backend *be, size_t bytes) {
    NEED(be, host_alloc);
    return be->ops->host_alloc(be, bytes);
}
void backend_host_free(backend *be, void *p) {
    if (p) {
        NEED(be, host_free);
        be->ops->host_free(be, p);
    }
}
backend_event *backend_event_new(backend *be) {
    NEED(be, event_new);
    return be->ops->event_new(be);
}
void backend_event_free(backend *be, backend_event *ev) {
    if (ev) {
        NEED(be, event_free);
        be->ops->event_free(be, ev);
    }
}
void backend_event_record(backend *be, backend_event *ev) {
    NEED(be, event_record);
    be->ops->event_record(be, ev);
}
int backend_event_query(backend *be, backend_event *ev) {
    NEED(be, event_query);
    return be->ops->event_query(be, ev);
}
void backend_event_wait(backend *be, backend_event *ev) {
    NEED(be, event_wait);
    be->ops->event_wait(be, ev);
}
double backend_event_elapsed_ms(backend *be, backend_event *a, backend_event *b) {
    NEED(be, event_elapsed_ms);
    return be->ops->event_elapsed_ms(be, a, b);
}
void backend_alias_add(backend *be, const void *host, const void *dev, size_t bytes) {
    NEED(be, alias_add);
    be->ops->alias_add(be, host, dev, bytes);
}
void backend_alias_clear(backend *be) {
    NEED(be, alias_clear);
    be->ops->alias_clear(be);
}
void backend_decode_begin(backend *be, const bdec_launch *l) {
    NEED(be, decode_begin);
    PROF(be, "decode_begin", be->ops->decode_begin(be, l));
}
void backend_decode_sample(backend *be, const bdec_launch *l, const void *logits) {
    NEED(be, decode_sample);
    PROF(be, "decode_sample", be->ops->decode_sample(be, l, logits));
}
void backend_decode_commit(backend *be, const bdec_launch *l) {
    NEED(be, decode_commit);
    PROF(be, "decode_commit", be->ops->decode_commit(be, l));
}

/* ---------------------------------------------------------------- collectives */

comm *backend_comm_join(backend *be, const uint8_t id[COMM_ID_BYTES], int rank, int world,
                        int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err) {
    NEED(be, comm_join);
    return be->ops->comm_join(be, id, rank, world, cancelled, user, timeout_ms, err);
}
