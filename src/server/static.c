/*
 * static.c — static files from the web root (the browser UI), confined to that directory.
 *
 * lws has already percent-decoded the path and collapsed "/../"; we still refuse anything that
 * could leave the root: backslashes, control bytes, '%' left over from double encoding, any
 * segment starting with '.' ("..", hidden files), and finally resolve symlinks with realpath()
 * and require the result to lie under the root's realpath. Files go out through
 * lws_serve_http_file (async, chunked by lws).
 *
 * Not here: routes (http.c). Threads: static_init on the main thread before serving; static_serve
 * on the lws service thread.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/server_internal.h"
#include "util/log.h"

static char  *g_root;      /* realpath of the web root, owned */
static size_t g_root_len;

int static_init(const char *web_root, um_err *err) {
    static_free();
    char buf[PATH_MAX];
    if (!realpath(web_root, buf)) return um_err_set(err, UM_ERR_IO, "--web-root %s: %s", web_root, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return um_err_set(err, UM_ERR_IO, "--web-root %s: not a directory", web_root);
    g_root = xstrdup(buf);
    g_root_len = strlen(buf);
    return 0;
}

void static_free(void) {
    free(g_root);
    g_root = NULL;
    g_root_len = 0;
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

int static_serve(struct lws *wsi, server *s, const char *path, int head_only, int *status_out) {
    (void)s;
    (void)head_only;
    *status_out = 0;
    if (!g_root) {
        *status_out = 404;
        return 0;
    }
    int bad = path_check(path);
    if (bad) {
        log_debug("static: refused path '%s' (%d)", path, bad);
        *status_out = bad;
        return 0;
    }
    char want[PATH_MAX], real[PATH_MAX];
    size_t pl = strlen(path);
    if (g_root_len + pl + 16 >= sizeof want) {
        *status_out = 404;
        return 0;
    }
    snprintf(want, sizeof want, "%s%s%s", g_root, path, path[pl - 1] == '/' ? "index.html" : "");
    if (!realpath(want, real)) {
        *status_out = 404;
        return 0;
    }
    struct stat st;
    if (stat(real, &st) == 0 && S_ISDIR(st.st_mode)) {
        size_t rl = strlen(real);
        if (rl + 12 >= sizeof real) {
            *status_out = 404;
            return 0;
        }
        memcpy(real + rl, "/index.html", 12);
        if (stat(real, &st) != 0) {
            *status_out = 404;
            return 0;
        }
    }
    /* confinement: the resolved file must lie strictly inside the root */
    if (strncmp(real, g_root, g_root_len) != 0 || real[g_root_len] != '/') {
        log_debug("static: '%s' resolves outside the web root", path);
        *status_out = 403;
        return 0;
    }
    if (!S_ISREG(st.st_mode)) {
        *status_out = 404;
        return 0;
    }
    static const char extra[] = "cache-control: no-cache\x0d\x0a";
    int n = lws_serve_http_file(wsi, real, mime_of(real), extra, (int)sizeof extra - 1);
    if (n < 0 || (n > 0 && lws_http_transaction_completed(wsi))) return -1;
    return 0;
}
