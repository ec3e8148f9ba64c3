/*
 * chat_template.c — a checkpoint's chat template: read tokenizer_config.json's chat_template
 * (a string, or a list of {name, template} where "default" is used), compile it with the Jinja
 * subset (jinja.c), render it with messages, add_generation_prompt and the tokenizer's
 * bos_token / eos_token (as transformers' apply_chat_template passes the special tokens).
 *
 * Not here: tokenizing the result (tokenizer_encode with parse_special = 1).
 * Threads: load on any one thread; render concurrently from any thread.
 */
#include "text/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "text/jinja.h"
#include "util/fileio.h"
#include "util/log.h"

#define CONFIG_MAX_BYTES (64u << 20)

struct chat_template {
    jinja_tmpl *tmpl;
    json_t *specials;         /* {"bos_token": "...", "eos_token": "...", ...} passed to every render */
};

int chat_template_load_string(const char *src, const char *bos_token, const char *eos_token, chat_template **out,
                              um_err *err) {
    *out = NULL;
    jinja_tmpl *j;
    if (jinja_compile(src, strlen(src), &j, err) != 0) return -1;
    chat_template *t = xcalloc(1, sizeof *t);
    t->tmpl = j;
    t->specials = json_object();
    if (bos_token) json_object_set_new(t->specials, "bos_token", json_string(bos_token));
    if (eos_token) json_object_set_new(t->specials, "eos_token", json_string(eos_token));
    *out = t;
    return 0;
}

void chat_template_free(chat_template *t) {
    if (!t) return;
    jinja_free(t->tmpl);
    json_decref(t->specials);
    free(t);
}

int chat_template_load_dir(const char *dir, const tokenizer *tok, chat_template **out, um_err *err) {
    *out = NULL;
    char path[4096];
    path_join(path, sizeof path, dir, "tokenizer_config.json");
    if (!file_exists(path)) return 0;
    char *text;
    size_t len;
    if (file_read_all(path, CONFIG_MAX_BYTES, &text, &len, err) != 0) return -1;
    json_error_t je;
    json_t *cfg = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, &je); /* model_max_length is huge */
    free(text);
    if (!cfg) return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    const json_t *ct = json_object_get(cfg, "chat_template");
    const char *src = NULL;
    if (json_is_string(ct)) {
        src = json_string_value(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        const json_t *e;
        json_array_foreach(ct, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && strcmp(name, "default") == 0) src = json_string_value(json_object_get(e, "template"));
        }
        if (!src) {
            json_decref(cfg);
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: chat_template list has no \"default\" entry", path);
        }
    } else if (ct && !json_is_null(ct)) {
        json_decref(cfg);
        return um_err_set(err, UM_ERR_FORMAT, "%s: chat_template must be a string or a list", path);
    }
    int rc = 0;
    if (src) {
        rc = chat_template_load_string(src, NULL, NULL, out, err);
        if (rc != 0) um_err_prefix(err, "%s", path);
    }
    if (rc == 0 && *out) {
        /* the special tokens, as transformers passes them: the config's *_token entries (a string
         * or an AddedToken object), else what the tokenizer found (special_tokens_map.json) */
        static const char *const names[] = {"bos_token", "eos_token", "unk_token", "pad_token", "mask_token",
                                            "cls_token", "sep_token", NULL};
        for (int i = 0; names[i]; i++) {
            const json_t *v = json_object_get(cfg, names[i]);
            if (json_is_object(v)) v = json_object_get(v, "content");
            const char *s = json_is_string(v) ? json_string_value(v) : NULL;
            if (!s && tok) s = tokenizer_config_token(tok, names[i]);
            if (s) json_object_set_new((*out)->specials, names[i], json_string(s));
        }
    }
    json_decref(cfg);
    return rc;
}

int chat_template_render_vars(const chat_template *t, const json_t *vars, char **out, um_err *err) {
    json_t *ctx = json_deep_copy(t->specials);
    if (json_is_object(vars)) json_object_update(ctx, (json_t *)vars);
    if (!json_object_get(ctx, "add_generation_prompt")) json_object_set_new(ctx, "add_generation_prompt", json_false());
    int rc = jinja_render(t->tmpl, ctx, out, err);
    json_decref(ctx);
    return rc;
}

int chat_template_render(const chat_template *t, const json_t *messages, int add_generation_prompt, char **out,
                         um_err *err) {
    *out = NULL;
    if (!json_is_array(messages)) return um_err_param(err, "messages", "messages must be an array");
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return um_err_param(err, "messages", "messages[%zu] must be an object with a string \"role\"", i);
    }
    json_t *vars = json_object();
    json_object_set(vars, "messages", (json_t *)messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    int rc = chat_template_render_vars(t, vars, out, err);
    json_decref(vars);
    return rc;
}

/* ---------------------------------------------------------------- render + encode */

/* 1 when text spells a special token (encoding it with and without special-token recognition
 * differs); -1 on an encoding error. */
static int spells_special(const tokenizer *tok, const char *text, um_err *err) {
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    size_t len = strlen(text);
    if (tokenizer_encode(tok, text, len, 1, &a, &na, err) != 0) return -1;
    if (tokenizer_encode(tok, text, len, 0, &b, &nb, err) != 0) {
        free(a);
        return -1;
    }
    int differ = na != nb || (na && memcmp(a, b, na * sizeof *a) != 0);
    free(a);
    free(b);
    return differ;
}

/* Placeholder standing for message i's content while locating it in the rendered text. */
#define PH_OPEN  "\x02umc"
#define PH_CLOSE '\x03'

/* Appends the ids of text[0, len) (parse_special as given) to *ids / *n (cap *cap). */
static int encode_append(const tokenizer *tok, const char *text, size_t len, int parse_special, int32_t **ids,
                         size_t *n, size_t *cap, um_err *err) {
    int32_t *part = NULL;
    size_t np = 0;
    if (len && tokenizer_encode(tok, text, len, parse_special, &part, &np, err) != 0) return -1;
    if (*n + np > *cap) {
        *cap = (*n + np) * 2 + 16;
        *ids = xrealloc(*ids, *cap * sizeof **ids);
    }
    if (np) memcpy(*ids + *n, part, np * sizeof *part);
    *n += np;
    free(part);
    return 0;
}

/* The rendered text (t_text) split into template text and message contents with the help of a
 * render where the flagged messages' contents are placeholders (p_text); each content segment is
 * the message's content or its trimmed form (what a "| trim" in the template leaves). Encodes as
 * it goes. -1 with err when the template changed a flagged content any other way. */
static int encode_segments(const tokenizer *tok, const char *t_text, const char *p_text, const json_t *messages,
                           int32_t **ids, size_t *n, um_err *err) {
    size_t cap = 0, tpos = 0, tlen = strlen(t_text);
    const char *p = p_text;
    for (;;) {
        const char *ph = strstr(p, PH_OPEN);
        size_t chunk = ph ? (size_t)(ph - p) : strlen(p);
        if (tpos + chunk > tlen || memcmp(t_text + tpos, p, chunk) != 0) goto mismatch;
        if (encode_append(tok, t_text + tpos, chunk, 1, ids, n, &cap, err) != 0) return -1;
        tpos += chunk;
        if (!ph) break;
        char *end;
        long i = strtol(ph + strlen(PH_OPEN), &end, 10);
        if (*end != PH_CLOSE || i < 0 || (size_t)i >= json_array_size(messages)) goto mismatch;
        p = end + 1;
        const char *content = json_string_value(json_object_get(json_array_get(messages, (size_t)i), "content"));
        const char *next = strstr(p, PH_OPEN);
        size_t next_len = next ? (size_t)(next - p) : strlen(p);
        /* candidates: as sent, then trimmed */
        const char *cand[2] = {content, content};
        size_t cl[2] = {strlen(content), 0};
        while (*cand[1] == ' ' || *cand[1] == '\t' || *cand[1] == '\n' || *cand[1] == '\r') cand[1]++;
        cl[1] = strlen(cand[1]);
        while (cl[1] && strchr(" \t\n\r", cand[1][cl[1] - 1])) cl[1]--;
        int k = 0;
        for (; k < 2; k++)
            if (tpos + cl[k] + next_len <= tlen && memcmp(t_text + tpos, cand[k], cl[k]) == 0 &&
                memcmp(t_text + tpos + cl[k], p, next_len) == 0)
                break;
        if (k == 2) goto mismatch;
        if (encode_append(tok, cand[k], cl[k], 0, ids, n, &cap, err) != 0) return -1;
        tpos += cl[k];
    }
    if (tpos != tlen) goto mismatch;
    return 0;
mismatch:
    return um_err_param(err, "messages",
                        "a message spells a special token (e.g. an end-of-turn marker) and this model's chat template "
                        "transforms message text, so it cannot be kept plain text; remove it from the message");
}

int chat_template_encode(const chat_template *t, const tokenizer *tok, const json_t *messages,
                         int add_generation_prompt, int32_t **ids, size_t *n, um_err *err) {
    *ids = NULL;
    *n = 0;
    if (!json_is_array(messages)) return um_err_param(err, "messages", "messages must be an array");
    json_t *marked = json_deep_copy(messages);
    int any = 0;
    for (size_t i = 0; i < json_array_size(marked); i++) {
        json_t *mo = json_array_get(marked, i);
        const char *c = json_string_value(json_object_get(mo, "content"));
        if (!c) continue;
        int s = spells_special(tok, c, err);
        if (s < 0) {
            json_decref(marked);
            return -1;
        }
        if (s) {
            char ph[32];
            snprintf(ph, sizeof ph, "%s%zu%c", PH_OPEN, i, PH_CLOSE);
            json_object_set_new(mo, "content", json_string(ph));
            any = 1;
        }
    }
    char *text = NULL;
    int rc = chat_template_render(t, messages, add_generation_prompt, &text, err);
    if (rc == 0 && !any) { /* the common case: exactly the rendered text, special tokens recognised */
        rc = tokenizer_encode(tok, text, strlen(text), 1, ids, n, err);
    } else if (rc == 0) {
        char *ptext = NULL;
        rc = chat_template_render(t, marked, add_generation_prompt, &ptext, err);
        if (rc == 0) rc = encode_segments(tok, text, ptext, messages, ids, n, err);
        free(ptext);
        if (rc != 0) {
            free(*ids);
            *ids = NULL;
            *n = 0;
        }
    }
    free(text);
    json_decref(marked);
    return rc;
}
