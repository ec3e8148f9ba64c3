/*
 * sglang.h — SGLang's native POST /generate: request parsing and response objects.
 *
 * Request (GenerateReqInput subset): "text" (string or list) or "input_ids" ([int] or [[int]]),
 * "sampling_params" {max_new_tokens, temperature, top_p, top_k, stop, seed, + unmask's diffusion
 * fields steps/block_length/decoder/threshold/...}, "stream", "rid". Per-request decoder settings
 * are an unmask extension: SGLang itself takes them server-wide (--dllm-algorithm-config, see
 * api/algo_config.h), which unmask also does.
 *
 * Response (per text): {"text", "output_ids", "meta_info": {"id", "finish_reason": null |
 * {"type":"stop","matched":…} | {"type":"length","length":N} | {"type":"abort"}, "prompt_tokens",
 * "completion_tokens", "cached_tokens", "e2e_latency", "diffusion_steps"}, "index"?}; a list
 * request answers with a list. Streaming: SGLang's default cumulative mode — every chunk repeats
 * the full committed text so far — then "data: [DONE]".
 *
 * Not here: HTTP. Pure; any thread.
 */
#ifndef UM_SGLANG_H
#define UM_SGLANG_H

#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"

int sglang_parse_generate(const char *body, size_t len, const decode_params *defaults, const api_limits *lim,
                          api_gen *g, api_error *e);

/* One response object for choice index (with_index: add "index", and suffix the rid with _index).
 * streaming: finish_reason stays null until t is done. */
json_t *sglang_chunk(const char *rid, int index, int with_index, const api_track *t, int n_prompt, double e2e_s,
                     int streaming);

/* SGLang's encoders (cumulative stream chunks, a list body for a list request). */
extern const api_dialect api_dialect_sglang;

#endif /* UM_SGLANG_H */
