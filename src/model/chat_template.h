/*
 * chat_template.h — render a checkpoint's chat_template (Jinja subset). STUB: the tokenizer issue
 * replaces this with the real interpreter; these are the functions model.c relies on.
 */
#ifndef UM_CHAT_TEMPLATE_H
#define UM_CHAT_TEMPLATE_H

#include "model/tokenizer.h"
#include "util/err.h"

typedef struct chat_template chat_template;

/* Load tokenizer_config.json's chat_template from dir; *out = NULL when there is none. */
int  chat_template_load_dir(const char *dir, const tokenizer *tok, chat_template **out, um_err *err);
void chat_template_free(chat_template *t);

#endif /* UM_CHAT_TEMPLATE_H */
