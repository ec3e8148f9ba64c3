/*
 * jsonl.h — the --jsonl loop that tokenize and detokenize share: a file read whole, one JSON value
 * per line handed to a callback, stdout flushed at the end. Does not: know what a line means.
 * Main thread.
 */
#ifndef UM_CLI_JSONL_H
#define UM_CLI_JSONL_H

#include <stddef.h>

#include <jansson.h>

/* One line's value (NULL when the line is not JSON; freed after the call) and its 1-based number.
 * 0 to go on, else the exit code (the loop stops). */
typedef int (*cli_jsonl_fn)(void *user, const json_t *j, size_t line_no);

/* Reads path (at most max_bytes) and calls fn for each line, parsed with json_loadb(flags).
 * Returns 0, or 1 when the file cannot be read (message printed), a line failed, or stdout could
 * not be flushed. */
int cli_jsonl_each(const char *path, size_t max_bytes, size_t flags, cli_jsonl_fn fn, void *user);

#endif /* UM_CLI_JSONL_H */
