/*
 * sse.h — Server-Sent Events framing and the byte queue every streamed HTTP response writes from.
 *
 * sse_frame_*() build complete records ("id: 7\ndata: {...}\n\n"; a payload with newlines becomes
 * several data: lines, as the SSE spec requires) into an out_chunk whose buffer has LWS_PRE bytes
 * of headroom, so the service thread can lws_write() it in place, one chunk per WRITEABLE.
 * out_queue is a FIFO of such chunks (a response body in pieces).
 *
 * Not here: HTTP headers, lws calls, event -> JSON (api/gen.c and the dialects). Pure data structures;
 * an out_queue belongs to one thread at a time (the lws service thread in the server).
 */
#ifndef UM_SSE_H
#define UM_SSE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* Bytes reserved before every chunk's payload (lws needs LWS_PRE writable bytes before the data). */
#define OUT_CHUNK_PRE 32

typedef struct out_chunk {
    struct out_chunk *next;
    size_t            len;        /* payload bytes at data() */
    size_t            cap;        /* payload capacity */
    uint64_t          t_event_ns; /* when the event this chunk encodes was produced (0 = n/a); for
                                     the per-event server-overhead histogram */
    unsigned char     buf[];      /* [OUT_CHUNK_PRE + cap] */
} out_chunk;

static inline unsigned char *out_chunk_data(out_chunk *c) { return c->buf + OUT_CHUNK_PRE; }

/* A chunk holding a copy of data[0..len). */
out_chunk *out_chunk_new(const void *data, size_t len);
void       out_chunk_free(out_chunk *c);

/* "data: <payload>\n\n" (split on '\n' into several data: lines). id (may be NULL) adds "id: <id>\n",
 * event (may be NULL) adds "event: <event>\n". */
out_chunk *sse_frame(const char *id, const char *event, const char *payload, size_t len);
/* Compact JSON of j as one record; j is not consumed. */
out_chunk *sse_frame_json(const char *id, const char *event, const json_t *j);
/* "data: [DONE]\n\n" */
out_chunk *sse_frame_done(void);
/* ": <text>\n\n" (keep-alive comment). */
out_chunk *sse_frame_comment(const char *text);

typedef struct out_queue {
    out_chunk *head, *tail;
    size_t     n;              /* chunks queued */
    size_t     bytes;          /* payload bytes queued */
} out_queue;

void       out_queue_init(out_queue *q);
void       out_queue_push(out_queue *q, out_chunk *c);   /* takes ownership */
out_chunk *out_queue_pop(out_queue *q);                  /* NULL when empty; caller owns it */
void       out_queue_clear(out_queue *q);                /* free every chunk */

#endif /* UM_SSE_H */
