/*
 * make_model.c — LLaDA-layout checkpoints (see make_model.h): random weights, or trained ones read
 * from an F32 safetensors file, as float or FP8 (E4M3 + 128 x 128 block scales) matrices, with the
 * built-in, a corpus-trained or a copied tokenizer.
 * Main thread + OpenMP workers.
 */
#include "model/make_model.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/safetensors.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include "util/log.h"
#include "util/rng.h"

int make_model_preset(const char *name, make_model_opts *o) {
    memset(o, 0, sizeof *o);
    o->rope_theta = 500000.0;
    o->dtype = DTYPE_BF16;
    o->seed = 1234;
    o->shards = 1;
    if (strcmp(name, "tiny") == 0) {
        o->d_model = 64, o->n_layers = 2, o->n_heads = 4, o->n_kv_heads = 4, o->ffn_hidden = 176;
        o->vocab_size = 512, o->max_seq = 1024;
    } else if (strcmp(name, "demo") == 0) { /* a random demo model: quick on 2 CPU cores */
        o->d_model = 256, o->n_layers = 4, o->n_heads = 4, o->n_kv_heads = 4, o->ffn_hidden = 704;
        o->vocab_size = 2048, o->max_seq = 2048;
    } else if (strcmp(name, "small") == 0) { /* ~100M parameters */
        o->d_model = 768, o->n_layers = 12, o->n_heads = 12, o->n_kv_heads = 12, o->ffn_hidden = 2048;
        o->vocab_size = 8192, o->max_seq = 4096;
    } else if (strcmp(name, "8b") == 0) { /* LLaDA-8B-Instruct shape */
        o->d_model = 4096, o->n_layers = 32, o->n_heads = 32, o->n_kv_heads = 32, o->ffn_hidden = 12288;
        o->vocab_size = 126464, o->embd_rows = 126464, o->max_seq = 4096;   /* LM head as large as the real one */
    } else if (strcmp(name, "dream-tiny") == 0) { /* Dream layout, GQA 2:1, for tests */
        o->dream = 1, o->rope_theta = 1000000.0;
        o->d_model = 64, o->n_layers = 2, o->n_heads = 4, o->n_kv_heads = 2, o->ffn_hidden = 176;
        o->vocab_size = 512, o->max_seq = 1024;
    } else if (strcmp(name, "dream-7b") == 0) { /* Dream-v0-Instruct-7B shape (GQA 7:1) */
        o->dream = 1, o->rope_theta = 1000000.0;
        o->d_model = 3584, o->n_layers = 28, o->n_heads = 28, o->n_kv_heads = 4, o->ffn_hidden = 18944;
        o->vocab_size = 152064, o->max_seq = 131072;
    } else if (strcmp(name, "lladamoe-tiny") == 0) { /* LLaDA-MoE layout for tests: 8 experts, top-2 */
        o->moe = MAKE_MOE_LLADA_MOE, o->rope_theta = 50000.0, o->partial_rotary = 1.0;
        o->d_model = 64, o->n_layers = 2, o->n_heads = 4, o->n_kv_heads = 4, o->ffn_hidden = 128;
        o->n_experts = 8, o->moe_top_k = 2, o->moe_ffn = 32, o->vocab_size = 512, o->max_seq = 1024;
    } else if (strcmp(name, "lladamoe-7b") == 0) { /* LLaDA-MoE-7B-A1B shape */
        o->moe = MAKE_MOE_LLADA_MOE, o->rope_theta = 50000.0, o->partial_rotary = 1.0;
        o->d_model = 2048, o->n_layers = 16, o->n_heads = 16, o->n_kv_heads = 16, o->ffn_hidden = 8192;
        o->n_experts = 64, o->moe_top_k = 8, o->moe_ffn = 1024, o->vocab_size = 157184, o->max_seq = 8192;
    } else if (strcmp(name, "llada2-tiny") == 0) { /* LLaDA2 layout for tests: dense layer 0, 2 groups of 4 */
        o->moe = MAKE_MOE_LLADA2, o->rope_theta = 600000.0, o->partial_rotary = 0.5;
        o->d_model = 64, o->n_layers = 3, o->n_heads = 4, o->n_kv_heads = 2, o->ffn_hidden = 160;
        o->n_experts = 8, o->moe_top_k = 2, o->moe_ffn = 32, o->shared_ffn = 32, o->first_dense = 1;
        o->n_group = 2, o->topk_group = 1, o->routed_scale = 2.5, o->expert_bias = 1;
        o->vocab_size = 512, o->max_seq = 1024;
    } else if (strcmp(name, "llada2-mini") == 0 || strcmp(name, "llada2-flash") == 0) {
        const int flash = name[7] == 'f';
        o->moe = MAKE_MOE_LLADA2, o->rope_theta = 600000.0, o->partial_rotary = 0.5;
        o->d_model = flash ? 4096 : 2048, o->n_layers = flash ? 32 : 20, o->n_heads = flash ? 32 : 16;
        o->n_kv_heads = 4, o->ffn_hidden = flash ? 9216 : 5120;
        o->n_experts = 256, o->moe_top_k = 8, o->moe_ffn = flash ? 1024 : 512, o->first_dense = 1;
        o->shared_ffn = o->moe_ffn, o->n_group = 8, o->topk_group = 4, o->routed_scale = 2.5, o->expert_bias = 1;
        o->vocab_size = 157184, o->max_seq = 16384;
    } else {
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- config.json */

#define FP8_BLOCK 128   /* rows and columns of weights one FP8 block scale covers */

/* An FP8 checkpoint's quantization_config, as the common FP8 releases write it. */
static void add_quantization_config(json_t *c, const make_model_opts *o) {
    if (!o->fp8) return;
    json_object_set_new(c, "quantization_config",
                        json_pack("{s:s,s:s,s:s,s:[i,i]}", "activation_scheme", "dynamic", "fmt", "e4m3",
                                  "quant_method", "fp8", "weight_block_size", FP8_BLOCK, FP8_BLOCK));
}

static int write_config(const char *dir, const make_model_opts *o, int vocab, int n_rows,
                        const tokenizer_special *sp, um_err *err) {
    /* Same keys as LLaDA-8B-Instruct's config.json, sizes replaced. */
    json_t *c = json_object();
    json_object_set_new(c, "activation_type", json_string("silu"));
    json_object_set_new(c, "alibi", json_false());
    json_object_set_new(c, "alibi_bias_max", json_real(8.0));
    json_object_set_new(c, "architectures", json_pack("[s]", "LLaDAModelLM"));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "attention_layer_norm", json_false());
    json_object_set_new(c, "attention_layer_norm_with_affine", json_true());
    json_object_set_new(c, "auto_map", json_pack("{s:s,s:s,s:s}", "AutoConfig", "configuration_llada.LLaDAConfig",
                                                 "AutoModelForCausalLM", "modeling_llada.LLaDAModelLM",
                                                 "AutoModel", "modeling_llada.LLaDAModelLM"));
    json_object_set_new(c, "bias_for_layer_norm", json_false());
    json_object_set_new(c, "block_group_size", json_integer(1));
    json_object_set_new(c, "block_type", json_string("llama"));
    json_object_set_new(c, "d_model", json_integer(o->d_model));
    json_object_set_new(c, "embedding_dropout", json_real(0.0));
    json_object_set_new(c, "embedding_size", json_integer(n_rows));
    json_object_set_new(c, "eos_token_id", json_integer(sp->eos));
    json_object_set_new(c, "flash_attention", json_false());
    json_object_set_new(c, "include_bias", json_false());
    json_object_set_new(c, "include_qkv_bias", json_false());
    json_object_set_new(c, "init_cutoff_factor", json_null());
    json_object_set_new(c, "init_device", json_string("meta"));
    json_object_set_new(c, "init_fn", json_string("mitchell"));
    json_object_set_new(c, "init_std", json_real(0.02));
    json_object_set_new(c, "input_emb_norm", json_false());
    json_object_set_new(c, "layer_norm_type", json_string("rms"));
    json_object_set_new(c, "layer_norm_with_affine", json_true());
    json_object_set_new(c, "mask_token_id", json_integer(sp->mask));
    json_object_set_new(c, "max_sequence_length", json_integer(o->max_seq));
    json_object_set_new(c, "mlp_hidden_size", json_integer(o->ffn_hidden));
    json_object_set_new(c, "mlp_ratio", json_integer(4));
    json_object_set_new(c, "model_type", json_string("llada"));
    json_object_set_new(c, "multi_query_attention", json_null());
    json_object_set_new(c, "n_heads", json_integer(o->n_heads));
    json_object_set_new(c, "n_kv_heads", json_integer(o->n_kv_heads));
    json_object_set_new(c, "n_layers", json_integer(o->n_layers));
    json_object_set_new(c, "pad_token_id", json_integer(sp->pad));
    json_object_set_new(c, "precision", json_string("amp_bf16"));
    json_object_set_new(c, "residual_dropout", json_real(0.0));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-05));
    json_object_set_new(c, "rope", json_true());
    json_object_set_new(c, "rope_full_precision", json_true());
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "scale_logits", json_false());
    json_object_set_new(c, "transformers_version", json_string("4.46.3"));
    json_object_set_new(c, "use_cache", json_false());
    json_object_set_new(c, "vocab_size", json_integer(vocab));
    json_object_set_new(c, "weight_tying", o->weight_tying ? json_true() : json_false());
    add_quantization_config(c, o);
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    if (rc != 0) return um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
    json_t *g = json_pack("{s:b,s:i,s:i,s:s}", "_from_model_config", 1, "bos_token_id", sp->bos,
                          "eos_token_id", sp->eos, "transformers_version", "4.38.2");
    path_join(path, sizeof path, dir, "generation_config.json");
    rc = json_dump_file(g, path, JSON_INDENT(4));
    json_decref(g);
    if (rc != 0) return um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
    return 0;
}

/* Dream-v0-Instruct-7B's config.json keys, sizes replaced; its generation_config.json as released. */
static int write_config_dream(const char *dir, const make_model_opts *o, int n_rows, const tokenizer_special *sp,
                              um_err *err) {
    json_t *c = json_object();
    json_object_set_new(c, "architectures", json_pack("[s]", "DreamModel"));
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "auto_map", json_pack("{s:s,s:s}", "AutoConfig", "configuration_dream.DreamConfig",
                                                 "AutoModel", "modeling_dream.DreamModel"));
    json_object_set_new(c, "bos_token_id", json_integer(sp->eos));   /* Dream: bos = eos = <|endoftext|> */
    json_object_set_new(c, "eos_token_id", json_integer(sp->eos));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(o->d_model));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "intermediate_size", json_integer(o->ffn_hidden));
    json_object_set_new(c, "mask_token_id", json_integer(sp->mask));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_seq));
    json_object_set_new(c, "max_window_layers", json_integer(o->n_layers));
    json_object_set_new(c, "model_type", json_string("Dream"));
    json_object_set_new(c, "num_attention_heads", json_integer(o->n_heads));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->n_layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->n_kv_heads));
    json_object_set_new(c, "pad_token_id", json_integer(sp->pad));
    json_object_set_new(c, "rms_norm_eps", json_real(1e-06));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "sliding_window", json_null());
    json_object_set_new(c, "tie_word_embeddings", o->weight_tying ? json_true() : json_false());
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(c, "transformers_version", json_string("4.46.2"));
    json_object_set_new(c, "use_cache", json_true());
    json_object_set_new(c, "use_mrope", json_false());
    json_object_set_new(c, "use_sliding_window", json_false());
    json_object_set_new(c, "vocab_size", json_integer(n_rows));
    add_quantization_config(c, o);
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    int rc = json_dump_file(c, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(c);
    if (rc != 0) return um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
    json_t *g = json_pack("{s:b,s:s,s:n,s:i,s:i,s:f,s:n,s:b,s:i,s:i,s:f,s:n,s:n,s:s}", "_from_model_config", 1,
                          "alg", "origin", "alg_temp", "bos_token_id", sp->eos, "eos_token_id", sp->eos, "eps", 0.001,
                          "mask_token_id", "output_history", 0, "pad_token_id", sp->pad, "steps", 512,
                          "temperature", 0.0, "top_k", "top_p", "transformers_version", "4.46.2");
    if (!g) return um_err_set(err, UM_ERR_INTERNAL, "generation_config.json: JSON construction failed");
    path_join(path, sizeof path, dir, "generation_config.json");
    rc = json_dump_file(g, path, JSON_INDENT(2));
    json_decref(g);
    if (rc != 0) return um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
    return 0;
}

/* LLaDA-MoE (configuration_lladamoe.py keys) or LLaDA2 (the LLaDA2.0-mini release's config.json keys),
 * sizes replaced. Token ids: LLaDA2's release names only pad_token_id (eos falls back to it, <|mask|>
 * comes from the tokenizer); without a tokenizer mask_token_id is written too. */
static int write_config_moe(const char *dir, const make_model_opts *o, int n_rows, const tokenizer_special *sp,
                            int has_tok, um_err *err) {
    json_t *c = json_object();
    json_object_set_new(c, "attention_dropout", json_real(0.0));
    json_object_set_new(c, "hidden_act", json_string("silu"));
    json_object_set_new(c, "hidden_size", json_integer(o->d_model));
    json_object_set_new(c, "initializer_range", json_real(0.02));
    json_object_set_new(c, "max_position_embeddings", json_integer(o->max_seq));
    json_object_set_new(c, "num_attention_heads", json_integer(o->n_heads));
    json_object_set_new(c, "num_experts", json_integer(o->n_experts));
    json_object_set_new(c, "num_experts_per_tok", json_integer(o->moe_top_k));
    json_object_set_new(c, "num_hidden_layers", json_integer(o->n_layers));
    json_object_set_new(c, "num_key_value_heads", json_integer(o->n_kv_heads));
    json_object_set_new(c, "output_router_logits", json_false());
    json_object_set_new(c, "pad_token_id", json_integer(sp->pad));
    json_object_set_new(c, "partial_rotary_factor", json_real(o->partial_rotary));
    json_object_set_new(c, "rope_scaling", json_null());
    json_object_set_new(c, "rope_theta", json_real(o->rope_theta));
    json_object_set_new(c, "tie_word_embeddings", o->weight_tying ? json_true() : json_false());
    json_object_set_new(c, "torch_dtype", json_string("bfloat16"));
    json_object_set_new(c, "use_cache", json_false());
    json_object_set_new(c, "vocab_size", json_integer(n_rows));
    json_object_set_new(c, "moe_router_enable_expert_bias", o->expert_bias ? json_true() : json_false());
    if (!has_tok) json_object_set_new(c, "mask_token_id", json_integer(sp->mask));
    if (o->moe == MAKE_MOE_LLADA_MOE) {
        json_object_set_new(c, "architectures", json_pack("[s]", "LLaDAMoEModelLM"));
        json_object_set_new(c, "auto_map", json_pack("{s:s,s:s}", "AutoConfig", "configuration_lladamoe.LLaDAMoEConfig",
                                                     "AutoModel", "modeling_lladamoe.LLaDAMoEModelLM"));
        json_object_set_new(c, "model_type", json_string("llada"));
        json_object_set_new(c, "attention_bias", json_false());
        json_object_set_new(c, "bos_token_id", json_null());
        json_object_set_new(c, "clip_qkv", json_null());
        json_object_set_new(c, "dense_intermediate_size", json_integer(o->ffn_hidden));
        json_object_set_new(c, "eos_token_id", json_integer(sp->eos));
        json_object_set_new(c, "expert_intermediate_size", json_integer(o->moe_ffn));
        json_t *freq = json_array();
        for (int l = 0; l < o->n_layers; l++) json_array_append_new(freq, json_integer(l < o->first_dense ? 0 : 1));
        json_object_set_new(c, "moe_layer_freq", freq);
        json_object_set_new(c, "moe_router_score_function", json_string("softmax"));
        json_object_set_new(c, "norm_topk_prob", json_false());
        json_object_set_new(c, "qk_layernorm", json_true());
        json_object_set_new(c, "rms_norm_eps", json_real(1e-05));
        json_object_set_new(c, "routed_scaling_factor", json_integer(1));
        json_object_set_new(c, "router_aux_loss_coef", json_real(0.01));
        json_object_set_new(c, "router_num_group", json_null());
        json_object_set_new(c, "router_topk_group", json_null());
        json_object_set_new(c, "shared_expert_intermediate_size",
                            o->shared_ffn > 0 ? json_integer(o->shared_ffn) : json_null());
        json_object_set_new(c, "transformers_version", json_string("4.48.3"));
    } else {
        json_object_set_new(c, "architectures", json_pack("[s]", "LLaDA2MoeModelLM"));
        json_object_set_new(c, "auto_map", json_pack("{s:s,s:s,s:s}", "AutoConfig", "configuration_llada2_moe.LLaDA2MoeConfig",
                                                     "AutoModel", "modeling_llada2_moe.LLaDA2MoeModel",
                                                     "AutoModelForCausalLM", "modeling_llada2_moe.LLaDA2MoeModelLM"));
        json_object_set_new(c, "model_type", json_string("llada2_moe"));
        json_object_set_new(c, "intermediate_size", json_integer(o->ffn_hidden));
        json_object_set_new(c, "first_k_dense_replace", json_integer(o->first_dense));
        json_object_set_new(c, "moe_intermediate_size", json_integer(o->moe_ffn));
        json_object_set_new(c, "norm_topk_prob", json_true());
        json_object_set_new(c, "norm_head", json_false());
        json_object_set_new(c, "use_bias", json_false());
        json_object_set_new(c, "use_rmsnorm", json_true());
        json_object_set_new(c, "rms_norm_eps", json_real(1e-06));
        json_object_set_new(c, "head_dim", json_integer(o->d_model / o->n_heads));
        json_object_set_new(c, "num_shared_experts", o->shared_ffn > 0 ? json_integer(o->shared_ffn / o->moe_ffn) : json_null());
        json_object_set_new(c, "use_qkv_bias", json_false());
        json_object_set_new(c, "embedding_dropout", json_real(0.0));
        json_object_set_new(c, "norm_softmax", json_false());
        json_object_set_new(c, "output_dropout", json_real(0.0));
        json_object_set_new(c, "rotary_dim", json_integer((int)(o->d_model / o->n_heads * o->partial_rotary)));
        json_object_set_new(c, "using_split_qkv_in_self_attention", json_false());
        json_object_set_new(c, "router_dtype", json_string("fp32"));
        json_object_set_new(c, "routed_scaling_factor", json_real(o->routed_scale));
        json_object_set_new(c, "n_group", json_integer(o->n_group));
        json_object_set_new(c, "topk_group", json_integer(o->topk_group));
        json_object_set_new(c, "score_function", json_string("sigmoid"));
        json_object_set_new(c, "max_window_layers", json_integer(o->n_layers));
        json_object_set_new(c, "use_sliding_window", json_false());
        json_object_set_new(c, "transformers_version", json_string("4.52.3"));
    }
    add_quantization_config(c, o);
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    int rc = json_dump_file(c, path, JSON_INDENT(4));
    json_decref(c);
    if (rc != 0) return um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
    return 0;
}

/* ---------------------------------------------------------------- tensors */

enum init_kind { INIT_NORMAL, INIT_NORM_WEIGHT };

typedef struct gen_tensor {
    char           name[128];
    int64_t        rows, cols;    /* cols = 0 for vectors */
    enum init_kind init;
    float          std;
    int            stream;        /* random stream of its values: its index in the float layout */
    enum dtype     dtype;         /* as written */
    int            scale_of;      /* -1, or: this is the F32 block scales of tensor scale_of (FP8) */
    float         *scales;        /* FP8 tensor: its block scales once written, until they are; owned */
} gen_tensor;

static int list_tensors(const make_model_opts *o, int n_rows, gen_tensor **out) {
    int n_max = 3 + 16 * o->n_layers + 3 * o->n_layers * o->n_experts, n = 0;
    gen_tensor *t = xcalloc((size_t)n_max, sizeof *t);
    int64_t d = o->d_model, hd = d / o->n_heads, kvd = hd * o->n_kv_heads, F = o->ffn_hidden;
    (void)hd;
#define ADD(nm, r, c_, kind, s)                                              \
    do {                                                                     \
        snprintf(t[n].name, sizeof t[n].name, "%s", nm);                     \
        t[n].rows = r, t[n].cols = c_, t[n].init = kind, t[n].std = (float)(s); \
        n++;                                                                 \
    } while (0)
    char nm[128];
    if (o->moe) {   /* LLaDA-MoE / LLaDA2 names (model/llada.c tables) */
        const int l2 = o->moe == MAKE_MOE_LLADA2;
        const double sd = 1.0 / sqrt((double)d), sf = 1.0 / sqrt((double)o->moe_ffn);
        ADD(l2 ? "model.word_embeddings.weight" : "model.embed_tokens.weight", n_rows, d, INIT_NORMAL, 1.0);
        for (int l = 0; l < o->n_layers; l++) {
#define ML(suffix, r, c_, kind, s_)                                    \
    do {                                                               \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);      \
        ADD(nm, r, c_, kind, s_);                                      \
    } while (0)
            ML("input_layernorm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
            if (l2) {
                ML("attention.query_key_value.weight", d + 2 * kvd, d, INIT_NORMAL, sd);
                ML("attention.query_layernorm.weight", hd, 0, INIT_NORM_WEIGHT, 0.1);
                ML("attention.key_layernorm.weight", hd, 0, INIT_NORM_WEIGHT, 0.1);
                ML("attention.dense.weight", d, d, INIT_NORMAL, sd);
            } else {
                ML("self_attn.q_proj.weight", d, d, INIT_NORMAL, sd);
                ML("self_attn.k_proj.weight", kvd, d, INIT_NORMAL, sd);
                ML("self_attn.v_proj.weight", kvd, d, INIT_NORMAL, sd);
                ML("self_attn.q_norm.weight", hd, 0, INIT_NORM_WEIGHT, 0.1);
                ML("self_attn.k_norm.weight", hd, 0, INIT_NORM_WEIGHT, 0.1);
                ML("self_attn.o_proj.weight", d, d, INIT_NORMAL, sd);
            }
            ML("post_attention_layernorm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
            if (l < o->first_dense) {
                ML("mlp.gate_proj.weight", F, d, INIT_NORMAL, sd);
                ML("mlp.up_proj.weight", F, d, INIT_NORMAL, sd);
                ML("mlp.down_proj.weight", d, F, INIT_NORMAL, 1.0 / sqrt((double)F));
                continue;
            }
            ML("mlp.gate.weight", o->n_experts, d, INIT_NORMAL, sd);
            /* the bias is a fraction of the scores it shifts (sigmoid ~0.5, softmax ~1/E) */
            if (o->expert_bias)
                ML(l2 ? "mlp.gate.expert_bias" : "mlp.expert_bias", o->n_experts, 0, INIT_NORMAL,
                   l2 ? 0.1 : 0.3 / o->n_experts);
            for (int e = 0; e < o->n_experts; e++) {
                char sfx[96];
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.gate_proj.weight", e);
                ML(sfx, o->moe_ffn, d, INIT_NORMAL, sd);
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.up_proj.weight", e);
                ML(sfx, o->moe_ffn, d, INIT_NORMAL, sd);
                snprintf(sfx, sizeof sfx, "mlp.experts.%d.down_proj.weight", e);
                ML(sfx, d, o->moe_ffn, INIT_NORMAL, sf);
            }
            if (o->shared_ffn > 0) {
                const char *p = l2 ? "mlp.shared_experts" : "shared_expert";
                char sfx[96];
                snprintf(sfx, sizeof sfx, "%s.gate_proj.weight", p);
                ML(sfx, o->shared_ffn, d, INIT_NORMAL, sd);
                snprintf(sfx, sizeof sfx, "%s.up_proj.weight", p);
                ML(sfx, o->shared_ffn, d, INIT_NORMAL, sd);
                snprintf(sfx, sizeof sfx, "%s.down_proj.weight", p);
                ML(sfx, d, o->shared_ffn, INIT_NORMAL, 1.0 / sqrt((double)o->shared_ffn));
            }
#undef ML
        }
        ADD("model.norm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
        if (!o->weight_tying) ADD("lm_head.weight", n_rows, d, INIT_NORMAL, sd);
        *out = t;
        return n;
    }
    if (o->dream) {   /* Qwen2 names (Dream-v0-Instruct-7B's index), q/k/v with biases */
        ADD("model.embed_tokens.weight", n_rows, d, INIT_NORMAL, 1.0);
        for (int l = 0; l < o->n_layers; l++) {
#define QW(suffix, r, c_, kind, s)                                     \
    do {                                                               \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", l, suffix);      \
        ADD(nm, r, c_, kind, s);                                       \
    } while (0)
            QW("input_layernorm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
            QW("self_attn.q_proj.weight", d, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("self_attn.q_proj.bias", d, 0, INIT_NORMAL, 0.5);
            QW("self_attn.k_proj.weight", kvd, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("self_attn.k_proj.bias", kvd, 0, INIT_NORMAL, 0.5);
            QW("self_attn.v_proj.weight", kvd, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("self_attn.v_proj.bias", kvd, 0, INIT_NORMAL, 0.5);
            QW("self_attn.o_proj.weight", d, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("post_attention_layernorm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
            QW("mlp.gate_proj.weight", F, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("mlp.up_proj.weight", F, d, INIT_NORMAL, 1.0 / sqrt((double)d));
            QW("mlp.down_proj.weight", d, F, INIT_NORMAL, 1.0 / sqrt((double)F));
#undef QW
        }
        ADD("model.norm.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
        if (!o->weight_tying) ADD("lm_head.weight", n_rows, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        *out = t;
        return n;
    }
    ADD("model.transformer.wte.weight", n_rows, d, INIT_NORMAL, 1.0);
    for (int l = 0; l < o->n_layers; l++) {
#define LAYER(suffix, r, c_, kind, s)                                                \
    do {                                                                           \
        snprintf(nm, sizeof nm, "model.transformer.blocks.%d.%s.weight", l, suffix); \
        ADD(nm, r, c_, kind, s);                                                   \
    } while (0)
        LAYER("attn_norm", d, 0, INIT_NORM_WEIGHT, 0.1);
        LAYER("q_proj", d, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("k_proj", kvd, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("v_proj", kvd, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("attn_out", d, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("ff_norm", d, 0, INIT_NORM_WEIGHT, 0.1);
        LAYER("ff_proj", F, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("up_proj", F, d, INIT_NORMAL, 1.0 / sqrt((double)d));
        LAYER("ff_out", d, F, INIT_NORMAL, 1.0 / sqrt((double)F));
#undef LAYER
    }
    ADD("model.transformer.ln_f.weight", d, 0, INIT_NORM_WEIGHT, 0.1);
    if (!o->weight_tying) ADD("model.transformer.ff_out.weight", n_rows, d, INIT_NORMAL, 1.0 / sqrt((double)d));
#undef ADD
    *out = t;
    return n;
}

static double normal01(uint64_t seed, uint64_t stream, uint64_t i) {
    double u1 = rng_u01(seed, stream, 2 * i), u2 = rng_u01(seed, stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Generate (src NULL) or convert (src: F32 values of the same shape) and write one tensor in chunks. */
static int write_tensor_data(FILE *fp, const gen_tensor *t, const float *src, uint64_t seed, uint64_t stream,
                             enum dtype dt) {
    int64_t n = t->rows * (t->cols ? t->cols : 1);
    const int64_t CH = 1 << 20;
    size_t es = dtype_size(dt);
    float *f = xmalloc((size_t)CH * sizeof *f);
    uint8_t *b = xmalloc((size_t)CH * es);
    int ok = 1;
    for (int64_t at = 0; at < n && ok; at += CH) {
        int64_t m = n - at < CH ? n - at : CH;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            if (src) {
                memcpy(&f[i], &src[at + i], sizeof f[i]);
                continue;
            }
            double z = normal01(seed, stream, (uint64_t)(at + i));
            f[i] = t->init == INIT_NORM_WEIGHT ? (float)(1.0 + t->std * z) : (float)(t->std * z);
        }
        if (dt == DTYPE_F32) {
            memcpy(b, f, (size_t)m * 4);
        } else {
            uint16_t *h = (uint16_t *)b;
            for (int64_t i = 0; i < m; i++) h[i] = dt == DTYPE_BF16 ? f32_to_bf16(f[i]) : f32_to_f16(f[i]);
        }
        ok = fwrite(b, es, (size_t)m, fp) == (size_t)m;
    }
    free(f);
    free(b);
    return ok ? 0 : -1;
}

/* The layout as written: every tensor in o->dtype, or with o->fp8 the linear layers' matrices as
 * F8_E4M3, each followed by its "_scale_inv" block scales. Not FP8: the embedding (first), the LM
 * head (last when untied), MoE routers, vectors. Values keep their streams, so an FP8 checkpoint
 * holds the quantized values of the float one made with the same seed. */
static int layout_tensors(const make_model_opts *o, gen_tensor *t, int n, gen_tensor **out) {
    gen_tensor *w = xcalloc((size_t)(2 * n), sizeof *w);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const size_t nl = strlen(t[i].name);
        const int router = nl >= 16 && strcmp(t[i].name + nl - 16, ".mlp.gate.weight") == 0;
        const int lm_head = i == n - 1 && !o->weight_tying;
        w[k] = t[i];
        w[k].stream = i;
        w[k].scale_of = -1;
        w[k].dtype = o->dtype;
        if (!o->fp8 || !t[i].cols || i == 0 || lm_head || router) {
            k++;
            continue;
        }
        w[k].dtype = DTYPE_F8_E4M3;
        gen_tensor *s = &w[k + 1];
        snprintf(s->name, sizeof s->name, "%s_scale_inv", t[i].name);
        s->rows = (t[i].rows + FP8_BLOCK - 1) / FP8_BLOCK;
        s->cols = (t[i].cols + FP8_BLOCK - 1) / FP8_BLOCK;
        s->dtype = DTYPE_F32;
        s->scale_of = k;
        k += 2;
    }
    *out = w;
    return k;
}

/* Generate (src NULL) or take (src: F32 values) FP8 matrix t and write it, FP8_BLOCK rows at a time:
 * each FP8_BLOCK x FP8_BLOCK block (smaller at the edges) scaled by its amax / 448, rounded to
 * nearest even. t->scales gets the block scales. */
static int write_fp8_data(FILE *fp, gen_tensor *t, const float *src, uint64_t seed) {
    const int64_t R = t->rows, C = t->cols, gc = (C + FP8_BLOCK - 1) / FP8_BLOCK;
    t->scales = xcalloc((size_t)(((R + FP8_BLOCK - 1) / FP8_BLOCK) * gc), sizeof *t->scales);
    float *f = xmalloc((size_t)(FP8_BLOCK * C) * sizeof *f);
    uint8_t *b = xmalloc((size_t)(FP8_BLOCK * C));
    int ok = 1;
    for (int64_t r0 = 0; r0 < R && ok; r0 += FP8_BLOCK) {
        const int64_t nr = R - r0 < FP8_BLOCK ? R - r0 : FP8_BLOCK;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nr * C; i++) {
            const int64_t at = r0 * C + i;
            if (src) memcpy(&f[i], &src[at], sizeof f[i]);   /* the mapping may be misaligned */
            else f[i] = (float)(t->std * normal01(seed, (uint64_t)t->stream, (uint64_t)at));
        }
        float *sc = t->scales + r0 / FP8_BLOCK * gc;
        for (int64_t j = 0; j < gc; j++) {
            const int64_t c1 = (j + 1) * FP8_BLOCK < C ? (j + 1) * FP8_BLOCK : C;
            float amax = 0;
            for (int64_t r = 0; r < nr; r++)
                for (int64_t c = j * FP8_BLOCK; c < c1; c++) amax = fmaxf(amax, fabsf(f[r * C + c]));
            sc[j] = amax > 0 ? amax / 448.0f : 1.0f;
            for (int64_t r = 0; r < nr; r++)
                for (int64_t c = j * FP8_BLOCK; c < c1; c++) b[r * C + c] = f32_to_fp8_e4m3(f[r * C + c] / sc[j]);
        }
        ok = fwrite(b, 1, (size_t)(nr * C), fp) == (size_t)(nr * C);
    }
    free(f);
    free(b);
    return ok ? 0 : -1;
}

static int validate_opts(const make_model_opts *o, um_err *err) {
    if (o->d_model <= 0 || o->n_layers <= 0 || o->n_heads <= 0 || o->n_kv_heads <= 0 || o->ffn_hidden <= 0 ||
        o->max_seq <= 0)
        return um_err_set(err, UM_ERR_INVALID_ARG, "model sizes must be positive");
    if (o->d_model % o->n_heads)
        return um_err_param(err, "n-heads", "d-model %d is not divisible by n-heads %d", o->d_model, o->n_heads);
    if ((o->d_model / o->n_heads) % 2)
        return um_err_param(err, "n-heads", "head_dim %d must be even", o->d_model / o->n_heads);
    if (o->n_heads % o->n_kv_heads)
        return um_err_param(err, "n-kv-heads", "n-heads %d is not divisible by n-kv-heads %d", o->n_heads,
                            o->n_kv_heads);
    if (o->moe) {
        if (o->n_experts < 1 || o->moe_top_k < 1 || o->moe_top_k > o->n_experts || o->moe_ffn < 1)
            return um_err_param(err, "experts", "MoE sizes: experts %d, experts per token %d (1 .. experts), expert "
                                "width %d must be positive", o->n_experts, o->moe_top_k, o->moe_ffn);
        if (o->first_dense < 0 || o->first_dense > o->n_layers)
            return um_err_param(err, "first-dense", "first-dense must be between 0 and %d, got %d", o->n_layers,
                                o->first_dense);
        if (o->moe == MAKE_MOE_LLADA2 &&
            (o->n_group < 1 || o->n_experts % o->n_group || o->n_experts / o->n_group < 2 || o->topk_group < 1 ||
             o->topk_group > o->n_group || o->moe_top_k > o->topk_group * (o->n_experts / o->n_group)))
            return um_err_param(err, "experts", "LLaDA2 routing: %d experts in %d groups (at least 2 each), keeping %d "
                                "groups, cannot choose %d experts", o->n_experts, o->n_group, o->topk_group,
                                o->moe_top_k);
        if (o->moe == MAKE_MOE_LLADA2 && o->shared_ffn % o->moe_ffn)
            return um_err_param(err, "experts", "LLaDA2: the shared expert width must be a multiple of the expert width");
    }
    if (o->shards < 1 || o->shards > 64) return um_err_param(err, "shards", "shards must be between 1 and 64");
    if (o->dtype != DTYPE_F32 && o->dtype != DTYPE_BF16 && o->dtype != DTYPE_F16)
        return um_err_param(err, "dtype", "dtype must be f32, bf16 or f16");
    return 0;
}

/* Copy the tokenizer files of checkpoint src into dir and read their special ids. */
static int tokenizer_copy(const char *src, const char *dir, tokenizer_special *sp, um_err *err) {
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"};
    tokenizer *tok = NULL;
    if (tokenizer_load_dir(src, &tok, err) != 0) return -1;
    if (!tok) return um_err_param(err, "tokenizer", "%s: no tokenizer.json", src);
    const char *names[5] = {"<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|mdm_mask|>", "<|endoftext|>"};
    int *ids[5] = {&sp->bos, &sp->eos, &sp->eot, &sp->mask, &sp->pad};
    int rc = 0;
    for (int i = 0; i < 5 && rc == 0; i++)
        if ((*ids[i] = tokenizer_token_id(tok, names[i])) < 0)
            rc = um_err_param(err, "tokenizer", "%s: the tokenizer has no %s token", src, names[i]);
    sp->vocab_size = tokenizer_n_vocab(tok);
    tokenizer_free(tok);
    for (size_t i = 0; i < sizeof files / sizeof files[0] && rc == 0; i++) {
        char from[4096], to[4096], *buf;
        size_t len;
        path_join(from, sizeof from, src, files[i]);
        path_join(to, sizeof to, dir, files[i]);
        if (strcmp(from, to) == 0) continue;
        um_err e2 = {0};
        if (file_read_all(from, (size_t)1 << 30, &buf, &len, &e2) != 0) {
            if (i < 2) rc = um_err_set(err, e2.code, "%s", e2.msg); /* special_tokens_map.json is optional */
            continue;
        }
        rc = file_write_all(to, buf, len, err);
        free(buf);
    }
    return rc;
}

static int write_tokenizer(const char *dir, const make_model_opts *o, tokenizer_special *sp, um_err *err) {
    if (o->tokenizer_dir) return tokenizer_copy(o->tokenizer_dir, dir, sp, err);
    if (o->moe) {
        if (o->tokenizer_corpus)
            return um_err_param(err, "tokenizer-corpus", "a MoE-layout model takes the built-in Ling-style tokenizer only");
        return tokenizer_write_builtin_ling(dir, sp, err);
    }
    if (o->dream) {
        if (o->tokenizer_corpus)
            return um_err_param(err, "tokenizer-corpus", "a Dream-layout model takes the built-in Qwen2 tokenizer only");
        return tokenizer_write_builtin_qwen2(dir, sp, err);
    }
    if (!o->tokenizer_corpus) return tokenizer_write_builtin(dir, sp, err);
    char *text;
    size_t len;
    if (file_read_all(o->tokenizer_corpus, (size_t)1 << 31, &text, &len, err) != 0) return -1;
    int rc = tokenizer_write_trained(dir, text, len, o->tokenizer_merges ? o->tokenizer_merges : 8000, 2, sp, err);
    free(text);
    return rc;
}

/* Every tensor of the layout must be in w as F32 with the layout's shape; nothing else may be. */
static int check_weights(const st_file *w, const gen_tensor *gt, int n, um_err *err) {
    for (int i = 0; i < n; i++) {
        const st_tensor *t = safetensors_find(w, gt[i].name);
        int ndim = gt[i].cols ? 2 : 1;
        if (!t) return um_err_param(err, "weights", "%s: tensor %s is missing", w->path, gt[i].name);
        if (t->type != DTYPE_F32)
            return um_err_param(err, "weights", "%s: %s is %s, expected F32", w->path, gt[i].name, t->type_name);
        if (t->ndim != ndim || t->shape[0] != gt[i].rows || (ndim == 2 && t->shape[1] != gt[i].cols))
            return um_err_param(err, "weights", "%s: %s has shape [%lld%s%lld], the configuration needs [%lld%s%lld]",
                                w->path, gt[i].name, (long long)t->shape[0], t->ndim > 1 ? ", " : "",
                                t->ndim > 1 ? (long long)t->shape[1] : 0LL, (long long)gt[i].rows, ndim > 1 ? ", " : "",
                                ndim > 1 ? (long long)gt[i].cols : 0LL);
    }
    if (w->n_tensors != n)
        return um_err_param(err, "weights", "%s: %d tensors, the configuration has %d", w->path, w->n_tensors, n);
    return 0;
}

int make_model_write(const char *dir, const make_model_opts *o, um_err *err) {
    if (validate_opts(o, err) != 0) return -1;
    if (dir_create(dir, err) != 0) return -1;
    tokenizer_special sp = {0};
    if (!o->no_tokenizer && write_tokenizer(dir, o, &sp, err) != 0) return -1;
    if (o->tokenizer_only) return 0;
    int vocab = sp.vocab_size;
    if (vocab <= 0) { /* no tokenizer: LLaDA-like special ids at the top of the vocabulary */
        if (o->vocab_size < 16) return um_err_param(err, "vocab", "vocab must be at least 16");
        vocab = o->vocab_size;
        sp.bos = vocab - 5, sp.eos = vocab - 4, sp.eot = vocab - 3, sp.mask = vocab - 2;
        sp.pad = sp.eos;
    }
    int n_rows = (vocab + 63) / 64 * 64; /* like LLaDA: embedding rows padded past the vocabulary */
    if ((o->dream || o->moe) && o->vocab_size > n_rows) n_rows = o->vocab_size;   /* vocab_size rows (Qwen2, Ling) */
    if (o->embd_rows > n_rows) n_rows = o->embd_rows;
    if (o->moe) {
        if (write_config_moe(dir, o, n_rows, &sp, !o->no_tokenizer, err) != 0) return -1;
    } else if ((o->dream ? write_config_dream(dir, o, n_rows, &sp, err) : write_config(dir, o, n_rows, n_rows, &sp, err)) != 0) {
        return -1;
    }

    gen_tensor *ft, *gt;
    const int nf = list_tensors(o, n_rows, &ft);
    st_file wf = {0};
    if (o->weights && (safetensors_open(o->weights, &wf, err) != 0 || check_weights(&wf, ft, nf, err) != 0)) {
        safetensors_free(&wf);
        free(ft);
        return -1;
    }
    const int n = layout_tensors(o, ft, nf, &gt);
    free(ft);
    st_write_tensor *wt = xcalloc((size_t)n, sizeof *wt);
    int *shard_of = xcalloc((size_t)n, sizeof *shard_of);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        wt[i].name = gt[i].name;
        wt[i].dtype = dtype_name(gt[i].dtype);
        wt[i].ndim = gt[i].cols ? 2 : 1;
        wt[i].shape[0] = gt[i].rows;
        wt[i].shape[1] = gt[i].cols;
        wt[i].nbytes = (size_t)(gt[i].rows * (gt[i].cols ? gt[i].cols : 1)) * dtype_size(gt[i].dtype);
        total += wt[i].nbytes;
    }
    /* split into shards of roughly equal bytes, in tensor order */
    size_t per = total / (size_t)o->shards + 1, acc = 0;
    for (int i = 0; i < n; i++) {
        int s = (int)(acc / per);
        shard_of[i] = s < o->shards ? s : o->shards - 1;
        acc += wt[i].nbytes;
    }
    json_t *wmap = json_object();
    int rc = 0;
    size_t written = 0;
    for (int s = 0; s < o->shards && rc == 0; s++) {
        char fname[64], path[4096];
        if (o->shards == 1)
            snprintf(fname, sizeof fname, "model.safetensors");
        else
            snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, o->shards);
        path_join(path, sizeof path, dir, fname);
        int first = -1, cnt = 0;
        for (int i = 0; i < n; i++)
            if (shard_of[i] == s) {
                if (first < 0) first = i;
                cnt++;
                json_object_set_new(wmap, gt[i].name, json_string(fname));
            }
        char tmp[4096 + 32];
        FILE *fp = file_replace_begin(path, tmp, sizeof tmp);   /* a server may have the old file mmap'd */
        if (!fp) {
            rc = um_err_set(err, UM_ERR_IO, "%s: cannot create", path);
            break;
        }
        if (safetensors_write_header(fp, wt + (first < 0 ? 0 : first), cnt, "{\"format\":\"pt\"}") != 0)
            rc = um_err_set(err, UM_ERR_IO, "%s: write failed", path);
        for (int i = first; rc == 0 && cnt > 0 && i < first + cnt; i++) {
            const st_tensor *src = o->weights && gt[i].scale_of < 0 ? safetensors_find(&wf, gt[i].name) : NULL;
            int wrc;
            if (gt[i].scale_of >= 0) {   /* the block scales of the FP8 matrix just written */
                gen_tensor *q = &gt[gt[i].scale_of];
                wrc = fwrite(q->scales, sizeof *q->scales, wt[i].nbytes / 4, fp) == wt[i].nbytes / 4 ? 0 : -1;
                free(q->scales);
                q->scales = NULL;
            } else if (gt[i].dtype == DTYPE_F8_E4M3) {
                wrc = write_fp8_data(fp, &gt[i], src ? src->data : NULL, o->seed);
            } else {
                wrc = write_tensor_data(fp, &gt[i], src ? src->data : NULL, o->seed, (uint64_t)gt[i].stream, gt[i].dtype);
            }
            if (wrc != 0) rc = um_err_set(err, UM_ERR_IO, "%s: write failed", path);
            written += wt[i].nbytes;
            if (!o->quiet && total > (64u << 20))
                fprintf(stderr, "\rmake-model: %5.1f%% (%zu / %zu MB)", 100.0 * (double)written / (double)total,
                        written >> 20, total >> 20);
        }
        if (file_replace_end(fp, tmp, path, rc == 0) != 0 && rc == 0)
            rc = um_err_set(err, UM_ERR_IO, "%s: write failed", path);
    }
    if (!o->quiet && total > (64u << 20)) fprintf(stderr, "\n");
    if (rc == 0 && o->shards > 1) {
        json_t *idx = json_pack("{s:{s:I},s:o}", "metadata", "total_size", (json_int_t)total, "weight_map", wmap);
        char path[4096];
        path_join(path, sizeof path, dir, "model.safetensors.index.json");
        if (json_dump_file(idx, path, JSON_INDENT(2)) != 0) rc = um_err_set(err, UM_ERR_IO, "%s: cannot write", path);
        json_decref(idx);
    } else {
        json_decref(wmap);
    }
    safetensors_free(&wf);
    for (int i = 0; i < n; i++) free(gt[i].scales);
    free(gt);
    free(wt);
    free(shard_of);
    return rc;
}
