/*
 * cpu_qgemm_ymm.h — the ymm micro-kernel of the quantized GEMM layer as a template, included by
 * cpu_qgemm_avx2.c twice: QY_VNNI 0 (AVX2: vpmaddubsw + vpmaddwd) and 1 (AVX-VNNI: vpdpbusd on ymm),
 * with QY_TARGET the target attribute and QY(name) the instance's names. Not a header of its own.
 *
 * A group (16 outputs) is two ymm halves of 8 outputs; a micro-kernel call is MR rows x one group.
 * Only the MR x 2 int32 accumulators live in registers (16 ymm registers hold no more); the fp32
 * accumulators are the block buffer c itself (L1), updated once per 32-input block.
 *   AVX-VNNI: as the zmm family (cpu_qgemm_avx512.c): weights the unsigned operand (Q8_0: q ^ 0x80,
 *             Q4_0: the nibble), the accumulator starting at -128 or -8 times the block's sum of x.
 *   AVX2:     vpmaddubsw also multiplies unsigned by signed bytes, but adds pairs into saturating
 *             int16, so q + 128 (up to 255 x 127 x 2) would overflow. Q8_0 takes |q| as the unsigned
 *             operand and x with q's sign as the signed one (|q| <= 128, |x| <= 127: a pair is at most
 *             32512, no saturation), and vpmaddwd by ones widens each step's pairs into int32. Q4_0
 *             takes the nibble and the -8 sum(x) start; its pairs are small (at most 2 x 15 x 127 =
 *             3810), so a block's 8 steps add up in int16 (at most 30480, no wrap) and one vpmaddwd
 *             per block widens them.
 * Threading: pure functions, run on pool slots.
 */
#ifndef QY_VNNI
#error "cpu_qgemm_ymm.h is a template: include it from cpu_qgemm_avx2.c with QY_VNNI, QY_TARGET and QY defined"
#endif

QY_TARGET __attribute__((always_inline)) static inline __m256i QY(bcast4)(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* acc += the 4-input step of x (broadcast) against weights w (prepared: VNNI the unsigned bytes; AVX2
 * Q8_0 the signed quants w with aw = |w|, Q4_0 the nibbles) */
QY_TARGET __attribute__((always_inline)) static inline __m256i QY(step)(const int Q4, __m256i acc, __m256i w, __m256i aw,
                                                                        __m256i x, __m256i ones) {
#if QY_VNNI
    (void)Q4, (void)aw, (void)ones;
    return _mm256_dpbusd_avx_epi32(acc, w, x);
#else
    const __m256i p = Q4 ? _mm256_maddubs_epi16(w, x) : _mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
#endif
}

/* c[i][l] += (the module's fp32 accumulation) for i < MR, l < 16: rows i0.. of a, the group at g. c is
 * the block buffer at this group's first column (rows 64 floats apart). */
QY_TARGET __attribute__((always_inline)) static inline void QY(ukernel)(const int Q4, const int MR, const cpu_qact *a,
                                                                         int64_t i0, const uint8_t *g, float *c) {
    const enum dtype t = Q4 ? DTYPE_Q4_0 : DTYPE_Q8_0;
    const int corr = QY_VNNI ? (Q4 ? 8 : 128) : (Q4 ? 8 : 0);
    const __m256i m80 = _mm256_set1_epi8((char)0x80), m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    (void)m80;
    /* the rows' quants, sums and scales, read through locals (c's stores would otherwise make GCC
     * reload a's fields every block) */
    const int8_t *xq[4];
    const int32_t *xs[4];
    const float *xd[4];
    const int64_t nb = a->nb;
#pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
        xq[i] = a->q + (i0 + i) * a->kpad;
        xs[i] = a->s + (i0 + i) * nb;
        xd[i] = a->d + (i0 + i) * nb;
    }
    for (int64_t bk = 0; bk < nb; bk++) {
        const uint8_t *qs = cpu_qblock_qs(g, t, bk);
        const int8_t *xb[4];
        __m256i acc[4][2];
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            xb[i] = xq[i] + 32 * bk;
            acc[i][0] = acc[i][1] = _mm256_set1_epi32(-xs[i][bk] * corr);
        }
        if (!Q4) {
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                __m256i w[2], aw[2];
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) {
                    const __m256i raw = _mm256_load_si256((const void *)(qs + 64 * s + 32 * v));
#if QY_VNNI
                    w[v] = _mm256_xor_si256(raw, m80);
                    aw[v] = w[v];
#else
                    w[v] = raw;
                    aw[v] = _mm256_abs_epi8(raw);
#endif
                }
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i x = QY(bcast4)(xb[i] + 4 * s);
#pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) acc[i][v] = QY(step)(0, acc[i][v], w[v], aw[v], x, ones);
                }
            }
        } else if (!QY_VNNI) {
            /* AVX2 Q4_0: the block's 8 vpmaddubsw results (each pair at most 2 x 15 x 127 = 3810) are
             * summed in int16 (at most 30480: no wrap), widened by one vpmaddwd per block, not per step */
            __m256i a16[4][2];
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++) a16[i][0] = a16[i][1] = _mm256_setzero_si256();
            /* not unrolled: GCC hoisted the 4 unrolled steps' loads and spilled ~50 ymm per block
             * (1.35-1.5x slower, cpu_kernels_bench); the VNNI and Q8_0 loops gain from unrolling */
#pragma GCC unroll 1
            for (int p = 0; p < 4; p++) {
                __m256i raw[2], w[2];
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) {
                    raw[v] = _mm256_load_si256((const void *)(qs + 64 * p + 32 * v));
                    w[v] = _mm256_and_si256(raw[v], m0f);
                }
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i x = QY(bcast4)(xb[i] + 4 * p);
#pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) a16[i][v] = _mm256_add_epi16(a16[i][v], _mm256_maddubs_epi16(w[v], x));
                }
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) w[v] = _mm256_and_si256(_mm256_srli_epi16(raw[v], 4), m0f);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i x = QY(bcast4)(xb[i] + 16 + 4 * p);
#pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) a16[i][v] = _mm256_add_epi16(a16[i][v], _mm256_maddubs_epi16(w[v], x));
                }
            }
#pragma GCC unroll 4
            for (int i = 0; i < MR; i++)
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++)   /* the start value set above, applied here: fewer live registers */
                    acc[i][v] = _mm256_add_epi32(_mm256_set1_epi32(-xs[i][bk] * corr),
                                                 _mm256_madd_epi16(a16[i][v], ones));
        } else {
#pragma GCC unroll 4
            for (int p = 0; p < 4; p++) {
                __m256i raw[2], w[2];
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) {
                    raw[v] = _mm256_load_si256((const void *)(qs + 64 * p + 32 * v));
                    w[v] = _mm256_and_si256(raw[v], m0f);
                }
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i x = QY(bcast4)(xb[i] + 4 * p);
#pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) acc[i][v] = QY(step)(1, acc[i][v], w[v], w[v], x, ones);
                }
#pragma GCC unroll 2
                for (int v = 0; v < 2; v++) w[v] = _mm256_and_si256(_mm256_srli_epi16(raw[v], 4), m0f);
#pragma GCC unroll 4
                for (int i = 0; i < MR; i++) {
                    const __m256i x = QY(bcast4)(xb[i] + 16 + 4 * p);
#pragma GCC unroll 2
                    for (int v = 0; v < 2; v++) acc[i][v] = QY(step)(1, acc[i][v], w[v], w[v], x, ones);
                }
            }
        }
        const uint16_t *d = cpu_qblock_d(g, t, bk);
        __m256 dw[2];
#pragma GCC unroll 2
        for (int v = 0; v < 2; v++) dw[v] = _mm256_cvtph_ps(_mm_loadu_si128((const void *)(d + 8 * v)));
#pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
            const __m256 dx = _mm256_set1_ps(xd[i][bk]);
#pragma GCC unroll 2
            for (int v = 0; v < 2; v++) {
                float *ci = c + i * 64 + 8 * v;
                _mm256_store_ps(ci, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i][v]), _mm256_mul_ps(dw[v], dx),
                                                    _mm256_load_ps(ci)));
            }
        }
    }
}

typedef void (*QY(ukernel_fn))(const cpu_qact *a, int64_t i0, const uint8_t *g, float *c);

#define QY_UK(q4, mr)                                                                                          \
    QY_TARGET static void QY(uk_##q4##_##mr)(const cpu_qact *a, int64_t i0, const uint8_t *g, float *c) {      \
        QY(ukernel)(q4, mr, a, i0, g, c);                                                                      \
    }
QY_UK(0, 1) QY_UK(0, 2) QY_UK(0, 3) QY_UK(0, 4) QY_UK(1, 1) QY_UK(1, 2) QY_UK(1, 3) QY_UK(1, 4)
#undef QY_UK

static const QY(ukernel_fn) QY(k_uk)[2][4] = {
    {QY(uk_0_1), QY(uk_0_2), QY(uk_0_3), QY(uk_0_4)},
    {QY(uk_1_1), QY(uk_1_2), QY(uk_1_3), QY(uk_1_4)},
};

/* The block group by group, each in passes of up to MR_MAX rows (AVX2 Q8_0: 3, whose step needs
 * two registers per weight vector), into c zeroed first. */
static void QY(block)(enum dtype t, const cpu_qact *a, int64_t i0, int m, const uint8_t *const *b, int ng, float *c) {
    const int q4 = t == DTYPE_Q4_0, mr_max = !QY_VNNI && !q4 ? 3 : 4;
    for (int i = 0; i < m; i++) memset(c + (int64_t)i * 64, 0, (size_t)ng * 16 * sizeof *c);
    for (int j = 0; j < ng; j++)
        for (int i = 0; i < m; i += mr_max) {
            const int mr = m - i < mr_max ? m - i : mr_max;
            QY(k_uk)[q4][mr - 1](a, i0 + i, b[j], c + (int64_t)i * 64 + 16 * j);
        }
}
