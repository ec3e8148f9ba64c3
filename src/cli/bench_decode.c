/*
 * bench_decode.c — `unmask bench --decode`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/bench.h"

int bench_decode(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask bench --decode' is not implemented yet\n");
    return 1;
}
