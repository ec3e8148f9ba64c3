/*
 * webhook.c — HMAC-signed HTTP POST deliveries with retries on a worker thread (see webhook.h).
 * Threads: webhook_enqueue/pending/free from any thread; the delivery loop on its own thread, which
 * blocks every signal.
 */
#include "jobs/webhook.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "util/log.h"
#include "util/timeutil.h"

/* ---------------------------------------------------------------- signing + URLs */

void webhook_sign(const char *secret, const void *body, size_t len, char out_hex[65]) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    const char *key = secret ? secret : "";
    unsigned char *r = HMAC(EVP_sha256(), key, (int)strlen(key), body, len, mac, &mac_len);
    CHECK(r != NULL && mac_len == 32);
    static const char hex[] = "0123456789abcdef";
    for (unsigned i = 0; i < 32; i++) {
        out_hex[2 * i] = hex[mac[i] >> 4];
        out_hex[2 * i + 1] = hex[mac[i] & 15];
    }
    out_hex[64] = 0;
}

int webhook_url_parse(const char *url, webhook_url *u, um_err *err) {
    memset(u, 0, sizeof *u);
    if (!url || strncmp(url, "http://", 7) != 0) {
        if (url && strncmp(url, "https://", 8) == 0)
            return um_err_param(err, "webhook", "webhook must be an http:// URL (https:// delivery is not supported)");
        return um_err_param(err, "webhook", "webhook must be an http:// URL, got '%.200s'", url ? url : "");
    }
    const char *p = url + 7;
    const char *host_end;
    if (*p == '[') {
        host_end = strchr(p, ']');
        if (!host_end) return um_err_param(err, "webhook", "webhook URL has an unterminated IPv6 address");
        if ((size_t)(host_end - p - 1) >= sizeof u->host) return um_err_param(err, "webhook", "webhook host too long");
        memcpy(u->host, p + 1, (size_t)(host_end - p - 1));
        p = host_end + 1;
    } else {
        size_t n = strcspn(p, ":/?#");
        if (n == 0 || n >= sizeof u->host) return um_err_param(err, "webhook", "webhook URL has no valid host");
        memcpy(u->host, p, n);
        p += n;
    }
    if (strchr(u->host, '@')) return um_err_param(err, "webhook", "webhook URL must not carry credentials");
    snprintf(u->port, sizeof u->port, "80");
    if (*p == ':') {
        p++;
        size_t n = strspn(p, "0123456789");
        long port = n ? strtol(p, NULL, 10) : 0;
        if (n == 0 || n > 5 || port < 1 || port > 65535)
            return um_err_param(err, "webhook", "webhook URL has an invalid port");
        snprintf(u->port, sizeof u->port, "%ld", port);
        p += n;
    }
    if (*p && *p != '/' && *p != '?') return um_err_param(err, "webhook", "webhook URL is malformed after the host");
    size_t pl = strcspn(p, "#");
    if (pl + 2 >= sizeof u->path) return um_err_param(err, "webhook", "webhook URL path too long");
    for (size_t i = 0; i < pl; i++)
        if ((unsigned char)p[i] <= 0x20 || (unsigned char)p[i] >= 0x7f)
            return um_err_param(err, "webhook", "webhook URL path must be printable ASCII without spaces");
    if (pl == 0 || p[0] == '?') {
        u->path[0] = '/';
        memcpy(u->path + 1, p, pl);
    } else {
        memcpy(u->path, p, pl);
    }
    return 0;
}

/* ---------------------------------------------------------------- one POST */

static double remaining(double deadline) {
    double r = deadline - time_now_s();
    return r > 0 ? r : 0;
}

static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        int ms = (int)(remaining(deadline) * 1000);
        if (ms <= 0) return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        int r = poll(&pfd, 1, ms);
        if (r < 0 && errno == EINTR) continue;
        return r > 0;
    }
}

/* ---------------------------------------------------------------- target policy */

/* One allowed network (CIDR). */
int webhook_allow_parse(const char *list, webhook_net **out, int *n, um_err *err) {
    return net_cidr_list_parse(list, "webhook-allow", out, n, err);
}

/* A resolved address of a target, checked and ready to connect to (IPv4-mapped IPv6 addresses
 * are turned into the IPv4 address they map: that is what a socket would reach). */
typedef struct target_addr {
    struct sockaddr_storage sa;
    socklen_t               len;
} target_addr;

/* ai as a target_addr (unmapped) into *t, and whether the policy allows it: a globally reachable
 * unicast address (util/netaddr.h: the IANA special-purpose registries), or one in the allow-list.
 * 0 = allowed; -1 with err naming the address and the registry entry that refused it. */
static int target_check(const struct addrinfo *ai, const char *host, const webhook_net *allow, int n_allow,
                        target_addr *t, um_err *err) {
    int family = ai->ai_family;
    unsigned char a[16] = {0};
    uint16_t port;
    if (family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ai->ai_addr;
        memcpy(a, &in->sin_addr, 4);
        port = in->sin_port;
    } else if (family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ai->ai_addr;
        memcpy(a, &in6->sin6_addr, 16);
        port = in6->sin6_port;
    } else {
        return um_err_param(err, "webhook", "webhook: '%s' resolves to an address that is neither IPv4 nor IPv6", host);
    }
    memset(t, 0, sizeof *t);
    if (family == AF_INET6 && !net_addr_unmap(&family, a)) {
        memcpy(&t->sa, ai->ai_addr, sizeof(struct sockaddr_in6));
        t->len = sizeof(struct sockaddr_in6);
    } else {
        struct sockaddr_in *in = (struct sockaddr_in *)&t->sa;
        in->sin_family = AF_INET;
        in->sin_port = port;
        memcpy(&in->sin_addr, a, 4);
        t->len = sizeof(struct sockaddr_in);
    }
    const net_special *why = NULL;
    if (net_cidr_list_contains(allow, n_allow, family, a) || net_addr_global(family, a, &why)) return 0;
    char shown[INET6_ADDRSTRLEN] = "?", reason[160];
    inet_ntop(family, a, shown, sizeof shown);
    if (why)
        snprintf(reason, sizeof reason, "%s, %s", why->name, why->ref);
    else
        snprintf(reason, sizeof reason, "an ISATAP address embedding a non-global IPv4 address");
    return um_err_param(err, "webhook",
                        "webhook: '%s' resolves to %s (%s), not a globally reachable unicast address; webhooks go to "
                        "global addresses only unless --webhook-allow lists the network",
                        host, shown, reason);
}

/* Resolves u->host now: every address must be allowed (a name with any internal address is
 * refused as a whole). *out (malloc'd, [*n]) = the checked addresses, the only ones a delivery
 * connects to: no second resolution between the check and the connect. */
static int resolve_checked(const webhook_url *u, const webhook_net *allow, int n_allow, target_addr **out, int *n,
                           um_err *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    *out = NULL;
    *n = 0;
    int gr = getaddrinfo(u->host, u->port, &hints, &res);
    if (gr != 0) return um_err_param(err, "webhook", "webhook: cannot resolve '%s': %s", u->host, gai_strerror(gr));
    int count = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) count++;
    target_addr *t = xcalloc((size_t)(count ? count : 1), sizeof *t);
    int rc = 0;
    for (struct addrinfo *a = res; a && rc == 0; a = a->ai_next) rc = target_check(a, u->host, allow, n_allow, &t[(*n)++], err);
    freeaddrinfo(res);
    if (rc != 0 || *n == 0) {
        free(t);
        *n = 0;
        return rc ? rc : um_err_param(err, "webhook", "webhook: '%s' resolves to no address", u->host);
    }
    *out = t;
    return 0;
}

/* Connects to an allowed address of u: resolved and checked now (a name's answer may have changed
 * since the job was created), then connected to exactly as checked. */
static int connect_to(const webhook_url *u, const webhook_net *allow, int n_allow, double deadline, um_err *err) {
    target_addr *t = NULL;
    int n = 0;
    if (resolve_checked(u, allow, n_allow, &t, &n, err) != 0) return -1;
    int fd = -1;
    for (int i = 0; i < n && fd < 0; i++) {
        fd = socket(t[i].sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, (const struct sockaddr *)&t[i].sa, t[i].len) != 0) {
            int ok = 0;
            if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline)) {
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0;
            }
            if (!ok) {
                close(fd);
                fd = -1;
            }
        }
    }
    free(t);
    if (fd < 0) return um_err_set(err, UM_ERR_IO, "webhook: cannot connect to %s:%s", u->host, u->port);
    return fd;
}

static int send_all(int fd, const char *p, size_t n, double deadline) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLOUT, deadline)) continue;
        return -1;
    }
    return 0;
}

int webhook_post(const webhook_url *u, const webhook_net *allow, int n_allow, const char *extra_headers,
                 const void *body, size_t len, double timeout_s,
                 int *http_status, um_err *err) {
    *http_status = 0;
    double deadline = time_now_s() + timeout_s;
    int fd = connect_to(u, allow, n_allow, deadline, err);
    if (fd < 0) return -1;
    char head[2048];
    int hn = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: unmask-webhook/1\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                      u->path, u->host, u->port, len, extra_headers ? extra_headers : "");
    if (hn < 0 || (size_t)hn >= sizeof head) {
        close(fd);
        return um_err_set(err, UM_ERR_INTERNAL, "webhook: request headers too long");
    }
    if (send_all(fd, head, (size_t)hn, deadline) || send_all(fd, body, len, deadline)) {
        close(fd);
        return um_err_set(err, UM_ERR_IO, "webhook: send to %s:%s failed", u->host, u->port);
    }
    /* Read just the status line. */
    char resp[256];
    size_t got = 0;
    while (got < sizeof resp - 1 && !memchr(resp, '\n', got)) {
        if (!wait_fd(fd, POLLIN, deadline)) break;
        ssize_t k = recv(fd, resp + got, sizeof resp - 1 - got, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(fd);
    resp[got] = 0;
    int major = 0, minor = 0, status = 0;
    if (sscanf(resp, "HTTP/%d.%d %d", &major, &minor, &status) != 3 || status < 100 || status > 999)
        return um_err_set(err, UM_ERR_IO, "webhook: no valid HTTP response from %s:%s", u->host, u->port);
    *http_status = status;
    return 0;
}

/* ---------------------------------------------------------------- the sender */

typedef struct delivery {
    struct delivery *next;
    webhook_url      url;
    char            *event, *id;     /* owned */
    char            *body;           /* owned */
    size_t           len;
    char             sig[65];
    int              attempts;
    double           next_at;        /* monotonic seconds */
    webhook_done_fn  done;
    void            *user;
} delivery;

#define WEBHOOK_MAX_WORKERS 64

struct webhook_sender {
    char           *secret;          /* owned */
    int             max_attempts;
    double          base_delay_s, timeout_s;
    webhook_net    *allow;           /* [n_allow] extra allowed networks (owned) */
    int             n_allow;
    pthread_t       threads[WEBHOOK_MAX_WORKERS];
    int             n_threads;
    pthread_mutex_t lock;
    pthread_cond_t  cond;            /* CLOCK_MONOTONIC */
    /* --- lock { */
    delivery       *queue;           /* pending, any order */
    delivery       *active;          /* in flight (one per target at most) */
    int             in_flight;
    int             stopping;
    double          drain_deadline;
    /* } lock --- */
};

/* 1 when a delivery to d's target (host:port) is in flight; lock held. */
static int target_busy(const webhook_sender *w, const delivery *d) {
    for (const delivery *a = w->active; a; a = a->next)
        if (strcmp(a->url.host, d->url.host) == 0 && strcmp(a->url.port, d->url.port) == 0) return 1;
    return 0;
}

static void delivery_free(delivery *d) {
    free(d->event);
    free(d->id);
    free(d->body);
    free(d);
}

/* One attempt of d (no lock held); 1 when the delivery is over (delivered or given up). */
static int attempt(webhook_sender *w, delivery *d) {
    char headers[512];
    snprintf(headers, sizeof headers, "X-Unmask-Signature: sha256=%s\r\nX-Unmask-Event: %s\r\nX-Unmask-Delivery: %s\r\n",
             d->sig, d->event, d->id);
    int status = 0;
    um_err err = {0};
    d->attempts++;
    int r = webhook_post(&d->url, w->allow, w->n_allow, headers, d->body, d->len, w->timeout_s, &status, &err);
    int ok = r == 0 && status >= 200 && status < 300;
    int give_up = ok || d->attempts >= w->max_attempts;
    if (!ok)
        log_warn("webhook %s to %s:%s%s attempt %d/%d failed: %s", d->id, d->url.host, d->url.port, d->url.path,
                 d->attempts, w->max_attempts, r ? err.msg : "non-2xx status");
    if (give_up && d->done) d->done(d->user, d->id, ok, d->attempts, status);
    return give_up;
}

/* A worker: the due delivery whose target has nothing in flight, one attempt, reschedule. So a
 * target that stalls holds one worker at most, and the others keep serving other targets. */
static void *sender_main(void *arg) {
    webhook_sender *w = arg;
    pthread_mutex_lock(&w->lock); /* --- lock { */
    for (;;) {
        double now = time_now_s();
        if (w->stopping && (!w->queue || now >= w->drain_deadline)) break;
        delivery **best = NULL;
        for (delivery **pp = &w->queue; *pp; pp = &(*pp)->next)
            if (!target_busy(w, *pp) && (!best || (*pp)->next_at < (*best)->next_at)) best = pp;
        if (!best || (*best)->next_at > now) {
            double until = best ? (*best)->next_at : now + 3600;
            if (w->stopping && until > w->drain_deadline) until = w->drain_deadline;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double dt = until - now;
            if (dt < 0) dt = 0;
            ts.tv_sec += (time_t)dt;
            ts.tv_nsec += (long)((dt - (double)(time_t)dt) * 1e9);
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&w->cond, &w->lock, &ts);
            continue;
        }
        delivery *d = *best;
        *best = d->next;
        d->next = w->active;
        w->active = d;
        w->in_flight++;
        pthread_mutex_unlock(&w->lock); /* } lock --- */

        int over = attempt(w, d);

        pthread_mutex_lock(&w->lock); /* --- lock { */
        for (delivery **pp = &w->active; *pp; pp = &(*pp)->next)
            if (*pp == d) {
                *pp = d->next;
                break;
            }
        w->in_flight--;
        if (over || (w->stopping && time_now_s() >= w->drain_deadline)) {
            delivery_free(d);
        } else {
            double delay = w->base_delay_s;
            for (int i = 1; i < d->attempts && delay < 60; i++) delay *= 2;
            if (delay > 60) delay = 60;
            d->next_at = time_now_s() + delay;
            d->next = w->queue;
            w->queue = d;
        }
        pthread_cond_broadcast(&w->cond); /* its target is free again */
    }
    pthread_mutex_unlock(&w->lock); /* } lock --- */
    return NULL;
}

webhook_sender *webhook_sender_new(const webhook_config *cfg, um_err *err) {
    webhook_sender *w = xcalloc(1, sizeof *w);
    if (webhook_allow_parse(cfg ? cfg->allow : NULL, &w->allow, &w->n_allow, err) != 0) {
        free(w);
        return NULL;
    }
    w->n_threads = cfg && cfg->workers > 0 ? (cfg->workers < WEBHOOK_MAX_WORKERS ? cfg->workers : WEBHOOK_MAX_WORKERS) : 4;
    w->secret = xstrdup(cfg && cfg->secret ? cfg->secret : "");
    w->max_attempts = cfg && cfg->max_attempts > 0 ? cfg->max_attempts : 5;
    w->base_delay_s = cfg && cfg->base_delay_s > 0 ? cfg->base_delay_s : 0.5;
    w->timeout_s = cfg && cfg->timeout_s > 0 ? cfg->timeout_s : 5;
    pthread_mutex_init(&w->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    /* The sender never takes signals (like the engines and preparation workers): SIGINT/SIGTERM
     * go to the service thread, whose handler state is not meant for this thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < w->n_threads; i++) CHECK(pthread_create(&w->threads[i], NULL, sender_main, w) == 0);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return w;
}

void webhook_sender_free(webhook_sender *w, double drain_s) {
    if (!w) return;
    pthread_mutex_lock(&w->lock);
    w->stopping = 1;
    w->drain_deadline = time_now_s() + drain_s;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    for (int i = 0; i < w->n_threads; i++) pthread_join(w->threads[i], NULL);
    while (w->queue) { /* abandoned at shutdown */
        delivery *d = w->queue;
        w->queue = d->next;
        log_warn("webhook %s abandoned at shutdown after %d attempts", d->id, d->attempts);
        delivery_free(d);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w->allow);
    free(w->secret);
    free(w);
}

int webhook_check_target(const webhook_sender *w, const char *url, um_err *err) {
    webhook_url u;
    if (webhook_url_parse(url, &u, err) != 0) return -1;
    target_addr *t = NULL;
    int n = 0;
    if (resolve_checked(&u, w->allow, w->n_allow, &t, &n, err) != 0) return -1;
    free(t);
    return 0;
}

int webhook_enqueue(webhook_sender *w, const char *url, const char *event, const char *delivery_id, const char *body,
                    size_t len, webhook_done_fn done, void *user, um_err *err) {
    delivery *d = xcalloc(1, sizeof *d);
    if (webhook_url_parse(url, &d->url, err)) {
        free(d);
        return -1;
    }
    d->event = xstrndup(event, strcspn(event, "\r\n"));
    d->id = xstrndup(delivery_id, strcspn(delivery_id, "\r\n"));
    d->body = xmalloc(len + 1);
    memcpy(d->body, body, len);
    d->body[len] = 0;
    d->len = len;
    webhook_sign(w->secret, body, len, d->sig);
    d->done = done;
    d->user = user;
    d->next_at = time_now_s();
    pthread_mutex_lock(&w->lock);
    d->next = w->queue;
    w->queue = d;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return 0;
}

int webhook_pending(webhook_sender *w) {
    pthread_mutex_lock(&w->lock);
    int n = w->in_flight;
    for (delivery *d = w->queue; d; d = d->next) n++;
    pthread_mutex_unlock(&w->lock);
    return n;
}
