/*
 * umk_emu_cublas.cpp — the cuBLAS subset of the unmask CUDA emulator (tests/emu/include/cublas_v2.h),
 * written from the cuBLAS documentation: column-major C = alpha op(A) op(B) + beta C with
 * op(A) m x k, op(B) k x n, C m x n; A stored lda x (k for N, m for T), lda >= max(1, m for N, k for
 * T); likewise ldb >= max(1, k for N, n for T), ldc >= max(1, m). A/B/C of type CUDA_R_16BF or
 * CUDA_R_32F, fp32 compute (8 interleaved float partial sums over k), bf16 output rounded to nearest
 * even; beta = 0 does not read C. alpha/beta are host pointers (the default pointer mode) and are
 * read at call time, so a captured GEMM keeps their values. Every operand range is checked against
 * the live device allocations. Runs on the handle's stream (a graph node while it captures).
 * Does not: other routines, device pointer mode, split-K or tensor-core summation orders.
 * Threading: a handle is used by one thread at a time (as with cuBLAS).
 */
#include <stdio.h>
#include <string.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "umk_emu_internal.h"

struct umk_emu_cublas {
    cudaStream_t stream;
    void        *workspace;
    size_t       workspace_bytes;
    int          math_mode;
    int          device;
};

namespace {

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : t == CUDA_R_16BF ? 2 : 0; }

float load(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return static_cast<const float *>(p)[i];
    return umk_emu_bf16_bits_to_f32(static_cast<const uint16_t *>(p)[i]);
}

void store(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_32F) static_cast<float *>(p)[i] = v;
    else static_cast<uint16_t *>(p)[i] = umk_emu_f32_to_bf16_bits(v);
}

// bytes spanned by a column-major rows x cols matrix with leading dimension ld
size_t span(int rows, int cols, int ld, cudaDataType_t t) {
    if (rows <= 0 || cols <= 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * type_bytes(t);
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new umk_emu_cublas{nullptr, nullptr, 0, CUBLAS_DEFAULT_MATH, umk_emu::current_device()};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void *workspace, size_t bytes) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && (!workspace || !umk_emu::is_device_range(workspace, bytes, handle->device)))
        umk_emu::fatal("cublasSetWorkspace: [%p, +%zu) is not device memory of device %d", workspace, bytes,
                       handle->device);
    if (((uintptr_t)workspace & 255) != 0) return CUBLAS_STATUS_INVALID_VALUE;   // must be 256-byte aligned
    handle->workspace = workspace;
    handle->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math_mode = (int)mode;
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

namespace {

struct gemm_args {
    bool ta, tb;
    int m, n, k, lda, ldb, ldc;
    float al, be;
    cudaDataType_t Atype, Btype, Ctype;
};

// Argument checks shared by the GEMM entry points (status, as cuBLAS returns it).
cublasStatus_t gemm_check(cublasHandle_t handle, const char *what, cublasOperation_t transa, cublasOperation_t transb,
                          int m, int n, int k, const void *alpha, cudaDataType_t Atype, int lda, cudaDataType_t Btype,
                          int ldb, const void *beta, cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                          gemm_args *g) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (umk_emu::current_device() != handle->device)
        umk_emu::fatal("%s: handle of device %d used while device %d is current", what, handle->device,
                       umk_emu::current_device());
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_PEDANTIC) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!type_bytes(Atype) || !type_bytes(Btype) || !type_bytes(Ctype)) return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    const int lda_min = ta ? k : m, ldb_min = tb ? n : k;
    if (m < 0 || n < 0 || k < 0 || lda < (lda_min > 1 ? lda_min : 1) || ldb < (ldb_min > 1 ? ldb_min : 1) ||
        ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    *g = gemm_args{ta, tb, m, n, k, lda, ldb, ldc, *static_cast<const float *>(alpha), *static_cast<const float *>(beta),
                   Atype, Btype, Ctype};
    return CUBLAS_STATUS_SUCCESS;
}

// Every operand inside a live allocation of device `dev` (fatal otherwise: a bug of the caller).
void gemm_ranges(const char *what, const gemm_args &g, const void *A, const void *B, const void *C, int dev) {
    const size_t a_bytes = span(g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.lda, g.Atype);
    const size_t b_bytes = span(g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.ldb, g.Btype), c_bytes = span(g.m, g.n, g.ldc, g.Ctype);
    if (g.k > 0 && (!umk_emu::is_device_range(A, a_bytes, dev) || !umk_emu::is_device_range(B, b_bytes, dev)))
        umk_emu::fatal("%s(m=%d n=%d k=%d lda=%d ldb=%d, op %c%c): A [%p, +%zu) or B [%p, +%zu) is not "
                       "inside a device allocation of device %d", what, g.m, g.n, g.k, g.lda, g.ldb, g.ta ? 'T' : 'N',
                       g.tb ? 'T' : 'N', A, a_bytes, B, b_bytes, dev);
    if (!umk_emu::is_device_range(C, c_bytes, dev))
        umk_emu::fatal("%s(m=%d n=%d ldc=%d): C [%p, +%zu) is not inside a device allocation of device %d", what, g.m,
                       g.n, g.ldc, C, c_bytes, dev);
}

// C = al op(A) op(B) + be C on the calling (stream) thread
void gemm_run(const gemm_args &g, const void *A, const void *B, void *C) {
    const int m = g.m, n = g.n, k = g.k;
    // op(A) as rows i of k floats, op(B) as columns j of k floats
    std::vector<float> a((size_t)m * (size_t)k), b((size_t)n * (size_t)k);
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++)
            a[(size_t)i * k + p] = load(A, g.Atype, g.ta ? (size_t)p + (size_t)i * g.lda : (size_t)i + (size_t)p * g.lda);
    for (int j = 0; j < n; j++)
        for (int p = 0; p < k; p++)
            b[(size_t)j * k + p] = load(B, g.Btype, g.tb ? (size_t)j + (size_t)p * g.ldb : (size_t)p + (size_t)j * g.ldb);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const float *ar = &a[(size_t)i * k], *bc = &b[(size_t)j * k];
            float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int p = 0;
            for (; p + 8 <= k; p += 8)
                for (int u = 0; u < 8; u++) part[u] += ar[p + u] * bc[p + u];
            for (; p < k; p++) part[0] += ar[p] * bc[p];
            const float acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
            const size_t ci = (size_t)i + (size_t)j * g.ldc;
            float v = g.al * acc;
            if (g.be != 0.0f) v += g.be * load(C, g.Ctype, ci);
            store(C, g.Ctype, ci, v);
        }
}

}  // namespace

extern "C" {

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda, const void *B,
                            cudaDataType_t Btype, int ldb, const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
    (void)algo;
    gemm_args g;
    const cublasStatus_t st = gemm_check(handle, "cublasGemmEx", transa, transb, m, n, k, alpha, Atype, lda, Btype, ldb,
                                         beta, Ctype, ldc, computeType, &g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    gemm_ranges("cublasGemmEx", g, A, B, C, handle->device);
    umk_emu::enqueue(handle->stream, "cublasGemmEx", [=] { gemm_run(g, A, B, C); });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
