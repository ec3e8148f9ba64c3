/*
 * decode_device.c — the device-resident decode loop (decode_device.h): builds a device_step batch
 * from the sequences' current state, enqueues steps (graph replays once the batch is stable),
 * keeps two in flight, and applies each step record through decode_seq_apply(). A batch with a KV
 * cache runs host-planned steps instead (device_step_enqueue_planned): whether a step refreshes a
 * sequence's cache depends on whether its previous step finished a block, so such a batch keeps one
 * step in flight, plans each step from the applied state (decode_seq_plan: refresh = the whole
 * canvas, else the window rows with the slot) and replays a graph per shape. A batch of
 * block-diffusion sequences (LLaDA2) does the same: each forward ends at the sequence's active
 * block (decode_seq_plan's rows) with its attention block size (fwd_batch.block_len); with the
 * exact block cache a refresh's chunked prefill (decode_seq_prefill) runs before the step.
 *
 * Does not: choose commits or sample on the host (the backend's decode kernels via device_step do),
 * decide which sequences run (sched/). On a backend without BACKEND_CAP_DEVICE_DECODE nothing is
 * eligible.
 * Threads: the thread that owns the model_ctx (engine thread, or the CLI's main thread).
 */
#include "decode/decode_device.h"

#include <stdlib.h>
#include <string.h>

#include "decode/decoder.h"
#include "decode/device_step.h"
#include "util/log.h"
#include "util/timeutil.h"

#define DEVICE_DEPTH 2        /* steps in flight: step k+1 is enqueued before k is applied */
#define DEVICE_RING  4        /* device_step's record ring (>= DEVICE_DEPTH) */
#define DEVICE_MAX_B 1024     /* device_step's largest block */

struct decode_device {
    model_ctx   *ctx;                 /* borrowed */
    int          graphs;              /* capture graphs for stable batches */
    device_step *cd;                  /* the current batch, or NULL */
    decode_seq **slot;                /* [n_slot] batch order; NULL once the sequence is done (or was
                                         dropped): its records are skipped */
    int          n_slot;              /* sequences in the current batch (0 without one) */
    int          cap_slot;            /* slot's allocated length */
    int          B;                   /* the batch's block length */
    int          batch_steps;         /* steps enqueued on this batch */
    int          graph;               /* 1: this batch replays a graph; 0: not captured yet;
                                         -1: capture failed, direct launches */
    uint64_t     t_enq[DEVICE_RING];  /* enqueue time of step #produced % DEVICE_RING */
    long         produced;            /* steps enqueued on this batch */
    long         applied;             /* of those, steps whose records were applied (or skipped) */
    int32_t     *row_pos, *row_tok;   /* [row_cap] scratch for one record's rows, owned */
    float       *row_conf;            /* [row_cap] their confidences, owned */
    int          row_cap;             /* >= the largest B built so far */
    unsigned char *gone;              /* [cap_slot] why slot[i] became NULL: GONE_* */
    device_step_stats seen_launch;    /* cd's launch counters after the previous step */
    int          planned;             /* 1: a sequence of the batch has a KV cache or runs the
                                         block-diffusion rules: host-planned steps */
    int          any_bd;              /* 1: a sequence of the batch runs the block-diffusion rules: the
                                         forward gets each sequence's attention block (l_blk) */
    decode_step_plan *plan;           /* [cap_slot] each sequence's plan of the step in flight */
    int32_t     *l_start, *l_kv;      /* [cap_slot+1], [cap_slot] the planned step's layout (scratch) */
    int32_t     *l_blk;               /* [cap_slot] block-causal attention block per sequence (0: none) */
    int32_t     *l_tok, *l_pos;       /* [l_cap] */
    int32_t     *l_out;               /* [cap_slot * B] */
    int          l_cap, l_out_cap;
    decode_device_step_fn on_step;    /* applied-step observer, or NULL */
    void        *on_step_user;
    decode_device_stats st;
};

enum { GONE_NOT, GONE_DONE_ON_DEVICE, GONE_FINISHED_BY_HOST };

/* The decoders kernels/decode.cu implements. Dream's confidence decoders only without top_p /
 * top_k: their confidence filters with Dream's own top-p / top-k rules (decoders.c
 * dream_confidence), which the device does not implement (x0's sampling filter is sample.c's, which
 * it does); origin reads no confidence, so any filter goes. */
static int dev_decoder_ok(const decode_params *p) {
    switch (p->decoder) {
    case DECODER_LOW_CONFIDENCE:
    case DECODER_RANDOM:
    case DECODER_THRESHOLD:
    case DECODER_FACTOR:
    case DECODER_ORIGIN: return 1;
    case DECODER_MASKGIT_PLUS:
    case DECODER_TOPK_MARGIN:
    case DECODER_ENTROPY: return p->top_p >= 1.0 && p->top_k <= 0;
    default: return 0;
    }
}

/* The decoders whose block-diffusion rule (decoders.c: the quota from the block length; LLaDA2's
 * threshold rule; factor's, the same as without blocks) kernels/decode.cu implements. */
static int dev_bd_decoder_ok(enum decode_decoder d) {
    return d == DECODER_LOW_CONFIDENCE || d == DECODER_RANDOM || d == DECODER_THRESHOLD || d == DECODER_FACTOR;
}

/* Decoders with a per-block step budget (decode.c plan_steps): the device reads blk_steps. Under
 * the block-diffusion rules (quota_len > 0) the threshold decoder has one too (its quota). */
static int dev_fixed_steps(enum decode_decoder d, int quota_len) {
    return (decoder_get(d)->flags & DECODER_F_FIXED_STEPS) != 0 || (quota_len > 0 && d == DECODER_THRESHOLD);
}

int decode_device_supported(const model_ctx *ctx) {
    /* tensor parallel (a sharded rank, or the leader of a group: its forward broadcasts the batch
     * and synchronises) stays on the host loop */
    return ctx && backend_has(ctx->be, BACKEND_CAP_DEVICE_DECODE | BACKEND_CAP_GRAPHS) && ctx->shard.world <= 1 &&
           ctx->tp == NULL;
}

int decode_device_eligible(const model_ctx *ctx, const decode_seq *s) {
    if (!decode_device_supported(ctx) || s == NULL) return 0;
    /* a forward that waits for the host (MoE layers routed on the host: a backend without the
     * device dispatch, or a shape its kernels do not take) cannot run in a device step */
    if (ctx->host_sync) return 0;
    const decode_params *p = decode_seq_params(s);
    decode_seq_cursor c;
    decode_seq_cursor_get(s, &c);
    /* block-causal models (LLaDA2) follow the block-diffusion rules (docs/decode.md "LLaDA2"): the
     * device loop runs them (quota from the block length, LLaDA2's threshold rule, the padded
     * canvas, host-planned forwards cut at the active block's end; with a cache the exact block KV:
     * the chunked prefill before the step, then the active block's rows) for the decoders whose rule
     * the kernel has */
    if (c.quota_len > 0 && !dev_bd_decoder_ok(p->decoder)) return 0;
    return dev_decoder_ok(p) && p->cfg_scale == 0 && c.n_suffix == 0 && p->block_length >= 1 &&
           p->block_length <= DEVICE_MAX_B;
}

decode_device *decode_device_create(model_ctx *ctx, int graphs) {
    CHECK(ctx);
    decode_device *dd = xcalloc(1, sizeof *dd);
    dd->ctx = ctx;
    dd->graphs = graphs != 0;
    return dd;
}

/* Drop the batch without applying anything pending. */
static void dev_drop(decode_device *dd) {
    device_step_free(dd->cd);   /* synchronises the stream */
    dd->cd = NULL;
    dd->n_slot = 0;
    dd->produced = dd->applied = 0;
    dd->batch_steps = 0;
    dd->graph = 0;
    memset(&dd->seen_launch, 0, sizeof dd->seen_launch);
}

void decode_device_set_on_step(decode_device *dd, decode_device_step_fn fn, void *user) {
    dd->on_step = fn;
    dd->on_step_user = user;
}

void decode_device_free(decode_device *dd) {
    if (!dd) return;
    dev_drop(dd);
    free(dd->slot);
    free(dd->gone);
    free(dd->row_pos);
    free(dd->row_tok);
    free(dd->row_conf);
    free(dd->plan);
    free(dd->l_start);
    free(dd->l_kv);
    free(dd->l_blk);
    free(dd->l_tok);
    free(dd->l_pos);
    free(dd->l_out);
    free(dd);
}

int decode_device_holding(const decode_device *dd) { return dd->cd != NULL; }

void decode_device_get_stats(const decode_device *dd, decode_device_stats *out) { *out = dd->st; }

void decode_device_stats_add_delta(decode_device_stats *sum, const decode_device_stats *now,
                                   const decode_device_stats *seen) {
#define ADD(f) sum->f += now->f - seen->f
    ADD(steps), ADD(steps_overlapped), ADD(rebuilds), ADD(rebuild_join), ADD(rebuild_leave), ADD(rebuild_cancel);
    ADD(rebuild_ineligible), ADD(graph_captures), ADD(graph_replays), ADD(graph_stale), ADD(records);
    ADD(lm_rows), ADD(lm_rows_masked), ADD(fwd_rows), ADD(steps_applied), ADD(step_ms_total);
#undef ADD
}

/* Apply the records of the step the last successful poll returned. */
static void dev_apply_polled(decode_device *dd, const decode_sink *sink) {
    const uint64_t t_step = dd->t_enq[dd->applied % DEVICE_RING];
    const double gpu_ms = device_step_gpu_ms(dd->cd);
    dd->applied++;
    int batch = 0;
    for (int i = 0; i < dd->n_slot; i++) {
        decode_seq *s = dd->slot[i];
        if (!s) continue;
        if (decode_seq_done(s)) { /* cancelled or failed meanwhile: no events after its DONE */
            dd->slot[i] = NULL;
            dd->gone[i] = GONE_FINISHED_BY_HOST;
            continue;
        }
        batch++;
        device_step_event ev;
        device_step_record(dd->cd, i, &ev);
        /* the device finished it at an earlier step, which was applied and made it done */
        CHECK(!ev.was_done);
        decode_seq_cursor c;
        decode_seq_cursor_get(s, &c);
        CHECK(ev.step == c.step && c.block < c.n_blocks && ev.lo == c.blk_lo[c.block] && ev.hi == c.blk_hi[c.block]);
        int nr = 0;
        for (int j = 0; j < ev.hi - ev.lo; j++) {
            if (ev.draft_tok[j] < 0) continue;
            dd->row_pos[nr] = ev.lo + j;
            dd->row_tok[nr] = ev.draft_tok[j];
            dd->row_conf[nr] = ev.draft_conf[j];
            nr++;
        }
        decode_record r;
        memset(&r, 0, sizeof r);
        r.step = ev.step;
        r.t_step_ns = t_step;
        r.n_commits = ev.n_commit;
        r.commit_pos = ev.pos;
        r.commit_tok = ev.tok;
        r.commit_conf = ev.conf;
        r.n_rows = nr;
        r.row_pos = dd->row_pos;
        r.row_tok = dd->row_tok;
        r.row_conf = dd->row_conf;
        decode_seq_apply(s, &r, sink);
        dd->st.records++;
        dd->st.lm_rows_masked += (uint64_t)(ev.masks_left + ev.n_commit);
        /* device and host agree on when the sequence ends (same block/EOS rules) */
        CHECK(decode_seq_done(s) == (ev.done != 0));
        if (ev.done) {
            dd->slot[i] = NULL;
            dd->gone[i] = GONE_DONE_ON_DEVICE;
        }
    }
    if (batch > 0) {
        dd->st.lm_rows += (uint64_t)dd->n_slot * (uint64_t)dd->B;
        dd->st.steps_applied++;
        dd->st.step_ms_total += gpu_ms;
        if (dd->on_step) dd->on_step(dd->on_step_user, gpu_ms, batch);
    }
}

void decode_device_drain(decode_device *dd, const decode_sink *sink) {
    if (!dd->cd) return;
    while (device_step_pending(dd->cd) > 0) {
        CHECK(device_step_poll(dd->cd, 1) == 1);
        dev_apply_polled(dd, sink);
    }
}

static int dev_forward(void *user, const fwd_batch *b, const void **logits, um_err *err) {
    return model_forward_dev(user, b, logits, err);
}

/* A new batch from the sequences' current state. */
static int dev_build(decode_device *dd, decode_seq **seqs, int n, um_err *err) {
    const model *m = dd->ctx->m;
    int B = 1;
    for (int i = 0; i < n; i++) {
        int b = decode_seq_params(seqs[i])->block_length;
        if (b > B) B = b;
    }
    device_step_seq *q = xcalloc((size_t)n, sizeof *q);
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        CHECK(!decode_seq_done(s) && decode_device_eligible(dd->ctx, s));
        const decode_params *p = decode_seq_params(s);
        decode_seq_cursor c;
        decode_seq_cursor_get(s, &c);
        CHECK(c.block < c.n_blocks);
        int len;
        q[i].tokens = decode_seq_canvas(s, &len);
        q[i].len = len;
        q[i].lo = c.blk_lo[c.block];
        q[i].hi = c.blk_hi[c.block];
        q[i].gen_end = c.blocks_end;   /* block diffusion: past gen_end, to the padded canvas's end */
        q[i].quota_len = c.quota_len;
        q[i].n_blocks = c.n_blocks - c.block;
        q[i].blk_steps = dev_fixed_steps(p->decoder, c.quota_len) ? c.blk_steps + c.block : NULL;
        q[i].block_steps = 1;
        q[i].decoder = (int)p->decoder;
        q[i].threshold = p->threshold;
        q[i].factor = p->factor;
        q[i].eps = p->eps;
        q[i].alg_temp = p->alg_temp;
        q[i].stop_at_eos = p->stop_at_eos;
        q[i].logit_shift = decode_seq_logit_shift(s);
        q[i].temperature = p->temperature;
        q[i].top_p = p->top_p;
        q[i].top_k = p->top_k;
        q[i].seed = p->seed;
        q[i].logits_eos_inf = p->logits_eos_inf;
        q[i].confidence_eos_eot_inf = p->confidence_eos_eot_inf;
        q[i].block_len = p->block_length;
        q[i].step = c.step;
        q[i].step_in_block = c.step_in_block;
        q[i].block_m0 = c.block_m0 > 0 ? c.block_m0 : 0;
    }
    device_step_ids ids = {m->cfg.n_embd_rows, m->cfg.mask_id, m->cfg.eos_id, m->cfg.eot_id >= 0 ? m->cfg.eot_id : -1};
    device_step *cd = device_step_create(dd->ctx->be, q, n, B, ids, DEVICE_RING, dev_forward, dd->ctx, err);
    free(q);
    if (!cd) return -1;
    if (n > dd->cap_slot) {
        dd->cap_slot = n;
        dd->slot = xrealloc(dd->slot, (size_t)n * sizeof *dd->slot);
        dd->gone = xrealloc(dd->gone, (size_t)n);
        dd->plan = xrealloc(dd->plan, (size_t)n * sizeof *dd->plan);
        dd->l_start = xrealloc(dd->l_start, (size_t)(n + 1) * sizeof *dd->l_start);
        dd->l_kv = xrealloc(dd->l_kv, (size_t)n * sizeof *dd->l_kv);
        dd->l_blk = xrealloc(dd->l_blk, (size_t)n * sizeof *dd->l_blk);
    }
    /* host-planned steps: a KV cache, or the block-diffusion rules (each step's forward ends at the
     * sequence's active block: the host knows where once the step before is applied) */
    dd->planned = 0;
    dd->any_bd = 0;
    for (int i = 0; i < n; i++) {
        decode_seq_cursor c;
        decode_seq_cursor_get(seqs[i], &c);
        dd->planned |= decode_seq_params(seqs[i])->cache != DECODE_CACHE_NONE || c.quota_len > 0;
        dd->any_bd |= c.quota_len > 0;
    }
    memcpy(dd->slot, seqs, (size_t)n * sizeof *seqs);
    memset(dd->gone, GONE_NOT, (size_t)n);
    if (B > dd->row_cap) {
        dd->row_cap = B;
        dd->row_pos = xrealloc(dd->row_pos, (size_t)B * sizeof *dd->row_pos);
        dd->row_tok = xrealloc(dd->row_tok, (size_t)B * sizeof *dd->row_tok);
        dd->row_conf = xrealloc(dd->row_conf, (size_t)B * sizeof *dd->row_conf);
    }
    dd->cd = cd;
    dd->n_slot = n;
    dd->B = B;
    dd->produced = dd->applied = 0;
    dd->batch_steps = 0;
    dd->graph = 0;
    dd->st.rebuilds++;
    log_debug("device decode: batch of %d sequences (block %d) built", n, B);
    return 0;
}

/* Plan the next step of every sequence of the batch (opening KV slots as needed) into the layout
 * scratch: its forward rows (the whole canvas, or the window with the slot) and, per block offset,
 * the forward row holding its logits. */
static void dev_plan_layout(decode_device *dd, device_step_layout *lay) {
    const int n = dd->n_slot, B = dd->B;
    int rows = 0;
    for (int i = 0; i < n; i++) {
        CHECK(dd->slot[i] && !decode_seq_done(dd->slot[i]));   /* a finished one makes the set change */
        dd->plan[i] = decode_seq_plan(dd->slot[i], dd->ctx);
        rows += dd->plan[i].wr - dd->plan[i].wl;
    }
    if (rows > dd->l_cap) {
        dd->l_cap = rows;
        dd->l_tok = xrealloc(dd->l_tok, (size_t)rows * sizeof *dd->l_tok);
        dd->l_pos = xrealloc(dd->l_pos, (size_t)rows * sizeof *dd->l_pos);
    }
    if (n * B > dd->l_out_cap) {
        dd->l_out_cap = n * B;
        dd->l_out = xrealloc(dd->l_out, (size_t)(n * B) * sizeof *dd->l_out);
    }
    dd->l_start[0] = 0;
    for (int i = 0; i < n; i++) {
        const decode_step_plan *pl = &dd->plan[i];
        const int32_t *x = decode_seq_canvas(dd->slot[i], NULL);
        const int r0 = dd->l_start[i], w = pl->wr - pl->wl;
        memcpy(dd->l_tok + r0, x + pl->wl, (size_t)w * sizeof *dd->l_tok);
        for (int j = 0; j < w; j++) dd->l_pos[r0 + j] = pl->wl + j;
        dd->l_kv[i] = pl->kv ? pl->slot[0] : 0;
        dd->l_start[i + 1] = r0 + w;
        decode_seq_cursor c;
        decode_seq_cursor_get(dd->slot[i], &c);
        dd->l_blk[i] = c.quota_len > 0 ? decode_seq_params(dd->slot[i])->block_length : 0;
        const int lo = c.blk_lo[c.block];
        for (int j = 0; j < B; j++) {   /* offsets past the block: any row of the sequence (unused) */
            int p = decode_seq_logit_row(dd->slot[i], lo + j < pl->wr ? lo + j : pl->wr - 1);
            dd->l_out[i * B + j] = r0 + (p < pl->wl ? 0 : p - pl->wl);
        }
    }
    *lay = (device_step_layout){.seq_start = dd->l_start, .tokens = dd->l_tok, .pos = dd->l_pos, .kv = dd->l_kv,
                                .out_rows = dd->l_out, .block_len = dd->any_bd ? dd->l_blk : NULL};
}

/* Counts a step enqueued at t0 whose forward ran `rows` canvas rows (ring slot, batch and total
 * steps); *cs: the device step's counters now. */
static void dev_enqueued(decode_device *dd, uint64_t t0, int rows, device_step_stats *cs) {
    dd->t_enq[dd->produced % DEVICE_RING] = t0;
    dd->st.fwd_rows += (uint64_t)rows;
    dd->produced++;
    dd->batch_steps++;
    dd->st.steps++;
    dd->st.steps_overlapped += device_step_pending(dd->cd) > 1;   /* the one before it still in flight */
    device_step_get_stats(dd->cd, cs);
}

/* One host-planned step of a KV-cached batch: plan, enqueue, wait, apply, record what the caches
 * hold now. */
static int dev_planned_step(decode_device *dd, const decode_sink *sink, um_err *err) {
    device_step_layout lay;
    dev_plan_layout(dd, &lay);
    const uint64_t t0 = time_now_ns();
    /* block-diffusion refreshes: the prefix's chunked prefill fills the slots first (forwards
     * without logits, not captured: a refresh happens once per sequence) */
    if (decode_seq_prefill(dd->ctx, dd->slot, dd->plan, dd->n_slot, err) != 0 ||
        device_step_enqueue_planned(dd->cd, &lay, dd->graphs, err) != 0) {
        dev_drop(dd);
        return -1;
    }
    device_step_stats cs;
    dev_enqueued(dd, t0, lay.seq_start[dd->n_slot], &cs);
    dd->st.graph_replays += cs.graph_launches - dd->seen_launch.graph_launches;
    dd->st.graph_captures += cs.captures - dd->seen_launch.captures;
    if (cs.captures > dd->seen_launch.captures)
        log_debug("device decode: graph captured for %d sequences (block %d, a KV-cached step shape)", dd->n_slot, dd->B);
    dd->st.graph_stale += cs.stale_graphs - dd->seen_launch.stale_graphs;
    dd->seen_launch = cs;
    CHECK(device_step_poll(dd->cd, 1) == 1);
    const int n = dd->n_slot;
    decode_seq **s = xmalloc((size_t)n * sizeof *s);
    memcpy(s, dd->slot, (size_t)n * sizeof *s);
    dev_apply_polled(dd, sink);
    for (int i = 0; i < n; i++) decode_seq_plan_ran(s[i], &dd->plan[i]);
    free(s);
    return 0;
}

static int same_set(const decode_device *dd, decode_seq **seqs, int n) {
    if (!dd->cd || n != dd->n_slot) return 0;
    for (int i = 0; i < n; i++)
        if (dd->slot[i] != seqs[i]) return 0;
    return 1;
}

/* Why the set changed (before the drain: slot[] is the previous batch). A cause counts once per
 * rebuild; a set change that leaves nothing to build counts nowhere. */
typedef struct set_change {
    int join, leave, cancel, ineligible;
} set_change;

static int in_set(decode_seq *const *v, int n, const decode_seq *s) {
    for (int i = 0; i < n; i++)
        if (v[i] == s) return 1;
    return 0;
}

static set_change classify_change(const decode_device *dd, decode_seq **seqs, int n) {
    set_change c = {0, 0, 0, 0};
    for (int i = 0; i < dd->n_slot; i++) {
        const decode_seq *s = dd->slot[i];
        if (!s) {
            if (dd->gone[i] == GONE_DONE_ON_DEVICE) c.leave = 1;
            else if (dd->gone[i] == GONE_FINISHED_BY_HOST) c.cancel = 1;
        } else if (!in_set(seqs, n, s)) {
            if (decode_seq_done(s)) c.cancel = 1;   /* finished by the host (cancel / error) */
            else c.ineligible = 1;                  /* moved to the host loop */
        }
    }
    for (int i = 0; i < n; i++)
        if (!decode_seq_done(seqs[i]) && !in_set(dd->slot, dd->n_slot, seqs[i])) c.join = 1;
    return c;
}

int decode_device_step(decode_device *dd, decode_seq **seqs, int n, const decode_sink *sink, um_err *err) {
    set_change why = {0, 0, 0, 0};
    if (!same_set(dd, seqs, n)) {
        why = classify_change(dd, seqs, n);
        /* the set changed: finish what is in flight, then start over from the host state */
        decode_device_drain(dd, sink);
        dev_drop(dd);
    }
    /* the drain may have finished some (their last step was pending) */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!decode_seq_done(seqs[i])) k++;
    if (k == 0) return 0;
    if (!dd->cd) {
        decode_seq **live = xmalloc((size_t)k * sizeof *live);
        k = 0;
        for (int i = 0; i < n; i++)
            if (!decode_seq_done(seqs[i])) live[k++] = seqs[i];
        int rc = dev_build(dd, live, k, err);
        free(live);
        if (rc != 0) return -1;
        dd->st.rebuild_join += (uint64_t)why.join;
        dd->st.rebuild_leave += (uint64_t)why.leave;
        dd->st.rebuild_cancel += (uint64_t)why.cancel;
        dd->st.rebuild_ineligible += (uint64_t)why.ineligible;
    }
    /* the forward seam's test hook (decode_forward_fault): the step fails as a failing enqueue below
     * would, its sequences' steps in flight counted as taken */
    if (decode_forward_fault(dd->slot, dd->n_slot, device_step_pending(dd->cd), err) != 0) {
        decode_device_drain(dd, sink);
        dev_drop(dd);
        return -1;
    }
    if (dd->planned) {
        int rc = dev_planned_step(dd, sink, err);
        if (rc == 0) {
            int live = 0;
            for (int i = 0; i < dd->n_slot; i++) live += dd->slot[i] != NULL;
            if (!live) dev_drop(dd);
        }
        return rc;
    }
    if (dd->graphs && dd->graph == 1 && !device_step_has_graph(dd->cd)) {
        /* the graph went stale (a buffer it used was freed) and the last step ran directly:
         * capture again on this step */
        dd->graph = 0;
    }
    if (dd->cd && dd->graphs && dd->graph == 0 && dd->batch_steps >= 1) {
        /* stable for a step: capture forward + sample + commit once, replay from now on. A capture
         * that fails leaves this batch on direct launches (a failing forward fails those too). */
        um_err cerr = {0};
        if (device_step_capture(dd->cd, &cerr) != 0) {
            log_warn("device decode: graph capture failed (%s); direct launches for this batch", cerr.msg);
            dd->graph = -1;
        } else {
            dd->graph = 1;
            dd->st.graph_captures++;
            log_debug("device decode: graph captured for %d sequences (block %d)", dd->n_slot, dd->B);
        }
    }
    uint64_t t0 = time_now_ns();
    if (device_step_enqueue(dd->cd, err) != 0) {
        /* the steps before this one ran: apply them; this one failed like a host forward */
        decode_device_drain(dd, sink);
        dev_drop(dd);
        return -1;
    }
    device_step_stats cs;
    dev_enqueued(dd, t0, device_step_batch(dd->cd)->seq_start[dd->n_slot], &cs);
    if (cs.graph_launches > dd->seen_launch.graph_launches) dd->st.graph_replays++;
    if (cs.stale_graphs > dd->seen_launch.stale_graphs) dd->st.graph_stale++;
    dd->seen_launch = cs;
    /* apply what is due, leaving DEVICE_DEPTH - 1 steps in flight: the GPU works on the newest
     * step while the host turns the previous one into events */
    while (device_step_pending(dd->cd) >= DEVICE_DEPTH) {
        CHECK(device_step_poll(dd->cd, 1) == 1);
        dev_apply_polled(dd, sink);
    }
    /* every sequence of the batch finished: let go of it now (an idle engine holds no GPU batch) */
    int live = 0;
    for (int i = 0; i < dd->n_slot; i++) live += dd->slot[i] != NULL;
    if (!live) dev_drop(dd);
    return 0;
}

void decode_device_reset(decode_device *dd) { dev_drop(dd); }
