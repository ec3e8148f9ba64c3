/*
 * ws.c — the "unmask" WebSocket protocol on /ws: connection lifecycle, message assembly and
 * limits, dispatch of client messages (generate, cancel, session.resume, ack, ping,
 * job.subscribe / job.unsubscribe) to sessions, the scheduler and the session's job subscriptions
 * (server/ws_jobs.h), and one frame per SERVER_WRITEABLE.
 *
 * Every connection gets a fresh session (session.created is its first event); session.resume
 * moves the connection onto an earlier session and replays what the client missed.
 * With --store redis:// a resume of a session this replica does not hold loads it from Redis and
 * follows it (on_resume_remote, session.h: followed sessions; server/ws_store.h).
 * Close codes: 1009 message too big, 1007 invalid UTF-8 (lws), 1013 too many sessions,
 * 4001 session resumed on another connection, 4008 session buffer overflow.
 * The server's wake-up (LWS_CALLBACK_EVENT_WAIT_CANCELLED, broadcast to every protocol) is taken
 * here: it drains the hub whose events mostly feed these sessions (server_on_wake).
 *
 * A `generate` is parsed here (api/request.h: the HTTP APIs' request core, so an error answers at
 * once) and built — tokenizer, chat template — on a preparation worker (server/gen_prep.h); the
 * result comes back to prep_done, which submits it and sends `accepted` (or the error). A cancel
 * meanwhile is applied right after submission; a vanished session drops it.
 * Meanwhile the connection's later messages wait (conn_message): one connection's messages are
 * handled in order, one at a time, so its replies come in the order of its messages.
 *
 * Not here: session buffering/replay (session.c), JSON shapes (api/ws_protocol.c), request
 * parsing (api/request.c), building (server/gen_prep.c, on a worker). Threads: lws service thread.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/algo_config.h"
#include "decode/event_json.h"
#include "server/conn_guard.h"
#include "server/session.h"
#include "server/ws_jobs.h"
#include "util/log.h"
#include "util/timeutil.h"

#ifndef UNMASK_VERSION
#define UNMASK_VERSION "0.1.0"
#endif

size_t ws_conn_size(void) { return sizeof(ws_conn); }

ws_state *ws_state_create(server *srv) {
    ws_state *w = xcalloc(1, sizeof *w);
    w->srv = srv;
    w->traces = trace_store_new(server_cfg(srv)->traces_max_bytes);
    return w;
}

void ws_state_free(ws_state *w) {
    if (!w) return;
    w->shutting_down = 1;
    while (w->sessions) session_destroy(w->sessions);
    trace_store_free(w->traces);
    ws_store_free(w->store);
    free(w);
}

void ws_state_set_store(ws_state *w, ws_store *st) {
    CHECK(!w->store);
    w->store = st;
}

void ws_get_conn_stats(const ws_state *w, server_conn_stats *out) {
    out->ws_connections = w->n_conns;
    out->sessions = w->n_sessions;
    out->sessions_detached = w->n_detached;
    out->session_bytes = w->bytes;
    out->ws_ended = w->n_ended;
}

int ws_flushed(const ws_state *w) {
    for (const ws_session *s = w->sessions; s; s = s->next)
        if (s->conn && (s->cursor || lws_partial_buffered(s->conn->wsi))) return 0;
    return 1;
}

int ws_close_all(ws_state *w) {
    for (ws_conn *c = w->conns; c; c = c->next) {
        c->going_away = 1;
        lws_callback_on_writable(c->wsi);
    }
    return w->n_conns;
}

int ws_n_conns(const ws_state *w) { return w->n_conns; }

json_t *ws_trace_get(ws_state *w, const char *id, const char *who) { return trace_get(w->traces, id, who); }

/* ---------------------------------------------------------------- events */

static json_t *ev_session_created(ws_state *w, ws_session *s) {
    server *srv = w->srv;
    const server_config *cfg = server_cfg(srv);
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("session.created"));
    json_object_set_new(o, "session", json_string(s->token));
    json_object_set_new(o, "server", json_pack("{s:s,s:s}", "name", "unmask", "version", UNMASK_VERSION));
    const model *m = server_model(srv);
    json_t *mi = json_object();
    json_object_set_new(mi, "ready", json_boolean(m != NULL));
    const char *name = strrchr(cfg->model, '/');
    json_object_set_new(mi, "name", json_string(name && name[1] ? name + 1 : cfg->model));
    if (m) {
        json_object_set_new(mi, "architecture", json_string(m->cfg.arch_name));
        json_object_set_new(mi, "family", json_string(model_arch_name(m->cfg.arch)));
        json_object_set_new(mi, "vocab_size", json_integer(m->cfg.vocab_size));
        json_object_set_new(mi, "max_seq", json_integer(server_max_seq(srv) > 0 ? server_max_seq(srv) : m->cfg.max_seq));
        json_object_set_new(mi, "tokenizer", json_boolean(m->tok != NULL));
        json_object_set_new(mi, "chat_template", json_boolean(m->chat != NULL));
        decode_params p = api_policy_params(server_policy(srv), m);
        json_object_set_new(o, "defaults", decode_params_to_json(&p));
        json_object_set_new(o, "decoder_fields", decode_decoder_fields(&p, &m->cfg)); /* what each decoder reads */
    }
    json_object_set_new(o, "model", mi);
    json_object_set_new(o, "limits",
                        json_pack("{s:I,s:i,s:f,s:i,s:I,s:i,s:i}", "max_message_bytes",
                                  (json_int_t)cfg->max_message_bytes, "max_generations", cfg->max_session_generations,
                                  "retention_s", cfg->session_retention_s, "max_batch", cfg->max_batch,
                                  "session_max_bytes", (json_int_t)cfg->session_max_bytes, "session_max_events",
                                  cfg->session_max_events, "max_job_subscriptions",
                                  cfg->max_session_job_subscriptions));
    return o;
}

/* An error event of this session (api_ev_errorf). */
#define push_error(s, code, param, event_id, gen_id, ...) \
    session_push((s), api_ev_errorf((code), (param), (event_id), (gen_id), __VA_ARGS__))

/* ---------------------------------------------------------------- generate: preparation */

static void prep_free(ws_prep *p) {
    gen_prep_release(&p->gp);
    free(p);
}

static void conn_drain(ws_conn *c);

/* Service thread: the request is prepared (or was skipped): submit it and send `accepted`, or
 * report why not; then the connection's messages that waited for this reply. */
static void prep_done(prep_job *j) {
    ws_prep *p = (ws_prep *)j;
    ws_gen *g = p->gen;
    ws_conn *c = p->conn;
    if (c) {
        c->waiting = NULL;
        p->conn = NULL;
    }
    if (!g) { /* the session (or the generation) went away meanwhile */
        prep_free(p);
        if (c) conn_drain(c);
        return;
    }
    g->prep = NULL;
    ws_session *s = g->sess;
    server *srv = s->w->srv;
    if (s->overflowed) {
        session_gen_remove(g);
    } else if (j->skipped) {
        push_error(s, "shutting_down", NULL, p->event_id, g->id,
                   "the server is shutting down: running generations finish, new ones are refused");
        session_gen_remove(g);
    } else if (p->gp.rc != 0) {
        session_push(s, api_ev_error(&p->gp.e, p->event_id, g->id));
        session_gen_remove(g);
    } else {
        CHECK(p->gp.n == 1);
        sched_req *r = sched_req_create(p->gp.seqs[0].seq, s->key);
        p->gp.seqs[0].seq = NULL;
        if (!s->conn) server_set_background(srv, r, 1); /* its client left while it was prepared */
        int qpos = 0;
        um_err err = {0};
        if (server_submit(srv, r, &qpos, &err) != 0) {
            sched_req_free(r);
            push_error(s, err.code == UM_ERR_RESOURCE ? "queue_full" : "unavailable", NULL, p->event_id, g->id, "%s",
                       err.msg);
            session_gen_remove(g);
        } else {
            /* events cannot be delivered before we return to the service loop: safe to attach now */
            session_gen_start(g, r, p->opts.stream_every);
            json_t *params = decode_params_to_json(&p->gp.g.params);
            json_t *ignored = api_gen_ignored(&p->gp.g);
            json_t *acc = api_ev_accepted(g->id, p->event_id, qpos, p->gp.seqs[0].n_prompt + p->gp.seqs[0].n_suffix,
                                          params, ignored);
            json_decref(ignored);
            if (server_cfg(srv)->traces_max_bytes > 0) {
                trace_begin(s->w->traces, s->who, s->token, g->id, params, g->trace_id);
                json_object_set_new(acc, "trace_id", json_string(g->trace_id));
            }
            json_decref(params);
            session_push(s, acc);
            if (g->cancel_pending) server_cancel(srv, r); /* its `done` ("cancelled") follows */
        }
    }
    prep_free(p);
    if (c) conn_drain(c);
}

/* ---------------------------------------------------------------- messages */

static void on_generate(ws_state *w, ws_conn *c, ws_session *s, api_msg *m) {
    server *srv = w->srv;
    const server_config *cfg = server_cfg(srv);
    const model *mdl = server_model(srv);
    if (!mdl) {
        push_error(s, "model_loading", NULL, m->event_id, m->id, "the model is still loading; retry in a moment");
        return;
    }
    if (server_draining(srv)) {
        push_error(s, "shutting_down", NULL, m->event_id, m->id,
                   "the server is shutting down: running generations finish, new ones are refused");
        return;
    }
    if (s->n_gens >= cfg->max_session_generations) {
        push_error(s, "too_many_generations", NULL, m->event_id, m->id,
                   "this session already runs %d generations (max_session_generations); wait for one to finish or "
                   "cancel one",
                   s->n_gens);
        return;
    }
    char id[API_ID_MAX + 1];
    if (m->id[0]) {
        snprintf(id, sizeof id, "%s", m->id);
        if (session_gen_find(s, id)) {
            push_error(s, "duplicate_id", "id", m->event_id, id, "a generation with id \"%s\" is still running", id);
            return;
        }
    } else {
        do snprintf(id, sizeof id, "gen_%llu", (unsigned long long)++s->gen_counter);
        while (session_gen_find(s, id));
    }
    callers *cs = server_callers(srv); /* the caller's rate limit and generation quota */
    double retry = 0;
    if (!callers_rate_take(cs, s->who, time_now_s(), &retry)) {
        push_error(s, "rate_limited", NULL, m->event_id, m->id,
                   "rate limit reached: %g requests per second per API key (HTTP and WebSocket together); retry in "
                   "%.0f ms",
                   callers_rate(cs), retry * 1000);
        return;
    }
    int limit = 0, held = 0;
    if (callers_take(cs, s->who, CALLER_GENERATIONS, 1, &limit, &held) != 0) {
        push_error(s, "quota_exceeded", NULL, m->event_id, m->id,
                   "this API key (or address) already has %d generations queued or running and may have %d (%s)", held,
                   limit, callers_res_flag(CALLER_GENERATIONS));
        return;
    }
    ws_gen *g = session_gen_add(s, id);
    g->counted = 1; /* the generation taken above; given back when g is freed */
    ws_prep *p = xcalloc(1, sizeof *p);
    if (api_gen_parse_ws(mdl, m->root, server_policy(srv), &p->gp.g, &p->opts, &p->gp.e) != 0) {
        session_push(s, api_ev_error(&p->gp.e, m->event_id, g->id));
        session_gen_remove(g);
        prep_free(p);
        return;
    }
    /* tokenize on a preparation worker (a 1 MB prompt takes tens of ms): the generation exists
     * from now on (its id is taken, cancel works); `accepted` or an error follows */
    gen_prep_init(&p->gp, s->key, prep_done);
    p->gp.m = mdl;
    p->gp.lim = &server_policy(srv)->lim;
    p->gen = g;
    snprintf(p->event_id, sizeof p->event_id, "%s", m->event_id);
    g->prep = p;
    p->conn = c; /* the connection's next messages wait for this one's reply (conn_message) */
    c->waiting = p;
    server_prep(w->srv, &p->gp.job);
}

static void on_cancel(ws_session *s, const api_msg *m) {
    ws_gen *g = session_gen_find(s, m->id);
    if (!g) {
        push_error(s, "unknown_generation", "id", m->event_id, m->id,
                   "no running generation with id \"%s\" in this session (finished, or never started)", m->id);
        return;
    }
    session_gen_cancel(g); /* its `done` (finish_reason "cancelled") follows */
}

static void push_to_session(void *user, json_t *ev) { session_push(user, ev); }

/* job.subscribe / job.unsubscribe: the session's job subscriptions (created with the first). A
 * followed session's subscriptions are its owner replica's. */
static void on_job_message(ws_state *w, ws_session *s, const api_msg *m) {
    if (s->followed) {
        push_error(s, "session_followed", NULL, m->event_id, m->id,
                   "this session is held by another replica (%s), which keeps its job subscriptions: this connection "
                   "only follows it; subscribe on a new session",
                   s->owner);
        return;
    }
    if (!s->jobs) s->jobs = ws_jobs_new(w->srv, s->who, push_to_session, s);
    if (m->type == API_MSG_JOB_SUBSCRIBE) ws_jobs_subscribe(s->jobs, m->id, m->event_id);
    else ws_jobs_unsubscribe(s->jobs, m->id, m->event_id);
}

/* The session.resumed event: n events replayed after m->seq; running (stolen) lists the running
 * generations' ids. */
static json_t *ev_resumed(const api_msg *m, const char *token, int n, json_t *running) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("session.resumed"));
    if (m->event_id[0]) json_object_set_new(o, "event_id", json_string(m->event_id));
    json_object_set_new(o, "session", json_string(token));
    json_object_set_new(o, "last_seq", json_integer((json_int_t)m->seq));
    json_object_set_new(o, "replayed", json_integer(n));
    json_object_set_new(o, "running", running);
    return o;
}

/* A resume replaces the connection's own session: refused once that session has work of its own
 * (generations, job subscriptions), which would be lost with it. */
static int own_work(const ws_session *cur) { return cur->n_gens > 0 || ws_jobs_count(cur->jobs) > 0; }

/* session.resume of a session this replica does not hold, from the Redis store (session.h:
 * followed sessions). */
static void on_resume_remote(ws_state *w, ws_conn *c, ws_session *cur, const api_msg *m) {
    if (own_work(cur)) {
        push_error(cur, "resume_not_allowed", "session", m->event_id, NULL,
                   "this connection already started generations (or job subscriptions) in its own session; resume on "
                   "a fresh connection");
        return;
    }
    api_error e;
    int n = 0;
    json_t *running = NULL;
    ws_session *s = session_follow_load(w, m->session, cur->who, m->seq, &n, &running, &e);
    if (!s) {
        session_push(cur, api_ev_error(&e, m->event_id, NULL));
        return;
    }
    session_destroy(cur); /* the connection's fresh session (nothing of value in it) */
    session_attach(s, c);
    json_t *o = ev_resumed(m, s->token, n, running);
    json_object_set_new(o, "owner", json_string(s->owner));
    session_push(s, o);
    session_follow_start(s);
}

static void on_resume(ws_state *w, ws_conn *c, ws_session *cur, const api_msg *m) {
    ws_session *old = session_find(w, m->session);
    if (old && strcmp(old->who, cur->who) != 0) old = NULL; /* another caller's session: as if unknown */
    if (!old && w->store && !session_tombstoned(w, m->session)) {
        on_resume_remote(w, c, cur, m);
        return;
    }
    if (!old) {
        if (session_tombstoned(w, m->session))
            push_error(cur, "session_overflow", "session", m->event_id, NULL,
                       "that session was discarded after its event buffer overflowed; start over");
        else
            push_error(cur, "unknown_session", "session", m->event_id, NULL,
                       "no such session (expired, or the token is wrong); start over with this connection's session");
        return;
    }
    if (old != cur) {
        if (own_work(cur)) {
            push_error(cur, "resume_not_allowed", "session", m->event_id, NULL,
                       "this connection already started generations (or job subscriptions) in its own session; resume "
                       "on a fresh connection");
            return;
        }
        if (m->seq > old->next_seq - 1) {
            push_error(cur, "invalid_request", "last_seq", m->event_id, NULL,
                       "last_seq %llu is ahead of the last event that session sent (%llu)", (unsigned long long)m->seq,
                       (unsigned long long)(old->next_seq - 1));
            return;
        }
        if (old->conn) { /* a half-dead earlier connection: this one takes over; it closes with 4001 */
            ws_conn *oc = old->conn;
            oc->kicked = 1;
            oc->sess = NULL;
            old->conn = NULL;
            old->detached_ns = 0;
            lws_callback_on_writable(oc->wsi);
        }
        session_destroy(cur); /* the connection's fresh session (nothing of value in it) */
        session_attach(old, c);
    }
    api_error e;
    int gap = 0;
    int n = session_rewind(old, m->seq, &gap, &e);
    if (n < 0) {
        session_push(old, api_ev_error(&e, m->event_id, NULL));
        return;
    }
    if (gap) {
        api_error ge;
        api_error_set(&ge, "resume_gap", "last_seq",
                      "events %llu..%llu were released before they were acknowledged (buffer limit); replay starts at "
                      "%llu",
                      (unsigned long long)m->seq + 1, (unsigned long long)old->floor, (unsigned long long)old->floor + 1);
        session_push(old, api_ev_error(&ge, m->event_id, NULL));
    }
    json_t *ids = json_array();
    for (ws_gen *g = old->gens; g; g = g->next) json_array_append_new(ids, json_string(g->id));
    json_t *o = ev_resumed(m, old->token, n, ids);
    session_push(old, o);
    log_debug("session %.8s…: resumed after seq %llu, %d events replayed", old->token, (unsigned long long)m->seq, n);
}

static void on_message(ws_state *w, ws_conn *c, const unsigned char *data, size_t len, int binary) {
    ws_session *s = c->sess;
    if (!s || s->overflowed) return;
    if (binary) {
        push_error(s, "binary_not_supported", NULL, NULL, NULL,
                   "binary messages are not supported: send JSON text messages");
        return;
    }
    api_msg m;
    api_error e;
    if (api_msg_parse((const char *)data, len, &m, &e) != 0) {
        session_push(s, api_ev_error(&e, m.event_id, NULL));
        return;
    }
    if (s->followed && (m.type == API_MSG_GENERATE || m.type == API_MSG_CANCEL)) {
        push_error(s, "session_followed", NULL, m.event_id, NULL,
                   "this session's generations run on another replica (%s): this connection only follows them; "
                   "start new generations on a new session",
                   s->owner);
        api_msg_free(&m);
        return;
    }
    switch (m.type) {
    case API_MSG_GENERATE: on_generate(w, c, s, &m); break;
    case API_MSG_CANCEL: on_cancel(s, &m); break;
    case API_MSG_RESUME: on_resume(w, c, s, &m); break;
    case API_MSG_ACK:
        if (session_ack(s, m.seq, &e) != 0) session_push(s, api_ev_error(&e, m.event_id, NULL));
        break;
    case API_MSG_PING: session_push(s, api_ev_pong(m.event_id)); break;
    case API_MSG_JOB_SUBSCRIBE:
    case API_MSG_JOB_UNSUBSCRIBE: on_job_message(w, s, &m); break;
    }
    api_msg_free(&m);
}

/* A whole client message. Messages of one connection are handled one at a time, in order: while
 * its `generate` is being prepared (its reply not queued yet), later ones wait in the connection's
 * queue, and reading from the socket pauses meanwhile (lws_rx_flow_control) so the queue holds at
 * most what lws had already read. Every reply thus comes in the order of the messages. */
static void conn_message(ws_state *w, ws_conn *c, const unsigned char *data, size_t len, int binary) {
    if (!c->waiting && !c->pend_head) {
        on_message(w, c, data, len, binary);
        return;
    }
    ws_pending *q = xmalloc(sizeof *q + len + 1);
    q->next = NULL;
    q->binary = binary;
    q->len = len;
    if (len) memcpy(q->data, data, len);
    q->data[len] = 0;
    if (c->pend_tail) c->pend_tail->next = q;
    else c->pend_head = q;
    c->pend_tail = q;
    if (!c->rx_paused) {
        lws_rx_flow_control(c->wsi, 0);
        c->rx_paused = 1;
    }
}

/* The messages that waited, until one of them waits again; reading resumes once none is left. */
static void conn_drain(ws_conn *c) {
    ws_state *w = server_ws(lws_context_user(lws_get_context(c->wsi)));
    while (!c->waiting && c->pend_head) {
        ws_pending *q = c->pend_head;
        c->pend_head = q->next;
        if (!c->pend_head) c->pend_tail = NULL;
        on_message(w, c, q->data, q->len, q->binary);
        free(q);
    }
    if (!c->pend_head && c->rx_paused) {
        lws_rx_flow_control(c->wsi, 1);
        c->rx_paused = 0;
    }
}

/* ---------------------------------------------------------------- lws callback */

static void conn_unlink(ws_state *w, ws_conn *c) {
    if (c->prev) c->prev->next = c->next;
    else if (w->conns == c) w->conns = c->next;
    else return; /* not linked */
    if (c->next) c->next->prev = c->prev;
    c->next = c->prev = NULL;
    w->n_conns--;
}

/* A connection is established: link it, give it a new session (or close it: capacity, quota). */
static int on_established(ws_state *w, ws_conn *c, struct lws *wsi) {
    c->wsi = wsi;
    c->next = w->conns;
    c->prev = NULL;
    if (w->conns) w->conns->prev = c;
    w->conns = c;
    w->n_conns++;
    const char *why = NULL;
    ws_session *s = session_create(w, c->who, &why);
    if (!s) {
        char reason_txt[120];
        int n = strcmp(why, "quota") == 0
                    ? snprintf(reason_txt, sizeof reason_txt, "this API key (or address) has all its sessions (%s)",
                               callers_res_flag(CALLER_SESSIONS))
                    : snprintf(reason_txt, sizeof reason_txt, "too many sessions; try again later");
        lws_close_reason(wsi, (enum lws_close_status)WS_CLOSE_CAPACITY, (unsigned char *)reason_txt, (size_t)n);
        return -1;
    }
    session_attach(s, c);
    session_push(s, ev_session_created(w, s));
    return 0;
}

/* One fragment of a client message: accumulate (bounded by --max-message-bytes), handle it whole. */
static int on_receive(ws_state *w, ws_conn *c, struct lws *wsi, const void *in, size_t len) {
    if (!c->sess) return 0; /* taken over by a resume elsewhere: closing */
    const server_config *cfg = server_cfg(w->srv);
    if (!c->rx_in_msg) {
        c->rx_in_msg = 1;
        c->rx_len = 0;
        c->rx_binary = lws_frame_is_binary(wsi);
    }
    if (c->rx_len + len > cfg->max_message_bytes) {
        char msg[96];
        int n = snprintf(msg, sizeof msg, "message larger than %zu bytes", cfg->max_message_bytes);
        lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, (unsigned char *)msg, (size_t)n);
        return -1;
    }
    if (!c->rx_binary) { /* binary messages are only counted, then refused */
        if (c->rx_len + len + 1 > c->rx_cap) {
            size_t cap = c->rx_cap ? c->rx_cap : 4096;
            while (cap < c->rx_len + len + 1) cap *= 2;
            c->rx = xrealloc(c->rx, cap);
            c->rx_cap = cap;
        }
        memcpy(c->rx + c->rx_len, in, len);
        c->rx[c->rx_len + len] = 0;
    }
    c->rx_len += len;
    if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
        c->rx_in_msg = 0;
        conn_message(w, c, c->rx, c->rx_binary ? 0 : c->rx_len, c->rx_binary);
        c->rx_len = 0;
        if (c->rx_cap > (64u << 10)) { /* do not keep a large buffer around */
            free(c->rx);
            c->rx = NULL;
            c->rx_cap = 0;
        }
    }
    return 0;
}

/* Writable: the next session frame, or the close a takeover / shutdown asked for. */
static int on_writeable(ws_conn *c, struct lws *wsi) {
    if (c->kicked) {
        static const char reason_txt[] = "session resumed on another connection";
        lws_close_reason(wsi, (enum lws_close_status)WS_CLOSE_REPLACED, (unsigned char *)reason_txt,
                         sizeof reason_txt - 1);
        return -1;
    }
    if (c->sess && c->sess->cursor) return session_write_next(c->sess);
    if (c->going_away) {
        static const char reason_txt[] = "server shutting down";
        lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY, (unsigned char *)reason_txt, sizeof reason_txt - 1);
        return -1;
    }
    return 0;
}

/* The connection closed: a normal close (1000) ends the session, anything else detaches it. */
static void on_closed(ws_state *w, ws_conn *c) {
    conn_unlink(w, c);
    w->n_ended++;
    if (c->sess && c->peer_close_code == 1000) {
        session_destroy(c->sess); /* a normal close ends the session: its generations stop */
    } else if (c->sess) {
        session_detach(c->sess);  /* network drop, page unload, ...: resumable for a while */
    }
    free(c->rx);
    c->rx = NULL;
    c->rx_cap = c->rx_len = 0;
    if (c->waiting) c->waiting->conn = NULL; /* its reply goes to the session alone */
    c->waiting = NULL;
    while (c->pend_head) { /* messages that never got their turn */
        ws_pending *q = c->pend_head;
        c->pend_head = q->next;
        free(q);
    }
    c->pend_tail = NULL;
}

int ws_lws_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in, size_t len) {
    ws_conn *c = user;
    server *srv = lws_context_user(lws_get_context(wsi));
    if (reason == LWS_CALLBACK_EVENT_WAIT_CANCELLED) { /* a broadcast: fake wsi, no pss */
        if (srv) server_on_wake(srv); /* the hub's engine events, readiness, the sessions' live events */
        return 0;
    }
    ws_state *w = srv ? server_ws(srv) : NULL;
    if (!w) return 0;
    switch (reason) {
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return http_confirm_upgrade(wsi);
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        /* API keys (server/http_api.c installs the check); the caller's identity for quotas */
        return c && server_ws_auth(srv, wsi, c->who, sizeof c->who) ? 0 : 1;
    case LWS_CALLBACK_ESTABLISHED:
        conn_guard_open(wsi); /* long-lived by design: counted per address, no request deadline */
        return on_established(w, c, wsi);
    /* a new connection is bound to this (the default) protocol until its first head is parsed:
     * the connection limits hear of it here (conn_guard.h) */
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        conn_guard_on_adopt(server_conn_guard(srv), wsi);
        return 0;
    case LWS_CALLBACK_SSL_INFO:
        conn_guard_on_tls_info(wsi, ((const struct lws_ssl_info *)in)->where);
        return 0;

    case LWS_CALLBACK_RECEIVE:
        return on_receive(w, c, wsi, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return on_writeable(c, wsi);
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        /* payload: 2-byte status code (+ reason). 1000 = the client is done with the session */
        if (len >= 2) c->peer_close_code = ((const unsigned char *)in)[0] << 8 | ((const unsigned char *)in)[1];
        return 0;
    case LWS_CALLBACK_CLOSED:
        on_closed(w, c);
        return 0;
    default:
        return 0;
    }
}
