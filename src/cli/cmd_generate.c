/*
 * cmd_generate.c — `unmask generate`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_generate(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask generate' is not implemented yet\n");
    return 1;
}
