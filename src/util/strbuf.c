/*
 * strbuf.c — growable NUL-terminated byte buffer (see strbuf.h). Capacity starts at 256 bytes and
 * doubles. Not here: encodings or escaping. Threads: a buffer belongs to its caller's thread.
 */
#include "util/strbuf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* Make room for n more bytes plus the terminating NUL. */
static void strbuf_grow(strbuf *b, size_t n) {
    CHECK(n < (size_t)-1 - b->n - 1);
    if (b->n + n + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (b->n + n + 1 > cap) cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void strbuf_put(strbuf *b, const void *s, size_t n) {
    strbuf_grow(b, n);
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void strbuf_puts(strbuf *b, const char *s) { strbuf_put(b, s, strlen(s)); }

void strbuf_putc(strbuf *b, char c) { strbuf_put(b, &c, 1); }

void strbuf_vprintf(strbuf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap2);
    va_end(ap2);
    CHECK(k >= 0);
    if (!b->p || b->n + (size_t)k >= b->cap) {
        strbuf_grow(b, (size_t)k);
        int k2 = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
        CHECK(k2 == k);
    }
    b->n += (size_t)k;
}

void strbuf_printf(strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    strbuf_vprintf(b, fmt, ap);
    va_end(ap);
}

const char *strbuf_str(const strbuf *b) { return b->p ? b->p : ""; }

char *strbuf_take(strbuf *b, size_t *len) {
    if (!b->p) strbuf_put(b, "", 0);
    char *p = b->p;
    if (len) *len = b->n;
    b->p = NULL;
    b->n = b->cap = 0;
    return p;
}

void strbuf_reset(strbuf *b) {
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

void strbuf_free(strbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}
