/*
 * netaddr.c — CIDR lists and the special-purpose address table (netaddr.h). Pure; any thread.
 */
#include "util/netaddr.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "util/log.h"

static const unsigned char k_mapped_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

int net_prefix_eq(const unsigned char *a, const unsigned char *b, int bits) {
    int bytes = bits / 8, rem = bits % 8;
    if (memcmp(a, b, (size_t)bytes) != 0) return 0;
    if (!rem) return 1;
    unsigned char mask = (unsigned char)(0xff << (8 - rem));
    return (a[bytes] & mask) == (b[bytes] & mask);
}

int net_addr_unmap(int *family, unsigned char *addr) {
    if (*family != AF_INET6 || memcmp(addr, k_mapped_prefix, sizeof k_mapped_prefix) != 0) return 0;
    memmove(addr, addr + 12, 4);
    memset(addr + 4, 0, 12);
    *family = AF_INET;
    return 1;
}

/* "addr[/bits]" into *net; 0, or -1 when it is no address or the prefix length is bad. */
static int cidr_parse(const char *text, net_cidr *net) {
    char buf[64];
    size_t n = strlen(text);
    if (n >= sizeof buf) return -1;
    memcpy(buf, text, n + 1);
    memset(net, 0, sizeof *net);
    char *slash = strchr(buf, '/');
    if (slash) *slash = 0;
    if (inet_pton(AF_INET, buf, net->addr) == 1) net->family = AF_INET, net->bits = 32;
    else if (inet_pton(AF_INET6, buf, net->addr) == 1) net->family = AF_INET6, net->bits = 128;
    else return -1;
    if (slash) {
        char *end;
        long b = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || b < 0 || b > net->bits) return -2;
        net->bits = (int)b;
    }
    return 0;
}

int net_cidr_list_parse(const char *list, const char *flag, net_cidr **out, int *n, um_err *err) {
    *out = NULL;
    *n = 0;
    if (!list || !list[0]) return 0;
    char *copy = xstrdup(list), *save = NULL;
    int rc = 0;
    for (char *tok = strtok_r(copy, ", ", &save); tok && rc == 0; tok = strtok_r(NULL, ", ", &save)) {
        net_cidr net;
        int r = cidr_parse(tok, &net);
        if (r == -1) {
            rc = um_err_param(err, flag, "--%s: '%s' is not an IPv4/IPv6 address or CIDR block", flag, tok);
            break;
        }
        if (r == -2) {
            rc = um_err_param(err, flag, "--%s: bad prefix length in '%s'", flag, tok);
            break;
        }
        /* a mapped block is the IPv4 block it maps: addresses are compared unmapped */
        if (net.bits >= 96 && net_addr_unmap(&net.family, net.addr)) net.bits -= 96;
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
    int family = AF_INET;
    if (inet_pton(AF_INET, addr, a) != 1) {
        if (inet_pton(AF_INET6, addr, a) != 1) return 0;
        family = AF_INET6;
        net_addr_unmap(&family, a);
    }
    return net_cidr_list_contains(l, n, family, a);
}

/* ---------------------------------------------------------------- special-purpose registries */

/* The IANA IPv4 and IPv6 Special-Purpose Address Registries (every entry; the reach is the
 * registry's "Globally Reachable" column), then the blocks of the address-space registries that
 * are not global unicast. Most specific block wins (see net_addr_global). */
static const net_special k_special[] = {
    /* IPv4 Special-Purpose Address Registry */
    {"0.0.0.0/8", "This network", "RFC 791", NET_REACH_LOCAL},
    {"0.0.0.0/32", "This host on this network", "RFC 1122", NET_REACH_LOCAL},
    {"10.0.0.0/8", "Private-Use", "RFC 1918", NET_REACH_LOCAL},
    {"100.64.0.0/10", "Shared Address Space", "RFC 6598", NET_REACH_LOCAL},
    {"127.0.0.0/8", "Loopback", "RFC 1122", NET_REACH_LOCAL},
    {"169.254.0.0/16", "Link Local", "RFC 3927", NET_REACH_LOCAL},
    {"172.16.0.0/12", "Private-Use", "RFC 1918", NET_REACH_LOCAL},
    {"192.0.0.0/24", "IETF Protocol Assignments", "RFC 6890", NET_REACH_LOCAL},
    {"192.0.0.0/29", "IPv4 Service Continuity Prefix", "RFC 7335", NET_REACH_LOCAL},
    {"192.0.0.8/32", "IPv4 dummy address", "RFC 7600", NET_REACH_LOCAL},
    {"192.0.0.9/32", "Port Control Protocol Anycast", "RFC 7723", NET_REACH_GLOBAL},
    {"192.0.0.10/32", "Traversal Using Relays around NAT Anycast", "RFC 8155", NET_REACH_GLOBAL},
    {"192.0.0.170/32", "NAT64/DNS64 Discovery", "RFC 8880", NET_REACH_LOCAL},
    {"192.0.0.171/32", "NAT64/DNS64 Discovery", "RFC 8880", NET_REACH_LOCAL},
    {"192.0.2.0/24", "Documentation (TEST-NET-1)", "RFC 5737", NET_REACH_LOCAL},
    {"192.31.196.0/24", "AS112-v4", "RFC 7535", NET_REACH_GLOBAL},
    {"192.52.193.0/24", "AMT", "RFC 7450", NET_REACH_GLOBAL},
    {"192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", "RFC 7526", NET_REACH_NA},
    {"192.88.99.2/32", "6a44-relay anycast address", "RFC 6751", NET_REACH_LOCAL},
    {"192.168.0.0/16", "Private-Use", "RFC 1918", NET_REACH_LOCAL},
    {"192.175.48.0/24", "Direct Delegation AS112 Service", "RFC 7534", NET_REACH_GLOBAL},
    {"198.18.0.0/15", "Benchmarking", "RFC 2544", NET_REACH_LOCAL},
    {"198.51.100.0/24", "Documentation (TEST-NET-2)", "RFC 5737", NET_REACH_LOCAL},
    {"203.0.113.0/24", "Documentation (TEST-NET-3)", "RFC 5737", NET_REACH_LOCAL},
    {"240.0.0.0/4", "Reserved", "RFC 1112", NET_REACH_LOCAL},
    {"255.255.255.255/32", "Limited Broadcast", "RFC 919", NET_REACH_LOCAL},
    /* IPv4 address space registry: not unicast */
    {"224.0.0.0/4", "Multicast", "RFC 5771", NET_REACH_LOCAL},

    /* IPv6 Special-Purpose Address Registry */
    {"::1/128", "Loopback Address", "RFC 4291", NET_REACH_LOCAL},
    {"::/128", "Unspecified Address", "RFC 4291", NET_REACH_LOCAL},
    {"::ffff:0:0/96", "IPv4-mapped Address", "RFC 4291", NET_REACH_LOCAL},
    {"64:ff9b::/96", "IPv4-IPv6 Translat.", "RFC 6052", NET_REACH_EMBEDDED_V4},
    {"64:ff9b:1::/48", "IPv4-IPv6 Translat. (local use)", "RFC 8215", NET_REACH_LOCAL},
    {"100::/64", "Discard-Only Address Block", "RFC 6666", NET_REACH_LOCAL},
    {"100:0:0:1::/64", "Dummy IPv6 Prefix", "RFC 9780", NET_REACH_LOCAL},
    {"2001::/23", "IETF Protocol Assignments", "RFC 2928", NET_REACH_LOCAL},
    {"2001::/32", "TEREDO", "RFC 4380", NET_REACH_NA},
    {"2001:1::1/128", "Port Control Protocol Anycast", "RFC 7723", NET_REACH_GLOBAL},
    {"2001:1::2/128", "Traversal Using Relays around NAT Anycast", "RFC 8155", NET_REACH_GLOBAL},
    {"2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", "RFC 9665", NET_REACH_GLOBAL},
    {"2001:2::/48", "Benchmarking", "RFC 5180", NET_REACH_LOCAL},
    {"2001:3::/32", "AMT", "RFC 7450", NET_REACH_GLOBAL},
    {"2001:4:112::/48", "AS112-v6", "RFC 7535", NET_REACH_GLOBAL},
    {"2001:10::/28", "Deprecated (previously ORCHID)", "RFC 4843", NET_REACH_NA},
    {"2001:20::/28", "ORCHIDv2", "RFC 7343", NET_REACH_GLOBAL},
    {"2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", "RFC 9374", NET_REACH_GLOBAL},
    {"2001:db8::/32", "Documentation", "RFC 3849", NET_REACH_LOCAL},
    {"2002::/16", "6to4", "RFC 3056", NET_REACH_NA},
    {"2620:4f:8000::/48", "Direct Delegation AS112 Service", "RFC 7534", NET_REACH_GLOBAL},
    {"3fff::/20", "Documentation", "RFC 9637", NET_REACH_LOCAL},
    {"5f00::/16", "Segment Routing (SRv6) SIDs", "RFC 9602", NET_REACH_LOCAL},
    {"fc00::/7", "Unique-Local", "RFC 4193", NET_REACH_LOCAL},
    {"fe80::/10", "Link-Local Unicast", "RFC 4291", NET_REACH_LOCAL},
    /* IPv6 address space registry: only 2000::/3 is global unicast; the rest is reserved,
     * multicast, or one of the blocks above; and two deprecated forms embedding IPv4 */
    {"::/0", "Reserved by IETF (not global unicast space)", "RFC 4291", NET_REACH_LOCAL},
    {"2000::/3", "Global Unicast", "RFC 4291", NET_REACH_GLOBAL},
    {"::/96", "IPv4-compatible Address (deprecated)", "RFC 4291", NET_REACH_LOCAL},
    {"::ffff:0:0:0/96", "IPv4-translated Address (obsolete)", "RFC 2765", NET_REACH_LOCAL},
    {"fec0::/10", "Site-Local Unicast (deprecated)", "RFC 3879", NET_REACH_LOCAL},
    {"ff00::/8", "Multicast", "RFC 4291", NET_REACH_LOCAL},
};
#define N_SPECIAL ((int)(sizeof k_special / sizeof k_special[0]))

const net_special *net_special_table(int *n) {
    *n = N_SPECIAL;
    return k_special;
}

/* The most specific table entry containing (family, addr), or NULL. */
static const net_special *special_find(int family, const unsigned char *addr) {
    const net_special *best = NULL;
    int best_bits = -1;
    for (int i = 0; i < N_SPECIAL; i++) {
        net_cidr net;
        CHECK(cidr_parse(k_special[i].block, &net) == 0); /* the table is ours */
        if (net.family == family && net.bits > best_bits && net_prefix_eq(addr, net.addr, net.bits)) {
            best = &k_special[i];
            best_bits = net.bits;
        }
    }
    return best;
}

/* 1 when the IPv6 interface id is ISATAP's ([00-03]00:5efe:a.b.c.d, RFC 5214 section 6.1). */
static int isatap_iid(const unsigned char *a) { return (a[8] & 0xfc) == 0 && a[9] == 0 && a[10] == 0x5e && a[11] == 0xfe; }

int net_addr_global(int family, const unsigned char *addr, const net_special **why) {
    const net_special *e = special_find(family, addr);
    if (why) *why = e;
    net_reach r = e ? e->reach : NET_REACH_GLOBAL;
    if (r == NET_REACH_EMBEDDED_V4) return net_addr_global(AF_INET, addr + 12, why);
    if (r != NET_REACH_GLOBAL) return 0;
    /* an ISATAP address leads to the IPv4 host it embeds, inside the site of its router */
    if (family == AF_INET6 && isatap_iid(addr) && !net_addr_global(AF_INET, addr + 12, NULL)) {
        if (why) *why = NULL;
        return 0;
    }
    return 1;
}
