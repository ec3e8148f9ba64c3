/*
 * cmd_quantize.c — `unmask quantize`: a float32 matrix (.npy [rows, cols]) quantized to Q8_0 or
 * Q4_0 the way weights are quantized at load (util/quant.h), written as the raw bytes of its blocks
 * (the bytes a GGUF tensor of that type holds: rows x cols / 32 blocks of 34 / 18 bytes); with --x,
 * activations x [n, cols] multiplied by it on the CPU backend's quantized kernels (y = x · Wᵀ, the
 * weight uploaded and quantized as a model's matrices are). For the NumPy reference test of the
 * quantization and people checking numerics, like `unmask logits`.
 * Does not: convert checkpoints. Main thread (+ the backend's pool).
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
#include "util/quant.h"

/* The blocks of every row of w [rows, cols] to path. 0, or 1 with the message printed. */
static int write_blocks(const char *path, enum dtype t, const float *w, int64_t rows, int64_t cols) {
    const size_t rb = dtype_row_bytes(t, cols);
    uint8_t *row = xmalloc(rb);
    FILE *fp = fopen(path, "wb");
    int ok = fp != NULL;
    for (int64_t r = 0; ok && r < rows; r++) {
        quant_row_quantize(t, w + r * cols, row, cols);
        ok = fwrite(row, 1, rb, fp) == rb;
    }
    if (fp && fclose(fp) != 0) ok = 0;
    free(row);
    if (!ok) fprintf(stderr, "error: %s: cannot write the blocks\n", path);
    return ok ? 0 : 1;
}

/* y = x · Wᵀ on the CPU backend with W quantized to t at upload. 0, or 1 with the message printed. */
static int product(const char *x_path, const char *y_path, enum dtype t, const float *w, int64_t rows, int64_t cols,
                   int threads) {
    float *x = NULL;
    int nd = 0, rc = 1;
    int64_t shape[NPY_MAX_DIMS];
    um_err err = {0};
    if (npy_read_f32(x_path, &x, &nd, shape, &err) != 0) {
        fprintf(stderr, "error: --x: %s\n", err.msg);
        return 1;
    }
    if (nd != 2 || shape[1] != cols || shape[0] < 1) {
        fprintf(stderr, "error: --x must be [n, %lld], n >= 1 (the weight's columns)\n", (long long)cols);
        free(x);
        return 1;
    }
    const int64_t n = shape[0];
    backend *be = backend_cpu_init(threads);
    bweight_src src = {.name = "quantize --in", .data = w, .type = DTYPE_F32, .rows = rows, .cols = cols, .quant = t};
    bweight bw;
    if (backend_weight_upload(be, &src, &bw, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
    } else {
        float *xa = backend_act_alloc(be, (size_t)(n * cols)), *ya = backend_act_alloc(be, (size_t)(n * rows));
        memcpy(xa, x, (size_t)(n * cols) * sizeof *x);
        backend_matmul(be, xa, &bw, NULL, (int)n, ya);
        float *y = xmalloc((size_t)(n * rows) * sizeof *y);
        backend_act_to_host(be, ya, (size_t)(n * rows), y);
        const int64_t yshape[2] = {n, rows};
        if (npy_write_f32(y_path, y, 2, yshape, &err) != 0) fprintf(stderr, "error: %s\n", err.msg);
        else rc = 0;
        free(y);
        backend_act_free(be, xa);
        backend_act_free(be, ya);
        backend_weight_free(be, &bw);
    }
    backend_free(be);
    free(x);
    return rc;
}

int cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *type_s = NULL, *out = NULL, *x_s = NULL, *y_s = NULL, *cpu_kernels = NULL;
    int threads = 0;
    arg_spec specs[] = {
        {"in", ARG_STR, &in, "float32 .npy matrix [rows, cols], cols a multiple of 32 [required]"},
        {"type", ARG_STR, &type_s, "q8_0 | q4_0 [required]"},
        {"out", ARG_STR, &out, "file for the blocks' bytes (rows x cols/32 blocks, GGUF layout)"},
        {"x", ARG_STR, &x_s, "float32 .npy activations [n, cols] to multiply (needs --y)"},
        {"y", ARG_STR, &y_s, "output .npy [n, rows] = x . W^T on the quantized CPU kernels"},
        {"threads", ARG_INT, &threads, "CPU threads (0 = all cores) [0]"},
        {"cpu-kernels", ARG_STR, &cpu_kernels, CLI_CPU_KERNELS_HELP},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv,
                       "usage: unmask quantize --in W.npy --type q8_0|q4_0 [--out BLOCKS.bin] [--x X.npy --y Y.npy]\n\n"
                       "Quantizes a float32 matrix as the CPU backend quantizes weights at load (--quant) and writes\n"
                       "its blocks; with --x, multiplies by it on the quantized kernels. UNMASK_CPU_QKERNELS picks\n"
                       "the int8 kernel family (auto, avx512vnni, avxvnni, avx2, scalar).",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (cli_cpu_kernels_apply(cpu_kernels) != 0) return 2;
    enum dtype t;
    if (!in || !type_s || (!out && !x_s)) {
        fprintf(stderr, "error: --in, --type and --out or --x are required (see --help)\n");
        return 2;
    }
    if (model_quant_parse(type_s, &t) == 0 && t == DTYPE_F8_E4M3) {
        fprintf(stderr, "error: --type fp8: quantize writes the CPU's Q8_0 / Q4_0 blocks; FP8 weights come from an FP8 "
                        "checkpoint (make-model --fp8) or --quant fp8 at load on a CUDA device\n");
        return 2;
    }
    if (model_quant_parse(type_s, &t) != 0 || !dtype_is_quant(t)) {
        fprintf(stderr, "error: --type must be q8_0 or q4_0, got '%s'\n", type_s);
        return 2;
    }
    if (!!x_s != !!y_s || threads < 0) {
        fprintf(stderr, "error: --x and --y go together; --threads must be >= 0\n");
        return 2;
    }
    float *w = NULL;
    int nd = 0;
    int64_t shape[NPY_MAX_DIMS];
    um_err err = {0};
    if (npy_read_f32(in, &w, &nd, shape, &err) != 0) {
        fprintf(stderr, "error: --in: %s\n", err.msg);
        return 1;
    }
    int rc = 2;
    if (nd != 2 || shape[0] < 1 || shape[1] < 1 || shape[1] % DTYPE_QBLOCK != 0)
        fprintf(stderr, "error: --in must be a matrix [rows, cols] with cols a multiple of %d\n", DTYPE_QBLOCK);
    else
        rc = (out ? write_blocks(out, t, w, shape[0], shape[1]) : 0) ||
             (x_s ? product(x_s, y_s, t, w, shape[0], shape[1], threads) : 0);
    free(w);
    return rc;
}
