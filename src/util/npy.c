/*
 * npy.c — .npy v1.0 writer (see npy.h). Any thread.
 */
#include "util/npy.h"

#include <errno.h>
#include <stdio.h>
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
