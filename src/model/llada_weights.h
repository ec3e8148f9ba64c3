/*
 * llada_weights.h — what every architecture's weights go through (llada_weights.c), below the
 * forward passes that use them (llada.c, moe.c): finding a checkpoint tensor with its shape
 * checked, and uploading it to a ctx's backend (quantized when the model asks, checkpoint pages
 * released after a backend copy, progress on long loads). Load time, on the thread building the ctx.
 */
#ifndef UM_LLADA_WEIGHTS_H
#define UM_LLADA_WEIGHTS_H

#include "model/model_types.h"
#include "util/err.h"

/* Find tensor `name` with shape [d0] (d1 < 0) or [d0, d1] and a usable dtype; NULL + err naming it. */
const st_tensor *llada_bind_one(const model *m, const char *name, int64_t d0, int64_t d1, um_err *err);
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
    enum dtype quant;         /* LLADA_W_MATRIX weights: DTYPE_Q8_0 / Q4_0, else as stored */
    uint64_t   total;         /* source bytes of the matrices this ctx quantizes (for the progress) */
    uint64_t   done, qbytes;  /* source bytes quantized so far, and the quantized bytes they became */
    uint64_t   t0_ns;
    int        shown;         /* tenths of total reported */
} llada_loader;
/* Upload rows x cols elements of checkpoint tensor t at data (t's own, or a slice or host copy of it;
 * n_elems = rows x cols checked) as kind. Pages of the checkpoint under data are dropped when the
 * backend made its own copy (backend_weight_keeps_source). -1 + err naming the tensor. */
int  llada_upload(llada_loader *ld, const st_tensor *t, const void *data, int64_t rows, int64_t cols, int64_t n_elems,
                  enum llada_wkind kind, bweight *w, um_err *err);
#endif /* UM_LLADA_WEIGHTS_H */
