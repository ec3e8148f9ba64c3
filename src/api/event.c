/*
 * event.c — scheduler events -> JSON, and step folding (event.h). Pure; any thread.
 */
#include "api/event.h"

#include <stdlib.h>
#include <string.h>

#include "decode/event_copy.h"
#include "util/log.h"

/* The scheduler's additions to DONE's timings. */
static void sched_timings(const sched_event *ev, decode_event_json_opts *o) {
    if (ev->ev.type != DECODE_EVENT_DONE) return;
    o->n_timings = 2;
    o->timing_names[0] = "queue_ms";
    o->timing_ms[0] = ev->queue_ms;
    o->timing_names[1] = "paused_ms";
    o->timing_ms[1] = ev->paused_ms;
}

json_t *api_event_json(const sched_event *ev, const char *id) {
    decode_event_json_opts o = {.id = id};
    sched_timings(ev, &o);
    return decode_event_to_json_opts(&ev->ev, &o);
}

json_t *api_event_timings_json(const sched_event *ev) {
    decode_event_json_opts o = {0};
    sched_timings(ev, &o);
    return decode_timings_to_json(&ev->ev.timings, &o);
}

/* ---------------------------------------------------------------- step folding */

api_step *api_step_new(sched_event *ev, const char *id) {
    CHECK(ev->ev.type == DECODE_EVENT_STEP);
    api_step *s = xcalloc(1, sizeof *s);
    s->ev = ev->ev;
    memset(&ev->ev, 0, sizeof ev->ev);
    s->merged = 1;
    s->drafts_at = s->ev.n_drafts > 0 ? DECODE_DRAFTS_BEFORE_PROGRESS : DECODE_DRAFTS_AUTO;
    s->id = xstrdup(id);
    return s;
}

static int committed_in(const decode_event *ev, int32_t pos) {
    for (int i = 0; i < ev->n_commits; i++)
        if (ev->commits[i].pos == pos) return 1;
    return 0;
}

void api_step_merge(api_step *into, api_step *next) {
    decode_event *a = &into->ev, *b = &next->ev;
    if (next->drafts_at != DECODE_DRAFTS_AUTO) { /* the later drafts replace the earlier ones */
        decode_event_release_drafts(a);
        a->drafts = b->drafts;
        a->n_drafts = b->n_drafts;
        b->drafts = NULL;
        b->n_drafts = 0;
        if (into->drafts_at == DECODE_DRAFTS_AUTO)
            into->drafts_at = into->merged > 1 ? DECODE_DRAFTS_AFTER_MERGED : DECODE_DRAFTS_AFTER_PROGRESS;
    } else if (into->drafts_at != DECODE_DRAFTS_AUTO && a->n_drafts > 0) { /* drop the positions next committed */
        decode_draft *d = (decode_draft *)a->drafts;
        int k = 0;
        for (int i = 0; i < a->n_drafts; i++) {
            if (committed_in(b, d[i].pos)) free((char *)d[i].piece);
            else d[k++] = d[i];
        }
        a->n_drafts = k;
        if (k == 0) {
            free(d);
            a->drafts = NULL;
        }
    }
    if (b->n_commits > 0) { /* the commits (their pieces move along) */
        decode_commit *c = xrealloc((decode_commit *)a->commits, (size_t)(a->n_commits + b->n_commits) * sizeof *c);
        memcpy(c + a->n_commits, b->commits, (size_t)b->n_commits * sizeof *c);
        a->commits = c;
        a->n_commits += b->n_commits;
        free((decode_commit *)b->commits);
        b->commits = NULL;
        b->n_commits = 0;
    }
    a->step = b->step;
    a->block = b->block;
    a->n_blocks = b->n_blocks;
    a->masks_left = b->masks_left;
    a->block_masks_left = b->block_masks_left;
    a->usage = b->usage;
    into->merged += next->merged;
    api_step_free(next);
}

json_t *api_step_json(const api_step *s) {
    decode_event_json_opts o = {.id = s->id, .merged = s->merged, .drafts_at = s->drafts_at};
    return decode_event_to_json_opts(&s->ev, &o);
}

void api_step_free(api_step *s) {
    if (!s) return;
    decode_event_release(&s->ev);
    free(s->id);
    free(s);
}
