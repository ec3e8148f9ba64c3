/*
 * chat_template.h — render a checkpoint's chat_template (the Jinja subset HF templates use:
 * for/if/elif/else/set, loop.*, + and ~, comparisons, in/not/and/or, subscripts and attributes,
 * filters trim/length/upper/lower/default/tojson/..., whitespace control, raise_exception).
 *
 * Not here: tokenizing the rendered text (tokenizer_encode with parse_special = 1), macros, call
 * blocks, imports. Unsupported syntax fails at load time with UM_ERR_UNSUPPORTED naming the
 * construct — never a silently different prompt.
 *
 * Threads: a loaded template is immutable; render may run on any thread concurrently.
 */
#ifndef UM_CHAT_TEMPLATE_H
#define UM_CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "util/err.h"

typedef struct chat_template chat_template;

/* Load tokenizer_config.json's chat_template from dir (a string, or a list of {name, template}
 * where "default" is taken); bos_token/eos_token come from tok's config. *out = NULL when there is
 * none. tok may be NULL. */
int  chat_template_load_dir(const char *dir, const tokenizer *tok, chat_template **out, um_err *err);
/* Compile a template source string; bos/eos (may be NULL = undefined) become bos_token/eos_token. */
int  chat_template_load_string(const char *src, const char *bos_token, const char *eos_token,
                               chat_template **out, um_err *err);
/* Free a loaded template (NULL: no-op). No render may still be running on it. */
void chat_template_free(chat_template *t);

/* Render with messages (a JSON array of {role, content, ...} objects) and add_generation_prompt.
 * *out is malloc'd, NUL-terminated (caller frees). Errors -> -1: UM_ERR_INVALID_ARG for bad
 * messages and template errors (raise_exception's message, type errors), UM_ERR_UNSUPPORTED for a
 * method/function the interpreter lacks, UM_ERR_RESOURCE past the limits (16 MB of output, 1M
 * loop iterations, 256 MB of working memory). */
int chat_template_render(const chat_template *t, const json_t *messages, int add_generation_prompt,
                         char **out, um_err *err);
/* Render messages (add_generation_prompt) and encode the prompt for tok: the template's text with
 * special tokens recognised, the messages' contents never — a content that spells "<|eot_id|>"
 * stays plain text and cannot end a turn or open a system message (chat injection). When no
 * content spells a special token this is exactly tokenizer_encode(render(...), parse_special 1),
 * HF's apply_chat_template + encode. *ids is malloc'd (caller frees). Errors: as for
 * chat_template_render and tokenizer_encode; UM_ERR_INVALID_ARG (param "messages") when such a
 * content is changed by the template other than by trimming (it could not be kept plain). */
int chat_template_encode(const chat_template *t, const tokenizer *tok, const json_t *messages,
                         int add_generation_prompt, int32_t **ids, size_t *n, um_err *err);
/* Render with an arbitrary variable context (a JSON object: messages, add_generation_prompt,
 * tools, ...); bos_token/eos_token are added unless vars sets them. */
int chat_template_render_vars(const chat_template *t, const json_t *vars, char **out, um_err *err);

#endif /* UM_CHAT_TEMPLATE_H */
