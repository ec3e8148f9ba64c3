/*
 * comm.c — the comm interface's dispatch helpers and the multi-node bootstrap over TCP (comm.h).
 *
 * Bootstrap protocol (all integers little-endian u32):
 *   node r -> node 0:  "UMBOOT02" nnodes node_rank fp_len fingerprint[fp_len]
 *   node 0 -> node r:  "UMBOOT02" status len payload   (status 0: payload = the blob;
 *                                                       status 1: payload = an error message)
 * Node 0 replies only after every node has joined, so a node that never arrives fails the whole
 * rendezvous with a message naming it instead of leaving the others hanging inside NCCL; a node
 * whose fingerprint (the setup that must agree: model, --tp, --max-seq, ...) differs from node 0's
 * is refused, which fails every node with one line naming the difference.
 * Afterwards the connections stay open as the liveness link. Messages on it: a stop request,
 * node r -> node 0: "S" signal (one byte each), sent once after comm_stop_request; a setup failure,
 * either way: "E" len (u16) message[len], before the failing node leaves.
 * Every wait polls the stop self-pipe too, so SIGINT/SIGTERM interrupt a rendezvous at once.
 * Does not: implement collectives (comm_local.c, cuda/comm_nccl.c). Any thread (blocking calls).
 */
#include "backend/comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/log.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- dispatch */

void comm_all_reduce_sum(comm *c, void *buf, size_t n, enum dtype t) {
    CHECK(t == DTYPE_F32 || t == DTYPE_BF16);
    if (!c || c->world == 1) return;
    c->ops->all_reduce_sum(c, buf, n, t);
}

void comm_all_reduce_sum_f32(comm *c, float *buf, size_t n) { comm_all_reduce_sum(c, buf, n, DTYPE_F32); }

void comm_all_reduce_act(comm *c, void *buf, size_t n) {
    if (!c || c->world == 1) return;
    comm_all_reduce_sum(c, buf, n, c->act_dtype);
}

void comm_all_gather(comm *c, const void *send, size_t bytes, void *recv) {
    if (!c || c->world == 1) {
        if (recv != send && bytes) memmove(recv, send, bytes);
        return;
    }
    c->ops->all_gather(c, send, bytes, recv);
}

void comm_broadcast(comm *c, void *buf, size_t bytes, int root) {
    if (!c || c->world == 1 || bytes == 0) return;
    CHECK(root >= 0 && root < c->world);
    c->ops->broadcast(c, buf, bytes, root);
}

void comm_barrier(comm *c) {
    if (c && c->world > 1) c->ops->barrier(c);
}

void comm_free(comm *c) {
    if (c) c->ops->free(c);
}

/* ---------------------------------------------------------------- options */

int comm_parse_addr(const char *s, char *host, size_t host_len, int *port, um_err *err) {
    if (!s || !*s) return um_err_param(err, "dist-init-addr", "empty address (expected host:port)");
    const char *colon;
    const char *h0 = s, *h1;
    if (s[0] == '[') {   /* [v6]:port */
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return um_err_param(err, "dist-init-addr", "'%s': expected [ipv6]:port", s);
        h0 = s + 1;
        h1 = rb;
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return um_err_param(err, "dist-init-addr", "'%s': expected host:port", s);
        h1 = colon;
    }
    size_t hl = (size_t)(h1 - h0);
    if (hl == 0 || hl >= host_len) return um_err_param(err, "dist-init-addr", "'%s': bad host part", s);
    char *end = NULL;
    errno = 0;
    long p = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || p < 1 || p > 65535)
        return um_err_param(err, "dist-init-addr", "'%s': port must be 1..65535", s);
    memcpy(host, h0, hl);
    host[hl] = '\0';
    *port = (int)p;
    return 0;
}

int comm_dist_opts_check(const comm_dist_opts *o, um_err *err) {
    if (o->nnodes < 1 || o->nnodes > 4096) return um_err_param(err, "nnodes", "--nnodes must be 1..4096, got %d", o->nnodes);
    if (o->node_rank < 0 || o->node_rank >= o->nnodes)
        return um_err_param(err, "node-rank", "--node-rank must be 0..%d (--nnodes %d), got %d", o->nnodes - 1, o->nnodes,
                            o->node_rank);
    if (o->nnodes > 1) {
        char host[256];
        int port;
        if (!o->init_addr) return um_err_param(err, "dist-init-addr", "--nnodes %d needs --dist-init-addr host:port", o->nnodes);
        if (comm_parse_addr(o->init_addr, host, sizeof host, &port, err) < 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- socket helpers */

static const char k_magic[8] = {'U', 'M', 'B', 'O', 'O', 'T', '0', '2'};
#define FP_MAX_BYTES 65536

/* ---------------------------------------------------------------- stop requests */

static int        g_stop_pipe[2] = {-1, -1}; /* written by comm_stop_request; never drained (sticky) */
static atomic_int g_stop_sig;                /* first signal requested, 0 = none */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "comm_stop_request runs in signal handlers");

void comm_stop_init(void) {
    if (g_stop_pipe[0] >= 0) return;
    CHECK(pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK) == 0);
}

void comm_stop_request(int sig) {
    int zero = 0;
    if (!atomic_compare_exchange_strong(&g_stop_sig, &zero, sig > 0 ? sig : SIGTERM)) return;
    if (g_stop_pipe[1] >= 0) {
        char c = 1;
        ssize_t w = write(g_stop_pipe[1], &c, 1);
        (void)w;
    }
}

int comm_stop_signal(void) { return atomic_load(&g_stop_sig); }

void comm_stop_reset(void) {
    char b[16];
    if (g_stop_pipe[0] >= 0)
        while (read(g_stop_pipe[0], b, sizeof b) > 0) {}
    atomic_store(&g_stop_sig, 0);
}

static const char *sig_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

/* "interrupted by SIGTERM" when a stop was requested, else NULL */
static const char *stop_why(void) {
    int sig = atomic_load(&g_stop_sig);
    if (!sig) return NULL;
    return sig == SIGINT ? "interrupted by SIGINT" : sig == SIGTERM ? "interrupted by SIGTERM" : "interrupted by a signal";
}

static int remaining_ms(uint64_t deadline_ns) {
    uint64_t now = time_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now) / 1000000ull;
    return ms > 0x7fffffff ? 0x7fffffff : (int)(ms ? ms : 1);
}

/* Full read/write with a deadline. 0 ok, -1 timeout/error (errno-ish reason in *why). */
/* intr: a stop request (comm_stop_request) ends the wait too ("interrupted by ..."). */
static int io_full_x(int fd, void *buf, size_t len, int writing, uint64_t deadline_ns, int intr, const char **why) {
    char *p = buf;
    while (len) {
        struct pollfd pf[2] = {{fd, (short)(writing ? POLLOUT : POLLIN), 0}, {intr ? g_stop_pipe[0] : -1, POLLIN, 0}};
        int ms = remaining_ms(deadline_ns);
        if (ms == 0) {
            *why = "timed out";
            return -1;
        }
        if (intr && stop_why()) {
            *why = stop_why();
            return -1;
        }
        int r = poll(pf, 2, ms);
        if (r < 0) {
            if (errno == EINTR) continue;
            *why = strerror(errno);
            return -1;
        }
        if (r == 0) {
            *why = "timed out";
            return -1;
        }
        if (pf[1].revents && stop_why()) {
            *why = stop_why();
            return -1;
        }
        if (!pf[0].revents) continue;
        ssize_t k = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (k < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
            *why = strerror(errno);
            return -1;
        }
        if (k == 0) {
            *why = "connection closed by the peer";
            return -1;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int io_full(int fd, void *buf, size_t len, int writing, uint64_t deadline_ns, const char **why) {
    return io_full_x(fd, buf, len, writing, deadline_ns, 1, why);
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* reply: magic, status, len, payload */
static int send_reply(int fd, uint32_t status, const void *payload, size_t len, uint64_t deadline_ns) {
    unsigned char h[16];
    memcpy(h, k_magic, 8);
    put_u32(h + 8, status);
    put_u32(h + 12, (uint32_t)len);
    const char *why = NULL;
    if (io_full_x(fd, h, sizeof h, 1, deadline_ns, 0, &why) < 0) return -1;
    if (len && io_full_x(fd, (void *)payload, len, 1, deadline_ns, 0, &why) < 0) return -1;
    return 0;
}

/* ---------------------------------------------------------------- node 0 */

int comm_bootstrap_listen(int port, int *fd_out, int *bound_port, um_err *err) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int v6 = 1;
    if (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        v6 = 0;
    }
    if (fd < 0) return um_err_set(err, UM_ERR_IO, "bootstrap: socket(): %s", strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);   /* accept IPv4 too */
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc < 0 || listen(fd, 64) < 0) {
        int e = errno;
        close(fd);
        return um_err_set(err, UM_ERR_IO, "bootstrap: cannot listen on port %d: %s", port, strerror(e));
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 && bound_port)
        *bound_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                               : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

static void close_all(int *fds, int n) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
}

static int bootstrap_serve(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms, const comm_fingerprint *fp,
                           int *keep, um_err *err);

int comm_bootstrap_serve(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms, um_err *err) {
    return bootstrap_serve(lfd, nnodes, blob, len, timeout_ms, NULL, NULL, err);
}

/* "1, 3": the nodes r >= 1 with peer[r] < 0 */
static void missing_nodes(const int *peer, int nnodes, char *out, size_t cap) {
    size_t o = 0;
    out[0] = '\0';
    for (int r = 1; r < nnodes && o + 16 < cap; r++)
        if (peer[r] < 0) o += (size_t)snprintf(out + o, cap - o, "%s%d", o ? ", " : "", r);
}

/* The error for a rendezvous that ended before every node joined: cancelled (stopped: a stop was
 * requested) or timed out, naming the missing nodes. Returns -1. */
static int join_wait_error(const int *peer, int nnodes, int joined, int timeout_ms, int stopped, um_err *err) {
    char missing[256];
    missing_nodes(peer, nnodes, missing, sizeof missing);
    if (stopped)   /* SIGINT / SIGTERM: give up now, the joined nodes are told by the caller */
        return um_err_set(err, UM_ERR_CANCELLED,
                          "bootstrap: %s while waiting for node%s %s to connect (%d of %d nodes joined)", stop_why(),
                          nnodes - joined > 1 ? "s" : "", missing, joined, nnodes);
    return um_err_set(err, UM_ERR_IO,
                      "bootstrap: timed out after %d ms waiting for node%s %s to connect (%d of %d nodes joined)",
                      timeout_ms, nnodes - joined > 1 ? "s" : "", missing, joined, nnodes);
}

/* A joining node's hello on fd: its nnodes, rank and fingerprint (*fp_out malloc'd, NULL when
 * empty). 0, or -1 (warning logged) when the connection is not a node or its hello was cut short. */
static int read_hello(int fd, uint64_t deadline, uint32_t *their_n, uint32_t *their_r, uint8_t **fp_out,
                      uint32_t *fp_len_out) {
    unsigned char h[16];
    const char *why = NULL;
    /* a silent connection must not eat the whole budget of the others: 5 s to say hello */
    uint64_t hello_deadline = time_now_ns() + 5000ull * 1000000ull;
    if (hello_deadline > deadline) hello_deadline = deadline;
    if (io_full(fd, h, sizeof h, 0, hello_deadline, &why) < 0 || memcmp(h, k_magic, 8) != 0) {
        log_warn("bootstrap: ignoring a connection that did not identify itself (%s)", why ? why : "bad magic");
        return -1;
    }
    *their_n = get_u32(h + 8), *their_r = get_u32(h + 12);
    unsigned char lb[4];
    uint32_t fp_len = 0;
    uint8_t *their_fp = NULL;
    if (io_full(fd, lb, 4, 0, hello_deadline, &why) < 0 || (fp_len = get_u32(lb)) > FP_MAX_BYTES ||
        (fp_len && io_full(fd, their_fp = xmalloc(fp_len), fp_len, 0, hello_deadline, &why) < 0)) {
        log_warn("bootstrap: ignoring a connection whose hello was cut short (%s)", why ? why : "fingerprint too long");
        free(their_fp);
        return -1;
    }
    *fp_out = their_fp;
    *fp_len_out = fp_len;
    return 0;
}

/* Why node 0 refuses a hello (different setup fingerprint, nnodes, a rank out of range or taken):
 * 1 with the reason in msg, or 0 when the node may join. */
static int hello_refused(const comm_fingerprint *fp, int nnodes, const int *peer, uint32_t their_n, uint32_t their_r,
                         const uint8_t *their_fp, uint32_t fp_len, char *msg, size_t cap) {
    const int fp_check = fp && fp->data && (int)their_n == nnodes && their_r >= 1 && (int)their_r < nnodes;
    if (fp_check && (fp_len != fp->len || memcmp(their_fp, fp->data, fp_len) != 0)) {
        if (fp_len != fp->len)
            snprintf(msg, cap, "node %u's setup fingerprint has %u bytes, node 0's %zu (different unmask versions?)",
                     their_r, fp_len, fp->len);
        else if (fp->describe)
            fp->describe(fp->data, their_fp, fp_len, (int)their_r, msg, cap);
        else
            snprintf(msg, cap, "node %u's setup differs from node 0's", their_r);
    } else if ((int)their_n != nnodes) {
        snprintf(msg, cap, "nnodes mismatch: node %u says --nnodes %u, node 0 has --nnodes %d", their_r, their_n, nnodes);
    } else if (their_r < 1 || (int)their_r >= nnodes) {
        snprintf(msg, cap, "node rank %u out of range 1..%d", their_r, nnodes - 1);
    } else if (peer[their_r] >= 0) {
        snprintf(msg, cap, "two nodes claim --node-rank %u", their_r);
    } else {
        return 0;
    }
    return 1;
}

/* Accepts nodes on lfd until all nnodes joined (peer[r] = their connections). 0, or -1 + err
 * (stopped, timed out, or a node refused: that node is told why and disconnected). */
static int accept_nodes(int lfd, int nnodes, int timeout_ms, uint64_t deadline, const comm_fingerprint *fp, int *peer,
                        um_err *err) {
    int joined = 1;
    while (joined < nnodes) {
        struct pollfd pf[2] = {{lfd, POLLIN, 0}, {g_stop_pipe[0], POLLIN, 0}};
        int ms = remaining_ms(deadline);
        int pr = ms && !stop_why() ? poll(pf, 2, ms) : 0;
        if (pr < 0 && errno == EINTR) continue;
        const int stopped = stop_why() != NULL;
        if (stopped || pr <= 0) return join_wait_error(peer, nnodes, joined, timeout_ms, stopped, err);
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        uint32_t their_n = 0, their_r = 0, fp_len = 0;
        uint8_t *their_fp = NULL;
        if (read_hello(fd, deadline, &their_n, &their_r, &their_fp, &fp_len) != 0) {
            close(fd);
            continue;
        }
        char msg[600];
        int refused = hello_refused(fp, nnodes, peer, their_n, their_r, their_fp, fp_len, msg, sizeof msg);
        free(their_fp);
        if (!refused) {
            peer[their_r] = fd;
            joined++;
            continue;
        }
        send_reply(fd, 1, msg, strlen(msg), deadline);
        close(fd);
        return um_err_set(err, UM_ERR_INVALID_ARG, "bootstrap: %s", msg);
    }
    return 0;
}

/* keep (or NULL): [nnodes] receives the open connection of every node r >= 1 on success (the
 * caller closes them); otherwise they are closed here */
static int bootstrap_serve(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms, const comm_fingerprint *fp,
                           int *keep, um_err *err) {
    if (timeout_ms <= 0) timeout_ms = 120000;
    const uint64_t deadline = time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    int *peer = xmalloc((size_t)nnodes * sizeof *peer);   /* peer[r] = fd of node r (r >= 1) */
    for (int r = 0; r < nnodes; r++) peer[r] = -1;
    int rc = accept_nodes(lfd, nnodes, timeout_ms, deadline, fp, peer, err);
    if (rc == 0) {
        for (int r = 1; r < nnodes; r++) {
            if (send_reply(peer[r], 0, blob, len, deadline) < 0) {
                rc = um_err_set(err, UM_ERR_IO, "bootstrap: sending the id to node %d failed", r);
                break;
            }
        }
    } else {
        char m[800];
        snprintf(m, sizeof m, "node 0 aborted the rendezvous: %s", err ? err->msg : "error");
        for (int r = 1; r < nnodes; r++)
            if (peer[r] >= 0) send_reply(peer[r], 1, m, strlen(m), time_now_ns() + 1000000000ull);
    }
    if (rc == 0 && keep) {
        for (int r = 0; r < nnodes; r++) keep[r] = peer[r];
    } else {
        close_all(peer, nnodes);
    }
    free(peer);
    close(lfd);
    return rc;
}

/* ---------------------------------------------------------------- other nodes */

static int connect_once(const struct addrinfo *ai, uint64_t deadline_ns, int *out, const char **why) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
        *why = strerror(errno);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd pf[2] = {{fd, POLLOUT, 0}, {g_stop_pipe[0], POLLIN, 0}};
        int ms = remaining_ms(deadline_ns);
        if (ms > 1000) ms = 1000;
        rc = poll(pf, 2, ms) >= 1 && pf[0].revents ? 0 : -1;
        if (rc == 0) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) {
                errno = soerr;
                rc = -1;
            }
        } else {
            errno = ETIMEDOUT;
        }
    }
    if (rc < 0) {
        *why = strerror(errno);
        close(fd);
        return -1;
    }
    fcntl(fd, F_SETFL, fl);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    *out = fd;
    return 0;
}

static int bootstrap_join(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len, int timeout_ms,
                          const comm_fingerprint *fp, int *keep, um_err *err);

int comm_bootstrap_join(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len, int timeout_ms,
                        um_err *err) {
    return bootstrap_join(host, port, nnodes, node_rank, blob, len, timeout_ms, NULL, NULL, err);
}

/* keep (or NULL): receives the open connection to node 0 on success (the caller closes it) */
static int bootstrap_join(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len, int timeout_ms,
                          const comm_fingerprint *fp, int *keep, um_err *err) {
    if (timeout_ms <= 0) timeout_ms = 120000;
    const uint64_t deadline = time_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, ports, &hints, &res);
    if (gai != 0) return um_err_set(err, UM_ERR_IO, "bootstrap: cannot resolve '%s': %s", host, gai_strerror(gai));
    int fd = -1;
    const char *why = "timed out";
    while (fd < 0) {   /* node 0 may not be listening yet: retry until the deadline */
        for (const struct addrinfo *ai = res; ai && fd < 0 && !stop_why(); ai = ai->ai_next)
            if (connect_once(ai, deadline, &fd, &why) == 0) break;
        if (fd >= 0 || remaining_ms(deadline) == 0 || stop_why()) break;
        struct pollfd sp = {g_stop_pipe[0], POLLIN, 0};   /* 100 ms between tries, or a stop request */
        if (poll(&sp, 1, 100) < 0 && errno != EINTR) usleep(100000);
    }
    freeaddrinfo(res);
    if (fd < 0 && stop_why())
        return um_err_set(err, UM_ERR_CANCELLED, "bootstrap: node %d: %s while connecting to node 0 at %s:%d", node_rank,
                          stop_why(), host, port);
    if (fd < 0)
        return um_err_set(err, UM_ERR_IO, "bootstrap: could not connect to node 0 at %s:%d within %d ms (%s)", host, port,
                          timeout_ms, why);
    const size_t fp_len = fp && fp->data ? fp->len : 0;
    CHECK(fp_len <= FP_MAX_BYTES);
    unsigned char *hello = xmalloc(20 + fp_len);
    memcpy(hello, k_magic, 8);
    put_u32(hello + 8, (uint32_t)nnodes);
    put_u32(hello + 12, (uint32_t)node_rank);
    put_u32(hello + 16, (uint32_t)fp_len);
    if (fp_len) memcpy(hello + 20, fp->data, fp_len);
    unsigned char h[16];
    int rc = 0;
    if (io_full(fd, hello, 20 + fp_len, 1, deadline, &why) < 0 || io_full(fd, h, sizeof h, 0, deadline, &why) < 0) {
        if (stop_why())
            rc = um_err_set(err, UM_ERR_CANCELLED, "bootstrap: node %d: %s while waiting for node 0 at %s:%d to start the "
                            "group", node_rank, stop_why(), host, port);
        else
            rc = um_err_set(err, UM_ERR_IO, "bootstrap: node %d: no answer from node 0 at %s:%d: %s", node_rank, host,
                            port, why);
    } else if (memcmp(h, k_magic, 8) != 0) {
        rc = um_err_set(err, UM_ERR_IO, "bootstrap: %s:%d is not an unmask bootstrap endpoint", host, port);
    } else {
        uint32_t status = get_u32(h + 8), n = get_u32(h + 12);
        if (status != 0) {
            char msg[512];
            size_t k = n < sizeof msg - 1 ? n : sizeof msg - 1;
            if (io_full(fd, msg, k, 0, deadline, &why) < 0) k = 0;
            msg[k] = '\0';
            rc = um_err_set(err, UM_ERR_INVALID_ARG, "bootstrap: node 0 refused node %d: %s", node_rank, msg);
        } else if (n != len) {
            rc = um_err_set(err, UM_ERR_FORMAT, "bootstrap: node 0 sent %u bytes, expected %zu", n, len);
        } else if (io_full(fd, blob, len, 0, deadline, &why) < 0) {
            rc = um_err_set(err, UM_ERR_IO, "bootstrap: receiving from node 0: %s", why);
        }
    }
    free(hello);
    if (rc == 0 && keep) *keep = fd;
    else close(fd);
    return rc;
}

int comm_bootstrap_exchange(const comm_dist_opts *o, void *blob, size_t len, um_err *err) {
    comm_link *l = NULL;
    int rc = comm_bootstrap_exchange_link(o, blob, len, &l, err);
    comm_link_close(l); /* the exchange alone: no liveness link kept */
    return rc;
}

struct comm_link {
    int             follower;     /* 1: this is node r >= 1's link to node 0 (forwards stop requests) */
    int             n;            /* fds */
    int            *fd;           /* [n] open bootstrap connections (node 0: one per other node) */
    int            *node;         /* [n] the node at the other end */
    int             wake[2];      /* self-pipe: comm_link_close wakes the watcher */
    pthread_t       th;
    int             watching;
    void          (*on_lost)(void *user, int node);
    void          (*on_stop)(void *user, int node, int sig);   /* node 0: a follower's stop request, or NULL */
    void          (*on_error)(void *user, int node, const char *msg);   /* a peer's setup failure, or NULL */
    void           *user;
    pthread_mutex_t send_lock;    /* writers of link messages (rank threads, the watcher) */
};

#define LINK_BUF 1100   /* per peer: the longest message ("E" + u16 + 1024 bytes) */

static comm_link *link_new(int n) {
    comm_link *l = xcalloc(1, sizeof *l);
    pthread_mutex_init(&l->send_lock, NULL);
    l->wake[0] = l->wake[1] = -1;
    l->n = n;
    l->fd = xmalloc((size_t)n * sizeof *l->fd);
    l->node = xmalloc((size_t)n * sizeof *l->node);
    return l;
}

int comm_bootstrap_serve_link(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms, comm_link **link,
                              um_err *err) {
    return comm_bootstrap_serve_link_fp(lfd, nnodes, blob, len, timeout_ms, NULL, link, err);
}

int comm_bootstrap_serve_link_fp(int lfd, int nnodes, const void *blob, size_t len, int timeout_ms,
                                 const comm_fingerprint *fp, comm_link **link, um_err *err) {
    *link = NULL;
    int *keep = xmalloc((size_t)nnodes * sizeof *keep);
    int rc = bootstrap_serve(lfd, nnodes, blob, len, timeout_ms, fp, keep, err);
    if (rc == 0) {
        comm_link *l = link_new(nnodes - 1);
        for (int r = 1; r < nnodes; r++) l->fd[r - 1] = keep[r], l->node[r - 1] = r;
        *link = l;
    }
    free(keep);
    return rc;
}

int comm_bootstrap_join_link(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len,
                             int timeout_ms, comm_link **link, um_err *err) {
    return comm_bootstrap_join_link_fp(host, port, nnodes, node_rank, blob, len, timeout_ms, NULL, link, err);
}

int comm_bootstrap_join_link_fp(const char *host, int port, int nnodes, int node_rank, void *blob, size_t len,
                                int timeout_ms, const comm_fingerprint *fp, comm_link **link, um_err *err) {
    *link = NULL;
    int fd = -1;
    if (bootstrap_join(host, port, nnodes, node_rank, blob, len, timeout_ms, fp, &fd, err) != 0) return -1;
    comm_link *l = link_new(1);
    l->follower = 1;
    l->fd[0] = fd;
    l->node[0] = 0;
    *link = l;
    return 0;
}

int comm_bootstrap_exchange_link(const comm_dist_opts *o, void *blob, size_t len, comm_link **link, um_err *err) {
    *link = NULL;
    if (comm_dist_opts_check(o, err) < 0) return -1;
    if (o->nnodes == 1) return 0;
    char host[256];
    int port;
    if (comm_parse_addr(o->init_addr, host, sizeof host, &port, err) < 0) return -1;
    if (o->node_rank == 0) {
        int fd;
        if (comm_bootstrap_listen(port, &fd, NULL, err) < 0) return -1;
        log_info("bootstrap: node 0 listening on port %d for %d node(s)", port, o->nnodes - 1);
        return comm_bootstrap_serve_link_fp(fd, o->nnodes, blob, len, o->timeout_ms, &o->fp, link, err);
    }
    return comm_bootstrap_join_link_fp(host, port, o->nnodes, o->node_rank, blob, len, o->timeout_ms, &o->fp, link, err);
}

/* Watcher thread: a peer's connection that reads EOF or fails means that node is gone. */
static void *link_main(void *arg) {
    comm_link *l = arg;
    struct pollfd *pf = xcalloc((size_t)l->n + 2, sizeof *pf);
    int *alive = xmalloc((size_t)l->n * sizeof *alive);
    unsigned char *buf = xmalloc((size_t)l->n * LINK_BUF);   /* [n][LINK_BUF] bytes received, not parsed yet */
    size_t *have = xcalloc((size_t)l->n, sizeof *have);
    for (int i = 0; i < l->n; i++) pf[i] = (struct pollfd){l->fd[i], POLLIN, 0}, alive[i] = 1;
    pf[l->n] = (struct pollfd){l->wake[0], POLLIN, 0};
    pf[l->n + 1] = (struct pollfd){l->follower ? g_stop_pipe[0] : -1, POLLIN, 0};   /* stop requests to forward */
    for (;;) {
        int r = poll(pf, (nfds_t)l->n + 2, -1);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 || pf[l->n].revents) break;   /* comm_link_close */
        if (pf[l->n + 1].revents && comm_stop_signal()) {   /* follower: ask node 0 to stop the group, once */
            const int sig = comm_stop_signal();
            unsigned char m[2] = {'S', (unsigned char)sig};
            const char *why = NULL;
            pf[l->n + 1].fd = -1;
            log_info("tensor parallel: %s: asking node 0 to stop the group", sig_name(sig));
            pthread_mutex_lock(&l->send_lock);
            if (alive[0] && io_full_x(l->fd[0], m, 2, 1, time_now_ns() + 5000000000ull, 0, &why) < 0)
                log_warn("tensor parallel: could not send the stop request to node 0: %s", why);
            pthread_mutex_unlock(&l->send_lock);
        }
        for (int i = 0; i < l->n; i++) {
            if (!alive[i] || !pf[i].revents) continue;
            unsigned char *b = buf + (size_t)i * LINK_BUF;
            ssize_t k = recv(l->fd[i], b + have[i], LINK_BUF - have[i], MSG_DONTWAIT);
            if (k > 0) {   /* parse whole messages: "S" sig (node 0 only), "E" len msg; unknown bytes dropped */
                size_t n = have[i] + (size_t)k, at = 0;
                while (at < n) {
                    if (b[at] == 'S') {
                        if (n - at < 2) break;
                        if (!l->follower && l->on_stop) l->on_stop(l->user, l->node[i], b[at + 1]);
                        at += 2;
                    } else if (b[at] == 'E') {
                        if (n - at < 3) break;
                        size_t len = (size_t)b[at + 1] | (size_t)b[at + 2] << 8;
                        if (n - at < 3 + len) break;
                        char msg[1025];
                        memcpy(msg, b + at + 3, len);
                        msg[len] = '\0';
                        if (l->on_error) l->on_error(l->user, l->node[i], msg);
                        at += 3 + len;
                    } else {
                        at++;
                    }
                }
                memmove(b, b + at, n - at);
                have[i] = n - at;
                continue;
            }
            if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            alive[i] = 0;
            pf[i].fd = -1;   /* poll ignores it from now on */
            l->on_lost(l->user, l->node[i]);
        }
    }
    free(have);
    free(buf);
    free(alive);
    free(pf);
    return NULL;
}

void comm_link_on_error(comm_link *l, void (*on_error)(void *user, int node, const char *msg)) {
    if (l) l->on_error = on_error;
}

void comm_link_send_error(comm_link *l, const char *msg) {
    if (!l) return;
    size_t len = strlen(msg);
    if (len > 1024) len = 1024;
    unsigned char m[3 + 1024];
    m[0] = 'E', m[1] = (unsigned char)len, m[2] = (unsigned char)(len >> 8);
    memcpy(m + 3, msg, len);
    /* --- send lock { */
    pthread_mutex_lock(&l->send_lock);
    for (int i = 0; i < l->n; i++) {
        const char *why = NULL;
        if (io_full_x(l->fd[i], m, 3 + len, 1, time_now_ns() + 2000000000ull, 0, &why) < 0)
            log_warn("tensor parallel: could not tell node %d about the setup failure: %s", l->node[i], why);
    }
    pthread_mutex_unlock(&l->send_lock);
    /* } send lock --- */
}

void comm_link_watch(comm_link *l, void (*on_lost)(void *user, int node), void (*on_stop)(void *user, int node, int sig),
                     void *user) {
    if (!l || l->watching) return;
    CHECK(pipe2(l->wake, O_CLOEXEC) == 0);
    l->on_lost = on_lost;
    l->on_stop = on_stop;
    l->user = user;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    if (pthread_create(&l->th, NULL, link_main, l) != 0) UM_FATAL("cannot start the bootstrap link watcher");
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    l->watching = 1;
}

void comm_link_close(comm_link *l) {
    if (!l) return;
    if (l->watching) {
        char c = 1;
        ssize_t w = write(l->wake[1], &c, 1);
        (void)w;
        pthread_join(l->th, NULL);
    }
    for (int i = 0; i < l->n; i++) close(l->fd[i]);
    if (l->wake[0] >= 0) close(l->wake[0]);
    if (l->wake[1] >= 0) close(l->wake[1]);
    pthread_mutex_destroy(&l->send_lock);
    free(l->fd);
    free(l->node);
    free(l);
}
