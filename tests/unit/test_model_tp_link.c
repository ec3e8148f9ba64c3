/*
 * test_model_tp_link.c — the multi-node liveness link (comm_bootstrap_*_link, comm_link_watch) that
 * lets tensor-parallel nodes notice a peer process that is gone (model_tp.c exits then instead of
 * hanging in NCCL): three nodes on 127.0.0.1 rendezvous (node 0 on port 0) and all receive node 0's
 * blob; when node 2 closes its link, node 0's watcher reports exactly node 2 (node 1 is not
 * reported); when node 0 closes, node 1's watcher reports node 0; closing a watched link reports
 * nothing about itself and stops its watcher. Waits are condition variables (bounded by 20 s as a
 * failure guard), no sleeps.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "backend/comm.h"
#include "test.h"
#include "util/log.h"

#define NNODES 3

typedef struct watcher {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             lost[NNODES];   /* times each node was reported lost */
    int             total;
} watcher;

static watcher g_w[NNODES];   /* what node i's watcher reported */

static void on_lost(void *user, int node) {
    watcher *w = user;
    pthread_mutex_lock(&w->mu);
    if (node >= 0 && node < NNODES) w->lost[node]++;
    w->total++;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* wait until watcher w reported `total` losses; 0 on time-out (a failure) */
static int wait_total(watcher *w, int total) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    pthread_mutex_lock(&w->mu);
    int rc = 0;
    while (w->total < total && rc == 0) rc = pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    int ok = w->total >= total;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

typedef struct join_job {
    int        port, rank;
    uint8_t    blob[32];
    comm_link *link;
    int        rc;
    um_err     err;
} join_job;

static void *join_main(void *p) {
    join_job *j = p;
    j->rc = comm_bootstrap_join_link("127.0.0.1", j->port, NNODES, j->rank, j->blob, sizeof j->blob, 20000, &j->link,
                                     &j->err);
    return NULL;
}

int main(void) {
    for (int i = 0; i < NNODES; i++) {
        pthread_mutex_init(&g_w[i].mu, NULL);
        pthread_cond_init(&g_w[i].cv, NULL);
    }
    um_err err = {0};
    int lfd = -1, port = 0;
    TEST_CHECK(comm_bootstrap_listen(0, &lfd, &port, &err) == 0 && port > 0, "listen: %s", err.msg);
    if (lfd < 0) return test_report();
    uint8_t blob[32];
    for (int i = 0; i < 32; i++) blob[i] = (uint8_t)(i * 7 + 3);
    join_job jobs[NNODES];
    pthread_t th[NNODES];
    for (int r = 1; r < NNODES; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].port = port;
        jobs[r].rank = r;
        pthread_create(&th[r], NULL, join_main, &jobs[r]);
    }
    comm_link *l0 = NULL;
    TEST_CHECK(comm_bootstrap_serve_link(lfd, NNODES, blob, sizeof blob, 20000, &l0, &err) == 0 && l0, "serve: %s",
               err.msg);
    for (int r = 1; r < NNODES; r++) {
        pthread_join(th[r], NULL);
        TEST_CHECK(jobs[r].rc == 0 && jobs[r].link, "node %d joined: %s", r, jobs[r].err.msg);
        TEST_CHECK(memcmp(jobs[r].blob, blob, sizeof blob) == 0, "node %d received node 0's blob", r);
    }
    if (!l0 || !jobs[1].link || !jobs[2].link) return test_report();
    comm_link_watch(l0, on_lost, NULL, &g_w[0]);
    comm_link_watch(jobs[1].link, on_lost, NULL, &g_w[1]);
    comm_link_watch(jobs[2].link, on_lost, NULL, &g_w[2]);

    /* node 2 goes away: node 0 notices exactly node 2 */
    comm_link_close(jobs[2].link);
    TEST_CHECK(wait_total(&g_w[0], 1), "node 0 noticed a lost node");
    TEST_CHECK(g_w[0].lost[2] == 1 && g_w[0].lost[1] == 0, "node 0 reported node 2 (%d) and not node 1 (%d)",
               g_w[0].lost[2], g_w[0].lost[1]);
    TEST_CHECK(g_w[2].total == 0, "a closed link reports nothing about itself (%d)", g_w[2].total);

    /* node 0 goes away: node 1 notices node 0 */
    comm_link_close(l0);
    TEST_CHECK(wait_total(&g_w[1], 1), "node 1 noticed node 0 leaving");
    TEST_CHECK(g_w[1].lost[0] == 1 && g_w[1].total == 1, "node 1 reported node 0 once (%d of %d)", g_w[1].lost[0],
               g_w[1].total);
    comm_link_close(jobs[1].link);
    TEST_CHECK(g_w[0].total == 1, "node 0 reported nothing after it closed (%d)", g_w[0].total);

    /* one node: no link at all */
    comm_link *none = (comm_link *)&err;
    comm_dist_opts one = {.nnodes = 1};
    TEST_CHECK(comm_bootstrap_exchange_link(&one, blob, sizeof blob, &none, &err) == 0 && none == NULL,
               "--nnodes 1 has no link");
    return test_report();
}
