/*
 * cmd_serve.c — `unmask serve`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask serve' is not implemented yet\n");
    return 1;
}
