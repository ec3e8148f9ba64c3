/*
 * test_comm_bootstrap.c — the multi-node rendezvous over TCP that hands NCCL's unique id from node
 * 0 to the other nodes (backend/comm.c): 4 nodes on loopback all receive node 0's bytes (clients
 * started before and after node 0 listens); a missing node makes node 0 time out naming it; a
 * client without node 0 times out with "could not connect"; nnodes mismatch and duplicate ranks
 * are refused with a message; address and option parsing.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/comm.h"
#include "test.h"

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

int main(void) {
    test_parse();
    test_four_nodes();
    test_late_node0();
    test_missing_node();
    test_no_server();
    test_mismatch();
    return test_report();
}
