/*
 * llada_weights.c — finding checkpoint tensors and uploading them to a ctx's backend (see
 * llada_weights.h). Load time, on the thread building the ctx.
 */
#include "model/llada_weights.h"

#include <stdio.h>
#include <string.h>

#include "model/gguf_model.h"
#include "util/log.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- tensor binding */

const st_tensor *llada_bind_one(const model *m, const char *name, int64_t d0, int64_t d1, um_err *err) {
    const st_tensor *t = checkpoint_find(&m->ck, name);
    char label[160];
    if (!t) {
        um_err_set(err, UM_ERR_FORMAT, "%s: missing tensor '%s'", m->dir, model_tensor_label(m, name, label, sizeof label));
        return NULL;
    }
    int ok = d1 < 0 ? (t->ndim == 1 && t->shape[0] == d0)
                    : (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1);
    if (!ok) {
        /* a GGUF file lists dimensions innermost first, as llama.cpp prints them: {cols, rows} */
        const int rev = m->gguf;
        const int64_t want[2] = {d0, d1};
        const int nw = d1 < 0 ? 1 : 2;
        char got[128], exp[64], *p = got;
        p += snprintf(p, sizeof got, "%s", rev ? "{" : "[");
        for (int i = 0; i < t->ndim && p < got + 100; i++)
            p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", i ? ", " : "",
                          (long long)t->shape[rev ? t->ndim - 1 - i : i]);
        snprintf(p, (size_t)(got + sizeof got - p), "%s", rev ? "}" : "]");
        if (nw == 1) snprintf(exp, sizeof exp, rev ? "{%lld}" : "[%lld]", (long long)d0);
        else snprintf(exp, sizeof exp, rev ? "{%lld, %lld}" : "[%lld, %lld]", (long long)want[rev ? 1 : 0],
                      (long long)want[rev ? 0 : 1]);
        um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", m->dir,
                   model_tensor_label(m, name, label, sizeof label), got, exp);
        return NULL;
    }
    if (t->type == DTYPE_OTHER) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; only F32, BF16 and F16 are supported",
                   m->dir, name, t->type_name);
        return NULL;
    }
    return t;
}

/* ---------------------------------------------------------------- upload */

/* Bytes of n elements of t's type. */
static uint64_t tensor_bytes(const st_tensor *t, int64_t n) { return (uint64_t)dtype_row_bytes(t->type, n); }

/* A progress line per tenth of a quantizing load of at least 1 GiB (rank 0 of a group only). */
static void loader_progress(llada_loader *ld) {
    if (ld->total < (1ull << 30) || ld->ctx->shard.rank != 0) return;
    const int tenth = (int)(10 * ld->done / ld->total);
    if (tenth <= ld->shown) return;
    ld->shown = tenth;
    log_info("quantizing weights to %s: %d%% (%.2f of %.2f GiB read), %.1f s", model_quant_name(ld->quant),
             tenth * 10 < 100 ? tenth * 10 : 100, (double)ld->done / (1u << 30), (double)ld->total / (1u << 30),
             (double)(time_now_ns() - ld->t0_ns) * 1e-9);
}

int llada_upload(llada_loader *ld, const st_tensor *t, const void *data, int64_t rows, int64_t cols, int64_t n_elems,
                 enum llada_wkind kind, bweight *w, um_err *err) {
    backend *be = ld->ctx->be;
    memset(w, 0, sizeof *w);
    if (t->type != DTYPE_F32 && t->type != DTYPE_BF16 && t->type != DTYPE_F16 && !dtype_is_quant(t->type))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; only F32, BF16, F16, Q8_0 and Q4_0 are supported",
                          t->name, t->type_name);
    if (dtype_is_quant(t->type) && !backend_has(be, BACKEND_CAP_QUANT))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "tensor '%s' is %s: the %s backend takes F32, BF16 and F16 weights only",
                          t->name, dtype_name(t->type), backend_name(be));
    if (rows <= 0 || cols <= 0 || rows * cols != n_elems)
        return um_err_set(err, UM_ERR_FORMAT, "tensor '%s' has %lld elements, expected %lld x %lld", t->name,
                          (long long)n_elems, (long long)rows, (long long)cols);
    if (dtype_is_quant(t->type) && cols % DTYPE_QBLOCK != 0)
        return um_err_set(err, UM_ERR_FORMAT, "tensor '%s' is %s with rows of %lld elements, not whole blocks of %d",
                          t->name, dtype_name(t->type), (long long)cols, DTYPE_QBLOCK);
    const int quantize = kind == LLADA_W_MATRIX && dtype_is_quant(ld->quant) && !dtype_is_quant(t->type);
    const bweight_src src = {.name = t->name, .data = data, .type = t->type, .rows = rows, .cols = cols,
                             .rows_only = kind == LLADA_W_GATHER, .quant = quantize ? ld->quant : DTYPE_F32};
    if (backend_weight_upload(be, &src, w, err) != 0) return -1;
    const uint64_t bytes = tensor_bytes(t, n_elems);
    if (!backend_weight_keeps_source(be, w)) checkpoint_release(&ld->ctx->m->ck, data, bytes);
    if (quantize) {
        ld->done += bytes;
        ld->qbytes += (uint64_t)rows * dtype_row_bytes(ld->quant, (cols + DTYPE_QBLOCK - 1) / DTYPE_QBLOCK * DTYPE_QBLOCK);
        loader_progress(ld);
    }
    return 0;
}
