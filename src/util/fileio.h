/*
 * fileio.h — whole-file reads, read-only mmaps, path joining. Any thread.
 */
#ifndef UM_FILEIO_H
#define UM_FILEIO_H

#include <stddef.h>

#include "util/err.h"

/* Read a whole file into a malloc'd, NUL-terminated buffer (caller frees). max_bytes bounds it. */
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len, um_err *err);
int file_write_all(const char *path, const void *data, size_t len, um_err *err);
int file_exists(const char *path);
/* mkdir -p: create dir and its missing parents (mode 0755). */
int dir_create(const char *path, um_err *err);

typedef struct file_map {
    void  *data;          /* mapped bytes (read-only), NULL when len == 0 */
    size_t len;           /* bytes */
} file_map;

int  file_map_open(const char *path, file_map *map, um_err *err);
void file_map_close(file_map *map);

/* dst = dir + "/" + name, truncated safely; returns dst. */
char *path_join(char *dst, size_t cap, const char *dir, const char *name);

#endif /* UM_FILEIO_H */
