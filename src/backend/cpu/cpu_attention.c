/*
 * cpu_attention.c — softmax(q kᵀ · scale + mask) v over varlen packed sequences, fp32.
 *
 * Work is split into (sequence, query tile, head) items run on the backend's pool. Per item:
 * S = Q_tile · K_seqᵀ (one sgemm into the worker's score buffer), mask (padding keys from
 * key_valid, optional block-causal), a max-subtracted softmax per row, O = P · V (one sgemm
 * written straight into the output rows). GQA: q-head h reads kv-head h / (n_heads / n_kv_heads).
 * A query with no visible key at all gets a zero output row.
 *
 * Keys of a sequence come from the packed k/v rows, or from its own buffers (attn_params.k_seq /
 * v_seq: a KV cache the model layer keeps).
 * Does not: keep any cache (k/v rows are whatever the caller passes).
 * Threading: called by the backend's engine thread; items run on pool slots.
 */
/* The branch-free helpers in cpu_internal.h (clamps, selects) only vectorise when float compares
 * may be if-converted; nothing here relies on floating-point exception flags. */
#pragma GCC optimize("no-trapping-math")

#include <cblas.h>
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

typedef struct attn_item {
    int seq;     /* sequence index */
    int q0, nq;  /* query rows [q0, q0+nq) (absolute rows of q/out) */
} attn_item;

/* In-place masked softmax of one score row of nk entries (mask already written as -inf). */
CPU_HOT_CLONES static void softmax_row(float *row, int nk) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < nk; j++) m = row[j] > m ? row[j] : m;
    if (m == -INFINITY) {   /* no visible key */
        for (int j = 0; j < nk; j++) row[j] = 0.0f;
        return;
    }
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < nk; j++) {
        float e = cpu_expf(row[j] - m);
        e = row[j] == -INFINITY ? 0.0f : e;
        row[j] = e;
        sum += e;
    }
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < nk; j++) row[j] *= inv;
}

typedef struct attn_run {
    cpu_impl          *ci;
    const attn_params *p;
    const attn_item   *items;
    const float       *q, *k, *v;
    float             *out;
} attn_run;

/* One (query tile, head) item: S = Q Kᵀ · scale, mask, softmax, O = P V. */
static void attn_task(void *arg, int64_t wi, int slot) {
    const attn_run *r = arg;
    const attn_params *p = r->p;
    const int H = p->n_heads, hd = p->head_dim, group = H / p->n_kv_heads, ldq = H * hd, ldk = p->n_kv_heads * hd;
    const attn_item *it = &r->items[wi / H];
    int h = (int)(wi % H), kvh = h / group;
    int k0 = p->k_start[it->seq], nk = p->k_start[it->seq + 1] - k0, nq = it->nq;
    float *o = r->out + (size_t)it->q0 * ldq + (size_t)h * hd;
    const int own = p->k_seq && p->k_seq[it->seq];   /* keys in the sequence's own buffers */
    const float *kb = own ? (const float *)p->k_seq[it->seq] : r->k + (size_t)k0 * ldk;
    const float *vb = own ? (const float *)p->v_seq[it->seq] : r->v + (size_t)k0 * ldk;
    if (nk == 0) {
        for (int i = 0; i < nq; i++)
            for (int d = 0; d < hd; d++) o[(size_t)i * ldq + d] = 0.0f;
        return;
    }
    float *S = cpu_tbuf_reserve(&r->ci->scores[slot], (size_t)nq * (size_t)nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, p->scale,
                r->q + (size_t)it->q0 * ldq + (size_t)h * hd, ldq, kb + (size_t)kvh * hd, ldk, 0.0f, S, nk);
    const uint8_t *valid = p->key_valid ? p->key_valid + k0 : NULL;
    const int32_t *kpos = p->block_causal ? p->k_pos + k0 : NULL;
    for (int i = 0; i < nq; i++) {
        float *row = S + (size_t)i * nk;
        if (valid) {
#pragma omp simd
            for (int j = 0; j < nk; j++) row[j] = valid[j] ? row[j] : -INFINITY;
        }
        if (kpos) {
            int B = p->block_causal, qb = p->q_pos[it->q0 + i] / B;
#pragma omp simd
            for (int j = 0; j < nk; j++) row[j] = kpos[j] / B <= qb ? row[j] : -INFINITY;
        }
        softmax_row(row, nk);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, S, nk, vb + (size_t)kvh * hd, ldk, 0.0f,
                o, ldq);
}

void cpu_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v, void *out) {
    cpu_impl *ci = cpu_impl_of(be);
    const int H = p->n_heads, KV = p->n_kv_heads, hd = p->head_dim, nt = be->n_threads;
    CHECK(H > 0 && KV > 0 && hd > 0 && H % KV == 0);
    CHECK(p->n_seqs > 0 && p->q_start && p->k_start);
    CHECK(!p->block_causal || (p->q_pos && p->k_pos));
    CHECK(!p->k_seq == !p->v_seq);

    int n_q = p->q_start[p->n_seqs];
    int qt = 64;
    if ((int64_t)((n_q + qt - 1) / qt) * H < 4 * nt) qt = 16;
    int n_items = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        int nq = p->q_start[s + 1] - p->q_start[s];
        CHECK(nq >= 0 && p->k_start[s + 1] >= p->k_start[s]);
        n_items += (nq + qt - 1) / qt;
    }
    attn_item *items = xmalloc((size_t)(n_items ? n_items : 1) * sizeof *items);
    int at = 0;
    for (int s = 0; s < p->n_seqs; s++)
        for (int q0 = p->q_start[s]; q0 < p->q_start[s + 1]; q0 += qt) {
            int rest = p->q_start[s + 1] - q0;
            items[at++] = (attn_item){s, q0, rest < qt ? rest : qt};
        }
    attn_run r = {.ci = ci, .p = p, .items = items, .q = q, .k = k, .v = v, .out = out};
    cpu_pool_run(ci->pool, (int64_t)n_items * H, 0, attn_task, &r);
    free(items);
}
