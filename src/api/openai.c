/*
 * openai.c — the OpenAI dialect (openai.h): POST /v1/chat/completions and /v1/completions (and
 * the FIM completions that reuse them) parsed into the request core's api_gen, and their responses
 * (chunks, Mercury diffusing frames, bodies) encoded as api_dialect_openai.
 * Pure; any thread (the server calls it on the lws service thread).
 */
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/request.h"
#include "util/log.h"

/* ================================================================ requests */

/* model, n, stream, stream_options, diffusing, logprobs: fields common to the OpenAI endpoints. */
static int parse_openai_common(api_gen *g, const json_t *o, const api_limits *lim, api_error *e) {
    const json_t *v = api_field(o, "model");
    if (v && !json_is_string(v))
        return oai_error_set(e, 400, "invalid_type", "model", "model must be a string, got %s", oai_json_type_name(v));
    if (v) snprintf(g->model, sizeof g->model, "%s", json_string_value(v));
    long long n = 1;
    int r = api_get_int_field(o, "n", &n, e);
    if (r < 0) return -1;
    if (r && (n < 1 || n > lim->max_choices))
        return oai_error_set(e, 400, "invalid_value", "n", "n must be between 1 and %d, got %lld", lim->max_choices, n);
    g->n = (int)n;
    if (api_get_bool_field(o, "stream", &g->stream, e) || api_get_bool_field(o, "diffusing", &g->diffusing, e)) return -1;
    v = api_field(o, "stream_options");
    if (v) {
        if (!json_is_object(v))
            return oai_error_set(e, 400, "invalid_type", "stream_options", "stream_options must be an object, got %s",
                                 oai_json_type_name(v));
        const json_t *iu = api_field(v, "include_usage");
        if (iu && !json_is_boolean(iu))
            return oai_error_set(e, 400, "invalid_type", "stream_options.include_usage",
                                 "stream_options.include_usage must be a boolean, got %s", oai_json_type_name(iu));
        g->include_usage = iu && json_is_true(iu);
    }
    v = api_field(o, "logprobs");
    if (v && (json_is_true(v) || (json_is_integer(v) && json_integer_value(v) > 0)))
        return oai_error_set(e, 400, "unsupported", "logprobs",
                             "logprobs are not supported: a diffusion model commits tokens out of order");
    return api_parse_params(g, o, lim, e);
}

int openai_parse_chat(const char *body, size_t len, const decode_params *defaults, const api_limits *lim, api_gen *g,
                      api_error *e) {
    api_gen_init(g, API_KIND_CHAT, &api_dialect_openai, defaults);
    json_t *o = api_parse_body(body, len, e);
    if (!o) return -1;
    int rc = -1;
    const json_t *msgs = json_object_get(o, "messages");
    if (!msgs || json_is_null(msgs)) {
        oai_error_set(e, 400, "missing_required_parameter", "messages", "messages is required");
        goto out;
    }
    if (!(g->messages = api_chat_messages(msgs, e))) goto out;
    if (parse_openai_common(g, o, lim, e)) goto out;
    rc = 0;
out:
    json_decref(o);
    return rc;
}

int openai_parse_completion(const char *body, size_t len, const decode_params *defaults, const api_limits *lim,
                            api_gen *g, api_error *e) {
    api_gen_init(g, API_KIND_COMPLETION, &api_dialect_openai, defaults);
    json_t *o = api_parse_body(body, len, e);
    if (!o) return -1;
    int rc = -1;
    const json_t *pr = api_field(o, "prompt");
    if (!pr) {
        oai_error_set(e, 400, "missing_required_parameter", "prompt", "prompt is required");
        goto out;
    }
    /* string | [string] | [int] | [[int]] */
    int list = json_is_array(pr) && json_array_size(pr) > 0 &&
               (json_is_string(json_array_get(pr, 0)) || json_is_array(json_array_get(pr, 0)));
    size_t np = list ? json_array_size(pr) : 1;
    if ((int)np > lim->max_choices) {
        oai_error_set(e, 400, "invalid_value", "prompt", "prompt may hold at most %d prompts, got %zu", lim->max_choices, np);
        goto out;
    }
    g->prompts = xcalloc(np, sizeof *g->prompts);
    for (size_t i = 0; i < np; i++) {
        char name[32];
        snprintf(name, sizeof name, list ? "prompt[%zu]" : "prompt", i);
        if (api_parse_prompt_value(list ? json_array_get(pr, i) : pr, name, &g->prompts[i], e)) goto out;
        g->n_prompts++;
    }
    g->prompts_list = list;
    const json_t *sfx = api_field(o, "suffix");
    if (sfx && !json_is_string(sfx)) {
        oai_error_set(e, 400, "invalid_type", "suffix", "suffix must be a string, got %s", oai_json_type_name(sfx));
        goto out;
    }
    if (sfx && json_string_length(sfx) > 0) g->suffix = xstrndup(json_string_value(sfx), json_string_length(sfx));
    if (api_get_bool_field(o, "echo", &g->echo, e)) goto out;
    if (parse_openai_common(g, o, lim, e)) goto out;
    if (g->n_prompts * g->n > lim->max_choices) {
        oai_error_set(e, 400, "invalid_value", "n", "prompts x n must be at most %d, got %d", lim->max_choices,
                      g->n_prompts * g->n);
        goto out;
    }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

/* ================================================================ responses */

static json_t *usage_json(const api_resp *r) {
    long p, c, s;
    api_resp_usage(r, &p, &c, &s);
    return json_pack("{s:I, s:I, s:I, s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens", (json_int_t)c,
                     "total_tokens", (json_int_t)(p + c), "diffusion_steps", (json_int_t)s);
}

/* OpenAI finish_reason for a finished choice. */
static const char *oai_finish(const api_track *t) {
    const char *f = api_track_finish(t);
    if (!f) return NULL;
    if (strcmp(f, "length") == 0) return "length";
    return "stop";
}

/* Chunk envelope shared by chat and completions streams. */
static json_t *chunk_new(const api_resp *r, json_t *choice) {
    int chat = r->kind == API_KIND_CHAT;
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", r->id, "object",
                          chat ? "chat.completion.chunk" : "text_completion", "created", (json_int_t)r->created, "model",
                          r->model, "choices", choice);
    if (r->include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

static json_t *chat_choice(int index, json_t *delta, const char *finish) {
    return json_pack("{s:i, s:o, s:n, s:o}", "index", index, "delta", delta, "logprobs", "finish_reason",
                     finish ? json_string(finish) : json_null());
}

static json_t *text_choice(const api_resp *r, int index, const char *text, size_t len, const char *finish) {
    json_t *c = json_pack("{s:o, s:i, s:n, s:o}", "text", oai_json_string_lossy(text, len), "index", index, "logprobs",
                          "finish_reason", finish ? json_string(finish) : json_null());
    if (r->kind == API_KIND_FIM) /* Mistral-style FIM clients read delta.content */
        json_object_set_new(c, "delta", json_pack("{s:o}", "content", oai_json_string_lossy(text, len)));
    return c;
}

static void oai_begin(api_resp *r, json_t *out) {
    for (int i = 0; i < r->n; i++) {
        if (r->kind == API_KIND_CHAT)
            json_array_append_new(out, chunk_new(r, chat_choice(r->c[i].index,
                                                                json_pack("{s:s, s:s}", "role", "assistant", "content", ""),
                                                                NULL)));
        else if ((r->kind == API_KIND_COMPLETION || r->kind == API_KIND_FIM) && r->c[i].echo)
            json_array_append_new(out, chunk_new(r, text_choice(r, r->c[i].index, r->c[i].echo, strlen(r->c[i].echo), NULL)));
    }
}

/* A Mercury-style frame: whole canvas (or final text) + diffusion_meta. */
static json_t *frame_chunk(const api_resp *r, api_choice *c, const char *finish) {
    char *canvas = api_track_canvas(c->t);
    json_t *choice;
    if (r->kind == API_KIND_CHAT)
        choice = chat_choice(c->index, json_pack("{s:s, s:o}", "role", "assistant", "content",
                                                 oai_json_string_lossy(canvas, strlen(canvas))),
                             finish);
    else
        choice = text_choice(r, c->index, canvas, strlen(canvas), finish);
    free(canvas);
    json_t *o = chunk_new(r, choice);
    json_object_set_new(o, "diffusion_meta", api_track_meta(c->t));
    return o;
}

static void oai_event(api_resp *r, api_choice *c, int flags, int slow, json_t *out) {
    const int done = (flags & TRACK_DONE) != 0, clean = api_choice_clean_end(c, flags);
    if (r->diffusing) {
        if ((flags & TRACK_FRAME) && !done && !slow) json_array_append_new(out, frame_chunk(r, c, NULL));
        if (clean) {
            json_array_append_new(out, frame_chunk(r, c, oai_finish(c->t)));
            if (r->kind == API_KIND_CHAT)
                json_array_append_new(out, chunk_new(r, chat_choice(c->index, json_object(), oai_finish(c->t))));
        }
        size_t n;
        api_track_take(c->t, &n); /* keep the append-only cursor in step */
        return;
    }
    if (flags & TRACK_TEXT) {
        size_t n = 0;
        const char *d = api_track_take(c->t, &n);
        if (n) {
            json_t *choice_obj = r->kind == API_KIND_CHAT
                                     ? chat_choice(c->index, json_pack("{s:o}", "content", oai_json_string_lossy(d, n)), NULL)
                                     : text_choice(r, c->index, d, n, NULL);
            json_array_append_new(out, chunk_new(r, choice_obj));
        }
    }
    if (clean) {
        json_t *choice_obj = r->kind == API_KIND_CHAT ? chat_choice(c->index, json_object(), oai_finish(c->t))
                                                      : text_choice(r, c->index, "", 0, oai_finish(c->t));
        json_array_append_new(out, chunk_new(r, choice_obj));
    }
}

static void oai_end(api_resp *r, json_t *out) {
    if (r->include_usage) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", r->id, "object",
                              r->kind == API_KIND_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)r->created, "model", r->model, "choices", "usage", usage_json(r));
        json_array_append_new(out, o);
    }
}

static json_t *oai_body(api_resp *r) {
    int chat = r->kind == API_KIND_CHAT;
    json_t *choices = json_array();
    for (int i = 0; i < r->n; i++) {
        api_choice *c = &r->c[i];
        size_t len;
        const char *text = api_track_text(c->t, &len);
        char *full = NULL;
        if (c->echo) {
            size_t el = strlen(c->echo);
            full = xmalloc(el + len + 1);
            memcpy(full, c->echo, el);
            memcpy(full + el, text, len);
            full[el + len] = 0;
            text = full;
            len += el;
        }
        json_t *ch;
        if (chat)
            ch = json_pack("{s:i, s:{s:s, s:o}, s:n, s:s?}", "index", c->index, "message", "role", "assistant", "content",
                           oai_json_string_lossy(text, len), "logprobs", "finish_reason", oai_finish(c->t));
        else {
            ch = json_pack("{s:o, s:i, s:n, s:s?}", "text", oai_json_string_lossy(text, len), "index", c->index, "logprobs",
                           "finish_reason", oai_finish(c->t));
            if (r->kind == API_KIND_FIM)
                json_object_set_new(ch, "message",
                                    json_pack("{s:s, s:o}", "role", "assistant", "content", oai_json_string_lossy(text, len)));
        }
        free(full);
        json_array_append_new(choices, ch);
    }
    return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object", chat ? "chat.completion" : "text_completion",
                     "created", (json_int_t)r->created, "model", r->model, "choices", choices, "usage", usage_json(r));
}

const api_dialect api_dialect_openai = {.sse_done = 1, .begin = oai_begin, .event = oai_event, .end = oai_end,
                                        .body = oai_body};
