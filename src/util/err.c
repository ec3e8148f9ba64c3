/*
 * err.c — um_err helpers. Any thread.
 */
#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int um_err_set(um_err *err, enum um_err_code code, const char *fmt, ...) {
    if (!err) return -1;
    err->code = code;
    err->param[0] = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int um_err_param(um_err *err, const char *param, const char *fmt, ...) {
    if (!err) return -1;
    err->code = UM_ERR_INVALID_ARG;
    snprintf(err->param, sizeof err->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int um_err_prefix(um_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char pre[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", pre, old);
    return -1;
}

const char *um_err_code_name(enum um_err_code code) {
    switch (code) {
    case UM_ERR_NONE: return "none";
    case UM_ERR_INVALID_ARG: return "invalid_argument";
    case UM_ERR_IO: return "io_error";
    case UM_ERR_FORMAT: return "invalid_format";
    case UM_ERR_UNSUPPORTED: return "unsupported";
    case UM_ERR_RESOURCE: return "resource_exhausted";
    case UM_ERR_CANCELLED: return "cancelled";
    case UM_ERR_INTERNAL: return "internal_error";
    }
    return "unknown";
}
