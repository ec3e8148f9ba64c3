/*
 * sse.c — SSE record framing + the out_chunk FIFO (see sse.h). Pure; one thread per queue.
 */
#include "api/sse.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

out_chunk *out_chunk_new(const void *data, size_t len) {
    out_chunk *c = xmalloc(sizeof *c + OUT_CHUNK_PRE + len + 1);
    c->next = NULL;
    c->len = len;
    c->cap = len;
    c->t_event_ns = 0;
    if (len) memcpy(out_chunk_data(c), data, len);
    out_chunk_data(c)[len] = 0;
    return c;
}

void out_chunk_free(out_chunk *c) { free(c); }

/* A growable byte buffer used while framing. */
typedef struct sbuf {
    char  *p;
    size_t n, cap;
} sbuf;

static void sbuf_put(sbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        while (b->n + n + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 256;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sbuf_puts(sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

/* Field values must not contain CR/LF (they would end the field): cut at the first one. */
static void put_field(sbuf *b, const char *name, const char *value) {
    sbuf_puts(b, name);
    sbuf_puts(b, ": ");
    sbuf_put(b, value, strcspn(value, "\r\n"));
    sbuf_puts(b, "\n");
}

out_chunk *sse_frame(const char *id, const char *event, const char *payload, size_t len) {
    sbuf b = {0};
    if (event) put_field(&b, "event", event);
    if (id) put_field(&b, "id", id);
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < len && payload[j] != '\n' && payload[j] != '\r') j++;
        sbuf_puts(&b, "data: ");
        sbuf_put(&b, payload + i, j - i);
        sbuf_puts(&b, "\n");
        if (j >= len) break;
        if (payload[j] == '\r' && j + 1 < len && payload[j + 1] == '\n') j++;
        i = j + 1;
        if (i >= len) { /* payload ended with a newline: an empty last data line */
            sbuf_puts(&b, "data: \n");
            break;
        }
    }
    sbuf_puts(&b, "\n");
    out_chunk *c = out_chunk_new(b.p, b.n);
    free(b.p);
    return c;
}

out_chunk *sse_frame_json(const char *id, const char *event, const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    CHECK(s != NULL);
    out_chunk *c = sse_frame(id, event, s, strlen(s));
    free(s);
    return c;
}

out_chunk *sse_frame_done(void) { return out_chunk_new("data: [DONE]\n\n", 14); }

out_chunk *sse_frame_comment(const char *text) {
    sbuf b = {0};
    sbuf_puts(&b, ": ");
    sbuf_put(&b, text, strcspn(text, "\r\n"));
    sbuf_puts(&b, "\n\n");
    out_chunk *c = out_chunk_new(b.p, b.n);
    free(b.p);
    return c;
}

void out_queue_init(out_queue *q) { memset(q, 0, sizeof *q); }

void out_queue_push(out_queue *q, out_chunk *c) {
    c->next = NULL;
    if (q->tail) q->tail->next = c;
    else q->head = c;
    q->tail = c;
    q->n++;
    q->bytes += c->len;
}

out_chunk *out_queue_pop(out_queue *q) {
    out_chunk *c = q->head;
    if (!c) return NULL;
    q->head = c->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    q->bytes -= c->len;
    c->next = NULL;
    return c;
}

void out_queue_clear(out_queue *q) {
    out_chunk *c;
    while ((c = out_queue_pop(q))) out_chunk_free(c);
}
