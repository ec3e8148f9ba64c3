/*
 * jsonl.c — the --jsonl line loop of tokenize / detokenize (jsonl.h). Main thread.
 */
#include "cli/jsonl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"
#include "util/fileio.h"

int cli_jsonl_each(const char *path, size_t max_bytes, size_t flags, cli_jsonl_fn fn, void *user) {
    char *buf;
    size_t len;
    um_err err = {0};
    if (file_read_all(path, max_bytes, &buf, &len, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    size_t pos = 0, line_no = 0;
    int rc = 0;
    while (pos < len && rc == 0) {
        char *nl = memchr(buf + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - buf) : len;
        line_no++;
        json_error_t je;
        json_t *j = json_loadb(buf + pos, end - pos, flags, &je);
        pos = end + 1;
        rc = fn(user, j, line_no) != 0;
        json_decref(j);
    }
    free(buf);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}
