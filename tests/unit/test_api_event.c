/*
 * test_api_event.c — scheduler events as the server sends and stores them (api/event.h), on
 * synthetic typed events: the key order of step / block / done objects (with and without a
 * generation id, the scheduler's queue_ms / paused_ms last in DONE's timings), and WebSocket step
 * folding (commits concatenated, the latest drafts less what was committed after them, progress of
 * the latest step, "merged" = steps folded, "drafts" kept where it first appeared).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/event.h"
#include "decode/event_copy.h"
#include "test.h"
#include "util/json_util.h"
#include "util/log.h"

/* A step with commits at positions cp[0..nc) and drafts at dp[0..nd) (nd < 0: none streamed). */
static sched_event *step_at(int step, int nc, const int *cp, int nd, const int *dp) {
    decode_commit c[8];
    decode_draft d[8];
    for (int i = 0; i < nc; i++)
        c[i] = (decode_commit){.pos = cp[i], .index = cp[i] - 10, .token = cp[i], .confidence = 0.5f, .piece = "a"};
    for (int i = 0; i < nd; i++)
        d[i] = (decode_draft){.pos = dp[i], .index = dp[i] - 10, .token = dp[i], .confidence = 0.25f, .piece = "b"};
    decode_event de = {.type = DECODE_EVENT_STEP, .step = step, .block = 0, .n_blocks = 1, .n_commits = nc,
                       .commits = c, .n_drafts = nd > 0 ? nd : 0, .drafts = d, .masks_left = 8 - step,
                       .block_masks_left = 8 - step, .usage = {.committed = step + 1}};
    sched_event *e = xcalloc(1, sizeof *e);
    e->kind = SCHED_EV_STEP;
    decode_event_copy(&e->ev, &de);
    return e;
}

static api_step *fold_of(sched_event *e) {
    api_step *s = api_step_new(e, "g1");
    sched_event_free(e);
    return s;
}

static char *dump(json_t *j) {
    char *s = json_dumps(j, UM_JSON_COMPACT);
    json_decref(j);
    return s;
}

/* the keys of a JSON object text, in order, joined by ',' (values skipped; nested objects too) */
static void keys_of(const char *js, char *out, size_t n) {
    json_t *j = json_loads(js, 0, NULL);
    out[0] = 0;
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v) {
        strncat(out, k, n - strlen(out) - 1);
        strncat(out, ",", n - strlen(out) - 1);
    }
    json_decref(j);
}

static void test_event_json(void) {
    decode_event de = {.type = DECODE_EVENT_DONE, .block = -1, .text = "hi", .text_len = 2,
                       .finish = DECODE_FINISH_LENGTH, .usage = {.prompt_tokens = 3, .completion_tokens = 2, .steps = 4},
                       .timings = {.first_event_ms = 1.0, .total_ms = 2.0, .decode_ms = 1.5, .tokens_per_s = 8.0}};
    sched_event e = {.kind = SCHED_EV_DONE, .final = 1, .ev = de, .queue_ms = 0.5, .paused_ms = 0.25};
    char *s = dump(api_event_json(&e, "g1"));
    TEST_CHECK(strcmp(s, "{\"type\":\"done\",\"id\":\"g1\",\"finish_reason\":\"length\",\"time_limited\":false,\"text\":\"hi\",\"error\":null,"
                         "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5,\"steps\":4,"
                         "\"committed\":0},\"timings\":{\"first_event_ms\":1.0,\"total_ms\":2.0,\"decode_ms\":1.5,"
                         "\"tokens_per_s\":8.0,\"queue_ms\":0.5,\"paused_ms\":0.25}}") == 0,
               "done with id: %s", s);
    free(s);
    s = dump(api_event_json(&e, NULL));
    TEST_CHECK(strncmp(s, "{\"type\":\"done\",\"finish_reason\"", 30) == 0, "done without id: %s", s);
    free(s);
    s = dump(api_event_timings_json(&e));
    TEST_CHECK(strstr(s, "\"tokens_per_s\":8.0,\"queue_ms\":0.5,\"paused_ms\":0.25}") != NULL, "timings: %s", s);
    free(s);
    /* the CLI's encoding of the same event has no scheduler timings */
    s = dump(decode_event_to_json(&de));
    TEST_CHECK(strstr(s, "queue_ms") == NULL && strstr(s, "\"id\"") == NULL, "decode_event_to_json: %s", s);
    free(s);
}

static void test_step_fold(void) {
    char k[256];
    /* one step, no drafts: no "drafts", no "merged" */
    api_step *a = fold_of(step_at(0, 1, (int[]){10}, -1, NULL));
    char *s = dump(api_step_json(a));
    keys_of(s, k, sizeof k);
    TEST_CHECK(strcmp(k, "type,id,step,block,n_blocks,commits,progress,") == 0, "single step keys: %s", k);
    free(s);
    /* + a step with drafts: drafts appear after progress (the first fold had none), merged 2 */
    api_step_merge(a, fold_of(step_at(1, 1, (int[]){11}, 3, (int[]){12, 13, 14})));
    /* + a step without drafts committing 13: the drafts lose 13 */
    api_step_merge(a, fold_of(step_at(2, 2, (int[]){13, 15}, -1, NULL)));
    s = dump(api_step_json(a));
    keys_of(s, k, sizeof k);
    TEST_CHECK(strcmp(k, "type,id,step,block,n_blocks,commits,progress,drafts,merged,") == 0, "folded keys: %s", k);
    json_t *j = json_loads(s, 0, NULL);
    json_t *cs = json_object_get(j, "commits"), *ds = json_object_get(j, "drafts");
    TEST_CHECK(json_array_size(cs) == 4 && json_integer_value(json_object_get(json_array_get(cs, 3), "pos")) == 15,
               "commits concatenated in order: %s", s);
    TEST_CHECK(json_array_size(ds) == 2 && json_integer_value(json_object_get(json_array_get(ds, 0), "pos")) == 12 &&
                   json_integer_value(json_object_get(json_array_get(ds, 1), "pos")) == 14,
               "drafts pruned of the later commit: %s", s);
    TEST_CHECK(json_integer_value(json_object_get(j, "step")) == 2 &&
                   json_integer_value(json_object_get(json_object_get(j, "progress"), "steps")) == 3 &&
                   json_integer_value(json_object_get(j, "merged")) == 3,
               "latest step and progress, merged 3: %s", s);
    json_decref(j);
    free(s);
    /* + a step committing every drafted position: "drafts" stays, empty */
    api_step_merge(a, fold_of(step_at(3, 2, (int[]){12, 14}, -1, NULL)));
    s = dump(api_step_json(a));
    TEST_CHECK(strstr(s, "\"drafts\":[],\"merged\":4}") != NULL, "emptied drafts kept: %s", s);
    free(s);
    api_step_free(a);

    /* drafts from the first step sit before progress; a later fold replaces them */
    a = fold_of(step_at(0, 0, NULL, 2, (int[]){10, 11}));
    api_step_merge(a, fold_of(step_at(1, 1, (int[]){10}, 1, (int[]){11})));
    s = dump(api_step_json(a));
    keys_of(s, k, sizeof k);
    TEST_CHECK(strcmp(k, "type,id,step,block,n_blocks,commits,drafts,progress,merged,") == 0, "keys: %s", k);
    TEST_CHECK(strstr(s, "\"drafts\":[{\"pos\":11,") != NULL && strstr(s, "\"pos\":10,\"index\":0,\"id\":10,\"text\":\"b\"") == NULL,
               "drafts replaced: %s", s);
    free(s);
    api_step_free(a);

    /* drafts first arriving once "merged" exists go after it */
    a = fold_of(step_at(0, 1, (int[]){10}, -1, NULL));
    api_step_merge(a, fold_of(step_at(1, 1, (int[]){11}, -1, NULL)));
    api_step *b = fold_of(step_at(2, 1, (int[]){12}, -1, NULL));
    api_step_merge(b, fold_of(step_at(3, 0, NULL, 1, (int[]){13})));
    api_step_merge(a, b); /* a fold of folds (stream.every > 1 into an unwritten frame) */
    s = dump(api_step_json(a));
    keys_of(s, k, sizeof k);
    TEST_CHECK(strcmp(k, "type,id,step,block,n_blocks,commits,progress,merged,drafts,") == 0, "keys: %s", k);
    TEST_CHECK(strstr(s, "\"merged\":4,") != NULL, "merged counts every step: %s", s);
    free(s);
    api_step_free(a);
}

int main(void) {
    test_event_json();
    test_step_fold();
    return test_report();
}
