/*
 * bpe_train.c — deterministic byte-level BPE training over a small corpus (see bpe_train.h).
 * Words are pre-tokenized with unicode_regex (Isolated splits), deduplicated with counts; each
 * round recounts pairs over the unique words (fine for corpora of some kilobytes).
 *
 * Not here: writing files (bpe_builtin.c). Threads: any.
 */
#include "text/bpe_train.h"

#include <stdlib.h>
#include <string.h>

#include "text/bpe.h"
#include "text/unicode_regex.h"
#include "util/log.h"

typedef struct word {
    int32_t *sym;
    int      n;
    int64_t  count;
} word;

typedef struct pair_ent {
    uint64_t key;             /* UINT64_MAX = empty */
    int64_t  count;
} pair_ent;

static char *byte_token(uint8_t b) {
    uint32_t cp = bpe_byte_to_cp(b);
    char *s = xmalloc(3);
    if (cp < 0x80) s[0] = (char)cp, s[1] = 0;
    else s[0] = (char)(0xC0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3F)), s[2] = 0;
    return s;
}

/* The corpus's unique words with their counts. */
typedef struct word_set {
    word *v;     /* [n], capacity cap */
    int   n, cap;
} word_set;

/* Frees the words and their symbols. */
static void word_set_free(word_set *ws) {
    for (int i = 0; i < ws->n; i++) free(ws->v[i].sym);
    free(ws->v);
}

/* Counts one occurrence of s[0..n): a new word starts as its bytes. */
static void word_set_add(word_set *ws, strmap *wmap, const char *s, size_t n) {
    int32_t wi = strmap_get(wmap, s, n);
    if (wi < 0) {
        if (ws->n == ws->cap) {
            ws->cap = ws->cap ? ws->cap * 2 : 1024;
            ws->v = xrealloc(ws->v, (size_t)ws->cap * sizeof *ws->v);
        }
        word *w = &ws->v[ws->n];
        w->n = (int)n;
        w->sym = xmalloc(n * sizeof(int32_t));
        for (size_t k = 0; k < n; k++) w->sym[k] = (uint8_t)s[k];
        w->count = 0;
        strmap_put(wmap, s, n, ws->n);
        wi = ws->n++;
    }
    ws->v[wi].count++;
}

/* Splits the corpus with split_regex (Isolated: matches and the gaps between them are words) into
 * ws. 0, or -1 + err (ws freed). */
static int split_words(const char *corpus, size_t len, const char *split_regex, word_set *ws, um_err *err) {
    uregex *re;
    if (uregex_compile(split_regex, strlen(split_regex), &re, err) != 0) return -1;
    strmap wmap;
    strmap_init(&wmap, 4096);
    size_t pos = 0, ms, me;
    int r;
    while ((r = uregex_find(re, corpus, len, pos, &ms, &me, err)) == 1) {
        /* Isolated: the gap before a match is a word too */
        for (int part = 0; part < 2; part++) {
            size_t a = part ? ms : pos, b = part ? me : ms;
            if (b > a) word_set_add(ws, &wmap, corpus + a, b - a);
        }
        pos = me;
    }
    uregex_free(re);
    strmap_free(&wmap);
    if (r < 0) {
        word_set_free(ws);
        return -1;
    }
    return 0;
}

/* Open-addressing counts of adjacent symbol pairs (key = left << 32 | right). */
typedef struct pair_table {
    pair_ent *v;    /* [cap], cap a power of two */
    size_t    cap, n;
} pair_table;

/* Slot of key in a table of cap entries (linear probing from its hash). */
static size_t pair_slot(const pair_ent *v, size_t cap, uint64_t key) {
    size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
    while (v[j].key != UINT64_MAX && v[j].key != key) j = (j + 1) & (cap - 1);
    return j;
}

/* Doubles the table and rehashes its entries. */
static void pair_table_grow(pair_table *t) {
    pair_ent *old = t->v;
    size_t oldcap = t->cap;
    t->cap *= 2;
    t->v = xmalloc(t->cap * sizeof *t->v);
    for (size_t i = 0; i < t->cap; i++) t->v[i].key = UINT64_MAX;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].key != UINT64_MAX) t->v[pair_slot(t->v, t->cap, old[i].key)] = old[i];
    free(old);
}

/* Empties the table and counts every adjacent pair of every word (weighted by the word's count). */
static void pair_table_count(pair_table *t, const word_set *ws) {
    for (size_t i = 0; i < t->cap; i++) t->v[i].key = UINT64_MAX;
    t->n = 0;
    for (int w = 0; w < ws->n; w++) {
        const word *wd = &ws->v[w];
        for (int k = 0; k + 1 < wd->n; k++) {
            uint64_t key = (uint64_t)(uint32_t)wd->sym[k] << 32 | (uint32_t)wd->sym[k + 1];
            if ((t->n + 1) * 2 > t->cap) pair_table_grow(t);
            size_t j = pair_slot(t->v, t->cap, key);
            if (t->v[j].key == UINT64_MAX) t->v[j].key = key, t->v[j].count = 0, t->n++;
            t->v[j].count += wd->count;
        }
    }
}

/* The most frequent pair (ties: the lowest key), UINT64_MAX when there is none; its count in *count. */
static uint64_t pair_table_best(const pair_table *t, int64_t *count) {
    uint64_t best = UINT64_MAX;
    int64_t best_count = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->v[i].key == UINT64_MAX) continue;
        if (t->v[i].count > best_count || (t->v[i].count == best_count && t->v[i].key < best))
            best = t->v[i].key, best_count = t->v[i].count;
    }
    *count = best_count;
    return best;
}

/* Records the merge (a, b) in out; returns the id of the merged token (new, or an existing one with
 * the same string). */
static int32_t merge_record(bpe_trained *out, strmap *tokmap, int32_t a, int32_t b) {
    size_t la = strlen(out->token[a]), lb = strlen(out->token[b]);
    char *s = xmalloc(la + lb + 1);
    memcpy(s, out->token[a], la);
    memcpy(s + la, out->token[b], lb + 1);
    int32_t id = strmap_get(tokmap, s, la + lb);
    if (id < 0) {
        id = out->n_tokens++;
        out->token[id] = s;
        strmap_put(tokmap, s, la + lb, id);
    } else {
        free(s); /* the same string reached through another pair: merge into the existing token */
    }
    out->merge[out->n_merges][0] = a;
    out->merge[out->n_merges][1] = b;
    out->n_merges++;
    return id;
}

/* Replaces every (a, b) in every word by id, left to right. */
static void merge_apply(word_set *ws, int32_t a, int32_t b, int32_t id) {
    for (int w = 0; w < ws->n; w++) {
        word *wd = &ws->v[w];
        int o = 0;
        for (int k = 0; k < wd->n; k++) {
            if (k + 1 < wd->n && wd->sym[k] == a && wd->sym[k + 1] == b) {
                wd->sym[o++] = id;
                k++;
            } else {
                wd->sym[o++] = wd->sym[k];
            }
        }
        wd->n = o;
    }
}

int bpe_train(const char *corpus, size_t len, const char *split_regex, int max_merges, int min_count,
              bpe_trained *out, um_err *err) {
    memset(out, 0, sizeof *out);
    /* unique words with counts */
    word_set ws = {0};
    if (split_words(corpus, len, split_regex, &ws, err) != 0) return -1;

    int cap_tok = 256 + max_merges;
    out->token = xcalloc((size_t)cap_tok, sizeof *out->token);
    out->merge = xcalloc((size_t)(max_merges ? max_merges : 1), sizeof *out->merge);
    for (int b = 0; b < 256; b++) out->token[b] = byte_token((uint8_t)b);
    out->n_tokens = 256;
    strmap tokmap;
    strmap_init(&tokmap, (size_t)cap_tok);
    for (int b = 0; b < 256; b++) strmap_put(&tokmap, out->token[b], strlen(out->token[b]), b);

    pair_table pt = {.cap = 1 << 16};
    pt.v = xmalloc(pt.cap * sizeof *pt.v);
    while (out->n_merges < max_merges) {
        pair_table_count(&pt, &ws);
        int64_t best_count;
        uint64_t best = pair_table_best(&pt, &best_count);
        if (best == UINT64_MAX || best_count < min_count) break;
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xFFFFFFFFu);
        merge_apply(&ws, a, b, merge_record(out, &tokmap, a, b));
    }
    free(pt.v);
    strmap_free(&tokmap);
    word_set_free(&ws);
    return 0;
}

void bpe_trained_free(bpe_trained *t) {
    for (int i = 0; i < t->n_tokens; i++) free(t->token[i]);
    free(t->token);
    free(t->merge);
    memset(t, 0, sizeof *t);
}
