/*
 * test.h — minimal assertions for C unit tests. Each failed check prints file:line and the
 * message; test_report() prints "N passed, N failed" and returns the process exit code.
 */
#ifndef UM_TEST_H
#define UM_TEST_H

#include <stdio.h>

static int g_test_passed, g_test_failed;

#define TEST_CHECK(cond, ...)                                              \
    do {                                                                   \
        if (cond) {                                                        \
            g_test_passed++;                                               \
        } else {                                                           \
            g_test_failed++;                                               \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

static inline int test_report(void) {
    printf("%d passed, %d failed\n", g_test_passed, g_test_failed);
    return g_test_failed ? 1 : 0;
}

#endif /* UM_TEST_H */
