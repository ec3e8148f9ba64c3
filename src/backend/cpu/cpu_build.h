/*
 * cpu_build.h — which CPU kernel families this compiler builds: the one place the kernel files
 * (cpu_gemm_*.c, cpu_qgemm_*.c) and the feature probes (cpu_features.c, which reports a family
 * absent when it is not built) read the condition from, and the function clones of hot loops.
 * Compile-time only; no code.
 */
#ifndef UM_CPU_BUILD_H
#define UM_CPU_BUILD_H

/* The AVX2, AVX-512 (BF16, VNNI) and AVX-VNNI families: x86-64 with GCC-style target attributes. */
#if defined(__x86_64__) && defined(__GNUC__)
#define UM_CPU_BUILD_X86 1
#else
#define UM_CPU_BUILD_X86 0
#endif

/* The AMX-BF16 family: GCC's AMX intrinsics (clang's differ). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define UM_CPU_BUILD_AMX 1
#else
#define UM_CPU_BUILD_AMX 0
#endif

/* Hot element-wise loops get an AVX2/FMA clone next to the baseline one, picked at load time
 * (GCC function multi-versioning via ifunc), so the binary still runs on any x86-64.
 * Not under ThreadSanitizer: GCC instruments the ifunc resolvers, which the dynamic loader runs
 * before libtsan is initialised (SIGSEGV at startup). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CPU_HOT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
/* the loops around the bf16 kernels (casts, epilogues) also get an AVX-512 clone */
#define CPU_WIDE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_HOT_CLONES
#define CPU_WIDE_CLONES
#endif

#endif /* UM_CPU_BUILD_H */
