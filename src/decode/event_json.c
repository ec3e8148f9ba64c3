/*
 * event_json.c — decode events and parameters <-> JSON (event_json.h). Pure; any thread.
 */
#include "decode/event_json.h"

#include <math.h>
#include <string.h>

static json_t *str_n(const char *s, size_t n) {
    json_t *j = json_stringn(s ? s : "", s ? n : 0);
    return j ? j : json_string("");   /* invalid UTF-8 cannot happen: pieces/text are sanitized */
}

static json_t *real_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *usage_json(const decode_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens, "steps", u->steps,
                     "committed", u->committed);
}

json_t *decode_event_to_json(const decode_event *ev) {
    json_t *o = json_object();
    switch (ev->type) {
    case DECODE_EVENT_STEP: {
        json_object_set_new(o, "type", json_string("step"));
        json_object_set_new(o, "step", json_integer(ev->step));
        json_object_set_new(o, "block", json_integer(ev->block));
        json_object_set_new(o, "n_blocks", json_integer(ev->n_blocks));
        json_t *cs = json_array();
        for (int i = 0; i < ev->n_commits; i++) {
            const decode_commit *c = &ev->commits[i];
            json_t *j = json_object();
            json_object_set_new(j, "pos", json_integer(c->pos));
            json_object_set_new(j, "index", json_integer(c->index));
            json_object_set_new(j, "id", json_integer(c->token));
            json_object_set_new(j, "text", str_n(c->piece, c->piece ? strlen(c->piece) : 0));
            json_object_set_new(j, "confidence", real_or_null(c->confidence));
            json_object_set_new(j, "special", json_boolean(c->special));
            json_array_append_new(cs, j);
        }
        json_object_set_new(o, "commits", cs);
        if (ev->n_drafts > 0) {
            json_t *ds = json_array();
            for (int i = 0; i < ev->n_drafts; i++) {
                const decode_draft *d = &ev->drafts[i];
                json_t *j = json_object();
                json_object_set_new(j, "pos", json_integer(d->pos));
                json_object_set_new(j, "index", json_integer(d->index));
                json_object_set_new(j, "id", json_integer(d->token));
                json_object_set_new(j, "text", str_n(d->piece, d->piece ? strlen(d->piece) : 0));
                json_object_set_new(j, "confidence", real_or_null(d->confidence));
                json_object_set_new(j, "special", json_boolean(d->special));
                json_array_append_new(ds, j);
            }
            json_object_set_new(o, "drafts", ds);
        }
        json_object_set_new(o, "progress",
                            json_pack("{s:i, s:i, s:i, s:i}", "steps", ev->step + 1, "masks_left", ev->masks_left,
                                      "block_masks_left", ev->block_masks_left, "committed", ev->usage.committed));
        break;
    }
    case DECODE_EVENT_BLOCK:
        json_object_set_new(o, "type", json_string("block"));
        json_object_set_new(o, "block", json_integer(ev->block));
        json_object_set_new(o, "n_blocks", json_integer(ev->n_blocks));
        json_object_set_new(o, "start", json_integer(ev->block_start));
        json_object_set_new(o, "end", json_integer(ev->block_end));
        json_object_set_new(o, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(o, "steps", json_integer(ev->step));
        break;
    case DECODE_EVENT_DONE:
        json_object_set_new(o, "type", json_string("done"));
        json_object_set_new(o, "finish_reason", json_string(decode_finish_name(ev->finish)));
        json_object_set_new(o, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(o, "error", ev->error ? json_string(ev->error) : json_null());
        json_object_set_new(o, "usage", usage_json(&ev->usage));
        json_object_set_new(o, "timings",
                            json_pack("{s:o, s:o, s:o, s:o}", "first_event_ms", real_or_null(ev->timings.first_event_ms),
                                      "total_ms", real_or_null(ev->timings.total_ms), "decode_ms",
                                      real_or_null(ev->timings.decode_ms), "tokens_per_s",
                                      real_or_null(ev->timings.tokens_per_s)));
        break;
    }
    return o;
}

/* ---------------------------------------------------------------- params */

static int get_int(const json_t *obj, const char *key, int *dst, um_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < -2147483647 || x > 2147483647)
            return um_err_param(err, key, "%s is out of range, got %lld", key, (long long)x);
        *dst = (int)x;
        return 0;
    }
    if (json_is_real(v)) {
        double x = json_real_value(v);
        if (x == floor(x) && fabs(x) < 2147483647.0) {
            *dst = (int)x;
            return 0;
        }
    }
    return um_err_param(err, key, "%s must be an integer", key);
}

static int get_num(const json_t *obj, const char *key, double *dst, um_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return um_err_param(err, key, "%s must be a number", key);
    *dst = json_number_value(v);
    return 0;
}

static int get_bool(const json_t *obj, const char *key, int *dst, um_err *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return um_err_param(err, key, "%s must be true or false", key);
    *dst = json_is_true(v);
    return 0;
}

int decode_params_apply_json(decode_params *p, const json_t *obj, um_err *err) {
    if (!json_is_object(obj)) return um_err_param(err, "params", "decode parameters must be a JSON object");
    if (get_int(obj, "max_tokens", &p->gen_length, err) || get_int(obj, "max_new_tokens", &p->gen_length, err) ||
        get_int(obj, "gen_length", &p->gen_length, err) || get_int(obj, "block_length", &p->block_length, err) ||
        get_int(obj, "steps", &p->steps, err) || get_num(obj, "threshold", &p->threshold, err) ||
        get_num(obj, "factor", &p->factor, err) || get_num(obj, "low_threshold", &p->low_threshold, err) ||
        get_num(obj, "credit_alpha", &p->credit_alpha, err) || get_num(obj, "credit_gamma", &p->credit_gamma, err) ||
        get_num(obj, "credit_decay", &p->credit_decay, err) || get_num(obj, "temperature", &p->temperature, err) ||
        get_int(obj, "top_k", &p->top_k, err) || get_num(obj, "top_p", &p->top_p, err) ||
        get_num(obj, "cfg_scale", &p->cfg_scale, err) || get_bool(obj, "logits_eos_inf", &p->logits_eos_inf, err) ||
        get_bool(obj, "confidence_eos_eot_inf", &p->confidence_eos_eot_inf, err) ||
        get_bool(obj, "stop_at_eos", &p->stop_at_eos, err) || get_bool(obj, "drafts", &p->stream_drafts, err) ||
        get_bool(obj, "stream_drafts", &p->stream_drafts, err) || get_int(obj, "draft_every", &p->draft_every, err) ||
        get_int(obj, "cache_refresh", &p->cache_refresh, err) || get_int(obj, "prefix_look", &p->prefix_look, err) ||
        get_int(obj, "after_look", &p->after_look, err) || get_int(obj, "warmup_steps", &p->warmup_steps, err))
        return -1;
    const json_t *v = json_object_get(obj, "seed");
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return um_err_param(err, "seed", "seed must be a non-negative integer");
        p->seed = (uint64_t)json_integer_value(v);
    }
    v = json_object_get(obj, "decoder");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) || decode_decoder_parse(json_string_value(v), &p->decoder) != 0)
            return um_err_param(err, "decoder", "decoder must be one of low_confidence, random, threshold, factor, hierarchy, credit");
    }
    v = json_object_get(obj, "block_layout");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) || decode_layout_parse(json_string_value(v), &p->layout) != 0)
            return um_err_param(err, "block_layout", "block_layout must be llada or aligned");
    }
    v = json_object_get(obj, "cache");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v) || decode_cache_parse(json_string_value(v), &p->cache) != 0)
            return um_err_param(err, "cache", "cache must be one of none, prefix, dual, vicinity");
    }
    return 0;
}

json_t *decode_params_to_json(const decode_params *p) {
    json_t *o = json_object();
    json_object_set_new(o, "gen_length", json_integer(p->gen_length));
    json_object_set_new(o, "block_length", json_integer(p->block_length));
    json_object_set_new(o, "steps", json_integer(p->steps));
    json_object_set_new(o, "decoder", json_string(decode_decoder_name(p->decoder)));
    json_object_set_new(o, "threshold", json_real(p->threshold));
    json_object_set_new(o, "factor", json_real(p->factor));
    json_object_set_new(o, "low_threshold", json_real(p->low_threshold));
    json_object_set_new(o, "credit_alpha", json_real(p->credit_alpha));
    json_object_set_new(o, "credit_gamma", json_real(p->credit_gamma));
    json_object_set_new(o, "credit_decay", json_real(p->credit_decay));
    json_object_set_new(o, "temperature", json_real(p->temperature));
    json_object_set_new(o, "top_k", json_integer(p->top_k));
    json_object_set_new(o, "top_p", json_real(p->top_p));
    json_object_set_new(o, "seed", json_integer((json_int_t)p->seed));
    json_object_set_new(o, "cfg_scale", json_real(p->cfg_scale));
    json_object_set_new(o, "logits_eos_inf", json_boolean(p->logits_eos_inf));
    json_object_set_new(o, "confidence_eos_eot_inf", json_boolean(p->confidence_eos_eot_inf));
    json_object_set_new(o, "block_layout", json_string(decode_layout_name(p->layout)));
    json_object_set_new(o, "stop_at_eos", json_boolean(p->stop_at_eos));
    json_object_set_new(o, "stream_drafts", json_boolean(p->stream_drafts));
    json_object_set_new(o, "draft_every", json_integer(p->draft_every));
    json_object_set_new(o, "cache", json_string(decode_cache_name(p->cache)));
    json_object_set_new(o, "cache_refresh", json_integer(p->cache_refresh));
    json_object_set_new(o, "prefix_look", json_integer(p->prefix_look));
    json_object_set_new(o, "after_look", json_integer(p->after_look));
    json_object_set_new(o, "warmup_steps", json_integer(p->warmup_steps));
    return o;
}
