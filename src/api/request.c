/*
 * request.c — prompt + decode parameters from JSON (request.h). Pure; any thread.
 * Not here: transport framing and ids (ws_protocol.c), scheduling (sched/).
 */
#include "api/request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/algo_config.h"
#include "api/api_error.h"
#include "decode/event_json.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/log.h"
#include "util/strbuf.h"

#define API_MAX_PROMPT_IDS (1 << 20)

int api_error_vset(api_error *e, const char *code, const char *param, const char *fmt, va_list ap) {
    if (!e) return -1;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
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
    if (!e) return -1;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", err->param);
    snprintf(e->msg, sizeof e->msg, "%s", err->msg);
    return -1;
}

/* One message's content as text: a string, null (""), or text parts concatenated. NULL + e
 * filled otherwise. */
static json_t *message_text(const json_t *content, size_t i, api_error *e) {
    if (!content || json_is_null(content)) return json_string("");
    if (json_is_string(content)) return json_incref((json_t *)content);
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!json_is_array(content)) {
        api_error_set(e, "invalid_type", param, "%s must be a string or an array of content parts, got %s", param,
                      oai_json_type_name(content));
        return NULL;
    }
    strbuf buf = STRBUF_INIT;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *part = json_array_get(content, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            strbuf_free(&buf);
            api_error_set(e, "invalid_type", param, "%s[%zu] must be an object with a \"type\"", param, k);
            return NULL;
        }
        if (strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            strbuf_free(&buf);
            api_error_set(e, "unsupported", param, "%s[%zu]: content parts of type '%.32s' are not supported (text only)",
                          param, k, json_string_value(type));
            return NULL;
        }
        strbuf_put(&buf, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(strbuf_str(&buf), buf.n);
    strbuf_free(&buf);
    return s;
}

json_t *api_chat_messages(const json_t *msgs, api_error *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        api_error_set(e, "invalid_value", "messages", "messages must be a non-empty array of {role, content} objects");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *mo = json_array_get(msgs, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const json_t *role = json_is_object(mo) ? json_object_get(mo, "role") : NULL;
        if (!json_is_string(role)) {
            api_error_set(e, "invalid_type", param, "messages[%zu] must be an object with a string \"role\"", i);
            json_decref(out);
            return NULL;
        }
        /* exact names only: the template writes the role as is, and the rendered text is read with
         * special tokens recognised (a role is not a place for free text) */
        const char *rs = json_string_value(role);
        size_t rn = json_string_length(role);
        int known = strlen(rs) == rn; /* no NUL inside */
        if (known && strcmp(rs, "developer") == 0) rs = "system";
        if (!known || (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))) {
            json_t *shown = oai_json_string_lossy(json_string_value(role), rn < 32 ? rn : 32);
            char *q = json_dumps(shown, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
            json_decref(shown);
            api_error_set(e, "invalid_value", param, "%s must be one of system, developer, user, assistant, tool, got %s%s",
                          param, q ? q : "?", rn > 32 ? " (its first 32 bytes)" : "");
            free(q);
            json_decref(out);
            return NULL;
        }
        json_t *text = message_text(json_object_get(mo, "content"), i, e);
        if (!text) {
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", rs, "content", text));
    }
    return out;
}

int api_prompt_tokens(const model *m, const json_t *obj, int32_t **ids, int *n, api_error *e) {
    const json_t *prompt = json_object_get(obj, "prompt");
    const json_t *msgs = json_object_get(obj, "messages");
    const json_t *pids = json_object_get(obj, "prompt_ids");
    if (json_is_null(prompt)) prompt = NULL;
    if (json_is_null(msgs)) msgs = NULL;
    if (json_is_null(pids)) pids = NULL;
    int given = !!prompt + !!msgs + !!pids;
    if (given != 1)
        return api_error_set(e, "invalid_request", given ? "prompt" : "prompt",
                             given ? "give only one of \"prompt\", \"messages\" or \"prompt_ids\""
                                   : "missing the prompt: give \"prompt\" (text), \"messages\" (chat) or "
                                     "\"prompt_ids\" (token ids)");
    *ids = NULL;
    *n = 0;
    if (pids) {
        if (!json_is_array(pids)) return api_error_set(e, "invalid_request", "prompt_ids", "\"prompt_ids\" must be an array of token ids");
        size_t k = json_array_size(pids);
        if (k == 0) return api_error_set(e, "invalid_request", "prompt_ids", "\"prompt_ids\" is empty");
        if (k > API_MAX_PROMPT_IDS)
            return api_error_set(e, "invalid_request", "prompt_ids", "\"prompt_ids\" has %zu ids, at most %d are allowed", k,
                                 API_MAX_PROMPT_IDS);
        int32_t *v = xmalloc(k * sizeof *v);
        for (size_t i = 0; i < k; i++) {
            const json_t *x = json_array_get(pids, i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
                free(v);
                return api_error_set(e, "invalid_request", "prompt_ids",
                                     "\"prompt_ids\"[%zu] must be a non-negative integer token id", i);
            }
            v[i] = (int32_t)json_integer_value(x);
        }
        *ids = v;
        *n = (int)k;
        return 0;
    }
    if (!m->tok)
        return api_error_set(e, "unsupported", prompt ? "prompt" : "messages",
                             "this model has no tokenizer; send \"prompt_ids\" instead");
    um_err err = {0};
    json_t *chat = NULL;
    if (msgs) {
        if (!(chat = api_chat_messages(msgs, e))) {
            if (strcmp(e->code, "unsupported") != 0) e->code = "invalid_request"; /* this protocol's code for a bad field */
            return -1;
        }
        if (!m->chat) {
            json_decref(chat);
            return api_error_set(e, "unsupported", "messages",
                                 "this model has no chat template; send \"prompt\" (raw text) instead");
        }
    } else if (!json_is_string(prompt)) {
        return api_error_set(e, "invalid_request", "prompt", "\"prompt\" must be a string");
    }
    size_t nn = 0;
    int rc = chat ? chat_template_encode(m->chat, m->tok, chat, 1, ids, &nn, &err) /* contents stay plain text */
                  : tokenizer_encode(m->tok, json_string_value(prompt), json_string_length(prompt), 1, ids, &nn, &err);
    json_decref(chat);
    if (rc != 0) {
        if (msgs) um_err_prefix(&err, "chat template");
        snprintf(err.param, sizeof err.param, "%s", msgs ? "messages" : "prompt");
        return api_error_from(e, "invalid_request", &err);
    }
    if (nn == 0) {
        free(*ids);
        *ids = NULL;
        return api_error_set(e, "invalid_request", msgs ? "messages" : "prompt", "the prompt is empty");
    }
    *n = (int)nn;
    return 0;
}

/* Top-level fields a generation request may carry besides the decode parameters (others are
 * reported back as ignored). */
static const char *const k_known_fields[] = {"type", "event_id", "id", "prompt", "messages", "prompt_ids", "params",
                                             "stream", NULL};

static int known_field(const char *k) {
    if (decode_param_canonical(k)) return 1;
    for (int i = 0; k_known_fields[i]; i++)
        if (strcmp(k_known_fields[i], k) == 0) return 1;
    return 0;
}

void api_gen_request_free(api_gen_request *r) {
    if (r->seq) decode_seq_free(r->seq);
    if (r->params) json_decref(r->params);
    if (r->ignored) json_decref(r->ignored);
    memset(r, 0, sizeof *r);
}

/* An error about a field inside "params": named "params.FIELD" (in the message too when it starts
 * with the field's name). */
static int params_error(api_error *e, um_err *err) {
    size_t n = strlen(err->param);
    if (n && strncmp(err->msg, err->param, n) == 0) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "params.%s", err->msg);
        snprintf(err->msg, sizeof err->msg, "%s", msg);
    }
    char inner[sizeof err->param];
    snprintf(inner, sizeof inner, "params.%.50s", err->param);
    snprintf(err->param, sizeof err->param, "%s", inner);
    return api_error_from(e, "invalid_request", err);
}

int api_gen_request_parse(const model *m, const json_t *obj, const api_policy *pol, api_gen_request *out,
                          api_error *e) {
    const api_limits *lim = &pol->lim;
    memset(out, 0, sizeof *out);
    out->stream_every = 1;
    if (!json_is_object(obj)) return api_error_set(e, "invalid_request", "", "the request must be a JSON object");
    decode_params p = api_policy_params(pol, m); /* + --algorithm-config defaults */
    decode_params_src src = {0}, inner = {0}; /* names at the top level, inside "params" */
    um_err err = {0};
    if (decode_params_apply_json(&p, obj, &src, &err) != 0) return api_error_from(e, "invalid_request", &err);
    const json_t *params = json_object_get(obj, "params");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) return api_error_set(e, "invalid_request", "params", "\"params\" must be an object");
        if (decode_params_apply_json(&p, params, &inner, &err) != 0) return params_error(e, &err);
        for (int i = 0; i < DECODE_PARAMS_MAX; i++)
            if (inner.name[i]) src.name[i] = inner.name[i];
    }
    if (api_limit_params(lim, &p, &src, &err) != 0) {
        int in_params = 0;
        for (int i = 0; i < DECODE_PARAMS_MAX; i++) in_params |= inner.name[i] && !strcmp(inner.name[i], err.param);
        return in_params ? params_error(e, &err) : api_error_from(e, "invalid_request", &err);
    }
    decode_params_settle(&p, &src);
    if (decode_params_check(&p, &err) != 0) {
        decode_params_err_rename(&err, &src);
        return api_error_from(e, "invalid_request", &err);
    }
    const json_t *stream = json_object_get(obj, "stream");
    if (stream && !json_is_null(stream) && !json_is_boolean(stream)) { /* booleans: HTTP APIs' "stream" */
        if (!json_is_object(stream))
            return api_error_set(e, "invalid_request", "stream",
                                 "\"stream\" must be an object like {\"drafts\": true, \"every\": 1}");
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)stream, k, v) {
            if (strcmp(k, "drafts") == 0) {
                if (!json_is_boolean(v)) return api_error_set(e, "invalid_request", "stream.drafts", "\"stream.drafts\" must be true or false");
                p.stream_drafts = json_is_true(v);
            } else if (strcmp(k, "draft_every") == 0) {
                if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
                    return api_error_set(e, "invalid_request", "stream.draft_every", "\"stream.draft_every\" must be an integer >= 1");
                p.draft_every = (int)json_integer_value(v);
            } else if (strcmp(k, "every") == 0) {
                if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
                    return api_error_set(e, "invalid_request", "stream.every", "\"stream.every\" must be an integer >= 1");
                out->stream_every = (int)json_integer_value(v);
            } else {
                return api_error_set(e, "invalid_request", "stream",
                                     "unknown field \"stream.%s\" (known: drafts, draft_every, every)", k);
            }
        }
    }
    int32_t *ids = NULL;
    int n = 0;
    if (api_prompt_tokens(m, obj, &ids, &n, e) != 0) return -1;
    const char *prompt_param = json_object_get(obj, "prompt_ids") && !json_is_null(json_object_get(obj, "prompt_ids"))
                                   ? "prompt_ids"
                               : json_object_get(obj, "messages") && !json_is_null(json_object_get(obj, "messages"))
                                   ? "messages"
                                   : "prompt";
    if (api_limit_prompt_tokens(lim, prompt_param, n, 0, &err) != 0) {
        free(ids);
        return api_error_from(e, API_CODE_CONTEXT_LENGTH, &err);
    }
    if (api_limit_context(lim, prompt_param, n, p.gen_length, 0, &err) != 0) {
        free(ids);
        return api_error_from(e, API_CODE_CONTEXT_LENGTH, &err);
    }
    decode_seq *seq = decode_seq_create(m, &p, ids, n, &err);
    free(ids);
    if (!seq) {
        decode_params_err_rename(&err, &src);
        return api_error_from(e, api_is_context_error(&err) ? API_CODE_CONTEXT_LENGTH : "invalid_request", &err);
    }
    out->seq = seq;
    out->n_prompt = n;
    out->params = decode_params_to_json(&p);
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (known_field(k)) continue;
        if (!out->ignored) out->ignored = json_array();
        json_array_append_new(out->ignored, json_string(k));
    }
    return 0;
}
