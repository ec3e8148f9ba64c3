/*
 * test_cuda_init.c — the CUDA backend's entry points on whatever machine runs the tests: device
 * names parse; with no GPU / driver (CI) or without CUDA compiled in, backend_cuda_init fails with
 * a clear um_err instead of aborting, and the comm's NCCL entry points fail cleanly when NCCL is
 * absent. With a GPU present (a lent device machine) init succeeds and reports the device. In a
 * CUDA build, the lazily dlopen'ed cuBLAS / NCCL entry points all resolve (the toolkit that built
 * unmask is on this machine; no GPU needed).
 */
#include <string.h>

#include "backend/comm.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_dl.h"
#include "test.h"

int main(void) {
    TEST_CHECK(backend_cuda_parse_device("cuda") == 0, "cuda");
    TEST_CHECK(backend_cuda_parse_device("cuda:3") == 3, "cuda:3");
    TEST_CHECK(backend_cuda_parse_device("cpu") == -1, "cpu");
    TEST_CHECK(backend_cuda_parse_device("cuda:") == -1, "cuda:");
    TEST_CHECK(backend_cuda_parse_device("cuda:1x") == -1, "cuda:1x");
    TEST_CHECK(backend_cuda_parse_device(NULL) == -1, "NULL");

    um_err err = {0};
    TEST_CHECK(backend_cuda_init("cpu", NULL, &err) == NULL && err.code != UM_ERR_NONE, "cpu is not a CUDA device");
    memset(&err, 0, sizeof err);
    const int n = backend_cuda_device_count();
    backend *be = backend_cuda_init("cuda:0", NULL, &err);
    if (!backend_cuda_compiled()) {
        TEST_CHECK(be == NULL && strstr(err.msg, "without CUDA"), "no CUDA compiled: %s", err.msg);
    } else if (n == 0) {
        TEST_CHECK(be == NULL && strstr(err.msg, "no CUDA device"), "no device: '%s'", err.msg);
        TEST_CHECK(err.code == UM_ERR_RESOURCE, "resource error code");
    } else {
        TEST_CHECK(be != NULL && backend_is_cuda(be), "device present: %s", err.msg);
        if (be) backend_free(be);
        memset(&err, 0, sizeof err);
        char name[32];
        snprintf(name, sizeof name, "cuda:%d", n);
        TEST_CHECK(backend_cuda_init(name, NULL, &err) == NULL && strstr(err.msg, "only"), "out-of-range device: %s", err.msg);
    }
#ifdef UNMASK_HAVE_CUDA
    memset(&err, 0, sizeof err);
    const cublas_fns *cb = cuda_dl_cublas(&err);
    TEST_CHECK(cb && cb->create && cb->gemm_ex && cb->set_workspace, "cuBLAS entry points: %s", err.msg);
#ifdef UNMASK_HAVE_NCCL
    memset(&err, 0, sizeof err);
    const nccl_fns *nf = cuda_dl_nccl(&err);
    TEST_CHECK(nf && nf->all_reduce && nf->comm_init_rank, "NCCL entry points: %s", err.msg);
    TEST_CHECK(comm_nccl_available(), "NCCL available");
    uint8_t uid[COMM_NCCL_ID_BYTES];
    memset(&err, 0, sizeof err);
    int rc = comm_nccl_unique_id(uid, &err);   /* no GPU needed for an id */
    TEST_CHECK(rc == 0 || strstr(err.msg, "NCCL"), "ncclGetUniqueId: %s", err.msg);
#endif
#endif
    if (!comm_nccl_available()) {
        uint8_t id[COMM_NCCL_ID_BYTES];
        memset(&err, 0, sizeof err);
        TEST_CHECK(comm_nccl_unique_id(id, &err) < 0 && strstr(err.msg, "NCCL"), "NCCL absent: %s", err.msg);
    }
    return test_report();
}
