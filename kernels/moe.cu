// moe.cu — the device-side mixture-of-experts dispatch of the CUDA backend, in three kernels that
// never need the host between them (every grid is sized from host-known bounds, so a forward that
// uses them can be captured into a CUDA graph):
//
// k_moe_route: one warp per token turns its router logits into top_k (expert, weight) pairs with
//   exactly the rules and tie-breaks of model/moe.c moe_route() (docs/model-spec.md §2c): softmax
//   (+ bias) in double with the max and the sum taken in expert order, or sigmoid + bias for the
//   selection inside the topk_group best groups (a group scores its two best biased values), the
//   unbiased sigmoids renormalised and scaled. Each selection step is a warp arg-max that equals
//   moe.c's sequential top_k scan (ties to the lower index; a NaN wins only as the first candidate).
// k_moe_sort: one block groups the n*k (token, choice) pairs by expert — a counting sort, stable
//   (token order inside an expert, as moe.c): per-expert offsets, each pair's row (slot; -1 for an
//   expert outside this rank's range [e0, e1)), each row's token, and a tile map (expert, first row)
//   of the row tiles of the grouped GEMMs, -1 past the last tile.
// k_moe_gemm<GATED>: grouped GEMM over the tile map, 64 x 64 output tiles of 4 warps on
//   mma.sync.m16n8k16 (bf16 in, fp32 accumulate), one expert per tile. GATED: rows of x gathered by
//   token, y = bf16(silu(bf16(x·Wgᵀ)) * bf16(x·Wuᵀ)) (the rounding of the unfused gate / up / SwiGLU
//   ops); else y = bf16(a·Wᵀ) on the sorted rows of a. A block whose tile map entry is -1 exits.
// The combine (each token's weighted rows added to x) is ops.cu's umk_moe_combine on the slots.
//
// Does not: allocate, synchronise, validate (the backend checks shapes: d and ffn multiples of 8,
// n_experts <= UMK_MOE_MAX_EXPERTS). Launched on the backend's stream.
#include <cuda_bf16.h>
#include <math.h>

#include "um_kernels.h"
#include "umk_portable.h"

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int NONE = 0x7fffffff;   // "no index" in the arg-max reductions

__device__ __forceinline__ float b2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t f2b(float f) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}

// ---------------------------------------------------------------- routing

// One step of moe.c top_k over v[0..n) by the whole warp: the sequential scan `best = first unused
// index; best = i whenever v[i] > v[best]` gives the largest value, ties to the lower index, NaNs
// never chosen — unless the first unused value is NaN, which then stays. -1 when all are used.
__device__ int warp_pick(const double *v, int n, const unsigned char *used) {
    const int lane = threadIdx.x & 31;
    int first = NONE, bi = NONE;
    double bv = 0.0;
    for (int i = lane; i < n; i += 32) {
        if (used[i]) continue;
        if (first == NONE) first = i;
        const double x = v[i];
        if (x != x) continue;
        if (bi == NONE || x > bv) bv = x, bi = i;
    }
    for (int o = 16; o > 0; o >>= 1) {
        const int of = __shfl_xor_sync(FULL, first, o);
        const int obi = __shfl_xor_sync(FULL, bi, o);
        const double obv = __shfl_xor_sync(FULL, bv, o);
        first = of < first ? of : first;
        if (obi != NONE && (bi == NONE || obv > bv || (obv == bv && obi < bi))) bv = obv, bi = obi;
    }
    if (first == NONE) return -1;
    const double f = v[first];
    return f != f ? first : bi;
}

// moe.c top_k(v, n, 2) by one thread (a group's two best: n = experts per group, small)
__device__ void top2_serial(const double *v, int n, int *i0, int *i1) {
    int b0 = -1, b1 = -1;
    for (int i = 0; i < n; i++)
        if (b0 < 0 || v[i] > v[b0]) b0 = i;
    for (int i = 0; i < n; i++)
        if (i != b0 && (b1 < 0 || v[i] > v[b1])) b1 = i;
    *i0 = b0;
    *i1 = b1;
}

struct route_args {
    const uint16_t *logits;   // [n, E]
    const float    *bias;     // [E] or nullptr
    int             E, K, sigmoid_group, G, topk_group;
    float           scale;
    int32_t        *idx;      // [n, K]
    float          *w;        // [n, K]
};

// one warp (block of 32) per token; shared: p[E], sg[E], gs[G] doubles, sel[K] ints, used[E],
// gused[G] bytes
__global__ void __launch_bounds__(32) k_moe_route(route_args a) {
    UMK_DYNAMIC_SMEM(smem);
    const int E = a.E, K = a.K, G = a.G, lane = threadIdx.x;
    double *p = reinterpret_cast<double *>(smem), *sg = p + E, *gs = sg + E;
    int *sel = reinterpret_cast<int *>(gs + G);
    unsigned char *used = reinterpret_cast<unsigned char *>(sel + K), *gused = used + E;
    const int64_t t = blockIdx.x;
    const uint16_t *lg = a.logits + t * E;
    for (int e = lane; e < E; e += 32) {
        sg[e] = b2f(lg[e]);   // the logit as moe_route sees it (f32), held in sg for now
        used[e] = 0;
    }
    for (int g = lane; g < G; g += 32) gused[g] = 0;
    __syncthreads();
    if (!a.sigmoid_group) {
        // softmax over all experts (max and sum in expert order, as moe.c), + bias
        __shared__ double mx_sum[2];
        if (lane == 0) {
            float mx = (float)sg[0];
            for (int e = 1; e < E; e++) mx = (float)sg[e] > mx ? (float)sg[e] : mx;
            mx_sum[0] = mx;
        }
        __syncthreads();
        for (int e = lane; e < E; e += 32) p[e] = exp(sg[e] - mx_sum[0]);
        __syncthreads();
        if (lane == 0) {
            double sum = 0;
            for (int e = 0; e < E; e++) sum += p[e];
            mx_sum[1] = sum;
        }
        __syncthreads();
        for (int e = lane; e < E; e += 32) p[e] = p[e] / mx_sum[1] + (a.bias ? (double)a.bias[e] : 0.0);
        __syncthreads();
        for (int j = 0; j < K; j++) {
            const int b = warp_pick(p, E, used);
            if (lane == 0) {
                used[b] = 1;
                a.idx[t * K + j] = b;
                a.w[t * K + j] = (float)p[b];
            }
            __syncthreads();
        }
        return;
    }
    // sigmoid; selection on sigmoid + bias within the topk_group best groups
    for (int e = lane; e < E; e += 32) {
        p[e] = 1.0 / (1.0 + exp(-sg[e]));
        sg[e] = p[e] + (a.bias ? (double)a.bias[e] : 0.0);
    }
    __syncthreads();
    const int per = E / G;
    for (int g = lane; g < G; g += 32) {
        int i0, i1;
        top2_serial(sg + g * per, per, &i0, &i1);
        gs[g] = sg[g * per + i0] + sg[g * per + i1];
    }
    __syncthreads();
    for (int q = 0; q < a.topk_group; q++) {
        const int b = warp_pick(gs, G, gused);
        if (lane == 0) gused[b] = 1;
        __syncthreads();
    }
    for (int e = lane; e < E; e += 32)
        if (!gused[e / per]) sg[e] = -INFINITY;
    __syncthreads();
    for (int j = 0; j < K; j++) {
        const int b = warp_pick(sg, E, used);
        if (lane == 0) {
            used[b] = 1;
            sel[j] = b;
        }
        __syncthreads();
    }
    if (lane == 0) {
        double sum = 0;
        for (int j = 0; j < K; j++) sum += p[sel[j]];
        for (int j = 0; j < K; j++) {
            a.idx[t * K + j] = sel[j];
            a.w[t * K + j] = (float)((K > 1 ? p[sel[j]] / (sum + 1e-20) : p[sel[j]]) * (double)a.scale);
        }
    }
}

// ---------------------------------------------------------------- counting sort

constexpr int SORT_WARPS = 8;

struct sort_args {
    const int32_t *idx;        // [nk] expert of each (token, choice) pair
    int            nk, k, E, e0, e1, tile_rows, max_tiles;
    int32_t       *offsets;    // [E + 1]
    int32_t       *slot;       // [nk]
    int32_t       *tok;        // [nk]
    int32_t       *tile_e;     // [max_tiles]
    int32_t       *tile_r;     // [max_tiles]
};

// exclusive prefix sums of a[0..n) in place by warp 0 (segments of ceil(n/32) per lane); *total =
// the sum. Called by every thread of the block (barriers inside).
__device__ void block_scan(int *a, int n, int *seg, int *total) {
    const int tid = threadIdx.x, per = (n + 31) / 32;
    if (tid < 32) {
        int s = 0;
        for (int i = tid * per; i < n && i < (tid + 1) * per; i++) s += a[i];
        seg[tid] = s;
    }
    __syncthreads();
    if (tid < 32) {
        int base = 0;
        for (int l = 0; l < tid; l++) base += seg[l];
        for (int i = tid * per; i < n && i < (tid + 1) * per; i++) {
            const int v = a[i];
            a[i] = base;
            base += v;
        }
        if (tid == 31) *total = base;
    }
    __syncthreads();
}

// one block of SORT_WARPS warps; shared: cnt[SORT_WARPS][E], tot[E], tiles[E] ints
__global__ void __launch_bounds__(SORT_WARPS * 32) k_moe_sort(sort_args a) {
    UMK_DYNAMIC_SMEM(smem);
    const int E = a.E, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int *cnt = reinterpret_cast<int *>(smem), *tot = cnt + SORT_WARPS * E, *tiles = tot + E;
    __shared__ int seg[32], totals[2];
    for (int i = tid; i < SORT_WARPS * E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    // warp w owns pairs [w*chunk, (w+1)*chunk)
    const int chunk = (a.nk + SORT_WARPS - 1) / SORT_WARPS;
    const int lo = warp * chunk, hi = lo + chunk < a.nk ? lo + chunk : a.nk;
    for (int i = lo + lane; i < hi; i += 32) atomicAdd(&cnt[warp * E + a.idx[i]], 1);
    __syncthreads();
    // per expert: totals, and each warp's first row relative to the expert's offset
    for (int e = tid; e < E; e += blockDim.x) {
        int s = 0;
        for (int w = 0; w < SORT_WARPS; w++) {
            const int c = cnt[w * E + e];
            cnt[w * E + e] = s;
            s += c;
        }
        tot[e] = s;
        tiles[e] = e >= a.e0 && e < a.e1 ? (s + a.tile_rows - 1) / a.tile_rows : 0;
    }
    __syncthreads();
    block_scan(tot, E, seg, &totals[0]);     // tot[e] = offset of expert e
    block_scan(tiles, E, seg, &totals[1]);   // tiles[e] = first tile of expert e
    for (int e = tid; e < E; e += blockDim.x) {
        const int end = e + 1 < E ? tot[e + 1] : totals[0];
        a.offsets[e] = tot[e];
        for (int j = 0, r = tot[e]; r < end && e >= a.e0 && e < a.e1 && tiles[e] + j < a.max_tiles;
             j++, r += a.tile_rows) {
            a.tile_e[tiles[e] + j] = e;
            a.tile_r[tiles[e] + j] = r;
        }
        for (int w = 0; w < SORT_WARPS; w++) cnt[w * E + e] += tot[e];
    }
    if (tid == 0) a.offsets[E] = totals[0];
    for (int j = totals[1] + tid; j < a.max_tiles; j += blockDim.x) a.tile_e[j] = -1;
    __syncthreads();
    // stable scatter: 32 pairs at a time per warp; a lane's rank among the lanes with its expert
    // comes from ballots over the expert's bits. Uniform trip count for the barriers.
    int bits = 0;
    while ((1 << bits) < E) bits++;
    const int rounds = (chunk + 31) / 32;
    for (int r = 0; r < rounds; r++) {
        const int i = lo + r * 32 + lane;
        const bool valid = i < hi;
        const int e = valid ? a.idx[i] : 0;
        unsigned same = __ballot_sync(FULL, valid);
        for (int b = 0; b < bits; b++) {
            const unsigned ones = __ballot_sync(FULL, (e >> b) & 1);
            same &= (e >> b) & 1 ? ones : ~ones;
        }
        const int rank = __popc(same & ((1u << lane) - 1u));
        const int row = valid ? cnt[warp * E + e] + rank : 0;
        __syncthreads();
        if (valid) {
            a.slot[i] = e >= a.e0 && e < a.e1 ? row : -1;
            a.tok[row] = i / a.k;
            if (rank == 0) cnt[warp * E + e] += __popc(same);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------- grouped GEMM

constexpr int BM = 64, BN = 64, BK = 32, LDS = BK + 8;   // tile sizes; shared row stride (80 bytes)

struct gemm_args {
    const uint16_t         *a;        // GATED: x [n, kd] rows by token; else [nk, kd] sorted rows
    const int32_t          *tok;      // [nk] token of each sorted row (GATED)
    const uint16_t *const  *w0;       // [E] expert weights [N, kd] (gate, or down)
    const uint16_t *const  *w1;       // [E] up (GATED)
    const int32_t          *offsets;  // [E + 1]
    const int32_t          *tile_e, *tile_r;
    int                     N, kd;
    uint16_t               *y;        // [nk, N] sorted rows
};

__device__ __forceinline__ uint32_t ld32(const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); }

// rows [r0, r0 + 64) x k [k0, k0 + 32) of a row source into s[64][LDS]; rows past `rows` and k past
// kd are zero (kd % 8 == 0: 16-byte chunks never straddle the end)
template <bool GATHER>
__device__ __forceinline__ void load_tile(uint16_t *s, const uint16_t *src, const int32_t *tok, int r0, int rows,
                                          int k0, int kd) {
    for (int c = threadIdx.x; c < BM * (BK / 8); c += blockDim.x) {
        const int r = c / (BK / 8), k8 = (c % (BK / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r0 + r < rows && k0 + k8 < kd) {
            const int64_t row = GATHER ? tok[r0 + r] : r0 + r;
            v = *reinterpret_cast<const uint4 *>(src + row * kd + k0 + k8);
        }
        *reinterpret_cast<uint4 *>(s + r * LDS + k8) = v;
    }
}

template <bool GATED>
__global__ void __launch_bounds__(128) k_moe_gemm(gemm_args a) {
    __shared__ __align__(16) uint16_t As[BM * LDS];
    __shared__ __align__(16) uint16_t Bs[GATED ? 2 : 1][BN * LDS];
    const int e = a.tile_e[blockIdx.x];
    if (e < 0) return;
    const int r0 = a.tile_r[blockIdx.x], r_end = a.offsets[e + 1];
    const int n0 = blockIdx.y * BN;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;   // this warp's 32 x 32 of the tile
    const uint16_t *w0 = a.w0[e];
    const uint16_t *w1 = GATED ? a.w1[e] : nullptr;
    float acc[GATED ? 2 : 1][2][4][4];
#pragma unroll
    for (int q = 0; q < (GATED ? 2 : 1); q++)
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < 4; ni++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[q][mi][ni][c] = 0.0f;

    for (int k0 = 0; k0 < a.kd; k0 += BK) {
        load_tile<GATED>(As, a.a, a.tok, r0, r_end, k0, a.kd);
        // weight rows n0.. (output columns) as the B operand, k-contiguous
        load_tile<false>(Bs[0], w0 + (int64_t)n0 * a.kd, nullptr, 0, a.N - n0, k0, a.kd);
        if (GATED) load_tile<false>(Bs[GATED ? 1 : 0], w1 + (int64_t)n0 * a.kd, nullptr, 0, a.N - n0, k0, a.kd);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const uint16_t *p = As + (wm + mi * 16 + g) * LDS + kk + 2 * t4;
                af[mi][0] = ld32(p);
                af[mi][1] = ld32(p + 8 * LDS);
                af[mi][2] = ld32(p + 8);
                af[mi][3] = ld32(p + 8 * LDS + 8);
            }
#pragma unroll
            for (int q = 0; q < (GATED ? 2 : 1); q++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) {
                    const uint16_t *p = Bs[q] + (wn + ni * 8 + g) * LDS + kk + 2 * t4;
                    const uint32_t b0 = ld32(p), b1 = ld32(p + 8);
#pragma unroll
                    for (int mi = 0; mi < 2; mi++) umk_mma_bf16_16816(acc[q][mi][ni], af[mi], b0, b1);
                }
        }
        __syncthreads();
    }

    // epilogue: c0/c1 at (row g, cols 2t, 2t+1), c2/c3 at row g + 8
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = r0 + wm + mi * 16 + g + h * 8, col = n0 + wn + ni * 8 + 2 * t4;
                if (row >= r_end) continue;
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const float x0 = acc[0][mi][ni][2 * h + c];
                    if (GATED) {
                        const float gt = b2f(f2b(x0)), up = b2f(f2b(acc[GATED ? 1 : 0][mi][ni][2 * h + c]));
                        v[c] = gt / (1.0f + expf(-gt)) * up;
                    } else {
                        v[c] = x0;
                    }
                }
                uint16_t *out = a.y + (int64_t)row * a.N + col;
                if (col + 1 < a.N) {
                    out[0] = f2b(v[0]);
                    out[1] = f2b(v[1]);
                } else if (col < a.N) {
                    out[0] = f2b(v[0]);
                }
            }
}

}  // namespace

extern "C" size_t umk_moe_route_smem(int n_experts, int top_k, int n_group) {
    return (size_t)(2 * n_experts + n_group) * sizeof(double) + (size_t)top_k * sizeof(int) +
           (size_t)(n_experts + n_group);
}

extern "C" size_t umk_moe_sort_smem(int n_experts) { return (size_t)(SORT_WARPS + 2) * (size_t)n_experts * sizeof(int); }

extern "C" int umk_moe_tile_rows(void) { return BM; }

extern "C" cudaError_t umk_moe_route(const umk_moe_route_cfg *c, const uint16_t *logits, int n, int32_t *idx,
                                     float *w, cudaStream_t s) {
    route_args a;
    a.logits = logits;
    a.bias = c->bias;
    a.E = c->n_experts;
    a.K = c->top_k;
    a.sigmoid_group = c->sigmoid_group;
    a.G = c->sigmoid_group ? c->n_group : 1;
    a.topk_group = c->topk_group;
    a.scale = c->routed_scale;
    a.idx = idx;
    a.w = w;
    if (n > 0) UMK_LAUNCH(k_moe_route, n, 32, umk_moe_route_smem(a.E, a.K, a.G), s, a);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_moe_sort(const int32_t *idx, int n, int k, int n_experts, int e0, int e1, int max_tiles,
                                    int32_t *offsets, int32_t *slot, int32_t *tok, int32_t *tile_e, int32_t *tile_r,
                                    cudaStream_t s) {
    sort_args a;
    a.idx = idx;
    a.nk = n * k;
    a.k = k;
    a.E = n_experts;
    a.e0 = e0;
    a.e1 = e1;
    a.tile_rows = BM;
    a.max_tiles = max_tiles;
    a.offsets = offsets;
    a.slot = slot;
    a.tok = tok;
    a.tile_e = tile_e;
    a.tile_r = tile_r;
    if (n > 0) UMK_LAUNCH(k_moe_sort, 1, SORT_WARPS * 32, umk_moe_sort_smem(n_experts), s, a);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_moe_gemm(int gated, const uint16_t *x, const int32_t *tok, const uint16_t *const *w0,
                                    const uint16_t *const *w1, const int32_t *offsets, const int32_t *tile_e,
                                    const int32_t *tile_r, int max_tiles, int N, int kd, uint16_t *y, cudaStream_t s) {
    gemm_args a;
    a.a = x;
    a.tok = tok;
    a.w0 = w0;
    a.w1 = w1;
    a.offsets = offsets;
    a.tile_e = tile_e;
    a.tile_r = tile_r;
    a.N = N;
    a.kd = kd;
    a.y = y;
    const dim3 grid((unsigned)max_tiles, (unsigned)((N + BN - 1) / BN));
    if (max_tiles > 0) {
        if (gated)
            UMK_LAUNCH(k_moe_gemm<true>, grid, 128, 0, s, a);
        else
            UMK_LAUNCH(k_moe_gemm<false>, grid, 128, 0, s, a);
    }
    return cudaGetLastError();
}
