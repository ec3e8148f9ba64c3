/*
 * decode_flags.h — the decode parameters as command-line flags, made from the one parameter table
 * (decode/event_json.h): --gen-length N, --block-length N, --decoder NAME, --temperature X,
 * --no-stop-at-eos, ... A command adds them to its arg_spec list, parses, and turns what was given
 * into the same JSON object a request would carry, so the CLI reads, settles and validates its
 * parameters exactly as the WebSocket and HTTP APIs do.
 * Not here: other flags of the commands. Main thread.
 */
#ifndef UM_DECODE_FLAGS_H
#define UM_DECODE_FLAGS_H

#include <jansson.h>

#include "cli/args.h"
#include "decode/event_json.h"

typedef struct decode_flags {
    const char *value[DECODE_PARAMS_MAX];  /* valued flags: the text given, or NULL */
    int         set[DECODE_PARAMS_MAX];    /* valueless (boolean) flags: 1 when given */
} decode_flags;

/* Appends one arg_spec per decode parameter to specs[*n ..] (the caller leaves room for
 * decode_param_count() more entries), pointing into f (zeroed by the caller). */
void decode_flags_specs(decode_flags *f, arg_spec *specs, int *n);

/* The flags given as a JSON object of decode parameters (canonical names; new reference), or NULL
 * after printing "error: --flag expects ..." when a value is not a number of the right kind. */
json_t *decode_flags_to_json(const decode_flags *f);

#endif /* UM_DECODE_FLAGS_H */
