/*
 * cmd_detokenize.c — `unmask detokenize`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask detokenize' is not implemented yet\n");
    return 1;
}
