/*
 * request.c — the WebSocket `generate` object -> api_gen (request.h). Pure; any thread.
 * Not here: building (api/gen.c), transport framing and ids (ws_protocol.c), scheduling (sched/).
 */
#include "api/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode/event_json.h"
#include "util/log.h"

/* Top-level fields a generation request may carry besides the decode parameters (others are
 * reported back as ignored). */
static const char *const k_known_fields[] = {"type", "event_id", "id", "prompt", "messages", "prompt_ids", "suffix",
                                             "params", "stream", NULL};

static int known_field(const char *k) {
    if (decode_param_canonical(k)) return 1;
    for (int i = 0; k_known_fields[i]; i++)
        if (strcmp(k_known_fields[i], k) == 0) return 1;
    return 0;
}

/* This protocol reports a bad field as invalid_request (the HTTP APIs: invalid_type / invalid_value). */
static int as_invalid_request(api_error *e) {
    if (strcmp(e->code, "unsupported") != 0) snprintf(e->code, sizeof e->code, "invalid_request");
    return -1;
}

/* The prompt (exactly one of prompt, messages, prompt_ids) and the suffix into g. */
static int parse_prompt(const model *m, const json_t *obj, api_gen *g, api_error *e) {
    const json_t *prompt = json_object_get(obj, "prompt");
    const json_t *msgs = json_object_get(obj, "messages");
    const json_t *pids = json_object_get(obj, "prompt_ids");
    const json_t *sfx = json_object_get(obj, "suffix");
    if (json_is_null(prompt)) prompt = NULL;
    if (json_is_null(msgs)) msgs = NULL;
    if (json_is_null(pids)) pids = NULL;
    if (json_is_null(sfx)) sfx = NULL;
    int given = !!prompt + !!msgs + !!pids;
    if (given != 1)
        return api_error_set(e, "invalid_request", "prompt",
                             given ? "give only one of \"prompt\", \"messages\" or \"prompt_ids\""
                                   : "missing the prompt: give \"prompt\" (text), \"messages\" (chat) or "
                                     "\"prompt_ids\" (token ids)");
    g->prompts = xcalloc(1, sizeof *g->prompts);
    if (pids) {
        if (!json_is_array(pids)) return api_error_set(e, "invalid_request", "prompt_ids", "\"prompt_ids\" must be an array of token ids");
        if (json_array_size(pids) == 0) return api_error_set(e, "invalid_request", "prompt_ids", "\"prompt_ids\" is empty");
        if (api_parse_token_ids(pids, "prompt_ids", "\"prompt_ids\"", &g->prompts[0], e) != 0) return as_invalid_request(e);
        g->n_prompts = 1;
    } else {
        if (!m->tok)
            return api_error_set(e, "unsupported", prompt ? "prompt" : "messages",
                                 "this model has no tokenizer; send \"prompt_ids\" instead");
        if (msgs) {
            if (!(g->messages = api_chat_messages(msgs, e))) return as_invalid_request(e);
            if (api_check_chat(m, e) != 0) return -1;
        } else {
            if (!json_is_string(prompt)) return api_error_set(e, "invalid_request", "prompt", "\"prompt\" must be a string");
            g->prompts[0].text = xstrndup(json_string_value(prompt), json_string_length(prompt));
            g->n_prompts = 1;
        }
    }
    if (sfx) {
        if (!json_is_string(sfx))
            return api_error_set(e, "invalid_request", "suffix", "\"suffix\" must be a string, got %s",
                                 oai_json_type_name(sfx));
        if (msgs)
            return api_error_set(e, "invalid_request", "suffix",
                                 "\"suffix\" goes with \"prompt\" or \"prompt_ids\" (infilling), not with \"messages\"");
        if (!m->tok) return api_error_set(e, "unsupported", "suffix", "this model has no tokenizer; it cannot read \"suffix\"");
        if (json_string_length(sfx) > 0) g->suffix = xstrndup(json_string_value(sfx), json_string_length(sfx));
    }
    return 0;
}

/* "stream": {"drafts", "draft_every", "every"} (a boolean, the HTTP APIs' "stream", is accepted). */
static int parse_stream(const json_t *obj, decode_params *p, api_gen_opts *o, api_error *e) {
    const json_t *stream = json_object_get(obj, "stream");
    if (!stream || json_is_null(stream) || json_is_boolean(stream)) return 0;
    if (!json_is_object(stream))
        return api_error_set(e, "invalid_request", "stream", "\"stream\" must be an object like {\"drafts\": true, \"every\": 1}");
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)stream, k, v) {
        if (strcmp(k, "drafts") == 0) {
            if (!json_is_boolean(v)) return api_error_set(e, "invalid_request", "stream.drafts", "\"stream.drafts\" must be true or false");
            p->stream_drafts = json_is_true(v);
        } else if (strcmp(k, "draft_every") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
                return api_error_set(e, "invalid_request", "stream.draft_every", "\"stream.draft_every\" must be an integer >= 1");
            p->draft_every = (int)json_integer_value(v);
        } else if (strcmp(k, "every") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1000000)
                return api_error_set(e, "invalid_request", "stream.every", "\"stream.every\" must be an integer >= 1");
            o->stream_every = (int)json_integer_value(v);
        } else {
            return api_error_set(e, "invalid_request", "stream",
                                 "unknown field \"stream.%s\" (known: drafts, draft_every, every)", k);
        }
    }
    return 0;
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

int api_gen_parse_ws(const model *m, const json_t *obj, const api_policy *pol, api_gen *g, api_gen_opts *o,
                     api_error *e) {
    const api_limits *lim = &pol->lim;
    decode_params defaults = api_policy_params(pol, m); /* + --algorithm-config defaults */
    api_gen_init(g, API_KIND_UNMASK, NULL, &defaults);
    memset(o, 0, sizeof *o);
    o->stream_every = 1;
    if (!json_is_object(obj)) return api_error_set(e, "invalid_request", "", "the request must be a JSON object");
    decode_params *p = &g->params;
    decode_params_src inner = {0}; /* names inside "params" (g->src: all the names the client used) */
    um_err err = {0};
    if (decode_params_apply_json(p, obj, &g->src, &err) != 0) return api_error_from(e, "invalid_request", &err);
    const json_t *params = json_object_get(obj, "params");
    if (params && !json_is_null(params)) {
        if (!json_is_object(params)) return api_error_set(e, "invalid_request", "params", "\"params\" must be an object");
        if (decode_params_apply_json(p, params, &inner, &err) != 0) return params_error(e, &err);
        for (int i = 0; i < DECODE_PARAMS_MAX; i++)
            if (inner.name[i]) g->src.name[i] = inner.name[i];
    }
    if (api_limit_params(lim, p, &g->src, &err) != 0) {
        int in_params = 0;
        for (int i = 0; i < DECODE_PARAMS_MAX; i++) in_params |= inner.name[i] && !strcmp(inner.name[i], err.param);
        return in_params ? params_error(e, &err) : api_error_from(e, "invalid_request", &err);
    }
    decode_params_settle(p, &g->src);
    if (decode_params_check(p, &err) != 0) {
        decode_params_err_rename(&err, &g->src);
        return api_error_from(e, "invalid_request", &err);
    }
    if (parse_stream(obj, p, o, e) != 0 || parse_prompt(m, obj, g, e) != 0) return -1;
    const char *k;
    const json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        if (known_field(k)) continue;
        if (!g->ignored) g->ignored = json_array();
        json_array_append_new(g->ignored, json_string(k));
    }
    return 0;
}
