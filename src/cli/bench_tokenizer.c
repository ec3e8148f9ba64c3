/*
 * bench_tokenizer.c — `unmask bench --tokenizer`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/bench.h"

int bench_tokenizer(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask bench --tokenizer' is not implemented yet\n");
    return 1;
}
