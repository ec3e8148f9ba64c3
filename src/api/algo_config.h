/*
 * algo_config.h — server-wide decoder defaults from an algorithm config file, in the style of
 * SGLang's `--dllm-algorithm-config cfg.yaml` (`unmask serve --algorithm-config FILE`).
 *
 * The file is JSON (an object) or a flat YAML subset: `key: value` lines, `#` comments, blank
 * lines, an optional `---`; values are numbers, true/false, null, or strings (bare or quoted).
 * Anything nested, a duplicate key or an unknown key is an error naming file:line and the key —
 * a typo in a server config must not be ignored silently.
 *
 * Keys (SGLang names first, unmask names accepted too), normalized to the request field names of
 * decode/event_json.h:
 *   algorithm | dllm_algorithm | decoder  ->  decoder   ("LowConfidence" = threshold decoding, as in
 *                                              SGLang; "JointThreshold", "HierarchyBlock"; also every
 *                                              unmask decoder name)
 *   threshold, factor, temperature, top_k, top_p, seed, cfg_scale, steps, stop_at_eos, draft_every
 *   block_size | block_length             ->  block_length
 *   gen_length | max_new_tokens | max_tokens  ->  gen_length
 *   cache | cache_type (none|prefix|dual|vicinity), cache_refresh | cache_update_freq, prefix_look,
 *   after_look, warmup_steps
 *   sub_block_size | sub_block_length, token_shift, edit_threshold, max_post_steps, ... (every request
 *   parameter name and alias)
 *
 * Not here: applying the result (decode_params_apply_json + decode_params_validate by the
 * caller). Pure functions, main thread at startup.
 */
#ifndef UM_ALGO_CONFIG_H
#define UM_ALGO_CONFIG_H

#include <stddef.h>

#include <jansson.h>

#include "api/limits.h"
#include "decode/decode.h"
#include "util/err.h"

/* Parse text (label names it in messages). *out = a new JSON object with normalized keys. */
int algo_config_parse(const char *text, size_t len, const char *label, json_t **out, um_err *err);
/* Read and parse a file. */
int algo_config_load(const char *path, json_t **out, um_err *err);

/* What a server applies to every request, whatever its transport: the limits, the algorithm
 * config's decoder defaults and the default KV cache. One per server instance; read-only while
 * serving (any thread). */
typedef struct api_policy {
    api_limits    lim;
    json_t       *algo;     /* --algorithm-config overrides (owned), or NULL */
    int           cache;    /* --cache: an enum decode_cache, or DECODE_CACHE_AUTO */
    const model  *bound;    /* api_policy_bind's model (not owned), or NULL */
    decode_params defaults; /* with bound: what api_policy_params returns for it */
} api_policy;

/* Defaults, no overrides, DECODE_CACHE_AUTO. */
void api_policy_init(api_policy *p);
void api_policy_free(api_policy *p);
/* decode_params_for_serving(m, p->cache) with p's algorithm-config overrides applied (the
 * algorithm config's "cache" wins over p->cache): the defaults every request starts from. For the
 * model p is bound to, a copy of what api_policy_bind computed. */
decode_params api_policy_params(const api_policy *p, const model *m);
/* Computes p's defaults for m once (a server, when its model is loaded, before it serves): requests
 * then copy them instead of computing them again. */
void api_policy_bind(api_policy *p, const model *m);

#endif /* UM_ALGO_CONFIG_H */
