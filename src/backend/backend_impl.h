/*
 * backend_impl.h — what a backend implements: the ops table behind the opaque `backend` handle of
 * backend.h, and the handle itself. Included by the implementations (cpu/, cuda/), backend.c (the
 * public wrappers) and tests that drive one implementation's ops directly; never by model/ or the
 * layers above, which see only backend.h.
 *
 * Members marked (optional) may be NULL: the wrapper in backend.c then does the documented
 * host-memory / synchronous thing, and backend_has() reports the capability as absent. A group of
 * optional members forms one capability (backend.h enum backend_cap): a backend sets all of its
 * members or none. The required members are the forward pass's ops; their semantics are in
 * backend.h next to the wrappers.
 *
 * Threading: as backend.h (one driving thread per instance).
 */
#ifndef UM_BACKEND_IMPL_H
#define UM_BACKEND_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/backend_decode.h"
#include "backend/comm.h"
#include "util/dtype.h"
#include "util/err.h"

typedef struct backend_ops {
    const char *name;          /* implementation name ("cpu", "cuda"): logs only */

    /* ------------------------------------------------ required: weights, activations, forward ops */
    int   (*weight_upload)(backend *be, const bweight_src *src, bweight *out, um_err *err);
    void  (*weight_free)(backend *be, bweight *w);
    void *(*act_alloc)(backend *be, size_t n);
    void  (*act_free)(backend *be, void *p);
    void  (*act_to_host)(backend *be, const void *src, size_t n, float *dst);
    void  (*embed)(backend *be, const bweight *wte, const int32_t *ids, int n, void *out);
    void  (*rmsnorm)(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out);
    void  (*matmul)(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y);
    void  (*rope)(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                  float theta);
    void  (*attention)(backend *be, const attn_params *p, const void *q, const void *k, const void *v, void *out);
    void  (*swiglu)(backend *be, const void *gate, const void *up, size_t n, void *out);
    void  (*add)(backend *be, void *x, const void *y, size_t n);
    void  (*get_rows)(backend *be, const void *x, int d, const int32_t *rows, int n, void *out);
    void  (*store_rows)(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start, const int32_t *pos,
                        void *const *dst);
    void  (*moe_combine)(backend *be, void *x, const void *y, int d, int n, int k, const int32_t *slot,
                         const float *w);
    void  (*free)(backend *be);
    /* (optional, not a capability) fused linear layer; NULL: backend_linear runs the single ops
     * (backend_linear_unfused, which an implementation may also call for the cases it does not fuse) */
    void  (*linear)(backend *be, const blinear *op);
    /* (optional, not a capability) n activation elements set to 0; NULL: memset (host memory) */
    void  (*act_zero)(backend *be, void *p, size_t n);
    /* (optional, not a capability) host loop on the backend's threads (backend_host_parallel_for);
     * NULL: the calling thread runs every chunk */
    void  (*host_parallel_for)(backend *be, int64_t n, int64_t grain, backend_range_fn fn, void *arg);
    /* (optional, not a capability) backend_weight_keeps_source; NULL: always 1 (views kept) */
    int   (*weight_keeps_source)(backend *be, const bweight *w);
    /* BACKEND_CAP_QUANT (a flag, not a member function): 1 when weight_upload takes Q8_0 / Q4_0
     * sources and bweight_src.quant, and every op reads such weights */
    int   quant_weights;
    /* BACKEND_CAP_FP8 (a flag): 1 when weight_upload takes DTYPE_F8_E4M3 sources with scales and
     * bweight_src.quant = DTYPE_F8_E4M3, and matmul / linear read such weights */
    int   fp8_weights;

    /* ------------------------------------------------ BACKEND_CAP_DEVICE_MEMORY */
    /* (optional) free / total device memory in bytes */
    void  (*mem_info)(backend *be, size_t *free_bytes, size_t *total_bytes);
    /* (optional) weights + activations + the backend's reserve against free memory */
    int   (*check_fit)(backend *be, uint64_t weight_bytes, uint64_t act_bytes, um_err *err);
    /* (optional) expected upload bytes for the progress line */
    void  (*set_upload_total)(backend *be, uint64_t bytes, const char *label);
    /* (optional) release the allocator's cached free blocks; bytes released */
    size_t (*trim)(backend *be);
    /* (optional, not part of the capability) device-to-device copy bandwidth, bytes/s */
    double (*mem_bandwidth)(backend *be, size_t bytes, int reps);

    /* ------------------------------------------------ BACKEND_CAP_ASYNC */
    /* (optional) wait for all queued work */
    void  (*synchronize)(backend *be);

    /* ------------------------------------------------ BACKEND_CAP_GRAPHS */
    void           (*graph_begin)(backend *be);                              /* (optional) */
    backend_graph *(*graph_end)(backend *be);                                /* (optional) */
    void           (*graph_launch)(backend *be, backend_graph *g);           /* (optional) */
    int            (*graph_stale)(backend *be, const backend_graph *g);      /* (optional) */
    void           (*graph_free)(backend *be, backend_graph *g);             /* (optional) */

    /* ------------------------------------------------ BACKEND_CAP_DEVICE_DECODE (backend_decode.h) */
    void          *(*buf_alloc)(backend *be, size_t bytes);                  /* (optional) */
    void           (*buf_free)(backend *be, void *p);                        /* (optional) */
    void           (*buf_set_async)(backend *be, void *dst, const void *src, size_t bytes);   /* (optional) */
    void           (*buf_get_async)(backend *be, void *dst, const void *src, size_t bytes);   /* (optional) */
    void          *(*host_alloc)(backend *be, size_t bytes);                 /* (optional) pinned */
    void           (*host_free)(backend *be, void *p);                       /* (optional) */
    backend_event *(*event_new)(backend *be);                                /* (optional) */
    void           (*event_free)(backend *be, backend_event *ev);            /* (optional) */
    void           (*event_record)(backend *be, backend_event *ev);          /* (optional) */
    int            (*event_query)(backend *be, backend_event *ev);           /* (optional) */
    void           (*event_wait)(backend *be, backend_event *ev);            /* (optional) */
    double         (*event_elapsed_ms)(backend *be, backend_event *a, backend_event *b);       /* (optional) */
    void           (*alias_add)(backend *be, const void *host, const void *dev, size_t bytes); /* (optional) */
    void           (*alias_clear)(backend *be);                              /* (optional) */
    /* (optional) host index arrays the ops copied to the device so far, and those that reused an
     * earlier copy of the same bytes (the profile reports them per step) */
    void           (*stage_stats)(backend *be, uint64_t *copies, uint64_t *reused);
    void           (*decode_begin)(backend *be, const bdec_launch *l);       /* (optional) */
    void           (*decode_sample)(backend *be, const bdec_launch *l, const void *logits);    /* (optional) */
    void           (*decode_commit)(backend *be, const bdec_launch *l);      /* (optional) */

    /* ------------------------------------------------ BACKEND_CAP_MOE */
    bmoe          *(*moe_prepare)(backend *be, const bmoe_desc *desc);      /* (optional) NULL: unsupported */
    void           (*moe_release)(backend *be, bmoe *m);                     /* (optional) */
    size_t         (*moe_workspace)(backend *be, const bmoe *m, int n);      /* (optional) */
    void           (*moe_forward)(backend *be, const bmoe *m, const void *logits, const void *h, int n, void *x,
                                  void *ws);                                 /* (optional) */

    /* ------------------------------------------------ BACKEND_CAP_FUSED */
    void           (*rope_kv)(backend *be, const brope_kv *op);              /* (optional) */
    void           (*add_rmsnorm)(backend *be, void *x, const void *y, const bweight *w, int n, int d, float eps,
                                  void *out);                                /* (optional) */
    unsigned       (*packs)(backend *be);       /* (optional) BACKEND_PACK_* (backend_packs) */

    /* ------------------------------------------------ BACKEND_CAP_COMM */
    /* (optional) join a collective group on this backend's device (see backend_comm_join) */
    comm *(*comm_join)(backend *be, const uint8_t id[COMM_ID_BYTES], int rank, int world,
                       int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err);
} backend_ops;

/* backend_linear as the single ops (rmsnorm, matmul, add, swiglu) in the order backend.h gives. */
void backend_linear_unfused(backend *be, const blinear *op);

typedef struct backend_prof backend_prof;

struct backend {
    const backend_ops *ops;
    const char        *name;         /* "cpu", "cuda:0" (owned by the implementation) */
    const char        *description;  /* device name; NULL = name */
    enum dtype         act_dtype;    /* activation dtype (F32 on CPU, BF16 on CUDA) */
    int                n_threads;
    void              *impl;         /* backend private state */
    backend_prof      *prof;         /* per-op timing while profiling (backend_prof.c), else NULL; owned */
};

/* backend_prof.c, for the backend.c wrappers: a timed pair around one op (-1: not profiling; nested
 * ops count once), and the pause while a graph is captured. */
int  backend_prof_begin(backend *be, const char *op);
void backend_prof_end(backend *be, int i);
void backend_prof_pause(backend *be, int on);

#endif /* UM_BACKEND_IMPL_H */
