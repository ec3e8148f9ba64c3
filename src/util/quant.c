/*
 * quant.c — scalar reference quantization of rows into Q8_0 / Q4_0 blocks and back (quant.h).
 * Pure functions, any thread.
 */
#include "util/quant.h"

#include <math.h>

#include "util/log.h"

static void q8_0_quantize(const float *x, quant_block_q8_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += DTYPE_QBLOCK) {
        float amax = 0.0f;
        for (int j = 0; j < DTYPE_QBLOCK; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < DTYPE_QBLOCK; j++) y[b].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void q4_0_quantize(const float *x, quant_block_q4_0 *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += DTYPE_QBLOCK) {
        float amax = 0.0f, vmax = 0.0f; /* the value of largest magnitude, with its sign */
        for (int j = 0; j < DTYPE_QBLOCK; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), vmax = x[j];
        const float d = vmax / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = f32_to_f16(d);
        for (int j = 0; j < DTYPE_QBLOCK / 2; j++) {
            int lo = (int)(int8_t)(x[j] * id + 8.5f), hi = (int)(int8_t)(x[j + DTYPE_QBLOCK / 2] * id + 8.5f);
            if (lo > 15) lo = 15;
            if (hi > 15) hi = 15;
            y[b].qs[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void quant_row_quantize(enum dtype type, const float *x, void *y, int64_t n) {
    CHECK(n % DTYPE_QBLOCK == 0);
    if (type == DTYPE_Q8_0) q8_0_quantize(x, y, n / DTYPE_QBLOCK);
    else if (type == DTYPE_Q4_0) q4_0_quantize(x, y, n / DTYPE_QBLOCK);
    else UM_FATAL("quant_row_quantize: %s is not a quantized type", dtype_name(type));
}

void quant_row_dequantize(enum dtype type, const void *x, float *y, int64_t n) {
    CHECK(n % DTYPE_QBLOCK == 0);
    const int64_t nb = n / DTYPE_QBLOCK;
    if (type == DTYPE_Q8_0) {
        const quant_block_q8_0 *b = x;
        for (int64_t i = 0; i < nb; i++) {
            const float d = f16_to_f32(b[i].d);
            for (int j = 0; j < DTYPE_QBLOCK; j++) y[i * DTYPE_QBLOCK + j] = d * (float)b[i].qs[j];
        }
    } else if (type == DTYPE_Q4_0) {
        const quant_block_q4_0 *b = x;
        for (int64_t i = 0; i < nb; i++) {
            const float d = f16_to_f32(b[i].d);
            for (int j = 0; j < DTYPE_QBLOCK / 2; j++) {
                y[i * DTYPE_QBLOCK + j] = d * (float)((b[i].qs[j] & 0x0f) - 8);
                y[i * DTYPE_QBLOCK + j + DTYPE_QBLOCK / 2] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
    } else {
        UM_FATAL("quant_row_dequantize: %s is not a quantized type", dtype_name(type));
    }
}
