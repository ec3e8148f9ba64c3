/*
 * fuzz_http_api.c — libFuzzer target: the request bodies of the HTTP generation APIs, through the
 * path server/http_api.c runs them: parse (OpenAI chat / completions, SGLang /generate, llama.cpp
 * /infill, /v1/fim/completions, jobs = chat-or-completion + webhook URL), then api_gen_build
 * against a loaded tiny model (chat template, tokenizer, infill canvas, decode validation) and the
 * response set-up (api_resp_new/begin). Errors must carry a status and serialize as the OpenAI
 * error body.
 * Input: byte 0 picks the endpoint, the rest is the body.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/algo_config.h"
#include "api/infill.h"
#include "api/openai.h"
#include "api/sglang.h"
#include "fuzz_common.h"
#include "jobs/webhook.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef int (*parse_fn)(const char *, size_t, const decode_params *, const api_limits *, api_gen *, api_error *);

static void check_error(const api_error *e) {
    if (e->status < 400 || e->status > 599 || !e->message[0]) {
        fprintf(stderr, "error without status/message: %d %s\n", e->status, e->message);
        abort();
    }
    size_t len = 0;
    char *body = oai_error_body(e, &len);
    if (!body || !len) abort();
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const model *m = fuzz_model();
    if (size < 1) return 0;
    int which = data[0] % 6;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    api_policy pol;
    api_policy_init(&pol);
    decode_params defaults = api_policy_params(&pol, m);
    api_limits lim = api_limits_default();
    api_error e = {0};
    api_gen g;
    int rc;
    json_t *jobs_obj = NULL;
    if (which == 5) { /* jobs: the body picks chat or completion */
        jobs_obj = api_parse_body(body, len, &e);
        if (!jobs_obj) {
            check_error(&e);
            return 0;
        }
        rc = (json_object_get(jobs_obj, "messages") ? openai_parse_chat : openai_parse_completion)(body, len, &defaults,
                                                                                                 &lim, &g, &e);
    } else {
        static const parse_fn fns[] = {openai_parse_chat, openai_parse_completion, sglang_parse_generate, infill_parse,
                                       infill_parse_fim};
        rc = fns[which](body, len, &defaults, &lim, &g, &e);
    }
    if (rc != 0) {
        check_error(&e);
        api_gen_free(&g);
        json_decref(jobs_obj);
        return 0;
    }
    api_seq *seqs = NULL;
    int n = 0;
    if (!g.warmup) {
        if (api_gen_build(&g, m, &lim, &seqs, &n, &e) != 0) {
            check_error(&e);
            api_gen_free(&g);
            json_decref(jobs_obj);
            return 0;
        }
        if (n < 1 || (lim.max_choices && n > lim.max_choices)) abort();
    }
    api_resp *r = api_resp_new(&g, seqs, n, m, "tiny");
    json_t *out = json_array();
    api_resp_begin(r, out);
    char *s = json_dumps(out, JSON_COMPACT);
    if (!s) abort();
    free(s);
    json_decref(out);
    if (g.warmup) {
        json_t *b = api_resp_body(r);
        s = json_dumps(b, JSON_COMPACT);
        if (!s) abort();
        free(s);
        json_decref(b);
    }
    api_resp_free(r);
    api_seqs_free(seqs, n);
    if (jobs_obj) {
        const json_t *wh = json_object_get(jobs_obj, "webhook");
        if (json_is_string(wh)) {
            webhook_url u;
            um_err ue = {0};
            (void)webhook_url_parse(json_string_value(wh), &u, &ue);
        }
        json_decref(jobs_obj);
    }
    api_gen_free(&g);
    return 0;
}
