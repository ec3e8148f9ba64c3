/*
 * cuda_decode.c — device-resident decode steps (cuda_decode.h): device buffers of a fixed batch,
 * the per-step launch sequence (forward -> umk_sample -> umk_decode_commit), CUDA graph capture
 * and the pinned ring of step records read back with events.
 *
 * Does not: build canvases or turn records into decode events / text (the decode loop does);
 * choose blocks on the host. Built without CUDA, only stubs that fail cleanly are compiled.
 * Threading: the engine thread that owns the backend.
 */
#include "backend/cuda/cuda_decode.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "decode/decode.h"
#include "util/log.h"

#ifdef UNMASK_HAVE_CUDA

#include "backend/cuda/cuda_internal.h"

_Static_assert((int)DECODER_LOW_CONFIDENCE == (int)UMK_DEC_LOW_CONFIDENCE && (int)DECODER_RANDOM == (int)UMK_DEC_RANDOM &&
                   (int)DECODER_THRESHOLD == (int)UMK_DEC_THRESHOLD && (int)DECODER_FACTOR == (int)UMK_DEC_FACTOR,
               "decoder enums of decode.h and um_kernels.h agree");

struct cuda_decode {
    backend        *be;
    cuda_impl      *ci;
    int             n_seqs, B, n_tok;
    umk_vocab_ids   ids;
    cuda_forward_fn fwd;
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
    cudaEvent_t    *ring_ev;       /* [ring] end of step (timing enabled): records copied */
    cudaEvent_t    *ring_ev0;      /* [ring] start of step (before its forward) */
    long            produced, consumed;
    const unsigned char *cur;      /* slot of the last successful poll */
    double          cur_ms;        /* GPU milliseconds of that step (ring_ev0 -> ring_ev) */

    cuda_graph     *graph;
    int             begun;
    cuda_decode_stats st;

    /* sequences continued mid-block: {step_in_block, step, m0} written over what umk_decode_begin
     * set (it starts every block afresh) */
    int             n_resume;
    int32_t        *h_resume_seq;  /* [n_resume] batch index */
    int32_t        *h_resume;      /* [n_resume][3] */
};

_Static_assert(offsetof(umk_seq_state, step) == offsetof(umk_seq_state, step_in_block) + 4 &&
                   offsetof(umk_seq_state, m0) == offsetof(umk_seq_state, step_in_block) + 8,
               "umk_seq_state: step_in_block, step, m0 are contiguous (patched together)");

static void *dmalloc(cuda_impl *ci, size_t bytes) {
    void *p = NULL;
    cuda_use_device(ci);
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

cuda_decode *cuda_decode_create(backend *be, const cuda_decode_seq *seqs, int n_seqs, int block_len,
                                cuda_decode_ids ids, int ring, cuda_forward_fn fwd, void *fwd_user, um_err *err) {
    if (!backend_is_cuda(be)) {
        um_err_set(err, UM_ERR_INVALID_ARG, "device-resident decoding needs the CUDA backend (got %s)", be->name);
        return NULL;
    }
    if (n_seqs < 1 || block_len < 1 || block_len > 1024 || ring < 2) {
        um_err_set(err, UM_ERR_INVALID_ARG, "cuda_decode: bad shape (%d sequences, block %d, ring %d)", n_seqs,
                   block_len, ring);
        return NULL;
    }
    for (int s = 0; s < n_seqs; s++) {
        const cuda_decode_seq *q = &seqs[s];
        const int qb = q->block_len > 0 ? q->block_len : block_len;
        if (q->len < 1 || q->lo < 0 || q->hi < q->lo || qb > block_len || q->hi - q->lo > qb || q->gen_end > q->len ||
            q->decoder < 0 || q->decoder > (int)DECODER_FACTOR || (q->blk_steps && q->n_blocks < 1) || q->step < 0 ||
            q->step_in_block < 0 || q->block_m0 < 0 || (q->block_m0 > 0 && q->block_m0 > q->hi - q->lo)) {
            um_err_set(err, UM_ERR_INVALID_ARG, "cuda_decode: sequence %d: bad canvas/block/decoder", s);
            return NULL;
        }
    }
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    cuda_decode *cd = xcalloc(1, sizeof *cd);
    cd->be = be;
    cd->ci = ci;
    cd->n_seqs = n_seqs;
    cd->B = block_len;
    cd->ids = (umk_vocab_ids){ids.vocab, ids.mask_id, ids.eos_id, ids.eot_id};
    cd->fwd = fwd;
    cd->fwd_user = fwd_user;
    cd->ring = ring;

    cd->h_seq_start = xmalloc((size_t)(n_seqs + 1) * sizeof *cd->h_seq_start);
    cd->h_seq_start[0] = 0;
    for (int s = 0; s < n_seqs; s++) cd->h_seq_start[s + 1] = cd->h_seq_start[s] + seqs[s].len;
    cd->n_tok = cd->h_seq_start[n_seqs];
    cd->h_tokens = xmalloc((size_t)cd->n_tok * sizeof *cd->h_tokens);
    for (int s = 0; s < n_seqs; s++)
        memcpy(cd->h_tokens + cd->h_seq_start[s], seqs[s].tokens, (size_t)seqs[s].len * sizeof(int32_t));
    const int n_rows = n_seqs * block_len;
    cd->h_out_rows = xmalloc((size_t)n_rows * sizeof *cd->h_out_rows);
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
    umk_seq_state *st = xcalloc((size_t)n_seqs, sizeof *st);
    umk_sample_cfg *cf = xcalloc((size_t)n_seqs, sizeof *cf);
    int n_tab = 0;
    for (int s = 0; s < n_seqs; s++) n_tab += seqs[s].blk_steps ? seqs[s].n_blocks : 0;
    int32_t *tab = n_tab ? xmalloc((size_t)n_tab * sizeof *tab) : NULL;
    int tab_off = 0;
    for (int s = 0; s < n_seqs; s++) {
        const cuda_decode_seq *q = &seqs[s];
        for (int j = 0; j < block_len; j++) {
            int p = q->lo + j < q->len ? q->lo + j : q->len - 1;
            cd->h_out_rows[s * block_len + j] = cd->h_seq_start[s] + p;
        }
        st[s].row0 = cd->h_seq_start[s];
        st[s].len = q->len;
        st[s].gen_end = q->gen_end > 0 ? q->gen_end : q->len;
        st[s].block_len = q->block_len > 0 ? q->block_len : block_len;
        st[s].step = q->step;
        st[s].lo = q->lo;
        st[s].hi = q->hi;
        st[s].block_steps = q->block_steps;
        st[s].blk = 0;
        st[s].blk_steps_off = -1;
        if (q->blk_steps) {
            memcpy(tab + tab_off, q->blk_steps, (size_t)q->n_blocks * sizeof *tab);
            st[s].blk_steps_off = tab_off;
            tab_off += q->n_blocks;
        }
        st[s].decoder = q->decoder;
        st[s].stop_at_eos = q->stop_at_eos;
        st[s].threshold = q->threshold;
        st[s].factor = q->factor;
        st[s].seed = q->seed;
        cf[s].temperature = q->temperature;
        cf[s].top_p = q->top_p;
        cf[s].top_k = q->top_k;
        cf[s].seed = q->seed;
        cf[s].logits_eos_inf = q->logits_eos_inf;
        cf[s].confidence_eos_eot_inf = q->confidence_eos_eot_inf;
    }
    cd->d_tokens = dmalloc(ci, (size_t)cd->n_tok * sizeof(int32_t));
    cd->d_out_rows = dmalloc(ci, (size_t)n_rows * sizeof(int32_t));
    cd->d_state = dmalloc(ci, (size_t)n_seqs * sizeof *cd->d_state);
    cd->d_cfg = dmalloc(ci, (size_t)n_seqs * sizeof *cd->d_cfg);
    cd->d_jobs = dmalloc(ci, (size_t)n_rows * sizeof *cd->d_jobs);
    cd->d_x0 = dmalloc(ci, (size_t)n_rows * sizeof *cd->d_x0);
    cd->d_conf = dmalloc(ci, (size_t)n_rows * sizeof *cd->d_conf);
    cd->ev_bytes = umk_event_bytes(block_len);
    cd->d_events = dmalloc(ci, (size_t)n_seqs * cd->ev_bytes);
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
    CUDA_CHECK(cudaMemcpyAsync(cd->d_tokens, cd->h_tokens, (size_t)cd->n_tok * sizeof(int32_t), cudaMemcpyHostToDevice, ci->stream));
    CUDA_CHECK(cudaMemcpyAsync(cd->d_out_rows, cd->h_out_rows, (size_t)n_rows * sizeof(int32_t), cudaMemcpyHostToDevice, ci->stream));
    CUDA_CHECK(cudaMemcpyAsync(cd->d_state, st, (size_t)n_seqs * sizeof *st, cudaMemcpyHostToDevice, ci->stream));
    CUDA_CHECK(cudaMemcpyAsync(cd->d_cfg, cf, (size_t)n_seqs * sizeof *cf, cudaMemcpyHostToDevice, ci->stream));
    if (n_tab) {
        cd->d_blk_steps = dmalloc(ci, (size_t)n_tab * sizeof(int32_t));
        CUDA_CHECK(cudaMemcpyAsync(cd->d_blk_steps, tab, (size_t)n_tab * sizeof(int32_t), cudaMemcpyHostToDevice, ci->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));   /* the host arrays are freed next */
    free(tab);
    free(st);
    free(cf);
    CUDA_CHECK(cudaMallocHost((void **)&cd->h_ring, (size_t)ring * (size_t)n_seqs * cd->ev_bytes));
    cd->ring_ev = xcalloc((size_t)ring, sizeof *cd->ring_ev);
    cd->ring_ev0 = xcalloc((size_t)ring, sizeof *cd->ring_ev0);
    for (int i = 0; i < ring; i++) {
        CUDA_CHECK(cudaEventCreateWithFlags(&cd->ring_ev[i], cudaEventDefault));
        CUDA_CHECK(cudaEventCreateWithFlags(&cd->ring_ev0[i], cudaEventDefault));
    }

    cd->batch.n_seqs = n_seqs;
    cd->batch.seq_start = cd->h_seq_start;
    cd->batch.tokens = cd->h_tokens;
    cd->batch.pos = NULL;
    cd->batch.key_valid = NULL;
    cd->batch.n_out = n_rows;
    cd->batch.out_rows = cd->h_out_rows;
    return cd;
}

void cuda_decode_free(cuda_decode *cd) {
    if (!cd) return;
    cuda_impl *ci = cd->ci;
    cuda_use_device(ci);
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
    cuda_graph_free(cd->graph);
    void *bufs[] = {cd->d_tokens, cd->d_out_rows, cd->d_state, cd->d_cfg, cd->d_jobs, cd->d_x0, cd->d_conf, cd->d_events,
                    cd->d_blk_steps};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) CUDA_CHECK(cudaFree(bufs[i]));
    for (int i = 0; i < cd->ring; i++) {
        CUDA_CHECK(cudaEventDestroy(cd->ring_ev[i]));
        CUDA_CHECK(cudaEventDestroy(cd->ring_ev0[i]));
    }
    free(cd->ring_ev);
    free(cd->ring_ev0);
    CUDA_CHECK(cudaFreeHost(cd->h_ring));
    free(cd->h_seq_start);
    free(cd->h_tokens);
    free(cd->h_out_rows);
    free(cd->h_resume_seq);
    free(cd->h_resume);
    free(cd);
}

const fwd_batch *cuda_decode_batch(const cuda_decode *cd) { return &cd->batch; }

/* forward with the canvas / LM-head rows read from the device, then sample + commit */
static int enqueue_compute(cuda_decode *cd, int with_commit, um_err *err) {
    cuda_impl *ci = cd->ci;
    backend_cuda_alias_add(cd->be, cd->h_tokens, cd->d_tokens, (size_t)cd->n_tok * sizeof(int32_t));
    backend_cuda_alias_add(cd->be, cd->h_out_rows, cd->d_out_rows, (size_t)cd->n_seqs * (size_t)cd->B * sizeof(int32_t));
    const void *logits = NULL;
    int rc = cd->fwd(cd->fwd_user, &cd->batch, &logits, err);
    backend_cuda_alias_clear(cd->be);
    if (rc < 0) return -1;
    CHECK(logits != NULL);
    if (!with_commit) return 0;
    const int n_rows = cd->n_seqs * cd->B;
    CUDA_CHECK(umk_sample(logits, cd->ids, cd->d_jobs, n_rows, cd->d_cfg, cd->d_x0, cd->d_conf, ci->stream));
    CUDA_CHECK(umk_decode_commit(cd->d_state, cd->n_seqs, cd->B, cd->ids, cd->d_tokens, cd->d_blk_steps, cd->d_x0,
                                 cd->d_conf, cd->d_events, cd->d_jobs, cd->d_out_rows, ci->stream));
    return 0;
}

static void ensure_begun(cuda_decode *cd) {
    if (cd->begun) return;
    CUDA_CHECK(umk_decode_begin(cd->d_state, cd->n_seqs, cd->B, cd->ids, cd->d_tokens, cd->d_blk_steps, cd->d_jobs,
                                cd->d_out_rows, cd->ci->stream));
    /* A continued block keeps its quota state: umk_decode_begin set m0 = the masks left and
     * step_in_block = 0 (its first block has masks, so it did not move on); put back the values of
     * when the block began. The sample jobs it wrote already carry the right step. */
    for (int k = 0; k < cd->n_resume; k++) {
        unsigned char *dst = (unsigned char *)(cd->d_state + cd->h_resume_seq[k]) + offsetof(umk_seq_state, step_in_block);
        CUDA_CHECK(cudaMemcpyAsync(dst, cd->h_resume + 3 * k, 3 * sizeof(int32_t), cudaMemcpyHostToDevice, cd->ci->stream));
    }
    if (cd->n_resume) CUDA_CHECK(cudaStreamSynchronize(cd->ci->stream));   /* pageable source: keep it simple */
    cd->begun = 1;
}

int cuda_decode_capture(cuda_decode *cd, um_err *err) {
    cuda_use_device(cd->ci);
    if (cd->graph) return 0;
    ensure_begun(cd);
    /* warm-up: allocates the forward's buffers — unless a step of this batch (same shapes) already
     * ran uncaptured and did that */
    if (cd->produced == 0 && enqueue_compute(cd, 0, err) < 0) return -1;
    CUDA_CHECK(cudaStreamSynchronize(cd->ci->stream));
    backend_cuda_capture_begin(cd->be);
    int rc = enqueue_compute(cd, 1, err);
    cuda_graph *g = backend_cuda_capture_end(cd->be);
    if (rc < 0) {
        cuda_graph_free(g);
        return -1;
    }
    cd->graph = g;
    return 0;
}

int cuda_decode_step(cuda_decode *cd, um_err *err) {
    cuda_impl *ci = cd->ci;
    cuda_use_device(ci);
    if (cd->produced - cd->consumed >= cd->ring)
        UM_FATAL("cuda_decode_step: %d steps pending unpolled (ring %d): poll before stepping", (int)(cd->produced - cd->consumed),
                 cd->ring);
    ensure_begun(cd);
    if (cd->graph && cuda_graph_stale(cd->graph)) {
        /* a buffer it was captured with was freed or replaced: never replay it */
        cuda_graph_free(cd->graph);   /* synchronises: no replay of it is in flight */
        cd->graph = NULL;
        cd->st.stale_graphs++;
        log_debug("cuda_decode: captured graph is stale (a buffer it uses was freed); direct launch");
    }
    const int slot = (int)(cd->produced % cd->ring);
    CUDA_CHECK(cudaEventRecord(cd->ring_ev0[slot], ci->stream));
    if (cd->graph) {
        cuda_graph_launch(cd->graph);
        cd->st.graph_launches++;
    } else {
        if (enqueue_compute(cd, 1, err) < 0) return -1;
        cd->st.direct_launches++;
    }
    unsigned char *dst = cd->h_ring + (size_t)slot * (size_t)cd->n_seqs * cd->ev_bytes;
    CUDA_CHECK(cudaMemcpyAsync(dst, cd->d_events, (size_t)cd->n_seqs * cd->ev_bytes, cudaMemcpyDeviceToHost, ci->stream));
    CUDA_CHECK(cudaEventRecord(cd->ring_ev[slot], ci->stream));
    cd->produced++;
    return 0;
}

int cuda_decode_poll(cuda_decode *cd, int wait) {
    if (cd->consumed == cd->produced) return 0;
    const int slot = (int)(cd->consumed % cd->ring);
    cuda_use_device(cd->ci);
    if (wait) {
        CUDA_CHECK(cudaEventSynchronize(cd->ring_ev[slot]));
    } else {
        cudaError_t e = cudaEventQuery(cd->ring_ev[slot]);
        if (e == cudaErrorNotReady) return 0;
        CUDA_CHECK(e);
    }
    cd->cur = cd->h_ring + (size_t)slot * (size_t)cd->n_seqs * cd->ev_bytes;
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, cd->ring_ev0[slot], cd->ring_ev[slot]));
    cd->cur_ms = ms;
    cd->consumed++;
    return 1;
}

double cuda_decode_step_ms(const cuda_decode *cd) {
    CHECK(cd->cur);
    return cd->cur_ms;
}

void cuda_decode_get_stats(const cuda_decode *cd, cuda_decode_stats *out) { *out = cd->st; }

int cuda_decode_has_graph(const cuda_decode *cd) { return cd->graph != NULL; }

void cuda_decode_event(const cuda_decode *cd, int s, cuda_step_event *ev) {
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

int cuda_decode_pending(const cuda_decode *cd) { return (int)(cd->produced - cd->consumed); }

void cuda_decode_tokens(cuda_decode *cd, int32_t *out) {
    cuda_impl *ci = cd->ci;
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemcpyAsync(out, cd->d_tokens, (size_t)cd->n_tok * sizeof(int32_t), cudaMemcpyDeviceToHost, ci->stream));
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
}

#else /* !UNMASK_HAVE_CUDA */

cuda_decode *cuda_decode_create(backend *be, const cuda_decode_seq *seqs, int n_seqs, int block_len,
                                cuda_decode_ids ids, int ring, cuda_forward_fn fwd, void *fwd_user, um_err *err) {
    (void)be, (void)seqs, (void)n_seqs, (void)block_len, (void)ids, (void)ring, (void)fwd, (void)fwd_user;
    um_err_set(err, UM_ERR_UNSUPPORTED, "this unmask was built without CUDA");
    return NULL;
}

void cuda_decode_free(cuda_decode *cd) { (void)cd; }
const fwd_batch *cuda_decode_batch(const cuda_decode *cd) { (void)cd; UM_FATAL("built without CUDA"); }
int cuda_decode_capture(cuda_decode *cd, um_err *err) { (void)cd; return um_err_set(err, UM_ERR_UNSUPPORTED, "built without CUDA"); }
int cuda_decode_step(cuda_decode *cd, um_err *err) { (void)cd; return um_err_set(err, UM_ERR_UNSUPPORTED, "built without CUDA"); }
int cuda_decode_poll(cuda_decode *cd, int wait) { (void)cd, (void)wait; return 0; }
void cuda_decode_event(const cuda_decode *cd, int s, cuda_step_event *ev) { (void)cd, (void)s, (void)ev; UM_FATAL("built without CUDA"); }
int cuda_decode_pending(const cuda_decode *cd) { (void)cd; return 0; }
void cuda_decode_tokens(cuda_decode *cd, int32_t *out) { (void)cd, (void)out; UM_FATAL("built without CUDA"); }
double cuda_decode_step_ms(const cuda_decode *cd) { (void)cd; UM_FATAL("built without CUDA"); }
void cuda_decode_get_stats(const cuda_decode *cd, cuda_decode_stats *out) { (void)cd; memset(out, 0, sizeof *out); }
int cuda_decode_has_graph(const cuda_decode *cd) { (void)cd; return 0; }

#endif /* UNMASK_HAVE_CUDA */
