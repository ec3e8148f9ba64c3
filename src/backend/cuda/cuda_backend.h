/*
 * cuda_backend.h — the CUDA backend (backend.h ops on one GPU: bf16 weights and activations, fp32
 * accumulation, cuBLAS GEMMs, kernels/ for the rest) and the CUDA-only extras the decode engine,
 * the bench and the GPU tests need (device-resident inputs, CUDA graphs, memory checks).
 *
 * Always compiled: without CUDA (no nvcc at build time) backend_cuda_init() fails with a clear
 * um_err and backend_cuda_device_count() is 0. With CUDA, nothing touches the driver until
 * backend_cuda_init() / backend_cuda_device_count() is called, so the binary runs on machines
 * without a GPU; there init reports "no CUDA device" as a um_err.
 *
 * Threading: a backend instance is driven by one thread at a time (the engine thread of its GPU);
 * every entry point makes its device current on the calling thread first.
 */
#ifndef UM_CUDA_BACKEND_H
#define UM_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "util/err.h"

/* "cuda" -> 0, "cuda:N" -> N; -1 when s does not name a CUDA device (e.g. "cpu"). */
int backend_cuda_parse_device(const char *s);
/* 1 when the binary was built with CUDA. */
int backend_cuda_compiled(void);
/* Number of usable CUDA devices; 0 when built without CUDA, without a driver or without a GPU. */
int backend_cuda_device_count(void);
/* Open device "cuda:N": stream, cuBLAS handle, staging buffers; o's CUDA fields (NULL = the
 * defaults). NULL + err when there is no such device, no driver, compute capability < 9.0, or CUDA
 * was not compiled in. */
backend *backend_cuda_init(const char *device, const backend_options *o, um_err *err);
int      backend_is_cuda(const backend *be);

/* Device name and memory (bytes) of the backend's GPU. */
const char *backend_cuda_device_name(const backend *be);
/* The device's L2 cache in bytes. */
size_t      backend_cuda_l2_bytes(const backend *be);
void        backend_cuda_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes);
/* "Does the model fit": weight_bytes (bf16 on device) + act_bytes + a reserve for cuBLAS and
 * staging against cudaMemGetInfo's free memory. -1 + UM_ERR_RESOURCE with the numbers if not. */
int backend_cuda_check_fit(backend *be, uint64_t weight_bytes, uint64_t act_bytes, um_err *err);
/* Weight upload progress: total bytes expected (bf16 on device) and a label for the progress line;
 * 0 = unknown (progress then shows the running total). */
void backend_cuda_set_upload_total(backend *be, uint64_t bytes, const char *label);

/* Wait for all queued work of the backend's stream. */
void  backend_cuda_sync(backend *be);
/* The backend's cudaStream_t (as void * so callers need no CUDA headers). */
void *backend_cuda_stream(backend *be);

/* Device-resident inputs: while an alias is registered, any op given a HOST index array that lies
 * inside [host, host + bytes) reads the same offset of the device array dev instead of staging the
 * host copy (the host contents are then ignored). This is how a device-resident decode step feeds
 * its device canvas (embed ids) and LM-head rows (get_rows) to the unchanged forward pass. */
void backend_cuda_alias_add(backend *be, const void *host, const void *dev, size_t bytes);
void backend_cuda_alias_clear(backend *be);

/* CUDA graphs: everything the backend enqueues between begin and end is captured (index arrays are
 * staged into buffers owned by the graph; act_to_host is not allowed inside). Run one uncaptured
 * warm-up forward first so activation buffers exist. */
typedef backend_graph cuda_graph;   /* backend.h graphs, CUDA side */
void        backend_cuda_capture_begin(backend *be);
cuda_graph *backend_cuda_capture_end(backend *be);
void        cuda_graph_launch(cuda_graph *g);   /* aborts on a stale graph */
void        cuda_graph_free(cuda_graph *g);
/* 1 when a device buffer the graph may use was freed or replaced since its capture began (an
 * activation block act_free'd — e.g. the model's scratch regrown by a bigger forward — or released,
 * the get_rows scratch replaced): replaying it could read freed memory or write into a block that
 * now belongs to someone else. Recapture (or launch directly) instead. */
int         cuda_graph_stale(const cuda_graph *g);

/* Give the cached free activation blocks back to the driver (cudaFree; synchronises the device).
 * Returns the bytes released. For idle servers and tests; the allocator also does this by itself
 * when an allocation fails. Graphs captured before become stale if they could use those blocks. */
size_t backend_cuda_trim(backend *be);

/* Tests and tools. */
/* host f32 -> activation buffer (rounded to bf16); synchronous */
void   backend_cuda_act_from_host(backend *be, void *dst, const float *src, size_t n);
/* 1: attention always uses the plain fp32 kernel (cross-check of the tensor-core kernel) */
void   backend_cuda_force_generic_attention(backend *be, int on);
/* key splits of the tensor-core attention: 0 = auto (split while the grid leaves SMs idle), 1 =
 * never, n > 1 = n splits where the keys and the workspace allow (cross-checks of the split path) */
void   backend_cuda_attention_splits(backend *be, int n);
/* host index arrays staged for ops since the backend started: copies made, and stagings that reused
 * an earlier copy of the same bytes still on the device (e.g. one layer's sequence starts for the
 * next layer) */
void   backend_cuda_stage_stats(backend *be, uint64_t *copies, uint64_t *reused);
/* 1: bf16 products of <= 64 rows on cuBLAS (as above that; the default, --cuda-skinny off); 0: the skinny kernel */
void   backend_cuda_gemm_cublas(backend *be, int on);
/* Measurement only (gpu_gemm_bench): 1 lets cuBLAS reduce split-K partials in bf16 (PyTorch's default
 * for bf16 GEMMs), 0 (unmask's setting) keeps every reduction in fp32. */
void   backend_cuda_cublas_reduced_precision(backend *be, int allow);
/* the skinny kernel's K ranges: n forced (gpu_gemm_bench), 0 = its own choice; and those of its last launch */
void   backend_cuda_gemm_splits(backend *be, int n);
int    backend_cuda_gemm_last_splits(backend *be);
/* 1: BACKEND_CAP_FUSED's ops as one kernel each (the default); 0: as their single kernels, as
 * backend_options.cuda_unfused (--cuda-fuse off) */
void   backend_cuda_fuse(backend *be, int on);
/* The BACKEND_PACK_* models loaded from now on join (UNMASK_CUDA_PACK; tests) */
void   backend_cuda_pack(backend *be, unsigned mask);
/* 0: every staging copies (A/B of the reuse); 1: reuse (the default) */
void   backend_cuda_stage_reuse(backend *be, int on);
/* 1: MoE layers uploaded from now on decline the device dispatch (BACKEND_CAP_MOE) and route on the
 * host (cross-check of the device path; cuda_moe.c) */
void   backend_cuda_force_host_moe(backend *be, int on);
/* device-to-device copy bandwidth in bytes/s (bytes read + written) over a buffer of `bytes`,
 * median of `reps` timed copies */
double backend_cuda_copy_bandwidth(backend *be, size_t bytes, int reps);
/* device buffers (raw bytes) for tools that run kernels directly */
void  *backend_cuda_malloc(backend *be, size_t bytes);
void   backend_cuda_free_dev(backend *be, void *p);
void   backend_cuda_memcpy_h2d(backend *be, void *dst, const void *src, size_t bytes);
void   backend_cuda_memcpy_d2h(backend *be, void *dst, const void *src, size_t bytes);

#endif /* UM_CUDA_BACKEND_H */
