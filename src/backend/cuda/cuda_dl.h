/*
 * cuda_dl.h — cuBLAS and NCCL loaded with dlopen on first use (only compiled with UNMASK_HAVE_CUDA).
 *
 * Why: cuBLASLt alone maps ~540 MB; linking it would make every unmask process — CPU-only runs,
 * tests under `ulimit -v` — pay for it. The CUDA runtime is linked statically (small; it loads the
 * driver lazily), and the two big libraries are opened only when a CUDA backend or an NCCL comm is
 * created: by soname first (LD_LIBRARY_PATH, ldconfig), then from the toolkit directory seen at
 * build time. Failing to load is a um_err ("cannot load libcublas.so.13: ..."), not an abort.
 * Threading: any thread; loading happens once (pthread_once).
 */
#ifndef UM_CUDA_DL_H
#define UM_CUDA_DL_H

#ifdef UNMASK_HAVE_CUDA

#include <cublas_v2.h>

#include "util/err.h"

typedef struct cublas_fns {
    __typeof__(cublasCreate_v2)      *create;
    __typeof__(cublasDestroy_v2)     *destroy;
    __typeof__(cublasSetStream_v2)   *set_stream;
    __typeof__(cublasSetWorkspace_v2) *set_workspace;
    __typeof__(cublasSetMathMode)    *set_math_mode;
    __typeof__(cublasGemmEx)         *gemm_ex;
} cublas_fns;

/* The cuBLAS entry points, or NULL + err. */
const cublas_fns *cuda_dl_cublas(um_err *err);

#ifdef UNMASK_HAVE_NCCL
#include <nccl.h>

typedef struct nccl_fns {
    __typeof__(ncclGetUniqueId)    *get_unique_id;
    __typeof__(ncclCommInitRank)   *comm_init_rank;
    __typeof__(ncclCommDestroy)    *comm_destroy;
    __typeof__(ncclCommInitRankConfig) *comm_init_rank_config;   /* non-blocking init (config.blocking = 0) */
    __typeof__(ncclCommGetAsyncError)  *comm_get_async_error;
    __typeof__(ncclCommAbort)          *comm_abort;
    __typeof__(ncclCommFinalize)       *comm_finalize;
    __typeof__(ncclAllReduce)      *all_reduce;
    __typeof__(ncclAllGather)      *all_gather;
    __typeof__(ncclBroadcast)      *broadcast;
    __typeof__(ncclGetErrorString) *get_error_string;
    __typeof__(ncclGetLastError)   *get_last_error;
} nccl_fns;

/* The NCCL entry points, or NULL + err. */
const nccl_fns *cuda_dl_nccl(um_err *err);
#endif

#endif /* UNMASK_HAVE_CUDA */
#endif /* UM_CUDA_DL_H */
