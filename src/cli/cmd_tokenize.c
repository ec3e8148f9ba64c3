/*
 * cmd_tokenize.c — `unmask tokenize`: print the token ids of a text (--text, --file or stdin) or
 * of a chat rendered through the model's chat template (--chat messages.json). Ids are printed
 * comma-separated on one line, or one "id<TAB>piece" per line with --verbose; --render prints the
 * rendered chat text instead of ids.
 * Does not: load weights (only the tokenizer files of --model), add BOS/EOS beyond what the chat
 * template writes. Main thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/jsonl.h"
#include "model/gguf.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "util/fileio.h"
#include "util/log.h"

#define INPUT_MAX_BYTES ((size_t)1 << 30)

static int read_stdin(char **out, size_t *out_len) {
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) {
            if (cap >= INPUT_MAX_BYTES) {
                free(buf);
                fprintf(stderr, "error: stdin is larger than %zu bytes\n", INPUT_MAX_BYTES);
                return -1;
            }
            cap *= 2;
            buf = xrealloc(buf, cap + 1);
        }
        size_t n = fread(buf + len, 1, cap - len, stdin);
        len += n;
        if (n == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        fprintf(stderr, "error: reading stdin: %s\n", strerror(errno));
        return -1;
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return 0;
}

/* --chat file: a JSON array of messages, or {"messages": [...], "add_generation_prompt": bool, ...}
 * (then every key becomes a template variable). */
static int render_chat(const char *dir, const chat_template *tmpl, const char *path, int no_gen, char **text,
                       um_err *err) {
    if (!tmpl)
        return um_err_set(err, UM_ERR_INVALID_ARG, "%s: no chat template (tokenizer_config.json's chat_template, or a "
                          "GGUF file's tokenizer.chat_template)", dir);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    int rc;
    if (!j) {
        rc = um_err_param(err, "chat", "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    } else if (json_is_array(j)) {
        rc = chat_template_render(tmpl, j, !no_gen, text, err);
    } else if (json_is_object(j) && json_is_array(json_object_get(j, "messages"))) {
        if (!json_object_get(j, "add_generation_prompt"))
            json_object_set_new(j, "add_generation_prompt", json_boolean(!no_gen));
        rc = chat_template_render_vars(tmpl, j, text, err);
    } else {
        rc = um_err_param(err, "chat", "%s: expected an array of {role, content} messages", path);
    }
    json_decref(j);
    return rc;
}

static void print_ids(const tokenizer *tok, const int32_t *ids, size_t n, int verbose) {
    for (size_t i = 0; i < n; i++) {
        if (verbose) printf("%d\t%s\n", ids[i], tokenizer_token_piece(tok, ids[i]));
        else printf(i ? ",%d" : "%d", ids[i]);
    }
    if (!verbose) printf("\n");
}

/* What a tokenize --jsonl line needs. */
typedef struct tok_jsonl {
    const tokenizer *tok;
    const char      *path;
    int              no_special, lossy;
} tok_jsonl;

/* One --jsonl line: a JSON string in, a line of ids out. 0, or 1 with the message printed. */
static int tokenize_line(void *user, const json_t *j, size_t line_no) {
    const tok_jsonl *t = user;
    if (!json_is_string(j)) {
        fprintf(stderr, "error: %s:%zu: expected a JSON string per line\n", t->path, line_no);
        return 1;
    }
    um_err err = {0};
    const char *s = json_string_value(j);
    size_t sl = json_string_length(j);
    char *clean = NULL;
    if (t->lossy) s = clean = utf8_sanitize(s, sl, &sl);
    int32_t *ids;
    size_t n;
    int rc = 0;
    if (tokenizer_encode(t->tok, s, sl, !t->no_special, &ids, &n, &err) != 0) {
        fprintf(stderr, "error: %s:%zu: %s\n", t->path, line_no, err.msg);
        rc = 1;
    } else {
        print_ids(t->tok, ids, n, 0);
        free(ids);
    }
    free(clean);
    return rc;
}

/* --jsonl: one JSON string per line in, one line of ids per line out (many texts, one load). */
static int tokenize_jsonl(const tokenizer *tok, const char *path, int no_special, int lossy) {
    tok_jsonl t = {tok, path, no_special, lossy};
    return cli_jsonl_each(path, INPUT_MAX_BYTES, JSON_DECODE_ANY | JSON_ALLOW_NUL, tokenize_line, &t);
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text_arg = NULL, *file = NULL, *chat = NULL, *jsonl = NULL;
    int no_special = 0, verbose = 0, lossy = 0, render = 0, no_gen = 0;
    arg_spec specs[] = {
        {"model", ARG_STR, &dir, "checkpoint directory (tokenizer.json or vocab.json + merges.txt) or GGUF file [required]"},
        {"text", ARG_STR, &text_arg, "text to tokenize (default: --file, else stdin)"},
        {"file", ARG_STR, &file, "read the text from this file"},
        {"jsonl", ARG_STR, &jsonl, "file of JSON strings, one per line: print one id line for each"},
        {"chat", ARG_STR, &chat, "JSON file of messages, rendered with the model's chat template"},
        {"no-generation-prompt", ARG_FLAG, &no_gen, "--chat: add_generation_prompt = false"},
        {"render", ARG_FLAG, &render, "--chat: print the rendered text instead of ids"},
        {"no-special", ARG_FLAG, &no_special, "do not recognise special tokens in the text"},
        {"lossy", ARG_FLAG, &lossy, "replace invalid UTF-8 by U+FFFD instead of failing"},
        {"verbose", ARG_FLAG, &verbose, "one 'id<TAB>piece' line per token"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv, "usage: unmask tokenize --model DIR [--text T | --file F | --chat M.json] [options]",
                       specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!dir) {
        fprintf(stderr, "error: --model DIR is required\n");
        return 2;
    }
    if ((text_arg != NULL) + (file != NULL) + (chat != NULL) + (jsonl != NULL) > 1) {
        fprintf(stderr, "error: give only one of --text, --file, --chat, --jsonl\n");
        return 2;
    }
    if (render && !chat) {
        fprintf(stderr, "error: --render needs --chat\n");
        return 2;
    }
    um_err err = {0};
    tokenizer *tok = NULL;
    chat_template *tmpl = NULL;
    int lrc;
    if (gguf_path_is_gguf(dir)) {
        lrc = model_tokenizer_load(dir, &tok, chat ? &tmpl : NULL, &err);
    } else {   /* --render needs only the template */
        lrc = !render ? tokenizer_load_dir(dir, &tok, &err) : 0;
        if (lrc == 0 && chat) lrc = chat_template_load_dir(dir, tok, &tmpl, &err);
    }
    if (lrc != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        tokenizer_free(tok);
        return 1;
    }
    if (!tok && !render) {
        fprintf(stderr, "error: %s: no tokenizer files (tokenizer.json or vocab.json + merges.txt; in a GGUF file "
                        "tokenizer.ggml.*)\n", dir);
        chat_template_free(tmpl);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    int rc = 1;
    if (jsonl) {
        rc = tokenize_jsonl(tok, jsonl, no_special, lossy);
        goto out;
    }
    if (chat) {
        if (render_chat(dir, tmpl, chat, no_gen, &text, &err) != 0) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto out;
        }
        len = strlen(text);
        if (render) {
            fwrite(text, 1, len, stdout);
            rc = 0;
            goto out;
        }
    } else if (text_arg) {
        text = xstrdup(text_arg);
        len = strlen(text);
    } else if (file) {
        if (file_read_all(file, INPUT_MAX_BYTES, &text, &len, &err) != 0) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto out;
        }
    } else if (read_stdin(&text, &len) != 0) {
        goto out;
    }
    if (lossy) {
        size_t nl;
        char *clean = utf8_sanitize(text, len, &nl);
        free(text);
        text = clean, len = nl;
    }
    int32_t *ids;
    size_t n;
    if (tokenizer_encode(tok, text, len, !no_special, &ids, &n, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    print_ids(tok, ids, n, verbose);
    free(ids);
    rc = fflush(stdout) == 0 ? 0 : 1;
out:
    free(text);
    chat_template_free(tmpl);
    tokenizer_free(tok);
    return rc;
}
