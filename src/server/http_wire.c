/*
 * http_wire.c — complete HTTP answers written as raw bytes (http_wire.h), for connections that get
 * no lws header helpers: a request deadline passed (conn_guard.c), a method lws does not take
 * (http.c). Pure; any thread.
 */
#include "server/http_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/json_util.h"
#include "util/log.h"

/* The reason phrase of the statuses answered without lws's header helpers. */
static const char *raw_phrase(int status) {
    switch (status) {
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    default: return "Error";
    }
}

size_t http_error_bytes(char *buf, size_t cap, int status, const char *code, const char *msg, const char *extra_headers) {
    json_t *o = json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type", "invalid_request_error", "param",
                          "code", code);
    char *body = json_dumps(o, UM_JSON_COMPACT);
    json_decref(o);
    CHECK(body);
    int n = snprintf(buf, cap,
                     "HTTP/1.1 %d %s\r\nServer: unmask\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\nCache-Control: no-store\r\n%s\r\n%s\n",
                     status, raw_phrase(status), strlen(body) + 1, extra_headers ? extra_headers : "", body);
    free(body);
    CHECK(n > 0 && (size_t)n < cap); /* our messages are short */
    return (size_t)n;
}

