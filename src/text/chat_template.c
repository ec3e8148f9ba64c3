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
