/*
 * trace.c — generation traces (trace.h). Service thread only.
 */
#include "server/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "util/hash.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/strbuf.h"

typedef struct trace {
    struct trace *next, *prev;     /* oldest first */
    struct trace *hnext;           /* hash chain (trace_store.buckets) */
    char          id[TRACE_ID_MAX];
    char         *owner, *session, *gen_id;   /* owned */
    char         *params;          /* compact JSON (owned) */
    strbuf        events;          /* compact JSON objects joined by '\n' */
    int           complete;        /* its done event arrived */
    size_t        bytes;
} trace;

#define TRACE_HASH 1024

struct trace_store {
    trace  *buckets[TRACE_HASH];   /* by id: every event looks its trace up */
    trace  *oldest, *newest;
    size_t  bytes, max_bytes;
};

trace_store *trace_store_new(size_t max_bytes) {
    trace_store *t = xcalloc(1, sizeof *t);
    t->max_bytes = max_bytes;
    return t;
}

static unsigned bucket_of(const char *id) { return hash_str_fnv1a(id) % TRACE_HASH; }

static void unlink_free(trace_store *t, trace *x) {
    trace **pp = &t->buckets[bucket_of(x->id)];
    while (*pp != x) pp = &(*pp)->hnext;
    *pp = x->hnext;
    if (x->prev) x->prev->next = x->next;
    else t->oldest = x->next;
    if (x->next) x->next->prev = x->prev;
    else t->newest = x->prev;
    t->bytes -= x->bytes;
    free(x->owner);
    free(x->session);
    free(x->gen_id);
    free(x->params);
    strbuf_free(&x->events);
    free(x);
}

void trace_store_free(trace_store *t) {
    if (!t) return;
    while (t->oldest) unlink_free(t, t->oldest);
    free(t);
}

static trace *find(trace_store *t, const char *id) {
    for (trace *x = t->buckets[bucket_of(id)]; x; x = x->hnext)
        if (strcmp(x->id, id) == 0) return x;
    return NULL;
}

static void charge(trace_store *t, trace *x, size_t n) {
    x->bytes += n;
    t->bytes += n;
    while (t->bytes > t->max_bytes && t->oldest && t->oldest != x) unlink_free(t, t->oldest);
}

void trace_begin(trace_store *t, const char *owner, const char *session, const char *gen_id, const json_t *params,
                 char id_out[TRACE_ID_MAX]) {
    trace *x = xcalloc(1, sizeof *x);
    unsigned char rnd[12];
    if (RAND_bytes(rnd, sizeof rnd) != 1) UM_FATAL("RAND_bytes failed");
    char *p = x->id + snprintf(x->id, sizeof x->id, "gen_");
    for (size_t i = 0; i < sizeof rnd; i++) p += sprintf(p, "%02x", rnd[i]);
    x->owner = xstrdup(owner ? owner : "");
    x->session = xstrdup(session);
    x->gen_id = xstrdup(gen_id);
    x->params = params ? json_dumps(params, UM_JSON_COMPACT) : xstrdup("{}");
    unsigned h = bucket_of(x->id);
    x->hnext = t->buckets[h];
    t->buckets[h] = x;
    x->prev = t->newest;
    if (t->newest) t->newest->next = x;
    else t->oldest = x;
    t->newest = x;
    charge(t, x, sizeof *x + strlen(x->params) + strlen(x->owner) + strlen(x->session) + strlen(x->gen_id));
    snprintf(id_out, TRACE_ID_MAX, "%s", x->id);
}

void trace_add(trace_store *t, const char *id, const json_t *ev, int final) {
    trace *x = id && id[0] ? find(t, id) : NULL;
    if (!x) return;
    size_t before = x->events.n;
    if (before) strbuf_putc(&x->events, '\n');
    char *s = json_dumps(ev, UM_JSON_COMPACT);
    if (s) strbuf_puts(&x->events, s);
    free(s);
    if (final) x->complete = 1;
    charge(t, x, x->events.n - before);
}

void trace_session_gone(trace_store *t, const char *session) {
    for (trace *x = t->oldest; x;) {
        trace *nx = x->next;
        if (strcmp(x->session, session) == 0) unlink_free(t, x);
        x = nx;
    }
}

json_t *trace_get(trace_store *t, const char *id, const char *owner) {
    trace *x = find(t, id);
    if (!x || strcmp(x->owner, owner ? owner : "") != 0) return NULL;
    json_t *events = json_array();
    const char *s = x->events.p, *end = s ? s + x->events.n : NULL;
    while (s && s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        size_t n = nl ? (size_t)(nl - s) : (size_t)(end - s);
        json_t *ev = json_loadb(s, n, 0, NULL);
        if (ev) json_array_append_new(events, ev);
        s += n + 1;
    }
    json_t *params = json_loads(x->params, 0, NULL);
    return json_pack("{s:s, s:s, s:s, s:o, s:b, s:o}", "id", x->id, "object", "generation.trace", "generation",
                     x->gen_id, "params", params ? params : json_object(), "complete", x->complete, "events", events);
}
