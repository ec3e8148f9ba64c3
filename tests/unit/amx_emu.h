/*
 * amx_emu.h — a software AMX tile unit, so the AMX-BF16 GEMM kernel (src/backend/cpu/cpu_gemm_amx.c)
 * can be checked on CPUs without AMX. cpu_gemm_amx.c compiled with UM_AMX_EMULATE includes this
 * header instead of <immintrin.h>: the _tile_* intrinsics it uses become the functions below,
 * written from the Intel SDM's descriptions of LDTILECFG, TILERELEASE, TILEZERO, TILELOADD,
 * TILESTORED and TDPBF16PS (palette 1: 8 tiles of at most 16 rows x 64 bytes).
 *
 * What the hardware would fault on aborts here, with the kernel's line: a tile instruction without
 * a loaded configuration (#UD), a configuration the CPU would refuse (#GP: palette other than 1,
 * nonzero reserved bytes or start_row, rows > 16, colsb > 64, rows and colsb not both zero or both
 * set, settings for tiles 8..15), a tile not configured, TDPBF16PS with shapes that do not chain
 * (dst.rows != a.rows, dst.colsb != b.colsb, a.colsb / 4 != b.rows) or with repeated tiles.
 * TDPBF16PS arithmetic: bf16 inputs widened exactly, denormal inputs as zero, fp32 round to
 * nearest for each of the two products' adds, denormal results flushed to zero.
 *
 * Does not: model timing, the tile data in XSAVE, or the AMX-INT8/FP16 instructions.
 * Threading: the tile state is per thread (_Thread_local), as the architectural state is.
 * Tests only: no part of unmask links this.
 */
#ifndef UM_AMX_EMU_H
#define UM_AMX_EMU_H

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct amx_emu_unit {
    int      configured;     /* a palette-1 configuration is loaded */
    uint8_t  rows[8];        /* rows of tile i (0 = unconfigured) */
    uint16_t colsb[8];       /* bytes per row of tile i */
    uint8_t  t[8][16][64];   /* tile data */
} amx_emu_unit;

static _Thread_local amx_emu_unit amx_emu;
/* TDPBF16PS executed, all threads (tests read it: proof the tiles ran). Defined here: exactly one
 * translation unit, the emulated cpu_gemm_amx.c, includes this header. */
_Atomic long amx_emu_dp_total;

#define AMX_EMU_FAIL(line, ...)                                          \
    do {                                                                 \
        fprintf(stderr, "amx_emu: cpu_gemm_amx.c:%d: ", line);          \
        fprintf(stderr, __VA_ARGS__);                                    \
        fputc('\n', stderr);                                             \
        abort();                                                         \
    } while (0)

static void amx_emu_need(int tile, int line) {
    if (!amx_emu.configured) AMX_EMU_FAIL(line, "tile instruction without a loaded tile configuration (#UD)");
    if (tile < 0 || tile > 7) AMX_EMU_FAIL(line, "tile register %d does not exist", tile);
    if (!amx_emu.rows[tile]) AMX_EMU_FAIL(line, "tile %d is not configured", tile);
}

static void amx_emu_loadconfig(const void *cfg, int line) {
    const uint8_t *c = cfg;
    if (((uintptr_t)cfg & 63) != 0) AMX_EMU_FAIL(line, "the configuration is not 64-byte aligned");
    memset(&amx_emu, 0, sizeof amx_emu);
    if (c[0] == 0) return; /* palette 0: init state */
    if (c[0] != 1) AMX_EMU_FAIL(line, "palette %d (only 1 exists) (#GP)", c[0]);
    if (c[1] != 0) AMX_EMU_FAIL(line, "start_row %d (#GP for a fresh configuration)", c[1]);
    for (int i = 2; i < 16; i++)
        if (c[i]) AMX_EMU_FAIL(line, "reserved configuration byte %d is %d (#GP)", i, c[i]);
    for (int i = 0; i < 16; i++) {
        uint16_t colsb = (uint16_t)(c[16 + 2 * i] | c[17 + 2 * i] << 8);
        uint8_t rows = c[48 + i];
        if (i >= 8 && (colsb || rows)) AMX_EMU_FAIL(line, "tile %d configured, palette 1 has 8 tiles (#GP)", i);
        if (i >= 8) continue;
        if (rows > 16 || colsb > 64) AMX_EMU_FAIL(line, "tile %d: %d rows x %d bytes exceeds 16 x 64 (#GP)", i, rows, colsb);
        if (!rows != !colsb) AMX_EMU_FAIL(line, "tile %d: rows %d with colsb %d (#GP)", i, rows, colsb);
        amx_emu.rows[i] = rows;
        amx_emu.colsb[i] = colsb;
    }
    amx_emu.configured = 1;
}

static void amx_emu_release(void) { memset(&amx_emu, 0, sizeof amx_emu); }

static void amx_emu_zero(int t, int line) {
    amx_emu_need(t, line);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);
}

static void amx_emu_loadd(int t, const void *base, long stride, int line) {
    amx_emu_need(t, line);
    memset(amx_emu.t[t], 0, sizeof amx_emu.t[t]);   /* bytes past rows x colsb read as zero */
    for (int r = 0; r < amx_emu.rows[t]; r++) memcpy(amx_emu.t[t][r], (const uint8_t *)base + r * stride, amx_emu.colsb[t]);
}

static void amx_emu_stored(int t, void *base, long stride, int line) {
    amx_emu_need(t, line);
    for (int r = 0; r < amx_emu.rows[t]; r++) memcpy((uint8_t *)base + r * stride, amx_emu.t[t][r], amx_emu.colsb[t]);
}

/* bf16 -> fp32, denormals as zero */
static float amx_emu_bf16(const uint8_t *p) {
    uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float amx_emu_ftz(float x) { return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x; }

static void amx_emu_dpbf16ps(int c, int a, int b, int line) {
    amx_emu_need(c, line);
    amx_emu_need(a, line);
    amx_emu_need(b, line);
    if (c == a || c == b || a == b) AMX_EMU_FAIL(line, "TDPBF16PS with repeated tiles %d, %d, %d (#UD)", c, a, b);
    const int M = amx_emu.rows[c], N = amx_emu.colsb[c] / 4, K = amx_emu.colsb[a] / 4;
    if (amx_emu.rows[a] != M || amx_emu.colsb[b] != amx_emu.colsb[c] || amx_emu.rows[b] != K || amx_emu.colsb[a] % 4)
        AMX_EMU_FAIL(line, "TDPBF16PS shapes do not chain: dst %dx%d, a %dx%d, b %dx%d (#UD)", amx_emu.rows[c],
                     amx_emu.colsb[c], amx_emu.rows[a], amx_emu.colsb[a], amx_emu.rows[b], amx_emu.colsb[b]);
    atomic_fetch_add_explicit(&amx_emu_dp_total, 1, memory_order_relaxed);
    for (int m = 0; m < M; m++) {
        float acc[16];
        memcpy(acc, amx_emu.t[c][m], (size_t)N * 4);
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                const uint8_t *ar = &amx_emu.t[a][m][4 * k], *br = &amx_emu.t[b][k][4 * n];
                acc[n] = amx_emu_ftz(acc[n] + amx_emu_bf16(ar + 2) * amx_emu_bf16(br + 2));
                acc[n] = amx_emu_ftz(acc[n] + amx_emu_bf16(ar) * amx_emu_bf16(br));
            }
        memcpy(amx_emu.t[c][m], acc, (size_t)N * 4);
    }
}

#define _tile_loadconfig(cfg) amx_emu_loadconfig(cfg, __LINE__)
#define _tile_release() amx_emu_release()
#define _tile_zero(t) amx_emu_zero(t, __LINE__)
#define _tile_loadd(t, base, stride) amx_emu_loadd(t, base, stride, __LINE__)
#define _tile_stored(t, base, stride) amx_emu_stored(t, base, stride, __LINE__)
#define _tile_dpbf16ps(c, a, b) amx_emu_dpbf16ps(c, a, b, __LINE__)

#endif
