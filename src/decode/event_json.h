/*
 * event_json.h — JSON (jansson) encodings shared by `unmask generate --json` and the server:
 * decode events -> JSON objects, and the decode parameters' one table: JSON request fields (and
 * the CLI's flags) -> decode_params.
 *
 * Not here: transport framing, request ids / sequence numbers (the caller adds them to the
 * returned object), OpenAI/SGLang shapes (api/). Pure functions, any thread.
 *
 * Event objects (field list in docs/decode.md):
 *   {"type":"step","step":3,"block":0,"n_blocks":4,
 *    "commits":[{"pos":12,"index":2,"id":881,"text":" the","confidence":0.93,"special":false}],
 *    "drafts":[{"pos":13,"index":3,"id":17,"text":"x","confidence":0.41,"special":false}],   (only when streamed)
 *    "progress":{"steps":4,"masks_left":120,"block_masks_left":28,"committed":8}}
 *   {"type":"block","block":0,"start":0,"end":32,"text":"...","steps":32}
 *   {"type":"done","finish_reason":"stop","text":"...","error":null,
 *    "usage":{"prompt_tokens":9,"completion_tokens":40,"total_tokens":49,"steps":64,"committed":64},
 *    "timings":{"first_event_ms":..,"total_ms":..,"decode_ms":..,"tokens_per_s":..}}
 */
#ifndef UM_EVENT_JSON_H
#define UM_EVENT_JSON_H

#include <jansson.h>

#include "decode/decode.h"
#include "util/err.h"

/* New reference to an object for ev (never NULL). */
json_t *decode_event_to_json(const decode_event *ev);

/* ---------------------------------------------------------------- decode parameters
 * One table (event_json.c) lists every decode parameter: its JSON name, type, CLI flag and help.
 * Every transport reads requests through it (WebSocket, OpenAI / SGLang / llama.cpp HTTP APIs,
 * jobs, `unmask generate` whose flags are made from it), so they accept the same names and types,
 * settle unset parameters the same way and validate with decode_params_validate's ranges. */

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
    const char *help;        /* one line, the built-in default in brackets */
} decode_param_desc;
int  decode_param_count(void);
void decode_param_at(int i, decode_param_desc *d);   /* 0 <= i < decode_param_count() */

/* decode_params -> JSON object with the canonical names (new reference). */
json_t *decode_params_to_json(const decode_params *p);

#endif /* UM_EVENT_JSON_H */
