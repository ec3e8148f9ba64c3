/*
 * cpu_attention.c — softmax(q kᵀ · scale + mask) v over varlen packed sequences.
 *
 * Work is split into (sequence, query tile, head) items run on the backend's pool. Per item:
 * S = Q_tile · K_seqᵀ into the slot's score buffer, mask (padding keys from key_valid, optional
 * block-causal), a max-subtracted softmax per row in fp32, O = P · V written straight into the
 * output rows; with block-causal attention an item's products stop at the last key any of its
 * queries can see. GQA: q-head h reads kv-head h / (n_heads / n_kv_heads). A query with no visible
 * key at all gets a zero output row. Two paths:
 *   fp32  (the reference; --cpu-kernels fp32): both products are single-threaded sgemms.
 *   bf16  (a bf16 kernel family, the one cpu_dispatch.c gives ci->attn): first one pool run packs
 *         every (sequence, kv head)'s K and Vᵀ in the GEMM layer's layout (cpu_gemm.h: keys, resp.
 *         head dims, are the "outputs"); then
 *         per item Q and P are cast to bf16 and both products run on the kernel family's blocks
 *         (fp32 accumulation), 48-query tiles — the same numerics as attention on bf16 tiles on a GPU.
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
#include <string.h>

#include "backend/cpu/cpu_internal.h"
#include "util/log.h"

typedef struct attn_item {
    int seq;     /* sequence index */
    int q0, nq;  /* query rows [q0, q0+nq) (absolute rows of q/out) */
} attn_item;

/* Everything a task needs; the bf16 fields are set on the bf16 path only. */
typedef struct attn_run {
    cpu_impl          *ci;
    const attn_params *p;
    const attn_item   *items;
    const float       *q, *k, *v;
    float             *out;
    /* bf16 path: per (sequence, kv head) packed K ([nk16 / 16] groups x hdp) and Vᵀ
     * ([hd16 / 16] groups x nk32), at kofs / vofs[s] + kvh * (per-head size) */
    uint16_t          *kpk, *vpk;
    int64_t           *kofs, *vofs;   /* [n_seqs] element offsets */
    int                hdp;           /* head_dim rounded up to 32 */
} attn_run;

/* head_dim bound of the bf16 path's pack tile (real models: 64..256) */
#define ATTN_MAX_HEAD_DIM 512

static int64_t round_up(int64_t a, int64_t m) { return (a + m - 1) / m * m; }

/* In-place masked softmax of one score row of nk entries (mask already written as -inf). */
CPU_WIDE_CLONES static void softmax_row(float *row, int nk) {
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

/* Mask (padding keys, block-causal) and softmax the item's score rows S[i][0..nk), ld apart. */
static void mask_softmax(const attn_params *p, const attn_item *it, int k0, int nk, float *S, int64_t ld) {
    const uint8_t *valid = p->key_valid ? p->key_valid + k0 : NULL;
    const int32_t *kpos = p->block_causal ? p->k_pos + k0 : NULL;
    for (int i = 0; i < it->nq; i++) {
        float *row = S + i * ld;
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
}

/* Keys [0, n) of the item's sequence hold every key a query of the item can see: with block-causal
 * attention the keys after the last one in a block <= the item's latest query block are masked for
 * all its queries, so the products skip them (a cache-free LLaDA2 forward: about half the pairs). */
static int item_visible_keys(const attn_params *p, const attn_item *it, int k0, int nk) {
    if (!p->block_causal) return nk;
    const int B = p->block_causal;
    int qb = 0;
    for (int i = 0; i < it->nq; i++) {
        const int b = p->q_pos[it->q0 + i] / B;
        qb = b > qb ? b : qb;
    }
    const int32_t *kpos = p->k_pos + k0;
    int n = nk;
    while (n > 0 && kpos[n - 1] / B > qb) n--;
    return n;
}

/* The item's keys and values: the packed rows or the sequence's own buffers (row stride ldk). */
static void item_kv(const attn_run *r, const attn_item *it, const float **kb, const float **vb) {
    const attn_params *p = r->p;
    const int64_t ldk = (int64_t)p->n_kv_heads * p->head_dim, k0 = p->k_start[it->seq];
    const int own = p->k_seq && p->k_seq[it->seq];
    *kb = own ? (const float *)p->k_seq[it->seq] : r->k + k0 * ldk;
    *vb = own ? (const float *)p->v_seq[it->seq] : r->v + k0 * ldk;
}

/* ---------------------------------------------------------------- fp32 path */

static void attn_task_fp32(void *arg, int64_t wi, int slot) {
    const attn_run *r = arg;
    const attn_params *p = r->p;
    const int H = p->n_heads, hd = p->head_dim, group = H / p->n_kv_heads, ldq = H * hd, ldk = p->n_kv_heads * hd;
    const attn_item *it = &r->items[wi / H];
    int h = (int)(wi % H), kvh = h / group;
    int k0 = p->k_start[it->seq], nk = p->k_start[it->seq + 1] - k0, nq = it->nq;
    float *o = r->out + (size_t)it->q0 * ldq + (size_t)h * hd;
    const float *kb, *vb;
    item_kv(r, it, &kb, &vb);
    nk = item_visible_keys(p, it, k0, nk);
    if (nk == 0) {
        for (int i = 0; i < nq; i++) memset(o + (size_t)i * ldq, 0, (size_t)hd * sizeof *o);
        return;
    }
    float *S = cpu_tbuf_reserve(&r->ci->scores[slot], (size_t)nq * (size_t)nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hd, p->scale,
                r->q + (size_t)it->q0 * ldq + (size_t)h * hd, ldq, kb + (size_t)kvh * hd, ldk, 0.0f, S, nk);
    mask_softmax(p, it, k0, nk, S, nk);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hd, nk, 1.0f, S, nk, vb + (size_t)kvh * hd, ldk, 0.0f,
                o, ldq);
}

/* ---------------------------------------------------------------- bf16 path */

/* 32-bit words over the uint16 bf16 buffers (two bf16 of a pair travel together). */
typedef uint32_t attn_word __attribute__((may_alias));

/* Pack one (sequence, kv head): K as a weight [nk, hd] (keys are outputs), Vᵀ as a weight
 * [hd, nk] (head dims are outputs), both in cpu_gemm.h's layout, zero-padded. Rows are cast to
 * bf16 with the vectorised row cast, then moved as 32-bit pairs: K is a 16-key by hd/2-pair
 * transpose per group, Vᵀ interleaves two keys' rows per 16 head dims. */
static void attn_pack_task(void *arg, int64_t t, int slot) {
    (void)slot;
    const attn_run *r = arg;
    const attn_params *p = r->p;
    const int KV = p->n_kv_heads, hd = p->head_dim, s = (int)(t / KV), kvh = (int)(t % KV), hdp = r->hdp;
    const int64_t ldk = (int64_t)KV * hd, nk = p->k_start[s + 1] - p->k_start[s];
    const int64_t nk16 = round_up(nk, 16), nk32 = round_up(nk, 32), hd16 = round_up(hd, 16);
    const attn_item it = {s, 0, 0};
    const float *kb, *vb;
    item_kv(r, &it, &kb, &vb);
    uint16_t *kd = r->kpk + r->kofs[s] + kvh * nk16 * hdp, *vd = r->vpk + r->vofs[s] + kvh * hd16 * nk32;
    _Alignas(64) uint16_t tile[16 * ATTN_MAX_HEAD_DIM];
    /* K: 16 keys at a time; group g holds, per head-dim pair e2, the 16 keys' pairs in a row */
    const int np = hdp / 2;
    for (int64_t j0 = 0; j0 < nk; j0 += 16) {
        const int n = nk - j0 < 16 ? (int)(nk - j0) : 16;
        for (int jj = 0; jj < n; jj++) cpu_row_to_bf16(kb + (j0 + jj) * ldk + kvh * hd, hd, hdp, NULL, 1.0f, tile + jj * hdp);
        if (n < 16) memset(tile + n * hdp, 0, (size_t)(16 - n) * (size_t)hdp * sizeof *tile);
        const attn_word *src = (const attn_word *)tile;
        attn_word *dst = (attn_word *)(kd + (j0 / 16) * np * 32);
        for (int e2 = 0; e2 < np; e2++)
            for (int jj = 0; jj < 16; jj++) dst[e2 * 16 + jj] = src[jj * np + e2];
    }
    /* Vᵀ: key pair jp, head-dim group g -> 16 words (key 2jp in the low half, 2jp+1 in the high) */
    if (nk32 != nk) memset(vd, 0, (size_t)(hd16 * nk32) * sizeof *vd);   /* zero padding keys */
    uint16_t *a = tile, *b = tile + hd16;
    attn_word *vw = (attn_word *)vd;
    for (int64_t j = 0; j < nk; j += 2) {
        cpu_row_to_bf16(vb + j * ldk + kvh * hd, hd, hd16, NULL, 1.0f, a);
        if (j + 1 < nk) cpu_row_to_bf16(vb + (j + 1) * ldk + kvh * hd, hd, hd16, NULL, 1.0f, b);
        else memset(b, 0, (size_t)hd16 * sizeof *b);
        for (int64_t g = 0; g < hd16 / 16; g++) {
            attn_word *dst = vw + g * (nk32 / 2) * 16 + (j / 2) * 16;
            for (int i = 0; i < 16; i++) dst[i] = (attn_word)a[g * 16 + i] | (attn_word)b[g * 16 + i] << 16;
        }
    }
}

/* One activation row for kernel family k: bf16(x[0..n)), zeros to npad, in k's element type. */
static void row_cast(const cpu_gemm_kernel *k, const float *x, int64_t n, int64_t npad, void *dst) {
    if (k->act_f32) cpu_row_to_bf16_f32(x, n, npad, NULL, 1.0f, dst);
    else cpu_row_to_bf16(x, n, npad, NULL, 1.0f, dst);
}

static void attn_task_bf16(void *arg, int64_t wi, int slot) {
    const attn_run *r = arg;
    const attn_params *p = r->p;
    const cpu_gemm_kernel *kern = r->ci->attn;
    const int H = p->n_heads, hd = p->head_dim, group = H / p->n_kv_heads, ldq = H * hd, hdp = r->hdp;
    const attn_item *it = &r->items[wi / H];
    const int h = (int)(wi % H), kvh = h / group, nq = it->nq;
    const int k0 = p->k_start[it->seq], nk = p->k_start[it->seq + 1] - k0;
    /* the packed layout is sized by all nk keys; the products run over the nv visible ones */
    const int64_t nk16 = round_up(nk, 16), nk32 = round_up(nk, 32), hd16 = round_up(hd, 16);
    const int nv = item_visible_keys(p, it, k0, nk);
    const int64_t nv16 = round_up(nv, 16), nv32 = round_up(nv, 32);
    const float scale = p->scale;
    float *o = r->out + (size_t)it->q0 * ldq + (size_t)h * hd;
    if (nv == 0) {
        for (int i = 0; i < nq; i++) memset(o + (size_t)i * ldq, 0, (size_t)hd * sizeof *o);
        return;
    }
    const uint16_t *kg = r->kpk + r->kofs[it->seq] + kvh * nk16 * hdp;
    const uint16_t *vg = r->vpk + r->vofs[it->seq] + kvh * hd16 * nk32;
    float *S = cpu_tbuf_reserve(&r->ci->scores[slot], (size_t)nq * (size_t)nv);
    /* Q and P rows in the family's activation type (bf16, or bf16 values as fp32) */
    const size_t asz = cpu_gemm_act_size(kern);
    char *qb = (char *)cpu_tbuf_reserve(&r->ci->wtile[slot], ((size_t)nq * (size_t)(hdp + nv32) * asz + 3) / 4);
    char *pb = qb + (size_t)nq * (size_t)hdp * asz;
    _Alignas(64) float c[GEMM_MB * 64];
    for (int i = 0; i < nq; i++) row_cast(kern, r->q + (size_t)(it->q0 + i) * ldq + (size_t)h * hd, hd, hdp,
                                          qb + (size_t)i * (size_t)hdp * asz);
    if (kern->begin) kern->begin();
    for (int64_t j0 = 0; j0 < nv; j0 += 64) {   /* S = Q Kᵀ, 64 keys (4 packed groups) at a time */
        const uint16_t *b[4];
        const int ng = (int)((nv16 - j0) / 16 < 4 ? (nv16 - j0) / 16 : 4), w = nv - j0 < 64 ? (int)(nv - j0) : 64;
        for (int j = 0; j < ng; j++) b[j] = kg + (j0 / 16 + j) * hdp * 16;
        kern->block(qb, hdp, nq, b, ng, hdp, c);
        for (int i = 0; i < nq; i++) {   /* scale in a local: a store through S could alias p->scale */
            float *restrict srow = S + (int64_t)i * nv + j0;
            const float *restrict crow = c + i * 64;
#pragma omp simd
            for (int j = 0; j < w; j++) srow[j] = crow[j] * scale;
        }
    }
    mask_softmax(p, it, k0, nv, S, nv);
    for (int i = 0; i < nq; i++) row_cast(kern, S + (int64_t)i * nv, nv, nv32, pb + (size_t)i * (size_t)nv32 * asz);
    for (int d0 = 0; d0 < hd; d0 += 64) {   /* O = P V, 64 head dims at a time */
        const uint16_t *b[4];
        const int ng = (int)((hd16 - d0) / 16 < 4 ? (hd16 - d0) / 16 : 4), w = hd - d0 < 64 ? hd - d0 : 64;
        for (int j = 0; j < ng; j++) b[j] = vg + (d0 / 16 + j) * nk32 * 16;   /* first nv32 keys of each group */
        kern->block(pb, nv32, nq, b, ng, nv32, c);
        for (int i = 0; i < nq; i++) {
            float *restrict orow = o + (size_t)i * ldq + d0;
            const float *restrict crow = c + i * 64;
#pragma omp simd
            for (int j = 0; j < w; j++) orow[j] = crow[j];
        }
    }
    if (kern->end) kern->end();
}

/* Packed K / Vᵀ of every (sequence, kv head) for the bf16 path, in one pool run. */
static void attn_pack_all(attn_run *r) {
    const attn_params *p = r->p;
    const int KV = p->n_kv_heads, hd = p->head_dim;
    r->hdp = (int)round_up(hd, 32);
    r->kofs = xmalloc((size_t)p->n_seqs * sizeof *r->kofs);
    r->vofs = xmalloc((size_t)p->n_seqs * sizeof *r->vofs);
    int64_t kt = 0, vt = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        const int64_t nk = p->k_start[s + 1] - p->k_start[s];
        r->kofs[s] = kt;
        r->vofs[s] = vt;
        kt += KV * round_up(nk, 16) * r->hdp;
        vt += KV * round_up(hd, 16) * round_up(nk, 32);
    }
    /* one growable buffer for both, kept across calls (every layer of every forward needs it) */
    uint16_t *buf = (uint16_t *)cpu_tbuf_reserve(&r->ci->attn_kv, (size_t)(kt + vt + 64) / 2);
    r->kpk = buf;
    r->vpk = buf + kt + (32 - kt % 32) % 32;   /* groups stay 64-byte aligned */
    cpu_pool_run(r->ci->pool, (int64_t)p->n_seqs * KV, 0, attn_pack_task, r);
}

void cpu_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v, void *out) {
    cpu_impl *ci = cpu_impl_of(be);
    const int H = p->n_heads, KV = p->n_kv_heads, hd = p->head_dim, nt = be->n_threads;
    CHECK(H > 0 && KV > 0 && hd > 0 && H % KV == 0);
    CHECK(p->n_seqs > 0 && p->q_start && p->k_start);
    CHECK(!p->block_causal || (p->q_pos && p->k_pos));
    CHECK(!p->k_seq == !p->v_seq);
    CHECK(hd <= ATTN_MAX_HEAD_DIM);
    const int bf16 = ci->attn != NULL;

    int n_q = p->q_start[p->n_seqs];
    int qt = bf16 ? GEMM_MB : 64;
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
    if (bf16) attn_pack_all(&r);
    cpu_pool_run(ci->pool, (int64_t)n_items * H, 0, bf16 ? attn_task_bf16 : attn_task_fp32, &r);
    free(r.kofs);
    free(r.vofs);
    free(items);
}
