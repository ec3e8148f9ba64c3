/*
 * fileio.c — file helpers. Any thread.
 */
#include "util/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

int file_read_all(const char *path, size_t max_bytes, char **out, size_t *out_len, um_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return um_err_set(err, UM_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (len == cap) {
            if (cap >= max_bytes) {
                fclose(f);
                free(buf);
                return um_err_set(err, UM_ERR_RESOURCE, "%s: larger than %zu bytes", path, max_bytes);
            }
            cap = cap * 2 > max_bytes ? max_bytes : cap * 2;
            buf = xrealloc(buf, cap + 1);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return um_err_set(err, UM_ERR_IO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return 0;
}

FILE *file_replace_begin(const char *path, char *tmp, size_t cap) {
    int n = snprintf(tmp, cap, "%s.tmp-%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= cap) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    return fopen(tmp, "wb");
}

int file_replace_end(FILE *fp, const char *tmp, const char *path, int ok) {
    if (fclose(fp) != 0) ok = 0;
    if (ok && rename(tmp, path) == 0) return 0;
    int e = errno;
    unlink(tmp);
    errno = e;
    return -1;
}

int file_write_all(const char *path, const void *data, size_t len, um_err *err) {
    char tmp[4096 + 32];
    FILE *f = file_replace_begin(path, tmp, sizeof tmp);
    if (!f) return um_err_set(err, UM_ERR_IO, "%s: %s", path, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    if (file_replace_end(f, tmp, path, ok) != 0) return um_err_set(err, UM_ERR_IO, "%s: write failed", path);
    return 0;
}

int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int dir_create(const char *path, um_err *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return um_err_set(err, UM_ERR_INVALID_ARG, "invalid directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return um_err_set(err, UM_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return um_err_set(err, UM_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return um_err_set(err, UM_ERR_IO, "%s: not a directory", buf);
    return 0;
}

int file_map_open(const char *path, file_map *map, um_err *err) {
    map->data = NULL;
    map->len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return um_err_set(err, UM_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return um_err_set(err, UM_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            return um_err_set(err, UM_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        }
        map->data = p;
        map->len = (size_t)st.st_size;
    }
    close(fd);
    return 0;
}

void file_map_release(const file_map *map, const void *p, size_t n) {
    const uintptr_t base = (uintptr_t)map->data, end = base + map->len, page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    if (!map->data || hi <= base || lo >= end) return;
    lo = lo < base ? base : lo;
    hi = hi > end ? end : hi;
    lo = (lo + page - 1) / page * page;   /* whole pages only: a neighbour's bytes stay mapped */
    hi = hi / page * page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void file_map_close(file_map *map) {
    if (map->data) munmap(map->data, map->len);
    map->data = NULL;
    map->len = 0;
}

char *path_join(char *dst, size_t cap, const char *dir, const char *name) {
    size_t dl = strlen(dir);
    if (dl && dir[dl - 1] == '/')
        snprintf(dst, cap, "%s%s", dir, name);
    else
        snprintf(dst, cap, "%s/%s", dir, name);
    return dst;
}
