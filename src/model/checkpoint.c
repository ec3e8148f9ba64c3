/*
 * checkpoint.c — open single-file or sharded safetensors checkpoints. Any thread.
 */
#include "model/checkpoint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fileio.h"
#include "util/log.h"

#define INDEX_MAX_BYTES (64u << 20)

int checkpoint_index_parse(const char *json, size_t len, const char *label, char ***shards,
                           int *n_shards, um_err *err) {
    *shards = NULL;
    *n_shards = 0;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return um_err_set(err, UM_ERR_FORMAT, "%s: invalid JSON: %s", label, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        json_decref(root);
        return um_err_set(err, UM_ERR_FORMAT, "%s: missing \"weight_map\" object", label);
    }
    int cap = 8, n = 0, rc = 0;
    char **list = xmalloc((size_t)cap * sizeof *list);
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            rc = um_err_set(err, UM_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", label, key);
            break;
        }
        const char *s = json_string_value(val);
        if (strchr(s, '/') || strcmp(s, "..") == 0 || !*s) {
            rc = um_err_set(err, UM_ERR_FORMAT, "%s: shard name '%s' must be a plain file name", label, s);
            break;
        }
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = strcmp(list[i], s) == 0;
        if (seen) continue;
        if (n == cap) list = xrealloc(list, (size_t)(cap *= 2) * sizeof *list);
        list[n++] = xstrdup(s);
    }
    json_decref(root);
    if (rc == 0 && n == 0) rc = um_err_set(err, UM_ERR_FORMAT, "%s: weight_map is empty", label);
    if (rc != 0) {
        for (int i = 0; i < n; i++) free(list[i]);
        free(list);
        return -1;
    }
    *shards = list;
    *n_shards = n;
    return 0;
}

void checkpoint_free(checkpoint *ck) {
    for (int i = 0; i < ck->n_files; i++) safetensors_free(&ck->files[i]);
    free(ck->files);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

/* Cross-check the index's weight_map against the shards' contents. */
static int check_index_map(const char *json, size_t len, const char *label, const checkpoint *ck,
                           um_err *err) {
    json_t *root = json_loadb(json, len, 0, NULL);
    json_t *wm = json_object_get(root, "weight_map");
    const char *key;
    json_t *val;
    int rc = 0;
    json_object_foreach(wm, key, val) {
        const char *shard = json_string_value(val);
        const st_file *f = NULL;
        for (int i = 0; i < ck->n_files; i++) {
            const char *base = strrchr(ck->files[i].path, '/');
            if (strcmp(base ? base + 1 : ck->files[i].path, shard) == 0) f = &ck->files[i];
        }
        if (!f || !safetensors_find(f, key)) {
            rc = um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' is mapped to %s but that shard does not contain it",
                            label, key, shard);
            break;
        }
    }
    json_decref(root);
    return rc;
}

int checkpoint_open(const char *dir, checkpoint *ck, um_err *err) {
    memset(ck, 0, sizeof *ck);
    ck->dir = xstrdup(dir);
    char path[4096];
    path_join(path, sizeof path, dir, "model.safetensors.index.json");
    if (file_exists(path)) {
        char *json;
        size_t len;
        if (file_read_all(path, INDEX_MAX_BYTES, &json, &len, err) != 0) goto fail;
        char **shards;
        int n;
        if (checkpoint_index_parse(json, len, path, &shards, &n, err) != 0) {
            free(json);
            goto fail;
        }
        ck->files = xcalloc((size_t)n, sizeof(st_file));
        int rc = 0;
        for (int i = 0; i < n; i++) {
            char sp[4096];
            path_join(sp, sizeof sp, dir, shards[i]);
            if (rc == 0 && !file_exists(sp))
                rc = um_err_set(err, UM_ERR_IO, "%s: shard %s listed in model.safetensors.index.json is missing",
                                dir, shards[i]);
            if (rc == 0) {
                rc = safetensors_open(sp, &ck->files[i], err);
                if (rc == 0) ck->n_files++;
            }
            free(shards[i]);
        }
        free(shards);
        if (rc == 0) rc = check_index_map(json, len, path, ck, err);
        free(json);
        if (rc != 0) goto fail;
    } else {
        path_join(path, sizeof path, dir, "model.safetensors");
        if (!file_exists(path)) {
            um_err_set(err, UM_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
            goto fail;
        }
        ck->files = xcalloc(1, sizeof(st_file));
        if (safetensors_open(path, &ck->files[0], err) != 0) goto fail;
        ck->n_files = 1;
    }
    /* a tensor name may appear in only one shard */
    for (int i = 0; i < ck->n_files; i++) {
        for (int j = 0; j < ck->files[i].n_tensors; j++) {
            const st_tensor *t = &ck->files[i].tensors[j];
            ck->total_bytes += t->nbytes;
            for (int k = i + 1; k < ck->n_files; k++)
                if (safetensors_find(&ck->files[k], t->name)) {
                    um_err_set(err, UM_ERR_FORMAT, "%s: tensor '%s' appears in both %s and %s", dir, t->name,
                               ck->files[i].path, ck->files[k].path);
                    goto fail;
                }
        }
    }
    return 0;
fail:
    checkpoint_free(ck);
    return -1;
}

const st_tensor *checkpoint_find(const checkpoint *ck, const char *name) {
    for (int i = 0; i < ck->n_files; i++) {
        const st_tensor *t = safetensors_find(&ck->files[i], name);
        if (t) return t;
    }
    return NULL;
}

void checkpoint_release(const checkpoint *ck, const void *p, size_t n) {
    for (int i = 0; i < ck->n_files; i++) file_map_release(&ck->files[i].map, p, n);
}
