/*
 * decode.h — the diffusion decode loop: canvas + block iteration, decoders, sampling, events.
 *
 * A decode_seq is one request's generation: canvas = prompt ++ MASK*gen_length, split into blocks;
 * each step one forward pass gives logits for the active block, the sequence's decoder commits some
 * masked positions, and the step's changes are reported as plain C events (decode_event) to a
 * sink. decode_step() advances ANY set of sequences by one step with ONE batched forward (CFG adds
 * each sequence's unconditional canvas to the same forward); sequences may join or leave between
 * steps, and a sequence's output never depends on its batch-mates (all randomness comes from the
 * counter-based rng keyed by (seed, step, position*vocab + token), util/rng.h). A step's outcome
 * is a record (decode_record) that decode_seq_apply() turns into state and events — the same
 * function for host steps and for the device-resident loop (decode/decode_device.h).
 *
 * Not here: queues, admission, cancellation policy, transports (sched/, server/, api/). Cancel =
 * the scheduler stops passing the sequence to decode_step (and may call decode_seq_finish() to
 * emit its final `done` event). The parameters' types, names and table: decode/params.h; JSON
 * encoding of events: decode/event_json.h.
 *
 * Threads: a decode_seq belongs to one thread at a time (the engine thread once scheduled).
 * decode_step() runs on the thread that owns the model_ctx; it keeps a per-thread scratch buffer
 * (logits), released by decode_thread_scratch_free(). Sinks are called synchronously on that
 * thread; every pointer inside an event is valid only during the callback.
 *
 * Full semantics (parameters, defaults, block layouts, decoders, event fields): docs/decode.md.
 */
#ifndef UM_DECODE_H
#define UM_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "decode/params.h"
#include "model/model.h"
#include "util/err.h"

/* ---------------------------------------------------------------- parameters */


/* Defaults for model m: decode_params_default() overridden by the checkpoint's
 * generation_config.json keys when present (temperature, top_k, top_p, steps, gen_length |
 * max_new_tokens, block_length, threshold, cfg_scale, decoder, cache, cache_refresh, prefix_look,
 * after_look, warmup_steps) and by the config (block-causal models: aligned layout with
 * block_length = the model's block size). Never fails (bad values are ignored and caught later by
 * validation; unknown decoder / cache names are ignored). */
decode_params decode_params_for_model(const model *m);
/* What a server starts every request from: decode_params_for_model(m) with the KV cache mode
 * `cache` (an enum decode_cache, the server's setting) — or, for DECODE_CACHE_AUTO, the mode the
 * checkpoint's generation_config.json names, else DECODE_CACHE_DUAL (serving is fast by default;
 * `unmask generate` and the reference comparisons keep `none`). */
#define DECODE_CACHE_AUTO (-1)
decode_params decode_params_for_serving(const model *m, int cache);
/* The ranges that need no model or prompt (every parameter's own range, in the parameter
 * table's order); the transports call it while parsing, decode_params_validate calls it first.
 * Errors as decode_params_validate's. */
int decode_params_check(const decode_params *p, um_err *err);
/* Check p for a prompt of n_prompt tokens on a model with config cfg. On failure: -1 and err with
 * code UM_ERR_INVALID_ARG, err->param = the parameter name, and a message naming the parameter,
 * the allowed range and the value, e.g. "steps must be between 4 and 128 (gen_length), got 2". */
int decode_params_validate(const decode_params *p, const model_config *cfg, int n_prompt, um_err *err);

/* 1 for decoders that may rewrite positions they already wrote (joint_threshold): their step
 * events carry revised commits, and text is final only per finished block. */
int         decode_decoder_edits(enum decode_decoder d);

/* The decode parameters the request set (src: the names it used) that p's decoder does not read
 * on a model with config cfg (the parameter table's decoders column, with the block-diffusion
 * rules of cfg + p's layout): their names as the request spelled them are appended to *names
 * (a JSON array, created when NULL), in table order. */
void        decode_params_unused(const decode_params *p, const decode_params_src *src, const model_config *cfg,
                                 json_t **names);
/* {"<decoder>": ["<parameter>", ...], ...}: for every decoder, the canonical names (those of
 * decode_params_to_json) of the parameters it reads on a model with config cfg when requests start
 * from defaults (their layout decides the block-diffusion rules). New reference. */
json_t     *decode_decoder_fields(const decode_params *defaults, const model_config *cfg);

/* ---------------------------------------------------------------- events */

enum decode_event_type {
    DECODE_EVENT_STEP,      /* one denoising step of one sequence */
    DECODE_EVENT_BLOCK,     /* a finalized block: its text never changes afterwards */
    DECODE_EVENT_DONE,      /* the sequence finished; always its last event */
};

enum decode_finish {
    DECODE_FINISH_NONE,      /* not finished */
    DECODE_FINISH_STOP,      /* an EOS/EOT was generated */
    DECODE_FINISH_LENGTH,    /* every block decoded without EOS/EOT */
    DECODE_FINISH_CANCELLED, /* decode_seq_finish(.., DECODE_FINISH_CANCELLED, ..) */
    DECODE_FINISH_ERROR,     /* decode_seq_finish(.., DECODE_FINISH_ERROR, ..) */
};
const char *decode_finish_name(enum decode_finish f); /* "stop" | "length" | "cancelled" | "error" */

/* A position committed (unmasked) in this step. */
typedef struct decode_commit {
    int32_t     pos;         /* absolute canvas position */
    int32_t     index;       /* pos - n_prompt: index into the generated region [0, gen_length) */
    int32_t     token;       /* token id */
    float       confidence;  /* softmax(noise-free logits)[token] (after CFG / eos flags) */
    int         special;     /* 1: EOS/EOT or a special added token (piece is its vocabulary
                                string, e.g. "<|eot_id|>"); text never contains it */
    const char *piece;       /* the token's text as valid UTF-8: raw token bytes with incomplete
                                UTF-8 replaced by U+FFFD; "" when the model has no tokenizer or the
                                position lies after an EOS/EOT already committed */
    int         revised;     /* 1: the position was already written in this block and is rewritten
                                (editing decoders, decode_decoder_edits) */
    int32_t     previous;    /* revised: the token it replaces */
} decode_commit;

/* The model's current guess for a still-masked position of the active block. */
typedef struct decode_draft {
    int32_t     pos, index;  /* as in decode_commit */
    int32_t     token;       /* x0 sampled this step (argmax at temperature 0) */
    float       confidence;  /* softmax(noise-free logits)[token] */
    int         special;
    const char *piece;       /* as in decode_commit */
} decode_draft;

typedef struct decode_usage {
    int prompt_tokens;       /* n_prompt */
    int completion_tokens;   /* generated tokens before the first EOS/EOT (all of them on length) */
    int steps;               /* forward passes this sequence took part in (CFG counts once) */
    int committed;           /* generated positions unmasked, EOS padding included */
} decode_usage;

typedef struct decode_timings {
    double first_event_ms;   /* creation -> first event delivered */
    double total_ms;         /* creation -> done */
    double decode_ms;        /* first step start -> done */
    double tokens_per_s;     /* completion_tokens / decode_ms (0 when decode_ms == 0) */
} decode_timings;

typedef struct decode_seq decode_seq;

typedef struct decode_event {
    enum decode_event_type type;
    decode_seq *seq;
    void       *seq_user;    /* decode_seq_set_user() value */
    int         step;        /* STEP: this step's index (0-based); BLOCK/DONE: steps taken so far */
    int         block;       /* STEP: active block index; BLOCK: the finalized block; DONE: -1 */
    int         n_blocks;    /* blocks of the canvas (some may be skipped by an early stop) */
    /* STEP */
    int                  n_commits;
    const decode_commit *commits;     /* [n_commits], ascending pos */
    int                  n_drafts;    /* 0 unless drafts are streamed this step */
    const decode_draft  *drafts;      /* [n_drafts], ascending pos */
    int                  masks_left;       /* masked positions left in the whole generated region */
    int                  block_masks_left; /* masked positions left in the active block */
    /* BLOCK: text appended by this block (UTF-8, never changes, nothing after EOS/EOT; a character
     * split across blocks is carried into the next block). The concatenation of every block's
     * text equals DONE's text. DONE: the full generated text. */
    const char  *text;
    size_t       text_len;
    int          block_start, block_end;   /* BLOCK: generated-region indices [start, end) */
    int          block_steps;              /* BLOCK: steps this block took (`step` counts all so far) */
    /* DONE */
    enum decode_finish finish;
    int          time_limited;    /* DONE: 1 when the sequence's deadline (decode_seq_set_deadline,
                                     decode_params.time_limit_ms) ended it: the block in progress was
                                     finished in one last step, later blocks were not decoded; finish
                                     is then STOP (an EOS/EOT was committed) or LENGTH */
    const char  *error;           /* DONE with DECODE_FINISH_ERROR: the message, else NULL */
    decode_usage   usage;          /* DONE (partial values are also filled on STEP/BLOCK) */
    decode_timings timings;        /* DONE */
} decode_event;

typedef void (*decode_sink_fn)(void *user, const decode_event *ev);
typedef struct decode_sink {
    decode_sink_fn fn;       /* may be NULL: events are dropped */
    void          *user;
} decode_sink;

/* ---------------------------------------------------------------- sequences */

/* Validates p (decode_params_validate) and the prompt (ids in the vocabulary, no mask token), then
 * builds the canvas. m must outlive the sequence. prompt is copied. */
decode_seq *decode_seq_create(const model *m, const decode_params *p, const int32_t *prompt, int n_prompt,
                              um_err *err);
/* Native infilling: canvas = prompt ++ MASK*gen_length ++ suffix. The suffix is fixed context (like
 * the prompt, and masked too in CFG's unconditional canvas); blocks, events, text and usage cover
 * the generated middle only. Needs a bidirectional model (block-causal ones: UM_ERR_UNSUPPORTED);
 * n_prompt + gen_length + n_suffix must fit the context (else UM_ERR_INVALID_ARG on gen_length).
 * n_suffix = 0 is decode_seq_create(). */
decode_seq *decode_seq_create_infill(const model *m, const decode_params *p, const int32_t *prompt, int n_prompt,
                                     const int32_t *suffix, int n_suffix, um_err *err);
void decode_seq_free(decode_seq *s);

/* 1 once the DONE event was emitted (by decode_step or decode_seq_finish). */
int  decode_seq_done(const decode_seq *s);
enum decode_finish decode_seq_finish_reason(const decode_seq *s);
void  decode_seq_set_user(decode_seq *s, void *user);
void *decode_seq_user(const decode_seq *s);
const decode_params *decode_seq_params(const decode_seq *s);
/* The current canvas (prompt ++ generated region ++ infill suffix, MASK where not yet committed). */
const int32_t *decode_seq_canvas(const decode_seq *s, int *len);
/* The canvas row whose model output scores position pos: pos, or pos - 1 for pos > 0 on a
 * shifted-logit model (Dream) or with hierarchy_block's token shift. Every reader of logits by
 * position goes through this rule. */
int decode_seq_logit_row(const decode_seq *s, int pos);
/* 1 when the sequence's logits are shifted (decode_seq_logit_row reads row pos - 1): a shifted-logit
 * model (Dream) or hierarchy_block's token shift. */
int decode_seq_logit_shift(const decode_seq *s);
/* Tokens this sequence adds to the next batched forward (canvas length, doubled with CFG): for a
 * scheduler's token budget. 0 when done. */
int  decode_seq_forward_tokens(const decode_seq *s);
/* The most tokens any forward of this sequence will add, over its whole generation (the next
 * step's count can be smaller: a block-diffusion step without a cache grows block by block): for
 * sizing a device up front. */
int  decode_seq_max_forward_tokens(const decode_seq *s);
/* KV cache positions the sequence holds while it runs with a cache (its canvas length, doubled
 * with CFG); 0 without a cache. For memory sizing. */
int  decode_seq_kv_rows(const decode_seq *s);
/* Steps taken so far / blocks finished so far. */
int  decode_seq_steps(const decode_seq *s);
int  decode_seq_blocks_done(const decode_seq *s);

/* The sequence's deadline, a time_now_ns() value (0 = none). By default it is the start of its first
 * step + decode_params.time_limit_ms (none while that is 0 or before the first step); set_deadline
 * overrides it (t_ns 0: back to that default). Once a step boundary finds the deadline passed
 * (decode_step), the sequence takes its last step: every still-masked position of the active
 * block is committed at the step's sampled token x0 (the argmax at temperature 0) instead of the
 * decoder's choice, the block is finished and DONE follows (time_limited = 1; finish STOP when an
 * EOS/EOT was committed, else LENGTH). A boundary with no block in progress (none of its steps
 * taken yet) ends the sequence there without a step. The other sequences of the batch are not
 * affected. Only decode_step applies it: a step engine that cannot (the device loop) hands an
 * expired sequence to decode_step (the scheduler does). */
void     decode_seq_set_deadline(decode_seq *s, uint64_t t_ns);
uint64_t decode_seq_deadline(const decode_seq *s);
/* 1 when s is not done and its deadline has passed at now_ns (its next step is its last). */
int      decode_seq_expired(const decode_seq *s, uint64_t now_ns);

/* Finish a sequence that will not be stepped again: emits DONE with reason (CANCELLED or ERROR;
 * error = message or NULL) carrying the text of the blocks finalized so far. No-op when already
 * done. */
void decode_seq_finish(decode_seq *s, enum decode_finish reason, const char *error, const decode_sink *sink);

/* ---------------------------------------------------------------- stepping */

/* One denoising step for every not-done sequence in seqs[0..n) (done ones are skipped): ONE
 * batched model_forward, then per sequence: sampling, its decoder's commits, and its events (STEP,
 * then BLOCK when the block completed, then DONE when finished) delivered to sink in seqs order.
 * A sequence whose deadline has passed takes its last step (decode_seq_set_deadline), or ends
 * before the forward when no block of it is in progress.
 * Every sequence must have been created for ctx->m.
 * Returns 0, or -1 with err when the forward failed (no sequence changed state; the caller
 * typically finishes them with DECODE_FINISH_ERROR). The test hook FAULT_FORWARD_FAIL fails it
 * here, before its forward (decode_forward_fault). */
int decode_step(model_ctx *ctx, decode_seq **seqs, int n, const decode_sink *sink, um_err *err);
/* The forward seam's test hook, FAULT_FORWARD_FAIL (util/fault.h; UNMASK_FAULT_FORWARD_FAIL): 0, or
 * -1 + err (UM_ERR_INTERNAL, "forward pass failed (injected by UNMASK_FAULT_FORWARD_FAIL, seed S)")
 * when a rule says the batched forward over seqs[0..n) fails (NULL and done entries skipped).
 * ahead: steps each sequence has taken beyond decode_seq_steps() (the device loop's steps still in
 * flight; 0 on the host). decode_step and decode_device_step ask it where their forward would fail
 * and fail the same way; nothing else changes when the hook is on. */
int decode_forward_fault(decode_seq *const *seqs, int n, int ahead, um_err *err);

/* ---------------------------------------------------------------- step records
 *
 * A step's outcome for one sequence, however it was computed (decode_step on the host: forward,
 * sampling, the decoder's choose(); or the device-resident loop, decode/decode_device.h: the same
 * on the GPU). decode_seq_apply() is the ONE function that turns it into state and events: it
 * writes the commits into the canvas, advances the step / block counters, tracks EOS/EOT, emits
 * STEP (commits; drafts = the rows still masked afterwards, when drafts are due this step), then
 * BLOCK when no mask is left in the block (its text) and DONE when the sequence finished (stop on
 * EOS/EOT at the end of its block, or length). */
typedef struct decode_record {
    int            step;         /* the step it records: must equal decode_seq_steps(s) */
    uint64_t       t_step_ns;    /* time_now_ns() when the step started (first step's decode_ms);
                                    0 = now */
    int            n_commits;    /* writes, <= the block length */
    const int32_t *commit_pos;   /* [n_commits] absolute positions inside the active block, ascending */
    const int32_t *commit_tok;   /* [n_commits] token ids */
    const float   *commit_conf;  /* [n_commits] confidence reported in the STEP event */
    int            n_rows;       /* positions sampled this step (<= the block length), ascending */
    const int32_t *row_pos;      /* [n_rows] absolute positions in the active block */
    const int32_t *row_tok;      /* [n_rows] x0 sampled there */
    const float   *row_conf;     /* [n_rows] its confidence */
} decode_record;

/* Apply r to s (not done; r->step == its step count; positions inside its active block — a
 * mismatch is a caller bug and aborts) and deliver the events to sink. */
void decode_seq_apply(decode_seq *s, const decode_record *r, const decode_sink *sink);

/* Where a sequence stands, for a step engine that continues it elsewhere (the device loop). The
 * pointers alias the sequence and stay valid while it lives. */
typedef struct decode_seq_cursor {
    int            n_blocks;
    int            block;            /* the active block (== n_blocks once every block finished) */
    const int32_t *blk_lo, *blk_hi;  /* [n_blocks] absolute bounds of each block */
    const int32_t *blk_steps;        /* [n_blocks] fixed-step decoders' step budget per block, else 0s */
    int            gen_end;          /* n_prompt + gen_length: the generated region ends here */
    int            blocks_end;       /* the last block ends here: gen_end, or under the block-diffusion
                                        rules (LLaDA2) the canvas padded to whole blocks, whose positions
                                        past gen_end are decoded but never reported */
    int            quota_len;        /* block-diffusion rules: fixed-step quotas (and LLaDA2's threshold
                                        rule) come from this block length; 0 = the ordinary rules */
    int            n_suffix;         /* infill suffix tokens after gen_end */
    int            step;             /* steps taken (the rng stream of the next step) */
    int            step_in_block;    /* steps taken in the active block */
    int            block_m0;         /* masks of the active block when it began; -1: not begun yet
                                        (its first step counts them) */
} decode_seq_cursor;
void decode_seq_cursor_get(const decode_seq *s, decode_seq_cursor *c);

/* What a sequence's next step runs (docs/decode.md "KV caches"), for a step engine (decode_step,
 * the device loop): rows [wl, wr) of its canvas at positions wl..wr-1 (the whole canvas without a
 * cache, on a refresh and during warmup), with its KV slots (fwd_batch.kv; slot[1]: the CFG
 * canvas's) when kv. decode_seq_plan opens the slots on ctx at the first step that needs them (a
 * sequence moved to another ctx starts over there with a refresh). decode_seq_plan_ran records
 * that the step's forward ran (the cache's block and age), after the forward and whatever the
 * step's record did to the sequence. */
typedef struct decode_step_plan {
    int wl, wr;      /* canvas rows that go through the forward */
    int kv;          /* 1: with the slots (refresh: fills them; window: reads them) */
    int refresh;     /* 1: the whole canvas, filling the cache (block-diffusion rules: rows
                        [prefill, wr), after the prefill below) */
    int block;       /* the active block when planned */
    int slot[2];     /* model_kv slots (conditional, CFG-unconditional), 0 = none */
    int prefill;     /* block-diffusion refresh: rows [0, prefill) (whole blocks) are first run
                        through forwards of at most prefill_chunk rows that only fill the cache
                        (decode_step does it; 0 = none); wl is prefill, or prefill - 1 with
                        shifted logits */
} decode_step_plan;
decode_step_plan decode_seq_plan(decode_seq *s, model_ctx *ctx);
void             decode_seq_plan_ran(decode_seq *s, const decode_step_plan *pl);
/* The block-diffusion prefill of the sequences whose plan (plan[i], from decode_seq_plan) has one:
 * rows [0, prefill) through forwards of at most prefill_chunk rows that only fill their KV slots,
 * before the step's own forward (decode_step, and the device loop's planned steps). Done sequences
 * are skipped. 0, or -1 + err when a forward failed. */
int              decode_seq_prefill(model_ctx *ctx, decode_seq **seqs, const decode_step_plan *plan, int n, um_err *err);

/* Loop decode_step() on one sequence until it is done. */
int decode_generate(model_ctx *ctx, decode_seq *s, const decode_sink *sink, um_err *err);

/* Release the calling thread's decode_step scratch (call when an engine thread exits). */
void decode_thread_scratch_free(void);

#endif /* UM_DECODE_H */
