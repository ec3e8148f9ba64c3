/*
 * bench_serve.c — `unmask bench --serve`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/bench.h"

int bench_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask bench --serve' is not implemented yet\n");
    return 1;
}
