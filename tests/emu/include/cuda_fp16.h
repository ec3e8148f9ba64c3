/*
 * cuda_fp16.h (unmask CUDA emulator shadow) — __half and __half2float for the CPU emulator (C++
 * only), IEEE binary16 decoded by hand (subnormals, inf, NaN). Does not: half arithmetic.
 */
#ifndef UMK_EMU_CUDA_FP16_H
#define UMK_EMU_CUDA_FP16_H

#include <math.h>
#include <stdint.h>

struct __half {
    uint16_t __x;
};

static inline float __half2float(__half h) {
    const int sign = h.__x >> 15, ex = (h.__x >> 10) & 31, man = h.__x & 1023;
    float v;
    if (ex == 0) v = ldexpf((float)man, -24);                       // zero / subnormal
    else if (ex == 31) v = man ? NAN : INFINITY;
    else v = ldexpf((float)(man | 1024), ex - 25);
    return sign ? -v : v;
}

#endif
