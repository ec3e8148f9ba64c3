// umk_portable.h — private to kernels/*.cu: the few constructs that differ between nvcc and the
// CPU emulator (tests/emu/, compiled as C++ with UNMASK_CUDA_EMU and tests/emu/umk_emu_device.h
// force-included): kernel launches, dynamic shared memory, read-only 16-byte loads and the bf16
// tensor-core mma.sync.
// With nvcc the macros expand to exactly the CUDA syntax they replace.
// Does not: hide anything else; every other construct in kernels/ is plain CUDA C++.
#ifndef UMK_PORTABLE_H
#define UMK_PORTABLE_H

#include <stdint.h>
#include <string.h>

#ifdef UNMASK_CUDA_EMU
#include "util/dtype.h"   // the FP8 conversions the emulator uses
#endif

#ifdef UNMASK_CUDA_EMU
// kernel<<<grid, block, smem, stream>>>(args...) run by the emulator (tests/emu/umk_emu_device.h)
#define UMK_LAUNCH(kernel, grid, block, smem, stream, ...) \
    umk_emu::launch(#kernel, kernel, (grid), (block), (smem), (stream), __VA_ARGS__)
// `extern __shared__` bytes sized by the launch, as a pointer named `name`
#define UMK_DYNAMIC_SMEM(name) unsigned char *const name = umk_emu::dynamic_smem()
#else
#define UMK_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define UMK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// 16 bytes from global memory through the read-only path (ld.global.nc.v4): p 16-byte aligned and
// not written while the kernel runs. A plain load in the emulator.
__device__ __forceinline__ uint4 umk_ldg16(const void *p) {
#ifdef UNMASK_CUDA_EMU
    return *reinterpret_cast<const uint4 *>(p);
#else
    return __ldg(reinterpret_cast<const uint4 *>(p));
#endif
}

// D += A·B for one warp-wide m16n8k16 tile (PTX mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32):
// A 16x16 row-major fragment (4 regs of 2 bf16), B 16x8 col-major (2 regs), C = D 16x8 fp32 (4 regs).
__device__ __forceinline__ void umk_mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef UNMASK_CUDA_EMU
    umk_emu::mma_m16n8k16_bf16(d, a, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}


// 16 bytes global -> shared without registers (cp.async.cg, L2 only); ok = 0 zero-fills the 16 bytes
// (src is then not read). Groups: umk_cp_async_commit closes one, umk_cp_async_wait<N> waits until
// at most N are in flight. The emulator copies at once.
__device__ __forceinline__ void umk_cp_async16(void *smem, const void *src, bool ok) {
#ifdef UNMASK_CUDA_EMU
    if (ok)
        memcpy(smem, src, 16);
    else
        memset(smem, 0, 16);
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void umk_cp_async_commit() {
#ifndef UNMASK_CUDA_EMU
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void umk_cp_async_wait() {
#ifndef UNMASK_CUDA_EMU
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// four f32 another block wrote (after its __threadfence): read from L2, not a stale L1 line
__device__ __forceinline__ float4 umk_ldcg_f32x4(const float4 *p) {
#ifdef UNMASK_CUDA_EMU
    return *p;
#else
    return __ldcg(p);
#endif
}

// two FP8 E4M3 (low byte first) -> two bf16 (low half first), exact: e4m3x2 -> f16x2 (exact), each
// half to f32, the pair to bf16x2 (exact: an E4M3 value has 4 significant bits). Four instructions
// of the packed-conversion kind; measured on the H200 (2026-11-28) against placing the bits with
// integer ops and one bf16x2 multiply by 2^120 (about ten instructions): the LM head at 1 row took
// 139 vs 174 us, so this stays.
__device__ __forceinline__ uint32_t umk_fp8x2_to_bf16x2(uint16_t v) {
#ifdef UNMASK_CUDA_EMU
    const float lo = fp8_e4m3_to_f32((uint8_t)(v & 0xff)), hi = fp8_e4m3_to_f32((uint8_t)(v >> 8));
    return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16);
#else
    uint32_t h2, r;
    float lo, hi;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(v));
    asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(h2));
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

// four FP8 E4M3 (bytes b0..b3 of v) -> bf16x2 (b0, b1) in lo and (b2, b3) in hi, exact
__device__ __forceinline__ void umk_fp8x4_to_bf16x2x2(uint32_t v, uint32_t &lo, uint32_t &hi) {
    lo = umk_fp8x2_to_bf16x2((uint16_t)(v & 0xffffu));
    hi = umk_fp8x2_to_bf16x2((uint16_t)(v >> 16));
}

// one FP8 E4M3 <-> f32 (to fp8: round to nearest even, saturating to +-448)
__device__ __forceinline__ float umk_fp8_to_f32(unsigned char b) {
#ifdef UNMASK_CUDA_EMU
    return fp8_e4m3_to_f32(b);
#else
    uint32_t h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"((uint16_t)b));
    float f;
    asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %1;\ncvt.f32.f16 %0, l;\n}\n" : "=f"(f) : "r"(h2));
    return f;
#endif
}
__device__ __forceinline__ unsigned char umk_f32_to_fp8(float f) {
#ifdef UNMASK_CUDA_EMU
    return f32_to_fp8_e4m3(f);
#else
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(f));
    return (unsigned char)(r & 0xff);
#endif
}

#endif  // UMK_PORTABLE_H
