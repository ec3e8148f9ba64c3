/*
 * llada.c — LLaDA dense (LLaDAModelLM, block_type "llama"): tensor names/shapes and the forward
 * pass written against backend ops (models.md §1.2–1.3).
 * Binding runs at load time (any thread); the forward runs on the engine thread owning the ctx.
 */
#include "model/llada.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* ---------------------------------------------------------------- tensor binding */

static const st_tensor *bind_one(const model *m, const char *name, int64_t d0, int64_t d1, um_err *err) {
    const st_tensor *t = checkpoint_find(&m->ck, name);
    if (!t) {
        um_err_set(err, UM_ERR_FORMAT, "%s: missing tensor '%s'", m->dir, name);
        return NULL;
    }
    int ok = d1 < 0 ? (t->ndim == 1 && t->shape[0] == d0)
                    : (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1);
    if (!ok) {
        char got[128] = "[", *p = got + 1;
        for (int i = 0; i < t->ndim && p < got + 100; i++)
            p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        snprintf(p, (size_t)(got + sizeof got - p), "]");
        if (d1 < 0)
            um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld]", m->dir, name, got,
                       (long long)d0);
        else
            um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]", m->dir, name,
                       got, (long long)d0, (long long)d1);
        return NULL;
    }
    if (t->type == DTYPE_OTHER) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s; only F32, BF16 and F16 are supported",
                   m->dir, name, t->type_name);
        return NULL;
    }
    return t;
}

int llada_tensors_bind(model *m, um_err *err) {
    const model_config *c = &m->cfg;
    llada_tensors *w = &m->llada;
    int64_t d = c->d_model, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int64_t V = c->n_embd_rows, F = c->ffn_hidden;
    if (!(w->wte = bind_one(m, "model.transformer.wte.weight", V, d, err))) return -1;
    if (!(w->ln_f = bind_one(m, "model.transformer.ln_f.weight", d, -1, err))) return -1;
    if (c->weight_tying)
        w->lm_head = w->wte;
    else if (!(w->lm_head = bind_one(m, "model.transformer.ff_out.weight", V, d, err)))
        return -1;
    w->layers = xcalloc((size_t)c->n_layers, sizeof *w->layers);
    char name[256];
#define BIND(field, suffix, a, b)                                                    \
    do {                                                                             \
        snprintf(name, sizeof name, "model.transformer.blocks.%d.%s.weight", l, suffix); \
        if (!(L->field = bind_one(m, name, a, b, err))) return -1;                   \
    } while (0)
    for (int l = 0; l < c->n_layers; l++) {
        llada_layer_tensors *L = &w->layers[l];
        BIND(attn_norm, "attn_norm", d, -1);
        BIND(q_proj, "q_proj", qd, d);
        BIND(k_proj, "k_proj", kvd, d);
        BIND(v_proj, "v_proj", kvd, d);
        BIND(attn_out, "attn_out", d, qd);
        BIND(ff_norm, "ff_norm", d, -1);
        BIND(ff_proj, "ff_proj", F, d);
        BIND(up_proj, "up_proj", F, d);
        BIND(ff_out, "ff_out", d, F);
    }
#undef BIND
    return 0;
}

void llada_tensors_free(model *m) {
    free(m->llada.layers);
    memset(&m->llada, 0, sizeof m->llada);
}

/* ---------------------------------------------------------------- forward (TODO: backend ops) */

int llada_ctx_init(model_ctx *ctx, um_err *err) {
    (void)ctx;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "forward pass not implemented yet");
}

void llada_ctx_free(model_ctx *ctx) { (void)ctx; }

int llada_forward(model_ctx *ctx, const fwd_batch *b, float *logits, um_err *err) {
    (void)ctx;
    (void)b;
    (void)logits;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "forward pass not implemented yet");
}
