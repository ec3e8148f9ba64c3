/*
 * gguf_model.c — a llama.cpp-converted GGUF file as a model: architecture and config from the
 * metadata, tensors renamed and reshaped to the Hugging Face layout the binding code reads, the
 * tokenizer and chat template from tokenizer.* (gguf_model.h; the mapping is docs/gguf.md).
 * Load time, any thread.
 */
#include "model/gguf_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/gguf.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "util/log.h"

/* ---------------------------------------------------------------- architectures */

enum name_kind {
    NAME_PLAIN,       /* a matrix as it is */
    NAME_VECTOR,      /* a vector (norm weight, bias) as it is */
    NAME_PERMUTE_Q,   /* rows permuted per query head by the converter (LLaDA): put back */
    NAME_PERMUTE_K,   /* the same per key/value head */
    NAME_EXPERTS,     /* [n_experts, rows, cols] stacked experts: one view per expert */
};

/* A GGUF tensor name (top level, or the part after "blk.N.") and its Hugging Face name: a pattern
 * whose first %d is the layer and second %d (NAME_EXPERTS) the expert. */
typedef struct name_map {
    const char    *gguf;
    const char    *hf;
    enum name_kind kind;
} name_map;

typedef struct gguf_arch {
    const char          *name;        /* general.architecture */
    enum model_arch      arch;
    const char          *hf_class;    /* what config.json's architectures[0] says for it */
    const name_map      *top, *layer; /* NULL-terminated */
    double               norm_eps;    /* defaults of the keys the converter may leave out */
    int                  max_seq;
    enum tokenizer_split split;       /* the family's pre-tokenizer (unknown tokenizer.ggml.pre names) */
    int                  nfc;
    const char          *mask_piece;  /* the mask token's string (no tokenizer.ggml.mask_token_id) */
} gguf_arch;

static const name_map k_llada_top[] = {
    {"token_embd.weight", "model.transformer.wte.weight", NAME_PLAIN},
    {"output_norm.weight", "model.transformer.ln_f.weight", NAME_VECTOR},
    {"output.weight", "model.transformer.ff_out.weight", NAME_PLAIN},
    {NULL, NULL, 0},
};
static const name_map k_llada_layer[] = {
    {"attn_norm.weight", "model.transformer.blocks.%d.attn_norm.weight", NAME_VECTOR},
    {"attn_q.weight", "model.transformer.blocks.%d.q_proj.weight", NAME_PERMUTE_Q},
    {"attn_k.weight", "model.transformer.blocks.%d.k_proj.weight", NAME_PERMUTE_K},
    {"attn_v.weight", "model.transformer.blocks.%d.v_proj.weight", NAME_PLAIN},
    {"attn_output.weight", "model.transformer.blocks.%d.attn_out.weight", NAME_PLAIN},
    {"ffn_norm.weight", "model.transformer.blocks.%d.ff_norm.weight", NAME_VECTOR},
    {"ffn_gate.weight", "model.transformer.blocks.%d.ff_proj.weight", NAME_PLAIN},
    {"ffn_up.weight", "model.transformer.blocks.%d.up_proj.weight", NAME_PLAIN},
    {"ffn_down.weight", "model.transformer.blocks.%d.ff_out.weight", NAME_PLAIN},
    {NULL, NULL, 0},
};

/* Dream, LLaDA-MoE: the Qwen2 / OLMoE names */
static const name_map k_hf_top[] = {
    {"token_embd.weight", "model.embed_tokens.weight", NAME_PLAIN},
    {"output_norm.weight", "model.norm.weight", NAME_VECTOR},
    {"output.weight", "lm_head.weight", NAME_PLAIN},
    {NULL, NULL, 0},
};
static const name_map k_dream_layer[] = {
    {"attn_norm.weight", "model.layers.%d.input_layernorm.weight", NAME_VECTOR},
    {"attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", NAME_PLAIN},
    {"attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", NAME_PLAIN},
    {"attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", NAME_PLAIN},
    {"attn_q.bias", "model.layers.%d.self_attn.q_proj.bias", NAME_VECTOR},
    {"attn_k.bias", "model.layers.%d.self_attn.k_proj.bias", NAME_VECTOR},
    {"attn_v.bias", "model.layers.%d.self_attn.v_proj.bias", NAME_VECTOR},
    {"attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", NAME_PLAIN},
    {"ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", NAME_VECTOR},
    {"ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", NAME_PLAIN},
    {"ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", NAME_PLAIN},
    {"ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", NAME_PLAIN},
    {NULL, NULL, 0},
};
static const name_map k_llada_moe_layer[] = {
    {"attn_norm.weight", "model.layers.%d.input_layernorm.weight", NAME_VECTOR},
    {"attn_q.weight", "model.layers.%d.self_attn.q_proj.weight", NAME_PLAIN},
    {"attn_k.weight", "model.layers.%d.self_attn.k_proj.weight", NAME_PLAIN},
    {"attn_v.weight", "model.layers.%d.self_attn.v_proj.weight", NAME_PLAIN},
    {"attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight", NAME_VECTOR},
    {"attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight", NAME_VECTOR},
    {"attn_output.weight", "model.layers.%d.self_attn.o_proj.weight", NAME_PLAIN},
    {"ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight", NAME_VECTOR},
    {"ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight", NAME_PLAIN},
    {"ffn_up.weight", "model.layers.%d.mlp.up_proj.weight", NAME_PLAIN},
    {"ffn_down.weight", "model.layers.%d.mlp.down_proj.weight", NAME_PLAIN},
    {"ffn_gate_inp.weight", "model.layers.%d.mlp.gate.weight", NAME_PLAIN},
    {"exp_probs_b.bias", "model.layers.%d.mlp.expert_bias", NAME_VECTOR},
    {"ffn_gate_exps.weight", "model.layers.%d.mlp.experts.%d.gate_proj.weight", NAME_EXPERTS},
    {"ffn_up_exps.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight", NAME_EXPERTS},
    {"ffn_down_exps.weight", "model.layers.%d.mlp.experts.%d.down_proj.weight", NAME_EXPERTS},
    {"ffn_gate_shexp.weight", "model.layers.%d.shared_expert.gate_proj.weight", NAME_PLAIN},
    {"ffn_up_shexp.weight", "model.layers.%d.shared_expert.up_proj.weight", NAME_PLAIN},
    {"ffn_down_shexp.weight", "model.layers.%d.shared_expert.down_proj.weight", NAME_PLAIN},
    {NULL, NULL, 0},
};

static const gguf_arch k_archs[] = {
    {"llada", MODEL_ARCH_LLADA, "LLaDAModelLM", k_llada_top, k_llada_layer, 1e-5, 4096, TOKENIZER_SPLIT_BAILING, 0,
     "<|mdm_mask|>"},
    {"dream", MODEL_ARCH_DREAM, "DreamModel", k_hf_top, k_dream_layer, 1e-6, 131072, TOKENIZER_SPLIT_QWEN2, 1,
     "<|mask|>"},
    {"llada-moe", MODEL_ARCH_LLADA_MOE, "LLaDAMoEModelLM", k_hf_top, k_llada_moe_layer, 1e-5, 4096,
     TOKENIZER_SPLIT_BAILING, 0, "<|mask|>"},
};

/* tokenizer.ggml.pre names (llama.cpp's) whose split unmask implements */
static const struct {
    const char          *name;
    enum tokenizer_split split;
    int                  nfc;
} k_pre[] = {
    {"llada-moe", TOKENIZER_SPLIT_BAILING, 0}, {"bailingmoe", TOKENIZER_SPLIT_BAILING, 0},
    {"bailingmoe2", TOKENIZER_SPLIT_BAILING, 0}, {"qwen2", TOKENIZER_SPLIT_QWEN2, 1},
    {"deepseek-r1-qwen", TOKENIZER_SPLIT_QWEN2, 1}, {"gpt-2", TOKENIZER_SPLIT_GPT2, 0},
};

static int get_int(const gguf_file *f, const gguf_arch *A, const char *suffix, int64_t lo, int64_t hi, int64_t def,
                   int *out, um_err *err);

/* The architecture of f (general.architecture), or NULL + err. */
static const gguf_arch *arch_of(const gguf_file *f, um_err *err) {
    int splits = 1;
    if (get_int(f, NULL, "split.count", 0, INT32_MAX, 1, &splits, err) != 0) return NULL;
    if (splits > 1) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s: one part of a GGUF file split in %d (split.count); merge the parts into "
                   "one file first (llama.cpp: llama-gguf-split --merge)", f->path, splits);
        return NULL;
    }
    const gguf_kv *kv = gguf_find_kv(f, "general.architecture");
    if (!kv) {
        um_err_set(err, UM_ERR_FORMAT, "%s: missing required key 'general.architecture'", f->path);
        return NULL;
    }
    const char *s;
    uint64_t len;
    if (gguf_kv_str(f, kv, &s, &len, err) != 0) return NULL;
    for (size_t i = 0; i < sizeof k_archs / sizeof k_archs[0]; i++)
        if (strlen(k_archs[i].name) == len && memcmp(k_archs[i].name, s, len) == 0) return &k_archs[i];
    um_err_set(err, UM_ERR_UNSUPPORTED, "%s: architecture '%.*s' is not supported (GGUF files of llada, dream and "
               "llada-moe are; llama.cpp's converter writes no LLaDA2 architecture)", f->path, (int)(len > 64 ? 64 : len),
               s);
    return NULL;
}

/* ---------------------------------------------------------------- metadata */

/* "<arch>.<suffix>" */
static const gguf_kv *akv(const gguf_file *f, const gguf_arch *A, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", A->name, suffix);
    return gguf_find_kv(f, key);
}

/* An integer key: present -> in [lo, hi]; absent -> def, or an error when def < lo (required). */
static int get_int(const gguf_file *f, const gguf_arch *A, const char *suffix, int64_t lo, int64_t hi, int64_t def,
                   int *out, um_err *err) {
    const gguf_kv *kv = A ? akv(f, A, suffix) : gguf_find_kv(f, suffix);
    if (!kv) {
        if (def < lo)
            return um_err_set(err, UM_ERR_FORMAT, "%s: missing required key '%s%s%s'", f->path, A ? A->name : "",
                              A ? "." : "", suffix);
        *out = (int)def;
        return 0;
    }
    int64_t v;
    if (gguf_kv_int(f, kv, lo, hi, &v, err) != 0) return -1;
    *out = (int)v;
    return 0;
}

static int get_float(const gguf_file *f, const gguf_arch *A, const char *suffix, double lo, double hi, double def,
                     float *out, um_err *err) {
    const gguf_kv *kv = akv(f, A, suffix);
    double v = def;
    if (kv && gguf_kv_float(f, kv, &v, err) != 0) return -1;
    if (!(v >= lo && v <= hi))
        return um_err_set(err, UM_ERR_FORMAT, "%s: key '%s.%s' is %g, must be between %g and %g", f->path, A->name,
                          suffix, v, lo, hi);
    *out = (float)v;
    return 0;
}

/* A bool key, def when absent. */
static int get_bool(const gguf_file *f, const char *key, int def, int *out, um_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    *out = def;
    return kv ? gguf_kv_bool(f, kv, out, err) : 0;
}

/* A tensor of layer l ("blk.<l>.<suffix>"), or NULL. */
static const gguf_tensor *layer_tensor(const gguf_file *f, int l, const char *suffix) {
    char name[160];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    return gguf_find_tensor(f, name);
}

/* The MoE fields of LLaDA-MoE: counts from the metadata, the layout (leading dense layers, shared
 * expert, expert bias, QK-norm) from the tensors present. */
static int moe_config(const gguf_file *f, const gguf_arch *A, model_config *c, um_err *err) {
    const int64_t BIG = 1 << 24;
    if (get_int(f, A, "expert_count", 1, 65536, -1, &c->n_experts, err) ||
        get_int(f, A, "expert_used_count", 1, 65536, -1, &c->moe_top_k, err) ||
        get_int(f, A, "expert_feed_forward_length", 1, BIG, -1, &c->moe_ffn, err))
        return -1;
    if (c->moe_top_k > c->n_experts)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s.expert_used_count %d is larger than %s.expert_count %d", f->path,
                          A->name, c->moe_top_k, A->name, c->n_experts);
    int gating = 1;   /* llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX */
    if (get_int(f, A, "expert_gating_func", 0, 1 << 20, 1, &gating, err)) return -1;
    if (gating != 1)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: %s.expert_gating_func %d is not supported (LLaDA-MoE routes with "
                          "a softmax, 1)", f->path, A->name, gating);
    c->first_dense = 0;
    while (c->first_dense < c->n_layers && !layer_tensor(f, c->first_dense, "ffn_gate_inp.weight")) c->first_dense++;
    for (int l = c->first_dense; l < c->n_layers; l++)
        if (!layer_tensor(f, l, "ffn_gate_inp.weight"))
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: layer %d has no blk.%d.ffn_gate_inp.weight after MoE layer %d: "
                              "only leading dense layers are supported", f->path, l, l, c->first_dense);
    if (c->first_dense == c->n_layers)
        return um_err_set(err, UM_ERR_FORMAT, "%s: no layer has a router (blk.N.ffn_gate_inp.weight)", f->path);
    int lead = c->first_dense;
    if (get_int(f, A, "leading_dense_block_count", 0, c->n_layers, c->first_dense, &lead, err)) return -1;
    if (lead != c->first_dense)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s.leading_dense_block_count is %d but the first router is in layer %d",
                          f->path, A->name, lead, c->first_dense);
    c->ffn_hidden = 0;
    if (c->first_dense > 0 && get_int(f, A, "feed_forward_length", 1, BIG, -1, &c->ffn_hidden, err)) return -1;
    const gguf_tensor *sh = layer_tensor(f, c->first_dense, "ffn_gate_shexp.weight");
    c->shared_ffn = 0;
    if (sh) {
        const int64_t rows = sh->n_dims == 2 ? sh->ne[1] : 0;
        if (get_int(f, A, "expert_shared_feed_forward_length", 1, BIG, rows, &c->shared_ffn, err)) return -1;
    }
    c->expert_bias = layer_tensor(f, c->first_dense, "exp_probs_b.bias") != NULL;
    c->qk_norm = layer_tensor(f, 0, "attn_q_norm.weight") != NULL;
    c->router = MODEL_ROUTER_SOFTMAX;
    c->routed_scale = 1.0f;
    c->n_group = c->topk_group = 1;
    return 0;
}

/* model_config from the metadata (and, for what the converter does not write, the tensors). */
static int read_config(const gguf_file *f, const gguf_arch *A, model_config *c, um_err *err) {
    const int64_t BIG = 1 << 24;
    memset(c, 0, sizeof *c);
    c->mask_id = c->eos_id = c->eot_id = c->bos_id = c->pad_id = -1;
    c->arch = A->arch;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", A->hf_class);
    if (get_int(f, A, "block_count", 1, 4096, -1, &c->n_layers, err) ||
        get_int(f, A, "embedding_length", 1, BIG, -1, &c->d_model, err) ||
        get_int(f, A, "attention.head_count", 1, 65536, -1, &c->n_heads, err) ||
        get_int(f, A, "attention.head_count_kv", 1, 65536, c->n_heads, &c->n_kv_heads, err) ||
        get_int(f, A, "context_length", 1, BIG, A->max_seq, &c->max_seq, err) ||
        get_float(f, A, "rope.freq_base", 1e-3, 1e12, 10000.0, &c->rope_theta, err) ||
        get_float(f, A, "attention.layer_norm_rms_epsilon", 0.0, 1.0, A->norm_eps, &c->norm_eps, err))
        return -1;
    if (c->n_heads % c->n_kv_heads != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s.attention.head_count %d is not divisible by "
                          "%s.attention.head_count_kv %d", f->path, A->name, c->n_heads, A->name, c->n_kv_heads);
    if (get_int(f, A, "attention.key_length", 1, 65536, c->d_model / c->n_heads, &c->head_dim, err)) return -1;
    int vlen = c->head_dim;
    if (get_int(f, A, "attention.value_length", 1, 65536, c->head_dim, &vlen, err)) return -1;
    if (vlen != c->head_dim || (int64_t)c->head_dim * c->n_heads != c->d_model)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head size %d (value %d) x %s.attention.head_count %d must equal "
                          "%s.embedding_length %d", f->path, c->head_dim, vlen, A->name, c->n_heads, A->name, c->d_model);
    if (c->head_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: head size %d must be even for RoPE", f->path, c->head_dim);
    if (get_int(f, A, "rope.dimension_count", 2, c->head_dim, c->head_dim, &c->rot_dim, err)) return -1;
    if (c->rot_dim % 2 != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s.rope.dimension_count %d must be even", f->path, A->name, c->rot_dim);
    const gguf_kv *rs = akv(f, A, "rope.scaling.type");
    if (rs) {
        const char *s;
        uint64_t len;
        if (gguf_kv_str(f, rs, &s, &len, err) != 0) return -1;
        if (!(len == 4 && memcmp(s, "none", 4) == 0))
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%.*s' is not supported (only none)",
                              f->path, A->name, (int)(len > 32 ? 32 : len), s);
    }
    char key[128];
    int causal = 0;
    snprintf(key, sizeof key, "%s.attention.causal", A->name);
    if (get_bool(f, key, 0, &causal, err)) return -1;
    if (causal)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: %s is true: unmask runs diffusion models with bidirectional "
                          "attention", f->path, key);
    /* embedding rows: the tensor's (the converter pads the token list to them) */
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->n_dims != 2)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s tensor 'token_embd.weight'", f->path,
                          emb ? "expected a 2-dimensional" : "missing");
    if (emb->ne[1] > BIG)
        return um_err_set(err, UM_ERR_FORMAT, "%s: token_embd.weight has %" PRId64 " rows, more than %" PRId64, f->path,
                          emb->ne[1], BIG);
    c->n_embd_rows = (int)emb->ne[1];
    if (get_int(f, A, "vocab_size", 1, c->n_embd_rows, c->n_embd_rows, &c->vocab_size, err)) return -1;
    c->weight_tying = gguf_find_tensor(f, "output.weight") == NULL;
    if (get_bool(f, "diffusion.shift_logits", A->arch == MODEL_ARCH_DREAM, &c->logits_shifted, err)) return -1;
    if (A->arch == MODEL_ARCH_LLADA_MOE) return moe_config(f, A, c, err);
    return get_int(f, A, "feed_forward_length", 1, BIG, -1, &c->ffn_hidden, err);
}

/* ---------------------------------------------------------------- tensors */

typedef struct tensor_list {
    st_tensor *t;
    int        n, cap;
} tensor_list;

static st_tensor *list_add(tensor_list *L) {
    if (L->n == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 256;
        L->t = xrealloc(L->t, (size_t)L->cap * sizeof *L->t);
    }
    st_tensor *t = &L->t[L->n++];
    memset(t, 0, sizeof *t);
    return t;
}

/* Which map entry names GGUF tensor `name`; *layer = its block (-1 at top level). */
static const name_map *map_name(const gguf_arch *A, const char *name, int n_layers, int *layer) {
    *layer = -1;
    const name_map *tab = A->top;
    const char *rest = name;
    if (strncmp(name, "blk.", 4) == 0) {
        char *end;
        long l = strtol(name + 4, &end, 10);
        if (end == name + 4 || *end != '.' || l < 0 || l >= n_layers || name[4] == '+' || name[4] == '-') return NULL;
        *layer = (int)l;
        tab = A->layer;
        rest = end + 1;
    }
    for (const name_map *m = tab; m->gguf; m++)
        if (strcmp(m->gguf, rest) == 0) return m;
    return NULL;
}

/* Rows of a q / k projection put back in Hugging Face order, in place. The converter stores, within
 * each head of hd rows, row i*(hd/2) + j (i the half, j the pair) at row 2j + i: the interleaved
 * rotary layout llama.cpp's LLaDA uses. The file is mapped private and read-only: the pages of the
 * tensor are made writable, so the rows written become the process's own copies of those pages
 * (copy-on-write) — they replace the file's pages instead of adding to them — and the file is not
 * changed. Dropping those pages later (madvise MADV_DONTNEED, checkpoint pages a backend has copied)
 * brings the file's permuted rows back: such a range must not be read again. */
static int unpermute_rows(const gguf_file *f, const gguf_tensor *g, int heads, size_t row_bytes, um_err *err) {
    const int64_t rows = g->ne[1], hd = rows / heads;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)g->data / page * page, b = ((uintptr_t)g->data + g->nbytes + page - 1) / page * page;
    if (mprotect((void *)a, b - a, PROT_READ | PROT_WRITE) != 0)
        return um_err_set(err, UM_ERR_IO, "%s: tensor '%s': cannot remap its rows for reordering: %s", f->path, g->name,
                          strerror(errno));
    char *base = (char *)(uintptr_t)g->data, *head = xmalloc((size_t)hd * row_bytes);
    for (int64_t h = 0; h < heads; h++) {
        char *rowp = base + (size_t)(h * hd) * row_bytes;
        memcpy(head, rowp, (size_t)hd * row_bytes);
        for (int64_t i = 0; i < 2; i++)
            for (int64_t j = 0; j < hd / 2; j++)
                memcpy(rowp + (size_t)(i * (hd / 2) + j) * row_bytes, head + (size_t)(2 * j + i) * row_bytes, row_bytes);
    }
    free(head);
    mprotect((void *)a, b - a, PROT_READ);   /* back to read-only; failing leaves it writable, harmless */
    return 0;
}

static void fill_tensor(st_tensor *t, const gguf_tensor *g, const char *name, const void *data, int64_t rows,
                        int64_t cols, int ndim) {
    char tn[16];
    t->name = xstrdup(name);
    t->type = g->type;
    snprintf(t->type_name, sizeof t->type_name, "%s", gguf_ggml_type_name(g->ggml_type, tn));
    t->ndim = ndim;
    if (ndim == 1) {
        t->shape[0] = cols;
    } else {
        t->shape[0] = rows;
        t->shape[1] = cols;
    }
    t->n_elems = rows * cols;
    t->data = data;
    t->nbytes = (size_t)rows * dtype_row_bytes(g->type, cols);
    t->offset = g->offset;
}

/* One GGUF tensor as the Hugging Face tensor(s) it stands for, appended to L; reorder: put permuted
 * q / k rows back (0: only check them, no tensor data is touched). */
static int add_tensor(const gguf_file *f, const model_config *c, const gguf_arch *A, const gguf_tensor *g,
                      tensor_list *L, int reorder, um_err *err) {
    int layer;
    const name_map *m = map_name(A, g->name, c->n_layers, &layer);
    if (!m)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' is not part of the %s architecture as unmask reads it",
                          f->path, g->name, A->name);
    char tn[16];
    if (g->type == DTYPE_OTHER)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which unmask does not support; "
                          "supported: F32, F16, BF16, Q8_0, Q4_0", f->path, g->name, gguf_ggml_type_name(g->ggml_type, tn));
    const int want_dims = m->kind == NAME_EXPERTS ? 3 : m->kind == NAME_VECTOR ? 1 : 2;
    if (g->n_dims != want_dims)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, expected %d", f->path, g->name,
                          g->n_dims, want_dims);
    if (dtype_is_quant(g->type) && want_dims == 1)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor %s is a vector of type %s; unmask reads vectors as F32, "
                          "F16 or BF16", f->path, g->name, gguf_ggml_type_name(g->ggml_type, tn));
    char name[256];
    const int64_t cols = g->ne[0], rows = want_dims == 1 ? 1 : g->ne[1];
    if (m->kind == NAME_EXPERTS) {
        if (g->ne[2] != c->n_experts)
            return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' stacks %" PRId64 " experts, the model has %d",
                              f->path, g->name, g->ne[2], c->n_experts);
        const size_t per = (size_t)rows * dtype_row_bytes(g->type, cols);
        for (int e = 0; e < c->n_experts; e++) {
            snprintf(name, sizeof name, m->hf, layer, e);
            fill_tensor(list_add(L), g, name, g->data + (size_t)e * per, rows, cols, 2);
        }
        return 0;
    }
    snprintf(name, sizeof name, m->hf, layer);
    if (m->kind == NAME_PERMUTE_Q || m->kind == NAME_PERMUTE_K) {
        const int heads = m->kind == NAME_PERMUTE_Q ? c->n_heads : c->n_kv_heads;
        if (rows % heads != 0 || (rows / heads) % 2 != 0)
            return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' has %" PRId64 " rows, not %d heads of an even size",
                              f->path, g->name, rows, heads);
        if (reorder && unpermute_rows(f, g, heads, dtype_row_bytes(g->type, cols), err) != 0) return -1;
    }
    fill_tensor(list_add(L), g, name, g->data, rows, cols, want_dims);
    return 0;
}

/* ---------------------------------------------------------------- tokenizer */

/* tokenizer.ggml.pre -> the split; unknown names fall back on the architecture's family. */
static void pre_split(const gguf_file *f, const gguf_arch *A, tokenizer_vocab *v) {
    v->split = A->split;
    v->nfc = A->nfc;
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.pre");
    if (kv && kv->type == GGUF_STRING) {
        for (size_t i = 0; i < sizeof k_pre / sizeof k_pre[0]; i++)
            if (strlen(k_pre[i].name) == kv->len && memcmp(k_pre[i].name, kv->data, kv->len) == 0) {
                v->split = k_pre[i].split;
                v->nfc = k_pre[i].nfc;
                return;
            }
    }
    log_warn("%s: tokenizer.ggml.pre '%.*s' is not a pre-tokenizer unmask knows by name: using the %s family's split",
             f->path, kv && kv->type == GGUF_STRING ? (int)(kv->len > 40 ? 40 : kv->len) : 6,
             kv && kv->type == GGUF_STRING ? (const char *)kv->data : "(none)", A->name);
}

/* An array key of the expected element type (array_of: GGUF_STRING, or GGUF_I32 for any integer
 * type), or NULL + err; absent is NULL without an error when !required. */
static const gguf_kv *get_array(const gguf_file *f, const char *key, int strings, int required, um_err *err) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        if (required) um_err_set(err, UM_ERR_FORMAT, "%s: missing required key '%s'", f->path, key);
        return NULL;
    }
    const int ok = kv->type == GGUF_ARRAY &&
                   (strings ? kv->arr_type == GGUF_STRING
                            : kv->arr_type != GGUF_STRING && kv->arr_type != GGUF_F32 && kv->arr_type != GGUF_F64 &&
                                  kv->arr_type != GGUF_BOOL);
    if (!ok)
        um_err_set(err, UM_ERR_FORMAT, "%s: key '%s' has type %s%s%s, expected an array of %s", f->path, key,
                   gguf_vtype_name(kv->type), kv->type == GGUF_ARRAY ? " of " : "",
                   kv->type == GGUF_ARRAY ? gguf_vtype_name(kv->arr_type) : "", strings ? "strings" : "integers");
    return ok ? kv : NULL;
}

/* The string of token id (NULL when out of range) from the token list, NUL-terminated into buf. */
static const char *token_str(const gguf_kv *toks, int64_t id, char *buf, size_t cap) {
    if (id < 0 || (uint64_t)id >= toks->n) return NULL;
    const char *s;
    uint64_t len;
    gguf_arr_str(toks, (uint64_t)id, &s, &len);
    if (len >= cap || memchr(s, 0, (size_t)len)) return NULL;
    memcpy(buf, s, (size_t)len);
    buf[len] = 0;
    return buf;
}

/* tokenizer.ggml.<which>_token_id, or -1. */
static int special_id(const gguf_file *f, const char *which, int *id, um_err *err) {
    char key[96];
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", which);
    *id = -1;
    return gguf_find_kv(f, key) ? get_int(f, NULL, key, 0, INT32_MAX, 0, id, err) : 0;
}

static int load_tokenizer(const gguf_file *f, const gguf_arch *A, tokenizer **tok, chat_template **chat, um_err *err) {
    *tok = NULL;
    if (chat) *chat = NULL;
    const gguf_kv *mk = gguf_find_kv(f, "tokenizer.ggml.model");
    if (!mk) return 0;   /* no tokenizer: prompts as token ids only */
    const char *ms;
    uint64_t ml;
    if (gguf_kv_str(f, mk, &ms, &ml, err) != 0) return -1;
    if (!(ml == 4 && memcmp(ms, "gpt2", 4) == 0))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (only gpt2, the "
                          "byte-level BPE)", f->path, (int)(ml > 32 ? 32 : ml), ms);
    const gguf_kv *toks = get_array(f, "tokenizer.ggml.tokens", 1, 1, err);
    if (!toks) return -1;
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type") ? get_array(f, "tokenizer.ggml.token_type", 0, 1, err)
                                                                        : NULL;
    const gguf_kv *merges = get_array(f, "tokenizer.ggml.merges", 1, 1, err);
    if (!merges || (gguf_find_kv(f, "tokenizer.ggml.token_type") && !types)) return -1;
    if (toks->n > (1u << 24))
        return um_err_set(err, UM_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries, more than %u", f->path,
                          toks->n, 1u << 24);
    if (types && types->n != toks->n)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %" PRIu64 " entries, "
                          "tokenizer.ggml.tokens %" PRIu64, f->path, types->n, toks->n);
    tokenizer_vocab v = {.n_tokens = (int32_t)toks->n, .n_merges = (int64_t)merges->n};
    const char **tp = xmalloc((size_t)(toks->n ? toks->n : 1) * sizeof *tp);
    uint32_t *tl = xmalloc((size_t)(toks->n ? toks->n : 1) * sizeof *tl);
    int32_t *kinds = types ? xmalloc((size_t)(toks->n ? toks->n : 1) * sizeof *kinds) : NULL;
    const char **mp = xmalloc((size_t)(merges->n ? merges->n : 1) * sizeof *mp);
    uint32_t *mlen = xmalloc((size_t)(merges->n ? merges->n : 1) * sizeof *mlen);
    int rc = 0;
    for (uint64_t i = 0; i < toks->n && rc == 0; i++) {
        uint64_t len;
        gguf_arr_str(toks, i, &tp[i], &len);
        if (len > UINT32_MAX) rc = um_err_set(err, UM_ERR_FORMAT, "%s: token %" PRIu64 " is too long", f->path, i);
        tl[i] = (uint32_t)len;
        if (kinds) {
            const int64_t k = gguf_arr_int(types, i);
            kinds[i] = k < 0 || k > 64 ? 0 : (int32_t)k;   /* out of range: refused as an unknown type */
        }
    }
    for (uint64_t i = 0; i < merges->n && rc == 0; i++) {
        uint64_t len;
        gguf_arr_str(merges, i, &mp[i], &len);
        if (len > UINT32_MAX) rc = um_err_set(err, UM_ERR_FORMAT, "%s: merge %" PRIu64 " is too long", f->path, i);
        mlen[i] = (uint32_t)len;
    }
    v.token = tp, v.token_len = tl, v.kind = kinds, v.merge = mp, v.merge_len = mlen;
    pre_split(f, A, &v);
    /* the special token strings (the chat template's bos_token / eos_token) */
    char bufs[5][256];
    const char *which[5] = {"bos", "eos", "padding", "unknown", "mask"};
    const char **dst[5] = {&v.bos_token, &v.eos_token, &v.pad_token, &v.unk_token, &v.mask_token};
    for (int i = 0; i < 5 && rc == 0; i++) {
        int id;
        rc = special_id(f, which[i], &id, err);
        if (rc == 0) *dst[i] = token_str(toks, id, bufs[i], sizeof bufs[i]);
    }
    char label[4200];
    snprintf(label, sizeof label, "%s: tokenizer.ggml", f->path);
    if (rc == 0) rc = tokenizer_load_vocab(&v, label, tok, err);
    free(tp);
    free(tl);
    free(kinds);
    free(mp);
    free(mlen);
    if (rc != 0 || !chat) return rc;
    const gguf_kv *ct = gguf_find_kv(f, "tokenizer.chat_template");
    if (!ct) return 0;
    const char *cs;
    uint64_t cl;
    if (gguf_kv_str(f, ct, &cs, &cl, err) != 0) return -1;
    char *src = xstrndup(cs, (size_t)cl);
    rc = chat_template_load_string(src, v.bos_token, v.eos_token, chat, err);
    free(src);
    if (rc != 0) {
        um_err_prefix(err, "%s: tokenizer.chat_template", f->path);
        tokenizer_free(*tok);
        *tok = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------------- token ids */

/* Special ids from tokenizer.ggml.*, else the family's token strings (the converter writes
 * tokenizer.ggml.mask_token_id for Dream, LLaDA-MoE and newer LLaDA files). */
static int resolve_ids(const gguf_file *f, const gguf_arch *A, const tokenizer *tok, model_config *c, um_err *err) {
    if (special_id(f, "mask", &c->mask_id, err) || special_id(f, "eos", &c->eos_id, err) ||
        special_id(f, "bos", &c->bos_id, err) || special_id(f, "padding", &c->pad_id, err) ||
        (A->arch != MODEL_ARCH_LLADA_MOE && special_id(f, "eot", &c->eot_id, err)))   /* MoE: eos only */
        return -1;
    if (c->mask_id < 0 && tok) c->mask_id = tokenizer_token_id(tok, A->mask_piece);
    if (c->eos_id < 0 && tok) c->eos_id = tokenizer_token_id(tok, "<|endoftext|>");
    if (c->pad_id < 0) c->pad_id = c->eos_id;
    if (c->mask_id < 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: no mask token: no tokenizer.ggml.mask_token_id and %s", f->path,
                          tok ? "the vocabulary has no mask token" : "no tokenizer to find it in");
    const int ids[] = {c->mask_id, c->eos_id, c->pad_id, c->bos_id, c->eot_id};
    const char *names[] = {"mask", "eos", "padding", "bos", "eot"};
    for (int i = 0; i < 5; i++)
        if (ids[i] >= c->n_embd_rows)
            return um_err_set(err, UM_ERR_FORMAT, "%s: tokenizer.ggml.%s_token_id %d is outside the %d-row embedding",
                              f->path, names[i], ids[i], c->n_embd_rows);
    return 0;
}

/* ---------------------------------------------------------------- names for messages */

/* s matches pattern pat whose %d stand for non-negative integers (at most two): 1 and their values. */
static int match_pattern(const char *pat, const char *s, int v[2]) {
    int k = 0;
    while (*pat) {
        if (pat[0] == '%' && pat[1] == 'd') {
            if (*s < '0' || *s > '9' || k == 2) return 0;
            long x = 0;
            while (*s >= '0' && *s <= '9' && x < 1000000) x = x * 10 + (*s++ - '0');
            v[k++] = (int)x;
            pat += 2;
        } else if (*pat++ != *s++) {
            return 0;
        }
    }
    return *s == 0;
}

const char *gguf_model_file_name(enum model_arch arch, const char *hf, char *buf, size_t cap) {
    for (size_t a = 0; a < sizeof k_archs / sizeof k_archs[0]; a++) {
        if (k_archs[a].arch != arch) continue;
        int v[2] = {0, 0};
        for (const name_map *m = k_archs[a].top; m->gguf; m++)
            if (match_pattern(m->hf, hf, v)) return snprintf(buf, cap, "%s", m->gguf), buf;
        for (const name_map *m = k_archs[a].layer; m->gguf; m++)
            if (match_pattern(m->hf, hf, v)) {
                if (m->kind == NAME_EXPERTS) snprintf(buf, cap, "blk.%d.%s (expert %d)", v[0], m->gguf, v[1]);
                else snprintf(buf, cap, "blk.%d.%s", v[0], m->gguf);
                return buf;
            }
    }
    return NULL;
}

/* ---------------------------------------------------------------- entry points */

int gguf_model_load(const char *path, model *m, um_err *err) {
    gguf_file f;
    if (gguf_open(path, &f, err) != 0) return -1;
    int rc = -1;
    tensor_list L = {0};
    const gguf_arch *A = arch_of(&f, err);
    if (!A || read_config(&f, A, &m->cfg, err) != 0) goto done;
    m->ck.dir = xstrdup(path);
    for (int i = 0; i < f.n_tensors; i++)
        if (add_tensor(&f, &m->cfg, A, &f.tensors[i], &L, 1, err) != 0) goto done;
    if (load_tokenizer(&f, A, &m->tok, &m->chat, err) != 0 || resolve_ids(&f, A, m->tok, &m->cfg, err) != 0) goto done;
    /* the tensors become the checkpoint's one file, which takes over the mapping */
    st_file *sf = xcalloc(1, sizeof *sf);
    sf->path = xstrdup(path);
    sf->map = f.map;
    f.map = (file_map){0};
    sf->tensors = L.t;
    sf->n_tensors = L.n;
    sf->header_len = f.data_start;
    L = (tensor_list){0};
    safetensors_sort(sf);
    for (int i = 1; i < sf->n_tensors; i++)
        CHECK(strcmp(sf->tensors[i].name, sf->tensors[i - 1].name) != 0);   /* GGUF names are unique */
    m->ck.files = sf;
    m->ck.n_files = 1;
    for (int i = 0; i < sf->n_tensors; i++) m->ck.total_bytes += sf->tensors[i].nbytes;
    rc = 0;
done:
    for (int i = 0; i < L.n; i++) free(L.t[i].name);
    free(L.t);
    gguf_free(&f);
    return rc;
}

int gguf_model_tokenizer(const char *path, tokenizer **tok, chat_template **chat, um_err *err) {
    *tok = NULL;
    if (chat) *chat = NULL;
    gguf_file f;
    if (gguf_open(path, &f, err) != 0) return -1;
    const gguf_arch *A = arch_of(&f, err);
    int rc = A ? load_tokenizer(&f, A, tok, chat, err) : -1;
    gguf_free(&f);
    return rc;
}

int gguf_model_check(const char *path, um_err *err) {
    gguf_file f;
    if (gguf_open(path, &f, err) != 0) return -1;
    model_config c;
    tensor_list L = {0};
    const gguf_arch *A = arch_of(&f, err);
    int rc = A && read_config(&f, A, &c, err) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < f.n_tensors; i++) rc = add_tensor(&f, &c, A, &f.tensors[i], &L, 0, err);
    for (int i = 0; i < L.n; i++) free(L.t[i].name);
    free(L.t);
    gguf_free(&f);
    return rc;
}

const char *model_tensor_label(const model *m, const char *name, char *buf, size_t cap) {
    const char *g = m->gguf ? gguf_model_file_name(m->cfg.arch, name, buf, cap) : NULL;
    return g ? g : name;
}
