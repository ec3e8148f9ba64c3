/*
 * json_util.h — the jansson dump flags for protocol output (HTTP bodies, SSE and WebSocket frames,
 * job events, webhook bodies, the CLI's --json lines): compact, and doubles with 9 significant
 * digits ("first_event_ms":0.605219 rather than jansson's default 17, 0.60521899999999995).
 * Not for files on disk (safetensors headers, tokenizer.json) nor for JSON that is parsed again
 * inside the server (a stored job request): those keep full precision. Header only; any thread.
 */
#ifndef UM_JSON_UTIL_H
#define UM_JSON_UTIL_H

#include <jansson.h>

#define UM_JSON_COMPACT (JSON_COMPACT | JSON_REAL_PRECISION(9))

#endif /* UM_JSON_UTIL_H */
