/*
 * cpu_internal.h — shared state and small vectorisable math helpers of the CPU backend
 * (the files in backend/cpu/). Not part of the backend interface: other layers use backend.h only
 * (unit tests may include this to check the helpers).
 *
 * Does not: allocate device memory (there is none), talk to other backends.
 * Threading: the cpu_impl is driven by the one engine thread that owns the backend; the per-thread
 * scratch slots are each touched only by the OpenMP worker whose omp_get_thread_num() indexes them.
 */
#ifndef UM_CPU_INTERNAL_H
#define UM_CPU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend_impl.h"

/* One growable f32 buffer per OpenMP worker, padded to a cache line against false sharing. */
typedef struct cpu_tbuf {
    float  *p;        /* [cap] owned, 64-byte aligned */
    size_t  cap;      /* floats */
    char    pad[64 - sizeof(float *) - sizeof(size_t)];
} cpu_tbuf;

typedef struct cpu_impl {
    int       n_threads;
    cpu_tbuf *wtile;        /* [n_threads] converted weight tiles (matmul) */
    cpu_tbuf *scores;       /* [n_threads] attention score tiles */
    /* RoPE cos/sin table of the last call, reused while positions/theta/rot_dim are unchanged
     * (q and k of every layer share one table per forward). */
    int32_t  *rope_pos;     /* [rope_n] positions the table was built for */
    float    *rope_cos;     /* [rope_n, rope_half] */
    float    *rope_sin;     /* [rope_n, rope_half] */
    int       rope_n, rope_half;
    int       rope_cap;     /* floats allocated in rope_cos / rope_sin */
    int       rope_pos_cap; /* entries allocated in rope_pos */
    float     rope_theta;
} cpu_impl;

static inline cpu_impl *cpu_impl_of(backend *be) { return (cpu_impl *)be->impl; }

/* Hot element-wise loops get an AVX2/FMA clone next to the baseline one, picked at load time
 * (GCC function multi-versioning via ifunc), so the binary still runs on any x86-64.
 * Not under ThreadSanitizer: GCC instruments the ifunc resolvers, which the dynamic loader runs
 * before libtsan is initialised (SIGSEGV at startup). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CPU_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CPU_HOT_CLONES
#endif

/* Grow thread slot b to at least n floats (contents not kept). */
float *cpu_tbuf_reserve(cpu_tbuf *b, size_t n);

/* ops implemented in cpu_matmul.c / cpu_attention.c */
void cpu_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y);
void cpu_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v,
                   void *out);

/* Convert n elements of a weight (F32/BF16/F16) starting at element offset off into dst. */
void cpu_weight_to_f32(const bweight *w, size_t off, size_t n, float *dst);

/* ---------------------------------------------------------------- scalar helpers (inlined into
 * `#pragma omp simd` loops, so they are written without branches) */

static inline float cpu_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t cpu_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* IEEE half -> float without branches: rebias via one multiply by 2^112 (handles subnormals),
 * then force the exponent of Inf/NaN to all ones. Exact for all 65536 inputs. */
static inline float cpu_f16_to_f32(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13;
    float f = cpu_bits_f32(o) * cpu_bits_f32(0x77800000u);   /* 2^112 */
    uint32_t u = cpu_f32_bits(f);
    u |= f >= 65536.0f ? 0x7f800000u : 0u;
    u |= (uint32_t)(h & 0x8000u) << 16;
    return cpu_bits_f32(u);
}

/* exp(x) for x in float range, relative error ~2 ulp; x <= -87 gives ~1.6e-38 (callers zero
 * masked entries themselves). Polynomial from the classic Cephes expf. */
static inline float cpu_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.3f ? 88.3f : x;
    float fx = x * 1.44269504088896341f;
    float n = (fx + 12582912.0f) - 12582912.0f;   /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t e = (int32_t)n + 127;
    return p * cpu_bits_f32((uint32_t)e << 23);
}

#endif /* UM_CPU_INTERNAL_H */
