/*
 * fileio.h — whole-file reads, atomic whole-file replacement, read-only mmaps, path joining.
 * Any thread.
 */
#ifndef UM_FILEIO_H
#define UM_FILEIO_H

#include <stddef.h>
#include <stdio.h>

#include "util/err.h"

/* Read a whole file into a malloc'd, NUL-terminated buffer (caller frees). max_bytes bounds it. */
int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len, um_err *err);
int file_write_all(const char *path, const void *data, size_t len, um_err *err);
int file_exists(const char *path);

/* Replacing a file that a running process may have mmap'd (a served model's weights): write to
 * "<path>.tmp-<pid>" and rename it over path at the end, so a reader keeps the old inode instead
 * of taking SIGBUS on a truncated mapping, and an interrupted write never leaves a half file.
 * file_replace_begin() opens the temporary file (tmp: cap >= strlen(path) + 32 bytes) or returns
 * NULL (errno set); file_replace_end() closes it and renames it over path when ok, else removes it.
 * Returns 0 on success, -1 when ok was 0 or closing/renaming failed (errno set). */
FILE *file_replace_begin(const char *path, char *tmp, size_t cap);
int   file_replace_end(FILE *fp, const char *tmp, const char *path, int ok);
/* mkdir -p: create dir and its missing parents (mode 0755). */
int dir_create(const char *path, um_err *err);

typedef struct file_map {
    void  *data;          /* mapped bytes (read-only), NULL when len == 0 */
    size_t len;           /* bytes */
} file_map;

int  file_map_open(const char *path, file_map *map, um_err *err);
void file_map_close(file_map *map);
/* Drop this process's pages of the mapping that lie wholly inside [p, p + n) (madvise DONTNEED): they
 * stop counting in its resident set and are read from the file again if touched again, so the bytes
 * seen never change. For data copied elsewhere (a weight quantized or packed at load). Bytes outside
 * the mapping are ignored. */
void file_map_release(const file_map *map, const void *p, size_t n);

/* dst = dir + "/" + name, truncated safely; returns dst. */
char *path_join(char *dst, size_t cap, const char *dir, const char *name);

#endif /* UM_FILEIO_H */
