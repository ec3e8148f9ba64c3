/*
 * event_copy.h — owned copies of decode events. A decode_event handed to a sink borrows the
 * sequence's buffers (valid only during the call); whoever keeps an event past the call (the
 * scheduler, which passes events to other threads) keeps a copy made here.
 *
 * Ownership of a copy: commits[] and drafts[] are each one malloc'd array (NULL when empty), every
 * piece of them, text and error are malloc'd strings; decode_event_release frees them all. Code
 * that edits a copy (api/event.c folds step events together) follows the same rules.
 *
 * Not here: JSON (decode/event_json.h). Pure; any thread.
 */
#ifndef UM_EVENT_COPY_H
#define UM_EVENT_COPY_H

#include "decode/decode.h"

/* *dst = a deep copy of *src with seq = NULL (the sequence may be gone when the copy is read);
 * seq_user is kept. */
void decode_event_copy(decode_event *dst, const decode_event *src);
/* Free a copy's drafts (pieces and array); n_drafts = 0. */
void decode_event_release_drafts(decode_event *ev);
/* Free what decode_event_copy allocated and zero *ev. NULL or zeroed: no-op. */
void decode_event_release(decode_event *ev);

#endif /* UM_EVENT_COPY_H */
