/*
 * checkpoint.h — a Hugging Face checkpoint directory as downloaded: config.json and either one
 * model.safetensors or shards listed in model.safetensors.index.json ({"weight_map": {name: file}}).
 *
 * Every shard is mmapped and validated (safetensors.h); the index must name only files that exist
 * and tensors those files contain, and no tensor may live in two shards. Lookup is by tensor name.
 * Immutable after open; any thread may read.
 */
#ifndef UM_CHECKPOINT_H
#define UM_CHECKPOINT_H

#include "model/safetensors.h"
#include "util/err.h"

typedef struct checkpoint {
    char      *dir;            /* owned */
    st_file   *files;          /* [n_files] mmapped shards, owned (a GGUF file: one, its tensors
                                  under their Hugging Face names: model/gguf_model.c) */
    int        n_files;
    size_t     total_bytes;    /* sum of tensor bytes */
} checkpoint;

/* Parse an index file's text (fuzzable): returns the distinct shard names in first-seen order
 * (caller frees each and the array). */
int  checkpoint_index_parse(const char *json, size_t len, const char *label, char ***shards,
                            int *n_shards, um_err *err);
int  checkpoint_open(const char *dir, checkpoint *ck, um_err *err);
void checkpoint_free(checkpoint *ck);
/* The tensor with this name, or NULL. */
const st_tensor *checkpoint_find(const checkpoint *ck, const char *name);
/* Drop this process's pages of the checkpoint's mappings inside [p, p + n) (file_map_release): for
 * tensor bytes a backend has copied (packed, quantized). Memory outside the mappings is ignored. */
void checkpoint_release(const checkpoint *ck, const void *p, size_t n);

#endif /* UM_CHECKPOINT_H */
