/*
 * umk_emu_runtime.cpp — the CUDA runtime API subset of the unmask CUDA emulator (declared in
 * tests/emu/include/cuda_runtime_api.h), written from the CUDA Runtime API documentation:
 * devices (UNMASK_EMU_DEVICES, default 1; sm_90; current device per host thread), device memory in
 * host memory (cudaMemGetInfo's total from UNMASK_EMU_MEM_BYTES, default 80 GiB, minus what is
 * allocated; new allocations filled with 0xff unless UNMASK_EMU_POISON=0), pinned host memory,
 * copies / memsets (range-checked against the live allocations), streams and events, stream
 * capture into graphs and graph replay, cudaFuncSetAttribute and launch-configuration checks.
 *
 * Ordering: every operation runs when it is enqueued, so stream order (and every event) holds
 * trivially. While a stream captures, kernel launches (arguments by value), copies, memsets,
 * event records and cuBLAS calls become graph nodes instead; cudaGraphLaunch replays them in order.
 * Capture rules enforced as documented: synchronising a capturing stream, and "potentially unsafe"
 * calls (cudaMalloc/cudaFree/cudaMallocHost/cudaFreeHost/synchronous copies) from a thread whose
 * capture mode forbids them, fail with cudaErrorStreamCaptureUnsupported and invalidate the capture.
 *
 * Does not: run anything asynchronously, emulate peer access, unified memory or the driver API.
 * Threading: any host thread; allocation tables are locked, the current device, capture mode and
 * last error are per thread.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "umk_emu_device.h"
#include "umk_emu_internal.h"

struct umk_emu_node {
    std::string           what;
    std::function<void()> fn;
};

struct umk_emu_stream {
    umk_emu_stream(int dev, unsigned fl) : device(dev), flags(fl) {}
    int                       device;
    unsigned                  flags;
    bool                      capturing = false;
    bool                      invalidated = false;
    std::string               invalid_why;
    cudaStreamCaptureMode     mode = cudaStreamCaptureModeGlobal;
    std::thread::id           capture_thread;
    std::vector<umk_emu_node> nodes;
};

struct umk_emu_event {
    unsigned flags;
    bool     recorded = false;
    double   t_ms = 0.0;
};

struct umk_emu_graph {
    std::vector<umk_emu_node> nodes;
};

struct umk_emu_graph_exec {
    std::vector<umk_emu_node> nodes;
};

namespace umk_emu {

void fatal(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "unmask CUDA emulator: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    abort();
}

namespace {

struct alloc_info {
    size_t bytes;
    int    device;
};

std::mutex                        g_mu;           // guards everything below
std::map<uintptr_t, alloc_info>   g_dev;          // device allocations by start address
std::map<uintptr_t, size_t>       g_pinned;       // pinned host allocations
std::vector<size_t>               g_dev_bytes;    // allocated bytes per device
std::map<std::pair<const void *, int>, int> g_max_dyn_smem;   // (kernel, device) -> attribute
std::atomic<int>                  g_global_captures{0};
std::atomic<uint64_t>             g_launches{0};

thread_local int                     tl_device = 0;
thread_local cudaError_t             tl_error = cudaSuccess;
thread_local cudaStreamCaptureMode   tl_mode = cudaStreamCaptureModeGlobal;
thread_local std::vector<umk_emu_stream *> tl_captures;   // streams this thread is capturing

long env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = nullptr;
    const long r = strtol(v, &end, 10);
    if (*end) fatal("%s=%s is not an integer", name, v);
    return r;
}

int n_devices() {
    static const int n = (int)env_long("UNMASK_EMU_DEVICES", 1);
    return n;
}

size_t mem_total() {
    static const size_t t = (size_t)env_long("UNMASK_EMU_MEM_BYTES", 80l << 30);
    return t;
}

bool poison() {
    static const bool p = env_long("UNMASK_EMU_POISON", 1) != 0;
    return p;
}

double now_ms() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

umk_emu_stream *default_stream(int device) {
    static umk_emu_stream *streams[64];
    static std::once_flag once;
    std::call_once(once, [] {
        for (int i = 0; i < 64; i++) streams[i] = new umk_emu_stream(i, 0);
    });
    if (device < 0 || device >= 64) fatal("device %d", device);
    return streams[device];
}

umk_emu_stream *stream_of(cudaStream_t s) { return s ? s : default_stream(tl_device); }

void invalidate(umk_emu_stream *st, const std::string &why) {
    if (!st->invalidated) {
        st->invalidated = true;
        st->invalid_why = why;
    }
}

// Documented rule (cudaThreadExchangeStreamCaptureMode): a thread in Global mode may not make
// potentially unsafe calls while it or any thread captures in Global mode; in ThreadLocal mode while
// it captures (non-relaxed); Relaxed never restricts.
cudaError_t check_unsafe(const char *call) {
    if (tl_mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    bool own = false;
    for (umk_emu_stream *st : tl_captures)
        if (st->mode != cudaStreamCaptureModeRelaxed) own = true;
    const bool other = tl_mode == cudaStreamCaptureModeGlobal && g_global_captures.load() > 0;
    if (!own && !other) return cudaSuccess;
    for (umk_emu_stream *st : tl_captures)
        invalidate(st, std::string(call) + " during stream capture (capture mode forbids it)");
    return set_error(cudaErrorStreamCaptureUnsupported);
}

const alloc_info *find_dev(const void *p, uintptr_t *base) {
    const uintptr_t a = (uintptr_t)p;
    auto it = g_dev.upper_bound(a);
    if (it == g_dev.begin()) return nullptr;
    --it;
    if (a >= it->first + it->second.bytes && !(it->second.bytes == 0 && a == it->first)) return nullptr;
    if (base) *base = it->first;
    return &it->second;
}

void check_range(const char *call, const char *which, const void *p, size_t bytes, bool device) {
    std::lock_guard<std::mutex> lk(g_mu);
    uintptr_t base = 0;
    const alloc_info *ai = find_dev(p, &base);
    if (device) {
        if (!ai)
            fatal("%s: %s %p is not inside a live device allocation (cudaMalloc)", call, which, p);
        if ((uintptr_t)p + bytes > base + ai->bytes)
            fatal("%s: %s [%p, +%zu) overruns its device allocation [%p, +%zu) by %zu bytes", call, which, p, bytes,
                  (void *)base, ai->bytes, (size_t)((uintptr_t)p + bytes - base - ai->bytes));
    } else if (ai) {
        fatal("%s: %s %p is a device pointer but the copy kind says host", call, which, p);
    }
}

cudaError_t do_memcpy(const char *call, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                      cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return set_error(cudaErrorInvalidValue);
    bool dst_dev, src_dev;
    switch (kind) {
    case cudaMemcpyHostToHost: dst_dev = false, src_dev = false; break;
    case cudaMemcpyHostToDevice: dst_dev = true, src_dev = false; break;
    case cudaMemcpyDeviceToHost: dst_dev = false, src_dev = true; break;
    case cudaMemcpyDeviceToDevice: dst_dev = true, src_dev = true; break;
    case cudaMemcpyDefault: {
        std::lock_guard<std::mutex> lk(g_mu);
        dst_dev = find_dev(dst, nullptr) != nullptr;
        src_dev = find_dev(src, nullptr) != nullptr;
        break;
    }
    default: return set_error(cudaErrorInvalidMemcpyDirection);
    }
    check_range(call, "destination", dst, bytes, dst_dev);
    check_range(call, "source", src, bytes, src_dev);
    return enqueue(s, call, [dst, src, bytes] { memmove(dst, src, bytes); });
}

}  // namespace

cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) tl_error = e;
    return e;
}

int current_device() { return tl_device; }

int stream_device(cudaStream_t s) { return stream_of(s)->device; }

bool is_device_range(const void *p, size_t bytes, int device) {
    std::lock_guard<std::mutex> lk(g_mu);
    uintptr_t base = 0;
    const alloc_info *ai = find_dev(p, &base);
    return ai && (device < 0 || ai->device == device) && (uintptr_t)p + bytes <= base + ai->bytes;
}

cudaError_t enqueue(cudaStream_t s, const char *what, std::function<void()> fn) {
    umk_emu_stream *st = stream_of(s);
    if (st->capturing) {
        if (st->invalidated) return set_error(cudaErrorStreamCaptureInvalidated);
        st->nodes.push_back(umk_emu_node{what, std::move(fn)});
        return cudaSuccess;
    }
    fn();
    return cudaSuccess;
}

void launch_closure(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                    std::function<void()> body) {
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
        block.x == 0 || block.y == 0 || block.z == 0 || block.z > 64 || threads > 1024) {
        fprintf(stderr, "unmask CUDA emulator: launch of %s with grid (%u,%u,%u) block (%u,%u,%u): invalid "
                "configuration\n", name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    int max_dyn = 48 * 1024;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_max_dyn_smem.find({fn, tl_device});
        if (it != g_max_dyn_smem.end()) max_dyn = it->second;
    }
    if (smem > (size_t)max_dyn) {
        fprintf(stderr, "unmask CUDA emulator: launch of %s with %zu bytes of dynamic shared memory; the limit for "
                "this kernel is %d (cudaFuncAttributeMaxDynamicSharedMemorySize)\n", name, smem, max_dyn);
        set_error(cudaErrorInvalidValue);
        return;
    }
    enqueue(s, name, [name, grid, block, smem, body = std::move(body)] {
        g_launches++;
        run_grid(name, grid, block, smem, body);
    });
}

}  // namespace umk_emu

using namespace umk_emu;

extern "C" {

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (emulator: UNMASK_EMU_DEVICES=0)";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
    }
}

cudaError_t cudaGetLastError(void) {
    const cudaError_t e = tl_error;
    tl_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return tl_error; }

cudaError_t cudaGetDeviceCount(int *count) {
    if (!count) return set_error(cudaErrorInvalidValue);
    *count = n_devices() > 0 ? n_devices() : 0;
    if (*count == 0) return set_error(cudaErrorNoDevice);
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (!prop) return set_error(cudaErrorInvalidValue);
    if (device < 0 || device >= n_devices()) return set_error(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "unmask CUDA emulator (CPU, not a GPU)");
    prop->totalGlobalMem = mem_total();
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->l2CacheSize = 50 << 20;   // an H100 / H200
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= n_devices() || device >= 64) return set_error(cudaErrorInvalidDevice);
    tl_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    if (!device) return set_error(cudaErrorInvalidValue);
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
    for (umk_emu_stream *st : tl_captures)
        if (st->mode != cudaStreamCaptureModeRelaxed) {
            invalidate(st, "cudaDeviceSynchronize during capture");
            return set_error(cudaErrorStreamCaptureUnsupported);
        }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_dev_bytes.size() <= (size_t)tl_device) g_dev_bytes.resize((size_t)tl_device + 1, 0);
    const size_t used = g_dev_bytes[(size_t)tl_device], total = mem_total();
    if (free_bytes) *free_bytes = used < total ? total - used : 0;
    if (total_bytes) *total_bytes = total;
    return cudaSuccess;
}

size_t umk_emu_device_allocated(int device) {
    std::lock_guard<std::mutex> lk(g_mu);
    return (size_t)device < g_dev_bytes.size() ? g_dev_bytes[(size_t)device] : 0;
}

uint64_t umk_emu_launch_count(void) { return g_launches.load(); }

cudaError_t cudaMalloc(void **p, size_t bytes) {
    if (!p) return set_error(cudaErrorInvalidValue);
    *p = nullptr;
    if (cudaError_t e = check_unsafe("cudaMalloc")) return e;
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        if (g_dev_bytes.size() <= (size_t)tl_device) g_dev_bytes.resize((size_t)tl_device + 1, 0);
        if (g_dev_bytes[(size_t)tl_device] + bytes > mem_total()) return set_error(cudaErrorMemoryAllocation);
        g_dev_bytes[(size_t)tl_device] += bytes;
    }
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes) != 0) {
        std::lock_guard<std::mutex> lk(g_mu);
        g_dev_bytes[(size_t)tl_device] -= bytes;
        return set_error(cudaErrorMemoryAllocation);
    }
    if (poison()) memset(m, 0xff, bytes);
    std::lock_guard<std::mutex> lk(g_mu);
    g_dev[(uintptr_t)m] = alloc_info{bytes, tl_device};
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    if (cudaError_t e = check_unsafe("cudaFree")) return e;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_dev.find((uintptr_t)p);
        if (it == g_dev.end()) return set_error(cudaErrorInvalidValue);
        g_dev_bytes[(size_t)it->second.device] -= it->second.bytes;
        g_dev.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    if (!p) return set_error(cudaErrorInvalidValue);
    *p = nullptr;
    if (cudaError_t e = check_unsafe("cudaMallocHost")) return e;
    void *m = nullptr;
    if (posix_memalign(&m, 4096, bytes ? bytes : 1) != 0) return set_error(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lk(g_mu);
    g_pinned[(uintptr_t)m] = bytes;
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void *p) {
    if (!p) return cudaSuccess;
    if (cudaError_t e = check_unsafe("cudaFreeHost")) return e;
    {
        std::lock_guard<std::mutex> lk(g_mu);
        auto it = g_pinned.find((uintptr_t)p);
        if (it == g_pinned.end()) return set_error(cudaErrorInvalidValue);
        g_pinned.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    if (cudaError_t e = check_unsafe("cudaMemcpy")) return e;
    return do_memcpy("cudaMemcpy", dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s) {
    return do_memcpy("cudaMemcpyAsync", dst, src, bytes, kind, s);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    if (bytes == 0) return cudaSuccess;
    check_range("cudaMemsetAsync", "destination", dst, bytes, true);
    return enqueue(s, "memset", [dst, value, bytes] { memset(dst, value, bytes); });
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    if (cudaError_t e = check_unsafe("cudaMemset")) return e;
    return cudaMemsetAsync(dst, value, bytes, nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    if (!s) return set_error(cudaErrorInvalidValue);
    *s = new umk_emu_stream(tl_device, flags);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return set_error(cudaErrorInvalidResourceHandle);
    if (s->capturing) fatal("cudaStreamDestroy of a stream that is capturing");
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    umk_emu_stream *st = stream_of(s);
    if (st->capturing) {
        invalidate(st, "cudaStreamSynchronize of the capturing stream");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    umk_emu_stream *st = stream_of(s);
    if (st->capturing) {
        invalidate(st, "cudaStreamQuery of the capturing stream");
        return set_error(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)s, (void)flags;
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;   // everything already ran in order
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    if (!e) return set_error(cudaErrorInvalidValue);
    *e = new umk_emu_event{flags};
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    return enqueue(s, "event record", [e] {
        e->recorded = true;
        e->t_ms = now_ms();
    });
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return set_error(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return set_error(cudaErrorInvalidValue);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return set_error(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return set_error(cudaErrorInvalidResourceHandle);
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    if (!s) return set_error(cudaErrorStreamCaptureUnsupported);   // the legacy stream cannot capture
    if (s->capturing) return set_error(cudaErrorIllegalState);
    s->capturing = true;
    s->invalidated = false;
    s->invalid_why.clear();
    s->mode = mode;
    s->capture_thread = std::this_thread::get_id();
    s->nodes.clear();
    tl_captures.push_back(s);
    if (mode == cudaStreamCaptureModeGlobal) g_global_captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    if (!s || !graph) return set_error(cudaErrorInvalidValue);
    if (!s->capturing) return set_error(cudaErrorInvalidValue);
    if (s->mode != cudaStreamCaptureModeRelaxed && s->capture_thread != std::this_thread::get_id())
        return set_error(cudaErrorStreamCaptureWrongThread);
    s->capturing = false;
    if (s->mode == cudaStreamCaptureModeGlobal) g_global_captures--;
    for (size_t i = 0; i < tl_captures.size(); i++)
        if (tl_captures[i] == s) tl_captures.erase(tl_captures.begin() + (long)i), i--;
    *graph = nullptr;
    if (s->invalidated) {
        fprintf(stderr, "unmask CUDA emulator: stream capture invalidated: %s\n", s->invalid_why.c_str());
        s->nodes.clear();
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    *graph = new umk_emu_graph{std::move(s->nodes)};
    s->nodes.clear();
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
    if (!status) return set_error(cudaErrorInvalidValue);
    umk_emu_stream *st = stream_of(s);
    *status = !st->capturing ? cudaStreamCaptureStatusNone
              : st->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (!mode) return set_error(cudaErrorInvalidValue);
    const cudaStreamCaptureMode old = tl_mode;
    tl_mode = *mode;
    *mode = old;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    (void)flags;
    if (!exec || !graph) return set_error(cudaErrorInvalidValue);
    *exec = new umk_emu_graph_exec{graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    if (!exec) return set_error(cudaErrorInvalidValue);
    return enqueue(s, "graph launch", [exec] {
        for (const umk_emu_node &n : exec->nodes) n.fn();
    });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (!exec) return set_error(cudaErrorInvalidValue);
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    if (!graph) return set_error(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
    if (!func) return set_error(cudaErrorInvalidValue);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 227 * 1024) return set_error(cudaErrorInvalidValue);
        std::lock_guard<std::mutex> lk(g_mu);
        g_max_dyn_smem[{func, tl_device}] = value;
    }
    return cudaSuccess;
}

}  // extern "C"
