/*
 * cuda_internal.h — shared by the files of src/backend/cuda/ (only compiled with UNMASK_HAVE_CUDA): the
 * CUDA_CHECK / CUBLAS_CHECK / NCCL_CHECK macros and the backend's private state.
 *
 * The CHECK macros are for setup failures and bugs (a failing launch, an impossible copy): they
 * print the statement, the error string and file:line, then abort. Conditions a user can cause
 * (no device, model does not fit) are reported as um_err by the callers before reaching them.
 * Threading: as cuda_backend.h.
 */
#ifndef UM_CUDA_INTERNAL_H
#define UM_CUDA_INTERNAL_H

#ifdef UNMASK_HAVE_CUDA

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_dl.h"
#include "um_kernels.h"
#include "util/log.h"

#define CUDA_CHECK(stmt)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (stmt);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            um_abort(__FILE__, __LINE__, "CUDA_CHECK(%s) failed: %s (%s)", #stmt, cudaGetErrorString(e_), \
                     cudaGetErrorName(e_));                                                        \
    } while (0)

#define CUBLAS_CHECK(stmt)                                                                          \
    do {                                                                                            \
        cublasStatus_t s_ = (stmt);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                            \
            um_abort(__FILE__, __LINE__, "CUBLAS_CHECK(%s) failed: %s (%d)", #stmt, cublas_status_name(s_), \
                     (int)s_);                                                                      \
    } while (0)

const char *cublas_status_name(cublasStatus_t s);

/* A bump arena of pinned host memory mirrored by device memory, for staging host index arrays:
 * bytes are written to host[used..], copied to dev[used..] with cudaMemcpyAsync on the stream. */
typedef struct cuda_chunk {
    char       *host;      /* pinned */
    char       *dev;
    size_t      cap, used;
    cudaEvent_t last_use;  /* recorded after the last op that read this chunk (ring mode) */
    int         recorded;
} cuda_chunk;

typedef struct cuda_arena {
    cuda_chunk *chunks;
    int         n, cap, cur;
    int         ring;      /* 1: chunks are reused round-robin after their last_use event;
                              0: grow only (graph-owned arenas live as long as their graph) */
} cuda_arena;

/* A staged array still in the active arena, for cuda_stage to hand out again when the same bytes
 * are staged by a later op (every layer of a forward stages the same sequence starts, positions and
 * cache pointers). Valid while its chunk is not reset: the memo is cleared whenever the arena moves
 * to another chunk, grows, or is switched (capture begin/end). */
typedef struct cuda_stage_memo {
    int    chunk;      /* index in the active arena */
    size_t off, bytes;
} cuda_stage_memo;
#define STAGE_MEMO 16

typedef struct cuda_alias {
    const char *host;
    const char *dev;
    size_t      bytes;
} cuda_alias;

typedef struct cuda_free_block {
    void  *p;
    size_t bytes;
} cuda_free_block;

typedef struct cuda_impl {
    int            device;
    size_t         l2_bytes;           /* the device's L2 cache */
    char           name[256];
    int            cc_major, cc_minor, n_sm;
    cudaStream_t   stream;
    const cublas_fns *cb;              /* cuBLAS entry points (cuda_dl.c) */
    cublasHandle_t cublas;
    void          *cublas_ws;          /* cuBLAS workspace (needed for graph capture) */
    size_t         cublas_ws_bytes;

    cuda_arena     stage;              /* per-op index arrays (ring) */
    cuda_arena    *graph_stage;        /* during capture: arena owned by the graph being captured */
    int            capturing;
    uint64_t       capture_epoch;      /* buf_epoch when the current capture began */
    cuda_stage_memo memo[STAGE_MEMO];  /* [n_memo] arrays staged in the active arena's live chunks */
    int            n_memo, memo_next;  /* entries in use; the next one to replace when full */
    int            memo_off;           /* 1: every cuda_stage copies (tests, A/B) */
    uint64_t       stage_copies, stage_hits;   /* cuda_stage calls that copied / reused a copy */

    /* weight upload: two pinned staging buffers (+ device scratch for F32/F16 -> BF16) */
    void          *up_host[2];
    void          *up_dev[2];
    cudaEvent_t    up_ev[2];
    int            up_used[2];
    size_t         up_chunk;           /* bytes per staging buffer */
    int            up_next;
    uint64_t       up_done, up_total;  /* device bytes uploaded / expected */
    uint64_t       up_shown;           /* last progress mark printed */
    double         up_t0;
    char           up_label[128];

    /* activation allocator: live blocks (pointer -> size) and an exact-size free list */
    cuda_free_block *live_blocks;
    int            n_live, cap_live;
    cuda_free_block *free_blocks;
    int            n_free, cap_free;
    size_t         act_live_bytes;
    uint64_t       buf_epoch;          /* bumped whenever a device buffer a captured graph may read
                                          or write stops being its owner's: an activation block is
                                          act_free'd (its owner replaced or released it; the block
                                          may be handed to someone else or cudaFree'd later) or
                                          released, or the get_rows scratch `tmp` is replaced. A
                                          graph captured at an older epoch may point at such memory:
                                          cuda_graph_stale() says so and it must not be replayed */

    /* RoPE cos/sin table cache */
    int32_t       *rope_pos;           /* host copy of the positions the table was built for */
    int            rope_n, rope_half, rope_pos_cap, rope_valid;
    float          rope_theta;
    float         *rope_tab;           /* current table: rope_own, or inside a graph's arena */
    float         *rope_own;           /* device [rope_own_cap] float2, owned */
    size_t         rope_own_cap;

    /* scratch: overlapping get_rows, act_to_host bounce */
    void          *tmp;
    size_t         tmp_bytes;
    uint16_t      *bounce;             /* pinned */
    size_t         bounce_bytes;

    cuda_alias    *aliases;
    int            n_alias, cap_alias;
    int            force_generic_attn;
    float         *attn_ws;            /* attention key-split partials (umk_attn_split), ATTN_WS_BYTES */
    int            attn_splits;        /* umk_attn_split.force: 0 auto, 1 never, n forced (tests) */
    int            force_host_moe;     /* 1: moe_prepare declines (tests: the host-routed path) */
    int            unfused;            /* 1: rope_kv / add_rmsnorm run their single kernels
                                          (--cuda-fuse off; backend_options.cuda_unfused) */
    int            gemm_cublas;        /* 1: bf16 products of <= 64 rows on cuBLAS too, not the skinny
                                          kernel (--cuda-gemm cublas; an A/B switch) */
    unsigned       pack;               /* BACKEND_PACK_* models loaded now join (UNMASK_CUDA_PACK;
                                          an A/B switch): all by default */
    int            gs_splits;          /* skinny GEMM K ranges forced (gpu_gemm_bench; 0 = its choice) */
    int            gs_last_splits;     /* the K ranges of its last launch */
    float         *gs_ws;              /* skinny GEMM split-K partials, GS_WS_FLOATS */
    unsigned      *gs_count;           /* its per-tile arrival counts, GS_COUNTS, zero between launches */
    uint16_t      *fp8_deq;            /* FP8 weights at > 64 rows: bf16 rows dequantized for cuBLAS,
                                          FP8_DEQ_ELEMS */
} cuda_impl;

static inline cuda_impl *cuda_impl_of(backend *be) { return (cuda_impl *)be->impl; }

/* Make the backend's device current on the calling thread (cached per thread). */
void cuda_use_device(const cuda_impl *ci);

/* BACKEND_CAP_MOE (cuda_moe.c) */
bmoe  *cuda_moe_prepare(backend *be, const bmoe_desc *desc);
void   cuda_moe_release(backend *be, bmoe *m);
size_t cuda_moe_workspace(backend *be, const bmoe *m, int n);
void   cuda_moe_forward(backend *be, const bmoe *m, const void *logits, const void *h, int n, void *x, void *ws);

/* Stage a host array for device reads by the next op (or resolve an alias). */
const void *cuda_stage(cuda_impl *ci, const void *host, size_t bytes);
/* Mark the end of an op that read staged arrays (ring reuse fence). */
void cuda_stage_done(cuda_impl *ci);

#endif /* UNMASK_HAVE_CUDA */
#endif /* UM_CUDA_INTERNAL_H */
