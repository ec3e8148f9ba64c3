/*
 * unicode_regex.c — compile a pre-tokenizer pattern into a node tree and match it by backtracking
 * with continuations (Oniguruma / Perl leftmost-first semantics). Quantified single-character
 * atoms loop iteratively, so \p{L}+ over a 10 MB word uses constant stack; only quantified groups
 * recurse (bounded by MATCH_MAX_DEPTH).
 *
 * Not here: anchors, back-references, lookbehind, scripts, inline flags (see unicode_regex.h).
 * Threads: compiled regexes are read-only; matching state lives on the caller's stack.
 */
#include "text/unicode_regex.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/unicode.h"
#include "util/log.h"

#define MATCH_MAX_DEPTH 4000
#define REP_INF         (-1)

enum rn_type { RN_EMPTY, RN_CHAR, RN_CLASS, RN_ANY, RN_SEQ, RN_ALT, RN_REP, RN_LOOK };
enum rep_mode { REP_GREEDY, REP_LAZY, REP_POSSESSIVE };
enum ci_kind { CI_RANGE, CI_CAT, CI_NCAT, CI_SPACE, CI_NSPACE, CI_WORD, CI_NWORD, CI_DIGIT, CI_NDIGIT };

typedef struct citem {
    enum ci_kind kind;
    uint32_t a, b;            /* RANGE: [a, b]; CAT / NCAT: category mask in a */
} citem;

typedef struct rclass {
    citem   *items;
    int      n, cap;
    int      neg;             /* [^...] */
    int      icase;
    uint32_t ascii[4];        /* precomputed membership (incl. neg / icase) for code points < 128 */
} rclass;

typedef struct rnode {
    enum rn_type type;
    uint32_t cp;              /* CHAR: code point (case-folded when icase) */
    int icase;                /* CHAR */
    rclass *cls;              /* CLASS */
    struct rnode **kids;      /* SEQ / ALT */
    int nkids;
    struct rnode *kid;        /* REP / LOOK */
    int min, max;             /* REP; max = REP_INF for unbounded */
    enum rep_mode mode;       /* REP */
    int neg;                  /* LOOK: (?!..) */
} rnode;

typedef struct firstset {
    uint32_t ascii[4];        /* bytes < 0x80 that can start a match */
    int nonascii;             /* a non-ASCII code point may start a match */
    int nullable;             /* can match the empty string */
} firstset;

/* An alternative that is a plain sequence of (quantified) single-character atoms, greedy or
 * possessive, optionally ending in a lookahead of one character class: matched by an iterative
 * backtracking loop over repeat counts instead of the recursive matcher (same semantics). */
#define SIMPLE_MAX 8

typedef struct simple_item {
    const rnode *atom;        /* CHAR / CLASS / ANY */
    int min, max;             /* max = REP_INF */
    int possessive;
} simple_item;

typedef struct simple_seq {
    simple_item items[SIMPLE_MAX];
    int n;
    const rnode *look;        /* trailing (?=x) / (?!x) with a single-character x, or NULL */
    int look_neg;
} simple_seq;

struct uregex {
    rnode  *root;
    rnode **alts;             /* root's alternatives (root itself when not an ALT) */
    int     nalts;
    firstset *first;          /* per alternative */
    simple_seq **simple;      /* per alternative: the fast form, or NULL */
    rnode **all;              /* every node, for freeing */
    int     nall, capall;
};

/* ================================================================ parsing */

typedef struct parser {
    uregex *re;
    const uint8_t *p, *end;
    const uint8_t *start;
    um_err *err;
    int failed;
} parser;

static int perr(parser *ps, enum um_err_code code, const char *what) {
    if (!ps->failed)
        um_err_set(ps->err, code, "regex: %s at offset %zu", what, (size_t)(ps->p - ps->start));
    ps->failed = 1;
    return -1;
}

static rnode *node_new(parser *ps, enum rn_type t) {
    uregex *re = ps->re;
    rnode *n = xcalloc(1, sizeof *n);
    n->type = t;
    if (re->nall == re->capall) {
        re->capall = re->capall ? re->capall * 2 : 32;
        re->all = xrealloc(re->all, (size_t)re->capall * sizeof *re->all);
    }
    re->all[re->nall++] = n;
    return n;
}

static void node_add_kid(rnode *n, rnode *k) {
    n->kids = xrealloc(n->kids, (size_t)(n->nkids + 1) * sizeof *n->kids);
    n->kids[n->nkids++] = k;
}

static void class_add(rclass *c, enum ci_kind kind, uint32_t a, uint32_t b) {
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 8;
        c->items = xrealloc(c->items, (size_t)c->cap * sizeof *c->items);
    }
    c->items[c->n++] = (citem){kind, a, b};
}

static int class_match_raw(const rclass *c, uint32_t cp) {
    for (int i = 0; i < c->n; i++) {
        const citem *it = &c->items[i];
        switch (it->kind) {
        case CI_RANGE: if (cp >= it->a && cp <= it->b) return 1; break;
        case CI_CAT: if ((it->a >> unicode_category(cp)) & 1) return 1; break;
        case CI_NCAT: if (!((it->a >> unicode_category(cp)) & 1)) return 1; break;
        case CI_SPACE: if (unicode_is_space(cp)) return 1; break;
        case CI_NSPACE: if (!unicode_is_space(cp)) return 1; break;
        case CI_WORD: if (unicode_is_word(cp)) return 1; break;
        case CI_NWORD: if (!unicode_is_word(cp)) return 1; break;
        case CI_DIGIT: if (unicode_category(cp) == UCAT_ND) return 1; break;
        case CI_NDIGIT: if (unicode_category(cp) != UCAT_ND) return 1; break;
        }
    }
    return 0;
}

typedef struct fold_probe {
    const rclass *c;
    int hit;
} fold_probe;

static void fold_probe_fn(uint32_t cp, void *arg) {
    fold_probe *fp = arg;
    if (!fp->hit && class_match_raw(fp->c, cp)) fp->hit = 1;
}

static int class_match_slow(const rclass *c, uint32_t cp) {
    int r = class_match_raw(c, cp);
    if (!r && c->icase) {
        uint32_t f = unicode_fold(cp);
        if (f != cp) r = class_match_raw(c, f);
        if (!r) {
            fold_probe fp = {c, 0};
            unicode_fold_inverse(f, fold_probe_fn, &fp);
            r = fp.hit;
        }
    }
    return r ^ c->neg;
}

static void class_finish(rclass *c) {
    memset(c->ascii, 0, sizeof c->ascii);
    for (uint32_t cp = 0; cp < 128; cp++)
        if (class_match_slow(c, cp)) c->ascii[cp >> 5] |= 1u << (cp & 31);
}

static int hexval(int ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static int32_t parse_literal_cp(parser *ps) {
    size_t adv;
    int32_t cp = utf8_decode(ps->p, (size_t)(ps->end - ps->p), &adv);
    if (cp < 0) return perr(ps, UM_ERR_FORMAT, "invalid UTF-8 in pattern");
    ps->p += adv;
    return cp;
}

static int parse_hex(parser *ps, int ndig, int braced, uint32_t *out) {
    uint32_t v = 0;
    int k = 0;
    if (braced) {
        if (ps->p >= ps->end || *ps->p != '{') return perr(ps, UM_ERR_FORMAT, "expected '{' in \\x{..}");
        ps->p++;
        while (ps->p < ps->end && *ps->p != '}') {
            int h = hexval(*ps->p);
            if (h < 0 || k >= 8) return perr(ps, UM_ERR_FORMAT, "bad hex escape");
            v = v * 16 + (uint32_t)h, k++, ps->p++;
        }
        if (ps->p >= ps->end || k == 0) return perr(ps, UM_ERR_FORMAT, "unterminated \\x{..}");
        ps->p++;
    } else {
        for (k = 0; k < ndig; k++) {
            if (ps->p >= ps->end || hexval(*ps->p) < 0) return perr(ps, UM_ERR_FORMAT, "bad hex escape");
            v = v * 16 + (uint32_t)hexval(*ps->p++);
        }
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) return perr(ps, UM_ERR_FORMAT, "escape out of range");
    *out = v;
    return 0;
}

static const struct {
    const char *name;
    uint32_t mask;
} prop_names[] = {
    {"L", UCAT_MASK_L}, {"Letter", UCAT_MASK_L}, {"Lu", 1u << UCAT_LU}, {"Ll", 1u << UCAT_LL},
    {"Lt", 1u << UCAT_LT}, {"Lm", 1u << UCAT_LM}, {"Lo", 1u << UCAT_LO},
    {"M", UCAT_MASK_M}, {"Mark", UCAT_MASK_M}, {"Mn", 1u << UCAT_MN}, {"Mc", 1u << UCAT_MC}, {"Me", 1u << UCAT_ME},
    {"N", UCAT_MASK_N}, {"Number", UCAT_MASK_N}, {"Nd", 1u << UCAT_ND}, {"Nl", 1u << UCAT_NL}, {"No", 1u << UCAT_NO},
    {"P", (1u << UCAT_PC) | (1u << UCAT_PD) | (1u << UCAT_PS) | (1u << UCAT_PE) | (1u << UCAT_PI) |
              (1u << UCAT_PF) | (1u << UCAT_PO)},
    {"Punctuation", (1u << UCAT_PC) | (1u << UCAT_PD) | (1u << UCAT_PS) | (1u << UCAT_PE) | (1u << UCAT_PI) |
                        (1u << UCAT_PF) | (1u << UCAT_PO)},
    {"Pc", 1u << UCAT_PC}, {"Pd", 1u << UCAT_PD}, {"Ps", 1u << UCAT_PS}, {"Pe", 1u << UCAT_PE},
    {"Pi", 1u << UCAT_PI}, {"Pf", 1u << UCAT_PF}, {"Po", 1u << UCAT_PO},
    {"S", (1u << UCAT_SM) | (1u << UCAT_SC) | (1u << UCAT_SK) | (1u << UCAT_SO)},
    {"Symbol", (1u << UCAT_SM) | (1u << UCAT_SC) | (1u << UCAT_SK) | (1u << UCAT_SO)},
    {"Sm", 1u << UCAT_SM}, {"Sc", 1u << UCAT_SC}, {"Sk", 1u << UCAT_SK}, {"So", 1u << UCAT_SO},
    {"Z", (1u << UCAT_ZS) | (1u << UCAT_ZL) | (1u << UCAT_ZP)},
    {"Separator", (1u << UCAT_ZS) | (1u << UCAT_ZL) | (1u << UCAT_ZP)},
    {"Zs", 1u << UCAT_ZS}, {"Zl", 1u << UCAT_ZL}, {"Zp", 1u << UCAT_ZP},
    {"C", (1u << UCAT_CC) | (1u << UCAT_CF) | (1u << UCAT_CS) | (1u << UCAT_CO) | (1u << UCAT_CN)},
    {"Other", (1u << UCAT_CC) | (1u << UCAT_CF) | (1u << UCAT_CS) | (1u << UCAT_CO) | (1u << UCAT_CN)},
    {"Cc", 1u << UCAT_CC}, {"Cf", 1u << UCAT_CF}, {"Cs", 1u << UCAT_CS}, {"Co", 1u << UCAT_CO},
    {"Cn", 1u << UCAT_CN},
};

/* After "\p" or "\P": parse {Name} / {^Name} / single letter; returns mask, sets *neg. */
static int parse_prop(parser *ps, uint32_t *mask, int *neg) {
    char name[32];
    size_t k = 0;
    if (ps->p < ps->end && *ps->p == '{') {
        ps->p++;
        if (ps->p < ps->end && *ps->p == '^') *neg = !*neg, ps->p++;
        while (ps->p < ps->end && *ps->p != '}') {
            if (k + 1 >= sizeof name) return perr(ps, UM_ERR_UNSUPPORTED, "unknown \\p{} property");
            name[k++] = (char)*ps->p++;
        }
        if (ps->p >= ps->end) return perr(ps, UM_ERR_FORMAT, "unterminated \\p{");
        ps->p++;
    } else if (ps->p < ps->end) {
        name[k++] = (char)*ps->p++;
    }
    name[k] = 0;
    for (size_t i = 0; i < sizeof prop_names / sizeof prop_names[0]; i++)
        if (strcmp(prop_names[i].name, name) == 0) {
            *mask = prop_names[i].mask;
            return 0;
        }
    if (!ps->failed)
        um_err_set(ps->err, UM_ERR_UNSUPPORTED, "regex: unsupported property \\p{%s} at offset %zu", name,
                   (size_t)(ps->p - ps->start));
    ps->failed = 1;
    return -1;
}

/* Parse an escape after '\'. Either a single code point (*cp, returns 0) or a class item added to
 * cls (returns 1). */
static int parse_escape(parser *ps, rclass *cls, uint32_t *cp) {
    if (ps->p >= ps->end) return perr(ps, UM_ERR_FORMAT, "trailing backslash");
    uint8_t c = *ps->p++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case 'a': *cp = 7; return 0;
    case 'e': *cp = 27; return 0;
    case 'x':
        return parse_hex(ps, 2, ps->p < ps->end && *ps->p == '{', cp) < 0 ? -1 : 0;
    case 'u': return parse_hex(ps, 4, 0, cp) < 0 ? -1 : 0;
    case 's': class_add(cls, CI_SPACE, 0, 0); return 1;
    case 'S': class_add(cls, CI_NSPACE, 0, 0); return 1;
    case 'w': class_add(cls, CI_WORD, 0, 0); return 1;
    case 'W': class_add(cls, CI_NWORD, 0, 0); return 1;
    case 'd': class_add(cls, CI_DIGIT, 0, 0); return 1;
    case 'D': class_add(cls, CI_NDIGIT, 0, 0); return 1;
    case 'p':
    case 'P': {
        uint32_t mask;
        int neg = c == 'P';
        if (parse_prop(ps, &mask, &neg) < 0) return -1;
        class_add(cls, neg ? CI_NCAT : CI_CAT, mask, 0);
        return 1;
    }
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            char what[48];
            snprintf(what, sizeof what, "unsupported escape \\%c", c);
            return perr(ps, UM_ERR_UNSUPPORTED, what);
        }
        ps->p--;
        int32_t v = parse_literal_cp(ps); /* escaped punctuation / any other character: literal */
        if (v < 0) return -1;
        *cp = (uint32_t)v;
        return 0;
    }
}

static rnode *parse_class(parser *ps, int icase) {
    rnode *n = node_new(ps, RN_CLASS);
    rclass *c = xcalloc(1, sizeof *c);
    n->cls = c;
    c->icase = icase;
    ps->p++; /* '[' */
    if (ps->p < ps->end && *ps->p == '^') c->neg = 1, ps->p++;
    int first = 1;
    for (;;) {
        if (ps->p >= ps->end) return perr(ps, UM_ERR_FORMAT, "unterminated character class"), NULL;
        uint8_t ch = *ps->p;
        if (ch == ']' && !first) {
            ps->p++;
            break;
        }
        if (ch == '[') return perr(ps, UM_ERR_UNSUPPORTED, "nested character class"), NULL;
        if (ch == '&' && ps->p + 1 < ps->end && ps->p[1] == '&')
            return perr(ps, UM_ERR_UNSUPPORTED, "class intersection &&"), NULL;
        first = 0;
        uint32_t lo;
        if (ch == '\\') {
            ps->p++;
            int r = parse_escape(ps, c, &lo);
            if (r < 0) return NULL;
            if (r == 1) continue;
        } else {
            int32_t v = parse_literal_cp(ps);
            if (v < 0) return NULL;
            lo = (uint32_t)v;
        }
        uint32_t hi = lo;
        if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
            ps->p++;
            if (*ps->p == '\\') {
                ps->p++;
                rclass tmp = {0};
                int r = parse_escape(ps, &tmp, &hi);
                free(tmp.items);
                if (r < 0) return NULL;
                if (r == 1) return perr(ps, UM_ERR_FORMAT, "class escape as range end"), NULL;
            } else {
                int32_t v = parse_literal_cp(ps);
                if (v < 0) return NULL;
                hi = (uint32_t)v;
            }
            if (hi < lo) return perr(ps, UM_ERR_FORMAT, "empty range in character class"), NULL;
        }
        class_add(c, CI_RANGE, lo, hi);
    }
    class_finish(c);
    return n;
}

static rnode *parse_alt(parser *ps, int icase);

static rnode *parse_atom(parser *ps, int icase) {
    uint8_t ch = *ps->p;
    switch (ch) {
    case '(': {
        ps->p++;
        int sub_icase = icase;
        rnode *look = NULL;
        if (ps->p < ps->end && *ps->p == '?') {
            ps->p++;
            if (ps->p >= ps->end) return perr(ps, UM_ERR_FORMAT, "unterminated group"), NULL;
            if (*ps->p == ':') {
                ps->p++;
            } else if (*ps->p == '=' || *ps->p == '!') {
                look = node_new(ps, RN_LOOK);
                look->neg = *ps->p == '!';
                ps->p++;
            } else if (*ps->p == '>') {
                return perr(ps, UM_ERR_UNSUPPORTED, "atomic group (?>...)"), NULL;
            } else if (*ps->p == '<') {
                return perr(ps, UM_ERR_UNSUPPORTED, "lookbehind or named group (?<...)"), NULL;
            } else {
                int on = 1, any = 0;
                while (ps->p < ps->end && *ps->p != ':' && *ps->p != ')') {
                    if (*ps->p == '-') on = 0;
                    else if (*ps->p == 'i') sub_icase = on, any = 1;
                    else return perr(ps, UM_ERR_UNSUPPORTED, "inline flag other than i"), NULL;
                    ps->p++;
                }
                if (ps->p >= ps->end || *ps->p == ')' || !any)
                    return perr(ps, UM_ERR_UNSUPPORTED, "inline flag group without ':' (e.g. (?i))"), NULL;
                ps->p++;
            }
        }
        rnode *inner = parse_alt(ps, sub_icase);
        if (!inner) return NULL;
        if (ps->p >= ps->end || *ps->p != ')') return perr(ps, UM_ERR_FORMAT, "missing ')'"), NULL;
        ps->p++;
        if (look) {
            look->kid = inner;
            return look;
        }
        return inner;
    }
    case '[': return parse_class(ps, icase);
    case '.': ps->p++; return node_new(ps, RN_ANY);
    case '^': case '$': return perr(ps, UM_ERR_UNSUPPORTED, "anchor ^ or $"), NULL;
    case '*': case '+': case '?': case '{': return perr(ps, UM_ERR_FORMAT, "nothing to repeat"), NULL;
    case '\\': {
        if (ps->p + 1 < ps->end) {
            uint8_t e = ps->p[1];
            if (e == 'b' || e == 'B' || e == 'A' || e == 'z' || e == 'Z' || e == 'G')
                return perr(ps, UM_ERR_UNSUPPORTED, "anchor escape (\\b \\A \\z ...)"), NULL;
            if (e >= '1' && e <= '9') return perr(ps, UM_ERR_UNSUPPORTED, "back-reference"), NULL;
        }
        ps->p++;
        rclass tmp = {0};
        uint32_t cp;
        int r = parse_escape(ps, &tmp, &cp);
        if (r < 0) {
            free(tmp.items);
            return NULL;
        }
        if (r == 1) {
            rnode *n = node_new(ps, RN_CLASS);
            n->cls = xcalloc(1, sizeof *n->cls);
            *n->cls = tmp;
            n->cls->icase = icase;
            class_finish(n->cls);
            return n;
        }
        free(tmp.items);
        rnode *n = node_new(ps, RN_CHAR);
        n->icase = icase;
        n->cp = icase ? unicode_fold(cp) : cp;
        return n;
    }
    default: {
        int32_t cp = parse_literal_cp(ps);
        if (cp < 0) return NULL;
        rnode *n = node_new(ps, RN_CHAR);
        n->icase = icase;
        n->cp = icase ? unicode_fold((uint32_t)cp) : (uint32_t)cp;
        return n;
    }
    }
}

static int parse_int(parser *ps, int *v) {
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return 0;
    long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > 100000) return perr(ps, UM_ERR_UNSUPPORTED, "repeat count too large");
    }
    *v = (int)x;
    return 1;
}

static rnode *parse_quant(parser *ps, rnode *atom) {
    while (ps->p < ps->end) {
        uint8_t ch = *ps->p;
        int min, max, braced = 0;
        if (ch == '?') min = 0, max = 1;
        else if (ch == '*') min = 0, max = REP_INF;
        else if (ch == '+') min = 1, max = REP_INF;
        else if (ch == '{') {
            const uint8_t *save = ps->p;
            ps->p++;
            int a = 0, b = REP_INF, ha, hb = 0;
            ha = parse_int(ps, &a);
            if (ha < 0) return NULL;
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                hb = parse_int(ps, &b);
                if (hb < 0) return NULL;
                if (!hb) b = REP_INF;
            } else {
                b = a;
            }
            if (ps->p >= ps->end || *ps->p != '}' || (!ha && !hb)) {
                ps->p = save;
                return perr(ps, UM_ERR_UNSUPPORTED, "malformed {n,m} repeat"), NULL;
            }
            if (b != REP_INF && b < a) return perr(ps, UM_ERR_FORMAT, "repeat {n,m} with m < n"), NULL;
            min = a, max = b, braced = 1;
        } else {
            break;
        }
        ps->p++;
        if (atom->type == RN_LOOK) return perr(ps, UM_ERR_UNSUPPORTED, "quantified lookahead"), NULL;
        rnode *r = node_new(ps, RN_REP);
        r->kid = atom, r->min = min, r->max = max, r->mode = REP_GREEDY;
        if (ps->p < ps->end && *ps->p == '?') r->mode = REP_LAZY, ps->p++;
        else if (ps->p < ps->end && *ps->p == '+') {
            if (braced) return perr(ps, UM_ERR_UNSUPPORTED, "'+' after {n,m} (not possessive in Oniguruma)"), NULL;
            r->mode = REP_POSSESSIVE, ps->p++;
        }
        atom = r;
    }
    return atom;
}

static rnode *parse_seq(parser *ps, int icase) {
    rnode *seq = node_new(ps, RN_SEQ);
    while (ps->p < ps->end && *ps->p != '|' && *ps->p != ')') {
        rnode *a = parse_atom(ps, icase);
        if (!a) return NULL;
        a = parse_quant(ps, a);
        if (!a) return NULL;
        node_add_kid(seq, a);
    }
    if (seq->nkids == 1) return seq->kids[0];
    if (seq->nkids == 0) seq->type = RN_EMPTY;
    return seq;
}

static rnode *parse_alt(parser *ps, int icase) {
    rnode *first = parse_seq(ps, icase);
    if (!first) return NULL;
    if (ps->p >= ps->end || *ps->p != '|') return first;
    rnode *alt = node_new(ps, RN_ALT);
    node_add_kid(alt, first);
    while (ps->p < ps->end && *ps->p == '|') {
        ps->p++;
        rnode *s = parse_seq(ps, icase);
        if (!s) return NULL;
        node_add_kid(alt, s);
    }
    return alt;
}

/* ================================================================ first sets */

static void first_of(const rnode *n, firstset *f) {
    memset(f, 0, sizeof *f);
    switch (n->type) {
    case RN_EMPTY:
    case RN_LOOK: f->nullable = 1; break;
    case RN_CHAR:
        if (n->icase) {
            f->nonascii = 1;
            for (uint32_t c = 0; c < 128; c++)
                if (unicode_fold(c) == n->cp) f->ascii[c >> 5] |= 1u << (c & 31);
        } else if (n->cp < 128) {
            f->ascii[n->cp >> 5] |= 1u << (n->cp & 31);
        } else {
            f->nonascii = 1;
        }
        break;
    case RN_CLASS: memcpy(f->ascii, n->cls->ascii, sizeof f->ascii); f->nonascii = 1; break;
    case RN_ANY:
        memset(f->ascii, 0xFF, sizeof f->ascii);
        f->ascii['\n' >> 5] &= ~(1u << ('\n' & 31));
        f->nonascii = 1;
        break;
    case RN_SEQ:
        f->nullable = 1;
        for (int i = 0; i < n->nkids && f->nullable; i++) {
            firstset k;
            first_of(n->kids[i], &k);
            for (int j = 0; j < 4; j++) f->ascii[j] |= k.ascii[j];
            f->nonascii |= k.nonascii;
            f->nullable = k.nullable;
        }
        break;
    case RN_ALT:
        for (int i = 0; i < n->nkids; i++) {
            firstset k;
            first_of(n->kids[i], &k);
            for (int j = 0; j < 4; j++) f->ascii[j] |= k.ascii[j];
            f->nonascii |= k.nonascii;
            f->nullable |= k.nullable;
        }
        break;
    case RN_REP:
        first_of(n->kid, f);
        if (n->min == 0 || n->max == 0) f->nullable = 1;
        break;
    }
}

static int is_single_node(const rnode *n) { return n->type == RN_CHAR || n->type == RN_CLASS || n->type == RN_ANY; }

static simple_seq *simple_of(const rnode *alt) {
    const rnode *const *kids = &alt;
    int nk = 1;
    if (alt->type == RN_SEQ) kids = (const rnode *const *)alt->kids, nk = alt->nkids;
    simple_seq q = {0};
    for (int i = 0; i < nk; i++) {
        const rnode *k = kids[i];
        if (k->type == RN_LOOK && i == nk - 1 && is_single_node(k->kid)) {
            q.look = k->kid, q.look_neg = k->neg;
            continue;
        }
        if (q.n == SIMPLE_MAX) return NULL;
        if (is_single_node(k)) {
            q.items[q.n++] = (simple_item){k, 1, 1, 0};
        } else if (k->type == RN_REP && is_single_node(k->kid) && k->mode != REP_LAZY) {
            q.items[q.n++] = (simple_item){k->kid, k->min, k->max, k->mode == REP_POSSESSIVE};
        } else {
            return NULL;
        }
    }
    if (q.n == 0) return NULL;
    simple_seq *out = xmalloc(sizeof *out);
    *out = q;
    return out;
}

int uregex_compile(const char *pattern, size_t len, uregex **out, um_err *err) {
    *out = NULL;
    uregex *re = xcalloc(1, sizeof *re);
    parser ps = {re, (const uint8_t *)pattern, (const uint8_t *)pattern + len, (const uint8_t *)pattern, err, 0};
    rnode *root = parse_alt(&ps, 0);
    if (root && ps.p < ps.end) {
        perr(&ps, UM_ERR_FORMAT, "unmatched ')'");
        root = NULL;
    }
    if (!root) {
        uregex_free(re);
        return -1;
    }
    re->root = root;
    if (root->type == RN_ALT) {
        re->alts = root->kids;
        re->nalts = root->nkids;
    } else {
        re->alts = &re->root;
        re->nalts = 1;
    }
    re->first = xcalloc((size_t)re->nalts, sizeof *re->first);
    re->simple = xcalloc((size_t)re->nalts, sizeof *re->simple);
    for (int i = 0; i < re->nalts; i++) {
        first_of(re->alts[i], &re->first[i]);
        re->simple[i] = simple_of(re->alts[i]);
    }
    *out = re;
    return 0;
}

void uregex_free(uregex *re) {
    if (!re) return;
    for (int i = 0; i < re->nall; i++) {
        rnode *n = re->all[i];
        if (n->cls) {
            free(n->cls->items);
            free(n->cls);
        }
        free(n->kids);
        free(n);
    }
    free(re->all);
    free(re->first);
    for (int i = 0; re->simple && i < re->nalts; i++) free(re->simple[i]);
    free(re->simple);
    free(re);
}

/* ================================================================ matching */

typedef struct matcher {
    const uint8_t *s;
    size_t len;
    int depth;
    int overflow;
} matcher;

enum kont_kind { K_SEQ, K_REP };

typedef struct kont {
    enum kont_kind kind;
    const rnode *n;
    int idx;                  /* K_SEQ: next kid; K_REP: iterations done */
    size_t start;             /* K_REP: where the current iteration began */
    const struct kont *next;
} kont;

static long m_node(matcher *m, const rnode *n, size_t pos, const kont *k);

static inline int is_single(const rnode *n) {
    return n->type == RN_CHAR || n->type == RN_CLASS || n->type == RN_ANY;
}

/* Does single-character node n match at pos? Sets *adv to the character's byte length. */
static inline int m_one(const matcher *m, const rnode *n, size_t pos, size_t *adv) {
    if (pos >= m->len) return 0;
    uint32_t cp = m->s[pos];
    if (cp < 0x80) {
        *adv = 1;
        switch (n->type) {
        case RN_CHAR: return (n->icase ? unicode_fold(cp) : cp) == n->cp;
        case RN_CLASS: return (n->cls->ascii[cp >> 5] >> (cp & 31)) & 1;
        default: return cp != '\n';
        }
    }
    int32_t d = utf8_decode(m->s + pos, m->len - pos, adv);
    cp = d < 0 ? 0xFFFD : (uint32_t)d;
    switch (n->type) {
    case RN_CHAR: return (n->icase ? unicode_fold(cp) : cp) == n->cp;
    case RN_CLASS: return class_match_slow(n->cls, cp);
    default: return 1;
    }
}

static inline size_t prev_char(const matcher *m, size_t pos) {
    do pos--;
    while (pos > 0 && (m->s[pos] & 0xC0) == 0x80);
    return pos;
}

static long m_kont(matcher *m, size_t pos, const kont *k);

static long m_rep(matcher *m, const rnode *n, int count, size_t pos, const kont *k) {
    if (n->mode == REP_POSSESSIVE) {
        /* atomic: the first way the greedy loop matches on its own is the only one tried */
        rnode g = *n;
        g.mode = REP_GREEDY;
        long e = m_rep(m, &g, count, pos, NULL);
        if (e < 0) return -1;
        return m_kont(m, (size_t)e, k);
    }
    int can_more = n->max == REP_INF || count < n->max;
    kont nk = {K_REP, n, count + 1, pos, k};
    if (n->mode == REP_GREEDY) {
        if (can_more) {
            long r = m_node(m, n->kid, pos, &nk);
            if (r >= 0 || m->overflow) return r;
        }
        return count >= n->min ? m_kont(m, pos, k) : -1;
    }
    if (count >= n->min) {
        long r = m_kont(m, pos, k);
        if (r >= 0 || m->overflow) return r;
    }
    return can_more ? m_node(m, n->kid, pos, &nk) : -1;
}

static long m_kont(matcher *m, size_t pos, const kont *k) {
    while (k) {
        if (k->kind == K_SEQ) {
            if (k->idx < k->n->nkids) {
                kont nk = {K_SEQ, k->n, k->idx + 1, 0, k->next};
                return m_node(m, k->n->kids[k->idx], pos, &nk);
            }
            k = k->next;
            continue;
        }
        /* K_REP: one more iteration finished at pos; an empty iteration ends the loop */
        if (pos == k->start) {
            if (k->idx >= k->n->min) {
                k = k->next;
                continue;
            }
        }
        return m_rep(m, k->n, k->idx, pos, k->next);
    }
    return (long)pos;
}

static long m_node(matcher *m, const rnode *n, size_t pos, const kont *k) {
    if (m->overflow) return -1;
    if (++m->depth > MATCH_MAX_DEPTH) {
        m->overflow = 1;
        m->depth--;
        return -1;
    }
    long r = -1;
    size_t adv;
    switch (n->type) {
    case RN_EMPTY: r = m_kont(m, pos, k); break;
    case RN_CHAR:
    case RN_CLASS:
    case RN_ANY:
        if (m_one(m, n, pos, &adv)) r = m_kont(m, pos + adv, k);
        break;
    case RN_SEQ: {
        kont nk = {K_SEQ, n, 0, 0, k};
        r = m_kont(m, pos, &nk);
        break;
    }
    case RN_ALT:
        for (int i = 0; i < n->nkids; i++) {
            r = m_node(m, n->kids[i], pos, k);
            if (r >= 0 || m->overflow) break;
        }
        break;
    case RN_LOOK: {
        long e = m_node(m, n->kid, pos, NULL);
        if (m->overflow) break;
        if ((e >= 0) != n->neg) r = m_kont(m, pos, k);
        break;
    }
    case RN_REP:
        if (!is_single(n->kid)) {
            r = m_rep(m, n, 0, pos, k);
            break;
        }
        {
            /* iterative: count how many characters the atom matches in a row */
            long cnt = 0;
            size_t p = pos;
            long maxc = n->max == REP_INF ? -1 : n->max;
            if (n->mode == REP_LAZY) {
                while (cnt < n->min && m_one(m, n->kid, p, &adv)) p += adv, cnt++;
                if (cnt < n->min) break;
                for (;;) {
                    r = m_kont(m, p, k);
                    if (r >= 0 || m->overflow) break;
                    if ((maxc >= 0 && cnt >= maxc) || !m_one(m, n->kid, p, &adv)) break;
                    p += adv, cnt++;
                }
                break;
            }
            while ((maxc < 0 || cnt < maxc) && m_one(m, n->kid, p, &adv)) p += adv, cnt++;
            if (cnt < n->min) break;
            if (n->mode == REP_POSSESSIVE) {
                r = m_kont(m, p, k);
                break;
            }
            for (;;) {
                r = m_kont(m, p, k);
                if (r >= 0 || m->overflow || cnt == n->min) break;
                p = prev_char(m, p);
                cnt--;
            }
        }
        break;
    }
    m->depth--;
    return r;
}

/* Iterative backtracking over the repeat counts of a simple sequence (greedy: most first). */
static long m_simple(const matcher *m, const simple_seq *q, size_t pos) {
    size_t end[SIMPLE_MAX];
    long cnt[SIMPLE_MAX];
    int k = 0;
    size_t p = pos, adv;
    for (;;) {
        /* forward: match items k.. greedily */
        while (k < q->n) {
            const simple_item *it = &q->items[k];
            long c = 0;
            while ((it->max == REP_INF || c < it->max) && m_one(m, it->atom, p, &adv)) p += adv, c++;
            if (c < it->min) goto backtrack;
            cnt[k] = c, end[k] = p;
            k++;
        }
        if (!q->look) return (long)p;
        {
            int hit = m_one(m, q->look, p, &adv);
            if (hit != q->look_neg) return (long)p;
        }
    backtrack:
        /* give back one character from the last item that can */
        for (;;) {
            if (--k < 0) return -1;
            const simple_item *it = &q->items[k];
            if (!it->possessive && cnt[k] > it->min) {
                cnt[k]--;
                end[k] = prev_char(m, end[k]);
                p = end[k];
                k++;
                break;
            }
        }
        /* the items after k restart from p */
    }
}

int uregex_find(const uregex *re, const char *s, size_t len, size_t from, size_t *ms, size_t *me,
                um_err *err) {
    matcher m = {(const uint8_t *)s, len, 0, 0};
    size_t pos = from;
    while (pos <= len) {
        uint8_t b = pos < len ? m.s[pos] : 0;
        for (int i = 0; i < re->nalts; i++) {
            const firstset *f = &re->first[i];
            if (!f->nullable) {
                if (pos >= len) continue;
                if (b < 0x80 ? !((f->ascii[b >> 5] >> (b & 31)) & 1) : !f->nonascii) continue;
            }
            long e = re->simple[i] ? m_simple(&m, re->simple[i], pos) : m_node(&m, re->alts[i], pos, NULL);
            if (m.overflow)
                return um_err_set(err, UM_ERR_RESOURCE, "regex: backtracking depth limit exceeded at byte %zu",
                                  pos);
            if (e >= 0) {
                if ((size_t)e == pos) break; /* empty match: skip this position, as find_iter does */
                *ms = pos, *me = (size_t)e;
                return 1;
            }
        }
        if (pos >= len) break;
        size_t adv = 1;
        if (b >= 0x80) utf8_decode(m.s + pos, len - pos, &adv);
        pos += adv;
    }
    return 0;
}
