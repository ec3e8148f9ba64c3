/*
 * static.h — the browser UI's files under the web root, for GETs no route claims (static.c): path
 * checks (no escape from the root, no dotfiles), MIME types, size limit. Service thread.
 */
#ifndef UM_STATIC_H
#define UM_STATIC_H

#include <stddef.h>

#include "util/err.h"

/* The file for path (decoded, starting with '/') under the web root. */
typedef struct static_file {
    char       *data;   /* whole file, owned by the caller (free) */
    size_t      len;    /* bytes */
    const char *mime;   /* static string */
} static_file;
/* The file for path under root (static_root_resolve's result): 0 and *out filled, or the HTTP
 * status to answer (400, 403, 404) with *out empty. */
int   static_lookup(const char *root, const char *path, static_file *out);
/* The web root's realpath (malloc'd), once at startup; NULL with err when it is not a directory. */
char *static_root_resolve(const char *web_root, um_err *err);
#endif /* UM_STATIC_H */
