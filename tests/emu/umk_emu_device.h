/*
 * umk_emu_device.h — the device side of the unmask CUDA emulator, force-included (-include) when
 * kernels/ *.cu are compiled as C++ for the CPU: CUDA qualifiers, the built-in index variables,
 * __syncthreads, warp shuffles / ballot, atomics, bit casts, and umk_emu::launch / the emulated
 * mma.sync used by kernels/umk_portable.h.
 *
 * Execution model (tests/emu/umk_emu.cpp): a launch runs its blocks one after another on the calling
 * host thread; the threads of a block are cooperative fibers, so __shared__ variables are plain
 * `static thread_local` objects (one per host thread, reused block after block), __syncthreads is a
 * block barrier and every warp-collective (shuffle, ballot, mma) is a barrier of the lanes its mask
 * names, which exchange values through the scheduler. Misuse (divergent barriers, masks naming an
 * exited lane, deadlocks) aborts with the call sites.
 * Does not: model timing, the memory model between blocks, or approximate intrinsics (__expf...).
 * Threading: the host thread that launches runs every fiber of the launch.
 */
#ifndef UMK_EMU_DEVICE_H
#define UMK_EMU_DEVICE_H

#ifndef __cplusplus
#error "umk_emu_device.h is for kernels compiled as C++"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __align__(n) __attribute__((aligned(n)))

namespace umk_emu {

// what a running fiber exposes to device code
struct thread_ctx {
    uint3 thread_idx;
};

// __thread (not thread_local): plain TLS access, no C++ TLS wrapper calls in every index expression
extern __thread thread_ctx *tl_thread;
extern __thread uint3 tl_block_idx;
extern __thread dim3 tl_block_dim, tl_grid_dim;

void syncthreads(const char *file, int line);
// warp collectives: every lane named in mask must call the same site
// shuffles: xor = 1 reads lane (lane ^ arg), else lane arg
uint64_t shfl(uint32_t mask, uint64_t bits, int arg, bool xor_, const char *file, int line);
uint32_t ballot(uint32_t mask, int pred, const char *file, int line);
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
unsigned char *dynamic_smem();

// kernel launch (runs now, or records a graph node while the stream captures)
void launch_closure(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, std::function<void()> body);

template <typename... P, typename... A>
void launch(const char *name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
    // arguments by value, converted to the parameter types at launch (as CUDA copies them)
    std::tuple<std::decay_t<P>...> t(std::forward<A>(args)...);
    launch_closure(name, reinterpret_cast<const void *>(kernel), grid, block, smem, s,
                   [kernel, t]() { std::apply(kernel, t); });
}

template <typename T>
T shfl_sync(const char *file, int line, uint32_t mask, T v, int arg, bool xor_) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of a type wider than 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = shfl(mask, bits, arg, xor_, file, line);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

}  // namespace umk_emu

#define threadIdx (umk_emu::tl_thread->thread_idx)
#define blockIdx (umk_emu::tl_block_idx)
#define blockDim (umk_emu::tl_block_dim)
#define gridDim (umk_emu::tl_grid_dim)

#define __syncthreads() umk_emu::syncthreads(__FILE__, __LINE__)
#define __shfl_xor_sync(mask, v, lane_mask) umk_emu::shfl_sync(__FILE__, __LINE__, (mask), (v), (lane_mask), true)
#define __shfl_sync(mask, v, src_lane) umk_emu::shfl_sync(__FILE__, __LINE__, (mask), (v), (src_lane), false)
#define __ballot_sync(mask, pred) umk_emu::ballot((mask), (pred) ? 1 : 0, __FILE__, __LINE__)

static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline void __threadfence() {}   // blocks run one after another
static inline float __ldcg(const float *p) { return *p; }
static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// fibers of one block never run concurrently: a read-modify-write is atomic
template <typename T>
static inline T atomicAdd(T *p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}

template <typename T>
static inline T min(T a, T b) {
    return b < a ? b : a;
}
template <typename T>
static inline T max(T a, T b) {
    return a < b ? b : a;
}

#endif  // UMK_EMU_DEVICE_H
