/*
 * strbuf.h — a growable, always NUL-terminated byte buffer (appending bytes, strings, printf
 * output). Not here: any encoding or escaping; UTF-8 checks. Not thread-safe: one buffer belongs to
 * one thread at a time; any thread.
 */
#ifndef UM_STRBUF_H
#define UM_STRBUF_H

#include <stdarg.h>
#include <stddef.h>

typedef struct strbuf {
    char  *p;      /* [cap] bytes, owned; NULL until the first write, then p[n] == 0 always */
    size_t n;      /* bytes written, not counting the terminating NUL */
    size_t cap;    /* bytes allocated at p */
} strbuf;

#define STRBUF_INIT {NULL, 0, 0}

/* Append n bytes (may contain NULs; s may be NULL when n == 0). Every append, even an empty one,
 * leaves p allocated and NUL-terminated. Abort on OOM. */
void strbuf_put(strbuf *b, const void *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
void strbuf_putc(strbuf *b, char c);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_vprintf(strbuf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* The contents: b->p, or "" while nothing was written. Valid until the next write. */
const char *strbuf_str(const strbuf *b);
/* Hand the contents to the caller (malloc'd, NUL-terminated, never NULL; *len = bytes when len is
 * not NULL) and leave b empty. */
char *strbuf_take(strbuf *b, size_t *len);
/* Empty the buffer, keeping its memory. */
void strbuf_reset(strbuf *b);
/* Release the memory; b is empty again. */
void strbuf_free(strbuf *b);

#endif /* UM_STRBUF_H */
