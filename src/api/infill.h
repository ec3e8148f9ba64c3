/*
 * infill.h — IDE completions: llama.cpp's POST /infill and Mistral/Mercury-style
 * POST /v1/fim/completions, both answered by NATIVE infilling: the canvas is
 * prefix ++ MASK*n ++ suffix and the model fills the hole with both sides in view (no FIM tokens,
 * no autoregressive emulation).
 *
 * /infill request (llama.vim / llama.vscode): input_prefix, input_suffix, input_extra
 * [{filename, text}] (prepended to the prefix as "filename\ntext\n\n" context chunks), prompt (the
 * text left of the cursor, appended to the prefix), n_predict (0 = warm-up: answer at once, -1 =
 * server default), temperature, top_k, top_p, stop, stream, response_fields, n_indent,
 * t_max_predict_ms (the decode parameter time_limit_ms: the block in progress is finished in one
 * last step at the deadline), n_cmpl (or n: that many completions, seeds seed, seed + 1, ...), plus
 * unmask's diffusion fields. Ignored (accepted): id_slot, cache_prompt, samplers,
 * t_max_prompt_ms, lora, model.
 * /infill response: {"index","content","tokens":[],"id_slot":-1,"stop":true,"model",
 * "tokens_predicted","tokens_evaluated","generation_settings":{decode parameters, "n_ctx"},"prompt",
 * "has_new_line","truncated","stop_type":"eos"|"limit"|"word"|"none","stopping_word",
 * "tokens_cached":0,"time_limited","diffusion_steps","timings":{cache_n, prompt_n, prompt_ms,
 * prompt_per_token_ms, prompt_per_second, predicted_n, predicted_ms, predicted_per_token_ms,
 * predicted_per_second}} — an array of them (index order) for n_cmpl > 1; with response_fields
 * ["content","timings/prompt_n"] only those, flattened under their path names. Streaming:
 * {"index","content":delta,"stop":false,...} chunks, then the full object with "content":"" and
 * "stop":true per completion (no [DONE], as llama.cpp).
 *
 * /v1/fim/completions: {model, prompt, suffix, max_tokens, stream, temperature, top_p, stop, ...}
 * answered in the legacy completion shape with the text in choices[].text AND choices[].delta.content
 * (stream) / choices[].message.content (non-stream), so Continue, minuet and Mercury clients agree.
 *
 * Not here: HTTP. Pure; any thread.
 */
#ifndef UM_INFILL_H
#define UM_INFILL_H

#include <stddef.h>

#include <jansson.h>

#include "api/gen.h"

int infill_parse(const char *body, size_t len, const decode_params *defaults, const api_limits *lim, api_gen *g,
                 api_error *e);
int infill_parse_fim(const char *body, size_t len, const decode_params *defaults, const api_limits *lim, api_gen *g,
                     api_error *e);

/* A streamed /infill delta. */
json_t *infill_chunk(int index, const char *delta, size_t len, const api_track *t, int n_prompt);
/* The final /infill object of choice c of r (c = NULL for the n_predict = 0 warm-up). streaming:
 * content is "" (the text was streamed). response_fields (may be NULL) selects and flattens fields. */
json_t *infill_final(const api_resp *r, const api_choice *c, int streaming, const json_t *response_fields);

/* llama.cpp's /infill encoders (its streams end without "data: [DONE]"). */
extern const api_dialect api_dialect_infill;

#endif /* UM_INFILL_H */
