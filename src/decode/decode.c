/*
 * decode.c — decode parameters, sequences (canvas + blocks + text), and the batched step loop
 * (decode.h). Not here: the decoders' commit rules (decoders.c), per-row sampling (sample.c), JSON
 * (event_json.c). Threads: decode_params_* any thread; a sequence and decode_step() on the engine
 * thread that owns the model_ctx (the sampling row loop fans out over the backend's host threads).
 */
#include "decode/decode.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/decoder.h"
#include "decode/params.h"
#include "decode/sample.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "util/fault.h"
#include "util/fileio.h"
#include "util/log.h"
#include "util/strbuf.h"
#include "util/timeutil.h"

/* ================================================================ parameters */

/* decode_params_for_model; *cache_set = 1 when generation_config.json names a cache mode. */
static decode_params params_for_model(const model *m, int *cache_set) {
    decode_params p = decode_params_default();
    *cache_set = 0;
    if (m->cfg.block_causal > 0) {
        p.layout = DECODE_LAYOUT_ALIGNED;
        p.block_length = m->cfg.block_causal;
    }
    /* Dream denoises the whole generation at once (no blocks): an unset block_length settles to
     * gen_length (decode_params_settle) */
    if (m->cfg.arch == MODEL_ARCH_DREAM) p.block_length = m->cfg.max_seq;
    decode_params_apply_generation(&p, m->gen_config, cache_set);
    /* a step count meant for a longer default generation (Dream: steps 512) would make every
     * request that only sets gen_length invalid: fall back to auto */
    if (p.steps > p.gen_length) p.steps = 0;
    return p;
}

decode_params decode_params_for_model(const model *m) {
    int cache_set;
    return params_for_model(m, &cache_set);
}

decode_params decode_params_for_serving(const model *m, int cache) {
    int cache_set;
    decode_params p = params_for_model(m, &cache_set);
    if (cache >= 0 && cache < DECODE_CACHE_COUNT_) p.cache = (enum decode_cache)cache;
    else if (!cache_set) p.cache = DECODE_CACHE_DUAL;
    return p;
}

int decode_decoder_edits(enum decode_decoder d) { return d == DECODER_JOINT_THRESHOLD; }


const char *decode_finish_name(enum decode_finish f) {
    switch (f) {
    case DECODE_FINISH_NONE: return "none";
    case DECODE_FINISH_STOP: return "stop";
    case DECODE_FINISH_LENGTH: return "length";
    case DECODE_FINISH_CANCELLED: return "cancelled";
    case DECODE_FINISH_ERROR: return "error";
    }
    return "unknown";
}

/* Block-diffusion rules (docs/decode.md "LLaDA2"): a block-causal model decoding aligned blocks. */
static int params_bd(const decode_params *p, const model_config *cfg) {
    return cfg && cfg->block_causal > 0 && p->layout == DECODE_LAYOUT_ALIGNED;
}

/* Where decoding ends: n_prompt + G, or — block-diffusion rules — the end of the block holding the
 * last generated position (the reference pads the canvas with masks to whole blocks), at most ctx. */
static int decode_end(const decode_params *p, const model_config *cfg, int n_prompt) {
    int end = n_prompt + p->gen_length;
    if (params_bd(p, cfg) && p->block_length > 0) {
        long long e = ((long long)end + p->block_length - 1) / p->block_length * p->block_length;
        end = e < cfg->max_seq ? (int)e : cfg->max_seq;
    }
    return end;
}

/* 1 when the decoder runs a step budget per block (fixed-step decoders; the threshold decoder under
 * the block-diffusion rules, whose quota comes from it). */
static int uses_steps(const decode_params *p, const model_config *cfg) {
    if ((int)p->decoder < 0 || p->decoder >= DECODER_COUNT_) return 0;
    return (decoder_get(p->decoder)->flags & DECODER_F_FIXED_STEPS) ||
           (p->decoder == DECODER_THRESHOLD && params_bd(p, cfg));
}

void decode_params_unused(const decode_params *p, const decode_params_src *src, const model_config *cfg,
                          json_t **names) {
    int bd = params_bd(p, cfg);
    for (int i = 0; i < decode_param_count(); i++) {
        if (!src->name[i] || decode_param_read_by(i, p->decoder, bd)) continue;
        if (!*names) *names = json_array();
        json_array_append_new(*names, json_string(src->name[i]));
    }
}

json_t *decode_decoder_fields(const decode_params *defaults, const model_config *cfg) {
    int bd = params_bd(defaults, cfg);
    json_t *o = json_object();
    for (int d = 0; d < DECODER_COUNT_; d++) {
        json_t *a = json_array();
        for (int i = 0; i < decode_param_count(); i++) {
            if (!decode_param_read_by(i, (enum decode_decoder)d, bd)) continue;
            decode_param_desc desc;
            decode_param_at(i, &desc);
            json_array_append_new(a, json_string(desc.name));
        }
        json_object_set_new(o, decode_decoder_name((enum decode_decoder)d), a);
    }
    return o;
}

/* Block bounds of the decoded region [n_prompt, end) for layout p. Returns the block count; lo/hi
 * (may be NULL) receive absolute bounds. */
static int layout_blocks(const decode_params *p, int n_prompt, int end, int32_t *lo, int32_t *hi) {
    int B = p->block_length;
    int first = p->layout == DECODE_LAYOUT_ALIGNED ? (n_prompt / B) * B : n_prompt;
    int nb = 0;
    for (int a = first; a < end; a += B, nb++) {
        if (lo) lo[nb] = a < n_prompt ? n_prompt : a;
        if (hi) hi[nb] = a + B < end ? a + B : end;
    }
    return nb;
}

/* The KV-cache fields that depend on the model (every range is checked whatever the mode, like the
 * decoder fields; the others are the table's rows). */
static int decode_cache_validate(const decode_params *p, int ctx, um_err *err) {
    if ((int)p->cache < 0 || p->cache >= DECODE_CACHE_COUNT_)
        return um_err_param(err, "cache", "cache must be none, prefix, dual or vicinity");
    if (p->prefix_look < 0 || p->prefix_look > ctx)
        return um_err_param(err, "prefix_look", "prefix_look must be between 0 and %d (the model's maximum sequence length), got %d", ctx,
                            p->prefix_look);
    if (p->after_look < 0 || p->after_look > ctx)
        return um_err_param(err, "after_look", "after_look must be between 0 and %d (the model's maximum sequence length), got %d", ctx,
                            p->after_look);
    return 0;
}

/* The sizes: gen_length, block_length, steps. Without cfg (the model-free check) only the lower
 * bounds; with it the whole range for a prompt of n_prompt tokens (n_prompt < the context). */
static int check_sizes(const decode_params *p, const model_config *cfg, int n_prompt, um_err *err) {
    int ctx = cfg ? cfg->max_seq : 0, gmax = ctx - n_prompt;
    if (!cfg && p->gen_length < 1) return um_err_param(err, "gen_length", "gen_length must be >= 1, got %d", p->gen_length);
    if (cfg && (p->gen_length < 1 || p->gen_length > gmax))
        return um_err_param(err, "gen_length",
                            "gen_length must be between 1 and %d (context %d minus %d prompt tokens), got %d", gmax,
                            ctx, n_prompt, p->gen_length);
    if (!cfg && p->block_length < 1)
        return um_err_param(err, "block_length", "block_length must be >= 1, got %d", p->block_length);
    if (cfg && p->layout == DECODE_LAYOUT_LLADA && (p->block_length < 1 || p->block_length > p->gen_length))
        return um_err_param(err, "block_length", "block_length must be between 1 and %d (gen_length), got %d",
                            p->gen_length, p->block_length);
    if (cfg && p->layout == DECODE_LAYOUT_ALIGNED && (p->block_length < 1 || p->block_length > ctx))
        return um_err_param(err, "block_length", "block_length must be between 1 and %d (the model's context), got %d",
                            ctx, p->block_length);
    int fixed = uses_steps(p, cfg);
    if (cfg && fixed && (int)p->layout >= 0 && p->layout < DECODE_LAYOUT_COUNT_) {
        int nb = layout_blocks(p, n_prompt, n_prompt + p->gen_length, NULL, NULL);
        if (p->steps != 0 && (p->steps < nb || p->steps > p->gen_length))
            return um_err_param(err, "steps",
                                "steps must be between %d (one per block: gen_length %d / block_length %d) and "
                                "%d (gen_length), or 0 for auto; got %d",
                                nb, p->gen_length, p->block_length, p->gen_length, p->steps);
    } else if (p->steps < 0) {
        return um_err_param(err, "steps", "steps must be >= 0 (0 = auto), got %d", p->steps);
    }
    return 0;
}

/* The layout, the sizes, the decoder, the table's own ranges (params.c), then the ranges that
 * depend on the model; the first bad one is reported. cfg NULL: the model-free part. */
static int check_ranges(const decode_params *p, const model_config *cfg, int n_prompt, um_err *err) {
    if ((int)p->layout < 0 || p->layout >= DECODE_LAYOUT_COUNT_)
        return um_err_param(err, "block_layout", "block_layout must be llada or aligned");
    if (check_sizes(p, cfg, n_prompt, err) != 0) return -1;
    if ((int)p->decoder < 0 || p->decoder >= DECODER_COUNT_) {
        char names[256];
        decode_decoder_list(names, sizeof names, ", ", " or ");
        return um_err_param(err, "decoder", "decoder must be %s", names);
    }
    if (decode_params_check_rows(p, err) != 0) return -1;
    if (!cfg && p->sub_block_length < 1)
        return um_err_param(err, "sub_block_length", "sub_block_length must be >= 1, got %d", p->sub_block_length);
    if (cfg && (p->sub_block_length < 1 || p->sub_block_length > cfg->max_seq))
        return um_err_param(err, "sub_block_length",
                            "sub_block_length must be between 1 and %d (the model's maximum sequence length), got %d",
                            cfg->max_seq, p->sub_block_length);
    if (cfg && (p->top_k < 0 || p->top_k > cfg->n_embd_rows))
        return um_err_param(err, "top_k", "top_k must be between 0 (off) and %d (the vocabulary), got %d",
                            cfg->n_embd_rows, p->top_k);
    if (p->top_k < 0) return um_err_param(err, "top_k", "top_k must be >= 0 (0 = off), got %d", p->top_k);
    return 0;
}

int decode_params_check(const decode_params *p, um_err *err) { return check_ranges(p, NULL, 0, err); }

int decode_params_validate(const decode_params *p, const model_config *cfg, int n_prompt, um_err *err) {
    int ctx = cfg->max_seq;
    if (n_prompt < 0) return um_err_param(err, "prompt", "prompt length must be >= 0, got %d", n_prompt);
    if (cfg->block_causal > 0 && p->layout != DECODE_LAYOUT_ALIGNED)
        return um_err_param(err, "block_layout",
                            "block_layout must be aligned for this block-causal model (its attention blocks start at "
                            "position 0)");
    if (n_prompt >= ctx)
        return um_err_param(err, "prompt",
                            "prompt has %d tokens but the model's context is %d tokens (at least 1 position "
                            "must remain for generation)",
                            n_prompt, ctx);
    if (check_ranges(p, cfg, n_prompt, err) != 0) return -1;
    if (p->logits_eos_inf && cfg->eos_id < 0)
        return um_err_param(err, "logits_eos_inf", "logits_eos_inf needs an eos_token_id, and the model has none");
    if (p->confidence_eos_eot_inf && cfg->eot_id < 0)
        return um_err_param(err, "confidence_eos_eot_inf",
                            "confidence_eos_eot_inf needs an <|eot_id|> token, and the model has none");
    return decode_cache_validate(p, ctx, err);
}

/* ================================================================ sequences */

/* Append a NUL-terminated copy of s[0..n) to the strings of one event; returns its offset. */
static size_t arena_put(strbuf *a, const char *s, size_t n) {
    size_t off = a->n;
    strbuf_put(a, s, n);
    strbuf_putc(a, 0);
    return off;
}

/* Append bytes as valid UTF-8 (every maximal invalid subpart -> U+FFFD, as HF decode does).
 * Returns the arena offset. */
static size_t arena_put_utf8(strbuf *a, const uint8_t *s, size_t n) {
    size_t o = 0;
    char *tmp = utf8_sanitize((const char *)s, n, &o);
    size_t off = arena_put(a, tmp, o);
    free(tmp);
    return off;
}

struct decode_seq {
    const model        *m;
    decode_params       p;
    const decoder_ops  *dec;
    void               *dec_state;       /* dec->state_size bytes, owned */
    void               *user;

    int       n_prompt, L, G;
    int       bd;                         /* block-diffusion rules (block-causal model, aligned blocks):
                                             quota from the block length, canvas padded to whole blocks,
                                             forwards up to the active block's end, exact block KV */
    int       gen_end;                    /* n_prompt + G: events, text and usage end here; positions in
                                             [gen_end, L - n_suffix) are decoded but never reported */
    int       n_suffix;                   /* infill suffix tokens at the end of the canvas */
    int       shift;                      /* shifted logits: position p is scored by row p - 1 (the
                                             model's, Dream; or the decoder's token shift,
                                             hierarchy_block): decode_seq_logit_row */
    int32_t  *x;                          /* [L] canvas = prompt ++ generated (G) ++ suffix, owned */
    int       n_blocks;
    int32_t  *blk_lo, *blk_hi;            /* [n_blocks] absolute bounds of each block's masks */
    int32_t  *blk_steps;                  /* [n_blocks] fixed-step budget per block */
    int       cur;                        /* active block */
    int       block_begun;
    int       block_m0;                   /* masked positions of the active block when it began
                                             (valid once block_begun) */
    int       step;                       /* steps taken */
    int       step_in_block;
    int       masks_left;                 /* masked generated positions */
    int       eos_pos;                    /* smallest committed EOS/EOT position, or -1 */
    int       eos_id, eot_id, mask_id;

    /* per-step buffers, capacity = the largest block */
    int       cap;
    int32_t  *row_pos;
    uint8_t  *row_masked;
    int32_t  *x0;
    double   *conf;
    int32_t  *w_pos, *w_tok;
    float    *w_conf;                     /* [cap] confidence of each write (record of a host step) */
    float    *row_conf;                   /* [cap] conf as float (record rows of a host step) */
    decode_commit *commits;
    decode_draft  *drafts;
    size_t        *piece_off;             /* [2*cap] offsets into strs (commits, then drafts) */
    strbuf         strs;                  /* the NUL-terminated piece strings of one event, owned */

    /* text */
    int        has_tok;
    tok_stream ts;
    strbuf     text;                      /* accumulated final text (NUL-terminated, never NULL), owned */
    int        text_stopped;              /* first EOS/EOT reached in finalized blocks */
    int        completion_tokens;
    int        saw_eos;                   /* an EOS/EOT was finalized in the generated region */

    /* KV cache (p.cache != NONE): slots on the ctx of the engine that steps the sequence */
    model_ctx *kv_ctx;                    /* where kv_slot are open; NULL: none open */
    int        kv_slot[2];                /* conditional / CFG-unconditional canvas (model_kv_open), 0 = none */
    int        kv_block;                  /* block the cache was filled in; -1: no usable cache */
    int        kv_age;                    /* steps taken since (and including) the last refresh */

    /* time limit (decode_seq_set_deadline) */
    uint64_t   deadline_ns;               /* set explicitly (time_now_ns() value), 0 = the default:
                                             t_first_step + p.time_limit_ms */
    int        last_step;                 /* 1: the deadline passed; the step in progress commits the
                                             rest of the active block and ends the sequence */

    enum decode_finish finish;
    int        done;
    uint64_t   t_create, t_first_step, t_first_event, t_done;
};

static int is_eos(const decode_seq *s, int tok) {
    return tok >= 0 && (tok == s->eos_id || tok == s->eot_id);
}

/* Steps per block for the fixed-step decoders: S spread over blocks in proportion to their masked
 * positions (largest remainder, ties to the earlier block), each in [1, masks]. With equal blocks
 * and S divisible by the block count this is exactly S / n_blocks per block, as the reference. */
static void plan_steps(decode_seq *s) {
    int nb = s->n_blocks, G = 0, sum = 0;
    if (s->p.steps_per_block > 0) {   /* the same budget for every block (at most its masks, or — the
                                         block-diffusion rules — at most gen_length, as the reference) */
        for (int b = 0; b < nb; b++) {
            int m = s->blk_hi[b] - s->blk_lo[b], cap = s->bd ? s->G : m;
            s->blk_steps[b] = s->p.steps_per_block < cap ? s->p.steps_per_block : cap;
        }
        return;
    }
    for (int b = 0; b < nb; b++) G += s->blk_hi[b] - s->blk_lo[b];
    int S = s->p.steps > 0 ? s->p.steps : s->G;
    long long *rem = xmalloc((size_t)nb * sizeof *rem);
    for (int b = 0; b < nb; b++) {
        long long m = s->blk_hi[b] - s->blk_lo[b];
        s->blk_steps[b] = (int32_t)((long long)S * m / G);
        rem[b] = (long long)S * m % G;
        sum += s->blk_steps[b];
    }
    while (sum < S) {
        int best = -1;
        for (int b = 0; b < nb; b++)
            if (s->blk_steps[b] < s->blk_hi[b] - s->blk_lo[b] && (best < 0 || rem[b] > rem[best])) best = b;
        CHECK(best >= 0);
        s->blk_steps[best]++;
        rem[best] = -1;
        sum++;
    }
    for (int b = 0; b < nb; b++) {
        while (s->blk_steps[b] < 1) {
            int big = 0;
            for (int c = 1; c < nb; c++)
                if (s->blk_steps[c] > s->blk_steps[big]) big = c;
            CHECK(s->blk_steps[big] > 1);
            s->blk_steps[big]--;
            s->blk_steps[b]++;
        }
    }
    free(rem);
}

decode_seq *decode_seq_create(const model *m, const decode_params *p, const int32_t *prompt, int n_prompt,
                              um_err *err) {
    return decode_seq_create_infill(m, p, prompt, n_prompt, NULL, 0, err);
}

/* Ids usable as fixed context: inside the vocabulary and not the mask token. */
static int check_context_ids(const model_config *cfg, const char *what, const int32_t *ids, int n, um_err *err) {
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= cfg->n_embd_rows)
            return um_err_param(err, what, "%s token %d at index %d is outside the vocabulary [0, %d)", what, ids[i],
                                i, cfg->n_embd_rows);
        if (ids[i] == cfg->mask_id)
            return um_err_param(err, what, "%s token at index %d is the mask token (%d), which %ss may not contain",
                                what, i, cfg->mask_id, what);
    }
    return 0;
}

decode_seq *decode_seq_create_infill(const model *m, const decode_params *p, const int32_t *prompt, int n_prompt,
                                     const int32_t *suffix, int n_suffix, um_err *err) {
    const model_config *cfg = &m->cfg;
    if (decode_params_validate(p, cfg, n_prompt, err) != 0) return NULL;
    if (n_suffix < 0) n_suffix = 0;
    if (n_suffix > 0) {
        if (cfg->block_causal > 0) {
            um_err_set(err, UM_ERR_UNSUPPORTED,
                       "infilling (a suffix after the generated region) needs a bidirectional model; this model "
                       "attends block-causally (block size %d)",
                       cfg->block_causal);
            return NULL;
        }
        if ((long long)n_prompt + p->gen_length + n_suffix > cfg->max_seq) {
            int gmax = cfg->max_seq - n_prompt - n_suffix;
            um_err_param(err, "gen_length",
                         "gen_length must be between 1 and %d (context %d minus %d prompt and %d suffix tokens), got %d",
                         gmax > 0 ? gmax : 0, cfg->max_seq, n_prompt, n_suffix, p->gen_length);
            return NULL;
        }
        if (check_context_ids(cfg, "suffix", suffix, n_suffix, err)) return NULL;
    }
    if (cfg->mask_id < 0) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "the model has no mask token id; it cannot run diffusion decoding");
        return NULL;
    }
    if (check_context_ids(cfg, "prompt", prompt, n_prompt, err)) return NULL;
    decode_seq *s = xcalloc(1, sizeof *s);
    s->t_create = time_now_ns();
    s->m = m;
    s->p = *p;
    s->dec = decoder_get(p->decoder);
    s->dec_state = s->dec->state_size ? xcalloc(1, s->dec->state_size) : NULL;
    s->n_prompt = n_prompt;
    s->G = p->gen_length;
    s->n_suffix = n_suffix;
    s->bd = params_bd(p, cfg);
    s->shift = cfg->logits_shifted || (p->decoder == DECODER_HIERARCHY_BLOCK && p->token_shift);
    s->gen_end = n_prompt + p->gen_length;
    const int dec_end = decode_end(p, cfg, n_prompt);
    s->L = dec_end + n_suffix;
    s->mask_id = cfg->mask_id;
    s->eos_id = cfg->eos_id;
    s->eot_id = cfg->eot_id;
    s->x = xmalloc((size_t)s->L * sizeof *s->x);
    if (n_prompt) memcpy(s->x, prompt, (size_t)n_prompt * sizeof *s->x);
    for (int i = n_prompt; i < dec_end; i++) s->x[i] = cfg->mask_id;
    if (n_suffix) memcpy(s->x + dec_end, suffix, (size_t)n_suffix * sizeof *s->x);
    s->n_blocks = layout_blocks(p, n_prompt, dec_end, NULL, NULL);
    s->blk_lo = xmalloc((size_t)s->n_blocks * sizeof *s->blk_lo);
    s->blk_hi = xmalloc((size_t)s->n_blocks * sizeof *s->blk_hi);
    s->blk_steps = xcalloc((size_t)s->n_blocks, sizeof *s->blk_steps);
    layout_blocks(p, n_prompt, dec_end, s->blk_lo, s->blk_hi);
    if (uses_steps(p, cfg)) plan_steps(s);
    s->cap = 1;
    for (int b = 0; b < s->n_blocks; b++)
        if (s->blk_hi[b] - s->blk_lo[b] > s->cap) s->cap = s->blk_hi[b] - s->blk_lo[b];
    size_t c = (size_t)s->cap;
    s->row_pos = xmalloc(c * sizeof *s->row_pos);
    s->row_masked = xmalloc(c);
    s->x0 = xmalloc(c * sizeof *s->x0);
    s->conf = xmalloc(c * sizeof *s->conf);
    s->w_pos = xmalloc(c * sizeof *s->w_pos);
    s->w_tok = xmalloc(c * sizeof *s->w_tok);
    s->w_conf = xmalloc(c * sizeof *s->w_conf);
    s->row_conf = xmalloc(c * sizeof *s->row_conf);
    s->commits = xmalloc(c * sizeof *s->commits);
    s->drafts = xmalloc(c * sizeof *s->drafts);
    s->piece_off = xmalloc(2 * c * sizeof *s->piece_off);
    s->masks_left = s->G;
    s->eos_pos = -1;
    s->kv_block = -1;
    s->has_tok = m->tok != NULL;
    if (s->has_tok) tok_stream_init(&s->ts, m->tok, 1);
    strbuf_put(&s->text, "", 0);
    return s;
}

/* Close the sequence's KV slots (on the thread that owns their ctx, or after its engine stopped). */
static void seq_kv_release(decode_seq *s) {
    if (!s->kv_ctx) return;
    for (int i = 0; i < 2; i++) model_kv_close(s->kv_ctx, s->kv_slot[i]);
    s->kv_slot[0] = s->kv_slot[1] = 0;
    s->kv_ctx = NULL;
    s->kv_block = -1;
}

void decode_seq_free(decode_seq *s) {
    if (!s) return;
    seq_kv_release(s);
    if (s->dec->free_state && s->dec_state) s->dec->free_state(s->dec_state);
    free(s->dec_state);
    if (s->has_tok) tok_stream_free(&s->ts);
    free(s->x);
    free(s->blk_lo);
    free(s->blk_hi);
    free(s->blk_steps);
    free(s->row_pos);
    free(s->row_masked);
    free(s->x0);
    free(s->conf);
    free(s->w_pos);
    free(s->w_tok);
    free(s->w_conf);
    free(s->row_conf);
    free(s->commits);
    free(s->drafts);
    free(s->piece_off);
    strbuf_free(&s->strs);
    strbuf_free(&s->text);
    free(s);
}

int decode_seq_done(const decode_seq *s) { return s->done; }
enum decode_finish decode_seq_finish_reason(const decode_seq *s) { return s->finish; }
void decode_seq_set_user(decode_seq *s, void *user) { s->user = user; }
void *decode_seq_user(const decode_seq *s) { return s->user; }
const decode_params *decode_seq_params(const decode_seq *s) { return &s->p; }
int decode_seq_steps(const decode_seq *s) { return s->step; }
int decode_seq_blocks_done(const decode_seq *s) { return s->cur; }

void decode_seq_set_deadline(decode_seq *s, uint64_t t_ns) { s->deadline_ns = t_ns; }

uint64_t decode_seq_deadline(const decode_seq *s) {
    if (s->deadline_ns) return s->deadline_ns;
    if (s->p.time_limit_ms <= 0 || !s->t_first_step) return 0;
    return s->t_first_step + (uint64_t)s->p.time_limit_ms * 1000000u;
}

int decode_seq_expired(const decode_seq *s, uint64_t now_ns) {
    const uint64_t d = decode_seq_deadline(s);
    return !s->done && d && now_ns >= d;
}

const int32_t *decode_seq_canvas(const decode_seq *s, int *len) {
    if (len) *len = s->L;
    return s->x;
}

/* What the next step of s runs (docs/decode.md "KV caches"), before slots are opened. */
/* Block-diffusion rules: rows the attention of block b sees end at its end; the rows of its aligned
 * start (the first block's prompt tail attends to the block's masks too). */
static int bd_block_start(const decode_seq *s, int b) { return s->blk_lo[b] / s->p.block_length * s->p.block_length; }

/* The block-diffusion plan (docs/decode.md "LLaDA2"): without a cache the canvas up to the active
 * block's end; with one (any mode: the exact block KV) a refresh fills it first — the prefix before
 * the active block prefilled in chunks of whole blocks (decode_step runs them before the step's
 * forward), then the block's rows —, then each step runs only the active block's rows, and the first
 * step of a block also the previous block's, whose final tokens' keys/values are committed by that
 * same forward. Rows after the active block are never run: block-causal attention never reads them
 * (the forward only attends to keys up to the end of its rows' blocks). */
static decode_step_plan seq_plan_bd(const decode_seq *s) {
    const int hi = s->blk_hi[s->cur];
    decode_step_plan pl = {0, hi, 0, 0, s->cur, {0, 0}, 0};
    if (s->p.cache == DECODE_CACHE_NONE || s->step < s->p.warmup_steps) return pl;
    pl.kv = 1;
    pl.slot[0] = s->kv_slot[0], pl.slot[1] = s->kv_slot[1];
    if (s->kv_block < 0 || (s->p.cache_refresh > 0 && s->kv_age >= s->p.cache_refresh)) {
        pl.refresh = 1;
        if (s->p.prefill_chunk > 0) pl.wl = pl.prefill = bd_block_start(s, s->cur);
        return pl;
    }
    pl.wl = bd_block_start(s, s->kv_block != s->cur && s->cur > 0 ? s->cur - 1 : s->cur);
    return pl;
}

/* The bidirectional models' plan: the whole canvas, or the cache mode's window. */
static decode_step_plan seq_plan_window(const decode_seq *s) {
    decode_step_plan pl = {0, s->L, 0, 0, s->cur, {0, 0}, 0};
    if (s->p.cache == DECODE_CACHE_NONE || s->step < s->p.warmup_steps) return pl;
    pl.kv = 1;
    pl.slot[0] = s->kv_slot[0], pl.slot[1] = s->kv_slot[1];
    if (s->kv_block != s->cur || (s->p.cache_refresh > 0 && s->kv_age >= s->p.cache_refresh)) {
        pl.refresh = 1;
        return pl;
    }
    const int lo = s->blk_lo[s->cur], hi = s->blk_hi[s->cur];
    switch (s->p.cache) {
    case DECODE_CACHE_PREFIX: pl.wl = lo, pl.wr = s->L; break;
    case DECODE_CACHE_DUAL: pl.wl = lo, pl.wr = hi; break;
    default:
        pl.wl = lo - s->p.prefix_look > 0 ? lo - s->p.prefix_look : 0;
        pl.wr = hi + s->p.after_look < s->L ? hi + s->p.after_look : s->L;
        break;
    }
    return pl;
}

static decode_step_plan seq_plan(const decode_seq *s) {
    decode_step_plan pl = s->bd ? seq_plan_bd(s) : seq_plan_window(s);
    /* shifted logits: position lo is scored by row lo - 1, which the window must hold. A
     * block-diffusion prefill still ends on the block boundary (a chunk's rows attend to every key of
     * their blocks), so that row is run twice — prefilled, then again in the window, with the same
     * keys and the same result. */
    const int lo = s->blk_lo[s->cur];
    if (s->shift && pl.wl > 0 && pl.wl >= lo) pl.wl = lo - 1;
    return pl;
}

int decode_seq_kv_rows(const decode_seq *s) {
    return s->p.cache == DECODE_CACHE_NONE ? 0 : s->L * (s->p.cfg_scale > 0 ? 2 : 1);
}

/* Rows of one block-diffusion prefill forward of s: whole blocks, at least one. */
static int bd_prefill_rows(const decode_seq *s) {
    const int B = s->p.block_length;
    return s->p.prefill_chunk > B ? s->p.prefill_chunk / B * B : B;
}

int decode_seq_max_forward_tokens(const decode_seq *s) {
    int rows = s->L;   /* a cache-free step, a refresh or a warm-up step runs up to the whole canvas */
    if (s->bd && s->p.cache != DECODE_CACHE_NONE && s->p.prefill_chunk > 0 && s->p.warmup_steps == 0 &&
        s->p.cache_refresh == 0) {
        /* exact block KV with chunked prefill: prefill chunks, or the window (the previous and the
         * active block, and the row before them for a shift) */
        const int w = 2 * s->p.block_length + 1, c = bd_prefill_rows(s);
        rows = c > w ? c : w;
        if (rows > s->L) rows = s->L;
    }
    return rows * (s->p.cfg_scale > 0 ? 2 : 1);
}

int decode_seq_forward_tokens(const decode_seq *s) {
    if (s->done) return 0;
    const decode_step_plan pl = seq_plan(s);
    int rows = pl.wr - pl.wl;
    if (pl.prefill > 0) {   /* the largest of the step's forwards */
        const int c = bd_prefill_rows(s) < pl.prefill ? bd_prefill_rows(s) : pl.prefill;
        if (c > rows) rows = c;
    }
    return rows * (s->p.cfg_scale > 0 ? 2 : 1);
}

/* ---------------------------------------------------------------- events */

static void fill_usage(const decode_seq *s, decode_usage *u) {
    u->prompt_tokens = s->n_prompt;
    u->completion_tokens = s->completion_tokens;
    u->steps = s->step;
    u->committed = s->G - s->masks_left;
}

static void emit(decode_seq *s, const decode_sink *sink, decode_event *ev) {
    ev->seq = s;
    ev->seq_user = s->user;
    ev->n_blocks = s->n_blocks;
    fill_usage(s, &ev->usage);
    if (!s->t_first_event) s->t_first_event = time_now_ns();
    if (sink && sink->fn) sink->fn(sink->user, ev);
}

static void text_append(decode_seq *s, const char *t, size_t n) {
    if (n) strbuf_put(&s->text, t, n);
}

/* The tokenizer stream's carried bytes into the text (at the end of the text being produced). */
static void text_flush(decode_seq *s) {
    const char *t;
    size_t n;
    tok_stream_flush(&s->ts, &t, &n);
    text_append(s, t, n);
}

static void emit_done(decode_seq *s, const decode_sink *sink, enum decode_finish reason, const char *error) {
    s->finish = reason;
    s->done = 1;
    seq_kv_release(s);   /* the cache memory goes back now, before DONE is delivered */
    s->t_done = time_now_ns();
    decode_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_DONE;
    ev.step = s->step;
    ev.block = -1;
    ev.text = s->text.p;
    ev.text_len = s->text.n;
    ev.finish = reason;
    ev.time_limited = s->last_step && (reason == DECODE_FINISH_STOP || reason == DECODE_FINISH_LENGTH);
    ev.error = error;
    ev.masks_left = s->masks_left;
    if (!s->t_first_event) s->t_first_event = s->t_done;
    ev.timings.first_event_ms = (double)(s->t_first_event - s->t_create) * 1e-6;
    ev.timings.total_ms = (double)(s->t_done - s->t_create) * 1e-6;
    ev.timings.decode_ms = s->t_first_step ? (double)(s->t_done - s->t_first_step) * 1e-6 : 0.0;
    ev.timings.tokens_per_s =
        ev.timings.decode_ms > 0 ? (double)s->completion_tokens / (ev.timings.decode_ms * 1e-3) : 0.0;
    emit(s, sink, &ev);
}

void decode_seq_finish(decode_seq *s, enum decode_finish reason, const char *error, const decode_sink *sink) {
    if (s->done) return;
    emit_done(s, sink, reason, error);
}

/* Piece of token tok at position pos into the arena; returns the offset. *special set. */
static size_t piece_put(decode_seq *s, int tok, int pos, int *special) {
    const tokenizer *tk = s->m->tok;
    *special = is_eos(s, tok) || (tk && tokenizer_is_special(tk, tok));
    if (!tk || (s->eos_pos >= 0 && pos > s->eos_pos)) return arena_put(&s->strs, "", 0);
    if (*special) {
        const char *pc = tokenizer_token_piece(tk, tok);
        return arena_put(&s->strs, pc ? pc : "", pc ? strlen(pc) : 0);
    }
    size_t n = 0;
    const uint8_t *b = tokenizer_token_bytes(tk, tok, &n);
    return arena_put_utf8(&s->strs, b ? b : (const uint8_t *)"", b ? n : 0);
}

/* The active block finished: its text (block order, through the incremental decoder, nothing after
 * the first EOS/EOT), the BLOCK event, then DONE when the sequence is finished. */
static void finish_block(decode_seq *s, const decode_sink *sink) {
    int b = s->cur, lo = s->blk_lo[b], hi = s->blk_hi[b];
    if (hi > s->gen_end) hi = s->gen_end;   /* block-diffusion padding past the generation: not reported */
    int block_eos = 0;
    for (int p = lo; p < hi; p++)
        if (is_eos(s, s->x[p])) block_eos = 1;
    if (block_eos) s->saw_eos = 1;
    int last = s->last_step || b + 1 >= s->n_blocks || (block_eos && s->p.stop_at_eos);
    size_t before = s->text.n;
    for (int p = lo; p < hi && !s->text_stopped; p++) {
        int tok = s->x[p];
        if (tok == s->mask_id) continue;
        if (is_eos(s, tok)) {
            s->text_stopped = 1;
            break;
        }
        s->completion_tokens++;
        if (s->has_tok) {
            const char *t;
            size_t n;
            tok_stream_push(&s->ts, tok, &t, &n);
            text_append(s, t, n);
        }
    }
    if (s->has_tok && (last || s->text_stopped)) text_flush(s);
    decode_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_BLOCK;
    ev.step = s->step;
    ev.block = b;
    ev.text = s->text.p + before;
    ev.text_len = s->text.n - before;
    ev.block_start = lo - s->n_prompt;
    ev.block_end = hi - s->n_prompt;
    ev.masks_left = s->masks_left;
    ev.block_steps = s->step_in_block;
    s->cur++;
    s->block_begun = 0;
    s->step_in_block = 0;
    emit(s, sink, &ev);
    if (last) emit_done(s, sink, s->saw_eos ? DECODE_FINISH_STOP : DECODE_FINISH_LENGTH, NULL);
}

/* ---------------------------------------------------------------- stepping */

static _Thread_local float *t_logits;
static _Thread_local size_t t_logits_cap;

void decode_thread_scratch_free(void) {
    free(t_logits);
    t_logits = NULL;
    t_logits_cap = 0;
}

typedef struct row_job {
    decode_seq *s;
    int         r;        /* row index within the sequence */
    float      *cond;     /* logits row */
    const float *uncond;  /* CFG row or NULL */
} row_job;

/* The canvas row whose output scores position pos: pos itself, or — shifted logits (s->shift: a
 * model whose output row i predicts token i+1, Dream; or hierarchy_block's token shift, Fast-dLLM v2)
 * — row pos - 1 (position 0 keeps row 0, as the references' shift cat(logits[:, :1], logits[:, :-1])
 * does). THE one place the shift happens on the host: every decoder, cache window and batch reads
 * logits through it (the device loop's planned steps too); the device-resident loop's own LM-head
 * rows (umk_seq_state.logit_shift, from decode_seq_logit_shift) follow the same rule. */
int decode_seq_logit_shift(const decode_seq *s) {
    return s->shift;
}

int decode_seq_logit_row(const decode_seq *s, int pos) {
    return s->shift && pos > 0 ? pos - 1 : pos;
}

/* Rows the sequence needs this step (fills row_pos / row_masked); returns the count. */
static int seq_rows(decode_seq *s) {
    int lo = s->blk_lo[s->cur], hi = s->blk_hi[s->cur], n = 0;
    int all = (s->dec->flags & DECODER_F_ALL_ROWS) != 0;
    for (int p = lo; p < hi; p++) {
        int masked = s->x[p] == s->mask_id;
        if (!masked && !all) continue;
        s->row_pos[n] = p;
        s->row_masked[n] = (uint8_t)masked;
        n++;
    }
    return n;
}

static void seq_view(decode_seq *s, int n_rows, const float *logits, decoder_view *v) {
    memset(v, 0, sizeof *v);
    v->p = &s->p;
    v->x = s->x;
    v->mask_id = s->mask_id;
    v->eos_id = s->eos_id;
    v->eot_id = s->eot_id >= 0 ? s->eot_id : -1;
    v->lo = s->blk_lo[s->cur];
    v->hi = s->blk_hi[s->cur];
    v->start = s->p.layout == DECODE_LAYOUT_ALIGNED ? v->lo / s->p.block_length * s->p.block_length : v->lo;
    v->shift = s->shift;
    v->block = s->cur;
    int bm = 0;
    for (int p = v->lo; p < v->hi; p++) bm += s->x[p] == s->mask_id;
    v->block_masks = bm;
    v->block_steps = s->blk_steps[s->cur];
    v->quota_len = s->bd ? s->p.block_length : 0;
    v->step_in_block = s->step_in_block;
    v->step = s->step;
    v->seed = s->p.seed;
    v->n_rows = n_rows;
    v->row_pos = s->row_pos;
    v->row_masked = s->row_masked;
    v->x0 = s->x0;
    v->conf = s->conf;
    v->logits = (s->dec->flags & DECODER_F_LOGITS) ? logits : NULL;
    if (s->dec->flags & DECODER_F_RESAMPLE) {
        v->x0_w = s->x0;
        v->conf_w = s->conf;
    }
    v->vocab = s->m->cfg.n_embd_rows;
}

/* Call the decoder's block_begin before the first step of the active block (host or device step). */
static void seq_block_begin(decode_seq *s) {
    if (s->block_begun) return;
    decoder_view v;
    seq_view(s, 0, NULL, &v);
    if (s->dec->block_begin) s->dec->block_begin(s->dec_state, &v);
    s->block_m0 = v.block_masks;
    s->block_begun = 1;
}

/* THE one place a step's outcome changes a sequence: apply record r (the writes and sampled rows of
 * step s->step) — canvas, counters, EOS position, STEP event (commits, drafts), then BLOCK / DONE
 * when the block finished. vb: the decoder's view of this step (for its block_done hook) or NULL
 * (a view without rows is built). Host steps (decode_step) and device steps (decode_device.c) both
 * end here. */
static void seq_apply(decode_seq *s, const decode_record *r, const decoder_view *vb, const decode_sink *sink) {
    CHECK(!s->done && s->cur < s->n_blocks);
    CHECK(r->step == s->step);
    CHECK(r->n_commits >= 0 && r->n_commits <= s->cap && r->n_rows >= 0 && r->n_rows <= s->cap);
    seq_block_begin(s);
    if (!s->t_first_step) s->t_first_step = r->t_step_ns ? r->t_step_ns : time_now_ns();
    decoder_view vl;
    if (!vb) {
        seq_view(s, 0, NULL, &vl);
        vb = &vl;
    }
    const int lo = s->blk_lo[s->cur], hi = s->blk_hi[s->cur];
    strbuf_reset(&s->strs);
    int revised_eos = 0;
    int nc = 0;   /* reported commits: positions past gen_end (block-diffusion padding) are written only */
    for (int i = 0; i < r->n_commits; i++) {
        int p = r->commit_pos[i], tok = r->commit_tok[i];
        CHECK(p >= lo && p < hi);
        int was_masked = s->x[p] == s->mask_id, prev = s->x[p];
        s->x[p] = tok;
        if (p >= s->gen_end) continue;
        if (was_masked && tok != s->mask_id) s->masks_left--;
        if (!was_masked && p == s->eos_pos) revised_eos = 1;   /* the first EOS may have been edited away */
        if (is_eos(s, tok) && (s->eos_pos < 0 || p < s->eos_pos)) s->eos_pos = p;
        s->commits[nc].pos = p;
        s->commits[nc].index = p - s->n_prompt;
        s->commits[nc].token = tok;
        s->commits[nc].confidence = r->commit_conf[i];
        s->commits[nc].revised = !was_masked;
        s->commits[nc].previous = was_masked ? -1 : prev;
        nc++;
    }
    if (revised_eos) { /* recompute the first EOS of the generated region */
        s->eos_pos = -1;
        for (int p = s->n_prompt; p < s->gen_end && s->eos_pos < 0; p++)
            if (s->x[p] != s->mask_id && is_eos(s, s->x[p])) s->eos_pos = p;
    }
    s->step++;
    s->step_in_block++;
    for (int i = 0; i < nc; i++)
        s->piece_off[i] = piece_put(s, s->commits[i].token, s->commits[i].pos, &s->commits[i].special);
    int block_left = 0, block_left_gen = 0;   /* in the block; in its generated part (events) */
    for (int p = lo; p < hi; p++) {
        block_left += s->x[p] == s->mask_id;
        block_left_gen += s->x[p] == s->mask_id && p < s->gen_end;
    }
    int nd = 0;
    if (s->p.stream_drafts && (s->step - 1) % s->p.draft_every == 0 && block_left > 0) {
        for (int q = 0; q < r->n_rows; q++) {
            int p = r->row_pos[q];
            CHECK(p >= lo && p < hi);
            if (s->x[p] != s->mask_id || p >= s->gen_end) continue;
            s->drafts[nd].pos = p;
            s->drafts[nd].index = p - s->n_prompt;
            s->drafts[nd].token = r->row_tok[q];
            s->drafts[nd].confidence = r->row_conf[q];
            s->piece_off[nc + nd] = piece_put(s, r->row_tok[q], p, &s->drafts[nd].special);
            nd++;
        }
    }
    for (int i = 0; i < nc; i++) s->commits[i].piece = s->strs.p + s->piece_off[i];
    for (int i = 0; i < nd; i++) s->drafts[i].piece = s->strs.p + s->piece_off[nc + i];

    decode_event ev;
    memset(&ev, 0, sizeof ev);
    ev.type = DECODE_EVENT_STEP;
    ev.step = s->step - 1;
    ev.block = s->cur;
    ev.n_commits = nc;
    ev.commits = s->commits;
    ev.n_drafts = nd;
    ev.drafts = s->drafts;
    ev.masks_left = s->masks_left;
    ev.block_masks_left = block_left_gen;
    emit(s, sink, &ev);

    int done = s->last_step || (s->dec->block_done ? s->dec->block_done(s->dec_state, vb, block_left) : block_left == 0);
    if (done) finish_block(s, sink);
}

void decode_seq_apply(decode_seq *s, const decode_record *r, const decode_sink *sink) {
    seq_apply(s, r, NULL, sink);
}

void decode_seq_cursor_get(const decode_seq *s, decode_seq_cursor *c) {
    memset(c, 0, sizeof *c);
    c->n_blocks = s->n_blocks;
    c->block = s->cur;
    c->blk_lo = s->blk_lo;
    c->blk_hi = s->blk_hi;
    c->blk_steps = s->blk_steps;
    c->gen_end = s->n_prompt + s->G;
    c->blocks_end = s->L - s->n_suffix;
    c->quota_len = s->bd ? s->p.block_length : 0;
    c->n_suffix = s->n_suffix;
    c->step = s->step;
    c->step_in_block = s->block_begun ? s->step_in_block : 0;
    c->block_m0 = s->block_begun ? s->block_m0 : -1;
}

/* The last step's writes (the deadline passed): every still-masked row of the active block at its
 * sampled x0 — whatever the decoder would choose; into w_pos / w_tok, returns the count. */
static int seq_last_writes(decode_seq *s, int n_rows) {
    int nw = 0;
    for (int r = 0; r < n_rows; r++)
        if (s->row_masked[r]) {
            s->w_pos[nw] = s->row_pos[r];
            s->w_tok[nw] = s->x0[r];
            nw++;
        }
    return nw;
}

/* Host step of one sequence after the forward and sampling: the decoder chooses (or, on the last
 * step of a time limit, seq_last_writes), the choice becomes a record, the record is applied. */
static void seq_after_forward(decode_seq *s, int n_rows, const float *logits, const decode_sink *sink) {
    decoder_view v;
    seq_view(s, n_rows, logits, &v);
    int nw = s->last_step ? seq_last_writes(s, n_rows) : s->dec->choose(s->dec_state, &v, s->w_pos, s->w_tok);
    CHECK(nw >= 0 && nw <= s->cap);
    if (v.block_masks > 0 && !(s->dec->flags & DECODER_F_MAY_SKIP)) CHECK(nw >= 1);
    for (int i = 0; i < nw; i++) {
        float cf = 0;
        for (int r = 0; r < n_rows; r++)
            if (s->row_pos[r] == s->w_pos[i]) cf = (float)s->conf[r];
        s->w_conf[i] = cf;
    }
    for (int r = 0; r < n_rows; r++) s->row_conf[r] = (float)s->conf[r];
    decode_record rec;
    memset(&rec, 0, sizeof rec);
    rec.step = s->step;
    rec.n_commits = nw;
    rec.commit_pos = s->w_pos;
    rec.commit_tok = s->w_tok;
    rec.commit_conf = s->w_conf;
    rec.n_rows = n_rows;
    rec.row_pos = s->row_pos;
    rec.row_tok = s->x0;
    rec.row_conf = s->row_conf;
    seq_apply(s, &rec, &v, sink);
}

/* The KV slots of a sequence whose plan uses them, on ctx (a sequence stepped on another ctx before
 * starts over there: its old slots are closed and the plan becomes a refresh). */
static void seq_kv_ensure(decode_seq *s, model_ctx *ctx) {
    if (s->kv_ctx == ctx) return;
    seq_kv_release(s);
    s->kv_ctx = ctx;
    s->kv_slot[0] = model_kv_open(ctx, s->L);
    if (s->p.cfg_scale > 0) s->kv_slot[1] = model_kv_open(ctx, s->L);
}

decode_step_plan decode_seq_plan(decode_seq *s, model_ctx *ctx) {
    CHECK(!s->done);
    decode_step_plan pl = seq_plan(s);
    if (pl.kv && s->kv_ctx != ctx) {
        seq_kv_ensure(s, ctx);
        pl = seq_plan(s);   /* new slots: a refresh */
    }
    return pl;
}

void decode_seq_plan_ran(decode_seq *s, const decode_step_plan *pl) {
    if (s->done || !pl->kv) return;   /* a finished sequence gave its cache back already */
    if (pl->refresh || s->bd) s->kv_block = pl->block;   /* bd: every cached step keeps it exact */
    if (pl->refresh) s->kv_age = 0;
    s->kv_age++;
}

/* One decode_step's layout over the sequences not done: their plans, sampled rows and logits rows. */
typedef struct step_layout {
    decode_step_plan *plan;     /* [n] (entries of done sequences unset) */
    int              *rows;     /* [n] rows sampled per sequence (0 when done) */
    int              *out_base; /* [n] first logits row of each sequence */
    int               n_act;    /* sequences not done */
    int               n_fseq;   /* forward sequences (2 per CFG sequence) */
    int               n_tok;    /* canvas tokens of the forward */
    int               n_out;    /* logits rows of the forward */
    int               any_kv;   /* some plan uses KV slots */
} step_layout;

/* Plans each sequence not done (KV slots on ctx) and counts the forward's sequences and tokens. */
static void step_layout_plan(step_layout *ly, model_ctx *ctx, decode_seq **seqs, int n) {
    memset(ly, 0, sizeof *ly);
    ly->plan = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *ly->plan);
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        if (s->done) continue;
        CHECK(s->m == ctx->m);
        ly->plan[i] = decode_seq_plan(s, ctx);
        ly->any_kv |= ly->plan[i].kv;
        ly->n_act++;
        int f = s->p.cfg_scale > 0 ? 2 : 1;
        ly->n_fseq += f;
        ly->n_tok += f * (ly->plan[i].wr - ly->plan[i].wl);
    }
}

/* Begins each sequence's block where due and lays out its rows in the logits. */
static void step_layout_rows(step_layout *ly, decode_seq **seqs, int n) {
    ly->rows = xmalloc((size_t)n * sizeof *ly->rows);
    ly->out_base = xmalloc((size_t)n * sizeof *ly->out_base);
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        ly->rows[i] = 0;
        if (s->done) continue;
        seq_block_begin(s);
        ly->rows[i] = seq_rows(s);
        ly->out_base[i] = ly->n_out;
        ly->n_out += ly->rows[i] * (s->p.cfg_scale > 0 ? 2 : 1);
    }
}

/* Frees what the layout allocated. */
static void step_layout_free(step_layout *ly) {
    free(ly->plan);
    free(ly->rows);
    free(ly->out_base);
}

/* The forward's input arrays (owned), sized by a step_layout. */
typedef struct step_bufs {
    int32_t *seq_start;   /* [n_fseq + 1] */
    int32_t *tokens;      /* [n_tok] */
    int32_t *pos;         /* [n_tok] */
    int32_t *kv;          /* [n_fseq] KV slots, NULL when no plan uses them */
    int32_t *out_rows;    /* [n_out] (at least 1) */
    int32_t *block_len;   /* [n_fseq] block-causal block size of each forward sequence, NULL when no
                             sequence runs the block-diffusion rules */
} step_bufs;

/* Fills b with each sequence's window: the canvas, then for CFG the unconditional one (prompt and
 * infill suffix masked out), and the token index of every logits row. */
static void step_bufs_fill(step_bufs *b, decode_seq **seqs, int n, const step_layout *ly) {
    int fs = 0, tk = 0;
    b->seq_start[0] = 0;
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        if (s->done) continue;
        const int wl = ly->plan[i].wl, w = ly->plan[i].wr - ly->plan[i].wl, cfg = s->p.cfg_scale > 0;
        const int rows = ly->rows[i];
        for (int c = 0; c <= cfg; c++) {   /* the canvas, then CFG's unconditional one */
            const int base = tk;
            memcpy(b->tokens + tk, s->x + wl, (size_t)w * sizeof *b->tokens);
            if (c) {   /* prompt and infill suffix masked out */
                for (int p = wl; p < s->n_prompt && p < wl + w; p++) b->tokens[tk + p - wl] = s->mask_id;
                for (int p = s->L - s->n_suffix; p < wl + w; p++)
                    if (p >= wl) b->tokens[tk + p - wl] = s->mask_id;
            }
            for (int p = 0; p < w; p++) b->pos[tk + p] = wl + p;
            if (b->kv) b->kv[fs] = ly->plan[i].slot[c];
            if (b->block_len) b->block_len[fs] = s->bd ? s->p.block_length : 0;
            tk += w;
            b->seq_start[++fs] = tk;
            for (int r = 0; r < rows; r++)
                b->out_rows[ly->out_base[i] + c * rows + r] = base + decode_seq_logit_row(s, s->row_pos[r]) - wl;
        }
    }
}

/* Runs the batched forward of the layout into t_logits (grown as needed); *t0: when the forward
 * started. 0, or -1 + err. */
static int step_forward(model_ctx *ctx, decode_seq **seqs, int n, const step_layout *ly, uint64_t *t0, um_err *err) {
    step_bufs b;
    b.seq_start = xmalloc((size_t)(ly->n_fseq + 1) * sizeof *b.seq_start);
    b.tokens = xmalloc((size_t)ly->n_tok * sizeof *b.tokens);
    b.pos = xmalloc((size_t)ly->n_tok * sizeof *b.pos);
    b.kv = ly->any_kv ? xcalloc((size_t)ly->n_fseq, sizeof *b.kv) : NULL;
    b.out_rows = xmalloc((size_t)(ly->n_out > 0 ? ly->n_out : 1) * sizeof *b.out_rows);
    int any_bd = 0;
    for (int i = 0; i < n; i++) any_bd |= !seqs[i]->done && seqs[i]->bd;
    b.block_len = any_bd ? xcalloc((size_t)ly->n_fseq, sizeof *b.block_len) : NULL;
    step_bufs_fill(&b, seqs, n, ly);
    size_t need = (size_t)ly->n_out * (size_t)ctx->m->cfg.n_embd_rows;
    if (need > t_logits_cap) {
        free(t_logits);
        t_logits = xmalloc(need * sizeof *t_logits);
        t_logits_cap = need;
    }
    fwd_batch fb;
    memset(&fb, 0, sizeof fb);
    fb.n_seqs = ly->n_fseq;
    fb.seq_start = b.seq_start;
    fb.tokens = b.tokens;
    fb.n_out = ly->n_out;
    fb.out_rows = b.out_rows;
    fb.pos = b.pos;
    fb.kv = b.kv;
    fb.block_len = b.block_len;
    *t0 = time_now_ns();
    int rc = ly->n_out > 0 ? model_forward(ctx, &fb, t_logits, err) : 0;
    free(b.seq_start);
    free(b.tokens);
    free(b.pos);
    free(b.kv);
    free(b.out_rows);
    free(b.block_len);
    return rc;
}

/* Block-diffusion refreshes (decode_step_plan.prefill): rows [0, prefill) of each such sequence
 * (and of its CFG canvas, prompt masked) go through forwards that only fill its KV slots, chunk by
 * chunk — round r batches chunk r of every sequence that still has one. Exact: a chunk's rows
 * attend to the keys of their own and earlier blocks only (block-causal), all in the slot by then,
 * so no forward ever needs the whole prompt's attention or activations at once. 0, or -1 + err. */
int decode_seq_prefill(model_ctx *ctx, decode_seq **seqs, const decode_step_plan *plan, int n, um_err *err) {
    int n_fseq = 0, n_tok = 0;   /* the most one round can hold */
    for (int i = 0; i < n; i++)
        if (!seqs[i]->done && plan[i].prefill > 0) {
            const int f = seqs[i]->p.cfg_scale > 0 ? 2 : 1;
            n_fseq += f;
            n_tok += f * bd_prefill_rows(seqs[i]);
        }
    if (n_fseq == 0) return 0;
    int32_t *seq_start = xmalloc((size_t)(n_fseq + 1) * sizeof *seq_start);
    int32_t *tokens = xmalloc((size_t)n_tok * sizeof *tokens), *pos = xmalloc((size_t)n_tok * sizeof *pos);
    int32_t *kv = xmalloc((size_t)n_fseq * sizeof *kv), *block_len = xmalloc((size_t)n_fseq * sizeof *block_len);
    int32_t out_row = 0;   /* no logits: out_rows with n_out 0 */
    int rc = 0;
    for (int round = 0; rc == 0; round++) {
        int fs = 0, tk = 0;
        seq_start[0] = 0;
        for (int i = 0; i < n; i++) {
            const decode_seq *s = seqs[i];
            if (s->done || plan[i].prefill <= 0) continue;
            const int C = bd_prefill_rows(s), r0 = round * C;
            if (r0 >= plan[i].prefill) continue;
            const int r1 = r0 + C < plan[i].prefill ? r0 + C : plan[i].prefill;
            for (int c = 0; c <= (s->p.cfg_scale > 0); c++) {   /* the canvas, then CFG's (prompt masked) */
                for (int p = r0; p < r1; p++, tk++) {
                    tokens[tk] = c && p < s->n_prompt ? s->mask_id : s->x[p];
                    pos[tk] = p;
                }
                kv[fs] = plan[i].slot[c];
                block_len[fs] = s->p.block_length;
                seq_start[++fs] = tk;
            }
        }
        if (fs == 0) break;
        const fwd_batch fb = {.n_seqs = fs, .seq_start = seq_start, .tokens = tokens, .pos = pos, .n_out = 0,
                              .out_rows = &out_row, .kv = kv, .block_len = block_len};
        rc = model_forward(ctx, &fb, NULL, err);
    }
    free(seq_start);
    free(tokens);
    free(pos);
    free(kv);
    free(block_len);
    return rc;
}

/* The sampling settings of sequence s over a vocabulary of V logits. */
static void seq_sample_cfg(const decode_seq *s, int V, sample_cfg *sc) {
    sc->vocab = V;
    sc->mask_id = s->mask_id;
    sc->eos_id = s->eos_id;
    sc->eot_id = s->eot_id >= 0 ? s->eot_id : -1;
    sc->cfg_scale = s->p.cfg_scale;
    sc->logits_eos_inf = s->p.logits_eos_inf;
    sc->confidence_eos_eot_inf = s->p.confidence_eos_eot_inf;
    sc->temperature = s->p.temperature;
    sc->top_k = s->p.top_k;
    sc->top_p = s->p.top_p;
    sc->seed = s->p.seed;
}

typedef struct row_run {
    const row_job *jobs;
    int            V;
} row_run;

static void sample_rows(void *arg, int64_t lo, int64_t hi) {
    const row_run *rr = arg;
    for (int64_t q = lo; q < hi; q++) {
        const row_job *j = &rr->jobs[q];
        sample_cfg sc;
        seq_sample_cfg(j->s, rr->V, &sc);
        sample_row(&sc, j->cond, j->uncond, j->s->step, j->s->row_pos[j->r], &j->s->x0[j->r], &j->s->conf[j->r]);
    }
}

/* Samples every row of every sequence not done from t_logits (x0, conf), rows in parallel on the
 * backend's host threads (the CPU backend's pool: the forward's own threads). */
static void step_sample(backend *be, decode_seq **seqs, int n, const step_layout *ly, int V) {
    int n_jobs = 0;
    for (int i = 0; i < n; i++) n_jobs += seqs[i]->done ? 0 : ly->rows[i];
    row_job *jobs = xmalloc((size_t)(n_jobs > 0 ? n_jobs : 1) * sizeof *jobs);
    int j = 0;
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        if (s->done) continue;
        for (int r = 0; r < ly->rows[i]; r++, j++) {
            jobs[j].s = s;
            jobs[j].r = r;
            jobs[j].cond = t_logits + (size_t)(ly->out_base[i] + r) * (size_t)V;
            jobs[j].uncond =
                s->p.cfg_scale > 0 ? t_logits + (size_t)(ly->out_base[i] + ly->rows[i] + r) * (size_t)V : NULL;
        }
    }
    row_run rr = {.jobs = jobs, .V = V};
    if (n_jobs > 1 && (size_t)n_jobs * (size_t)V > 65536) backend_host_parallel_for(be, n_jobs, 1, sample_rows, &rr);
    else sample_rows(&rr, 0, n_jobs);
    free(jobs);
}

int decode_forward_fault(decode_seq *const *seqs, int n, int ahead, um_err *err) {
    for (int i = 0; i < n; i++) {
        const decode_seq *s = seqs[i];
        if (!s || s->done) continue;
        if (fault_hit(FAULT_FORWARD_FAIL, &(fault_at){.seed = s->p.seed, .steps = s->step + ahead}))
            return um_err_set(err, UM_ERR_INTERNAL, "forward pass failed (injected by %s, seed %" PRIu64 ")",
                              fault_name(FAULT_FORWARD_FAIL), s->p.seed);
    }
    return 0;
}

/* The time limit at a step boundary: an expired sequence with a block in progress takes its last
 * step now; one between blocks ends here with the text of its finished blocks (its tokenizer's
 * carried bytes flushed, as at a last block). */
static void seq_check_deadline(decode_seq *s, uint64_t now, const decode_sink *sink) {
    if (!decode_seq_expired(s, now)) return;
    s->last_step = 1;
    if (s->step_in_block > 0) return;
    if (s->has_tok && !s->text_stopped) text_flush(s);
    emit_done(s, sink, s->saw_eos ? DECODE_FINISH_STOP : DECODE_FINISH_LENGTH, NULL);
}

int decode_step(model_ctx *ctx, decode_seq **seqs, int n, const decode_sink *sink, um_err *err) {
    int V = ctx->m->cfg.n_embd_rows;
    const uint64_t now = time_now_ns();
    for (int i = 0; i < n; i++)
        if (!seqs[i]->done) seq_check_deadline(seqs[i], now, sink);
    step_layout ly;
    step_layout_plan(&ly, ctx, seqs, n);
    if (ly.n_act == 0) {
        step_layout_free(&ly);
        return 0;
    }
    step_layout_rows(&ly, seqs, n);
    uint64_t t0;
    const uint64_t t_prefill = time_now_ns();   /* a prefill is part of the step's forward time */
    if (decode_forward_fault(seqs, n, 0, err) != 0 || decode_seq_prefill(ctx, seqs, ly.plan, n, err) != 0 ||
        step_forward(ctx, seqs, n, &ly, &t0, err) != 0) {
        step_layout_free(&ly);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (!seqs[i]->done && ly.plan[i].prefill > 0) t0 = t_prefill;
    for (int i = 0; i < n && ly.n_out > 0; i++)   /* the cache is as the forward left it */
        if (!seqs[i]->done) decode_seq_plan_ran(seqs[i], &ly.plan[i]);
    for (int i = 0; i < n; i++)
        if (!seqs[i]->done && !seqs[i]->t_first_step) seqs[i]->t_first_step = t0;

    step_sample(ctx->be, seqs, n, &ly, V);
    for (int i = 0; i < n; i++) {
        decode_seq *s = seqs[i];
        if (s->done) continue;
        seq_after_forward(s, ly.rows[i], t_logits + (size_t)ly.out_base[i] * (size_t)V, sink);
    }
    step_layout_free(&ly);
    return 0;
}

int decode_generate(model_ctx *ctx, decode_seq *s, const decode_sink *sink, um_err *err) {
    while (!s->done)
        if (decode_step(ctx, &s, 1, sink, err) != 0) return -1;
    return 0;
}
