/*
 * err.h — per-request / per-input error reports.
 *
 * A fallible function returns 0 on success or -1 and fills *err with a code and one human line
 * ("model.safetensors: tensor 'x' has unknown dtype 'Q4'"). err may be NULL (message dropped).
 * The server maps codes to HTTP statuses / WebSocket error codes; the CLI prints msg and exits 1.
 */
#ifndef UM_ERR_H
#define UM_ERR_H

enum um_err_code {
    UM_ERR_NONE = 0,
    UM_ERR_INVALID_ARG,   /* a request/CLI parameter is out of range or malformed */
    UM_ERR_IO,            /* file missing/unreadable */
    UM_ERR_FORMAT,        /* file contents malformed (safetensors, json, tokenizer) */
    UM_ERR_UNSUPPORTED,   /* valid input we do not implement (architecture, template construct) */
    UM_ERR_RESOURCE,      /* does not fit (memory, context length, queue) */
    UM_ERR_CANCELLED,
    UM_ERR_INTERNAL,
};

typedef struct um_err {
    enum um_err_code code;
    char param[64];       /* offending parameter name, or "" */
    char msg[512];        /* one line, no trailing newline */
} um_err;

/* Fill err (if non-NULL); always returns -1 so callers can `return um_err_set(...)`. */
int um_err_set(um_err *err, enum um_err_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Same, naming the parameter (for API validation errors). */
int um_err_param(um_err *err, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Prefix an existing message: "ctx: old message". */
int um_err_prefix(um_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *um_err_code_name(enum um_err_code code);

#endif /* UM_ERR_H */
