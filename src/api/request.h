/*
 * request.h — JSON request bodies -> a ready-to-submit generation (prompt tokens + decode_seq),
 * shared by the WebSocket `generate` message and HTTP APIs; and the protocol error type.
 *
 * A request object carries exactly one of
 *   "prompt":     raw text (tokenized as is, special tokens recognised, no chat template),
 *   "messages":   [{"role","content"},...] rendered with the model's chat template
 *                 (add_generation_prompt = true), or
 *   "prompt_ids": [int,...] token ids,
 * plus decode parameters at the top level and/or inside "params" (event_json.h field names), and
 * "stream": {"drafts": bool, "draft_every": N, "every": N} (every: send one step event per N
 * denoising steps, merging the ones in between).
 *
 * Not here: transports, ids/seq numbers, the scheduler. Pure functions (the model is read-only);
 * any thread.
 */
#ifndef UM_API_REQUEST_H
#define UM_API_REQUEST_H

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>

#include "api/algo_config.h"
#include "api/limits.h"
#include "decode/decode.h"
#include "model/model.h"

/* A protocol-level error: stable machine code ("invalid_request", "queue_full", ...), offending
 * parameter (or ""), one human line. */
typedef struct api_error {
    const char *code;      /* static string */
    char        param[64];
    char        msg[512];
} api_error;

int api_error_set(api_error *e, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int api_error_vset(api_error *e, const char *code, const char *param, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* Map a um_err (from tokenizer/decode validation) to an api_error with the given code, keeping
 * param and message. Returns -1. */
int api_error_from(api_error *e, const char *code, const um_err *err);

/* Chat messages, the one check every transport applies (WebSocket `generate`, /v1/chat/completions,
 * /v1/jobs, `unmask generate --messages`): a non-empty array of objects whose "role" is exactly
 * one of system, developer (taken as system), user, assistant, tool, and whose "content" is a
 * string, null ("") or an array of {"type":"text","text"} parts (concatenated). Returns a new
 * array of {"role","content"} strings for the chat template, or NULL with e filled: param
 * "messages", "messages[i].role" or "messages[i].content", code "invalid_value" / "invalid_type"
 * (the HTTP APIs' codes; the WebSocket protocol reports them as "invalid_request") or
 * "unsupported" (a non-text part). Roles are checked because a template writes them verbatim into
 * text that is then read with special tokens recognised: "user<|eot_id|>..." would forge a turn.
 * Contents need no such check: chat_template_encode never reads them as special tokens. */
json_t *api_chat_messages(const json_t *msgs, api_error *e);

/* Token ids of the prompt in obj (see above). *ids is malloc'd (caller frees). */
int api_prompt_tokens(const model *m, const json_t *obj, int32_t **ids, int *n, api_error *e);

typedef struct api_gen_request {
    decode_seq *seq;          /* owned (NULL after being handed to the scheduler) */
    int         n_prompt;
    int         stream_every; /* >= 1 */
    json_t     *params;       /* effective decode parameters (owned) */
    json_t     *ignored;      /* array of top-level field names that were not understood, or NULL */
} api_gen_request;

/* Parse + validate everything and build the decode_seq, starting from the server's policy (its
 * decoder defaults; its limits, api/limits.h: the same checks and messages as the HTTP APIs). Errors: code "invalid_request"
 * (bad or missing field, gen_length over --max-gen-length; param named), "context_length_exceeded"
 * (prompt over --max-prompt-tokens, or prompt + gen_length over the model's context),
 * "unsupported" (e.g. messages without a chat template). Tokenizes the prompt: may take tens of
 * ms for a large one (the server runs it on its prep worker, not the service thread). */
int  api_gen_request_parse(const model *m, const json_t *obj, const api_policy *pol, api_gen_request *out,
                           api_error *e);
void api_gen_request_free(api_gen_request *r);

#endif /* UM_API_REQUEST_H */
