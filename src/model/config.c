/*
 * config.c — config.json parsing and validation. Any thread.
 */
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

const char *model_arch_name(enum model_arch arch) {
    switch (arch) {
    case MODEL_ARCH_LLADA: return "llada";
    case MODEL_ARCH_LLADA_MOE: return "llada-moe";
    case MODEL_ARCH_LLADA2: return "llada2";
    case MODEL_ARCH_DREAM: return "dream";
    default: return "unknown";
    }
}

/* Integer field: present -> must be an integer in [lo, hi]; absent -> def (or error if def < lo). */
static int get_int(json_t *root, const char *key, long long lo, long long hi, long long def,
                   const char *label, int *out, um_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        if (def < lo) return um_err_set(err, UM_ERR_FORMAT, "%s: missing required key '%s'", label, key);
        *out = (int)def;
        return 0;
    }
    if (!json_is_integer(v))
        return um_err_set(err, UM_ERR_FORMAT, "%s: '%s' must be an integer", label, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return um_err_set(err, UM_ERR_FORMAT, "%s: '%s' is %lld, must be between %lld and %lld", label,
                          key, x, lo, hi);
    *out = (int)x;
    return 0;
}

static int get_float(json_t *root, const char *key, double lo, double hi, double def,
                     const char *label, float *out, um_err *err) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) {
        *out = (float)def;
        return 0;
    }
    if (!json_is_number(v))
        return um_err_set(err, UM_ERR_FORMAT, "%s: '%s' must be a number", label, key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return um_err_set(err, UM_ERR_FORMAT, "%s: '%s' is %g, must be between %g and %g", label, key,
                          x, lo, hi);
    *out = (float)x;
    return 0;
}

static int get_bool(json_t *root, const char *key, int def) {
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v)) return def;
    return json_is_true(v);
}

/* eos_token_id may be an int or a list (first entry is used). */
static int get_token_id(json_t *root, const char *key, int def) {
    json_t *v = json_object_get(root, key);
    if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
    if (json_is_integer(v)) return (int)json_integer_value(v);
    return def;
}

static int parse_llada(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    if (get_int(root, "d_model", 1, BIG, -1, label, &c->d_model, err) ||
        get_int(root, "n_layers", 1, 4096, -1, label, &c->n_layers, err) ||
        get_int(root, "n_heads", 1, 65536, -1, label, &c->n_heads, err) ||
        get_int(root, "n_kv_heads", 1, 65536, c->n_heads, label, &c->n_kv_heads, err) ||
        get_int(root, "mlp_hidden_size", 1, BIG, -1, label, &c->ffn_hidden, err) ||
        get_int(root, "vocab_size", 1, BIG, -1, label, &c->vocab_size, err) ||
        get_int(root, "embedding_size", 1, BIG, c->vocab_size, label, &c->n_embd_rows, err) ||
        get_int(root, "max_sequence_length", 1, BIG, 4096, label, &c->max_seq, err) ||
        get_float(root, "rope_theta", 1e-3, 1e12, 10000.0, label, &c->rope_theta, err) ||
        get_float(root, "rms_norm_eps", 0.0, 1.0, 1e-5, label, &c->norm_eps, err))
        return -1;
    json_t *mqa = json_object_get(root, "multi_query_attention");
    if (json_is_true(mqa)) c->n_kv_heads = 1;
    if (c->d_model % c->n_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: d_model %d is not divisible by n_heads %d", label,
                          c->d_model, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: n_heads %d is not divisible by n_kv_heads %d", label,
                          c->n_heads, c->n_kv_heads);
    c->head_dim = c->d_model / c->n_heads;
    if (c->head_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head_dim %d must be even for RoPE", label, c->head_dim);
    if (c->n_embd_rows < c->vocab_size)
        return um_err_set(err, UM_ERR_FORMAT, "%s: embedding_size %d is smaller than vocab_size %d",
                          label, c->n_embd_rows, c->vocab_size);
    c->rot_dim = c->head_dim;
    c->weight_tying = get_bool(root, "weight_tying", 0);
    /* Features of the OLMo-derived config that the LLaDA checkpoints never enable. */
    static const char *unsupported_true[] = {"alibi", "include_bias", "include_qkv_bias",
                                             "attention_layer_norm", "input_emb_norm", "scale_logits"};
    for (size_t i = 0; i < sizeof unsupported_true / sizeof *unsupported_true; i++)
        if (get_bool(root, unsupported_true[i], 0))
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: '%s': true is not supported", label,
                              unsupported_true[i]);
    if (!get_bool(root, "rope", 1))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'rope': false is not supported", label);
    json_t *bt = json_object_get(root, "block_type");
    if (json_is_string(bt) && strcmp(json_string_value(bt), "llama") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: block_type '%s' is not supported (only 'llama')",
                          label, json_string_value(bt));
    json_t *lt = json_object_get(root, "layer_norm_type");
    if (json_is_string(lt) && strcmp(json_string_value(lt), "rms") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: layer_norm_type '%s' is not supported (only 'rms')",
                          label, json_string_value(lt));
    json_t *act = json_object_get(root, "activation_type");
    if (json_is_string(act) && strcmp(json_string_value(act), "silu") != 0 &&
        strcmp(json_string_value(act), "swiglu") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: activation_type '%s' is not supported", label,
                          json_string_value(act));
    c->mask_id = get_token_id(root, "mask_token_id", 126336);
    c->eos_id = get_token_id(root, "eos_token_id", 126081);
    c->pad_id = get_token_id(root, "pad_token_id", c->eos_id);
    c->bos_id = get_token_id(root, "bos_token_id", -1);
    return 0;
}

/* Dream (DreamModel, model_type "Dream"): the Qwen2 config keys. Every model-shaping key is
 * required (a Qwen2 config always writes them); features Dream never enables are refused by name. */
static int parse_dream(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    if (get_int(root, "hidden_size", 1, BIG, -1, label, &c->d_model, err) ||
        get_int(root, "num_hidden_layers", 1, 4096, -1, label, &c->n_layers, err) ||
        get_int(root, "num_attention_heads", 1, 65536, -1, label, &c->n_heads, err) ||
        get_int(root, "num_key_value_heads", 1, 65536, c->n_heads, label, &c->n_kv_heads, err) ||
        get_int(root, "intermediate_size", 1, BIG, -1, label, &c->ffn_hidden, err) ||
        get_int(root, "vocab_size", 1, BIG, -1, label, &c->vocab_size, err) ||
        get_int(root, "max_position_embeddings", 1, BIG, 131072, label, &c->max_seq, err) ||
        get_float(root, "rope_theta", 1e-3, 1e12, 10000.0, label, &c->rope_theta, err) ||
        get_float(root, "rms_norm_eps", 0.0, 1.0, 1e-6, label, &c->norm_eps, err))
        return -1;
    if (c->d_model % c->n_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: hidden_size %d is not divisible by num_attention_heads %d", label,
                          c->d_model, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: num_attention_heads %d is not divisible by num_key_value_heads %d", label, c->n_heads,
                          c->n_kv_heads);
    c->head_dim = c->d_model / c->n_heads;
    if (c->head_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head_dim %d (hidden_size / num_attention_heads) must be even for RoPE",
                          label, c->head_dim);
    c->n_embd_rows = c->vocab_size;   /* Qwen2: embedding and LM head have vocab_size rows */
    c->rot_dim = c->head_dim;
    c->weight_tying = get_bool(root, "tie_word_embeddings", 0);
    c->logits_shifted = 1;
    json_t *act = json_object_get(root, "hidden_act");
    if (json_is_string(act) && strcmp(json_string_value(act), "silu") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only 'silu')", label,
                          json_string_value(act));
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'rope_scaling' is not supported (only null)", label);
    static const char *unsupported_true[] = {"use_sliding_window", "use_mrope"};
    for (size_t i = 0; i < sizeof unsupported_true / sizeof *unsupported_true; i++)
        if (get_bool(root, unsupported_true[i], 0))
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: '%s': true is not supported", label, unsupported_true[i]);
    c->mask_id = get_token_id(root, "mask_token_id", -1);
    c->eos_id = get_token_id(root, "eos_token_id", -1);
    c->pad_id = get_token_id(root, "pad_token_id", c->eos_id);
    c->bos_id = get_token_id(root, "bos_token_id", -1);
    return 0;
}

int model_config_parse(const char *json, size_t len, const char *label, model_config *cfg,
                       um_err *err) {
    memset(cfg, 0, sizeof *cfg);
    cfg->mask_id = cfg->eos_id = cfg->eot_id = cfg->bos_id = cfg->pad_id = -1;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root)
        return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON: %s (line %d)", label, jerr.text,
                          jerr.line);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = um_err_set(err, UM_ERR_FORMAT, "%s: not a JSON object", label);
        goto out;
    }
    json_t *archs = json_object_get(root, "architectures");
    const char *an = NULL;
    if (json_is_array(archs) && json_array_size(archs) > 0 && json_is_string(json_array_get(archs, 0)))
        an = json_string_value(json_array_get(archs, 0));
    json_t *mt = json_object_get(root, "model_type");
    const char *mts = json_is_string(mt) ? json_string_value(mt) : "";
    if (an) snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", an);
    if (an && strcmp(an, "LLaDAModelLM") == 0) {
        cfg->arch = MODEL_ARCH_LLADA;
    } else if (an && strcmp(an, "LLaDAMoEModelLM") == 0) {
        cfg->arch = MODEL_ARCH_LLADA_MOE;
    } else if (an && strcmp(an, "LLaDA2MoeModelLM") == 0) {
        cfg->arch = MODEL_ARCH_LLADA2;
    } else if ((an && strcmp(an, "DreamModel") == 0) || (!an && strcmp(mts, "Dream") == 0)) {
        cfg->arch = MODEL_ARCH_DREAM;
        if (!an) snprintf(cfg->arch_name, sizeof cfg->arch_name, "DreamModel");
    } else if (!an && strcmp(mts, "llada") == 0) {
        /* no architectures list: LLaDA-MoE shares model_type; tell them apart by key names */
        cfg->arch = json_object_get(root, "d_model") ? MODEL_ARCH_LLADA : MODEL_ARCH_LLADA_MOE;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s",
                 cfg->arch == MODEL_ARCH_LLADA ? "LLaDAModelLM" : "LLaDAMoEModelLM");
    } else {
        rc = um_err_set(err, UM_ERR_UNSUPPORTED, "%s: unknown architecture '%s' (model_type '%s')", label,
                        an ? an : "(none)", mts);
        goto out;
    }
    if (cfg->arch != MODEL_ARCH_LLADA && cfg->arch != MODEL_ARCH_DREAM) {
        rc = um_err_set(err, UM_ERR_UNSUPPORTED, "%s: architecture %s is recognised but not implemented yet",
                        label, cfg->arch_name);
        goto out;
    }
    rc = cfg->arch == MODEL_ARCH_DREAM ? parse_dream(root, label, cfg, err) : parse_llada(root, label, cfg, err);
    if (rc == 0) {
        int ids[] = {cfg->mask_id, cfg->eos_id, cfg->pad_id, cfg->bos_id};
        const char *names[] = {"mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"};
        for (int i = 0; i < 4 && rc == 0; i++)
            if (ids[i] >= cfg->n_embd_rows)
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: %s %d is outside the %d-row embedding", label,
                                names[i], ids[i], cfg->n_embd_rows);
        if (rc == 0 && cfg->mask_id < 0)
            rc = um_err_set(err, UM_ERR_FORMAT, "%s: mask_token_id is required", label);
    }
out:
    json_decref(root);
    return rc;
}

int model_config_apply_generation(const char *json, size_t len, const char *label,
                                  model_config *cfg, um_err *err) {
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON: %s", label, root ? "not an object" : jerr.text);
    }
    int bos = get_token_id(root, "bos_token_id", cfg->bos_id);
    int eos = get_token_id(root, "eos_token_id", cfg->eos_id);
    json_decref(root);
    if (bos >= cfg->n_embd_rows || eos >= cfg->n_embd_rows)
        return um_err_set(err, UM_ERR_FORMAT, "%s: token id outside the %d-row embedding", label,
                          cfg->n_embd_rows);
    cfg->bos_id = bos;
    cfg->eos_id = eos;
    return 0;
}

long long model_config_n_params(const model_config *c) {
    long long d = c->d_model, kv = (long long)c->n_kv_heads * c->head_dim;
    long long per_layer = d * d * 2 + d * kv * 2 + 3 * d * (long long)c->ffn_hidden + 2 * d;
    if (c->arch == MODEL_ARCH_DREAM) per_layer += d + 2 * kv;   /* q/k/v biases */
    long long emb = (long long)c->n_embd_rows * d;
    return emb * (c->weight_tying ? 1 : 2) + c->n_layers * per_layer + d;
}
