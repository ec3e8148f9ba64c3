/*
 * fuzz_chat_template.c — libFuzzer target: chat_template_load_string + chat_template_render on a
 * fuzzed template source (a checkpoint's tokenizer_config.json is untrusted) with fixed messages,
 * tools and documents. Whatever the template does, the interpreter's limits (output, loop steps,
 * memory, nesting) must end it with an error, never a crash, a hang or unbounded recursion.
 * Input: the template source (up to the first NUL).
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat_template.h"
#include "util/log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"You are helpful.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 <|eot_id|> {{ x }}\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\":"
    "   {\"name\": \"get\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"{\\\"t\\\": 21}\", \"tool_call_id\": \"c1\"},"
    " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"part\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"d\","
    "   \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"documents\": [{\"title\": \"t\", \"text\": \"x\"}], \"add_generation_prompt\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static json_t *vars, *msgs;
    if (!vars) {
        log_level_set(LOG_LEVEL_ERROR);
        json_error_t je;
        vars = json_loads(VARS, 0, &je);
        if (!vars) abort();
        msgs = json_object_get(vars, "messages");
    }
    char *src = malloc(size + 1);
    memcpy(src, data, size);
    src[size] = 0;
    chat_template *t = NULL;
    um_err err = {0};
    int rc = chat_template_load_string(src, "<s>", size & 1 ? "</s>" : NULL, &t, &err);
    free(src);
    if (rc != 0) {
        if (t) abort();
        return 0;
    }
    for (int agp = 0; agp < 2; agp++) {
        char *out = NULL;
        if (chat_template_render(t, msgs, agp, &out, &err) == 0) {
            if (!out) abort();
            free(out);
        } else if (out) {
            abort(); /* an error leaves no output behind */
        }
    }
    char *out = NULL;
    if (chat_template_render_vars(t, vars, &out, &err) == 0) free(out);
    chat_template_free(t);
    return 0;
}
