/*
 * event_json.c — decode events and parameters <-> JSON (event_json.h). Pure; any thread.
 */
#include "decode/event_json.h"

#include <math.h>
#include <stddef.h>
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

/* The value v of field key (present, not null) into *dst; a message naming key when it does not fit. */
static int get_int(const json_t *v, const char *key, int *dst, um_err *err) {
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

static int get_num(const json_t *v, const char *key, double *dst, um_err *err) {
    if (!json_is_number(v)) return um_err_param(err, key, "%s must be a number", key);
    *dst = json_number_value(v);
    return 0;
}

static int get_bool(const json_t *v, const char *key, int *dst, um_err *err) {
    if (!json_is_boolean(v)) return um_err_param(err, key, "%s must be true or false", key);
    *dst = json_is_true(v);
    return 0;
}

/* ---------------------------------------------------------------- decode parameters as JSON */

/* How a decode parameter is written in JSON. */
enum dp_type { DP_INT, DP_NUM, DP_BOOL, DP_SEED, DP_DECODER, DP_LAYOUT, DP_CACHE };

/* One JSON field of decode_params. The table is the one list of them: decode_params_apply_json
 * reads every row in order (an alias before its field, so the field's own name wins when a body
 * has both), decode_params_to_json writes the rows marked out (the canonical names). Value ranges
 * are decode_params_validate's, the same for every transport. */
typedef struct dp_field {
    const char  *name;
    enum dp_type type;
    size_t       off;   /* offsetof(decode_params, field) */
    int          out;   /* written by decode_params_to_json */
} dp_field;

#define DPF(f) offsetof(decode_params, f)
static const dp_field k_fields[] = {
    {"max_tokens", DP_INT, DPF(gen_length), 0},        /* OpenAI's name */
    {"max_new_tokens", DP_INT, DPF(gen_length), 0},    /* Hugging Face's name */
    {"gen_length", DP_INT, DPF(gen_length), 1},
    {"block_length", DP_INT, DPF(block_length), 1},
    {"steps", DP_INT, DPF(steps), 1},
    {"decoder", DP_DECODER, DPF(decoder), 1},
    {"threshold", DP_NUM, DPF(threshold), 1},
    {"factor", DP_NUM, DPF(factor), 1},
    {"low_threshold", DP_NUM, DPF(low_threshold), 1},
    {"credit_alpha", DP_NUM, DPF(credit_alpha), 1},
    {"credit_gamma", DP_NUM, DPF(credit_gamma), 1},
    {"credit_decay", DP_NUM, DPF(credit_decay), 1},
    {"temperature", DP_NUM, DPF(temperature), 1},
    {"top_k", DP_INT, DPF(top_k), 1},
    {"top_p", DP_NUM, DPF(top_p), 1},
    {"seed", DP_SEED, DPF(seed), 1},
    {"cfg_scale", DP_NUM, DPF(cfg_scale), 1},
    {"logits_eos_inf", DP_BOOL, DPF(logits_eos_inf), 1},
    {"confidence_eos_eot_inf", DP_BOOL, DPF(confidence_eos_eot_inf), 1},
    {"block_layout", DP_LAYOUT, DPF(layout), 1},
    {"stop_at_eos", DP_BOOL, DPF(stop_at_eos), 1},
    {"drafts", DP_BOOL, DPF(stream_drafts), 0},        /* the WebSocket protocol's short name */
    {"stream_drafts", DP_BOOL, DPF(stream_drafts), 1},
    {"draft_every", DP_INT, DPF(draft_every), 1},
    {"cache", DP_CACHE, DPF(cache), 1},
    {"cache_refresh", DP_INT, DPF(cache_refresh), 1},
    {"prefix_look", DP_INT, DPF(prefix_look), 1},
    {"after_look", DP_INT, DPF(after_look), 1},
    {"warmup_steps", DP_INT, DPF(warmup_steps), 1},
};
#undef DPF

/* Reads one field from obj into p (absent or null: unchanged). */
static int field_apply(const dp_field *f, decode_params *p, const json_t *obj, um_err *err) {
    void *dst = (char *)p + f->off;
    const json_t *v = json_object_get(obj, f->name);
    if (!v || json_is_null(v)) return 0;
    switch (f->type) {
    case DP_INT: return get_int(v, f->name, dst, err);
    case DP_NUM: return get_num(v, f->name, dst, err);
    case DP_BOOL: return get_bool(v, f->name, dst, err);
    case DP_SEED:
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return um_err_param(err, f->name, "seed must be a non-negative integer");
        *(uint64_t *)dst = (uint64_t)json_integer_value(v);
        return 0;
    case DP_DECODER:
        if (!json_is_string(v) || decode_decoder_parse(json_string_value(v), dst) != 0)
            return um_err_param(err, f->name,
                                "decoder must be one of low_confidence, random, threshold, factor, hierarchy, credit");
        return 0;
    case DP_LAYOUT:
        if (!json_is_string(v) || decode_layout_parse(json_string_value(v), dst) != 0)
            return um_err_param(err, f->name, "block_layout must be llada or aligned");
        return 0;
    case DP_CACHE:
        if (!json_is_string(v) || decode_cache_parse(json_string_value(v), dst) != 0)
            return um_err_param(err, f->name, "cache must be one of none, prefix, dual, vicinity");
        return 0;
    }
    return 0;
}

/* One field of p as JSON. */
static json_t *field_json(const dp_field *f, const decode_params *p) {
    const void *src = (const char *)p + f->off;
    switch (f->type) {
    case DP_INT: return json_integer(*(const int *)src);
    case DP_NUM: return json_real(*(const double *)src);
    case DP_BOOL: return json_boolean(*(const int *)src);
    case DP_SEED: return json_integer((json_int_t)*(const uint64_t *)src);
    case DP_DECODER: return json_string(decode_decoder_name(*(const enum decode_decoder *)src));
    case DP_LAYOUT: return json_string(decode_layout_name(*(const enum decode_layout *)src));
    case DP_CACHE: return json_string(decode_cache_name(*(const enum decode_cache *)src));
    }
    return json_null();
}

int decode_params_apply_json(decode_params *p, const json_t *obj, um_err *err) {
    if (!json_is_object(obj)) return um_err_param(err, "params", "decode parameters must be a JSON object");
    for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++)
        if (field_apply(&k_fields[i], p, obj, err) != 0) return -1;
    return 0;
}

json_t *decode_params_to_json(const decode_params *p) {
    json_t *o = json_object();
    for (size_t i = 0; i < sizeof k_fields / sizeof k_fields[0]; i++)
        if (k_fields[i].out) json_object_set_new(o, k_fields[i].name, field_json(&k_fields[i], p));
    return o;
}
