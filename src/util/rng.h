/*
 * rng.h — counter-based random numbers.
 *
 * Every random draw is a pure function of (seed, stream, counter), so a request's samples do not
 * depend on which other requests share its batch, on thread scheduling, or on the backend: the
 * CUDA kernels compute the same hash. stream/counter are chosen by the caller (for Gumbel noise:
 * stream = step index, counter = position * vocab + token).
 * Header-only, pure, any thread.
 */
#ifndef UM_RNG_H
#define UM_RNG_H

#include <stdint.h>

static inline uint64_t rng_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return rng_mix64(rng_mix64(seed ^ rng_mix64(stream + 0x632be59bd9b4e019ull)) + counter);
}

/* Uniform double in the open interval (0, 1): never 0, never 1 (safe for -log(u)). */
static inline double rng_u01(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint64_t r = rng_u64(seed, stream, counter) >> 11; /* 53 bits */
    return ((double)r + 0.5) * (1.0 / 9007199254740992.0);
}

#endif /* UM_RNG_H */
