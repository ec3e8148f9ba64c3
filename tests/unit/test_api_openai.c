/*
 * test_api_openai.c — the HTTP generation APIs without a server: request parsing (types, ranges,
 * the client's own parameter names in messages), building sequences on a tiny model (chat
 * template, native infill canvas, validation renamed to client fields), the event tracker
 * (append-only committed prefix, out-of-order commits, EOS, stop strings held back, drafts and the
 * diffusing canvas), and the response shapes of chat, completions, FIM, SGLang and /infill.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/infill.h"
#include "api/openai.h"
#include "api/sglang.h"
#include "backend/backend.h"
#include "decode/event_copy.h"
#include "decode/event_json.h"
#include "model/make_model.h"
#include "model/model.h"
#include "test.h"
#include "test_model.h"
#include "util/log.h"

static api_limits g_lim;

/* Parse body with parser; expect failure with status/param and message substring. */
typedef int (*parse_fn)(const char *, size_t, const decode_params *, const api_limits *, api_gen *, api_error *);

static void expect_err(parse_fn fn, const char *body, int status, const char *param, const char *msg_part) {
    api_gen g;
    api_error e;
    memset(&e, 0, sizeof e);
    decode_params d = decode_params_default();
    int rc = fn(body, strlen(body), &d, &g_lim, &g, &e);
    TEST_CHECK(rc == -1, "should fail: %s", body);
    if (rc == -1) {
        TEST_CHECK(e.status == status, "status %d != %d for %s (%s)", e.status, status, body, e.message);
        TEST_CHECK(strcmp(e.param, param) == 0, "param '%s' != '%s' for %s", e.param, param, body);
        TEST_CHECK(strstr(e.message, msg_part) != NULL, "message '%s' lacks '%s'", e.message, msg_part);
    }
    api_gen_free(&g);
}

static void test_parse(void) {
    expect_err(openai_parse_chat, "{", 400, "", "not valid JSON");
    expect_err(openai_parse_chat, "[1,2]", 400, "", "must be a JSON object");
    expect_err(openai_parse_chat, "", 400, "", "empty");
    expect_err(openai_parse_chat, "{}", 400, "messages", "messages is required");
    expect_err(openai_parse_chat, "{\"messages\":[]}", 400, "messages", "non-empty");
    expect_err(openai_parse_chat, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", 400, "messages[0].role",
               "must be one of");
    expect_err(openai_parse_chat, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content",
               "string or an array");
    expect_err(openai_parse_chat,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}", 400,
               "messages[0].content", "not supported");
    const char *ok_msgs = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
    snprintf(b, sizeof b, "{%s,\"diffusion_steps\":2000}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "diffusion_steps", "diffusion_steps must be between 0 (auto) and 1024, got 2000");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":\"many\"}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "max_tokens", "must be an integer");
    snprintf(b, sizeof b, "{%s,\"max_tokens\":0}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "max_tokens", "between 1 and");
    snprintf(b, sizeof b, "{%s,\"temperature\":3}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "temperature", "between 0 and 2, got 3");
    snprintf(b, sizeof b, "{%s,\"top_p\":0}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "top_p", "in (0, 1]");
    snprintf(b, sizeof b, "{%s,\"decoder\":\"magic\"}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "decoder", "magic");
    snprintf(b, sizeof b, "{%s,\"threshold\":1.5}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "threshold", "(0, 1]");
    snprintf(b, sizeof b, "{%s,\"stream\":\"yes\"}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "stream", "boolean");
    snprintf(b, sizeof b, "{%s,\"n\":100}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "n", "between 1 and 16");
    snprintf(b, sizeof b, "{%s,\"stop\":[1]}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "stop", "stop[0] must be a string");
    snprintf(b, sizeof b, "{%s,\"logprobs\":true}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "logprobs", "not supported");
    snprintf(b, sizeof b, "{%s,\"seed\":-1}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "seed", "non-negative");
    snprintf(b, sizeof b, "{%s,\"model\":7}", ok_msgs);
    expect_err(openai_parse_chat, b, 400, "model", "string");
    expect_err(openai_parse_completion, "{\"model\":\"x\"}", 400, "prompt", "prompt is required");
    expect_err(openai_parse_completion, "{\"prompt\":{}}", 400, "prompt", "string or an array");
    expect_err(openai_parse_completion, "{\"prompt\":[1,-2]}", 400, "prompt", "prompt[1]");
    expect_err(openai_parse_completion, "{\"prompt\":\"a\",\"suffix\":3}", 400, "suffix", "string");
    expect_err(sglang_parse_generate, "{}", 400, "text", "required");
    expect_err(sglang_parse_generate, "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-4}}", 400,
               "sampling_params.max_new_tokens", "between 1");
    expect_err(sglang_parse_generate, "{\"text\":[\"a\",3]}", 400, "text[1]", "string");
    expect_err(infill_parse, "{\"input_prefix\":1}", 400, "input_prefix", "string");
    expect_err(infill_parse, "{\"input_extra\":[{\"filename\":\"a\"}]}", 400, "input_extra", "text");
    expect_err(infill_parse_fim, "{\"prompt\":\"a\",\"max_tokens\":999999}", 400, "max_tokens", "between 1 and 8192");

    /* valid requests */
    api_gen g;
    api_error e;
    decode_params d = decode_params_default();
    const char *chat = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"max_tokens\":16,\"diffusion_steps\":8,"
                       "\"block_size\":8,\"stop\":\"END\",\"diffusing\":true,\"top_k\":-1}";
    TEST_CHECK(openai_parse_chat(chat, strlen(chat), &d, &g_lim, &g, &e) == 0, "chat parses: %s", e.message);
    TEST_CHECK(g.stream && g.include_usage && g.diffusing && g.params.gen_length == 16 && g.params.steps == 8 &&
                   g.params.block_length == 8 && g.n_stop == 1 && g.params.top_k == 0,
               "chat fields");
    TEST_CHECK(strcmp(json_string_value(json_object_get(json_array_get(g.messages, 0), "role")), "system") == 0 &&
                   strcmp(json_string_value(json_object_get(json_array_get(g.messages, 0), "content")), "ab") == 0,
               "developer -> system, parts joined");
    TEST_CHECK(strcmp(decode_params_src_get(&g.src, "steps"), "diffusion_steps") == 0 &&
                   strcmp(decode_params_src_get(&g.src, "gen_length"), "max_tokens") == 0,
               "names kept");
    api_gen_free(&g);
    const char *inf = "{\"input_prefix\":\"def f(x):\\n\",\"input_suffix\":\"\\n    return y\\n\",\"prompt\":\"    y\","
                      "\"input_extra\":[{\"filename\":\"a.py\",\"text\":\"import os\"}],\"n_predict\":0,\"id_slot\":0,"
                      "\"samplers\":[],\"response_fields\":[\"content\"]}";
    TEST_CHECK(infill_parse(inf, strlen(inf), &d, &g_lim, &g, &e) == 0, "infill parses: %s", e.message);
    TEST_CHECK(g.warmup == 1, "n_predict 0 = warm-up");
    TEST_CHECK(strcmp(g.prompts[0].text, "a.py\nimport os\n\ndef f(x):\n    y") == 0, "prefix: %s", g.prompts[0].text);
    TEST_CHECK(strcmp(g.suffix, "\n    return y\n") == 0, "suffix");
    api_gen_free(&g);
    const char *gen = "{\"text\":[\"a\",\"b\"],\"sampling_params\":{\"max_new_tokens\":8,\"temperature\":0},\"stream\":true}";
    TEST_CHECK(sglang_parse_generate(gen, strlen(gen), &d, &g_lim, &g, &e) == 0, "generate parses: %s", e.message);
    TEST_CHECK(g.n_prompts == 2 && g.prompts_list && g.params.gen_length == 8 && g.stream, "generate fields");
    api_gen_free(&g);
}

/* ---------------------------------------------------------------- tracker on synthetic events */

/* A committed or drafted token of a synthetic step (pos = 100 + index, confidence 0.5). */
typedef struct tok {
    int         index, id;
    const char *text;
    int         special;
} tok;
#define TOKS(...) (int)(sizeof((tok[]){__VA_ARGS__}) / sizeof(tok)), (tok[]){__VA_ARGS__}

/* Synthetic scheduler events, owned like the engine's (decode_event_copy). */
static sched_event *event_of(const decode_event *de) {
    sched_event *e = xcalloc(1, sizeof *e);
    e->kind = de->type == DECODE_EVENT_STEP    ? SCHED_EV_STEP
              : de->type == DECODE_EVENT_BLOCK ? SCHED_EV_BLOCK
                                               : SCHED_EV_DONE;
    e->final = de->type == DECODE_EVENT_DONE;
    decode_event_copy(&e->ev, de);
    return e;
}

static sched_event *step_event(int step, int nc, const tok *cs, int nd, const tok *ds, int committed, int G) {
    decode_commit c[16];
    decode_draft d[16];
    CHECK(nc <= 16 && nd <= 16);
    for (int i = 0; i < nc; i++)
        c[i] = (decode_commit){.pos = 100 + cs[i].index, .index = cs[i].index, .token = cs[i].id, .confidence = 0.5f,
                               .special = cs[i].special, .piece = cs[i].text};
    for (int i = 0; i < nd; i++)
        d[i] = (decode_draft){.pos = 100 + ds[i].index, .index = ds[i].index, .token = ds[i].id, .confidence = 0.5f,
                              .special = ds[i].special, .piece = ds[i].text};
    decode_event de = {.type = DECODE_EVENT_STEP, .step = step, .block = 0, .n_blocks = 1, .n_commits = nc, .commits = c,
                       .n_drafts = nd, .drafts = d, .masks_left = G - committed, .block_masks_left = G - committed,
                       .usage = {.committed = committed}};
    return event_of(&de);
}

static sched_event *done_event(const char *finish, const char *text, int completion) {
    enum decode_finish f = strcmp(finish, "stop") == 0 ? DECODE_FINISH_STOP
                           : strcmp(finish, "length") == 0 ? DECODE_FINISH_LENGTH
                                                           : DECODE_FINISH_CANCELLED;
    decode_event de = {.type = DECODE_EVENT_DONE, .block = -1, .text = text, .text_len = strlen(text), .finish = f,
                       .usage = {.prompt_tokens = 3, .completion_tokens = completion, .steps = 4, .committed = 4},
                       .timings = {.first_event_ms = 1.0, .total_ms = 2.0, .decode_ms = 1.5, .tokens_per_s = 100.0}};
    return event_of(&de);
}

static void test_tracker(void) {
    /* no tokenizer: pieces are the text; EOS id 99 */
    model fake;
    memset(&fake, 0, sizeof fake);
    fake.cfg.eos_id = 99;
    fake.cfg.eot_id = -1;
    api_track *t = api_track_new(6, &fake, NULL, 0);
    size_t n;
    /* commit index 2 first: nothing streams (prefix not contiguous) */
    sched_event *ev = step_event(0, TOKS({2, 3, "C", 0}), 0, NULL, 1, 6);
    int f = api_track_event(t, ev);
    sched_event_free(ev);
    TEST_CHECK((f & TRACK_FRAME) && !(f & TRACK_TEXT), "out-of-order commit: frame, no text");
    ev = step_event(1, TOKS({0, 1, "A", 0}, {1, 2, "B", 0}),
                    TOKS({3, 7, "x", 0}), 3, 6);
    f = api_track_event(t, ev);
    sched_event_free(ev);
    const char *d = api_track_take(t, &n);
    TEST_CHECK((f & TRACK_TEXT) && n == 3 && memcmp(d, "ABC", 3) == 0, "prefix ABC streamed: %.*s", (int)n, d);
    char *canvas = api_track_canvas(t);
    TEST_CHECK(strcmp(canvas, "ABCx") == 0, "canvas with draft: %s", canvas);
    free(canvas);
    json_t *meta = api_track_meta(t);
    TEST_CHECK(strcmp(json_string_value(json_object_get(meta, "state")), "cccdmm") == 0, "state string");
    TEST_CHECK(json_real_value(json_object_get(meta, "diffusion_progress")) == 0.5, "progress 0.5");
    json_decref(meta);
    /* EOS at 4, a piece after it never shows */
    ev = step_event(2, TOKS({3, 4, "D", 0}, {4, 99, "<eos>", 1}, {5, 5, "", 0}), 0, NULL, 6, 6);
    api_track_event(t, ev);
    sched_event_free(ev);
    d = api_track_take(t, &n);
    TEST_CHECK(n == 1 && d[0] == 'D', "D then EOS");
    ev = done_event("stop", "ABCD", 4);
    f = api_track_event(t, ev);
    sched_event_free(ev);
    TEST_CHECK((f & TRACK_DONE) && strcmp(api_track_finish(t), "stop") == 0, "done stop");
    size_t tl;
    TEST_CHECK(strcmp(api_track_text(t, &tl), "ABCD") == 0, "final text");
    api_track_free(t);

    /* stop strings: held back until they cannot match; truncated at the match */
    char *stops[] = {"END"};
    t = api_track_new(8, &fake, stops, 1);
    ev = step_event(0, TOKS({0, 1, "ab", 0}, {1, 2, "cE", 0}), 0, NULL, 2, 8);
    api_track_event(t, ev);
    sched_event_free(ev);
    d = api_track_take(t, &n);
    TEST_CHECK(n == 2 && memcmp(d, "ab", 2) == 0, "held back 'cE' (could start END): %.*s", (int)n, d);
    ev = step_event(1, TOKS({2, 3, "NDxyz", 0}), 0, NULL, 3, 8);
    f = api_track_event(t, ev);
    sched_event_free(ev);
    TEST_CHECK((f & TRACK_STOP) && (f & TRACK_DONE), "stop string hit");
    d = api_track_take(t, &n);
    TEST_CHECK(n == 1 && d[0] == 'c', "text up to the stop: %.*s", (int)n, d);
    TEST_CHECK(strcmp(api_track_stop_word(t), "END") == 0, "stop word");
    ev = done_event("cancelled", "abcENDxyz", 3);
    f = api_track_event(t, ev);
    sched_event_free(ev);
    TEST_CHECK(strcmp(api_track_finish(t), "stop") == 0 && strcmp(api_track_text(t, &tl), "abc") == 0,
               "later cancelled DONE ignored");
    TEST_CHECK(api_track_usage(t) && json_integer_value(json_object_get(api_track_usage(t), "completion_tokens")) == 3,
               "but its usage is kept");
    api_track_free(t);

    /* UTF-8: the holdback never splits a character */
    char *stops2[] = {"zz"};
    t = api_track_new(4, &fake, stops2, 1);
    ev = step_event(0, TOKS({0, 1, "a\xC3\xA9", 0}), 0, NULL, 1, 4);
    api_track_event(t, ev);
    sched_event_free(ev);
    d = api_track_take(t, &n);
    TEST_CHECK(n == 1 && d[0] == 'a', "é held whole (hold 1 byte would split it): %zu", n);
    api_track_free(t);
}

static json_t *drain(json_t *a) {
    json_t *copy = json_copy(a);
    json_array_clear(a);
    return copy;
}

static void test_shapes(void) {
    model fake;
    memset(&fake, 0, sizeof fake);
    fake.cfg.eos_id = 99;
    fake.cfg.eot_id = -1;
    decode_params d = decode_params_default();
    api_gen g;
    api_error e;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true},\"max_tokens\":4}";
    TEST_CHECK(openai_parse_chat(chat, strlen(chat), &d, &g_lim, &g, &e) == 0, "parse");
    api_seq seq = {.seq = NULL, .index = 0, .prompt = 0, .n_prompt = 3};
    api_resp *r = api_resp_new(&g, &seq, 1, &fake, "tiny");
    json_t *out = json_array();
    api_resp_begin(r, out);
    json_t *c0 = json_array_get(out, 0);
    TEST_CHECK(json_array_size(out) == 1 && strcmp(json_string_value(json_object_get(c0, "object")), "chat.completion.chunk") == 0,
               "role chunk");
    TEST_CHECK(strcmp(json_string_value(json_object_get(json_object_get(json_array_get(json_object_get(c0, "choices"), 0),
                                                                        "delta"),
                                                        "role")),
                      "assistant") == 0,
               "role assistant");
    TEST_CHECK(json_is_null(json_object_get(c0, "usage")), "usage null on chunks");
    json_decref(drain(out));
    sched_event *ev = step_event(0, TOKS({0, 1, "He", 0}, {1, 2, "llo", 0}), 0, NULL, 2, 4);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    ev = step_event(1, TOKS({2, 99, "<eos>", 1}, {3, 99, "", 1}), 0, NULL, 4, 4);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    ev = done_event("stop", "Hello", 2);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    TEST_CHECK(api_resp_done(r) && !api_resp_error(r), "done");
    api_resp_end(r, out);
    char *s = json_dumps(out, JSON_COMPACT);
    TEST_CHECK(strstr(s, "\"delta\":{\"content\":\"Hello\"}") && strstr(s, "\"finish_reason\":\"stop\"") &&
                   strstr(s, "\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5"),
               "content, finish, usage chunk: %s", s);
    free(s);
    json_decref(out);
    json_t *body = api_resp_body(r);
    s = json_dumps(body, JSON_COMPACT);
    TEST_CHECK(strstr(s, "\"object\":\"chat.completion\"") && strstr(s, "\"message\":{\"role\":\"assistant\",\"content\":\"Hello\"}"),
               "body: %s", s);
    free(s);
    json_decref(body);
    api_resp_free(r);
    api_gen_free(&g);

    /* diffusing frames: replace semantics + diffusion_meta, closing chunk */
    const char *dchat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"stream\":true,\"diffusing\":true,\"max_tokens\":4}";
    openai_parse_chat(dchat, strlen(dchat), &d, &g_lim, &g, &e);
    r = api_resp_new(&g, &seq, 1, &fake, "tiny");
    out = json_array();
    ev = step_event(0, TOKS({1, 2, "llo", 0}), TOKS({0, 5, "Ye", 0}), 1, 4);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    s = json_dumps(out, JSON_COMPACT);
    TEST_CHECK(strstr(s, "\"content\":\"Yello\"") && strstr(s, "\"diffusion_meta\"") && strstr(s, "\"state\":\"dcmm\""),
               "frame: %s", s);
    free(s);
    json_array_clear(out);
    ev = step_event(1, TOKS({0, 1, "He", 0}), 0, NULL, 2, 4);
    api_resp_event(r, 0, ev, 1 /* slow client: frame skipped */, out);
    sched_event_free(ev);
    TEST_CHECK(json_array_size(out) == 0, "slow client: intermediate frame dropped");
    ev = done_event("length", "Hello", 2);
    api_resp_event(r, 0, ev, 1, out);
    sched_event_free(ev);
    s = json_dumps(out, JSON_COMPACT);
    TEST_CHECK(json_array_size(out) == 2 && strstr(s, "\"content\":\"Hello\"") && strstr(s, "\"diffusion_progress\":1.0") &&
                   strstr(s, "\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\""),
               "final frame + closing chunk: %s", s);
    free(s);
    json_decref(out);
    api_resp_free(r);
    api_gen_free(&g);

    /* SGLang cumulative chunks */
    const char *gen = "{\"text\":\"x\",\"stream\":true,\"rid\":\"r1\"}";
    sglang_parse_generate(gen, strlen(gen), &d, &g_lim, &g, &e);
    r = api_resp_new(&g, &seq, 1, &fake, "tiny");
    out = json_array();
    ev = step_event(0, TOKS({0, 1, "A", 0}), 0, NULL, 1, 4);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    ev = step_event(1, TOKS({1, 2, "B", 0}), 0, NULL, 2, 4);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    ev = done_event("length", "AB", 2);
    api_resp_event(r, 0, ev, 0, out);
    sched_event_free(ev);
    TEST_CHECK(json_array_size(out) == 3, "3 sglang chunks");
    TEST_CHECK(strcmp(json_string_value(json_object_get(json_array_get(out, 1), "text")), "AB") == 0, "cumulative text");
    s = json_dumps(json_array_get(out, 2), JSON_COMPACT);
    TEST_CHECK(strstr(s, "\"finish_reason\":{\"type\":\"length\",\"length\":2}") && strstr(s, "\"id\":\"r1\""), "final meta: %s", s);
    free(s);
    TEST_CHECK(api_resp_sse_done(r), "[DONE] for sglang");
    json_decref(out);
    api_resp_free(r);
    api_gen_free(&g);

    /* /infill warm-up and response_fields */
    const char *inf = "{\"input_prefix\":\"a\",\"n_predict\":0,\"response_fields\":[\"content\",\"timings/prompt_n\",\"stop\"]}";
    infill_parse(inf, strlen(inf), &d, &g_lim, &g, &e);
    r = api_resp_new(&g, NULL, 0, &fake, "tiny");
    body = api_resp_body(r);
    s = json_dumps(body, JSON_COMPACT);
    TEST_CHECK(strcmp(s, "{\"content\":\"\",\"timings/prompt_n\":0,\"stop\":true}") == 0, "warm-up flattened: %s", s);
    free(s);
    json_decref(body);
    TEST_CHECK(!api_resp_sse_done(r), "no [DONE] for /infill");
    api_resp_free(r);
    api_gen_free(&g);
}

/* ---------------------------------------------------------------- build on a real tiny model */

static void test_build(void) {
    make_model_opts o = test_model_opts();
    um_err ue = {0};
    model m;
    if (test_model_make("test_api_openai_model", &o, &m, &ue) != 0) {
        TEST_CHECK(0, "model: %s", ue.msg);
        return;
    }
    decode_params d = decode_params_for_model(&m);
    api_gen g;
    api_error e;
    api_seq *seqs = NULL;
    int n = 0;
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8,\"block_length\":4,"
                       "\"n\":2,\"seed\":5}";
    TEST_CHECK(openai_parse_chat(chat, strlen(chat), &d, &g_lim, &g, &e) == 0, "parse");
    TEST_CHECK(api_gen_build(&g, &m, &g_lim, &seqs, &n, &e) == 0, "build chat: %s", e.message);
    TEST_CHECK(n == 2 && seqs[1].index == 1 && decode_seq_params(seqs[1].seq)->seed == 6, "n copies, seeds");
    TEST_CHECK(seqs[0].n_prompt > 5, "chat template rendered: %d tokens", seqs[0].n_prompt);
    api_seqs_free(seqs, n);
    api_gen_free(&g);

    /* validation errors come back under the client's field names */
    const char *bad = "{\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}],\"max_tokens\":8,\"block_size\":4,"
                      "\"diffusion_steps\":1}";
    openai_parse_chat(bad, strlen(bad), &d, &g_lim, &g, &e);
    TEST_CHECK(api_gen_build(&g, &m, &g_lim, &seqs, &n, &e) == -1, "steps < blocks");
    TEST_CHECK(e.status == 400 && strcmp(e.param, "diffusion_steps") == 0 && strstr(e.message, "diffusion_steps must be between 2") &&
                   strstr(e.message, "max_tokens 8 / block_size 4"),
               "renamed: %s / %s", e.param, e.message);
    api_gen_free(&g);

    /* infill canvas: prompt ++ masks ++ suffix */
    const char *fim = "{\"prompt\":\"def add(a, b):\\n\",\"suffix\":\"\\n\\nprint(add(1, 2))\\n\",\"max_tokens\":8}";
    infill_parse_fim(fim, strlen(fim), &d, &g_lim, &g, &e);
    TEST_CHECK(api_gen_build(&g, &m, &g_lim, &seqs, &n, &e) == 0, "build fim: %s", e.message);
    if (n != 1) {
        model_free(&m);
        return;
    }
    int len = 0;
    const int32_t *x = decode_seq_canvas(seqs[0].seq, &len);
    TEST_CHECK(seqs[0].n_suffix > 0 && len == seqs[0].n_prompt + 8 + seqs[0].n_suffix, "canvas has the suffix");
    TEST_CHECK(x[seqs[0].n_prompt] == m.cfg.mask_id && x[len - 1] != m.cfg.mask_id, "masks then suffix");
    api_seqs_free(seqs, n);
    api_gen_free(&g);

    /* prompt limit */
    api_limits lim = g_lim;
    lim.max_prompt_tokens = 3;
    const char *cp = "{\"prompt\":\"a long prompt that has more than three tokens\"}";
    openai_parse_completion(cp, strlen(cp), &d, &lim, &g, &e);
    TEST_CHECK(api_gen_build(&g, &m, &lim, &seqs, &n, &e) == -1 && strcmp(e.code, "context_length_exceeded") == 0 &&
                   strcmp(e.param, "prompt") == 0,
               "prompt limit: %s", e.message);
    api_gen_free(&g);
    const char *big = "{\"prompt\":\"x\",\"max_tokens\":8000}";
    openai_parse_completion(big, strlen(big), &d, &g_lim, &g, &e);
    TEST_CHECK(api_gen_build(&g, &m, &g_lim, &seqs, &n, &e) == -1 && strcmp(e.param, "max_tokens") == 0 &&
                   strstr(e.message, "max_tokens must be between 1 and"),
               "context limit under the client's name: %s", e.message);
    api_gen_free(&g);
    model_free(&m);
}

int main(void) {
    g_lim = api_limits_default();
    test_parse();
    test_tracker();
    test_shapes();
    test_build();
    return test_report();
}
