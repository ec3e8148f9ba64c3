/*
 * decoders.c — the decoders behind decoder.h: low_confidence and random (A1, fixed steps with the
 * reference quota), threshold (A2/A4), factor (A3), hierarchy (A5), credit (A6), joint_threshold
 * (A9), hierarchy_block (A10) and Dream's origin / maskgit_plus / topk_margin / entropy (its
 * diffusion_generate schedule). Pure functions of the view and their small per-sequence state; they
 * never touch the canvas themselves. Not here: sampling and confidences (sample.c), block iteration
 * (decode.c), the decoders' names (params.c). Engine thread.
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
/* Dream decoders: origin's per-position transfer draws, and the Gumbel noise of alg_temp > 0. */
#define ORIGIN_STREAM_BIT  (1ull << 61)
#define ALG_TEMP_STREAM_BIT (1ull << 60)

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
    st->m0 = v->quota_len > 0 ? v->quota_len : v->block_masks;
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
    int k;
    if (v->quota_len > 0) {   /* LLaDA2: all c > tau when at least the quota clear it, else the quota */
        int q = decoder_quota(v->quota_len, v->block_steps > 0 ? v->block_steps : 1, v->step_in_block);
        if (q < 1) q = 1;
        int above = 0;
        while (above < n && cs[above].c > v->p->threshold) above++;
        k = above >= q ? above : (q < n ? q : n);
        int r = emit_top(v, cs, k, out_pos, out_tok);
        free(cs);
        return r;
    }
    k = n > 0 ? 1 : 0;   /* always the most confident one */
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

/* ---------------------------------------------------------------- Dream (origin, maskgit_plus, topk_margin, entropy) */

float decoder_dream_timestep(int steps, double eps, int i) {
    CHECK(steps >= 1 && i >= 0 && i <= steps);
    const float start = 1.0f, end = (float)eps;
    const float step = (end - start) / (float)steps;
    volatile float prod;   /* no fused multiply-add: torch rounds the product, then adds */
    if (i < (steps + 1) / 2) {
        prod = step * (float)i;
        return start + prod;
    }
    prod = step * (float)(steps - i);
    return end - prod;
}

int decoder_dream_quota(int n, int steps, double eps, int i) {
    if (i >= steps - 1) return n;
    const float t = decoder_dream_timestep(steps, eps, i), s = decoder_dream_timestep(steps, eps, i + 1);
    volatile float r = 1.0f - s / t;
    volatile float f = (float)n * r;
    int k = (int)f;
    return k < 0 ? 0 : k > n ? n : k;
}

typedef struct dv {
    double  v;
    int32_t id;
} dv;

static int dv_cmp(const void *a, const void *b) {   /* descending value, then ascending id */
    const dv *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Dream's sample_tokens confidence of one row: z = l / T (T > 0), top_p then top_k filtering (a
 * filtered logit counts as -inf), probs = softmax(z) over the whole vocabulary; maskgit_plus:
 * probs[x0], topk_margin: the best minus the second best probability, entropy: sum p log(p + 1e-10).
 * z, sorted: [V] scratch. */
static double dream_confidence(const decoder_view *v, const float *l, int32_t x0, double *z, dv *sorted) {
    const decode_params *p = v->p;
    const int V = v->vocab;
    const double T = p->temperature;
    for (int t = 0; t < V; t++) z[t] = T > 0 ? (double)l[t] / T : (double)l[t];
    if (p->top_p < 1.0 || p->top_k > 0) {
        for (int t = 0; t < V; t++) sorted[t].v = z[t], sorted[t].id = t;
        qsort(sorted, (size_t)V, sizeof *sorted, dv_cmp);
        if (p->top_p < 1.0) {   /* keep a token while the mass before it is <= top_p */
            double mx = sorted[0].v, zs = 0, cum = 0;
            for (int t = 0; t < V; t++) zs += exp(sorted[t].v - mx);
            for (int t = 0; t < V; t++) {
                if (t > 0 && cum > p->top_p) z[sorted[t].id] = -INFINITY, sorted[t].v = -INFINITY;
                cum += exp(sorted[t].v == -INFINITY ? -INFINITY : sorted[t].v - mx) / zs;
            }
        }
        if (p->top_k > 0 && p->top_k < V) {   /* keep every token >= the k-th best value */
            const double kth = sorted[p->top_k - 1].v;
            for (int t = 0; t < V; t++)
                if (z[t] < kth) z[t] = -INFINITY;
        }
    }
    double mx = -INFINITY;
    for (int t = 0; t < V; t++)
        if (z[t] > mx) mx = z[t];
    double zs = 0;
    for (int t = 0; t < V; t++) zs += z[t] == -INFINITY ? 0.0 : exp(z[t] - mx);
    switch (p->decoder) {
    case DECODER_MASKGIT_PLUS: return z[x0] == -INFINITY ? 0.0 : exp(z[x0] - mx) / zs;
    case DECODER_TOPK_MARGIN: {
        double p1 = -1, p2 = -1;
        for (int t = 0; t < V; t++) {
            double q = z[t] == -INFINITY ? 0.0 : exp(z[t] - mx) / zs;
            if (q > p1) p2 = p1, p1 = q;
            else if (q > p2) p2 = q;
        }
        return p1 - (p2 < 0 ? 0 : p2);
    }
    case DECODER_ENTROPY: {
        double h = 0;
        for (int t = 0; t < V; t++) {
            double q = z[t] == -INFINITY ? 0.0 : exp(z[t] - mx) / zs;
            h += q * log(q + 1e-10);
        }
        return h;
    }
    default: CHECK(!"not a Dream confidence decoder"); return 0;
    }
}

static int dream_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    const fixed_state *st = state;
    const decode_params *p = v->p;
    const int i = v->step_in_block, S = st->s, last = i >= S - 1;
    int n = 0;
    for (int r = 0; r < v->n_rows; r++) n += v->row_masked[r];
    if (p->decoder == DECODER_ORIGIN) {
        /* every masked position independently with probability 1 - s/t (all at the last step) */
        float pt = 1.0f;
        if (!last) {
            const float t = decoder_dream_timestep(S, p->eps, i), s = decoder_dream_timestep(S, p->eps, i + 1);
            pt = 1.0f - s / t;
        }
        int k = 0;
        for (int r = 0; r < v->n_rows; r++) {
            if (!v->row_masked[r]) continue;
            const float u = (float)rng_u01(v->seed, ORIGIN_STREAM_BIT | (uint64_t)v->step, (uint64_t)v->row_pos[r]);
            if (last || u < pt) {
                out_pos[k] = v->row_pos[r];
                out_tok[k] = v->x0[r];
                k++;
            }
        }
        return k;
    }
    const int k = decoder_dream_quota(n, S, p->eps, i);
    if (k <= 0 || n == 0) return 0;
    CHECK(v->logits);
    cand *cs = xmalloc((size_t)n * sizeof *cs);
    double *z = xmalloc((size_t)v->vocab * sizeof *z);
    dv *sorted = (p->top_p < 1.0 || p->top_k > 0) ? xmalloc((size_t)v->vocab * sizeof *sorted) : NULL;
    int m = 0;
    for (int r = 0; r < v->n_rows; r++) {
        if (!v->row_masked[r]) continue;
        double c = dream_confidence(v, v->logits + (size_t)r * (size_t)v->vocab, v->x0[r], z, sorted);
        if (p->alg_temp > 0) {   /* sampling without replacement from softmax(c / alg_temp): Gumbel top-k */
            double u = rng_u01(v->seed, ALG_TEMP_STREAM_BIT | (uint64_t)v->step, (uint64_t)v->row_pos[r]);
            c = c / p->alg_temp - log(-log(u));
        }
        cs[m].c = c;
        cs[m].pos = v->row_pos[r];
        cs[m].row = r;
        m++;
    }
    qsort(cs, (size_t)m, sizeof *cs, cand_cmp);
    int r = emit_top(v, cs, k < m ? k : m, out_pos, out_tok);
    free(sorted);
    free(z);
    free(cs);
    return r;
}

/* ---------------------------------------------------------------- table */

/* ---------------------------------------------------------------- joint_threshold (A9, LLaDA2.1) */

typedef struct joint_state {
    int post;       /* edit-only steps taken since the block's last mask was written */
    int finished;   /* the block ended: a step wrote nothing, or max_post_steps edit-only steps ran */
} joint_state;

static void joint_block_begin(void *state, const decoder_view *v) {
    (void)v;
    memset(state, 0, sizeof(joint_state));
}

/* Rows are every position of the block (DECODER_F_ALL_ROWS), ascending: mask-to-token for masked
 * rows with c > threshold (else the most confident masked row), token-to-token for written rows
 * whose x0 differs from the canvas with c > edit_threshold. Writes come out in position order. */
static int joint_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    joint_state *st = state;
    if (st->finished) return 0;
    if (v->block_masks == 0 && ++st->post > v->p->max_post_steps) {
        st->finished = 1;
        return 0;
    }
    int best = -1, any_m2t = 0;
    for (int r = 0; r < v->n_rows; r++) {
        if (!v->row_masked[r]) continue;
        if (v->conf[r] > v->p->threshold) any_m2t = 1;
        if (best < 0 || v->conf[r] > v->conf[best]) best = r;   /* first maximum: lowest position */
    }
    int n = 0;
    for (int r = 0; r < v->n_rows; r++) {
        int pos = v->row_pos[r];
        int m2t = v->row_masked[r] && (any_m2t ? v->conf[r] > v->p->threshold : r == best);
        int t2t = !v->row_masked[r] && v->x[pos] != v->x0[r] && v->conf[r] > v->p->edit_threshold;
        if (!m2t && !t2t) continue;
        out_pos[n] = pos;
        out_tok[n] = v->x0[r];
        n++;
    }
    if (n == 0) st->finished = 1;
    return n;
}

static int joint_block_done(void *state, const decoder_view *v, int masks_left) {
    (void)v;
    (void)masks_left;
    return ((const joint_state *)state)->finished;
}

/* ---------------------------------------------------------------- hierarchy_block (A10) */

/* Fast-dLLM v2's hierarchical block decoding (SGLang HierarchyBlock). The block's sub-blocks of
 * sub_block_length positions, counted from its start, are decoded in order: the current one is the
 * first that still holds a mask, and a step commits its masked positions with c > threshold
 * (strictly), else its most confident one (first maximum). With the token shift (v->shift) a block
 * whose first position is masked begins with a step that commits only that position, whatever its
 * confidence: its x0 comes from the previous block's last row — the inherited token. */
static int hblock_choose(void *state, const decoder_view *v, int32_t *out_pos, int32_t *out_tok) {
    (void)state;
    int first = -1;
    for (int r = 0; r < v->n_rows && first < 0; r++)
        if (v->row_masked[r]) first = r;
    if (first < 0) return 0;
    if (v->shift && v->step_in_block == 0 && v->lo == v->start && v->lo > 0 && v->row_pos[first] == v->lo) {
        out_pos[0] = v->lo;
        out_tok[0] = v->x0[first];
        return 1;
    }
    const int sub = v->p->sub_block_length;
    const int s0 = v->start + (v->row_pos[first] - v->start) / sub * sub, s1 = s0 + sub;
    int n = 0, best = -1;
    for (int r = first; r < v->n_rows && v->row_pos[r] < s1; r++) {
        if (!v->row_masked[r]) continue;
        if (best < 0 || v->conf[r] > v->conf[best]) best = r;
        if (v->conf[r] > v->p->threshold) {
            out_pos[n] = v->row_pos[r];
            out_tok[n] = v->x0[r];
            n++;
        }
    }
    if (n == 0) {
        out_pos[0] = v->row_pos[best];
        out_tok[0] = v->x0[best];
        n = 1;
    }
    return n;
}

static const decoder_ops k_decoders[DECODER_COUNT_] = {
    [DECODER_LOW_CONFIDENCE] = {DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin,
                                low_conf_choose, NULL, NULL},
    [DECODER_RANDOM] = {DECODER_F_FIXED_STEPS, sizeof(fixed_state), fixed_block_begin, random_choose,
                        NULL, NULL},
    [DECODER_THRESHOLD] = {0, 0, NULL, threshold_choose, NULL, NULL},
    [DECODER_FACTOR] = {0, 0, NULL, factor_choose, NULL, NULL},
    [DECODER_HIERARCHY] = {0, 0, NULL, hierarchy_choose, NULL, NULL},
    [DECODER_CREDIT] = {DECODER_F_LOGITS | DECODER_F_RESAMPLE, sizeof(credit_state), credit_block_begin,
                        credit_choose, NULL, credit_free},
    [DECODER_ORIGIN] = {DECODER_F_FIXED_STEPS | DECODER_F_MAY_SKIP, sizeof(fixed_state), fixed_block_begin,
                        dream_choose, NULL, NULL},
    [DECODER_MASKGIT_PLUS] = {DECODER_F_FIXED_STEPS | DECODER_F_MAY_SKIP | DECODER_F_LOGITS,
                              sizeof(fixed_state), fixed_block_begin, dream_choose, NULL, NULL},
    [DECODER_TOPK_MARGIN] = {DECODER_F_FIXED_STEPS | DECODER_F_MAY_SKIP | DECODER_F_LOGITS,
                             sizeof(fixed_state), fixed_block_begin, dream_choose, NULL, NULL},
    [DECODER_JOINT_THRESHOLD] = {DECODER_F_ALL_ROWS | DECODER_F_MAY_SKIP, sizeof(joint_state),
                                 joint_block_begin, joint_choose, joint_block_done, NULL},
    [DECODER_HIERARCHY_BLOCK] = {0, 0, NULL, hblock_choose, NULL, NULL},
    [DECODER_ENTROPY] = {DECODER_F_FIXED_STEPS | DECODER_F_MAY_SKIP | DECODER_F_LOGITS, sizeof(fixed_state),
                         fixed_block_begin, dream_choose, NULL, NULL},
};

const decoder_ops *decoder_get(enum decode_decoder d) {
    CHECK((int)d >= 0 && d < DECODER_COUNT_);
    return &k_decoders[d];
}
