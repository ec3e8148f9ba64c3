/*
 * request.h — the WebSocket `generate` message as one more dialect of the HTTP APIs' request core
 * (api/gen.h): parsed into the same api_gen, built into decode sequences by the same api_gen_build
 * (chat template, tokenizer, infilling canvas, limits, decode validation), so a request reads the
 * same whichever transport brings it.
 *
 * A generate object carries exactly one of
 *   "prompt":     raw text (tokenized as is, special tokens recognised, no chat template),
 *   "messages":   [{"role","content"},...] rendered with the model's chat template
 *                 (add_generation_prompt = true), or
 *   "prompt_ids": [int,...] token ids,
 * optionally "suffix": text after the hole (infilling, as /v1/completions' suffix and /infill's
 * input_suffix: prompt ++ masks ++ suffix, special-token strings read as plain text), with
 * "prompt" or "prompt_ids";
 * plus decode parameters at the top level and/or inside "params" (event_json.h field names), and
 * "stream": {"drafts": bool, "draft_every": N, "every": N} (every: send one step event per N
 * denoising steps, merging the ones in between).
 *
 * Not here: the message envelope (type, id, event_id: api/ws_protocol.h), transports, the
 * scheduler. Pure functions (the model is read-only); any thread (the server parses on the lws
 * service thread and builds on a preparation worker, as for HTTP: docs/architecture.md).
 */
#ifndef UM_API_REQUEST_H
#define UM_API_REQUEST_H

#include <jansson.h>

#include "api/algo_config.h"
#include "api/api_error.h"
#include "api/gen.h"
#include "model/model.h"

/* What a WebSocket generate asks of its transport rather than of the decoder. */
typedef struct api_gen_opts {
    int stream_every;   /* >= 1: one step event per stream_every denoising steps (merged) */
} api_gen_opts;

/* Parse and check a generate object into g (kind API_KIND_UNMASK, the server's policy defaults
 * + the request's fields; the unknown top-level fields in g->ignored) and o. Tokenizes nothing:
 * api_gen_build() does, with the same limits and messages as the HTTP APIs. Errors (code
 * "invalid_request" naming the field, "unsupported": no tokenizer for text, no chat template for
 * messages) fill e; g must then still be freed (api_gen_free). */
int api_gen_parse_ws(const model *m, const json_t *obj, const api_policy *pol, api_gen *g, api_gen_opts *o,
                     api_error *e);

#endif /* UM_API_REQUEST_H */
