/*
 * cmd_detokenize.c — `unmask detokenize`: print the text of comma-separated token ids, exactly
 * (no newline added; invalid UTF-8 shown as U+FFFD as HF decode does). Ids outside the vocabulary
 * are an error. Does not: load weights. Main thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/jsonl.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "util/fileio.h"
#include "util/log.h"

/* What a detokenize --jsonl line needs. */
typedef struct detok_jsonl {
    const tokenizer *tok;
    const char      *path;
    int              skip;   /* --skip-special */
} detok_jsonl;

/* One --jsonl line: a JSON array of this tokenizer's ids in, its text as a JSON string out. 0, or 1
 * with the message printed. */
static int detokenize_line(void *user, const json_t *j, size_t line_no) {
    const detok_jsonl *d = user;
    int rc = 0;
    size_t n = json_array_size(j);
    int32_t *ids = xmalloc((n + 1) * sizeof *ids);
    if (!json_is_array(j)) rc = 1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *v = json_array_get(j, i);
        size_t bl;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7FFFFFFF ||
            !tokenizer_token_bytes(d->tok, (int)json_integer_value(v), &bl))
            rc = 1;
        else
            ids[i] = (int32_t)json_integer_value(v);
    }
    if (rc) {
        fprintf(stderr, "error: %s:%zu: expected a JSON array of token ids of this tokenizer\n", d->path, line_no);
    } else {
        char *text;
        size_t tl;
        tokenizer_decode(d->tok, ids, n, d->skip, &text, &tl);
        json_t *s = json_stringn(text, tl);
        char *out = json_dumps(s, JSON_ENCODE_ANY);
        printf("%s\n", out);
        free(out);
        json_decref(s);
        free(text);
    }
    free(ids);
    return rc;
}

/* --jsonl: one JSON array of ids per line in, one JSON string per line out. */
static int detokenize_jsonl(const tokenizer *tok, const char *path, int skip) {
    detok_jsonl d = {tok, path, skip};
    return cli_jsonl_each(path, (size_t)1 << 30, 0, detokenize_line, &d);
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *jsonl = NULL;
    int skip = 0;
    arg_spec specs[] = {
        {"model", ARG_STR, &dir, "checkpoint directory (tokenizer.json or vocab.json + merges.txt) or GGUF file [required]"},
        {"ids", ARG_STR, &ids_s, "comma-separated token ids [required]"},
        {"jsonl", ARG_STR, &jsonl, "file with a JSON array of ids per line: print a JSON string for each"},
        {"skip-special", ARG_FLAG, &skip, "drop special tokens"},
        {NULL, 0, NULL, NULL},
    };
    int r = args_parse(argc, argv, "usage: unmask detokenize --model DIR --ids 1,2,3 [--skip-special]", specs);
    if (r != 0) return r > 0 ? 0 : 2;
    if (!dir || (!ids_s) == (!jsonl)) {
        fprintf(stderr, "error: --model DIR and one of --ids LIST / --jsonl FILE are required\n");
        return 2;
    }
    int *list = NULL;
    int n = 0;
    if (ids_s && *ids_s) {
        n = args_parse_int_list("ids", ids_s, &list);
        if (n < 0) return 2;
    }
    um_err err = {0};
    tokenizer *tok;
    if (model_tokenizer_load(dir, &tok, NULL, &err) != 0) {
        fprintf(stderr, "error: %s\n", err.msg);
        free(list);
        return 1;
    }
    if (!tok) {
        fprintf(stderr, "error: %s: no tokenizer files (tokenizer.json or vocab.json + merges.txt; in a GGUF file "
                        "tokenizer.ggml.*)\n", dir);
        free(list);
        return 1;
    }
    if (jsonl) {
        int jrc = detokenize_jsonl(tok, jsonl, skip);
        tokenizer_free(tok);
        return jrc;
    }
    int32_t *ids = xmalloc(((size_t)n + 1) * sizeof *ids);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        size_t bl;
        if (!tokenizer_token_bytes(tok, list[i], &bl)) {
            fprintf(stderr, "error: --ids: %d is not a token id of this tokenizer (vocabulary size %d)\n", list[i],
                    tokenizer_n_vocab(tok));
            rc = 1;
        }
        ids[i] = list[i];
    }
    if (rc == 0) {
        char *text;
        size_t len;
        tokenizer_decode(tok, ids, (size_t)n, skip, &text, &len);
        fwrite(text, 1, len, stdout);
        free(text);
        rc = fflush(stdout) == 0 ? 0 : 1;
    }
    free(ids);
    free(list);
    tokenizer_free(tok);
    return rc;
}
