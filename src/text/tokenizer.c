/*
 * tokenizer.c — the tokenizer pipeline of HF tokenizers, byte-exact for byte-level BPE models:
 * added tokens (leftmost-longest, lstrip/rstrip/single_word/normalized/special) -> normalizer
 * (NFC / NFD / Sequence) -> pre-tokenizers (Split with a regex or string and any split behaviour,
 * ByteLevel, Digits, Sequence) -> BPE (bpe.c) ; decoding through the ByteLevel decoder with
 * lossy UTF-8 repair; an incremental decoder; loading tokenizer.json or vocab.json + merges.txt.
 *
 * Not here: post-processors (no BOS/EOS is added), truncation/padding, offsets, WordPiece /
 * Unigram / WordLevel models (rejected with UM_ERR_UNSUPPORTED), reading GGUF files (model/ hands
 * their tokenizer arrays to tokenizer_load_vocab), the built-in tokenizer
 * (bpe_builtin.c), chat templates (chat_template.c).
 *
 * Threads: loading on any one thread; a loaded tokenizer is shared read-only (bpe.c guards its
 * word cache), so encode/decode run on any thread concurrently.
 */
#include "text/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "text/unicode.h"
#include "text/unicode_regex.h"
#include "util/fileio.h"
#include "util/log.h"

#define TOKENIZER_MAX_FILE  (512u << 20)
#define TOKENIZER_MAX_ID    (1 << 24)
#define TOKENIZER_MAX_STEPS 16

/* The GPT-2 pattern ByteLevel(use_regex = true) splits with. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* Qwen2 / Dream (slow tokenizer PRETOKENIZE_REGEX). */
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
/* LLaDA's and the Ling / Bailing family's Split regex (their tokenizer.json). */
static const char BAILING_PATTERN[] =
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|"
    "\\s+(?!\\S)|\\s+";

const char *tokenizer_split_regex(enum tokenizer_split s) {
    switch (s) {
    case TOKENIZER_SPLIT_QWEN2: return QWEN2_PATTERN;
    case TOKENIZER_SPLIT_BAILING: return BAILING_PATTERN;
    default: return GPT2_PATTERN;
    }
}

enum split_behavior { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };
enum pt_kind { PT_SPLIT, PT_BYTELEVEL };
enum norm_kind { NORM_NFC, NORM_NFD };

typedef struct pretok {
    enum pt_kind kind;
    uregex *re;                   /* SPLIT with a regex (or ByteLevel use_regex) */
    char   *literal;              /* SPLIT with a string pattern (owned) */
    size_t  lit_len;
    enum split_behavior behavior;
    int     invert;
    int     add_prefix_space;     /* BYTELEVEL */
} pretok;

typedef struct added_tok {
    char   *content;              /* the token string (owned) */
    size_t  len;
    char   *mat;                  /* what is matched: content, normalized when `normalized` (owned) */
    size_t  mat_len;
    int32_t id;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} added_tok;

/* Added tokens of one kind (normalized or not), indexed by first byte, longest first. */
typedef struct added_set {
    int     *idx;                 /* indices into tok->added, grouped by first byte */
    int      start[257];          /* idx[start[b] .. start[b+1]) begin with byte b */
    int      n;
} added_set;

typedef struct config_token {
    char *name, *value;
} config_token;

struct tokenizer {
    bpe_model bpe;
    added_tok *added;
    int        n_added;
    added_set  set_raw, set_norm; /* matched before / after normalization */
    enum norm_kind norm[TOKENIZER_MAX_STEPS];
    int        n_norm;
    pretok     pre[TOKENIZER_MAX_STEPS];
    int        n_pre;
    int32_t    n_vocab;           /* max id + 1 over model and added tokens */
    int32_t   *added_of_id;       /* [n_vocab] index into added, or -1 */
    uint8_t   *special;           /* [n_vocab] */
    uint32_t  *dec_off, *dec_len; /* [n_vocab] decoded bytes in dec_blob */
    uint8_t   *dec_blob;
    strmap     added_map;         /* added content (unnormalized) -> id */
    config_token *cfg;
    int        n_cfg;
};

/* ================================================================ small helpers */

static int fmt_err(um_err *err, const char *label, const char *what) {
    return um_err_set(err, UM_ERR_FORMAT, "%s: %s", label, what);
}

static void tok_destroy(tokenizer *t) {
    bpe_free(&t->bpe);
    for (int i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].mat);
    }
    free(t->added);
    free(t->set_raw.idx);
    free(t->set_norm.idx);
    for (int i = 0; i < t->n_pre; i++) {
        uregex_free(t->pre[i].re);
        free(t->pre[i].literal);
    }
    free(t->added_of_id);
    free(t->special);
    free(t->dec_off);
    free(t->dec_len);
    free(t->dec_blob);
    strmap_free(&t->added_map);
    for (int i = 0; i < t->n_cfg; i++) {
        free(t->cfg[i].name);
        free(t->cfg[i].value);
    }
    free(t->cfg);
    free(t);
}

void tokenizer_free(tokenizer *tok) {
    if (tok) tok_destroy(tok);
}

static tokenizer *tok_new(void) {
    tokenizer *t = xcalloc(1, sizeof *t);
    bpe_init(&t->bpe);
    strmap_init(&t->added_map, 64);
    return t;
}

static char *normalize_text(const tokenizer *t, const char *s, size_t len, size_t *out_len) {
    char *cur = NULL;
    size_t cur_len = len;
    for (int i = 0; i < t->n_norm; i++) {
        const char *in = cur ? cur : s;
        char *next = t->norm[i] == NORM_NFC ? unicode_nfc(in, cur_len, &cur_len) : unicode_nfd(in, cur_len, &cur_len);
        free(cur);
        cur = next;
    }
    *out_len = cur_len;
    return cur; /* NULL = unchanged (no normalizer) */
}

static void add_added(tokenizer *t, const char *content, size_t len, int32_t id, int special, int lstrip,
                      int rstrip, int single_word, int normalized) {
    t->added = xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    added_tok *a = &t->added[t->n_added++];
    memset(a, 0, sizeof *a);
    a->content = xstrndup(content, len);
    a->len = len;
    a->id = id;
    a->special = (uint8_t)special, a->lstrip = (uint8_t)lstrip, a->rstrip = (uint8_t)rstrip;
    a->single_word = (uint8_t)single_word, a->normalized = (uint8_t)normalized;
}

static void config_token_set(tokenizer *t, const char *name, const char *value) {
    for (int i = 0; i < t->n_cfg; i++)
        if (strcmp(t->cfg[i].name, name) == 0) {
            free(t->cfg[i].value);
            t->cfg[i].value = xstrdup(value);
            return;
        }
    t->cfg = xrealloc(t->cfg, (size_t)(t->n_cfg + 1) * sizeof *t->cfg);
    t->cfg[t->n_cfg].name = xstrdup(name);
    t->cfg[t->n_cfg].value = xstrdup(value);
    t->n_cfg++;
}

/* ================================================================ added-token matching */

static void added_set_build(tokenizer *t, added_set *set, int normalized) {
    int n = 0;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized == normalized && t->added[i].mat_len > 0) n++;
    set->idx = xmalloc((size_t)(n ? n : 1) * sizeof *set->idx);
    set->n = n;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        set->start[b] = k;
        int first = k;
        for (int i = 0; i < t->n_added; i++) {
            const added_tok *a = &t->added[i];
            if (a->normalized != normalized || a->mat_len == 0 || (uint8_t)a->mat[0] != b) continue;
            /* insert sorted by length, longest first (stable for equal lengths) */
            int j = k++;
            while (j > first && t->added[set->idx[j - 1]].mat_len < a->mat_len) {
                set->idx[j] = set->idx[j - 1];
                j--;
            }
            set->idx[j] = i;
        }
    }
    set->start[256] = k;
}

/* Leftmost-longest match of any token of set in s[from..len): returns the added index or -1. */
static int added_find(const tokenizer *t, const added_set *set, const char *s, size_t len, size_t from,
                      size_t *ms) {
    if (!set->n) return -1;
    for (size_t i = from; i < len; i++) {
        uint8_t b = (uint8_t)s[i];
        for (int k = set->start[b]; k < set->start[b + 1]; k++) {
            const added_tok *a = &t->added[set->idx[k]];
            if (a->mat_len <= len - i && memcmp(s + i, a->mat, a->mat_len) == 0) {
                *ms = i;
                return set->idx[k];
            }
        }
    }
    return -1;
}

static int32_t last_cp(const char *s, size_t len) {
    if (!len) return -1;
    size_t i = len - 1;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    size_t adv;
    return utf8_decode((const uint8_t *)s + i, len - i, &adv);
}

static int32_t first_cp(const char *s, size_t len) {
    if (!len) return -1;
    size_t adv;
    return utf8_decode((const uint8_t *)s, len, &adv);
}

typedef struct piece_sink {
    int (*text)(void *arg, const char *s, size_t len);   /* a piece of plain text */
    void (*token)(void *arg, int32_t id);                /* an added token */
    void *arg;
} piece_sink;

/* HF AddedVocabulary::find_matches + split: cut s into added tokens and text between them. */
static int split_added(const tokenizer *t, const added_set *set, int parse_special, const char *s, size_t len,
                       const piece_sink *sink) {
    size_t start_offset = 0, pos = 0, ms;
    for (;;) {
        int ai = added_find(t, set, s, len, pos, &ms);
        if (ai < 0) break;
        const added_tok *a = &t->added[ai];
        size_t start = ms, stop = ms + a->mat_len;
        pos = stop; /* non-overlapping search, even when this match is discarded */
        if (!parse_special && a->special) continue;
        if (a->single_word) {
            int32_t before = last_cp(s, start), after = first_cp(s + stop, len - stop);
            int start_space = start == 0 || !(before >= 0 && unicode_is_word((uint32_t)before));
            int stop_space = stop == len || !(after >= 0 && unicode_is_word((uint32_t)after));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t p = ns - 1;
                while (p > 0 && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
                size_t adv;
                int32_t cp = utf8_decode((const uint8_t *)s + p, len - p, &adv);
                if (cp < 0 || !unicode_is_space((uint32_t)cp)) break;
                ns = p;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (start < start_offset) start = start_offset;
        if (a->rstrip) {
            while (stop < len) {
                size_t adv;
                int32_t cp = utf8_decode((const uint8_t *)s + stop, len - stop, &adv);
                if (cp < 0 || !unicode_is_space((uint32_t)cp)) break;
                stop += adv;
            }
            pos = stop > pos ? stop : pos;
        }
        if (start_offset < start && sink->text(sink->arg, s + start_offset, start - start_offset) != 0) return -1;
        sink->token(sink->arg, a->id);
        start_offset = stop;
    }
    if (start_offset < len) return sink->text(sink->arg, s + start_offset, len - start_offset);
    return 0;
}

/* ================================================================ encoding */

typedef struct enc_ctx {
    const tokenizer *t;
    idvec ids;
    int parse_special;
    um_err *err;
} enc_ctx;

static int pretok_run(enc_ctx *c, int step, const char *s, size_t len);

typedef struct seg {
    size_t a, b;
    int match;
} seg;

typedef struct segvec {
    seg *v;
    size_t n, cap;
} segvec;

static void seg_push(segvec *sv, size_t a, size_t b, int match) {
    if (sv->n == sv->cap) {
        sv->cap = sv->cap ? sv->cap * 2 : 32;
        sv->v = xrealloc(sv->v, sv->cap * sizeof *sv->v);
    }
    sv->v[sv->n++] = (seg){a, b, match};
}

/* Next match of a split pattern in s[from..len): 1 found, 0 none, -1 error. */
static int pattern_find(const pretok *p, const char *s, size_t len, size_t from, size_t *ms, size_t *me,
                        um_err *err) {
    if (p->re) return uregex_find(p->re, s, len, from, ms, me, err);
    if (from >= len || p->lit_len == 0) return 0;
    const char *hit = memmem(s + from, len - from, p->literal, p->lit_len);
    if (!hit) return 0;
    *ms = (size_t)(hit - s);
    *me = *ms + p->lit_len;
    return 1;
}

static int split_run(enc_ctx *c, int step, const pretok *p, const char *s, size_t len) {
    size_t pos = 0, ms, me;
    int r;
    if (p->behavior == SB_ISOLATED && !p->invert) { /* fast path: stream gaps and matches */
        while ((r = pattern_find(p, s, len, pos, &ms, &me, c->err)) == 1) {
            if (ms > pos && pretok_run(c, step + 1, s + pos, ms - pos) != 0) return -1;
            if (pretok_run(c, step + 1, s + ms, me - ms) != 0) return -1;
            pos = me;
        }
        if (r < 0) return -1;
        if (pos < len) return pretok_run(c, step + 1, s + pos, len - pos);
        return 0;
    }
    segvec sv = {0};
    while ((r = pattern_find(p, s, len, pos, &ms, &me, c->err)) == 1) {
        if (ms > pos) seg_push(&sv, pos, ms, 0);
        seg_push(&sv, ms, me, 1);
        pos = me;
    }
    if (r < 0) {
        free(sv.v);
        return -1;
    }
    if (pos < len) seg_push(&sv, pos, len, 0);
    if (p->invert)
        for (size_t i = 0; i < sv.n; i++) sv.v[i].match = !sv.v[i].match;
    /* HF SplitDelimiterBehavior: out[i].match = "remove this piece" */
    segvec out = {0};
    int prev_match = 0;
    switch (p->behavior) {
    case SB_REMOVED: out = sv, sv.v = NULL; break;
    case SB_ISOLATED:
        for (size_t i = 0; i < sv.n; i++) seg_push(&out, sv.v[i].a, sv.v[i].b, 0);
        break;
    case SB_MERGED_PREV:
        for (size_t i = 0; i < sv.n; i++) {
            if (sv.v[i].match && !prev_match && out.n) out.v[out.n - 1].b = sv.v[i].b;
            else seg_push(&out, sv.v[i].a, sv.v[i].b, 0);
            prev_match = sv.v[i].match;
        }
        break;
    case SB_MERGED_NEXT:
        for (size_t k = sv.n; k-- > 0;) {
            if (sv.v[k].match && !prev_match && out.n) out.v[out.n - 1].a = sv.v[k].a;
            else seg_push(&out, sv.v[k].a, sv.v[k].b, 0);
            prev_match = sv.v[k].match;
        }
        for (size_t i = 0; i < out.n / 2; i++) {
            seg tmp = out.v[i];
            out.v[i] = out.v[out.n - 1 - i];
            out.v[out.n - 1 - i] = tmp;
        }
        break;
    case SB_CONTIGUOUS:
        for (size_t i = 0; i < sv.n; i++) {
            if (sv.v[i].match == prev_match && out.n) out.v[out.n - 1].b = sv.v[i].b;
            else seg_push(&out, sv.v[i].a, sv.v[i].b, 0);
            prev_match = sv.v[i].match;
        }
        break;
    }
    free(sv.v);
    int rc = 0;
    for (size_t i = 0; i < out.n && rc == 0; i++)
        if (!out.v[i].match && out.v[i].b > out.v[i].a)
            rc = pretok_run(c, step + 1, s + out.v[i].a, out.v[i].b - out.v[i].a);
    free(out.v);
    return rc;
}

static int pretok_run(enc_ctx *c, int step, const char *s, size_t len) {
    const tokenizer *t = c->t;
    if (len == 0) return 0;
    if (step == t->n_pre) {
        bpe_encode_word(&t->bpe, s, len, &c->ids);
        return 0;
    }
    const pretok *p = &t->pre[step];
    if (p->kind == PT_BYTELEVEL) {
        char *tmp = NULL;
        if (p->add_prefix_space && s[0] != ' ') {
            tmp = xmalloc(len + 1);
            tmp[0] = ' ';
            memcpy(tmp + 1, s, len);
            s = tmp, len++;
        }
        int rc = p->re ? split_run(c, step, p, s, len) : pretok_run(c, step + 1, s, len);
        free(tmp);
        return rc;
    }
    return split_run(c, step, p, s, len);
}

static int sink_text_norm(void *arg, const char *s, size_t len) { return pretok_run(arg, 0, s, len); }

static void sink_token(void *arg, int32_t id) {
    enc_ctx *c = arg;
    idvec_push(&c->ids, id);
}

/* A piece of raw text between non-normalized added tokens: normalize, split on normalized added
 * tokens, pre-tokenize, BPE. */
static int sink_text_raw(void *arg, const char *s, size_t len) {
    enc_ctx *c = arg;
    size_t nlen;
    char *norm = normalize_text(c->t, s, len, &nlen);
    const char *ns = norm ? norm : s;
    if (!norm) nlen = len;
    piece_sink sink = {sink_text_norm, sink_token, c};
    int rc = split_added(c->t, &c->t->set_norm, c->parse_special, ns, nlen, &sink);
    free(norm);
    return rc;
}

int tokenizer_encode(const tokenizer *tok, const char *text, size_t len, int parse_special, int32_t **ids,
                     size_t *n, um_err *err) {
    *ids = NULL;
    *n = 0;
    size_t bad;
    if (!utf8_validate(text, len, &bad))
        return um_err_param(err, "text", "text is not valid UTF-8 (byte %zu)", bad);
    enc_ctx c = {tok, {0}, parse_special, err};
    piece_sink sink = {sink_text_raw, sink_token, &c};
    if (split_added(tok, &tok->set_raw, parse_special, text, len, &sink) != 0) {
        free(c.ids.v);
        return -1;
    }
    *ids = c.ids.v;
    *n = c.ids.n;
    return 0;
}

/* ================================================================ vocabulary queries */

int tokenizer_n_vocab(const tokenizer *tok) { return tok->n_vocab; }

int tokenizer_token_id(const tokenizer *tok, const char *piece) {
    size_t len = strlen(piece);
    int32_t id = strmap_get(&tok->added_map, piece, len);
    if (id >= 0) return id;
    return strmap_get(&tok->bpe.vocab, piece, len);
}

int tokenizer_is_special(const tokenizer *tok, int id) {
    return id >= 0 && id < tok->n_vocab && tok->special[id];
}

const char *tokenizer_token_piece(const tokenizer *tok, int id) {
    if (id < 0 || id >= tok->n_vocab) return NULL;
    if (tok->added_of_id[id] >= 0) {
        /* the unnormalized content: find it through the map entry pointing at this id */
        const added_tok *a = &tok->added[tok->added_of_id[id]];
        return a->content;
    }
    return id < tok->bpe.n_ids ? tok->bpe.piece[id] : NULL;
}

const uint8_t *tokenizer_token_bytes(const tokenizer *tok, int id, size_t *len) {
    if (id < 0 || id >= tok->n_vocab || tok->dec_off[id] == UINT32_MAX) {
        *len = 0;
        return NULL;
    }
    *len = tok->dec_len[id];
    return tok->dec_blob + tok->dec_off[id];
}

const char *tokenizer_config_token(const tokenizer *tok, const char *name) {
    for (int i = 0; i < tok->n_cfg; i++)
        if (strcmp(tok->cfg[i].name, name) == 0) return tok->cfg[i].value;
    return NULL;
}

/* ================================================================ decoding */

void tokenizer_decode(const tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                      size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        if (tokenizer_token_bytes(tok, ids[i], &l)) total += l;
    }
    char *out = xmalloc(total * 3 + 4);
    utf8_lossy st = {0};
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const uint8_t *b = tokenizer_token_bytes(tok, ids[i], &l);
        if (!b || (skip_special && tok->special[ids[i]])) continue;
        for (size_t k = 0; k < l; k++) o += (size_t)utf8_lossy_feed(&st, b[k], out + o);
    }
    o += (size_t)utf8_lossy_flush(&st, out + o);
    out[o] = 0;
    *text = out;
    *len = o;
}

void tok_stream_init(tok_stream *s, const tokenizer *tok, int skip_special) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->skip_special = skip_special;
}

static void stream_reserve(tok_stream *s, size_t need) {
    if (need <= s->cap) return;
    s->cap = need < 64 ? 64 : need * 2;
    s->buf = xrealloc(s->buf, s->cap);
}

void tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len) {
    size_t l;
    const uint8_t *b = tokenizer_token_bytes(s->tok, id, &l);
    if (!b || (s->skip_special && s->tok->special[id])) l = 0;
    stream_reserve(s, l * 3 + 8);
    utf8_lossy st = {{0}, s->n_pend, 0};
    memcpy(st.pend, s->pend, sizeof st.pend);
    if (s->n_pend) st.need = s->pend[0] < 0xE0 ? 2 : s->pend[0] < 0xF0 ? 3 : 4; /* from the lead byte */
    size_t o = 0;
    for (size_t k = 0; k < l; k++) o += (size_t)utf8_lossy_feed(&st, b[k], s->buf + o);
    memcpy(s->pend, st.pend, sizeof s->pend);
    s->n_pend = st.n_pend;
    s->buf[o] = 0;
    *text = s->buf;
    *len = o;
}

void tok_stream_flush(tok_stream *s, const char **text, size_t *len) {
    stream_reserve(s, 8);
    size_t o = 0;
    if (s->n_pend) {
        memcpy(s->buf, UTF8_REPLACEMENT, 3);
        o = 3;
    }
    s->n_pend = 0;
    s->buf[o] = 0;
    *text = s->buf;
    *len = o;
}

void tok_stream_free(tok_stream *s) {
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* ================================================================ finishing a loaded tokenizer */

/* The bytes a token string decodes to through the ByteLevel decoder: every character mapped back
 * to its byte, or the string's own UTF-8 when some character is not in the byte map. */
static size_t piece_bytes(const char *p, size_t len, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < len) {
        size_t adv;
        int32_t cp = utf8_decode((const uint8_t *)p + i, len - i, &adv);
        int b = cp < 0 ? -1 : bpe_cp_to_byte((uint32_t)cp);
        if (b < 0) {
            memcpy(out, p, len);
            return len;
        }
        out[o++] = (uint8_t)b;
        i += adv;
    }
    return o;
}

static int tok_finish(tokenizer *t, const char *label, um_err *err) {
    bpe_finish(&t->bpe);
    int32_t nv = t->bpe.n_ids;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id + 1 > nv) nv = t->added[i].id + 1;
    t->n_vocab = nv;
    if (nv == 0) return fmt_err(err, label, "empty vocabulary");
    t->added_of_id = xmalloc((size_t)nv * sizeof *t->added_of_id);
    for (int32_t i = 0; i < nv; i++) t->added_of_id[i] = -1;
    for (int i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        t->added_of_id[a->id] = i;
        strmap_put(&t->added_map, a->content, a->len, a->id);
    }
    /* normalized added tokens are matched against normalized text */
    for (int i = 0; i < t->n_added; i++) {
        added_tok *a = &t->added[i];
        char *nc = NULL;
        size_t nl = a->len;
        if (a->normalized) nc = normalize_text(t, a->content, a->len, &nl);
        free(a->mat);
        a->mat = nc ? nc : xstrndup(a->content, a->len);
        a->mat_len = nc ? nl : a->len;
    }
    added_set_build(t, &t->set_raw, 0);
    added_set_build(t, &t->set_norm, 1);
    /* decoded bytes and the special flag per id; HF decodes added ids through their content */
    t->special = xcalloc((size_t)nv, 1);
    t->dec_off = xmalloc((size_t)nv * sizeof *t->dec_off);
    t->dec_len = xcalloc((size_t)nv, sizeof *t->dec_len);
    size_t total = 0;
    for (int32_t i = 0; i < nv; i++) {
        const char *p = tokenizer_token_piece(t, i);
        if (p) total += strlen(p);
    }
    t->dec_blob = xmalloc(total + 1);
    strmap special_contents;
    strmap_init(&special_contents, 64);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].special) strmap_put(&special_contents, t->added[i].content, t->added[i].len, 1);
    size_t o = 0;
    for (int32_t i = 0; i < nv; i++) {
        const char *p = tokenizer_token_piece(t, i);
        if (!p) {
            t->dec_off[i] = UINT32_MAX;
            continue;
        }
        size_t pl = strlen(p);
        if (o + pl > UINT32_MAX) {
            strmap_free(&special_contents);
            return fmt_err(err, label, "vocabulary strings too large");
        }
        t->dec_off[i] = (uint32_t)o;
        size_t bl = piece_bytes(p, pl, t->dec_blob + o);
        t->dec_len[i] = (uint32_t)bl;
        o += bl;
        t->special[i] = strmap_get(&special_contents, p, pl) >= 0;
    }
    strmap_free(&special_contents);
    return 0;
}

/* ================================================================ tokenizer.json */

static int json_bool(const json_t *o, const char *key, int def) {
    const json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return def;
}

static int parse_normalizer(tokenizer *t, const json_t *n, const char *label, int depth, um_err *err) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return fmt_err(err, label, "normalizer must be an object or null");
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return fmt_err(err, label, "normalizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(n, "normalizers");
        if (!json_is_array(arr)) return fmt_err(err, label, "Sequence normalizer needs a \"normalizers\" array");
        if (depth > 4) return fmt_err(err, label, "normalizer Sequence nested too deep");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) if (parse_normalizer(t, v, label, depth + 1, err) != 0) return -1;
        return 0;
    }
    if (t->n_norm >= TOKENIZER_MAX_STEPS) return fmt_err(err, label, "too many normalizers");
    if (strcmp(type, "NFC") == 0) t->norm[t->n_norm++] = NORM_NFC;
    else if (strcmp(type, "NFD") == 0) t->norm[t->n_norm++] = NORM_NFD;
    else return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: unsupported normalizer type \"%s\"", label, type);
    return 0;
}

static int parse_behavior(const json_t *v, enum split_behavior *b) {
    const char *s = json_string_value(v);
    if (!s) return -1;
    if (strcmp(s, "Removed") == 0) *b = SB_REMOVED;
    else if (strcmp(s, "Isolated") == 0) *b = SB_ISOLATED;
    else if (strcmp(s, "MergedWithPrevious") == 0) *b = SB_MERGED_PREV;
    else if (strcmp(s, "MergedWithNext") == 0) *b = SB_MERGED_NEXT;
    else if (strcmp(s, "Contiguous") == 0) *b = SB_CONTIGUOUS;
    else return -1;
    return 0;
}

static int add_regex_step(tokenizer *t, const char *pattern, size_t len, enum split_behavior b, int invert,
                          const char *label, um_err *err) {
    if (t->n_pre >= TOKENIZER_MAX_STEPS) return fmt_err(err, label, "too many pre-tokenizers");
    pretok *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    if (uregex_compile(pattern, len, &p->re, err) != 0) return um_err_prefix(err, "%s: pre_tokenizer", label);
    p->kind = PT_SPLIT, p->behavior = b, p->invert = invert;
    t->n_pre++;
    return 0;
}

static int parse_pretok(tokenizer *t, const json_t *n, const char *label, int depth, um_err *err) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return fmt_err(err, label, "pre_tokenizer must be an object or null");
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return fmt_err(err, label, "pre_tokenizer has no \"type\"");
    if (strcmp(type, "Sequence") == 0) {
        const json_t *arr = json_object_get(n, "pretokenizers");
        if (!json_is_array(arr)) return fmt_err(err, label, "Sequence pre_tokenizer needs a \"pretokenizers\" array");
        if (depth > 4) return fmt_err(err, label, "pre_tokenizer Sequence nested too deep");
        size_t i;
        const json_t *v;
        json_array_foreach(arr, i, v) if (parse_pretok(t, v, label, depth + 1, err) != 0) return -1;
        return 0;
    }
    if (t->n_pre >= TOKENIZER_MAX_STEPS) return fmt_err(err, label, "too many pre-tokenizers");
    if (strcmp(type, "ByteLevel") == 0) {
        pretok *p = &t->pre[t->n_pre];
        memset(p, 0, sizeof *p);
        p->kind = PT_BYTELEVEL;
        p->add_prefix_space = json_bool(n, "add_prefix_space", 1);
        p->behavior = SB_ISOLATED;
        if (json_bool(n, "use_regex", 1) &&
            uregex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, &p->re, err) != 0)
            return -1;
        t->n_pre++;
        t->bpe.byte_level = 1;
        return 0;
    }
    if (strcmp(type, "Split") == 0) {
        enum split_behavior b;
        if (parse_behavior(json_object_get(n, "behavior"), &b) != 0)
            return fmt_err(err, label, "Split pre_tokenizer has a missing or unknown \"behavior\"");
        int invert = json_bool(n, "invert", 0);
        const json_t *pat = json_object_get(n, "pattern");
        const json_t *re = json_object_get(pat, "Regex");
        const json_t *lit = json_object_get(pat, "String");
        if (json_is_string(re))
            return add_regex_step(t, json_string_value(re), json_string_length(re), b, invert, label, err);
        if (!json_is_string(lit))
            return fmt_err(err, label, "Split pre_tokenizer needs pattern {\"Regex\": ..} or {\"String\": ..}");
        pretok *p = &t->pre[t->n_pre];
        memset(p, 0, sizeof *p);
        p->kind = PT_SPLIT, p->behavior = b, p->invert = invert;
        p->literal = xstrndup(json_string_value(lit), json_string_length(lit));
        p->lit_len = json_string_length(lit);
        t->n_pre++;
        return 0;
    }
    if (strcmp(type, "Digits") == 0) {
        int individual = json_bool(n, "individual_digits", 0);
        return add_regex_step(t, "\\p{N}", 5, individual ? SB_ISOLATED : SB_CONTIGUOUS, 0, label, err);
    }
    return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: unsupported pre_tokenizer type \"%s\"", label, type);
}

static int check_decoder(const json_t *d, const char *label, int depth, um_err *err) {
    if (!d || json_is_null(d))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: a decoder is required (ByteLevel)", label);
    const char *type = json_string_value(json_object_get(d, "type"));
    if (!type) return fmt_err(err, label, "decoder has no \"type\"");
    if (strcmp(type, "ByteLevel") == 0) return 0;
    if (strcmp(type, "Sequence") == 0 && depth < 4) {
        const json_t *arr = json_object_get(d, "decoders");
        if (!json_is_array(arr) || json_array_size(arr) != 1)
            return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: only a Sequence of one ByteLevel decoder is supported",
                              label);
        return check_decoder(json_array_get(arr, 0), label, depth + 1, err);
    }
    return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: unsupported decoder type \"%s\"", label, type);
}

static int check_id(json_int_t id, const char *label, const char *what, um_err *err) {
    if (id < 0 || id >= TOKENIZER_MAX_ID)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %s id %lld out of range [0, %d)", label, what, (long long)id,
                          TOKENIZER_MAX_ID);
    return 0;
}

static int parse_vocab(tokenizer *t, const json_t *vocab, const char *label, um_err *err) {
    if (!json_is_object(vocab)) return fmt_err(err, label, "model.vocab must be an object {token: id}");
    size_t n = json_object_size(vocab);
    strmap_free(&t->bpe.vocab);
    strmap_init(&t->bpe.vocab, n);
    const char *key;
    const json_t *v;
    json_int_t max_id = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v))
            return um_err_set(err, UM_ERR_FORMAT, "%s: vocab entry \"%.40s\" is not an integer id", label, key);
        json_int_t id = json_integer_value(v);
        if (check_id(id, label, "vocab", err) != 0) return -1;
        if (id > max_id) max_id = id;
    }
    if (max_id >= (json_int_t)(2 * n + 65536))
        return um_err_set(err, UM_ERR_FORMAT, "%s: vocab id %lld is far beyond its %zu entries", label,
                          (long long)max_id, n);
    json_object_foreach((json_t *)vocab, key, v) {
        /* HF keeps the last string for an id listed twice; we refuse the ambiguity */
        if (bpe_add_piece(&t->bpe, (int32_t)json_integer_value(v), key, strlen(key)) != 0)
            return um_err_set(err, UM_ERR_FORMAT, "%s: vocab id %lld is used by two tokens", label,
                              (long long)json_integer_value(v));
    }
    return 0;
}

/* One merge given as "a b" or [a, b]. */
static int add_merge_strings(tokenizer *t, const char *a, size_t al, const char *b, size_t bl, uint32_t rank,
                             const char *label, um_err *err) {
    int32_t ia = strmap_get(&t->bpe.vocab, a, al), ib = strmap_get(&t->bpe.vocab, b, bl);
    if (ia < 0 || ib < 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: merge %u refers to a token not in the vocabulary (\"%.*s\")",
                          label, rank, (int)(ia < 0 ? (al > 40 ? 40 : al) : (bl > 40 ? 40 : bl)), ia < 0 ? a : b);
    char stackbuf[256];
    char *m = al + bl <= sizeof stackbuf ? stackbuf : xmalloc(al + bl);
    memcpy(m, a, al);
    memcpy(m + al, b, bl);
    int32_t im = strmap_get(&t->bpe.vocab, m, al + bl);
    if (m != stackbuf) free(m);
    if (im < 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: merge %u result \"%.*s%.*s\" is not in the vocabulary", label,
                          rank, (int)(al > 30 ? 30 : al), a, (int)(bl > 30 ? 30 : bl), b);
    bpe_add_merge(&t->bpe, ia, ib, im, rank);
    return 0;
}

/* One merge given as the string "a b" (exactly one space). */
static int add_merge_line(tokenizer *t, const char *s, size_t len, uint32_t rank, const char *label, um_err *err) {
    const char *sp = memchr(s, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
        return um_err_set(err, UM_ERR_FORMAT, "%s: merge %u \"%.*s\" is not \"a b\"", label, rank,
                          (int)(len > 40 ? 40 : len), s);
    return add_merge_strings(t, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s), rank, label, err);
}

static int parse_merges(tokenizer *t, const json_t *merges, const char *label, um_err *err) {
    if (!merges || json_is_null(merges)) return 0;
    if (!json_is_array(merges)) return fmt_err(err, label, "model.merges must be an array");
    size_t i;
    const json_t *m;
    json_array_foreach(merges, i, m) {
        if (i >= UINT32_MAX) return fmt_err(err, label, "too many merges");
        if (json_is_string(m)) {
            if (add_merge_line(t, json_string_value(m), json_string_length(m), (uint32_t)i, label, err) != 0) return -1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            const json_t *a = json_array_get(m, 0), *b = json_array_get(m, 1);
            if (add_merge_strings(t, json_string_value(a), json_string_length(a), json_string_value(b),
                                  json_string_length(b), (uint32_t)i, label, err) != 0)
                return -1;
        } else {
            return um_err_set(err, UM_ERR_FORMAT, "%s: merge %zu must be \"a b\" or [\"a\", \"b\"]", label, i);
        }
    }
    return 0;
}

static int parse_model(tokenizer *t, const json_t *model, const char *label, um_err *err) {
    if (!json_is_object(model)) return fmt_err(err, label, "missing \"model\" object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: unsupported model type \"%s\" (only BPE)", label, type);
    if (!type && !json_object_get(model, "merges"))
        return fmt_err(err, label, "model has no \"type\" and is not BPE");
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: BPE byte_fallback is not supported", label);
    const json_t *d = json_object_get(model, "dropout");
    if (d && !json_is_null(d) && !(json_is_number(d) && json_number_value(d) == 0.0))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", label);
    const char *csp = json_string_value(json_object_get(model, "continuing_subword_prefix"));
    const char *ews = json_string_value(json_object_get(model, "end_of_word_suffix"));
    if ((csp && *csp) || (ews && *ews))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: BPE continuing_subword_prefix/end_of_word_suffix", label);
    if (parse_vocab(t, json_object_get(model, "vocab"), label, err) != 0) return -1;
    if (parse_merges(t, json_object_get(model, "merges"), label, err) != 0) return -1;
    t->bpe.ignore_merges = json_bool(model, "ignore_merges", 0);
    t->bpe.fuse_unk = json_bool(model, "fuse_unk", 0);
    const json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        t->bpe.unk_id = strmap_get(&t->bpe.vocab, json_string_value(unk), json_string_length(unk));
        if (t->bpe.unk_id < 0) return fmt_err(err, label, "unk_token is not in the vocabulary");
    }
    return 0;
}

static int parse_added_entry(tokenizer *t, const json_t *a, json_int_t id, const char *label, um_err *err) {
    const json_t *content = json_object_get(a, "content");
    if (!json_is_string(content) || json_string_length(content) == 0)
        return fmt_err(err, label, "added token without a non-empty \"content\" string");
    if (check_id(id, label, "added token", err) != 0) return -1;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) {
            if (t->added[i].len == json_string_length(content) &&
                memcmp(t->added[i].content, json_string_value(content), t->added[i].len) == 0)
                return 0;
            return um_err_set(err, UM_ERR_FORMAT, "%s: added token id %lld is used twice", label, (long long)id);
        }
    int special = json_bool(a, "special", 0);
    add_added(t, json_string_value(content), json_string_length(content), (int32_t)id, special,
              json_bool(a, "lstrip", 0), json_bool(a, "rstrip", 0), json_bool(a, "single_word", 0),
              json_bool(a, "normalized", !special));
    return 0;
}

static int parse_added_tokens(tokenizer *t, const json_t *arr, const char *label, um_err *err) {
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return fmt_err(err, label, "added_tokens must be an array");
    size_t i;
    const json_t *a;
    json_array_foreach(arr, i, a) {
        const json_t *id = json_object_get(a, "id");
        if (!json_is_object(a) || !json_is_integer(id))
            return um_err_set(err, UM_ERR_FORMAT, "%s: added_tokens[%zu] needs an integer \"id\"", label, i);
        if (parse_added_entry(t, a, json_integer_value(id), label, err) != 0) return -1;
    }
    return 0;
}

static int parse_tokenizer_json(tokenizer *t, const json_t *root, const char *label, um_err *err) {
    if (!json_is_object(root)) return fmt_err(err, label, "top level must be an object");
    if (parse_model(t, json_object_get(root, "model"), label, err) != 0) return -1;
    if (parse_added_tokens(t, json_object_get(root, "added_tokens"), label, err) != 0) return -1;
    if (parse_normalizer(t, json_object_get(root, "normalizer"), label, 0, err) != 0) return -1;
    if (parse_pretok(t, json_object_get(root, "pre_tokenizer"), label, 0, err) != 0) return -1;
    if (check_decoder(json_object_get(root, "decoder"), label, 0, err) != 0) return -1;
    return 0;
}

int tokenizer_load_json(const char *buf, size_t len, const char *label, tokenizer **out, um_err *err) {
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(buf, len, 0, &je);
    if (!root)
        return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON at line %d: %s", label, je.line, je.text);
    tokenizer *t = tok_new();
    int rc = parse_tokenizer_json(t, root, label, err);
    json_decref(root);
    if (rc == 0) rc = tok_finish(t, label, err);
    if (rc != 0) {
        tok_destroy(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* ================================================================ arrays (GGUF metadata) */

/* The split steps of v: [NFC], the regex (GPT-2's inside ByteLevel, as HF's use_regex does), the
 * byte-level mapping. */
static int vocab_pretok(tokenizer *t, const tokenizer_vocab *v, const char *label, um_err *err) {
    if (v->nfc) t->norm[t->n_norm++] = NORM_NFC;
    if (v->split == TOKENIZER_SPLIT_GPT2) {
        t->pre[0] = (pretok){.kind = PT_BYTELEVEL, .behavior = SB_ISOLATED};
        if (uregex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, &t->pre[0].re, err) != 0) return -1;
        t->n_pre = 1;
    } else {
        const char *re = tokenizer_split_regex(v->split);
        if (add_regex_step(t, re, strlen(re), SB_ISOLATED, 0, label, err) != 0) return -1;
        t->pre[t->n_pre++] = (pretok){.kind = PT_BYTELEVEL, .behavior = SB_ISOLATED};
    }
    t->bpe.byte_level = 1;
    return 0;
}

static int vocab_tokens(tokenizer *t, const tokenizer_vocab *v, const char *label, um_err *err) {
    if (v->n_tokens <= 0 || v->n_tokens > TOKENIZER_MAX_ID)
        return um_err_set(err, UM_ERR_FORMAT, "%s: %d tokens (1 to %d are valid)", label, v->n_tokens, TOKENIZER_MAX_ID);
    strmap_free(&t->bpe.vocab);
    strmap_init(&t->bpe.vocab, (size_t)v->n_tokens);
    for (int32_t i = 0; i < v->n_tokens; i++) {
        const int32_t kind = v->kind ? v->kind[i] : TOKENIZER_TOKEN_NORMAL;
        if (kind < TOKENIZER_TOKEN_NORMAL || kind > TOKENIZER_TOKEN_BYTE)
            return um_err_set(err, UM_ERR_FORMAT, "%s: token %d has unknown type %d", label, i, kind);
        if (kind == TOKENIZER_TOKEN_UNUSED) continue;
        const char *p = v->token[i];
        const size_t len = v->token_len[i];
        if (len == 0) return um_err_set(err, UM_ERR_FORMAT, "%s: token %d is empty", label, i);
        const int32_t other = strmap_get(&t->bpe.vocab, p, len);
        if (other >= 0)
            return um_err_set(err, UM_ERR_FORMAT, "%s: tokens %d and %d are both \"%.*s\"", label, other, i,
                              (int)(len > 40 ? 40 : len), p);
        CHECK(bpe_add_piece(&t->bpe, i, p, len) == 0);   /* ids are distinct */
        if (kind == TOKENIZER_TOKEN_CONTROL || kind == TOKENIZER_TOKEN_USER_DEFINED)
            add_added(t, p, len, i, kind == TOKENIZER_TOKEN_CONTROL, 0, 0, 0, 0);
    }
    return 0;
}

int tokenizer_load_vocab(const tokenizer_vocab *v, const char *label, tokenizer **out, um_err *err) {
    *out = NULL;
    tokenizer *t = tok_new();
    int rc = vocab_tokens(t, v, label, err);
    for (int64_t i = 0; rc == 0 && i < v->n_merges; i++) {
        if (i >= UINT32_MAX) rc = fmt_err(err, label, "too many merges");
        else rc = add_merge_line(t, v->merge[i], v->merge_len[i], (uint32_t)i, label, err);
    }
    if (rc == 0) rc = vocab_pretok(t, v, label, err);
    const char *const names[] = {"bos_token", "eos_token", "pad_token", "unk_token", "mask_token"};
    const char *const values[] = {v->bos_token, v->eos_token, v->pad_token, v->unk_token, v->mask_token};
    for (int i = 0; rc == 0 && i < 5; i++)
        if (values[i]) config_token_set(t, names[i], values[i]);
    if (rc == 0) rc = tok_finish(t, label, err);
    if (rc != 0) {
        tok_destroy(t);
        return -1;
    }
    *out = t;
    return 0;
}

/* ================================================================ directory loading */

static int load_json_path(const char *dir, const char *name, size_t flags, json_t **out, um_err *err) {
    char path[4096];
    path_join(path, sizeof path, dir, name);
    *out = NULL;
    if (!file_exists(path)) return 0;
    char *text;
    size_t len;
    if (file_read_all(path, TOKENIZER_MAX_FILE, &text, &len, err) != 0) return -1;
    json_error_t je;
    *out = json_loadb(text, len, flags, &je);
    free(text);
    if (!*out) return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    return 0;
}

static const char *token_string(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* tokenizer_config.json / special_tokens_map.json: token strings and extra added tokens. */
static int apply_config(tokenizer *t, const json_t *cfg, const char *label, int add_tokens, um_err *err) {
    if (!cfg) return 0;
    if (!json_is_object(cfg)) return fmt_err(err, label, "top level must be an object");
    const char *key;
    const json_t *v;
    json_object_foreach((json_t *)cfg, key, v) {
        size_t kl = strlen(key);
        if (kl > 6 && strcmp(key + kl - 6, "_token") == 0) {
            const char *s = token_string(v);
            if (s) config_token_set(t, key, s);
        }
    }
    const json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    if (!add_tokens || !dec) return 0;
    if (!json_is_object(dec)) return fmt_err(err, label, "added_tokens_decoder must be an object");
    json_object_foreach((json_t *)dec, key, v) {
        char *end;
        long long id = strtoll(key, &end, 10);
        if (*key == 0 || *end || !json_is_object(v))
            return um_err_set(err, UM_ERR_FORMAT, "%s: added_tokens_decoder key \"%.20s\" is not an id", label, key);
        const char *content = json_string_value(json_object_get(v, "content"));
        if (!content) return um_err_set(err, UM_ERR_FORMAT, "%s: added_tokens_decoder[%s] has no content", label, key);
        /* tokens tokenizer.json already has are kept as they are; new ones are added like
         * transformers' add_tokens: with the vocabulary id when the string is in the vocabulary */
        int known = 0;
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].id == id || strcmp(t->added[i].content, content) == 0) known = 1;
        if (known) continue;
        int32_t vid = strmap_get(&t->bpe.vocab, content, strlen(content));
        if (vid >= 0) id = vid;
        else if (id < t->bpe.n_ids && t->bpe.piece[id])
            return um_err_set(err, UM_ERR_FORMAT, "%s: added token id %lld collides with vocabulary token", label, id);
        if (parse_added_entry(t, v, id, label, err) != 0) return -1;
    }
    return 0;
}

static int load_vocab_merges(tokenizer *t, const char *dir, const json_t *cfg, um_err *err) {
    char path[4096];
    json_t *vocab;
    if (load_json_path(dir, "vocab.json", 0, &vocab, err) != 0) return -1;
    path_join(path, sizeof path, dir, "vocab.json");
    int rc = parse_vocab(t, vocab, path, err);
    json_decref(vocab);
    if (rc != 0) return -1;
    path_join(path, sizeof path, dir, "merges.txt");
    char *text;
    size_t len;
    if (file_read_all(path, TOKENIZER_MAX_FILE, &text, &len, err) != 0) return -1;
    size_t pos = 0;
    uint32_t rank = 0;
    size_t line_no = 0;
    rc = 0;
    while (pos < len && rc == 0) {
        char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        size_t l = end - pos;
        const char *line = text + pos;
        line_no++;
        if (l && line[l - 1] == '\r') l--;
        if (l && !(line_no == 1 && l >= 8 && memcmp(line, "#version", 8) == 0)) {
            const char *sp = memchr(line, ' ', l);
            if (!sp || memchr(sp + 1, ' ', l - (size_t)(sp + 1 - line)))
                rc = um_err_set(err, UM_ERR_FORMAT, "%s:%zu: a merge line must be \"a b\"", path, line_no);
            else
                rc = add_merge_strings(t, line, (size_t)(sp - line), sp + 1, l - (size_t)(sp + 1 - line), rank++,
                                       path, err);
        }
        pos = end + 1;
    }
    free(text);
    if (rc != 0) return -1;
    /* added_tokens.json: {content: id}; flags come from tokenizer_config's added_tokens_decoder */
    json_t *added;
    if (load_json_path(dir, "added_tokens.json", 0, &added, err) != 0) return -1;
    if (added) {
        path_join(path, sizeof path, dir, "added_tokens.json");
        const char *key;
        json_t *v;
        const json_t *dec = json_object_get(cfg, "added_tokens_decoder");
        if (!json_is_object(added)) rc = fmt_err(err, path, "top level must be an object");
        json_object_foreach(added, key, v) {
            if (rc) break;
            if (!json_is_integer(v)) {
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: \"%.40s\" has no integer id", path, key);
                break;
            }
            char idkey[32];
            snprintf(idkey, sizeof idkey, "%lld", (long long)json_integer_value(v));
            const json_t *flags = json_object_get(dec, idkey);
            json_t *entry = json_is_object(flags) ? json_deep_copy(flags) : json_object();
            json_object_set_new(entry, "content", json_string(key));
            if (!json_object_get(entry, "normalized")) json_object_set_new(entry, "normalized", json_false());
            rc = parse_added_entry(t, entry, json_integer_value(v), path, err);
            json_decref(entry);
        }
        json_decref(added);
        if (rc != 0) return -1;
    }
    /* Qwen2 / Dream slow tokenizer: NFC, the Qwen2 regex, byte-level; GPT-2 style: its regex */
    const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
    if (cls && (strstr(cls, "GPT2") || strstr(cls, "Roberta"))) {
        t->pre[0] = (pretok){.kind = PT_BYTELEVEL, .behavior = SB_ISOLATED,
                             .add_prefix_space = json_bool(cfg, "add_prefix_space", 0)};
        if (uregex_compile(GPT2_PATTERN, sizeof GPT2_PATTERN - 1, &t->pre[0].re, err) != 0) return -1;
        t->n_pre = 1;
    } else {
        t->norm[t->n_norm++] = NORM_NFC;
        if (add_regex_step(t, QWEN2_PATTERN, sizeof QWEN2_PATTERN - 1, SB_ISOLATED, 0, "vocab.json", err) != 0)
            return -1;
        t->pre[t->n_pre++] = (pretok){.kind = PT_BYTELEVEL, .behavior = SB_ISOLATED};
    }
    t->bpe.byte_level = 1;
    return 0;
}

int tokenizer_load_dir(const char *dir, tokenizer **out, um_err *err) {
    *out = NULL;
    char path[4096], cfg_path[4096];
    path_join(cfg_path, sizeof cfg_path, dir, "tokenizer_config.json");
    json_t *cfg = NULL, *stm = NULL;
    tokenizer *t = NULL;
    int rc = -1;
    if (load_json_path(dir, "tokenizer_config.json", JSON_DECODE_INT_AS_REAL, &cfg, err) != 0) goto done;
    if (load_json_path(dir, "special_tokens_map.json", JSON_DECODE_INT_AS_REAL, &stm, err) != 0) goto done;
    path_join(path, sizeof path, dir, "tokenizer.json");
    if (file_exists(path)) {
        char *text;
        size_t len;
        if (file_read_all(path, TOKENIZER_MAX_FILE, &text, &len, err) != 0) goto done;
        json_error_t je;
        json_t *root = json_loadb(text, len, 0, &je);
        free(text);
        if (!root) {
            um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
            goto done;
        }
        t = tok_new();
        rc = parse_tokenizer_json(t, root, path, err);
        json_decref(root);
        if (rc != 0) goto done;
        rc = -1;
    } else {
        char vpath[4096], mpath[4096];
        path_join(vpath, sizeof vpath, dir, "vocab.json");
        path_join(mpath, sizeof mpath, dir, "merges.txt");
        if (!file_exists(vpath) && !file_exists(mpath)) {
            rc = 0; /* no tokenizer files */
            goto done;
        }
        if (!file_exists(vpath) || !file_exists(mpath)) {
            um_err_set(err, UM_ERR_IO, "%s: vocab.json and merges.txt must both be present", dir);
            goto done;
        }
        t = tok_new();
        if (load_vocab_merges(t, dir, cfg, err) != 0) goto done;
    }
    path_join(path, sizeof path, dir, "special_tokens_map.json");
    if (apply_config(t, stm, path, 0, err) != 0) goto done;
    if (apply_config(t, cfg, cfg_path, 1, err) != 0) goto done;
    if (tok_finish(t, dir, err) != 0) goto done;
    *out = t;
    t = NULL;
    rc = 0;
done:
    if (t) tok_destroy(t);
    json_decref(cfg);
    json_decref(stm);
    return rc;
}
