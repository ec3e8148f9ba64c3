/*
 * conn_guard.c — per-address connection caps, request deadlines, keep-alive idle timeouts and the
 * request sizes on the wire (see conn_guard.h).
 *
 * How a connection is followed. lws 4.1.6 announces an accepted socket (FILTER_NETWORK_CONNECTION,
 * with the peer's address: the cap is applied there), creates its wsi (WSI_CREATE) and adopts it
 * (SERVER_NEW_CLIENT_INSTANTIATED, on the default protocol), all in one call; the record created at
 * the accept is bound to the wsi at the adoption (lws's opaque user data, which lws leaves alone for
 * server connections) and freed at WSI_DESTROY, whatever protocol the connection had by then.
 *
 * When a request starts. A connection's first request starts at the accept. The next request on a
 * keep-alive connection starts with its first byte, which lws reads without telling anyone: one
 * timer of the guard looks at every idle connection's count of received bytes (TCP_INFO) every
 * GUARD_IDLE_TICK_S at most, so the deadline of such a request starts at most one tick late (it is
 * never shorter than --request-timeout); the same look closes connections idle for too long. A
 * request's own deadline is a timer of its connection, set once per request.
 *
 * Bytes of a request. The kernel's count of bytes received on the socket (TCP_INFO), taken when a
 * request begins (after the TLS handshake on TLS), tells how many bytes the request took on the
 * wire: http.c bounds the headers lws 4.1.6 cannot list with it (conn_guard_request_bytes).
 *
 * Not here: HTTP requests and answers (http.c), WebSocket sessions (ws.c). Threads: lws service
 * thread only.
 */
#include "server/conn_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "server/metrics.h"
#include "server/http_wire.h"
#include "util/log.h"
#include "util/netaddr.h"
#include "util/timeutil.h"

#define GUARD_BUCKETS       1024
#define GUARD_IDLE_TICK_S   1.0    /* longest gap between two looks at an idle connection */
#define GUARD_LINGER_TICK_S 0.02   /* after an answer written here: how often to drop input ... */
#define GUARD_LINGER_S      2.0    /* ... and for how long at most before closing */
#define GUARD_GRACE_S       1.0    /* a deadline waits this long at most for bytes that came in time */
#define GUARD_GRACE_TICK_S  0.05

/* Open connections of one client address (an IPv6 address's /64). */
typedef struct guard_addr {
    struct guard_addr *next;      /* bucket chain */
    unsigned char      key[17];   /* 4 or 6, then the address (IPv6: its first 8 bytes, the rest 0) */
    int                conns;     /* connections counted here */
} guard_addr;

typedef enum guard_state {
    GUARD_REQUEST,  /* a request is arriving: the deadline runs */
    GUARD_ANSWER,   /* the request is being answered: no timer */
    GUARD_IDLE,     /* keep-alive between requests: the guard's tick looks for the next request */
    GUARD_OPEN,     /* WebSocket, or raw: no timer */
    GUARD_CLOSING,  /* closing (after an answer written here: dropping input until the client
                     * closes) */
} guard_state;

typedef struct guard_conn guard_conn;
struct guard_conn {
    guard_conn  *prev, *next;     /* every record of the guard */
    conn_guard  *g;
    struct lws  *wsi;             /* NULL until adopted */
    guard_addr  *addr;            /* where the connection is counted, NULL: not counted */
    lws_sorted_usec_list_t sul;   /* the state's timer */
    guard_state  state;
    double       t0;              /* monotonic s: REQUEST: the request began; IDLE: the last answer
                                   * ended; CLOSING: the answer was written */
    int          head_done;       /* REQUEST: the head was parsed (http.c holds the request) */
    int          tls;             /* a TLS connection */
    int          ref_valid;       /* recv_ref counts from the start of the request (on TLS: taken
                                   * once the handshake was over) */
    uint64_t     recv_ref;        /* bytes the socket had received when the current request began
                                   * (for TLS: at the end of the handshake) */
};

struct conn_guard {
    double           request_s;   /* --request-timeout */
    double           idle_s;      /* --keepalive-timeout */
    double           idle_tick_s; /* how often the idle connections are looked at */
    lws_sorted_usec_list_t tick;  /* ... by this timer */
    int              cap;         /* --max-conns-per-address, 0 = none */
    net_cidr        *exempt;      /* [n_exempt] --trusted-proxies (owned) */
    int              n_exempt;
    struct metrics  *metrics;
    struct lws_context *ctx;      /* NULL before start / after stop */
    conn_guard_late_body_fn late_body; /* the HTTP layer's 408 for a late body, or NULL */
    int              stopped;
    guard_addr      *buckets[GUARD_BUCKETS];
    guard_conn      *conns;       /* every record */
    guard_conn      *pending;     /* accepted, its wsi not adopted yet ... */
    struct lws      *pending_wsi; /* ... though created (WSI_CREATE), or NULL */
    conn_guard_stats st;
    double           last_refusal_log; /* monotonic s */
    long long        refused_unlogged;
};

static void guard_timer(lws_sorted_usec_list_t *sul);

/* ---------------------------------------------------------------- sockets */

/* Bytes the kernel has received on a TCP socket (read by the program or not); -1 when unknown. */
static int sock_received(int fd, uint64_t *received) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
        return -1;
    *received = ti.tcpi_bytes_received;
    return 0;
}

int conn_peer_gone(struct lws *wsi) {
    struct pollfd p = {.fd = (int)lws_get_socket_fd(wsi), .events = POLLRDHUP};
    if (p.fd < 0) return 1;
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

int conn_drain_unread(struct lws *wsi) {
    int fd = (int)lws_get_socket_fd(wsi);
    char buf[4096];
    for (int i = 0; fd >= 0 && i < 256; i++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return 1;
        if (n < 0) return 0;
    }
    return fd < 0;
}

/* ---------------------------------------------------------------- per-address counts */

/* The counting key of a peer address: IPv4 (also when mapped into IPv6), or an IPv6 /64 (one
 * subscriber's or host's network: a single address is free to change within it). *family/a: the
 * address itself, unmapped, for the exemption check. */
static void addr_key(const struct sockaddr_storage *ss, unsigned char key[17], int *family, unsigned char a[16]) {
    memset(key, 0, 17);
    memset(a, 0, 16);
    *family = ss->ss_family;
    if (ss->ss_family == AF_INET) memcpy(a, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    else if (ss->ss_family == AF_INET6) memcpy(a, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    net_addr_unmap(family, a);
    key[0] = *family == AF_INET ? 4 : 6;
    memcpy(key + 1, a, *family == AF_INET ? 4 : 8);
}

static unsigned addr_hash(const unsigned char key[17]) {
    unsigned h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < 17; i++) h = (h ^ key[i]) * 16777619u;
    return h % GUARD_BUCKETS;
}

/* The entry of key, created (with 0 connections) when absent. */
static guard_addr *addr_get(conn_guard *g, const unsigned char key[17]) {
    guard_addr **b = &g->buckets[addr_hash(key)];
    for (guard_addr *a = *b; a; a = a->next)
        if (memcmp(a->key, key, 17) == 0) return a;
    guard_addr *a = xcalloc(1, sizeof *a);
    memcpy(a->key, key, 17);
    a->next = *b;
    *b = a;
    g->st.addresses++;
    return a;
}

static void addr_put(conn_guard *g, guard_addr *a) {
    if (!a || --a->conns > 0) return;
    for (guard_addr **p = &g->buckets[addr_hash(a->key)]; *p; p = &(*p)->next)
        if (*p == a) {
            *p = a->next;
            break;
        }
    g->st.addresses--;
    free(a);
}

/* ---------------------------------------------------------------- records */

static guard_conn *conn_of(struct lws *wsi) { return wsi ? lws_get_opaque_user_data(wsi) : NULL; }

static void timer_at(guard_conn *r, double seconds) {
    if (!r->g->ctx || r->g->stopped) return;
    if (seconds < 0) seconds = 0;
    lws_sul_schedule(r->g->ctx, 0, &r->sul, guard_timer, (lws_usec_t)(seconds * LWS_US_PER_SEC));
}

static void conn_free(conn_guard *g, guard_conn *r) {
    lws_sul_cancel(&r->sul);
    addr_put(g, r->addr);
    if (r->prev) r->prev->next = r->next;
    else g->conns = r->next;
    if (r->next) r->next->prev = r->prev;
    g->st.open--;
    free(r);
}

/* The next request's bytes are counted from here (what the socket received until now). */
static void recv_ref_take(guard_conn *r) {
    uint64_t v = 0;
    if (r->wsi && sock_received((int)lws_get_socket_fd(r->wsi), &v) == 0) r->recv_ref = v;
}

/* A request starts now (t0): its deadline is armed. */
static void request_begin(guard_conn *r, double t0) {
    r->state = GUARD_REQUEST;
    r->head_done = 0;
    r->t0 = t0;
    timer_at(r, t0 + r->g->request_s - time_now_s());
}

/* Close the connection soon, without writing anything more. */
static void conn_kill(guard_conn *r) {
    r->state = GUARD_CLOSING;
    lws_sul_cancel(&r->sul);
    lws_set_timeout(r->wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC);
}

/* Writes a JSON error straight to the socket of a connection whose head is not (or not fully)
 * parsed, then closes it gracefully: our side shut, what the client still sends dropped until it
 * closes or GUARD_LINGER_S pass (closing with unread input would reset the answer away). */
static void answer_and_close(guard_conn *r, int status, const char *code, const char *msg) {
    unsigned char buf[LWS_PRE + 1024];
    size_t n = http_error_bytes((char *)buf + LWS_PRE, sizeof buf - LWS_PRE, status, code, msg, NULL);
    r->state = GUARD_CLOSING;
    r->t0 = time_now_s();
    if (lws_write(r->wsi, buf + LWS_PRE, n, LWS_WRITE_HTTP) < (int)n || lws_partial_buffered(r->wsi)) {
        conn_kill(r); /* (lws flushes what it buffered before closing) */
        return;
    }
    int fd = (int)lws_get_socket_fd(r->wsi);
    if (!r->tls && fd >= 0) shutdown(fd, SHUT_WR);
    lws_rx_flow_control(r->wsi, 0);
    timer_at(r, GUARD_LINGER_TICK_S);
}

/* ---------------------------------------------------------------- timers */

/* 1 when bytes wait in the socket that lws has not read yet. */
static int sock_unread(int fd) {
    int n = 0;
    return fd >= 0 && ioctl(fd, FIONREAD, &n) == 0 && n > 0;
}

static void on_deadline(guard_conn *r) {
    conn_guard *g = r->g;
    /* bytes that arrived in time but wait unread (the service thread was busy): let lws read them
     * first, they may complete the request (an attacker's drip is read as soon as it comes) */
    if (sock_unread((int)lws_get_socket_fd(r->wsi)) && time_now_s() < r->t0 + g->request_s + GUARD_GRACE_S) {
        timer_at(r, GUARD_GRACE_TICK_S);
        return;
    }
    g->st.timed_out++;
    if (g->metrics) metrics_conn_limit(g->metrics, "request_timeout");
    if (r->head_done) { /* the body is late: http.c answers 408 (and closes) */
        if (g->late_body && g->late_body(r->wsi)) r->state = GUARD_ANSWER;
        else conn_kill(r);
        return;
    }
    uint64_t recv = 0;
    int have = sock_received((int)lws_get_socket_fd(r->wsi), &recv) == 0;
    /* nothing to answer: TLS not up, not a byte of a request arrived (an idle new connection), or
     * the client is gone */
    SSL *ssl = r->tls ? lws_get_ssl(r->wsi) : NULL;
    if ((r->tls && (!ssl || !SSL_is_init_finished(ssl))) || (have && recv == r->recv_ref) || conn_peer_gone(r->wsi)) {
        conn_kill(r);
        return;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "the request did not arrive within %g s (--request-timeout)", g->request_s);
    answer_and_close(r, 408, "request_timeout", msg);
}

/* An idle keep-alive connection: has the next request begun? Or has it idled long enough? */
static void idle_look(guard_conn *r, double now) {
    conn_guard *g = r->g;
    uint64_t recv = 0;
    if (sock_received((int)lws_get_socket_fd(r->wsi), &recv) == 0 && recv != r->recv_ref) {
        request_begin(r, now); /* the first byte came after the last look: at most a tick ago */
        return;
    }
    if (now - r->t0 >= g->idle_s) {
        g->st.idle_closed++;
        if (g->metrics) metrics_conn_limit(g->metrics, "keepalive_idle");
        conn_kill(r);
    }
}

/* The guard's tick: every idle connection looked at, O(connections) per tick. */
static void guard_tick(lws_sorted_usec_list_t *sul) {
    conn_guard *g = lws_container_of(sul, conn_guard, tick);
    if (g->stopped || !g->ctx) return;
    double now = time_now_s();
    for (guard_conn *r = g->conns; r; r = r->next)
        if (r->state == GUARD_IDLE && r->wsi) idle_look(r, now);
    lws_sul_schedule(g->ctx, 0, &g->tick, guard_tick, (lws_usec_t)(g->idle_tick_s * LWS_US_PER_SEC));
}

static void on_linger_tick(guard_conn *r) {
    if (conn_drain_unread(r->wsi) || time_now_s() - r->t0 >= GUARD_LINGER_S) {
        lws_set_timeout(r->wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC);
        return;
    }
    timer_at(r, GUARD_LINGER_TICK_S);
}

static void guard_timer(lws_sorted_usec_list_t *sul) {
    guard_conn *r = lws_container_of(sul, guard_conn, sul);
    if (!r->wsi || r->g->stopped) return;
    switch (r->state) {
    case GUARD_REQUEST: on_deadline(r); break;
    case GUARD_CLOSING: on_linger_tick(r); break;
    case GUARD_IDLE:
    case GUARD_ANSWER:
    case GUARD_OPEN: break;
    }
}

/* ---------------------------------------------------------------- lifecycle */

conn_guard *conn_guard_new(const server_config *cfg, struct metrics *m, um_err *err) {
    conn_guard *g = xcalloc(1, sizeof *g);
    if (net_cidr_list_parse(cfg->trusted_proxies, "trusted-proxies", &g->exempt, &g->n_exempt, err) != 0) {
        free(g);
        return NULL;
    }
    g->request_s = cfg->request_timeout_s;
    g->idle_s = cfg->keepalive_timeout_s;
    g->idle_tick_s = GUARD_IDLE_TICK_S;
    if (g->request_s / 8 < g->idle_tick_s) g->idle_tick_s = g->request_s / 8;
    if (g->idle_s / 8 < g->idle_tick_s) g->idle_tick_s = g->idle_s / 8;
    g->cap = cfg->max_conns_per_address;
    g->metrics = m;
    return g;
}

void conn_guard_set_late_body(conn_guard *g, conn_guard_late_body_fn fn) { g->late_body = fn; }

void conn_guard_start(conn_guard *g, struct lws_context *ctx) {
    g->ctx = ctx;
    g->stopped = 0;
    lws_sul_schedule(ctx, 0, &g->tick, guard_tick, (lws_usec_t)(g->idle_tick_s * LWS_US_PER_SEC));
}

void conn_guard_stop(conn_guard *g) {
    g->stopped = 1;
    lws_sul_cancel(&g->tick);
    for (guard_conn *r = g->conns; r; r = r->next) lws_sul_cancel(&r->sul);
    g->ctx = NULL;
}

void conn_guard_free(conn_guard *g) {
    if (!g) return;
    while (g->conns) conn_free(g, g->conns);
    for (int i = 0; i < GUARD_BUCKETS; i++) /* (all gone with their connections) */
        while (g->buckets[i]) {
            guard_addr *a = g->buckets[i];
            g->buckets[i] = a->next;
            free(a);
        }
    free(g->exempt);
    free(g);
}

void conn_guard_get_stats(const conn_guard *g, conn_guard_stats *out) { *out = g->st; }

int conn_guard_on_accept(conn_guard *g, const struct lws_filter_network_conn_args *args) {
    if (g->pending) { /* the last accepted socket never got a wsi (lws closed it itself) */
        conn_free(g, g->pending);
        g->pending = NULL;
        g->pending_wsi = NULL;
    }
    unsigned char key[17], a[16];
    int family;
    addr_key(&args->cli_addr, key, &family, a);
    guard_addr *ad = NULL;
    if (g->cap > 0 && !net_cidr_list_contains(g->exempt, g->n_exempt, family, a)) {
        ad = addr_get(g, key);
        if (ad->conns >= g->cap) {
            g->st.refused++;
            if (g->metrics) metrics_conn_limit(g->metrics, "per_address");
            double now = time_now_s();
            g->refused_unlogged++;
            if (now - g->last_refusal_log >= 10) { /* a flood must not flood the log */
                char shown[INET6_ADDRSTRLEN] = "?";
                inet_ntop(family, a, shown, sizeof shown);
                log_warn("connection from %s closed: %d connections open from %s%s (--max-conns-per-address); "
                         "%lld refused since the last such line",
                         shown, ad->conns, shown, family == AF_INET6 ? "/64" : "", g->refused_unlogged);
                g->last_refusal_log = now;
                g->refused_unlogged = 0;
            }
            if (ad->conns == 0) addr_put(g, ad);
            return 1;
        }
        ad->conns++;
    }
    guard_conn *r = xcalloc(1, sizeof *r);
    r->g = g;
    r->addr = ad;
    r->next = g->conns;
    if (g->conns) g->conns->prev = r;
    g->conns = r;
    g->st.open++;
    g->pending = r;
    g->pending_wsi = NULL;
    r->state = GUARD_REQUEST;
    r->t0 = time_now_s();
    return 0;
}

void conn_guard_on_wsi_create(conn_guard *g, struct lws *wsi) {
    if (g->pending && !g->pending_wsi) g->pending_wsi = wsi;
}

void conn_guard_on_adopt(conn_guard *g, struct lws *wsi) {
    if (!g->pending || g->pending_wsi != wsi) return;
    guard_conn *r = g->pending;
    g->pending = NULL;
    g->pending_wsi = NULL;
    r->wsi = wsi;
    lws_set_opaque_user_data(wsi, r);
    r->tls = lws_is_ssl(wsi);
    r->recv_ref = 0; /* every byte of a plain connection so far is its first request's */
    r->ref_valid = !r->tls;
    request_begin(r, r->t0); /* the first request started at the accept */
}

void conn_guard_on_wsi_destroy(conn_guard *g, struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    if (!r && g->pending && g->pending_wsi == wsi) { /* closed during its adoption */
        r = g->pending;
        g->pending = NULL;
        g->pending_wsi = NULL;
    }
    if (!r) return;
    lws_set_opaque_user_data(wsi, NULL);
    conn_free(g, r);
}

void conn_guard_on_tls_info(struct lws *wsi, int where) {
    guard_conn *r = conn_of(wsi);
    if (!r || !(where & SSL_CB_HANDSHAKE_DONE)) return;
    if (r->state == GUARD_REQUEST && !r->head_done) { /* the head follows the handshake */
        recv_ref_take(r);
        r->ref_valid = 1;
    }
}

long long conn_guard_request_bytes(struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    uint64_t v = 0;
    if (!r || !r->ref_valid || sock_received((int)lws_get_socket_fd(wsi), &v) != 0 || v < r->recv_ref) return -1;
    return (long long)(v - r->recv_ref);
}

/* ---------------------------------------------------------------- the request cycle */

void conn_guard_request_head(struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    if (!r) return;
    if (r->state == GUARD_IDLE) request_begin(r, time_now_s()); /* began between two looks */
    if (r->state == GUARD_REQUEST) r->head_done = 1;
}

void conn_guard_answering(struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    if (!r || r->state == GUARD_CLOSING) return;
    r->state = GUARD_ANSWER;
    lws_sul_cancel(&r->sul);
}

void conn_guard_idle(struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    if (!r || r->state == GUARD_CLOSING) return;
    r->state = GUARD_IDLE; /* (the guard's tick takes it from here) */
    r->head_done = 0;
    r->t0 = time_now_s();
    recv_ref_take(r);
    r->ref_valid = 1;
    lws_sul_cancel(&r->sul);
}

void conn_guard_open(struct lws *wsi) {
    guard_conn *r = conn_of(wsi);
    if (!r || r->state == GUARD_CLOSING) return;
    r->state = GUARD_OPEN;
    lws_sul_cancel(&r->sul);
}
