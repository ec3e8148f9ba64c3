/*
 * cuda_dl.c — dlopen of cuBLAS (and cuBLASLt, which it needs) and NCCL on first use (cuda_dl.h).
 * Under the CPU CUDA emulator (UNMASK_CUDA_EMU, tests/emu/) the emulator's cuBLAS and NCCL subsets are
 * linked in and returned directly: nothing is loaded.
 * Does not: call into the libraries. Any thread; loading is serialised by pthread_once.
 */
#include "backend/cuda/cuda_dl.h"

#ifdef UNMASK_HAVE_CUDA

#ifdef UNMASK_CUDA_EMU

static const cublas_fns g_emu_cublas = {
    .create = cublasCreate_v2,
    .destroy = cublasDestroy_v2,
    .set_stream = cublasSetStream_v2,
    .set_workspace = cublasSetWorkspace_v2,
    .set_math_mode = cublasSetMathMode,
    .gemm_ex = cublasGemmEx,
};

const cublas_fns *cuda_dl_cublas(um_err *err) {
    (void)err;
    return &g_emu_cublas;
}

#ifdef UNMASK_HAVE_NCCL
static const nccl_fns g_emu_nccl = {
    .get_unique_id = ncclGetUniqueId,
    .comm_init_rank = ncclCommInitRank,
    .comm_destroy = ncclCommDestroy,
    .comm_init_rank_config = ncclCommInitRankConfig,
    .comm_get_async_error = ncclCommGetAsyncError,
    .comm_abort = ncclCommAbort,
    .comm_finalize = ncclCommFinalize,
    .all_reduce = ncclAllReduce,
    .all_gather = ncclAllGather,
    .broadcast = ncclBroadcast,
    .get_error_string = ncclGetErrorString,
    .get_last_error = ncclGetLastError,
};

const nccl_fns *cuda_dl_nccl(um_err *err) {
    (void)err;
    return &g_emu_nccl;
}
#endif

#else /* !UNMASK_CUDA_EMU */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#ifndef UNMASK_CUDA_LIBDIR
#define UNMASK_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif
#ifndef UNMASK_CUBLAS_SONAME
#define UNMASK_CUBLAS_SONAME "libcublas.so"
#endif
#ifndef UNMASK_CUBLASLT_SONAME
#define UNMASK_CUBLASLT_SONAME "libcublasLt.so"
#endif

/* dlopen by soname, then from dir; the first dlerror() is kept for the message */
static void *open_lib(const char *soname, const char *dir, char *why, size_t why_len) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
    if (h) return h;
    snprintf(why, why_len, "%s", dlerror());
    if (dir && *dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, soname);
        h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    }
    return h;
}

#define RESOLVE(lib, dst, name, why)                                                 \
    do {                                                                              \
        *(void **)(&(dst)) = dlsym(lib, name);                                        \
        if (!(dst)) {                                                                 \
            snprintf(why, sizeof why, "symbol %s missing", name);                     \
            ok = 0;                                                                   \
        }                                                                             \
    } while (0)

static pthread_once_t g_cublas_once = PTHREAD_ONCE_INIT;
static cublas_fns g_cublas;
static int g_cublas_ok;
static char g_cublas_why[512];

static void load_cublas(void) {
    /* cuBLASLt first: libcublas finds it through its $ORIGIN RUNPATH, or as already loaded */
    void *lt = open_lib(UNMASK_CUBLASLT_SONAME, UNMASK_CUDA_LIBDIR, g_cublas_why, sizeof g_cublas_why);
    void *h = lt ? open_lib(UNMASK_CUBLAS_SONAME, UNMASK_CUDA_LIBDIR, g_cublas_why, sizeof g_cublas_why) : NULL;
    if (!h) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", g_cublas_why);
        snprintf(g_cublas_why, sizeof g_cublas_why, "cannot load %s (also tried %s): %s",
                 lt ? UNMASK_CUBLAS_SONAME : UNMASK_CUBLASLT_SONAME, UNMASK_CUDA_LIBDIR, tmp);
        return;
    }
    int ok = 1;
    RESOLVE(h, g_cublas.create, "cublasCreate_v2", g_cublas_why);
    RESOLVE(h, g_cublas.destroy, "cublasDestroy_v2", g_cublas_why);
    RESOLVE(h, g_cublas.set_stream, "cublasSetStream_v2", g_cublas_why);
    RESOLVE(h, g_cublas.set_workspace, "cublasSetWorkspace_v2", g_cublas_why);
    RESOLVE(h, g_cublas.set_math_mode, "cublasSetMathMode", g_cublas_why);
    RESOLVE(h, g_cublas.gemm_ex, "cublasGemmEx", g_cublas_why);
    g_cublas_ok = ok;
}

const cublas_fns *cuda_dl_cublas(um_err *err) {
    pthread_once(&g_cublas_once, load_cublas);
    if (g_cublas_ok) return &g_cublas;
    um_err_set(err, UM_ERR_RESOURCE, "cuBLAS: %s", g_cublas_why);
    return NULL;
}

#ifdef UNMASK_HAVE_NCCL

#ifndef UNMASK_NCCL_LIBDIR
#define UNMASK_NCCL_LIBDIR UNMASK_CUDA_LIBDIR
#endif

static pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;
static nccl_fns g_nccl;
static int g_nccl_ok;
static char g_nccl_why[512];

static void load_nccl(void) {
    void *h = open_lib("libnccl.so.2", UNMASK_NCCL_LIBDIR, g_nccl_why, sizeof g_nccl_why);
    if (!h) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "%s", g_nccl_why);
        snprintf(g_nccl_why, sizeof g_nccl_why, "cannot load libnccl.so.2 (also tried %s): %s", UNMASK_NCCL_LIBDIR, tmp);
        return;
    }
    int ok = 1;
    RESOLVE(h, g_nccl.get_unique_id, "ncclGetUniqueId", g_nccl_why);
    RESOLVE(h, g_nccl.comm_init_rank, "ncclCommInitRank", g_nccl_why);
    RESOLVE(h, g_nccl.comm_destroy, "ncclCommDestroy", g_nccl_why);
    RESOLVE(h, g_nccl.comm_init_rank_config, "ncclCommInitRankConfig", g_nccl_why);
    RESOLVE(h, g_nccl.comm_get_async_error, "ncclCommGetAsyncError", g_nccl_why);
    RESOLVE(h, g_nccl.comm_abort, "ncclCommAbort", g_nccl_why);
    RESOLVE(h, g_nccl.comm_finalize, "ncclCommFinalize", g_nccl_why);
    RESOLVE(h, g_nccl.all_reduce, "ncclAllReduce", g_nccl_why);
    RESOLVE(h, g_nccl.all_gather, "ncclAllGather", g_nccl_why);
    RESOLVE(h, g_nccl.broadcast, "ncclBroadcast", g_nccl_why);
    RESOLVE(h, g_nccl.get_error_string, "ncclGetErrorString", g_nccl_why);
    RESOLVE(h, g_nccl.get_last_error, "ncclGetLastError", g_nccl_why);
    g_nccl_ok = ok;
}

const nccl_fns *cuda_dl_nccl(um_err *err) {
    pthread_once(&g_nccl_once, load_nccl);
    if (g_nccl_ok) return &g_nccl;
    um_err_set(err, UM_ERR_RESOURCE, "NCCL: %s", g_nccl_why);
    return NULL;
}

#endif /* UNMASK_HAVE_NCCL */

#endif /* UNMASK_CUDA_EMU */

#endif /* UNMASK_HAVE_CUDA */
