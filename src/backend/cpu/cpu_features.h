/*
 * cpu_features.h — what this CPU can run, asked once at run time (cpuid + xgetbv, and the Linux
 * permission for AMX tile data), and which kernel path the CPU backend takes for bf16 weights:
 * AMX-BF16 tiles, AVX512-BF16 (vdpbf16ps), or the fp32 reference (OpenBLAS sgemm on weights widened
 * per tile). Process-wide: the path chosen by backend_cpu_kernels_select() (the --cpu-kernels
 * flag) or the UNMASK_CPU_KERNELS environment variable applies to CPU backends created afterwards.
 *
 * Does not: run any kernel (cpu_gemm*.c do), know about weights or threads.
 * Threading: the probes are computed once (thread-safe, pthread_once); select() is called by the
 * main thread before backends are created.
 */
#ifndef UM_CPU_FEATURES_H
#define UM_CPU_FEATURES_H

#include "backend/backend.h"

typedef struct cpu_features {
    int avx512bf16;   /* AVX512F+BW+VL+BF16 in the CPU and zmm/opmask state enabled by the OS */
    int amx_bf16;     /* AMX-TILE + AMX-BF16, tile state enabled, and tile data permitted for us
                         (arch_prctl(ARCH_REQ_XCOMP_PERM) succeeded) */
    int avx512bf16_fault;     /* 0, or the signal vdpbf16ps raised in its trial though cpuid and XCR0
                                 said yes (SIGILL, SIGSEGV) */
    char amx_why[96]; /* why amx_bf16 is 0 (empty when it is 1) */
} cpu_features;

/* The probe results (computed on first call: cpuid/XCR0/arch_prctl, then one trial of each bf16
 * path's instructions under a SIGILL/SIGSEGV handler; a path that faults is reported absent). */
const cpu_features *cpu_features_get(void);

/* The path CPU backends created now should use: the selected one, or AUTO resolved to the best
 * available (AMX, then AVX512-BF16, then fp32). Never AUTO. Aborts (UM_FATAL) when
 * UNMASK_CPU_KERNELS names an unknown or unavailable path: that is impossible setup. */
enum backend_cpu_kernels cpu_kernels_resolve(void);

#endif /* UM_CPU_FEATURES_H */
