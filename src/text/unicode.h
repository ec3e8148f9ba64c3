/*
 * unicode.h — the Unicode a byte-exact tokenizer needs: strict UTF-8 decoding, lossy repair
 * (U+FFFD per maximal subpart, as Rust's String::from_utf8_lossy and WHATWG TextDecoder do),
 * general categories (\p{L}, \p{N}, ...), White_Space, simple case folding, NFC / NFD.
 *
 * Not here: regexes (unicode_regex.h), scripts, grapheme clusters, compatibility (NFKC/NFKD)
 * normalization. Tables come from tools/gen_unicode_tables.py (unicode_tables.c): categories and
 * case folding of Unicode 16.0 (the version HF tokenizers' regexes classify by), normalization
 * data of Unicode 14.0.
 *
 * Threads: pure functions over read-only tables; any thread.
 */
#ifndef UM_UNICODE_H
#define UM_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* General categories, in the order of the generated tables. */
enum ucat {
    UCAT_CN, UCAT_LU, UCAT_LL, UCAT_LT, UCAT_LM, UCAT_LO, UCAT_MN, UCAT_MC, UCAT_ME, UCAT_ND,
    UCAT_NL, UCAT_NO, UCAT_PC, UCAT_PD, UCAT_PS, UCAT_PE, UCAT_PI, UCAT_PF, UCAT_PO, UCAT_SM,
    UCAT_SC, UCAT_SK, UCAT_SO, UCAT_ZS, UCAT_ZL, UCAT_ZP, UCAT_CC, UCAT_CF, UCAT_CS, UCAT_CO,
    UCAT_COUNT
};
#define UCAT_MASK_L ((1u << UCAT_LU) | (1u << UCAT_LL) | (1u << UCAT_LT) | (1u << UCAT_LM) | (1u << UCAT_LO))
#define UCAT_MASK_M ((1u << UCAT_MN) | (1u << UCAT_MC) | (1u << UCAT_ME))
#define UCAT_MASK_N ((1u << UCAT_ND) | (1u << UCAT_NL) | (1u << UCAT_NO))

extern const char unicode_tables_version[];   /* Unicode version of the category data, e.g. "16.0.0" */

/* ---------------------------------------------------------------- UTF-8 */

#define UTF8_REPLACEMENT "\xEF\xBF\xBD"   /* U+FFFD */

/* Decode one code point from s[0..len) (len >= 1). Returns the code point and sets *adv to its byte
 * length, or returns -1 for an invalid / truncated sequence (overlong, surrogate, > U+10FFFF), with
 * *adv = length of the maximal subpart to replace by one U+FFFD (>= 1). */
int32_t utf8_decode(const uint8_t *s, size_t len, size_t *adv);
/* Encode cp (<= 0x10FFFF) into buf (4 bytes room); returns the byte count. */
int utf8_encode(uint32_t cp, char *buf);
/* 1 when s[0..len) is valid UTF-8; else 0 and *bad_offset = first offending byte. */
int utf8_validate(const char *s, size_t len, size_t *bad_offset);
/* Copy s with every maximal invalid subpart replaced by U+FFFD. Returns a malloc'd NUL-terminated
 * buffer; *out_len excludes the NUL. */
char *utf8_sanitize(const char *s, size_t len, size_t *out_len);

/* Byte-at-a-time lossy decoder state: feed bytes, get complete UTF-8 out. */
typedef struct utf8_lossy {
    uint8_t pend[4];   /* valid prefix of an incomplete character */
    int     n_pend;
    int     need;      /* total length of the character being collected */
} utf8_lossy;
/* Feed one byte; appends 0..8 bytes of output (completed char and/or U+FFFD) to out and returns
 * the count. */
int utf8_lossy_feed(utf8_lossy *st, uint8_t b, char *out);
/* Flush: an incomplete character becomes U+FFFD. Returns the byte count written to out (<= 3). */
int utf8_lossy_flush(utf8_lossy *st, char *out);

/* ---------------------------------------------------------------- properties */

enum ucat unicode_category(uint32_t cp);
int unicode_is_letter(uint32_t cp);   /* \p{L} */
int unicode_is_number(uint32_t cp);   /* \p{N} */
int unicode_is_space(uint32_t cp);    /* White_Space (regex \s) */
int unicode_is_word(uint32_t cp);     /* \w: L, M, Nd, Nl, Pc, ZWJ/ZWNJ */
int unicode_ccc(uint32_t cp);         /* canonical combining class */
uint32_t unicode_fold(uint32_t cp);   /* simple case fold (cp itself when none) */
/* Call fn for every code point whose simple fold equals f (excluding f itself). */
void unicode_fold_inverse(uint32_t f, void (*fn)(uint32_t cp, void *arg), void *arg);

/* ---------------------------------------------------------------- normalization */

/* NFC / NFD of valid UTF-8 s. Returns a malloc'd NUL-terminated buffer; *out_len excludes NUL. */
char *unicode_nfc(const char *s, size_t len, size_t *out_len);
char *unicode_nfd(const char *s, size_t len, size_t *out_len);

#endif /* UM_UNICODE_H */
