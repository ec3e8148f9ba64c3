/*
 * test_api_webhook.c — webhook signing (RFC 4231 vector), URL parsing, and real deliveries to a
 * loopback listener: signature header, retry with backoff after a 500, give-up after max_attempts;
 * the address policy at creation (every spelling of an internal address) and at delivery (a name
 * that resolves to loopback is refused there unless allowed).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "jobs/webhook.h"
#include "test.h"
#include "util/timeutil.h"

static void test_sign(void) {
    char hex[65];
    const char *data = "what do ya want for nothing?";
    webhook_sign("Jefe", data, strlen(data), hex);
    TEST_CHECK(strcmp(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843") == 0, "RFC 4231 #2: %s",
               hex);
}

static void test_url(void) {
    webhook_url u;
    um_err err = {0};
    TEST_CHECK(webhook_url_parse("http://127.0.0.1:8123/hook?x=1", &u, &err) == 0, "parse: %s", err.msg);
    TEST_CHECK(strcmp(u.host, "127.0.0.1") == 0 && strcmp(u.port, "8123") == 0 && strcmp(u.path, "/hook?x=1") == 0,
               "fields %s %s %s", u.host, u.port, u.path);
    TEST_CHECK(webhook_url_parse("http://example.com", &u, &err) == 0 && strcmp(u.port, "80") == 0 &&
                   strcmp(u.path, "/") == 0,
               "defaults");
    TEST_CHECK(webhook_url_parse("http://[::1]:9/x", &u, &err) == 0 && strcmp(u.host, "::1") == 0, "ipv6");
    TEST_CHECK(webhook_url_parse("https://example.com/", &u, &err) == -1 && strcmp(err.param, "webhook") == 0 &&
                   strstr(err.msg, "https"),
               "https refused: %s", err.msg);
    TEST_CHECK(webhook_url_parse("ftp://x", &u, &err) == -1, "scheme");
    TEST_CHECK(webhook_url_parse("http://:80/", &u, &err) == -1, "no host");
    TEST_CHECK(webhook_url_parse("http://h:99999/", &u, &err) == -1, "bad port");
    TEST_CHECK(webhook_url_parse("http://h/a b", &u, &err) == -1, "space in path");
    TEST_CHECK(webhook_url_parse("http://user@h/", &u, &err) == -1, "credentials");
}

/* ---------------------------------------------------------------- loopback listener */

typedef struct listener {
    int  fd, port;
    int  n_requests;        /* answered so far */
    int  fail_first;        /* answer 500 to the first N requests */
    char last_sig[160];
    char last_body[512];
    char last_delivery[64];
} listener;

static void header_value(const char *req, const char *name, char *out, size_t cap) {
    out[0] = 0;
    const char *p = strcasestr(req, name);
    if (!p) return;
    p += strlen(name);
    while (*p == ' ') p++;
    size_t n = strcspn(p, "\r\n");
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = 0;
}

static void *listener_main(void *arg) {
    listener *l = arg;
    for (;;) {
        int c = accept(l->fd, NULL, NULL);
        if (c < 0) return NULL;
        char req[4096];
        size_t got = 0;
        long want = -1;
        for (;;) {
            ssize_t k = recv(c, req + got, sizeof req - 1 - got, 0);
            if (k <= 0) break;
            got += (size_t)k;
            req[got] = 0;
            char *end = strstr(req, "\r\n\r\n");
            if (end) {
                char cl[32];
                header_value(req, "content-length:", cl, sizeof cl);
                want = (long)(end + 4 - req) + atol(cl);
                if ((long)got >= want) break;
            }
        }
        char *end = strstr(req, "\r\n\r\n");
        if (end) snprintf(l->last_body, sizeof l->last_body, "%s", end + 4);
        header_value(req, "x-unmask-signature:", l->last_sig, sizeof l->last_sig);
        header_value(req, "x-unmask-delivery:", l->last_delivery, sizeof l->last_delivery);
        int n = ++l->n_requests;
        const char *resp = n <= l->fail_first ? "HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"
                                              : "HTTP/1.1 204 No Content\r\n\r\n";
        send(c, resp, strlen(resp), MSG_NOSIGNAL);
        close(c);
    }
}

static void listener_start(listener *l, pthread_t *th) {
    l->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(l->fd, (struct sockaddr *)&a, sizeof a);
    socklen_t al = sizeof a;
    getsockname(l->fd, (struct sockaddr *)&a, &al);
    l->port = ntohs(a.sin_port);
    listen(l->fd, 8);
    pthread_create(th, NULL, listener_main, l);
}

typedef struct done_rec {
    pthread_mutex_t lock;
    int             calls, ok, attempts, status;
} done_rec;

static void on_done(void *user, const char *id, int ok, int attempts, int status) {
    done_rec *d = user;
    (void)id;
    pthread_mutex_lock(&d->lock);
    d->calls++;
    d->ok = ok;
    d->attempts = attempts;
    d->status = status;
    pthread_mutex_unlock(&d->lock);
}

static int wait_calls(done_rec *d, int n, double timeout_s) {
    double t0 = time_now_s();
    for (;;) {
        pthread_mutex_lock(&d->lock);
        int c = d->calls;
        pthread_mutex_unlock(&d->lock);
        if (c >= n) return 1;
        if (time_now_s() - t0 > timeout_s) return 0;
        usleep(2000); /* polling a condition with a deadline, not sleeping as synchronisation */
    }
}

static void test_delivery(void) {
    listener l = {0};
    l.fail_first = 2;
    pthread_t th;
    listener_start(&l, &th);
    webhook_config cfg = {.secret = "s3cret", .max_attempts = 4, .base_delay_s = 0.02, .timeout_s = 2,
                          .allow = "127.0.0.1/32"};
    um_err cerr = {0};
    webhook_sender *w = webhook_sender_new(&cfg, &cerr);
    TEST_CHECK(w != NULL, "sender: %s", cerr.msg);
    done_rec d = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/hook", l.port);
    const char *body = "{\"id\":\"job_1\",\"status\":\"succeeded\"}";
    um_err err = {0};
    double t0 = time_now_s();
    TEST_CHECK(webhook_enqueue(w, url, "job.succeeded", "dlv_1", body, strlen(body), on_done, &d, &err) == 0, "enqueue");
    TEST_CHECK(wait_calls(&d, 1, 10), "delivered in time");
    double took = time_now_s() - t0;
    TEST_CHECK(d.ok == 1 && d.attempts == 3 && d.status == 204, "ok after 2 failures: ok=%d attempts=%d status=%d", d.ok,
               d.attempts, d.status);
    TEST_CHECK(took >= 0.02 + 0.04 - 0.005, "exponential backoff waited %.3f s", took);
    char want[80];
    webhook_sign("s3cret", body, strlen(body), want);
    char want_hdr[90];
    snprintf(want_hdr, sizeof want_hdr, "sha256=%s", want);
    TEST_CHECK(strcmp(l.last_sig, want_hdr) == 0, "signature header %s", l.last_sig);
    TEST_CHECK(strcmp(l.last_body, body) == 0, "body %s", l.last_body);
    TEST_CHECK(strcmp(l.last_delivery, "dlv_1") == 0, "delivery id");

    /* always failing -> gives up after max_attempts */
    l.fail_first = 1000;
    l.n_requests = 0;
    TEST_CHECK(webhook_enqueue(w, url, "job.failed", "dlv_2", "{}", 2, on_done, &d, &err) == 0, "enqueue 2");
    TEST_CHECK(wait_calls(&d, 2, 10), "gave up in time");
    TEST_CHECK(d.ok == 0 && d.attempts == 4 && d.status == 500 && l.n_requests == 4, "4 attempts then failed");

    /* nothing listening -> connect error, status 0 */
    TEST_CHECK(webhook_enqueue(w, "http://127.0.0.1:1/x", "job.failed", "dlv_3", "{}", 2, on_done, &d, &err) == 0, "enqueue 3");
    TEST_CHECK(wait_calls(&d, 3, 10), "connect failures reported");
    TEST_CHECK(d.ok == 0 && d.status == 0, "no status on connect failure");
    TEST_CHECK(webhook_enqueue(w, "https://x/", "e", "d", "{}", 2, NULL, NULL, &err) == -1, "https refused at enqueue");
    TEST_CHECK(webhook_pending(w) == 0, "nothing pending");
    webhook_sender_free(w, 1);
    shutdown(l.fd, SHUT_RDWR);
    close(l.fd);
    pthread_join(th, NULL);
}

/* The SSRF guard: internal addresses in every spelling are refused unless allow-listed. */
static void test_targets(void) {
    um_err err = {0};
    webhook_config cfg = {.secret = "k", .timeout_s = 1};
    webhook_sender *w = webhook_sender_new(&cfg, &err);
    static const char *const refused[] = {
        "http://127.0.0.1/", "http://127.1.2.3:8080/x", "http://localhost/", "http://0.0.0.0/", "http://10.1.2.3/",
        "http://172.16.0.1/", "http://172.31.255.255/", "http://192.168.1.1/", "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/", "http://2130706433/", "http://0x7f000001/", "http://0177.0.0.1/", "http://127.1/",
        "http://[::1]/", "http://[::]/", "http://[::ffff:127.0.0.1]/", "http://[::ffff:169.254.169.254]/",
        "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:7f00:1::]/", "http://[fd00:ec2::254]/", "http://[fe80::1]/",
        "http://[ff02::1]/", "http://224.0.0.1/", "http://255.255.255.255/",
        /* accepted before (issue 26): IPv4-translated, local-use NAT64, reserved, ORCHID */
        "http://[::ffff:0:a9fe:a9fe]/", "http://[::ffff:0:10.0.0.1]/", "http://[::ffff:0:127.0.0.1]/",
        "http://[64:ff9b:1::a9fe:a9fe]/", "http://[64:ff9b:1::7f00:1]/", "http://[::1:a9fe:a9fe]/",
        "http://[::ffff:0:0:a9fe:a9fe]/", "http://[2001:10::1]/",
        /* more of the same families */
        "http://[::127.0.0.1]/", "http://[2002:808:808::1]/", "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
        "http://[3fff::1]/", "http://[5f00::1]/", "http://[100::1]/", "http://[fec0::1]/", "http://192.0.0.8/",
        "http://192.88.99.1/", "http://[2600::5efe:a00:1]/", "http://198.18.0.1/",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        memset(&err, 0, sizeof err);
        TEST_CHECK(webhook_check_target(w, refused[i], &err) == -1 && strcmp(err.param, "webhook") == 0,
                   "%s refused (%s)", refused[i], err.msg);
    }
    static const char *const public_ok[] = {"http://93.184.216.34/", "http://8.8.8.8:8080/hook", "http://[2606:4700::1]/",
                                            "http://[::ffff:8.8.8.8]/", "http://[64:ff9b::808:808]/", "http://192.0.0.9/"};
    for (size_t i = 0; i < sizeof public_ok / sizeof public_ok[0]; i++)
        TEST_CHECK(webhook_check_target(w, public_ok[i], &err) == 0, "%s allowed: %s", public_ok[i], err.msg);
    webhook_sender_free(w, 0);
    /* an allow-list opens exactly its networks */
    cfg.allow = "127.0.0.1, 10.0.0.0/8,fd00::/8";
    w = webhook_sender_new(&cfg, &err);
    TEST_CHECK(w && webhook_check_target(w, "http://127.0.0.1:9/", &err) == 0, "127.0.0.1 allowed: %s", err.msg);
    TEST_CHECK(webhook_check_target(w, "http://10.200.0.1/", &err) == 0, "10/8 allowed");
    TEST_CHECK(webhook_check_target(w, "http://[fd00:ec2::254]/", &err) == 0, "fd00::/8 allowed");
    TEST_CHECK(webhook_check_target(w, "http://127.0.0.2/", &err) == -1, "127.0.0.2 still refused");
    TEST_CHECK(webhook_check_target(w, "http://169.254.169.254/", &err) == -1, "metadata still refused");
    TEST_CHECK(webhook_check_target(w, "http://[::ffff:127.0.0.1]:9/", &err) == 0, "mapped 127.0.0.1 is 127.0.0.1");
    memset(&err, 0, sizeof err);
    TEST_CHECK(webhook_check_target(w, "http://[::ffff:0:10.0.0.1]/", &err) == -1 && strstr(err.msg, "IPv4-translated"),
               "an IPv4-translated address is not the IPv4 address (allowed 10/8 does not open it): %s", err.msg);
    webhook_sender_free(w, 0);
    cfg.allow = "10.0.0.0/33";
    TEST_CHECK(webhook_sender_new(&cfg, &err) == NULL && strstr(err.msg, "prefix"), "bad CIDR: %s", err.msg);
    cfg.allow = "not-an-address";
    TEST_CHECK(webhook_sender_new(&cfg, &err) == NULL && strstr(err.msg, "--webhook-allow"), "bad entry: %s", err.msg);
}

/* The check that counts is the one at delivery: a name resolving to loopback is refused there, with
 * nothing sent, unless the allow-list opens loopback (then it is delivered). The names resolve
 * without DNS: "localhost" through /etc/hosts, "0x7f.1" and "2130706433" as numbers (inet_aton). */
static void test_delivery_resolves(void) {
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    TEST_CHECK(getaddrinfo("localhost", "80", &hints, &res) == 0 && res, "this machine resolves localhost");
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        char shown[64] = "";
        getnameinfo(a->ai_addr, a->ai_addrlen, shown, sizeof shown, NULL, 0, NI_NUMERICHOST);
        TEST_CHECK(strcmp(shown, "127.0.0.1") == 0 || strcmp(shown, "::1") == 0, "localhost -> %s (loopback)", shown);
    }
    if (res) freeaddrinfo(res);
    listener l = {0};
    pthread_t th;
    listener_start(&l, &th);
    static const char *const names[] = {"localhost", "0x7f.1", "2130706433"};
    for (int allowed = 0; allowed <= 1; allowed++) {
        webhook_config cfg = {.secret = "s", .max_attempts = 1, .timeout_s = 2, .allow = allowed ? "127.0.0.0/8,::1" : NULL};
        um_err err = {0};
        webhook_sender *w = webhook_sender_new(&cfg, &err);
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            done_rec d = {.lock = PTHREAD_MUTEX_INITIALIZER};
            char url[96];
            snprintf(url, sizeof url, "http://%s:%d/hook", names[i], l.port);
            int before = l.n_requests;
            /* enqueued directly, as a job's delivery is: the creation check is not what protects */
            TEST_CHECK(webhook_enqueue(w, url, "job.succeeded", "dlv_dns", "{}", 2, on_done, &d, &err) == 0, "enqueue %s", url);
            TEST_CHECK(wait_calls(&d, 1, 10), "%s: an outcome", url);
            if (allowed)
                TEST_CHECK(d.ok == 1 && d.status == 204 && l.n_requests == before + 1, "%s delivered when loopback is allowed",
                           url);
            else
                TEST_CHECK(d.ok == 0 && d.status == 0 && l.n_requests == before, "%s refused at delivery, nothing sent",
                           url);
        }
        webhook_sender_free(w, 0);
    }
    shutdown(l.fd, SHUT_RDWR);
    close(l.fd);
    pthread_join(th, NULL);
}

/* A target that never answers holds one worker; another target's deliveries go through meanwhile. */
static void test_stalled_target(void) {
    /* a listener that accepts and never answers */
    int stall = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    TEST_CHECK(bind(stall, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(stall, 64) == 0 &&
                   getsockname(stall, (struct sockaddr *)&sa, &sl) == 0,
               "stalling listener");
    listener l = {0};
    pthread_t th;
    listener_start(&l, &th);
    um_err err = {0};
    webhook_config cfg = {.secret = "s", .max_attempts = 1, .timeout_s = 3, .allow = "127.0.0.1", .workers = 2};
    webhook_sender *w = webhook_sender_new(&cfg, &err);
    done_rec d = {.lock = PTHREAD_MUTEX_INITIALIZER};
    char slow[64], fast[64];
    snprintf(slow, sizeof slow, "http://127.0.0.1:%d/stall", ntohs(sa.sin_port));
    snprintf(fast, sizeof fast, "http://127.0.0.1:%d/hook", l.port);
    for (int i = 0; i < 10; i++) { /* ten deliveries to the stalled target... */
        char id[16];
        snprintf(id, sizeof id, "slow%d", i);
        webhook_enqueue(w, slow, "e", id, "{}", 2, NULL, NULL, &err);
    }
    double t0 = time_now_s();
    TEST_CHECK(webhook_enqueue(w, fast, "e", "fast", "{}", 2, on_done, &d, &err) == 0, "enqueue fast");
    TEST_CHECK(wait_calls(&d, 1, 10), "the healthy target was served");
    TEST_CHECK(d.ok == 1 && time_now_s() - t0 < 2.0, "...without waiting behind the stalled one (%.2f s)",
               time_now_s() - t0);
    webhook_sender_free(w, 0);
    close(stall);
    shutdown(l.fd, SHUT_RDWR);
    close(l.fd);
    pthread_join(th, NULL);
}

int main(void) {
    test_sign();
    test_url();
    test_targets();
    test_delivery();
    test_delivery_resolves();
    test_stalled_target();
    return test_report();
}
