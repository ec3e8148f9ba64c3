/*
 * event_json.h — JSON (jansson) encodings shared by `unmask generate --json` and the server:
 * decode events -> JSON objects. The decode parameters (JSON request fields, the CLI's flags) are
 * decode/params.h, included here.
 *
 * Not here: transport framing, request ids / sequence numbers (the caller adds them to the
 * returned object), OpenAI/SGLang shapes (api/). Pure functions, any thread.
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

/* New reference to an object for ev (never NULL). */
json_t *decode_event_to_json(const decode_event *ev);

#endif /* UM_EVENT_JSON_H */
