/*
 * backend.h — the small ops interface every compute backend implements (cpu/, cuda/).
 *
 * Forward passes (model/llada.c, ...) are written once against these ops. A backend owns device
 * memory: weights are "uploaded" (the CPU backend just keeps a view into the mmapped checkpoint,
 * converting bf16/f16 per tile inside matmul; CUDA copies to HBM), activations are buffers from
 * act_alloc() in the backend's activation dtype (f32 on CPU, bf16 on CUDA). Index arrays (token
 * ids, positions, sequence offsets, row lists) are always passed as HOST pointers; a device backend
 * stages them itself. Shapes are row-major, rows first: x[n, d] means n rows of d elements.
 *
 * A backend is an opaque handle: callers use the functions below and ask what it can do through
 * its capabilities (backend_has), never through its name. The ops table behind the handle, with
 * its optional members, is in backend_impl.h, which only backend implementations (cpu/, cuda/) and
 * their tests include.
 *
 * Threading: one backend instance is driven by one engine thread at a time; ops may use internal
 * worker threads (the CPU backend's one pool, cpu_pool; streams on CUDA). Ops return nothing: a failing op is a
 * bug or an impossible setup and aborts (CHECK); per-request problems are caught before the forward.
 */
#ifndef UM_BACKEND_H
#define UM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/comm.h"
#include "util/dtype.h"
#include "util/err.h"

typedef struct backend backend;

/* A weight matrix or vector resident on the backend. Linear weights are [rows=out, cols=in]. */
typedef struct bweight {
    const void *data;        /* device pointer (CPU: points into the mmapped checkpoint) */
    enum dtype  type;        /* storage dtype */
    int64_t     rows, cols;  /* vectors: rows = 1 */
    void       *owned;       /* backend allocation to free, or NULL for views */
    const float *scale;      /* DTYPE_F8_E4M3 only (else NULL): f32 multipliers, one per block of
                                scale_rows x scale_cols elements, row-major
                                [ceil(rows/scale_rows), ceil(cols/scale_cols)], in the backend's
                                memory (owned with `owned`): element = fp8 value x its block's scale */
    int          scale_rows, scale_cols; /* the block: (1, cols) = one scale per output channel
                                (--quant fp8); (128, 128) = the common FP8 checkpoint layout */
} bweight;

/* Host data of one weight handed to backend_weight_upload: a dense row-major [rows, cols] array.
 * The caller has checked that type is F32, BF16 or F16 — or, on a backend with BACKEND_CAP_QUANT,
 * Q8_0 / Q4_0 (rows of cols / 32 blocks, util/quant.h; cols a multiple of 32) — and that the shape
 * matches the data. */
typedef struct bweight_src {
    const char *name;        /* for messages (the checkpoint tensor's name); not owned */
    const void *data;        /* host memory, rows * cols elements of type; not owned. A host backend
                                may keep a view into it: it must outlive the bweight (unless
                                backend_weight_keeps_source says the backend took a copy) */
    enum dtype  type;        /* DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_Q8_0 or DTYPE_Q4_0, or
                                DTYPE_F8_E4M3 (BACKEND_CAP_FP8 only) with scale below */
    int64_t     rows, cols;  /* vectors: rows = 1 */
    int         rows_only;   /* 1: only ever read by row (backend_embed), never a matmul operand, so a
                                backend need not build its matmul layout (CPU: bf16 packing) */
    enum dtype  quant;       /* DTYPE_Q8_0 / DTYPE_Q4_0 (BACKEND_CAP_QUANT only): a matrix operand
                                stored quantized to this type, from a float source (a source already
                                quantized keeps its own type). DTYPE_F8_E4M3 (BACKEND_CAP_FP8 only):
                                from a float source, stored as FP8 with one scale per output
                                channel (amax / 448 of the row). Any other value (zero-initialised:
                                F32): stored as the backend stores type */
    const float *scale;      /* DTYPE_F8_E4M3: host f32 [ceil(rows/scale_rows), ceil(cols/scale_cols)]
                                (a checkpoint's weight_scale_inv); not owned. NULL otherwise */
    int          scale_rows, scale_cols; /* its block shape (bweight.scale_rows / scale_cols) */
    int          n_parts;    /* > 0 (a joined weight, backend_packs; F32 / BF16 / F16 stored as the
                                backend stores them, no quant): data is NULL and the rows arrive in
                                n_parts blocks, part_data[j] holding part_rows[j] rows (summing to
                                rows), copied in order without joining them on the host first */
    const void *const *part_data;
    const int64_t     *part_rows;
} bweight_src;

/* Attention over a batch of variable-length sequences packed row after row (varlen layout).
 * Queries of sequence s are rows q_start[s]..q_start[s+1]-1 of q/out; its keys/values are rows
 * k_start[s]..k_start[s+1]-1 of k/v (equal to the query rows when there is no cache) — or, for a
 * sequence whose keys live in its own buffers (a KV cache), rows 0..k_start[s+1]-k_start[s]-1 of
 * k_seq[s] / v_seq[s]. k_start also numbers the keys for k_pos / key_valid in both cases. */
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
    const void *const *k_seq;    /* [n_seqs] host array of device pointers, or NULL: a non-NULL
                                    k_seq[s] holds sequence s's keys (row stride n_kv_heads*head_dim)
                                    instead of k; v_seq[s] its values (set exactly where k_seq is) */
    const void *const *v_seq;
} attn_params;

/* ---------------------------------------------------------------- devices and instances */

/* Parse a --device name without opening anything: 0 for "cpu" (and NULL), 1 for an accelerator
 * ("cuda", "cuda:N"; *index = N, 0 for "cuda"), -1 when the name is unknown. index may be NULL. */
int      backend_device_parse(const char *device, int *index);
/* 1 when device names a are b are the same device ("cuda" and "cuda:0"); 0 otherwise or when either
 * is unknown. */
int      backend_device_same(const char *a, const char *b);
/* What the operator chooses about the backends a process opens: serve's --cpu-pin / --cuda-fuse
 * (server/server_config.c), the same flags of logits, generate and bench. The zeroed struct is the
 * default of every field. */
typedef struct backend_options {
    int                      cpu_pin;     /* CPU: 1 = pool slot i pinned to the i-th CPU the process
                                             may use; 0 = not pinned (docs/cpu-kernels.md) */
    int                      cuda_unfused; /* CUDA: 1 = --cuda-fuse off: backend_rope_kv and
                                              backend_add_rmsnorm run as their single kernels (an
                                              A/B switch, docs/gpu.md); 0 = one fused kernel each */
    int                      cuda_skinny; /* CUDA: 1 = --cuda-skinny on: bf16 products of <= 64 rows on
                                             the skinny kernel; 0 = on cuBLAS (faster on the H200 at
                                             the steps' 32 rows: docs/gpu.md). FP8 weights always
                                             take the skinny kernel */
} backend_options;
/* Use o for the backends backend_init_device opens from now on (process-wide, as
 * backend_cpu_kernels_select: before any backend is opened, on the thread that then opens them). */
void     backend_options_select(const backend_options *o);

/* CPU backend (backend/cpu/). n_threads <= 0 means all cores. backend_cpu_init: the default
 * options; backend_cpu_init_opts: o's CPU fields (NULL = defaults). */
backend *backend_cpu_init(int n_threads);
backend *backend_cpu_init_opts(int n_threads, const backend_options *o);
/* Probes this CPU's features now (else the first CPU backend or kernel choice does): the probe's
 * trials fork, so a process calls it early, before it starts threads of its own. */
void     backend_cpu_probe(void);

/* CPU kernels: what the CPU backend's matrix products of BF16 weights run on (docs/cpu-kernels.md).
 * AMX: AMX-BF16 tiles; AVX512BF16: vdpbf16ps; AVX2: fp32 FMAs on the bf16 weights widened in
 * registers; the three keep the weights bf16 (packed once at upload), cast activations to bf16 and
 * accumulate in fp32 (results within bf16 rounding of the fp32 path).
 * FP32: OpenBLAS sgemm on weights widened to f32 tile by tile — the numerical reference, and the
 * path of F32/F16 weights under every setting. AUTO: chosen per product by its shape and this CPU's
 * ISA (AMX, else AVX512BF16 for every product; with AVX2 only, AVX2 for products of few rows and
 * FP32 above a measured row count; else FP32). Any other value forces that path for every product. */
enum backend_cpu_kernels {
    BACKEND_CPU_KERNELS_AUTO,
    BACKEND_CPU_KERNELS_FP32,
    BACKEND_CPU_KERNELS_AVX512BF16,
    BACKEND_CPU_KERNELS_AMX,
    BACKEND_CPU_KERNELS_AVX2,
};
/* "auto", "fp32", "avx512bf16", "amx", "avx2" -> *out: 0, or -1 when the name is unknown. */
int         backend_cpu_kernels_parse(const char *name, enum backend_cpu_kernels *out);
const char *backend_cpu_kernels_name(enum backend_cpu_kernels k);
/* Use kernels k in the CPU backends created from now on (process-wide; the main thread, before
 * any backend exists; without a call the UNMASK_CPU_KERNELS environment variable, else AUTO).
 * -1 + err (param "cpu-kernels") saying what this CPU lacks when k cannot run here. */
int         backend_cpu_kernels_select(enum backend_cpu_kernels k, um_err *err);
/* The kernels a backend's products use: the one path that runs all of them, AUTO when they are
 * chosen per product by shape (an AVX2-only CPU); FP32 for a non-CPU backend. */
enum backend_cpu_kernels backend_cpu_kernels_of(const backend *be);
/* The backend a --device flag names: NULL/"cpu" -> CPU with n_threads, "cuda" / "cuda:N" -> that
 * GPU (backend/cuda/), with the options of backend_options_select. NULL + err (naming the device)
 * when it is unknown or cannot be opened. */
backend *backend_init_device(const char *device, int n_threads, um_err *err);
/* Free the backend and everything it still owns (NULL: no-op). Weights and activation buffers
 * must have been freed before. */
void     backend_free(backend *be);

/* Instance name as --device spells it ("cpu", "cuda:0"): for messages and logs only. */
const char *backend_name(const backend *be);
/* What the device is ("NVIDIA H100 80GB HBM3"; the CPU backend: "cpu"). */
const char *backend_description(const backend *be);
/* Worker threads of the ops (CPU: the slots of its pool, the engine thread included; 1 on a device
 * backend). */
int         backend_n_threads(const backend *be);
/* dtype of activation buffers (F32 on CPU, BF16 on CUDA). */
enum dtype  backend_act_dtype(const backend *be);

/* Capabilities: optional parts of the ops table (backend_impl.h). */
enum backend_cap {
    BACKEND_CAP_DEVICE_MEMORY = 1 << 0, /* weights and activations live in device memory of limited
                                           size: backend_mem_info / backend_check_fit report it */
    BACKEND_CAP_ASYNC         = 1 << 1, /* ops are queued (backend_synchronize waits for them) */
    BACKEND_CAP_GRAPHS        = 1 << 2, /* backend_graph_* capture and replay op sequences */
    BACKEND_CAP_DEVICE_DECODE = 1 << 3, /* the primitives of the device-resident decode step
                                           (backend_decode.h): buffers, events, aliases, decode kernels */
    BACKEND_CAP_COMM          = 1 << 4, /* backend_comm_join: collectives on the device (NCCL) */
    BACKEND_CAP_MOE           = 1 << 5, /* backend_moe_*: a MoE layer's routing, dispatch and expert
                                           GEMMs on the device, without the host */
    BACKEND_CAP_QUANT         = 1 << 6, /* block-quantized weights (Q8_0, Q4_0): weight_upload takes
                                           them (or quantizes, bweight_src.quant) and every op reads
                                           them (the CPU backend; docs/cpu-kernels.md) */
    BACKEND_CAP_FUSED         = 1 << 7, /* backend_rope_kv and backend_add_rmsnorm: the small ops
                                           around the GEMMs as one op each (fewer launches on a
                                           device; the CUDA backend, docs/gpu.md) */
    BACKEND_CAP_FP8           = 1 << 8, /* FP8 E4M3 weights with block scales: weight_upload takes
                                           them (DTYPE_F8_E4M3 + scale) or quantizes a float matrix
                                           (bweight_src.quant); matmul / linear read them (CUDA) */
};
/* 1 when the backend offers every capability in caps (a mask of backend_cap). */
int backend_has(const backend *be, unsigned caps);

/* Free and total device memory in bytes; 0 / 0 on a host-memory backend. */
void backend_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes);
/* "Does the model fit": weight_bytes (as stored on the device) + act_bytes + the backend's own
 * reserve against its free memory. 0 when it fits (always on a host-memory backend), -1 +
 * UM_ERR_RESOURCE naming the numbers when not. */
int  backend_check_fit(backend *be, uint64_t weight_bytes, uint64_t act_bytes, um_err *err);
/* Weight upload progress: total bytes the next uploads will write and a label for the progress
 * line (0 = unknown). No-op where uploads are views. */
void backend_set_upload_total(backend *be, uint64_t bytes, const char *label);
/* Device-to-device copy bandwidth in bytes/s (read + written) over a buffer of `bytes`, median of
 * `reps` timed copies; 0 where the backend cannot measure it (benchmarks only). */
double backend_mem_bandwidth(backend *be, size_t bytes, int reps);
/* Wait until every queued op finished (no-op on a synchronous backend). */
void backend_synchronize(backend *be);
/* Give cached free device memory back to the driver; returns the bytes released (0 where there is
 * no such cache). Graphs captured before may become stale. */
size_t backend_trim(backend *be);

/* ---------------------------------------------------------------- ops (see backend_impl.h) */

/* Upload one weight: a device copy (CUDA: bf16 in HBM) or a view of src->data (CPU, when aligned).
 * -1 + err (UM_ERR_RESOURCE) when device memory runs out; the caller frees with weight_free. */
int   backend_weight_upload(backend *be, const bweight_src *src, bweight *out, um_err *err);
void  backend_weight_free(backend *be, bweight *w);
/* 1 when the backend still reads the host memory w was uploaded from (a view: it must live, and its
 * pages may be read, as long as w); 0 when it made its own copy (packed or quantized on the CPU,
 * device memory), so the caller may free that memory or drop its pages now. */
int   backend_weight_keeps_source(backend *be, const bweight *w);
/* Activation buffers of n elements in backend_act_dtype (freed with backend_act_free). */
void *backend_act_alloc(backend *be, size_t n);
void  backend_act_free(backend *be, void *p);
/* n activation elements -> host f32 (synchronises a queued backend). */
void  backend_act_to_host(backend *be, const void *src, size_t n, float *dst);
/* out[i, :] = wte[ids[i], :] */
void  backend_embed(backend *be, const bweight *wte, const int32_t *ids, int n, void *out);
/* out[i, :] = x[i, :] * rsqrt(mean(x[i]^2) + eps) * w   (x, out: [n, d]; out may equal x) */
void  backend_rmsnorm(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out);
/* y[n, w.rows] = x[n, w.cols] . w^T (+ bias[w.rows] if bias) */
void  backend_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y);
/* rotate-half RoPE in place on x[n, n_heads, head_dim], first rot_dim dims of each head */
void  backend_rope(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                   float theta);
/* out[n_q, n_heads*head_dim] = softmax(q k^T * scale + mask) v per sequence and head (GQA) */
void  backend_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v, void *out);
/* A linear layer with what surrounds it fused (one op instead of three or four, so a backend can
 * cast the input once, share it between weights and apply the epilogue while the output is hot):
 *   h = norm ? RMSNorm(x, norm, eps) : x                      x: [n, w[0].cols]
 *   BLIN_STORE   y[j] = h . w[j]^T  for j < n_w (1..3, all with w[0].cols inputs)
 *   BLIN_ADD     y[0] += h . w[0]^T  (n_w = 1: a residual add)
 *   BLIN_SWIGLU  y[0] = silu(h . w[0]^T) * (h . w[1]^T)  (n_w = 2, same shapes)
 * Results equal the single ops in that order (backend_rmsnorm, backend_matmul, backend_add,
 * backend_swiglu) up to the backend's product rounding. tmp_h ([n, w[0].cols], needed with norm;
 * may equal x) and tmp_y ([n, w[0].rows], needed with ADD and SWIGLU) are activation buffers for a
 * backend that runs the single ops; a fused one may leave them untouched; their contents afterwards
 * are unspecified. No y may overlap x, tmp_h or tmp_y. */
enum blinear_epi { BLIN_STORE, BLIN_ADD, BLIN_SWIGLU };
typedef struct blinear {
    const void      *x;
    int              n;          /* rows */
    const bweight   *norm;       /* [1, w[0].cols] or NULL */
    float            eps;
    enum blinear_epi epi;
    int              n_w;
    const bweight   *w[3];
    void            *y[3];       /* y[j]: [n, w[j].rows] */
    void            *tmp_h, *tmp_y;
    int              wide_tmp;   /* BLIN_SWIGLU: tmp_y holds [n, w[0].rows + w[1].rows] — the two
                                    products may then run as one where w[1] continues w[0]'s rows
                                    (BACKEND_PACK_GATE_UP) */
} blinear;
void  backend_linear(backend *be, const blinear *op);
/* out[i] = silu(gate[i]) * up[i] (out may equal gate) */
void  backend_swiglu(backend *be, const void *gate, const void *up, size_t n, void *out);
/* x[i] += y[i] */
void  backend_add(backend *be, void *x, const void *y, size_t n);
/* p[0 .. n) = 0 (activation elements) */
void  backend_act_zero(backend *be, void *p, size_t n);
/* out[i, :] = x[rows[i], :], rows of d elements */
void  backend_get_rows(backend *be, const void *x, int d, const int32_t *rows, int n, void *out);
/* Scatter packed rows into per-sequence buffers (a KV cache write): for every sequence s with
 * dst[s] != NULL, dst[s][pos[i], :] = x[i, :] for its rows i in seq_start[s]..seq_start[s+1]-1, rows
 * of d elements. dst: [n_seqs] host array of device pointers; pos: [seq_start[n_seqs]] host. */
void  backend_store_rows(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start, const int32_t *pos,
                         void *const *dst);

/* The ops between the q/k/v products and the attention as one op (BACKEND_CAP_FUSED); the same as
 *   backend_rope(q, n, n_heads, head_dim, rot_dim, pos, theta);
 *   backend_rope(k, n, n_kv_heads, head_dim, rot_dim, pos, theta);
 *   backend_store_rows(k, n_kv_heads*head_dim, n_seqs, seq_start, pos, k_dst);   only when k_dst
 *   backend_store_rows(v, n_kv_heads*head_dim, n_seqs, seq_start, pos, v_dst);   only when k_dst
 * (results bit-identical on one backend). k_dst, v_dst: NULL (no KV cache: the two ropes only) or
 * [n_seqs] host arrays of device pointers as backend_store_rows's dst.
 * With qkv (one product of q|k|v-concatenated weights, BACKEND_PACK_QKV): q, k and v are first
 * unpacked from its rows — q, k, v outputs then — and the above runs on them (one launch still). */
typedef struct brope_kv {
    void          *q, *k;              /* [n, n_heads, head_dim], [n, n_kv_heads, head_dim]: rotated in place */
    void          *v;                  /* [n, n_kv_heads, head_dim]: read (written only with qkv) */
    const void    *qkv;                /* NULL, or [n, ld_qkv] rows: q heads | k heads | v heads */
    int            ld_qkv;             /* elements between qkv's rows (>= (n_heads + 2 n_kv_heads) head_dim) */
    int            n, n_heads, n_kv_heads, head_dim, rot_dim;
    const int32_t *pos;                /* [n] host */
    float          theta;
    int            n_seqs;             /* with k_dst: the sequences of seq_start */
    const int32_t *seq_start;          /* [n_seqs+1] host, seq_start[n_seqs] == n; with k_dst */
    void *const   *k_dst, *const *v_dst;
} brope_kv;
void  backend_rope_kv(backend *be, const brope_kv *op);
/* Weights a model should join so that products of one input run as one (backend_packs). */
enum backend_pack {
    BACKEND_PACK_QKV     = 1 << 0, /* a layer's q, k, v as one matrix (rows q | k | v): one product,
                                      whose rows backend_rope_kv unpacks (brope_kv.qkv) */
    BACKEND_PACK_GATE_UP = 1 << 1, /* gate and up as one matrix (rows gate | up; the two weights are
                                      views of it): BLIN_SWIGLU with wide_tmp runs one product */
};
/* The BACKEND_PACK_* a model should use, asked at load: where one larger product streams its weights
 * faster than several (CUDA, with BACKEND_CAP_FUSED; the A/B switch UNMASK_CUDA_PACK, docs/gpu.md);
 * 0 elsewhere. */
unsigned backend_packs(backend *be);
/* The residual add and the next RMSNorm as one op (BACKEND_CAP_FUSED): backend_add(x, y, n*d) then
 * backend_rmsnorm(x, w, n, d, eps, out), bit-identical on one backend. out may equal y, not x. */
void  backend_add_rmsnorm(backend *be, void *x, const void *y, const bweight *w, int n, int d, float eps, void *out);

/* Mixture-of-experts combine: x[t, :] += sum_j w[t*k + j] * y[slot[t*k + j], :] for t < n — each
 * token's k weighted expert outputs (rows of y, d elements) summed in fp32, then added to its row
 * of x once (rounded once to the activation dtype); a slot < 0 adds nothing. slot, w: host arrays
 * of n*k entries. y must not overlap x. */
void  backend_moe_combine(backend *be, void *x, const void *y, int d, int n, int k, const int32_t *slot,
                          const float *w);

/* Run fn(arg, lo, hi) over [0, n) in chunks of grain on the host threads this backend computes
 * with, the calling thread included: the CPU backend's pool (so host loops of the layers above,
 * such as sampling a step's rows, share the threads the forward uses instead of starting others
 * that would spin beside them); the CUDA backend's host OpenMP threads. A backend without host
 * threads runs it on the calling thread. Chunks may run in any order and concurrently; fn must
 * not call into this backend. */
typedef void (*backend_range_fn)(void *arg, int64_t lo, int64_t hi);
void  backend_host_parallel_for(backend *be, int64_t n, int64_t grain, backend_range_fn fn, void *arg);

/* ---------------------------------------------------------------- MoE dispatch (BACKEND_CAP_MOE) */

/* The routed experts of one MoE layer as a backend's device dispatch runs them (model/moe.c fills
 * it from the model config; docs/model-spec.md §2c gives the routing rules). */
enum bmoe_router {
    BMOE_SOFTMAX,        /* softmax over the experts (+ bias); the top_k values are the weights */
    BMOE_SIGMOID_GROUP,  /* sigmoid + bias selects within the topk_group best of n_group groups; the
                            unbiased sigmoids, renormalised (top_k > 1), times routed_scale */
};
typedef struct bmoe_desc {
    enum bmoe_router router;
    int              n_experts, top_k;
    int              n_group, topk_group;   /* BMOE_SIGMOID_GROUP (n_experts % n_group == 0) */
    float            routed_scale;          /* BMOE_SIGMOID_GROUP */
    const float     *bias;                  /* [n_experts] host f32 expert bias, or NULL (copied) */
    int              e0, e1;                /* experts held by this backend: [e0, e1) */
    const bweight   *gate, *up, *down;      /* [n_experts] arrays of uploaded weights [ffn, d], [ffn, d],
                                               [d, ffn]; only [e0, e1) are read */
} bmoe_desc;
typedef struct bmoe bmoe;
/* The backend's dispatch of one layer (device copies of the bias and of the expert weight tables),
 * or NULL when it has none: no BACKEND_CAP_MOE, or a shape its kernels do not take (the caller then
 * routes on the host with the ops above). Load time, never during a graph capture. */
bmoe  *backend_moe_prepare(backend *be, const bmoe_desc *desc);
void   backend_moe_release(backend *be, bmoe *m);
/* Activation elements of the workspace backend_moe_forward needs for n tokens. */
size_t backend_moe_workspace(backend *be, const bmoe *m, int n);
/* x[t, :] += sum_j w_tj * expert_{e_tj}(h[t, :]) for t < n, the k experts e_tj and weights w_tj
 * routed from logits[t, :] (logits = h · routerᵀ, activations [n, n_experts]); experts outside
 * [e0, e1) add nothing (a tensor-parallel rank's partial sum). expert(h) = down(silu(gate h) * up h)
 * with the rounding of backend_linear's SwiGLU and backend_matmul; the sum is backend_moe_combine's.
 * Enqueued only: no host synchronisation, capturable into a graph. ws: an activation buffer of
 * backend_moe_workspace(n) elements. */
void   backend_moe_forward(backend *be, const bmoe *m, const void *logits, const void *h, int n, void *x, void *ws);

/* ---------------------------------------------------------------- graphs (BACKEND_CAP_GRAPHS) */

/* Everything the backend enqueues between begin and end is captured into a graph (index arrays are
 * staged into buffers the graph owns; act_to_host is not allowed inside). Run one uncaptured
 * forward first so activation buffers exist. */
typedef struct backend_graph backend_graph;
void           backend_graph_begin(backend *be);
backend_graph *backend_graph_end(backend *be);
/* Replay (aborts on a stale graph). */
void           backend_graph_launch(backend *be, backend_graph *g);
/* 1 when a device buffer the graph may use was freed or replaced since its capture began: replaying
 * it could read freed memory. Recapture or launch directly instead. */
int            backend_graph_stale(backend *be, const backend_graph *g);
/* Free a graph (synchronises: no replay of it is in flight afterwards). NULL: no-op. */
void           backend_graph_free(backend *be, backend_graph *g);

/* ---------------------------------------------------------------- collectives (BACKEND_CAP_COMM) */

/* 1 when backends of `device`'s kind can form a device collective group in this build (GPUs with
 * NCCL); 0 for cpu (its ranks use comm_local) and when the library is missing. */
int   backend_device_comm_available(const char *device);
/* A fresh group id for devices of that kind (rank 0 / node 0 makes it, the others receive it). */
int   backend_device_comm_id(const char *device, uint8_t id[COMM_ID_BYTES], um_err *err);
/* Join group `id` as `rank` of `world` with collectives on this backend's queue; activation-dtype
 * all-reduces. Non-blocking: NULL + err when cancelled(user) becomes true or after timeout_ms
 * (<= 0: 10 minutes), so one failed rank cannot leave the others waiting. cancelled may be NULL. */
comm *backend_comm_join(backend *be, const uint8_t id[COMM_ID_BYTES], int rank, int world,
                        int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err);

#endif /* UM_BACKEND_H */
