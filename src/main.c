/*
 * main.c — the unmask binary: dispatches to a subcommand (src/cli/). Main thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

#ifndef UNMASK_VERSION
#define UNMASK_VERSION "0.1.0"
#endif

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_commands[] = {
    {"serve", cmd_serve, "run the server (WebSocket + HTTP APIs + browser UI)"},
    {"generate", cmd_generate, "generate text from a prompt on the command line"},
    {"logits", cmd_logits, "write logits for a token sequence as a .npy file"},
    {"quantize", cmd_quantize, "quantize a matrix to Q8_0 / Q4_0 blocks (and multiply by it) as the CPU does"},
    {"tokenize", cmd_tokenize, "print the token ids of a text or chat"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"make-model", cmd_make_model, "write a random-weight test checkpoint in a real layout (LLaDA, Dream, LLaDA-MoE, LLaDA2)"},
    {"bench", cmd_bench, "benchmark forward, decode, tokenizer or server"},
};

static void usage(FILE *f) {
    fprintf(f, "unmask %s — a streaming server for diffusion language models\n\n", UNMASK_VERSION);
    fprintf(f, "usage: unmask <command> [options]   (unmask <command> --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        fprintf(f, "  %-12s %s\n", k_commands[i].name, k_commands[i].help);
    fprintf(f, "  %-12s %s\n", "version", "print the version");
}

/* OpenMP (libgomp) worker threads spin for ~300k iterations before sleeping. On a machine shared
 * with other work, or beside our own service and engine threads, that spinning steals the cores
 * the computation needs (seen: 2 threads 5x slower than 1 under load). OMP_WAIT_POLICY=passive
 * costs 15-40% when the machine is idle; a short spin (GOMP_SPINCOUNT=20000) measured within
 * noise of the default. libgomp reads these variables before main() runs, so when the user set
 * neither we set the short spin and re-execute ourselves once. The OpenMP regions left: the CUDA
 * backend's host loops (the host decode loop's sampling rows) and make-model's weight fill; the
 * CPU backend runs everything, sampling included, on its own pool. */
static void omp_spin_policy_apply(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("GOMP_SPINCOUNT", "20000", 1) != 0) return;
    execv("/proc/self/exe", argv);
    /* exec failed (no /proc): carry on with libgomp's defaults */
}

int main(int argc, char **argv) {
    omp_spin_policy_apply(argv);
    const int rc = cli_process_init();
    if (rc != 0) return rc;
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("unmask %s\n", UNMASK_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
        if (strcmp(cmd, k_commands[i].name) == 0) return k_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
