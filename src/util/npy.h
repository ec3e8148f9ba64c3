/*
 * npy.h — float32 arrays as NumPy .npy files ('<f4', C order; written as format v1.0), the exchange
 * format between `unmask logits` / `unmask quantize` and the NumPy reference tests.
 * Does not: handle other dtypes or Fortran order. Pure I/O, any thread.
 */
#ifndef UM_NPY_H
#define UM_NPY_H

#include <stdint.h>

#include "util/err.h"

#define NPY_MAX_DIMS 8

/* Write data (prod(shape) floats, row-major) to path. */
int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, um_err *err);
/* Read a '<f4' C-order array of at most NPY_MAX_DIMS dimensions (format 1.0 to 3.0): *data (malloc'd,
 * caller frees), *ndim, shape[]. -1 + err naming the file and what is wrong. */
int npy_read_f32(const char *path, float **data, int *ndim, int64_t *shape, um_err *err);

#endif /* UM_NPY_H */
