/*
 * ws_protocol.c — WebSocket JSON protocol messages (ws_protocol.h). Pure; any thread.
 * Not here: sessions and sockets (server/), request bodies (request.c).
 */
#include "api/ws_protocol.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/log.h"

static const struct {
    const char       *name;
    enum api_msg_type type;
} k_types[] = {
    {"generate", API_MSG_GENERATE}, {"cancel", API_MSG_CANCEL}, {"session.resume", API_MSG_RESUME},
    {"ack", API_MSG_ACK},           {"ping", API_MSG_PING},
    {"job.subscribe", API_MSG_JOB_SUBSCRIBE}, {"job.unsubscribe", API_MSG_JOB_UNSUBSCRIBE},
};

static int id_ok(const char *s, size_t n) {
    if (n == 0 || n > API_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.' || c == ':'))
            return 0;
    }
    return 1;
}

static int seq_field(const json_t *root, const char *name, uint64_t *out, api_error *e) {
    const json_t *v = json_object_get(root, name);
    if (!v) return api_error_set(e, "invalid_request", name, "missing \"%s\" (a non-negative integer)", name);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return api_error_set(e, "invalid_request", name, "\"%s\" must be a non-negative integer", name);
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

void api_msg_free(api_msg *m) {
    if (m->root) json_decref(m->root);
    m->root = NULL;
}

int api_msg_parse(const char *text, size_t len, api_msg *m, api_error *e) {
    memset(m, 0, sizeof *m);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return api_error_set(e, "invalid_json", "", "the message is not valid JSON: %s (at byte %d)", je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return api_error_set(e, "invalid_message", "", "a message must be a JSON object with a \"type\"");
    }
    const json_t *eid = json_object_get(root, "event_id");
    if (eid && !json_is_null(eid)) {
        size_t n = json_is_string(eid) ? json_string_length(eid) : 0;
        int ok = json_is_string(eid) && n <= API_EVENT_ID_MAX && strlen(json_string_value(eid)) == n;
        if (!ok) {
            json_decref(root);
            return api_error_set(e, "invalid_message", "event_id", "\"event_id\" must be a string of at most %d bytes",
                                 API_EVENT_ID_MAX);
        }
        memcpy(m->event_id, json_string_value(eid), n + 1);
    }
    const json_t *type = json_object_get(root, "type");
    if (!json_is_string(type)) {
        json_decref(root);
        return api_error_set(e, "invalid_message", "type", type ? "\"type\" must be a string" : "the message has no \"type\"");
    }
    const char *tn = json_string_value(type);
    size_t ti = 0;
    for (; ti < sizeof k_types / sizeof k_types[0]; ti++)
        if (strcmp(k_types[ti].name, tn) == 0) break;
    if (ti == sizeof k_types / sizeof k_types[0]) {
        api_error_set(e, "unknown_type", "type",
                      "unknown message type \"%.64s\" (expected generate, cancel, session.resume, ack, ping, job.subscribe or "
                      "job.unsubscribe)", tn);
        json_decref(root);
        return -1;
    }
    m->type = k_types[ti].type;
    const json_t *id = json_object_get(root, "id");
    switch (m->type) {
    case API_MSG_GENERATE:
        if (id && !json_is_null(id)) {
            if (!json_is_string(id) || !id_ok(json_string_value(id), json_string_length(id))) {
                json_decref(root);
                return api_error_set(e, "invalid_request", "id",
                                     "\"id\" must be 1-%d characters of [A-Za-z0-9_.:-]", API_ID_MAX);
            }
            memcpy(m->id, json_string_value(id), json_string_length(id) + 1);
        }
        break;
    case API_MSG_CANCEL:
        if (!json_is_string(id) || !id_ok(json_string_value(id), json_string_length(id))) {
            json_decref(root);
            return api_error_set(e, "invalid_request", "id", "cancel needs the \"id\" of a generation (a string)");
        }
        memcpy(m->id, json_string_value(id), json_string_length(id) + 1);
        break;
    case API_MSG_JOB_SUBSCRIBE:
    case API_MSG_JOB_UNSUBSCRIBE: /* a job id's shape is the store's business: a wrong one is unknown_job */
        if (!json_is_string(id) || !id_ok(json_string_value(id), json_string_length(id))) {
            api_error_set(e, "invalid_request", "id", "%s needs the \"id\" of a job (a string, as POST /v1/jobs returned it)",
                          m->type == API_MSG_JOB_SUBSCRIBE ? "job.subscribe" : "job.unsubscribe");
            json_decref(root);
            return -1;
        }
        memcpy(m->id, json_string_value(id), json_string_length(id) + 1);
        break;
    case API_MSG_RESUME: {
        const json_t *sess = json_object_get(root, "session");
        if (!json_is_string(sess) || json_string_length(sess) != API_TOKEN_HEX) {
            json_decref(root);
            return api_error_set(e, "invalid_request", "session",
                                 "\"session\" must be the %d-character token from session.created", API_TOKEN_HEX);
        }
        memcpy(m->session, json_string_value(sess), API_TOKEN_HEX + 1);
        if (seq_field(root, "last_seq", &m->seq, e) != 0) {
            json_decref(root);
            return -1;
        }
        break;
    }
    case API_MSG_ACK:
        if (seq_field(root, "seq", &m->seq, e) != 0) {
            json_decref(root);
            return -1;
        }
        break;
    case API_MSG_PING: break;
    }
    m->root = root;
    return 0;
}

/* ---------------------------------------------------------------- events */

/* Messages may quote client input cut at a byte limit: make them valid UTF-8 ('?' for bad bytes)
 * so that the JSON encoder accepts them. */
static void utf8_clean(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        int ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (p[i] & 0xC0) == 0x80;
        if (ok && n == 2 && *p < 0xC2) ok = 0;                                  /* overlong */
        if (ok && n == 3 && ((*p == 0xE0 && p[1] < 0xA0) || (*p == 0xED && p[1] >= 0xA0))) ok = 0; /* overlong, surrogates */
        if (ok && n == 4 && ((*p == 0xF0 && p[1] < 0x90) || *p > 0xF4 || (*p == 0xF4 && p[1] >= 0x90))) ok = 0;
        if (!ok) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

json_t *api_ev_error(const api_error *e, const char *event_id, const char *gen_id) {
    char msg[sizeof e->message], param[sizeof e->param];
    snprintf(msg, sizeof msg, "%s", e->message);
    snprintf(param, sizeof param, "%s", e->param);
    utf8_clean(msg);
    utf8_clean(param);
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("error"));
    if (gen_id && gen_id[0]) json_object_set_new(o, "id", json_string(gen_id));
    if (event_id && event_id[0]) json_object_set_new(o, "event_id", json_string(event_id));
    json_object_set_new(o, "error", json_pack("{s:s,s:s,s:o}", "code", e->code[0] ? e->code : "error", "message", msg,
                                              "param", param[0] ? json_string(param) : json_null()));
    return o;
}

json_t *api_ev_errorf(const char *code, const char *param, const char *event_id, const char *gen_id, const char *fmt,
                      ...) {
    api_error e;
    va_list ap;
    va_start(ap, fmt);
    api_error_vset(&e, code, param, fmt, ap);
    va_end(ap);
    return api_ev_error(&e, event_id, gen_id);
}

json_t *api_ev_pong(const char *event_id) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("pong"));
    if (event_id && event_id[0]) json_object_set_new(o, "event_id", json_string(event_id));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_object_set_new(o, "time_ms", json_integer((json_int_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000));
    return o;
}

json_t *api_ev_accepted(const char *gen_id, const char *event_id, int queue_pos, int n_prompt, const json_t *params,
                        const json_t *ignored) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("accepted"));
    json_object_set_new(o, "id", json_string(gen_id));
    if (event_id && event_id[0]) json_object_set_new(o, "event_id", json_string(event_id));
    json_object_set_new(o, "queue_position", json_integer(queue_pos));
    json_object_set_new(o, "prompt_tokens", json_integer(n_prompt));
    if (params) json_object_set(o, "params", (json_t *)params);
    if (ignored && json_array_size(ignored)) json_object_set(o, "ignored_fields", (json_t *)ignored);
    return o;
}

json_t *api_ev_job_update(const char *job_id, const char *event_id, json_t *job, int final) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("job.update"));
    json_object_set_new(o, "id", json_string(job_id));
    if (event_id && event_id[0]) json_object_set_new(o, "event_id", json_string(event_id));
    json_object_set_new(o, "final", json_boolean(final));
    json_object_set_new(o, "job", job);
    return o;
}

json_t *api_ev_job_unsubscribed(const char *job_id, const char *event_id, int was_subscribed) {
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("job.unsubscribed"));
    json_object_set_new(o, "id", json_string(job_id));
    if (event_id && event_id[0]) json_object_set_new(o, "event_id", json_string(event_id));
    json_object_set_new(o, "subscribed", json_boolean(was_subscribed));
    return o;
}
