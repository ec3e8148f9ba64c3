/*
 * llada_weights.h — what every architecture's weights go through (llada_weights.c), below the
 * forward passes that use them (llada.c, moe.c): finding a checkpoint tensor with its shape
 * checked (an FP8 matrix with its block scales), and uploading it to a ctx's backend (quantized when
 * the model asks; FP8 as stored where the backend has FP8 kernels, else dequantized on the host;
 * checkpoint pages released after a backend copy, progress on long loads). Load time, on the thread
 * building the ctx.
 */
#ifndef UM_LLADA_WEIGHTS_H
#define UM_LLADA_WEIGHTS_H

#include "model/model_types.h"
#include "util/err.h"

/* Find tensor `name` with shape [d0] (d1 < 0) or [d0, d1] and a usable dtype; NULL + err naming it.
 * A matrix stored as F8_E4M3 must have its block scales (llada_fp8_scale). */
const st_tensor *llada_bind_one(const model *m, const char *name, int64_t d0, int64_t d1, um_err *err);
/* The block scales of FP8 matrix t (the common checkpoint layout): tensor "<t's name>_scale_inv"
 * (X.weight -> X.weight_scale_inv), F32 (BF16 / F16 taken too) of shape [ceil(rows / br),
 * ceil(cols / bc)] for the block br x bc of config.json's quantization_config.weight_block_size
 * (128 x 128 when absent): element (i, j) of t = fp8 value x scale[i / br][j / bc]. NULL + err
 * naming the tensor when the scales are missing or of another shape. */
const st_tensor *llada_fp8_scale(const model *m, const st_tensor *t, um_err *err);
/* Host buffers a backend may keep views of (column slices for tensor parallelism, FP8 matrices
 * dequantized on the host): freed with the ctx's weights, after them. */
typedef struct llada_host_parts {
    void **p;   /* [n] owned */
    int    n;
} llada_host_parts;
void llada_host_parts_add(llada_host_parts *h, void *p);
void llada_host_parts_free(llada_host_parts *h);
/* What an uploaded weight is used for: how it is stored on the backend. */
enum llada_wkind {
    LLADA_W_PLAIN,    /* as the checkpoint stores it: norms, biases, the MoE router */
    LLADA_W_MATRIX,   /* the weight of a product: quantized when the model asks (model.quant) */
    LLADA_W_GATHER,   /* only gathered by row (the embedding) */
};
/* The weight upload of one model_ctx (llada_ctx_init, and the MoE layers' in moe.c): the
 * quantization of matrices the model asks for, the release of checkpoint pages a backend copied
 * (so a quantized model never holds its bf16 bytes), and a progress line on long quantizing loads. */
typedef struct llada_loader {
    model_ctx *ctx;
    llada_host_parts *parts;  /* where host copies the backend keeps views of go (the ctx's weights) */
    enum dtype quant;         /* LLADA_W_MATRIX weights: DTYPE_Q8_0 / Q4_0 (BACKEND_CAP_QUANT) or
                                 DTYPE_F8_E4M3 (BACKEND_CAP_FP8) from float sources, else as stored */
    uint64_t   total;         /* source bytes of the matrices this ctx quantizes (for the progress) */
    uint64_t   done, qbytes;  /* source bytes quantized so far, and the quantized bytes they became */
    uint64_t   t0_ns;
    int        shown;         /* tenths of total reported */
    int        fp8_host;      /* FP8 tensors dequantized on the host (no BACKEND_CAP_FP8, or gathered) */
    uint64_t   fp8_bytes;     /* their FP8 bytes */
    uint64_t   fp8_ns;        /* time spent dequantizing them */
} llada_loader;
/* Upload rows x cols elements of checkpoint tensor t at data as kind: the block of t starting at
 * row row0, column col0 (t's own bytes, or a host copy of that block; n_elems = rows x cols checked).
 * Pages of the checkpoint under data are dropped when the backend made its own copy
 * (backend_weight_keeps_source). An FP8 tensor (with its block scales, cut to the block) goes to
 * a backend with BACKEND_CAP_FP8 as stored, unless only gathered; anywhere else it is dequantized on
 * the host (fp8 x scale in f32, stored as bf16, or quantized from the f32 values when ld->quant is
 * Q8_0 / Q4_0). -1 + err naming the tensor. */
int  llada_upload(llada_loader *ld, const st_tensor *t, const void *data, int64_t row0, int64_t col0, int64_t rows,
                  int64_t cols, int64_t n_elems, enum llada_wkind kind, bweight *w, um_err *err);
/* Upload n row blocks as one [sum rows, cols] weight, in order: block j is rows[j] rows of tensor
 * t[j] at data[j] (a checkpoint tensor or this rank's rows of it), which the backend copies block by
 * block (bweight_src.n_parts; quantized — ld->quant — they are joined on the host first): q, k and v
 * or gate and up as one product (backend_packs); name labels it. Only F32 / BF16 / F16 tensors of one
 * dtype are taken: 1 (nothing done) for any other, 0 when uploaded, -1 + err on failure. */
int  llada_upload_rows_concat(llada_loader *ld, const st_tensor *const t[], const void *const data[],
                              const int64_t rows[], int n, int64_t cols, enum llada_wkind kind, const char *name,
                              bweight *w, um_err *err);
/* The line saying the FP8 weights were dequantized on the host (once per load, rank 0), if any were. */
void llada_loader_report(const llada_loader *ld);
#endif /* UM_LLADA_WEIGHTS_H */
