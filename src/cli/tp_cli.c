/*
 * tp_cli.c — open the model_ctx of a CLI subcommand, with or without --tp (tp_cli.h): one backend +
 * fit check + ctx, or a tensor-parallel group (model/model_tp.h) whose leader is the ctx; and the
 * --cpu-kernels and --quant flags every model-running subcommand shares; the process-wide start (cli_process_init).
 * Does not: parse flags, load the model, run forwards (the subcommands do). Main thread.
 */
#include "cli/tp_cli.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "util/fault.h"
#include "util/log.h"

int cli_model_ctx_open(cli_model_ctx *c, const model *m, const char *device, int tp, int threads, uint64_t fit_tokens,
                       uint64_t kv_rows, um_err *err) {
    memset(c, 0, sizeof *c);
    if (!device) device = "cpu";
    if (tp < 1 || tp > MODEL_TP_MAX_LOCAL)
        return um_err_param(err, "tp", "--tp must be in [1, %d], got %d", MODEL_TP_MAX_LOCAL, tp);
    if (dtype_is_quant(m->quant) && strcmp(device, "cpu") != 0)   /* before a GPU is opened (or found missing) */
        return um_err_param(err, "quant",
                            "--quant %s: GPUs have no kernels for quantized weights yet; use --quant bf16 with --device %s "
                            "(quantized weights run on the CPU)",
                            model_quant_name(m->quant), device);
    if (m->quant == DTYPE_F8_E4M3 && strcmp(device, "cpu") == 0)   /* before the weights are uploaded */
        return um_err_param(err, "quant", "--quant fp8 needs a CUDA device (Hopper FP8 weights); on the CPU use q8_0 or "
                            "q4_0");
    if (tp == 1) {
        if (strchr(device, ','))
            return um_err_param(err, "device", "--device %s lists several GPUs: this command runs one model (add --tp N "
                                "to split it over them)", device);
        c->be = backend_init_device(device, threads, err);
        if (!c->be) return -1;
        if (model_quant_check(m, c->be, err) != 0 || model_fit_check(c->be, m, 1, fit_tokens, 0, kv_rows, err) != 0 ||
            model_ctx_init(&c->own, m, c->be, err) != 0) {
            backend_free(c->be);
            c->be = NULL;
            return -1;
        }
        c->ctx = &c->own;
        return 0;
    }
    model_tp_opts o = {.tp = tp, .n_local = tp, .fit_tokens = fit_tokens, .fit_kv_rows = kv_rows, .dist = {.nnodes = 1}};
    int per = 0;
    if (threads > 0) per = (threads + tp - 1) / tp;
    else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        per = cores > tp ? (int)(cores / tp) : 1;
    }
    o.n_threads = per;
    if (strcmp(device, "cpu") == 0) {
        for (int i = 0; i < tp; i++) snprintf(c->devs[i], sizeof c->devs[i], "cpu");
    } else if (strcmp(device, "cuda") == 0) {
        for (int i = 0; i < tp; i++) snprintf(c->devs[i], sizeof c->devs[i], "cuda:%d", i);
    } else {
        int n = 0;
        for (const char *p = device; *p;) {
            size_t k = strcspn(p, ",");
            if (n < tp) snprintf(c->devs[n], sizeof c->devs[n], "%.*s", (int)k, p);
            if (n < tp && backend_device_parse(c->devs[n], NULL) != 1)
                return um_err_param(err, "device", "--device: '%s' is not a GPU (expected cpu, cuda or cuda:0,cuda:1,...)",
                                    c->devs[n]);
            n++;
            p += k + (p[k] == ',');
        }
        if (n != tp)
            return um_err_param(err, "tp", "--tp %d needs %d GPUs but --device %s lists %d", tp, tp, device, n);
        for (int i = 0; i < tp; i++)
            for (int j = 0; j < i; j++)
                if (backend_device_same(c->devs[i], c->devs[j]))
                    return um_err_param(err, "device", "--device %s: %s appears twice; each --tp rank needs its own GPU",
                                        device, c->devs[i]);
    }
    for (int i = 0; i < tp; i++) o.devices[i] = c->devs[i];
    c->tp = model_tp_create(m, &o, err);
    if (!c->tp) return -1;
    c->ctx = model_tp_leader(c->tp);
    return 0;
}

void cli_model_ctx_close(cli_model_ctx *c) {
    if (c->tp) model_tp_free(c->tp);
    else if (c->ctx) model_ctx_free(&c->own);
    if (c->be) backend_free(c->be);
    memset(c, 0, sizeof *c);
}

int cli_model_ctx_exit_code(const um_err *err) {
    return err->param[0] ? 2 : 1;
}

int cli_process_init(void) {
    um_err err = {0};
    if (fault_init_env(&err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 2;
    }
    backend_cpu_probe();
    return 0;
}

int cli_cpu_kernels_apply(const char *name) {
    if (!name) return 0;
    enum backend_cpu_kernels k;
    um_err err = {0};
    if (backend_cpu_kernels_parse(name, &k) != 0) {
        fprintf(stderr, "error: --cpu-kernels: unknown kernel path '%s' (auto, amx, avx512bf16, avx2, fp32)\n", name);
        return -1;
    }
    if (backend_cpu_kernels_select(k, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int cli_backend_options_apply(const char *cpu_pin, const char *cuda_fuse, const char *cuda_skinny) {
    backend_options o = {0};
    if (cpu_pin && strcmp(cpu_pin, "on") != 0 && strcmp(cpu_pin, "off") != 0) {
        fprintf(stderr, "error: --cpu-pin must be on or off, got '%s'\n", cpu_pin);
        return -1;
    }
    o.cpu_pin = cpu_pin && strcmp(cpu_pin, "on") == 0;
    if (cuda_fuse && strcmp(cuda_fuse, "on") != 0 && strcmp(cuda_fuse, "off") != 0) {
        fprintf(stderr, "error: --cuda-fuse must be on or off, got '%s'\n", cuda_fuse);
        return -1;
    }
    o.cuda_unfused = cuda_fuse && strcmp(cuda_fuse, "off") == 0;
    if (cuda_skinny && strcmp(cuda_skinny, "on") != 0 && strcmp(cuda_skinny, "off") != 0) {
        fprintf(stderr, "error: --cuda-skinny must be on or off, got '%s'\n", cuda_skinny);
        return -1;
    }
    o.cuda_skinny = cuda_skinny && strcmp(cuda_skinny, "on") == 0;
    backend_options_select(&o);
    return 0;
}

int cli_cpu_kernels_take(int *argc, char **argv) {
    for (int i = 1; i < *argc; i++) {
        int k = strcmp(argv[i], "--cpu-kernels") == 0 ? 2 : strncmp(argv[i], "--cpu-kernels=", 14) == 0 ? 1 : 0;
        if (!k) continue;
        if (k == 2 && i + 1 >= *argc) {
            fprintf(stderr, "error: --cpu-kernels needs a value (auto, amx, avx512bf16, avx2, fp32)\n");
            return -1;
        }
        if (cli_cpu_kernels_apply(k == 2 ? argv[i + 1] : argv[i] + 14) != 0) return -1;
        memmove(argv + i, argv + i + k, (size_t)(*argc - i - k + 1) * sizeof *argv);   /* keeps argv[argc] = NULL */
        *argc -= k;
        i--;
    }
    return 0;
}

int cli_quant_parse(const char *name, enum dtype *out) {
    *out = DTYPE_BF16;
    if (!name) return 0;
    if (model_quant_parse(name, out) != 0) {
        fprintf(stderr, "error: --quant: unknown weight type '%s' (%s)\n", name, MODEL_QUANT_NAMES);
        return -1;
    }
    return 0;
}
