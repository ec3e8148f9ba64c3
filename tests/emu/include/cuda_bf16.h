/*
 * cuda_bf16.h (unmask CUDA emulator shadow) — __nv_bfloat16 / __nv_bfloat162 and the conversions
 * kernels/ use, for the CPU emulator (C++ only). Rounding: round-to-nearest-even, NaN -> 0x7fff,
 * as documented for __float2bfloat16_rn. Does not: implement bf16 arithmetic operators.
 */
#ifndef UMK_EMU_CUDA_BF16_H
#define UMK_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

#include "cuda_runtime_api.h"

struct __nv_bfloat16 {
    uint16_t __x;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};

static inline uint16_t umk_emu_f32_to_bf16_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;   // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest, ties to even
    return (uint16_t)(u >> 16);
}

static inline float umk_emu_bf16_bits_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{umk_emu_f32_to_bf16_bits(f)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return umk_emu_bf16_bits_to_f32(b.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
    return __nv_bfloat162{__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
}

#endif
