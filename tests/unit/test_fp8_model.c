/*
 * test_fp8_model.c — FP8 weights at the model layer, on the CPU: an FP8 checkpoint (make-model
 * --fp8) binds with its scales and its matrices as F8_E4M3; --quant fp8 is refused by
 * model_quant_check on a backend without FP8 kernels (param "quant", the message the CLI prints),
 * while --quant q8_0 on the FP8 checkpoint is accepted and loads; the device fit check's FP8 saving
 * (model_weight_fp8_savings) equals what the checkpoint's own tensor list gives — the stored FP8
 * matrices less their block scales, or with --quant fp8 every matrix but the embedding less a
 * scale per row. Single-threaded (the CPU backend's pool aside).
 */
#include <string.h>

#include "model/llada_weights.h"
#include "model/model_tp.h"
#include "test.h"
#include "test_model.h"

/* Sum over the checkpoint's tensors of (elements - 4 x scales) for the FP8 ones (stored) or, with
 * all_mats, over every 2-D tensor but the embedding (--quant fp8: a scale per row). */
static uint64_t want_savings(const model *m, int all_mats) {
    uint64_t n = 0;
    for (int f = 0; f < m->ck.n_files; f++)
        for (int i = 0; i < m->ck.files[f].n_tensors; i++) {
            const st_tensor *t = &m->ck.files[f].tensors[i];
            if (t->ndim != 2 || strstr(t->name, "_scale_inv") || strstr(t->name, "wte")) continue;
            if (t->type == DTYPE_F8_E4M3)
                n += (uint64_t)t->n_elems - 4u * (uint64_t)(((t->shape[0] + 127) / 128) * ((t->shape[1] + 127) / 128));
            else if (all_mats)
                n += (uint64_t)t->n_elems - 4u * (uint64_t)t->shape[0];
        }
    return n;
}

int main(void) {
    um_err err = {0};
    model m;
    make_model_opts o = test_model_opts();
    o.fp8 = 1;
    o.no_tokenizer = 1;
    o.ffn_hidden = 200;   /* two column blocks of ff_out, the second partial */
    TEST_CHECK(test_model_make("fp8_model", &o, &m, &err) == 0, "FP8 checkpoint: %s", err.msg);
    const llada_layer_tensors *L = &m.llada.layers[0];
    TEST_CHECK(L->q_proj->type == DTYPE_F8_E4M3 && L->ff_out->type == DTYPE_F8_E4M3 &&
                   m.llada.wte->type == DTYPE_BF16 && m.llada.lm_head->type == DTYPE_BF16,
               "matrices FP8, embedding and LM head bf16");
    const st_tensor *s = llada_fp8_scale(&m, L->ff_out, &err);
    TEST_CHECK(s && s->type == DTYPE_F32 && s->shape[0] == 1 && s->shape[1] == 2, "ff_out's scales [1, 2]: %s", err.msg);
    TEST_CHECK(m.cfg.fp8 && m.cfg.fp8_block[0] == 128 && m.cfg.fp8_block[1] == 128, "quantization_config read");

    backend *be = backend_cpu_init(1);
    m.quant = DTYPE_F8_E4M3;
    um_err e1 = {0};
    TEST_CHECK(model_quant_check(&m, be, &e1) != 0 && strcmp(e1.param, "quant") == 0 &&
                   strstr(e1.msg, "--quant fp8 needs a CUDA device (Hopper FP8 weights); on the CPU use q8_0 or q4_0"),
               "--quant fp8 refused on the CPU: %s", e1.msg);
    model_ctx ctx;
    um_err e2 = {0};
    TEST_CHECK(model_ctx_init(&ctx, &m, be, &e2) != 0 && strstr(e2.msg, "--quant fp8"), "no ctx with fp8 on the CPU");
    m.quant = DTYPE_Q8_0;
    um_err e3 = {0};
    TEST_CHECK(model_quant_check(&m, be, &e3) == 0, "--quant q8_0 on an FP8 checkpoint: %s", e3.msg);
    TEST_CHECK(model_ctx_init(&ctx, &m, be, &e3) == 0, "loads: %s", e3.msg);
    model_ctx_free(&ctx);

    m.quant = DTYPE_BF16;
    const uint64_t stored = want_savings(&m, 0);
    TEST_CHECK(stored > 0 && model_weight_fp8_savings(&m, 1) == stored, "stored FP8 saves %llu bytes, expected %llu",
               (unsigned long long)model_weight_fp8_savings(&m, 1), (unsigned long long)stored);
    model_free(&m);

    make_model_opts f = test_model_opts();
    f.no_tokenizer = 1;
    TEST_CHECK(test_model_make("fp8_model_float", &f, &m, &err) == 0, "float checkpoint: %s", err.msg);
    TEST_CHECK(model_weight_fp8_savings(&m, 1) == 0, "a bf16 checkpoint saves nothing without --quant fp8");
    m.quant = DTYPE_F8_E4M3;
    const uint64_t conv = want_savings(&m, 1);
    TEST_CHECK(conv > 0 && model_weight_fp8_savings(&m, 1) == conv, "--quant fp8 saves %llu bytes, expected %llu",
               (unsigned long long)model_weight_fp8_savings(&m, 1), (unsigned long long)conv);
    TEST_CHECK(model_weight_fp8_savings(&m, 1) < model_weight_bytes(&m, 1), "less than the bf16 bytes");
    model_free(&m);
    backend_free(be);
    return test_report();
}
