/*
 * gen.c — the request core every generation transport sits on (gen.h): the request model and its
 * shared field parsers, building decode sequences, the per-choice event tracker, and the response
 * object whose records the request's dialect encodes (openai.c, sglang.c, infill.c install their
 * encoders through api_dialect; this file calls none of them by name).
 * Pure; any thread (the server parses and encodes on the lws service thread, builds on a
 * preparation worker).
 */
#include "api/gen.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "api/event.h"
#include "decode/event_json.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/log.h"
#include "util/strbuf.h"
#include "util/timeutil.h"

#define API_MAX_STOP_BYTES 256

/* ================================================================ request model */

void api_gen_init(api_gen *g, enum api_kind kind, const api_dialect *dialect, const decode_params *defaults) {
    memset(g, 0, sizeof *g);
    g->kind = kind;
    g->dialect = dialect;
    g->n = 1;
    g->params = defaults ? *defaults : decode_params_default();
}

void api_gen_free(api_gen *g) {
    json_decref(g->messages);
    for (int i = 0; i < g->n_prompts; i++) {
        free(g->prompts[i].text);
        free(g->prompts[i].ids);
    }
    free(g->prompts);
    free(g->suffix);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    json_decref(g->response_fields);
    json_decref(g->ignored);
    json_decref(g->unused);
    memset(g, 0, sizeof *g);
}

json_t *api_parse_body(const char *body, size_t len, api_error *e) {
    if (len == 0) {
        oai_error_set(e, 400, "invalid_json", NULL, "the request body is empty; send a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        oai_error_set(e, 400, "invalid_json", NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text,
                      je.line, je.column);
        return NULL;
    }
    if (!json_is_object(o)) {
        oai_error_set(e, 400, "invalid_json", NULL, "the request body must be a JSON object, got %s", oai_json_type_name(o));
        json_decref(o);
        return NULL;
    }
    return o;
}

const json_t *api_field(const json_t *obj, const char *k) {
    const json_t *v = json_object_get(obj, k);
    return v && !json_is_null(v) ? v : NULL;
}

int api_get_bool_field(const json_t *obj, const char *k, int *dst, api_error *e) {
    const json_t *v = api_field(obj, k);
    if (!v) return 0;
    if (!json_is_boolean(v))
        return oai_error_set(e, 400, "invalid_type", k, "%s must be a boolean, got %s", k, oai_json_type_name(v));
    *dst = json_is_true(v);
    return 0;
}

/* An integer field (integral reals accepted). 1 = present, 0 = absent, -1 = error. */
int api_get_int_field(const json_t *obj, const char *k, long long *dst, api_error *e) {
    const json_t *v = api_field(obj, k);
    if (!v) return 0;
    if (json_is_integer(v)) {
        *dst = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) {
        *dst = (long long)json_real_value(v);
        return 1;
    }
    return oai_error_set(e, 400, "invalid_type", k, "%s must be an integer, got %s", k, oai_json_type_name(v));
}

int api_parse_stop(api_gen *g, const json_t *v, const api_limits *lim, api_error *e) {
    if (!v || json_is_null(v)) return 0;
    const json_t *one = json_is_string(v) ? v : NULL;
    size_t n = one ? 1 : json_is_array(v) ? json_array_size(v) : 0;
    if (!one && !json_is_array(v))
        return oai_error_set(e, 400, "invalid_type", "stop", "stop must be a string or an array of strings, got %s",
                             oai_json_type_name(v));
    if ((int)n > lim->max_stop)
        return oai_error_set(e, 400, "invalid_value", "stop", "stop may hold at most %d strings, got %zu", lim->max_stop, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = one ? one : json_array_get(v, i);
        if (!json_is_string(s))
            return oai_error_set(e, 400, "invalid_type", "stop", "stop[%zu] must be a string, got %s", i, oai_json_type_name(s));
        size_t len = json_string_length(s);
        if (len == 0) continue; /* an empty stop string would stop at once: ignore, as OpenAI does */
        if (len > API_MAX_STOP_BYTES)
            return oai_error_set(e, 400, "invalid_value", "stop", "stop strings may be at most %d bytes, got %zu",
                                 API_MAX_STOP_BYTES, len);
        g->stop = xrealloc(g->stop, (size_t)(g->n_stop + 1) * sizeof *g->stop);
        g->stop[g->n_stop++] = xstrndup(json_string_value(s), len);
    }
    return 0;
}

static void client_names(const api_gen *g, um_err *ue);

int api_parse_params(api_gen *g, const json_t *obj, const api_limits *lim, api_error *e) {
    decode_params *p = &g->params;
    json_t *body = json_copy((json_t *)obj); /* shallow: to drop fields read here */
    const json_t *np = api_field(body, "n_predict");
    if (g->kind == API_KIND_INFILL && json_is_integer(np) && json_integer_value(np) == 0) {
        g->warmup = 1;  /* llama.vim's context warm-up: answer at once, generate nothing */
        json_object_del(body, "n_predict");
    }
    um_err ue = {0};
    decode_params saved = *p;
    int rc = decode_params_apply_json(p, body, &g->src, &ue);
    json_decref(body);
    if (rc == 0) rc = api_limit_params(lim, p, &g->src, &ue);
    if (rc == 0) {
        decode_params_settle(p, &g->src);
        rc = decode_params_check(p, &ue);
        client_names(g, &ue);
    }
    if (rc != 0) {
        *p = saved;
        return oai_error_from_um(e, &ue);
    }
    return api_parse_stop(g, api_field(obj, "stop"), lim, e);
}

int api_parse_token_ids(const json_t *v, const char *param, const char *label, api_prompt *p, api_error *e) {
    memset(p, 0, sizeof *p);
    size_t n = json_array_size(v);
    if (n > API_MAX_PROMPT_IDS)
        return oai_error_set(e, 400, "invalid_value", param, "%s has %zu token ids, at most %d are allowed", label, n,
                             API_MAX_PROMPT_IDS);
    p->ids = xmalloc((n ? n : 1) * sizeof *p->ids);
    p->n_ids = (int)n;
    for (size_t i = 0; i < n; i++) {
        const json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX) {
            free(p->ids);
            p->ids = NULL;
            return oai_error_set(e, 400, "invalid_type", param, "%s[%zu] must be a non-negative integer token id", label,
                                 i);
        }
        p->ids[i] = (int32_t)json_integer_value(x);
    }
    return 0;
}

int api_parse_prompt_value(const json_t *v, const char *fieldname, api_prompt *p, api_error *e) {
    memset(p, 0, sizeof *p);
    if (json_is_string(v)) {
        p->text = xstrndup(json_string_value(v), json_string_length(v));
        return 0;
    }
    if (json_is_array(v)) return api_parse_token_ids(v, fieldname, fieldname, p, e);
    return oai_error_set(e, 400, "invalid_type", fieldname, "%s must be a string or an array of token ids, got %s",
                         fieldname, oai_json_type_name(v));
}

/* One message's content as text: a string, null (""), or text parts concatenated. NULL + e
 * filled otherwise. */
static json_t *message_text(const json_t *content, size_t i, api_error *e) {
    if (!content || json_is_null(content)) return json_string("");
    if (json_is_string(content)) return json_incref((json_t *)content);
    char param[48];
    snprintf(param, sizeof param, "messages[%zu].content", i);
    if (!json_is_array(content)) {
        api_error_set(e, "invalid_type", param, "%s must be a string or an array of content parts, got %s", param,
                      oai_json_type_name(content));
        return NULL;
    }
    strbuf buf = STRBUF_INIT;
    for (size_t k = 0; k < json_array_size(content); k++) {
        const json_t *part = json_array_get(content, k);
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type)) {
            strbuf_free(&buf);
            api_error_set(e, "invalid_type", param, "%s[%zu] must be an object with a \"type\"", param, k);
            return NULL;
        }
        if (strcmp(json_string_value(type), "text") != 0 || !json_is_string(text)) {
            strbuf_free(&buf);
            api_error_set(e, "unsupported", param, "%s[%zu]: content parts of type '%.32s' are not supported (text only)",
                          param, k, json_string_value(type));
            return NULL;
        }
        strbuf_put(&buf, json_string_value(text), json_string_length(text));
    }
    json_t *s = json_stringn(strbuf_str(&buf), buf.n);
    strbuf_free(&buf);
    return s;
}

json_t *api_chat_messages(const json_t *msgs, api_error *e) {
    if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
        api_error_set(e, "invalid_value", "messages", "messages must be a non-empty array of {role, content} objects");
        return NULL;
    }
    json_t *out = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        const json_t *mo = json_array_get(msgs, i);
        char param[48];
        snprintf(param, sizeof param, "messages[%zu].role", i);
        const json_t *role = json_is_object(mo) ? json_object_get(mo, "role") : NULL;
        if (!json_is_string(role)) {
            api_error_set(e, "invalid_type", param, "messages[%zu] must be an object with a string \"role\"", i);
            json_decref(out);
            return NULL;
        }
        /* exact names only: the template writes the role as is, and the rendered text is read with
         * special tokens recognised (a role is not a place for free text) */
        const char *rs = json_string_value(role);
        size_t rn = json_string_length(role);
        int known = strlen(rs) == rn; /* no NUL inside */
        if (known && strcmp(rs, "developer") == 0) rs = "system";
        if (!known || (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool"))) {
            json_t *shown = oai_json_string_lossy(json_string_value(role), rn < 32 ? rn : 32);
            char *q = json_dumps(shown, JSON_ENCODE_ANY | JSON_ENSURE_ASCII);
            json_decref(shown);
            api_error_set(e, "invalid_value", param, "%s must be one of system, developer, user, assistant, tool, got %s%s",
                          param, q ? q : "?", rn > 32 ? " (its first 32 bytes)" : "");
            free(q);
            json_decref(out);
            return NULL;
        }
        json_t *text = message_text(json_object_get(mo, "content"), i, e);
        if (!text) {
            json_decref(out);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:s, s:o}", "role", rs, "content", text));
    }
    return out;
}

/* ================================================================ build */

void api_seqs_free(api_seq *s, int n) {
    if (!s) return;
    for (int i = 0; i < n; i++) {
        if (s[i].seq) decode_seq_free(s[i].seq);
        free(s[i].echo);
    }
    free(s);
}

/* Decode errors in the client's parameter names: the names it used, and for a length it did not
 * give, its API's usual name. */
static void client_names(const api_gen *g, um_err *ue) {
    decode_params_src src = g->src;
    const char *len_name = g->kind == API_KIND_INFILL     ? "n_predict"
                           : g->kind == API_KIND_GENERATE ? "max_new_tokens"
                           : g->kind == API_KIND_UNMASK   ? "gen_length"
                                                          : "max_tokens";
    if (!decode_params_src_get(&src, "gen_length")) decode_params_src_set(&src, "gen_length", len_name);
    decode_params_err_rename(ue, &src);
}

/* A per-request failure of the build (tokenizer, template, decode validation) as the request's
 * transport reports it: the HTTP APIs by the um_err's kind (oai_error_from_um), the WebSocket as
 * invalid_request. context: the failure may be "does not fit the context" (context_length_exceeded). */
static int build_error(const api_gen *g, const um_err *ue, int context, api_error *e) {
    int ctx = context && api_is_context_error(ue);
    if (g->kind == API_KIND_UNMASK) return api_error_from(e, ctx ? API_CODE_CONTEXT_LENGTH : "invalid_request", ue);
    oai_error_from_um(e, ue);
    if (ctx) snprintf(e->code, sizeof e->code, "%s", API_CODE_CONTEXT_LENGTH);
    return -1;
}

static int tokenize(const api_gen *g, const model *m, const char *text, int parse_special, const char *param,
                    int32_t **ids, int *n, api_error *e) {
    *ids = NULL;
    *n = 0;
    if (!text[0]) return 0;
    if (!m->tok)
        return oai_error_set(e, 400, "unsupported", param, "this model has no tokenizer; send token ids instead of text");
    um_err ue = {0};
    size_t nn = 0;
    if (tokenizer_encode(m->tok, text, strlen(text), parse_special, ids, &nn, &ue) != 0) {
        snprintf(ue.param, sizeof ue.param, "%s", param);
        return build_error(g, &ue, 0, e);
    }
    *n = (int)nn;
    return 0;
}

int api_check_chat(const model *m, api_error *e) {
    if (m->chat) return 0;
    return api_error_set(e, "unsupported", "messages",
                         "this model has no chat template; send \"prompt\" (raw text) instead");
}

/* The chat prompt's ids: message contents are never read as special tokens
 * (chat_template_encode). */
static int chat_tokenize(const api_gen *g, const model *m, int32_t **ids, int *n, api_error *e) {
    if (!m->tok)
        return oai_error_set(e, 400, "unsupported", "messages", "this model has no tokenizer; send token ids instead of text");
    um_err ue = {0};
    size_t nn = 0;
    if (chat_template_encode(m->chat, m->tok, g->messages, 1, ids, &nn, &ue) != 0) {
        um_err_prefix(&ue, "chat template");
        snprintf(ue.param, sizeof ue.param, "messages");
        return build_error(g, &ue, 0, e);
    }
    *n = (int)nn;
    return 0;
}

/* The name of prompt i in the client's request (errors, limits). */
static const char *prompt_param_of(const api_gen *g, int i) {
    switch (g->kind) {
    case API_KIND_CHAT: return "messages";
    case API_KIND_INFILL: return "input_prefix";
    case API_KIND_GENERATE: return "text";
    case API_KIND_UNMASK: return g->messages ? "messages" : g->prompts[i].text ? "prompt" : "prompt_ids";
    default: return "prompt";
    }
}

json_t *api_gen_ignored(const api_gen *g) {
    if (!json_array_size(g->ignored) && !json_array_size(g->unused)) return NULL;
    json_t *a = json_array();
    if (g->ignored) json_array_extend(a, g->ignored);
    if (g->unused) json_array_extend(a, g->unused);
    return a;
}

int api_gen_build(api_gen *g, const model *m, const api_limits *lim, api_seq **out, int *n_out, api_error *e) {
    *out = NULL;
    *n_out = 0;
    int ws = g->kind == API_KIND_UNMASK; /* the WebSocket's wording for an empty prompt, its param names */
    int n_prompts = g->messages ? 1 : g->n_prompts;
    int total = n_prompts * g->n;
    api_seq *seqs = xcalloc((size_t)(total ? total : 1), sizeof *seqs);
    int32_t *sfx = NULL;
    int n_sfx = 0;
    const char *suffix_param = g->kind == API_KIND_INFILL ? "input_suffix" : "suffix";
    if (g->suffix && tokenize(g, m, g->suffix, 0, suffix_param, &sfx, &n_sfx, e)) goto fail;
    decode_params p = g->params;
    if (g->diffusing) p.stream_drafts = 1;
    decode_params_settle(&p, &g->src);
    json_decref(g->unused);
    g->unused = NULL;
    decode_params_unused(&p, &g->src, &m->cfg, &g->unused);
    int k = 0;
    for (int i = 0; i < n_prompts; i++) {
        const char *prompt_param = prompt_param_of(g, i);
        int32_t *ids = NULL;
        int n = 0;
        char *text = NULL;
        if (g->messages) {
            if (api_check_chat(m, e) != 0) goto fail; /* no "role: content" fallback: docs/http-api.md */
            if (chat_tokenize(g, m, &ids, &n, e)) {
                free(text);
                goto fail;
            }
        } else if (g->prompts[i].text) {
            /* raw code for infilling: special-token strings in it are plain text */
            int special = g->kind != API_KIND_FIM && g->kind != API_KIND_INFILL && !g->suffix;
            if (tokenize(g, m, g->prompts[i].text, special, prompt_param, &ids, &n, e)) goto fail;
            text = xstrdup(g->prompts[i].text);
        } else {
            n = g->prompts[i].n_ids;
            ids = xmalloc((size_t)(n ? n : 1) * sizeof *ids);
            if (n) memcpy(ids, g->prompts[i].ids, (size_t)n * sizeof *ids);
        }
        int empty = n == 0 && n_sfx == 0 && g->kind != API_KIND_CHAT;
        if (ws && empty) { /* the WebSocket checks this before the limits */
            api_error_set(e, "invalid_request", prompt_param, "the prompt is empty");
            free(ids);
            free(text);
            goto fail;
        }
        um_err le = {0};
        if (api_limit_prompt_tokens(lim, prompt_param, n, n_sfx, &le) != 0 ||
            api_limit_context(lim, prompt_param, n, p.gen_length, n_sfx, &le) != 0) {
            oai_error_set(e, 400, API_CODE_CONTEXT_LENGTH, prompt_param, "%s", le.msg);
            free(ids);
            free(text);
            goto fail;
        }
        if (empty) {
            oai_error_set(e, 400, "invalid_value", prompt_param, "%s is empty", prompt_param);
            free(ids);
            free(text);
            goto fail;
        }
        for (int c = 0; c < g->n; c++, k++) {
            decode_params pc = p;
            pc.seed = p.seed + (uint64_t)c;
            um_err ue = {0};
            decode_seq *s = decode_seq_create_infill(m, &pc, ids, n, sfx, n_sfx, &ue);
            if (!s) {
                client_names(g, &ue);
                if (!ws && strcmp(ue.param, "prompt") == 0) snprintf(ue.param, sizeof ue.param, "%s", prompt_param);
                else if (strcmp(ue.param, "suffix") == 0) snprintf(ue.param, sizeof ue.param, "%s", suffix_param);
                else if (g->kind == API_KIND_GENERATE && ue.param[0]) {   /* a decode field: where SGLang takes it */
                    char in_sp[sizeof ue.param];
                    snprintf(in_sp, sizeof in_sp, "sampling_params.%.40s", ue.param);
                    snprintf(ue.param, sizeof ue.param, "%s", in_sp);
                }
                build_error(g, &ue, 1, e);
                free(ids);
                free(text);
                goto fail;
            }
            seqs[k].seq = s;
            seqs[k].index = k;
            seqs[k].prompt = i;
            seqs[k].n_prompt = n;
            seqs[k].n_suffix = n_sfx;
            if (g->echo && text) seqs[k].echo = xstrdup(text);
            *n_out = k + 1;
        }
        free(ids);
        free(text);
    }
    free(sfx);
    *out = seqs;
    return 0;
fail:
    free(sfx);
    api_seqs_free(seqs, *n_out);
    *n_out = 0;
    return -1;
}

/* ================================================================ tracker */

struct api_track {
    int              G;
    const tokenizer *tok;
    int              eos_id, eot_id;
    uint8_t         *state;        /* [G] 0 masked, 1 committed, 2 draft */
    int32_t         *ids;          /* [G] */
    char           **piece;        /* [G] owned display text ("" for special tokens) */
    int              prefix;       /* committed contiguous prefix consumed into text */
    int              text_stopped; /* an EOS/EOT ended the text */
    int32_t         *text_ids;     /* ids that made the text */
    int              n_text_ids;
    tok_stream       ts;
    strbuf           text;         /* decoded text (NUL-terminated, never NULL), owned */
    size_t           taken;        /* bytes of text handed out by api_track_take */
    char *const     *stop;
    int              n_stop;
    size_t           max_stop;
    char            *stop_word;    /* owned copy of the matched stop string */
    int              done;
    char             finish[16];
    char            *error;
    json_t          *usage, *timings;
    int              step, block, n_blocks, masks_left, committed;
    int              editing;      /* the decoder rewrites written positions: text only from finished blocks */
    int              final_upto;   /* editing: generated positions [0, final_upto) are final (block events) */
    int              n_indent;     /* > 0: the text ends at the first line indented less (llama.cpp) */
    size_t           indent_at;    /* n_indent: where the next newline is looked for */
    int              indent_cut;   /* n_indent ended the text */
    int              time_limited; /* DONE said the time limit ended the generation */
};

void api_track_set_editing(api_track *t) { t->editing = 1; }
void api_track_set_indent(api_track *t, int n_indent) { t->n_indent = n_indent; }

api_track *api_track_new(int G, const model *m, char *const *stop, int n_stop) {
    api_track *t = xcalloc(1, sizeof *t);
    t->G = G;
    t->tok = m ? m->tok : NULL;
    t->eos_id = m ? m->cfg.eos_id : -1;
    t->eot_id = m ? m->cfg.eot_id : -1;
    t->state = xcalloc((size_t)(G ? G : 1), 1);
    t->ids = xcalloc((size_t)(G ? G : 1), sizeof *t->ids);
    t->piece = xcalloc((size_t)(G ? G : 1), sizeof *t->piece);
    t->text_ids = xmalloc((size_t)(G ? G : 1) * sizeof *t->text_ids);
    if (t->tok) tok_stream_init(&t->ts, t->tok, 1);
    strbuf_put(&t->text, "", 0);
    t->stop = stop;
    t->n_stop = n_stop;
    for (int i = 0; i < n_stop; i++)
        if (strlen(stop[i]) > t->max_stop) t->max_stop = strlen(stop[i]);
    t->masks_left = G;
    return t;
}

void api_track_free(api_track *t) {
    if (!t) return;
    for (int i = 0; i < t->G; i++) free(t->piece[i]);
    free(t->piece);
    free(t->state);
    free(t->ids);
    free(t->text_ids);
    if (t->tok) tok_stream_free(&t->ts);
    strbuf_free(&t->text);
    free(t->stop_word);
    free(t->error);
    json_decref(t->usage);
    json_decref(t->timings);
    free(t);
}

static void text_put(api_track *t, const char *s, size_t n) {
    if (n) strbuf_put(&t->text, s, n);
}

static int is_eos_id(const api_track *t, int id) { return id >= 0 && (id == t->eos_id || id == t->eot_id); }

static void set_piece(api_track *t, int i, int32_t id, const char *piece, int special, uint8_t st) {
    free(t->piece[i]);
    t->piece[i] = xstrdup(!special && piece ? piece : "");
    t->ids[i] = id;
    t->state[i] = st;
}

/* Consume the committed contiguous prefix into text. */
static void advance_prefix(api_track *t) {
    while (t->prefix < t->G && t->state[t->prefix] == 1 && (!t->editing || t->prefix < t->final_upto)) {
        int i = t->prefix++;
        if (t->text_stopped) continue;
        int id = t->ids[i];
        const char *p;
        size_t n;
        if (is_eos_id(t, id)) {
            t->text_stopped = 1;
            if (t->tok) {
                tok_stream_flush(&t->ts, &p, &n);
                text_put(t, p, n);
            }
            continue;
        }
        t->text_ids[t->n_text_ids++] = id;
        if (t->tok) {
            tok_stream_push(&t->ts, id, &p, &n);
            text_put(t, p, n);
        } else {
            text_put(t, t->piece[i], strlen(t->piece[i]));
        }
    }
}

/* Earliest stop string at or after from; truncates the text there. 1 when found. */
static int check_stop(api_track *t, size_t from) {
    if (!t->n_stop || t->stop_word) return 0;
    size_t best = (size_t)-1;
    int which = -1;
    for (int i = 0; i < t->n_stop; i++) {
        const char *hit = strstr(t->text.p + from, t->stop[i]);
        if (hit && (size_t)(hit - t->text.p) < best) best = (size_t)(hit - t->text.p), which = i;
    }
    if (which < 0) return 0;
    t->stop_word = xstrdup(t->stop[which]);
    t->text.n = best;
    t->text.p[best] = 0;
    if (t->taken > t->text.n) t->taken = t->text.n;
    return 1;
}

/* n_indent, as llama.cpp's /infill applies it: on the first line after a newline that has content
 * (any character other than a space or tab) indented by fewer than n_indent spaces / tabs, the
 * text ends where that content starts. 1 when it was cut just now. */
static int check_indent(api_track *t) {
    if (t->n_indent <= 0 || t->indent_cut) return 0;
    for (;;) {
        const char *nl = t->text.n > t->indent_at ? memchr(t->text.p + t->indent_at, '\n', t->text.n - t->indent_at) : NULL;
        if (!nl) return 0;
        size_t pos = (size_t)(nl - t->text.p) + 1;
        int ind = 0;
        while (pos < t->text.n && (t->text.p[pos] == ' ' || t->text.p[pos] == '\t')) pos++, ind++;
        if (pos >= t->text.n) return 0; /* the line has no content yet */
        if (ind < t->n_indent) {
            t->text.n = pos;
            t->text.p[pos] = 0;
            if (t->taken > t->text.n) t->taken = t->text.n;
            t->indent_cut = 1;
            return 1;
        }
        t->indent_at = (size_t)(nl - t->text.p) + 1;
    }
}

static void finish_as(api_track *t, const char *reason) {
    t->done = 1;
    snprintf(t->finish, sizeof t->finish, "%s", reason);
}

int api_track_event(api_track *t, const sched_event *sev) {
    const decode_event *ev = &sev->ev;
    if (t->done) {
        /* finished early by a stop string: the cancelled sequence's DONE still brings the usage */
        if (ev->type == DECODE_EVENT_DONE && !t->usage) {
            t->usage = decode_usage_to_json(&ev->usage);
            t->timings = api_event_timings_json(sev);
        }
        return TRACK_DONE;
    }
    int flags = 0;
    size_t before = t->text.n;
    if (ev->type == DECODE_EVENT_STEP) {
        t->step = ev->step + 1;
        t->block = ev->block;
        t->n_blocks = ev->n_blocks;
        t->masks_left = ev->masks_left;
        t->committed = ev->usage.committed;
        if (ev->n_drafts > 0)
            for (int i = 0; i < t->G; i++)
                if (t->state[i] == 2) t->state[i] = 0;
        for (int k = 0; k < ev->n_commits; k++) {
            const decode_commit *c = &ev->commits[k];
            if (c->index >= 0 && c->index < t->G) set_piece(t, c->index, c->token, c->piece, c->special, 1);
        }
        for (int k = 0; k < ev->n_drafts; k++) {
            const decode_draft *d = &ev->drafts[k];
            if (d->index >= 0 && d->index < t->G && t->state[d->index] != 1)
                set_piece(t, d->index, d->token, d->piece, d->special, 2);
        }
        advance_prefix(t);
        flags |= TRACK_FRAME;
    } else if (ev->type == DECODE_EVENT_BLOCK) { /* its positions are final now (editing decoders wait for this) */
        int end = ev->block_end;
        if (end > t->final_upto) t->final_upto = end < t->G ? end : t->G;
        advance_prefix(t);
    } else if (ev->type == DECODE_EVENT_DONE) {
        json_decref(t->usage);
        json_decref(t->timings);
        t->usage = decode_usage_to_json(&ev->usage);
        t->timings = api_event_timings_json(sev);
        t->time_limited = ev->time_limited;
        if (ev->error) t->error = xstrdup(ev->error);
        if (ev->finish == DECODE_FINISH_ERROR && !t->error) t->error = xstrdup("the generation failed");
        if (t->tok && !t->text_stopped) {
            const char *p;
            size_t n;
            tok_stream_flush(&t->ts, &p, &n);
            text_put(t, p, n);
        }
        /* the final text is authoritative (it equals ours unless positions stayed masked) */
        const char *fs = ev->text ? ev->text : "";
        size_t fl = ev->text ? ev->text_len : 0;
        if (fl < t->taken || memcmp(fs, t->text.p, t->taken) != 0)
            log_warn("api: streamed text diverged from the final text (%zu bytes sent)", t->taken);
        strbuf_reset(&t->text);
        text_put(t, fs, fl);
        if (t->taken > t->text.n) t->taken = t->text.n;
        for (int i = 0; i < t->G; i++)
            if (t->state[i] == 2) t->state[i] = 0;
        t->masks_left = 0;
        finish_as(t, decode_finish_name(ev->finish));
        flags |= TRACK_DONE;
    }
    size_t from = before > t->max_stop ? before - t->max_stop : 0;
    if (t->text.n != before || (flags & TRACK_DONE)) {
        if (check_stop(t, from)) {
            if (!t->done) flags |= TRACK_STOP;
            finish_as(t, "stop");
            flags |= TRACK_DONE;
        } else if (check_indent(t)) { /* llama.cpp reports it as a limit */
            if (!t->done) flags |= TRACK_STOP;
            finish_as(t, "length");
            flags |= TRACK_DONE;
        }
    }
    if (t->text.n > t->taken) flags |= TRACK_TEXT;
    return flags;
}

/* Bytes of text that can be sent: everything once done; otherwise all but a possible stop-string
 * prefix at the end, cut back to a UTF-8 character boundary. */
static size_t safe_len(const api_track *t) {
    if (t->done) return t->text.n;
    size_t hold = t->max_stop ? t->max_stop - 1 : 0;
    size_t s = t->text.n > hold ? t->text.n - hold : 0;
    while (s > t->taken && s < t->text.n && ((unsigned char)t->text.p[s] & 0xC0) == 0x80) s--;
    return s < t->taken ? t->taken : s;
}

const char *api_track_take(api_track *t, size_t *len) {
    size_t s = safe_len(t);
    const char *p = t->text.p + t->taken;
    *len = s - t->taken;
    t->taken = s;
    return p;
}

const char *api_track_text(const api_track *t, size_t *len) {
    if (len) *len = t->text.n;
    return t->text.p;
}

char *api_track_canvas(const api_track *t) {
    if (t->done) return xstrndup(t->text.p, t->text.n);
    strbuf out = STRBUF_INIT;
    int eos_seen = 0;
    for (int i = 0; i < t->G; i++) {
        if (t->state[i] == 0 || !t->piece[i]) continue;
        if (t->state[i] == 1 && is_eos_id(t, t->ids[i])) eos_seen = 1;
        if (eos_seen) break;
        strbuf_puts(&out, t->piece[i]);
    }
    return strbuf_take(&out, NULL);
}

json_t *api_track_meta(const api_track *t) {
    char *st = xmalloc((size_t)t->G + 1);
    int committed = 0;
    for (int i = 0; i < t->G; i++) {
        int s = t->done ? 1 : t->state[i];
        st[i] = s == 1 ? 'c' : s == 2 ? 'd' : 'm';
        committed += s == 1;
    }
    st[t->G] = 0;
    double progress = t->done ? 1.0 : t->G ? (double)committed / t->G : 1.0;
    json_t *m = json_pack("{s:b, s:f, s:i, s:i, s:i, s:i, s:s}", "diffusion_content", 1, "diffusion_progress", progress,
                          "step", t->step, "block", t->block, "n_blocks", t->n_blocks, "masks_left",
                          t->done ? 0 : t->G - committed, "state", st);
    free(st);
    return m;
}

const char *api_track_finish(const api_track *t) { return t->done ? t->finish : NULL; }
const char *api_track_stop_word(const api_track *t) { return t->stop_word; }
const char *api_track_error(const api_track *t) { return t->error; }
const json_t *api_track_usage(const api_track *t) { return t->usage; }
const json_t *api_track_timings(const api_track *t) { return t->timings; }
int api_track_done(const api_track *t) { return t->done; }
int api_track_steps(const api_track *t) {
    return t->usage ? (int)json_integer_value(json_object_get(t->usage, "steps")) : t->step;
}

int api_track_time_limited(const api_track *t) { return t->time_limited; }

json_t *api_track_output_ids(const api_track *t) {
    json_t *a = json_array();
    for (int i = 0; i < t->n_text_ids; i++) json_array_append_new(a, json_integer(t->text_ids[i]));
    return a;
}

/* ================================================================ responses */

static void random_hex(char *out, int nbytes) {
    unsigned char b[32];
    if (nbytes > 32) nbytes = 32;
    if (RAND_bytes(b, nbytes) != 1) UM_FATAL("RAND_bytes failed");
    for (int i = 0; i < nbytes; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

api_resp *api_resp_new(const api_gen *g, const api_seq *seqs, int n, const model *m, const char *model_name) {
    api_resp *r = xcalloc(1, sizeof *r);
    r->kind = g->kind;
    CHECK(g->dialect);
    r->dialect = g->dialect;
    r->stream = g->stream;
    r->include_usage = g->include_usage && g->stream;
    r->diffusing = g->diffusing;
    r->prompts_list = g->prompts_list;
    r->warmup = g->warmup;
    r->created = (long)time(NULL);
    snprintf(r->model, sizeof r->model, "%s", model_name ? model_name : "unmask");
    char hex[49];
    random_hex(hex, 12);
    switch (g->kind) {
    case API_KIND_CHAT: snprintf(r->id, sizeof r->id, "chatcmpl-%s", hex); break;
    case API_KIND_COMPLETION:
    case API_KIND_FIM: snprintf(r->id, sizeof r->id, "cmpl-%s", hex); break;
    case API_KIND_INFILL: snprintf(r->id, sizeof r->id, "infill-%s", hex); break;
    case API_KIND_GENERATE: snprintf(r->id, sizeof r->id, "%s", g->rid[0] ? g->rid : hex); break;
    case API_KIND_UNMASK: snprintf(r->id, sizeof r->id, "gen-%s", hex); break;
    }
    snprintf(r->rid, sizeof r->rid, "%s", r->id);
    r->response_fields = g->response_fields ? json_incref(g->response_fields) : NULL;
    r->settings = decode_params_to_json(&g->params);
    r->n_ctx = m ? m->cfg.max_seq : 0;
    if (g->kind == API_KIND_INFILL && g->n_prompts > 0 && g->prompts[0].text) r->prompt_text = xstrdup(g->prompts[0].text);
    r->n_stop = g->n_stop;
    r->stop = xcalloc((size_t)(g->n_stop ? g->n_stop : 1), sizeof *r->stop);
    for (int i = 0; i < g->n_stop; i++) r->stop[i] = xstrdup(g->stop[i]);
    r->n = n;
    r->c = xcalloc((size_t)(n ? n : 1), sizeof *r->c);
    for (int i = 0; i < n; i++) {
        int G = seqs[i].seq ? decode_seq_params(seqs[i].seq)->gen_length : g->params.gen_length;
        r->c[i].t = api_track_new(G, m, r->stop, r->n_stop);
        if (decode_decoder_edits(g->params.decoder)) api_track_set_editing(r->c[i].t);
        if (g->n_indent > 0) api_track_set_indent(r->c[i].t, g->n_indent);
        r->c[i].index = seqs[i].index;
        r->c[i].prompt = seqs[i].prompt;
        r->c[i].n_prompt = seqs[i].n_prompt + seqs[i].n_suffix;
        r->c[i].gen_length = G;
        r->c[i].echo = seqs[i].echo ? xstrdup(seqs[i].echo) : NULL;
    }
    r->t0_ns = time_now_ns();
    return r;
}

void api_resp_free(api_resp *r) {
    if (!r) return;
    for (int i = 0; i < r->n; i++) {
        api_track_free(r->c[i].t);
        free(r->c[i].echo);
    }
    free(r->c);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    json_decref(r->response_fields);
    json_decref(r->settings);
    free(r->prompt_text);
    free(r);
}

const char *api_resp_id(const api_resp *r) { return r->id; }

int api_resp_done(const api_resp *r) {
    for (int i = 0; i < r->n; i++)
        if (!api_track_done(r->c[i].t)) return 0;
    return 1;
}

const char *api_resp_error(const api_resp *r) {
    for (int i = 0; i < r->n; i++) {
        const char *e = api_track_error(r->c[i].t);
        if (e) return e;
        const char *f = api_track_finish(r->c[i].t);
        if (f && strcmp(f, "cancelled") == 0) return "the generation was cancelled (server shutting down or request aborted)";
    }
    return NULL;
}

int api_resp_sse_done(const api_resp *r) { return r->dialect->sse_done; }

void api_resp_usage(const api_resp *r, long *prompt_tokens, long *completion_tokens, long *steps) {
    long p = 0, c = 0, s = 0;
    for (int i = 0; i < r->n; i++) {
        int first_copy = 1;
        for (int j = 0; j < i; j++)
            if (r->c[j].prompt == r->c[i].prompt) first_copy = 0;
        const json_t *u = api_track_usage(r->c[i].t);
        if (first_copy) p += r->c[i].n_prompt;
        if (u) {
            c += (long)json_integer_value(json_object_get(u, "completion_tokens"));
            s += (long)json_integer_value(json_object_get(u, "steps"));
        }
    }
    if (prompt_tokens) *prompt_tokens = p;
    if (completion_tokens) *completion_tokens = c;
    if (steps) *steps = s;
}


void api_resp_begin(api_resp *r, json_t *out) {
    if (r->stream && r->dialect->begin) r->dialect->begin(r, out);
}

int api_resp_event(api_resp *r, int choice, const sched_event *ev, int slow, json_t *out) {
    if (choice < 0 || choice >= r->n) return 0;
    api_choice *c = &r->c[choice];
    int was_done = api_track_done(c->t);
    int flags = api_track_event(c->t, ev);
    if (was_done) return 0;
    int stop_hit = (flags & TRACK_STOP) != 0;
    if (r->stream && out) r->dialect->event(r, c, flags, slow, out);
    return stop_hit;
}

void api_resp_end(api_resp *r, json_t *out) {
    if (r->stream && out && r->dialect->end) r->dialect->end(r, out);
}

json_t *api_resp_body(api_resp *r) { return r->dialect->body(r); }

int api_choice_clean_end(const api_choice *c, int flags) {
    if (!(flags & TRACK_DONE) || api_track_error(c->t)) return 0;
    const char *fin = api_track_finish(c->t);
    return !(fin && strcmp(fin, "cancelled") == 0);
}

double api_resp_elapsed_s(const api_resp *r) { return time_ms_since(r->t0_ns) * 1e-3; }
