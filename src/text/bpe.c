/*
 * bpe.c — BPE vocabulary, merge table, merge loop and word cache (see bpe.h).
 *
 * Not here: anything before the word boundary (added tokens, normalizers, regex splits).
 * Threads: encode may run concurrently; the cache is guarded by its own mutex.
 */
#include "text/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* ================================================================ strmap */

uint32_t strmap_hash(const char *s, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ len;
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, u + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    uint64_t t = 0;
    for (size_t k = 0; i + k < len; k++) t |= (uint64_t)u[i + k] << (8 * k);
    h = (h ^ t) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

void strmap_init(strmap *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap *= 2;
    m->slots = xcalloc(cap, sizeof *m->slots);
    m->cap = cap;
    m->n = 0;
}

void strmap_free(strmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static void strmap_grow(strmap *m) {
    strmap_entry *old = m->slots;
    size_t oldcap = m->cap;
    m->cap *= 2;
    m->slots = xcalloc(m->cap, sizeof *m->slots);
    for (size_t i = 0; i < oldcap; i++) {
        if (!old[i].key) continue;
        size_t j = old[i].hash & (m->cap - 1);
        while (m->slots[j].key) j = (j + 1) & (m->cap - 1);
        m->slots[j] = old[i];
    }
    free(old);
}

int32_t strmap_put(strmap *m, const char *key, size_t len, int32_t val) {
    if ((m->n + 1) * 4 > m->cap * 3) strmap_grow(m);
    uint32_t h = strmap_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        strmap_entry *e = &m->slots[j];
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) {
            int32_t prev = e->val;
            e->val = val;
            e->key = key;
            return prev;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->slots[j] = (strmap_entry){key, (uint32_t)len, h, val};
    m->n++;
    return -1;
}

int32_t strmap_get(const strmap *m, const char *key, size_t len) {
    if (!m->cap) return -1;
    uint32_t h = strmap_hash(key, len);
    size_t j = h & (m->cap - 1);
    while (m->slots[j].key) {
        const strmap_entry *e = &m->slots[j];
        if (e->hash == h && e->len == len && memcmp(e->key, key, len) == 0) return e->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

/* ================================================================ idvec */

void idvec_push(idvec *iv, int32_t id) {
    if (iv->n == iv->cap) {
        iv->cap = iv->cap ? iv->cap * 2 : 64;
        iv->v = xrealloc(iv->v, iv->cap * sizeof *iv->v);
    }
    iv->v[iv->n++] = id;
}

void idvec_append(idvec *iv, const int32_t *ids, size_t n) {
    if (n == 0) return; /* iv->v may still be NULL: no pointer arithmetic / memcpy on it */
    if (iv->n + n > iv->cap) {
        while (iv->n + n > iv->cap) iv->cap = iv->cap ? iv->cap * 2 : 64;
        iv->v = xrealloc(iv->v, iv->cap * sizeof *iv->v);
    }
    memcpy(iv->v + iv->n, ids, n * sizeof *ids);
    iv->n += n;
}

/* ================================================================ byte-level map */

uint32_t bpe_byte_to_cp(uint8_t b) {
    /* printable bytes map to themselves; the rest to 256 + k in byte order */
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    uint32_t k = 0;
    for (uint32_t x = 0; x < b; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
    return 256 + k;
}

int bpe_cp_to_byte(uint32_t cp) {
    if ((cp >= '!' && cp <= '~') || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) return (int)cp;
    if (cp < 256 || cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    for (uint32_t x = 0; x < 256; x++)
        if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE) && k-- == 0) return (int)x;
    return -1;
}

/* ================================================================ cache */

#define CACHE_SLOTS   32768u
#define CACHE_KEY_MAX 24
#define CACHE_IDS_MAX 8

typedef struct cache_slot { /* one 64-byte cache line */
    uint32_t hash;
    uint8_t  klen;            /* 0 = empty */
    uint8_t  nids;
    uint8_t  pad[2];
    char     key[CACHE_KEY_MAX];
    int32_t  ids[CACHE_IDS_MAX];
} cache_slot;

struct bpe_cache {
    pthread_mutex_t mu;
    /* --- mu lock { */
    cache_slot slots[CACHE_SLOTS];
    /* } mu lock --- */
};

/* ================================================================ pair lookup cache */

/* Merge lookups hit an MB-sized hash table in DRAM; words share most of their pairs, so each
 * thread keeps a small direct-mapped cache of recent lookups (hits and misses), tagged with the
 * model's uid so no clearing is needed when a thread switches tokenizers. */
#define PAIR_SLOTS 16384u

typedef struct pair_slot {
    uint64_t key;
    uint32_t owner;           /* bpe_model.uid; 0 = empty */
    uint32_t rank;            /* UINT32_MAX = no merge */
    int32_t  id;
    int32_t  pad;
} pair_slot;

static pthread_key_t pair_key;
static pthread_once_t pair_once = PTHREAD_ONCE_INIT;
static uint32_t next_uid;     /* atomic */

static void pair_key_init(void) { CHECK(pthread_key_create(&pair_key, free) == 0); }

static pair_slot *pair_cache(void) {
    pthread_once(&pair_once, pair_key_init);
    pair_slot *c = pthread_getspecific(pair_key);
    if (!c) {
        c = xcalloc(PAIR_SLOTS, sizeof *c);
        CHECK(pthread_setspecific(pair_key, c) == 0);
    }
    return c;
}

/* ================================================================ model */

void bpe_init(bpe_model *b) {
    memset(b, 0, sizeof *b);
    strmap_init(&b->vocab, 1024);
    b->unk_id = -1;
    for (int i = 0; i < 256; i++) b->byte_id[i] = -1;
}

void bpe_free(bpe_model *b) {
    for (int32_t i = 0; i < b->n_ids; i++) free(b->piece[i]);
    free(b->piece);
    free(b->piece_len);
    strmap_free(&b->vocab);
    free(b->merges);
    if (b->cache) {
        pthread_mutex_destroy(&b->cache->mu);
        free(b->cache);
    }
    free(b->byte_pairs);
    memset(b, 0, sizeof *b);
}

int bpe_add_piece(bpe_model *b, int32_t id, const char *piece, size_t len) {
    CHECK(id >= 0);
    if (id >= b->n_ids) {
        int32_t n = b->n_ids ? b->n_ids : 1024;
        while (n <= id) n *= 2;
        b->piece = xrealloc(b->piece, (size_t)n * sizeof *b->piece);
        b->piece_len = xrealloc(b->piece_len, (size_t)n * sizeof *b->piece_len);
        memset(b->piece + b->n_ids, 0, (size_t)(n - b->n_ids) * sizeof *b->piece);
        memset(b->piece_len + b->n_ids, 0, (size_t)(n - b->n_ids) * sizeof *b->piece_len);
        b->n_ids = n; /* trimmed to max id + 1 in bpe_finish */
    }
    if (b->piece[id]) return -1;
    b->piece[id] = xstrndup(piece, len);
    b->piece_len[id] = (uint32_t)len;
    strmap_put(&b->vocab, b->piece[id], len, id);
    return 0;
}

static inline uint64_t merge_key(int32_t l, int32_t r) { return (uint64_t)(uint32_t)l << 32 | (uint32_t)r; }

static inline size_t merge_slot(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void merges_grow(bpe_model *b) {
    bpe_merge *old = b->merges;
    size_t oldcap = b->cap_merges;
    b->cap_merges = oldcap ? oldcap * 2 : 1024;
    b->merges = xmalloc(b->cap_merges * sizeof *b->merges);
    for (size_t i = 0; i < b->cap_merges; i++) b->merges[i].key = UINT64_MAX;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i].key == UINT64_MAX) continue;
        size_t j = merge_slot(old[i].key, b->cap_merges);
        while (b->merges[j].key != UINT64_MAX) j = (j + 1) & (b->cap_merges - 1);
        b->merges[j] = old[i];
    }
    free(old);
}

void bpe_add_merge(bpe_model *b, int32_t left, int32_t right, int32_t merged, uint32_t rank) {
    if ((b->n_merges + 1) * 2 > b->cap_merges) merges_grow(b);
    uint64_t key = merge_key(left, right);
    size_t j = merge_slot(key, b->cap_merges);
    while (b->merges[j].key != UINT64_MAX) {
        if (b->merges[j].key == key) {
            b->merges[j].rank = rank;
            b->merges[j].id = merged;
            return;
        }
        j = (j + 1) & (b->cap_merges - 1);
    }
    b->merges[j] = (bpe_merge){key, rank, merged};
    b->n_merges++;
}

const bpe_merge *bpe_merge_get(const bpe_model *b, int32_t left, int32_t right) {
    if (!b->cap_merges) return NULL;
    uint64_t key = merge_key(left, right);
    size_t j = merge_slot(key, b->cap_merges);
    for (;;) {
        const bpe_merge *m = &b->merges[j];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
        j = (j + 1) & (b->cap_merges - 1);
    }
}

void bpe_finish(bpe_model *b) {
    if (!b->uid) b->uid = __atomic_add_fetch(&next_uid, 1, __ATOMIC_RELAXED);
    int32_t n = b->n_ids;
    while (n > 0 && !b->piece[n - 1]) n--;
    b->n_ids = n;
    for (int i = 0; i < 256; i++) {
        char buf[4];
        uint32_t cp = bpe_byte_to_cp((uint8_t)i);
        int len;
        if (cp < 0x80) buf[0] = (char)cp, len = 1;
        else buf[0] = (char)(0xC0 | cp >> 6), buf[1] = (char)(0x80 | (cp & 0x3F)), len = 2;
        b->byte_id[i] = strmap_get(&b->vocab, buf, (size_t)len);
    }
    if (b->byte_level) {
        int all = 1;
        for (int i = 0; i < 256; i++) all &= b->byte_id[i] >= 0;
        free(b->byte_pairs);
        b->byte_pairs = NULL;
        if (all) { /* every byte has a token: initial pair lookups go through a dense table */
            b->byte_pairs = xmalloc(65536 * sizeof *b->byte_pairs);
            for (int x = 0; x < 256; x++)
                for (int y = 0; y < 256; y++) {
                    const bpe_merge *m = bpe_merge_get(b, b->byte_id[x], b->byte_id[y]);
                    b->byte_pairs[x << 8 | y] = m ? (bpe_pair){m->rank, m->id} : (bpe_pair){UINT32_MAX, -1};
                }
        }
    }
    if (!b->cache) {
        b->cache = xcalloc(1, sizeof *b->cache);
        pthread_mutex_init(&b->cache->mu, NULL);
    }
}

/* ---------------------------------------------------------------- merge loop */

typedef struct sym {
    int32_t id;               /* -1 = removed (merged into its left neighbour) */
    int32_t prev, next;       /* -1 = none */
} sym;

/* A queued merge: (rank, position), smallest rank first, then leftmost. HF also stores the new
 * id and skips entries whose current pair no longer merges into it; since a merged token's string
 * is the concatenation of its pair's strings and vocabulary strings are unique, that new id is
 * produced only by the same pair, i.e. the same rank, so "current pair has this rank" is the same
 * test and the id need not be stored (8 bytes per entry: long words stay affordable). */
typedef struct heap_ent {
    uint32_t rank;
    uint32_t pos;
} heap_ent;

static inline int heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

typedef struct heap {
    heap_ent *v;
    size_t n, cap;
} heap;

/* A 4-ary min-heap: half the depth of a binary heap, and a node's children share a cache line
 * (what matters for words of millions of bytes). */
static void heap_push(heap *h, heap_ent e) {
    if (h->n == h->cap) {
        h->cap = h->cap * 2;
        h->v = xrealloc(h->v, h->cap * sizeof *h->v);
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (!heap_less(&e, &h->v[p])) break;
        h->v[i] = h->v[p];
        i = p;
    }
    h->v[i] = e;
}

static heap_ent heap_pop(heap *h) {
    heap_ent top = h->v[0];
    heap_ent last = h->v[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 4 * i + 1, best = i;
        const heap_ent *bv = &last;
        size_t end = c + 4 < n ? c + 4 : n;
        for (; c < end; c++)
            if (heap_less(&h->v[c], bv)) best = c, bv = &h->v[c];
        if (best == i) break;
        h->v[i] = h->v[best];
        i = best;
    }
    if (n) h->v[i] = last;
    return top;
}

/* bpe_merge_get through the thread's pair cache: returns the rank (UINT32_MAX = none), sets *id. */
static inline uint32_t pair_lookup(const bpe_model *b, pair_slot *pc, int32_t l, int32_t r, int32_t *id) {
    uint64_t key = merge_key(l, r);
    pair_slot *ps = &pc[(size_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (PAIR_SLOTS - 1)];
    if (ps->owner == b->uid && ps->key == key) {
        *id = ps->id;
        return ps->rank;
    }
    const bpe_merge *m = bpe_merge_get(b, l, r);
    ps->owner = b->uid, ps->key = key;
    ps->rank = m ? m->rank : UINT32_MAX;
    ps->id = m ? m->id : -1;
    *id = ps->id;
    return ps->rank;
}

static inline void try_push(const bpe_model *b, pair_slot *pc, heap *h, const sym *s, int32_t pos) {
    int32_t id;
    uint32_t rank = pair_lookup(b, pc, s[pos].id, s[s[pos].next].id, &id);
    if (rank != UINT32_MAX) heap_push(h, (heap_ent){rank, (uint32_t)pos});
}

#define STACK_SYMS 64

/* Initial symbols of a word; returns the count. Unknown characters become unk (fused when asked)
 * or are dropped, as HF's BPE::merge_word does. */
static size_t word_symbols(const bpe_model *b, const char *w, size_t len, sym *s) {
    size_t n = 0;
    int pending_unk = 0;
    const uint8_t *u = (const uint8_t *)w;
    size_t i = 0;
    while (i < len) {
        int32_t id;
        size_t adv = 1;
        if (b->byte_level) {
            id = b->byte_id[u[i]];
        } else {
            uint8_t c = u[i];
            adv = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            if (i + adv > len) adv = len - i;
            id = strmap_get(&b->vocab, w + i, adv);
        }
        i += adv;
        if (id < 0) {
            if (b->unk_id < 0) continue;
            if (b->fuse_unk && pending_unk) continue;
            pending_unk = 1;
            id = b->unk_id;
        } else {
            pending_unk = 0;
        }
        s[n].id = id;
        n++;
    }
    return n;
}

static void merge_word(const bpe_model *b, const char *w, size_t len, idvec *out) {
    sym stack_syms[STACK_SYMS];
    heap_ent stack_heap[STACK_SYMS * 2];
    sym *s = len <= STACK_SYMS ? stack_syms : xmalloc(len * sizeof *s);
    size_t n = word_symbols(b, w, len, s);
    if (n == 0) goto done;
    for (size_t i = 0; i < n; i++) s[i].prev = (int32_t)i - 1, s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    pair_slot *pc = pair_cache();
    heap h;
    if (n <= STACK_SYMS) h = (heap){stack_heap, 0, STACK_SYMS * 2};
    else h = (heap){xmalloc(n * sizeof(heap_ent)), 0, n};
    if (b->byte_pairs && n == len) { /* byte-level word: initial pairs from the dense byte-pair table */
        const uint8_t *u = (const uint8_t *)w;
        for (size_t i = 0; i + 1 < n; i++) {
            const bpe_pair *bp = &b->byte_pairs[(size_t)u[i] << 8 | u[i + 1]];
            if (bp->rank != UINT32_MAX) heap_push(&h, (heap_ent){bp->rank, (uint32_t)i});
        }
    } else {
        for (size_t i = 0; i + 1 < n; i++) try_push(b, pc, &h, s, (int32_t)i);
    }
    while (h.n) {
        heap_ent top = heap_pop(&h);
        sym *cur = &s[top.pos];
        if (cur->id < 0 || cur->next < 0) continue;
        int32_t nx = cur->next, new_id;
        if (pair_lookup(b, pc, cur->id, s[nx].id, &new_id) != top.rank) continue; /* expired entry */
        cur->id = new_id;
        cur->next = s[nx].next;
        s[nx].id = -1;
        if (cur->next >= 0) s[cur->next].prev = (int32_t)top.pos;
        if (h.v == stack_heap && h.n + 2 > h.cap) { /* move to the heap before it could overflow */
            heap_ent *v = xmalloc(h.cap * 2 * sizeof *v);
            memcpy(v, stack_heap, h.n * sizeof *v);
            h.v = v;
            h.cap *= 2;
        }
        if (cur->prev >= 0) try_push(b, pc, &h, s, cur->prev);
        if (cur->next >= 0) try_push(b, pc, &h, s, (int32_t)top.pos);
    }
    if (h.v != stack_heap) free(h.v);
    for (int32_t i = 0; i >= 0; i = s[i].next) idvec_push(out, s[i].id);
done:
    if (s != stack_syms) free(s);
}

/* ignore_merges: the whole word's (byte-mapped) string looked up directly. */
static int32_t whole_word_id(const bpe_model *b, const char *w, size_t len) {
    if (!b->byte_level) return strmap_get(&b->vocab, w, len);
    char stackbuf[256];
    char *buf = len * 2 <= sizeof stackbuf ? stackbuf : xmalloc(len * 2);
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        uint32_t cp = bpe_byte_to_cp((uint8_t)w[i]);
        if (cp < 0x80) buf[o++] = (char)cp;
        else buf[o++] = (char)(0xC0 | cp >> 6), buf[o++] = (char)(0x80 | (cp & 0x3F));
    }
    int32_t id = strmap_get(&b->vocab, buf, o);
    if (buf != stackbuf) free(buf);
    return id;
}

void bpe_encode_word(const bpe_model *b, const char *w, size_t len, idvec *out) {
    if (len == 0) return;
    if (b->ignore_merges) {
        int32_t id = whole_word_id(b, w, len);
        if (id >= 0) {
            idvec_push(out, id);
            return;
        }
    }
    if (len > CACHE_KEY_MAX) {
        merge_word(b, w, len, out);
        return;
    }
    uint32_t h = strmap_hash(w, len);
    cache_slot *slot = &b->cache->slots[h & (CACHE_SLOTS - 1)];
    pthread_mutex_lock(&b->cache->mu);
    /* --- mu lock { */
    if (slot->klen == len && slot->hash == h && memcmp(slot->key, w, len) == 0) {
        idvec_append(out, slot->ids, slot->nids);
        pthread_mutex_unlock(&b->cache->mu);
        return;
    }
    /* } mu lock --- */
    pthread_mutex_unlock(&b->cache->mu);
    size_t start = out->n;
    merge_word(b, w, len, out);
    size_t nids = out->n - start;
    if (nids <= CACHE_IDS_MAX) {
        pthread_mutex_lock(&b->cache->mu);
        /* --- mu lock { */
        slot->hash = h;
        slot->klen = (uint8_t)len;
        slot->nids = (uint8_t)nids;
        memcpy(slot->key, w, len);
        if (nids) memcpy(slot->ids, out->v + start, nids * sizeof *out->v); /* a word may give no ids */
        /* } mu lock --- */
        pthread_mutex_unlock(&b->cache->mu);
    }
}
