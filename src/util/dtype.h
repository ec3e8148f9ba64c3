/*
 * dtype.h — element types found in checkpoints, and scalar conversions (bf16/f16 <-> f32). The
 * block-quantized types (Q8_0, Q4_0: util/quant.h) store 32 elements per block, so a row's bytes
 * come from dtype_row_bytes(), not from an element size.
 * Header-only, pure functions, any thread.
 */
#ifndef UM_DTYPE_H
#define UM_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype {
    DTYPE_F32,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_OTHER,          /* a dtype safetensors knows but we cannot compute with (I64, U8, ...) */
    DTYPE_Q8_0,           /* blocks of 32: an f16 scale and 32 int8 (34 bytes; util/quant.h) */
    DTYPE_Q4_0,           /* blocks of 32: an f16 scale and 32 4-bit values (18 bytes; util/quant.h) */
    DTYPE_F8_E4M3,        /* OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, 0x7f/0xff NaN, max 448),
                             one byte per element; a weight of this type carries f32 scales per block
                             (bweight.scale): element = fp8 value x its block's scale */
};

#define DTYPE_QBLOCK 32   /* elements per block of the quantized types */

static inline int dtype_is_quant(enum dtype t) { return t == DTYPE_Q8_0 || t == DTYPE_Q4_0; }

/* Bytes per element of the element types; 0 for the block-quantized ones (dtype_row_bytes) and OTHER. */
static inline size_t dtype_size(enum dtype t) {
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: return 2;
    case DTYPE_F16: return 2;
    case DTYPE_F8_E4M3: return 1;
    default: return 0;
    }
}

/* Bytes of n consecutive elements of type t; for the quantized types n is a multiple of
 * DTYPE_QBLOCK (a row of a quantized weight always is). */
static inline size_t dtype_row_bytes(enum dtype t, int64_t n) {
    switch (t) {
    case DTYPE_Q8_0: return (size_t)(n / DTYPE_QBLOCK) * 34;
    case DTYPE_Q4_0: return (size_t)(n / DTYPE_QBLOCK) * 18;
    default: return (size_t)n * dtype_size(t);
    }
}

static inline const char *dtype_name(enum dtype t) {
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_Q8_0: return "Q8_0";
    case DTYPE_Q4_0: return "Q4_0";
    case DTYPE_F8_E4M3: return "F8_E4M3";
    default: return "OTHER";
    }
}

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round-to-nearest-even, NaN kept quiet (what torch does for .to(bfloat16)). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 0x1f) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = 1u << (shift - 1);
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (uint32_t)(exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

/* FP8 E4M3 (e4m3fn) -> f32, exact; 0x7f / 0xff (NaN) -> NaN. */
static inline float fp8_e4m3_to_f32(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80) << 24;
    const uint32_t exp = (b >> 3) & 0xf, man = b & 0x7;
    uint32_t u;
    if ((b & 0x7f) == 0x7f) {
        u = sign | 0x7fc00000u;
    } else if (exp == 0) {   /* subnormal: man x 2^-9 */
        float f = (float)man * (1.0f / 512.0f);
        return sign ? -f : f;
    } else {
        u = sign | ((exp + 127 - 7) << 23) | (man << 20);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* f32 -> FP8 E4M3, round to nearest even, saturating to +-448 (NaN -> 0x7f). */
static inline uint8_t f32_to_fp8_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7f;
    float a = f < 0 ? -f : f;
    if (a >= 464.0f) return (uint8_t)(sign | 0x7e);   /* 448 and above the rounding midpoint: saturate */
    if (a < 0.015625f) {                              /* below 2^-6: subnormal grid of 2^-9 */
        const float q = a * 512.0f;                   /* exact */
        uint32_t r = (uint32_t)q;
        const float rem = q - (float)r;
        if (rem > 0.5f || (rem == 0.5f && (r & 1))) r++;
        return (uint8_t)(sign | r);                   /* r == 8 is the smallest normal, 0x08 */
    }
    memcpy(&u, &a, 4);
    uint32_t exp = ((u >> 23) & 0xff) - 127 + 7, man = u & 0x7fffff;
    uint32_t r = (exp << 3) | (man >> 20);
    const uint32_t rem = man & 0xfffff;
    if (rem > 0x80000 || (rem == 0x80000 && (r & 1))) r++;
    if (r > 0x7e) r = 0x7e;
    return (uint8_t)(sign | r);
}

/* Convert n elements of type t at src to f32. */
static inline void dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n) {
    if (t == DTYPE_F32) {
        memcpy(dst, src, n * 4);
    } else if (t == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else if (t == DTYPE_F16) {
        const uint16_t *s = (const uint16_t *)src;
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(s[i]);
    } else if (t == DTYPE_F8_E4M3) {   /* unscaled values: the caller multiplies by the block scales */
        const uint8_t *s = (const uint8_t *)src;
        for (size_t i = 0; i < n; i++) dst[i] = fp8_e4m3_to_f32(s[i]);
    }
}

#endif /* UM_DTYPE_H */
