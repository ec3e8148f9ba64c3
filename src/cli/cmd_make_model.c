/*
 * cmd_make_model.c — `unmask make-model`: write a LLaDA-layout checkpoint: random weights, or
 * trained ones (--weights, the export step of tools/train/); the built-in tokenizer, one trained on
 * a corpus (--tokenizer-corpus, also alone with --tokenizer-only) or a copied one (--tokenizer).
 * Main thread.
 */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "model/config.h"
#include "model/make_model.h"

int cmd_make_model(int argc, char **argv) {
    const char *out = NULL, *preset = "tiny", *dtype = "bf16";
    int d_model = 0, n_layers = 0, n_heads = 0, n_kv = 0, ffn = 0, vocab = 0, max_seq = 0, seed = 1234;
    int shards = 1, tying = 0, no_tok = 0, quiet = 0, merges = 0, tok_only = 0, fp8 = 0;
    const char *tok_corpus = NULL, *tok_dir = NULL, *weights = NULL;
    double theta = 0;
    int experts = 0, experts_per_tok = 0, expert_bias = -1, first_dense = -1, moe_ffn = 0;
    arg_spec specs[] = {
        {"out", ARG_STR, &out, "output directory (created if missing) [required]"},
        {"preset", ARG_STR, &preset, "tiny | demo (random, quick on 2 cores; the bundled models/unmask-code-13m is trained, not made here) | small (~100M params) | 8b (LLaDA-8B shape) | dream-tiny | dream-7b (Dream layout) | lladamoe-tiny | lladamoe-7b (LLaDA-MoE layout) | llada2-tiny | llada2-mini | llada2-flash (LLaDA2.0 layout) [tiny]"},
        {"dtype", ARG_STR, &dtype, "bf16 | f32 | f16 [bf16]"},
        {"seed", ARG_INT, &seed, "weight seed [1234]"},
        {"d-model", ARG_INT, &d_model, "override hidden size"},
        {"n-layers", ARG_INT, &n_layers, "override layer count"},
        {"n-heads", ARG_INT, &n_heads, "override attention heads"},
        {"n-kv-heads", ARG_INT, &n_kv, "override key/value heads (GQA)"},
        {"ffn", ARG_INT, &ffn, "override SwiGLU hidden size (mlp_hidden_size)"},
        {"vocab", ARG_INT, &vocab, "vocabulary size when no tokenizer is written"},
        {"max-seq", ARG_INT, &max_seq, "override max_sequence_length"},
        {"rope-theta", ARG_FLOAT, &theta, "override rope_theta [500000]"},
        {"experts", ARG_INT, &experts, "MoE presets: override experts per layer"},
        {"experts-per-tok", ARG_INT, &experts_per_tok, "MoE presets: override experts per token"},
        {"expert-bias", ARG_INT, &expert_bias, "MoE presets: 1 = write a router expert bias, 0 = none [preset]"},
        {"first-dense", ARG_INT, &first_dense, "MoE presets: override leading dense layers"},
        {"moe-ffn", ARG_INT, &moe_ffn, "MoE presets: override each expert's (and the shared expert's) SwiGLU size"},
        {"shards", ARG_INT, &shards, "write N shards + model.safetensors.index.json [1]"},
        {"weight-tying", ARG_FLAG, &tying, "share the embedding as LM head"},
        {"fp8", ARG_FLAG, &fp8, "store the linear layers' matrices as FP8 E4M3 with 128 x 128 block scales "
                                "(weight_scale_inv), the common FP8 checkpoint layout; embedding, LM head, router "
                                "and norms stay --dtype"},
        {"no-tokenizer", ARG_FLAG, &no_tok, "do not write tokenizer files"},
        {"tokenizer-corpus", ARG_STR, &tok_corpus, "train the byte-level BPE tokenizer on this text file"},
        {"merges", ARG_INT, &merges, "--tokenizer-corpus: BPE merges [8000]"},
        {"tokenizer", ARG_STR, &tok_dir, "copy the tokenizer files of this checkpoint directory"},
        {"tokenizer-only", ARG_FLAG, &tok_only, "write the tokenizer files only"},
        {"weights", ARG_STR, &weights, "F32 safetensors with every tensor's trained values (else random)"},
        {"quiet", ARG_FLAG, &quiet, "no progress output"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv, "usage: unmask make-model --out DIR [--preset NAME] [options]\n\n"
                                   "Writes a checkpoint in the exact layout of a real release (LLaDA-8B-Instruct; Dream-7B\n"
                                   "for the dream presets; LLaDA-MoE-7B-A1B / LLaDA2.0 for the MoE presets): seeded random\n"
                                   "weights, or trained ones with --weights (sizes given by the preset and the\n"
                                   "overrides must match them).",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "error: --out DIR is required\n");
        return 2;
    }
    if ((tok_corpus != NULL) + (tok_dir != NULL) + no_tok > 1) {
        fprintf(stderr, "error: give only one of --tokenizer-corpus, --tokenizer, --no-tokenizer\n");
        return 2;
    }
    if (tok_only && !tok_corpus && !tok_dir) {
        fprintf(stderr, "error: --tokenizer-only needs --tokenizer-corpus or --tokenizer\n");
        return 2;
    }
    if (merges < 0 || (merges && !tok_corpus)) {
        fprintf(stderr, "error: --merges needs --tokenizer-corpus and a positive count\n");
        return 2;
    }
    make_model_opts o;
    if (make_model_preset(preset, &o) != 0) {
        fprintf(stderr, "error: --preset must be tiny, demo, small, 8b, dream-tiny, dream-7b, lladamoe-tiny, lladamoe-7b, "
                        "llada2-tiny, llada2-mini or llada2-flash, got '%s'\n", preset);
        return 2;
    }
    if (strcmp(dtype, "bf16") == 0) o.dtype = DTYPE_BF16;
    else if (strcmp(dtype, "f32") == 0) o.dtype = DTYPE_F32;
    else if (strcmp(dtype, "f16") == 0) o.dtype = DTYPE_F16;
    else {
        fprintf(stderr, "error: --dtype must be bf16, f32 or f16, got '%s'\n", dtype);
        return 2;
    }
    if (d_model) o.d_model = d_model;
    if (n_layers) o.n_layers = n_layers;
    if (n_heads) o.n_heads = n_heads, o.n_kv_heads = n_kv ? n_kv : n_heads;
    if (n_kv) o.n_kv_heads = n_kv;
    if (ffn) o.ffn_hidden = ffn;
    if (vocab) o.vocab_size = vocab;
    if (max_seq) o.max_seq = max_seq;
    if (theta) o.rope_theta = theta;
    if ((experts || experts_per_tok || expert_bias >= 0 || first_dense >= 0 || moe_ffn) && !o.moe) {
        fprintf(stderr, "error: --experts, --experts-per-tok, --expert-bias, --first-dense and --moe-ffn need a MoE "
                        "preset\n");
        return 2;
    }
    if (experts) o.n_experts = experts;
    if (experts_per_tok) o.moe_top_k = experts_per_tok;
    if (expert_bias >= 0) o.expert_bias = expert_bias != 0;
    if (first_dense >= 0) o.first_dense = first_dense;
    if (moe_ffn) o.moe_ffn = moe_ffn, o.shared_ffn = o.shared_ffn ? moe_ffn : 0;
    o.seed = (uint64_t)seed;
    o.shards = shards;
    o.weight_tying = tying;
    o.fp8 = fp8;
    o.no_tokenizer = no_tok;
    o.quiet = quiet;
    o.tokenizer_corpus = tok_corpus;
    o.tokenizer_merges = merges;
    o.tokenizer_dir = tok_dir;
    o.tokenizer_only = tok_only;
    o.weights = weights;
    um_err err = {0};
    if (make_model_write(out, &o, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return err.code == UM_ERR_INVALID_ARG ? 2 : 1;
    }
    if (!quiet && tok_only) fprintf(stderr, "make-model: wrote the tokenizer files to %s\n", out);
    else if (!quiet)
        fprintf(stderr, "make-model: wrote %s (%s%s, d_model %d, %d layers)\n", out, weights ? "trained weights, " : "",
                weights ? "sizes" : preset, o.d_model, o.n_layers);
    return 0;
}
