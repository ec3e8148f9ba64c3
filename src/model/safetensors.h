/*
 * safetensors.h — parse and validate safetensors files (huggingface/safetensors "Format").
 *
 * safetensors_parse() works on a caller-owned buffer (fuzzable, no I/O); safetensors_open() mmaps a
 * file and parses it. Tensor data is never copied: st_tensor.data points into the buffer/mapping.
 * Validation: 8-byte header length bounds, JSON well-formed object, known dtype strings, shape
 * product x dtype size == byte length, offsets inside the buffer, tensors tile the data section
 * without holes or overlaps, no duplicate names. Does not interpret tensor names (model/ does).
 * Any thread; an st_file is immutable after parsing.
 */
#ifndef UM_SAFETENSORS_H
#define UM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "util/dtype.h"
#include "util/err.h"
#include "util/fileio.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u)   /* same bound as the reference reader */

typedef struct st_tensor {
    char          *name;               /* owned */
    enum dtype     type;               /* DTYPE_OTHER for dtypes we cannot compute with */
    char           type_name[16];      /* dtype string as written ("BF16", "I64", ...) */
    int            ndim;
    int64_t        shape[ST_MAX_DIMS];
    int64_t        n_elems;            /* product of shape (1 for rank 0) */
    const void    *data;               /* points into the file buffer; not owned */
    size_t         nbytes;
    size_t         offset;             /* byte offset from start of the data section */
} st_tensor;

typedef struct st_file {
    char      *path;                   /* owned; "<buffer>" when parsed from memory */
    file_map   map;                    /* the mapping (len 0 when parsed from a caller buffer) */
    st_tensor *tensors;                /* [n_tensors], owned, sorted by name */
    int        n_tensors;
    size_t     header_len;             /* bytes before the data section (a checkpoint fingerprint
                                          hashes them: model_tp.c) */
} st_file;

/* Parse buf[0..len). On error fills err ("<label>: problem") and leaves *f empty. label names the
 * file in messages. The buffer must outlive *f. */
int  safetensors_parse(const uint8_t *buf, size_t len, const char *label, st_file *f, um_err *err);
int  safetensors_open(const char *path, st_file *f, um_err *err);
void safetensors_free(st_file *f);
const st_tensor *safetensors_find(const st_file *f, const char *name);
/* Sort f->tensors by name (what safetensors_find's binary search needs): for a file whose tensor
 * list was built another way (a GGUF file's, model/gguf_model.c). */
void safetensors_sort(st_file *f);

/* Writer: used by make-model and tests. Tensors are laid out contiguously in the order given (the
 * header is space-padded to a multiple of 8 bytes, like the reference writer). */
typedef struct st_write_tensor {
    const char *name;
    const char *dtype;                 /* "F32", "BF16", "F16" (or any string, for corrupt tests) */
    int         ndim;
    int64_t     shape[ST_MAX_DIMS];
    const void *data;
    size_t      nbytes;
} st_write_tensor;

int safetensors_write(const char *path, const st_write_tensor *t, int n, const char *metadata_json,
                      um_err *err);
/* Streaming variant for large files: writes the 8-byte length + header for t[0..n) (data pointers
 * ignored); the caller then writes each tensor's nbytes in order. */
int safetensors_write_header(FILE *fp, const st_write_tensor *t, int n, const char *metadata_json);

#endif /* UM_SAFETENSORS_H */
