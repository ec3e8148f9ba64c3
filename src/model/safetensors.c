/*
 * safetensors.c — safetensors reader/writer (see safetensors.h for the contract).
 * Any thread. Uses jansson for the header; no tensor data is copied on read.
 */
#include "model/safetensors.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* ---------------------------------------------------------------- dtype table */

static const struct { const char *name; int bits; enum dtype type; } k_dtypes[] = {
    {"BOOL", 8, DTYPE_OTHER},      {"F4", 4, DTYPE_OTHER},          {"F6_E2M3", 6, DTYPE_OTHER},
    {"F6_E3M2", 6, DTYPE_OTHER},   {"U8", 8, DTYPE_OTHER},          {"I8", 8, DTYPE_OTHER},
    {"F8_E5M2", 8, DTYPE_OTHER},   {"F8_E4M3", 8, DTYPE_F8_E4M3},   {"F8_E8M0", 8, DTYPE_OTHER},
    {"F8_E4M3FNUZ", 8, DTYPE_OTHER}, {"F8_E5M2FNUZ", 8, DTYPE_OTHER}, {"I16", 16, DTYPE_OTHER},
    {"U16", 16, DTYPE_OTHER},      {"F16", 16, DTYPE_F16},          {"BF16", 16, DTYPE_BF16},
    {"I32", 32, DTYPE_OTHER},      {"U32", 32, DTYPE_OTHER},        {"F32", 32, DTYPE_F32},
    {"C64", 64, DTYPE_OTHER},      {"F64", 64, DTYPE_OTHER},        {"I64", 64, DTYPE_OTHER},
    {"U64", 64, DTYPE_OTHER},
};

static int dtype_lookup(const char *s, int *bits, enum dtype *type) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++) {
        if (strcmp(s, k_dtypes[i].name) == 0) {
            *bits = k_dtypes[i].bits;
            *type = k_dtypes[i].type;
            return 0;
        }
    }
    return -1;
}

/* ---------------------------------------------------------------- reader */

static int cmp_offset(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    /* empty tensors share offsets with their neighbour; order them first */
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const st_tensor *)a)->name, ((const st_tensor *)b)->name);
}

void safetensors_free(st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    file_map_close(&f->map);
    memset(f, 0, sizeof *f);
}

/* Parse one tensor entry; returns 0 or fills err. */
static int parse_entry(const char *label, const char *key, json_t *val, size_t data_len,
                       st_tensor *t, um_err *err) {
    if (!json_is_object(val))
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': entry is not an object", label, key);
    json_t *jd = json_object_get(val, "dtype");
    json_t *js = json_object_get(val, "shape");
    json_t *jo = json_object_get(val, "data_offsets");
    if (!json_is_string(jd))
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': missing or non-string dtype", label, key);
    if (!json_is_array(js))
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': missing shape array", label, key);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end]",
                          label, key);
    int bits;
    enum dtype type;
    const char *ds = json_string_value(jd);
    if (dtype_lookup(ds, &bits, &type) != 0)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", label, key, ds);
    snprintf(t->type_name, sizeof t->type_name, "%s", ds);
    t->type = type;
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': rank %zu exceeds %d", label, key, nd,
                          ST_MAX_DIMS);
    t->ndim = (int)nd;
    /* n_elems * bits must not overflow: cap at 2^60 bits */
    unsigned __int128 n = 1;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                              label, key, i);
        t->shape[i] = json_integer_value(d);
        n *= (unsigned __int128)t->shape[i];
        if (n > ((unsigned __int128)1 << 60))
            return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': shape too large", label, key);
    }
    t->n_elems = (int64_t)n;
    unsigned __int128 total_bits = n * (unsigned)bits;
    if (total_bits % 8)
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': %s size is not a whole number of bytes",
                          label, key, ds);
    json_t *b0 = json_array_get(jo, 0), *b1 = json_array_get(jo, 1);
    if (!json_is_integer(b0) || !json_is_integer(b1) || json_integer_value(b0) < 0 ||
        json_integer_value(b1) < json_integer_value(b0))
        return um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s': invalid data_offsets", label, key);
    size_t begin = (size_t)json_integer_value(b0), end = (size_t)json_integer_value(b1);
    if ((unsigned __int128)(end - begin) != total_bits / 8)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: tensor '%s': shape x dtype is %" PRIu64 " bytes but data_offsets span %zu",
                          label, key, (uint64_t)(total_bits / 8), end - begin);
    if (end > data_len)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets end %zu beyond the %zu data bytes in the file "
                          "(truncated?)", label, key, end, data_len);
    t->offset = begin;
    t->nbytes = end - begin;
    return 0;
}

int safetensors_parse(const uint8_t *buf, size_t len, const char *label, st_file *f, um_err *err) {
    memset(f, 0, sizeof *f);
    if (len < 8)
        return um_err_set(err, UM_ERR_FORMAT, "%s: file is %zu bytes, too short for a safetensors header",
                          label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > ST_MAX_HEADER)
        return um_err_set(err, UM_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the %u-byte limit",
                          label, hlen, ST_MAX_HEADER);
    if (hlen < 2 || 8 + hlen > len)
        return um_err_set(err, UM_ERR_FORMAT,
                          "%s: header length %" PRIu64 " does not fit in the %zu-byte file (truncated?)",
                          label, hlen, len);
    if (buf[8] != '{')
        return um_err_set(err, UM_ERR_FORMAT, "%s: header does not start with '{'", label);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return um_err_set(err, UM_ERR_FORMAT, "%s: header JSON: %s (at byte %d)", label, jerr.text,
                          jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return um_err_set(err, UM_ERR_FORMAT, "%s: header is not a JSON object", label);
    }
    size_t data_len = len - 8 - (size_t)hlen;
    const uint8_t *data = buf + 8 + hlen;
    size_t cap = json_object_size(root);
    f->tensors = xcalloc(cap ? cap : 1, sizeof(st_tensor));
    f->n_tensors = 0;
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: __metadata__ is not an object", label);
                break;
            }
            continue;
        }
        st_tensor *t = &f->tensors[f->n_tensors];
        if (parse_entry(label, key, val, data_len, t, err) != 0) {
            rc = -1;
            break;
        }
        t->name = xstrdup(key);
        t->data = data + t->offset;
        f->n_tensors++;
    }
    json_decref(root);
    if (rc == 0 && f->n_tensors > 0) {
        /* tiling: sorted by offset, each begins where the previous ends, last ends at data_len */
        st_tensor **order = xmalloc((size_t)f->n_tensors * sizeof *order);
        for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
        qsort(order, (size_t)f->n_tensors, sizeof *order, cmp_offset);
        size_t at = 0;
        for (int i = 0; i < f->n_tensors && rc == 0; i++) {
            st_tensor *t = order[i];
            if (t->offset < at)
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' overlaps the previous tensor '%s'",
                                label, t->name, order[i - 1]->name);
            else if (t->offset > at)
                rc = um_err_set(err, UM_ERR_FORMAT, "%s: hole of %zu bytes before tensor '%s'", label,
                                t->offset - at, t->name);
            at = t->offset + t->nbytes;
        }
        if (rc == 0 && at != data_len)
            rc = um_err_set(err, UM_ERR_FORMAT,
                            "%s: tensors end at byte %zu of the %zu-byte data section (%s)", label, at,
                            data_len, at < data_len ? "trailing bytes" : "truncated");
        free(order);
    } else if (rc == 0 && data_len != 0) {
        rc = um_err_set(err, UM_ERR_FORMAT, "%s: %zu data bytes but no tensors", label, data_len);
    }
    if (rc != 0) {
        safetensors_free(f);
        return -1;
    }
    safetensors_sort(f);
    f->path = xstrdup(label);
    f->header_len = 8 + (size_t)hlen;
    return 0;
}

int safetensors_open(const char *path, st_file *f, um_err *err) {
    file_map map;
    if (file_map_open(path, &map, err) != 0) return -1;
    if (safetensors_parse(map.data, map.len, path, f, err) != 0) {
        file_map_close(&map);
        return -1;
    }
    f->map = map;
    return 0;
}

void safetensors_sort(st_file *f) { qsort(f->tensors, (size_t)f->n_tensors, sizeof(st_tensor), cmp_name); }

const st_tensor *safetensors_find(const st_file *f, const char *name) {
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        int c = strcmp(name, f->tensors[mid].name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) hi = mid - 1; else lo = mid + 1;
    }
    return NULL;
}

/* ---------------------------------------------------------------- writer */

int safetensors_write_header(FILE *fp, const st_write_tensor *t, int n, const char *metadata_json) {
    json_t *root = json_object();
    if (metadata_json) {
        json_t *meta = json_loads(metadata_json, 0, NULL);
        CHECK(meta && json_is_object(meta));
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(e, "dtype", json_string(t[i].dtype));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets",
                            json_pack("[II]", (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        json_object_set_new(root, t[i].name, e);
        off += t[i].nbytes;
    }
    char *hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(lenb, 1, 8, fp) == 8 && fwrite(hdr, 1, hl, fp) == hl;
    for (size_t i = hl; i < padded && ok; i++) ok = fputc(' ', fp) != EOF;
    free(hdr);
    return ok ? 0 : -1;
}

int safetensors_write(const char *path, const st_write_tensor *t, int n, const char *metadata_json,
                      um_err *err) {
    char tmp[4096 + 32];
    FILE *fp = file_replace_begin(path, tmp, sizeof tmp);
    if (!fp) return um_err_set(err, UM_ERR_IO, "%s: cannot create", path);
    int ok = safetensors_write_header(fp, t, n, metadata_json) == 0;
    for (int i = 0; i < n && ok; i++)
        ok = t[i].nbytes == 0 || fwrite(t[i].data, 1, t[i].nbytes, fp) == t[i].nbytes;
    if (file_replace_end(fp, tmp, path, ok) != 0) return um_err_set(err, UM_ERR_IO, "%s: write failed", path);
    return 0;
}
