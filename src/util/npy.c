/*
 * npy.c — .npy reader and v1.0 writer of float32 arrays (see npy.h). Any thread.
 */
#include "util/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, um_err *err) {
    if (ndim < 0 || ndim > NPY_MAX_DIMS) return um_err_set(err, UM_ERR_INTERNAL, "%s: bad rank %d", path, ndim);
    char dict[512];
    int len = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld,%s", (long long)shape[i],
                        i + 1 < ndim ? " " : "");
        count *= (size_t)shape[i];
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* magic(6) + version(2) + header length(2) + dict + spaces + '\n', padded to 64 bytes */
    size_t total = 10 + (size_t)len + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)len + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    FILE *fp = fopen(path, "wb");
    if (!fp) return um_err_set(err, UM_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(pre, 1, 10, fp) == 10 && fwrite(dict, 1, (size_t)len, fp) == (size_t)len;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', fp) != EOF;
    ok = ok && fputc('\n', fp) != EOF;
    ok = ok && (count == 0 || fwrite(data, sizeof(float), count, fp) == count);
    if (fclose(fp) != 0) ok = 0;
    if (!ok) return um_err_set(err, UM_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, um_err *err) {
    *data = NULL;
    *ndim = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return um_err_set(err, UM_ERR_IO, "%s: %s", path, strerror(errno));
    unsigned char pre[12];
    int rc = -1;
    char *dict = NULL;
    if (fread(pre, 1, 8, fp) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0 || pre[6] < 1 || pre[6] > 3) {
        um_err_set(err, UM_ERR_FORMAT, "%s: not a .npy file (format 1.0 to 3.0)", path);
        goto out;
    }
    const int wide = pre[6] >= 2;   /* 4-byte header length from format 2.0 on */
    if (fread(pre + 8, 1, wide ? 4 : 2, fp) != (size_t)(wide ? 4 : 2)) {
        um_err_set(err, UM_ERR_FORMAT, "%s: truncated header", path);
        goto out;
    }
    size_t hlen = pre[8] | (size_t)pre[9] << 8;
    if (wide) hlen |= (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    if (hlen == 0 || hlen > (1u << 20)) {
        um_err_set(err, UM_ERR_FORMAT, "%s: header of %zu bytes", path, hlen);
        goto out;
    }
    dict = calloc(hlen + 1, 1);
    if (!dict || fread(dict, 1, hlen, fp) != hlen) {
        um_err_set(err, UM_ERR_FORMAT, "%s: truncated header", path);
        goto out;
    }
    const char *descr = strstr(dict, "'descr'"), *fo = strstr(dict, "'fortran_order'"), *sh = strstr(dict, "'shape'");
    if (!descr || !strstr(descr, "'<f4'") || !fo || !strstr(fo, "False") || !sh || !(sh = strchr(sh, '('))) {
        um_err_set(err, UM_ERR_FORMAT, "%s: not a little-endian float32 C-order array (%s)", path, dict);
        goto out;
    }
    size_t count = 1;
    for (const char *p = sh + 1; *p && *p != ')';) {
        char *end;
        const long long v = strtoll(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (*ndim >= NPY_MAX_DIMS || v < 0) {
            um_err_set(err, UM_ERR_FORMAT, "%s: bad shape %s", path, sh);
            goto out;
        }
        shape[(*ndim)++] = v;
        count *= (size_t)v;
        p = end;
    }
    *data = malloc(count ? count * sizeof(float) : 1);
    if (!*data || fread(*data, sizeof(float), count, fp) != count) {
        um_err_set(err, UM_ERR_FORMAT, "%s: holds fewer than the %zu floats its shape says", path, count);
        free(*data);
        *data = NULL;
        goto out;
    }
    rc = 0;
out:
    free(dict);
    fclose(fp);
    return rc;
}
