/*
 * openai.h — the OpenAI dialect of the request core (api/gen.h): POST /v1/chat/completions and
 * /v1/completions parsed into an api_gen, their responses encoded by api_dialect_openai (chunks,
 * Mercury-style "diffusing" frames with diffusion_meta, bodies; FIM completions use it too).
 * Pure; any thread.
 */
#ifndef UM_OPENAI_H
#define UM_OPENAI_H

#include <stddef.h>

#include "api/gen.h"

/* Parsers of the OpenAI endpoints. body/len is the raw request body. */
int openai_parse_chat(const char *body, size_t len, const decode_params *defaults, const api_limits *lim,
                      api_gen *g, api_error *e);
int openai_parse_completion(const char *body, size_t len, const decode_params *defaults, const api_limits *lim,
                            api_gen *g, api_error *e);

extern const api_dialect api_dialect_openai;

#endif /* UM_OPENAI_H */
