/*
 * static.c — static files from the web root (the browser UI), confined to that directory.
 *
 * lws has already percent-decoded the path and collapsed "/../"; we still refuse anything that
 * could leave the root: backslashes, control bytes, '%' left over from double encoding, any
 * segment starting with '.' ("..", hidden files), and finally resolve symlinks with realpath()
 * and require the result to lie under the root's realpath. The file is read whole (the UI's files
 * are small; STATIC_MAX_BYTES caps it) and answered through http.c's own response writer like
 * every other response, so pipelining detection and keep-alive behave the same for files.
 *
 * Not here: routes (http.c). Threads: static_root_resolve on the main thread before serving;
 * static_lookup on the lws service thread. No state: the server keeps the resolved root.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/static.h"
#include "util/log.h"

#define STATIC_MAX_BYTES (16u << 20) /* larger files under the web root answer 404 */

char *static_root_resolve(const char *web_root, um_err *err) {
    char buf[PATH_MAX];
    if (!realpath(web_root, buf)) {
        um_err_set(err, UM_ERR_IO, "--web-root %s: %s", web_root, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode)) {
        um_err_set(err, UM_ERR_IO, "--web-root %s: not a directory", web_root);
        return NULL;
    }
    return xstrdup(buf);
}

static const struct {
    const char *ext, *mime;
} k_mime[] = {
    {".html", "text/html; charset=utf-8"},
    {".js", "text/javascript; charset=utf-8"},
    {".mjs", "text/javascript; charset=utf-8"},
    {".css", "text/css; charset=utf-8"},
    {".json", "application/json"},
    {".svg", "image/svg+xml"},
    {".png", "image/png"},
    {".ico", "image/x-icon"},
    {".webp", "image/webp"},
    {".woff2", "font/woff2"},
    {".txt", "text/plain; charset=utf-8"},
    {".md", "text/markdown; charset=utf-8"},
    {".webmanifest", "application/manifest+json"},
};

static const char *mime_of(const char *path) {
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash))
        for (size_t i = 0; i < sizeof k_mime / sizeof k_mime[0]; i++)
            if (strcmp(dot, k_mime[i].ext) == 0) return k_mime[i].mime;
    return "application/octet-stream";
}

/* 0 = acceptable request path, else the HTTP status to answer. */
static int path_check(const char *path) {
    if (path[0] != '/') return 400;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if (*p < 0x20 || *p == 0x7f || *p == '\\' || *p == '%') return 403;
        if (*p == '/' && p[1] == '.') return 403; /* "..", ".", hidden files */
    }
    return 0;
}

/* Reads the regular file fd (size bytes) whole; NULL on a short read. */
static char *read_all(int fd, size_t size) {
    char *buf = xmalloc(size ? size : 1);
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(buf);
            return NULL;
        }
        got += (size_t)n;
    }
    return buf;
}

int static_lookup(const char *root, const char *path, static_file *out) {
    memset(out, 0, sizeof *out);
    if (!root) return 404;
    const size_t root_len = strlen(root);
    int bad = path_check(path);
    if (bad) {
        log_debug("static: refused path '%s' (%d)", path, bad);
        return bad;
    }
    char want[PATH_MAX], real[PATH_MAX];
    size_t pl = strlen(path);
    if (root_len + pl + 16 >= sizeof want) return 404;
    snprintf(want, sizeof want, "%s%s%s", root, path, path[pl - 1] == '/' ? "index.html" : "");
    if (!realpath(want, real)) return 404;
    struct stat st;
    if (stat(real, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t rl = strlen(real);
        if (rl + 12 >= sizeof real) return 404;
        memcpy(real + rl, "/index.html", 12);
        if (stat(real, &st) != 0) return 404;
    }
    /* confinement: the resolved file must lie strictly inside the root */
    if (strncmp(real, root, root_len) != 0 || real[root_len] != '/') {
        log_debug("static: '%s' resolves outside the web root", path);
        return 403;
    }
    if (!S_ISREG(st.st_mode) || (unsigned long long)st.st_size > STATIC_MAX_BYTES) return 404;
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 404;
    out->data = read_all(fd, (size_t)st.st_size);
    close(fd);
    if (!out->data) return 404;
    out->len = (size_t)st.st_size;
    out->mime = mime_of(real);
    return 0;
}
