/*
 * backend.h — the small ops interface every compute backend implements (cpu/ now, cuda/ later).
 *
 * Forward passes (model/llada.c, ...) are written once against these ops. A backend owns device
 * memory: weights are "uploaded" (the CPU backend just keeps a view into the mmapped checkpoint,
 * converting bf16/f16 per tile inside matmul; CUDA copies to HBM), activations are buffers from
 * act_alloc() in the backend's activation dtype (f32 on CPU, bf16 on CUDA). Index arrays (token
 * ids, positions, sequence offsets, row lists) are always passed as HOST pointers; a device backend
 * stages them itself. Shapes are row-major, rows first: x[n, d] means n rows of d elements.
 *
 * Threading: one backend instance is driven by one engine thread at a time; ops may use internal
 * worker threads (OpenMP / OpenBLAS on CPU, streams on CUDA). Ops return nothing: a failing op is a
 * bug or an impossible setup and aborts (CHECK); per-request problems are caught before the forward.
 */
#ifndef UM_BACKEND_H
#define UM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "model/safetensors.h"
#include "util/dtype.h"
#include "util/err.h"

typedef struct backend backend;

/* A weight matrix or vector resident on the backend. Linear weights are [rows=out, cols=in]. */
typedef struct bweight {
    const void *data;        /* device pointer (CPU: points into the mmapped checkpoint) */
    enum dtype  type;        /* storage dtype */
    int64_t     rows, cols;  /* vectors: rows = 1 */
    void       *owned;       /* backend allocation to free, or NULL for views */
} bweight;

/* Attention over a batch of variable-length sequences packed row after row (varlen layout).
 * Queries of sequence s are rows q_start[s]..q_start[s+1]-1 of q/out; its keys/values are rows
 * k_start[s]..k_start[s+1]-1 of k/v (equal to the query rows when there is no cache). */
typedef struct attn_params {
    int            n_seqs;
    const int32_t *q_start;      /* [n_seqs+1] host */
    const int32_t *k_start;      /* [n_seqs+1] host */
    const int32_t *q_pos;        /* [n_q] absolute positions of query rows (for block_causal) */
    const int32_t *k_pos;        /* [n_k] absolute positions of key rows */
    const uint8_t *key_valid;    /* [n_k] 0 = padding key excluded for every query; NULL = all valid */
    int            block_causal; /* 0: full bidirectional; B > 0: key j visible to query i iff
                                    k_pos[j]/B <= q_pos[i]/B (LLaDA2 block diffusion) */
    int            n_heads, n_kv_heads, head_dim;
    float          scale;        /* usually 1/sqrt(head_dim) */
} attn_params;

typedef struct backend_ops {
    const char *name;

    /* weights: upload a checkpoint tensor (any of F32/BF16/F16) as a [rows, cols] matrix */
    int   (*weight_upload)(backend *be, const st_tensor *t, int64_t rows, int64_t cols, bweight *out,
                           um_err *err);
    void  (*weight_free)(backend *be, bweight *w);

    /* activation buffers of n elements in the backend's activation dtype */
    void *(*act_alloc)(backend *be, size_t n);
    void  (*act_free)(backend *be, void *p);
    /* activation rows -> host f32 (n elements) */
    void  (*act_to_host)(backend *be, const void *src, size_t n, float *dst);

    /* out[i, :] = wte[ids[i], :] */
    void  (*embed)(backend *be, const bweight *wte, const int32_t *ids, int n, void *out);
    /* out[i, :] = x[i, :] * rsqrt(mean(x[i]^2) + eps) * w   (x, out: [n, d]; out may equal x) */
    void  (*rmsnorm)(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out);
    /* y[n, w.rows] = x[n, w.cols] . w^T (+ bias[w.rows] if bias) */
    void  (*matmul)(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y);
    /* rotate-half RoPE in place on x[n, n_heads, head_dim], first rot_dim dims of each head,
     * position pos[i] for row i, inv_freq[j] = theta^(-2j/rot_dim) */
    void  (*rope)(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim,
                  const int32_t *pos, float theta);
    /* out[n_q, n_heads*head_dim] = softmax(q k^T * scale + mask) v, per sequence and head (GQA:
     * q-head h uses kv-head h / (n_heads / n_kv_heads)) */
    void  (*attention)(backend *be, const attn_params *p, const void *q, const void *k,
                       const void *v, void *out);
    /* out[i] = silu(gate[i]) * up[i] for i < n (out may equal gate) */
    void  (*swiglu)(backend *be, const void *gate, const void *up, size_t n, void *out);
    /* x[i] += y[i] for i < n */
    void  (*add)(backend *be, void *x, const void *y, size_t n);
    /* out[i, :] = x[rows[i], :] for i < n, rows of d elements */
    void  (*get_rows)(backend *be, const void *x, int d, const int32_t *rows, int n, void *out);

    void  (*free)(backend *be);
} backend_ops;

struct backend {
    const backend_ops *ops;
    const char        *name;     /* "cpu", "cuda:0" */
    int                n_threads;
    void              *impl;     /* backend private state */
};

/* CPU backend (backend/cpu/). n_threads <= 0 means all cores. */
backend *backend_cpu_init(int n_threads);
/* The backend a --device flag names: NULL/"cpu" -> CPU with n_threads, "cuda" / "cuda:N" -> that
 * GPU (backend/cuda/). NULL + err (naming the device) when it is unknown or cannot be opened. */
backend *backend_init_device(const char *device, int n_threads, um_err *err);
void     backend_free(backend *be);

#endif /* UM_BACKEND_H */
