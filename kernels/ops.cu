// ops.cu — element-wise kernels of the CUDA backend: embedding gather, RMSNorm (alone or fused with
// the residual add), RoPE (table + rotate-half; fused with the KV cache write), SwiGLU, add, get_rows,
// store_rows (KV cache writes), bias add, dtype conversions. bf16 storage, fp32 math.
// Rows whose width is a multiple of 8 elements (16 bytes) use 16-byte vector accesses.
// Does not: allocate or synchronise. Launched by src/backend/cuda/ on the backend's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "um_kernels.h"
#include "umk_portable.h"

typedef __nv_bfloat16 bf16;

namespace {

__device__ __forceinline__ float b2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t f2b(float f) {
    bf16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}

// 8 bf16 in a 16-byte vector
__device__ __forceinline__ void unpack8(uint4 v, float *f) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack8(const float *f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (uint32_t)f2b(f[2 * i]) | ((uint32_t)f2b(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

__host__ __device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

int grid_for(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b > 65535u * 8u) b = 65535u * 8u;   // grid-stride loops cover the rest
    return (int)(b ? b : 1);
}

// ---------------------------------------------------------------- embed / get_rows

// copy one row of d elements (16-byte chunks when both ends allow), by the whole block
__device__ __forceinline__ void copy_row(const uint16_t *__restrict__ s, uint16_t *__restrict__ o, int64_t d) {
    if ((d & 7) == 0 && aligned16(s) && aligned16(o)) {
        const uint4 *s4 = reinterpret_cast<const uint4 *>(s);
        uint4 *o4 = reinterpret_cast<uint4 *>(o);
        for (int64_t j = threadIdx.x; j < d / 8; j += blockDim.x) o4[j] = s4[j];
    } else {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) o[j] = s[j];
    }
}

__global__ void k_gather_rows(const uint16_t *__restrict__ src, int64_t d, const int32_t *__restrict__ rows,
                              uint16_t *__restrict__ out) {
    const int i = blockIdx.x;
    copy_row(src + (int64_t)rows[i] * d, out + (int64_t)i * d, d);
}

// block (r, s): row seq_start[s] + r of x -> dst[s] row pos[...] (the KV cache write)
__global__ void k_store_rows(const uint16_t *__restrict__ x, int64_t d, const int32_t *__restrict__ seq_start,
                             const int32_t *__restrict__ pos, uint16_t *const *__restrict__ dst) {
    const int s = blockIdx.y;
    const int i = seq_start[s] + (int)blockIdx.x;
    if (dst[s] == nullptr || i >= seq_start[s + 1]) return;
    copy_row(x + (int64_t)i * d, dst[s] + (int64_t)pos[i] * d, d);
}

// ---------------------------------------------------------------- rmsnorm

// ADD = false: out = RMSNorm(x) (x read only; out may equal x).
// ADD = true:  x += y (rounded to bf16 as k_add does), then out = RMSNorm(x) of the sum — the residual
// add and the next sublayer's norm in one pass over the row (out may equal y, not x). Each thread
// reads and writes the same elements in both passes, so out == y needs no extra barrier.
constexpr int RMS_THREADS = 256;   // k_rmsnorm's block
template <bool ADD>
__global__ void __launch_bounds__(RMS_THREADS) k_rmsnorm(uint16_t *x, const uint16_t *y, const uint16_t *__restrict__ w,
                                                     int d, float eps, uint16_t *out) {
    const int64_t row = blockIdx.x;
    uint16_t *xr = x + row * d;
    const uint16_t *yr = ADD ? y + row * d : nullptr;
    uint16_t *orow = out + row * d;
    const bool vec = (d & 7) == 0 && aligned16(xr) && aligned16(orow) && aligned16(w) && (!ADD || aligned16(yr));
    float ss = 0.0f;
    if (vec) {
        for (int j = threadIdx.x; j < d / 8; j += RMS_THREADS) {
            float f[8];
            unpack8(reinterpret_cast<const uint4 *>(xr)[j], f);
            if (ADD) {
                float g[8];
                unpack8(reinterpret_cast<const uint4 *>(yr)[j], g);
#pragma unroll
                for (int e = 0; e < 8; e++) f[e] += g[e];
                const uint4 sum = pack8(f);
                reinterpret_cast<uint4 *>(xr)[j] = sum;
                unpack8(sum, f);   // the bf16 sum, as the norm reads it back
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += f[e] * f[e];
        }
    } else {
        for (int j = threadIdx.x; j < d; j += RMS_THREADS) {
            float f = b2f(xr[j]);
            if (ADD) {
                const uint16_t sum = f2b(f + b2f(yr[j]));
                xr[j] = sum;
                f = b2f(sum);
            }
            ss += f * f;
        }
    }
    __shared__ float red[RMS_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < RMS_THREADS / 32 ? red[threadIdx.x] : 0.0f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) red[0] = v;
    }
    __syncthreads();
    const float r = rsqrtf(red[0] / (float)d + eps);
    // y = w * cast_bf16(x * r): the product with the weight happens after rounding to bf16
    if (vec) {
        for (int j = threadIdx.x; j < d / 8; j += RMS_THREADS) {
            float f[8], g[8];
            unpack8(reinterpret_cast<const uint4 *>(xr)[j], f);
            unpack8(reinterpret_cast<const uint4 *>(w)[j], g);
#pragma unroll
            for (int e = 0; e < 8; e++) f[e] = g[e] * b2f(f2b(f[e] * r));
            reinterpret_cast<uint4 *>(orow)[j] = pack8(f);
        }
    } else {
        for (int j = threadIdx.x; j < d; j += RMS_THREADS) orow[j] = f2b(b2f(w[j]) * b2f(f2b(b2f(xr[j]) * r)));
    }
}

// ---------------------------------------------------------------- rope

__global__ void k_rope_table(const int32_t *__restrict__ pos, int n, int half, float theta, float2 *tab) {
    const int64_t total = (int64_t)n * half;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(t / half), j = (int)(t % half);
        const double inv = pow((double)theta, -2.0 * j / (2.0 * half));
        double sn, cs;
        sincos((double)pos[i] * inv, &sn, &cs);
        tab[t] = make_float2((float)cs, (float)sn);
    }
}

// Rotate-half RoPE of q and k, and the KV cache write of k and v, W columns at a time (W = 8: 16-byte
// accesses; W = 1: the scalar path for shapes and pointers that do not allow them). Block (i, g):
// row i, head slots [g*spb, g*spb + spb) of the row's q heads [0, n_heads), k heads
// [n_heads, n_heads + n_kv_heads) and — only launched with k_dst — v heads after those. Thread
// t handles the columns j = (t % P)*W .. +W of the rotated half (P = half/W) and their partners at
// j + half in slots t / P, t / P + blockDim/P, ...: its cos/sin are loaded once into registers and
// reused for every head it rotates, and no index is divided per element. q and k heads are rotated
// in place; a k head is also written to its sequence's k_dst slot at row pos[i] (the sequence found
// by a binary search of i in seq_start; a NULL slot: not written) with the dims past rot_dim copied
// as they are, and a v head is copied to v_dst the same way. From packed rows pk (one q|k|v product,
// row stride ld_pk) every head is read there and written — q and k rotated — to its q / k / v row
// (dims past rot_dim copied); tab NULL (with pk only): nothing rotated, the heads only unpacked.
// umk_rope_apply (the single rope) is the launch without k (n_kv_heads = 0). The rotation is the float expression of the v1 kernels
// (a·c − b·s, b·c + a·s, each rounded to bf16), so results are bit-identical to them.
template <int W>
struct bfw;   // W bf16 as raw bits
template <>
struct bfw<8> {
    uint4 r;
    __device__ __forceinline__ void load(const uint16_t *p) { r = *reinterpret_cast<const uint4 *>(p); }
    __device__ __forceinline__ void store(uint16_t *p, bool vec) const {
        if (vec) {
            *reinterpret_cast<uint4 *>(p) = r;
        } else {   // a cache slot that is not 16-byte aligned
            const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
            for (int e = 0; e < 8; e++) p[e] = (uint16_t)(w[e >> 1] >> (16 * (e & 1)));
        }
    }
    __device__ __forceinline__ void get(float *f) const { unpack8(r, f); }
    __device__ __forceinline__ void set(const float *f) { r = pack8(f); }
};
template <>
struct bfw<1> {
    uint16_t r;
    __device__ __forceinline__ void load(const uint16_t *p) { r = *p; }
    __device__ __forceinline__ void store(uint16_t *p, bool) const { *p = r; }
    __device__ __forceinline__ void get(float *f) const { f[0] = b2f(r); }
    __device__ __forceinline__ void set(const float *f) { r = f2b(f[0]); }
};

// cos/sin of W consecutive columns of a umk_rope_table row (W = 8: 16-byte aligned)
template <int W>
__device__ __forceinline__ void load_cs(const float2 *__restrict__ t, float *c, float *s) {
    if constexpr (W == 8) {
#pragma unroll
        for (int e = 0; e < W; e += 2) {
            const uint4 v = umk_ldg16(t + e);
            c[e] = __uint_as_float(v.x), s[e] = __uint_as_float(v.y);
            c[e + 1] = __uint_as_float(v.z), s[e + 1] = __uint_as_float(v.w);
        }
    } else {
#pragma unroll
        for (int e = 0; e < W; e++) c[e] = t[e].x, s[e] = t[e].y;
    }
}

constexpr int ROPE_THREADS = 256;      // k_rope_rows' largest block
constexpr int ROPE_MIN_BLOCKS = 256;   // below this many rows a row's slots are split over blocks

template <int W>
__global__ void __launch_bounds__(ROPE_THREADS)
    k_rope_rows(uint16_t *q, uint16_t *k, uint16_t *v, const uint16_t *__restrict__ pk, int64_t ld_pk, int n_heads,
                int n_kv_heads, int head_dim, int half, int spb, const float2 *__restrict__ tab, int n_seqs,
                const int32_t *__restrict__ seq_start, const int32_t *__restrict__ pos,
                uint16_t *const *__restrict__ k_dst, uint16_t *const *__restrict__ v_dst) {
    const int i = (int)blockIdx.x;
    const int P = half / W;   // threads per slot (the launch makes blockDim a multiple of P)
    const int j = (int)(threadIdx.x % (unsigned)P) * W;
    const int s_step = (int)(blockDim.x / (unsigned)P);
    const int s_lo = (int)blockIdx.y * spb, n_rot = n_heads + n_kv_heads;
    const int s_hi = min(s_lo + spb, n_rot + (k_dst || pk ? n_kv_heads : 0));
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    float c[W], sn[W];
    if (tab) load_cs<W>(tab + (int64_t)i * half + j, c, sn);
    uint16_t *kd = nullptr, *vd = nullptr;   // row i's k and v cache rows, when stored
    if (k_dst && s_hi > n_heads) {
        int lo = 0, hi = n_seqs - 1;   // row i's sequence: the last s with seq_start[s] <= i
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (seq_start[mid] <= i) lo = mid;
            else hi = mid - 1;
        }
        if (k_dst[lo]) kd = k_dst[lo] + pos[i] * kvd;
        if (v_dst[lo]) vd = v_dst[lo] + pos[i] * kvd;
    }
    const bool dvec = aligned16(kd) && aligned16(vd);
    for (int s = s_lo + (int)(threadIdx.x / (unsigned)P); s < s_hi; s += s_step) {
        const bool rot = s < n_rot && tab;
        uint16_t *x1 = nullptr, *dst = nullptr;   // the head's row in q / k / v, its cache row
        if (s < n_heads) {
            x1 = q + ((int64_t)i * n_heads + s) * head_dim;
        } else if (s < n_rot) {
            x1 = k + ((int64_t)i * n_kv_heads + (s - n_heads)) * head_dim;
            if (kd) dst = kd + (int64_t)(s - n_heads) * head_dim;
        } else {
            x1 = v + ((int64_t)i * n_kv_heads + (s - n_rot)) * head_dim;
            if (vd) dst = vd + (int64_t)(s - n_rot) * head_dim;
        }
        // packed rows (one q|k|v product): head slot s of row i is at s * head_dim, and every head is
        // written to its q / k / v row; else q and k heads are rotated in place and v only stored
        const uint16_t *src = pk ? pk + (int64_t)i * ld_pk + (int64_t)s * head_dim : x1;
        if (!pk && s >= n_rot) x1 = nullptr;
        if (!x1 && !dst) continue;
        bfw<W> xa, xb;   // columns j.. and j + half..
        xa.load(src + j);
        xb.load(src + j + half);
        if (rot) {
            float a[W], b[W], r0[W], r1[W];
            xa.get(a);
            xb.get(b);
            // v1's a·c − b·s and b·c + a·s as nvcc compiled them there (PTX: mul, mul, sub; and one
            // fma with a·s fused, b·c rounded). Left implicit, the second one's contraction here
            // came out the other way round (b·c fused) in the 16-byte path: hence the explicit fmaf.
#pragma unroll
            for (int e = 0; e < W; e++) {
                r0[e] = a[e] * c[e] - b[e] * sn[e];
                r1[e] = fmaf(a[e], sn[e], b[e] * c[e]);
            }
            xa.set(r0);
            xb.set(r1);
        }
        if (x1 && (rot || pk)) {   // in place: only what was rotated; from packed rows: the whole head
            xa.store(x1 + j, true);
            xb.store(x1 + j + half, true);
            for (int t = 2 * half + j; pk && t < head_dim; t += half) {
                bfw<W> x;
                x.load(src + t);
                x.store(x1 + t, true);
            }
        }
        if (dst) {
            xa.store(dst + j, dvec);
            xb.store(dst + j + half, dvec);
            for (int t = 2 * half + j; t < head_dim; t += half) {   // dims past rot_dim: copied as they are
                bfw<W> x;
                x.load(src + t);
                x.store(dst + t, dvec);
            }
        }
    }
}

// ---------------------------------------------------------------- swiglu / add / bias

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// out[i] = silu(gate[i]) * up[i] for i = t, t + stride, ... < n: 8 at a time (vec: 16-byte aligned,
// i counts 8-element vectors up to n / 8) or one
__device__ __forceinline__ void swiglu_span(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t t,
                                            int64_t n, int64_t stride, bool vec) {
    if (vec) {
        for (; t < n / 8; t += stride) {
            float g[8], u[8];
            unpack8(reinterpret_cast<const uint4 *>(gate)[t], g);
            unpack8(reinterpret_cast<const uint4 *>(up)[t], u);
#pragma unroll
            for (int e = 0; e < 8; e++) g[e] = silu_mul(g[e], u[e]);
            reinterpret_cast<uint4 *>(out)[t] = pack8(g);
        }
    } else {
        for (; t < n; t += stride) out[t] = f2b(silu_mul(b2f(gate[t]), b2f(up[t])));
    }
}

__global__ void k_swiglu(const uint16_t *gate, const uint16_t *up, size_t n, uint16_t *out, bool vec) {
    swiglu_span(gate, up, out, blockIdx.x * (int64_t)blockDim.x + threadIdx.x, (int64_t)n,
                (int64_t)gridDim.x * blockDim.x, vec);
}

// k_swiglu over rows of one joined gate|up product: row r's gate at gu + r*ld, its up f further;
// out rows dense. Block (r, c): row r, a grid-stride share of its columns.
__global__ void k_swiglu_rows(const uint16_t *__restrict__ gu, int64_t ld, int f, uint16_t *__restrict__ out,
                              bool vec) {
    const int64_t r = blockIdx.x;
    swiglu_span(gu + r * ld, gu + r * ld + f, out + r * (int64_t)f, blockIdx.y * (int64_t)blockDim.x + threadIdx.x,
                f, (int64_t)gridDim.y * blockDim.x, vec);
}

// block t: x[t, :] += sum_j w[t*k + j] * y[slot[t*k + j], :] (fp32 sum, one rounding)
__global__ void k_moe_combine(uint16_t *x, const uint16_t *__restrict__ y, int64_t d, int k,
                              const int32_t *__restrict__ slot, const float *__restrict__ w) {
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t sl = slot[t * k + j];
            if (sl >= 0) acc += w[t * k + j] * b2f(y[(int64_t)sl * d + i]);
        }
        x[t * d + i] = f2b(b2f(x[t * d + i]) + acc);
    }
}

__global__ void k_add(uint16_t *x, const uint16_t *y, size_t n, bool vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (vec) {
        for (; t < n / 8; t += stride) {
            float a[8], b[8];
            unpack8(reinterpret_cast<const uint4 *>(x)[t], a);
            unpack8(reinterpret_cast<const uint4 *>(y)[t], b);
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] += b[e];
            reinterpret_cast<uint4 *>(x)[t] = pack8(a);
        }
    } else {
        for (; t < n; t += stride) x[t] = f2b(b2f(x[t]) + b2f(y[t]));
    }
}

__global__ void k_bias_add(uint16_t *y, const uint16_t *__restrict__ b, int64_t n, int m) {
    const int64_t total = n * m;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x)
        y[t] = f2b(b2f(y[t]) + b2f(b[t % m]));
}

// ---------------------------------------------------------------- conversions

__global__ void k_f32_to_bf16(const float *src, size_t n, uint16_t *dst) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
        dst[t] = f2b(src[t]);
}

__global__ void k_f16_to_bf16(const __half *src, size_t n, uint16_t *dst) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
        dst[t] = f2b(__half2float(src[t]));
}

__global__ void k_bf16_to_f32(const uint16_t *src, size_t n, float *dst) {
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < n; t += (size_t)gridDim.x * blockDim.x)
        dst[t] = b2f(src[t]);
}

}  // namespace

// ---------------------------------------------------------------- launchers

extern "C" cudaError_t umk_embed(const uint16_t *wte, int64_t d, const int32_t *ids, int n, uint16_t *out,
                                 cudaStream_t s) {
    if (n > 0) UMK_LAUNCH(k_gather_rows, n, 128, 0, s, wte, d, ids, out);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_get_rows(const uint16_t *x, int d, const int32_t *rows, int n, uint16_t *out,
                                    cudaStream_t s) {
    if (n > 0) UMK_LAUNCH(k_gather_rows, n, 128, 0, s, x, d, rows, out);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_store_rows(const uint16_t *x, int d, int n_seqs, const int32_t *seq_start,
                                      const int32_t *pos, uint16_t *const *dst, int max_rows, cudaStream_t s) {
    if (n_seqs > 0 && max_rows > 0)
        UMK_LAUNCH(k_store_rows, dim3((unsigned)max_rows, (unsigned)n_seqs), 128, 0, s, x, (int64_t)d, seq_start, pos,
                   dst);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_rmsnorm(const uint16_t *x, const uint16_t *w, int n, int d, float eps, uint16_t *out,
                                   cudaStream_t s) {
    // k_rmsnorm<false> never writes x
    if (n > 0) UMK_LAUNCH(k_rmsnorm<false>, n, RMS_THREADS, 0, s, const_cast<uint16_t *>(x), nullptr, w, d, eps, out);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_add_rmsnorm(uint16_t *x, const uint16_t *y, const uint16_t *w, int n, int d, float eps,
                                       uint16_t *out, cudaStream_t s) {
    if (n > 0) UMK_LAUNCH(k_rmsnorm<true>, n, RMS_THREADS, 0, s, x, y, w, d, eps, out);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_rope_table(const int32_t *pos, int n, int half, float theta, float *tab, cudaStream_t s) {
    size_t total = (size_t)n * (size_t)half;
    if (total) UMK_LAUNCH(k_rope_table, grid_for(total, 256), 256, 0, s, pos, n, half, theta, reinterpret_cast<float2 *>(tab));
    return cudaGetLastError();
}

// k_rope_rows over n rows: 16-byte accesses (W = 8) where half, head_dim and the pointers allow them,
// else W = 1. Blocks of P = half/W threads per slot and up to ROPE_THREADS threads; with fewer
// than ROPE_MIN_BLOCKS rows a row's slots are split over several blocks so that small steps still
// spread over the SMs.
static cudaError_t rope_rows(uint16_t *q, uint16_t *k, uint16_t *v, const uint16_t *pk, int64_t ld_pk, int n,
                             int n_heads, int n_kv_heads, int head_dim, int rot_dim, const float *tab, int n_seqs,
                             const int32_t *seq_start, const int32_t *pos, uint16_t *const *k_dst,
                             uint16_t *const *v_dst, cudaStream_t s) {
    const int half = rot_dim / 2, slots = n_heads + (k_dst || pk ? 2 : 1) * n_kv_heads;
    if (n <= 0 || half <= 0 || slots <= 0) return cudaGetLastError();
    const bool vec = half % 8 == 0 && head_dim % 8 == 0 && aligned16(q) && aligned16(k) && (!k_dst || aligned16(v)) &&
                     (!tab || aligned16(tab)) && (!pk || (aligned16(pk) && aligned16(v) && ld_pk % 8 == 0));
    const int P = vec ? half / 8 : half;
    if (P > ROPE_THREADS) return cudaErrorInvalidValue;   // rot_dim > 4096 (vector) or > 512 (scalar)
    int groups = n < ROPE_MIN_BLOCKS ? min(slots, (ROPE_MIN_BLOCKS + n - 1) / n) : 1;
    const int spb = (slots + groups - 1) / groups;   // slots per block
    groups = (slots + spb - 1) / spb;
    const dim3 grid((unsigned)n, (unsigned)groups);
    const int threads = P * min(spb, ROPE_THREADS / P);
    const float2 *t2 = reinterpret_cast<const float2 *>(tab);
    if (vec)
        UMK_LAUNCH(k_rope_rows<8>, grid, threads, 0, s, q, k, v, pk, ld_pk, n_heads, n_kv_heads, head_dim, half, spb,
                   t2, n_seqs, seq_start, pos, k_dst, v_dst);
    else
        UMK_LAUNCH(k_rope_rows<1>, grid, threads, 0, s, q, k, v, pk, ld_pk, n_heads, n_kv_heads, head_dim, half, spb,
                   t2, n_seqs, seq_start, pos, k_dst, v_dst);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_rope_apply(uint16_t *x, int n, int n_heads, int head_dim, int rot_dim, const float *tab,
                                      cudaStream_t s) {
    if (!tab) return cudaErrorInvalidValue;
    return rope_rows(x, nullptr, nullptr, nullptr, 0, n, n_heads, 0, head_dim, rot_dim, tab, 0, nullptr, nullptr,
                     nullptr, nullptr, s);
}

extern "C" cudaError_t umk_rope_kv(uint16_t *q, uint16_t *k, uint16_t *v, const uint16_t *qkv, int64_t ld_qkv, int n,
                                   int n_heads, int n_kv_heads, int head_dim, int rot_dim, const float *tab,
                                   int n_seqs, const int32_t *seq_start, const int32_t *pos, uint16_t *const *k_dst,
                                   uint16_t *const *v_dst, cudaStream_t s) {
    if (!tab && !qkv) return cudaErrorInvalidValue;   // nothing to rotate from, nothing to unpack
    return rope_rows(q, k, v, qkv, ld_qkv, n, n_heads, n_kv_heads, head_dim, rot_dim, tab, n_seqs, seq_start, pos,
                     k_dst, v_dst, s);
}

extern "C" cudaError_t umk_swiglu(const uint16_t *gate, const uint16_t *up, size_t n, uint16_t *out, cudaStream_t s) {
    bool vec = (n & 7) == 0 && ((uintptr_t)gate & 15) == 0 && ((uintptr_t)up & 15) == 0 && ((uintptr_t)out & 15) == 0;
    if (n) UMK_LAUNCH(k_swiglu, grid_for(vec ? n / 8 : n, 256), 256, 0, s, gate, up, n, out, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_swiglu_rows(const uint16_t *gu, int n, int f, int64_t ld, uint16_t *out, cudaStream_t s) {
    if (n <= 0 || f <= 0) return cudaGetLastError();
    if (ld < 2 * (int64_t)f) return cudaErrorInvalidValue;
    const bool vec = (f & 7) == 0 && (ld & 7) == 0 && ((uintptr_t)gu & 15) == 0 && ((uintptr_t)out & 15) == 0;
    const int per_row = vec ? f / 8 : f;
    const dim3 grid((unsigned)n, (unsigned)((per_row + 255) / 256));
    UMK_LAUNCH(k_swiglu_rows, grid, 256, 0, s, gu, ld, f, out, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_moe_combine(uint16_t *x, const uint16_t *y, int d, int n, int k, const int32_t *slot,
                                       const float *w, cudaStream_t s) {
    if (n > 0 && k > 0) UMK_LAUNCH(k_moe_combine, n, 128, 0, s, x, y, (int64_t)d, k, slot, w);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_add(uint16_t *x, const uint16_t *y, size_t n, cudaStream_t s) {
    bool vec = (n & 7) == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)y & 15) == 0;
    if (n) UMK_LAUNCH(k_add, grid_for(vec ? n / 8 : n, 256), 256, 0, s, x, y, n, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_bias_add(uint16_t *y, const uint16_t *b, int n, int m, cudaStream_t s) {
    size_t total = (size_t)n * (size_t)m;
    if (total) UMK_LAUNCH(k_bias_add, grid_for(total, 256), 256, 0, s, y, b, n, m);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_to_bf16(const void *src, int src_is_f16, size_t n, uint16_t *dst, cudaStream_t s) {
    if (n) {
        if (src_is_f16)
            UMK_LAUNCH(k_f16_to_bf16, grid_for(n, 256), 256, 0, s, static_cast<const __half *>(src), n, dst);
        else
            UMK_LAUNCH(k_f32_to_bf16, grid_for(n, 256), 256, 0, s, static_cast<const float *>(src), n, dst);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t umk_bf16_to_f32(const uint16_t *src, size_t n, float *dst, cudaStream_t s) {
    if (n) UMK_LAUNCH(k_bf16_to_f32, grid_for(n, 256), 256, 0, s, src, n, dst);
    return cudaGetLastError();
}
