/*
 * log.h — logging and the two kinds of failure.
 *
 * CHECK()/UM_FATAL() are for bugs and impossible setup (allocation failure, broken invariants):
 * they print file:line and abort. Per-request failures never use them; they return a status and
 * fill a um_err (util/err.h) that the caller turns into a protocol error or a CLI message.
 * Thread-safe: each log line is one fprintf to stderr.
 */
#ifndef UM_LOG_H
#define UM_LOG_H

#include <stdarg.h>
#include <stddef.h>

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

void log_level_set(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)

_Noreturn void um_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Invariant check: aborts with file:line and the expression text. */
#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) um_abort(__FILE__, __LINE__, "CHECK(%s) failed", #cond); \
    } while (0)
#define UM_FATAL(...) um_abort(__FILE__, __LINE__, __VA_ARGS__)

/* Allocation that aborts on OOM (recovering from OOM in a long-running server is futile). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);

#endif /* UM_LOG_H */
