// attention.cu — bidirectional / block-causal attention over varlen packed sequences (GQA, key
// padding mask), bf16 in and out, fp32 online softmax. A sequence's keys/values are its rows of the packed
// k/v, or its own buffers (umk_attn.k_seq / v_seq: a KV cache).
//
// k_attn_mma<HD>: flash-attention-2 style. A block of 4 warps owns 64 query rows of one (sequence,
// head); each warp owns 16 rows and keeps its Q fragments, the running max/sum and the O
// accumulator in registers. Per 64-key tile: K is staged row-major and V transposed in shared
// memory (rows padded by 16 bytes: conflict-free 32-bit fragment loads), S = Q·Kᵀ and O += P·V run
// on mma.sync.m16n8k16 (bf16 in, fp32 accumulate); the S accumulator layout doubles as the A
// operand of P·V, so P never leaves registers. Masking per key: beyond the sequence, key_valid = 0,
// or (block_causal = B) k_pos/B > q_pos/B. A row that has seen no visible key yet keeps m = -inf and
// contributes nothing; a query with no visible key at all writes zeros (as the CPU backend).
// Key splits (flash-decoding): when query tiles x heads x sequences would leave SMs idle (a cached
// decode step: 32 block rows, one tile per head), each block takes one of n_split consecutive
// ranges of key tiles and writes its unnormalised output and running max / sum to a workspace;
// k_attn_combine merges the ranges per (row, head). n_split = 1 writes the output directly.
// k_attn_generic: one warp per (query row, head), scalar fp32; any head_dim <= 256. Used when the
// head size has no mma instantiation, pointers are not 16-byte aligned, or on request (tests).
// Does not: allocate, synchronise. Launched on the backend's stream.
#include <cuda_bf16.h>
#include <math.h>

#include "um_kernels.h"
#include "umk_portable.h"

namespace {

constexpr int BR = 64;    // query rows per block (16 per warp)
constexpr int BC = 64;    // keys per tile
constexpr int PAD = 8;    // bf16 elements of padding per shared-memory row

struct attn_args {
    umk_attn        p;
    const uint16_t *q, *k, *v;
    uint16_t       *out;
    int             n_split;   // key splits per (query tile, head, sequence): 1 = write out directly
    float          *ws_o;      // n_split > 1: [n_q][n_heads][n_split][HD] unnormalised partial outputs
    float          *ws_ml;     //              [n_q][n_heads][n_split][2] running max (log2 units), sum
};

__device__ __forceinline__ uint32_t ld32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);   // .x (low 16 bits) = lo
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int HD>
__global__ void __launch_bounds__(128) k_attn_mma(attn_args a) {
    constexpr int KS = HD + PAD;   // Ks row stride (elements)
    constexpr int VS = BC + PAD;   // Vt row stride
    constexpr int CPR = HD / 8;    // 16-byte chunks per K/V row
    constexpr int CH = BC * CPR / 128;   // K (and V) chunks per thread per tile
    static_assert(BC * CPR % 128 == 0, "a tile's chunks split evenly over the 128 threads");
    UMK_DYNAMIC_SMEM(smem);
    uint16_t *Ks = reinterpret_cast<uint16_t *>(smem);        // [BC][KS]  K tile, row = key
    uint16_t *Vt = Ks + BC * KS;                                // [HD][VS]  V tile transposed, row = dim
    int *kinfo = reinterpret_cast<int *>(Vt + HD * VS);        // [BC] -1 = invisible, else key block

    const umk_attn &p = a.p;
    const int s = blockIdx.z / a.n_split, sp = blockIdx.z % a.n_split, h = blockIdx.y;
    const int q_end = p.q_start[s + 1];
    const int q0 = p.q_start[s] + blockIdx.x * BR;
    if (q0 >= q_end) return;
    const int k_begin = p.k_start[s], k_end = p.k_start[s + 1];
    // this block's keys: split sp of the sequence's key tiles (all of them when n_split = 1)
    const int tiles_per_split = ((k_end - k_begin + BC - 1) / BC + a.n_split - 1) / a.n_split;
    const int kt_lo = k_begin + sp * tiles_per_split * BC;
    const int kt_hi = min(k_end, kt_lo + tiles_per_split * BC);
    const int kvh = h / (p.n_heads / p.n_kv_heads);
    const int ldq = p.n_heads * HD, ldk = p.n_kv_heads * HD;
    // key row `row` (numbered by k_start) lives at kb/vb + (row - k_begin) * ldk
    const bool own = p.k_seq != nullptr && p.k_seq[s] != nullptr;   // the sequence's own buffers (KV cache)
    const uint16_t *kb = own ? p.k_seq[s] : a.k + (int64_t)k_begin * ldk;
    const uint16_t *vb = own ? p.v_seq[s] : a.v + (int64_t)k_begin * ldk;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = q0 + warp * 16 + g, r1 = r0 + 8;   // the two query rows this thread holds
    const bool ok0 = r0 < q_end, ok1 = r1 < q_end;
    // a warp whose 16 rows all lie past the sequence's queries (a cached decode step: 32 rows in a
    // 64-row tile) only helps stage K/V: it skips the products and the softmax (v4), so the tensor
    // cores of its SM sub-partition serve the live warps
    const bool live = q0 + warp * 16 < q_end;
    const int bc = p.block_causal;
    const int qb0 = (bc > 0 && ok0) ? p.q_pos[r0] / bc : 0;
    const int qb1 = (bc > 0 && ok1) ? p.q_pos[r1] / bc : 0;
    const float sl2 = p.scale * 1.4426950408889634f;   // softmax in base 2

    // Q as A fragments: reg0 (row g, cols 2t..2t+1), reg1 (row g+8), reg2 (row g, +8), reg3 (row g+8, +8)
    uint32_t qf[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int c = h * HD + kk * 16 + 2 * t;
        qf[kk][0] = ok0 ? ld32(a.q + (int64_t)r0 * ldq + c) : 0u;
        qf[kk][1] = ok1 ? ld32(a.q + (int64_t)r1 * ldq + c) : 0u;
        qf[kk][2] = ok0 ? ld32(a.q + (int64_t)r0 * ldq + c + 8) : 0u;
        qf[kk][3] = ok1 ? ld32(a.q + (int64_t)r1 * ldq + c + 8) : 0u;
    }

    float o[HD / 8][4];
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int kt = kt_lo; kt < kt_hi; kt += BC) {
        // this tile's K and V chunks into registers first, all loads in flight together (a load
        // followed by its shared-memory store, chunk by chunk, waited out one memory latency per
        // chunk: 16 per tile at HD 128); issued before the barrier, so they also overlap the other
        // warps finishing the previous tile
        uint4 kc_[CH], vc_[CH];
#pragma unroll
        for (int i = 0; i < CH; i++) {   // K: consecutive threads, consecutive chunks
            const int c = tid + i * 128, key = c / CPR, col = (c % CPR) * 8, row = kt + key;
            kc_[i] = row < k_end ? umk_ldg16(kb + (int64_t)(row - k_begin) * ldk + kvh * HD + col) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < CH; i++) {   // V: consecutive threads, consecutive keys
            const int c = tid + i * 128, key = c % BC, col = (c / BC) * 8, row = kt + key;
            vc_[i] = row < k_end ? umk_ldg16(vb + (int64_t)(row - k_begin) * ldk + kvh * HD + col) : make_uint4(0u, 0u, 0u, 0u);
        }
        __syncthreads();   // every warp is done with the previous tile
#pragma unroll
        for (int i = 0; i < CH; i++) {
            const int c = tid + i * 128, key = c / CPR, col = (c % CPR) * 8;
            *reinterpret_cast<uint4 *>(Ks + key * KS + col) = kc_[i];
        }
#pragma unroll
        for (int i = 0; i < CH; i++) {
            const int c = tid + i * 128, key = c % BC, col = (c / BC) * 8;
            const uint32_t w[4] = {vc_[i].x, vc_[i].y, vc_[i].z, vc_[i].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                Vt[(col + 2 * j) * VS + key] = (uint16_t)(w[j] & 0xffffu);
                Vt[(col + 2 * j + 1) * VS + key] = (uint16_t)(w[j] >> 16);
            }
        }
        if (tid < BC) {
            const int row = kt + tid;
            int info = -1;
            if (row < k_end && (!p.key_valid || p.key_valid[row])) info = bc > 0 ? p.k_pos[row] / bc : 0;
            kinfo[tid] = info;
        }
        __syncthreads();

        if (!live) continue;   // warp-uniform; the barriers above are every warp's
        // S = Q·Kᵀ: n-tile nt covers keys nt*8..nt*8+7; B fragment = K[key nt*8+g][dims 2t.., 2t+8..]
        float sc[BC / 8][4];
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const uint16_t *kr = Ks + (nt * 8 + g) * KS + 2 * t;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) umk_mma_bf16_16816(sc[nt], qf[kk], ld32(kr + kk * 16), ld32(kr + kk * 16 + 8));
        }

        // mask, scale, row max (a row's 4 owners are lanes 4g..4g+3)
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int info = kinfo[nt * 8 + 2 * t + i];
                const bool v0 = info >= 0 && (bc == 0 || info <= qb0);
                const bool v1 = info >= 0 && (bc == 0 || info <= qb1);
                sc[nt][i] = v0 ? sc[nt][i] * sl2 : -INFINITY;
                sc[nt][2 + i] = v1 ? sc[nt][2 + i] * sl2 : -INFINITY;
                mx0 = fmaxf(mx0, sc[nt][i]);
                mx1 = fmaxf(mx1, sc[nt][2 + i]);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float mu0 = mn0 == -INFINITY ? 0.0f : mn0, mu1 = mn1 == -INFINITY ? 0.0f : mn1;
        const float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
        for (int nt = 0; nt < BC / 8; nt++) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                sc[nt][i] = exp2f(sc[nt][i] - mu0);
                sc[nt][2 + i] = exp2f(sc[nt][2 + i] - mu1);
                ps0 += sc[nt][i];
                ps1 += sc[nt][2 + i];
            }
        }
        l0 = l0 * al0 + ps0;   // per-lane partial sums; the 4 owners are summed at the end
        l1 = l1 * al1 + ps1;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            o[dt][0] *= al0;
            o[dt][1] *= al0;
            o[dt][2] *= al1;
            o[dt][3] *= al1;
        }

        // O += P·V: the C layout of n-tiles 2kc, 2kc+1 is the A layout of the 16-key chunk kc;
        // B fragment = Vt[dim dt*8+g][keys 16kc+2t.., 16kc+2t+8..]
#pragma unroll
        for (int kc = 0; kc < BC / 16; kc++) {
            const uint32_t pa[4] = {pack_bf16x2(sc[2 * kc][0], sc[2 * kc][1]), pack_bf16x2(sc[2 * kc][2], sc[2 * kc][3]),
                                    pack_bf16x2(sc[2 * kc + 1][0], sc[2 * kc + 1][1]),
                                    pack_bf16x2(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
            for (int dt = 0; dt < HD / 8; dt++) {
                const uint16_t *vr = Vt + (dt * 8 + g) * VS + kc * 16 + 2 * t;
                umk_mma_bf16_16816(o[dt], pa, ld32(vr), ld32(vr + 8));
            }
        }
    }

    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    if (a.n_split > 1) {   // partial result of this split: merged by k_attn_combine
        const int64_t i0 = ((int64_t)r0 * p.n_heads + h) * a.n_split + sp, i1 = ((int64_t)r1 * p.n_heads + h) * a.n_split + sp;
#pragma unroll
        for (int dt = 0; dt < HD / 8; dt++) {
            const int c = dt * 8 + 2 * t;
            if (ok0) *reinterpret_cast<float2 *>(a.ws_o + i0 * HD + c) = make_float2(o[dt][0], o[dt][1]);
            if (ok1) *reinterpret_cast<float2 *>(a.ws_o + i1 * HD + c) = make_float2(o[dt][2], o[dt][3]);
        }
        if (t == 0) {
            if (ok0) *reinterpret_cast<float2 *>(a.ws_ml + i0 * 2) = make_float2(m0, l0);
            if (ok1) *reinterpret_cast<float2 *>(a.ws_ml + i1 * 2) = make_float2(m1, l1);
        }
        return;
    }
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
    for (int dt = 0; dt < HD / 8; dt++) {
        const int c = h * HD + dt * 8 + 2 * t;
        if (ok0) *reinterpret_cast<uint32_t *>(a.out + (int64_t)r0 * ldq + c) = pack_bf16x2(o[dt][0] * inv0, o[dt][1] * inv0);
        if (ok1) *reinterpret_cast<uint32_t *>(a.out + (int64_t)r1 * ldq + c) = pack_bf16x2(o[dt][2] * inv1, o[dt][3] * inv1);
    }
}

// One warp's output row of one head: lane holds dims lane + 32 j (j < N) of the unnormalised
// output; writes v * inv as bf16 for the dims below hd (inv = 1 / softmax sum, 0 for no visible key).
template <int N>
__device__ __forceinline__ void warp_store_row(const float (&v)[N], float inv, int lane, int hd, uint16_t *dst) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        const int d = lane + 32 * j;
        if (d < hd) {
            __nv_bfloat16 b = __float2bfloat16_rn(v[j] * inv);
            dst[d] = *reinterpret_cast<uint16_t *>(&b);
        }
    }
}

// Merges the n_split partials of one (query row, head) per warp: m = max m_i, weights 2^(m_i - m)
// (0 for a split that saw no visible key), out = sum w_i o_i / sum w_i l_i; zeros when no split saw
// a key (as the unsplit kernel). Lane i < S loads split i's (max, sum) pair, so the S pairs arrive
// in one load and the max and the weighted sum are warp reductions; the partial outputs are then
// read 4 splits per round with every load of a round in flight together (a loop carrying one load
// at a time waited out S memory latencies, twice: v1).
template <int HD>
__global__ void __launch_bounds__(128) k_attn_combine(attn_args a) {
    const umk_attn &p = a.p;
    const int64_t gw = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, S = a.n_split;   // S <= 32 (choose_splits)
    if (gw >= (int64_t)p.n_q * p.n_heads) return;
    const int row = (int)(gw / p.n_heads), h = (int)(gw % p.n_heads);
    const int64_t base = gw * S;   // (row * n_heads + h) * S
    const float2 ml = lane < S ? *reinterpret_cast<const float2 *>(a.ws_ml + (base + lane) * 2)
                               : make_float2(-INFINITY, 0.0f);
    float m = ml.x;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    // this lane's split weight (0 for a split with no visible key, or none at all)
    const float wl = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - m);
    float l = wl * ml.y;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    constexpr int DPL = (HD + 31) / 32;   // dims per lane
    float acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) acc[j] = 0.0f;
    const float *o = a.ws_o + base * HD;
    for (int i0 = 0; i0 < S; i0 += 4) {
        float v[4][DPL];
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane + 32 * j;
                v[u][j] = i0 + u < S && d < HD ? o[(int64_t)(i0 + u) * HD + d] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            // a split that saw no visible key is skipped, not weighted by 0 (its partial may hold
            // 0 x NaN from masked values); lanes >= S hold -inf
            const float mi = __shfl_sync(0xffffffffu, ml.x, i0 + u), wi = __shfl_sync(0xffffffffu, wl, i0 + u);
            if (mi == -INFINITY) continue;   // uniform over the warp
#pragma unroll
            for (int j = 0; j < DPL; j++) acc[j] += wi * v[u][j];
        }
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    warp_store_row(acc, inv, lane, HD, a.out + (int64_t)row * p.n_heads * HD + h * HD);
}

__device__ __forceinline__ float b2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

constexpr int GEN_MAX_HD = 256;
constexpr int GEN_DPL = GEN_MAX_HD / 32;   // dims per lane

__global__ void __launch_bounds__(128) k_attn_generic(attn_args a) {
    const umk_attn &p = a.p;
    const int HD = p.head_dim, H = p.n_heads;
    const int64_t gw = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (gw >= (int64_t)p.n_q * H) return;
    const int row = (int)(gw / H), h = (int)(gw % H);
    int lo = 0, hi = p.n_seqs - 1;   // sequence of this row: last s with q_start[s] <= row
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.q_start[mid] <= row) lo = mid;
        else hi = mid - 1;
    }
    const int s = lo;
    const int kvh = h / (H / p.n_kv_heads);
    const int ldq = H * HD, ldk = p.n_kv_heads * HD;
    const int bc = p.block_causal;
    const int qb = bc > 0 ? p.q_pos[row] / bc : 0;
    float q[GEN_DPL], o[GEN_DPL];
#pragma unroll
    for (int i = 0; i < GEN_DPL; i++) {
        const int d = lane + 32 * i;
        q[i] = d < HD ? b2f(a.q[(int64_t)row * ldq + h * HD + d]) : 0.0f;
        o[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int k0 = p.k_start[s];
    const bool own = p.k_seq != nullptr && p.k_seq[s] != nullptr;   // the sequence's own buffers (KV cache)
    const uint16_t *kb = own ? p.k_seq[s] : a.k + (int64_t)k0 * ldk;
    const uint16_t *vb = own ? p.v_seq[s] : a.v + (int64_t)k0 * ldk;
    for (int j = k0; j < p.k_start[s + 1]; j++) {
        if (p.key_valid && !p.key_valid[j]) continue;
        if (bc > 0 && p.k_pos[j] / bc > qb) continue;
        const uint16_t *kr = kb + (int64_t)(j - k0) * ldk + kvh * HD;
        const uint16_t *vr = vb + (int64_t)(j - k0) * ldk + kvh * HD;
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < GEN_DPL; i++) {
            const int d = lane + 32 * i;
            if (d < HD) dot += q[i] * b2f(kr[d]);
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float sc = dot * p.scale;
        const float mn = fmaxf(m, sc);
        const float al = expf(m - mn), pe = expf(sc - mn);
        l = l * al + pe;
#pragma unroll
        for (int i = 0; i < GEN_DPL; i++) {
            const int d = lane + 32 * i;
            o[i] = o[i] * al + (d < HD ? pe * b2f(vr[d]) : 0.0f);
        }
        m = mn;
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    warp_store_row(o, inv, lane, HD, a.out + (int64_t)row * ldq + h * HD);
}

template <int HD>
size_t mma_smem_bytes() {
    return (size_t)(BC * (HD + PAD) + HD * (BC + PAD)) * sizeof(uint16_t) + BC * sizeof(int);
}

template <int HD>
cudaError_t launch_mma(const attn_args &a, cudaStream_t s) {
    const dim3 grid((unsigned)((a.p.max_q_len + BR - 1) / BR), (unsigned)a.p.n_heads, (unsigned)(a.p.n_seqs * a.n_split));
    const size_t sm = mma_smem_bytes<HD>();
    if (sm > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(k_attn_mma<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        if (e != cudaSuccess) return e;
    }
    UMK_LAUNCH(k_attn_mma<HD>, grid, 128, sm, s, a);
    if (a.n_split > 1) {
        const int64_t warps = (int64_t)a.p.n_q * a.p.n_heads;
        UMK_LAUNCH(k_attn_combine<HD>, (unsigned)((warps + 3) / 4), 128, 0, s, a);
    }
    return cudaGetLastError();
}

// Key splits for the tensor-core kernel: while query tiles x heads x sequences leave SMs idle,
// about two blocks per SM, at most one split per key tile and 32 (a warp merges them), and only
// what the workspace holds.
int choose_splits(const umk_attn *p, int hd, const umk_attn_split *sp) {
    if (!sp || !sp->ws || sp->force == 1) return 1;
    const int64_t blocks = (int64_t)((p->max_q_len + BR - 1) / BR) * p->n_heads * p->n_seqs;
    const int max_tiles = (p->max_k_len + BC - 1) / BC;
    int n = 1;
    if (sp->force > 1) n = sp->force;
    else if (blocks < sp->n_sm) n = (int)((2 * (int64_t)sp->n_sm + blocks - 1) / blocks);
    if (n > max_tiles) n = max_tiles;
    if (n > 32) n = 32;
    const int64_t per_split = (int64_t)p->n_q * p->n_heads * (hd + 2) * (int64_t)sizeof(float);
    if (per_split > 0 && (int64_t)n * per_split > (int64_t)sp->ws_bytes) n = (int)((int64_t)sp->ws_bytes / per_split);
    return n < 2 ? 1 : n;
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

}  // namespace

extern "C" cudaError_t umk_attention(const umk_attn *p, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                     uint16_t *out, int force_generic, const umk_attn_split *split, cudaStream_t s) {
    if (p->n_q <= 0 || p->max_q_len <= 0) return cudaGetLastError();
    if (p->head_dim > GEN_MAX_HD || p->n_kv_heads <= 0 || p->n_heads % p->n_kv_heads) return cudaErrorInvalidValue;
    attn_args a = {*p, q, k, v, out, 1, nullptr, nullptr};
    a.n_split = choose_splits(p, p->head_dim, split);
    if (a.n_split > 1) {
        a.ws_o = split->ws;
        a.ws_ml = split->ws + (size_t)p->n_q * p->n_heads * a.n_split * p->head_dim;
    }
    const bool al = aligned16(q) && aligned16(k) && aligned16(v) && aligned16(out);
    if (!force_generic && al) {
        switch (p->head_dim) {
        case 16: return launch_mma<16>(a, s);
        case 32: return launch_mma<32>(a, s);
        case 64: return launch_mma<64>(a, s);
        case 128: return launch_mma<128>(a, s);
        default: break;
        }
    }
    a.n_split = 1;   // the generic kernel never splits
    const int64_t warps = (int64_t)p->n_q * p->n_heads;
    UMK_LAUNCH(k_attn_generic, (unsigned)((warps + 3) / 4), 128, 0, s, a);
    return cudaGetLastError();
}
