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

int bpe_train(const char *corpus, size_t len, const char *split_regex, int max_merges, int min_count,
              bpe_trained *out, um_err *err) {
    memset(out, 0, sizeof *out);
    uregex *re;
    if (uregex_compile(split_regex, strlen(split_regex), &re, err) != 0) return -1;
    /* unique words with counts */
    strmap wmap;
    strmap_init(&wmap, 4096);
    word *words = NULL;
    int nw = 0, capw = 0;
    size_t pos = 0, ms, me;
    int r;
    while ((r = uregex_find(re, corpus, len, pos, &ms, &me, err)) == 1) {
        /* Isolated: the gap before a match is a word too */
        for (int part = 0; part < 2; part++) {
            size_t a = part ? ms : pos, b = part ? me : ms;
            if (b <= a) continue;
            int32_t wi = strmap_get(&wmap, corpus + a, b - a);
            if (wi < 0) {
                if (nw == capw) {
                    capw = capw ? capw * 2 : 1024;
                    words = xrealloc(words, (size_t)capw * sizeof *words);
                }
                words[nw].n = (int)(b - a);
                words[nw].sym = xmalloc((b - a) * sizeof(int32_t));
                for (size_t k = 0; k < b - a; k++) words[nw].sym[k] = (uint8_t)corpus[a + k];
                words[nw].count = 0;
                strmap_put(&wmap, corpus + a, b - a, nw);
                wi = nw++;
            }
            words[wi].count++;
        }
        pos = me;
    }
    uregex_free(re);
    strmap_free(&wmap);
    if (r < 0) {
        for (int i = 0; i < nw; i++) free(words[i].sym);
        free(words);
        return -1;
    }

    int cap_tok = 256 + max_merges;
    out->token = xcalloc((size_t)cap_tok, sizeof *out->token);
    out->merge = xcalloc((size_t)(max_merges ? max_merges : 1), sizeof *out->merge);
    for (int b = 0; b < 256; b++) out->token[b] = byte_token((uint8_t)b);
    out->n_tokens = 256;
    strmap tokmap;
    strmap_init(&tokmap, (size_t)cap_tok);
    for (int b = 0; b < 256; b++) strmap_put(&tokmap, out->token[b], strlen(out->token[b]), b);

    size_t cap_pairs = 1 << 16;
    pair_ent *pairs = xmalloc(cap_pairs * sizeof *pairs);
    while (out->n_merges < max_merges) {
        for (size_t i = 0; i < cap_pairs; i++) pairs[i].key = UINT64_MAX;
        size_t npairs = 0;
        for (int w = 0; w < nw; w++) {
            for (int k = 0; k + 1 < words[w].n; k++) {
                uint64_t key = (uint64_t)(uint32_t)words[w].sym[k] << 32 | (uint32_t)words[w].sym[k + 1];
                if ((npairs + 1) * 2 > cap_pairs) { /* grow and rehash */
                    pair_ent *old = pairs;
                    size_t oldcap = cap_pairs;
                    cap_pairs *= 2;
                    pairs = xmalloc(cap_pairs * sizeof *pairs);
                    for (size_t i = 0; i < cap_pairs; i++) pairs[i].key = UINT64_MAX;
                    for (size_t i = 0; i < oldcap; i++) {
                        if (old[i].key == UINT64_MAX) continue;
                        size_t j = (size_t)((old[i].key * 0x9E3779B97F4A7C15ull) >> 20) & (cap_pairs - 1);
                        while (pairs[j].key != UINT64_MAX) j = (j + 1) & (cap_pairs - 1);
                        pairs[j] = old[i];
                    }
                    free(old);
                }
                size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (cap_pairs - 1);
                while (pairs[j].key != UINT64_MAX && pairs[j].key != key) j = (j + 1) & (cap_pairs - 1);
                if (pairs[j].key == UINT64_MAX) pairs[j].key = key, pairs[j].count = 0, npairs++;
                pairs[j].count += words[w].count;
            }
        }
        uint64_t best = UINT64_MAX;
        int64_t best_count = 0;
        for (size_t i = 0; i < cap_pairs; i++) {
            if (pairs[i].key == UINT64_MAX) continue;
            if (pairs[i].count > best_count || (pairs[i].count == best_count && pairs[i].key < best))
                best = pairs[i].key, best_count = pairs[i].count;
        }
        if (best == UINT64_MAX || best_count < min_count) break;
        int32_t a = (int32_t)(best >> 32), b = (int32_t)(best & 0xFFFFFFFFu);
        size_t la = strlen(out->token[a]), lb = strlen(out->token[b]);
        char *s = xmalloc(la + lb + 1);
        memcpy(s, out->token[a], la);
        memcpy(s + la, out->token[b], lb + 1);
        int32_t id = strmap_get(&tokmap, s, la + lb);
        if (id < 0) {
            id = out->n_tokens++;
            out->token[id] = s;
            strmap_put(&tokmap, s, la + lb, id);
        } else {
            free(s); /* the same string reached through another pair: merge into the existing token */
        }
        out->merge[out->n_merges][0] = a;
        out->merge[out->n_merges][1] = b;
        out->n_merges++;
        for (int w = 0; w < nw; w++) {
            int o = 0;
            for (int k = 0; k < words[w].n; k++) {
                if (k + 1 < words[w].n && words[w].sym[k] == a && words[w].sym[k + 1] == b) {
                    words[w].sym[o++] = id;
                    k++;
                } else {
                    words[w].sym[o++] = words[w].sym[k];
                }
            }
            words[w].n = o;
        }
    }
    free(pairs);
    strmap_free(&tokmap);
    for (int i = 0; i < nw; i++) free(words[i].sym);
    free(words);
    return 0;
}

void bpe_trained_free(bpe_trained *t) {
    for (int i = 0; i < t->n_tokens; i++) free(t->token[i]);
    free(t->token);
    free(t->merge);
    memset(t, 0, sizeof *t);
}
