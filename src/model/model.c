/*
 * model.c — checkpoint directory loading, architecture dispatch, forward entry point.
 * model_load/model_free: any thread (usually main at startup). model_forward: the engine thread
 * that owns the ctx.
 */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/llada.h"
#include "text/chat_template.h"
#include "model/model_kv.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include "util/log.h"

#define CONFIG_MAX_BYTES (4u << 20)

static int load_json_file(const char *dir, const char *name, int required, char **text, size_t *len,
                          um_err *err) {
    char path[4096];
    path_join(path, sizeof path, dir, name);
    *text = NULL;
    if (!required && !file_exists(path)) return 0;
    return file_read_all(path, CONFIG_MAX_BYTES, text, len, err);
}

/* 1 when path is a regular file that starts with the GGUF magic. */
static int is_gguf_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && gguf_path_is_gguf(path);
}

int model_dir_check(const char *dir, um_err *err) {
    static const char make[] = "a Hugging Face checkpoint directory (config.json + model.safetensors) or a GGUF file, or "
                               "make a small test model with: unmask make-model --out";
    struct stat st;
    char path[4096];
    if (stat(dir, &st) != 0)
        return um_err_set(err, UM_ERR_IO, "model directory %s does not exist; pass %s %s", dir, make, dir);
    const size_t dl = strlen(dir);
    if (is_gguf_file(dir) || (S_ISREG(st.st_mode) && dl > 5 && strcmp(dir + dl - 5, ".gguf") == 0))
        return gguf_model_check(dir, err);   /* a .gguf without the magic: the reader says what is wrong */
    if (!S_ISDIR(st.st_mode)) {
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = 0;
        else snprintf(parent, sizeof parent, ".");
        return um_err_set(err, UM_ERR_IO, "%s is a file, not a model directory or a GGUF file; pass the directory that "
                          "holds it: %s", dir, parent[0] ? parent : "/");
    }
    path_join(path, sizeof path, dir, "config.json");
    if (!file_exists(path))
        return um_err_set(err, UM_ERR_IO, "%s is not a model directory: it has no config.json; pass %s NEW_DIR", dir,
                          make);
    char idx[4096];
    path_join(path, sizeof path, dir, "model.safetensors");
    path_join(idx, sizeof idx, dir, "model.safetensors.index.json");
    if (!file_exists(path) && !file_exists(idx))
        return um_err_set(err, UM_ERR_IO,
                          "%s has config.json but no weights (model.safetensors or model.safetensors.index.json with "
                          "its shards); copy them from the checkpoint's release",
                          dir);
    return 0;
}

/* config.json (+ generation_config.json), the safetensors files, the tokenizer files. */
static int load_dir(const char *dir, model *m, um_err *err) {
    if (model_dir_check(dir, err) != 0) return -1;
    char *text;
    size_t len;
    char path[4096];
    path_join(path, sizeof path, dir, "config.json");
    if (load_json_file(dir, "config.json", 1, &text, &len, err) != 0) return -1;
    int rc = model_config_parse(text, len, path, &m->cfg, err);
    free(text);
    if (rc != 0) return -1;
    if (load_json_file(dir, "generation_config.json", 0, &text, &len, err) != 0) return -1;
    if (text) {
        path_join(path, sizeof path, dir, "generation_config.json");
        rc = model_config_apply_generation(text, len, path, &m->cfg, err);
        if (rc == 0) {
            json_t *g = json_loadb(text, len, 0, NULL);
            if (json_is_object(g)) m->gen_config = g;
            else json_decref(g);
        }
        free(text);
        if (rc != 0) return -1;
    }
    if (checkpoint_open(dir, &m->ck, err) != 0) return -1;
    if (tokenizer_load_dir(dir, &m->tok, err) != 0) return -1;
    if (m->tok && chat_template_load_dir(dir, m->tok, &m->chat, err) != 0) return -1;
    return 0;
}

int model_load(const char *dir, model *m, um_err *err) {
    memset(m, 0, sizeof *m);
    m->quant = DTYPE_BF16;
    m->dir = xstrdup(dir);
    m->gguf = is_gguf_file(dir);
    if ((m->gguf ? gguf_model_load(dir, m, err) : load_dir(dir, m, err)) != 0) goto fail;
    if (llada_tensors_bind(m, err) != 0) goto fail;
    if (m->cfg.n_experts > 0) {   /* MoE families: ids the config leaves out come from the tokenizer */
        if (m->tok && m->cfg.mask_id < 0) m->cfg.mask_id = tokenizer_token_id(m->tok, "<|mask|>");
        if (m->tok && m->cfg.eos_id < 0) m->cfg.eos_id = tokenizer_token_id(m->tok, "<|endoftext|>");
        if (m->cfg.pad_id < 0) m->cfg.pad_id = m->cfg.eos_id;
        if (m->cfg.mask_id < 0 || m->cfg.mask_id >= m->cfg.n_embd_rows) {
            um_err_set(err, UM_ERR_FORMAT, "%s: no mask token: config.json has no mask_token_id and %s", dir,
                       m->tok ? "the tokenizer has no <|mask|>" : "there is no tokenizer.json to read <|mask|> from");
            goto fail;
        }
    }
    if (m->tok && m->cfg.eot_id < 0 && m->cfg.n_experts == 0)   /* MoE families stop on eos only */
        m->cfg.eot_id = tokenizer_token_id(m->tok, "<|eot_id|>");
    if (m->tok && m->cfg.eot_id < 0 && m->cfg.n_experts == 0)
        m->cfg.eot_id = tokenizer_token_id(m->tok, "<|im_end|>");   /* Qwen2 / Dream */
    return 0;
fail:
    model_free(m);
    return -1;
}

int model_tokenizer_load(const char *path, tokenizer **tok, chat_template **chat, um_err *err) {
    *tok = NULL;
    if (chat) *chat = NULL;
    if (is_gguf_file(path)) return gguf_model_tokenizer(path, tok, chat, err);
    if (tokenizer_load_dir(path, tok, err) != 0) return -1;
    if (*tok && chat && chat_template_load_dir(path, *tok, chat, err) != 0) {
        tokenizer_free(*tok);
        *tok = NULL;
        return -1;
    }
    return 0;
}

void model_free(model *m) {
    if (!m) return;
    if (m->chat) chat_template_free(m->chat);
    if (m->tok) tokenizer_free(m->tok);
    llada_tensors_free(m);
    checkpoint_free(&m->ck);
    json_decref(m->gen_config);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

int model_quant_check(const model *m, backend *be, um_err *err) {
    if (m->quant == DTYPE_F8_E4M3 && !backend_has(be, BACKEND_CAP_FP8))
        return backend_has(be, BACKEND_CAP_DEVICE_MEMORY)
                   ? um_err_param(err, "quant", "--quant fp8: %s (%s) has no FP8 kernels (FP8 weights need a GPU with FP8 "
                                  "tensor cores, such as Hopper); use --quant bf16 there", backend_name(be),
                                  backend_description(be))
                   : um_err_param(err, "quant", "--quant fp8: %s (%s) has no FP8 kernels; --quant fp8 needs a CUDA device "
                                  "(Hopper FP8 weights); on the CPU use q8_0 or q4_0", backend_name(be),
                                  backend_description(be));
    if (!model_quant_converts(m->quant)) return 0;
    if (dtype_is_quant(m->quant) && !backend_has(be, BACKEND_CAP_QUANT))
        return um_err_param(err, "quant",
                            "--quant %s: %s (%s) has no kernels for quantized weights yet; use --quant bf16 there "
                            "(quantized weights run on the CPU)",
                            model_quant_name(m->quant), backend_name(be), backend_description(be));
    /* weights stored quantized are never requantized: another block type would round twice (stored
     * FP8 weights are dequantized exactly, so --quant q8_0 / q4_0 round them once; --quant fp8 keeps
     * them as stored) */
    for (int f = 0; f < m->ck.n_files; f++)
        for (int i = 0; i < m->ck.files[f].n_tensors; i++) {
            const st_tensor *t = &m->ck.files[f].tensors[i];
            if (!dtype_is_quant(t->type) || t->type == m->quant) continue;
            char label[160];
            return um_err_param(err, "quant",
                                "--quant %s: tensor '%s' is stored as %s and is never requantized (rounding twice); "
                                "use --quant bf16 (keep the stored types) or %s, or quantize the float checkpoint",
                                model_quant_name(m->quant), model_tensor_label(m, t->name, label, sizeof label),
                                dtype_name(t->type), model_quant_name(t->type));
        }
    return 0;
}

int model_ctx_init(model_ctx *ctx, const model *m, backend *be, um_err *err) {
    return model_ctx_init_shard(ctx, m, be, NULL, err);
}

int model_ctx_init_shard(model_ctx *ctx, const model *m, backend *be, const model_shard *shard, um_err *err) {
    memset(ctx, 0, sizeof *ctx);
    ctx->m = m;
    ctx->be = be;
    ctx->shard.world = 1;
    if (model_quant_check(m, be, err) != 0) return -1;
    if (shard && shard->world > 1) {
        const model_config *c = &m->cfg;
        int W = shard->world;
        if (shard->rank < 0 || shard->rank >= W || !shard->comm)
            return um_err_set(err, UM_ERR_INTERNAL, "shard rank %d of %d (comm %s)", shard->rank, W,
                              shard->comm ? "set" : "missing");
        if (model_config_check_tp(c, m->dir, W, err) != 0) return -1;
        ctx->shard = *shard;
    }
    if (llada_ctx_init(ctx, err) != 0) return -1;
    model_kv_init(ctx);
    return 0;
}

void model_ctx_free(model_ctx *ctx) {
    model_kv_free(ctx);
    if (ctx->weights || ctx->scratch) llada_ctx_free(ctx);
    memset(ctx, 0, sizeof *ctx);
}

static int forward_validate(const model_ctx *ctx, const fwd_batch *b, um_err *err) {
    const model_config *c = &ctx->m->cfg;
    if (b->n_seqs <= 0) return um_err_param(err, "tokens", "batch has no sequences");
    if (b->seq_start[0] != 0) return um_err_set(err, UM_ERR_INTERNAL, "seq_start[0] must be 0");
    for (int s = 0; s < b->n_seqs; s++) {
        int len = b->seq_start[s + 1] - b->seq_start[s];
        if (len <= 0) return um_err_param(err, "tokens", "sequence %d is empty", s);
        if (len > c->max_seq)
            return um_err_param(err, "tokens", "sequence %d has %d tokens, the model's maximum is %d", s,
                                len, c->max_seq);
    }
    int n_tokens = b->seq_start[b->n_seqs];
    for (int i = 0; i < n_tokens; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->n_embd_rows)
            return um_err_param(err, "tokens", "token id %d at index %d is outside the vocabulary [0, %d)",
                                b->tokens[i], i, c->n_embd_rows);
    if (b->pos)
        for (int i = 0; i < n_tokens; i++)
            if (b->pos[i] < 0 || b->pos[i] >= c->max_seq)
                return um_err_param(err, "positions", "position %d at index %d is outside [0, %d)", b->pos[i],
                                    i, c->max_seq);
    if (b->out_rows) {
        if (b->n_out < 0 || (b->n_out == 0 && !b->kv))   /* none: only a KV-cache fill (prefill) */
            return um_err_param(err, "positions", "no output rows requested");
        for (int i = 0; i < b->n_out; i++)
            if (b->out_rows[i] < 0 || b->out_rows[i] >= n_tokens)
                return um_err_param(err, "positions", "position %d is outside the %d-token input",
                                    b->out_rows[i], n_tokens);
    } else if (b->n_out != n_tokens) {
        return um_err_set(err, UM_ERR_INTERNAL, "n_out must equal n_tokens when out_rows is NULL");
    }
    if (b->block_len) {
        for (int s = 0; s < b->n_seqs; s++)
            if (b->block_len[s] < 0 || b->block_len[s] > c->max_seq)
                return um_err_param(err, "block_length", "block length %d is outside [0, %d]", b->block_len[s],
                                    c->max_seq);
    }
    if (b->kv) {   /* slots are the decode loop's (a bad one is a bug, but reported, not aborted) */
        if (b->key_valid) return um_err_set(err, UM_ERR_INTERNAL, "key_valid cannot be combined with KV caches");
        for (int s = 0; s < b->n_seqs; s++) {
            if (b->kv[s] == 0) continue;
            const int rows = model_kv_rows(ctx, b->kv[s]);
            if (rows == 0) return um_err_set(err, UM_ERR_INTERNAL, "sequence %d: KV slot %d is not open", s, b->kv[s]);
            for (int i = b->seq_start[s]; i < b->seq_start[s + 1]; i++) {
                const int p = b->pos ? b->pos[i] : i - b->seq_start[s];
                if (p >= rows)
                    return um_err_set(err, UM_ERR_INTERNAL, "sequence %d: position %d is outside its %d-row KV slot", s,
                                      p, rows);
            }
        }
    }
    return 0;
}

int model_forward(model_ctx *ctx, const fwd_batch *b, float *logits, um_err *err) {
    if (forward_validate(ctx, b, err) != 0) return -1;
    if (ctx->tp) ctx->tp_send(ctx->tp, b);   /* the followers run their shards alongside */
    return llada_forward(ctx, b, logits, err);
}

int model_forward_dev(model_ctx *ctx, const fwd_batch *b, const void **logits, um_err *err) {
    if (forward_validate(ctx, b, err) != 0) return -1;
    if (b->n_out == 0) return um_err_set(err, UM_ERR_INTERNAL, "a KV-cache fill runs through model_forward");
    if (ctx->tp) ctx->tp_send(ctx->tp, b);
    return llada_forward_dev(ctx, b, logits, err);
}
