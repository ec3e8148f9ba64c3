/*
 * cmd_logits.c — `unmask logits`: one forward pass of a token sequence on the CPU backend, logits
 * of the chosen rows written as float32 .npy [n_rows, vocab rows]. The NumPy reference tests and
 * people debugging numerics use it.
 * --tp N runs the forward as a tensor-parallel group (cli/tp_cli.h), so tests compare it with --tp 1.
 * Does not: tokenize text (pass ids), batch several sequences.
 * Main thread (+ the backend's OpenMP workers).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/tp_cli.h"
#include "model/model.h"
#include "util/log.h"
#include "util/npy.h"

int cmd_logits(int argc, char **argv) {
    const char *model_dir = NULL, *tokens_s = NULL, *out = NULL, *positions_s = NULL, *valid_s = NULL;
    int threads = 0, tp = 1, block_length = -1;
    const char *device = "cpu", *cpu_kernels = NULL, *quant_s = NULL, *cpu_pin = NULL;
    const char *cuda_fuse = NULL, *cuda_skinny = NULL;
    arg_spec specs[] = {
        {"model", ARG_STR, &model_dir, "checkpoint directory or GGUF file [required]"},
        {"tokens", ARG_STR, &tokens_s, "comma-separated token ids, e.g. 1,2,3 [required]"},
        {"out", ARG_STR, &out, "output .npy file (float32 [rows, vocab]) [required]"},
        {"positions", ARG_STR, &positions_s, "comma-separated row indices whose logits to write [all]"},
        {"key-valid", ARG_STR, &valid_s, "comma-separated 0/1 per token; 0 = padding key [all 1]"},
        {"block-length", ARG_INT, &block_length,
         "block-causal attention with blocks of B positions aligned to 0 (0 = bidirectional) [the model's: LLaDA2 32, "
         "others bidirectional]"},
        {"threads", ARG_INT, &threads, "CPU threads (0 = all cores) [0]"},
        {"device", ARG_STR, &device, "cpu | cuda | cuda:N; with --tp: cuda:0,cuda:1,... [cpu]"},
        {"tp", ARG_INT, &tp, "tensor-parallel ranks (CPU threads or GPUs) [1]"},
        {"cpu-kernels", ARG_STR, &cpu_kernels, CLI_CPU_KERNELS_HELP},
        {"cpu-pin", ARG_STR, &cpu_pin, CLI_CPU_PIN_HELP},
        {"cuda-fuse", ARG_STR, &cuda_fuse, CLI_CUDA_FUSE_HELP},
        {"cuda-skinny", ARG_STR, &cuda_skinny, CLI_CUDA_SKINNY_HELP},
        {"quant", ARG_STR, &quant_s, CLI_QUANT_HELP},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask logits --model DIR --tokens 1,2,3 --out FILE.npy [--positions i,j]\n"
                       "                     [--key-valid 1,1,0] [--block-length B] [--threads N] [--device D] [--tp N]\n"
                       "                     [--quant bf16|q8_0|q4_0|fp8]\n\n"
                       "Runs one forward pass and writes float32 logits as a NumPy .npy file.",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    enum dtype quant;
    if (cli_cpu_kernels_apply(cpu_kernels) != 0 || cli_backend_options_apply(cpu_pin, cuda_fuse, cuda_skinny) != 0 ||
        cli_quant_parse(quant_s, &quant) != 0)
        return 2;
    if (!model_dir || !tokens_s || !out) {
        fprintf(stderr, "error: --model, --tokens and --out are required (see --help)\n");
        return 2;
    }
    if (block_length < -1) {
        fprintf(stderr, "error: --block-length must be >= 0, got %d\n", block_length);
        return 2;
    }
    if (threads < 0) {
        fprintf(stderr, "error: --threads must be >= 0, got %d\n", threads);
        return 2;
    }
    int *tokens = NULL, *positions = NULL, *valid = NULL;
    int n_pos = 0, n_valid = 0, rc = 2;
    uint8_t *kv = NULL;
    int n = args_parse_int_list("tokens", tokens_s, &tokens);
    if (n < 0) goto done;
    if (positions_s && (n_pos = args_parse_int_list("positions", positions_s, &positions)) < 0) goto done;
    if (valid_s) {
        if ((n_valid = args_parse_int_list("key-valid", valid_s, &valid)) < 0) goto done;
        if (n_valid != n) {
            fprintf(stderr, "error: --key-valid has %d entries but --tokens has %d\n", n_valid, n);
            goto done;
        }
        kv = xmalloc((size_t)n);
        for (int i = 0; i < n; i++) {
            if (valid[i] != 0 && valid[i] != 1) {
                fprintf(stderr, "error: --key-valid entry %d is %d, expected 0 or 1\n", i, valid[i]);
                goto done;
            }
            kv[i] = (uint8_t)valid[i];
        }
    }

    rc = 1;
    um_err err = {0};
    model m;
    if (model_load(model_dir, &m, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto done;
    }
    m.quant = quant;
    cli_model_ctx mc;
    if (cli_model_ctx_open(&mc, &m, device, tp, threads, (uint64_t)n, 0, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        rc = cli_model_ctx_exit_code(&err);
        model_free(&m);
        goto done;
    }
    int32_t seq_start[2] = {0, n}, blk[1] = {block_length};
    int n_out = positions ? n_pos : n;
    fwd_batch b = {
        .n_seqs = 1,
        .seq_start = seq_start,
        .tokens = tokens,
        .key_valid = kv,
        .n_out = n_out,
        .out_rows = positions,
        .block_len = block_length >= 0 ? blk : NULL,
    };
    int64_t shape[2] = {n_out, m.cfg.n_embd_rows};
    float *logits = xmalloc((size_t)n_out * (size_t)m.cfg.n_embd_rows * sizeof *logits);
    if (model_forward(mc.ctx, &b, logits, &err) != 0) {
        if (err.param[0]) fprintf(stderr, "error: --%s: %s\n", err.param, err.msg);
        else fprintf(stderr, "error: %s\n", err.msg);
        rc = err.code == UM_ERR_INVALID_ARG ? 2 : 1;
    } else if (npy_write_f32(out, logits, 2, shape, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
    } else {
        rc = 0;
    }
    free(logits);
    cli_model_ctx_close(&mc);
    model_free(&m);
done:
    free(tokens);
    free(positions);
    free(valid);
    free(kv);
    return rc;
}
