/*
 * quant.h — the block-quantized weight types Q8_0 and Q4_0: their block layout and the scalar
 * reference quantization / dequantization of a row. A row of n elements (n a multiple of 32) is
 * n / 32 blocks, each one scale d (IEEE half) and 32 quantized values q:
 *   Q8_0: x[j] ~ d * q[j],        q[j] int8,  d = max|x| / 127
 *   Q4_0: x[j] ~ d * (q[j] - 8),  q[j] in [0, 15], d = (the x of largest magnitude) / -8
 * The bytes are exactly those of the GGUF types of the same names (Q4_0 packs element j in the low
 * nibble of qs[j] and element j + 16 in its high nibble), so a GGUF tensor of these types is used
 * as it is, without conversion. These functions are the numerical reference every optimised kernel
 * is tested against. Not here: products on quantized weights (the backends).
 * Pure functions, any thread.
 */
#ifndef UM_QUANT_H
#define UM_QUANT_H

#include <stdint.h>

#include "util/dtype.h"

typedef struct quant_block_q8_0 {
    uint16_t d;                     /* scale, IEEE half */
    int8_t   qs[DTYPE_QBLOCK];
} quant_block_q8_0;

typedef struct quant_block_q4_0 {
    uint16_t d;                     /* scale, IEEE half */
    uint8_t  qs[DTYPE_QBLOCK / 2];  /* element j: low nibble of qs[j]; element j + 16: high nibble */
} quant_block_q4_0;

_Static_assert(sizeof(quant_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(quant_block_q4_0) == 18, "Q4_0 block is 18 bytes");

/* x[0..n) -> n / 32 blocks at y (type Q8_0 or Q4_0); n a multiple of 32. */
void quant_row_quantize(enum dtype type, const float *x, void *y, int64_t n);
/* n / 32 blocks at x (type Q8_0 or Q4_0) -> y[0..n). */
void quant_row_dequantize(enum dtype type, const void *x, float *y, int64_t n);

#endif /* UM_QUANT_H */
