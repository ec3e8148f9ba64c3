/*
 * cpu_elem.c — a weight's elements as fp32 (cpu_elem.h). Pure; any thread (pool slots run it on
 * their own slices).
 */
#include "backend/cpu/cpu_elem.h"

#include "backend/cpu/cpu_build.h"
#include "util/dtype.h"
#include "util/log.h"
#include "util/quant.h"

CPU_HOT_CLONES void cpu_weight_to_f32(const bweight *w, size_t off, size_t n, float *dst) {
    if (dtype_is_quant(w->type)) {   /* a view of GGUF-layout rows (a quantized embedding), whole blocks */
        CHECK(!w->owned && off % DTYPE_QBLOCK == 0 && n % DTYPE_QBLOCK == 0); /* not a repacked copy */
        quant_row_dequantize(w->type, (const uint8_t *)w->data + dtype_row_bytes(w->type, (int64_t)off), dst,
                             (int64_t)n);
    } else if (w->type == DTYPE_F32) {
        memcpy(dst, (const float *)w->data + off, n * sizeof(float));
    } else if (w->type == DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)w->data + off;
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(s[i]);
    } else {
        CHECK(w->type == DTYPE_F16);
        const uint16_t *s = (const uint16_t *)w->data + off;
#pragma omp simd
        for (size_t i = 0; i < n; i++) dst[i] = cpu_f16_to_f32(s[i]);
    }
}
