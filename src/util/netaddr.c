/*
 * netaddr.c — CIDR lists (netaddr.h). Pure; any thread.
 */
#include "util/netaddr.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/log.h"

int net_prefix_eq(const unsigned char *a, const unsigned char *b, int bits) {
    int bytes = bits / 8, rem = bits % 8;
    if (memcmp(a, b, (size_t)bytes) != 0) return 0;
    if (!rem) return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rem));
    return (a[bytes] & mask) == (b[bytes] & mask);
}

int net_cidr_list_parse(const char *list, const char *flag, net_cidr **out, int *n, um_err *err) {
    *out = NULL;
    *n = 0;
    if (!list || !list[0]) return 0;
    char *copy = xstrdup(list), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, ", ", &save); tok && rc == 0; tok = strtok_r(NULL, ", ", &save)) {
        net_cidr net = {0};
        char *slash = strchr(tok, '/');
        if (slash) *slash = 0;
        if (inet_pton(AF_INET, tok, net.addr) == 1) net.family = AF_INET, net.bits = 32;
        else if (inet_pton(AF_INET6, tok, net.addr) == 1) net.family = AF_INET6, net.bits = 128;
        else {
            rc = um_err_param(err, flag, "--%s: '%s' is not an IPv4/IPv6 address or CIDR block", flag, tok);
            break;
        }
        if (slash) {
            char *end;
            long b = strtol(slash + 1, &end, 10);
            if (!slash[1] || *end || b < 0 || b > net.bits) {
                rc = um_err_param(err, flag, "--%s: bad prefix length in '%s/%s'", flag, tok, slash + 1);
                break;
            }
            net.bits = (int)b;
        }
        *out = xrealloc(*out, (size_t)(*n + 1) * sizeof **out);
        (*out)[(*n)++] = net;
    }
    free(copy);
    if (rc != 0) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

int net_cidr_list_contains(const net_cidr *l, int n, int family, const unsigned char *addr) {
    for (int i = 0; i < n; i++)
        if (l[i].family == family && net_prefix_eq(addr, l[i].addr, l[i].bits)) return 1;
    return 0;
}

int net_cidr_list_contains_text(const net_cidr *l, int n, const char *addr) {
    unsigned char a[16];
    if (inet_pton(AF_INET, addr, a) == 1) return net_cidr_list_contains(l, n, AF_INET, a);
    if (inet_pton(AF_INET6, addr, a) != 1) return 0;
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (memcmp(a, mapped, sizeof mapped) == 0 && net_cidr_list_contains(l, n, AF_INET, a + 12)) return 1;
    return net_cidr_list_contains(l, n, AF_INET6, a);
}
