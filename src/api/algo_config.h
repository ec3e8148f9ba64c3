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
 *                                              SGLang; also low_confidence|random|threshold|factor)
 *   threshold, factor, temperature, top_k, top_p, seed, cfg_scale, steps, stop_at_eos, draft_every
 *   block_size | block_length             ->  block_length
 *   gen_length | max_new_tokens | max_tokens  ->  gen_length
 *   cache | cache_type (none|prefix|dual|vicinity), cache_refresh | cache_update_freq, prefix_look,
 *   after_look, warmup_steps
 *
 * Not here: applying the result (decode_params_apply_json + decode_params_validate by the
 * caller). Pure functions, main thread at startup.
 */
#ifndef UM_ALGO_CONFIG_H
#define UM_ALGO_CONFIG_H

#include <stddef.h>

#include <jansson.h>

#include "decode/decode.h"
#include "util/err.h"

/* Parse text (label names it in messages). *out = a new JSON object with normalized keys. */
int algo_config_parse(const char *text, size_t len, const char *label, json_t **out, um_err *err);
/* Read and parse a file. */
int algo_config_load(const char *path, json_t **out, um_err *err);

/* The server-wide defaults: set once at startup on the main thread (overrides is copied; NULL
 * clears; cache: the server's KV cache mode, an enum decode_cache or DECODE_CACHE_AUTO), read by
 * every request path afterwards (any thread). Before any call: no overrides, DECODE_CACHE_AUTO. */
void algo_config_set_defaults(const json_t *overrides, int cache);
/* decode_params_for_serving(m, cache) with the server-wide overrides applied: the defaults every
 * request (HTTP APIs and WebSocket) starts from. */
decode_params algo_config_params_for_model(const model *m);

#endif /* UM_ALGO_CONFIG_H */
