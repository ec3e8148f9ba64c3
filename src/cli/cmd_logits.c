/*
 * cmd_logits.c — `unmask logits`. STUB: not implemented yet.
 */
#include <stdio.h>

#include "cli/cli.h"

int cmd_logits(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "error: 'unmask logits' is not implemented yet\n");
    return 1;
}
