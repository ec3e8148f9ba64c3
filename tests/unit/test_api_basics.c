/*
 * test_api_basics.c — pure HTTP-API building blocks: the OpenAI error object and status mapping,
 * SSE framing + the out_queue, API keys, token-bucket rate limits, the algorithm config parser
 * and the Prometheus metrics text.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "api/algo_config.h"
#include "api/api_error.h"
#include "api/sse.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/ratelimit.h"
#include "test.h"

static void test_api_error(void) {
    api_error e;
    int r = oai_error_set(&e, 400, "invalid_value", "diffusion_steps", "diffusion_steps must be between 1 and 1024, got %d",
                          2000);
    TEST_CHECK(r == -1, "returns -1");
    char *body = oai_error_body(&e, NULL);
    TEST_CHECK(strcmp(body, "{\"error\":{\"message\":\"diffusion_steps must be between 1 and 1024, got 2000\","
                            "\"type\":\"invalid_request_error\",\"param\":\"diffusion_steps\",\"code\":\"invalid_value\"}}") == 0,
               "body: %s", body);
    free(body);

    oai_error_set(&e, 500, NULL, NULL, "boom");
    body = oai_error_body(&e, NULL);
    TEST_CHECK(strstr(body, "\"param\":null") && strstr(body, "\"code\":null") && strstr(body, "\"server_error\""),
               "nulls + server_error: %s", body);
    free(body);
    TEST_CHECK(oai_error_should_retry(&e), "500 retryable");

    TEST_CHECK(strcmp(oai_error_type_for_status(401), "authentication_error") == 0, "401 type");
    TEST_CHECK(strcmp(oai_error_type_for_status(429), "rate_limit_error") == 0, "429 type");
    TEST_CHECK(strcmp(oai_error_type_for_status(404), "invalid_request_error") == 0, "404 type");
    TEST_CHECK(strcmp(oai_status_reason(413), "Payload Too Large") == 0, "413 reason");
    oai_error_set(&e, 400, NULL, NULL, "x");
    TEST_CHECK(!oai_error_should_retry(&e), "400 not retryable");

    um_err ue = {0};
    um_err_param(&ue, "top_p", "top_p must be in (0, 1], got 3");
    oai_error_from_um(&e, &ue);
    TEST_CHECK(e.status == 400 && strcmp(e.param, "top_p") == 0 && strstr(e.message, "got 3"), "from um_err");
    um_err_set(&ue, UM_ERR_RESOURCE, "queue full");
    oai_error_from_um(&e, &ue);
    TEST_CHECK(e.status == 503 && e.param[0] == 0, "resource -> 503");

    /* client text with invalid UTF-8 never makes the body unserializable */
    oai_error_set(&e, 400, NULL, "decoder", "unknown decoder '%s'", "bad\xff\xfe");
    body = oai_error_body(&e, NULL);
    TEST_CHECK(body && strstr(body, "bad\xEF\xBF\xBD\xEF\xBF\xBD'"), "lossy: %s", body);
    free(body);
    json_t *s = oai_json_string_lossy("a\xC3\xA9\xE2\x82", 5);
    TEST_CHECK(s && strcmp(json_string_value(s), "a\xC3\xA9\xEF\xBF\xBD\xEF\xBF\xBD") == 0, "truncated seq");
    json_decref(s);
}

static char *chunk_str(out_chunk *c) { return (char *)out_chunk_data(c); }

static void test_sse(void) {
    out_chunk *c = sse_frame(NULL, NULL, "{\"a\":1}", 7);
    TEST_CHECK(strcmp(chunk_str(c), "data: {\"a\":1}\n\n") == 0, "plain: %s", chunk_str(c));
    TEST_CHECK(c->len == strlen("data: {\"a\":1}\n\n"), "len");
    out_chunk_free(c);
    c = sse_frame("7", "step", "l1\nl2\r\nl3", 9);
    TEST_CHECK(strcmp(chunk_str(c), "event: step\nid: 7\ndata: l1\ndata: l2\ndata: l3\n\n") == 0, "multi: %s",
               chunk_str(c));
    out_chunk_free(c);
    c = sse_frame("x\ny", NULL, "", 0);
    TEST_CHECK(strcmp(chunk_str(c), "id: x\ndata: \n\n") == 0, "id cut at newline: %s", chunk_str(c));
    out_chunk_free(c);
    c = sse_frame_done();
    TEST_CHECK(strcmp(chunk_str(c), "data: [DONE]\n\n") == 0 && c->len == 14, "done");
    out_chunk_free(c);
    json_t *j = json_pack("{s:s}", "k", "v\nw");
    c = sse_frame_json(NULL, NULL, j);
    TEST_CHECK(strcmp(chunk_str(c), "data: {\"k\":\"v\\nw\"}\n\n") == 0, "json escapes newline: %s", chunk_str(c));
    out_chunk_free(c);
    json_decref(j);

    out_queue q;
    out_queue_init(&q);
    out_queue_push(&q, out_chunk_new("ab", 2));
    out_queue_push(&q, out_chunk_new("cde", 3));
    TEST_CHECK(q.n == 2 && q.bytes == 5, "queue counts");
    c = out_queue_pop(&q);
    TEST_CHECK(c && c->len == 2 && memcmp(out_chunk_data(c), "ab", 2) == 0, "fifo order");
    out_chunk_free(c);
    out_queue_push(&q, out_chunk_new("f", 1));
    out_queue_clear(&q);
    TEST_CHECK(q.n == 0 && q.bytes == 0 && !q.head && !q.tail, "cleared");
    TEST_CHECK(out_queue_pop(&q) == NULL, "empty pop");
}

static void test_auth(void) {
    auth_keys a;
    um_err err = {0};
    const char *file = "# keys\n  sk-one  \n\nsk-two\n";
    TEST_CHECK(auth_keys_parse(&a, file, strlen(file), "keys.txt", &err) == 0, "parse: %s", err.msg);
    TEST_CHECK(a.n == 2 && strcmp(a.keys[0], "sk-one") == 0 && strcmp(a.keys[1], "sk-two") == 0, "keys");
    TEST_CHECK(auth_check(&a, "sk-two", 0) == AUTH_OK, "valid");
    TEST_CHECK(auth_check(&a, "sk-tw", 0) == AUTH_INVALID, "prefix is invalid");
    TEST_CHECK(auth_check(&a, "sk-twoo", 0) == AUTH_INVALID, "longer is invalid");
    TEST_CHECK(auth_check(&a, NULL, 0) == AUTH_MISSING, "missing");
    TEST_CHECK(auth_check(&a, "", 0) == AUTH_MISSING, "empty");
    TEST_CHECK(auth_check(&a, NULL, 1) == AUTH_MALFORMED, "malformed");
    auth_keys_free(&a);
    TEST_CHECK(auth_keys_parse(&a, "# only comments\n\n", 17, "k", &err) == -1 && strstr(err.msg, "no API key"),
               "empty file refused: %s", err.msg);
    TEST_CHECK(auth_keys_parse(&a, "a b\n", 4, "k", &err) == -1 && strstr(err.msg, "k:1"), "space refused: %s", err.msg);
    /* every key must be one a browser can present (subprotocol "unmask, unmask-key.<key>", at most
     * 126 characters in libwebsockets, tchar only) */
    char longest[AUTH_KEY_MAX + 3];
    memset(longest, 'k', AUTH_KEY_MAX);
    strcpy(longest + AUTH_KEY_MAX, "\n");
    TEST_CHECK(auth_keys_parse(&a, longest, strlen(longest), "k", &err) == 0 && a.n == 1 &&
                   strlen(a.keys[0]) == AUTH_KEY_MAX,
               "a key of %d characters loads: %s", AUTH_KEY_MAX, err.msg);
    auth_keys_free(&a);
    strcpy(longest + AUTH_KEY_MAX, "k\n");
    TEST_CHECK(auth_keys_parse(&a, longest, strlen(longest), "k", &err) == -1 && strstr(err.msg, "k:1") &&
                   strstr(err.msg, "at most 107 characters") && strstr(err.msg, "has 108"),
               "a key of %d characters is refused, naming the limit: %s", AUTH_KEY_MAX + 1, err.msg);
    TEST_CHECK(AUTH_KEY_MAX == 126 - (int)strlen("unmask, unmask-key."), "the limit follows from the header's");
    const char *bad_chars[] = {"sk/slash", "sk=pad==", "a\"b", "k,k", "sk:1", "sk;x", "\xc3\xa9t\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad_chars / sizeof bad_chars[0]; i++)
        TEST_CHECK(auth_keys_parse(&a, bad_chars[i], strlen(bad_chars[i]), "k", &err) == -1 &&
                       strstr(err.msg, "may only hold letters, digits"),
                   "'%s' refused: %s", bad_chars[i], err.msg);
    const char *ok_chars = "sk-A_z.9~!#$%&'*+^`|\n";
    TEST_CHECK(auth_keys_parse(&a, ok_chars, strlen(ok_chars), "k", &err) == 0, "tchar key loads: %s", err.msg);
    auth_keys_free(&a);
    auth_keys open = {0};
    TEST_CHECK(auth_check(&open, NULL, 0) == AUTH_OK, "open access");

    char tok[128];
    TEST_CHECK(auth_bearer_token("Bearer sk-1", tok, sizeof tok) == 0 && strcmp(tok, "sk-1") == 0, "bearer");
    TEST_CHECK(auth_bearer_token("  bearer   sk-2  ", tok, sizeof tok) == 0 && strcmp(tok, "sk-2") == 0, "bearer ws");
    TEST_CHECK(auth_bearer_token("Basic abc", tok, sizeof tok) == -1, "basic refused");
    TEST_CHECK(auth_bearer_token("Bearer", tok, sizeof tok) == -1, "no token");
    TEST_CHECK(auth_bearer_token("Bearersk", tok, sizeof tok) == -1, "no space");
    TEST_CHECK(auth_key_from_subprotocols("realtime, openai-insecure-api-key.sk-9, openai-beta.realtime-v1", tok,
                                          sizeof tok) == 0 &&
                   strcmp(tok, "sk-9") == 0,
               "subprotocol key");
    TEST_CHECK(auth_key_from_subprotocols("unmask-key.abc", tok, sizeof tok) == 0 && strcmp(tok, "abc") == 0, "unmask-key");
    TEST_CHECK(auth_key_from_subprotocols("realtime", tok, sizeof tok) == -1, "no key");
}

static void test_ratelimit(void) {
    ratelimit *rl = ratelimit_new(2.0, 3.0); /* 2/s, burst 3 */
    double ra = 0;
    int ok = 0;
    for (int i = 0; i < 3; i++) ok += ratelimit_take(rl, "k1", 1, 100.0, &ra);
    TEST_CHECK(ok == 3, "burst of 3 allowed");
    TEST_CHECK(ratelimit_take(rl, "k1", 1, 100.0, &ra) == 0, "4th refused");
    TEST_CHECK(ra > 0.49 && ra < 0.51, "retry after 0.5 s, got %g", ra);
    TEST_CHECK(ratelimit_take(rl, "k2", 1, 100.0, &ra) == 1, "other key independent");
    TEST_CHECK(ratelimit_take(rl, "k1", 1, 100.25, &ra) == 0 && ra > 0.24 && ra < 0.26, "partial refill: %g", ra);
    TEST_CHECK(ratelimit_take(rl, "k1", 1, 100.5, &ra) == 1, "refilled after 0.5 s");
    TEST_CHECK(ratelimit_take(rl, "k1", 1, 1000.0, &ra) == 1, "long idle");
    TEST_CHECK(ratelimit_n_keys(rl) == 2, "two buckets");
    ratelimit_free(rl);
    rl = ratelimit_new(0, 0);
    for (int i = 0; i < 100; i++) ok = ratelimit_take(rl, "x", 1, 0, &ra);
    TEST_CHECK(ok == 1, "unlimited");
    ratelimit_free(rl);
}

static void test_algo_config(void) {
    json_t *o = NULL;
    um_err err = {0};
    const char *yaml = "# SGLang style\n---\nalgorithm: LowConfidence\nthreshold: 0.95   # tau\nblock_size: 32\n"
                       "temperature: 0\nstop_at_eos: true\n";
    TEST_CHECK(algo_config_parse(yaml, strlen(yaml), "cfg.yaml", &o, &err) == 0, "yaml: %s", err.msg);
    TEST_CHECK(o && strcmp(json_string_value(json_object_get(o, "decoder")), "threshold") == 0, "LowConfidence");
    TEST_CHECK(json_real_value(json_object_get(o, "threshold")) == 0.95, "threshold");
    TEST_CHECK(json_integer_value(json_object_get(o, "block_length")) == 32, "block_size -> block_length");
    TEST_CHECK(json_is_true(json_object_get(o, "stop_at_eos")), "bool");
    json_decref(o);

    const char *js = "{\"decoder\":\"low_confidence\",\"steps\":16,\"max_new_tokens\":64}";
    TEST_CHECK(algo_config_parse(js, strlen(js), "cfg.json", &o, &err) == 0, "json: %s", err.msg);
    TEST_CHECK(json_integer_value(json_object_get(o, "gen_length")) == 64 &&
                   json_integer_value(json_object_get(o, "steps")) == 16,
               "json keys");
    json_decref(o);

    const char *bad1 = "threshold: 0.9\nthreshhold: 0.8\n";
    TEST_CHECK(algo_config_parse(bad1, strlen(bad1), "c.yaml", &o, &err) == -1 && strstr(err.msg, "c.yaml:2") &&
                   strstr(err.msg, "threshhold"),
               "unknown key names file:line: %s", err.msg);
    const char *bad2 = "algorithm:\n  threshold: 0.9\n";
    TEST_CHECK(algo_config_parse(bad2, strlen(bad2), "c.yaml", &o, &err) == -1 && strstr(err.msg, "c.yaml:1"),
               "nesting refused: %s", err.msg);
    const char *bad3 = "algorithm: FastDiffuser\n";
    TEST_CHECK(algo_config_parse(bad3, strlen(bad3), "c.yaml", &o, &err) == -1 && strstr(err.msg, "FastDiffuser"),
               "unsupported algorithm: %s", err.msg);
    /* SGLang's Fast-dLLM v2 config: HierarchyBlock with its keys */
    const char *hb = "algorithm: HierarchyBlock\nthreshold: 0.9\nsub_block_size: 8\ntoken_shift: 1\nblock_size: 32\n";
    TEST_CHECK(algo_config_parse(hb, strlen(hb), "c.yaml", &o, &err) == 0 &&
                   strcmp(json_string_value(json_object_get(o, "decoder")), "hierarchy_block") == 0 &&
                   json_integer_value(json_object_get(o, "sub_block_length")) == 8 &&
                   json_integer_value(json_object_get(o, "token_shift")) == 1,
               "HierarchyBlock config: %s", err.msg);
    json_decref(o);
    o = NULL;
    /* SGLang's LLaDA2.1 config: JointThreshold with its keys */
    const char *jt = "algorithm: JointThreshold\nthreshold: 0.5\nedit_threshold: 0.1\nmax_post_steps: 8\nblock_size: 32\n";
    TEST_CHECK(algo_config_parse(jt, strlen(jt), "c.yaml", &o, &err) == 0 &&
                   strcmp(json_string_value(json_object_get(o, "decoder")), "joint_threshold") == 0 &&
                   json_real_value(json_object_get(o, "edit_threshold")) == 0.1 &&
                   json_integer_value(json_object_get(o, "max_post_steps")) == 8,
               "JointThreshold config: %s", err.msg);
    json_decref(o);
    o = NULL;
    const char *bad4 = "threshold: high\n";
    TEST_CHECK(algo_config_parse(bad4, strlen(bad4), "c.yaml", &o, &err) == -1 && strstr(err.msg, "number"),
               "string for number: %s", err.msg);
    const char *bad5 = "block_size: 32\nblock_length: 16\n";
    TEST_CHECK(algo_config_parse(bad5, strlen(bad5), "c.yaml", &o, &err) == -1 && strstr(err.msg, "twice"),
               "duplicate via alias: %s", err.msg);
    const char *bad6 = "{\"threshold\": }";
    TEST_CHECK(algo_config_parse(bad6, strlen(bad6), "c.json", &o, &err) == -1 && strstr(err.msg, "invalid JSON"),
               "bad json: %s", err.msg);
    TEST_CHECK(algo_config_load("/nonexistent/cfg.yaml", &o, &err) == -1, "missing file");
}

static double gauge_seven(void *user) {
    (void)user;
    return 7;
}

static void test_metrics(void) {
    metrics *m = metrics_new();
    metrics_gauge_register(m, "queue_depth", "Requests waiting.", gauge_seven, NULL);
    metrics_http_request(m, "/v1/models", "GET", 200);
    metrics_http_request(m, "/v1/models", "GET", 200);
    metrics_http_request(m, "/v1/chat/completions", "POST", 429);
    metrics_tokens(m, 10, 20);
    metrics_steps(m, 5);
    metrics_step_latency(m, 0.003);
    metrics_step_latency(m, 100);
    metrics_event_overhead(m, 0.00002);
    metrics_finished(m, "stop");
    metrics *other = metrics_new(); /* instances are independent */
    metrics_http_request(other, "/v1/models", "GET", 200);
    char *t = metrics_render(m, NULL);
    TEST_CHECK(strstr(t, "unmask_http_requests_total{route=\"/v1/models\",method=\"GET\",status=\"200\"} 2\n"), "counter");
    TEST_CHECK(strstr(t, "status=\"429\"} 1\n"), "429 counted");
    TEST_CHECK(strstr(t, "# TYPE unmask_queue_depth gauge\nunmask_queue_depth 7\n"), "gauge");
    TEST_CHECK(strstr(t, "unmask_generated_tokens_total 20\n"), "tokens");
    TEST_CHECK(strstr(t, "unmask_step_latency_seconds_bucket{le=\"0.0025\"} 0\n"), "below bucket");
    TEST_CHECK(strstr(t, "unmask_step_latency_seconds_bucket{le=\"0.005\"} 1\n"), "bucket");
    TEST_CHECK(strstr(t, "unmask_step_latency_seconds_bucket{le=\"+Inf\"} 2\n"), "+Inf");
    TEST_CHECK(strstr(t, "unmask_step_latency_seconds_count 2\n"), "count");
    TEST_CHECK(strstr(t, "unmask_requests_finished_total{finish_reason=\"stop\"} 1\n"), "finished");
    free(t);
    metrics_reset(m);
    t = metrics_render(m, NULL);
    TEST_CHECK(!strstr(t, "status=\"200\"} 2"), "reset clears the counters");
    TEST_CHECK(strstr(t, "unmask_queue_depth 7\n"), "reset keeps the gauges");
    free(t);
    metrics_free(m);
    metrics_free(other);
}

int main(void) {
    test_api_error();
    test_sse();
    test_auth();
    test_ratelimit();
    test_algo_config();
    test_metrics();
    return test_report();
}
