/*
 * params.h — the decode parameters' one table (params.c). A row per parameter carries its JSON
 * name, CLI flag, type, built-in default, own range, whether a checkpoint's generation_config.json
 * may set it, and help; defaults (decode_params_default), the own-range checks, JSON in and out,
 * generation_config.json, the CLI's flags and --help are loops over it. Every transport reads
 * requests through it (WebSocket, OpenAI / SGLang / llama.cpp HTTP APIs, jobs, `unmask generate`
 * whose flags are made from it), so they accept the same names and types, settle unset parameters
 * the same way and report the same range errors.
 *
 * Not here: checks that involve several parameters or the model (decode.c's
 * decode_params_validate), the decoders themselves (decoders.c). Pure functions, any thread.
 */
#ifndef UM_DECODE_PARAMS_H
#define UM_DECODE_PARAMS_H

#include <jansson.h>
#include <stdint.h>

#include "util/err.h"

/* ---------------------------------------------------------------- the parameters */

enum decode_decoder {
    DECODER_LOW_CONFIDENCE, /* A1: fixed steps, commit the k most confident masked positions */
    DECODER_RANDOM,         /* A1 'random' remasking: k positions chosen uniformly at random */
    DECODER_THRESHOLD,      /* A2/A4: commit every masked position with confidence >= threshold,
                               always at least the most confident one; no fixed step count */
    DECODER_FACTOR,         /* A3: commit the n highest with c(n) >= 1 - factor/(n+1) */
    DECODER_HIERARCHY,      /* A5: per run of consecutive masks its local maximum (> low_threshold
                               when set), plus every c > threshold, plus the global argmax */
    DECODER_CREDIT,         /* A6: threshold (A4) on logits + credit_alpha * log(1 + M), M a
                               per-block credit table [block_length x vocab] */
    /* Dream's diffusion_generate algorithms (alg = ...): Dream's step schedule (timesteps
     * linspace(1, eps, steps+1); step i commits int(n_masked * (1 - s/t)), the last step all that
     * remain; a step may commit none), positions chosen by confidence (alg_temp > 0: sampled) */
    DECODER_ORIGIN,         /* each masked position independently with probability 1 - s/t */
    DECODER_MASKGIT_PLUS,   /* confidence = top-1 probability */
    DECODER_TOPK_MARGIN,    /* confidence = top-1 minus top-2 probability */
    DECODER_ENTROPY,        /* confidence = sum p log(p + 1e-10) (negative entropy) */
    DECODER_JOINT_THRESHOLD, /* LLaDA2.1 token editing (SGLang JointThreshold): masked positions with
                               confidence > threshold (at least the most confident one) are written
                               (mask-to-token), and already written positions of the block whose
                               argmax differs with confidence > edit_threshold are rewritten
                               (token-to-token); once no mask is left up to max_post_steps edit-only
                               steps follow; the block ends when a step writes nothing */
    DECODER_HIERARCHY_BLOCK, /* Fast-dLLM v2 / SGLang HierarchyBlock: the block's sub-blocks of
                               sub_block_length positions are decoded in order; each step commits the
                               current sub-block's masked positions with confidence > threshold, else
                               its most confident one; with token_shift position p is predicted from
                               logits row p - 1, and a block whose first position is masked begins
                               with a step that commits only it (the previous block's last row's
                               token: the inherited token) */
    DECODER_COUNT_
};

enum decode_layout {
    DECODE_LAYOUT_LLADA,    /* blocks start right after the prompt: [Lp + b*B, Lp + (b+1)*B) */
    DECODE_LAYOUT_ALIGNED,  /* blocks at multiples of B; the first holds the prompt tail */
    DECODE_LAYOUT_COUNT_
};

/* KV caches across steps (docs/decode.md "KV caches"). A *refresh* step runs the whole canvas and
 * keeps every layer's keys/values; the other steps run only a window of rows, attending over the
 * cache with the window's rows replaced by fresh ones. */
enum decode_cache {
    DECODE_CACHE_NONE,      /* every step runs the whole canvas (the reference) */
    DECODE_CACHE_PREFIX,    /* window = the active block and every position after it (Fast-dLLM) */
    DECODE_CACHE_DUAL,      /* window = the active block's rows only (Fast-dLLM dual cache) */
    DECODE_CACHE_VICINITY,  /* window = the block widened by prefix_look / after_look positions
                               (dInfer vicinity refresh); 0 / 0 is dual */
    DECODE_CACHE_COUNT_
};

typedef struct decode_params {
    int      gen_length;             /* masked positions after the prompt; default 128 */
    int      block_length;           /* B; default 32 */
    int      steps;                  /* fixed-step decoders: forward passes in total, spread over the
                                        blocks; 0 = auto (one token per step = gen_length); default 0.
                                        Ignored by threshold/factor (they run until the block is full) */
    int      steps_per_block;        /* fixed-step decoders: steps of every block, overriding steps;
                                        0 = unset (steps decides); default 0. On block-causal
                                        (LLaDA2) models also the threshold decoder's quota schedule */
    enum decode_decoder decoder;     /* default DECODER_LOW_CONFIDENCE */
    double   threshold;              /* threshold / credit / hierarchy_block decoder tau, hierarchy
                                        tau_high; in (0, 1];
                                        default 0.9 */
    double   factor;                 /* factor decoder f, > 0; default 1.0 */
    double   low_threshold;          /* hierarchy decoder tau_low, in [0, 1]; 0 = off; default 0 */
    double   credit_alpha;           /* credit decoder alpha (logit boost), >= 0; default 0.7 */
    double   credit_gamma;           /* credit decoder gamma (credit = p^gamma), >= 0; default 0.2 */
    double   credit_decay;           /* credit decoder beta (per-step decay), in [0, 1]; default 0.8 */
    double   temperature;            /* 0 ... DECODE_MAX_TEMPERATURE; 0 = greedy (argmax); default 0 */
    int      top_k;                  /* sample only among the k best tokens; 0 = off; default 0 */
    double   top_p;                  /* nucleus sampling mass, in (0, 1]; 1 = off; default 1 */
    uint64_t seed;                   /* rng key for temperature > 0 and the random decoder; default 0 */
    double   cfg_scale;              /* classifier-free guidance, >= 0; 0 = off; default 0 */
    int      logits_eos_inf;         /* 1: logits[eos_id] = -inf before sampling; default 0 */
    int      confidence_eos_eot_inf; /* 1: the reference quirk: confidence computed with
                                        logits[eot_id] = -inf (x0 == eot -> confidence 0); default 0 */
    enum decode_layout layout;       /* default DECODE_LAYOUT_LLADA */
    int      stop_at_eos;            /* 1: finish at the end of the block that holds the first
                                        EOS/EOT; default 1 */
    int      stream_drafts;          /* 1: step events carry drafts for still-masked positions of the
                                        active block; default 0 */
    int      draft_every;            /* with stream_drafts: drafts on every N-th step of the
                                        sequence (step % N == 0); >= 1; default 1 */
    enum decode_cache cache;         /* default DECODE_CACHE_NONE */
    int      cache_refresh;          /* with a cache: also refresh once the cache is this many steps
                                        old inside a block (1 = every step, which is no cache);
                                        0 = only when a block begins; >= 0; default 0 */
    int      prefix_look;            /* vicinity: positions before the block recomputed every step;
                                        0 .. context; default 0 */
    int      after_look;             /* vicinity: positions after the block recomputed every step;
                                        0 .. context; default 0 */
    int      warmup_steps;           /* with a cache: the sequence's first N steps run without one
                                        (and keep none); >= 0; default 0 */
    int      prefill_chunk;          /* block-diffusion (block-causal) models with a cache: a refresh
                                        prefills the prefix before the active block in forwards of
                                        at most this many rows (whole blocks, at least one block);
                                        0 = the whole prefix and the block in one forward;
                                        0 .. context; default 256 */
    double   alg_temp;               /* Dream decoders: 0 = commit the most confident positions;
                                        > 0: sample them from softmax(confidence / alg_temp);
                                        0 .. 100; default 0 */
    double   eps;                    /* Dream decoders: the schedule's last timestep, in (0, 1);
                                        default 0.001 */
    double   edit_threshold;         /* joint_threshold: confidence a rewrite of a written position
                                        needs (tau_edit), in [0, 1]; default 0 */
    int      max_post_steps;         /* joint_threshold: edit-only steps after a block's last mask,
                                        0 .. 1000; default 16 */
    int      sub_block_length;       /* hierarchy_block: positions per sub-block, counted from the
                                        block's start; 1 .. context; default 8 */
    int      token_shift;            /* hierarchy_block: 1 = position p is predicted from logits row
                                        p - 1 (and a masked first block position is inherited),
                                        0 = from row p; default 1 */
    int      time_limit_ms;          /* wall-clock budget of the denoising, ms, counted from the start
                                        of the sequence's first step (queue time excluded); once it
                                        has passed, the block in progress is finished in one last
                                        step (every masked position at its current prediction) and
                                        the generation ends (decode_seq_set_deadline); 0 = off;
                                        0 .. 86400000; default 0 (llama.cpp's t_max_predict_ms) */
} decode_params;

/* The built-in defaults (the table's). */
decode_params decode_params_default(void);
/* The largest sampling temperature any transport accepts (OpenAI's range, 0 ... 2). */
#define DECODE_MAX_TEMPERATURE 2.0

/* Names of the enum values as requests spell them; parse: 0, or -1 for an unknown name. */
const char *decode_decoder_name(enum decode_decoder d);          /* "low_confidence", ... */
int         decode_decoder_parse(const char *name, enum decode_decoder *out);
const char *decode_layout_name(enum decode_layout l);            /* "llada" | "aligned" */
int         decode_layout_parse(const char *name, enum decode_layout *out);
const char *decode_cache_name(enum decode_cache c);              /* "none" | "prefix" | "dual" | "vicinity" */
int         decode_cache_parse(const char *name, enum decode_cache *out);

/* ---------------------------------------------------------------- the table */



#define DECODE_PARAMS_MAX 40

/* For each parameter (table order): the name the request used for it (a static string: the
 * canonical name or an alias), or NULL when the request did not set it. Zero-initialize. */
typedef struct decode_params_src {
    const char *name[DECODE_PARAMS_MAX];
} decode_params_src;

/* Apply the decode fields present in obj (others are ignored) to *p:
 *   gen_length (aliases max_tokens, max_completion_tokens, max_new_tokens, n_predict: negative =
 *   not given), block_length (block_size), steps (diffusion_steps), decoder (alg; "low_confidence" |
 *   "random" | "threshold" | "factor" | "hierarchy" | "credit" | "origin" | "maskgit_plus" |
 *   "topk_margin" | "entropy"; SGLang's "LowConfidence" = threshold), threshold, factor,
 *   low_threshold, credit_alpha, credit_gamma, credit_decay, alg_temp, eps,
 *   temperature, top_k (-1 = off = 0), top_p, seed, cfg_scale, logits_eos_inf,
 *   confidence_eos_eot_inf, block_layout ("llada" | "aligned"), stop_at_eos, stream_drafts
 *   (drafts), draft_every, cache ("none" | "prefix" | "dual" | "vicinity"), cache_refresh,
 *   prefix_look, after_look, warmup_steps, time_limit_ms (t_max_predict_ms: negative = not given).
 * When a body has an alias and the canonical name, the canonical name wins.
 * A field of the wrong JSON type or an unknown enum name: -1, UM_ERR_INVALID_ARG naming the field
 * as the request spelled it. Ranges are not checked here: decode_params_validate() does.
 * null values are ignored. src (optional) records the names used, across several calls. */
int decode_params_apply_json(decode_params *p, const json_t *obj, decode_params_src *src, um_err *err);

/* Defaults that depend on other parameters, for those the request did not set (src NULL = none
 * set): block_length is at most gen_length (llada layout), a steps count above gen_length falls
 * back to auto. Call after every apply and before validation. */
void decode_params_settle(decode_params *p, const decode_params_src *src);

/* Rewrites an error from decode_params_validate (err->param and the words of err->msg) into the
 * names the request used: "block_length must be between 1 and 16 (gen_length)" becomes
 * "block_size must be between 1 and 16 (max_tokens)". */
void decode_params_err_rename(um_err *err, const decode_params_src *src);

/* The name a request used for a parameter (canonical name), or NULL when it was not set. */
const char *decode_params_src_get(const decode_params_src *src, const char *canonical);
/* Records name (static storage) as the request's name for a parameter (canonical name). */
void decode_params_src_set(decode_params_src *src, const char *canonical, const char *name);

/* The canonical name of a parameter name or alias, or NULL when it is not a decode parameter. */
const char *decode_param_canonical(const char *name);

/* The table's rows, for front ends that make their own interface from it (the CLI's flags). */
enum decode_param_type {
    DECODE_PARAM_INT,   /* JSON integer */
    DECODE_PARAM_NUM,   /* JSON number */
    DECODE_PARAM_BOOL,  /* JSON boolean; the CLI flag takes no value and sets flag_value */
    DECODE_PARAM_SEED,  /* JSON non-negative integer (63 bits) */
    DECODE_PARAM_NAME,  /* JSON string, one of the names in help */
};
typedef struct decode_param_desc {
    const char *name;        /* canonical JSON name */
    enum decode_param_type type;
    const char *flag;        /* CLI flag without "--" */
    int         flag_value;  /* DECODE_PARAM_BOOL: the value the flag sets */
    const char *help;        /* one line, the built-in default in brackets (static storage) */
} decode_param_desc;
int  decode_param_count(void);
void decode_param_at(int i, decode_param_desc *d);   /* 0 <= i < decode_param_count() */
/* 1 when decoder d reads parameter i (table order): the table's decoders column. Parameters that
 * are no decoder's own (lengths, sampling, caches, streaming, ...) are read by every decoder. bd:
 * the block-diffusion rules (a block-causal model with the aligned layout: LLaDA2), under which
 * the threshold decoder also runs a step budget (steps, steps_per_block). decode.h's
 * decode_params_unused / decode_decoder_fields apply it to a model. */
int  decode_param_read_by(int i, enum decode_decoder d, int bd);

/* decode_params -> JSON object with the canonical names (new reference). */
json_t *decode_params_to_json(const decode_params *p);

/* The own range of every parameter that has one (table order; the first bad one is reported):
 * -1 with err naming the parameter, its range and the value. decode_params_check and
 * decode_params_validate call it between their cross-field checks. */
int decode_params_check_rows(const decode_params *p, um_err *err);

/* The keys of a checkpoint's generation_config.json object g that the table lets it set (and the
 * names Hugging Face / Dream use for them: max_new_tokens, alg) into *p. Lenient: a value of the
 * wrong type or an unknown decoder / cache name is ignored (validation catches bad ranges later).
 * *cache_set = 1 when g names a cache mode. */
void decode_params_apply_generation(decode_params *p, const json_t *g, int *cache_set);

/* A decoder by its name or one of SGLang's class names (LowConfidence = threshold, JointThreshold,
 * HierarchyBlock): 0, or -1 when it names none. */
int decode_decoder_parse_any(const char *name, enum decode_decoder *out);
/* The decoders' names in enum order joined by sep, the last two by last_sep, into buf. */
void decode_decoder_list(char *buf, size_t cap, const char *sep, const char *last_sep);

#endif /* UM_DECODE_PARAMS_H */
