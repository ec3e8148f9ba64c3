/*
 * netaddr.h — IPv4/IPv6 address lists in CIDR notation ("10.0.0.0/8,127.0.0.1,fd00::/8"): parsing
 * and membership. Used for the webhook allow-list and the trusted reverse proxies.
 * Not here: resolving names, sockets. Pure; any thread.
 */
#ifndef UM_NETADDR_H
#define UM_NETADDR_H

#include "util/err.h"

typedef struct net_cidr {
    int           family;      /* AF_INET / AF_INET6 */
    unsigned char addr[16];    /* network byte order; 4 bytes used for AF_INET */
    int           bits;        /* prefix length */
} net_cidr;

/* Parses a comma/space separated list into *out (malloc'd, [*n]); NULL or "" -> empty. A bad entry:
 * -1 with err (UM_ERR_INVALID_ARG, param = flag) naming --flag and the entry. */
int net_cidr_list_parse(const char *list, const char *flag, net_cidr **out, int *n, um_err *err);
/* 1 when the first bits of a and b (address bytes) agree. */
int net_prefix_eq(const unsigned char *a, const unsigned char *b, int bits);
/* 1 when the address (family, bytes) lies in one of the blocks. */
int net_cidr_list_contains(const net_cidr *l, int n, int family, const unsigned char *addr);
/* The same for an address as text ("192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1" counts as IPv4);
 * 0 for text that is not an address. */
int net_cidr_list_contains_text(const net_cidr *l, int n, const char *addr);

#endif /* UM_NETADDR_H */
