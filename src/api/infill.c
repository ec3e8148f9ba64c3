/*
 * infill.c — llama.cpp /infill and /v1/fim/completions over native infilling (see infill.h).
 * Pure; any thread.
 */
#include "api/infill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/openai.h"
#include "util/log.h"
#include "util/strbuf.h"

static int opt_string(const json_t *o, const char *k, const char **out, api_error *e) {
    const json_t *v = json_object_get(o, k);
    *out = "";
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return oai_error_set(e, 400, "invalid_type", k, "%s must be a string", k);
    *out = json_string_value(v);
    return 0;
}

int infill_parse(const char *body, size_t len, const decode_params *defaults, const api_limits *lim, api_gen *g,
                 api_error *e) {
    api_gen_init(g, API_KIND_INFILL, &api_dialect_infill, defaults);
    json_t *o = api_parse_body(body, len, e);
    if (!o) return -1;
    int rc = -1;
    strbuf pre = STRBUF_INIT;
    const char *prefix, *suffix, *prompt;
    if (opt_string(o, "input_prefix", &prefix, e) || opt_string(o, "input_suffix", &suffix, e) ||
        opt_string(o, "prompt", &prompt, e))
        goto out;
    const json_t *extra = json_object_get(o, "input_extra");
    if (extra && !json_is_null(extra)) {
        if (!json_is_array(extra)) {
            oai_error_set(e, 400, "invalid_type", "input_extra", "input_extra must be an array of {filename, text} objects");
            goto out;
        }
        for (size_t i = 0; i < json_array_size(extra); i++) {
            const json_t *ch = json_array_get(extra, i);
            const json_t *fn = json_object_get(ch, "filename"), *tx = json_object_get(ch, "text");
            if (!json_is_object(ch) || !json_is_string(tx) || (fn && !json_is_null(fn) && !json_is_string(fn))) {
                oai_error_set(e, 400, "invalid_type", "input_extra",
                              "input_extra[%zu] must be an object with a string \"text\" (and optional \"filename\")", i);
                goto out;
            }
            if (json_is_string(fn) && json_string_length(fn)) {
                strbuf_put(&pre, json_string_value(fn), json_string_length(fn));
                strbuf_put(&pre, "\n", 1);
            }
            strbuf_put(&pre, json_string_value(tx), json_string_length(tx));
            strbuf_put(&pre, "\n\n", 2);
        }
    }
    strbuf_puts(&pre, prefix);
    strbuf_puts(&pre, prompt);
    g->prompts = xcalloc(1, sizeof *g->prompts);
    g->prompts[0].text = strbuf_take(&pre, NULL);
    g->n_prompts = 1;
    if (suffix[0]) g->suffix = xstrdup(suffix);
    const json_t *st = json_object_get(o, "stream");
    if (st && !json_is_null(st) && !json_is_boolean(st)) {
        oai_error_set(e, 400, "invalid_type", "stream", "stream must be a boolean");
        goto out;
    }
    g->stream = json_is_true(st);
    const json_t *rf = json_object_get(o, "response_fields");
    if (rf && !json_is_null(rf)) {
        if (!json_is_array(rf)) {
            oai_error_set(e, 400, "invalid_type", "response_fields", "response_fields must be an array of strings");
            goto out;
        }
        for (size_t i = 0; i < json_array_size(rf); i++)
            if (!json_is_string(json_array_get(rf, i))) {
                oai_error_set(e, 400, "invalid_type", "response_fields", "response_fields[%zu] must be a string", i);
                goto out;
            }
        if (json_array_size(rf)) g->response_fields = json_incref((json_t *)rf);
    }
    long long ni = 0;
    int have = api_get_int_field(o, "n_indent", &ni, e);
    if (have < 0) goto out;
    if (have && (ni < 0 || ni > 1000000)) {
        oai_error_set(e, 400, "invalid_value", "n_indent", "n_indent must be between 0 (off) and 1000000, got %lld", ni);
        goto out;
    }
    g->n_indent = (int)ni;
    /* llama.cpp's n_cmpl (falling back to "n", as llama.cpp does): that many completions of the one
     * prompt, answered as an array; copies differ by seed (seed, seed + 1, ...) */
    const char *ncf = api_field(o, "n_cmpl") ? "n_cmpl" : "n";
    long long nc = 1;
    have = api_get_int_field(o, ncf, &nc, e);
    if (have < 0) goto out;
    if (have && (nc < 1 || nc > lim->max_choices)) {
        oai_error_set(e, 400, "invalid_value", ncf, "%s must be between 1 and %d, got %lld", ncf, lim->max_choices, nc);
        goto out;
    }
    g->n = (int)nc;
    if (api_parse_params(g, o, lim, e)) goto out;
    rc = 0;
out:
    strbuf_free(&pre);
    json_decref(o);
    return rc;
}

int infill_parse_fim(const char *body, size_t len, const decode_params *defaults, const api_limits *lim, api_gen *g,
                     api_error *e) {
    if (openai_parse_completion(body, len, defaults, lim, g, e)) return -1;
    g->kind = API_KIND_FIM;
    return 0;
}

json_t *infill_chunk(int index, const char *delta, size_t len, const api_track *t, int n_prompt) {
    size_t tl;
    api_track_text(t, &tl);
    json_t *ids = api_track_output_ids(t);
    json_int_t predicted = (json_int_t)json_array_size(ids);
    json_decref(ids);
    return json_pack("{s:i, s:o, s:[], s:b, s:i, s:I, s:i}", "index", index, "content", oai_json_string_lossy(delta, len),
                     "tokens", "stop", 0, "id_slot", -1, "tokens_predicted", predicted, "tokens_evaluated", n_prompt);
}

static double num(const json_t *o, const char *k) { return o ? json_number_value(json_object_get(o, k)) : 0.0; }

/* Value at "a/b/c" inside o, or NULL. */
static json_t *path_get(json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = o;
    for (char *tok = strtok(buf, "/"); tok && cur; tok = strtok(NULL, "/")) cur = json_object_get(cur, tok);
    return cur;
}

json_t *infill_final(const api_resp *r, const api_choice *c, int streaming, const json_t *response_fields) {
    const api_track *t = c ? c->t : NULL;
    const int n_prompt = c ? c->n_prompt : 0;
    size_t len = 0;
    const char *text = t ? api_track_text(t, &len) : "";
    const char *fin = t ? api_track_finish(t) : NULL;
    const char *sw = t ? api_track_stop_word(t) : NULL;
    const char *stop_type = !fin ? "none" : sw ? "word" : strcmp(fin, "length") == 0 ? "limit" : "eos";
    const json_t *u = t ? api_track_usage(t) : NULL;
    const json_t *tm = t ? api_track_timings(t) : NULL;
    const json_int_t predicted_n = u ? json_integer_value(json_object_get(u, "completion_tokens")) : 0; /* a count */
    double predicted_ms = num(tm, "decode_ms"), prompt_ms = num(tm, "first_event_ms");
    /* cache_n / tokens_cached: tokens reused from an earlier request's cache — none: every position's
     * keys and values depend on the whole canvas (bidirectional attention over prefix, hole and
     * suffix), so no earlier request's cache is exact for this one (docs/http-api.md) */
    json_t *timings = json_pack("{s:i, s:i, s:f, s:f, s:f, s:I, s:f, s:f, s:f}", "cache_n", 0, "prompt_n", n_prompt,
                                "prompt_ms", prompt_ms, "prompt_per_token_ms", n_prompt ? prompt_ms / n_prompt : 0.0,
                                "prompt_per_second", prompt_ms > 0 ? n_prompt * 1000.0 / prompt_ms : 0.0,
                                "predicted_n", predicted_n, "predicted_ms", predicted_ms, "predicted_per_token_ms",
                                predicted_n > 0 ? predicted_ms / (double)predicted_n : 0.0, "predicted_per_second",
                                predicted_ms > 0 ? (double)predicted_n * 1000.0 / predicted_ms : 0.0);
    json_t *settings = r->settings ? json_deep_copy(r->settings) : json_object();
    json_object_set_new(settings, "n_ctx", json_integer(r->n_ctx));
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(c ? c->index : 0));
    json_object_set_new(o, "content", streaming ? json_string("") : oai_json_string_lossy(text, len));
    json_object_set_new(o, "tokens", json_array());
    json_object_set_new(o, "id_slot", json_integer(-1));
    json_object_set_new(o, "stop", json_true());
    json_object_set_new(o, "model", json_string(r->model[0] ? r->model : "unmask"));
    json_object_set_new(o, "tokens_predicted", json_integer(predicted_n));
    json_object_set_new(o, "tokens_evaluated", json_integer(n_prompt));
    json_object_set_new(o, "generation_settings", settings);
    json_object_set_new(o, "prompt", r->prompt_text ? oai_json_string_lossy(r->prompt_text, strlen(r->prompt_text))
                                                    : json_string(""));
    json_object_set_new(o, "has_new_line", json_boolean(memchr(text, '\n', len) != NULL));
    json_object_set_new(o, "truncated", json_false());
    json_object_set_new(o, "stop_type", json_string(stop_type));
    json_object_set_new(o, "stopping_word", json_string(sw ? sw : ""));
    json_object_set_new(o, "tokens_cached", json_integer(0));
    json_object_set_new(o, "time_limited", json_boolean(t && api_track_time_limited(t)));
    json_object_set_new(o, "diffusion_steps", json_integer(t ? api_track_steps(t) : 0));
    json_object_set_new(o, "timings", timings);
    if (!response_fields) return o;
    json_t *sel = json_object();
    size_t i;
    const json_t *f;
    json_array_foreach(response_fields, i, f) {
        const char *path = json_string_value(f);
        json_t *v = path && path[0] ? path_get(o, path) : NULL;
        if (v) json_object_set(sel, path, v);
    }
    json_decref(o);
    return sel;
}

/* ---------------------------------------------------------------- the dialect */

static void infill_event(api_resp *r, api_choice *c, int flags, int slow, json_t *out) {
    (void)slow;
    if (flags & TRACK_TEXT) {
        size_t n = 0;
        const char *d = api_track_take(c->t, &n);
        if (n) json_array_append_new(out, infill_chunk(c->index, d, n, c->t, c->n_prompt));
    }
    if (api_choice_clean_end(c, flags)) json_array_append_new(out, infill_final(r, c, 1, NULL));
}

/* One object, or — n_cmpl > 1 — an array of them in index order, as llama.cpp answers. */
static json_t *infill_body(api_resp *r) {
    if (r->warmup || r->n == 0) return infill_final(r, NULL, 0, r->response_fields);
    if (r->n == 1) return infill_final(r, &r->c[0], 0, r->response_fields);
    json_t *arr = json_array();
    for (int i = 0; i < r->n; i++) json_array_append_new(arr, infill_final(r, &r->c[i], 0, r->response_fields));
    return arr;
}

const api_dialect api_dialect_infill = {.sse_done = 0, .event = infill_event, .body = infill_body};
