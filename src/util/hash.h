/*
 * hash.h — string hashing for the in-memory tables (job ids, caller identities): FNV-1a, 32 bits.
 * Not cryptographic: fine for keys a client cannot choose freely (random job ids; caller identities
 * are a SHA-256 of the API key or the peer address). Any thread; no state.
 */
#ifndef UM_UTIL_HASH_H
#define UM_UTIL_HASH_H

#include <stdint.h>

/* FNV-1a of the NUL-terminated string s. */
static inline uint32_t hash_str_fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

#endif
