/*
 * jinja.h — a small Jinja2 interpreter for chat templates, with the settings transformers uses
 * (trim_blocks, lstrip_blocks, no autoescape, loopcontrols, a trailing newline dropped).
 *
 * Supported: text, {{ }}, {% if/elif/else %}, {% for a[, b] in x [if c] %}..{% else %}, {% set %}
 * (names, namespace attributes, block set), {% break/continue %}, {% generation %}, comments,
 * whitespace control (- and +); literals (strings with Python escapes, ints, floats, lists,
 * dicts, tuples, true/false/none); + - * / // % ** ~, comparisons, in / not in, and/or/not,
 * x if c else y, subscripts and slices, attributes, calls, filters and tests (see jinja.c for the
 * list), string/dict methods, globals raise_exception, range, namespace, dict, strftime_now.
 * Not supported (compile error UM_ERR_UNSUPPORTED naming the construct): macro, call, filter
 * blocks, include/import/extends/block, raw, with, unknown filters/tests.
 *
 * Threads: a compiled template is immutable; jinja_render allocates its own state; any thread.
 */
#ifndef UM_JINJA_H
#define UM_JINJA_H

#include <jansson.h>

#include "util/err.h"

typedef struct jinja_tmpl jinja_tmpl;

/* Parse src[0..len) into *out (caller frees with jinja_free). -1 + err naming the line:
 * UM_ERR_FORMAT for a syntax error, UM_ERR_UNSUPPORTED for a construct outside the subset above or
 * nesting past the parser's depth limit. Safe on arbitrary bytes (fuzzed). */
int  jinja_compile(const char *src, size_t len, jinja_tmpl **out, um_err *err);
/* Free a compiled template (NULL: no-op). */
void jinja_free(jinja_tmpl *t);
/* Render with the variables of a JSON object. *out: malloc'd, NUL-terminated. Errors
 * (raise_exception, type errors, limits) -> -1 with err. */
int  jinja_render(const jinja_tmpl *t, const json_t *vars, char **out, um_err *err);

#endif /* UM_JINJA_H */
