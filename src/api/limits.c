/*
 * limits.c — request limits shared by every transport (limits.h). Pure checks; the limits
 * themselves belong to the server instance (api_policy). Any thread.
 */
#include "api/limits.h"

#include <string.h>

api_limits api_limits_default(void) {
    api_limits l = {.max_gen_length = 8192, .max_prompt_tokens = 0, .max_choices = 16, .max_steps = 1024, .max_stop = 8};
    return l;
}

int api_limit_gen_length(const api_limits *l, const char *field, long long v, um_err *err) {
    if (v >= 1 && v <= l->max_gen_length) return 0;
    return um_err_param(err, field, "%s must be between 1 and %d, got %lld", field, l->max_gen_length, v);
}

int api_limit_params(const api_limits *l, decode_params *p, const decode_params_src *src, um_err *err) {
    const char *len = decode_params_src_get(src, "gen_length");
    if (len && api_limit_gen_length(l, len, p->gen_length, err) != 0) return -1;
    if (!len && p->gen_length > l->max_gen_length) p->gen_length = l->max_gen_length;
    const char *steps = decode_params_src_get(src, "steps");
    if (steps && l->max_steps > 0 && (p->steps < 0 || p->steps > l->max_steps))
        return um_err_param(err, steps, "%s must be between 0 (auto) and %d, got %d", steps, l->max_steps, p->steps);
    return 0;
}

int api_limit_prompt_tokens(const api_limits *l, const char *param, int n_prompt, int n_suffix, um_err *err) {
    if (l->max_prompt_tokens <= 0 || n_prompt + n_suffix <= l->max_prompt_tokens) return 0;
    um_err_param(err, param, "the prompt has %d tokens%s, more than this server's limit of %d", n_prompt + n_suffix,
                 n_suffix ? " (with the suffix)" : "", l->max_prompt_tokens);
    if (err) err->code = UM_ERR_RESOURCE;
    return -1;
}

int api_limit_context(const api_limits *l, const char *param, int n_prompt, int gen_length, int n_suffix, um_err *err) {
    long long total = (long long)n_prompt + gen_length + (n_suffix > 0 ? n_suffix : 0);
    if (l->max_seq <= 0 || total <= l->max_seq) return 0;
    if (n_suffix > 0)
        um_err_param(err, param,
                     "the prompt (%d tokens) + gen_length (%d) + suffix (%d tokens) = %lld tokens, more than this "
                     "server's --max-seq of %d",
                     n_prompt, gen_length, n_suffix, total, l->max_seq);
    else
        um_err_param(err, param, "the prompt (%d tokens) + gen_length (%d) = %lld tokens, more than this server's --max-seq of %d",
                     n_prompt, gen_length, total, l->max_seq);
    if (err) err->code = UM_ERR_RESOURCE;
    return -1;
}

int api_is_context_error(const um_err *err) {
    return err->code == UM_ERR_INVALID_ARG && strstr(err->msg, "context") != NULL;
}
