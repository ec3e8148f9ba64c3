/*
 * algo_config.c — YAML-subset / JSON algorithm config -> normalized decode fields (see
 * algo_config.h). Pure; main thread.
 */
#include "api/algo_config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_error.h"
#include "decode/event_json.h"
#include "util/fileio.h"
#include "util/log.h"

#define ALGO_MAX_FILE (1u << 20)

typedef struct key_map {
    const char *from, *to;
} key_map;

/* Names only config files use (SGLang's and dInfer's); every decode parameter name and alias of
 * the request APIs is accepted too (decode_param_canonical). */
static const key_map k_keys[] = {
    {"algorithm", "decoder"},
    {"dllm_algorithm", "decoder"},
    {"cache_type", "cache"},
    {"cache_update_freq", "cache_refresh"},
};

static const char *map_key(const char *k) {
    for (size_t i = 0; i < sizeof k_keys / sizeof k_keys[0]; i++)
        if (strcmp(k, k_keys[i].from) == 0) return k_keys[i].to;
    return decode_param_canonical(k);
}

/* Normalize one (key, value); line 0 = JSON input (no line numbers). */
static int add_entry(json_t *out, const char *label, int line, const char *key, json_t *value, um_err *err) {
    char where[300];
    if (line > 0) snprintf(where, sizeof where, "%s:%d", label, line);
    else snprintf(where, sizeof where, "%s", label);
    const char *to = map_key(key);
    if (!to) {
        json_decref(value);
        return um_err_param(err, key,
                            "%s: unknown algorithm config key '%s' (known: algorithm, threshold, block_size, "
                            "steps, temperature, top_k, top_p, seed, cfg_scale, factor, gen_length, stop_at_eos, "
                            "cache, cache_refresh, prefix_look, after_look, warmup_steps, or any other decode "
                            "parameter of the request APIs)",
                            where, key);
    }
    if (json_object_get(out, to)) {
        json_decref(value);
        return um_err_param(err, key, "%s: '%s' is set twice", where, key);
    }
    if (strcmp(to, "decoder") == 0) {
        if (!json_is_string(value)) {
            json_decref(value);
            return um_err_param(err, key, "%s: '%s' must be a string", where, key);
        }
        const char *name = json_string_value(value);
        enum decode_decoder d;
        if (decode_decoder_parse_any(name, &d) != 0) {
            char names[256];
            decode_decoder_list(names, sizeof names, ", ", " or ");
            int r = um_err_param(err, key,
                                 "%s: algorithm '%s' is not supported (use %s, or SGLang's LowConfidence, "
                                 "JointThreshold or HierarchyBlock)",
                                 where, name, names);
            json_decref(value);
            return r;
        }
        json_decref(value);
        value = json_string(decode_decoder_name(d));
    } else if (strcmp(to, "cache") == 0) {
        enum decode_cache c;
        if (!json_is_string(value) || decode_cache_parse(json_string_value(value), &c) != 0) {
            json_decref(value);
            return um_err_param(err, key, "%s: '%s' must be one of none, prefix, dual, vicinity", where, key);
        }
    } else if (json_is_string(value) || json_is_object(value) || json_is_array(value)) {
        json_decref(value);
        return um_err_param(err, key, "%s: '%s' must be a number or boolean", where, key);
    }
    json_object_set_new(out, to, value);
    return 0;
}

/* A YAML scalar -> JSON value (new reference). */
static json_t *yaml_scalar(char *v) {
    size_t n = strlen(v);
    if (n >= 2 && ((v[0] == '"' && v[n - 1] == '"') || (v[0] == '\'' && v[n - 1] == '\''))) {
        v[n - 1] = 0;
        return oai_json_string_lossy(v + 1, n - 2);
    }
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "yes")) return json_true();
    if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "no")) return json_false();
    if (!strcmp(v, "null") || !strcmp(v, "~") || !strcmp(v, "")) return json_null();
    char *end;
    errno = 0;
    long long iv = strtoll(v, &end, 10);
    if (*end == 0 && errno == 0) return json_integer(iv);
    errno = 0;
    double dv = strtod(v, &end);
    if (*end == 0 && errno == 0) return json_real(dv);
    return oai_json_string_lossy(v, n);
}

static int parse_yaml(const char *text, size_t len, const char *label, json_t *out, um_err *err) {
    size_t i = 0;
    int line = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        line++;
        char *l = xstrndup(text + i, j - i);
        i = j + 1;
        /* strip comments (a '#' at the start or after whitespace, outside quotes) */
        char quote = 0;
        for (char *p = l; *p; p++) {
            if (quote) {
                if (*p == quote) quote = 0;
            } else if (*p == '"' || *p == '\'') {
                quote = *p;
            } else if (*p == '#' && (p == l || isspace((unsigned char)p[-1]))) {
                *p = 0;
                break;
            }
        }
        size_t n = strlen(l);
        while (n && isspace((unsigned char)l[n - 1])) l[--n] = 0;
        char *s = l;
        while (*s == ' ') s++;
        if (*s == 0 || strcmp(s, "---") == 0) {
            free(l);
            continue;
        }
        if (s != l || *s == '\t' || *s == '-') {
            free(l);
            return um_err_set(err, UM_ERR_FORMAT,
                              "%s:%d: only flat 'key: value' lines are supported (no nesting or lists)", label, line);
        }
        char *colon = strchr(s, ':');
        if (!colon || (colon[1] && colon[1] != ' ' && colon[1] != '\t')) {
            free(l);
            return um_err_set(err, UM_ERR_FORMAT, "%s:%d: expected 'key: value'", label, line);
        }
        *colon = 0;
        char *k = s, *v = colon + 1;
        size_t kn = strlen(k);
        while (kn && isspace((unsigned char)k[kn - 1])) k[--kn] = 0;
        while (*v == ' ' || *v == '\t') v++;
        if (*v == 0 || *v == '{' || *v == '[') {
            um_err_set(err, UM_ERR_FORMAT, "%s:%d: '%s': %s", label, line, k,
                       *v ? "flow mappings/lists are not supported" : "no value (nested mappings are not supported)");
            free(l);
            return -1;
        }
        int r = add_entry(out, label, line, k, yaml_scalar(v), err);
        free(l);
        if (r) return -1;
    }
    return 0;
}

int algo_config_parse(const char *text, size_t len, const char *label, json_t **out, um_err *err) {
    *out = NULL;
    json_t *o = json_object();
    size_t k = 0;
    while (k < len && isspace((unsigned char)text[k])) k++;
    if (k < len && text[k] == '{') {
        json_error_t je;
        json_t *doc = json_loadb(text, len, 0, &je);
        if (!doc) {
            json_decref(o);
            return um_err_set(err, UM_ERR_FORMAT, "%s:%d: invalid JSON: %s", label, je.line, je.text);
        }
        const char *key;
        json_t *v;
        json_object_foreach(doc, key, v) {
            if (add_entry(o, label, 0, key, json_incref(v), err)) {
                json_decref(doc);
                json_decref(o);
                return -1;
            }
        }
        json_decref(doc);
    } else if (parse_yaml(text, len, label, o, err)) {
        json_decref(o);
        return -1;
    }
    *out = o;
    return 0;
}

int algo_config_load(const char *path, json_t **out, um_err *err) {
    char *buf = NULL;
    size_t len = 0;
    *out = NULL;
    if (file_read_all(path, ALGO_MAX_FILE, &buf, &len, err) != 0) return -1;
    int r = algo_config_parse(buf, len, path, out, err);
    free(buf);
    return r;
}

/* ---------------------------------------------------------------- a server's request policy */

void api_policy_init(api_policy *p) {
    memset(p, 0, sizeof *p);
    p->lim = api_limits_default();
    p->cache = DECODE_CACHE_AUTO;
}

void api_policy_free(api_policy *p) {
    json_decref(p->algo);
    api_policy_init(p);
}

void api_policy_bind(api_policy *pol, const model *m) {
    pol->bound = NULL;
    pol->defaults = api_policy_params(pol, m);
    pol->bound = m;
}

decode_params api_policy_params(const api_policy *pol, const model *m) {
    if (pol->bound == m) return pol->defaults;
    decode_params p = decode_params_for_serving(m, pol->cache);
    if (pol->algo) {
        decode_params saved = p;
        um_err err = {0};
        /* values were type-checked when the file was loaded; a range problem shows up in the
         * request's validation, naming the field */
        if (decode_params_apply_json(&p, pol->algo, NULL, &err) != 0) p = saved;
    }
    return p;
}
