/*
 * test_netaddr.c — the special-purpose address table (util/netaddr.h) at every block's edges: the
 * first and last address of each registry entry and the neighbours just outside it, each with the
 * verdict the registries give (the most specific block decides); the addresses an attacker found
 * accepted (issue: IPv4-translated, local NAT64, IPv4-compatible-like forms, ORCHID); the NAT64,
 * ISATAP and IPv4-mapped forms by their embedded IPv4 address; CIDR lists with mapped blocks.
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "test.h"
#include "util/netaddr.h"

typedef struct addr_case {
    const char *addr;
    int         global;   /* expected net_addr_global */
} addr_case;

/* Every entry's edges (first, last, just below, just above; each address once), with the verdict
 * of the most specific registry block containing it. */
static const addr_case k_edges[] = {
    {"0.0.0.0", 0}, /* first 0.0.0.0/8 */
    {"0.255.255.255", 0}, /* last 0.0.0.0/8 */
    {"1.0.0.0", 1}, /* above 0.0.0.0/8 */
    {"0.0.0.1", 0}, /* above 0.0.0.0/32 */
    {"10.0.0.0", 0}, /* first 10.0.0.0/8 */
    {"10.255.255.255", 0}, /* last 10.0.0.0/8 */
    {"9.255.255.255", 1}, /* below 10.0.0.0/8 */
    {"11.0.0.0", 1}, /* above 10.0.0.0/8 */
    {"100.64.0.0", 0}, /* first 100.64.0.0/10 */
    {"100.127.255.255", 0}, /* last 100.64.0.0/10 */
    {"100.63.255.255", 1}, /* below 100.64.0.0/10 */
    {"100.128.0.0", 1}, /* above 100.64.0.0/10 */
    {"127.0.0.0", 0}, /* first 127.0.0.0/8 */
    {"127.255.255.255", 0}, /* last 127.0.0.0/8 */
    {"126.255.255.255", 1}, /* below 127.0.0.0/8 */
    {"128.0.0.0", 1}, /* above 127.0.0.0/8 */
    {"169.254.0.0", 0}, /* first 169.254.0.0/16 */
    {"169.254.255.255", 0}, /* last 169.254.0.0/16 */
    {"169.253.255.255", 1}, /* below 169.254.0.0/16 */
    {"169.255.0.0", 1}, /* above 169.254.0.0/16 */
    {"172.16.0.0", 0}, /* first 172.16.0.0/12 */
    {"172.31.255.255", 0}, /* last 172.16.0.0/12 */
    {"172.15.255.255", 1}, /* below 172.16.0.0/12 */
    {"172.32.0.0", 1}, /* above 172.16.0.0/12 */
    {"192.0.0.0", 0}, /* first 192.0.0.0/24 */
    {"192.0.0.255", 0}, /* last 192.0.0.0/24 */
    {"191.255.255.255", 1}, /* below 192.0.0.0/24 */
    {"192.0.1.0", 1}, /* above 192.0.0.0/24 */
    {"192.0.0.7", 0}, /* last 192.0.0.0/29 */
    {"192.0.0.8", 0}, /* above 192.0.0.0/29 */
    {"192.0.0.9", 1}, /* above 192.0.0.8/32 */
    {"192.0.0.10", 1}, /* above 192.0.0.9/32 */
    {"192.0.0.11", 0}, /* above 192.0.0.10/32 */
    {"192.0.0.170", 0}, /* first 192.0.0.170/32 */
    {"192.0.0.169", 0}, /* below 192.0.0.170/32 */
    {"192.0.0.171", 0}, /* above 192.0.0.170/32 */
    {"192.0.0.172", 0}, /* above 192.0.0.171/32 */
    {"192.0.2.0", 0}, /* first 192.0.2.0/24 */
    {"192.0.2.255", 0}, /* last 192.0.2.0/24 */
    {"192.0.1.255", 1}, /* below 192.0.2.0/24 */
    {"192.0.3.0", 1}, /* above 192.0.2.0/24 */
    {"192.31.196.0", 1}, /* first 192.31.196.0/24 */
    {"192.31.196.255", 1}, /* last 192.31.196.0/24 */
    {"192.31.195.255", 1}, /* below 192.31.196.0/24 */
    {"192.31.197.0", 1}, /* above 192.31.196.0/24 */
    {"192.52.193.0", 1}, /* first 192.52.193.0/24 */
    {"192.52.193.255", 1}, /* last 192.52.193.0/24 */
    {"192.52.192.255", 1}, /* below 192.52.193.0/24 */
    {"192.52.194.0", 1}, /* above 192.52.193.0/24 */
    {"192.88.99.0", 0}, /* first 192.88.99.0/24 */
    {"192.88.99.255", 0}, /* last 192.88.99.0/24 */
    {"192.88.98.255", 1}, /* below 192.88.99.0/24 */
    {"192.88.100.0", 1}, /* above 192.88.99.0/24 */
    {"192.88.99.2", 0}, /* first 192.88.99.2/32 */
    {"192.88.99.1", 0}, /* below 192.88.99.2/32 */
    {"192.88.99.3", 0}, /* above 192.88.99.2/32 */
    {"192.168.0.0", 0}, /* first 192.168.0.0/16 */
    {"192.168.255.255", 0}, /* last 192.168.0.0/16 */
    {"192.167.255.255", 1}, /* below 192.168.0.0/16 */
    {"192.169.0.0", 1}, /* above 192.168.0.0/16 */
    {"192.175.48.0", 1}, /* first 192.175.48.0/24 */
    {"192.175.48.255", 1}, /* last 192.175.48.0/24 */
    {"192.175.47.255", 1}, /* below 192.175.48.0/24 */
    {"192.175.49.0", 1}, /* above 192.175.48.0/24 */
    {"198.18.0.0", 0}, /* first 198.18.0.0/15 */
    {"198.19.255.255", 0}, /* last 198.18.0.0/15 */
    {"198.17.255.255", 1}, /* below 198.18.0.0/15 */
    {"198.20.0.0", 1}, /* above 198.18.0.0/15 */
    {"198.51.100.0", 0}, /* first 198.51.100.0/24 */
    {"198.51.100.255", 0}, /* last 198.51.100.0/24 */
    {"198.51.99.255", 1}, /* below 198.51.100.0/24 */
    {"198.51.101.0", 1}, /* above 198.51.100.0/24 */
    {"203.0.113.0", 0}, /* first 203.0.113.0/24 */
    {"203.0.113.255", 0}, /* last 203.0.113.0/24 */
    {"203.0.112.255", 1}, /* below 203.0.113.0/24 */
    {"203.0.114.0", 1}, /* above 203.0.113.0/24 */
    {"240.0.0.0", 0}, /* first 240.0.0.0/4 */
    {"255.255.255.255", 0}, /* last 240.0.0.0/4 */
    {"239.255.255.255", 0}, /* below 240.0.0.0/4 */
    {"255.255.255.254", 0}, /* below 255.255.255.255/32 */
    {"224.0.0.0", 0}, /* first 224.0.0.0/4 */
    {"223.255.255.255", 1}, /* below 224.0.0.0/4 */
    {"::1", 0}, /* first ::1/128 */
    {"::", 0}, /* below ::1/128 */
    {"::2", 0}, /* above ::1/128 */
    {"::ffff:0:0", 0}, /* first ::ffff:0:0/96 */
    {"::ffff:ffff:ffff", 0}, /* last ::ffff:0:0/96 */
    {"::fffe:ffff:ffff", 0}, /* below ::ffff:0:0/96 */
    {"::1:0:0:0", 0}, /* above ::ffff:0:0/96 */
    {"64:ff9b::", 0}, /* first 64:ff9b::/96 */
    {"64:ff9b::ffff:ffff", 0}, /* last 64:ff9b::/96 */
    {"64:ff9a:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 64:ff9b::/96 */
    {"64:ff9b::1:0:0", 0}, /* above 64:ff9b::/96 */
    {"64:ff9b:1::", 0}, /* first 64:ff9b:1::/48 */
    {"64:ff9b:1:ffff:ffff:ffff:ffff:ffff", 0}, /* last 64:ff9b:1::/48 */
    {"64:ff9b:0:ffff:ffff:ffff:ffff:ffff", 0}, /* below 64:ff9b:1::/48 */
    {"64:ff9b:2::", 0}, /* above 64:ff9b:1::/48 */
    {"100::", 0}, /* first 100::/64 */
    {"100::ffff:ffff:ffff:ffff", 0}, /* last 100::/64 */
    {"ff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 100::/64 */
    {"100:0:0:1::", 0}, /* above 100::/64 */
    {"100::1:ffff:ffff:ffff:ffff", 0}, /* last 100:0:0:1::/64 */
    {"100:0:0:2::", 0}, /* above 100:0:0:1::/64 */
    {"2001::", 0}, /* first 2001::/23 */
    {"2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2001::/23 */
    {"2000:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* below 2001::/23 */
    {"2001:200::", 1}, /* above 2001::/23 */
    {"2001:0:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2001::/32 */
    {"2001:1::", 0}, /* above 2001::/32 */
    {"2001:1::1", 1}, /* first 2001:1::1/128 */
    {"2001:1::2", 1}, /* above 2001:1::1/128 */
    {"2001:1::3", 1}, /* above 2001:1::2/128 */
    {"2001:1::4", 0}, /* above 2001:1::3/128 */
    {"2001:2::", 0}, /* first 2001:2::/48 */
    {"2001:2:0:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2001:2::/48 */
    {"2001:1:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 2001:2::/48 */
    {"2001:2:1::", 0}, /* above 2001:2::/48 */
    {"2001:3::", 1}, /* first 2001:3::/32 */
    {"2001:3:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2001:3::/32 */
    {"2001:2:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 2001:3::/32 */
    {"2001:4::", 0}, /* above 2001:3::/32 */
    {"2001:4:112::", 1}, /* first 2001:4:112::/48 */
    {"2001:4:112:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2001:4:112::/48 */
    {"2001:4:111:ffff:ffff:ffff:ffff:ffff", 0}, /* below 2001:4:112::/48 */
    {"2001:4:113::", 0}, /* above 2001:4:112::/48 */
    {"2001:10::", 0}, /* first 2001:10::/28 */
    {"2001:1f:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2001:10::/28 */
    {"2001:f:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 2001:10::/28 */
    {"2001:20::", 1}, /* above 2001:10::/28 */
    {"2001:2f:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2001:20::/28 */
    {"2001:30::", 1}, /* above 2001:20::/28 */
    {"2001:3f:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2001:30::/28 */
    {"2001:40::", 0}, /* above 2001:30::/28 */
    {"2001:db8::", 0}, /* first 2001:db8::/32 */
    {"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2001:db8::/32 */
    {"2001:db7:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* below 2001:db8::/32 */
    {"2001:db9::", 1}, /* above 2001:db8::/32 */
    {"2002::", 0}, /* first 2002::/16 */
    {"2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 2002::/16 */
    {"2001:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* below 2002::/16 */
    {"2003::", 1}, /* above 2002::/16 */
    {"2620:4f:8000::", 1}, /* first 2620:4f:8000::/48 */
    {"2620:4f:8000:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2620:4f:8000::/48 */
    {"2620:4f:7fff:ffff:ffff:ffff:ffff:ffff", 1}, /* below 2620:4f:8000::/48 */
    {"2620:4f:8001::", 1}, /* above 2620:4f:8000::/48 */
    {"3fff::", 0}, /* first 3fff::/20 */
    {"3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 3fff::/20 */
    {"3ffe:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* below 3fff::/20 */
    {"3fff:1000::", 1}, /* above 3fff::/20 */
    {"5f00::", 0}, /* first 5f00::/16 */
    {"5f00:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last 5f00::/16 */
    {"5eff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 5f00::/16 */
    {"5f01::", 0}, /* above 5f00::/16 */
    {"fc00::", 0}, /* first fc00::/7 */
    {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last fc00::/7 */
    {"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below fc00::/7 */
    {"fe00::", 0}, /* above fc00::/7 */
    {"fe80::", 0}, /* first fe80::/10 */
    {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last fe80::/10 */
    {"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below fe80::/10 */
    {"fec0::", 0}, /* above fe80::/10 */
    {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last ::/0 */
    {"2000::", 1}, /* first 2000::/3 */
    {"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 1}, /* last 2000::/3 */
    {"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* below 2000::/3 */
    {"4000::", 0}, /* above 2000::/3 */
    {"::ffff:ffff", 0}, /* last ::/96 */
    {"::1:0:0", 0}, /* above ::/96 */
    {"::ffff:0:0:0", 0}, /* first ::ffff:0:0:0/96 */
    {"::ffff:0:ffff:ffff", 0}, /* last ::ffff:0:0:0/96 */
    {"::fffe:ffff:ffff:ffff", 0}, /* below ::ffff:0:0:0/96 */
    {"::ffff:1:0:0", 0}, /* above ::ffff:0:0:0/96 */
    {"feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", 0}, /* last fec0::/10 */
    {"ff00::", 0}, /* above fec0::/10 */
};

/* The forms that embed an IPv4 address, and what reaches internal hosts in them. */
static const addr_case k_embedded[] = {
    /* accepted before (issue 26): every one reaches a metadata, private or loopback address */
    {"::ffff:0:a9fe:a9fe", 0},      /* IPv4-translated ::ffff:0:0:0/96 (obsolete SIIT) */
    {"::ffff:0:10.0.0.1", 0},
    {"::ffff:0:127.0.0.1", 0},
    {"64:ff9b:1::a9fe:a9fe", 0},    /* local-use NAT64 64:ff9b:1::/48: not globally reachable */
    {"64:ff9b:1::7f00:1", 0},
    {"::1:a9fe:a9fe", 0},           /* reserved ::/8, outside 2000::/3 */
    {"::ffff:0:0:a9fe:a9fe", 0},
    {"2001:10::1", 0},              /* deprecated ORCHID, inside IETF Protocol Assignments */
    /* NAT64 well-known prefix: decided by the embedded IPv4 address */
    {"64:ff9b::808:808", 1},
    {"64:ff9b::a9fe:a9fe", 0},
    {"64:ff9b::7f00:1", 0},
    {"64:ff9b::c000:9", 1},         /* 192.0.0.9, PCP anycast: globally reachable */
    /* IPv4-compatible (deprecated): refused whatever it embeds */
    {"::8.8.8.8", 0},
    {"::127.0.0.1", 0},
    /* 6to4 and Teredo ("N/A"): refused whatever they embed */
    {"2002:808:808::1", 0},
    {"2002:7f00:1::", 0},
    {"2001:0:4136:e378:8000:63bf:3fff:fdd2", 0}, /* Teredo, client 192.0.2.45 obfuscated */
    {"2001:0:808:808:0:0:f7f7:f7f7", 0},         /* Teredo, client 8.8.8.8 obfuscated */
    /* ISATAP interface ids on a global prefix: the embedded IPv4 address must be global */
    {"2600::5efe:a00:1", 0},        /* 0000:5efe:10.0.0.1 */
    {"2600::200:5efe:a9fe:a9fe", 0},
    {"2600::200:5efe:808:808", 1},
    {"2600::300:5efe:7f00:1", 0},   /* u and g bits set */
    {"2600::400:5efe:7f00:1", 1},   /* not an ISATAP id */
    {"2600::5eff:7f00:1", 1},
    /* plain public addresses */
    {"8.8.8.8", 1},
    {"93.184.216.34", 1},
    {"2606:4700::1", 1},
};

static int parse_addr(const char *text, int *family, unsigned char *a) {
    memset(a, 0, 16);
    if (inet_pton(AF_INET, text, a) == 1) return *family = AF_INET, 1;
    if (inet_pton(AF_INET6, text, a) == 1) return *family = AF_INET6, 1;
    return 0;
}

static void check_cases(const addr_case *cases, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        int family = 0;
        unsigned char a[16];
        TEST_CHECK(parse_addr(cases[i].addr, &family, a), "%s: %s parses", what, cases[i].addr);
        const net_special *why = NULL;
        int g = net_addr_global(family, a, &why);
        TEST_CHECK(g == cases[i].global, "%s: %s is %s (decided by %s)", what, cases[i].addr,
                   cases[i].global ? "global" : "not global", why ? why->block : "no entry");
    }
}

/* The edge list covers every table entry: its first and last address are in it. */
static void test_edges_cover_table(void) {
    int n;
    const net_special *t = net_special_table(&n);
    TEST_CHECK(n >= 50, "the table holds both registries (%d entries)", n);
    for (int i = 0; i < n; i++) {
        net_cidr *c = NULL;
        int nc = 0;
        um_err err = {0};
        TEST_CHECK(net_cidr_list_parse(t[i].block, "test", &c, &nc, &err) == 0 && nc == 1, "%s parses", t[i].block);
        if (nc != 1) continue;
        unsigned char last[16];
        int len = c->family == AF_INET ? 4 : 16;
        memcpy(last, c->addr, 16);
        for (int b = c->bits; b < len * 8; b++) last[b / 8] |= (unsigned char)(0x80 >> (b % 8));
        /* (an IPv4-mapped block is stored as IPv4; its edges are listed in IPv6 form) */
        int found_first = 0, found_last = 0;
        for (size_t k = 0; k < sizeof k_edges / sizeof k_edges[0]; k++) {
            int family = 0;
            unsigned char a[16];
            if (!parse_addr(k_edges[k].addr, &family, a)) continue;
            net_addr_unmap(&family, a);
            if (family != c->family) continue;
            if (memcmp(a, c->addr, (size_t)len) == 0) found_first = 1;
            if (memcmp(a, last, (size_t)len) == 0) found_last = 1;
        }
        TEST_CHECK(found_first && found_last, "%s (%s): first and last address are tested", t[i].block, t[i].name);
        free(c);
    }
}

/* A mapped address is judged as the IPv4 address once unmapped; as itself it is not global. */
static void test_mapped(void) {
    int family = 0;
    unsigned char a[16];
    parse_addr("::ffff:8.8.8.8", &family, a);
    TEST_CHECK(!net_addr_global(family, a, NULL), "::ffff:8.8.8.8 as IPv6 is the mapped block (not global)");
    TEST_CHECK(net_addr_unmap(&family, a) && family == AF_INET && net_addr_global(family, a, NULL),
               "unmapped it is 8.8.8.8 (global)");
    parse_addr("::ffff:169.254.169.254", &family, a);
    TEST_CHECK(net_addr_unmap(&family, a) && !net_addr_global(family, a, NULL), "::ffff:169.254.169.254 -> link local");
    parse_addr("2001:db8::1", &family, a);
    TEST_CHECK(!net_addr_unmap(&family, a) && family == AF_INET6, "other IPv6 addresses stay");
}

static void test_cidr_lists(void) {
    net_cidr *l = NULL;
    int n = 0;
    um_err err = {0};
    TEST_CHECK(net_cidr_list_parse("10.0.0.0/8, ::ffff:127.0.0.0/104 fd00::/8,192.0.2.7", "x", &l, &n, &err) == 0 && n == 4,
               "list parses: %s", err.msg);
    TEST_CHECK(n == 4 && l[1].family == AF_INET && l[1].bits == 8, "a mapped block is stored as IPv4 (127.0.0.0/8)");
    TEST_CHECK(net_cidr_list_contains_text(l, n, "127.9.9.9") && net_cidr_list_contains_text(l, n, "::ffff:127.0.0.1"),
               "both spellings of a loopback address are in it");
    TEST_CHECK(net_cidr_list_contains_text(l, n, "10.200.0.1") && net_cidr_list_contains_text(l, n, "fd12::1") &&
                   net_cidr_list_contains_text(l, n, "192.0.2.7") && !net_cidr_list_contains_text(l, n, "192.0.2.8") &&
                   !net_cidr_list_contains_text(l, n, "11.0.0.1") && !net_cidr_list_contains_text(l, n, "not-an-address"),
               "membership");
    free(l);
    TEST_CHECK(net_cidr_list_parse("10.0.0.0/33", "webhook-allow", &l, &n, &err) == -1 && strstr(err.msg, "prefix") &&
                   strcmp(err.param, "webhook-allow") == 0,
               "bad prefix: %s", err.msg);
    TEST_CHECK(net_cidr_list_parse("10.0.0.1/", "x", &l, &n, &err) == -1, "empty prefix");
    TEST_CHECK(net_cidr_list_parse("example.com", "x", &l, &n, &err) == -1 && strstr(err.msg, "example.com"), "a name");
    TEST_CHECK(net_cidr_list_parse("", "x", &l, &n, &err) == 0 && n == 0 && l == NULL, "empty list");
}

int main(void) {
    check_cases(k_edges, sizeof k_edges / sizeof k_edges[0], "edge");
    check_cases(k_embedded, sizeof k_embedded / sizeof k_embedded[0], "embedded");
    test_edges_cover_table();
    test_mapped();
    test_cidr_lists();
    return test_report();
}
