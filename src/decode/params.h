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

#include "decode/decode.h"
#include "util/err.h"


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
 *   prefix_look, after_look, warmup_steps.
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
