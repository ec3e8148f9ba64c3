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

/* "quantization_config" of an FP8 checkpoint (the common layout: E4M3 weights, 128 x 128 block
 * scales). Other quantization methods are left to the tensors' dtypes, which the loader names. */
static int parse_quantization(json_t *root, const char *label, model_config *c, um_err *err) {
    c->fp8_block[0] = c->fp8_block[1] = 128;
    json_t *q = json_object_get(root, "quantization_config");
    if (!json_is_object(q)) return 0;
    json_t *m = json_object_get(q, "quant_method");
    if (!json_is_string(m) || strcmp(json_string_value(m), "fp8") != 0) return 0;
    c->fp8 = 1;
    json_t *fmt = json_object_get(q, "fmt");
    if (json_is_string(fmt) && strcmp(json_string_value(fmt), "e4m3") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: quantization_config.fmt is '%.32s'; only FP8 e4m3 weights are "
                          "supported", label, json_string_value(fmt));
    json_t *bs = json_object_get(q, "weight_block_size");
    if (!bs || json_is_null(bs)) return 0;
    for (int i = 0; i < 2; i++) {
        json_t *v = json_is_array(bs) && json_array_size(bs) == 2 ? json_array_get(bs, (size_t)i) : NULL;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
            return um_err_set(err, UM_ERR_FORMAT, "%s: quantization_config.weight_block_size must be [rows, cols] of "
                              "integers in [1, 65536]", label);
        c->fp8_block[i] = (int)json_integer_value(v);
    }
    return 0;
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

/* The transformer shape every Hugging Face-style config (Dream / Qwen2, LLaDA-MoE, LLaDA2) names
 * alike, all required but num_key_value_heads (default: num_attention_heads). */
static int get_hf_shape(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    return get_int(root, "hidden_size", 1, BIG, -1, label, &c->d_model, err) ||
           get_int(root, "num_hidden_layers", 1, 4096, -1, label, &c->n_layers, err) ||
           get_int(root, "num_attention_heads", 1, 65536, -1, label, &c->n_heads, err) ||
           get_int(root, "num_key_value_heads", 1, 65536, c->n_heads, label, &c->n_kv_heads, err);
}

/* Refuse a key whose value is true (features the supported releases never enable). */
static int refuse_true(json_t *root, const char *const *keys, size_t n, const char *label, um_err *err) {
    for (size_t i = 0; i < n; i++)
        if (get_bool(root, keys[i], 0))
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: '%s': true is not supported", label, keys[i]);
    return 0;
}

/* hidden_act must be silu, rope_scaling null (Qwen2 / Dream and both MoE families). */
static int check_act_rope(json_t *root, const char *label, um_err *err) {
    json_t *act = json_object_get(root, "hidden_act");
    if (json_is_string(act) && strcmp(json_string_value(act), "silu") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (only 'silu')", label,
                          json_string_value(act));
    json_t *rs = json_object_get(root, "rope_scaling");
    if (rs && !json_is_null(rs))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'rope_scaling' is not supported (only null)", label);
    return 0;
}

/* Dream (DreamModel, model_type "Dream"): the Qwen2 config keys. Every model-shaping key is
 * required (a Qwen2 config always writes them); features Dream never enables are refused by name. */
static int parse_dream(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    if (get_hf_shape(root, label, c, err) ||
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
    static const char *const unsupported_true[] = {"use_sliding_window", "use_mrope"};
    if (check_act_rope(root, label, err) != 0 ||
        refuse_true(root, unsupported_true, sizeof unsupported_true / sizeof *unsupported_true, label, err) != 0)
        return -1;
    c->mask_id = get_token_id(root, "mask_token_id", -1);
    c->eos_id = get_token_id(root, "eos_token_id", -1);
    c->pad_id = get_token_id(root, "pad_token_id", c->eos_id);
    c->bos_id = get_token_id(root, "bos_token_id", -1);
    return 0;
}

/* ---------------------------------------------------------------- MoE families */

/* Heads, head_dim (explicit or hidden / heads) and the rotary width from partial_rotary_factor. */
static int moe_heads(json_t *root, const char *label, int prf_required, model_config *c, um_err *err) {
    if (c->n_heads % c->n_kv_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: num_attention_heads %d is not divisible by num_key_value_heads %d", label, c->n_heads,
                          c->n_kv_heads);
    json_t *hdv = json_object_get(root, "head_dim");
    if (hdv && !json_is_null(hdv)) {
        if (get_int(root, "head_dim", 2, 65536, -1, label, &c->head_dim, err)) return -1;
    } else {
        if (c->d_model % c->n_heads != 0)
            return um_err_set(err, UM_ERR_FORMAT, "%s: hidden_size %d is not divisible by num_attention_heads %d",
                              label, c->d_model, c->n_heads);
        c->head_dim = c->d_model / c->n_heads;
    }
    if (c->head_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head_dim %d must be even for RoPE", label, c->head_dim);
    json_t *pv = json_object_get(root, "partial_rotary_factor");
    double prf = 1.0;
    if (pv && !json_is_null(pv)) {
        if (!json_is_number(pv))
            return um_err_set(err, UM_ERR_FORMAT, "%s: 'partial_rotary_factor' must be a number", label);
        prf = json_number_value(pv);
    } else if (prf_required) {
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: missing required key 'partial_rotary_factor' (the config class default -1 is not a "
                          "valid factor; 1.0 rotates the whole head)",
                          label);
    }
    if (!(prf > 0.0 && prf <= 1.0))
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: 'partial_rotary_factor' is %g, must be in (0, 1] (the fraction of head_dim that RoPE "
                          "rotates)",
                          label, prf);
    c->rot_dim = (int)(c->head_dim * prf);
    if (c->rot_dim < 2 || c->rot_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: partial_rotary_factor %g gives %d rotary dims of head_dim %d; "
                          "they must be a positive even number", label, prf, c->rot_dim, c->head_dim);
    json_t *rd = json_object_get(root, "rotary_dim");
    if (rd && !json_is_null(rd) && (!json_is_integer(rd) || json_integer_value(rd) != c->rot_dim))
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: 'rotary_dim' disagrees with head_dim %d x partial_rotary_factor %g = %d", label,
                          c->head_dim, prf, c->rot_dim);
    return 0;
}

/* Token ids of the MoE families: the config's keys when present, else the releases' ids
 * (<|mask|> 156895, <|endoftext|> 156892) when they fit the vocabulary, else -1 (model_load then
 * reads <|mask|> / <|endoftext|> from the tokenizer). */
static void moe_token_ids(json_t *root, model_config *c) {
    const int V = c->n_embd_rows;
    c->mask_id = get_token_id(root, "mask_token_id", 156895 < V ? 156895 : -1);
    c->pad_id = get_token_id(root, "pad_token_id", -1);
    c->eos_id = get_token_id(root, "eos_token_id", c->pad_id >= 0 ? c->pad_id : (156892 < V ? 156892 : -1));
    if (c->pad_id < 0) c->pad_id = c->eos_id;
    c->bos_id = get_token_id(root, "bos_token_id", -1);
}

/* LLaDA-MoE (LLaDAMoEModelLM; its config says model_type "llada"): the OLMoE keys of
 * configuration_lladamoe.py. Keys the official model code ignores (moe_router_score_function,
 * routed_scaling_factor, router_num_group, router_topk_group, norm_topk_prob) are not read. */
static int parse_llada_moe(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    if (get_hf_shape(root, label, c, err) ||
        get_int(root, "num_experts", 1, 65536, -1, label, &c->n_experts, err) ||
        get_int(root, "num_experts_per_tok", 1, 65536, -1, label, &c->moe_top_k, err) ||
        get_int(root, "expert_intermediate_size", 1, BIG, -1, label, &c->moe_ffn, err) ||
        get_int(root, "vocab_size", 1, BIG, -1, label, &c->vocab_size, err) ||
        get_int(root, "max_position_embeddings", 1, BIG, 4096, label, &c->max_seq, err) ||
        get_float(root, "rms_norm_eps", 0.0, 1.0, 1e-5, label, &c->norm_eps, err))
        return -1;
    json_t *rt = json_object_get(root, "rope_theta");
    if (!rt || json_is_null(rt))
        return um_err_set(err, UM_ERR_FORMAT, "%s: missing required key 'rope_theta' (the config class default -1 is "
                          "not a valid base)", label);
    if (get_float(root, "rope_theta", 1e-3, 1e12, 0, label, &c->rope_theta, err)) return -1;
    if (c->moe_top_k > c->n_experts)
        return um_err_set(err, UM_ERR_FORMAT, "%s: num_experts_per_tok %d is larger than num_experts %d", label,
                          c->moe_top_k, c->n_experts);
    if (moe_heads(root, label, 1, c, err)) return -1;
    if (c->head_dim * c->n_heads != c->d_model)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head_dim %d x num_attention_heads %d must equal hidden_size %d",
                          label, c->head_dim, c->n_heads, c->d_model);
    /* shared_expert_intermediate_size: null = no shared expert; the class default -1 is invalid */
    json_t *sh = json_object_get(root, "shared_expert_intermediate_size");
    if (!sh)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: missing key 'shared_expert_intermediate_size' (null for no shared expert; the config "
                          "class default -1 is not a size)", label);
    if (!json_is_null(sh)) {
        if (!json_is_integer(sh) || json_integer_value(sh) < 1 || json_integer_value(sh) > BIG)
            return um_err_set(err, UM_ERR_FORMAT,
                              "%s: 'shared_expert_intermediate_size' must be a positive size, or null for no shared "
                              "expert (the config class default -1 is not a size)", label);
        c->shared_ffn = (int)json_integer_value(sh);
    }
    /* moe_layer_freq: per layer 1 = MoE, 0 = dense (dense_intermediate_size); unmask supports dense
     * layers only before the first MoE layer */
    json_t *freq = json_object_get(root, "moe_layer_freq");
    c->first_dense = 0;
    if (freq && !json_is_null(freq)) {
        if (!json_is_array(freq) || (int)json_array_size(freq) != c->n_layers)
            return um_err_set(err, UM_ERR_FORMAT, "%s: 'moe_layer_freq' must be a list of num_hidden_layers (%d) 0/1 "
                              "entries", label, c->n_layers);
        int seen_moe = 0;
        for (int l = 0; l < c->n_layers; l++) {
            json_t *e = json_array_get(freq, (size_t)l);
            if (!json_is_integer(e) || (json_integer_value(e) != 0 && json_integer_value(e) != 1))
                return um_err_set(err, UM_ERR_FORMAT, "%s: moe_layer_freq[%d] must be 0 (dense) or 1 (MoE)", label, l);
            if (json_integer_value(e) == 1) seen_moe = 1;
            else if (seen_moe)
                return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: moe_layer_freq[%d] is 0 after a MoE layer; only "
                                  "leading dense layers are supported", label, l);
            else c->first_dense++;
        }
    }
    c->ffn_hidden = 0;
    if (c->first_dense > 0 &&
        get_int(root, "dense_intermediate_size", 1, BIG, -1, label, &c->ffn_hidden, err))
        return -1;
    c->qk_norm = get_bool(root, "qk_layernorm", 0);
    c->expert_bias = get_bool(root, "moe_router_enable_expert_bias", 0);
    c->router = MODEL_ROUTER_SOFTMAX;
    c->routed_scale = 1.0f;
    c->n_group = c->topk_group = 1;
    c->n_embd_rows = c->vocab_size;
    c->weight_tying = get_bool(root, "tie_word_embeddings", 0);
    static const char *unsupported_true[] = {"attention_bias"};
    if (refuse_true(root, unsupported_true, 1, label, err) || check_act_rope(root, label, err)) return -1;
    json_t *clip = json_object_get(root, "clip_qkv");
    if (clip && !json_is_null(clip))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'clip_qkv' is not supported (only null)", label);
    moe_token_ids(root, c);
    return 0;
}

/* LLaDA2.0 / 2.1 (LLaDA2MoeModelLM, the BailingMoeV2 keys of configuration_llada2_moe.py). */
static int parse_llada2(json_t *root, const char *label, model_config *c, um_err *err) {
    const long long BIG = 1 << 24;
    if (get_hf_shape(root, label, c, err) ||
        get_int(root, "intermediate_size", 1, BIG, -1, label, &c->ffn_hidden, err) ||
        get_int(root, "num_experts", 1, 65536, -1, label, &c->n_experts, err) ||
        get_int(root, "num_experts_per_tok", 1, 65536, -1, label, &c->moe_top_k, err) ||
        get_int(root, "moe_intermediate_size", 1, BIG, -1, label, &c->moe_ffn, err) ||
        get_int(root, "first_k_dense_replace", 0, 4096, 0, label, &c->first_dense, err) ||
        get_int(root, "n_group", 1, 65536, 1, label, &c->n_group, err) ||
        get_int(root, "topk_group", 1, 65536, 1, label, &c->topk_group, err) ||
        get_int(root, "vocab_size", 1, BIG, -1, label, &c->vocab_size, err) ||
        get_int(root, "max_position_embeddings", 1, BIG, 16384, label, &c->max_seq, err) ||
        get_float(root, "rope_theta", 1e-3, 1e12, 10000.0, label, &c->rope_theta, err) ||
        get_float(root, "rms_norm_eps", 0.0, 1.0, 1e-6, label, &c->norm_eps, err) ||
        get_float(root, "routed_scaling_factor", 0.0, 1e6, 1.0, label, &c->routed_scale, err))
        return -1;
    if (c->first_dense > c->n_layers)
        return um_err_set(err, UM_ERR_FORMAT, "%s: first_k_dense_replace %d is larger than num_hidden_layers %d", label,
                          c->first_dense, c->n_layers);
    int n_shared = 0;
    if (get_int(root, "num_shared_experts", 0, 1024, 0, label, &n_shared, err)) return -1;
    c->shared_ffn = n_shared * c->moe_ffn;
    if (c->n_experts % c->n_group != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: num_experts %d is not divisible by n_group %d", label, c->n_experts,
                          c->n_group);
    if (c->n_experts / c->n_group < 2)
        return um_err_set(err, UM_ERR_FORMAT, "%s: n_group %d leaves fewer than 2 experts per group (the group score "
                          "sums each group's best two)", label, c->n_group);
    if (c->topk_group > c->n_group)
        return um_err_set(err, UM_ERR_FORMAT, "%s: topk_group %d is larger than n_group %d", label, c->topk_group,
                          c->n_group);
    if (c->moe_top_k > c->topk_group * (c->n_experts / c->n_group))
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: num_experts_per_tok %d is larger than the %d experts of topk_group %d groups", label,
                          c->moe_top_k, c->topk_group * (c->n_experts / c->n_group), c->topk_group);
    if (moe_heads(root, label, 0, c, err)) return -1;
    json_t *sf = json_object_get(root, "score_function");
    if (json_is_string(sf) && strcmp(json_string_value(sf), "sigmoid") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: score_function '%s' is not supported (only 'sigmoid')", label,
                          json_string_value(sf));
    if (!get_bool(root, "use_rmsnorm", 1))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'use_rmsnorm': false is not supported", label);
    /* use_bias: the config class defaults to true (a bias on attention.dense), the releases say false */
    json_t *ub = json_object_get(root, "use_bias");
    if (!ub || !json_is_false(ub))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: 'use_bias' must be false (a bias on attention.dense is not "
                          "supported; the config class defaults to true when the key is missing)", label);
    static const char *unsupported_true[] = {"use_qkv_bias", "norm_head", "use_sliding_window"};
    if (refuse_true(root, unsupported_true, 3, label, err) || check_act_rope(root, label, err)) return -1;
    c->qk_norm = get_bool(root, "use_qk_norm", 1);
    c->fused_qkv = 1;
    c->expert_bias = get_bool(root, "moe_router_enable_expert_bias", 0);
    c->router = MODEL_ROUTER_SIGMOID_GROUP;
    c->n_embd_rows = c->vocab_size;
    c->weight_tying = get_bool(root, "tie_word_embeddings", 0);
    c->block_causal = 32;   /* the releases' block size (no config key; SGLang's block_size) */
    moe_token_ids(root, c);
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
    switch (cfg->arch) {
    case MODEL_ARCH_DREAM: rc = parse_dream(root, label, cfg, err); break;
    case MODEL_ARCH_LLADA_MOE: rc = parse_llada_moe(root, label, cfg, err); break;
    case MODEL_ARCH_LLADA2: rc = parse_llada2(root, label, cfg, err); break;
    default: rc = parse_llada(root, label, cfg, err); break;
    }
    if (rc == 0) rc = parse_quantization(root, label, cfg, err);
    if (rc == 0) {
        int ids[] = {cfg->mask_id, cfg->eos_id, cfg->pad_id, cfg->bos_id};
        const char *names[] = {"mask_token_id", "eos_token_id", "pad_token_id", "bos_token_id"};
        for (int i = 0; i < 4 && rc == 0; i++)
            if (ids[i] >= cfg->n_embd_rows)
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: %s %d is outside the %d-row embedding", label,
                                names[i], ids[i], cfg->n_embd_rows);
        if (rc == 0 && cfg->mask_id < 0 && cfg->n_experts == 0)   /* MoE: model_load reads <|mask|> */
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
    long long d = c->d_model, kv = (long long)c->n_kv_heads * c->head_dim, qd = (long long)c->n_heads * c->head_dim;
    long long attn = d * qd * 2 + d * kv * 2 + 2 * d + (c->qk_norm ? 2LL * c->head_dim : 0);
    if (c->arch == MODEL_ARCH_DREAM) attn += qd + 2 * kv;   /* q/k/v biases */
    long long dense = 3 * d * (long long)c->ffn_hidden;
    long long moe = (long long)c->n_experts * (d + 3 * d * (long long)c->moe_ffn) + 3 * d * (long long)c->shared_ffn +
                    (c->expert_bias ? c->n_experts : 0);
    int n_dense = c->n_experts > 0 ? c->first_dense : c->n_layers;
    long long emb = (long long)c->n_embd_rows * d;
    return emb * (c->weight_tying ? 1 : 2) + c->n_layers * attn + n_dense * dense + (c->n_layers - n_dense) * moe + d;
}

int model_config_check_tp(const model_config *c, const char *label, int tp, um_err *err) {
    if (tp < 1) return um_err_param(err, "tp", "--tp must be >= 1, got %d", tp);
    if (c->n_experts > 0 && (c->n_heads % tp || c->n_kv_heads % tp || c->ffn_hidden % tp || c->shared_ffn % tp)) {
        /* MoE: experts are split in ranges (any count), the shared expert by its width */
        um_err_param(err, "tp",
                     "--tp %d: expert/tensor parallelism needs n_heads (%d), n_kv_heads (%d), the dense MLP width "
                     "(%d) and the shared expert width (%d) of %s divisible by %d",
                     tp, c->n_heads, c->n_kv_heads, c->ffn_hidden, c->shared_ffn, label, tp);
        if (err) err->code = UM_ERR_UNSUPPORTED;
        return -1;
    }
    if (c->n_heads % tp || c->n_kv_heads % tp || c->ffn_hidden % tp) {
        um_err_param(err, "tp",
                     "--tp %d: tensor parallelism needs n_heads (%d), n_kv_heads (%d) and the MLP width (%d) of %s "
                     "divisible by %d",
                     tp, c->n_heads, c->n_kv_heads, c->ffn_hidden, label, tp);
        if (err) err->code = UM_ERR_UNSUPPORTED;
        return -1;
    }
    return 0;
}
