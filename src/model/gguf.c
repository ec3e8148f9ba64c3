/*
 * gguf.c — GGUF reader (see gguf.h for the contract). Layout, little-endian throughout:
 *   u32 magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: { string key, u32 value type, value } (a string is u64 length + bytes; an array is
 *             u32 element type + u64 count + elements),
 *   tensor infos: { string name, u32 rank, u64 dims[rank] (innermost first), u32 type, u64 offset },
 *   padding to general.alignment (default 32), then the data section; each tensor's offset is
 *   relative to it and a multiple of the alignment.
 * Any thread. Every read goes through a cursor that checks the bytes left first.
 */
#include "model/gguf.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#define GGUF_MAGIC 0x46554747u            /* "GGUF" read as a little-endian u32 */
#define GGUF_MAX_KEY 65535u               /* the spec's bound on key length */
#define GGUF_MAX_NAME 1024u               /* tensor names (ggml itself keeps 63 bytes) */
#define GGUF_MAX_ENTRIES (1u << 20)       /* metadata entries and tensors (real files: < 10^5) */
#define GGUF_MAX_STRINGS (1u << 24)       /* elements of one array of strings (vocabularies: < 10^6) */

/* ---------------------------------------------------------------- ggml tensor types */

/* Block size (elements) and bytes per block of every type id the format defines; unit = 0 for ids
 * no type has (removed or never assigned). */
static const struct ggml_type_info {
    const char *name;
    uint32_t    block, unit;
    enum dtype  type;
} k_types[] = {
    [0] = {"F32", 1, 4, DTYPE_F32},         [1] = {"F16", 1, 2, DTYPE_F16},
    [2] = {"Q4_0", 32, 18, DTYPE_Q4_0},     [3] = {"Q4_1", 32, 20, DTYPE_OTHER},
    [6] = {"Q5_0", 32, 22, DTYPE_OTHER},    [7] = {"Q5_1", 32, 24, DTYPE_OTHER},
    [8] = {"Q8_0", 32, 34, DTYPE_Q8_0},     [9] = {"Q8_1", 32, 36, DTYPE_OTHER},
    [10] = {"Q2_K", 256, 84, DTYPE_OTHER},  [11] = {"Q3_K", 256, 110, DTYPE_OTHER},
    [12] = {"Q4_K", 256, 144, DTYPE_OTHER}, [13] = {"Q5_K", 256, 176, DTYPE_OTHER},
    [14] = {"Q6_K", 256, 210, DTYPE_OTHER}, [15] = {"Q8_K", 256, 292, DTYPE_OTHER},
    [16] = {"IQ2_XXS", 256, 66, DTYPE_OTHER}, [17] = {"IQ2_XS", 256, 74, DTYPE_OTHER},
    [18] = {"IQ3_XXS", 256, 98, DTYPE_OTHER}, [19] = {"IQ1_S", 256, 50, DTYPE_OTHER},
    [20] = {"IQ4_NL", 32, 18, DTYPE_OTHER},   [21] = {"IQ3_S", 256, 110, DTYPE_OTHER},
    [22] = {"IQ2_S", 256, 82, DTYPE_OTHER},   [23] = {"IQ4_XS", 256, 136, DTYPE_OTHER},
    [24] = {"I8", 1, 1, DTYPE_OTHER},   [25] = {"I16", 1, 2, DTYPE_OTHER}, [26] = {"I32", 1, 4, DTYPE_OTHER},
    [27] = {"I64", 1, 8, DTYPE_OTHER},  [28] = {"F64", 1, 8, DTYPE_OTHER},
    [29] = {"IQ1_M", 256, 56, DTYPE_OTHER},  [30] = {"BF16", 1, 2, DTYPE_BF16},
    [34] = {"TQ1_0", 256, 54, DTYPE_OTHER},  [35] = {"TQ2_0", 256, 66, DTYPE_OTHER},
    [39] = {"MXFP4", 32, 17, DTYPE_OTHER},
};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static const struct ggml_type_info *type_info(uint32_t id) {
    return id < N_TYPES && k_types[id].unit ? &k_types[id] : NULL;
}

const char *gguf_ggml_type_name(uint32_t id, char buf[16]) {
    const struct ggml_type_info *t = type_info(id);
    if (t) return t->name;
    snprintf(buf, 16, "type %u", id);
    return buf;
}

static const char *const k_vtype_names[GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *gguf_vtype_name(enum gguf_vtype t) { return (unsigned)t < GGUF_VTYPE_COUNT ? k_vtype_names[t] : "?"; }

/* Bytes of one scalar of type t (0 for string and array). */
static size_t vtype_size(enum gguf_vtype t) {
    switch (t) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- cursor */

typedef struct cursor {
    const uint8_t *buf;
    size_t         len, pos;
    const char    *label;
    um_err        *err;
} cursor;

static uint64_t rd_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* n bytes at the cursor, or -1 naming `what` when fewer are left. */
static int need(cursor *c, uint64_t n, const char *what) {
    if (n > c->len - c->pos)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: %s needs %" PRIu64 " bytes at offset %zu but the file has %zu "
                          "left (truncated?)", c->label, what, n, c->pos, c->len - c->pos);
    return 0;
}

static int rd_u32(cursor *c, uint32_t *v, const char *what) {
    if (need(c, 4, what)) return -1;
    *v = (uint32_t)rd_le(c->buf + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, uint64_t *v, const char *what) {
    if (need(c, 8, what)) return -1;
    *v = rd_le(c->buf + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A string: its bytes stay in the buffer. */
static int rd_str(cursor *c, const uint8_t **s, uint64_t *len, uint64_t max, const char *what) {
    if (rd_u64(c, len, what)) return -1;
    if (*len > max)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: %s is %" PRIu64 " bytes long (at offset %zu), more than %" PRIu64,
                          c->label, what, *len, c->pos - 8, max);
    if (need(c, *len, what)) return -1;
    *s = c->buf + c->pos;
    c->pos += (size_t)*len;
    return 0;
}

/* ---------------------------------------------------------------- parse */

void gguf_free(gguf_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_kv; i++) {
        free(f->kv[i].key);
        free(f->kv[i].str_off);
    }
    free(f->kv);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    file_map_close(&f->map);
    memset(f, 0, sizeof *f);
}

/* A copy of s[0..len) as a C string; -1 when it holds a NUL byte. */
static int cstr(cursor *c, const uint8_t *s, uint64_t len, const char *what, char **out) {
    if (memchr(s, 0, (size_t)len))
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: %s at offset %zu contains a NUL byte", c->label, what,
                          (size_t)(s - c->buf));
    *out = xstrndup((const char *)s, (size_t)len);
    return 0;
}

/* One value of type t (not an array) at the cursor: skip it, checking its bytes exist. */
static int skip_scalar(cursor *c, enum gguf_vtype t, const char *key) {
    char what[96];
    snprintf(what, sizeof what, "the value of '%.60s'", key);
    if (t == GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        return rd_str(c, &s, &len, UINT64_MAX, what);
    }
    if (need(c, vtype_size(t), what)) return -1;
    if (t == GGUF_BOOL && c->buf[c->pos] > 1)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s' is a bool of value %u (only 0 or 1)", c->label, key,
                          c->buf[c->pos]);
    c->pos += vtype_size(t);
    return 0;
}

static int parse_kv(cursor *c, gguf_kv *kv) {
    const uint8_t *ks;
    uint64_t kl;
    if (rd_str(c, &ks, &kl, GGUF_MAX_KEY, "a metadata key")) return -1;
    if (cstr(c, ks, kl, "a metadata key", &kv->key)) return -1;
    uint32_t t;
    if (rd_u32(c, &t, "a value type")) return -1;
    if (t >= GGUF_VTYPE_COUNT)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s' has unknown value type %u", c->label, kv->key, t);
    kv->type = (enum gguf_vtype)t;
    kv->n = 1;
    if (t == GGUF_STRING) {
        const uint8_t *s;
        char what[96];
        snprintf(what, sizeof what, "the value of '%.60s'", kv->key);
        if (rd_str(c, &s, &kv->len, UINT64_MAX, what)) return -1;
        kv->data = s;
        return 0;
    }
    if (t != GGUF_ARRAY) {
        kv->data = c->buf + c->pos;
        return skip_scalar(c, kv->type, kv->key);
    }
    uint32_t at;
    uint64_t n;
    if (rd_u32(c, &at, "an array element type") || rd_u64(c, &n, "an array length")) return -1;
    if (at >= GGUF_VTYPE_COUNT)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s' is an array of unknown value type %u", c->label, kv->key,
                          at);
    if (at == GGUF_ARRAY)
        return um_err_set(c->err, UM_ERR_UNSUPPORTED, "%s: key '%s' is an array of arrays, which unmask does not read",
                          c->label, kv->key);
    kv->arr_type = (enum gguf_vtype)at;
    kv->n = n;
    kv->data = c->buf + c->pos;
    if (at != GGUF_STRING) {
        const size_t es = vtype_size(kv->arr_type);
        if (n > (c->len - c->pos) / es)
            return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s': an array of %" PRIu64 " %s values does not fit in "
                              "the %zu bytes left (truncated?)", c->label, kv->key, n, gguf_vtype_name(kv->arr_type),
                              c->len - c->pos);
        for (uint64_t i = 0; at == GGUF_BOOL && i < n; i++)
            if (kv->data[i] > 1)
                return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s': bool element %" PRIu64 " is %u (only 0 or 1)",
                                  c->label, kv->key, i, kv->data[i]);
        c->pos += (size_t)(n * es);
        return 0;
    }
    /* strings: each at least its 8-byte length */
    if (n > GGUF_MAX_STRINGS)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s' is an array of %" PRIu64 " strings, more than unmask "
                          "reads (%u)", c->label, kv->key, n, GGUF_MAX_STRINGS);
    if (n > (c->len - c->pos) / 8)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key '%s': an array of %" PRIu64 " strings does not fit in the %zu "
                          "bytes left (truncated?)", c->label, kv->key, n, c->len - c->pos);
    kv->str_off = xmalloc((size_t)(n ? n : 1) * sizeof *kv->str_off);
    for (uint64_t i = 0; i < n; i++) {
        kv->str_off[i] = (uint64_t)(c->pos - (size_t)(kv->data - c->buf));
        const uint8_t *s;
        uint64_t len;
        char what[96];
        snprintf(what, sizeof what, "element %" PRIu64 " of '%.60s'", i, kv->key);
        if (rd_str(c, &s, &len, UINT64_MAX, what)) return -1;
    }
    return 0;
}

static int parse_tensor_info(cursor *c, gguf_tensor *t) {
    const uint8_t *ns;
    uint64_t nl;
    if (rd_str(c, &ns, &nl, GGUF_MAX_NAME, "a tensor name")) return -1;
    if (cstr(c, ns, nl, "a tensor name", &t->name)) return -1;
    uint32_t nd;
    if (rd_u32(c, &nd, "a tensor rank")) return -1;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' has %u dimensions (1 to %d are valid)", c->label,
                          t->name, nd, GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t n_elems = 1;
    for (int i = 0; i < GGUF_MAX_DIMS; i++) t->ne[i] = 1;
    for (uint32_t i = 0; i < nd; i++) {
        uint64_t d;
        if (rd_u64(c, &d, "a tensor dimension")) return -1;
        if (d == 0 || d > ((uint64_t)1 << 60) / n_elems)
            return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' has dimension %u of size %" PRIu64 " (%s)", c->label,
                              t->name, i, d, d == 0 ? "empty" : "too large");
        t->ne[i] = (int64_t)d;
        n_elems *= d;
    }
    if (rd_u32(c, &t->ggml_type, "a tensor type") || rd_u64(c, &t->offset, "a tensor offset")) return -1;
    const struct ggml_type_info *ti = type_info(t->ggml_type);
    if (!ti)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' has unknown type id %u", c->label, t->name,
                          t->ggml_type);
    t->type = ti->type;
    if (t->ne[0] % ti->block != 0)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' has rows of %" PRId64 " elements, not a multiple of "
                          "the %s block of %u", c->label, t->name, t->ne[0], ti->name, ti->block);
    t->nbytes = (size_t)(n_elems / ti->block * ti->unit);   /* <= 2^60 / block * 292: no overflow */
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* The first string of names[0..n) that appears twice (names is sorted in place), or NULL. */
static const char *find_duplicate(const char **names, int n) {
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    for (int i = 1; i < n; i++)
        if (strcmp(names[i], names[i - 1]) == 0) return names[i];
    return NULL;
}

/* Keys and tensor names are unique. O(n log n). */
static int check_unique(cursor *c, gguf_file *f) {
    const int n = f->n_kv > f->n_tensors ? f->n_kv : f->n_tensors;
    const char **names = xmalloc((size_t)(n ? n : 1) * sizeof *names);
    for (int i = 0; i < f->n_kv; i++) names[i] = f->kv[i].key;
    const char *dup = find_duplicate(names, f->n_kv);
    int rc = 0;
    if (dup) rc = um_err_set(c->err, UM_ERR_FORMAT, "%s: metadata key '%s' appears twice", c->label, dup);
    for (int i = 0; rc == 0 && i < f->n_tensors; i++) names[i] = f->tensors[i].name;
    if (rc == 0 && (dup = find_duplicate(names, f->n_tensors)))
        rc = um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' appears twice", c->label, dup);
    free(names);
    return rc;
}

static int cmp_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* general.alignment, when present: a u32 power of two. */
static int read_alignment(cursor *c, gguf_file *f) {
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *a = gguf_find_kv(f, "general.alignment");
    if (!a) return 0;
    if (a->type != GGUF_U32)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: key 'general.alignment' has type %s, expected u32", c->label,
                          a->type == GGUF_ARRAY ? "array" : gguf_vtype_name(a->type));
    uint32_t v = (uint32_t)rd_le(a->data, 4);
    if (v == 0 || (v & (v - 1)) != 0)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: general.alignment is %u, not a power of two", c->label, v);
    f->alignment = v;
    return 0;
}

/* Data section: aligned offsets, inside the file, no two tensors overlapping. */
static int place_tensors(cursor *c, gguf_file *f) {
    const size_t al = f->alignment;
    if (c->pos > SIZE_MAX - al) return um_err_set(c->err, UM_ERR_FORMAT, "%s: file too large", c->label);
    f->data_start = (c->pos + al - 1) / al * al;
    if (f->n_tensors > 0 && f->data_start > c->len)
        return um_err_set(c->err, UM_ERR_FORMAT, "%s: the data section would start at byte %zu, past the end of the "
                          "%zu-byte file (truncated?)", c->label, f->data_start, c->len);
    const size_t avail = c->len >= f->data_start ? c->len - f->data_start : 0;
    for (int i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % al != 0)
            return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' has offset %" PRIu64 ", not a multiple of the "
                              "alignment %zu", c->label, t->name, t->offset, al);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' (%zu bytes at data offset %" PRIu64 ") ends past "
                              "the end of the file: the data section has %zu bytes (truncated?)", c->label, t->name,
                              t->nbytes, t->offset, avail);
        t->data = c->buf + f->data_start + t->offset;
    }
    if (f->n_tensors < 2) return 0;
    gguf_tensor **order = xmalloc((size_t)f->n_tensors * sizeof *order);
    for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_offset);
    int rc = 0;
    for (int i = 1; i < f->n_tensors && rc == 0; i++)
        if (order[i]->offset < order[i - 1]->offset + order[i - 1]->nbytes)
            rc = um_err_set(c->err, UM_ERR_FORMAT, "%s: tensor '%s' overlaps tensor '%s'", c->label, order[i]->name,
                            order[i - 1]->name);
    free(order);
    return rc;
}

int gguf_parse(const uint8_t *buf, size_t len, const char *label, gguf_file *f, um_err *err) {
    memset(f, 0, sizeof *f);
    cursor c = {.buf = buf, .len = len, .pos = 0, .label = label, .err = err};
    uint32_t version;
    if (len < 4 || (uint32_t)rd_le(buf, 4) != GGUF_MAGIC)
        return um_err_set(err, UM_ERR_FORMAT, "%s: not a GGUF file (it does not start with the bytes \"GGUF\")", label);
    c.pos = 4;
    if (rd_u32(&c, &version, "the version")) return -1;
    const uint32_t swapped = version >> 24 | (version >> 8 & 0xff00) | (version << 8 & 0xff0000) | version << 24;
    if (swapped == 2 || swapped == 3)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: big-endian GGUF file (version %u byte-swapped); unmask reads "
                          "little-endian GGUF only", label, swapped);
    if (version != 2 && version != 3)
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (only 2 and 3)", label, version);
    f->version = version;
    uint64_t n_tensors, n_kv;
    if (rd_u64(&c, &n_tensors, "the tensor count") || rd_u64(&c, &n_kv, "the metadata count")) return -1;
    if (n_kv > GGUF_MAX_ENTRIES || n_tensors > GGUF_MAX_ENTRIES)
        return um_err_set(err, UM_ERR_FORMAT, "%s: header claims %" PRIu64 " metadata entries and %" PRIu64 " tensors, "
                          "more than unmask reads (%u each)", label, n_kv, n_tensors, GGUF_MAX_ENTRIES);
    /* every entry takes bytes: a key-value pair at least 13, a tensor info at least 32 */
    if (n_kv > (len - c.pos) / 13 || n_tensors > (len - c.pos) / 32)
        return um_err_set(err, UM_ERR_FORMAT, "%s: header claims %" PRIu64 " metadata entries and %" PRIu64 " tensors, "
                          "more than the %zu-byte file can hold (truncated?)", label, n_kv, n_tensors, len);
    f->kv = xcalloc((size_t)(n_kv ? n_kv : 1), sizeof *f->kv);
    f->tensors = xcalloc((size_t)(n_tensors ? n_tensors : 1), sizeof *f->tensors);
    f->path = xstrdup(label);
    int rc = 0;
    for (uint64_t i = 0; i < n_kv && rc == 0; i++) {
        rc = parse_kv(&c, &f->kv[i]);
        f->n_kv++;   /* counted even on failure: gguf_free releases its key */
    }
    if (rc == 0) rc = read_alignment(&c, f);
    for (uint64_t i = 0; i < n_tensors && rc == 0; i++) {
        rc = parse_tensor_info(&c, &f->tensors[i]);
        f->n_tensors++;
    }
    if (rc == 0) rc = check_unique(&c, f);
    if (rc == 0) rc = place_tensors(&c, f);
    if (rc != 0) {
        gguf_free(f);
        return -1;
    }
    return 0;
}

int gguf_open(const char *path, gguf_file *f, um_err *err) {
    file_map map;
    memset(f, 0, sizeof *f);
    if (file_map_open(path, &map, err) != 0) return -1;
    if (gguf_parse(map.data, map.len, path, f, err) != 0) {
        file_map_close(&map);
        return -1;
    }
    f->map = map;
    return 0;
}

int gguf_path_is_gguf(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return 0;
    char m[4];
    int ok = fread(m, 1, 4, fp) == 4 && memcmp(m, "GGUF", 4) == 0;
    fclose(fp);
    return ok;
}

/* ---------------------------------------------------------------- lookup and typed access */

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (int i = 0; i < f->n_kv; i++)
        if (strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (int i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int wrong_type(const gguf_file *f, const gguf_kv *kv, const char *want, um_err *err) {
    if (kv->type == GGUF_ARRAY)
        return um_err_set(err, UM_ERR_FORMAT, "%s: key '%s' is an array of %s, expected %s", f->path, kv->key,
                          gguf_vtype_name(kv->arr_type), want);
    return um_err_set(err, UM_ERR_FORMAT, "%s: key '%s' has type %s, expected %s", f->path, kv->key,
                      gguf_vtype_name(kv->type), want);
}

/* A scalar integer of any width as int64 (u64 values past INT64_MAX saturate). */
static int64_t scalar_int(enum gguf_vtype t, const uint8_t *p) {
    switch (t) {
    case GGUF_U8: return p[0];
    case GGUF_I8: return (int8_t)p[0];
    case GGUF_U16: return (int64_t)rd_le(p, 2);
    case GGUF_I16: return (int16_t)rd_le(p, 2);
    case GGUF_U32: return (int64_t)rd_le(p, 4);
    case GGUF_I32: return (int32_t)rd_le(p, 4);
    case GGUF_U64: { uint64_t v = rd_le(p, 8); return v > INT64_MAX ? INT64_MAX : (int64_t)v; }
    case GGUF_I64: return (int64_t)rd_le(p, 8);
    default: return 0;
    }
}

static int is_int_type(enum gguf_vtype t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 || t == GGUF_I32 ||
           t == GGUF_U64 || t == GGUF_I64;
}

int gguf_kv_int(const gguf_file *f, const gguf_kv *kv, int64_t lo, int64_t hi, int64_t *out, um_err *err) {
    if (!is_int_type(kv->type)) return wrong_type(f, kv, "an integer", err);
    int64_t v = scalar_int(kv->type, kv->data);
    if (v < lo || v > hi)
        return um_err_set(err, UM_ERR_FORMAT, "%s: key '%s' is %" PRId64 ", must be between %" PRId64 " and %" PRId64,
                          f->path, kv->key, v, lo, hi);
    *out = v;
    return 0;
}

int gguf_kv_float(const gguf_file *f, const gguf_kv *kv, double *out, um_err *err) {
    if (kv->type == GGUF_F32) {
        uint32_t u = (uint32_t)rd_le(kv->data, 4);
        float x;
        memcpy(&x, &u, 4);
        *out = x;
    } else if (kv->type == GGUF_F64) {
        uint64_t u = rd_le(kv->data, 8);
        memcpy(out, &u, 8);
    } else if (is_int_type(kv->type)) {
        *out = (double)scalar_int(kv->type, kv->data);
    } else {
        return wrong_type(f, kv, "a number", err);
    }
    if (*out != *out) return um_err_set(err, UM_ERR_FORMAT, "%s: key '%s' is NaN", f->path, kv->key);
    return 0;
}

int gguf_kv_bool(const gguf_file *f, const gguf_kv *kv, int *out, um_err *err) {
    if (kv->type != GGUF_BOOL) return wrong_type(f, kv, "a bool", err);
    *out = kv->data[0] != 0;
    return 0;
}

int gguf_kv_str(const gguf_file *f, const gguf_kv *kv, const char **s, uint64_t *len, um_err *err) {
    if (kv->type != GGUF_STRING) return wrong_type(f, kv, "a string", err);
    *s = (const char *)kv->data;
    *len = kv->len;
    return 0;
}

void gguf_arr_str(const gguf_kv *kv, uint64_t i, const char **s, uint64_t *len) {
    CHECK(kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && i < kv->n);
    const uint8_t *p = kv->data + kv->str_off[i];
    *len = rd_le(p, 8);
    *s = (const char *)p + 8;
}

int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i) {
    CHECK(kv->type == GGUF_ARRAY && is_int_type(kv->arr_type) && i < kv->n);
    return scalar_int(kv->arr_type, kv->data + i * vtype_size(kv->arr_type));
}
