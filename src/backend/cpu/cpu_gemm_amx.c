/*
 * cpu_gemm_amx.c — the AMX-BF16 kernel family of the GEMM layer (cpu_gemm.h): TDPBF16PS on 16x16
 * fp32 accumulator tiles.
 *
 * Tiles (one configuration, loaded per pool slot around a run of blocks): tmm0-3 accumulators,
 * tmm4-5 activations (16 rows x 32 bf16, straight from the row-major bf16 activations), tmm6-7
 * weights (16 input pairs x 16 outputs: one packed group, exactly the layout TDPBF16PS wants).
 * A block of 32 rows x 2 groups runs 2x2 tiles per 32-input step; 16 leftover rows run 1x2; fewer
 * than 16 rows go to the AVX512-BF16 micro-kernel (every AMX CPU has it), so no activation row is
 * ever padded. Accumulators are stored to the block buffer for the shared epilogue.
 *
 * Only selected where cpu_features found AMX usable (CPUID, XCR0 and the Linux permission,
 * arch_prctl(ARCH_REQ_XCOMP_PERM)); tests/unit/test_cpu_gemm.c runs it on such CPUs and says why it
 * skips elsewhere. Compiled with UM_AMX_EMULATE (tests only), the same code runs on a software tile
 * unit (tests/unit/amx_emu.h) as the kernel family cpu_gemm_amx_emulated, so its tile shapes,
 * strides and accumulator placement are checked on CPUs without AMX too.
 * Does not: pack, convert, apply epilogues.
 * Threading: the tile configuration is per thread: begin()/end() run on the slot that uses it.
 */
#include <string.h>

#include "backend/cpu/cpu_build.h"
#include "backend/cpu/cpu_gemm.h"

#if defined(UM_AMX_EMULATE)
#include "amx_emu.h"

#define AMX_TARGET
#define CPU_GEMM_AMX cpu_gemm_amx_emulated
#define AMX_NAME "amx (emulated tiles)"
#define AMX_COMPILED 1
#elif UM_CPU_BUILD_AMX
#include <immintrin.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define CPU_GEMM_AMX cpu_gemm_amx
#define AMX_NAME "amx"
#define AMX_COMPILED 1
#endif

#ifdef AMX_COMPILED

/* The 64-byte tile configuration (palette 1). */
typedef struct amx_tilecfg {
    uint8_t  palette;
    uint8_t  start_row;
    uint8_t  reserved[14];
    uint16_t colsb[16];   /* bytes per row of tile i */
    uint8_t  rows[16];    /* rows of tile i */
} amx_tilecfg;

AMX_TARGET static void amx_begin(void) {
    _Alignas(64) amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
}

AMX_TARGET static void amx_end(void) { _tile_release(); }

/* 32 rows x groups b0, b1 (b1 may be NULL): c rows i..i+31, columns 16 j0 ... */
AMX_TARGET static void amx_32x2(const uint16_t *a, int64_t lda, const uint16_t *b0, const uint16_t *b1, int64_t kpad,
                                float *c0, float *c1) {
    const long sa = (long)(lda * 2), sb = 64, sc = 64 * 4;
    const uint16_t *a1 = a + 16 * lda;
    __asm__ volatile("" ::: "memory");   /* the tile loads below read memory the compiler cannot see */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k0 = 0; k0 < kpad; k0 += 32) {
        _tile_loadd(4, a + k0, sa);
        _tile_loadd(5, a1 + k0, sa);
        _tile_loadd(6, b0 + k0 * 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (b1) {
            _tile_loadd(7, b1 + k0 * 16, sb);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, c0, sc);
    _tile_stored(2, c0 + 16 * 64, sc);
    if (b1) {
        _tile_stored(1, c1, sc);
        _tile_stored(3, c1 + 16 * 64, sc);
    }
}

/* 16 rows x groups b0, b1 (b1 may be NULL) */
AMX_TARGET static void amx_16x2(const uint16_t *a, int64_t lda, const uint16_t *b0, const uint16_t *b1, int64_t kpad,
                                float *c0, float *c1) {
    const long sa = (long)(lda * 2), sb = 64, sc = 64 * 4;
    __asm__ volatile("" ::: "memory");
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t k0 = 0; k0 < kpad; k0 += 32) {
        _tile_loadd(4, a + k0, sa);
        _tile_loadd(6, b0 + k0 * 16, sb);
        _tile_dpbf16ps(0, 4, 6);
        if (b1) {
            _tile_loadd(7, b1 + k0 * 16, sb);
            _tile_dpbf16ps(1, 4, 7);
        }
    }
    _tile_stored(0, c0, sc);
    if (b1) _tile_stored(1, c1, sc);
}

AMX_TARGET static void amx_block(const void *act, int64_t lda, int m, const uint16_t *const *b, int ng, int64_t kpad,
                                 float *c) {
    const uint16_t *a = act;
    int i = 0;
    for (; i + 32 <= m; i += 32)
        for (int j = 0; j < ng; j += 2)
            amx_32x2(a + (int64_t)i * lda, lda, b[j], j + 1 < ng ? b[j + 1] : NULL, kpad, c + (int64_t)i * 64 + 16 * j,
                     c + (int64_t)i * 64 + 16 * (j + 1));
    for (; i + 16 <= m; i += 16)
        for (int j = 0; j < ng; j += 2)
            amx_16x2(a + (int64_t)i * lda, lda, b[j], j + 1 < ng ? b[j + 1] : NULL, kpad, c + (int64_t)i * 64 + 16 * j,
                     c + (int64_t)i * 64 + 16 * (j + 1));
    if (i < m) cpu_gemm_avx512bf16.block(a + (int64_t)i * lda, lda, m - i, b, ng, kpad, c + (int64_t)i * 64);
}

const cpu_gemm_kernel CPU_GEMM_AMX = {.name = AMX_NAME, .block = amx_block, .begin = amx_begin, .end = amx_end};

#else /* no AMX intrinsics in this compiler: never selected (cpu_features reports AMX absent) */

const cpu_gemm_kernel cpu_gemm_amx = {.name = "amx", .block = NULL};   /* not compiled in */

#endif
