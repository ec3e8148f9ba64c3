/*
 * limits.h — the server-side request limits every transport applies (WebSocket `generate`, the
 * OpenAI / SGLang / llama.cpp HTTP APIs, async jobs), and the checks that produce their errors, so
 * a limit reads the same whichever way a request arrives:
 *   gen_length (or the client's alias) over --max-gen-length:
 *     "max_tokens must be between 1 and 64, got 100"          (param: the client's field name)
 *   prompt (+ suffix) over --max-prompt-tokens:
 *     "the prompt has 300 tokens, more than this server's limit of 200"  code context_length_exceeded
 *   prompt + gen_length (+ suffix) over --max-seq:
 *     "the prompt (300 tokens) + gen_length (200) = 500 tokens, more than this server's --max-seq of 256"
 *   prompt + gen_length over the model's context (decode validation): code context_length_exceeded.
 * Message size (--max-message-bytes) is enforced by the transports (WebSocket 1009, HTTP 413).
 *
 * The process-wide limits are set once while the server is configured (main thread, before any
 * request) and read-only afterwards, like the algorithm-config defaults (api/algo_config.h).
 * Not here: flag parsing (server/http_api.c), transport error shapes. Pure; any thread.
 */
#ifndef UM_API_LIMITS_H
#define UM_API_LIMITS_H

#include "decode/event_json.h"
#include "util/err.h"

#define API_CODE_CONTEXT_LENGTH "context_length_exceeded"
#define API_MAX_PROMPT_IDS (1 << 20)   /* token ids one request's prompt may list (every transport) */

/* Server-side limits applied while parsing/building (0 = no extra limit). */
typedef struct api_limits {
    int max_gen_length;     /* largest gen_length / max_tokens a request may ask for */
    int max_prompt_tokens;  /* largest prompt (+ suffix), in tokens; 0 = the model's context only */
    int max_choices;        /* prompts x n per request (HTTP) */
    int max_steps;          /* largest steps / diffusion_steps */
    int max_stop;           /* stop strings per request (HTTP) */
    int max_seq;            /* largest prompt + gen_length (+ suffix), tokens (serve --max-seq);
                               0 = the model's context only (decode validation) */
} api_limits;

api_limits api_limits_default(void);   /* 8192 / 0 / 16 / 1024 / 8 */

/* field (the client's name for the length) = v must be 1 ... max_gen_length. -1 with err
 * (UM_ERR_INVALID_ARG, param = field) otherwise. */
int api_limit_gen_length(const api_limits *l, const char *field, long long v, um_err *err);
/* The limits on a request's decode parameters, named as the client spelled them (src): a given
 * length within 1 ... max_gen_length (an unset one is lowered to max_gen_length), a given step
 * count within 0 (auto) ... max_steps. -1 with err (UM_ERR_INVALID_ARG) otherwise. */
int api_limit_params(const api_limits *l, decode_params *p, const decode_params_src *src, um_err *err);
/* n_prompt (+ n_suffix) tokens must fit max_prompt_tokens. -1 with err (UM_ERR_RESOURCE,
 * param = param) otherwise; the transports send it as context_length_exceeded. */
int api_limit_prompt_tokens(const api_limits *l, const char *param, int n_prompt, int n_suffix, um_err *err);
/* n_prompt + gen_length (+ n_suffix) must fit max_seq. -1 with err (UM_ERR_RESOURCE, param =
 * param) otherwise; the transports send it as context_length_exceeded. */
int api_limit_context(const api_limits *l, const char *param, int n_prompt, int gen_length, int n_suffix, um_err *err);
/* 1 when a decode_seq_create() failure means "does not fit the model's context" (the transports
 * report it as context_length_exceeded). */
int api_is_context_error(const um_err *err);

#endif /* UM_API_LIMITS_H */
