/*
 * event_json.h — JSON (jansson) encodings shared by `unmask generate --json` and the server:
 * decode events -> JSON objects. The decode parameters (JSON request fields, the CLI's flags) are
 * decode/params.h, included here.
 *
 * The one encoder of decode events: `unmask generate --json` prints it, and the server builds every
 * event it sends or stores through it (api/event.h adds what the transports carry: a generation id,
 * the scheduler's timings, folded steps).
 *
 * Not here: transport framing, sequence numbers, OpenAI/SGLang shapes (api/). Pure functions, any
 * thread.
 *
 * Event objects (field list in docs/decode.md):
 *   {"type":"step","step":3,"block":0,"n_blocks":4,
 *    "commits":[{"pos":12,"index":2,"id":881,"text":" the","confidence":0.93,"special":false}],
 *    "drafts":[{"pos":13,"index":3,"id":17,"text":"x","confidence":0.41,"special":false}],   (only when streamed)
 *    "progress":{"steps":4,"masks_left":120,"block_masks_left":28,"committed":8}}
 *   {"type":"block","block":0,"start":0,"end":32,"text":"...","steps":32}
 *   {"type":"done","finish_reason":"stop","time_limited":false,"text":"...","error":null,
 *    "usage":{"prompt_tokens":9,"completion_tokens":40,"total_tokens":49,"steps":64,"committed":64},
 *    "timings":{"first_event_ms":..,"total_ms":..,"decode_ms":..,"tokens_per_s":..}}
 */
#ifndef UM_EVENT_JSON_H
#define UM_EVENT_JSON_H

#include <jansson.h>

#include "decode/decode.h"
#include "decode/params.h"
#include "util/err.h"

/* Where a STEP object's "drafts" key sits (decode_event_json_opts.drafts_at). */
enum decode_drafts_at {
    DECODE_DRAFTS_AUTO,             /* before "progress" when the event has drafts, else absent */
    DECODE_DRAFTS_BEFORE_PROGRESS,  /* present (even when empty), before "progress" */
    DECODE_DRAFTS_AFTER_PROGRESS,   /* present, right after "progress" */
    DECODE_DRAFTS_AFTER_MERGED,     /* present, after "merged" (the object's last key) */
};

#define DECODE_JSON_TIMINGS_MAX 2

/* What a transport adds to the object (a zeroed struct adds nothing). */
typedef struct decode_event_json_opts {
    const char *id;                 /* non-NULL: "id" right after "type" */
    int         merged;             /* STEP: > 1 adds "merged" (steps folded into this object) after
                                       "progress" */
    enum decode_drafts_at drafts_at;
    int         n_timings;          /* DONE: extra "timings" members appended in order, in ms
                                       (always numbers) */
    const char *timing_names[DECODE_JSON_TIMINGS_MAX];
    double      timing_ms[DECODE_JSON_TIMINGS_MAX];
} decode_event_json_opts;

/* New reference to an object for ev (never NULL). o: NULL = nothing added. */
json_t *decode_event_to_json(const decode_event *ev);
json_t *decode_event_to_json_opts(const decode_event *ev, const decode_event_json_opts *o);
/* The members of DONE's object on their own (new references): "usage", "timings" (with o's extra
 * timings; o may be NULL). */
json_t *decode_usage_to_json(const decode_usage *u);
json_t *decode_timings_to_json(const decode_timings *t, const decode_event_json_opts *o);

#endif /* UM_EVENT_JSON_H */
