// decode.cu — device side of a decode step: the fused confidence / sampling kernel and the
// decoders that choose commits, so a whole step needs no host synchronisation.
//
// k_sample: one block of 512 threads per requested logits row. Pass 1 streams the row once and
// computes, without writing anything back: the effective logits (CFG mix, eos flag), the argmax
// over tokens != mask (ties: lowest id), the confidence statistics (max and sum of exp in double,
// online rescaling), the candidate count and — when no top-k/top-p filter applies — the Gumbel-max
// sample. With top-k / top-p, an exact MSB-first radix select over order-preserving 32-bit keys
// (4 x 8-bit digits; counts for top-k, double masses for top-p) finds the threshold key, and a
// block-wide ordered scan finds the id cut inside a tie at the threshold (decode/sample.c sorts by
// value desc then id asc), so the candidate set equals the CPU's exactly. A final pass draws the
// Gumbel-max sample over the candidates. Noise: util/rng.h ported bit for bit.
// k_commit / k_begin: one block per sequence; decode/decoders.c's rules (low_confidence, random,
// threshold, factor; Dream's origin, maskgit_plus, topk_margin, entropy with its step schedule and
// alg_temp; the block-diffusion quota from the block length and LLaDA2's threshold rule) on the
// active block, commit into the packed canvas, block advance and EOS stop,
// the step record, and the next step's sample jobs + LM-head rows.
// Does not: allocate, synchronise. Launched on the backend's stream.
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "um_kernels.h"
#include "umk_portable.h"

namespace {

// ---------------------------------------------------------------- util/rng.h, ported

__device__ __forceinline__ uint64_t rng_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return rng_mix64(rng_mix64(seed ^ rng_mix64(stream + 0x632be59bd9b4e019ull)) + counter);
}

__device__ __forceinline__ double rng_u01(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r = rng_u64(seed, stream, counter) >> 11;
    return ((double)r + 0.5) * (1.0 / 9007199254740992.0);
}

// decode/sample.c sample_gumbel: stream = step, counter = pos * vocab + token
__device__ __forceinline__ double gumbel(uint64_t seed, int step, int pos, int vocab, int token) {
    const double u = rng_u01(seed, (uint64_t)step, (uint64_t)pos * (uint64_t)vocab + (uint64_t)token);
    return -log(-log(u));
}

// decode/decoders.c: the random decoder's score stream; Dream's origin draws and alg_temp noise
constexpr uint64_t RANDOM_SCORE_STREAM_BIT = 1ull << 62;
constexpr uint64_t ORIGIN_STREAM_BIT = 1ull << 61;
constexpr uint64_t ALG_TEMP_STREAM_BIT = 1ull << 60;

// IEEE single operations that are never contracted into a fused multiply-add (decoders.c computes
// Dream's schedule with volatile floats for the same reason): the schedule is bit-identical.
__device__ __forceinline__ float f_mul(float a, float b) {
#ifdef UNMASK_CUDA_EMU
    volatile float r = a * b;
    return r;
#else
    return __fmul_rn(a, b);
#endif
}
__device__ __forceinline__ float f_div(float a, float b) {
#ifdef UNMASK_CUDA_EMU
    volatile float r = a / b;
    return r;
#else
    return __fdiv_rn(a, b);
#endif
}
__device__ __forceinline__ float f_add(float a, float b) {
#ifdef UNMASK_CUDA_EMU
    volatile float r = a + b;
    return r;
#else
    return __fadd_rn(a, b);
#endif
}

// decode/decoders.c decoder_dream_timestep: linspace(1, eps, steps + 1)[i] as torch computes it
__device__ float dream_timestep(int steps, double eps, int i) {
    const float start = 1.0f, end = (float)eps;
    const float step = f_div(f_add(end, -start), (float)steps);
    if (i < (steps + 1) / 2) return f_add(start, f_mul(step, (float)i));
    return f_add(end, -f_mul(step, (float)(steps - i)));
}

// 1 - s/t of step i (decoders.c: the fraction of the masks a step commits)
__device__ float dream_frac(int steps, double eps, int i) {
    const float t = dream_timestep(steps, eps, i), s = dream_timestep(steps, eps, i + 1);
    return f_add(1.0f, -f_div(s, t));
}

// decode/decoders.c decoder_dream_quota
__device__ int dream_quota(int n, int steps, double eps, int i) {
    if (i >= steps - 1) return n;
    const int k = (int)f_mul((float)n, dream_frac(steps, eps, i));
    return k < 0 ? 0 : k > n ? n : k;
}

// ---------------------------------------------------------------- helpers

__device__ __forceinline__ float b2f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// order-preserving key: larger float -> larger key; -0 and +0 share a key (they compare equal)
__device__ __forceinline__ uint32_t fkey(float f) {
    if (f == 0.0f) f = 0.0f;
    const uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float key_to_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

constexpr int ST = 512;            // k_sample threads
constexpr int NW = ST / 32;

struct row_ctx {
    const uint16_t *c, *u;   // conditional / unconditional row (u NULL: no CFG)
    double          w;       // cfg_scale + 1
    int             eos_kill;
    int             mask_id;
};

// the effective logit (decode/sample.c: CFG in double, stored as float; l[eos] = -inf)
__device__ __forceinline__ float eff(const row_ctx &r, int v) {
    float l = b2f(r.c[v]);
    if (r.u) {
        const double uv = (double)b2f(r.u[v]);
        l = (float)(uv + r.w * ((double)l - uv));
        if (isnan(l)) l = -INFINITY;  // -inf rows (-inf + inf): the token is impossible (as sample.c)
    }
    if (v == r.eos_kill) l = -INFINITY;
    return l;
}

__device__ __forceinline__ bool is_cand(const row_ctx &r, int v, float l) { return v != r.mask_id && isfinite(l); }

// (value desc, id asc) ordering for argmax-style reductions
template <typename T>
__device__ __forceinline__ bool better(T a, int ia, T b, int ib) {
    return a > b || (a == b && ia < ib);
}

struct sample_smem {
    unsigned int cnt[256];
    double       mass[256];
    double       d[NW], d2[NW];
    float        f[NW];
    int          i[NW], i2[NW];
    int          bcast_i, bcast_i2;
    unsigned int bcast_cnt;
    double       bcast_d, bcast_before, bcast_target;
};

template <typename T>
__device__ void block_argmax(sample_smem &sm, T &v, int &id) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const T ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (better(ov, oi, v, id)) v = ov, id = oi;
    }
    const int w = threadIdx.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        if constexpr (sizeof(T) == 8) sm.d[w] = (double)v;
        else sm.f[w] = (float)v;
        sm.i[w] = id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        T bv;
        if constexpr (sizeof(T) == 8) bv = (T)sm.d[0];
        else bv = (T)sm.f[0];
        int bi = sm.i[0];
        for (int k = 1; k < NW; k++) {
            T kv;
            if constexpr (sizeof(T) == 8) kv = (T)sm.d[k];
            else kv = (T)sm.f[k];
            if (better(kv, sm.i[k], bv, bi)) bv = kv, bi = sm.i[k];
        }
        if constexpr (sizeof(T) == 8) sm.bcast_d = (double)bv;
        else sm.f[0] = (float)bv;
        sm.bcast_i = bi;
    }
    __syncthreads();
    if constexpr (sizeof(T) == 8) v = (T)sm.bcast_d;
    else v = (T)sm.f[0];
    id = sm.bcast_i;
    __syncthreads();
}

__device__ int block_sum_int(sample_smem &sm, int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.i2[threadIdx.x >> 5] = v;
    __syncthreads();
    int t = 0;
    for (int k = 0; k < NW; k++) t += sm.i2[k];
    __syncthreads();
    return t;
}

// combine (max, sum exp(x - max)) pairs
__device__ __forceinline__ void lse_combine(double &m, double &z, double om, double oz) {
    if (om == -INFINITY) return;
    if (m == -INFINITY) {
        m = om, z = oz;
    } else if (om > m) {
        z = z * exp(m - om) + oz, m = om;
    } else {
        z += oz * exp(om - m);
    }
}

__device__ void block_lse(sample_smem &sm, double &m, double &z) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const double om = __shfl_xor_sync(0xffffffffu, m, o), oz = __shfl_xor_sync(0xffffffffu, z, o);
        lse_combine(m, z, om, oz);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.d[threadIdx.x >> 5] = m, sm.d2[threadIdx.x >> 5] = z;
    __syncthreads();
    double bm = -INFINITY, bz = 0.0;
    for (int k = 0; k < NW; k++) lse_combine(bm, bz, sm.d[k], sm.d2[k]);
    m = bm, z = bz;
    __syncthreads();
}

// Filter: members of the candidate set after top-k (tk/idk) and top-p (tp/idp) cuts.
struct cut {
    bool     on;
    uint32_t key;   // keep key > key, or key == key and id <= id
    int      id;
};

__device__ __forceinline__ bool pass_cut(const cut &c, uint32_t key, int v) {
    return !c.on || key > c.key || (key == c.key && v <= c.id);
}

// The need-th smallest id (1-based) among v with key == tau that pass `pre` (block-uniform result).
template <typename Pred>
__device__ int nth_id_with_key(sample_smem &sm, const row_ctx &r, int V, uint32_t tau, int need, Pred pre) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int seen = 0, found = -1;
    for (int base = 0; base < V; base += ST) {
        const int v = base + (int)threadIdx.x;
        bool f = false;
        if (v < V) {
            const float l = eff(r, v);
            f = is_cand(r, v, l) && fkey(l) == tau && pre(fkey(l), v);
        }
        const unsigned bal = __ballot_sync(0xffffffffu, f);
        const int wpre = __popc(bal & ((1u << lane) - 1u));
        __syncthreads();
        if (lane == 0) sm.i2[w] = __popc(bal);
        __syncthreads();
        int off = 0, tot = 0;
        for (int k = 0; k < NW; k++) {
            if (k < w) off += sm.i2[k];
            tot += sm.i2[k];
        }
        if (f && seen + off + wpre + 1 == need) sm.bcast_i2 = v;
        seen += tot;
        __syncthreads();
        if (seen >= need) {
            found = sm.bcast_i2;
            break;
        }
    }
    __syncthreads();
    return found;
}

// top-k: the k-th largest key among the candidates, and the id cut inside its tie group
__device__ cut select_top_k(sample_smem &sm, const row_ctx &r, int V, int k) {
    uint32_t prefix = 0, pmask = 0;
    int kk = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += ST) sm.cnt[i] = 0;
        __syncthreads();
        for (int v = threadIdx.x; v < V; v += ST) {
            const float l = eff(r, v);
            if (!is_cand(r, v, l)) continue;
            const uint32_t key = fkey(l);
            if ((key & pmask) == prefix) atomicAdd(&sm.cnt[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int cum = 0, b = 255;
            for (; b > 0; b--) {
                if (cum + (int)sm.cnt[b] >= kk) break;
                cum += (int)sm.cnt[b];
            }
            sm.bcast_i = b;
            sm.bcast_i2 = kk - cum;
        }
        __syncthreads();
        prefix |= (uint32_t)sm.bcast_i << shift;
        pmask |= 255u << shift;
        kk = sm.bcast_i2;
        __syncthreads();
    }
    cut c;
    c.on = true;
    c.key = prefix;
    c.id = nth_id_with_key(sm, r, V, prefix, kk, [](uint32_t, int) { return true; });
    return c;
}

// top-p over softmax(l / T) restricted to the members of ck: the smallest prefix (value desc, id
// asc) whose mass reaches top_p. Returns an inactive cut when rounding leaves the target unreached
// (the CPU then keeps every candidate).
__device__ cut select_top_p(sample_smem &sm, const row_ctx &r, int V, const cut &ck, double mx, double T,
                            double top_p) {
    uint32_t prefix = 0, pmask = 0;
    double before = 0.0, target = 0.0;   // mass of members above the current prefix; top_p * z
    bool reached = true;
    unsigned int last_cnt = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += ST) sm.cnt[i] = 0, sm.mass[i] = 0.0;
        __syncthreads();
        for (int v = threadIdx.x; v < V; v += ST) {
            const float l = eff(r, v);
            if (!is_cand(r, v, l)) continue;
            const uint32_t key = fkey(l);
            if (!pass_cut(ck, key, v) || (key & pmask) != prefix) continue;
            const unsigned b = (key >> shift) & 255u;
            atomicAdd(&sm.cnt[b], 1u);
            atomicAdd(&sm.mass[b], exp(((double)l - mx) / T));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            if (shift == 24) {   // first digit: every member is binned -> the normaliser
                double z = 0.0;
                for (int b = 0; b < 256; b++) z += sm.mass[b];
                sm.bcast_target = top_p * z;
            }
            const double tgt = sm.bcast_target;
            double acc = before, acc_lowest = before;
            int chosen = -1, lowest = -1;
            for (int b = 255; b >= 0; b--) {
                if (!sm.cnt[b]) continue;
                lowest = b;
                acc_lowest = acc;
                if (acc + sm.mass[b] >= tgt) {
                    chosen = b;
                    break;
                }
                acc += sm.mass[b];
            }
            // Below the first digit the sub-bins re-sum the chosen bin in another order: a miss
            // there is rounding, so the cut falls in the last (lowest) sub-bin.
            if (chosen < 0 && shift != 24 && lowest >= 0) chosen = lowest, acc = acc_lowest;
            sm.bcast_i = chosen;
            sm.bcast_before = chosen >= 0 ? acc : before;
            sm.bcast_cnt = chosen >= 0 ? sm.cnt[chosen] : 0u;
        }
        __syncthreads();
        if (sm.bcast_i < 0) reached = false;
        else prefix |= (uint32_t)sm.bcast_i << shift;
        pmask |= 255u << shift;
        before = sm.bcast_before;
        target = sm.bcast_target;
        last_cnt = sm.bcast_cnt;
        __syncthreads();
        if (!reached) break;
    }
    cut c;
    c.on = false;
    c.key = 0;
    c.id = 0;
    if (!reached) return c;
    const double e = exp(((double)key_to_float(prefix) - mx) / T);
    double jd = e > 0.0 ? ceil((target - before) / e) : 1.0;
    int j = jd < 1.0 ? 1 : (jd > (double)last_cnt ? (int)last_cnt : (int)jd);
    if (j < 1) j = 1;
    c.on = true;
    c.key = prefix;
    c.id = nth_id_with_key(sm, r, V, prefix, j, [&ck](uint32_t key, int v) { return pass_cut(ck, key, v); });
    return c;
}

__device__ double block_sum_double(sample_smem &sm, double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sm.d2[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0.0;
    for (int k = 0; k < NW; k++) t += sm.d2[k];
    __syncthreads();
    return t;
}

// z = l / T of vocabulary entry v (T = 0: the logit itself)
__device__ __forceinline__ double dream_z(const row_ctx &r, int v, double T) {
    return T > 0 ? (double)eff(r, v) / T : (double)eff(r, v);
}

// Dream's confidence of one row (decode/decoders.c dream_confidence without top-p / top-k): z = l / T
// (T > 0) over the whole vocabulary (mask included, l[eos] = -inf under logits_eos_inf), probs =
// softmax(z) in double: maskgit_plus probs[x0], topk_margin the best minus the second best
// probability, entropy sum p log(p + 1e-10). Two passes like the host (max, then the sum of
// exp(z - max)); only the summation order differs. Block-uniform result.
__device__ double dream_score(sample_smem &sm, const row_ctx &r, int V, double T, int x0, int which) {
    double mx = -INFINITY;
    int mi = 0x7fffffff;
    for (int v = threadIdx.x; v < V; v += ST) {
        const double z = dream_z(r, v, T);
        if (better(z, v, mx, mi)) mx = z, mi = v;
    }
    block_argmax(sm, mx, mi);
    double zs = 0.0;
    for (int v = threadIdx.x; v < V; v += ST) {
        const double z = dream_z(r, v, T);
        zs += z == -INFINITY ? 0.0 : exp(z - mx);
    }
    zs = block_sum_double(sm, zs);
    if (which == UMK_DEC_MASKGIT_PLUS) {
        const double z = dream_z(r, x0, T);
        return z == -INFINITY ? 0.0 : exp(z - mx) / zs;
    }
    if (which == UMK_DEC_TOPK_MARGIN) {
        // the second best value: the best over every token but the first maximum's (ties count twice)
        double m2 = -INFINITY;
        int i2 = 0x7fffffff;
        for (int v = threadIdx.x; v < V; v += ST) {
            if (v == mi) continue;
            const double z = dream_z(r, v, T);
            if (better(z, v, m2, i2)) m2 = z, i2 = v;
        }
        block_argmax(sm, m2, i2);
        const double p1 = mx == -INFINITY ? 0.0 : exp(mx - mx) / zs;
        const double p2 = m2 == -INFINITY ? 0.0 : exp(m2 - mx) / zs;
        return p1 - p2;
    }
    double h = 0.0;   // entropy
    for (int v = threadIdx.x; v < V; v += ST) {
        const double z = dream_z(r, v, T);
        const double q = z == -INFINITY ? 0.0 : exp(z - mx) / zs;
        h += q * log(q + 1e-10);
    }
    return block_sum_double(sm, h);
}

__global__ void __launch_bounds__(ST) k_sample(const uint16_t *__restrict__ logits, umk_vocab_ids ids,
                                               const umk_sample_job *__restrict__ jobs,
                                               const umk_sample_cfg *__restrict__ cfgs, int32_t *x0_out,
                                               double *conf_out) {
    __shared__ sample_smem sm;
    const umk_sample_job job = jobs[blockIdx.x];
    const umk_sample_cfg cf = cfgs[job.cfg];
    if (!job.active) {
        if (threadIdx.x == 0) {
            x0_out[blockIdx.x] = -1, conf_out[blockIdx.x] = 0.0;
            if (cf.dream_score) conf_out[gridDim.x + blockIdx.x] = 0.0;
        }
        return;
    }
    const int V = ids.vocab;
    row_ctx r;
    r.c = logits + (int64_t)job.row * V;
    r.u = (job.urow >= 0 && cf.cfg_scale > 0) ? logits + (int64_t)job.urow * V : nullptr;
    r.w = cf.cfg_scale + 1.0;
    r.eos_kill = (cf.logits_eos_inf && ids.eos_id >= 0 && ids.eos_id < V) ? ids.eos_id : -1;
    r.mask_id = ids.mask_id;
    const int drop = (cf.confidence_eos_eot_inf && ids.eot_id >= 0 && ids.eot_id < V) ? ids.eot_id : -1;
    const double T = cf.temperature;
    const bool filt = T > 0 && (cf.top_k > 0 || cf.top_p < 1.0);
    const bool plain_gumbel = T > 0 && !filt;

    // pass 1
    double cm = -INFINITY, cz = 0.0;      // confidence: max / sum exp over v != drop
    float bv = -INFINITY;                 // argmax over v != mask
    int bi = 0x7fffffff;
    double gs = -INFINITY;                // Gumbel-max (no filter)
    int gi = 0x7fffffff;
    int ncand = 0;
    for (int v = threadIdx.x; v < V; v += ST) {
        const float l = eff(r, v);
        if (v != drop && l > -INFINITY) {
            const double dl = (double)l;
            if (dl > cm) {
                cz = (cm == -INFINITY ? 0.0 : cz * exp(cm - dl)) + 1.0;
                cm = dl;
            } else {
                cz += exp(dl - cm);
            }
        }
        if (v != r.mask_id) {
            if (better(l, v, bv, bi)) bv = l, bi = v;
            if (isfinite(l)) {
                ncand++;
                if (plain_gumbel) {
                    const double sc = (double)l + T * gumbel(cf.seed, job.step, job.pos, V, v);
                    if (better(sc, v, gs, gi)) gs = sc, gi = v;
                }
            }
        }
    }
    block_lse(sm, cm, cz);
    block_argmax(sm, bv, bi);
    ncand = block_sum_int(sm, ncand);
    if (plain_gumbel) block_argmax(sm, gs, gi);

    int x0;
    if (T <= 0) {
        x0 = bi;
    } else if (plain_gumbel) {
        x0 = gi;
    } else {
        cut ck;
        ck.on = false, ck.key = 0, ck.id = 0;
        int n = ncand;
        if (cf.top_k > 0 && cf.top_k < n) {
            ck = select_top_k(sm, r, V, cf.top_k);
            n = cf.top_k;
        }
        cut cp;
        cp.on = false, cp.key = 0, cp.id = 0;
        if (cf.top_p < 1.0 && n > 1) cp = select_top_p(sm, r, V, ck, (double)bv, T, cf.top_p);
        gs = -INFINITY, gi = 0x7fffffff;
        for (int v = threadIdx.x; v < V; v += ST) {
            const float l = eff(r, v);
            if (!is_cand(r, v, l)) continue;
            const uint32_t key = fkey(l);
            if (!pass_cut(ck, key, v) || !pass_cut(cp, key, v)) continue;
            const double sc = (double)l + T * gumbel(cf.seed, job.step, job.pos, V, v);
            if (better(sc, v, gs, gi)) gs = sc, gi = v;
        }
        block_argmax(sm, gs, gi);
        x0 = gi;
    }
    if (x0 < 0 || x0 >= V) x0 = r.mask_id == 0 ? 1 : 0;   // every logit -inf (sample.c does the same)
    if (threadIdx.x == 0) {
        double conf = 0.0;
        if (x0 != drop) {
            const float lx = eff(r, x0);
            if (isfinite(lx) && cz > 0.0) conf = exp((double)lx - cm) / cz;
        }
        x0_out[blockIdx.x] = x0;
        conf_out[blockIdx.x] = conf;
    }
    if (cf.dream_score) {
        const double sc = dream_score(sm, r, V, T, x0, cf.dream_score);
        if (threadIdx.x == 0) conf_out[gridDim.x + blockIdx.x] = sc;
    }
}

__global__ void k_gumbel(uint64_t seed, int step, int pos, int vocab, int n, double *out) {
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < n; v += gridDim.x * blockDim.x)
        out[v] = gumbel(seed, step, pos, vocab, v);
}

// ---------------------------------------------------------------- decoders

constexpr int CT = 256;   // k_commit threads

struct ev_view {
    umk_event_hdr *hdr;
    int32_t       *pos, *tok;
    float         *conf;
    int32_t       *dtok;
    float         *dconf;
};

__host__ __device__ size_t event_bytes(int B) { return UMK_EVENT_BYTES(B); }

__device__ ev_view event_at(void *events, int s, int B) {
    unsigned char *base = static_cast<unsigned char *>(events) + (size_t)s * event_bytes(B);
    ev_view e;
    e.hdr = reinterpret_cast<umk_event_hdr *>(base);
    e.pos = reinterpret_cast<int32_t *>(base + sizeof(umk_event_hdr));
    e.tok = e.pos + B;
    e.conf = reinterpret_cast<float *>(e.tok + B);
    e.dtok = reinterpret_cast<int32_t *>(e.conf + B);
    e.dconf = reinterpret_cast<float *>(e.dtok + B);
    return e;
}

__device__ int quota(int m, int s, int i) { return s <= 0 ? m : m / s + (i < m % s ? 1 : 0); }

__device__ void load_block_steps(umk_seq_state &S, const int32_t *blk_steps) {
    if (blk_steps && S.blk_steps_off >= 0) S.block_steps = blk_steps[S.blk_steps_off + S.blk];
}

// advance past finished / mask-free blocks (thread 0); sets lo/hi/blk/m0/done/step_in_block
__device__ void advance_block(umk_seq_state &S, const int32_t *tokens, int mask_id, const int32_t *blk_steps) {
    for (;;) {
        S.lo = S.hi;
        if (S.lo >= S.gen_end) {
            S.done = 1;
            return;
        }
        S.blk++;
        load_block_steps(S, blk_steps);
        S.hi = min(S.lo + S.block_len, S.gen_end);
        int m = 0;
        for (int p = S.lo; p < S.hi; p++) m += tokens[S.row0 + p] == mask_id;
        if (m > 0) {
            S.m0 = m;
            S.step_in_block = 0;
            return;
        }
    }
}

__device__ void write_next(const umk_seq_state &S, int s, int B, const int32_t *tokens, int mask_id,
                           umk_sample_job *jobs, int32_t *out_rows) {
    for (int j = threadIdx.x; j < B; j += blockDim.x) {
        const int p = S.lo + j;
        const bool in = !S.done && p < S.hi;
        umk_sample_job jb;
        jb.row = s * B + j;
        jb.urow = -1;
        jb.pos = p;
        jb.step = S.step;
        jb.cfg = s;
        jb.active = in && tokens[S.row0 + p] == mask_id;
        jobs[s * B + j] = jb;
        const int pc = p < S.len ? (p < 0 ? 0 : p) : S.len - 1;
        out_rows[s * B + j] = S.row0 + (S.logit_shift && pc > 0 ? pc - 1 : pc);
    }
}

__global__ void k_begin(umk_seq_state *st, int B, umk_vocab_ids ids, const int32_t *tokens, const int32_t *blk_steps,
                        umk_sample_job *jobs, int32_t *out_rows) {
    __shared__ umk_seq_state S;
    const int s = blockIdx.x;
    if (threadIdx.x == 0) {
        S = st[s];
        load_block_steps(S, blk_steps);
        if (!S.done) {
            int m = 0;
            for (int p = S.lo; p < S.hi; p++) m += tokens[S.row0 + p] == ids.mask_id;
            if (S.lo >= S.gen_end) S.done = 1;
            else if (m > 0) S.m0 = m, S.step_in_block = 0;
            else advance_block(S, tokens, ids.mask_id, blk_steps);
        }
        st[s] = S;
    }
    __syncthreads();
    write_next(S, s, B, tokens, ids.mask_id, jobs, out_rows);
}

__global__ void __launch_bounds__(CT) k_commit(umk_seq_state *st, int B, umk_vocab_ids ids, int32_t *tokens,
                                               const int32_t *blk_steps, const int32_t *x0, const double *conf,
                                               void *events,
                                               umk_sample_job *jobs, int32_t *out_rows) {
    UMK_DYNAMIC_SMEM(dyn);
    double *score = reinterpret_cast<double *>(dyn);    // [B] commit score per block offset
    double *sorted = score + B;                          // [B] scores of masked offsets by rank
    int *masked = reinterpret_cast<int *>(sorted + B);   // [B]
    int *rank = masked + B;                              // [B] rank among masked (-1: not masked)
    __shared__ umk_seq_state S;
    __shared__ int n_masked, k_commit_n, thr_mode;
    const int s = blockIdx.x;
    const ev_view ev = event_at(events, s, B);
    if (threadIdx.x == 0) S = st[s];
    __syncthreads();
    if (S.done) {
        if (threadIdx.x == 0) {
            umk_event_hdr h = {S.step, S.lo, S.hi, 0, 0, 0, 1, 1};
            *ev.hdr = h;
        }
        for (int j = threadIdx.x; j < B; j += blockDim.x) ev.dtok[j] = -1, ev.dconf[j] = 0.0f;
        write_next(S, s, B, tokens, ids.mask_id, jobs, out_rows);
        return;
    }
    const int lo = S.lo, nb = S.hi - S.lo;
    for (int j = threadIdx.x; j < B; j += blockDim.x) {
        const bool m = j < nb && tokens[S.row0 + lo + j] == ids.mask_id;
        const double c = conf[s * B + j];
        double sc = c;
        if (S.decoder == UMK_DEC_RANDOM) {
            sc = rng_u01(S.seed, RANDOM_SCORE_STREAM_BIT | (uint64_t)S.step, (uint64_t)(lo + j));
        } else if (S.decoder == UMK_DEC_ORIGIN) {
            sc = (double)(float)rng_u01(S.seed, ORIGIN_STREAM_BIT | (uint64_t)S.step, (uint64_t)(lo + j));
        } else if (S.decoder >= UMK_DEC_MASKGIT_PLUS) {   // Dream's score, after the event confidences
            sc = conf[(size_t)gridDim.x * B + s * B + j];
            if (S.alg_temp > 0) {   // Gumbel top-k: sampling without replacement from softmax(c / alg_temp)
                const double u = rng_u01(S.seed, ALG_TEMP_STREAM_BIT | (uint64_t)S.step, (uint64_t)(lo + j));
                sc = sc / S.alg_temp - log(-log(u));
            }
        }
        score[j] = sc;
        masked[j] = m;
        ev.dtok[j] = m ? x0[s * B + j] : -1;
        ev.dconf[j] = m ? (float)c : 0.0f;
    }
    __syncthreads();
    // rank among masked positions: score desc, then position asc (decoders.c cand_cmp)
    for (int j = threadIdx.x; j < B; j += blockDim.x) {
        int rk = -1;
        if (j < nb && masked[j]) {
            rk = 0;
            for (int i = 0; i < nb; i++)
                if (i != j && masked[i] && (score[i] > score[j] || (score[i] == score[j] && i < j))) rk++;
        }
        rank[j] = rk;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < nb; j += blockDim.x)
        if (rank[j] >= 0) sorted[rank[j]] = score[j];
    __syncthreads();   // sorted[] complete (the block-diffusion threshold rule reads it below)
    if (threadIdx.x == 0) {
        int n = 0;
        for (int j = 0; j < nb; j++) n += rank[j] >= 0;
        int k = 0, tm = 0;
        if (S.decoder == UMK_DEC_LOW_CONFIDENCE || S.decoder == UMK_DEC_RANDOM) {
            // the quota of the masks when the block began, or (block diffusion) of the block length
            const int sb = S.block_steps > 0 ? S.block_steps : 1;
            k = quota(S.quota_len > 0 ? S.quota_len : S.m0, sb, S.step_in_block);
            if (S.step_in_block >= sb - 1) k = n;
            if (k < 1) k = 1;
            if (k > n) k = n;
        } else if (S.decoder == UMK_DEC_THRESHOLD && S.quota_len > 0) {
            // block diffusion (decoders.c threshold_choose): every masked offset with conf > tau
            // (a prefix of the ranks) when at least the block-length quota clear it, else the quota
            const int q0 = quota(S.quota_len, S.block_steps > 0 ? S.block_steps : 1, S.step_in_block);
            const int q = q0 < 1 ? 1 : q0;
            int above = 0;
            while (above < n && sorted[above] > S.threshold) above++;
            k = above >= q ? above : (q < n ? q : n);
        } else if (S.decoder == UMK_DEC_THRESHOLD) {
            tm = 1;   // commit = rank 0 or conf >= threshold
        } else if (S.decoder == UMK_DEC_ORIGIN) {
            tm = 2;   // commit = every masked offset whose draw u < 1 - s/t (all at the last step)
        } else if (S.decoder >= UMK_DEC_MASKGIT_PLUS) {
            const int sb = S.block_steps > 0 ? S.block_steps : 1;
            k = dream_quota(n, sb, S.eps, S.step_in_block);   // may be 0: a step without commits
        }
        n_masked = n;
        k_commit_n = k;
        thr_mode = tm;
    }
    __syncthreads();
    if (threadIdx.x == 0 && S.decoder == UMK_DEC_FACTOR) {
        const int m = n_masked;
        int k = m;
        for (int nn = 2; nn <= m; nn++) {
            if (sorted[nn - 1] < 1.0 - S.factor / (double)(nn + 1)) {
                k = nn == m ? m : nn - 1;
                break;
            }
        }
        k_commit_n = k;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        // commits in ascending position; the canvas is written after every read above
        const int sb = S.block_steps > 0 ? S.block_steps : 1;
        const bool last = S.step_in_block >= sb - 1;
        const float pt = thr_mode == 2 && !last ? dream_frac(sb, S.eps, S.step_in_block) : 1.0f;
        int nc = 0;
        for (int j = 0; j < nb; j++) {
            const int rk = rank[j];
            if (rk < 0) continue;
            const bool c = thr_mode == 2   ? (last || (float)score[j] < pt)
                           : thr_mode == 1 ? (rk == 0 || score[j] >= S.threshold)
                                           : rk < k_commit_n;
            if (!c) continue;
            const int tok = x0[s * B + j];
            tokens[S.row0 + lo + j] = tok;
            ev.pos[nc] = lo + j;
            ev.tok[nc] = tok;
            ev.conf[nc] = (float)conf[s * B + j];
            nc++;
        }
        umk_event_hdr h;
        h.step = S.step;
        h.lo = S.lo;
        h.hi = S.hi;
        h.n_commit = nc;
        h.masks_left = n_masked - nc;
        h.block_done = n_masked - nc == 0;
        h.was_done = 0;
        S.step++;
        S.step_in_block++;
        if (h.block_done) {
            bool eos = false;
            if (S.stop_at_eos)
                for (int p = S.lo; p < S.hi; p++) {
                    const int t = tokens[S.row0 + p];
                    eos |= (ids.eos_id >= 0 && t == ids.eos_id) || (ids.eot_id >= 0 && t == ids.eot_id);
                }
            if (eos) S.done = 1;
            else advance_block(S, tokens, ids.mask_id, blk_steps);
        }
        h.done = S.done;
        *ev.hdr = h;
        st[s] = S;
    }
    __syncthreads();
    write_next(S, s, B, tokens, ids.mask_id, jobs, out_rows);
}

}  // namespace

// ---------------------------------------------------------------- launchers

extern "C" size_t umk_event_bytes(int block_len) { return event_bytes(block_len); }

extern "C" cudaError_t umk_sample(const uint16_t *logits, umk_vocab_ids ids, const umk_sample_job *jobs, int n_jobs,
                                  const umk_sample_cfg *cfgs, int32_t *x0, double *conf, cudaStream_t s) {
    if (n_jobs > 0) UMK_LAUNCH(k_sample, n_jobs, ST, 0, s, logits, ids, jobs, cfgs, x0, conf);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_gumbel(uint64_t seed, int step, int pos, int vocab, int n, double *out, cudaStream_t s) {
    if (n > 0) UMK_LAUNCH(k_gumbel, (n + 255) / 256, 256, 0, s, seed, step, pos, vocab, n, out);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_decode_begin(umk_seq_state *st, int n_seqs, int block_len, umk_vocab_ids ids,
                                        const int32_t *tokens, const int32_t *blk_steps, umk_sample_job *jobs,
                                        int32_t *out_rows, cudaStream_t s) {
    if (n_seqs > 0) UMK_LAUNCH(k_begin, n_seqs, 128, 0, s, st, block_len, ids, tokens, blk_steps, jobs, out_rows);
    return cudaGetLastError();
}

extern "C" cudaError_t umk_decode_commit(umk_seq_state *st, int n_seqs, int block_len, umk_vocab_ids ids,
                                         int32_t *tokens, const int32_t *blk_steps, const int32_t *x0,
                                         const double *conf, void *events, umk_sample_job *next_jobs,
                                         int32_t *out_rows, cudaStream_t s) {
    if (n_seqs <= 0) return cudaGetLastError();
    const size_t B = (size_t)block_len;
    const size_t sm = 2 * B * sizeof(double) + 2 * B * sizeof(int);
    if (sm > 48 * 1024) return cudaErrorInvalidValue;   // block_len > ~2000
    UMK_LAUNCH(k_commit, n_seqs, CT, sm, s, st, block_len, ids, tokens, blk_steps, x0, conf, events, next_jobs, out_rows);
    return cudaGetLastError();
}
