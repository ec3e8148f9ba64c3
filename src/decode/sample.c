/*
 * sample.c — effective logits, Gumbel-max sampling with top-k / top-p, confidence (sample.h).
 * Pure functions; called from the decode loop's row loop (any of the backend's host threads).
 */
#include "decode/sample.h"

#include <math.h>
#include <stdlib.h>

#include "util/log.h"
#include "util/rng.h"

double sample_gumbel(uint64_t seed, int step, int pos, int vocab, int token) {
    double u = rng_u01(seed, (uint64_t)step, (uint64_t)pos * (uint64_t)vocab + (uint64_t)token);
    return -log(-log(u));
}

typedef struct tv {
    float   v;
    int32_t id;
} tv;

/* descending value, then ascending id (deterministic ties) */
static int tv_cmp(const void *a, const void *b) {
    const tv *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Partition a[0..n) so that a[0..k) holds the k first elements in tv_cmp order (quickselect with
 * a median-of-three pivot; tv_cmp is a total order, so the result is deterministic). */
static void select_top(tv *a, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (tv_cmp(&a[mid], &a[lo]) < 0) { tv t = a[mid]; a[mid] = a[lo]; a[lo] = t; }
        if (tv_cmp(&a[hi], &a[lo]) < 0) { tv t = a[hi]; a[hi] = a[lo]; a[lo] = t; }
        if (tv_cmp(&a[hi], &a[mid]) < 0) { tv t = a[hi]; a[hi] = a[mid]; a[mid] = t; }
        tv pivot = a[mid];
        int i = lo, j = hi;
        while (i <= j) {
            while (tv_cmp(&a[i], &pivot) < 0) i++;
            while (tv_cmp(&a[j], &pivot) > 0) j--;
            if (i <= j) {
                tv t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++, j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

/* Candidates allowed by top_k / top_p, as ids in cand (returns the count). n_all candidates are the
 * ids != mask with finite logits. */
static int filter_candidates(const sample_cfg *c, const float *l, int32_t *cand) {
    int V = c->vocab;
    tv *a = xmalloc((size_t)V * sizeof *a);
    int n = 0;
    for (int v = 0; v < V; v++)
        if (v != c->mask_id && isfinite(l[v])) a[n].v = l[v], a[n].id = v, n++;
    if (c->top_k > 0 && c->top_k < n) {
        /* keep the k best (ties by lower id): O(V) selection, then sort only those */
        select_top(a, n, c->top_k);
        n = c->top_k;
        qsort(a, (size_t)n, sizeof *a, tv_cmp);
    } else if (c->top_p < 1.0) {
        qsort(a, (size_t)n, sizeof *a, tv_cmp);
    }
    if (c->top_p < 1.0 && n > 1) {
        /* nucleus over softmax(l / T) restricted to the current candidates */
        double T = c->temperature, mx = (double)a[0].v, z = 0;
        for (int i = 0; i < n; i++) z += exp(((double)a[i].v - mx) / T);
        double cum = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            cum += exp(((double)a[i].v - mx) / T) / z;
            if (cum >= c->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    for (int i = 0; i < n; i++) cand[i] = a[i].id;
    free(a);
    return n;
}

void sample_row(const sample_cfg *c, float *l, const float *u, int step, int pos, int32_t *x0, double *conf) {
    int V = c->vocab;
    if (u && c->cfg_scale > 0) {
        double w = c->cfg_scale + 1.0;
        for (int v = 0; v < V; v++) {
            l[v] = (float)((double)u[v] + w * ((double)l[v] - (double)u[v]));
            if (isnan(l[v])) l[v] = -INFINITY; /* -inf rows (-inf + inf): the token is impossible */
        }
    }
    if (c->logits_eos_inf && c->eos_id >= 0 && c->eos_id < V) l[c->eos_id] = -INFINITY;

    /* x0 */
    int best = -1;
    if (c->temperature <= 0) {
        float bv = -INFINITY;
        for (int v = 0; v < V; v++) {
            if (v == c->mask_id) continue;
            if (best < 0 || l[v] > bv) bv = l[v], best = v;
        }
    } else {
        double T = c->temperature, bs = -INFINITY;
        if (c->top_k > 0 || c->top_p < 1.0) {
            int32_t *cand = xmalloc((size_t)V * sizeof *cand);
            int n = filter_candidates(c, l, cand);
            for (int i = 0; i < n; i++) {
                int v = cand[i];
                double s = (double)l[v] + T * sample_gumbel(c->seed, step, pos, V, v);
                if (best < 0 || s > bs) bs = s, best = v;
            }
            free(cand);
        } else {
            for (int v = 0; v < V; v++) {
                if (v == c->mask_id || !isfinite(l[v])) continue;
                double s = (double)l[v] + T * sample_gumbel(c->seed, step, pos, V, v);
                if (best < 0 || s > bs) bs = s, best = v;
            }
        }
    }
    if (best < 0) best = c->mask_id == 0 ? 1 : 0;  /* every logit -inf: impossible in practice */
    *x0 = best;

    /* confidence: softmax(l)[x0] in double, optionally with l[eot] = -inf */
    int drop = (c->confidence_eos_eot_inf && c->eot_id >= 0 && c->eot_id < V) ? c->eot_id : -1;
    if (best == drop) {
        *conf = 0.0;
        return;
    }
    double mx = -INFINITY;
    for (int v = 0; v < V; v++)
        if (v != drop && (double)l[v] > mx) mx = l[v];
    double z = 0;
    for (int v = 0; v < V; v++)
        if (v != drop) z += exp((double)l[v] - mx);
    *conf = isfinite(l[best]) && z > 0 ? exp((double)l[best] - mx) / z : 0.0;
}
