/*
 * unicode.c — UTF-8 decoding / lossy repair, category and case-fold lookups, NFC / NFD over the
 * generated tables in unicode_tables.c.
 *
 * Not here: regex matching (unicode_regex.c), NFKC/NFKD, locale-dependent behaviour.
 * Threads: pure functions; any thread.
 */
#include "text/unicode.h"

#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* generated tables (unicode_tables.c) */
extern const uint16_t ucat_stage1[];
extern const uint8_t  ucat_stage2[];
extern const uint16_t uccc_stage1[];
extern const uint8_t  uccc_stage2[];
extern const int      unicode_n_decomp;
extern const uint32_t unicode_decomp_cp[];
extern const uint32_t unicode_decomp_off[];
extern const uint32_t unicode_decomp_data[];
extern const int      unicode_n_comp;
extern const uint32_t unicode_comp[][3];
extern const int      unicode_n_nfc_unsafe;
extern const uint32_t unicode_nfc_unsafe[][2];
extern const int      unicode_n_fold;
extern const uint32_t unicode_fold_table[][2];

/* ---------------------------------------------------------------- UTF-8 */

/* Lead byte -> sequence length (0 = invalid lead) and the allowed range of the second byte. */
static int utf8_lead(uint8_t b, uint8_t *lo, uint8_t *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) *lo = 0xA0;
        if (b == 0xED) *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) *lo = 0x90;
        if (b == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

int32_t utf8_decode(const uint8_t *s, size_t len, size_t *adv) {
    uint8_t b = s[0], lo, hi;
    if (b < 0x80) {
        *adv = 1;
        return b;
    }
    int n = utf8_lead(b, &lo, &hi);
    if (n == 0) {
        *adv = 1;
        return -1;
    }
    uint32_t cp = b & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len || s[i] < lo || s[i] > hi) {
            *adv = (size_t)i;
            return -1;
        }
        lo = 0x80, hi = 0xBF;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *adv = (size_t)n;
    return (int32_t)cp;
}

int utf8_encode(uint32_t cp, char *buf) {
    uint8_t *o = (uint8_t *)buf;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    CHECK(cp <= 0x10FFFF);
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

int utf8_validate(const char *s, size_t len, size_t *bad_offset) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t adv;
        if (utf8_decode(u + i, len - i, &adv) < 0) {
            if (bad_offset) *bad_offset = i;
            return 0;
        }
        i += adv;
    }
    return 1;
}

char *utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    const uint8_t *u = (const uint8_t *)s;
    char *out = xmalloc(len * 3 + 1); /* each bad byte becomes at most 3 bytes */
    size_t i = 0, o = 0;
    while (i < len) {
        size_t adv;
        if (utf8_decode(u + i, len - i, &adv) < 0) {
            memcpy(out + o, UTF8_REPLACEMENT, 3);
            o += 3;
        } else {
            memcpy(out + o, s + i, adv);
            o += adv;
        }
        i += adv;
    }
    out[o] = 0;
    *out_len = o;
    return out;
}

int utf8_lossy_feed(utf8_lossy *st, uint8_t b, char *out) {
    int w = 0;
    if (st->n_pend) {
        uint8_t lo = 0x80, hi = 0xBF;
        if (st->n_pend == 1) utf8_lead(st->pend[0], &lo, &hi);
        if (b >= lo && b <= hi) {
            st->pend[st->n_pend++] = b;
            if (st->n_pend == st->need) {
                memcpy(out, st->pend, (size_t)st->need);
                w = st->need;
                st->n_pend = 0;
            }
            return w;
        }
        memcpy(out, UTF8_REPLACEMENT, 3); /* the held prefix is a maximal invalid subpart */
        w = 3;
        st->n_pend = 0;
    }
    uint8_t lo, hi;
    int n = utf8_lead(b, &lo, &hi);
    if (n == 1) {
        out[w++] = (char)b;
    } else if (n == 0) {
        memcpy(out + w, UTF8_REPLACEMENT, 3);
        w += 3;
    } else {
        st->pend[0] = b;
        st->n_pend = 1;
        st->need = n;
    }
    return w;
}

int utf8_lossy_flush(utf8_lossy *st, char *out) {
    if (!st->n_pend) return 0;
    st->n_pend = 0;
    memcpy(out, UTF8_REPLACEMENT, 3);
    return 3;
}

/* ---------------------------------------------------------------- properties */

enum ucat unicode_category(uint32_t cp) {
    if (cp >= 0x110000) return UCAT_CN;
    return (enum ucat)ucat_stage2[(size_t)ucat_stage1[cp >> 8] * 256 + (cp & 255)];
}

int unicode_is_letter(uint32_t cp) { return (UCAT_MASK_L >> unicode_category(cp)) & 1; }
int unicode_is_number(uint32_t cp) { return (UCAT_MASK_N >> unicode_category(cp)) & 1; }

int unicode_is_space(uint32_t cp) {
    if (cp < 0x80) return (cp >= 9 && cp <= 13) || cp == 32;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

int unicode_is_word(uint32_t cp) {
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) return 1;
    uint32_t m = UCAT_MASK_L | UCAT_MASK_M | (1u << UCAT_ND) | (1u << UCAT_NL) | (1u << UCAT_PC);
    return (m >> unicode_category(cp)) & 1;
}

int unicode_ccc(uint32_t cp) {
    if (cp < 0x300 || cp >= 0x110000) return 0;
    return uccc_stage2[(size_t)uccc_stage1[cp >> 8] * 256 + (cp & 255)];
}

uint32_t unicode_fold(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    int lo = 0, hi = unicode_n_fold - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (unicode_fold_table[mid][0] == cp) return unicode_fold_table[mid][1];
        if (unicode_fold_table[mid][0] < cp) lo = mid + 1;
        else hi = mid - 1;
    }
    return cp;
}

void unicode_fold_inverse(uint32_t f, void (*fn)(uint32_t cp, void *arg), void *arg) {
    for (int i = 0; i < unicode_n_fold; i++)
        if (unicode_fold_table[i][1] == f && unicode_fold_table[i][0] != f) fn(unicode_fold_table[i][0], arg);
}

/* ---------------------------------------------------------------- normalization */

#define HANGUL_SBASE  0xAC00u
#define HANGUL_LBASE  0x1100u
#define HANGUL_VBASE  0x1161u
#define HANGUL_TBASE  0x11A7u
#define HANGUL_LCOUNT 19u
#define HANGUL_VCOUNT 21u
#define HANGUL_TCOUNT 28u
#define HANGUL_NCOUNT (HANGUL_VCOUNT * HANGUL_TCOUNT)
#define HANGUL_SCOUNT (HANGUL_LCOUNT * HANGUL_NCOUNT)

static int nfc_unsafe(uint32_t cp) {
    if (cp < 0x300) return 0;
    int lo = 0, hi = unicode_n_nfc_unsafe - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < unicode_nfc_unsafe[mid][0]) hi = mid - 1;
        else if (cp > unicode_nfc_unsafe[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

typedef struct cpbuf {
    uint32_t *v;
    size_t n, cap;
} cpbuf;

static void cpbuf_push(cpbuf *b, uint32_t cp) {
    if (b->n == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 64;
        b->v = xrealloc(b->v, b->cap * sizeof *b->v);
    }
    b->v[b->n++] = cp;
}

static void decompose_one(cpbuf *b, uint32_t cp) {
    if (cp >= HANGUL_SBASE && cp < HANGUL_SBASE + HANGUL_SCOUNT) {
        uint32_t si = cp - HANGUL_SBASE;
        cpbuf_push(b, HANGUL_LBASE + si / HANGUL_NCOUNT);
        cpbuf_push(b, HANGUL_VBASE + (si % HANGUL_NCOUNT) / HANGUL_TCOUNT);
        if (si % HANGUL_TCOUNT) cpbuf_push(b, HANGUL_TBASE + si % HANGUL_TCOUNT);
        return;
    }
    if (cp >= 0xC0) {
        int lo = 0, hi = unicode_n_decomp - 1;
        while (lo <= hi) {
            int mid = (lo + hi) / 2;
            if (unicode_decomp_cp[mid] == cp) {
                uint32_t off = unicode_decomp_off[mid];
                for (uint32_t k = 0; k < (off & 7); k++) cpbuf_push(b, unicode_decomp_data[(off >> 3) + k]);
                return;
            }
            if (unicode_decomp_cp[mid] < cp) lo = mid + 1;
            else hi = mid - 1;
        }
    }
    cpbuf_push(b, cp);
}

/* UTF-8 -> canonically decomposed and reordered code points. Invalid bytes become U+FFFD. */
static void nfd_cps(const char *s, size_t len, cpbuf *b) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        size_t adv;
        int32_t cp = utf8_decode(u + i, len - i, &adv);
        decompose_one(b, cp < 0 ? 0xFFFD : (uint32_t)cp);
        i += adv;
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by ccc */
    for (size_t k = 1; k < b->n; k++) {
        int c = unicode_ccc(b->v[k]);
        if (c == 0) continue;
        size_t j = k;
        uint32_t cp = b->v[k];
        while (j > 0) {
            int pc = unicode_ccc(b->v[j - 1]);
            if (pc == 0 || pc <= c) break;
            b->v[j] = b->v[j - 1];
            j--;
        }
        b->v[j] = cp;
    }
}

static int64_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= HANGUL_LBASE && a < HANGUL_LBASE + HANGUL_LCOUNT && b >= HANGUL_VBASE &&
        b < HANGUL_VBASE + HANGUL_VCOUNT)
        return HANGUL_SBASE + ((a - HANGUL_LBASE) * HANGUL_VCOUNT + (b - HANGUL_VBASE)) * HANGUL_TCOUNT;
    if (a >= HANGUL_SBASE && a < HANGUL_SBASE + HANGUL_SCOUNT && (a - HANGUL_SBASE) % HANGUL_TCOUNT == 0 &&
        b > HANGUL_TBASE && b < HANGUL_TBASE + HANGUL_TCOUNT)
        return a + (b - HANGUL_TBASE);
    int lo = 0, hi = unicode_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const uint32_t *p = unicode_comp[mid];
        if (p[0] == a && p[1] == b) return p[2];
        if (p[0] < a || (p[0] == a && p[1] < b)) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static char *cps_to_utf8(const cpbuf *b, size_t *out_len) {
    char *out = xmalloc(b->n * 4 + 1);
    size_t o = 0;
    for (size_t i = 0; i < b->n; i++) o += (size_t)utf8_encode(b->v[i], out + o);
    out[o] = 0;
    *out_len = o;
    return out;
}

char *unicode_nfd(const char *s, size_t len, size_t *out_len) {
    cpbuf b = {0};
    nfd_cps(s, len, &b);
    char *out = cps_to_utf8(&b, out_len);
    free(b.v);
    return out;
}

/* Full NFC (decompose, reorder, compose) of one span. */
static void nfc_span(const char *s, size_t len, cpbuf *b) {
    b->n = 0;
    nfd_cps(s, len, b);
    if (b->n == 0) return;
    size_t starter = 0, w = 1;
    int last_class = unicode_ccc(b->v[0]) ? 256 : 0;
    for (size_t r = 1; r < b->n; r++) { /* canonical composition (UAX #15) */
        uint32_t ch = b->v[r];
        int cls = unicode_ccc(ch);
        int64_t comp = last_class == 256 ? -1 : compose_pair(b->v[starter], ch);
        if (comp >= 0 && (last_class < cls || last_class == 0)) {
            b->v[starter] = (uint32_t)comp;
            continue;
        }
        if (cls == 0) starter = w;
        last_class = cls;
        b->v[w++] = ch;
    }
    b->n = w;
}

/* Only the spans around code points that may change are normalized: a span runs from the last
 * "safe" code point (a starter that NFC leaves alone and that never composes with what precedes
 * it) before an unsafe one to the next safe code point. */
char *unicode_nfc(const char *s, size_t len, size_t *out_len) {
    const uint8_t *u = (const uint8_t *)s;
    char *out = NULL;
    size_t o = 0, cap = 0, flushed = 0, i = 0, last_safe = 0;
    int have_safe = 0;
    cpbuf b = {0};
    while (i < len) {
        size_t adv = 1;
        int32_t cp = u[i];
        if (u[i] >= 0xCC) cp = utf8_decode(u + i, len - i, &adv);
        if (u[i] < 0xCC || cp < 0 || !nfc_unsafe((uint32_t)cp)) {
            if (u[i] < 0x80 || (u[i] & 0xC0) == 0xC0) last_safe = i, have_safe = 1;
            i += adv;
            continue;
        }
        size_t start = have_safe && last_safe >= flushed ? last_safe : flushed;
        size_t j = i;
        while (j < len) {
            size_t a2 = 1;
            int32_t c2 = u[j];
            if (u[j] >= 0xCC) c2 = utf8_decode(u + j, len - j, &a2);
            if (u[j] < 0xCC || c2 < 0 || !nfc_unsafe((uint32_t)c2)) break;
            j += a2;
        }
        nfc_span(s + start, j - start, &b);
        size_t need = o + (start - flushed) + b.n * 4 + (len - j) + 1;
        if (need > cap) {
            cap = need + len / 4 + 64;
            out = xrealloc(out, cap);
        }
        memcpy(out + o, s + flushed, start - flushed);
        o += start - flushed;
        for (size_t k = 0; k < b.n; k++) o += (size_t)utf8_encode(b.v[k], out + o);
        flushed = i = j;
        have_safe = 0;
    }
    free(b.v);
    if (!out) {
        *out_len = len;
        return xstrndup(s, len);
    }
    if (o + (len - flushed) + 1 > cap) out = xrealloc(out, o + (len - flushed) + 1);
    memcpy(out + o, s + flushed, len - flushed);
    o += len - flushed;
    out[o] = 0;
    *out_len = o;
    return out;
}
