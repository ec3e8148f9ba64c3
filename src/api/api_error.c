/*
 * api_error.c — api_error: setters, the OpenAI error object and status mapping (see api_error.h). Pure, any thread.
 */
#include "api/api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "util/json_util.h"
#include "util/log.h"

const char *oai_error_type_for_status(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 429: return "rate_limit_error";
    default: break;
    }
    return status >= 500 ? "server_error" : "invalid_request_error";
}

const char *oai_status_reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: break;
    }
    return "Error";
}

int oai_error_set(api_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
    if (!e) return -1;
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", oai_error_type_for_status(status));
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int api_error_vset(api_error *e, const char *code, const char *param, const char *fmt, va_list ap) {
    if (!e) return -1;
    memset(e, 0, sizeof *e);
    e->status = 400;
    snprintf(e->type, sizeof e->type, "%s", oai_error_type_for_status(400));
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    return -1;
}

int api_error_set(api_error *e, const char *code, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    api_error_vset(e, code, param, fmt, ap);
    va_end(ap);
    return -1;
}

int api_error_from(api_error *e, const char *code, const um_err *err) {
    return api_error_set(e, code, err->param, "%s", err->msg);
}

int oai_error_from_um(api_error *e, const um_err *err) {
    int status = 500;
    const char *code = "internal_error";
    switch (err->code) {
    case UM_ERR_INVALID_ARG: status = 400, code = "invalid_value"; break;
    case UM_ERR_FORMAT: status = 400, code = "invalid_format"; break;
    case UM_ERR_UNSUPPORTED: status = 400, code = "unsupported"; break;
    case UM_ERR_RESOURCE: status = 503, code = "resource_exhausted"; break;
    case UM_ERR_CANCELLED: status = 499, code = "cancelled"; break;
    case UM_ERR_NONE:
    case UM_ERR_IO:
    case UM_ERR_INTERNAL: break;
    }
    return oai_error_set(e, status, code, err->param[0] ? err->param : NULL, "%s",
                         err->msg[0] ? err->msg : um_err_code_name(err->code));
}

int oai_error_should_retry(const api_error *e) {
    /* the SDKs also retry 409 (lock timeouts); our 409s (a finished job) are permanent */
    return e->status == 408 || e->status == 429 || e->status >= 500;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid / truncated. */
static size_t utf8_seq_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t need;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, min = 0x10000;
    else return 0;
    if (n < need) return 0;
    unsigned cp = c & (need == 2 ? 0x1F : need == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return need;
}

json_t *oai_json_string_lossy(const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        size_t k = u[i] ? utf8_seq_len(u + i, len - i) : 0;
        if (!k) break;
        i += k;
    }
    if (i == len) return json_stringn(s, len);
    char *out = xmalloc(len * 3 + 1);
    size_t o = 0;
    for (i = 0; i < len;) {
        size_t k = u[i] ? utf8_seq_len(u + i, len - i) : 0;
        if (k) {
            memcpy(out + o, s + i, k);
            o += k, i += k;
        } else if (u[i] == 0) {
            out[o++] = 0; /* NUL is valid in JSON strings (\u0000) */
            i++;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3, i++;
        }
    }
    json_t *j = json_stringn(out, o);
    free(out);
    CHECK(j != NULL);
    return j;
}

const char *oai_json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static json_t *str_or_null(const char *s) { return s[0] ? oai_json_string_lossy(s, strlen(s)) : json_null(); }

json_t *oai_error_json(const api_error *e) {
    json_t *inner = json_object();
    json_object_set_new(inner, "message", oai_json_string_lossy(e->message, strlen(e->message)));
    json_object_set_new(inner, "type", json_string(e->type[0] ? e->type : oai_error_type_for_status(e->status)));
    json_object_set_new(inner, "param", str_or_null(e->param));
    json_object_set_new(inner, "code", str_or_null(e->code));
    json_t *o = json_object();
    json_object_set_new(o, "error", inner);
    return o;
}

char *oai_error_body(const api_error *e, size_t *len) {
    json_t *o = oai_error_json(e);
    char *s = json_dumps(o, UM_JSON_COMPACT);
    json_decref(o);
    CHECK(s != NULL);
    if (len) *len = strlen(s);
    return s;
}
