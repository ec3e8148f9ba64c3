/*
 * decoders.c — the decoders behind decoder.h: low_confidence and random (A1, fixed steps with the
 * reference quota), threshold (A2/A4), factor (A3), hierarchy (A5) and credit (A6). Pure functions of the view and their small
 * per-sequence state; they never touch the canvas themselves. Not here: sampling / confidence
 * (decode.c), block iteration. Engine thread.
 */
#include "decode/decoder.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode/sample.h"
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

/* ---------------------------------------------------------------- hierarchy (A5) */

/* Candidates: in every run of consecutive masked positions, the positions equal to the run's
 * maximum confidence (and > low_threshold when set); every position with c > threshold; the
 * global argmax (first maximum). */
static int hierarchy_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    (void)state;
    const decode_params *p = v->p;
    int n = 0, best = -1;
    for (int r = 0; r < v->n_rows; r++) {
        if (!v->row_masked[r]) continue;
        if (best < 0 || v->conf[r] > v->conf[best]) best = r;
    }
    int r = 0;
    while (r < v->n_rows) {
        if (!v->row_masked[r]) {
            r++;
            continue;
        }
        /* run [r, e): masked rows at consecutive positions */
        int e = r + 1;
        while (e < v->n_rows && v->row_masked[e] && v->row_pos[e] == v->row_pos[e - 1] + 1) e++;
        double mx = v->conf[r];
        for (int q = r + 1; q < e; q++)
            if (v->conf[q] > mx) mx = v->conf[q];
        for (int q = r; q < e; q++) {
            double c = v->conf[q];
            int take = c == mx && (p->low_threshold <= 0.0 || c > p->low_threshold);
            if (c > p->threshold || q == best) take = 1;
            if (take) {
                out_pos[n] = v->row_pos[q];
                out_tok[n] = v->x0[q];
                n++;
            }
        }
        r = e;
    }
    return n;
}

/* ---------------------------------------------------------------- credit (A6) */

typedef struct credit_state {
    float *M;       /* [rows x vocab] credit of the active block, row = pos - lo; owned */
    int    rows;    /* rows allocated (block_length) */
    int    vocab;
    float *l;       /* [vocab] scratch: adjusted logits */
} credit_state;

static void credit_block_begin(void *state, const decoder_view *v) {
    credit_state *st = state;
    int need = v->p->block_length > v->hi - v->lo ? v->p->block_length : v->hi - v->lo;
    if (!st->M || st->rows < need || st->vocab != v->vocab) {
        free(st->M);
        free(st->l);
        st->rows = need;
        st->vocab = v->vocab;
        st->M = xmalloc((size_t)need * (size_t)v->vocab * sizeof *st->M);
        st->l = xmalloc((size_t)v->vocab * sizeof *st->l);
    }
    /* a new block starts with no credit (A6: cleared when the previous block finished) */
    memset(st->M, 0, (size_t)st->rows * (size_t)st->vocab * sizeof *st->M);
}

static int credit_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    credit_state *st = state;
    const decode_params *p = v->p;
    int V = v->vocab;
    CHECK(st->M && v->logits && v->x0_w && v->conf_w && V == st->vocab);
    sample_cfg sc;
    memset(&sc, 0, sizeof sc);
    sc.vocab = V;
    sc.mask_id = v->mask_id;
    sc.eos_id = v->eos_id;
    sc.eot_id = v->eot_id;
    sc.cfg_scale = 0;           /* v->logits are already the effective logits */
    sc.logits_eos_inf = 0;
    sc.confidence_eos_eot_inf = p->confidence_eos_eot_inf;
    sc.temperature = p->temperature;
    sc.top_k = p->top_k;
    sc.top_p = p->top_p;
    sc.seed = p->seed;
    const float decay = (float)p->credit_decay;
    for (int r = 0; r < v->n_rows; r++) {
        if (!v->row_masked[r]) continue;
        int i = v->row_pos[r] - v->lo;
        CHECK(i >= 0 && i < st->rows);
        float *M = st->M + (size_t)i * (size_t)V;
        const float *l = v->logits + (size_t)r * (size_t)V;
        if (v->step_in_block > 0)
            for (int t = 0; t < V; t++) M[t] *= decay;
        /* (p1, t1) = max of softmax(l): the first maximum of l */
        int t1 = 0;
        for (int t = 1; t < V; t++)
            if (l[t] > l[t1]) t1 = t;
        double z = 0;
        for (int t = 0; t < V; t++) z += exp((double)l[t] - (double)l[t1]);
        double p1 = z > 0 ? 1.0 / z : 0.0;
        M[t1] += (float)pow(p1, p->credit_gamma);
        for (int t = 0; t < V; t++) st->l[t] = (float)((double)l[t] + p->credit_alpha * log1p((double)M[t]));
        sample_row(&sc, st->l, NULL, v->step, v->row_pos[r], &v->x0_w[r], &v->conf_w[r]);
    }
    return threshold_choose(NULL, v, out_pos, out_tok);
}

static void credit_free(void *state) {
    credit_state *st = state;
    free(st->M);
    free(st->l);
}

/* ---------------------------------------------------------------- table */

static const decoder_ops k_decoders[DECODER_COUNT_] = {
    [DECODER_LOW_CONFIDENCE] = {"low_confidence", DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin,
                                low_conf_choose, NULL, NULL},
    [DECODER_RANDOM] = {"random", DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin, random_choose,
                        NULL, NULL},
    [DECODER_THRESHOLD] = {"threshold", 0, 0, NULL, threshold_choose, NULL, NULL},
    [DECODER_FACTOR] = {"factor", 0, 0, NULL, factor_choose, NULL, NULL},
    [DECODER_HIERARCHY] = {"hierarchy", 0, 0, NULL, hierarchy_choose, NULL, NULL},
    [DECODER_CREDIT] = {"credit", DECODER_F_LOGITS | DECODER_F_RESAMPLE, sizeof(credit_state), credit_block_begin,
                        credit_choose, NULL, credit_free},
};

const decoder_ops *decoder_get(enum decode_decoder d) {
    CHECK((int)d >= 0 && d < DECODER_COUNT_);
    return &k_decoders[d];
}
