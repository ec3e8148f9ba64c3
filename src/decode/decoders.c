/*
 * decoders.c — the decoders behind decoder.h: low_confidence and random (A1, fixed steps with the
 * reference quota), threshold (A2/A4) and factor (A3). Pure functions of the view and their small
 * per-sequence state; they never touch the canvas themselves. Not here: sampling / confidence
 * (decode.c), block iteration. Engine thread.
 */
#include "decode/decoder.h"

#include <stdlib.h>

#include "util/log.h"
#include "util/rng.h"

/* rng stream used by the random decoder's scores (disjoint from the Gumbel streams = step). */
#define RANDOM_SCORE_STREAM_BIT (1ull << 62)

int decoder_quota(int m, int s, int i) {
    if (s <= 0) return m;
    return m / s + (i < m % s ? 1 : 0);
}

typedef struct cand {
    double  c;     /* score, higher first */
    int32_t pos;   /* ties: lower position first */
    int32_t row;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->c > y->c) return -1;
    if (x->c < y->c) return 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Masked rows of the view sorted by score (conf, or scores[] when given), best first. Returns the
 * count; cs has room for v->n_rows. */
static int sorted_masked(const decoder_view *v, const double *scores, cand *cs) {
    int n = 0;
    for (int r = 0; r < v->n_rows; r++) {
        if (!v->row_masked[r]) continue;
        cs[n].c = scores ? scores[r] : v->conf[r];
        cs[n].pos = v->row_pos[r];
        cs[n].row = r;
        n++;
    }
    qsort(cs, (size_t)n, sizeof *cs, cand_cmp);
    return n;
}

/* Emit the first k candidates in ascending position order. */
static int emit_top(const decoder_view *v, cand *cs, int k, int32_t *out_pos, int32_t *out_tok) {
    /* re-sort the chosen prefix by position so writes are ordered */
    for (int i = 1; i < k; i++) {
        cand t = cs[i];
        int j = i - 1;
        while (j >= 0 && cs[j].pos > t.pos) {
            cs[j + 1] = cs[j];
            j--;
        }
        cs[j + 1] = t;
    }
    for (int i = 0; i < k; i++) {
        out_pos[i] = cs[i].pos;
        out_tok[i] = v->x0[cs[i].row];
    }
    return k;
}

/* ---------------------------------------------------------------- low_confidence / random */

typedef struct fixed_state {
    int m0;        /* masks in the block when it began */
    int s;         /* steps budgeted to the block */
} fixed_state;

static void fixed_block_begin(void *state, const decoder_view *v) {
    fixed_state *st = state;
    st->m0 = v->block_masks;
    st->s = v->block_steps > 0 ? v->block_steps : 1;
}

static int fixed_choose(fixed_state *st, const decoder_view *v, const double *scores, int32_t *out_pos,
                        int32_t *out_tok) {
    cand *cs = xmalloc((size_t)(v->n_rows > 0 ? v->n_rows : 1) * sizeof *cs);
    int n = sorted_masked(v, scores, cs);
    int k = decoder_quota(st->m0, st->s, v->step_in_block);
    if (v->step_in_block >= st->s - 1) k = n;  /* last budgeted step: finish the block */
    if (k < 1) k = 1;
    if (k > n) k = n;
    int r = emit_top(v, cs, k, out_pos, out_tok);
    free(cs);
    return r;
}

static int low_conf_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    return fixed_choose(state, v, NULL, out_pos, out_tok);
}

static int random_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    double *sc = xmalloc((size_t)(v->n_rows > 0 ? v->n_rows : 1) * sizeof *sc);
    for (int r = 0; r < v->n_rows; r++)
        sc[r] = rng_u01(v->seed, RANDOM_SCORE_STREAM_BIT | (uint64_t)v->step, (uint64_t)v->row_pos[r]);
    int k = fixed_choose(state, v, sc, out_pos, out_tok);
    free(sc);
    return k;
}

/* ---------------------------------------------------------------- threshold (A2) */

static int threshold_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    (void)state;
    cand *cs = xmalloc((size_t)(v->n_rows > 0 ? v->n_rows : 1) * sizeof *cs);
    int n = sorted_masked(v, NULL, cs);
    int k = n > 0 ? 1 : 0;   /* always the most confident one */
    while (k < n && cs[k].c >= v->p->threshold) k++;
    int r = emit_top(v, cs, k, out_pos, out_tok);
    free(cs);
    return r;
}

/* ---------------------------------------------------------------- factor (A3) */

static int factor_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    (void)state;
    cand *cs = xmalloc((size_t)(v->n_rows > 0 ? v->n_rows : 1) * sizeof *cs);
    int m = sorted_masked(v, NULL, cs);
    /* first failing 1-based n (c(n) < 1 - f/(n+1)), n >= 2; none -> m. Reference quirk: a first
     * failure at n = m commits all m. */
    int k = m;
    for (int n = 2; n <= m; n++) {
        if (cs[n - 1].c < 1.0 - v->p->factor / (double)(n + 1)) {
            k = n == m ? m : n - 1;
            break;
        }
    }
    int r = emit_top(v, cs, k, out_pos, out_tok);
    free(cs);
    return r;
}

/* ---------------------------------------------------------------- table */

static const decoder_ops k_decoders[DECODER_COUNT_] = {
    [DECODER_LOW_CONFIDENCE] = {"low_confidence", DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin,
                                low_conf_choose, NULL, NULL},
    [DECODER_RANDOM] = {"random", DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin, random_choose,
                        NULL, NULL},
    [DECODER_THRESHOLD] = {"threshold", 0, 0, NULL, threshold_choose, NULL, NULL},
    [DECODER_FACTOR] = {"factor", 0, 0, NULL, factor_choose, NULL, NULL},
};

const decoder_ops *decoder_get(enum decode_decoder d) {
    CHECK((int)d >= 0 && d < DECODER_COUNT_);
    return &k_decoders[d];
}
