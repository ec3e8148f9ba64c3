/*
 * event_json.c — decode events -> JSON (event_json.h). The decode parameters' table is params.c.
 * Pure; any thread.
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

json_t *decode_usage_to_json(const decode_usage *u) {
    return json_pack("{s:i, s:i, s:i, s:i, s:i}", "prompt_tokens", u->prompt_tokens, "completion_tokens",
                     u->completion_tokens, "total_tokens", u->prompt_tokens + u->completion_tokens, "steps", u->steps,
                     "committed", u->committed);
}

/* One committed or drafted token: {"pos","index","id","text","confidence","special"}. */
static json_t *token_json(int pos, int index, int token, const char *piece, float confidence, int special) {
    json_t *j = json_object();
    json_object_set_new(j, "pos", json_integer(pos));
    json_object_set_new(j, "index", json_integer(index));
    json_object_set_new(j, "id", json_integer(token));
    json_object_set_new(j, "text", str_n(piece, piece ? strlen(piece) : 0));
    json_object_set_new(j, "confidence", real_or_null(confidence));
    json_object_set_new(j, "special", json_boolean(special));
    return j;
}

json_t *decode_timings_to_json(const decode_timings *t, const decode_event_json_opts *o) {
    json_t *j = json_pack("{s:o, s:o, s:o, s:o}", "first_event_ms", real_or_null(t->first_event_ms), "total_ms",
                          real_or_null(t->total_ms), "decode_ms", real_or_null(t->decode_ms), "tokens_per_s",
                          real_or_null(t->tokens_per_s));
    for (int i = 0; o && i < o->n_timings && i < DECODE_JSON_TIMINGS_MAX; i++)
        json_object_set_new(j, o->timing_names[i], json_real(o->timing_ms[i]));
    return j;
}

static json_t *drafts_json(const decode_event *ev) {
    json_t *ds = json_array();
    for (int i = 0; i < ev->n_drafts; i++) {
        const decode_draft *d = &ev->drafts[i];
        json_array_append_new(ds, token_json(d->pos, d->index, d->token, d->piece, d->confidence, d->special));
    }
    return ds;
}

json_t *decode_event_to_json(const decode_event *ev) { return decode_event_to_json_opts(ev, NULL); }

json_t *decode_event_to_json_opts(const decode_event *ev, const decode_event_json_opts *o) {
    static const decode_event_json_opts none;
    if (!o) o = &none;
    json_t *j = json_object();
    static const char *const type_names[] = {"step", "block", "done"};
    json_object_set_new(j, "type", json_string(type_names[ev->type]));
    if (o->id) json_object_set_new(j, "id", json_string(o->id));
    switch (ev->type) {
    case DECODE_EVENT_STEP: {
        enum decode_drafts_at at = o->drafts_at;
        if (at == DECODE_DRAFTS_AUTO && ev->n_drafts > 0) at = DECODE_DRAFTS_BEFORE_PROGRESS;
        json_object_set_new(j, "step", json_integer(ev->step));
        json_object_set_new(j, "block", json_integer(ev->block));
        json_object_set_new(j, "n_blocks", json_integer(ev->n_blocks));
        json_t *cs = json_array();
        for (int i = 0; i < ev->n_commits; i++) {
            const decode_commit *c = &ev->commits[i];
            json_t *t = token_json(c->pos, c->index, c->token, c->piece, c->confidence, c->special);
            if (c->revised) { /* an editing decoder rewrote a position written before */
                json_object_set_new(t, "revised", json_true());
                json_object_set_new(t, "previous", json_integer(c->previous));
            }
            json_array_append_new(cs, t);
        }
        json_object_set_new(j, "commits", cs);
        if (at == DECODE_DRAFTS_BEFORE_PROGRESS) json_object_set_new(j, "drafts", drafts_json(ev));
        json_object_set_new(j, "progress",
                            json_pack("{s:i, s:i, s:i, s:i}", "steps", ev->step + 1, "masks_left", ev->masks_left,
                                      "block_masks_left", ev->block_masks_left, "committed", ev->usage.committed));
        if (at == DECODE_DRAFTS_AFTER_PROGRESS) json_object_set_new(j, "drafts", drafts_json(ev));
        if (o->merged > 1) json_object_set_new(j, "merged", json_integer(o->merged));
        if (at == DECODE_DRAFTS_AFTER_MERGED) json_object_set_new(j, "drafts", drafts_json(ev));
        break;
    }
    case DECODE_EVENT_BLOCK:
        json_object_set_new(j, "block", json_integer(ev->block));
        json_object_set_new(j, "n_blocks", json_integer(ev->n_blocks));
        json_object_set_new(j, "start", json_integer(ev->block_start));
        json_object_set_new(j, "end", json_integer(ev->block_end));
        json_object_set_new(j, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(j, "steps", json_integer(ev->step));
        json_object_set_new(j, "block_steps", json_integer(ev->block_steps));
        break;
    case DECODE_EVENT_DONE:
        json_object_set_new(j, "finish_reason", json_string(decode_finish_name(ev->finish)));
        json_object_set_new(j, "time_limited", json_boolean(ev->time_limited));
        json_object_set_new(j, "text", str_n(ev->text, ev->text_len));
        json_object_set_new(j, "error", ev->error ? json_string(ev->error) : json_null());
        json_object_set_new(j, "usage", decode_usage_to_json(&ev->usage));
        json_object_set_new(j, "timings", decode_timings_to_json(&ev->timings, o));
        break;
    }
    return j;
}
