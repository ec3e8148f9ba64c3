/*
 * tp_cli.h — the model_ctx a CLI subcommand runs on: one backend (--device), or a tensor-parallel
 * group (--tp N: N CPU threads, or the GPUs listed in --device cuda:0,cuda:1,...). `logits`,
 * `bench` (and `generate`) open it the same way, so --tp means the same everywhere.
 * Not here: the server's replicas (server/server.c). Main thread.
 */
#ifndef UM_CLI_TP_CLI_H
#define UM_CLI_TP_CLI_H

#include <stdint.h>

#include "model/model.h"
#include "model/model_tp.h"

typedef struct cli_model_ctx {
    model_ctx *ctx;                          /* what to run forwards on (the leader with --tp) */
    backend   *be;                           /* without --tp: the backend, owned */
    model_ctx  own;                          /* without --tp: the ctx */
    model_tp  *tp;                           /* with --tp: the group, owned */
    char       devs[MODEL_TP_MAX_LOCAL][64]; /* the ranks' devices */
} cli_model_ctx;

/* device: "cpu", "cuda[:N]" or (with tp > 1) a list "cuda:0,cuda:1" of tp GPUs ("cuda" alone =
 * cuda:0..tp-1). threads: CPU threads in total (0 = all cores), split over the ranks. fit_tokens:
 * canvas tokens of the largest forward, for the CUDA fit check (0 = none); kv_rows: KV cache
 * positions it reserves too (0 = none). -1 + err (param "tp" / "device" for flag errors,
 * UM_ERR_UNSUPPORTED when tp does not divide the model) otherwise. */
int  cli_model_ctx_open(cli_model_ctx *c, const model *m, const char *device, int tp, int threads, uint64_t fit_tokens,
                        uint64_t kv_rows, um_err *err);
void cli_model_ctx_close(cli_model_ctx *c);
/* Exit code for an open failure: 2 for flag errors (err->param set: bad --tp / --device, tp not
 * dividing the model), 1 otherwise (no GPU, does not fit, ...). */
int  cli_model_ctx_exit_code(const um_err *err);

/* The --cpu-kernels flag (auto | amx | avx512bf16 | avx2 | fp32; NULL = not given): the kernel path
 * of the CPU backends this process creates (backend.h). 0, or -1 with the message printed (exit 2)
 * when the name is unknown or this CPU lacks the path. */
#define CLI_CPU_KERNELS_HELP                                                                                 \
    "CPU matrix kernels: auto | amx | avx512bf16 | avx2 | fp32; auto picks per product by shape and ISA: "  \
    "amx, else avx512bf16, else (AVX2 only) avx2 for products of few rows and fp32 above "                 \
    "(docs/cpu-kernels.md) [auto]"
int  cli_cpu_kernels_apply(const char *name);
/* For a command whose own parser does not know the flag (serve): finds --cpu-kernels NAME or
 * --cpu-kernels=NAME in argv, applies it and removes it from argv / *argc. 0 or -1 as above. */
int  cli_cpu_kernels_take(int *argc, char **argv);

/* The --cpu-pin (on | off; NULL = off), --cuda-fuse and --cuda-skinny (on | off; NULL = on) flags: the options of the backends this process opens
 * (backend_options_select), as serve's settings of the same names. 0, or -1 with the message printed (exit 2) for an unknown value. */
#define CLI_CPU_PIN_HELP                                                                                    \
    "CPU: on = pin compute thread i to the i-th CPU the process may use, off = the OS places them "         \
    "(docs/cpu-kernels.md) [off]"
#define CLI_CUDA_FUSE_HELP                                                                                  \
    "CUDA: on = RoPE + KV cache write and residual add + RMSNorm as one kernel each; off = their single "   \
    "kernels, an A/B switch (docs/gpu.md) [on]"
#define CLI_CUDA_SKINNY_HELP                                                                                \
    "CUDA: on = bf16 products of <= 64 rows on the weight-streaming kernel; off = on cuBLAS, faster on the "  \
    "H200 so far (docs/gpu.md); FP8 weights always stream [off]"
int  cli_backend_options_apply(const char *cpu_pin, const char *cuda_fuse, const char *cuda_skinny);

/* The --quant flag (bf16 | q8_0 | q4_0 | fp8; NULL = bf16): how the matrices are stored (model.quant).
 * 0 with *out set, or -1 with the message printed (exit 2). */
#define CLI_QUANT_HELP                                                                                          \
    "weights of the matrix products: bf16 = as the checkpoint stores them (an FP8 checkpoint: FP8 on CUDA, "    \
    "dequantized on the CPU), q8_0 | q4_0 = quantized at load, 8 / 4.5 bits per weight (CPU only; "           \
    "docs/cpu-kernels.md), fp8 = E4M3 with a scale per output channel (CUDA only; docs/gpu.md) [bf16]"
int  cli_quant_parse(const char *name, enum dtype *out);

#endif /* UM_CLI_TP_CLI_H */
