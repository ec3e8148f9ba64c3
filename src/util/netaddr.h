/*
 * netaddr.h — IPv4/IPv6 addresses: CIDR lists ("10.0.0.0/8,127.0.0.1,fd00::/8") with parsing and
 * membership (the webhook allow-list, the trusted reverse proxies, connection caps), and the IANA
 * special-purpose address registries as one table, to tell globally reachable unicast addresses
 * from everything else (webhook targets).
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

/* Parses a comma/space separated list into *out (malloc'd, [*n]); NULL or "" -> empty. An IPv4-mapped
 * IPv6 block (::ffff:10.0.0.0/104) is stored as the IPv4 block it maps (10.0.0.0/8). A bad entry:
 * -1 with err (UM_ERR_INVALID_ARG, param = flag) naming --flag and the entry. */
int net_cidr_list_parse(const char *list, const char *flag, net_cidr **out, int *n, um_err *err);
/* 1 when the first bits of a and b (address bytes) agree. */
int net_prefix_eq(const unsigned char *a, const unsigned char *b, int bits);
/* 1 when the address (family, bytes) lies in one of the blocks. */
int net_cidr_list_contains(const net_cidr *l, int n, int family, const unsigned char *addr);
/* The same for an address as text ("192.0.2.1", "2001:db8::1", "::ffff:192.0.2.1" counts as IPv4);
 * 0 for text that is not an address. */
int net_cidr_list_contains_text(const net_cidr *l, int n, const char *addr);

/* An IPv4-mapped IPv6 address (::ffff:a.b.c.d) becomes the IPv4 address it maps, in place
 * (*family = AF_INET, addr[0..3] = a.b.c.d): a socket connects to that IPv4 address. Returns 1
 * when it did, 0 for any other address (left as it is). */
int net_addr_unmap(int *family, unsigned char *addr);

/* ---------------------------------------------------------------- special-purpose registries
 *
 * One entry per block of the IANA IPv4 and IPv6 Special-Purpose Address Registries (every entry,
 * with its "Globally Reachable" column), plus the address-space registries' blocks that are not
 * global unicast (IPv4 multicast; IPv6 outside 2000::/3, multicast, the deprecated site-local
 * and IPv4-compatible / -translated forms). The most specific block containing an address
 * decides; an address in no block is global unicast. */
typedef enum net_reach {
    NET_REACH_GLOBAL,       /* "Globally Reachable: True" (or global unicast space) */
    NET_REACH_LOCAL,        /* "False": loopback, private, link-local, documentation, ... */
    NET_REACH_NA,           /* "N/A" (deprecated or transition blocks: 6to4, Teredo, ORCHID): refused */
    NET_REACH_EMBEDDED_V4,  /* NAT64 well-known prefix: reaches the IPv4 address in its last 32 bits,
                               so that address decides (RFC 6052 section 3.1) */
} net_reach;

typedef struct net_special {
    const char *block;      /* "127.0.0.0/8" */
    const char *name;       /* "Loopback" */
    const char *ref;        /* "RFC 1122" */
    net_reach   reach;
} net_special;

/* The table (static; [*n] entries), for tests and documentation. */
const net_special *net_special_table(int *n);

/* 1 when (family, addr) is a globally reachable unicast address by the table: the deciding entry's
 * reach is GLOBAL, or EMBEDDED_V4 and the embedded IPv4 address is global; an ISATAP interface id
 * (::0:5efe:a.b.c.d, ::200:5efe:a.b.c.d) on a global prefix must embed a global IPv4 address too.
 * *why (may be NULL) = the deciding entry (for the NAT64 prefix: the embedded IPv4 address's), NULL
 * when none decided (global unicast space) or for an ISATAP address refused for its IPv4 part. An
 * IPv4-mapped address is judged as the IPv6 block it is (not global): unmap it first
 * (net_addr_unmap) to judge the IPv4 address a socket would reach. */
int net_addr_global(int family, const unsigned char *addr, const net_special **why);

#endif /* UM_NETADDR_H */
