/*
 * unicode_regex.h — a small backtracking regex engine with the semantics of Oniguruma (what HF
 * tokenizers uses) for the subset pre-tokenizer patterns need: alternation, groups (?:..) (?i:..),
 * lookahead (?=..) (?!..), greedy / lazy / possessive quantifiers (? * + {n,m}, ?? *? ?+ ++ *+),
 * classes [..] [^..] with ranges, \s \S \d \D \w \W \p{..} \P{..} (general categories), '.',
 * escapes \r \n \t \f \v \xHH \x{..} \uHHHH.
 *
 * Not here: anchors (^ $ \b \A \z), back-references, lookbehind, scripts (\p{Han}), named groups:
 * those fail to compile with UM_ERR_UNSUPPORTED naming the construct.
 *
 * Threads: a compiled regex is immutable; matching uses only the caller's stack; any thread.
 */
#ifndef UM_UNICODE_REGEX_H
#define UM_UNICODE_REGEX_H

#include <stddef.h>

#include "util/err.h"

typedef struct uregex uregex;

/* Compile pattern[0..len) (UTF-8) into *out (caller frees with uregex_free). -1 + err:
 * UM_ERR_FORMAT for a malformed pattern, UM_ERR_UNSUPPORTED for a construct listed above. */
int  uregex_compile(const char *pattern, size_t len, uregex **out, um_err *err);
/* Free a compiled regex (NULL: no-op). */
void uregex_free(uregex *re);

/* Leftmost match in s[0..len) (valid UTF-8) starting the search at byte `from`.
 * Returns 1 with [*ms, *me) set, 0 when there is no match, -1 when the match needed more
 * backtracking depth than allowed (pathological pattern; err filled). */
int uregex_find(const uregex *re, const char *s, size_t len, size_t from, size_t *ms, size_t *me,
                um_err *err);

#endif /* UM_UNICODE_REGEX_H */
