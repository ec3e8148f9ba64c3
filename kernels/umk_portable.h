// umk_portable.h — private to kernels/*.cu: the few constructs that differ between nvcc and the
// CPU emulator (tests/emu/, compiled as C++ with UNMASK_CUDA_EMU and tests/emu/umk_emu_device.h
// force-included): kernel launches, dynamic shared memory, read-only 16-byte loads and the bf16
// tensor-core mma.sync.
// With nvcc the macros expand to exactly the CUDA syntax they replace.
// Does not: hide anything else; every other construct in kernels/ is plain CUDA C++.
#ifndef UMK_PORTABLE_H
#define UMK_PORTABLE_H

#include <stdint.h>

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

#endif  // UMK_PORTABLE_H
