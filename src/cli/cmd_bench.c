/*
 * cmd_bench.c — `unmask bench`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_bench(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask bench' is not implemented yet\n");
    return 1;
}
