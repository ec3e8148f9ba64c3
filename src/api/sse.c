/*
 * sse.c — SSE record framing + the out_chunk FIFO (see sse.h). Pure; one thread per queue.
 */
#include "api/sse.h"

#include <stdlib.h>
#include <string.h>

#include "util/json_util.h"
#include "util/log.h"
#include "util/strbuf.h"

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

/* Field values must not contain CR/LF (they would end the field): cut at the first one. */
static void put_field(strbuf *b, const char *name, const char *value) {
    strbuf_puts(b, name);
    strbuf_puts(b, ": ");
    strbuf_put(b, value, strcspn(value, "\r\n"));
    strbuf_puts(b, "\n");
}

out_chunk *sse_frame(const char *id, const char *event, const char *payload, size_t len) {
    strbuf b = STRBUF_INIT;
    if (event) put_field(&b, "event", event);
    if (id) put_field(&b, "id", id);
    size_t i = 0;
    for (;;) {
        size_t j = i;
        while (j < len && payload[j] != '\n' && payload[j] != '\r') j++;
        strbuf_puts(&b, "data: ");
        strbuf_put(&b, payload + i, j - i);
        strbuf_puts(&b, "\n");
        if (j >= len) break;
        if (payload[j] == '\r' && j + 1 < len && payload[j + 1] == '\n') j++;
        i = j + 1;
        if (i >= len) { /* payload ended with a newline: an empty last data line */
            strbuf_puts(&b, "data: \n");
            break;
        }
    }
    strbuf_puts(&b, "\n");
    out_chunk *c = out_chunk_new(b.p, b.n);
    strbuf_free(&b);
    return c;
}

out_chunk *sse_frame_json(const char *id, const char *event, const json_t *j) {
    char *s = json_dumps(j, UM_JSON_COMPACT);
    CHECK(s != NULL);
    out_chunk *c = sse_frame(id, event, s, strlen(s));
    free(s);
    return c;
}

out_chunk *sse_frame_done(void) { return out_chunk_new("data: [DONE]\n\n", 14); }

out_chunk *sse_frame_comment(const char *text) {
    strbuf b = STRBUF_INIT;
    strbuf_puts(&b, ": ");
    strbuf_put(&b, text, strcspn(text, "\r\n"));
    strbuf_puts(&b, "\n\n");
    out_chunk *c = out_chunk_new(b.p, b.n);
    strbuf_free(&b);
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
