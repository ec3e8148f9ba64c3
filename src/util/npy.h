/*
 * npy.h — write float32 arrays as NumPy .npy files (format v1.0, '<f4', C order), the exchange
 * format between `unmask logits` and the NumPy reference tests.
 * Does not: read .npy files or handle other dtypes. Pure I/O, any thread.
 */
#ifndef UM_NPY_H
#define UM_NPY_H

#include <stdint.h>

#include "util/err.h"

#define NPY_MAX_DIMS 8

/* Write data (prod(shape) floats, row-major) to path. */
int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, um_err *err);

#endif /* UM_NPY_H */
