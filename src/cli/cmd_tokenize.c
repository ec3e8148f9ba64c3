/*
 * cmd_tokenize.c — `unmask tokenize`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask tokenize' is not implemented yet\n");
    return 1;
}
