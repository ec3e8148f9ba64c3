/*
 * cpu_internal.h — shared state and small vectorisable math helpers of the CPU backend
 * (the files in backend/cpu/). Not part of the backend interface: other layers use backend.h only
 * (unit tests may include this to check the helpers).
 *
 * Does not: allocate device memory (there is none), talk to other backends.
 * Threading: the cpu_impl is driven by the one engine thread that owns the backend; the per-slot
 * scratch buffers are each touched only by the pool slot (cpu_pool.h) whose number indexes them.
 */
#ifndef UM_CPU_INTERNAL_H
#define UM_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_build.h"
#include "backend/cpu/cpu_elem.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_mem.h"
#include "backend/cpu/cpu_pool.h"
#include "backend/cpu/cpu_qgemm.h"

/* One growable f32 buffer per pool slot, padded to a cache line against false sharing. */
typedef struct cpu_tbuf {
    float  *p;        /* [cap] owned, 64-byte aligned */
    size_t  cap;      /* floats */
    char    pad[64 - sizeof(float *) - sizeof(size_t)];
} cpu_tbuf;

/* What bweight.owned points to for a CPU weight: the aligned copy of a misaligned source and the
 * packed layout of the bf16 kernels. bweight.data stays the row-major view (embed rows and the
 * fp32 path read it) — except for a quantized matrix (qpacked), whose packed blocks are its only
 * copy: bweight.data then points at them and nothing reads the source. */
typedef struct cpu_wmem {
    void       *copy;       /* aligned copy of the source, or NULL (data is a view of the source) */
    cpu_packed  packed;     /* packed.p == NULL: not packed */
    cpu_qpacked qpacked;    /* qpacked.p == NULL: not quantized (cpu_qgemm.h) */
} cpu_wmem;

typedef struct cpu_impl {
    int       n_threads;
    cpu_pool *pool;         /* the one pool every parallel loop of this backend runs on */
    enum backend_cpu_kernels kernels;   /* the path of every product, or AUTO: chosen per product by shape */
    const cpu_gemm_kernel *gemm;        /* the bf16 kernel family of (some) products, NULL: fp32 only */
    int64_t   gemm_max_m;   /* products of more rows than this run on the fp32 path (INT64_MAX: none) */
    int64_t   gemm_wide_k;      /* products of at least this many inputs use gemm_max_m_wide instead */
    int64_t   gemm_max_m_wide;  /* rows, as gemm_max_m, for products of gemm_wide_k or more inputs */
    const cpu_gemm_kernel *attn;        /* attention's kernel family, NULL: fp32 sgemms */
    void     *abuf;         /* activations of the current product (cpu_gemm.h layout, the family's type) */
    size_t    abuf_cap;     /* bytes */
    const cpu_qgemm_kernel *qgemm;   /* the int8 family of quantized weights (never NULL) */
    void     *qbuf;         /* quantized activations of the current product (cpu_qact_bytes) */
    size_t    qbuf_cap;     /* bytes */
    cpu_tbuf *wtile;        /* [n_threads] converted weight tiles (fp32 matmul) */
    cpu_tbuf *scores;       /* [n_threads] attention score tiles */
    cpu_tbuf  attn_kv;      /* bf16 attention: every (sequence, kv head)'s packed K and Vᵀ (driving thread) */
    /* RoPE cos/sin table of the last call, reused while positions/theta/rot_dim are unchanged
     * (q and k of every layer share one table per forward). */
    int32_t  *rope_pos;     /* [rope_n] positions the table was built for */
    float    *rope_cos;     /* [rope_n, rope_half] */
    float    *rope_sin;     /* [rope_n, rope_half] */
    int       rope_n, rope_half;
    int       rope_cap;     /* floats allocated in rope_cos / rope_sin */
    int       rope_pos_cap; /* entries allocated in rope_pos */
    float     rope_theta;
    char     *description;  /* "cpu (<kernels> kernels)", owned */
    cpu_mem_cache act_cache; /* freed big activation buffers / KV slots, kept mapped for reuse */
} cpu_impl;

static inline cpu_impl *cpu_impl_of(backend *be) { return (cpu_impl *)be->impl; }

/* The packed layout of w, or NULL when it has none (F32/F16, vectors, fp32 path, gather-only). */
static inline const cpu_packed *cpu_weight_packed(const bweight *w) {
    const cpu_wmem *m = (const cpu_wmem *)w->owned;
    return m && m->packed.p ? &m->packed : NULL;
}

/* The quantized packed layout of w, or NULL when w is not a quantized matrix. */
static inline const cpu_qpacked *cpu_weight_qpacked(const bweight *w) {
    const cpu_wmem *m = (const cpu_wmem *)w->owned;
    return m && m->qpacked.p ? &m->qpacked : NULL;
}


/* The dispatch (cpu_dispatch.c): sets ci->kernels, gemm, the row limits, attn, the int8 family of
 * quantized weights (qk, cpu_qkernels_resolve()) and the description (replacing an earlier one) for
 * the resolved setting k (cpu_kernels_resolve(); automatic: it came from AUTO); before any weight
 * is uploaded (packing follows ci->gemm). */
void cpu_dispatch_init(cpu_impl *ci, enum backend_cpu_kernels k, int automatic, enum cpu_qkernels qk);
/* The kernel family that runs a product of m rows x n outputs x k inputs on packed weights, or NULL:
 * the fp32 path (OpenBLAS sgemm on the weights widened tile by tile). */
static inline const cpu_gemm_kernel *cpu_dispatch_gemm(const cpu_impl *ci, int64_t m, int64_t n, int64_t k) {
    (void)n;
    return m <= (k >= ci->gemm_wide_k ? ci->gemm_max_m_wide : ci->gemm_max_m) ? ci->gemm : NULL;
}

/* Run fn(arg, lo, hi) over [0, n) in chunks of `grain` on the backend's pool (on the calling
 * thread alone when parallel is 0: small loops cost more to hand out than they save). */
typedef void (*cpu_range_fn)(void *arg, int64_t lo, int64_t hi);
void cpu_parallel_for(cpu_impl *ci, int64_t n, int64_t grain, int parallel, cpu_range_fn fn, void *arg);

/* Room for n bytes of activations in ci->abuf. */
void *cpu_abuf_reserve(cpu_impl *ci, size_t n);
/* Room for n rows of kpad inputs quantized (cpu_act_to_q8) in ci->qbuf. */
void *cpu_qbuf_reserve(cpu_impl *ci, int64_t n, int64_t kpad);

/* Grow thread slot b to at least n floats (contents not kept). */
float *cpu_tbuf_reserve(cpu_tbuf *b, size_t n);

/* ops implemented in cpu_matmul.c / cpu_attention.c */
void cpu_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y);
void cpu_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v,
                   void *out);


#endif /* UM_CPU_INTERNAL_H */
