// gemm.cu — the weight-streaming GEMM of the few rows of a decode step (m <= 64 activation rows):
// y[m, N] = x[m, K] · Wᵀ with W bf16 or FP8 E4M3 (f32 scales per output channel or per 128-wide K
// group of row blocks), up to three products that share x in one launch (q/k/v, gate/up), and the
// linear op's epilogues: store, residual add (y += bf16(x·Wᵀ)), SwiGLU (y = silu(g)·u of two
// products). Also the FP8 conversions of the CUDA backend: a float matrix quantized per output
// channel at load, and an FP8 matrix dequantized to bf16 rows for cuBLAS when m is large.
//
// At m <= 64 a step's time is the weight bytes over HBM bandwidth, so the kernel is built to keep
// every SM streaming weights: a block owns 128 weight rows (16 per warp, the M side of
// mma.sync.m16n8k16) and a K range; the K dimension is split over blocks until the grid fills the
// SMs twice; weights and x arrive through a cp.async pipeline of 128-byte row segments (3–4 stages,
// 16-byte chunks swizzled by row parity: conflict-free 16-byte fragment loads, one per two or four
// mma steps). FP8 bytes become bf16 in registers (exact), so the tensor cores see bf16 × bf16 →
// fp32 as with bf16 weights. Split-K partials go to a workspace as one float4 row per thread
// (coalesced); the last block of a tile (an atomic count per tile, reset by that block) sums them
// in split order — deterministic — and applies the epilogue. Version log: docs/gpu.md.
// Does not: allocate, handle m > 64 (cuBLAS does), or read weights whose row bytes are not a
// multiple of 16. Launched by src/backend/cuda/ on the backend's stream; graph-capturable.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string.h>

#include "um_kernels.h"
#include "umk_portable.h"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int GS_THREADS = 256;   // 8 warps
constexpr int GS_BN = 128;        // weight rows (output columns) per tile, 16 per warp
constexpr int GS_KB = 128;        // bytes of a weight row per stage (64 bf16, 128 fp8)

__device__ __forceinline__ float b2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
__device__ __forceinline__ uint16_t f2b(float f) {
    bf16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

struct gs_args {
    const uint16_t *x;              // [m, k] bf16
    int             m, k;
    int             n_prod;         // 1..3
    const void     *w[3];           // [n[p], k] bf16 or fp8
    const float    *scale[3];       // fp8: [ceil(n/scale_rows), groups] (groups = 1 or ceil(k/128))
    int             scale_rows[3];
    uint16_t       *y[3];           // [m, n[p]]
    int             n[3];
    int             tile0[4];       // first global tile of product p; tile0[n_prod] = all tiles
    int             epi;            // UMK_GEMM_STORE / ADD / SWIGLU
    int             splits;         // K ranges (grid.y)
    int             st_per_split;   // stages per K range
    int             n_stages;       // ceil(k * elem bytes / 128)
    float          *ws;             // split-K partials (splits > 1 or SWIGLU)
    unsigned       *count;          // per tile (SWIGLU: per tile of product 0), zero between launches
};

// Shared-memory layout (v3): a stage holds the tile's 128 weight rows of 128 bytes and the x rows
// of KT elements, unpadded; the 16-byte chunk c of row r sits in slot c ^ swz(r) of its row, which
// makes the fragment loads below conflict-free (a quarter-warp reads rows 2q and 2q + 1: the XOR
// sends their chunks to disjoint bank groups). Weights and x of a bf16 product: swz = 4 (r & 1);
// x of an FP8 product (256-byte rows, two chunks per lane): swz = r & 1.
//
// K order inside a stage (v3): each lane loads 16 contiguous bytes per row and feeds them to
// consecutive mma steps, so the 16 k of an mma step are not 16 consecutive k but a fixed
// interleave. Weights and x use the same one, so the products and sums are the same set; only the
// order of the fp32 additions inside the tensor core differs from a plain k order. For lane
// (g, t4) and mma step i of a stage, the elements that stand for the fragment's k = 2t4, 2t4 + 1
// (registers a0/a1, b0) and 2t4 + 8, 2t4 + 9 (a2/a3, b1) are
//   bf16 weights (4 steps of 16 in 64): 32 (i >> 1) + 8 t4 + 4 (i & 1) + {0, 1} and + {2, 3}
//   FP8 weights (8 steps in 128):       64 (i >> 2) + 16 t4 + 4 (i & 3) + {0, 1} and + {2, 3}
//
// WT: 0 bf16 weights, 1 fp8 with one scale per row over all of k, 2 fp8 with a scale per 128-wide
// k group (one stage). MT: 8-row tiles of x (m <= 8 * MT). S: pipeline stages.
template <int MT, int WT, int S>
__global__ void __launch_bounds__(GS_THREADS, 2) k_gemm_skinny(gs_args a) {
    constexpr int KT = WT == 0 ? GS_KB / 2 : GS_KB;   // k elements per stage
    constexpr int XB = KT * 2;                        // bytes of an x row per stage
    constexpr int XR = MT * 8;                        // x rows staged (rows >= m are zeros)
    constexpr int WSTAGE = GS_BN * GS_KB;
    constexpr int STAGE = WSTAGE + XR * XB;
    constexpr int XSWZ = WT == 0 ? 4 : 1;
    constexpr int WCH = GS_BN * (GS_KB / 16) / GS_THREADS;   // weight chunks per thread and stage (4)
    constexpr int XCH = XR * (XB / 16);                      // x chunks per stage
    constexpr int XPT = (XCH + GS_THREADS - 1) / GS_THREADS; // per thread (threads past XCH: none)
    UMK_DYNAMIC_SMEM(smem);
    __shared__ int s_last;

    // which product and tile
    int p = 0;
    while (p + 1 < a.n_prod && (int)blockIdx.x >= a.tile0[p + 1]) p++;
    const int tile = blockIdx.x;                      // global tile
    const int n0 = (tile - a.tile0[p]) * GS_BN;
    const int N = a.n[p];
    const unsigned char *W = static_cast<const unsigned char *>(a.w[p]);
    const int wes = WT == 0 ? 2 : 1;                  // weight element bytes
    const int64_t wrow = (int64_t)a.k * wes;
    const int split = blockIdx.y;
    const int st0 = split * a.st_per_split;
    const int st1 = min(st0 + a.st_per_split, a.n_stages);
    const int nst = max(st1 - st0, 0);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

    // this thread's cp.async chunks, addressed once: chunk i of a stage is column group tid % 8 of
    // weight row tid / 8 + 32 i (x: column group tid % (XB / 16) of row tid / (XB / 16) + XRP i);
    // each row's parity, hence its swizzle, is the same for all i
    constexpr int XCPR = XB / 16, XRP = GS_THREADS / XCPR;   // x chunks per row, rows per pass
    const int wr = tid / 8, wc = tid % 8;
    const int w_rows_left = N - (n0 + wr);                 // chunk i exists while 32 i < this
    const unsigned char *wsrc = W + (w_rows_left > 0 ? (int64_t)(n0 + wr) * wrow : 0) + wc * 16;
    const int64_t wstep = 32 * wrow;
    const int wdst = wr * GS_KB + ((wc ^ ((wr & 1) << 2)) * 16);
    const int xr = tid / XCPR, xc = tid % XCPR;
    const unsigned char *xsrc = reinterpret_cast<const unsigned char *>(a.x) + (int64_t)xr * a.k * 2 + xc * 16;
    const int xdst = WSTAGE + xr * XB + ((xc ^ ((xr & 1) * XSWZ)) * 16);

    auto load_stage = [&](int buf, int st) {
        unsigned char *sb = smem + buf * STAGE;
        const int64_t kb = (int64_t)st * GS_KB;       // byte offset in a weight row
        const bool kok = kb + wc * 16 < wrow;
#pragma unroll
        for (int i = 0; i < WCH; i++) {
            const bool ok = kok && 32 * i < w_rows_left;
            umk_cp_async16(sb + wdst + i * 32 * GS_KB, ok ? wsrc + i * wstep + kb : W, ok);
        }
        const int64_t kx = (int64_t)st * XB;          // byte offset in an x row
        const bool xkok = kx + xc * 16 < (int64_t)a.k * 2;
#pragma unroll
        for (int i = 0; i < XPT; i++) {
            if (XCH % GS_THREADS != 0 && tid + i * GS_THREADS >= XCH) continue;
            const bool ok = xkok && xr + i * XRP < a.m;
            const unsigned char *src =
                ok ? xsrc + (int64_t)i * XRP * a.k * 2 + kx : reinterpret_cast<const unsigned char *>(a.x);
            umk_cp_async16(sb + xdst + i * XRP * XB, src, ok);
        }
    };

    float acc[MT][4];
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[j][c] = 0.0f;

    // this lane's two weight rows (C rows g and g + 8 of the warp's 16) and their scales
    const int wr0 = warp * 16 + g;
    const float *sc = WT != 0 ? a.scale[p] : nullptr;
    const int ngk = WT == 2 ? (a.k + KT - 1) / KT : 1;
    const int srows = WT != 0 ? a.scale_rows[p] : 1;
    int sidx0 = 0, sidx1 = 0;
    if (WT != 0) {
        sidx0 = (min(n0 + wr0, N - 1) / srows) * ngk;
        sidx1 = (min(n0 + wr0 + 8, N - 1) / srows) * ngk;
    }
    // the lane's fragment bytes in a stage: rows wr0 and wr0 + 8 (same parity: same swizzle), x rows
    // j * 8 + g (the parity of g); chunk q of a row is this lane's q-th group of 16 bytes
    const int wswz = (g & 1) << 2, xswz = (g & 1) * XSWZ;
    const int w0off = wr0 * GS_KB, w1off = (wr0 + 8) * GS_KB, xoff = WSTAGE + g * XB;

#pragma unroll
    for (int i = 0; i < S - 1; i++) {
        if (i < nst) load_stage(i, st0 + i);
        umk_cp_async_commit();
    }
    for (int i = 0; i < nst; i++) {
        umk_cp_async_wait<S - 2>();
        __syncthreads();
        if (i + S - 1 < nst) load_stage((i + S - 1) % S, st0 + i + S - 1);
        umk_cp_async_commit();

        const unsigned char *base = smem + (i % S) * STAGE;
        float part[WT == 2 ? MT : 1][4];
        if (WT == 2) {
#pragma unroll
            for (int j = 0; j < (WT == 2 ? MT : 1); j++)
#pragma unroll
                for (int c = 0; c < 4; c++) part[j][c] = 0.0f;
        }
        // two groups of 16 bytes per weight row and stage (2 mma steps each for bf16, 4 for FP8),
        // taken 2 steps at a time: one 16-byte chunk of each x row feeds 2 steps
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const int wch = ((t4 + 4 * q) ^ wswz) * 16;
            const uint4 r0 = *reinterpret_cast<const uint4 *>(base + w0off + wch);
            const uint4 r1 = *reinterpret_cast<const uint4 *>(base + w1off + wch);
#pragma unroll
            for (int h = 0; h < (WT == 0 ? 1 : 2); h++) {
                uint32_t af[2][4];
                if (WT == 0) {
                    af[0][0] = r0.x, af[0][1] = r1.x, af[0][2] = r0.y, af[0][3] = r1.y;
                    af[1][0] = r0.z, af[1][1] = r1.z, af[1][2] = r0.w, af[1][3] = r1.w;
                } else {
                    umk_fp8x4_to_bf16x2x2(h ? r0.z : r0.x, af[0][0], af[0][2]);
                    umk_fp8x4_to_bf16x2x2(h ? r1.z : r1.x, af[0][1], af[0][3]);
                    umk_fp8x4_to_bf16x2x2(h ? r0.w : r0.y, af[1][0], af[1][2]);
                    umk_fp8x4_to_bf16x2x2(h ? r1.w : r1.y, af[1][1], af[1][3]);
                }
                const int xch = ((WT == 0 ? t4 + 4 * q : 8 * q + 2 * t4 + h) ^ xswz) * 16;
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    const uint4 xv = *reinterpret_cast<const uint4 *>(base + xoff + j * 8 * XB + xch);
                    float(&d)[4] = WT == 2 ? part[WT == 2 ? j : 0] : acc[j];
                    umk_mma_bf16_16816(d, af[0], xv.x, xv.y);
                    umk_mma_bf16_16816(d, af[1], xv.z, xv.w);
                }
            }
        }
        if (WT == 2) {   // this stage is one k group: acc += scale * part
            const int gi = st0 + i;
            const float s0 = sc[sidx0 + gi], s1 = sc[sidx1 + gi];
#pragma unroll
            for (int j = 0; j < MT; j++) {
                acc[j][0] += s0 * part[WT == 2 ? j : 0][0];
                acc[j][1] += s0 * part[WT == 2 ? j : 0][1];
                acc[j][2] += s1 * part[WT == 2 ? j : 0][2];
                acc[j][3] += s1 * part[WT == 2 ? j : 0][3];
            }
        }
    }
    umk_cp_async_wait<0>();
    if (WT == 1) {
        const float s0 = sc[sidx0], s1 = sc[sidx1];
#pragma unroll
        for (int j = 0; j < MT; j++) {
            acc[j][0] *= s0;
            acc[j][1] *= s0;
            acc[j][2] *= s1;
            acc[j][3] *= s1;
        }
    }

    // split-K / SwiGLU: partials in fragment order, the tile's last block reduces
    const bool swiglu = a.epi == UMK_GEMM_SWIGLU;
    const bool reduce = a.splits > 1 || swiglu;
    float v2[MT][4];   // SwiGLU: the up product's values (product 1)
    if (reduce) {
        // [tile][split][j][thread] of float4: each warp's store is 512 contiguous bytes
        float4 *mine =
            reinterpret_cast<float4 *>(a.ws) + (int64_t)(tile * a.splits + split) * MT * GS_THREADS + tid;
#pragma unroll
        for (int j = 0; j < MT; j++) mine[j * GS_THREADS] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        __threadfence();
        __syncthreads();
        const int ctile = swiglu ? tile - a.tile0[p] : tile;   // SwiGLU: gate and up tiles share a count
        const unsigned need = (unsigned)a.splits * (swiglu ? 2u : 1u);
        if (tid == 0) {
            const unsigned prev = atomicAdd(&a.count[ctile], 1u);
            s_last = prev + 1 == need;
            if (s_last) a.count[ctile] = 0;   // every arrival has counted: ready for the next launch
        }
        __syncthreads();
        if (!s_last) return;
        __threadfence();
        // acc is in the workspace already: sum the tile's splits into it (and SwiGLU's up tile into v2)
        auto reduce_into = [&](float(&sum)[MT][4], int t) {
#pragma unroll
            for (int j = 0; j < MT; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) sum[j][c] = 0.0f;
            for (int s = 0; s < a.splits; s++) {
                const float4 *src =
                    reinterpret_cast<const float4 *>(a.ws) + (int64_t)(t * a.splits + s) * MT * GS_THREADS + tid;
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    const float4 v = umk_ldcg_f32x4(src + j * GS_THREADS);
                    sum[j][0] += v.x;
                    sum[j][1] += v.y;
                    sum[j][2] += v.z;
                    sum[j][3] += v.w;
                }
            }
        };
        reduce_into(acc, swiglu ? a.tile0[0] + ctile : tile);
        if (swiglu) reduce_into(v2, a.tile0[1] + ctile);
    }

    // epilogue: C[w row][x row]: c0/c1 at (wr0, x rows 2t, 2t+1), c2/c3 at (wr0 + 8, ...)
    const int yp = swiglu ? 0 : p;
    uint16_t *Y = a.y[yp];
    const int NY = a.n[yp];
#pragma unroll
    for (int j = 0; j < MT; j++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int col = n0 + wr0 + (c >> 1) * 8, row = j * 8 + 2 * t4 + (c & 1);
            if (col >= NY || row >= a.m) continue;
            uint16_t *out = Y + (int64_t)row * NY + col;
            if (a.epi == UMK_GEMM_STORE) {
                *out = f2b(acc[j][c]);
            } else if (a.epi == UMK_GEMM_ADD) {
                *out = f2b(b2f(*out) + b2f(f2b(acc[j][c])));
            } else {
                *out = f2b(silu_mul(b2f(f2b(acc[j][c])), b2f(f2b(v2[j][c]))));
            }
        }
}

template <int MT, int WT>
constexpr int gs_stages() {
    return MT == 8 ? 3 : 4;
}
template <int MT, int WT>
constexpr size_t gs_smem() {
    return (size_t)gs_stages<MT, WT>() *
           (size_t)(GS_BN * GS_KB + MT * 8 * (WT == 0 ? GS_KB / 2 : GS_KB) * 2);
}

template <int MT, int WT>
cudaError_t gs_launch(const gs_args &a, dim3 grid, cudaStream_t s) {
    constexpr int S = gs_stages<MT, WT>();
    // the shared-memory limit was raised above 48 KiB for this device by umk_gemm_skinny_prepare (not
    // here: no runtime API call but the launch while a graph may be capturing)
    constexpr size_t sm = gs_smem<MT, WT>();
    UMK_LAUNCH((k_gemm_skinny<MT, WT, S>), grid, GS_THREADS, sm, s, a);
    return cudaGetLastError();
}

template <int MT, int WT>
cudaError_t gs_prepare() {
    return cudaFuncSetAttribute(k_gemm_skinny<MT, WT, gs_stages<MT, WT>()>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)gs_smem<MT, WT>());
}

template <int WT>
cudaError_t gs_prepare_wt() {
    cudaError_t e;
    if ((e = gs_prepare<1, WT>()) != cudaSuccess || (e = gs_prepare<2, WT>()) != cudaSuccess ||
        (e = gs_prepare<4, WT>()) != cudaSuccess || (e = gs_prepare<8, WT>()) != cudaSuccess)
        return e;
    return cudaSuccess;
}

template <int WT>
cudaError_t gs_launch_mt(int mt, const gs_args &a, dim3 grid, cudaStream_t s) {
    switch (mt) {
    case 1: return gs_launch<1, WT>(a, grid, s);
    case 2: return gs_launch<2, WT>(a, grid, s);
    case 4: return gs_launch<4, WT>(a, grid, s);
    default: return gs_launch<8, WT>(a, grid, s);
    }
}

// ---------------------------------------------------------------- FP8 conversions

// one block per row: scale = amax / 448 (1 for an all-zero row), q = e4m3(x / scale)
__global__ void __launch_bounds__(256) k_fp8_quant_rows(const uint16_t *x, int64_t k, unsigned char *q, float *scale) {
    __shared__ float red[8];
    const int64_t row = blockIdx.x;
    const uint16_t *xr = x + row * k;
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(b2f(xr[i])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) amax = fmaxf(amax, red[i]);
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    if (threadIdx.x == 0) scale[row] = s;
    unsigned char *qr = q + row * k;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) qr[i] = umk_f32_to_fp8(b2f(xr[i]) / s);
}

// rows [r0, r0 + n) of an fp8 matrix with block scales -> bf16(fp8 * scale)
__global__ void k_fp8_dequant(const unsigned char *q, const float *scale, int scale_rows, int scale_cols, int64_t k,
                              int64_t r0, int64_t n, uint16_t *out) {
    const int64_t total = n * k, stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t groups = (k + scale_cols - 1) / scale_cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += stride) {
        const int64_t r = r0 + i / k, c = i % k;
        const float s = scale[(r / scale_rows) * groups + c / scale_cols];
        out[i] = f2b(umk_fp8_to_f32(q[r * k + c]) * s);
    }
}

// the same for a row of k % 16 == 0 bytes and scale groups of a multiple of 16 columns: a block per
// row, 16 bytes in, 32 out per thread and step, one scale per 16 columns, no 64-bit division
__global__ void __launch_bounds__(128) k_fp8_dequant16(const unsigned char *q, const float *scale, int scale_rows,
                                                      int scale_cols, int k, int64_t r0, uint16_t *out) {
    const int64_t r = r0 + blockIdx.x;
    const int groups = (k + scale_cols - 1) / scale_cols;
    const float *srow = scale + (int64_t)(r / scale_rows) * groups;
    const unsigned char *qr = q + r * k;
    uint16_t *orow = out + (int64_t)blockIdx.x * k;
    for (int c = threadIdx.x * 16; c < k; c += blockDim.x * 16) {
        const uint4 v = umk_ldg16(qr + c);
        const float s = srow[c / scale_cols];
        const uint32_t in[4] = {v.x, v.y, v.z, v.w};
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const uint32_t b2 = umk_fp8x2_to_bf16x2((uint16_t)(in[i >> 1] >> ((i & 1) * 16)));
            o[i] = (uint32_t)f2b(b2f((uint16_t)b2) * s) | ((uint32_t)f2b(b2f((uint16_t)(b2 >> 16)) * s) << 16);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(orow + c);
        dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
        dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
    }
}

// every pair of FP8 bytes through the skinny kernel's conversion: out[v] = umk_fp8x2_to_bf16x2(v)
__global__ void k_fp8x2_table(uint32_t *out) {
    const int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v < 65536) out[v] = umk_fp8x2_to_bf16x2((uint16_t)v);
}

// How a launch is cut: tiles of 128 weight rows over the products, and K split into ranges so
// that the blocks fill the SMs' slots (two blocks per SM) in whole waves: the smallest split count
// whose grid covers every slot at least once with >= 90% of the last wave used, each range >= 4
// stages; else the count that uses the slots best.
struct gs_plan {
    int tiles, splits, st_per_split, n_stages;
};

gs_plan plan_of(const umk_gemm_skinny_args *p) {
    gs_plan g = {0, 1, 1, 1};
    int fp8 = 0;
    for (int i = 0; i < p->n_prod && i < 3; i++) {
        g.tiles += (p->n[i] + GS_BN - 1) / GS_BN;
        if (p->scale[i]) fp8 = 1;
    }
    g.n_stages = (int)(((int64_t)p->k * (fp8 ? 1 : 2) + GS_KB - 1) / GS_KB);
    int splits = p->splits;
    if (splits <= 0 && g.tiles > 0) {
        const int slots = 2 * (p->n_sm > 0 ? p->n_sm : 132);
        const int most = g.n_stages / 4 > 1 ? g.n_stages / 4 : 1;
        double best_eff = -1.0;
        splits = 1;
        for (int sp = 1; sp <= most; sp++) {
            const int64_t b = (int64_t)g.tiles * sp, waves = (b + slots - 1) / slots;
            const double eff = (double)b / (double)(waves * slots);
            if (b >= slots && eff >= 0.9) {
                splits = sp;
                break;
            }
            if (eff > best_eff + 1e-9) best_eff = eff, splits = sp;
        }
    }
    if (splits < 1) splits = 1;
    g.st_per_split = (g.n_stages + splits - 1) / splits;
    g.splits = (g.n_stages + g.st_per_split - 1) / g.st_per_split;   // no empty ranges
    return g;
}

}  // namespace

extern "C" int umk_gemm_skinny_supported(int m, int k, int wtype, int scale_rows, int scale_cols) {
    if (m < 1 || m > UMK_GEMM_SKINNY_MAX_M || k < 1) return 0;
    if (wtype == 0) return k % 8 == 0;
    if (k % 16 != 0 || scale_rows < 1) return 0;
    return scale_cols >= k || scale_cols == GS_KB;   // one group per row, or one per 128-element stage
}

extern "C" size_t umk_gemm_skinny_ws_floats(const umk_gemm_skinny_args *p) {
    const gs_plan g = plan_of(p);
    if (g.splits == 1 && p->epi != UMK_GEMM_SWIGLU) return 0;
    const int mt = p->m <= 8 ? 1 : p->m <= 16 ? 2 : p->m <= 32 ? 4 : 8;
    return (size_t)g.tiles * (size_t)g.splits * GS_THREADS * (size_t)(mt * 4);
}

extern "C" cudaError_t umk_gemm_skinny(const umk_gemm_skinny_args *p, cudaStream_t s) {
    if (p->n_prod < 1 || p->n_prod > 3 || p->m < 1 || p->m > UMK_GEMM_SKINNY_MAX_M) return cudaErrorInvalidValue;
    if (p->epi == UMK_GEMM_SWIGLU && (p->n_prod != 2 || p->n[0] != p->n[1])) return cudaErrorInvalidValue;
    if (p->epi == UMK_GEMM_ADD && p->n_prod != 1) return cudaErrorInvalidValue;
    const gs_plan g = plan_of(p);
    if (g.tiles == 0) return cudaSuccess;
    gs_args a;
    memset(&a, 0, sizeof a);
    a.x = p->x;
    a.m = p->m;
    a.k = p->k;
    a.n_prod = p->n_prod;
    a.epi = p->epi;
    int fp8 = 0, per_row = 1, tiles = 0;
    for (int i = 0; i < p->n_prod; i++) {
        a.w[i] = p->w[i];
        a.scale[i] = p->scale[i];
        a.scale_rows[i] = p->scale_rows[i] > 0 ? p->scale_rows[i] : 1;
        a.y[i] = p->y[i];
        a.n[i] = p->n[i];
        a.tile0[i] = tiles;
        tiles += (p->n[i] + GS_BN - 1) / GS_BN;
        if ((p->scale[i] != nullptr) != (p->scale[0] != nullptr)) return cudaErrorInvalidValue;   // one weight type
        if (p->scale[i]) {
            fp8 = 1;
            if (!umk_gemm_skinny_supported(p->m, p->k, 1, a.scale_rows[i], p->scale_cols[i])) return cudaErrorInvalidValue;
            if (p->scale_cols[i] < p->k) per_row = 0;
        }
    }
    if (fp8 && !per_row) {
        for (int i = 0; i < p->n_prod; i++)
            if (p->scale_cols[i] != GS_KB) return cudaErrorInvalidValue;   // one scale mode per launch
    }
    if (!fp8 && p->k % 8 != 0) return cudaErrorInvalidValue;
    a.tile0[p->n_prod] = tiles;
    a.n_stages = g.n_stages;
    a.st_per_split = g.st_per_split;
    a.splits = g.splits;
    if (g.splits > 1 || p->epi == UMK_GEMM_SWIGLU) {
        const int ctiles = p->epi == UMK_GEMM_SWIGLU ? a.tile0[1] : tiles;
        if (!p->ws || !p->count || umk_gemm_skinny_ws_floats(p) > p->ws_floats || ctiles > p->n_count)
            return cudaErrorInvalidValue;
        a.ws = p->ws;
        a.count = p->count;
    }
    const int mt = p->m <= 8 ? 1 : p->m <= 16 ? 2 : p->m <= 32 ? 4 : 8;
    const dim3 grid((unsigned)tiles, (unsigned)g.splits);
    const int wt = fp8 ? (per_row ? 1 : 2) : 0;
    if (wt == 0) return gs_launch_mt<0>(mt, a, grid, s);
    if (wt == 1) return gs_launch_mt<1>(mt, a, grid, s);
    return gs_launch_mt<2>(mt, a, grid, s);
}

extern "C" cudaError_t umk_gemm_skinny_prepare(void) {
    cudaError_t e;
    if ((e = gs_prepare_wt<0>()) != cudaSuccess || (e = gs_prepare_wt<1>()) != cudaSuccess) return e;
    return gs_prepare_wt<2>();
}

extern "C" int umk_gemm_skinny_splits(const umk_gemm_skinny_args *p) { return plan_of(p).splits; }

extern "C" int umk_gemm_skinny_tiles(const umk_gemm_skinny_args *p) { return plan_of(p).tiles; }

extern "C" cudaError_t umk_fp8_quantize_rows(const uint16_t *x, int64_t rows, int64_t k, unsigned char *q, float *scale,
                                             cudaStream_t s) {
    if (rows > 0) UMK_LAUNCH(k_fp8_quant_rows, (unsigned)rows, 256, 0, s, x, k, q, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_fp8_dequantize(const unsigned char *q, const float *scale, int scale_rows, int scale_cols,
                                          int64_t k, int64_t r0, int64_t n, uint16_t *out, cudaStream_t s) {
    const int64_t total = n * k;
    if (total > 0 && k % 16 == 0 && scale_cols % 16 == 0 && k <= INT32_MAX && n <= INT32_MAX &&
        reinterpret_cast<uintptr_t>(q) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
        UMK_LAUNCH(k_fp8_dequant16, (unsigned)n, 128, 0, s, q, scale, scale_rows, scale_cols, (int)k, r0, out);
    } else if (total > 0) {
        int64_t blocks = (total + 255) / 256;
        if (blocks > 65535 * 8) blocks = 65535 * 8;
        UMK_LAUNCH(k_fp8_dequant, (unsigned)blocks, 256, 0, s, q, scale, scale_rows, scale_cols, k, r0, n, out);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t umk_fp8x2_table(uint32_t *out, cudaStream_t s) {
    UMK_LAUNCH(k_fp8x2_table, 256, 256, 0, s, out);
    return cudaGetLastError();
}
