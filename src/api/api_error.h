/*
 * api_error.h — api_error: the one per-request error of every transport (WebSocket `error` event,
 * HTTP error body, CLI message), and the OpenAI error object and HTTP status policy of every HTTP
 * API (OpenAI, SGLang, llama.cpp /infill, jobs, operations).
 *
 * The WebSocket `error` event carries code, message and param (status and type are the HTTP
 * encoding of the same error).
 *
 * Body shape (all four keys always present, null when empty, as the OpenAI spec requires):
 *   {"error":{"message":"diffusion_steps must be between 1 and 1024, got 2000",
 *             "type":"invalid_request_error","param":"diffusion_steps","code":"invalid_value"}}
 * Status -> type: 400/404/405/409/413/422 invalid_request_error, 401 authentication_error,
 * 403 permission_error, 429 rate_limit_error, 5xx server_error (503: "overloaded"/"shutting_down"
 * codes). um_err codes map through oai_error_from_um().
 *
 * Not here: writing headers (Retry-After, x-should-retry are added by server/http_api.c from
 * retry_after_ms / oai_error_should_retry()). Pure functions, any thread.
 */
#ifndef UM_OAI_ERROR_H
#define UM_OAI_ERROR_H

#include <jansson.h>
#include <stdarg.h>

#include "util/err.h"

typedef struct api_error {
    int    status;          /* HTTP status, 400..599 */
    char   type[40];        /* OpenAI error type, e.g. "invalid_request_error" */
    char   code[48];        /* machine-readable code, "" -> null */
    char   param[64];       /* offending request field, "" -> null */
    char   message[512];    /* one human line */
    double retry_after_ms;  /* > 0: the client may retry after this delay (429 / 503) */
} api_error;

/* A protocol error of status 400 (the WebSocket protocol reads code, param and message; codes such
 * as "invalid_request", "queue_full", "unknown_session"). code/param may be NULL. Returns -1. */
int api_error_set(api_error *e, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int api_error_vset(api_error *e, const char *code, const char *param, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));
/* A um_err (tokenizer/decode validation) with the given code (status 400), keeping param and
 * message. Returns -1. */
int api_error_from(api_error *e, const char *code, const um_err *err);

/* Fill e; type follows from status (oai_error_type_for_status). code/param may be NULL. Returns -1
 * so handlers can `return oai_error_set(...)`. */
int oai_error_set(api_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* From a per-request um_err: INVALID_ARG/FORMAT/UNSUPPORTED -> 400, RESOURCE -> 503, CANCELLED -> 499
 * (client closed request), IO/INTERNAL -> 500. The um_err's param and message are kept. */
int oai_error_from_um(api_error *e, const um_err *err);

const char *oai_error_type_for_status(int status);
/* Reason phrase for a status ("Too Many Requests"); "Error" for unknown ones. */
const char *oai_status_reason(int status);
/* 1 when an OpenAI SDK should retry this error (408, 429, >= 500), else 0 (409 included: ours are
 * permanent): drives the `x-should-retry` header so SDK retries follow the server's intent. */
int oai_error_should_retry(const api_error *e);

/* {"error":{...}} as a new reference. */
json_t *oai_error_json(const api_error *e);
/* The same, serialized compactly into a malloc'd NUL-terminated string (caller frees). */
char *oai_error_body(const api_error *e, size_t *len);

/* A JSON string from arbitrary bytes (json_string() rejects invalid UTF-8 and returns NULL): invalid
 * or truncated UTF-8 sequences become U+FFFD. Shared by every encoder that echoes client text. */
json_t *oai_json_string_lossy(const char *s, size_t len);

/* "an object", "a string", ... for messages about a value of the wrong type. */
const char *oai_json_type_name(const json_t *v);

#endif /* UM_OAI_ERROR_H */
