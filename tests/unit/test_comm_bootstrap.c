/*
 * test_comm_bootstrap.c — the multi-node rendezvous over TCP that hands NCCL's unique id from node
 * 0 to the other nodes (backend/comm.c): 4 nodes on loopback all receive node 0's bytes (clients
 * started before and after node 0 listens); a missing node makes node 0 time out naming it; a
 * client without node 0 times out with "could not connect"; nnodes mismatch and duplicate ranks
 * are refused with a message; address and option parsing; a node whose setup fingerprint differs is
 * refused with node 0's describe line on both sides (equal ones pass); comm_stop_request interrupts
 * node 0's wait for a missing node and a follower's connect retries within 2 s ("interrupted by
 * SIGTERM"); over the liveness link, a follower's stop request reaches node 0's on_stop and a setup
 * error line reaches the peer's on_error.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/comm.h"
#include "test.h"
#include "util/timeutil.h"

typedef struct join_arg {
    int     port, nnodes, rank, timeout_ms;
    uint8_t blob[COMM_NCCL_ID_BYTES];
    int     rc;
    um_err  err;
} join_arg;

static void *join_main(void *p) {
    join_arg *a = p;
    a->rc = comm_bootstrap_join("127.0.0.1", a->port, a->nnodes, a->rank, a->blob, sizeof a->blob, a->timeout_ms,
                                &a->err);
    return NULL;
}

static void test_four_nodes(void) {
    int fd = -1, port = 0;
    um_err err = {0};
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, &err) == 0 && port > 0, "listen: %s", err.msg);
    uint8_t id[COMM_NCCL_ID_BYTES];
    for (int i = 0; i < COMM_NCCL_ID_BYTES; i++) id[i] = (uint8_t)(i * 7 + 3);
    join_arg a[3];
    pthread_t th[3];
    for (int r = 1; r <= 3; r++) {
        memset(&a[r - 1], 0, sizeof a[r - 1]);
        a[r - 1].port = port, a[r - 1].nnodes = 4, a[r - 1].rank = r, a[r - 1].timeout_ms = 10000;
        pthread_create(&th[r - 1], NULL, join_main, &a[r - 1]);
    }
    int rc = comm_bootstrap_serve(fd, 4, id, sizeof id, 10000, &err);
    TEST_CHECK(rc == 0, "serve: %s", err.msg);
    for (int r = 0; r < 3; r++) {
        pthread_join(th[r], NULL);
        TEST_CHECK(a[r].rc == 0, "node %d: %s", r + 1, a[r].err.msg);
        TEST_CHECK(memcmp(a[r].blob, id, sizeof id) == 0, "node %d received node 0's id", r + 1);
    }
}

/* clients that start before node 0 listens keep retrying */
typedef struct serve_arg {
    int     port;
    uint8_t id[COMM_NCCL_ID_BYTES];
    int     rc;
    um_err  err;
} serve_arg;

static void *late_server(void *p) {
    serve_arg *s = p;
    usleep(300000);
    comm_dist_opts o = {NULL, 2, 0, 10000};
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", s->port);
    o.init_addr = addr;
    s->rc = comm_bootstrap_exchange(&o, s->id, sizeof s->id, &s->err);
    return NULL;
}

static int free_port(void) {
    int fd, port = 0;
    um_err err;
    if (comm_bootstrap_listen(0, &fd, &port, &err) < 0) return -1;
    close(fd);
    return port;
}

static void test_late_node0(void) {
    serve_arg s;
    memset(&s, 0, sizeof s);
    s.port = free_port();
    TEST_CHECK(s.port > 0, "free port");
    memset(s.id, 0xab, sizeof s.id);
    pthread_t th;
    pthread_create(&th, NULL, late_server, &s);
    comm_dist_opts o = {NULL, 2, 1, 10000};
    char addr[64];
    snprintf(addr, sizeof addr, "localhost:%d", s.port);
    o.init_addr = addr;
    uint8_t got[COMM_NCCL_ID_BYTES] = {0};
    um_err err = {0};
    int rc = comm_bootstrap_exchange(&o, got, sizeof got, &err);
    pthread_join(th, NULL);
    TEST_CHECK(rc == 0, "late node 0, joiner: %s", err.msg);
    TEST_CHECK(s.rc == 0, "late node 0, server: %s", s.err.msg);
    TEST_CHECK(memcmp(got, s.id, sizeof got) == 0, "id received through a retried connect");
}

static void test_missing_node(void) {
    int fd = -1, port = 0;
    um_err err = {0};
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, &err) == 0, "listen: %s", err.msg);
    join_arg a;
    memset(&a, 0, sizeof a);
    a.port = port, a.nnodes = 3, a.rank = 1, a.timeout_ms = 5000;
    pthread_t th;
    pthread_create(&th, NULL, join_main, &a);
    uint8_t id[COMM_NCCL_ID_BYTES] = {1};
    int rc = comm_bootstrap_serve(fd, 3, id, sizeof id, 400, &err);
    pthread_join(th, NULL);
    TEST_CHECK(rc < 0 && strstr(err.msg, "timed out") && strstr(err.msg, "node 2"), "node 0 names the missing node: %s",
               err.msg);
    TEST_CHECK(a.rc < 0 && strstr(a.err.msg, "aborted"), "joined node learns the rendezvous failed: %s", a.err.msg);
}

static void test_no_server(void) {
    int port = free_port();
    um_err err = {0};
    uint8_t id[COMM_NCCL_ID_BYTES];
    int rc = comm_bootstrap_join("127.0.0.1", port, 2, 1, id, sizeof id, 300, &err);
    TEST_CHECK(rc < 0 && strstr(err.msg, "could not connect") && strstr(err.msg, "127.0.0.1"),
               "connect timeout message: %s", err.msg);
}

static void test_mismatch(void) {
    int fd = -1, port = 0;
    um_err err = {0};
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, &err) == 0, "listen: %s", err.msg);
    join_arg a;
    memset(&a, 0, sizeof a);
    a.port = port, a.nnodes = 3, a.rank = 1, a.timeout_ms = 5000;   /* node 0 says 2 */
    pthread_t th;
    pthread_create(&th, NULL, join_main, &a);
    uint8_t id[COMM_NCCL_ID_BYTES] = {1};
    int rc = comm_bootstrap_serve(fd, 2, id, sizeof id, 5000, &err);
    pthread_join(th, NULL);
    TEST_CHECK(rc < 0 && strstr(err.msg, "nnodes mismatch"), "node 0 reports the mismatch: %s", err.msg);
    TEST_CHECK(a.rc < 0 && strstr(a.err.msg, "nnodes mismatch"), "the node is told why: %s", a.err.msg);

    /* duplicate node rank */
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, &err) == 0, "listen: %s", err.msg);
    join_arg b[2];
    pthread_t tb[2];
    for (int i = 0; i < 2; i++) {
        memset(&b[i], 0, sizeof b[i]);
        b[i].port = port, b[i].nnodes = 3, b[i].rank = 2, b[i].timeout_ms = 5000;
        pthread_create(&tb[i], NULL, join_main, &b[i]);
    }
    rc = comm_bootstrap_serve(fd, 3, id, sizeof id, 5000, &err);
    for (int i = 0; i < 2; i++) pthread_join(tb[i], NULL);
    TEST_CHECK(rc < 0 && strstr(err.msg, "--node-rank 2"), "duplicate rank refused: %s", err.msg);
    TEST_CHECK(b[0].rc < 0 && b[1].rc < 0, "both duplicate nodes fail");
}

static void test_parse(void) {
    char host[64];
    int port = 0;
    um_err err = {0};
    TEST_CHECK(comm_parse_addr("10.0.0.1:5000", host, sizeof host, &port, &err) == 0 && !strcmp(host, "10.0.0.1") &&
                   port == 5000, "ipv4");
    TEST_CHECK(comm_parse_addr("[::1]:29500", host, sizeof host, &port, &err) == 0 && !strcmp(host, "::1") && port == 29500,
               "ipv6");
    TEST_CHECK(comm_parse_addr("node-a.cluster:1", host, sizeof host, &port, &err) == 0 && port == 1, "hostname");
    TEST_CHECK(comm_parse_addr("nohost", host, sizeof host, &port, &err) < 0, "no port");
    TEST_CHECK(comm_parse_addr("h:0", host, sizeof host, &port, &err) < 0, "port 0");
    TEST_CHECK(comm_parse_addr("h:70000", host, sizeof host, &port, &err) < 0, "port too big");
    TEST_CHECK(comm_parse_addr(":80", host, sizeof host, &port, &err) < 0, "empty host");
    TEST_CHECK(comm_parse_addr("h:8x", host, sizeof host, &port, &err) < 0 && !strcmp(err.param, "dist-init-addr"),
               "junk port names the flag");
    comm_dist_opts o = {"h:1", 2, 2, 0};
    TEST_CHECK(comm_dist_opts_check(&o, &err) < 0 && !strcmp(err.param, "node-rank"), "node rank out of range");
    o.node_rank = 1;
    o.init_addr = NULL;
    TEST_CHECK(comm_dist_opts_check(&o, &err) < 0 && !strcmp(err.param, "dist-init-addr"), "nnodes > 1 needs an address");
    o.nnodes = 1, o.node_rank = 0;
    TEST_CHECK(comm_dist_opts_check(&o, &err) == 0, "single node needs nothing");
    uint8_t id[4] = {9, 9, 9, 9};
    TEST_CHECK(comm_bootstrap_exchange(&o, id, sizeof id, &err) == 0 && id[0] == 9, "single node exchange is a no-op");
}

/* ---------------------------------------------------------------- fingerprint */

static void describe_first(const void *a, const void *b, size_t len, int node, char *msg, size_t cap) {
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (i < len && x[i] == y[i]) i++;
    snprintf(msg, cap, "node %d differs at byte %zu (%u vs %u)", node, i, y[i], x[i]);
}

typedef struct fp_join {
    int              port;
    uint8_t          fp[8];
    comm_fingerprint f;
    uint8_t          blob[COMM_NCCL_ID_BYTES];
    comm_link       *link;
    int              rc;
    um_err           err;
} fp_join;

static void *fp_join_main(void *p) {
    fp_join *j = p;
    j->rc = comm_bootstrap_join_link_fp("127.0.0.1", j->port, 2, 1, j->blob, sizeof j->blob, 10000, &j->f, &j->link,
                                        &j->err);
    return NULL;
}

/* node 0 with fingerprint {1..8}, node 1 with `theirs`: 0 both ok, else -1 (errors in e0 / j) */
static int fp_round(const uint8_t theirs[8], um_err *e0, fp_join *j, comm_link **l0) {
    static const uint8_t mine[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int fd = -1, port = 0;
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, e0) == 0, "listen: %s", e0->msg);
    memset(j, 0, sizeof *j);
    j->port = port;
    memcpy(j->fp, theirs, 8);
    j->f = (comm_fingerprint){.data = j->fp, .len = 8};
    pthread_t th;
    pthread_create(&th, NULL, fp_join_main, j);
    uint8_t id[COMM_NCCL_ID_BYTES] = {42};
    comm_fingerprint f0 = {.data = mine, .len = 8, .describe = describe_first};
    int rc = comm_bootstrap_serve_link_fp(fd, 2, id, sizeof id, 10000, &f0, l0, e0);
    pthread_join(th, NULL);
    return rc == 0 && j->rc == 0 ? 0 : -1;
}

static void test_fingerprint(void) {
    um_err e0 = {0};
    fp_join j;
    comm_link *l0 = NULL;
    const uint8_t same[8] = {1, 2, 3, 4, 5, 6, 7, 8}, other[8] = {1, 2, 3, 4, 5, 9, 7, 8};
    TEST_CHECK(fp_round(same, &e0, &j, &l0) == 0 && j.blob[0] == 42, "equal fingerprints: %s / %s", e0.msg, j.err.msg);
    comm_link_close(l0);
    comm_link_close(j.link);
    e0 = (um_err){0};
    l0 = NULL;
    TEST_CHECK(fp_round(other, &e0, &j, &l0) < 0, "a different fingerprint is refused");
    TEST_CHECK(l0 == NULL && j.link == NULL, "no link kept after a refusal");
    TEST_CHECK(!strcmp(e0.msg, "bootstrap: node 1 differs at byte 5 (9 vs 6)"), "node 0 names it: %s", e0.msg);
    TEST_CHECK(!strcmp(j.err.msg, "bootstrap: node 0 refused node 1: node 1 differs at byte 5 (9 vs 6)"),
               "node 1 gets node 0's line: %s", j.err.msg);
}

/* ---------------------------------------------------------------- stop requests */

static void *serve_missing(void *p) {
    serve_arg *s = p;
    int fd = -1, port = 0;
    if (comm_bootstrap_listen(0, &fd, &port, &s->err) < 0) {
        s->rc = -2;
        return NULL;
    }
    s->rc = comm_bootstrap_serve(fd, 2, s->id, sizeof s->id, 60000, &s->err);
    return NULL;
}

static void test_stop_interrupts(void) {
    comm_stop_init();
    comm_stop_reset();
    TEST_CHECK(comm_stop_signal() == 0, "no stop yet");
    serve_arg s;
    memset(&s, 0, sizeof s);
    pthread_t th;
    const uint64_t t0 = time_now_ns();
    pthread_create(&th, NULL, serve_missing, &s);
    comm_stop_request(SIGTERM);   /* whether the thread is already waiting or not: it must return */
    comm_stop_request(SIGINT);    /* the first signal is kept */
    pthread_join(th, NULL);
    const double secs = (double)(time_now_ns() - t0) * 1e-9;
    TEST_CHECK(s.rc == -1 && s.err.code == UM_ERR_CANCELLED, "serve interrupted (rc %d): %s", s.rc, s.err.msg);
    TEST_CHECK(!strcmp(s.err.msg, "bootstrap: interrupted by SIGTERM while waiting for node 1 to connect (1 of 2 nodes "
                                  "joined)"),
               "message: %s", s.err.msg);
    TEST_CHECK(secs < 2.0, "node 0 stopped waiting within 2 s of the request (%.3f s; the timeout was 60 s)", secs);
    TEST_CHECK(comm_stop_signal() == SIGTERM, "first signal kept");
    /* a follower retrying to reach an absent node 0 */
    int fd = -1, port = 0;
    um_err err = {0};
    TEST_CHECK(comm_bootstrap_listen(0, &fd, &port, &err) == 0, "listen: %s", err.msg);
    close(fd);   /* nobody listens on `port` now */
    uint8_t id[COMM_NCCL_ID_BYTES];
    const uint64_t t1 = time_now_ns();
    int rc = comm_bootstrap_join("127.0.0.1", port, 2, 1, id, sizeof id, 60000, &err);
    TEST_CHECK(rc < 0 && err.code == UM_ERR_CANCELLED && strstr(err.msg, "node 1: interrupted by SIGTERM while connecting to node 0"),
               "join interrupted: %s", err.msg);
    TEST_CHECK((double)(time_now_ns() - t1) * 1e-9 < 2.0, "join returned within 2 s");
    comm_stop_reset();
    TEST_CHECK(comm_stop_signal() == 0, "reset");
}

/* ---------------------------------------------------------------- link messages */

typedef struct link_events {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    int             stop_node, stop_sig, err_node;
    char            err_msg[128];
} link_events;

static link_events g_ev = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, -1, 0, -1, ""};

static void ev_lost(void *user, int node) { (void)user, (void)node; }

static void ev_stop(void *user, int node, int sig) {
    (void)user;
    pthread_mutex_lock(&g_ev.mu);
    g_ev.stop_node = node, g_ev.stop_sig = sig;
    pthread_cond_broadcast(&g_ev.cv);
    pthread_mutex_unlock(&g_ev.mu);
}

static void ev_error(void *user, int node, const char *msg) {
    (void)user;
    pthread_mutex_lock(&g_ev.mu);
    g_ev.err_node = node;
    snprintf(g_ev.err_msg, sizeof g_ev.err_msg, "%s", msg);
    pthread_cond_broadcast(&g_ev.cv);
    pthread_mutex_unlock(&g_ev.mu);
}

/* waits (bounded: 10 s) until *field != unset */
static int ev_wait(const int *field, int unset) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&g_ev.mu);
    while (*field == unset && pthread_cond_timedwait(&g_ev.cv, &g_ev.mu, &ts) == 0) {}
    int v = *field;
    pthread_mutex_unlock(&g_ev.mu);
    return v;
}

static void test_link_messages(void) {
    um_err e0 = {0};
    fp_join j;
    comm_link *l0 = NULL;
    const uint8_t same[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    TEST_CHECK(fp_round(same, &e0, &j, &l0) == 0, "link: %s / %s", e0.msg, j.err.msg);
    comm_stop_init();
    comm_stop_reset();
    comm_link_on_error(l0, ev_error);
    comm_link_watch(l0, ev_lost, ev_stop, NULL);
    comm_link_on_error(j.link, ev_error);
    comm_link_watch(j.link, ev_lost, NULL, NULL);
    /* node 1's setup error reaches node 0 */
    comm_link_send_error(j.link, "rank 1 (cuda:0): boom");
    TEST_CHECK(ev_wait(&g_ev.err_node, -1) == 1 && !strcmp(g_ev.err_msg, "rank 1 (cuda:0): boom"),
               "node 0 got node 1's error: node %d '%s'", g_ev.err_node, g_ev.err_msg);
    /* and the other way */
    pthread_mutex_lock(&g_ev.mu);
    g_ev.err_node = -1;
    pthread_mutex_unlock(&g_ev.mu);
    comm_link_send_error(l0, "rank 0 (cuda:0): bang");
    TEST_CHECK(ev_wait(&g_ev.err_node, -1) == 0 && !strcmp(g_ev.err_msg, "rank 0 (cuda:0): bang"),
               "node 1 got node 0's error: node %d '%s'", g_ev.err_node, g_ev.err_msg);
    /* a stop request on "node 1" (this process) is forwarded by the follower's watcher only */
    comm_stop_request(SIGTERM);
    TEST_CHECK(ev_wait(&g_ev.stop_node, -1) == 1 && g_ev.stop_sig == SIGTERM, "node 0's on_stop: node %d sig %d",
               g_ev.stop_node, g_ev.stop_sig);
    comm_link_close(j.link);
    comm_link_close(l0);
    comm_stop_reset();
}

int main(void) {
    test_fingerprint();
    test_stop_interrupts();
    test_link_messages();
    test_parse();
    test_four_nodes();
    test_late_node0();
    test_missing_node();
    test_no_server();
    test_mismatch();
    return test_report();
}
