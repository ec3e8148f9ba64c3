/*
 * args.c — command-line flag parsing. Main thread only.
 */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

void args_print_help(const char *usage, const arg_spec *specs) {
    printf("%s\n\nOptions:\n", usage);
    for (const arg_spec *s = specs; s->name; s++) {
        const char *meta = s->type == ARG_STR ? " S" : s->type == ARG_INT ? " N" : s->type == ARG_FLOAT ? " X" : "";
        char left[64];
        snprintf(left, sizeof left, "--%s%s", s->name, meta);
        printf("  %-26s %s\n", left, s->help);
    }
    printf("  %-26s %s\n", "--help", "show this help");
}

static int set_value(const arg_spec *s, const char *v) {
    char *end;
    switch (s->type) {
    case ARG_STR: *(const char **)s->dst = v; return 0;
    case ARG_INT: {
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < INT_MIN || x > INT_MAX) {
            fprintf(stderr, "error: --%s expects an integer, got '%s'\n", s->name, v);
            return -1;
        }
        *(int *)s->dst = (int)x;
        return 0;
    }
    case ARG_FLOAT: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || *end || end == v) {
            fprintf(stderr, "error: --%s expects a number, got '%s'\n", s->name, v);
            return -1;
        }
        *(double *)s->dst = x;
        return 0;
    }
    case ARG_FLAG: *(int *)s->dst = 1; return 0;
    }
    return -1;
}

int args_parse(int argc, char **argv, const char *usage, const arg_spec *specs) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            args_print_help(usage, specs);
            return 1;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "error: unexpected argument '%s' (see --help)\n", a);
            return -1;
        }
        a += 2;
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const arg_spec *s = specs;
        for (; s->name; s++)
            if (strlen(s->name) == nl && strncmp(s->name, a, nl) == 0) break;
        if (!s->name) {
            fprintf(stderr, "error: unknown option '--%.*s' (see --help)\n", (int)nl, a);
            return -1;
        }
        if (s->type == ARG_FLAG) {
            if (eq) {
                fprintf(stderr, "error: --%s takes no value\n", s->name);
                return -1;
            }
            *(int *)s->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "error: --%s needs a value\n", s->name);
            return -1;
        }
        if (set_value(s, v) != 0) return -1;
    }
    return 0;
}

int args_parse_int_list(const char *flag, const char *s, int **out) {
    int cap = 16, n = 0;
    int *v = xmalloc((size_t)cap * sizeof *v);
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || errno || x < INT_MIN || x > INT_MAX || (*end && *end != ',')) {
            fprintf(stderr, "error: --%s expects comma-separated integers, got '%s'\n", flag, s);
            free(v);
            return -1;
        }
        if (n == cap) v = xrealloc(v, (size_t)(cap *= 2) * sizeof *v);
        v[n++] = (int)x;
        p = *end ? end + 1 : end;
    }
    if (n == 0) {
        fprintf(stderr, "error: --%s is empty\n", flag);
        free(v);
        return -1;
    }
    *out = v;
    return n;
}
