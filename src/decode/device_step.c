/*
 * device_step.c — device-resident decode steps (device_step.h): device buffers of a fixed batch,
 * the per-step launch sequence (forward -> backend_decode_sample -> backend_decode_commit), graph
 * capture and the pinned ring of step records read back with events — all through the backend's
 * BACKEND_CAP_DEVICE_DECODE / _GRAPHS primitives (backend_decode.h), so no device API appears here.
 *
 * Host-planned steps (KV caches): the caller's rows are copied into pinned mirrors and device
 * buffers the forward reads through aliases; graphs are kept per shape (PLAN_GRAPHS, least recently
 * used one dropped).
 * Does not: build canvases or turn records into decode events / text (decode_device.c does);
 * choose blocks on the host. Threading: the engine thread that owns the backend.
 */
#include "decode/device_step.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_decode.h"
#include "decode/decode.h"
#include "util/log.h"

_Static_assert((int)DECODER_LOW_CONFIDENCE == (int)UMK_DEC_LOW_CONFIDENCE && (int)DECODER_RANDOM == (int)UMK_DEC_RANDOM &&
                   (int)DECODER_THRESHOLD == (int)UMK_DEC_THRESHOLD && (int)DECODER_FACTOR == (int)UMK_DEC_FACTOR &&
                   (int)DECODER_ORIGIN == (int)UMK_DEC_ORIGIN && (int)DECODER_MASKGIT_PLUS == (int)UMK_DEC_MASKGIT_PLUS &&
                   (int)DECODER_TOPK_MARGIN == (int)UMK_DEC_TOPK_MARGIN && (int)DECODER_ENTROPY == (int)UMK_DEC_ENTROPY,
               "decoder enums of decode.h and backend_decode_types.h agree");

#define PLAN_GRAPHS 4   /* graphs kept per batch for host-planned steps, one per shape */

/* A graph of one host-planned shape: rows per sequence, which sequences have a KV slot and, with
 * block-causal attention, each one's attention block and first position (the forward derives the
 * rows' block indices and a slot's key count from the positions on the host, so they are baked into
 * a graph: rows of a planned step are consecutive positions, so the first one fixes them). */
typedef struct plan_graph {
    int32_t       *sig;       /* [4 * n_seqs + 1]: seq_start, then kv != 0, then the attention block
                                 and the first row's position per sequence (both 0 without
                                 fwd_batch.block_len); NULL = unused */
    backend_graph *g;         /* NULL: seen once, not captured yet */
    long           used;      /* step that last used it (LRU) */
} plan_graph;

struct device_step {
    backend        *be;
    int             n_seqs, B, n_tok;
    umk_vocab_ids   ids;
    device_step_forward_fn fwd;
    void           *fwd_user;

    /* host side of the batch (aliased to the device arrays for the forward) */
    int32_t        *h_seq_start;   /* [n_seqs+1] */
    int32_t        *h_tokens;      /* [n_tok] initial canvas (stale after step 0) */
    int32_t        *h_out_rows;    /* [n_seqs*B] placeholder (valid rows) */
    fwd_batch       batch;

    /* device */
    int32_t        *d_tokens;      /* [n_tok] the live canvas */
    int32_t        *d_out_rows;    /* [n_seqs*B] LM-head rows of the next step */
    umk_seq_state  *d_state;       /* [n_seqs] */
    umk_sample_cfg *d_cfg;         /* [n_seqs] */
    int32_t        *d_blk_steps;   /* per-block step budgets of all sequences, or NULL */
    umk_sample_job *d_jobs;        /* [n_seqs*B] */
    int32_t        *d_x0;          /* [n_seqs*B] */
    double         *d_conf;        /* [n_seqs*B] */
    void           *d_events;      /* [n_seqs] records of the last step */
    size_t          ev_bytes;      /* per sequence */

    /* pinned ring of step records */
    int             ring;
    unsigned char  *h_ring;        /* [ring][n_seqs * ev_bytes] */
    backend_event **ring_ev;       /* [ring] end of step: records copied */
    backend_event **ring_ev0;      /* [ring] start of step (before its forward) */
    long            produced, consumed;
    const unsigned char *cur;      /* slot of the last successful poll */
    double          cur_ms;        /* GPU milliseconds of that step (ring_ev0 -> ring_ev) */

    backend_graph  *graph;
    int             begun;
    device_step_stats st;

    /* host-planned steps: the forward's arrays (pinned host mirrors, aliased to the device copies) */
    int32_t        *d_ftok, *d_fpos;   /* [n_tok] device */
    int32_t        *h_ftok, *h_fpos;   /* [n_tok] pinned */
    int32_t        *h_fout;            /* [n_seqs*B] pinned, copied to d_out_rows */
    int32_t        *h_fstart, *h_fkv;  /* [n_seqs+1], [n_seqs] (staged by the ops, or baked into graphs) */
    int32_t        *h_fblk;            /* [n_seqs] attention blocks (fwd_batch.block_len), likewise */
    fwd_batch       fbatch;
    plan_graph      pg[PLAN_GRAPHS];

    /* sequences continued mid-block: {step_in_block, step, m0} written over what umk_decode_begin
     * set (it starts every block afresh) */
    int             n_resume;
    int32_t        *h_resume_seq;  /* [n_resume] batch index */
    int32_t        *h_resume;      /* [n_resume][3] */
};

_Static_assert(offsetof(umk_seq_state, step) == offsetof(umk_seq_state, step_in_block) + 4 &&
                   offsetof(umk_seq_state, m0) == offsetof(umk_seq_state, step_in_block) + 8,
               "umk_seq_state: step_in_block, step, m0 are contiguous (patched together)");

static void *dmalloc(backend *be, size_t bytes) { return backend_buf_alloc(be, bytes ? bytes : 16); }

/* Checks the backend, the shape and every sequence for device_step_create. 0, or -1 + err. */
static int device_step_check(backend *be, const device_step_seq *seqs, int n_seqs, int block_len, int ring,
                             um_err *err) {
    if (!backend_has(be, BACKEND_CAP_DEVICE_DECODE)) {
        um_err_set(err, UM_ERR_INVALID_ARG, "device-resident decoding needs a backend with device decode support (got %s)",
                   backend_name(be));
        return -1;
    }
    if (n_seqs < 1 || block_len < 1 || block_len > 1024 || ring < 2) {
        um_err_set(err, UM_ERR_INVALID_ARG, "device_step: bad shape (%d sequences, block %d, ring %d)", n_seqs,
                   block_len, ring);
        return -1;
    }
    for (int s = 0; s < n_seqs; s++) {
        const device_step_seq *q = &seqs[s];
        const int qb = q->block_len > 0 ? q->block_len : block_len;
        if (q->len < 1 || q->lo < 0 || q->hi < q->lo || qb > block_len || q->hi - q->lo > qb || q->gen_end > q->len ||
            q->decoder < 0 || q->decoder > (int)DECODER_ENTROPY || q->decoder == (int)DECODER_HIERARCHY ||
            q->decoder == (int)DECODER_CREDIT ||
            (q->decoder >= (int)DECODER_MASKGIT_PLUS && (q->top_p < 1.0 || q->top_k > 0)) || (q->blk_steps && q->n_blocks < 1) || q->step < 0 ||
            q->step_in_block < 0 || q->block_m0 < 0 || (q->block_m0 > 0 && q->block_m0 > q->hi - q->lo)) {
            um_err_set(err, UM_ERR_INVALID_ARG, "device_step: sequence %d: bad canvas/block/decoder", s);
            return -1;
        }
    }
    return 0;
}

/* The host side of the batch: sequence starts, the initial canvas, the LM-head rows of the first
 * block, and the sequences resumed mid-block. */
static void device_step_host_init(device_step *cd, const device_step_seq *seqs) {
    const int n_seqs = cd->n_seqs, block_len = cd->B;
    cd->h_seq_start = xmalloc((size_t)(n_seqs + 1) * sizeof *cd->h_seq_start);
    cd->h_seq_start[0] = 0;
    for (int s = 0; s < n_seqs; s++) cd->h_seq_start[s + 1] = cd->h_seq_start[s] + seqs[s].len;
    cd->n_tok = cd->h_seq_start[n_seqs];
    cd->h_tokens = xmalloc((size_t)cd->n_tok * sizeof *cd->h_tokens);
    for (int s = 0; s < n_seqs; s++)
        memcpy(cd->h_tokens + cd->h_seq_start[s], seqs[s].tokens, (size_t)seqs[s].len * sizeof(int32_t));
    cd->h_out_rows = xmalloc((size_t)n_seqs * (size_t)block_len * sizeof *cd->h_out_rows);
    for (int s = 0; s < n_seqs; s++) {
        const device_step_seq *q = &seqs[s];
        for (int j = 0; j < block_len; j++) {
            int p = q->lo + j < q->len ? q->lo + j : q->len - 1;
            cd->h_out_rows[s * block_len + j] = cd->h_seq_start[s] + (q->logit_shift && p > 0 ? p - 1 : p);
        }
    }
    for (int s = 0; s < n_seqs; s++) cd->n_resume += seqs[s].block_m0 > 0;
    cd->h_resume_seq = xmalloc((size_t)(cd->n_resume + 1) * sizeof *cd->h_resume_seq);
    cd->h_resume = xmalloc((size_t)(cd->n_resume + 1) * 3 * sizeof *cd->h_resume);
    for (int s = 0, k = 0; s < n_seqs; s++) {
        if (seqs[s].block_m0 <= 0) continue;
        cd->h_resume_seq[k] = s;
        cd->h_resume[3 * k + 0] = seqs[s].step_in_block;
        cd->h_resume[3 * k + 1] = seqs[s].step;
        cd->h_resume[3 * k + 2] = seqs[s].block_m0;
        k++;
    }
}

/* Sequence q's device state (row0: its first token in the batch) and sampling settings; tab_off:
 * where its per-block step budgets start in the shared table, -1 = none. */
static void seq_state_of(const device_step_seq *q, int row0, int block_len, int tab_off, umk_seq_state *st,
                         umk_sample_cfg *cf) {
    st->row0 = row0;
    st->len = q->len;
    st->gen_end = q->gen_end > 0 ? q->gen_end : q->len;
    st->block_len = q->block_len > 0 ? q->block_len : block_len;
    st->step = q->step;
    st->lo = q->lo;
    st->hi = q->hi;
    st->block_steps = q->block_steps;
    st->blk = 0;
    st->blk_steps_off = tab_off;
    st->decoder = q->decoder;
    st->stop_at_eos = q->stop_at_eos;
    st->logit_shift = q->logit_shift;
    st->threshold = q->threshold;
    st->factor = q->factor;
    st->seed = q->seed;
    st->eps = q->eps;
    st->alg_temp = q->alg_temp;
    st->quota_len = q->quota_len;
    cf->dream_score = q->decoder >= (int)DECODER_MASKGIT_PLUS ? q->decoder : 0;
    cf->temperature = q->temperature;
    cf->top_p = q->top_p;
    cf->top_k = q->top_k;
    cf->seed = q->seed;
    cf->logits_eos_inf = q->logits_eos_inf;
    cf->confidence_eos_eot_inf = q->confidence_eos_eot_inf;
}

/* Allocates the device arrays and uploads the canvas, LM-head rows, sequence states, sampling
 * settings and per-block step budgets (after device_step_host_init). */
static void device_step_device_init(device_step *cd, const device_step_seq *seqs) {
    backend *be = cd->be;
    const int n_seqs = cd->n_seqs, block_len = cd->B, n_rows = n_seqs * block_len;
    umk_seq_state *st = xcalloc((size_t)n_seqs, sizeof *st);
    umk_sample_cfg *cf = xcalloc((size_t)n_seqs, sizeof *cf);
    int n_tab = 0;
    for (int s = 0; s < n_seqs; s++) n_tab += seqs[s].blk_steps ? seqs[s].n_blocks : 0;
    int32_t *tab = n_tab ? xmalloc((size_t)n_tab * sizeof *tab) : NULL;
    int tab_off = 0;
    for (int s = 0; s < n_seqs; s++) {
        const device_step_seq *q = &seqs[s];
        seq_state_of(q, cd->h_seq_start[s], block_len, q->blk_steps ? tab_off : -1, &st[s], &cf[s]);
        if (q->blk_steps) {
            memcpy(tab + tab_off, q->blk_steps, (size_t)q->n_blocks * sizeof *tab);
            tab_off += q->n_blocks;
        }
    }
    cd->d_tokens = dmalloc(be, (size_t)cd->n_tok * sizeof(int32_t));
    cd->d_out_rows = dmalloc(be, (size_t)n_rows * sizeof(int32_t));
    cd->d_state = dmalloc(be, (size_t)n_seqs * sizeof *cd->d_state);
    cd->d_cfg = dmalloc(be, (size_t)n_seqs * sizeof *cd->d_cfg);
    cd->d_jobs = dmalloc(be, (size_t)n_rows * sizeof *cd->d_jobs);
    cd->d_x0 = dmalloc(be, (size_t)n_rows * sizeof *cd->d_x0);
    /* [2][n_rows]: the confidences, then Dream's decoder scores (umk_sample_cfg.dream_score) */
    cd->d_conf = dmalloc(be, 2 * (size_t)n_rows * sizeof *cd->d_conf);
    cd->ev_bytes = UMK_EVENT_BYTES(block_len);
    cd->d_events = dmalloc(be, (size_t)n_seqs * cd->ev_bytes);
    backend_synchronize(be);
    backend_buf_set_async(be, cd->d_tokens, cd->h_tokens, (size_t)cd->n_tok * sizeof(int32_t));
    backend_buf_set_async(be, cd->d_out_rows, cd->h_out_rows, (size_t)n_rows * sizeof(int32_t));
    backend_buf_set_async(be, cd->d_state, st, (size_t)n_seqs * sizeof *st);
    backend_buf_set_async(be, cd->d_cfg, cf, (size_t)n_seqs * sizeof *cf);
    if (n_tab) {
        cd->d_blk_steps = dmalloc(be, (size_t)n_tab * sizeof(int32_t));
        backend_buf_set_async(be, cd->d_blk_steps, tab, (size_t)n_tab * sizeof(int32_t));
    }
    backend_synchronize(be);   /* the host arrays are freed next */
    free(tab);
    free(st);
    free(cf);
}

device_step *device_step_create(backend *be, const device_step_seq *seqs, int n_seqs, int block_len,
                                device_step_ids ids, int ring, device_step_forward_fn fwd, void *fwd_user, um_err *err) {
    if (device_step_check(be, seqs, n_seqs, block_len, ring, err) != 0) return NULL;
    device_step *cd = xcalloc(1, sizeof *cd);
    cd->be = be;
    cd->n_seqs = n_seqs;
    cd->B = block_len;
    cd->ids = (umk_vocab_ids){ids.vocab, ids.mask_id, ids.eos_id, ids.eot_id};
    cd->fwd = fwd;
    cd->fwd_user = fwd_user;
    cd->ring = ring;
    device_step_host_init(cd, seqs);
    device_step_device_init(cd, seqs);

    cd->h_ring = backend_host_alloc(be, (size_t)ring * (size_t)n_seqs * cd->ev_bytes);
    cd->ring_ev = xcalloc((size_t)ring, sizeof *cd->ring_ev);
    cd->ring_ev0 = xcalloc((size_t)ring, sizeof *cd->ring_ev0);
    for (int i = 0; i < ring; i++) {
        cd->ring_ev[i] = backend_event_new(be);
        cd->ring_ev0[i] = backend_event_new(be);
    }

    cd->batch.n_seqs = n_seqs;
    cd->batch.seq_start = cd->h_seq_start;
    cd->batch.tokens = cd->h_tokens;
    cd->batch.pos = NULL;
    cd->batch.key_valid = NULL;
    cd->batch.n_out = n_seqs * block_len;
    cd->batch.out_rows = cd->h_out_rows;
    return cd;
}

void device_step_free(device_step *cd) {
    if (!cd) return;
    backend *be = cd->be;
    backend_synchronize(be);
    backend_graph_free(be, cd->graph);
    for (int i = 0; i < PLAN_GRAPHS; i++) {
        backend_graph_free(be, cd->pg[i].g);
        free(cd->pg[i].sig);
    }
    void *bufs[] = {cd->d_tokens, cd->d_out_rows, cd->d_state, cd->d_cfg, cd->d_jobs, cd->d_x0, cd->d_conf, cd->d_events,
                    cd->d_blk_steps, cd->d_ftok, cd->d_fpos};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) backend_buf_free(be, bufs[i]);
    void *pinned[] = {cd->h_ftok, cd->h_fpos, cd->h_fout};
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        if (pinned[i]) backend_host_free(be, pinned[i]);
    free(cd->h_fstart);
    free(cd->h_fkv);
    free(cd->h_fblk);
    for (int i = 0; i < cd->ring; i++) {
        backend_event_free(be, cd->ring_ev[i]);
        backend_event_free(be, cd->ring_ev0[i]);
    }
    free(cd->ring_ev);
    free(cd->ring_ev0);
    backend_host_free(be, cd->h_ring);
    free(cd->h_seq_start);
    free(cd->h_tokens);
    free(cd->h_out_rows);
    free(cd->h_resume_seq);
    free(cd->h_resume);
    free(cd);
}

const fwd_batch *device_step_batch(const device_step *cd) { return &cd->batch; }

static bdec_launch launch_of(const device_step *cd) {
    return (bdec_launch){.state = cd->d_state, .n_seqs = cd->n_seqs, .block_len = cd->B, .ids = cd->ids,
                         .tokens = cd->d_tokens, .blk_steps = cd->d_blk_steps, .jobs = cd->d_jobs,
                         .out_rows = cd->d_out_rows, .cfg = cd->d_cfg, .x0 = cd->d_x0, .conf = cd->d_conf,
                         .events = cd->d_events};
}

/* forward with the canvas / LM-head rows read from the device (planned: the forward's own arrays),
 * then sample + commit */
static int enqueue_compute(device_step *cd, int planned, int with_commit, um_err *err) {
    const size_t out_bytes = (size_t)cd->n_seqs * (size_t)cd->B * sizeof(int32_t);
    if (planned) {
        const size_t n = (size_t)cd->fbatch.seq_start[cd->n_seqs] * sizeof(int32_t);
        backend_alias_add(cd->be, cd->h_ftok, cd->d_ftok, n);
        backend_alias_add(cd->be, cd->h_fpos, cd->d_fpos, n);
        backend_alias_add(cd->be, cd->h_fout, cd->d_out_rows, out_bytes);
    } else {
        backend_alias_add(cd->be, cd->h_tokens, cd->d_tokens, (size_t)cd->n_tok * sizeof(int32_t));
        backend_alias_add(cd->be, cd->h_out_rows, cd->d_out_rows, out_bytes);
    }
    const void *logits = NULL;
    int rc = cd->fwd(cd->fwd_user, planned ? &cd->fbatch : &cd->batch, &logits, err);
    backend_alias_clear(cd->be);
    if (rc < 0) return -1;
    CHECK(logits != NULL);
    if (!with_commit) return 0;
    const bdec_launch l = launch_of(cd);
    backend_decode_sample(cd->be, &l, logits);
    backend_decode_commit(cd->be, &l);
    return 0;
}

static void ensure_begun(device_step *cd) {
    if (cd->begun) return;
    const bdec_launch l = launch_of(cd);
    backend_decode_begin(cd->be, &l);
    /* A continued block keeps its quota state: umk_decode_begin set m0 = the masks left and
     * step_in_block = 0 (its first block has masks, so it did not move on); put back the values of
     * when the block began. The sample jobs it wrote already carry the right step. */
    for (int k = 0; k < cd->n_resume; k++) {
        unsigned char *dst = (unsigned char *)(cd->d_state + cd->h_resume_seq[k]) + offsetof(umk_seq_state, step_in_block);
        backend_buf_set_async(cd->be, dst, cd->h_resume + 3 * k, 3 * sizeof(int32_t));
    }
    if (cd->n_resume) backend_synchronize(cd->be);   /* pageable source: keep it simple */
    cd->begun = 1;
}

int device_step_capture(device_step *cd, um_err *err) {
    if (cd->graph) return 0;
    ensure_begun(cd);
    /* warm-up: allocates the forward's buffers — unless a step of this batch (same shapes) already
     * ran uncaptured and did that */
    if (cd->produced == 0 && enqueue_compute(cd, 0, 0, err) < 0) return -1;
    backend_synchronize(cd->be);
    backend_graph_begin(cd->be);
    int rc = enqueue_compute(cd, 0, 1, err);
    backend_graph *g = backend_graph_end(cd->be);
    if (rc < 0) {
        backend_graph_free(cd->be, g);
        return -1;
    }
    cd->graph = g;
    return 0;
}

/* The step's records -> its ring slot, and the end-of-step event. */
static void finish_enqueue(device_step *cd, int slot) {
    unsigned char *dst = cd->h_ring + (size_t)slot * (size_t)cd->n_seqs * cd->ev_bytes;
    backend_buf_get_async(cd->be, dst, cd->d_events, (size_t)cd->n_seqs * cd->ev_bytes);
    backend_event_record(cd->be, cd->ring_ev[slot]);
    cd->produced++;
}

/* The planned-step buffers, at the first planned step of a batch. */
static void plan_alloc(device_step *cd) {
    if (cd->d_ftok) return;
    const size_t n = (size_t)cd->n_tok * sizeof(int32_t), out = (size_t)cd->n_seqs * (size_t)cd->B * sizeof(int32_t);
    cd->d_ftok = dmalloc(cd->be, n);
    cd->d_fpos = dmalloc(cd->be, n);
    cd->h_ftok = backend_host_alloc(cd->be, n);
    cd->h_fpos = backend_host_alloc(cd->be, n);
    cd->h_fout = backend_host_alloc(cd->be, out);
    cd->h_fstart = xmalloc((size_t)(cd->n_seqs + 1) * sizeof *cd->h_fstart);
    cd->h_fkv = xmalloc((size_t)cd->n_seqs * sizeof *cd->h_fkv);
    cd->h_fblk = xmalloc((size_t)cd->n_seqs * sizeof *cd->h_fblk);
}

/* The kept graph entry of this step's shape (h_fstart / h_fkv), or a fresh one (evicting the least
 * recently used). *fresh = 1 when the shape was not kept. */
static plan_graph *plan_graph_of(device_step *cd, int *fresh) {
    const int n = cd->n_seqs, len = 4 * n + 1, blk = cd->fbatch.block_len != NULL;
    int32_t *sig = xmalloc((size_t)len * sizeof *sig);
    memcpy(sig, cd->h_fstart, (size_t)(n + 1) * sizeof *sig);
    for (int s = 0; s < n; s++) {
        sig[n + 1 + s] = cd->h_fkv[s] != 0;
        sig[2 * n + 1 + s] = blk ? cd->h_fblk[s] : 0;
        sig[3 * n + 1 + s] = blk && cd->h_fstart[s + 1] > cd->h_fstart[s] ? cd->h_fpos[cd->h_fstart[s]] : 0;
    }
    plan_graph *lru = &cd->pg[0];
    for (int i = 0; i < PLAN_GRAPHS; i++) {
        plan_graph *e = &cd->pg[i];
        if (e->sig && memcmp(e->sig, sig, (size_t)len * sizeof *sig) == 0) {
            free(sig);
            *fresh = 0;
            return e;
        }
        if (!e->sig || (lru->sig && e->used < lru->used)) lru = e;
    }
    backend_graph_free(cd->be, lru->g);
    free(lru->sig);
    lru->g = NULL;
    lru->sig = sig;
    *fresh = 1;
    return lru;
}

int device_step_enqueue_planned(device_step *cd, const device_step_layout *lay, int graphs, um_err *err) {
    backend *be = cd->be;
    const int n = cd->n_seqs, B = cd->B;
    CHECK(cd->produced == cd->consumed);   /* the pinned mirrors are free: no step in flight */
    ensure_begun(cd);
    plan_alloc(cd);
    const int rows = lay->seq_start[n];
    CHECK(lay->seq_start[0] == 0 && rows > 0 && rows <= cd->n_tok);
    memcpy(cd->h_fstart, lay->seq_start, (size_t)(n + 1) * sizeof *cd->h_fstart);
    memcpy(cd->h_fkv, lay->kv, (size_t)n * sizeof *cd->h_fkv);
    memcpy(cd->h_ftok, lay->tokens, (size_t)rows * sizeof(int32_t));
    memcpy(cd->h_fpos, lay->pos, (size_t)rows * sizeof(int32_t));
    memcpy(cd->h_fout, lay->out_rows, (size_t)n * (size_t)B * sizeof(int32_t));
    if (lay->block_len) memcpy(cd->h_fblk, lay->block_len, (size_t)n * sizeof *cd->h_fblk);
    cd->fbatch = (fwd_batch){.n_seqs = n, .seq_start = cd->h_fstart, .tokens = cd->h_ftok, .pos = cd->h_fpos,
                             .n_out = n * B, .out_rows = cd->h_fout, .kv = cd->h_fkv,
                             .block_len = lay->block_len ? cd->h_fblk : NULL};
    /* after the previous step's commit (which wrote full-canvas LM-head rows): this step's rows */
    backend_buf_set_async(be, cd->d_ftok, cd->h_ftok, (size_t)rows * sizeof(int32_t));
    backend_buf_set_async(be, cd->d_fpos, cd->h_fpos, (size_t)rows * sizeof(int32_t));
    backend_buf_set_async(be, cd->d_out_rows, cd->h_fout, (size_t)n * (size_t)B * sizeof(int32_t));
    int fresh = 1;
    plan_graph *e = graphs ? plan_graph_of(cd, &fresh) : NULL;
    if (e && e->g && backend_graph_stale(be, e->g)) {   /* a buffer it was captured with is gone */
        backend_graph_free(be, e->g);
        e->g = NULL;
        cd->st.stale_graphs++;
    }
    if (e && !e->g && !fresh) {   /* the shape ran before (its buffers exist): capture it now */
        backend_graph_begin(be);
        int rc = enqueue_compute(cd, 1, 1, err);
        backend_graph *g = backend_graph_end(be);
        if (rc < 0) {
            backend_graph_free(be, g);
            return -1;
        }
        e->g = g;
        cd->st.captures++;
    }
    if (e) e->used = cd->produced;
    const int slot = (int)(cd->produced % cd->ring);
    backend_event_record(be, cd->ring_ev0[slot]);
    if (e && e->g) {
        backend_graph_launch(be, e->g);
        cd->st.graph_launches++;
    } else {
        if (enqueue_compute(cd, 1, 1, err) < 0) return -1;
        cd->st.direct_launches++;
    }
    finish_enqueue(cd, slot);
    return 0;
}

int device_step_enqueue(device_step *cd, um_err *err) {
    backend *be = cd->be;
    if (cd->produced - cd->consumed >= cd->ring)
        UM_FATAL("device_step_enqueue: %d steps pending unpolled (ring %d): poll before stepping", (int)(cd->produced - cd->consumed),
                 cd->ring);
    ensure_begun(cd);
    if (cd->graph && backend_graph_stale(be, cd->graph)) {
        /* a buffer it was captured with was freed or replaced: never replay it */
        backend_graph_free(be, cd->graph);   /* synchronises: no replay of it is in flight */
        cd->graph = NULL;
        cd->st.stale_graphs++;
        log_debug("device_step: captured graph is stale (a buffer it uses was freed); direct launch");
    }
    const int slot = (int)(cd->produced % cd->ring);
    backend_event_record(be, cd->ring_ev0[slot]);
    if (cd->graph) {
        backend_graph_launch(be, cd->graph);
        cd->st.graph_launches++;
    } else {
        if (enqueue_compute(cd, 0, 1, err) < 0) return -1;
        cd->st.direct_launches++;
    }
    finish_enqueue(cd, slot);
    return 0;
}

int device_step_poll(device_step *cd, int wait) {
    if (cd->consumed == cd->produced) return 0;
    const int slot = (int)(cd->consumed % cd->ring);
    if (wait) backend_event_wait(cd->be, cd->ring_ev[slot]);
    else if (!backend_event_query(cd->be, cd->ring_ev[slot])) return 0;
    cd->cur = cd->h_ring + (size_t)slot * (size_t)cd->n_seqs * cd->ev_bytes;
    cd->cur_ms = backend_event_elapsed_ms(cd->be, cd->ring_ev0[slot], cd->ring_ev[slot]);
    cd->consumed++;
    return 1;
}

double device_step_gpu_ms(const device_step *cd) {
    CHECK(cd->cur);
    return cd->cur_ms;
}

void device_step_get_stats(const device_step *cd, device_step_stats *out) { *out = cd->st; }

int device_step_has_graph(const device_step *cd) { return cd->graph != NULL; }

void device_step_record(const device_step *cd, int s, device_step_event *ev) {
    CHECK(cd->cur && s >= 0 && s < cd->n_seqs);
    const unsigned char *base = cd->cur + (size_t)s * cd->ev_bytes;
    umk_event_hdr h;
    memcpy(&h, base, sizeof h);
    const int B = cd->B;
    const int32_t *pos = (const int32_t *)(base + sizeof h);
    ev->step = h.step;
    ev->lo = h.lo;
    ev->hi = h.hi;
    ev->n_commit = h.n_commit;
    ev->masks_left = h.masks_left;
    ev->block_done = h.block_done;
    ev->done = h.done;
    ev->was_done = h.was_done;
    ev->pos = pos;
    ev->tok = pos + B;
    ev->conf = (const float *)(pos + 2 * B);
    ev->draft_tok = pos + 3 * B;
    ev->draft_conf = (const float *)(pos + 4 * B);
}

int device_step_pending(const device_step *cd) { return (int)(cd->produced - cd->consumed); }

void device_step_tokens(device_step *cd, int32_t *out) {
    backend_buf_get_async(cd->be, out, cd->d_tokens, (size_t)cd->n_tok * sizeof(int32_t));
    backend_synchronize(cd->be);
}
