/*
 * sglang.c — SGLang POST /generate parsing and response objects (see sglang.h). Pure; any thread.
 */
#include "api/sglang.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int sglang_parse_generate(const char *body, size_t len, const decode_params *defaults, const api_limits *lim,
                          api_gen *g, api_error *e) {
    api_gen_init(g, API_KIND_GENERATE, &api_dialect_sglang, defaults);
    json_t *o = api_parse_body(body, len, e);
    if (!o) return -1;
    int rc = -1;
    const json_t *text = json_object_get(o, "text"), *ids = json_object_get(o, "input_ids");
    if (json_is_null(text)) text = NULL;
    if (json_is_null(ids)) ids = NULL;
    if (!!text + !!ids != 1) {
        oai_error_set(e, 400, text ? "invalid_value" : "missing_required_parameter", "text",
                      text ? "give either text or input_ids, not both" : "text (or input_ids) is required");
        goto out;
    }
    const char *fname = text ? "text" : "input_ids";
    const json_t *pv = text ? text : ids;
    int list = text ? json_is_array(text) : (json_is_array(ids) && json_array_size(ids) > 0 &&
                                             json_is_array(json_array_get(ids, 0)));
    if (text && !json_is_string(text) && !json_is_array(text)) {
        oai_error_set(e, 400, "invalid_type", "text", "text must be a string or a list of strings");
        goto out;
    }
    size_t n = list ? json_array_size(pv) : 1;
    if (n == 0) {
        oai_error_set(e, 400, "invalid_value", fname, "%s must not be an empty list", fname);
        goto out;
    }
    if ((int)n > lim->max_choices) {
        oai_error_set(e, 400, "invalid_value", fname, "%s may hold at most %d prompts, got %zu", fname, lim->max_choices, n);
        goto out;
    }
    g->prompts = xcalloc(n, sizeof *g->prompts);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = list ? json_array_get(pv, i) : pv;
        char name[32];
        snprintf(name, sizeof name, list ? "%s[%zu]" : "%s", fname, i);
        if (text && !json_is_string(v)) {
            oai_error_set(e, 400, "invalid_type", name, "%s must be a string", name);
            goto out;
        }
        if (api_parse_prompt_value(v, name, &g->prompts[i], e)) goto out;
        g->n_prompts++;
    }
    g->prompts_list = list;
    const json_t *sp = json_object_get(o, "sampling_params");
    if (sp && !json_is_null(sp)) {
        if (!json_is_object(sp)) {
            oai_error_set(e, 400, "invalid_type", "sampling_params", "sampling_params must be an object");
            goto out;
        }
        if (api_parse_params(g, sp, lim, e)) {
            char param[64];
            snprintf(param, sizeof param, "sampling_params.%s", e->param);
            if (e->param[0]) snprintf(e->param, sizeof e->param, "%s", param);
            goto out;
        }
    }
    const json_t *st = json_object_get(o, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st)) {
        oai_error_set(e, 400, "invalid_type", "stream", "stream must be a boolean");
        goto out;
    }
    g->stream = json_is_true(st);
    const json_t *rid = json_object_get(o, "rid");
    if (rid && !json_is_null(rid)) {
        if (!json_is_string(rid)) {
            oai_error_set(e, 400, "invalid_type", "rid", "rid must be a string");
            goto out;
        }
        snprintf(g->rid, sizeof g->rid, "%s", json_string_value(rid));
    }
    rc = 0;
out:
    json_decref(o);
    return rc;
}

json_t *sglang_chunk(const char *rid, int index, int with_index, const api_track *t, int n_prompt, double e2e_s,
                     int streaming) {
    size_t len;
    const char *text = api_track_text(t, &len);
    json_t *fr = json_null();
    const char *f = api_track_finish(t);
    if (f) {
        const char *sw = api_track_stop_word(t);
        if (strcmp(f, "length") == 0) {
            const json_t *u = api_track_usage(t);
            fr = json_pack("{s:s, s:I}", "type", "length", "length",
                           u ? json_integer_value(json_object_get(u, "completion_tokens")) : (json_int_t)0);
        } else if (strcmp(f, "stop") == 0) {
            fr = sw ? json_pack("{s:s, s:s}", "type", "stop", "matched", sw) : json_pack("{s:s, s:n}", "type", "stop", "matched");
        } else {
            fr = json_pack("{s:s, s:s}", "type", "abort", "message", api_track_error(t) ? api_track_error(t) : f);
        }
    }
    (void)streaming;
    const json_t *u = api_track_usage(t);
    json_t *ids = api_track_output_ids(t);
    json_int_t completion = u ? json_integer_value(json_object_get(u, "completion_tokens")) : (json_int_t)json_array_size(ids);
    char id[160];
    if (with_index) snprintf(id, sizeof id, "%s_%d", rid, index);
    else snprintf(id, sizeof id, "%s", rid);
    json_t *meta = json_pack("{s:s, s:o, s:i, s:I, s:i, s:f, s:I}", "id", id, "finish_reason", fr, "prompt_tokens", n_prompt,
                             "completion_tokens", completion, "cached_tokens", 0, "e2e_latency", e2e_s, "diffusion_steps",
                             (json_int_t)api_track_steps(t));
    json_t *o = json_pack("{s:o, s:o, s:o}", "text", oai_json_string_lossy(text, len), "output_ids", ids, "meta_info", meta);
    if (with_index) json_object_set_new(o, "index", json_integer(index));
    return o;
}

/* ---------------------------------------------------------------- the dialect */

static void sglang_event(api_resp *r, api_choice *c, int flags, int slow, json_t *out) {
    (void)slow;
    if (!(flags & (TRACK_TEXT | TRACK_DONE)) || ((flags & TRACK_DONE) && !api_choice_clean_end(c, flags))) return;
    size_t n;
    api_track_take(c->t, &n);
    json_array_append_new(out, sglang_chunk(r->rid, c->index, r->prompts_list, c->t, c->n_prompt, api_resp_elapsed_s(r), 1));
}

static json_t *sglang_body(api_resp *r) {
    if (!r->prompts_list && r->n == 1)
        return sglang_chunk(r->rid, 0, 0, r->c[0].t, r->c[0].n_prompt, api_resp_elapsed_s(r), 0);
    json_t *a = json_array();
    for (int i = 0; i < r->n; i++)
        json_array_append_new(a, sglang_chunk(r->rid, r->c[i].index, 1, r->c[i].t, r->c[i].n_prompt, api_resp_elapsed_s(r), 0));
    return a;
}

const api_dialect api_dialect_sglang = {.sse_done = 1, .event = sglang_event, .body = sglang_body};
