/*
 * event.h — scheduler events (sched/sched.h) as the server sends and stores them. Events travel
 * typed from the engines to the transports; this is the one place they become JSON
 * (decode/event_json.h's encoder, plus what the transports add: a generation id, the scheduler's
 * queue_ms / paused_ms in DONE's timings, folded steps). The WebSocket writer, the trace, the job
 * log and the HTTP responses' usage / timings all come through here.
 *
 * Step folding: a WebSocket step frame that could not be written yet absorbs the generation's next
 * steps (and stream.every > 1 folds steps before queueing); api_step does it on the typed events,
 * so the frame's JSON is built once, when it is written.
 *
 * Not here: framing and sequence numbers (server/session.c), the OpenAI / SGLang shapes (gen.h and
 * the dialects), the decode event encoder itself (decode/event_json.c). Pure; any thread.
 */
#ifndef UM_API_EVENT_H
#define UM_API_EVENT_H

#include <jansson.h>

#include "decode/event_json.h"
#include "sched/sched.h"

/* ev as a JSON object (new reference): {"type", "id" (when id is not NULL), <the decode event's
 * fields>}, DONE's "timings" ending with "queue_ms" and "paused_ms". */
json_t *api_event_json(const sched_event *ev, const char *id);
/* DONE's "timings" object alone (new reference). */
json_t *api_event_timings_json(const sched_event *ev);

/* One or more step events of one generation folded into one frame. */
typedef struct api_step {
    decode_event ev;       /* owned (decode/event_copy.h rules), a STEP: the commits of every folded
                              step in order; the drafts of the latest step that had any, less the
                              positions committed after it; step, block, n_blocks and progress of
                              the latest */
    int          merged;   /* steps folded in (>= 1); > 1 adds "merged" to the JSON */
    enum decode_drafts_at drafts_at; /* DECODE_DRAFTS_AUTO while no folded step had drafts, else
                              where the key sits: where it first appeared (the wire's key order) */
    char        *id;       /* the generation's id (owned) */
} api_step;

/* A new fold of step event ev (its decode event moves into the fold; ev keeps an empty one). */
api_step *api_step_new(sched_event *ev, const char *id);
/* Fold next (a later fold of the same generation) into into; next is freed. */
void      api_step_merge(api_step *into, api_step *next);
/* The frame's JSON (new reference): like api_event_json of one step, with "merged" when folded. */
json_t   *api_step_json(const api_step *s);
void      api_step_free(api_step *s);

#endif /* UM_API_EVENT_H */
