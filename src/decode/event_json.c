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

static json_t *usage_json(const decode_usage *u) {
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
            json_t *j = token_json(c->pos, c->index, c->token, c->piece, c->confidence, c->special);
            if (c->revised) { /* an editing decoder rewrote a position written before */
                json_object_set_new(j, "revised", json_true());
                json_object_set_new(j, "previous", json_integer(c->previous));
            }
            json_array_append_new(cs, j);
        }
        json_object_set_new(o, "commits", cs);
        if (ev->n_drafts > 0) {
            json_t *ds = json_array();
            for (int i = 0; i < ev->n_drafts; i++) {
                const decode_draft *d = &ev->drafts[i];
                json_array_append_new(ds, token_json(d->pos, d->index, d->token, d->piece, d->confidence, d->special));
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
        json_object_set_new(o, "block_steps", json_integer(ev->block_steps));
        break;
    case DECODE_EVENT_DONE:
        json_object_set_new(o, "type", json_string("done"));
        json_object_set_new(o, "finish_reason", json_string(decode_finish_name(ev->finish)));
        json_object_set_new(o, "time_limited", json_boolean(ev->time_limited));
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
