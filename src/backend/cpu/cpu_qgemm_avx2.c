/*
 * cpu_qgemm_avx2.c — the ymm kernel families of the quantized GEMM layer (cpu_qgemm.h): AVX2
 * (vpmaddubsw + vpmaddwd, any x86-64-v3 CPU) and AVX-VNNI (vpdpbusd on ymm, Intel Alder Lake and
 * later, AMD Zen 5), both from the template cpu_qgemm_ymm.h, which says how each one keeps the
 * numerics of cpu_qgemm.h exactly.
 *
 * Compiled for every x86-64 (target attributes, no global -m flags); only called after cpu_features
 * found the instructions. Threading: pure functions of their arguments, run on pool slots.
 */
#include <string.h>

#include "backend/cpu/cpu_qgemm.h"
#include "backend/cpu/cpu_build.h"

#if UM_CPU_BUILD_X86
#include <immintrin.h>

#define QY_VNNI 0
#define QY_TARGET __attribute__((target("avx2,fma,f16c")))
#define QY(name) avx2_##name
#include "backend/cpu/cpu_qgemm_ymm.h"
#undef QY_VNNI
#undef QY_TARGET
#undef QY

#define QY_VNNI 1
#define QY_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define QY(name) avxvnni_##name
#include "backend/cpu/cpu_qgemm_ymm.h"
#undef QY_VNNI
#undef QY_TARGET
#undef QY

const cpu_qgemm_kernel cpu_qgemm_avx2 = {.name = "avx2", .block = avx2_block};
const cpu_qgemm_kernel cpu_qgemm_avxvnni = {.name = "avxvnni", .block = avxvnni_block};

#else /* not x86-64 + GCC: never selected (cpu_features reports them absent) */

const cpu_qgemm_kernel cpu_qgemm_avx2 = {.name = "avx2", .block = NULL};
const cpu_qgemm_kernel cpu_qgemm_avxvnni = {.name = "avxvnni", .block = NULL};

#endif
