/*
 * chat_template.c — STUB until the Jinja-subset interpreter lands: reports "no template".
 */
#include "model/chat_template.h"

int chat_template_load_dir(const char *dir, const tokenizer *tok, chat_template **out, um_err *err) {
    (void)dir, (void)tok, (void)err;
    *out = NULL;
    return 0;
}
int chat_template_load_string(const char *src, const char *bos_token, const char *eos_token,
                              chat_template **out, um_err *err) {
    (void)src, (void)bos_token, (void)eos_token;
    *out = NULL;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "chat templates not implemented yet");
}
void chat_template_free(chat_template *t) { (void)t; }
int chat_template_render(const chat_template *t, const json_t *messages, int add_generation_prompt,
                         char **out, um_err *err) {
    (void)t, (void)messages, (void)add_generation_prompt;
    *out = NULL;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "chat templates not implemented yet");
}
int chat_template_render_vars(const chat_template *t, const json_t *vars, char **out, um_err *err) {
    (void)t, (void)vars;
    *out = NULL;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "chat templates not implemented yet");
}
