/*
 * event_copy.c — owned copies of decode events (event_copy.h). Pure; any thread.
 */
#include "decode/event_copy.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

static char *dup_n(const char *s, size_t n) {
    char *d = xmalloc(n + 1);
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

void decode_event_copy(decode_event *dst, const decode_event *src) {
    *dst = *src;
    dst->seq = NULL;
    dst->commits = NULL;
    dst->drafts = NULL;
    if (src->n_commits > 0) {
        decode_commit *c = xmalloc((size_t)src->n_commits * sizeof *c);
        memcpy(c, src->commits, (size_t)src->n_commits * sizeof *c);
        for (int i = 0; i < src->n_commits; i++) c[i].piece = c[i].piece ? xstrdup(c[i].piece) : NULL;
        dst->commits = c;
    } else {
        dst->n_commits = 0;
    }
    if (src->n_drafts > 0) {
        decode_draft *d = xmalloc((size_t)src->n_drafts * sizeof *d);
        memcpy(d, src->drafts, (size_t)src->n_drafts * sizeof *d);
        for (int i = 0; i < src->n_drafts; i++) d[i].piece = d[i].piece ? xstrdup(d[i].piece) : NULL;
        dst->drafts = d;
    } else {
        dst->n_drafts = 0;
    }
    dst->text = src->text ? dup_n(src->text, src->text_len) : NULL;
    dst->error = src->error ? xstrdup(src->error) : NULL;
}

void decode_event_release_drafts(decode_event *ev) {
    for (int i = 0; i < ev->n_drafts; i++) free((char *)ev->drafts[i].piece);
    free((decode_draft *)ev->drafts);
    ev->drafts = NULL;
    ev->n_drafts = 0;
}

void decode_event_release(decode_event *ev) {
    if (!ev) return;
    for (int i = 0; i < ev->n_commits; i++) free((char *)ev->commits[i].piece);
    free((decode_commit *)ev->commits);
    decode_event_release_drafts(ev);
    free((char *)ev->text);
    free((char *)ev->error);
    memset(ev, 0, sizeof *ev);
}
