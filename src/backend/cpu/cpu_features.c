/*
 * cpu_features.c — run-time CPU probes (cpuid leaves 1 and 7, XCR0 through xgetbv, the Linux AMX
 * tile-data permission) and the process-wide choices of the bf16 kernel path (cpu_features.h,
 * backend.h "CPU kernels") and of the int8 family of quantized weights (cpu_qkernels_*).
 *
 * Does not: run kernels. On a non-x86 build every bf16 path reports absent and AUTO means fp32.
 * Threading: probes once under pthread_once (any thread); the selection is written by the main
 * thread before CPU backends exist and read when one is created.
 */
#include "backend/cpu/cpu_features.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_build.h"
#include "util/fault.h"
#include "util/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <errno.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define UM_CPU_TRIALS 1
#endif
#endif

static cpu_features g_feat;

/* the name of a signal that ended a trial, for messages */
static const char *sig_name(int sig) {
    return sig == SIGILL ? "SIGILL" : sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : "a signal";
}
static pthread_once_t g_feat_once = PTHREAD_ONCE_INIT;
/* -1: nothing selected (UNMASK_CPU_KERNELS or AUTO); else an enum backend_cpu_kernels */
static int g_selected = -1;

#if defined(__x86_64__)
static unsigned long long xcr0_read(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

#define ARCH_REQ_XCOMP_PERM_ 0x1023   /* asm/prctl.h */
#define XFEATURE_XTILEDATA_  18

static void features_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    const int fma_f16c = ((c >> 12) & 1) && ((c >> 29) & 1);                    /* FMA, F16C */
    unsigned long long xcr0 = osxsave ? xcr0_read() : 0;
    const int os_ymm = (xcr0 & 0x6) == 0x6;                                      /* SSE, AVX state */
    const int os_avx512 = (xcr0 & 0xe6) == 0xe6;              /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM */
    const int os_tiles = ((xcr0 >> 17) & 3) == 3;             /* XTILECFG, XTILEDATA */
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx512 = ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);   /* F, BW, VL */
    const int amx = ((d >> 22) & 1) && ((d >> 24) & 1);                        /* AMX-BF16, AMX-TILE */
    const int avx2 = (b >> 5) & 1, vnni512 = (c >> 11) & 1;                    /* AVX2, AVX512_VNNI */
    const unsigned max_sub = a;
    int bf16 = 0, avxvnni = 0;
    if (max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        bf16 = (a >> 5) & 1;                                                   /* AVX512_BF16 */
        avxvnni = (a >> 4) & 1;                                                /* AVX-VNNI */
    }
    g_feat.avx512bf16 = avx512 && bf16 && os_avx512;
    g_feat.avx2 = avx && avx2 && fma_f16c && os_ymm;                          /* AVX2 + FMA + F16C */
    g_feat.avxvnni = g_feat.avx2 && avxvnni;
    g_feat.avx512vnni = avx512 && vnni512 && os_avx512 && fma_f16c;
    if (!amx) {
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "the CPU has no AMX-BF16");
    } else if (!os_tiles) {
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "the OS does not enable AMX tile state (XCR0)");
    } else if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_, XFEATURE_XTILEDATA_) != 0) {
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "Linux refused AMX tile data (arch_prctl, kernel < 5.16?)");
    } else if (!g_feat.avx512bf16) {   /* the AMX path runs its row remainders and epilogues with AVX-512 */
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "AMX without AVX512-BF16");
    } else {
        g_feat.amx_bf16 = 1;
    }
}

#ifdef UM_CPU_TRIALS
/* Trials: cpuid, XCR0 and arch_prctl can all say yes on a virtual CPU that still faults on the first
 * instruction (seen on a lent GPU machine, an Intel Xeon under KVM, 2026-11-26: AMX tiles raised
 * SIGILL in pool threads and SIGSEGV in the main thread; Linux sends those when it cannot enable the
 * tile state on first use). Each bf16 path's instructions are run once in a forked child, in its
 * main thread and in a new thread; a path whose child dies of a signal is reported absent instead
 * of killing the process. The test hook FAULT_CPU_TRIAL (util/fault.h: UNMASK_FAULT_CPU_TRIAL=PATH
 * or PATH:segv) makes that trial fault on purpose with SIGILL (SIGSEGV) (tests/cli/test_cpu_trial.sh). */
__attribute__((target("amx-tile,amx-bf16"))) static void trial_amx(void) {
    _Alignas(64) uint8_t cfg[64];
    memset(cfg, 0, sizeof cfg);
    cfg[0] = 1;    /* palette 1 */
    cfg[16] = 64;  /* tile 0: 64 bytes per row */
    cfg[48] = 16;  /* tile 0: 16 rows */
    _tile_loadconfig(cfg);
    _tile_zero(0);
    _tile_release();
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void trial_avx512bf16(void) {
    volatile float out[16];
    const __m512 acc = _mm512_dpbf16_ps(_mm512_set1_ps(1.0f), (__m512bh)_mm512_set1_epi16(0x3f80),
                                        (__m512bh)_mm512_set1_epi16(0x3f80));
    _mm512_storeu_ps((float *)out, acc);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) static void trial_avx512vnni(void) {
    volatile int32_t out[16];
    const __m512i acc = _mm512_dpbusd_epi32(_mm512_set1_epi32(1), _mm512_set1_epi8(2), _mm512_set1_epi8(3));
    _mm512_storeu_si512((void *)out, acc);
}

__attribute__((target("avx2,avxvnni"))) static void trial_avxvnni(void) {
    volatile int32_t out[8];
    const __m256i acc = _mm256_dpbusd_avx_epi32(_mm256_set1_epi32(1), _mm256_set1_epi8(2), _mm256_set1_epi8(3));
    _mm256_storeu_si256((void *)out, acc);
}

static void trial_fault_ill(void) { __asm__ volatile("ud2"); }
static void trial_fault_segv(void) { raise(SIGSEGV); }

static void (*g_trial_fn)(void);   /* the child's trial, for its second thread */
static void *trial_thread(void *arg) {
    (void)arg;
    g_trial_fn();
    return NULL;
}

/* 0 when fn ran in the child (both threads), else the signal that ended it (SIGILL, SIGSEGV, ...).
 * Runs once, from features_init (pthread_once). */
static int trial_run(const char *path, void (*fn)(void)) {
    const int fault = fault_hit(FAULT_CPU_TRIAL, &(fault_at){.path = path});   /* test hook (util/fault.h) */
    if (fault != FAULT_HIT_NONE) fn = fault == FAULT_HIT_SEGV ? trial_fault_segv : trial_fault_ill;
    fflush(NULL);   /* nothing buffered is written twice */
    const pid_t pid = fork();
    if (pid < 0) return 0;   /* cannot try: trust cpuid */
    if (pid == 0) {
        signal(SIGILL, SIG_DFL);
        signal(SIGSEGV, SIG_DFL);
        fn();
        g_trial_fn = fn;
        pthread_t t;
        if (pthread_create(&t, NULL, trial_thread, NULL) == 0) pthread_join(t, NULL);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return 0;
    return WIFSIGNALED(st) ? WTERMSIG(st) : 0;
}

static void features_trials(void) {
    int sig;
    if (g_feat.avx512bf16 && (sig = trial_run("avx512bf16", trial_avx512bf16)) != 0) {
        g_feat.avx512bf16 = 0;
        g_feat.avx512bf16_fault = sig;
        if (g_feat.amx_bf16) {
            g_feat.amx_bf16 = 0;
            snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "AMX without AVX512-BF16");
        }
    }
    if (g_feat.avx512vnni && trial_run("avx512vnni", trial_avx512vnni) != 0) g_feat.avx512vnni = 0;
    if (g_feat.avxvnni && trial_run("avxvnni", trial_avxvnni) != 0) g_feat.avxvnni = 0;
    if (g_feat.amx_bf16 && (sig = trial_run("amx", trial_amx)) != 0) {
        g_feat.amx_bf16 = 0;
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why,
                 "AMX instructions fault (%s) though cpuid, XCR0 and Linux allow them (a VM?)", sig_name(sig));
    }
}
#else
static void features_trials(void) {}
#endif

#else
static void features_probe(void) { snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "not an x86-64 CPU"); }
static void features_trials(void) {}
#endif

/* UNMASK_CPU_ISA: hide what lies above a level, as if the CPU lacked it (docs/cpu-kernels.md: the
 * AVX2-only stand-in on an AVX-512 machine). Runs before the trials, so hidden paths are never tried. */
static void features_cap(void) {
    static const char *const levels[] = {"baseline", "avx2", "avx512bf16", "amx"};
    const char *env = getenv("UNMASK_CPU_ISA");
    if (!env || !*env) return;
    int lvl = -1;
    for (int i = 0; i < 4; i++)
        if (strcmp(env, levels[i]) == 0) lvl = i;
    if (lvl < 0) UM_FATAL("UNMASK_CPU_ISA=%s: unknown level (baseline, avx2, avx512bf16, amx)", env);
    snprintf(g_feat.isa_cap, sizeof g_feat.isa_cap, "%s", env);
    if (lvl < 3 && g_feat.amx_bf16) {
        g_feat.amx_bf16 = 0;
        g_feat.hidden |= CPU_HID_AMX;
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "UNMASK_CPU_ISA=%s hides AMX", env);
    }
    if (lvl < 2 && g_feat.avx512bf16) {
        g_feat.avx512bf16 = 0;
        g_feat.hidden |= CPU_HID_AVX512BF16;
    }
    if (lvl < 2 && (g_feat.avx512vnni || g_feat.avxvnni)) { /* an AVX2-class CPU has no VNNI (Zen 3) */
        g_feat.avx512vnni = g_feat.avxvnni = 0;
        g_feat.hidden |= CPU_HID_VNNI;
    }
    if (lvl < 1 && g_feat.avx2) {
        g_feat.avx2 = 0;
        g_feat.hidden |= CPU_HID_AVX2;
    }
}

static void features_init(void) {
    memset(&g_feat, 0, sizeof g_feat);
    features_probe();
    features_cap();
    features_trials();
    if (!UM_CPU_BUILD_X86) /* this compiler built no such kernels */
        g_feat.avx2 = g_feat.avx512bf16 = g_feat.avxvnni = g_feat.avx512vnni = 0;
    if (g_feat.amx_bf16 && (!UM_CPU_BUILD_AMX || !g_feat.avx512bf16)) {
        g_feat.amx_bf16 = 0;
        snprintf(g_feat.amx_why, sizeof g_feat.amx_why, "this build has no AMX kernels");
    }
}

const cpu_features *cpu_features_get(void) {
    pthread_once(&g_feat_once, features_init);
    return &g_feat;
}

void backend_cpu_probe(void) { (void)cpu_features_get(); }

/* ---------------------------------------------------------------- the kernel path */

static const char *const k_names[] = {
    [BACKEND_CPU_KERNELS_AUTO] = "auto",
    [BACKEND_CPU_KERNELS_FP32] = "fp32",
    [BACKEND_CPU_KERNELS_AVX512BF16] = "avx512bf16",
    [BACKEND_CPU_KERNELS_AMX] = "amx",
    [BACKEND_CPU_KERNELS_AVX2] = "avx2",
};

int backend_cpu_kernels_parse(const char *name, enum backend_cpu_kernels *out) {
    for (int k = 0; k < (int)(sizeof k_names / sizeof k_names[0]); k++)
        if (name && strcmp(name, k_names[k]) == 0) {
            *out = (enum backend_cpu_kernels)k;
            return 0;
        }
    return -1;
}

const char *backend_cpu_kernels_name(enum backend_cpu_kernels k) {
    return (int)k >= 0 && (int)k < (int)(sizeof k_names / sizeof k_names[0]) ? k_names[k] : "?";
}

/* "auto, avx512bf16, avx2 or fp32": the settings that do run here, for messages. */
static const char *kernels_usable(char *buf, size_t n) {
    const cpu_features *f = cpu_features_get();
    const char *names[5];
    int k = 0;
    names[k++] = "auto";
    if (f->amx_bf16) names[k++] = "amx";
    if (f->avx512bf16) names[k++] = "avx512bf16";
    if (f->avx2) names[k++] = "avx2";
    names[k++] = "fp32";
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < k && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i == 0 ? "" : i == k - 1 ? " or " : ", ", names[i]);
    return buf;
}

/* 0 when path k runs on this CPU, else -1 + err saying what is missing. */
static int kernels_check(enum backend_cpu_kernels k, um_err *err) {
    const cpu_features *f = cpu_features_get();
    char use[64];
    kernels_usable(use, sizeof use);
    if (k == BACKEND_CPU_KERNELS_AVX2 && !f->avx2)
        return f->hidden & CPU_HID_AVX2
                   ? um_err_param(err, "cpu-kernels", "--cpu-kernels avx2: UNMASK_CPU_ISA=%s hides AVX2; use %s",
                                  f->isa_cap, use)
                   : um_err_param(err, "cpu-kernels", "--cpu-kernels avx2: this CPU (or OS) has no AVX2 and FMA; use %s",
                                  use);
    if (k == BACKEND_CPU_KERNELS_AVX512BF16 && (f->hidden & CPU_HID_AVX512BF16))
        return um_err_param(err, "cpu-kernels", "--cpu-kernels avx512bf16: UNMASK_CPU_ISA=%s hides AVX512-BF16; use %s",
                            f->isa_cap, use);
    if (k == BACKEND_CPU_KERNELS_AVX512BF16 && !f->avx512bf16)
        return f->avx512bf16_fault
                   ? um_err_param(err, "cpu-kernels", "--cpu-kernels avx512bf16: AVX512-BF16 instructions fault (%s) "
                                  "on this CPU though cpuid and XCR0 allow them (a VM?); use %s",
                                  sig_name(f->avx512bf16_fault), use)
                   : um_err_param(err, "cpu-kernels", "--cpu-kernels avx512bf16: this CPU (or OS) has no AVX512-BF16 "
                                  "(vdpbf16ps); use %s", use);
    if (k == BACKEND_CPU_KERNELS_AMX && !f->amx_bf16)
        return um_err_param(err, "cpu-kernels", "--cpu-kernels amx: %s; use %s", f->amx_why, use);
    return 0;
}

int backend_cpu_kernels_select(enum backend_cpu_kernels k, um_err *err) {
    if (kernels_check(k, err) != 0) return -1;
    g_selected = (int)k;
    return 0;
}

/* AUTO on this CPU: one path for every product where one is best at every shape, else AUTO (the
 * products are dispatched by shape, cpu_dispatch.h). */
static enum backend_cpu_kernels kernels_best(void) {
    const cpu_features *f = cpu_features_get();
    return f->amx_bf16 ? BACKEND_CPU_KERNELS_AMX : f->avx512bf16 ? BACKEND_CPU_KERNELS_AVX512BF16
                                                                 : f->avx2 ? BACKEND_CPU_KERNELS_AUTO
                                                                           : BACKEND_CPU_KERNELS_FP32;
}

enum backend_cpu_kernels cpu_kernels_resolve(int *automatic) {
    enum backend_cpu_kernels k = BACKEND_CPU_KERNELS_AUTO;
    if (g_selected >= 0) {
        k = (enum backend_cpu_kernels)g_selected;
    } else {
        const char *env = getenv("UNMASK_CPU_KERNELS");
        if (env && *env) {
            um_err err = {0};
            if (backend_cpu_kernels_parse(env, &k) != 0)
                UM_FATAL("UNMASK_CPU_KERNELS=%s: unknown kernel path (auto, amx, avx512bf16, avx2, fp32)", env);
            if (kernels_check(k, &err) != 0) UM_FATAL("UNMASK_CPU_KERNELS=%s: %s", env, err.msg);
        }
    }
    if (automatic) *automatic = k == BACKEND_CPU_KERNELS_AUTO;
    return k == BACKEND_CPU_KERNELS_AUTO ? kernels_best() : k;
}

/* ---------------------------------------------------------------- the quantized weights' kernels */

static const char *const k_qnames[] = {
    [CPU_QKERNELS_AUTO] = "auto",
    [CPU_QKERNELS_SCALAR] = "scalar",
    [CPU_QKERNELS_AVX2] = "avx2",
    [CPU_QKERNELS_AVXVNNI] = "avxvnni",
    [CPU_QKERNELS_AVX512VNNI] = "avx512vnni",
};
static int g_qselected = -1;   /* -1: nothing selected (UNMASK_CPU_QKERNELS or AUTO) */

int cpu_qkernels_parse(const char *name, enum cpu_qkernels *out) {
    for (int k = 0; k < (int)(sizeof k_qnames / sizeof k_qnames[0]); k++)
        if (name && strcmp(name, k_qnames[k]) == 0) {
            *out = (enum cpu_qkernels)k;
            return 0;
        }
    return -1;
}

const char *cpu_qkernels_name(enum cpu_qkernels k) {
    return (int)k >= 0 && (int)k < (int)(sizeof k_qnames / sizeof k_qnames[0]) ? k_qnames[k] : "?";
}

static int qkernels_check(enum cpu_qkernels k, um_err *err) {
    const cpu_features *f = cpu_features_get();
    const int have = k == CPU_QKERNELS_AVX2         ? f->avx2
                     : k == CPU_QKERNELS_AVXVNNI    ? f->avxvnni
                     : k == CPU_QKERNELS_AVX512VNNI ? f->avx512vnni
                                                    : 1;
    if (!have)
        return um_err_param(err, "cpu-qkernels", "int8 kernels %s: this CPU (or OS, or build) lacks %s; use auto, "
                            "scalar or one it has", cpu_qkernels_name(k),
                            k == CPU_QKERNELS_AVX2 ? "AVX2/FMA/F16C" : k == CPU_QKERNELS_AVXVNNI ? "AVX-VNNI" : "AVX512-VNNI");
    return 0;
}

int cpu_qkernels_select(enum cpu_qkernels k, um_err *err) {
    if (qkernels_check(k, err) != 0) return -1;
    g_qselected = (int)k;
    return 0;
}

enum cpu_qkernels cpu_qkernels_resolve(void) {
    enum cpu_qkernels k = CPU_QKERNELS_AUTO;
    if (g_qselected >= 0) {
        k = (enum cpu_qkernels)g_qselected;
    } else {
        const char *env = getenv("UNMASK_CPU_QKERNELS");
        if (env && *env) {
            um_err err = {0};
            if (cpu_qkernels_parse(env, &k) != 0)
                UM_FATAL("UNMASK_CPU_QKERNELS=%s: unknown kernel family (auto, avx512vnni, avxvnni, avx2, scalar)", env);
            if (qkernels_check(k, &err) != 0) UM_FATAL("UNMASK_CPU_QKERNELS=%s: %s", env, err.msg);
        }
    }
    if (k != CPU_QKERNELS_AUTO) return k;
    const cpu_features *f = cpu_features_get();
    return f->avx512vnni ? CPU_QKERNELS_AVX512VNNI
           : f->avxvnni  ? CPU_QKERNELS_AVXVNNI
           : f->avx2     ? CPU_QKERNELS_AVX2
                         : CPU_QKERNELS_SCALAR;
}
