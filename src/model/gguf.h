/*
 * gguf.h — parse and validate GGUF files (the format llama.cpp's converter writes: docs/gguf.md).
 *
 * gguf_parse() works on a caller-owned buffer (fuzzable, no I/O); gguf_open() mmaps a file and
 * parses it. Nothing is copied: metadata values and tensor data point into the buffer. Validation:
 * magic, version (2 and 3, little-endian), every length and count against the bytes left, known
 * value types (no nested arrays), unique keys and tensor names, general.alignment (a power of two,
 * u32), tensor ranks 1..4 with positive dimensions, known tensor types whose rows hold whole blocks,
 * aligned offsets, tensor data inside the file and not overlapping. A malformed file gives one
 * error naming the file and the problem, never a crash.
 * Does not: interpret key names or tensor names (model/gguf_model.c does), convert tensor data.
 * Any thread; a gguf_file is immutable after parsing.
 */
#ifndef UM_GGUF_H
#define UM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "util/dtype.h"
#include "util/err.h"
#include "util/fileio.h"

#define GGUF_MAX_DIMS 4                   /* ggml's tensor rank */
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types, numbered as in the file. */
enum gguf_vtype {
    GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY,
    GGUF_U64, GGUF_I64, GGUF_F64,
    GGUF_VTYPE_COUNT
};

typedef struct gguf_kv {
    char           *key;        /* owned, NUL-terminated */
    enum gguf_vtype type;
    enum gguf_vtype arr_type;   /* GGUF_ARRAY: the element type */
    uint64_t        n;          /* GGUF_ARRAY: elements; else 1 */
    const uint8_t  *data;       /* the value's bytes in the buffer: a scalar, a string's bytes (len
                                   bytes, no NUL), or an array's first element */
    uint64_t        len;        /* GGUF_STRING: its length in bytes */
    uint64_t       *str_off;    /* GGUF_ARRAY of strings: [n] offset of each element's u64 length
                                   prefix from data, owned; else NULL */
} gguf_kv;

typedef struct gguf_tensor {
    char          *name;                /* owned, NUL-terminated */
    uint32_t       ggml_type;           /* the file's type id */
    enum dtype     type;                /* DTYPE_F32/F16/BF16/Q8_0/Q4_0, or DTYPE_OTHER */
    int            n_dims;              /* 1..GGUF_MAX_DIMS */
    int64_t        ne[GGUF_MAX_DIMS];   /* ggml order: ne[0] is the row length (innermost); unused = 1 */
    uint64_t       offset;              /* from the start of the data section */
    const uint8_t *data;                /* into the buffer */
    size_t         nbytes;
} gguf_tensor;

typedef struct gguf_file {
    char        *path;                 /* owned: the label given to the parser */
    file_map     map;                  /* gguf_open's mapping (len 0 when parsed from a caller buffer) */
    uint32_t     version;
    uint32_t     alignment;
    gguf_kv     *kv;                   /* [n_kv] in file order, owned */
    int          n_kv;
    gguf_tensor *tensors;              /* [n_tensors] in file order, owned */
    int          n_tensors;
    size_t       data_start;           /* byte offset of the data section (after the tensor infos) */
} gguf_file;

/* Parse buf[0..len) (label names the file in messages). On error fills err ("<label>: problem",
 * UM_ERR_FORMAT, or UM_ERR_UNSUPPORTED for a valid file of a kind we do not read) and leaves *f
 * empty. The buffer must outlive *f. */
int  gguf_parse(const uint8_t *buf, size_t len, const char *label, gguf_file *f, um_err *err);
int  gguf_open(const char *path, gguf_file *f, um_err *err);
void gguf_free(gguf_file *f);
/* 1 when the file at path starts with the GGUF magic (reads 4 bytes), else 0. */
int  gguf_path_is_gguf(const char *path);

const gguf_kv     *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
/* Name of a value type ("u32", "string", "array", ...) and of a ggml tensor type id ("Q4_K", or
 * "type 99" for an unknown id: buf holds it). */
const char *gguf_vtype_name(enum gguf_vtype t);
const char *gguf_ggml_type_name(uint32_t id, char buf[16]);

/* Typed access; each returns -1 with err naming the file and key ("key 'llada.block_count' has type
 * string, expected an integer") when the value has another type or is out of range. */
int gguf_kv_int(const gguf_file *f, const gguf_kv *kv, int64_t lo, int64_t hi, int64_t *out, um_err *err);
int gguf_kv_float(const gguf_file *f, const gguf_kv *kv, double *out, um_err *err);
int gguf_kv_bool(const gguf_file *f, const gguf_kv *kv, int *out, um_err *err);
/* A string value: *s points into the buffer (not NUL-terminated), *len its bytes. */
int gguf_kv_str(const gguf_file *f, const gguf_kv *kv, const char **s, uint64_t *len, um_err *err);
/* Element i of an array of strings / of integers (any integer type). The array's type is checked
 * by the caller (kv->type == GGUF_ARRAY, kv->arr_type). */
void    gguf_arr_str(const gguf_kv *kv, uint64_t i, const char **s, uint64_t *len);
int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i);

#endif /* UM_GGUF_H */
