/*
 * test_api_jobs.c — the async job store: idempotency keys, owner isolation, lifecycle, retries of
 * failed engine work up to the limit, cancellation, the resumable event log and its window, and
 * the byte budget (finished jobs evicted first, full stores refuse, logs shed old events); a SQLite
 * store read back at start gives every job's event log byte for byte, whatever its length.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jobs/job_db.h"
#include "jobs/jobs.h"
#include "test.h"

/* job_store_append with the progress a runner would pass for ev (a step: its "progress"). */
static int64_t append_ev(job_store *js, const char *id, const json_t *ev) {
    const json_t *p = json_object_get(ev, "progress");
    const job_progress pr = {(long)json_integer_value(json_object_get(p, "steps")),
                             (long)json_integer_value(json_object_get(p, "committed"))};
    return job_store_append(js, id, ev, p ? &pr : NULL);
}

static json_t *step_ev(int steps, int committed) {
    return json_pack("{s:s, s:{s:i, s:i}}", "type", "step", "progress", "steps", steps, "committed", committed);
}

/* max_bytes: what the store holds stays within it whatever is thrown at it. */
static void test_byte_budget(void) {
    job_store_opts o = {.max_jobs = 1000, .max_active = 1000, .max_events = 4096, .max_attempts = 1, .max_bytes = 64 << 10};
    job_store *js = job_store_new(&o);
    um_err err = {0};
    char big[8000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    json_t *req = json_pack("{s:s}", "prompt", big);
    char ids[64][40];
    int existed, made = 0;
    for (; made < 64; made++)
        if (job_store_create(js, "k", NULL, req, NULL, ids[made], &existed, &err) != 0) break;
    TEST_CHECK(made >= 6 && made < 10 && err.code == UM_ERR_RESOURCE && strstr(err.msg, "--jobs-max-bytes"),
               "a full store refuses new jobs (%d made): %s", made, err.msg);
    TEST_CHECK(job_store_bytes(js) <= o.max_bytes, "within the budget: %zu", job_store_bytes(js));
    /* finish two: a new job fits again, the oldest finished one evicted for it */
    json_t *res = json_pack("{s:s}", "text", "done");
    job_store_start(js, ids[0], 4);
    job_store_succeed(js, ids[0], res);
    job_store_start(js, ids[1], 4);
    job_store_succeed(js, ids[1], res);
    char nid[40];
    TEST_CHECK(job_store_create(js, "k", NULL, req, NULL, nid, &existed, &err) == 0, "room after eviction: %s", err.msg);
    TEST_CHECK(!job_store_exists(js, ids[0], "k"), "the oldest finished job went");
    TEST_CHECK(job_store_bytes(js) <= o.max_bytes, "within the budget: %zu", job_store_bytes(js));
    /* a running job's log under pressure sheds its oldest events, and the store stays in budget */
    job_store_start(js, nid, 4);
    json_t *ev = json_pack("{s:s, s:s}", "type", "step", "pad", big);
    for (int i = 0; i < 40; i++) append_ev(js, nid, ev);
    TEST_CHECK(job_store_bytes(js) <= o.max_bytes + 16000, "bounded: %zu", job_store_bytes(js));
    job_event_copy *evs = NULL;
    int terminal = 0;
    TEST_CHECK(job_store_events_since(js, nid, 0, 10, &evs, &terminal, &err) == -1, "the oldest events are gone");
    /* ids: 1 queued, 2 running, 3..42 steps; at least the newest is kept */
    int n = job_store_events_since(js, nid, 41, 10, &evs, &terminal, &err);
    TEST_CHECK(n == 1 && evs[0].id == 42, "the newest event is kept (%d): %s", n, err.msg);
    job_events_free(evs, n > 0 ? n : 0);
    json_decref(ev);
    json_decref(res);
    json_decref(req);
    job_store_free(js);
}

/* Every kept event of job id (from the oldest the window keeps) as one string ("id:json\n" each),
 * or NULL when they cannot be read. */
static char *events_text(job_store *js, const char *id, int *count) {
    job_event_copy *evs = NULL;
    int terminal = 0, n = -1;
    um_err err = {0};
    for (int64_t after = 0; n < 0 && after < 100000; after++)
        n = job_store_events_since(js, id, after, 100000, &evs, &terminal, &err);
    *count = n;
    if (n < 0) return NULL;
    size_t cap = 1;
    for (int i = 0; i < n; i++) cap += strlen(evs[i].json) + 24;
    char *s = calloc(1, cap), *p = s;
    for (int i = 0; i < n; i++) p += sprintf(p, "%lld:%s\n", (long long)evs[i].id, evs[i].json);
    job_events_free(evs, n);
    return s;
}

static job_store *open_sqlite(const char *path, int max_events) {
    job_store_opts o = {.max_jobs = 100, .max_active = 100, .max_events = max_events, .max_attempts = 3};
    um_err err = {0};
    int rc = job_db_backend_open(path, &o.backend, &err);
    TEST_CHECK(rc == 0, "open %s: %s", path, err.msg);
    if (rc != 0) return NULL;
    job_store *js = job_store_new(&o);
    rc = job_store_load(js, &err);
    TEST_CHECK(rc == 0, "load %s: %s", path, err.msg);
    return js;
}

/* A store read back at start: finished and interrupted jobs keep their whole event log byte for
 * byte, for logs shorter than, equal to and many times the ring's first capacity (16) — the
 * restart that once aliased ring slots (double free at start for 33+ events, freed memory served
 * for 17-32) — and for logs past the window (max_events), where the newest are kept. */
static void test_reload_event_logs(void) {
    const char *tmp = getenv("UNMASK_TEST_TMP");
    char path[512];
    snprintf(path, sizeof path, "%s/test_api_jobs_reload_%d.db", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
    static const int lens[] = {0, 1, 12, 13, 14, 15, 29, 30, 31, 62, 63, 64, 100, 300};
    const int nlen = (int)(sizeof lens / sizeof lens[0]);
    char wal[540], shm[540];
    snprintf(wal, sizeof wal, "%s-wal", path);
    snprintf(shm, sizeof shm, "%s-shm", path);
    for (int window = 0; window < 2; window++) {
        const int max_events = window ? 40 : 4096;
        unlink(path), unlink(wal), unlink(shm);
        job_store *js = open_sqlite(path, max_events);
        if (!js) return;
        char ids[2 * 14][40];
        char *before[2 * 14];
        int counts[2 * 14];
        um_err err = {0};
        for (int i = 0; i < 2 * nlen; i++) {
            int existed = 0, finish = i < nlen, len = lens[i % nlen];
            json_t *req = json_pack("{s:s, s:i}", "prompt", "p", "n", i);
            TEST_CHECK(job_store_create(js, "k", NULL, req, NULL, ids[i], &existed, &err) == 0, "create: %s", err.msg);
            json_decref(req);
            job_store_start(js, ids[i], 64);
            for (int e = 0; e < len; e++) {
                json_t *ev = json_pack("{s:s, s:i, s:s, s:{s:i, s:i}}", "type", "step", "step", e, "text",
                                       "step text that differs per event", "progress", "steps", e + 1, "committed", e);
                append_ev(js, ids[i], ev);
                json_decref(ev);
            }
            if (finish) {
                json_t *res = json_pack("{s:s, s:i}", "text", "done", "n", i);
                job_store_succeed(js, ids[i], res);
                json_decref(res);
            }
            before[i] = events_text(js, ids[i], &counts[i]);
        }
        job_store_free(js); /* the server stopped; the unfinished jobs were running */
        for (int round = 0; round < 2; round++) { /* and started again, twice */
            js = open_sqlite(path, max_events);
            if (!js) return;
            char(*queued)[40] = NULL, (*hooks)[40] = NULL;
            int nh = 0;
            int nq = job_store_recover(js, "restarted", &queued, &hooks, &nh);
            TEST_CHECK(nq == nlen, "the interrupted jobs are queued (again): %d", nq);
            free(queued);
            free(hooks);
            for (int i = 0; i < 2 * nlen; i++) {
                int n = 0;
                char *after = events_text(js, ids[i], &n);
                if (i < nlen) {
                    TEST_CHECK(after && before[i] && strcmp(after, before[i]) == 0,
                               "window %d round %d: finished job with %d steps: the same %d events after the restart "
                               "(%d read)",
                               max_events, round, lens[i], counts[i], n);
                    TEST_CHECK(job_store_status(js, ids[i]) == JOB_SUCCEEDED, "still succeeded");
                } else if (round == 0) {
                    /* what was logged before (less the oldest event when the window was full), then
                     * a retry event (the interrupted attempt) */
                    const char *kept = before[i];
                    if (kept && counts[i] == max_events) kept = strchr(kept, '\n') + 1;
                    TEST_CHECK(after && kept && strncmp(after, kept, strlen(kept)) == 0 &&
                                   strstr(after + strlen(kept), "\"retry\""),
                               "window %d: interrupted job with %d steps keeps its %d events and logs a retry",
                               max_events, lens[i % nlen], counts[i]);
                    free(before[i]);
                    before[i] = after, after = NULL;
                    counts[i] = n;
                } else { /* queued since the first restart: nothing new */
                    TEST_CHECK(after && before[i] && strcmp(after, before[i]) == 0,
                               "window %d: queued job with %d steps: the same %d events after a second restart",
                               max_events, lens[i % nlen], counts[i]);
                    TEST_CHECK(job_store_status(js, ids[i]) == JOB_QUEUED, "still queued");
                }
                free(after);
            }
            job_store_free(js);
        }
        for (int i = 0; i < 2 * nlen; i++) free(before[i]);
    }
    unlink(path), unlink(wal), unlink(shm);
}

int main(void) {
    test_byte_budget();
    test_reload_event_logs();
    job_store_opts o = {.max_jobs = 4, .max_active = 3, .max_events = 8, .max_attempts = 2};
    job_store *js = job_store_new(&o);
    um_err err = {0};
    json_t *req = json_pack("{s:s}", "prompt", "hi");
    json_t *req2 = json_pack("{s:s}", "prompt", "other");
    char id[40], id2[40], id3[40];
    int existed = 0;
    TEST_CHECK(job_store_create(js, "k1", "idem-1", req, NULL, id, &existed, &err) == 0 && !existed, "create");
    TEST_CHECK(strncmp(id, "job_", 4) == 0 && strlen(id) == 28, "id shape %s", id);
    TEST_CHECK(job_store_create(js, "k1", "idem-1", req, NULL, id2, &existed, &err) == 0 && existed &&
                   strcmp(id, id2) == 0,
               "same key -> same job");
    TEST_CHECK(job_store_create(js, "k1", "idem-1", req2, NULL, id2, &existed, &err) == -1 &&
                   strcmp(err.param, "Idempotency-Key") == 0,
               "same key, different body refused: %s", err.msg);
    TEST_CHECK(job_store_create(js, "k2", "idem-1", req, NULL, id2, &existed, &err) == 0 && !existed &&
                   strcmp(id, id2) != 0,
               "keys are per owner");
    TEST_CHECK(!job_store_exists(js, id, "k2") && job_store_exists(js, id, "k1"), "owner isolation");
    TEST_CHECK(job_store_get_json(js, id, "k2") == NULL, "no snapshot for other owner");

    /* lifecycle with one failed attempt then success */
    TEST_CHECK(job_store_start(js, id, 32) == 0, "start");
    TEST_CHECK(job_store_start(js, id, 32) == -1, "start twice refused");
    json_t *ev = step_ev(1, 8);
    TEST_CHECK(append_ev(js, id, ev) == 3, "event ids continue (queued=1, running=2, step=3)");
    json_decref(ev);
    TEST_CHECK(job_store_attempt_failed(js, id, "forward failed") == 1, "retried");
    TEST_CHECK(job_store_status(js, id) == JOB_QUEUED, "back to queued");
    TEST_CHECK(job_store_start(js, id, 32) == 0, "second attempt");
    ev = step_ev(2, 16);
    append_ev(js, id, ev);
    json_decref(ev);
    json_t *snap = job_store_get_json(js, id, "k1");
    TEST_CHECK(snap && strcmp(json_string_value(json_object_get(snap, "status")), "running") == 0, "running");
    TEST_CHECK(json_real_value(json_object_get(json_object_get(snap, "progress"), "fraction")) == 0.5, "progress 0.5");
    TEST_CHECK(json_integer_value(json_object_get(snap, "attempts")) == 2, "attempts 2");
    json_decref(snap);
    json_t *result = json_pack("{s:s}", "text", "hello");
    job_store_succeed(js, id, result);
    json_decref(result);
    snap = job_store_get_json(js, id, "k1");
    TEST_CHECK(strcmp(json_string_value(json_object_get(snap, "status")), "succeeded") == 0, "succeeded");
    TEST_CHECK(strcmp(json_string_value(json_object_get(json_object_get(snap, "result"), "text")), "hello") == 0, "result");
    TEST_CHECK(json_integer_value(json_object_get(snap, "completed_at")) > 0, "completed_at");
    json_decref(snap);

    /* event log: all, then resume after 3 */
    job_event_copy *evs = NULL;
    int terminal = 0;
    int n = job_store_events_since(js, id, 0, 100, &evs, &terminal, &err);
    TEST_CHECK(n == 7 && terminal, "7 events (queued, running, step, retry, running, step, succeeded): %d", n);
    TEST_CHECK(n > 3 && strstr(evs[3].json, "\"retry\""), "retry logged");
    TEST_CHECK(n == 7 && strstr(evs[6].json, "succeeded") && evs[6].id == 7, "final status event");
    job_events_free(evs, n);
    n = job_store_events_since(js, id, 5, 100, &evs, &terminal, &err);
    TEST_CHECK(n == 2 && evs[0].id == 6 && evs[1].id == 7, "resume after 5 -> exactly 6, 7");
    job_events_free(evs, n);

    /* a second failure beyond max_attempts -> failed */
    TEST_CHECK(job_store_start(js, id2, 8) == 0, "start job 2");
    TEST_CHECK(job_store_attempt_failed(js, id2, "boom") == 1, "retry 1");
    TEST_CHECK(job_store_start(js, id2, 8) == 0, "attempt 2");
    TEST_CHECK(job_store_attempt_failed(js, id2, "boom again") == 0, "no more attempts");
    snap = job_store_get_json(js, id2, "k2");
    TEST_CHECK(strcmp(json_string_value(json_object_get(snap, "status")), "failed") == 0, "failed");
    TEST_CHECK(strcmp(json_string_value(json_object_get(json_object_get(snap, "error"), "message")), "boom again") == 0,
               "error message");
    json_decref(snap);

    /* cancellation: queued -> cancelled now; running -> marked */
    TEST_CHECK(job_store_create(js, "k1", NULL, req2, "http://127.0.0.1:9/h", id3, &existed, &err) == 0, "create 3");
    TEST_CHECK(job_store_cancel(js, id3, "k2") == 0, "other owner cannot cancel");
    TEST_CHECK(job_store_cancel(js, id3, "k1") == 1 && job_store_status(js, id3) == JOB_CANCELLED, "queued cancel");
    TEST_CHECK(job_store_cancel(js, id3, "k1") == 0, "terminal: no-op");
    char *wh = job_store_webhook(js, id3);
    TEST_CHECK(wh && strcmp(wh, "http://127.0.0.1:9/h") == 0, "webhook kept");
    free(wh);
    char id4[40];
    TEST_CHECK(job_store_create(js, "k1", NULL, req2, NULL, id4, &existed, &err) == 0, "create 4 (evicts oldest)");
    TEST_CHECK(job_store_start(js, id4, 8) == 0 && job_store_cancel(js, id4, "k1") == 2, "running cancel marked");
    TEST_CHECK(job_store_cancel_requested(js, id4) && job_store_attempt_failed(js, id4, "x") == 0,
               "no retry after cancel");

    /* event window */
    char id5[40];
    TEST_CHECK(job_store_create(js, "k1", NULL, req, NULL, id5, &existed, &err) == 0, "create 5");
    job_store_start(js, id5, 100);
    for (int i = 0; i < 20; i++) {
        ev = step_ev(i + 1, i);
        append_ev(js, id5, ev);
        json_decref(ev);
    }
    n = job_store_events_since(js, id5, 2, 100, &evs, &terminal, &err);
    TEST_CHECK(n == -1 && strcmp(err.param, "Last-Event-ID") == 0, "outside the window: %s", err.msg);
    n = job_store_events_since(js, id5, 20, 100, &evs, &terminal, &err);
    TEST_CHECK(n == 2 && !terminal && evs[0].id == 21, "inside the window");
    job_events_free(evs, n);

    /* active limit */
    char idx[40];
    int q, r, total;
    job_store_counts(js, &q, &r, &total);
    TEST_CHECK(r == 1 && total <= 4, "counts q=%d r=%d total=%d", q, r, total);
    job_store_create(js, "k9", NULL, req, NULL, idx, &existed, &err);
    job_store_create(js, "k9", NULL, req2, NULL, idx, &existed, &err);
    TEST_CHECK(job_store_create(js, "k9", NULL, req, NULL, idx, &existed, &err) == -1 && err.code == UM_ERR_RESOURCE,
               "too many active: %s", err.msg);

    json_decref(req);
    json_decref(req2);
    job_store_free(js);
    return test_report();
}
