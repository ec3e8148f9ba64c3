/*
 * cpu_features.h — what this CPU can run, asked once at run time (cpuid + xgetbv, and the Linux
 * permission for AMX tile data), and which kernel path the CPU backend takes for bf16 weights:
 * AMX-BF16 tiles, AVX512-BF16 (vdpbf16ps), or the fp32 reference (OpenBLAS sgemm on weights widened
 * per tile), and with AVX2 + FMA only, the AVX2 family for products of few rows. Process-wide: the path
 * chosen by backend_cpu_kernels_select() (the --cpu-kernels flag) or the UNMASK_CPU_KERNELS
 * environment variable applies to CPU backends created afterwards. Likewise the int8 kernel family
 * of Q8_0 / Q4_0 weights (cpu_qkernels_*, UNMASK_CPU_QKERNELS). UNMASK_CPU_ISA=amx|avx512bf16|
 * avx2|baseline caps what the probes report (a testing and benchmark knob: this CPU then behaves as
 * one without the features above that level, e.g. an AVX2-only CPU on an AVX-512 machine).
 *
 * Does not: run any kernel (cpu_gemm*.c do), know about weights or threads.
 * Threading: the probes are computed once (thread-safe, pthread_once); select() is called by the
 * main thread before backends are created.
 */
#ifndef UM_CPU_FEATURES_H
#define UM_CPU_FEATURES_H

#include "backend/backend.h"

typedef struct cpu_features {
    int avx2;         /* AVX2 + FMA + F16C in the CPU and ymm state enabled by the OS (bf16 and int8
                         kernels) */
    int avx512bf16;   /* AVX512F+BW+VL+BF16 in the CPU and zmm/opmask state enabled by the OS */
    int amx_bf16;     /* AMX-TILE + AMX-BF16, tile state enabled, and tile data permitted for us
                         (arch_prctl(ARCH_REQ_XCOMP_PERM) succeeded) */
    int avx512bf16_fault;     /* 0, or the signal vdpbf16ps raised in its trial though cpuid and XCR0
                                 said yes (SIGILL, SIGSEGV) */
    char amx_why[96]; /* why amx_bf16 is 0 (empty when it is 1) */
    /* the int8 kernels of quantized weights (cpu_qgemm.h) */
    int avxvnni;      /* AVX-VNNI (vpdpbusd on ymm) besides avx2 */
    int avx512vnni;   /* AVX512F+BW+VL+VNNI, zmm/opmask state enabled, F16C + FMA */
    char isa_cap[16]; /* UNMASK_CPU_ISA's level, or empty */
    unsigned hidden;  /* CPU_HID_* bits: features this CPU has that UNMASK_CPU_ISA hides */
} cpu_features;

enum { CPU_HID_AVX2 = 1, CPU_HID_AVX512BF16 = 2, CPU_HID_AMX = 4, CPU_HID_VNNI = 8 };

/* The probe results (computed on first call: cpuid/XCR0/arch_prctl, capped by UNMASK_CPU_ISA, then
 * one trial of each remaining bf16 path's instructions in a forked child; a path that faults is
 * reported absent). An unknown UNMASK_CPU_ISA is fatal (impossible setup). */
const cpu_features *cpu_features_get(void);

/* The path CPU backends created now should use: the selected one, or AUTO resolved to the one path
 * that serves every product (AMX, else AVX512-BF16; FP32 without AVX2), or AUTO itself on an
 * AVX2-only CPU, whose products are dispatched by shape (cpu_dispatch.c). *automatic (may be NULL):
 * 1 when the setting was AUTO. Aborts (UM_FATAL) when UNMASK_CPU_KERNELS names an unknown or
 * unavailable path: that is impossible setup. */
enum backend_cpu_kernels cpu_kernels_resolve(int *automatic);

/* ---------------------------------------------------------------- quantized weights' kernels
 * The kernel family of Q8_0 / Q4_0 products (cpu_qgemm.h). AUTO: the best this CPU has
 * (AVX512-VNNI, AVX-VNNI, AVX2, scalar). Chosen per process like the bf16 path: cpu_qkernels_select()
 * (tests, benchmarks), else the UNMASK_CPU_QKERNELS environment variable, else AUTO. */
enum cpu_qkernels {
    CPU_QKERNELS_AUTO,
    CPU_QKERNELS_SCALAR,
    CPU_QKERNELS_AVX2,
    CPU_QKERNELS_AVXVNNI,
    CPU_QKERNELS_AVX512VNNI,
};
/* "auto", "scalar", "avx2", "avxvnni", "avx512vnni" -> *out: 0, or -1 when unknown. */
int  cpu_qkernels_parse(const char *name, enum cpu_qkernels *out);
const char *cpu_qkernels_name(enum cpu_qkernels k);
/* Use family k in the CPU backends created from now on; -1 + err (param "cpu-qkernels") saying what
 * this CPU lacks. */
int  cpu_qkernels_select(enum cpu_qkernels k, um_err *err);
/* The family backends created now use (never AUTO). Aborts (UM_FATAL) when UNMASK_CPU_QKERNELS
 * names an unknown or unavailable family: impossible setup. */
enum cpu_qkernels cpu_qkernels_resolve(void);

#endif /* UM_CPU_FEATURES_H */
