/*
 * cpu_dispatch.c — which kernel runs each product of a CPU backend, by the product's shape and this
 * CPU's ISA (docs/cpu-kernels.md, "Dispatch by shape", has the measurements behind every number).
 *
 *   setting     CPU                    products of BF16 weights                  attention
 *   auto        AMX usable             AMX (its blocks under 16 rows: AVX512-BF16)  AMX
 *   auto        AVX512-BF16            AVX512-BF16 at every shape                 AVX512-BF16
 *   auto        AVX2 + FMA only        AVX2 up to AVX2_MAX_M rows (AVX2_MAX_M_WIDE  fp32
 *                                      from AVX2_WIDE_K inputs), fp32 above
 *   auto        neither                fp32                                       fp32
 *   a path      (checked by cpu_features) that path at every shape              that path
 *
 * fp32 means OpenBLAS sgemm on the weights widened tile by tile (from the packed copy where there is
 * one, cpu_matmul.c) with fp32 activations — exactly what `--cpu-kernels fp32` computes.
 *
 * Quantized weights (Q8_0 / Q4_0) always run on the int8 family cpu_qkernels_resolve() names
 * (cpu_qgemm.h), at every shape.
 *
 * Does not: probe the CPU (cpu_features.c), run kernels.
 * Threading: init runs once per backend on the thread creating it; the tables are read-only.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

/* AVX2-only CPUs: products of up to AVX2_MAX_M rows run on the AVX2 bf16 family, more on fp32
 * (OpenBLAS); products of at least AVX2_WIDE_K inputs up to AVX2_MAX_M_WIDE rows. The measured
 * crossovers (docs/cpu-kernels.md "Dispatch by shape"): on 768 inputs the fp32 path won the wide
 * products (gate/up, LM head) from about 128 rows; on 2048+ inputs the AVX2 family was still ahead,
 * or level, at 256 rows. */
#define AVX2_MAX_M 96
#define AVX2_WIDE_K 2048
#define AVX2_MAX_M_WIDE 256

void cpu_dispatch_init(cpu_impl *ci, enum backend_cpu_kernels k, int automatic, enum cpu_qkernels qk) {
    ci->kernels = k;
    ci->gemm_max_m = ci->gemm_max_m_wide = ci->gemm_wide_k = INT64_MAX;
    switch (k) {
    case BACKEND_CPU_KERNELS_AMX: ci->gemm = &cpu_gemm_amx; break;
    case BACKEND_CPU_KERNELS_AVX512BF16: ci->gemm = &cpu_gemm_avx512bf16; break;
    case BACKEND_CPU_KERNELS_AVX2: ci->gemm = &cpu_gemm_avx2; break;
    case BACKEND_CPU_KERNELS_FP32: ci->gemm = NULL; break;
    case BACKEND_CPU_KERNELS_AUTO:   /* only an AVX2-only CPU resolves to AUTO (cpu_kernels_resolve) */
        CHECK(cpu_features_get()->avx2);
        ci->gemm = &cpu_gemm_avx2;
        ci->gemm_max_m = AVX2_MAX_M;
        ci->gemm_wide_k = AVX2_WIDE_K;
        ci->gemm_max_m_wide = AVX2_MAX_M_WIDE;
        break;
    }
    /* attention: on the bf16 family of a forced path or of AMX / AVX512-BF16; on an AVX2-only CPU the
     * fp32 sgemms (measured: neither side ahead at every shape, docs/cpu-kernels.md; fp32 keeps the
     * attention of a dispatched forward the reference path's) */
    ci->attn = k == BACKEND_CPU_KERNELS_AUTO ? NULL : ci->gemm;
    ci->qgemm = cpu_qkernels_family(qk);
    char d[224];
    if (k == BACKEND_CPU_KERNELS_AUTO)
        snprintf(d, sizeof d,
                 "cpu (auto: avx2 kernels up to %lld rows, fp32 above; up to %lld rows from %lld inputs; quantized "
                 "weights: %s)",
                 (long long)ci->gemm_max_m, (long long)ci->gemm_max_m_wide, (long long)ci->gemm_wide_k,
                 cpu_qkernels_name(qk));
    else if (automatic)
        snprintf(d, sizeof d, "cpu (auto: %s kernels for every product; quantized weights: %s)",
                 backend_cpu_kernels_name(k), cpu_qkernels_name(qk));
    else
        snprintf(d, sizeof d, "cpu (%s kernels; quantized weights: %s)", backend_cpu_kernels_name(k),
                 cpu_qkernels_name(qk));
    free(ci->description);
    ci->description = xstrdup(d);
}
