/*
 * jinja.c — compile a chat template (Jinja2 subset, see jinja.h) into a tree, render it over JSON
 * variables with Python/Jinja2 semantics: Python-style str() of values, truthiness, `and`/`or`
 * returning operands, Undefined that prints as "" but fails on attribute access and `+`, one
 * scope per for-loop (set inside a loop does not leak), namespace() for loop-carried state.
 *
 * Not here: loading tokenizer_config.json (chat_template.c); HTML autoescape; sandbox checks
 * beyond "no method mutates anything".
 * Threads: compiled templates are read-only; each render has its own arena; any thread.
 */
#include "text/jinja.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/unicode.h"
#include "util/log.h"
#include "util/strbuf.h"

#define RENDER_MAX_OUTPUT   (16u << 20)
#define RENDER_MAX_STEPS    1000000
#define RENDER_MAX_MEMORY   ((size_t)256 << 20)   /* arena bytes of one render */
#define EVAL_MAX_DEPTH      200

/* ================================================================ arena */

typedef struct arena_blk {
    struct arena_blk *next;
    size_t used, cap;
    max_align_t data[];
} arena_blk;

typedef struct arena {
    arena_blk *head;
    size_t total;             /* bytes allocated in blocks */
} arena;

static void *ar_alloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        arena_blk *b = xmalloc(sizeof *b + cap);
        b->next = a->head, b->used = 0, b->cap = cap;
        a->total += cap;
        a->head = b;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void *ar_zalloc(arena *a, size_t n) {
    void *p = ar_alloc(a, n);
    memset(p, 0, n);
    return p;
}

static char *ar_strndup(arena *a, const char *s, size_t n) {
    char *p = ar_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static void ar_free(arena *a) {
    while (a->head) {
        arena_blk *n = a->head->next;
        free(a->head);
        a->head = n;
    }
}

/* ================================================================ values */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC, V_METHOD } vtype;

typedef struct vlist vlist;
typedef struct vdict vdict;

typedef struct value {
    vtype t;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;                         /* V_STR; V_METHOD: method name */
        vlist *l;
        vdict *d;
        int fn;                      /* V_FUNC */
    } u;
    const struct value *obj;        /* V_METHOD: the bound object */
} value;

struct vlist {
    value *v;
    size_t n, cap;
};

struct vdict {
    const char **k;
    size_t *kn;
    value *v;
    size_t n, cap;
    int is_ns;                       /* namespace(): attributes may be set */
};

enum { FN_RAISE, FN_RANGE, FN_NAMESPACE, FN_DICT, FN_STRFTIME };

static value v_undef(void) { return (value){.t = V_UNDEF}; }
static value v_none(void) { return (value){.t = V_NONE}; }
static value v_bool(int b) { return (value){.t = V_BOOL, .u.b = !!b}; }
static value v_int(int64_t i) { return (value){.t = V_INT, .u.i = i}; }
static value v_float(double f) { return (value){.t = V_FLOAT, .u.f = f}; }
static value v_str(const char *p, size_t n) { return (value){.t = V_STR, .u.s = {p, n}}; }

static vlist *list_new(arena *a) { return ar_zalloc(a, sizeof(vlist)); }
static void list_push(arena *a, vlist *l, value v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        value *nv = ar_alloc(a, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv, l->cap = cap;
    }
    l->v[l->n++] = v;
}
static value v_list(vlist *l) { return (value){.t = V_LIST, .u.l = l}; }

static vdict *dict_new(arena *a) { return ar_zalloc(a, sizeof(vdict)); }
static value *dict_find(const vdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == kn && memcmp(d->k[i], k, kn) == 0) return &d->v[i];
    return NULL;
}
static void dict_set(arena *a, vdict *d, const char *k, size_t kn, value v) {
    value *slot = dict_find(d, k, kn);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        const char **nk = ar_alloc(a, cap * sizeof *nk);
        size_t *nkn = ar_alloc(a, cap * sizeof *nkn);
        value *nv = ar_alloc(a, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nkn, d->kn, d->n * sizeof *nkn);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk, d->kn = nkn, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k, d->kn[d->n] = kn, d->v[d->n] = v;
    d->n++;
}
static value v_dict(vdict *d) { return (value){.t = V_DICT, .u.d = d}; }

static value from_json(arena *a, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        vdict *d = dict_new(a);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) dict_set(a, d, ar_strndup(a, k, strlen(k)), strlen(k), from_json(a, v));
        return v_dict(d);
    }
    case JSON_ARRAY: {
        vlist *l = list_new(a);
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) list_push(a, l, from_json(a, v));
        return v_list(l);
    }
    case JSON_STRING: return v_str(ar_strndup(a, json_string_value(j), json_string_length(j)), json_string_length(j));
    case JSON_INTEGER: return v_int(json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    default: return v_none();
    }
}

static const char *type_name(vtype t) {
    static const char *names[] = {"undefined", "none", "bool", "int", "float", "string", "list", "dict", "function",
                                  "method"};
    return names[t];
}

/* ================================================================ AST */

enum expr_kind {
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_BIN, E_AND, E_OR,
    E_CMP, E_COND, E_LIST, E_TUPLE, E_DICT
};
enum bin_op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT };
enum cmp_op { CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct expr expr;
struct expr {
    enum expr_kind kind;
    int line;
    value lit;                /* E_LIT */
    const char *name;         /* E_NAME, E_ATTR, E_FILTER, E_TEST */
    size_t name_n;
    expr *a, *b, *c, *d;      /* operands; E_SLICE: a[b:c:d]; E_COND: c ? a : b */
    expr **args;              /* E_CALL / E_FILTER / E_TEST args; E_LIST / E_TUPLE items; E_DICT k,v,k,v.. */
    int nargs;
    const char **kwn;         /* keyword argument names */
    expr **kwv;
    int nkw;
    int op;                   /* bin_op / cmp_op; E_CMP chains use args + ops */
    int *ops;                 /* E_CMP: nargs-1 operators between args */
    int negate;               /* E_TEST: "is not" */
    int fid;                  /* E_FILTER / E_TEST: index into the table */
};

enum stmt_kind { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_BREAK, S_CONTINUE };

typedef struct stmt stmt;
typedef struct block {
    stmt **s;
    int n;
} block;

struct stmt {
    enum stmt_kind kind;
    int line;
    const char *text;         /* S_TEXT */
    size_t text_n;
    expr *e;                  /* S_OUT / S_IF cond / S_FOR iterable / S_SET value */
    expr *filter;             /* S_FOR ... if filter */
    const char *target[2];    /* S_FOR loop variables; S_SET / S_SETBLOCK name */
    int ntarget;
    const char *attr;         /* S_SET ns.attr */
    block body, orelse;       /* S_IF then/else (elif = nested S_IF); S_FOR body/else; S_SETBLOCK body */
};

struct jinja_tmpl {
    arena ar;
    block root;
};

/* ================================================================ lexer */

enum tok_type { T_EOF, T_TEXT, T_VAR_BEGIN, T_BLOCK_BEGIN, T_VAR_END, T_BLOCK_END, T_NAME, T_INT, T_FLOAT, T_STR, T_OP };

typedef struct token {
    enum tok_type t;
    const char *s;            /* T_TEXT / T_NAME / T_STR (decoded) / T_OP */
    size_t n;
    int64_t i;
    double f;
    int line;
} token;

typedef struct lexer {
    arena *ar;
    const char *src;
    size_t len, pos;
    int line;
    token *toks;
    size_t ntok, captok;
    um_err *err;
} lexer;

static int lex_err(lexer *lx, enum um_err_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int lex_err(lexer *lx, enum um_err_code code, const char *fmt, ...) {
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return um_err_set(lx->err, code, "chat template line %d: %s", lx->line, msg);
}

static token *tok_push(lexer *lx, enum tok_type t) {
    if (lx->ntok == lx->captok) {
        lx->captok = lx->captok ? lx->captok * 2 : 256;
        lx->toks = xrealloc(lx->toks, lx->captok * sizeof *lx->toks);
    }
    token *k = &lx->toks[lx->ntok++];
    memset(k, 0, sizeof *k);
    k->t = t;
    k->line = lx->line;
    return k;
}

static int is_ident_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_ident(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }

/* Python unicode-escape decoding of a string literal body. */
static int lex_string(lexer *lx, char quote) {
    strbuf b = {0};
    lx->pos++; /* opening quote */
    for (;;) {
        if (lx->pos >= lx->len) {
            strbuf_free(&b);
            return lex_err(lx, UM_ERR_FORMAT, "unterminated string literal");
        }
        char c = lx->src[lx->pos++];
        if (c == quote) break;
        if (c == '\n') lx->line++;
        if (c != '\\') {
            strbuf_put(&b, &c, 1);
            continue;
        }
        if (lx->pos >= lx->len) continue;
        char e = lx->src[lx->pos++];
        char ch = 0;
        switch (e) {
        case 'n': ch = '\n'; break;
        case 't': ch = '\t'; break;
        case 'r': ch = '\r'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'v': ch = '\v'; break;
        case 'a': ch = '\a'; break;
        case '0': ch = 0; break;
        case '\\': ch = '\\'; break;
        case '\'': ch = '\''; break;
        case '"': ch = '"'; break;
        case '\n': lx->line++; continue; /* line continuation */
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0;
            for (int k = 0; k < nd; k++) {
                char h = lx->pos < lx->len ? lx->src[lx->pos] : 0;
                int v = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                      : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                if (v < 0) {
                    strbuf_free(&b);
                    return lex_err(lx, UM_ERR_FORMAT, "bad \\%c escape in string literal", e);
                }
                cp = cp * 16 + (uint32_t)v;
                lx->pos++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
                strbuf_free(&b);
                return lex_err(lx, UM_ERR_FORMAT, "escape out of range in string literal");
            }
            char u8[4];
            strbuf_put(&b, u8, (size_t)utf8_encode(cp, u8));
            continue;
        }
        default: { /* unknown escape: kept as is, like Python */
            char two[2] = {'\\', e};
            strbuf_put(&b, two, 2);
            continue;
        }
        }
        strbuf_put(&b, &ch, 1);
    }
    token *k = tok_push(lx, T_STR);
    k->s = ar_strndup(lx->ar, strbuf_str(&b), b.n);
    k->n = b.n;
    strbuf_free(&b);
    return 0;
}

/* Tokens inside {{ }} / {% %} up to the closing delimiter. Returns 0 and sets *strip_after when
 * the tag ends with '-'. */
static int lex_tag(lexer *lx, char close, int *strip_after) {
    static const char *ops3[] = {"**", "//", "==", "!=", "<=", ">=", NULL};
    for (;;) {
        while (lx->pos < lx->len && strchr(" \t\n\r", lx->src[lx->pos])) {
            if (lx->src[lx->pos] == '\n') lx->line++;
            lx->pos++;
        }
        if (lx->pos >= lx->len) return lex_err(lx, UM_ERR_FORMAT, "unterminated tag (missing '%c}')", close);
        const char *p = lx->src + lx->pos;
        size_t rest = lx->len - lx->pos;
        if (rest >= 3 && p[0] == '-' && p[1] == close && p[2] == '}') {
            lx->pos += 3;
            *strip_after = 1;
            return 0;
        }
        if (rest >= 2 && p[0] == close && p[1] == '}') {
            lx->pos += 2;
            *strip_after = 0;
            return 0;
        }
        if (rest >= 3 && p[0] == '+' && p[1] == close && p[2] == '}') { /* "+%}": keep the newline */
            lx->pos += 3;
            *strip_after = 2;
            return 0;
        }
        char c = p[0];
        if (c == '\'' || c == '"') {
            if (lex_string(lx, c) != 0) return -1;
            continue;
        }
        if (c >= '0' && c <= '9') {
            size_t k = 0;
            int is_float = 0;
            while (k < rest && ((p[k] >= '0' && p[k] <= '9') || p[k] == '_')) k++;
            if (k + 1 < rest && p[k] == '.' && p[k + 1] >= '0' && p[k + 1] <= '9') {
                is_float = 1;
                k++;
                while (k < rest && p[k] >= '0' && p[k] <= '9') k++;
            }
            if (k < rest && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < rest && (p[e] == '+' || p[e] == '-')) e++;
                if (e < rest && p[e] >= '0' && p[e] <= '9') {
                    is_float = 1;
                    k = e;
                    while (k < rest && p[k] >= '0' && p[k] <= '9') k++;
                }
            }
            char num[64];
            size_t o = 0;
            for (size_t q = 0; q < k && o + 1 < sizeof num; q++)
                if (p[q] != '_') num[o++] = p[q];
            num[o] = 0;
            token *t = tok_push(lx, is_float ? T_FLOAT : T_INT);
            if (is_float) t->f = strtod(num, NULL);
            else t->i = strtoll(num, NULL, 10);
            lx->pos += k;
            continue;
        }
        if (is_ident_start(c)) {
            size_t k = 1;
            while (k < rest && is_ident(p[k])) k++;
            token *t = tok_push(lx, T_NAME);
            t->s = p, t->n = k;
            lx->pos += k;
            continue;
        }
        size_t k = 1;
        for (int q = 0; ops3[q]; q++)
            if (rest >= 2 && p[0] == ops3[q][0] && p[1] == ops3[q][1]) k = 2;
        if (k == 1 && !strchr("+-*/%~<>=()[]{},.:|!", c))
            return lex_err(lx, UM_ERR_FORMAT, "unexpected character '%c' in tag", c);
        token *t = tok_push(lx, T_OP);
        t->s = p, t->n = k;
        lx->pos += k;
    }
}

typedef struct seg {
    int is_tag;
    size_t a, b;              /* text: src[a..b) */
    char kind;                /* tag: '{' var, '%' block */
    int strip_before, plus, strip_after;
    size_t tok_first, tok_end; /* tag tokens [first, end) */
} seg;

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* Split the source into text and tags, apply whitespace control, produce the token stream. */
static int lex_all(lexer *lx) {
    seg *segs = NULL;
    size_t nseg = 0, capseg = 0;
    int rc = 0;
    while (lx->pos < lx->len) {
        const char *p = lx->src + lx->pos;
        const char *q = p;
        const char *end = lx->src + lx->len;
        while (q + 1 < end && !(q[0] == '{' && (q[1] == '{' || q[1] == '%' || q[1] == '#'))) q++;
        if (q + 1 >= end) q = end;
        if (nseg + 2 > capseg) {
            capseg = capseg ? capseg * 2 : 64;
            segs = xrealloc(segs, capseg * sizeof *segs);
        }
        if (q > p) {
            segs[nseg++] = (seg){0, lx->pos, (size_t)(q - lx->src), 0, 0, 0, 0, 0, 0};
            for (const char *c = p; c < q; c++)
                if (*c == '\n') lx->line++;
        }
        lx->pos = (size_t)(q - lx->src);
        if (q == end) break;
        char kind = q[1];
        seg s = {1, 0, 0, kind, 0, 0, 0, 0, 0};
        lx->pos += 2;
        if (lx->pos < lx->len && lx->src[lx->pos] == '-') s.strip_before = 1, lx->pos++;
        else if (lx->pos < lx->len && lx->src[lx->pos] == '+') s.plus = 1, lx->pos++;
        if (kind == '#') {
            const char *ce = lx->src + lx->pos;
            while (ce + 1 < end && !(ce[0] == '#' && ce[1] == '}')) {
                if (*ce == '\n') lx->line++;
                ce++;
            }
            if (ce + 1 >= end) {
                rc = lex_err(lx, UM_ERR_FORMAT, "unterminated comment");
                break;
            }
            s.strip_after = ce > lx->src + lx->pos && ce[-1] == '-';
            lx->pos = (size_t)(ce - lx->src) + 2;
            segs[nseg++] = s;
            continue;
        }
        s.tok_first = lx->ntok;
        if (lex_tag(lx, kind == '{' ? '}' : '%', &s.strip_after) != 0) {
            rc = -1;
            break;
        }
        s.tok_end = lx->ntok;
        segs[nseg++] = s;
    }
    if (rc != 0) {
        free(segs);
        return -1;
    }
    /* whitespace control over text segments, then the final token stream */
    token *tags = lx->toks;
    size_t ntags = lx->ntok;
    lx->toks = NULL, lx->ntok = lx->captok = 0;
    for (size_t i = 0; i < nseg; i++) {
        seg *s = &segs[i];
        if (!s->is_tag) {
            size_t a = s->a, b = s->b;
            const seg *prev = i > 0 ? &segs[i - 1] : NULL, *next = i + 1 < nseg ? &segs[i + 1] : NULL;
            int starting = prev == NULL; /* does this text begin at the start of a line? */
            if (prev && prev->strip_after == 1) { /* "-%}": all whitespace after the tag */
                while (a < b && is_ws(lx->src[a])) a++;
                starting = a > s->a && lx->src[a - 1] == '\n';
            } else if (prev && prev->kind != '{' && prev->strip_after != 2 && a < b && lx->src[a] == '\n') {
                a++; /* trim_blocks: the first newline after a block or comment tag */
                starting = 1;
            }
            if (next && next->strip_before) {
                while (b > a && is_ws(lx->src[b - 1])) b--;
            } else if (next && next->kind != '{' && !next->plus) { /* lstrip_blocks */
                size_t l = b;
                while (l > a && (lx->src[l - 1] == ' ' || lx->src[l - 1] == '\t')) l--;
                if ((l > a && lx->src[l - 1] == '\n') || (l == a && starting)) b = l;
            }
            if (b > a) {
                token *t = tok_push(lx, T_TEXT);
                t->s = lx->src + a, t->n = b - a;
            }
            continue;
        }
        if (s->kind == '#') continue;
        token *t = tok_push(lx, s->kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN);
        t->line = s->tok_first < ntags ? tags[s->tok_first].line : lx->line;
        for (size_t k = s->tok_first; k < s->tok_end; k++) *tok_push(lx, tags[k].t) = tags[k];
        tok_push(lx, s->kind == '{' ? T_VAR_END : T_BLOCK_END);
    }
    tok_push(lx, T_EOF);
    free(tags);
    free(segs);
    return 0;
}

/* ================================================================ parser */

typedef struct parser {
    arena *ar;
    token *t;
    size_t pos;
    um_err *err;
    int failed;
    int depth;                /* expression / block nesting, bounded */
} parser;

#define PARSE_MAX_DEPTH 100

static int perr(parser *p, enum um_err_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *p, enum um_err_code code, const char *fmt, ...) {
    if (p->failed) return -1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    um_err_set(p->err, code, "chat template line %d: %s", p->t[p->pos].line, msg);
    p->failed = 1;
    return -1;
}

static token *cur(parser *p) { return &p->t[p->pos]; }
static int is_op(const token *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && memcmp(t->s, op, t->n) == 0; }
static int is_name(const token *t, const char *nm) {
    return t->t == T_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}
static int accept_op(parser *p, const char *op) {
    if (is_op(cur(p), op)) {
        p->pos++;
        return 1;
    }
    return 0;
}
static int accept_name(parser *p, const char *nm) {
    if (is_name(cur(p), nm)) {
        p->pos++;
        return 1;
    }
    return 0;
}
static int expect_op(parser *p, const char *op) {
    if (accept_op(p, op)) return 0;
    return perr(p, UM_ERR_FORMAT, "expected '%s'", op);
}

static expr *enew(parser *p, enum expr_kind k) {
    expr *e = ar_zalloc(p->ar, sizeof *e);
    e->kind = k;
    e->line = cur(p)->line;
    return e;
}

static void eargs_push(parser *p, expr *e, expr *a) {
    expr **n = ar_alloc(p->ar, (size_t)(e->nargs + 1) * sizeof *n);
    if (e->nargs) memcpy(n, e->args, (size_t)e->nargs * sizeof *n);
    n[e->nargs++] = a;
    e->args = n;
}

static void ekw_push(parser *p, expr *e, const char *name, expr *v) {
    const char **nn = ar_alloc(p->ar, (size_t)(e->nkw + 1) * sizeof *nn);
    expr **nv = ar_alloc(p->ar, (size_t)(e->nkw + 1) * sizeof *nv);
    if (e->nkw) {
        memcpy(nn, e->kwn, (size_t)e->nkw * sizeof *nn);
        memcpy(nv, e->kwv, (size_t)e->nkw * sizeof *nv);
    }
    nn[e->nkw] = name, nv[e->nkw] = v;
    e->nkw++;
    e->kwn = nn, e->kwv = nv;
}

static expr *parse_expr(parser *p);
static expr *parse_or(parser *p);
static expr *parse_unary(parser *p, int with_filter);
static expr *parse_primary(parser *p);

static const char *tok_name(parser *p, const token *t) { return ar_strndup(p->ar, t->s, t->n); }

/* (args, kw=args) after '(' has been consumed */
static int parse_call_args(parser *p, expr *e) {
    while (!accept_op(p, ")")) {
        if (p->failed) return -1;
        if (cur(p)->t == T_NAME && is_op(&p->t[p->pos + 1], "=")) {
            const char *nm = tok_name(p, cur(p));
            p->pos += 2;
            expr *v = parse_expr(p);
            if (!v) return -1;
            ekw_push(p, e, nm, v);
        } else {
            expr *v = parse_expr(p);
            if (!v) return -1;
            eargs_push(p, e, v);
        }
        if (!is_op(cur(p), ")") && expect_op(p, ",") != 0) return -1;
    }
    return 0;
}

/* node(args) after '(' has been consumed: the call expression, or NULL on a parse error. */
static expr *parse_call_of(parser *p, expr *node) {
    expr *c = enew(p, E_CALL);
    c->a = node;
    if (parse_call_args(p, c) != 0) return NULL;
    return c;
}

static const char *const FILTERS[] = {
    "trim", "length", "count", "upper", "lower", "title", "capitalize", "default", "d", "tojson", "first", "last",
    "join", "replace", "string", "int", "float", "list", "reverse", "items", "safe", "abs", "selectattr",
    "rejectattr", "map", "select", "reject", "unique", "sum", "min", "max", "round", "e", "escape", "indent",
    "wordcount", "batch", "dictsort", "sort", NULL};
static const char *const TESTS[] = {
    "defined", "undefined", "none", "boolean", "true", "false", "string", "number", "integer", "float", "mapping",
    "iterable", "sequence", "callable", "odd", "even", "divisibleby", "eq", "equalto", "==", "ne", "!=", "lt", "<",
    "gt", ">", "le", "<=", "ge", ">=", "in", "lower", "upper", "sameas", NULL};
/* filters parsed but not implemented: rejected at compile time with their name */
static const char *const FILTERS_UNSUPPORTED[] = {"round", "e", "escape", "indent", "wordcount", "batch",
                                                  "dictsort", "sort", NULL};

static int table_find(const char *const *tab, const char *s, size_t n) {
    for (int i = 0; tab[i]; i++)
        if (strlen(tab[i]) == n && memcmp(tab[i], s, n) == 0) return i;
    return -1;
}

static expr *parse_filter_expr(parser *p, expr *node) {
    for (;;) {
        if (p->failed) return NULL;
        if (accept_op(p, "|")) {
            token *t = cur(p);
            if (t->t != T_NAME) return perr(p, UM_ERR_FORMAT, "expected a filter name after '|'"), NULL;
            int fid = table_find(FILTERS, t->s, t->n);
            if (fid < 0 || table_find(FILTERS_UNSUPPORTED, t->s, t->n) >= 0)
                return perr(p, UM_ERR_UNSUPPORTED, "unsupported filter '%.*s'", (int)t->n, t->s), NULL;
            expr *f = enew(p, E_FILTER);
            f->name = tok_name(p, t), f->name_n = t->n, f->fid = fid, f->a = node;
            p->pos++;
            if (accept_op(p, "(") && parse_call_args(p, f) != 0) return NULL;
            node = f;
        } else if (is_name(cur(p), "is")) {
            p->pos++;
            expr *te = enew(p, E_TEST);
            te->a = node;
            if (accept_name(p, "not")) te->negate = 1;
            token *t = cur(p);
            int tid = -1;
            if (t->t == T_NAME || t->t == T_OP) tid = table_find(TESTS, t->s, t->n);
            if (t->t == T_NAME && (is_name(t, "none") || is_name(t, "None"))) tid = table_find(TESTS, "none", 4);
            if (t->t == T_NAME && (is_name(t, "true") || is_name(t, "True"))) tid = table_find(TESTS, "true", 4);
            if (t->t == T_NAME && (is_name(t, "false") || is_name(t, "False"))) tid = table_find(TESTS, "false", 5);
            if (tid < 0) return perr(p, UM_ERR_UNSUPPORTED, "unsupported test 'is %.*s'", (int)t->n, t->s), NULL;
            te->fid = tid, te->name = TESTS[tid], te->name_n = strlen(TESTS[tid]);
            p->pos++;
            if (accept_op(p, "(")) {
                if (parse_call_args(p, te) != 0) return NULL;
            } else {
                token *n = cur(p);
                int arg_follows = n->t == T_STR || n->t == T_INT || n->t == T_FLOAT ||
                                  (n->t == T_NAME && !is_name(n, "else") && !is_name(n, "or") && !is_name(n, "and") &&
                                   !is_name(n, "if") && !is_name(n, "is") && !is_name(n, "in") && !is_name(n, "not"));
                if (arg_follows) {
                    expr *a = parse_primary(p);
                    if (!a) return NULL;
                    eargs_push(p, te, a);
                }
            }
            node = te;
        } else if (accept_op(p, "(")) {
            if (!(node = parse_call_of(p, node))) return NULL;
        } else {
            return node;
        }
    }
}

static expr *parse_postfix(parser *p, expr *node) {
    for (;;) {
        if (p->failed) return NULL;
        if (accept_op(p, ".")) {
            token *t = cur(p);
            if (t->t != T_NAME && t->t != T_INT) return perr(p, UM_ERR_FORMAT, "expected an attribute name after '.'"), NULL;
            expr *e = enew(p, E_ATTR);
            e->a = node;
            if (t->t == T_NAME) {
                e->name = tok_name(p, t), e->name_n = t->n;
            } else { /* x.0 = x[0] */
                e->kind = E_ITEM;
                e->b = enew(p, E_LIT);
                e->b->lit = v_int(t->i);
            }
            p->pos++;
            node = e;
        } else if (accept_op(p, "[")) {
            expr *parts[3] = {NULL, NULL, NULL};
            int nparts = 0, is_slice = 0;
            for (;;) {
                if (is_op(cur(p), ":")) {
                    is_slice = 1;
                    p->pos++;
                    nparts++;
                    if (nparts > 2) return perr(p, UM_ERR_FORMAT, "bad slice"), NULL;
                    continue;
                }
                if (is_op(cur(p), "]")) break;
                parts[nparts] = parse_expr(p);
                if (!parts[nparts]) return NULL;
                if (!is_op(cur(p), ":") && !is_op(cur(p), "]")) return perr(p, UM_ERR_FORMAT, "expected ']'"), NULL;
            }
            p->pos++;
            expr *e = enew(p, is_slice ? E_SLICE : E_ITEM);
            e->a = node;
            if (is_slice) e->b = parts[0], e->c = parts[1], e->d = parts[2];
            else {
                if (!parts[0]) return perr(p, UM_ERR_FORMAT, "empty subscript"), NULL;
                e->b = parts[0];
            }
            node = e;
        } else if (accept_op(p, "(")) {
            if (!(node = parse_call_of(p, node))) return NULL;
        } else {
            return node;
        }
    }
}

static expr *parse_primary(parser *p) {
    token *t = cur(p);
    expr *e;
    switch (t->t) {
    case T_NAME:
        e = enew(p, E_LIT);
        p->pos++;
        if (is_name(t, "true") || is_name(t, "True")) e->lit = v_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) e->lit = v_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) e->lit = v_none();
        else {
            e->kind = E_NAME;
            e->name = tok_name(p, t), e->name_n = t->n;
        }
        return e;
    case T_STR: {
        strbuf b = {0};
        while (cur(p)->t == T_STR) { /* adjacent literals concatenate */
            strbuf_put(&b, cur(p)->s, cur(p)->n);
            p->pos++;
        }
        e = enew(p, E_LIT);
        e->lit = v_str(ar_strndup(p->ar, strbuf_str(&b), b.n), b.n);
        strbuf_free(&b);
        return e;
    }
    case T_INT: e = enew(p, E_LIT); e->lit = v_int(t->i); p->pos++; return e;
    case T_FLOAT: e = enew(p, E_LIT); e->lit = v_float(t->f); p->pos++; return e;
    case T_OP:
        if (accept_op(p, "(")) {
            if (accept_op(p, ")")) return enew(p, E_TUPLE);
            expr *first = parse_expr(p);
            if (!first) return NULL;
            if (accept_op(p, ")")) return first;
            e = enew(p, E_TUPLE);
            eargs_push(p, e, first);
            while (accept_op(p, ",")) {
                if (is_op(cur(p), ")")) break;
                expr *x = parse_expr(p);
                if (!x) return NULL;
                eargs_push(p, e, x);
            }
            if (expect_op(p, ")") != 0) return NULL;
            return e;
        }
        if (accept_op(p, "[")) {
            e = enew(p, E_LIST);
            while (!accept_op(p, "]")) {
                expr *x = parse_expr(p);
                if (!x) return NULL;
                eargs_push(p, e, x);
                if (!is_op(cur(p), "]") && expect_op(p, ",") != 0) return NULL;
            }
            return e;
        }
        if (accept_op(p, "{")) {
            e = enew(p, E_DICT);
            while (!accept_op(p, "}")) {
                expr *k = parse_expr(p);
                if (!k || expect_op(p, ":") != 0) return NULL;
                expr *v = parse_expr(p);
                if (!v) return NULL;
                eargs_push(p, e, k);
                eargs_push(p, e, v);
                if (!is_op(cur(p), "}") && expect_op(p, ",") != 0) return NULL;
            }
            return e;
        }
        return perr(p, UM_ERR_FORMAT, "unexpected '%.*s' in expression", (int)t->n, t->s), NULL;
    case T_VAR_END:
    case T_BLOCK_END:
    case T_EOF: return perr(p, UM_ERR_FORMAT, "expression expected"), NULL;
    default: return perr(p, UM_ERR_FORMAT, "unexpected token in expression"), NULL;
    }
}

static expr *parse_unary(parser *p, int with_filter) {
    expr *node;
    if (p->depth > PARSE_MAX_DEPTH) return perr(p, UM_ERR_UNSUPPORTED, "expression nested too deeply"), NULL;
    if (accept_op(p, "-")) {
        node = enew(p, E_NEG);
        p->depth++;
        node->a = parse_unary(p, 0);
        p->depth--;
        if (!node->a) return NULL;
    } else if (accept_op(p, "+")) {
        node = enew(p, E_POS);
        p->depth++;
        node->a = parse_unary(p, 0);
        p->depth--;
        if (!node->a) return NULL;
    } else {
        node = parse_primary(p);
        if (!node) return NULL;
    }
    node = parse_postfix(p, node);
    if (node && with_filter) node = parse_filter_expr(p, node);
    return node;
}

static expr *mk_bin(parser *p, int op, expr *a, expr *b) {
    expr *e = enew(p, E_BIN);
    e->op = op, e->a = a, e->b = b;
    return e;
}

static expr *parse_pow(parser *p) {
    expr *l = parse_unary(p, 1);
    while (l && accept_op(p, "**")) {
        expr *r = parse_unary(p, 1);
        if (!r) return NULL;
        l = mk_bin(p, OP_POW, l, r);
    }
    return l;
}

static expr *parse_math2(parser *p) {
    expr *l = parse_pow(p);
    while (l) {
        int op;
        if (accept_op(p, "*")) op = OP_MUL;
        else if (accept_op(p, "//")) op = OP_FLOORDIV;
        else if (accept_op(p, "/")) op = OP_DIV;
        else if (accept_op(p, "%")) op = OP_MOD;
        else break;
        expr *r = parse_pow(p);
        if (!r) return NULL;
        l = mk_bin(p, op, l, r);
    }
    return l;
}

static expr *parse_concat(parser *p) {
    expr *l = parse_math2(p);
    while (l && accept_op(p, "~")) {
        expr *r = parse_math2(p);
        if (!r) return NULL;
        l = mk_bin(p, OP_CONCAT, l, r);
    }
    return l;
}

static expr *parse_math1(parser *p) {
    expr *l = parse_concat(p);
    while (l) {
        int op;
        if (accept_op(p, "+")) op = OP_ADD;
        else if (accept_op(p, "-")) op = OP_SUB;
        else break;
        expr *r = parse_concat(p);
        if (!r) return NULL;
        l = mk_bin(p, op, l, r);
    }
    return l;
}

static expr *parse_compare(parser *p) {
    expr *l = parse_math1(p);
    if (!l) return NULL;
    expr *e = NULL;
    for (;;) {
        int op;
        if (accept_op(p, "==")) op = CMP_EQ;
        else if (accept_op(p, "!=")) op = CMP_NE;
        else if (accept_op(p, "<=")) op = CMP_LE;
        else if (accept_op(p, ">=")) op = CMP_GE;
        else if (accept_op(p, "<")) op = CMP_LT;
        else if (accept_op(p, ">")) op = CMP_GT;
        else if (accept_name(p, "in")) op = CMP_IN;
        else if (is_name(cur(p), "not") && is_name(&p->t[p->pos + 1], "in")) {
            p->pos += 2;
            op = CMP_NOTIN;
        } else break;
        expr *r = parse_math1(p);
        if (!r) return NULL;
        if (!e) {
            e = enew(p, E_CMP);
            eargs_push(p, e, l);
        }
        int *ops = ar_alloc(p->ar, (size_t)e->nargs * sizeof *ops);
        if (e->nargs > 1) memcpy(ops, e->ops, (size_t)(e->nargs - 1) * sizeof *ops);
        ops[e->nargs - 1] = op;
        e->ops = ops;
        eargs_push(p, e, r);
    }
    return e ? e : l;
}

static expr *parse_not(parser *p) {
    if (accept_name(p, "not")) {
        if (++p->depth > PARSE_MAX_DEPTH) return perr(p, UM_ERR_UNSUPPORTED, "expression nested too deeply"), NULL;
        expr *e = enew(p, E_NOT);
        e->a = parse_not(p);
        p->depth--;
        return e->a ? e : NULL;
    }
    return parse_compare(p);
}

static expr *parse_and(parser *p) {
    expr *l = parse_not(p);
    while (l && accept_name(p, "and")) {
        expr *e = enew(p, E_AND);
        e->a = l;
        e->b = parse_not(p);
        if (!e->b) return NULL;
        l = e;
    }
    return l;
}

static expr *parse_or(parser *p) {
    expr *l = parse_and(p);
    while (l && accept_name(p, "or")) {
        expr *e = enew(p, E_OR);
        e->a = l;
        e->b = parse_and(p);
        if (!e->b) return NULL;
        l = e;
    }
    return l;
}

static expr *parse_expr_inner(parser *p);

static expr *parse_expr(parser *p) {
    if (++p->depth > PARSE_MAX_DEPTH) return perr(p, UM_ERR_UNSUPPORTED, "expression nested too deeply"), NULL;
    expr *e = parse_expr_inner(p);
    p->depth--;
    return e;
}

static expr *parse_expr_inner(parser *p) {
    expr *l = parse_or(p);
    while (l && accept_name(p, "if")) {
        expr *e = enew(p, E_COND);
        e->a = l;
        e->c = parse_or(p);
        if (!e->c) return NULL;
        if (accept_name(p, "else")) {
            e->b = parse_expr(p);
            if (!e->b) return NULL;
        }
        l = e;
    }
    return l;
}

/* ---------------------------------------------------------------- statements */

static stmt *snew(parser *p, enum stmt_kind k) {
    stmt *s = ar_zalloc(p->ar, sizeof *s);
    s->kind = k;
    s->line = cur(p)->line;
    return s;
}

static void block_push(parser *p, block *b, stmt *s) {
    stmt **n = ar_alloc(p->ar, (size_t)(b->n + 1) * sizeof *n);
    if (b->n) memcpy(n, b->s, (size_t)b->n * sizeof *n);
    n[b->n++] = s;
    b->s = n;
}

static int expect_block_end(parser *p) {
    if (cur(p)->t == T_BLOCK_END) {
        p->pos++;
        return 0;
    }
    return perr(p, UM_ERR_FORMAT, "expected '%%}'");
}

/* Parse statements until a block tag whose keyword is one of `ends` (not consumed: the position is
 * left on the keyword token, after the T_BLOCK_BEGIN). Returns the index of the end keyword. */
static int parse_body(parser *p, block *b, const char *const *ends);

static int parse_for(parser *p, stmt *s) {
    for (;;) {
        token *t = cur(p);
        if (t->t != T_NAME) return perr(p, UM_ERR_FORMAT, "expected a loop variable name");
        if (s->ntarget == 2) return perr(p, UM_ERR_UNSUPPORTED, "for loop with more than two targets");
        s->target[s->ntarget++] = tok_name(p, t);
        p->pos++;
        if (!accept_op(p, ",")) break;
    }
    if (!accept_name(p, "in")) return perr(p, UM_ERR_FORMAT, "expected 'in' in for loop");
    s->e = parse_or(p); /* no conditional expression here: "if" starts the loop filter */
    if (!s->e) return -1;
    if (accept_name(p, "if")) {
        s->filter = parse_or(p);
        if (!s->filter) return -1;
    }
    if (accept_name(p, "recursive")) return perr(p, UM_ERR_UNSUPPORTED, "recursive for loops");
    if (expect_block_end(p) != 0) return -1;
    static const char *const ends[] = {"endfor", "else", NULL};
    int which = parse_body(p, &s->body, ends);
    if (which < 0) return -1;
    p->pos++;
    if (expect_block_end(p) != 0) return -1;
    if (which == 1) {
        static const char *const ends2[] = {"endfor", NULL};
        if (parse_body(p, &s->orelse, ends2) < 0) return -1;
        p->pos++;
        if (expect_block_end(p) != 0) return -1;
    }
    return 0;
}

static int parse_if(parser *p, stmt *s) {
    s->e = parse_expr(p);
    if (!s->e || expect_block_end(p) != 0) return -1;
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    int which = parse_body(p, &s->body, ends);
    if (which < 0) return -1;
    p->pos++;
    if (which == 1) { /* elif: a nested if in the else branch */
        stmt *n = snew(p, S_IF);
        block_push(p, &s->orelse, n);
        return parse_if(p, n);
    }
    if (expect_block_end(p) != 0) return -1;
    if (which == 2) {
        static const char *const ends2[] = {"endif", NULL};
        if (parse_body(p, &s->orelse, ends2) < 0) return -1;
        p->pos++;
        if (expect_block_end(p) != 0) return -1;
    }
    return 0;
}

static int parse_set(parser *p, stmt *s) {
    token *t = cur(p);
    if (t->t != T_NAME) return perr(p, UM_ERR_FORMAT, "expected a name after 'set'");
    s->target[0] = tok_name(p, t);
    s->ntarget = 1;
    p->pos++;
    if (accept_op(p, ".")) {
        token *a = cur(p);
        if (a->t != T_NAME) return perr(p, UM_ERR_FORMAT, "expected an attribute name in set");
        s->attr = tok_name(p, a);
        p->pos++;
    }
    if (is_op(cur(p), ",")) return perr(p, UM_ERR_UNSUPPORTED, "tuple assignment in set");
    if (accept_op(p, "=")) {
        s->e = parse_expr(p);
        if (!s->e) return -1;
        return expect_block_end(p);
    }
    if (s->attr) return perr(p, UM_ERR_FORMAT, "expected '=' in set");
    if (cur(p)->t == T_OP && is_op(cur(p), "|")) return perr(p, UM_ERR_UNSUPPORTED, "filtered block set");
    if (expect_block_end(p) != 0) return -1;
    s->kind = S_SETBLOCK;
    static const char *const ends[] = {"endset", NULL};
    if (parse_body(p, &s->body, ends) < 0) return -1;
    p->pos++;
    return expect_block_end(p);
}

static int parse_body_inner(parser *p, block *b, const char *const *ends);

static int parse_body(parser *p, block *b, const char *const *ends) {
    if (++p->depth > PARSE_MAX_DEPTH) return perr(p, UM_ERR_UNSUPPORTED, "blocks nested too deeply");
    int rc = parse_body_inner(p, b, ends);
    p->depth--;
    return rc;
}

static int parse_body_inner(parser *p, block *b, const char *const *ends) {
    for (;;) {
        if (p->failed) return -1;
        token *t = cur(p);
        switch (t->t) {
        case T_EOF:
            if (ends) return perr(p, UM_ERR_FORMAT, "missing {%% %s %%}", ends[0]);
            return 0;
        case T_TEXT: {
            stmt *s = snew(p, S_TEXT);
            s->text = t->s, s->text_n = t->n;
            block_push(p, b, s);
            p->pos++;
            break;
        }
        case T_VAR_BEGIN: {
            p->pos++;
            stmt *s = snew(p, S_OUT);
            s->e = parse_expr(p);
            if (!s->e) return -1;
            if (cur(p)->t != T_VAR_END) return perr(p, UM_ERR_FORMAT, "expected '}}'");
            p->pos++;
            block_push(p, b, s);
            break;
        }
        case T_BLOCK_BEGIN: {
            p->pos++;
            token *kw = cur(p);
            if (kw->t != T_NAME) return perr(p, UM_ERR_FORMAT, "expected a statement keyword after '{%%'");
            for (int i = 0; ends && ends[i]; i++)
                if (is_name(kw, ends[i])) return i;
            stmt *s;
            if (is_name(kw, "if")) {
                p->pos++;
                s = snew(p, S_IF);
                if (parse_if(p, s) != 0) return -1;
            } else if (is_name(kw, "for")) {
                p->pos++;
                s = snew(p, S_FOR);
                if (parse_for(p, s) != 0) return -1;
            } else if (is_name(kw, "set")) {
                p->pos++;
                s = snew(p, S_SET);
                if (parse_set(p, s) != 0) return -1;
            } else if (is_name(kw, "break") || is_name(kw, "continue")) {
                p->pos++;
                s = snew(p, is_name(kw, "break") ? S_BREAK : S_CONTINUE);
                if (expect_block_end(p) != 0) return -1;
            } else if (is_name(kw, "generation") || is_name(kw, "endgeneration")) {
                p->pos++; /* transformers' assistant-mask marker: renders its body unchanged */
                if (expect_block_end(p) != 0) return -1;
                break;
            } else {
                static const char *const known[] = {"endif", "endfor", "elif", "else", "endset", NULL};
                if (table_find(known, kw->s, kw->n) >= 0)
                    return perr(p, UM_ERR_FORMAT, "unexpected {%% %.*s %%}", (int)kw->n, kw->s);
                return perr(p, UM_ERR_UNSUPPORTED, "unsupported statement {%% %.*s %%}", (int)kw->n, kw->s);
            }
            block_push(p, b, s);
            break;
        }
        default: return perr(p, UM_ERR_FORMAT, "unexpected token");
        }
    }
}

int jinja_compile(const char *src, size_t len, jinja_tmpl **out, um_err *err) {
    *out = NULL;
    jinja_tmpl *t = xcalloc(1, sizeof *t);
    /* newline normalization (\r\n, \r -> \n) and one trailing newline dropped, as Jinja's lexer */
    char *norm = ar_alloc(&t->ar, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    lexer lx = {&t->ar, norm, n, 0, 1, NULL, 0, 0, err};
    int rc = lex_all(&lx);
    if (rc == 0) {
        parser ps = {&t->ar, lx.toks, 0, err, 0, 0};
        rc = parse_body(&ps, &t->root, NULL);
        if (rc > 0) rc = 0;
    }
    free(lx.toks);
    if (rc != 0) {
        jinja_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    ar_free(&t->ar);
    free(t);
}

/* ================================================================ rendering */

typedef struct frame {
    const char **k;
    value *v;
    size_t n, cap;
} frame;

typedef struct rctx {
    arena *ar;
    frame *frames;
    int nframes, capframes;
    strbuf out;
    um_err *err;
    int failed;
    int brk, cont;
    long steps;
    int depth;
} rctx;

static value rerr(rctx *r, int line, enum um_err_code code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static value rerr(rctx *r, int line, enum um_err_code code, const char *fmt, ...) {
    if (!r->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        um_err_set(r->err, code, "chat template line %d: %s", line, msg);
        r->failed = 1;
    }
    return v_undef();
}

static void scope_push(rctx *r) {
    if (r->nframes == r->capframes) {
        r->capframes = r->capframes ? r->capframes * 2 : 8;
        r->frames = xrealloc(r->frames, (size_t)r->capframes * sizeof *r->frames);
    }
    memset(&r->frames[r->nframes++], 0, sizeof(frame));
}

static void scope_pop(rctx *r) { r->nframes--; }

static void scope_set(rctx *r, const char *k, value v) {
    frame *f = &r->frames[r->nframes - 1];
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->k[i], k) == 0) {
            f->v[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        const char **nk = ar_alloc(r->ar, cap * sizeof *nk);
        value *nv = ar_alloc(r->ar, cap * sizeof *nv);
        if (f->n) {
            memcpy(nk, f->k, f->n * sizeof *nk);
            memcpy(nv, f->v, f->n * sizeof *nv);
        }
        f->k = nk, f->v = nv, f->cap = cap;
    }
    f->k[f->n] = k, f->v[f->n] = v;
    f->n++;
}

static int scope_get(rctx *r, const char *k, size_t kn, value *out) {
    for (int i = r->nframes - 1; i >= 0; i--) {
        frame *f = &r->frames[i];
        for (size_t j = 0; j < f->n; j++)
            if (strlen(f->k[j]) == kn && memcmp(f->k[j], k, kn) == 0) {
                *out = f->v[j];
                return 1;
            }
    }
    return 0;
}

/* ---------------------------------------------------------------- conversions */

static int truthy(value v) {
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: return 0;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0.0;
    case V_STR: return v.u.s.n != 0;
    case V_LIST: return v.u.l->n != 0;
    case V_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static void fmt_float(strbuf *b, double f) {
    if (isnan(f)) {
        strbuf_puts(b, "nan");
        return;
    }
    if (isinf(f)) {
        strbuf_puts(b, f < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) { /* shortest round-trip, like Python's repr */
        snprintf(tmp, sizeof tmp, "%.*g", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* Python uses positional notation for 1e-4 <= |f| < 1e16 and writes integral values as "x.0" */
    double a = fabs(f);
    if (strchr(tmp, 'e') && a >= 1e-4 && a < 1e16) {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(tmp, sizeof tmp, "%.*f", prec, f);
            if (strtod(tmp, NULL) == f) break;
        }
    }
    strbuf_puts(b, tmp);
    if (!strchr(tmp, '.') && !strchr(tmp, 'e')) strbuf_puts(b, ".0");
}

static void repr_str(strbuf *b, const char *s, size_t n) {
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    strbuf_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') strbuf_puts(b, "\\\\");
        else if (c == (unsigned char)q) {
            strbuf_put(b, "\\", 1);
            strbuf_put(b, &q, 1);
        } else if (c == '\n') strbuf_puts(b, "\\n");
        else if (c == '\r') strbuf_puts(b, "\\r");
        else if (c == '\t') strbuf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f) strbuf_printf(b, "\\x%02x", c);
        else strbuf_put(b, (const char *)&c, 1);
    }
    strbuf_put(b, &q, 1);
}

static void to_str(strbuf *b, value v, int repr);

static void to_str(strbuf *b, value v, int repr) {
    switch (v.t) {
    case V_UNDEF: break;
    case V_NONE: strbuf_puts(b, "None"); break;
    case V_BOOL: strbuf_puts(b, v.u.b ? "True" : "False"); break;
    case V_INT: strbuf_printf(b, "%lld", (long long)v.u.i); break;
    case V_FLOAT: fmt_float(b, v.u.f); break;
    case V_STR:
        if (repr) repr_str(b, v.u.s.p, v.u.s.n);
        else strbuf_put(b, v.u.s.p, v.u.s.n);
        break;
    case V_LIST:
        strbuf_puts(b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) strbuf_puts(b, ", ");
            to_str(b, v.u.l->v[i], 1);
        }
        strbuf_puts(b, "]");
        break;
    case V_DICT:
        strbuf_puts(b, v.u.d->is_ns ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) strbuf_puts(b, ", ");
            repr_str(b, v.u.d->k[i], v.u.d->kn[i]);
            strbuf_puts(b, ": ");
            to_str(b, v.u.d->v[i], 1);
        }
        strbuf_puts(b, v.u.d->is_ns ? "}>" : "}");
        break;
    default: strbuf_puts(b, "<function>"); break;
    }
}

static value str_value(rctx *r, value v) {
    if (v.t == V_STR) return v;
    strbuf b = {0};
    to_str(&b, v, 0);
    value s = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
    strbuf_free(&b);
    return s;
}

/* Python json.dumps(ensure_ascii=False), default separators or indent. */
static int to_json(rctx *r, strbuf *b, value v, int indent, int depth, int line) {
    char pad[2 + 64];
    switch (v.t) {
    case V_UNDEF:
    case V_NONE: strbuf_puts(b, "null"); return 0;
    case V_BOOL: strbuf_puts(b, v.u.b ? "true" : "false"); return 0;
    case V_INT: strbuf_printf(b, "%lld", (long long)v.u.i); return 0;
    case V_FLOAT:
        if (isnan(v.u.f)) strbuf_puts(b, "NaN");
        else if (isinf(v.u.f)) strbuf_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else fmt_float(b, v.u.f);
        return 0;
    case V_STR:
        strbuf_put(b, "\"", 1);
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.p[i];
            if (c == '"') strbuf_puts(b, "\\\"");
            else if (c == '\\') strbuf_puts(b, "\\\\");
            else if (c == '\n') strbuf_puts(b, "\\n");
            else if (c == '\r') strbuf_puts(b, "\\r");
            else if (c == '\t') strbuf_puts(b, "\\t");
            else if (c == '\b') strbuf_puts(b, "\\b");
            else if (c == '\f') strbuf_puts(b, "\\f");
            else if (c < 0x20) strbuf_printf(b, "\\u%04x", c);
            else strbuf_put(b, (const char *)&c, 1);
        }
        strbuf_put(b, "\"", 1);
        return 0;
    case V_LIST:
    case V_DICT: {
        int is_list = v.t == V_LIST;
        size_t n = is_list ? v.u.l->n : v.u.d->n;
        strbuf_puts(b, is_list ? "[" : "{");
        if (depth > 100) return rerr(r, line, UM_ERR_INVALID_ARG, "tojson: nesting too deep"), -1;
        for (size_t i = 0; i < n; i++) {
            if (i) strbuf_puts(b, indent >= 0 ? "," : ", ");
            if (indent >= 0) {
                strbuf_puts(b, "\n");
                int w = indent * (depth + 1);
                for (int k = 0; k < w; k++) strbuf_put(b, " ", 1);
            }
            if (!is_list) {
                to_json(r, b, v_str(v.u.d->k[i], v.u.d->kn[i]), indent, depth + 1, line);
                strbuf_puts(b, ": ");
            }
            if (to_json(r, b, is_list ? v.u.l->v[i] : v.u.d->v[i], indent, depth + 1, line) != 0) return -1;
        }
        if (indent >= 0 && n) {
            snprintf(pad, sizeof pad, "\n");
            strbuf_puts(b, pad);
            int w = indent * depth;
            for (int k = 0; k < w; k++) strbuf_put(b, " ", 1);
        }
        strbuf_puts(b, is_list ? "]" : "}");
        return 0;
    }
    default: return rerr(r, line, UM_ERR_INVALID_ARG, "tojson: cannot serialize a %s", type_name(v.t)), -1;
    }
}

/* ---------------------------------------------------------------- comparisons */

static int is_num(value v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }
static double num_f(value v) { return v.t == V_FLOAT ? v.u.f : v.t == V_INT ? (double)v.u.i : (double)v.u.b; }

static int values_eq(value a, value b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != V_FLOAT && b.t != V_FLOAT)
            return (a.t == V_INT ? a.u.i : a.u.b) == (b.t == V_INT ? b.u.i : b.u.b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case V_UNDEF:
    case V_NONE: return 1;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!values_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            value *o = dict_find(b.u.d, a.u.d->k[i], a.u.d->kn[i]);
            if (!o || !values_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case V_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

/* -1 / 0 / 1, or 2 when not orderable */
static int values_cmp(value a, value b) {
    if (is_num(a) && is_num(b)) {
        double x = num_f(a), y = num_f(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == V_STR && b.t == V_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n);
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    return 2;
}

static int contains(rctx *r, value hay, value needle, int line, int *out) {
    switch (hay.t) {
    case V_STR:
        if (needle.t != V_STR)
            return rerr(r, line, UM_ERR_INVALID_ARG, "'in <string>' requires a string, not %s", type_name(needle.t)), -1;
        *out = needle.u.s.n == 0 || memmem(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
        return 0;
    case V_LIST:
        *out = 0;
        for (size_t i = 0; i < hay.u.l->n; i++)
            if (values_eq(hay.u.l->v[i], needle)) *out = 1;
        return 0;
    case V_DICT: *out = needle.t == V_STR && dict_find(hay.u.d, needle.u.s.p, needle.u.s.n) != NULL; return 0;
    case V_UNDEF: *out = 0; return 0;
    default: return rerr(r, line, UM_ERR_INVALID_ARG, "argument of type %s is not iterable", type_name(hay.t)), -1;
    }
}

/* ---------------------------------------------------------------- strings */

static size_t utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* byte offset of code point index ci (clamped) */
static size_t utf8_offset(const char *s, size_t n, size_t ci) {
    size_t i = 0;
    while (i < n && ci) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        ci--;
    }
    return i;
}

static int py_space(uint32_t cp) { return unicode_is_space(cp) || (cp >= 0x1C && cp <= 0x1F); }

static value str_strip(rctx *r, value s, value chars, int left, int right) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    int use_chars = chars.t == V_STR;
    while (a < b) {
        size_t adv;
        int32_t cp = utf8_decode((const uint8_t *)p + a, b - a, &adv);
        int strip = use_chars ? memmem(chars.u.s.p, chars.u.s.n, p + a, adv) != NULL : (cp >= 0 && py_space((uint32_t)cp));
        if (!left || !strip) break;
        a += adv;
    }
    while (b > a && right) {
        size_t q = b - 1;
        while (q > a && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
        size_t adv;
        int32_t cp = utf8_decode((const uint8_t *)p + q, b - q, &adv);
        int strip = use_chars ? memmem(chars.u.s.p, chars.u.s.n, p + q, b - q) != NULL : (cp >= 0 && py_space((uint32_t)cp));
        if (!strip) break;
        b = q;
    }
    (void)r;
    return v_str(p + a, b - a);
}

static value str_map_case(rctx *r, value s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    char *o = ar_alloc(r->ar, s.u.s.n + 1);
    int prev_alpha = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up = mode == 1 || (mode == 2 && !prev_alpha) || (mode == 3 && i == 0);
        if (mode == 3 && i > 0) up = 0;
        if (up && c >= 'a' && c <= 'z') c = (char)(c - 32);
        else if (!up && c >= 'A' && c <= 'Z') c = (char)(c + 32);
        o[i] = c;
        prev_alpha = alpha || ((unsigned char)c >= 0x80);
    }
    o[s.u.s.n] = 0;
    return v_str(o, s.u.s.n);
}

static value str_replace(rctx *r, value s, value old, value new, int64_t count) {
    if (old.u.s.n == 0) return s;
    strbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    while (i < s.u.s.n) {
        const char *hit = (count < 0 || done < count) ? memmem(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n) : NULL;
        if (!hit) break;
        strbuf_put(&b, s.u.s.p + i, (size_t)(hit - (s.u.s.p + i)));
        strbuf_put(&b, new.u.s.p, new.u.s.n);
        i = (size_t)(hit - s.u.s.p) + old.u.s.n;
        done++;
    }
    strbuf_put(&b, s.u.s.p + i, s.u.s.n - i);
    value v = v_str(ar_strndup(r->ar, b.p, b.n), b.n);
    strbuf_free(&b);
    return v;
}

static value str_split(rctx *r, value s, value sep, int64_t maxsplit) {
    vlist *l = list_new(r->ar);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    if (sep.t != V_STR) { /* whitespace runs, leading/trailing ignored */
        for (;;) {
            while (i < n && is_ws(p[i])) i++;
            if (i >= n) break;
            size_t j = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) j = n;
            else
                while (j < n && !is_ws(p[j])) j++;
            size_t e = j;
            while (j == n && e > i && is_ws(p[e - 1])) e--;
            list_push(r->ar, l, v_str(p + i, e - i));
            i = j;
        }
        return v_list(l);
    }
    if (sep.u.s.n == 0) return rerr(r, 0, UM_ERR_INVALID_ARG, "split: empty separator");
    for (;;) {
        const char *hit = (maxsplit < 0 || (int64_t)l->n < maxsplit) ? memmem(p + i, n - i, sep.u.s.p, sep.u.s.n) : NULL;
        if (!hit) {
            list_push(r->ar, l, v_str(p + i, n - i));
            break;
        }
        list_push(r->ar, l, v_str(p + i, (size_t)(hit - (p + i))));
        i = (size_t)(hit - p) + sep.u.s.n;
    }
    return v_list(l);
}

/* ---------------------------------------------------------------- evaluation */

static value eval(rctx *r, const expr *e);

typedef struct argv_t {
    value pos[8];
    int npos;
    const char *kwn[8];
    value kwv[8];
    int nkw;
} argv_t;

static int eval_args(rctx *r, const expr *e, argv_t *a) {
    memset(a, 0, sizeof *a);
    if (e->nargs > 8 || e->nkw > 8) return rerr(r, e->line, UM_ERR_UNSUPPORTED, "too many arguments"), -1;
    for (int i = 0; i < e->nargs; i++) a->pos[a->npos++] = eval(r, e->args[i]);
    for (int i = 0; i < e->nkw; i++) {
        a->kwn[a->nkw] = e->kwn[i];
        a->kwv[a->nkw++] = eval(r, e->kwv[i]);
    }
    return r->failed ? -1 : 0;
}

/* positional i, else keyword name, else undefined */
static value arg(const argv_t *a, int i, const char *kw) {
    if (i >= 0 && i < a->npos) return a->pos[i];
    for (int k = 0; k < a->nkw; k++)
        if (kw && strcmp(a->kwn[k], kw) == 0) return a->kwv[k];
    return v_undef();
}

static value get_attr(rctx *r, value obj, const char *name, size_t n, int line);
static value get_item(rctx *r, value obj, value key, int line);
static int run_test(rctx *r, int tid, value v, const argv_t *a, int line);
static value apply_filter(rctx *r, int fid, const char *fname, value v, const argv_t *a, int line);

static value iterable_list(rctx *r, value v, int line) {
    if (v.t == V_LIST) return v;
    vlist *l = list_new(r->ar);
    if (v.t == V_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) list_push(r->ar, l, v_str(v.u.d->k[i], v.u.d->kn[i]));
    } else if (v.t == V_STR) {
        size_t i = 0;
        while (i < v.u.s.n) {
            size_t adv;
            utf8_decode((const uint8_t *)v.u.s.p + i, v.u.s.n - i, &adv);
            list_push(r->ar, l, v_str(v.u.s.p + i, adv));
            i += adv;
        }
    } else if (v.t != V_UNDEF) {
        return rerr(r, line, UM_ERR_INVALID_ARG, "'%s' object is not iterable", type_name(v.t));
    }
    return v_list(l);
}

static value call_method(rctx *r, const value *obj, const char *m, const argv_t *a, int line) {
    value o = *obj;
    if (o.t == V_STR) {
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
            return str_strip(r, o, arg(a, 0, "chars"), m[0] != 'r', m[0] != 'l');
        if (!strcmp(m, "upper")) return str_map_case(r, o, 1);
        if (!strcmp(m, "lower")) return str_map_case(r, o, 0);
        if (!strcmp(m, "title")) return str_map_case(r, o, 2);
        if (!strcmp(m, "capitalize")) return str_map_case(r, o, 3);
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            value x = arg(a, 0, NULL);
            vlist one = {&x, 1, 1};
            vlist *opts = x.t == V_LIST ? x.u.l : &one;
            for (size_t i = 0; i < opts->n; i++) {
                value s = opts->v[i];
                if (s.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "%s() needs a string", m);
                if (s.u.s.n > o.u.s.n) continue;
                const char *at = m[0] == 's' ? o.u.s.p : o.u.s.p + o.u.s.n - s.u.s.n;
                if (memcmp(at, s.u.s.p, s.u.s.n) == 0) return v_bool(1);
            }
            return v_bool(0);
        }
        if (!strcmp(m, "replace")) {
            value x = arg(a, 0, NULL), y = arg(a, 1, NULL), c = arg(a, 2, NULL);
            if (x.t != V_STR || y.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "replace() needs strings");
            return str_replace(r, o, x, y, c.t == V_INT ? c.u.i : -1);
        }
        if (!strcmp(m, "split")) {
            value sep = arg(a, 0, "sep"), ms = arg(a, 1, "maxsplit");
            return str_split(r, o, sep, ms.t == V_INT ? ms.u.i : -1);
        }
        if (!strcmp(m, "find")) {
            value x = arg(a, 0, NULL);
            if (x.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "find() needs a string");
            const char *hit = memmem(o.u.s.p, o.u.s.n, x.u.s.p, x.u.s.n);
            return v_int(hit ? (int64_t)utf8_count(o.u.s.p, (size_t)(hit - o.u.s.p)) : -1);
        }
        if (!strcmp(m, "join")) {
            value l = iterable_list(r, arg(a, 0, NULL), line);
            strbuf b = {0};
            for (size_t i = 0; l.t == V_LIST && i < l.u.l->n; i++) {
                if (i) strbuf_put(&b, o.u.s.p, o.u.s.n);
                to_str(&b, l.u.l->v[i], 0);
            }
            value v = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
            strbuf_free(&b);
            return v;
        }
    } else if (o.t == V_DICT) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            vlist *l = list_new(r->ar);
            for (size_t i = 0; i < o.u.d->n; i++) {
                value k = v_str(o.u.d->k[i], o.u.d->kn[i]);
                if (m[0] == 'k') list_push(r->ar, l, k);
                else if (m[0] == 'v') list_push(r->ar, l, o.u.d->v[i]);
                else {
                    vlist *pair = list_new(r->ar);
                    list_push(r->ar, pair, k);
                    list_push(r->ar, pair, o.u.d->v[i]);
                    list_push(r->ar, l, v_list(pair));
                }
            }
            return v_list(l);
        }
        if (!strcmp(m, "get")) {
            value k = arg(a, 0, NULL);
            value *v = k.t == V_STR ? dict_find(o.u.d, k.u.s.p, k.u.s.n) : NULL;
            if (v) return *v;
            value d = arg(a, 1, "default");
            return d.t == V_UNDEF ? v_none() : d;
        }
    }
    return rerr(r, line, UM_ERR_UNSUPPORTED, "unsupported method '%s' of %s", m, type_name(o.t));
}

static value call_func(rctx *r, int fn, const argv_t *a, int line) {
    switch (fn) {
    case FN_RAISE: {
        value m = str_value(r, arg(a, 0, NULL));
        return rerr(r, line, UM_ERR_INVALID_ARG, "%.*s", (int)m.u.s.n, m.u.s.p);
    }
    case FN_RANGE: {
        int64_t start = 0, stop, step = 1;
        for (int i = 0; i < a->npos; i++)
            if (a->pos[i].t != V_INT) return rerr(r, line, UM_ERR_INVALID_ARG, "range() needs integers");
        if (a->npos == 1) stop = a->pos[0].u.i;
        else if (a->npos >= 2) start = a->pos[0].u.i, stop = a->pos[1].u.i, step = a->npos > 2 ? a->pos[2].u.i : 1;
        else return rerr(r, line, UM_ERR_INVALID_ARG, "range() needs arguments");
        if (step == 0) return rerr(r, line, UM_ERR_INVALID_ARG, "range() step must not be zero");
        vlist *l = list_new(r->ar);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (l->n > 100000) return rerr(r, line, UM_ERR_RESOURCE, "range() too long");
            list_push(r->ar, l, v_int(i));
        }
        return v_list(l);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        vdict *d = dict_new(r->ar);
        d->is_ns = fn == FN_NAMESPACE;
        if (a->npos == 1 && a->pos[0].t == V_DICT)
            for (size_t i = 0; i < a->pos[0].u.d->n; i++)
                dict_set(r->ar, d, a->pos[0].u.d->k[i], a->pos[0].u.d->kn[i], a->pos[0].u.d->v[i]);
        for (int i = 0; i < a->nkw; i++) dict_set(r->ar, d, a->kwn[i], strlen(a->kwn[i]), a->kwv[i]);
        return v_dict(d);
    }
    case FN_STRFTIME: {
        value f = arg(a, 0, NULL);
        if (f.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "strftime_now() needs a format string");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char fmtz[128], outs[256];
        snprintf(fmtz, sizeof fmtz, "%.*s", (int)f.u.s.n, f.u.s.p);
        size_t n = strftime(outs, sizeof outs, fmtz, &tmv);
        return v_str(ar_strndup(r->ar, outs, n), n);
    }
    }
    return v_undef();
}

static value get_attr(rctx *r, value obj, const char *name, size_t n, int line) {
    if (obj.t == V_UNDEF) return rerr(r, line, UM_ERR_INVALID_ARG, "undefined value has no attribute '%.*s'", (int)n, name);
    if (obj.t == V_DICT) {
        static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
        if (!obj.u.d->is_ns && table_find(dict_methods, name, n) >= 0) {
            value *self = ar_alloc(r->ar, sizeof *self);
            *self = obj;
            value m = {.t = V_METHOD, .u.s = {name, n}, .obj = self};
            return m;
        }
        value *v = dict_find(obj.u.d, name, n);
        return v ? *v : v_undef();
    }
    if (obj.t == V_STR) {
        static const char *const str_methods[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                                                  "startswith", "endswith", "replace", "split", "find", "join", NULL};
        if (table_find(str_methods, name, n) >= 0) {
            value *self = ar_alloc(r->ar, sizeof *self);
            *self = obj;
            value m = {.t = V_METHOD, .u.s = {ar_strndup(r->ar, name, n), n}, .obj = self};
            return m;
        }
    }
    return v_undef();
}

static value get_item(rctx *r, value obj, value key, int line) {
    if (obj.t == V_UNDEF) return rerr(r, line, UM_ERR_INVALID_ARG, "undefined value is not subscriptable");
    if (obj.t == V_DICT) {
        if (key.t != V_STR) return v_undef();
        value *v = dict_find(obj.u.d, key.u.s.p, key.u.s.n);
        if (v) return *v;
        return v_undef();
    }
    if (obj.t == V_LIST || obj.t == V_STR) {
        if (key.t == V_STR && obj.t == V_STR) return get_attr(r, obj, key.u.s.p, key.u.s.n, line);
        if (key.t != V_INT && key.t != V_BOOL) return v_undef();
        int64_t i = key.t == V_INT ? key.u.i : key.u.b;
        int64_t n = obj.t == V_LIST ? (int64_t)obj.u.l->n : (int64_t)utf8_count(obj.u.s.p, obj.u.s.n);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return v_undef();
        if (obj.t == V_LIST) return obj.u.l->v[i];
        size_t a = utf8_offset(obj.u.s.p, obj.u.s.n, (size_t)i), b = utf8_offset(obj.u.s.p, obj.u.s.n, (size_t)i + 1);
        return v_str(obj.u.s.p + a, b - a);
    }
    return v_undef();
}

static value eval_slice(rctx *r, const expr *e) {
    value o = eval(r, e->a);
    value vs[3] = {e->b ? eval(r, e->b) : v_none(), e->c ? eval(r, e->c) : v_none(), e->d ? eval(r, e->d) : v_none()};
    if (r->failed) return v_undef();
    if (o.t != V_LIST && o.t != V_STR) return rerr(r, e->line, UM_ERR_INVALID_ARG, "cannot slice a %s", type_name(o.t));
    for (int k = 0; k < 3; k++)
        if (vs[k].t != V_NONE && vs[k].t != V_INT)
            return rerr(r, e->line, UM_ERR_INVALID_ARG, "slice indices must be integers");
    int64_t n = o.t == V_LIST ? (int64_t)o.u.l->n : (int64_t)utf8_count(o.u.s.p, o.u.s.n);
    int64_t step = vs[2].t == V_INT ? vs[2].u.i : 1;
    if (step == 0) return rerr(r, e->line, UM_ERR_INVALID_ARG, "slice step cannot be zero");
    int64_t start, stop;
    if (step > 0) {
        start = vs[0].t == V_INT ? vs[0].u.i : 0;
        stop = vs[1].t == V_INT ? vs[1].u.i : n;
        if (start < 0) start += n;
        if (stop < 0) stop += n;
        if (start < 0) start = 0;
        if (stop > n) stop = n;
    } else {
        start = vs[0].t == V_INT ? vs[0].u.i : n - 1;
        stop = vs[1].t == V_INT ? vs[1].u.i : -n - 1;
        if (start < 0) start += n;
        if (stop < 0) stop += n;
        if (start >= n) start = n - 1;
        if (stop < -1) stop = -1;
    }
    vlist *l = list_new(r->ar);
    strbuf b = {0};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (o.t == V_LIST) list_push(r->ar, l, o.u.l->v[i]);
        else {
            size_t a0 = utf8_offset(o.u.s.p, o.u.s.n, (size_t)i), a1 = utf8_offset(o.u.s.p, o.u.s.n, (size_t)i + 1);
            strbuf_put(&b, o.u.s.p + a0, a1 - a0);
        }
    }
    if (o.t == V_LIST) return v_list(l);
    value s = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
    strbuf_free(&b);
    return s;
}

static value binop(rctx *r, int op, value a, value b, int line) {
    if (op == OP_CONCAT) {
        strbuf s = {0};
        to_str(&s, a, 0);
        to_str(&s, b, 0);
        value v = v_str(ar_strndup(r->ar, strbuf_str(&s), s.n), s.n);
        strbuf_free(&s);
        return v;
    }
    if (a.t == V_UNDEF || b.t == V_UNDEF)
        return rerr(r, line, UM_ERR_INVALID_ARG, "arithmetic on an undefined value");
    if (op == OP_ADD && a.t == V_STR && b.t == V_STR) {
        char *p = ar_alloc(r->ar, a.u.s.n + b.u.s.n + 1);
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        p[a.u.s.n + b.u.s.n] = 0;
        return v_str(p, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == V_LIST && b.t == V_LIST) {
        vlist *l = list_new(r->ar);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(r->ar, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(r->ar, l, b.u.l->v[i]);
        return v_list(l);
    }
    if (op == OP_MUL && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
        value s = a.t == V_STR ? a : b;
        int64_t k = a.t == V_INT ? a.u.i : b.u.i;
        if (k < 0) k = 0;
        if ((uint64_t)k * s.u.s.n > RENDER_MAX_OUTPUT) return rerr(r, line, UM_ERR_RESOURCE, "string repetition too large");
        char *p = ar_alloc(r->ar, (size_t)k * s.u.s.n + 1);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        p[(size_t)k * s.u.s.n] = 0;
        return v_str(p, (size_t)k * s.u.s.n);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *ops[] = {"+", "-", "*", "/", "//", "%", "**"};
        return rerr(r, line, UM_ERR_INVALID_ARG, "unsupported operand types for %s: %s and %s", ops[op], type_name(a.t),
                    type_name(b.t));
    }
    int ints = a.t != V_FLOAT && b.t != V_FLOAT;
    int64_t x = a.t == V_INT ? a.u.i : a.t == V_BOOL ? a.u.b : 0, y = b.t == V_INT ? b.u.i : b.t == V_BOOL ? b.u.b : 0;
    double fx = num_f(a), fy = num_f(b);
    switch (op) {
    case OP_ADD: return ints ? v_int(x + y) : v_float(fx + fy);
    case OP_SUB: return ints ? v_int(x - y) : v_float(fx - fy);
    case OP_MUL: return ints ? v_int(x * y) : v_float(fx * fy);
    case OP_DIV:
        if (fy == 0) return rerr(r, line, UM_ERR_INVALID_ARG, "division by zero");
        return v_float(fx / fy);
    case OP_FLOORDIV:
    case OP_MOD:
        if (fy == 0) return rerr(r, line, UM_ERR_INVALID_ARG, "division by zero");
        if (ints) {
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
            return v_int(op == OP_FLOORDIV ? q : m);
        } else {
            double q = floor(fx / fy), m = fx - q * fy;
            return v_float(op == OP_FLOORDIV ? q : m);
        }
    case OP_POW:
        if (ints && y >= 0) {
            int64_t p = 1;
            for (int64_t i = 0; i < y && i < 64; i++) p *= x;
            return v_int(p);
        }
        return v_float(pow(fx, fy));
    }
    return v_undef();
}

/* f(args): a function, a method, or the error for what cannot be called. */
static value eval_call(rctx *r, const expr *e) {
    value f = eval(r, e->a);
    argv_t a;
    if (r->failed || eval_args(r, e, &a) != 0) return v_undef();
    if (f.t == V_FUNC) return call_func(r, f.u.fn, &a, e->line);
    if (f.t == V_METHOD) return call_method(r, f.obj, f.u.s.p, &a, e->line);
    if (f.t == V_UNDEF && e->a->kind == E_ATTR)
        return rerr(r, e->line, UM_ERR_UNSUPPORTED, "unsupported method '%s' (or undefined attribute called)", e->a->name);
    if (f.t == V_UNDEF && e->a->kind == E_NAME)
        return rerr(r, e->line, UM_ERR_UNSUPPORTED, "unknown function '%s'", e->a->name);
    return rerr(r, e->line, UM_ERR_INVALID_ARG, "%s is not callable", type_name(f.t));
}

/* x | filter(args) and x is [not] test(args). */
static value eval_filter_or_test(rctx *r, const expr *e) {
    value x = eval(r, e->a);
    argv_t a;
    if (r->failed || eval_args(r, e, &a) != 0) return v_undef();
    if (e->kind == E_FILTER) return apply_filter(r, e->fid, e->name, x, &a, e->line);
    int t = run_test(r, e->fid, x, &a, e->line);
    return v_bool(e->negate ? !t : t);
}

/* -x and +x (numbers and booleans). */
static value eval_unary(rctx *r, const expr *e) {
    value x = eval(r, e->a);
    if (r->failed) return v_undef();
    if (x.t == V_INT) return v_int(e->kind == E_NEG ? -x.u.i : x.u.i);
    if (x.t == V_FLOAT) return v_float(e->kind == E_NEG ? -x.u.f : x.u.f);
    if (x.t == V_BOOL) return v_int(e->kind == E_NEG ? -x.u.b : x.u.b);
    return rerr(r, e->line, UM_ERR_INVALID_ARG, "bad operand type for unary %c: %s", e->kind == E_NEG ? '-' : '+',
                type_name(x.t));
}

/* A comparison chain a < b == c ... (each link evaluated once, stops at the first false one). */
static value eval_cmp(rctx *r, const expr *e) {
    value x = eval(r, e->args[0]);
    int res = 1;
    for (int i = 1; i < e->nargs && res && !r->failed; i++) {
        value y = eval(r, e->args[i]);
        if (r->failed) break;
        int op = e->ops[i - 1], c, in;
        switch (op) {
        case CMP_EQ: res = values_eq(x, y); break;
        case CMP_NE: res = !values_eq(x, y); break;
        case CMP_IN:
        case CMP_NOTIN:
            if (contains(r, y, x, e->line, &in) != 0) break;
            res = op == CMP_IN ? in : !in;
            break;
        default:
            c = values_cmp(x, y);
            if (c == 2) {
                rerr(r, e->line, UM_ERR_INVALID_ARG, "cannot compare %s and %s", type_name(x.t), type_name(y.t));
                break;
            }
            res = op == CMP_LT ? c < 0 : op == CMP_LE ? c <= 0 : op == CMP_GT ? c > 0 : c >= 0;
        }
        x = y;
    }
    return v_bool(res);
}

/* A list / tuple literal or a dict literal (string keys only). */
static value eval_collection(rctx *r, const expr *e) {
    if (e->kind != E_DICT) {
        vlist *l = list_new(r->ar);
        for (int i = 0; i < e->nargs; i++) list_push(r->ar, l, eval(r, e->args[i]));
        return v_list(l);
    }
    vdict *d = dict_new(r->ar);
    for (int i = 0; i + 1 < e->nargs; i += 2) {
        value k = eval(r, e->args[i]);
        if (k.t != V_STR) {
            rerr(r, e->line, UM_ERR_UNSUPPORTED, "dict literal keys must be strings");
            break;
        }
        dict_set(r->ar, d, k.u.s.p, k.u.s.n, eval(r, e->args[i + 1]));
    }
    return v_dict(d);
}

static value eval(rctx *r, const expr *e) {
    if (r->failed) return v_undef();
    if (++r->depth > EVAL_MAX_DEPTH) {
        r->depth--;
        return rerr(r, e->line, UM_ERR_RESOURCE, "expression nested too deeply");
    }
    value v = v_undef();
    switch (e->kind) {
    case E_LIT: v = e->lit; break;
    case E_NAME:
        if (!scope_get(r, e->name, e->name_n, &v)) v = v_undef();
        break;
    case E_ATTR: v = get_attr(r, eval(r, e->a), e->name, e->name_n, e->line); break;
    case E_ITEM: {
        value o = eval(r, e->a), k = eval(r, e->b);
        if (!r->failed) v = get_item(r, o, k, e->line);
        break;
    }
    case E_SLICE: v = eval_slice(r, e); break;
    case E_CALL: v = eval_call(r, e); break;
    case E_FILTER:
    case E_TEST: v = eval_filter_or_test(r, e); break;
    case E_NEG:
    case E_POS: v = eval_unary(r, e); break;
    case E_NOT: v = v_bool(!truthy(eval(r, e->a))); break;
    case E_AND: {
        value x = eval(r, e->a);
        v = truthy(x) ? eval(r, e->b) : x;
        break;
    }
    case E_OR: {
        value x = eval(r, e->a);
        v = truthy(x) ? x : eval(r, e->b);
        break;
    }
    case E_BIN: {
        value x = eval(r, e->a), y = eval(r, e->b);
        if (!r->failed) v = binop(r, e->op, x, y, e->line);
        break;
    }
    case E_CMP: v = eval_cmp(r, e); break;
    case E_COND: v = truthy(eval(r, e->c)) ? eval(r, e->a) : (e->b ? eval(r, e->b) : v_undef()); break;
    case E_LIST:
    case E_TUPLE:
    case E_DICT: v = eval_collection(r, e); break;
    }
    r->depth--;
    return r->failed ? v_undef() : v;
}

/* ---------------------------------------------------------------- tests and filters */

static int run_test(rctx *r, int tid, value v, const argv_t *a, int line) {
    const char *t = TESTS[tid];
    value x = arg(a, 0, NULL);
    if (!strcmp(t, "defined")) return v.t != V_UNDEF;
    if (!strcmp(t, "undefined")) return v.t == V_UNDEF;
    if (!strcmp(t, "none")) return v.t == V_NONE;
    if (!strcmp(t, "boolean")) return v.t == V_BOOL;
    if (!strcmp(t, "true")) return v.t == V_BOOL && v.u.b;
    if (!strcmp(t, "false")) return v.t == V_BOOL && !v.u.b;
    if (!strcmp(t, "string")) return v.t == V_STR;
    if (!strcmp(t, "number")) return v.t == V_INT || v.t == V_FLOAT;
    if (!strcmp(t, "integer")) return v.t == V_INT;
    if (!strcmp(t, "float")) return v.t == V_FLOAT;
    if (!strcmp(t, "mapping")) return v.t == V_DICT;
    if (!strcmp(t, "iterable")) return v.t == V_LIST || v.t == V_DICT || v.t == V_STR;
    if (!strcmp(t, "sequence")) return v.t == V_LIST || v.t == V_DICT || v.t == V_STR;
    if (!strcmp(t, "callable")) return v.t == V_FUNC || v.t == V_METHOD;
    if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v.t != V_INT) return rerr(r, line, UM_ERR_INVALID_ARG, "test '%s' needs an integer", t), 0;
        if (t[0] == 'o') return (v.u.i % 2) != 0;
        if (t[0] == 'e') return (v.u.i % 2) == 0;
        if (x.t != V_INT || x.u.i == 0) return rerr(r, line, UM_ERR_INVALID_ARG, "divisibleby needs a non-zero integer"), 0;
        return v.u.i % x.u.i == 0;
    }
    if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==") || !strcmp(t, "sameas")) return values_eq(v, x);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !values_eq(v, x);
    if (!strcmp(t, "in")) {
        int in = 0;
        contains(r, x, v, line, &in);
        return in;
    }
    if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != V_STR) return 0;
        for (size_t i = 0; i < v.u.s.n; i++) {
            char c = v.u.s.p[i];
            if (t[0] == 'l' && c >= 'A' && c <= 'Z') return 0;
            if (t[0] == 'u' && c >= 'a' && c <= 'z') return 0;
        }
        return 1;
    }
    int c = values_cmp(v, x);
    if (c == 2) return rerr(r, line, UM_ERR_INVALID_ARG, "cannot compare %s and %s", type_name(v.t), type_name(x.t)), 0;
    if (!strcmp(t, "lt") || !strcmp(t, "<")) return c < 0;
    if (!strcmp(t, "gt") || !strcmp(t, ">")) return c > 0;
    if (!strcmp(t, "le") || !strcmp(t, "<=")) return c <= 0;
    return c >= 0; /* ge, >= */
}

static int test_by_name(rctx *r, value name, value v, value targ, int line) {
    if (name.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "test name must be a string"), 0;
    int tid = table_find(TESTS, name.u.s.p, name.u.s.n);
    if (tid < 0) return rerr(r, line, UM_ERR_UNSUPPORTED, "unsupported test '%.*s'", (int)name.u.s.n, name.u.s.p), 0;
    argv_t a = {0};
    if (targ.t != V_UNDEF) a.pos[a.npos++] = targ;
    return run_test(r, tid, v, &a, line);
}

/* int filter: numbers and booleans truncated, strings parsed (else the default= argument or 0). */
static value filter_int(value v, const argv_t *a) {
    if (v.t == V_INT) return v;
    if (v.t == V_FLOAT) return v_int((int64_t)v.u.f);
    if (v.t == V_BOOL) return v_int(v.u.b);
    if (v.t == V_STR) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.p);
        char *end;
        long long x = strtoll(tmp, &end, 10);
        return *end == 0 && end != tmp ? v_int(x) : arg(a, 0, "default").t == V_INT ? arg(a, 0, "default") : v_int(0);
    }
    return v_int(0);
}

/* float filter: numbers converted, strings parsed (else 0.0). */
static value filter_float(value v) {
    if (is_num(v)) return v_float(num_f(v));
    if (v.t == V_STR) {
        char tmp[64];
        snprintf(tmp, sizeof tmp, "%.*s", (int)(v.u.s.n < 63 ? v.u.s.n : 63), v.u.s.p);
        char *end;
        double x = strtod(tmp, &end);
        return *end == 0 && end != tmp ? v_float(x) : v_float(0);
    }
    return v_float(0);
}

/* tojson filter (indent= as the first argument). */
static value filter_tojson(rctx *r, value v, const argv_t *a, int line) {
    value ind = arg(a, 0, "indent");
    strbuf b = {0};
    if (to_json(r, &b, v, ind.t == V_INT ? (int)ind.u.i : -1, 0, line) != 0) {
        strbuf_free(&b);
        return v_undef();
    }
    value s = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
    strbuf_free(&b);
    return s;
}

/* The filters on single values (not sequences): 1 with *out set when f is one of them, else 0. */
static int filter_scalar(rctx *r, const char *f, value v, const argv_t *a, int line, value *out) {
    if (!strcmp(f, "safe")) {
        *out = v;
    } else if (!strcmp(f, "trim")) {
        *out = v.t == V_UNDEF ? v_str("", 0) : str_strip(r, str_value(r, v), arg(a, 0, "chars"), 1, 1);
    } else if (!strcmp(f, "length") || !strcmp(f, "count")) {
        switch (v.t) {
        case V_UNDEF: *out = v_int(0); break;
        case V_STR: *out = v_int((int64_t)utf8_count(v.u.s.p, v.u.s.n)); break;
        case V_LIST: *out = v_int((int64_t)v.u.l->n); break;
        case V_DICT: *out = v_int((int64_t)v.u.d->n); break;
        default: *out = rerr(r, line, UM_ERR_INVALID_ARG, "object of type %s has no length", type_name(v.t));
        }
    } else if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        *out = str_map_case(r, str_value(r, v), f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
    } else if (!strcmp(f, "default") || !strcmp(f, "d")) {
        int boolean = truthy(arg(a, 1, "boolean"));
        *out = v;
        if (v.t == V_UNDEF || (boolean && !truthy(v))) {
            value d = arg(a, 0, "default_value");
            *out = d.t == V_UNDEF && a->npos == 0 ? v_str("", 0) : d;
        }
    } else if (!strcmp(f, "tojson")) {
        *out = filter_tojson(r, v, a, line);
    } else if (!strcmp(f, "string")) {
        *out = str_value(r, v);
    } else if (!strcmp(f, "int")) {
        *out = filter_int(v, a);
    } else if (!strcmp(f, "float")) {
        *out = filter_float(v);
    } else if (!strcmp(f, "abs")) {
        if (v.t == V_INT) *out = v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        else if (v.t == V_FLOAT) *out = v_float(fabs(v.u.f));
        else *out = rerr(r, line, UM_ERR_INVALID_ARG, "abs of a %s", type_name(v.t));
    } else if (!strcmp(f, "replace")) {
        value s = str_value(r, v), x = arg(a, 0, NULL), y = arg(a, 1, NULL), c = arg(a, 2, "count");
        if (x.t != V_STR || y.t != V_STR) *out = rerr(r, line, UM_ERR_INVALID_ARG, "replace needs two strings");
        else *out = str_replace(r, s, x, y, c.t == V_INT ? c.u.i : -1);
    } else if (!strcmp(f, "items")) {
        argv_t none = {0};
        if (v.t == V_UNDEF) *out = v_list(list_new(r->ar));
        else if (v.t != V_DICT) *out = rerr(r, line, UM_ERR_INVALID_ARG, "items of a %s", type_name(v.t));
        else *out = call_method(r, &v, "items", &none, line);
    } else {
        return 0;
    }
    return 1;
}

/* reverse filter: a string's characters (in holds them) or a list, reversed. */
static value filter_reverse(rctx *r, value v, const vlist *in) {
    if (v.t == V_STR) {
        strbuf b = {0};
        for (size_t i = in->n; i-- > 0;) strbuf_put(&b, in->v[i].u.s.p, in->v[i].u.s.n);
        value s = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
        strbuf_free(&b);
        return s;
    }
    vlist *o = list_new(r->ar);
    for (size_t i = in->n; i-- > 0;) list_push(r->ar, o, in->v[i]);
    return v_list(o);
}

/* join filter: the items (or their attribute=) as strings, separated by the first argument. */
static value filter_join(rctx *r, const vlist *in, const argv_t *a, int line) {
    value sep = arg(a, 0, "d"), attr = arg(a, 1, "attribute");
    strbuf b = {0};
    for (size_t i = 0; i < in->n; i++) {
        if (i && sep.t == V_STR) strbuf_put(&b, sep.u.s.p, sep.u.s.n);
        value x = in->v[i];
        if (attr.t == V_STR) x = get_attr(r, x, attr.u.s.p, attr.u.s.n, line);
        to_str(&b, x, 0);
    }
    value s = v_str(ar_strndup(r->ar, strbuf_str(&b), b.n), b.n);
    strbuf_free(&b);
    return s;
}

/* sum, min and max filters (f names which). */
static value filter_reduce(rctx *r, const char *f, const vlist *in, int line) {
    if (f[1] == 'u') {
        value acc = v_int(0);
        for (size_t i = 0; i < in->n && !r->failed; i++) acc = binop(r, OP_ADD, acc, in->v[i], line);
        return acc;
    }
    if (!in->n) return v_undef();
    value best = in->v[0];
    for (size_t i = 1; i < in->n; i++) {
        int c = values_cmp(in->v[i], best);
        if (c == 2) return rerr(r, line, UM_ERR_INVALID_ARG, "cannot compare values in %s", f);
        if ((f[1] == 'i' && c < 0) || (f[1] == 'a' && c > 0)) best = in->v[i];
    }
    return best;
}

/* map filter: each item's attribute= (with default=), or each item through the named filter. */
static value filter_map(rctx *r, const vlist *in, const argv_t *a, int line) {
    value attr = arg(a, -1, "attribute"), fname = arg(a, 0, NULL), dflt = arg(a, -1, "default");
    vlist *o = list_new(r->ar);
    for (size_t i = 0; i < in->n && !r->failed; i++) {
        value x;
        if (attr.t == V_STR) {
            x = get_attr(r, in->v[i], attr.u.s.p, attr.u.s.n, line);
            if (x.t == V_UNDEF && dflt.t != V_UNDEF) x = dflt;
        } else if (fname.t == V_STR) {
            int sub = table_find(FILTERS, fname.u.s.p, fname.u.s.n);
            if (sub < 0 || table_find(FILTERS_UNSUPPORTED, fname.u.s.p, fname.u.s.n) >= 0)
                return rerr(r, line, UM_ERR_UNSUPPORTED, "unsupported filter '%.*s' in map", (int)fname.u.s.n,
                            fname.u.s.p);
            argv_t rest = *a;
            rest.npos = a->npos > 1 ? a->npos - 1 : 0;
            for (int k = 0; k < rest.npos; k++) rest.pos[k] = a->pos[k + 1];
            x = apply_filter(r, sub, FILTERS[sub], in->v[i], &rest, line);
        } else {
            return rerr(r, line, UM_ERR_INVALID_ARG, "map needs a filter name or attribute=");
        }
        list_push(r->ar, o, x);
    }
    return v_list(o);
}

/* select, reject, selectattr and rejectattr filters (f names which): the items whose value (or
 * attribute) passes the named test, or is truthy when none is named. */
static value filter_select(rctx *r, const char *f, const vlist *in, const argv_t *a, int line) {
    int by_attr = f[6] == 'a', keep_match = f[0] == 's';
    value attr = by_attr ? arg(a, 0, NULL) : v_undef();
    value tname = arg(a, by_attr ? 1 : 0, NULL), targ = arg(a, by_attr ? 2 : 1, NULL);
    if (by_attr && attr.t != V_STR) return rerr(r, line, UM_ERR_INVALID_ARG, "%s needs an attribute name", f);
    vlist *o = list_new(r->ar);
    for (size_t i = 0; i < in->n && !r->failed; i++) {
        value x = by_attr ? get_attr(r, in->v[i], attr.u.s.p, attr.u.s.n, line) : in->v[i];
        int ok = tname.t == V_UNDEF ? truthy(x) : test_by_name(r, tname, x, targ, line);
        if (ok == keep_match) list_push(r->ar, o, in->v[i]);
    }
    return v_list(o);
}

static value apply_filter(rctx *r, int fid, const char *f, value v, const argv_t *a, int line) {
    (void)fid;
    value out;
    if (filter_scalar(r, f, v, a, line, &out)) return out;
    /* the rest work on sequences */
    value l = iterable_list(r, v, line);
    if (r->failed) return v_undef();
    vlist *in = l.u.l;
    if (!strcmp(f, "list")) return l;
    if (!strcmp(f, "first")) return in->n ? in->v[0] : v_undef();
    if (!strcmp(f, "last")) return in->n ? in->v[in->n - 1] : v_undef();
    if (!strcmp(f, "reverse")) return filter_reverse(r, v, in);
    if (!strcmp(f, "join")) return filter_join(r, in, a, line);
    if (!strcmp(f, "unique")) {
        vlist *o = list_new(r->ar);
        for (size_t i = 0; i < in->n; i++) {
            int seen = 0;
            for (size_t j = 0; j < o->n && !seen; j++) seen = values_eq(o->v[j], in->v[i]);
            if (!seen) list_push(r->ar, o, in->v[i]);
        }
        return v_list(o);
    }
    if (!strcmp(f, "sum") || !strcmp(f, "min") || !strcmp(f, "max")) return filter_reduce(r, f, in, line);
    if (!strcmp(f, "map")) return filter_map(r, in, a, line);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr") || !strcmp(f, "select") || !strcmp(f, "reject"))
        return filter_select(r, f, in, a, line);
    return rerr(r, line, UM_ERR_UNSUPPORTED, "unsupported filter '%s'", f);
}

/* ---------------------------------------------------------------- statements */

static int exec_block(rctx *r, const block *b);

static int out_value(rctx *r, value v, int line) {
    size_t before = r->out.n;
    to_str(&r->out, v, 0);
    if (r->out.n > RENDER_MAX_OUTPUT) return rerr(r, line, UM_ERR_RESOURCE, "output larger than %u bytes", RENDER_MAX_OUTPUT), -1;
    (void)before;
    return 0;
}

static int exec_for(rctx *r, const stmt *s) {
    value it = eval(r, s->e);
    if (r->failed) return -1;
    value lv = iterable_list(r, it, s->line);
    if (r->failed) return -1;
    vlist *items = lv.u.l;
    scope_push(r);
    int rc = 0;
    if (s->filter) { /* filtered items first, so loop.length / loop.last see the filtered list */
        vlist *kept = list_new(r->ar);
        for (size_t i = 0; i < items->n && !r->failed; i++) {
            value x = items->v[i];
            if (s->ntarget == 1) scope_set(r, s->target[0], x);
            else {
                scope_set(r, s->target[0], get_item(r, x, v_int(0), s->line));
                scope_set(r, s->target[1], get_item(r, x, v_int(1), s->line));
            }
            if (truthy(eval(r, s->filter))) list_push(r->ar, kept, x);
        }
        items = kept;
    }
    size_t n = items->n;
    /* one loop object per loop, updated in place (as its values are per iteration anyway) */
    vdict *loop = dict_new(r->ar);
    static const char *const loop_keys[] = {"index", "index0", "revindex", "revindex0", "first", "last", "length",
                                            "previtem", "nextitem"};
    for (int k = 0; k < 9; k++) dict_set(r->ar, loop, loop_keys[k], strlen(loop_keys[k]), v_undef());
    scope_set(r, "loop", v_dict(loop));
    for (size_t i = 0; i < n && !r->failed; i++) {
        if (++r->steps > RENDER_MAX_STEPS) {
            rerr(r, s->line, UM_ERR_RESOURCE, "template runs too long");
            break;
        }
        if (r->ar->total > RENDER_MAX_MEMORY) {
            rerr(r, s->line, UM_ERR_RESOURCE, "template uses more than %zu MB", RENDER_MAX_MEMORY >> 20);
            break;
        }
        value x = items->v[i];
        if (s->ntarget == 1) {
            scope_set(r, s->target[0], x);
        } else {
            if (x.t != V_LIST || x.u.l->n != 2) {
                rerr(r, s->line, UM_ERR_INVALID_ARG, "cannot unpack a %s into two loop variables", type_name(x.t));
                break;
            }
            scope_set(r, s->target[0], x.u.l->v[0]);
            scope_set(r, s->target[1], x.u.l->v[1]);
        }
        value *lo = loop->v; /* in loop_keys order */
        lo[0] = v_int((int64_t)i + 1), lo[1] = v_int((int64_t)i);
        lo[2] = v_int((int64_t)(n - i)), lo[3] = v_int((int64_t)(n - i - 1));
        lo[4] = v_bool(i == 0), lo[5] = v_bool(i + 1 == n), lo[6] = v_int((int64_t)n);
        lo[7] = i > 0 ? items->v[i - 1] : v_undef(), lo[8] = i + 1 < n ? items->v[i + 1] : v_undef();
        scope_set(r, "loop", v_dict(loop)); /* the body may have rebound the name */
        if (exec_block(r, &s->body) != 0) {
            rc = -1;
            break;
        }
        r->cont = 0;
        if (r->brk) {
            r->brk = 0;
            break;
        }
    }
    if (n == 0 && !r->failed && s->orelse.n) rc = exec_block(r, &s->orelse);
    scope_pop(r);
    return r->failed ? -1 : rc;
}

static int exec_block(rctx *r, const block *b) {
    for (int i = 0; i < b->n && !r->failed; i++) {
        const stmt *s = b->s[i];
        if (r->brk || r->cont) return 0;
        switch (s->kind) {
        case S_TEXT:
            strbuf_put(&r->out, s->text, s->text_n);
            if (r->out.n > RENDER_MAX_OUTPUT) return rerr(r, s->line, UM_ERR_RESOURCE, "output too large"), -1;
            break;
        case S_OUT: {
            value v = eval(r, s->e);
            if (r->failed || out_value(r, v, s->line) != 0) return -1;
            break;
        }
        case S_IF:
            if (truthy(eval(r, s->e))) {
                if (exec_block(r, &s->body) != 0) return -1;
            } else if (!r->failed && exec_block(r, &s->orelse) != 0) {
                return -1;
            }
            break;
        case S_FOR:
            if (exec_for(r, s) != 0) return -1;
            break;
        case S_SET: {
            value v = eval(r, s->e);
            if (r->failed) return -1;
            if (s->attr) {
                value ns;
                if (!scope_get(r, s->target[0], strlen(s->target[0]), &ns) || ns.t != V_DICT || !ns.u.d->is_ns)
                    return rerr(r, s->line, UM_ERR_INVALID_ARG, "cannot assign attribute on non-namespace '%s'",
                                s->target[0]), -1;
                dict_set(r->ar, ns.u.d, s->attr, strlen(s->attr), v);
            } else {
                scope_set(r, s->target[0], v);
            }
            break;
        }
        case S_SETBLOCK: {
            strbuf saved = r->out;
            r->out = (strbuf){0};
            int rc = exec_block(r, &s->body);
            value v = v_str(ar_strndup(r->ar, strbuf_str(&r->out), r->out.n), r->out.n);
            strbuf_free(&r->out);
            r->out = saved;
            if (rc != 0) return -1;
            scope_set(r, s->target[0], v);
            break;
        }
        case S_BREAK: r->brk = 1; return 0;
        case S_CONTINUE: r->cont = 1; return 0;
        }
    }
    return r->failed ? -1 : 0;
}

int jinja_render(const jinja_tmpl *t, const json_t *vars, char **out, um_err *err) {
    *out = NULL;
    arena ar = {0};
    rctx r = {0};
    r.ar = &ar;
    r.err = err;
    scope_push(&r); /* globals */
    static const struct {
        const char *name;
        int fn;
    } funcs[] = {{"raise_exception", FN_RAISE}, {"range", FN_RANGE}, {"namespace", FN_NAMESPACE},
                 {"dict", FN_DICT}, {"strftime_now", FN_STRFTIME}};
    for (size_t i = 0; i < sizeof funcs / sizeof funcs[0]; i++)
        scope_set(&r, funcs[i].name, (value){.t = V_FUNC, .u.fn = funcs[i].fn});
    if (json_is_object(vars)) {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)vars, k, v) scope_set(&r, ar_strndup(&ar, k, strlen(k)), from_json(&ar, v));
    }
    scope_push(&r); /* template top level */
    int rc = exec_block(&r, &t->root);
    if (rc == 0 && !r.failed) {
        *out = strbuf_take(&r.out, NULL);
    } else {
        rc = -1;
    }
    strbuf_free(&r.out);
    free(r.frames);
    ar_free(&ar);
    return rc;
}
