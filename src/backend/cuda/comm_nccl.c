/*
 * comm_nccl.c — the comm interface over NCCL (comm.h): one rank per GPU, device buffers,
 * collectives enqueued on the rank's CUDA stream (no host synchronisation except in barrier).
 * Multi-node: node 0 creates the unique id (comm_nccl_unique_id) and hands it to the other nodes
 * with comm_bootstrap_exchange; every GPU thread then calls comm_nccl_init with its global rank.
 *
 * Communicators are non-blocking (ncclConfig_t.blocking = 0, NCCL >= 2.14): the init is polled with
 * ncclCommGetAsyncError and can be aborted (ncclCommAbort) when another rank fails or a deadline
 * passes; every later call that answers ncclInProgress is waited for the same way (nccl_wait), so
 * collectives keep their enqueue-and-return behaviour.
 * Does not: pick ranks or devices (the engine does). Without NCCL at build time only the stubs at
 * the end are compiled and comm_nccl_available() is 0.
 * Threading: each rank's handle on its own engine thread; init may run concurrently on all of them.
 */
#include "backend/comm.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

#if defined(UNMASK_HAVE_CUDA) && defined(UNMASK_HAVE_NCCL)

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "backend/cuda/cuda_dl.h"
#include "backend/cuda/cuda_internal.h"

static const nccl_fns *g_nf;   /* set by the first successful comm_nccl_unique_id / init (cuda_dl.c) */

/* A non-blocking communicator's call may answer ncclInProgress: poll its state until it settles. */
static ncclResult_t nccl_wait(ncclComm_t nc, ncclResult_t r) {
    while (r == ncclInProgress) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t q = g_nf->comm_get_async_error(nc, &st);
        if (q != ncclSuccess) return q;
        r = st;
        if (r == ncclInProgress) sched_yield();
    }
    return r;
}

#define NCCL_CHECK(nc, stmt)                                                                             \
    do {                                                                                                 \
        ncclResult_t r_ = nccl_wait((nc), (stmt));                                                       \
        if (r_ != ncclSuccess)                                                                           \
            um_abort(__FILE__, __LINE__, "NCCL_CHECK(%s) failed: %s", #stmt, g_nf->get_error_string(r_)); \
    } while (0)

_Static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES, "NCCL unique id size");

typedef struct nccl_impl {
    ncclComm_t   nc;
    cudaStream_t stream;
    int          device;
    float       *one;   /* device scalar for barrier */
    void        *stage;     /* device staging buffer of the host broadcast, owned */
    size_t       stage_cap; /* its bytes */
} nccl_impl;

static nccl_impl *nimpl(comm *c) { return (nccl_impl *)c->impl; }

static void nccl_use(const nccl_impl *n) { CUDA_CHECK(cudaSetDevice(n->device)); }

static void nccl_all_reduce_sum(comm *c, void *buf, size_t n, enum dtype t) {
    nccl_impl *ni = nimpl(c);
    nccl_use(ni);
    NCCL_CHECK(ni->nc, g_nf->all_reduce(buf, buf, n, t == DTYPE_F32 ? ncclFloat32 : ncclBfloat16, ncclSum, ni->nc, ni->stream));
}

static void nccl_all_gather(comm *c, const void *send, size_t bytes, void *recv) {
    nccl_impl *ni = nimpl(c);
    nccl_use(ni);
    NCCL_CHECK(ni->nc, g_nf->all_gather(send, recv, bytes, ncclUint8, ni->nc, ni->stream));
}

/* Host-buffer broadcast: staged through a device buffer (root copies its bytes in), ncclBroadcast
 * in place on the rank's stream, every other rank copies the result out; synchronises the stream. */
static void nccl_broadcast(comm *c, void *buf, size_t bytes, int root) {
    nccl_impl *ni = nimpl(c);
    nccl_use(ni);
    if (bytes > ni->stage_cap) {
        if (ni->stage) CUDA_CHECK(cudaFree(ni->stage));   /* synchronous: no pending reader survives */
        ni->stage_cap = bytes < 4096 ? 4096 : bytes + bytes / 2;
        CUDA_CHECK(cudaMalloc(&ni->stage, ni->stage_cap));
    }
    if (c->rank == root) CUDA_CHECK(cudaMemcpyAsync(ni->stage, buf, bytes, cudaMemcpyHostToDevice, ni->stream));
    NCCL_CHECK(ni->nc, g_nf->broadcast(ni->stage, ni->stage, bytes, ncclUint8, root, ni->nc, ni->stream));
    if (c->rank != root) CUDA_CHECK(cudaMemcpyAsync(buf, ni->stage, bytes, cudaMemcpyDeviceToHost, ni->stream));
    CUDA_CHECK(cudaStreamSynchronize(ni->stream));
}

static void nccl_barrier(comm *c) {
    nccl_impl *ni = nimpl(c);
    nccl_use(ni);
    NCCL_CHECK(ni->nc, g_nf->all_reduce(ni->one, ni->one, 1, ncclFloat32, ncclSum, ni->nc, ni->stream));
    CUDA_CHECK(cudaStreamSynchronize(ni->stream));
}

static void nccl_free(comm *c) {
    nccl_impl *ni = nimpl(c);
    nccl_use(ni);
    CUDA_CHECK(cudaStreamSynchronize(ni->stream));
    NCCL_CHECK(ni->nc, g_nf->comm_finalize(ni->nc));   /* non-blocking: finalize, wait, then destroy */
    ncclResult_t dr = g_nf->comm_destroy(ni->nc);   /* finalized: frees locally without blocking */
    if (dr != ncclSuccess) um_abort(__FILE__, __LINE__, "ncclCommDestroy failed: %s", g_nf->get_error_string(dr));
    CUDA_CHECK(cudaFree(ni->one));
    if (ni->stage) CUDA_CHECK(cudaFree(ni->stage));
    free(ni);
    free(c);
}

static const comm_ops k_nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce_sum,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .free = nccl_free,
};

int comm_nccl_available(void) { return cuda_dl_nccl(NULL) != NULL; }

int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES], um_err *err) {
    const nccl_fns *nf = cuda_dl_nccl(err);
    if (!nf) return -1;
    g_nf = nf;
    ncclUniqueId u;
    ncclResult_t r = nf->get_unique_id(&u);
    if (r != ncclSuccess) return um_err_set(err, UM_ERR_RESOURCE, "NCCL: ncclGetUniqueId: %s", nf->get_error_string(r));
    memcpy(id, u.internal, COMM_NCCL_ID_BYTES);
    return 0;
}

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

comm *comm_nccl_init(const uint8_t id[COMM_NCCL_ID_BYTES], int rank, int world, int device, void *stream,
                     int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err) {
    if (world < 1 || rank < 0 || rank >= world) {
        um_err_set(err, UM_ERR_INVALID_ARG, "NCCL: rank %d out of range for world %d", rank, world);
        return NULL;
    }
    const nccl_fns *nf = cuda_dl_nccl(err);
    if (!nf) return NULL;
    g_nf = nf;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        um_err_set(err, UM_ERR_RESOURCE, "NCCL rank %d: cuda:%d: %s", rank, device, cudaGetErrorString(ce));
        return NULL;
    }
    if (fault_hit(FAULT_NCCL_INIT_RANK, &(fault_at){.rank = rank})) {   /* test hook (util/fault.h) */
        um_err_set(err, UM_ERR_RESOURCE, "NCCL rank %d of %d on cuda:%d: injected init failure (%s=%d)", rank, world,
                   device, fault_name(FAULT_NCCL_INIT_RANK), rank);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(u.internal, id, COMM_NCCL_ID_BYTES);
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = nf->comm_init_rank_config(&nc, world, u, rank, &cfg);
    /* poll the init: a peer that never joins must not block this rank forever */
    const uint64_t deadline = mono_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 600000);
    const char *why = NULL;
    while (r == ncclInProgress) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t q = nf->comm_get_async_error(nc, &st);
        r = q != ncclSuccess ? q : st;
        if (r != ncclInProgress) break;
        if (cancelled && cancelled(user)) {
            why = "another rank of the group failed before joining";
            break;
        }
        if (mono_ms() >= deadline) {
            why = "timed out waiting for the other ranks to join";
            break;
        }
        usleep(1000);
    }
    if (why) {   /* abort the pending init (documented for non-blocking communicators) */
        nf->comm_abort(nc);
        um_err_set(err, UM_ERR_CANCELLED, "NCCL rank %d of %d on cuda:%d: init aborted: %s", rank, world, device, why);
        return NULL;
    }
    if (r != ncclSuccess) {
        um_err_set(err, UM_ERR_RESOURCE, "NCCL rank %d of %d on cuda:%d: ncclCommInitRankConfig: %s (%s)", rank, world,
                   device, nf->get_error_string(r), nf->get_last_error(nc));
        if (nc) nf->comm_abort(nc);
        return NULL;
    }
    nccl_impl *ni = xcalloc(1, sizeof *ni);
    ni->nc = nc;
    ni->stream = (cudaStream_t)stream;
    ni->device = device;
    CUDA_CHECK(cudaMalloc((void **)&ni->one, sizeof(float)));
    CUDA_CHECK(cudaMemsetAsync(ni->one, 0, sizeof(float), ni->stream));   /* ordered before the collectives */
    comm *c = xcalloc(1, sizeof *c);
    c->ops = &k_nccl_ops;
    c->rank = rank;
    c->world = world;
    c->act_dtype = DTYPE_BF16;
    c->impl = ni;
    return c;
}

#else /* no NCCL */

int comm_nccl_available(void) { return 0; }

int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES], um_err *err) {
    (void)id;
    return um_err_set(err, UM_ERR_UNSUPPORTED, "this unmask was built without NCCL (multi-GPU needs nccl.h at build time)");
}

comm *comm_nccl_init(const uint8_t id[COMM_NCCL_ID_BYTES], int rank, int world, int device, void *stream,
                     int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err) {
    (void)id, (void)rank, (void)world, (void)device, (void)stream, (void)cancelled, (void)user, (void)timeout_ms;
    um_err_set(err, UM_ERR_UNSUPPORTED, "this unmask was built without NCCL (multi-GPU needs nccl.h at build time)");
    return NULL;
}

#endif
