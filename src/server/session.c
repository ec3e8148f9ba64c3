/*
 * session.c — WebSocket session state (session.h): frames, seq, acks, budget, replay, retention,
 * generations and their event delivery.
 *
 * Not here: the lws callback, message parsing, resume handshake (ws.c).
 * Threads: lws service thread only (gen_deliver runs from the hub drain on that thread; followed
 * sessions' live events come from the store's subscriber thread through ws_state_on_wake).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server/metrics.h"
#include "server/session.h"
#include "server/ws_jobs.h"
#include "util/json_util.h"
#include "util/log.h"
#include "util/timeutil.h"

#define FRAME_OVERHEAD 96   /* bytes charged per frame besides its payload */

/* ---------------------------------------------------------------- frames */

/* Budget charge of a not-yet-serialized event: a cheap upper-ish estimate of its JSON size from
 * its tokens (commits + drafts) and its text. */
static size_t frame_estimate(int n_tokens, size_t text_len) {
    return 160 + 96 * (size_t)n_tokens + 2 * text_len + FRAME_OVERHEAD;
}

static size_t step_estimate(const api_step *st) { return frame_estimate(st->ev.n_commits + st->ev.n_drafts, 0); }

static void frame_free(ws_frame *f) {
    if (f->gen && f->gen->pending_step == f) f->gen->pending_step = NULL;
    if (f->obj) json_decref(f->obj);
    api_step_free(f->step);
    free(f->buf);
    free(f);
}

/* A frame for obj (a session-level event: no tokens, no text; or a generation's block / done event
 * of text_len bytes of text). */
static ws_frame *frame_new(json_t *obj, size_t text_len, uint64_t t_event_ns) {
    ws_frame *f = xcalloc(1, sizeof *f);
    f->obj = obj;
    f->cost = frame_estimate(0, text_len);
    f->t_event_ns = t_event_ns;
    return f;
}

/* Budget accounting: every frame, and separately the never-written ones (which cannot be
 * released without losing events). */
static void acct_add(ws_session *s, const ws_frame *f) {
    s->bytes += f->cost;
    s->w->bytes += f->cost;
    s->n_frames++;
    if (!f->written_once) {
        s->bytes_unsent += f->cost;
        s->n_unsent++;
    }
}

static void acct_sub(ws_session *s, const ws_frame *f) {
    s->bytes -= f->cost;
    s->w->bytes -= f->cost;
    s->n_frames--;
    if (!f->written_once) {
        s->bytes_unsent -= f->cost;
        s->n_unsent--;
    }
}

static void pop_head(ws_session *s) {
    ws_frame *f = s->head;
    CHECK(f && f != s->cursor);
    s->head = f->next;
    if (!s->head) s->tail = NULL;
    acct_sub(s, f);
    frame_free(f);
}

/* obj as {"type", "id"?, "seq"?, ...rest} (seq 0: none), malloc'd text. */
static char *event_text(json_t *obj, uint64_t seq) {
    json_t *w = json_object();
    json_t *type = json_object_get(obj, "type");
    if (type) json_object_set(w, "type", type);
    json_t *id = json_object_get(obj, "id");
    if (id) json_object_set(w, "id", id);
    if (seq) json_object_set_new(w, "seq", json_integer((json_int_t)seq));
    json_object_update_missing(w, obj);
    char *text = json_dumps(w, UM_JSON_COMPACT);
    CHECK(text);
    json_decref(w);
    return text;
}

/* Serialize f with the next seq (a followed session's own frames: none). */
static void frame_serialize(ws_session *s, ws_frame *f) {
    CHECK((f->obj || f->step) && !f->buf);
    acct_sub(s, f);
    f->seq = s->followed ? 0 : s->next_seq++;
    if (f->step) { /* the step frame's JSON, built now that it is written (unless already built) */
        if (!f->obj) f->obj = api_step_json(f->step);
        api_step_free(f->step);
        f->step = NULL;
    }
    char *text = event_text(f->obj, f->seq);
    json_decref(f->obj);
    f->obj = NULL;
    f->len = strlen(text);
    f->buf = xmalloc(LWS_PRE + f->len);
    memcpy(f->buf + LWS_PRE, text, f->len);
    free(text);
    f->cost = f->len + FRAME_OVERHEAD;
    acct_add(s, f);
    if (f->gen && f->gen->pending_step == f) f->gen->pending_step = NULL;
    f->gen = NULL;
}

static void request_write(ws_session *s) {
    if (s->conn && s->cursor) lws_callback_on_writable(s->conn->wsi);
}

/* ---------------------------------------------------------------- budget */

static void session_overflow(ws_session *s);

/* Release acknowledged frames; over budget, release sent-but-unacknowledged ones oldest first
 * (replay below them becomes impossible). Frames waiting to be re-sent after a resume stay until
 * re-sent (they were within budget before); only never-written frames beyond the budget overflow. */
/* Budgets: the session's own (--session-max-bytes / --session-max-events) and every session's
 * together (--sessions-max-bytes). Over either, the session releases its oldest written,
 * unacknowledged frames first (a later resume reports the gap); events it could not even write
 * are never dropped silently: over its own budget, or over its fair share of a full global
 * budget, the session overflows (its generations stop, the client is told). */
static void trim(ws_session *s) {
    const server_config *cfg = server_cfg(s->w->srv);
    ws_state *w = s->w;
    while (s->head && s->head != s->cursor && s->head->seq <= s->acked) pop_head(s);
    while ((s->bytes > cfg->session_max_bytes || s->n_frames > cfg->session_max_events ||
            w->bytes > cfg->sessions_max_bytes) &&
           s->head && s->head != s->cursor) {
        s->floor = s->head->seq;
        pop_head(s);
    }
    size_t share = cfg->sessions_max_bytes / (size_t)(w->n_sessions > 0 ? w->n_sessions : 1);
    if (!s->overflowed && (s->bytes_unsent > cfg->session_max_bytes || s->n_unsent > cfg->session_max_events ||
                           (w->bytes > cfg->sessions_max_bytes && s->bytes_unsent > share)))
        session_overflow(s);
}

static void append(ws_session *s, ws_frame *f) {
    f->next = NULL;
    if (s->tail) s->tail->next = f;
    else s->head = f;
    s->tail = f;
    if (!s->cursor) s->cursor = f;
    acct_add(s, f);
    if (s->w->store && !s->followed && !f->buf) { /* its seq now, and into the store's log */
        frame_serialize(s, f);
        ws_store_append(s->w->store, s->token, s->who, (const char *)f->buf + LWS_PRE, f->len);
    }
}

/* A frame already serialized (text with its seq) at the end. */
static void append_raw(ws_session *s, const char *text, size_t len, uint64_t seq) {
    ws_frame *f = xcalloc(1, sizeof *f);
    f->seq = seq;
    f->len = len;
    f->buf = xmalloc(LWS_PRE + len);
    memcpy(f->buf + LWS_PRE, text, len);
    f->cost = len + FRAME_OVERHEAD;
    append(s, f);   /* already serialized: append() neither re-numbers nor re-stores it */
}

static void schedule_destroy(ws_session *s, double seconds);

/* Unwritten events cannot be kept: stop the session's generations, drop what is unwritten, leave
 * one error frame and close (or discard the detached session). Never frees generations or the
 * session synchronously (callers may be inside gen_deliver). */
static void session_overflow(ws_session *s) {
    const server_config *cfg = server_cfg(s->w->srv);
    log_warn("session %.8s…: event buffer overflow (%zu bytes / %d events not yet sent; limits %zu / %d): closing",
             s->token, s->bytes_unsent, s->n_unsent, cfg->session_max_bytes, cfg->session_max_events);
    s->overflowed = 1;
    for (ws_gen *g = s->gens; g; g = g->next) {
        if (g->req) server_cancel(s->w->srv, g->req);
        if (g->prep) g->cancel_pending = 1; /* submitted and cancelled at once when prepared */
        api_step_free(g->held_step);
        g->held_step = NULL;
    }
    /* drop every unwritten frame */
    ws_frame *prev = NULL, *f = s->head;
    while (f && f != s->cursor) prev = f, f = f->next;
    while (f) {
        ws_frame *next = f->next;
        acct_sub(s, f);
        frame_free(f);
        f = next;
    }
    s->cursor = NULL;
    s->tail = prev;
    if (prev) prev->next = NULL;
    else s->head = NULL;
    api_error e;
    api_error_set(&e, "session_overflow", "",
                  "the session's event buffer overflowed (client too slow or away too long); its generations were "
                  "cancelled and undelivered events dropped");
    append(s, frame_new(api_ev_error(&e, NULL, NULL), 0, 0));
    if (s->conn) request_write(s);
    else {
        ws_state *w = s->w;
        snprintf(w->tomb[w->tomb_next], sizeof w->tomb[0], "%s", s->token);
        w->tomb_next = (w->tomb_next + 1) % (int)(sizeof w->tomb / sizeof w->tomb[0]);
        schedule_destroy(s, 0);
    }
}

/* ---------------------------------------------------------------- sessions */

static void random_token(char out[API_TOKEN_HEX + 1]) {
    unsigned char b[API_TOKEN_HEX / 2];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0) UM_FATAL("getrandom failed");
        got += (size_t)n;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof b; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[API_TOKEN_HEX] = 0;
}

ws_session *session_create(ws_state *w, const char *who, const char **why) {
    const server_config *cfg = server_cfg(w->srv);
    *why = "capacity";
    if (w->shutting_down) return NULL;
    if (callers_take(server_callers(w->srv), who, CALLER_SESSIONS, 1, NULL, NULL) != 0) {
        *why = "quota";
        return NULL;
    }
    if (w->n_sessions >= cfg->max_sessions) { /* make room: the longest-detached session goes */
        ws_session *old = NULL;
        for (ws_session *s = w->sessions; s; s = s->next)
            if (!s->conn && (!old || s->detached_ns < old->detached_ns)) old = s;
        if (!old) {
            callers_give(server_callers(w->srv), who, CALLER_SESSIONS, 1);
            return NULL;
        }
        log_info("session %.8s…: discarded to make room (max_sessions %d)", old->token, cfg->max_sessions);
        session_destroy(old);
    }
    ws_session *s = xcalloc(1, sizeof *s);
    s->w = w;
    random_token(s->token);
    snprintf(s->who, sizeof s->who, "%s", who);
    s->key = callers_owner_key(who);
    s->next_seq = 1;
    s->next = w->sessions;
    if (w->sessions) w->sessions->prev = s;
    w->sessions = s;
    w->n_sessions++;
    return s;
}

static void gen_free(ws_gen *g);
static void follow_unsub(ws_session *s);

void session_destroy(ws_session *s) {
    ws_state *w = s->w;
    if (s->sul_armed) lws_sul_cancel(&s->sul);
    s->sul_armed = 0;
    if (s->follow_armed) lws_sul_cancel(&s->sul_follow);
    s->follow_armed = 0;
    follow_unsub(s);
    if (s->follow_open) json_decref(s->follow_open);
    if (s->follow_jobs) json_decref(s->follow_jobs);
    ws_jobs_free(s->jobs); /* its job subscriptions end with it */
    while (s->gens) {
        ws_gen *g = s->gens;
        s->gens = g->next;
        if (g->req) {
            sched_req *r = g->req;
            r->deliver = NULL; /* its remaining events are dropped; the hub frees it */
            r->owner = NULL;
            server_cancel(w->srv, r);
        }
        gen_free(g);
    }
    while (s->head) { /* its frames leave the budgets with it (the server-wide one above all) */
        ws_frame *f = s->head;
        s->head = f->next;
        acct_sub(s, f);
        frame_free(f);
    }
    CHECK(s->bytes == 0 && s->n_frames == 0 && s->bytes_unsent == 0 && s->n_unsent == 0);
    if (s->conn) s->conn->sess = NULL;
    else w->n_detached--;
    trace_session_gone(w->traces, s->token);
    callers_give(server_callers(w->srv), s->who, CALLER_SESSIONS, 1);
    if (s->prev) s->prev->next = s->next;
    else w->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    w->n_sessions--;
    w->n_ended++;
    CHECK(w->n_sessions > 0 || w->bytes == 0); /* the budget balances: nothing charged without a session */
    free(s);
}

static int token_eq(const char *a, const char *b) {
    unsigned char d = 0;
    for (int i = 0; i < API_TOKEN_HEX; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

ws_session *session_find(ws_state *w, const char *token) {
    if (strlen(token) != API_TOKEN_HEX) return NULL;
    for (ws_session *s = w->sessions; s; s = s->next)
        if (token_eq(s->token, token)) return s;
    return NULL;
}

int session_tombstoned(const ws_state *w, const char *token) {
    for (size_t i = 0; i < sizeof w->tomb / sizeof w->tomb[0]; i++)
        if (w->tomb[i][0] && token_eq(w->tomb[i], token)) return 1;
    return 0;
}

static void session_expire_cb(lws_sorted_usec_list_t *sul) {
    ws_session *s = lws_container_of(sul, ws_session, sul);
    s->sul_armed = 0;
    if (s->conn) return; /* re-attached meanwhile */
    log_info("session %.8s…: %s after %.1f s detached (%d generation%s cancelled)", s->token,
             s->overflowed ? "discarded (overflow)" : "expired", (double)(time_now_ns() - s->detached_ns) * 1e-9,
             s->n_gens, s->n_gens == 1 ? "" : "s");
    session_destroy(s);
}

static void schedule_destroy(ws_session *s, double seconds) {
    if (s->w->shutting_down) return;
    if (s->sul_armed) lws_sul_cancel(&s->sul);
    lws_usec_t us = (lws_usec_t)(seconds * 1e6);
    lws_sul_schedule(server_lws_context(s->w->srv), 0, &s->sul, session_expire_cb, us > 0 ? us : 1);
    s->sul_armed = 1;
}

/* A detached session's generations run in the background: they yield to every other request at
 * a step boundary and resume when the client is back or there is room (sched_set_background). */
static void session_gens_background(ws_session *s, int bg) {
    for (ws_gen *g = s->gens; g; g = g->next)
        if (g->req) server_set_background(s->w->srv, g->req, bg);
}

void session_attach(ws_session *s, ws_conn *c) {
    if (s->sul_armed) lws_sul_cancel(&s->sul);
    s->sul_armed = 0;
    if (!s->conn && s->detached_ns) {
        s->w->n_detached--;
        session_gens_background(s, 0);
    }
    s->detached_ns = 0;
    s->conn = c;
    c->sess = s;
    request_write(s);
}

void session_detach(ws_session *s) {
    if (!s->conn) return;
    s->conn->sess = NULL;
    s->conn = NULL;
    s->detached_ns = time_now_ns();
    s->w->n_detached++;
    session_gens_background(s, 1);
    const server_config *cfg = server_cfg(s->w->srv);
    if (s->followed) { /* its log is in the store: a later resume loads it again */
        if (s->follow_armed) lws_sul_cancel(&s->sul_follow);
        s->follow_armed = 0;
        follow_unsub(s);
        schedule_destroy(s, 0);
        return;
    }
    if (s->w->store) ws_store_touch(s->w->store, s->token);
    schedule_destroy(s, s->overflowed ? 0 : cfg->session_retention_s);
}

/* ---------------------------------------------------------------- queueing and writing */

void session_push(ws_session *s, json_t *obj) {
    if (s->overflowed) {
        json_decref(obj);
        return;
    }
    append(s, frame_new(obj, 0, 0));
    trim(s);
    request_write(s);
}

int session_write_next(ws_session *s) {
    ws_conn *c = s->conn;
    ws_frame *f = s->cursor;
    if (!c || !f) return 0;
    if (!f->buf) frame_serialize(s, f);
    if (lws_write(c->wsi, f->buf + LWS_PRE, f->len, LWS_WRITE_TEXT) < (int)f->len) return -1;
    if (!f->written_once) {
        acct_sub(s, f);
        f->written_once = 1;
        acct_add(s, f);
        server_note_event_written(s->w->srv, f->t_event_ns);
    }
    s->cursor = f->next;
    if (s->overflowed && !s->cursor) {
        static const char reason[] = "session buffer overflow";
        lws_close_reason(c->wsi, (enum lws_close_status)WS_CLOSE_OVERFLOW, (unsigned char *)reason, sizeof reason - 1);
        return -1;
    }
    trim(s);
    request_write(s);
    if (!s->cursor && c->going_away) lws_callback_on_writable(c->wsi);
    return 0;
}

int session_ack(ws_session *s, uint64_t seq, api_error *e) {
    uint64_t written = s->next_seq - 1;
    if (seq > written) /* taken, it would release frames the client never got, with no resume_gap later */
        return api_error_set(e, "invalid_request", "seq", "ack seq %llu is ahead of the last event this session sent (%llu)",
                             (unsigned long long)seq, (unsigned long long)written);
    if (seq > s->acked) s->acked = seq;
    trim(s);
    return 0;
}

int session_rewind(ws_session *s, uint64_t last_seq, int *gap, api_error *e) {
    uint64_t written = s->next_seq - 1;
    if (last_seq > written)
        return api_error_set(e, "invalid_request", "last_seq",
                             "last_seq %llu is ahead of the last event this session sent (%llu)",
                             (unsigned long long)last_seq, (unsigned long long)written);
    CHECK(session_ack(s, last_seq, e) == 0);
    *gap = last_seq < s->floor;
    ws_frame *f = s->head;
    while (f && f->buf && f->seq <= last_seq) f = f->next;
    s->cursor = f;
    int n = 0;
    for (; f; f = f->next) n++;
    return n;
}

/* ---------------------------------------------------------------- generations */

static void gen_free(ws_gen *g) {
    if (g->counted) callers_give(server_callers(g->sess->w->srv), g->sess->who, CALLER_GENERATIONS, 1);
    if (g->prep) { /* still being prepared: its result is dropped when it comes back */
        g->prep->gen = NULL;
        atomic_store(&g->prep->gp.job.cancel, 1);
        g->prep = NULL;
    }
    if (g->pending_step) g->pending_step->gen = NULL;
    api_step_free(g->held_step);
    free(g);
}

static void gen_unlink(ws_gen *g) {
    ws_session *s = g->sess;
    for (ws_gen **pp = &s->gens; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            s->n_gens--;
            return;
        }
}

/* A step frame: folded into the generation's unwritten step frame when there is one. obj: st's
 * JSON when it was built already (for the trace; owned), else NULL. */
static void enqueue_step(ws_gen *g, api_step *st, json_t *obj, uint64_t t_ns) {
    ws_session *s = g->sess;
    ws_frame *p = g->pending_step;
    if (p && p->step) {
        api_step_merge(p->step, st);
        json_decref(obj);
        json_decref(p->obj); /* a single step's JSON no longer: built from the fold when written */
        p->obj = NULL;
        acct_sub(s, p);
        p->cost = step_estimate(p->step);
        acct_add(s, p);
        trim(s);
        request_write(s);
        return;
    }
    ws_frame *f = xcalloc(1, sizeof *f);
    f->step = st;
    f->obj = obj;
    f->cost = step_estimate(st);
    f->t_event_ns = t_ns;
    f->gen = g;
    g->pending_step = f;
    append(s, f);
    trim(s);
    request_write(s);
}

static void flush_held(ws_gen *g) {
    if (!g->held_step) return;
    api_step *h = g->held_step;
    g->held_step = NULL;
    g->held_n = 0;
    enqueue_step(g, h, NULL, 0);
}

static void gen_deliver(sched_req *r, sched_event *ev) {
    ws_gen *g = r->owner;
    ws_session *s = g->sess;
    int final = ev->final;
    if (final) metrics_finished_event(server_metrics(s->w->srv), &ev->ev);
    if (!s->overflowed) {
        json_t *obj = NULL; /* the event's JSON: the trace's record, and the frame of a block / done */
        if (ev->kind != SCHED_EV_STEP || g->trace_id[0]) obj = api_event_json(ev, g->id);
        if (obj) trace_add(s->w->traces, g->trace_id, obj, final);
        if (ev->kind == SCHED_EV_STEP) {
            api_step *st = api_step_new(ev, g->id);
            if (g->every > 1) {
                json_decref(obj);
                if (g->held_step) api_step_merge(g->held_step, st);
                else g->held_step = st;
                if (++g->held_n >= g->every) flush_held(g);
            } else {
                enqueue_step(g, st, obj, ev->t_ns);
            }
        } else {
            flush_held(g);
            if (g->pending_step) g->pending_step->gen = NULL;
            g->pending_step = NULL; /* later steps must not merge across a block/done */
            ws_frame *f = frame_new(obj, ev->ev.text_len, ev->t_ns);
            append(s, f);
            trim(s);
            request_write(s);
        }
    }
    sched_event_free(ev);
    if (final) {
        r->owner = NULL;
        r->deliver = NULL;
        g->req = NULL;
        gen_unlink(g);
        gen_free(g);
    }
}

ws_gen *session_gen_find(ws_session *s, const char *id) {
    for (ws_gen *g = s->gens; g; g = g->next)
        if (strcmp(g->id, id) == 0) return g;
    return NULL;
}

ws_gen *session_gen_add(ws_session *s, const char *id) {
    ws_gen *g = xcalloc(1, sizeof *g);
    g->sess = s;
    snprintf(g->id, sizeof g->id, "%s", id);
    g->every = 1;
    g->next = s->gens;
    s->gens = g;
    s->n_gens++;
    return g;
}

void session_gen_start(ws_gen *g, sched_req *r, int every) {
    CHECK(!g->req && !g->prep);
    g->req = r;
    g->every = every > 0 ? every : 1;
    r->owner = g;
    r->deliver = gen_deliver;
}

void session_gen_remove(ws_gen *g) {
    CHECK(!g->req);
    gen_unlink(g);
    gen_free(g);
}

void session_gen_cancel(ws_gen *g) {
    if (g->req) server_cancel(g->sess->w->srv, g->req);
    else if (g->prep) g->cancel_pending = 1;
}

void ws_state_shutdown(ws_state *w) {
    w->shutting_down = 1;
    for (ws_session *s = w->sessions; s; s = s->next) {
        if (s->sul_armed) lws_sul_cancel(&s->sul);
        s->sul_armed = 0;
        if (s->follow_armed) lws_sul_cancel(&s->sul_follow);
        s->follow_armed = 0;
    }
}

/* ---------------------------------------------------------------- followed sessions (Redis) */

#define FOLLOW_POLL_US (2000 * 1000) /* fallback: the owner's heartbeat, events pub/sub lost */

static void follow_sub(ws_session *s) {
    if (s->follow_sub) return;
    ws_store_follow(s->w->store, s->token);
    s->follow_sub = 1;
}

static void follow_unsub(ws_session *s) {
    if (!s->follow_sub) return;
    ws_store_unfollow(s->w->store, s->token);
    s->follow_sub = 0;
}

/* 1 while the owner still has something that produces events: an unfinished generation or a job
 * subscription. */
static int follow_active(const ws_session *s) {
    return json_object_size(s->follow_open) > 0 || json_object_size(s->follow_jobs) > 0;
}

/* Take the store's log entries docs[0..n) (indexes follow_next..): queue those after `after` and
 * after the highest seq already taken, track the generations' start (accepted) and end (done, or
 * an error with their id) and the job subscriptions' (a job.update that is not final; the final
 * one, job.unsubscribed, or an error with the job's id). Returns how many were queued. */
static int follow_take(ws_session *s, char **docs, int n, uint64_t after) {
    int queued = 0;
    for (int i = 0; i < n; i++) {
        json_error_t je;
        json_t *o = json_loads(docs[i], 0, &je);
        if (!o) continue;
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(o, "seq"));
        const char *type = json_string_value(json_object_get(o, "type"));
        const char *id = json_string_value(json_object_get(o, "id"));
        if (type && id) {
            if (strcmp(type, "accepted") == 0) json_object_set_new(s->follow_open, id, json_true());
            else if (strcmp(type, "done") == 0 || strcmp(type, "error") == 0) json_object_del(s->follow_open, id);
            if (strcmp(type, "job.update") == 0 && !json_is_true(json_object_get(o, "final")))
                json_object_set_new(s->follow_jobs, id, json_true());
            else if (strcmp(type, "job.update") == 0 || strcmp(type, "job.unsubscribed") == 0 || strcmp(type, "error") == 0)
                json_object_del(s->follow_jobs, id);
        }
        if (seq > s->follow_seq) {
            s->follow_seq = seq;
            if (seq > after) {
                append_raw(s, docs[i], strlen(docs[i]), seq);
                queued++;
            }
        }
        json_decref(o);
    }
    s->follow_next += n;
    if (s->follow_seq + 1 > s->next_seq) s->next_seq = s->follow_seq + 1;
    return queued;
}

static void docs_free(char **docs, int n) {
    for (int i = 0; i < n; i++) free(docs[i]);
    free(docs);
}

ws_session *session_follow_load(ws_state *w, const char *token, const char *who, uint64_t last_seq, int *replayed,
                                json_t **running, api_error *e) {
    char owner_who[CALLER_WHO_MAX], owner[96];
    char **docs;
    int n;
    *replayed = 0;
    *running = NULL;
    if (!w->store || strlen(token) != API_TOKEN_HEX) {
        api_error_set(e, "unknown_session", "session", "no such session (expired, or the token is wrong)");
        return NULL;
    }
    int rc = ws_store_load(w->store, token, 0, owner_who, sizeof owner_who, owner, sizeof owner, &docs, &n);
    if (rc < 0) {
        api_error_set(e, "store_unavailable", "session", "the session store (Redis) did not answer; try again");
        return NULL;
    }
    if (rc == 0 || strcmp(owner_who, who) != 0) {
        if (rc > 0) docs_free(docs, n);
        api_error_set(e, "unknown_session", "session",
                      "no such session (expired, or the token is wrong); start over with this connection's session");
        return NULL;
    }
    const char *why = NULL;
    ws_session *s = session_create(w, who, &why);
    if (!s) {
        docs_free(docs, n);
        api_error_set(e, "capacity", "session", "too many sessions; try again later");
        return NULL;
    }
    snprintf(s->token, sizeof s->token, "%s", token);
    s->followed = 1;
    snprintf(s->owner, sizeof s->owner, "%s", owner);
    s->follow_open = json_object();
    s->follow_jobs = json_object();
    uint64_t after = last_seq;
    *replayed = follow_take(s, docs, n, after);
    docs_free(docs, n);
    if (last_seq > s->follow_seq) s->follow_seq = last_seq; /* the owner had not stored them yet */
    if (s->follow_seq + 1 > s->next_seq) s->next_seq = s->follow_seq + 1; /* acks up to last_seq are fine */
    s->acked = last_seq;
    *running = json_array();
    const char *id;
    json_t *v;
    json_object_foreach(s->follow_open, id, v) json_array_append_new(*running, json_string(id));
    log_info("session %.8s…: resumed from the store (owner %s), %d events replayed", token, owner, *replayed);
    return s;
}

/* A `replica_lost` error about id (a generation or a job subscription), continuing the session's
 * seq, into the store's log too. */
static void follow_lost_one(ws_session *s, const char *id, const api_error *e) {
    json_t *obj = api_ev_error(e, NULL, id);
    uint64_t seq = ++s->follow_seq;
    char *text = event_text(obj, seq);
    json_decref(obj);
    append_raw(s, text, strlen(text), seq);
    ws_store_append(s->w->store, s->token, s->who, text, strlen(text));
    free(text);
}

/* The owner died: every unfinished generation, and every job subscription it held, ends with an
 * error replica_lost (into the log too, continuing the session's seq). */
static void follow_lost(ws_session *s) {
    const char *id;
    json_t *v;
    api_error e;
    json_object_foreach(s->follow_open, id, v) {
        api_error_set(&e, "replica_lost", "",
                      "the replica running this generation (%s) stopped before it finished; its events up to here "
                      "were replayed; generate again",
                      s->owner);
        follow_lost_one(s, id, &e);
        log_warn("session %.8s…: generation %s lost with replica %s", s->token, id, s->owner);
    }
    json_object_foreach(s->follow_jobs, id, v) {
        api_error_set(&e, "replica_lost", "",
                      "the replica holding this session's subscription to job '%s' (%s) stopped; the job itself goes "
                      "on: subscribe to it again on a new session",
                      id, s->owner);
        follow_lost_one(s, id, &e);
    }
    json_object_clear(s->follow_open);
    json_object_clear(s->follow_jobs);
    s->next_seq = s->follow_seq + 1;
    request_write(s);
}

static void follow_poll_cb(lws_sorted_usec_list_t *sul);

static void follow_poll(ws_session *s) {
    if (!s->conn || !follow_active(s)) {
        follow_unsub(s);
        return;
    }
    int alive = ws_store_alive(s->w->store, s->owner); /* before the log: what it stored before dying is read */
    char **docs;
    int n;
    if (ws_store_load(s->w->store, s->token, s->follow_next, NULL, 0, NULL, 0, &docs, &n) > 0) {
        if (follow_take(s, docs, n, s->follow_seq)) request_write(s);
        docs_free(docs, n);
    }
    if (!follow_active(s)) {
        follow_unsub(s);
        return;
    }
    if (alive == 0) {
        follow_lost(s);
        follow_unsub(s);
        return;
    }
    if (s->w->shutting_down) return;
    lws_sul_schedule(server_lws_context(s->w->srv), 0, &s->sul_follow, follow_poll_cb, FOLLOW_POLL_US);
    s->follow_armed = 1;
}

static void follow_poll_cb(lws_sorted_usec_list_t *sul) {
    ws_session *s = lws_container_of(sul, ws_session, sul_follow);
    s->follow_armed = 0;
    follow_poll(s);
}

void session_follow_start(ws_session *s) {
    CHECK(s->followed);
    /* subscribe first: the confirmation (a note) reads the log again for what the owner stored
     * between the load and the subscription; the notes after it carry the rest */
    if (s->conn && follow_active(s)) follow_sub(s);
    follow_poll(s);
}

/* The log from follow_next on (what pub/sub did not bring). */
static void follow_catch_up(ws_session *s) {
    char **docs;
    int n;
    if (ws_store_load(s->w->store, s->token, s->follow_next, NULL, 0, NULL, 0, &docs, &n) > 0) {
        if (follow_take(s, docs, n, s->follow_seq)) request_write(s);
        docs_free(docs, n);
    }
}

void ws_state_on_wake(ws_state *w) {
    if (!w->store || w->shutting_down) return;
    ws_note *notes = ws_store_take(w->store);
    long relayed = 0;
    for (ws_note *n = notes; n; n = n->next) {
        ws_session *s = session_find(w, n->token);
        if (!s || !s->followed || !s->conn || !s->follow_sub) continue;
        if (!n->json) { /* subscribed: what was stored before it */
            follow_catch_up(s);
        } else {
            json_error_t je;
            json_t *o = json_loads(n->json, 0, &je);
            uint64_t seq = o ? (uint64_t)json_integer_value(json_object_get(o, "seq")) : 0;
            if (o) json_decref(o);
            if (seq <= s->follow_seq) continue; /* replayed or read from the log already */
            if (seq == s->follow_seq + 1) {
                if (follow_take(s, &n->json, 1, s->follow_seq)) request_write(s);
                relayed++;
            } else {
                follow_catch_up(s); /* a gap: notes were lost (the list has them) */
            }
        }
        if (!follow_active(s)) follow_unsub(s);
    }
    ws_store_notes_free(notes);
    if (relayed) metrics_ws_follow_pubsub(server_metrics(w->srv), relayed);
}

