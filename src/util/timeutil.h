/*
 * timeutil.h — monotonic clock helpers. Any thread.
 */
#ifndef UM_TIMEUTIL_H
#define UM_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline uint64_t time_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline double time_now_s(void) { return (double)time_now_ns() * 1e-9; }
static inline double time_ms_since(uint64_t t0_ns) { return (double)(time_now_ns() - t0_ns) * 1e-6; }

#endif /* UM_TIMEUTIL_H */
