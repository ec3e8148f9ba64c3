/*
 * llada_weights.c — finding checkpoint tensors and uploading them to a ctx's backend (see
 * llada_weights.h). Load time, on the thread building the ctx.
 */
#include "model/llada_weights.h"

#include <stdio.h>
#include <stdlib.h>
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
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; only F32, BF16, F16 and F8_E4M3 (with "
                   "block scales) are supported", m->dir, name, t->type_name);
        return NULL;
    }
    if (t->type == DTYPE_F8_E4M3) {
        if (t->ndim != 2) {
            um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor '%s' is a vector stored as F8_E4M3; only matrices may be "
                       "FP8 (norms and biases stay F32 / BF16)", m->dir, name);
            return NULL;
        }
        if (!llada_fp8_scale(m, t, err)) return NULL;
    }
    return t;
}

const st_tensor *llada_fp8_scale(const model *m, const st_tensor *t, um_err *err) {
    char name[300];
    snprintf(name, sizeof name, "%s_scale_inv", t->name);
    const st_tensor *s = checkpoint_find(&m->ck, name);
    const int64_t br = m->cfg.fp8_block[0] > 0 ? m->cfg.fp8_block[0] : 128;
    const int64_t bc = m->cfg.fp8_block[1] > 0 ? m->cfg.fp8_block[1] : 128;
    const int64_t want0 = (t->shape[0] + br - 1) / br, want1 = (t->shape[1] + bc - 1) / bc;
    if (!s) {
        um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' is F8_E4M3 but its block scales '%s' are missing (an FP8 "
                   "checkpoint stores [%lld, %lld] F32 scales beside each FP8 matrix)", m->dir, t->name, name,
                   (long long)want0, (long long)want1);
        return NULL;
    }
    if (s->type != DTYPE_F32 && s->type != DTYPE_BF16 && s->type != DTYPE_F16) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s: FP8 block scales '%s' have dtype %s; expected F32 (or BF16 / F16)",
                   m->dir, name, s->type_name);
        return NULL;
    }
    if (s->ndim != 2 || s->shape[0] != want0 || s->shape[1] != want1) {
        char got[64] = "[]";
        if (s->ndim == 1) snprintf(got, sizeof got, "[%lld]", (long long)s->shape[0]);
        else if (s->ndim >= 2) snprintf(got, sizeof got, "[%lld, %lld%s]", (long long)s->shape[0],
                                        (long long)s->shape[1], s->ndim > 2 ? ", ..." : "");
        um_err_set(err, UM_ERR_FORMAT, "%s: FP8 block scales '%s' have shape %s, expected [%lld, %lld]: one per %lld x "
                   "%lld block of the [%lld, %lld] matrix '%s' (quantization_config.weight_block_size%s)", m->dir,
                   name, got, (long long)want0, (long long)want1, (long long)br, (long long)bc,
                   (long long)t->shape[0], (long long)t->shape[1], t->name,
                   m->cfg.fp8 ? " of config.json" : ": config.json names none, 128 x 128 assumed");
        return NULL;
    }
    return s;
}

void llada_host_parts_add(llada_host_parts *h, void *p) {
    h->p = xrealloc(h->p, (size_t)(h->n + 1) * sizeof *h->p);
    h->p[h->n++] = p;
}

void llada_host_parts_free(llada_host_parts *h) {
    for (int i = 0; i < h->n; i++) free(h->p[i]);
    free(h->p);
    memset(h, 0, sizeof *h);
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

/* ---------------------------------------------------------------- FP8 */

/* The block scales of the [rows, cols] block of FP8 tensor t at (row0, col0), as f32 on the host:
 * *grid [ceil(rows / *sr), ceil(cols / *sc)], caller frees. A block on the checkpoint's block
 * boundaries keeps its block shape; one that starts inside a block (a fused q|k|v part, a tensor
 * parallel slice) gets one scale per row (*sr = 1) and / or per column (*sc = 1). */
static float *fp8_block_scales(const model *m, const st_tensor *t, int64_t row0, int64_t col0, int64_t rows,
                               int64_t cols, int *sr, int *sc, um_err *err) {
    const st_tensor *s = llada_fp8_scale(m, t, err);
    if (!s) return NULL;
    const int br0 = m->cfg.fp8_block[0] > 0 ? m->cfg.fp8_block[0] : 128, bc0 = m->cfg.fp8_block[1] > 0 ? m->cfg.fp8_block[1] : 128;
    *sr = row0 % br0 ? 1 : br0;
    *sc = col0 % bc0 ? 1 : bc0;
    const int64_t gr = (rows + *sr - 1) / *sr, gc = (cols + *sc - 1) / *sc, SC = s->shape[1];
    float *all = xmalloc((size_t)s->n_elems * sizeof *all);
    dtype_to_f32(s->type, s->data, all, (size_t)s->n_elems);
    float *grid = xmalloc((size_t)(gr * gc) * sizeof *grid);
    for (int64_t i = 0; i < gr; i++)
        for (int64_t j = 0; j < gc; j++) grid[i * gc + j] = all[(row0 + i * *sr) / br0 * SC + (col0 + j * *sc) / bc0];
    free(all);
    return grid;
}

/* Dequantizing rows of an FP8 block on the host pool: element = fp8 x its block's scale in f32, then
 * stored as f32 (to be quantized) or bf16. */
typedef struct fp8_dequant {
    float          lut[256]; /* fp8_e4m3_to_f32 of every code */
    const uint8_t *src;     /* [rows, cols] FP8 */
    const float   *grid;    /* block scales, [ceil(rows / sr), gc] */
    int64_t        cols, gc;
    int            sr, sc;
    float         *f32;     /* output, or NULL */
    uint16_t      *bf16;    /* output, or NULL */
} fp8_dequant;

static void fp8_dequant_rows(void *arg, int64_t lo, int64_t hi) {
    const fp8_dequant *d = arg;
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t *x = d->src + r * d->cols;
        const float *g = d->grid + r / d->sr * d->gc;
        for (int64_t j = 0; j < d->gc; j++) {   /* one block of columns: one scale */
            const int64_t c0 = j * d->sc, c1 = c0 + d->sc < d->cols ? c0 + d->sc : d->cols;
            const float sj = g[j];
            if (d->f32)
                for (int64_t c = c0; c < c1; c++) d->f32[r * d->cols + c] = d->lut[x[c]] * sj;
            else
                for (int64_t c = c0; c < c1; c++) d->bf16[r * d->cols + c] = f32_to_bf16(d->lut[x[c]] * sj);
        }
    }
}

/* A matrix quantized at load (--quant): its source bytes read and its stored bytes (FP8: a byte per
 * weight and a scale per row; Q8_0 / Q4_0: whole blocks), for the load's progress line. */
static void loader_count_quantized(llada_loader *ld, uint64_t bytes, int64_t rows, int64_t cols) {
    ld->done += bytes;
    const int64_t padded = (cols + DTYPE_QBLOCK - 1) / DTYPE_QBLOCK * DTYPE_QBLOCK;
    ld->qbytes += ld->quant == DTYPE_F8_E4M3 ? (uint64_t)rows * ((uint64_t)cols + 4)
                                             : (uint64_t)rows * dtype_row_bytes(ld->quant, padded);
    loader_progress(ld);
}

/* llada_upload of an FP8 block: as stored (BACKEND_CAP_FP8) or dequantized on the host. */
static int upload_fp8(llada_loader *ld, const st_tensor *t, const void *data, int64_t row0, int64_t col0, int64_t rows,
                      int64_t cols, enum llada_wkind kind, bweight *w, um_err *err) {
    backend *be = ld->ctx->be;
    int sr, sc;
    float *grid = fp8_block_scales(ld->ctx->m, t, row0, col0, rows, cols, &sr, &sc, err);
    if (!grid) return -1;
    const uint64_t bytes = (uint64_t)(rows * cols);
    if (kind != LLADA_W_GATHER && backend_has(be, BACKEND_CAP_FP8)) {   /* kept as stored, never requantized */
        const bweight_src src = {.name = t->name, .data = data, .type = DTYPE_F8_E4M3, .rows = rows, .cols = cols,
                                 .scale = grid, .scale_rows = sr, .scale_cols = sc};
        const int rc = backend_weight_upload(be, &src, w, err);
        free(grid);
        if (rc != 0) return -1;
        if (!backend_weight_keeps_source(be, w)) checkpoint_release(&ld->ctx->m->ck, data, bytes);
        return 0;
    }
    const int quantize = kind == LLADA_W_MATRIX && dtype_is_quant(ld->quant);
    fp8_dequant d = {.src = data, .grid = grid, .cols = cols, .gc = (cols + sc - 1) / sc, .sr = sr, .sc = sc};
    const uint64_t t0 = time_now_ns();
    for (int i = 0; i < 256; i++) d.lut[i] = fp8_e4m3_to_f32((uint8_t)i);
    void *buf = xmalloc((size_t)(rows * cols) * (quantize ? sizeof(float) : sizeof(uint16_t)));
    if (quantize) d.f32 = buf;
    else d.bf16 = buf;
    backend_host_parallel_for(be, rows, 64, fp8_dequant_rows, &d);
    ld->fp8_ns += time_now_ns() - t0;
    free(grid);
    ld->fp8_host++;
    ld->fp8_bytes += bytes;
    const bweight_src src = {.name = t->name, .data = buf, .type = quantize ? DTYPE_F32 : DTYPE_BF16, .rows = rows,
                             .cols = cols, .rows_only = kind == LLADA_W_GATHER, .quant = quantize ? ld->quant : DTYPE_F32};
    if (backend_weight_upload(be, &src, w, err) != 0) {
        free(buf);
        return -1;
    }
    checkpoint_release(&ld->ctx->m->ck, data, bytes);   /* every byte was read into buf */
    if (backend_weight_keeps_source(be, w)) llada_host_parts_add(ld->parts, buf);
    else free(buf);
    if (quantize) loader_count_quantized(ld, bytes, rows, cols);
    return 0;
}

void llada_loader_report(const llada_loader *ld) {
    if (!ld->fp8_host || ld->ctx->shard.rank != 0) return;
    backend *be = ld->ctx->be;
    log_info("%s: %d FP8 weight tensors (%.2f GiB) dequantized on the host (fp8 x block scale, %.1f s) and %s %s: %s",
             ld->ctx->m->dir, ld->fp8_host, (double)ld->fp8_bytes / (1u << 30), (double)ld->fp8_ns * 1e-9,
             dtype_is_quant(ld->quant) ? "quantized to" : "stored as",
             dtype_is_quant(ld->quant) ? model_quant_name(ld->quant) : "bf16",
             backend_has(be, BACKEND_CAP_FP8) ? "the embedding is only gathered by row"
                                              : "this backend has no FP8 kernels (CUDA keeps FP8 weights as stored)");
}

int llada_upload(llada_loader *ld, const st_tensor *t, const void *data, int64_t row0, int64_t col0, int64_t rows,
                 int64_t cols, int64_t n_elems, enum llada_wkind kind, bweight *w, um_err *err) {
    backend *be = ld->ctx->be;
    memset(w, 0, sizeof *w);
    if (t->type != DTYPE_F32 && t->type != DTYPE_BF16 && t->type != DTYPE_F16 && !dtype_is_quant(t->type) &&
        t->type != DTYPE_F8_E4M3)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; only F32, BF16, F16, F8_E4M3, Q8_0 and Q4_0 "
                          "are supported", t->name, t->type_name);
    if (dtype_is_quant(t->type) && !backend_has(be, BACKEND_CAP_QUANT))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "tensor '%s' is %s: the %s backend takes F32, BF16 and F16 weights only",
                          t->name, dtype_name(t->type), backend_name(be));
    if (rows <= 0 || cols <= 0 || rows * cols != n_elems)
        return um_err_set(err, UM_ERR_FORMAT, "tensor '%s' has %lld elements, expected %lld x %lld", t->name,
                          (long long)n_elems, (long long)rows, (long long)cols);
    if (dtype_is_quant(t->type) && cols % DTYPE_QBLOCK != 0)
        return um_err_set(err, UM_ERR_FORMAT, "tensor '%s' is %s with rows of %lld elements, not whole blocks of %d",
                          t->name, dtype_name(t->type), (long long)cols, DTYPE_QBLOCK);
    if (t->type == DTYPE_F8_E4M3) return upload_fp8(ld, t, data, row0, col0, rows, cols, kind, w, err);
    const int quantize = kind == LLADA_W_MATRIX && model_quant_converts(ld->quant) && !dtype_is_quant(t->type);
    const bweight_src src = {.name = t->name, .data = data, .type = t->type, .rows = rows, .cols = cols,
                             .rows_only = kind == LLADA_W_GATHER, .quant = quantize ? ld->quant : DTYPE_F32};
    if (backend_weight_upload(be, &src, w, err) != 0) return -1;
    const uint64_t bytes = tensor_bytes(t, n_elems);
    if (!backend_weight_keeps_source(be, w)) checkpoint_release(&ld->ctx->m->ck, data, bytes);
    if (quantize) loader_count_quantized(ld, bytes, rows, cols);
    return 0;
}

int llada_upload_rows_concat(llada_loader *ld, const st_tensor *const t[], const void *const data[],
                             const int64_t rows[], int n, int64_t cols, enum llada_wkind kind, const char *name,
                             bweight *w, um_err *err) {
    CHECK(n >= 1);
    for (int j = 0; j < n; j++)
        if (t[j]->type != t[0]->type || (t[j]->type != DTYPE_F32 && t[j]->type != DTYPE_BF16 && t[j]->type != DTYPE_F16))
            return 1;
    memset(w, 0, sizeof *w);
    backend *be = ld->ctx->be;
    int64_t total = 0;
    for (int j = 0; j < n; j++) total += rows[j];
    const size_t rb = dtype_row_bytes(t[0]->type, cols);
    const int quantize = kind == LLADA_W_MATRIX && model_quant_converts(ld->quant);
    char *buf = NULL;
    bweight_src src = {.name = name, .type = t[0]->type, .rows = total, .cols = cols,
                       .quant = quantize ? ld->quant : DTYPE_F32};
    if (quantize) {   /* quantized from one host array: the blocks joined here first */
        buf = xmalloc((size_t)total * rb);
        size_t off = 0;
        for (int j = 0; j < n; j++) {
            memcpy(buf + off, data[j], (size_t)rows[j] * rb);
            off += (size_t)rows[j] * rb;
        }
        src.data = buf;
    } else {          /* the backend copies the blocks in order (no host copy) */
        src.n_parts = n;
        src.part_data = data;
        src.part_rows = rows;
    }
    if (backend_weight_upload(be, &src, w, err) != 0) {
        free(buf);
        return -1;
    }
    const int kept = backend_weight_keeps_source(be, w);
    CHECK(!kept || buf);   /* a backend that keeps views never joins (backend_packs) */
    if (!kept)
        for (int j = 0; j < n; j++) checkpoint_release(&ld->ctx->m->ck, data[j], (size_t)rows[j] * rb);
    if (quantize) loader_count_quantized(ld, (uint64_t)total * rb, total, cols);
    if (kept) llada_host_parts_add(ld->parts, buf);
    else free(buf);
    return 0;
}
