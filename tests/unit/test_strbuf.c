/*
 * test_strbuf.c — util/strbuf: appends keep the buffer NUL-terminated across growth, printf output
 * longer than the free space, embedded NULs, reset / take / free.
 */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/strbuf.h"

static void test_put(void) {
    strbuf b = STRBUF_INIT;
    TEST_CHECK(strcmp(strbuf_str(&b), "") == 0 && b.p == NULL, "empty buffer reads as \"\"");
    strbuf_put(&b, NULL, 0);
    TEST_CHECK(b.p && b.n == 0 && b.p[0] == 0, "an empty put allocates and terminates");
    strbuf_puts(&b, "ab");
    strbuf_putc(&b, 'c');
    strbuf_put(&b, "d\0e", 3);
    TEST_CHECK(b.n == 6 && memcmp(b.p, "abcd\0e", 7) == 0, "bytes incl. NUL, terminated: n=%zu", b.n);

    /* grow well past the first allocation, one byte at a time */
    strbuf_reset(&b);
    TEST_CHECK(b.n == 0 && b.p[0] == 0, "reset empties");
    for (int i = 0; i < 5000; i++) strbuf_putc(&b, (char)('a' + i % 26));
    int ok = b.n == 5000 && b.p[5000] == 0 && b.cap > 5000;
    for (int i = 0; ok && i < 5000; i++) ok = b.p[i] == (char)('a' + i % 26);
    TEST_CHECK(ok, "5000 putc: n=%zu cap=%zu", b.n, b.cap);
    strbuf_free(&b);
    TEST_CHECK(b.p == NULL && b.n == 0 && b.cap == 0, "free empties");
}

static void test_printf(void) {
    strbuf b = STRBUF_INIT;
    strbuf_printf(&b, "%d-%s", 42, "x");
    TEST_CHECK(strcmp(b.p, "42-x") == 0 && b.n == 4, "printf into an empty buffer: %s", b.p);
    /* longer than the free space: must grow and print it whole */
    char big[1000];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = 0;
    strbuf_printf(&b, "[%s]", big);
    TEST_CHECK(b.n == 4 + 1001 && b.p[4] == '[' && b.p[b.n - 1] == ']' && b.p[b.n] == 0 && b.p[500] == 'z',
               "long printf: n=%zu", b.n);
    strbuf_printf(&b, "%s", "");
    TEST_CHECK(b.n == 1005, "empty printf adds nothing");

    size_t len = 0;
    char *s = strbuf_take(&b, &len);
    TEST_CHECK(len == 1005 && strlen(s) == 1005 && s[0] == '4', "take: len=%zu", len);
    TEST_CHECK(b.p == NULL && b.n == 0 && b.cap == 0, "take leaves the buffer empty");
    free(s);

    s = strbuf_take(&b, &len);
    TEST_CHECK(s && s[0] == 0 && len == 0, "take of an untouched buffer gives \"\"");
    free(s);
}

int main(void) {
    test_put();
    test_printf();
    return test_report();
}
