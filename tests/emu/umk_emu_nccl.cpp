/*
 * umk_emu_nccl.cpp — the NCCL subset of the unmask CUDA emulator (tests/emu/include/nccl.h), written
 * from NCCL's documented semantics, so tensor parallelism over "GPUs" runs in CI on the CPU:
 *   - ncclGetUniqueId writes a fresh POSIX shared-memory name ("/umk-nccl-<pid>-<n>-<random>") into
 *     the id; ncclCommInitRank(nranks, id, rank) maps that segment (the first rank to arrive creates
 *     and initialises it, O_EXCL), waits until all nranks joined (the last one unlinks the name, so
 *     nothing is left in /dev/shm once a group formed) and returns. Ranks may be threads of one
 *     process or separate processes (multi-node on one machine): everything shared lives in the
 *     segment — a process-shared robust mutex + condition variable (CLOCK_MONOTONIC), a barrier, and
 *     one staging slot per rank.
 *   - Collectives run when they are enqueued on the stream (like every emulated operation; a graph
 *     node while the stream captures, run at replay): chunk by chunk, every rank copies its part
 *     into its slot, a barrier, every rank computes its result from the slots IN RANK ORDER
 *     (((s0 op s1) op s2) ..., each partial result rounded to the element type, as NCCL rounds on
 *     every hop), a second barrier frees the slots. Results are therefore bit-identical on every
 *     rank and between a thread group and a process group.
 *   - Checks (bugs abort with "unmask CUDA emulator: NCCL ..."): send/recv buffers inside live device
 *     allocations of the communicator's device, the stream on that device, every rank calling the
 *     same collective with the same count / type / op / root (compared after the first barrier).
 *   - No hangs: a rank waiting more than UNMASK_EMU_NCCL_TIMEOUT_MS (default 60000) for its peers
 *     aborts naming the collective and the missing ranks (ncclCommInitRank returns ncclSystemError
 *     with that message in ncclGetLastError instead); ncclCommAbort marks the segment so the
 *     peers' pending and later collectives abort at once instead of waiting; a peer process that
 *     dies while holding the lock is detected through the robust mutex.
 *   - Non-blocking init (ncclCommInitRankConfig with config->blocking = 0, NCCL >= 2.14 semantics):
 *     returns ncclInProgress with a valid handle at once, the join runs on a helper thread, and
 *     ncclCommGetAsyncError reports ncclInProgress until the group formed (ncclSuccess) or the join
 *     failed; ncclCommAbort on such a handle cancels the pending join (within ~20 ms), marks the
 *     segment aborted so the peers' joins fail too, unlinks its name and frees the handle.
 *     Collectives and ncclCommDestroy on a handle whose init has not succeeded abort (a bug).
 * Does not: point-to-point, reduce-scatter, ncclGroupStart/End batching (a group
 * is a no-op: each call still runs at once, so ONE thread driving several ranks of a group would
 * wait for itself and time out — our code has one thread per rank).
 * Threading: a communicator is used by one host thread at a time; any number of communicators and
 * processes at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "cuda_bf16.h"
#include "nccl.h"
#include "umk_emu_internal.h"

namespace {

constexpr uint64_t kMagic = 0x4c43434e554d4b55ull;   // "UKMUNCCL"
constexpr size_t   kSlotBytes = 1u << 20;             // staging bytes per rank and chunk
constexpr size_t   kHeaderBytes = 16384;
constexpr int      kMaxRanks = 256;

enum coll_kind { COLL_ALL_REDUCE = 1, COLL_BROADCAST = 2, COLL_ALL_GATHER = 3 };

// what a rank is doing, compared across ranks after the first barrier of every chunk
struct coll_desc {
    uint64_t seq;      // collective number on this communicator
    int32_t  kind;     // coll_kind
    int32_t  dtype;    // ncclDataType_t
    int32_t  op;       // ncclRedOp_t (all-reduce)
    int32_t  root;     // broadcast
    uint64_t count;    // elements (per rank for all-gather)
};

// the shared segment: this header, then nranks slots of kSlotBytes
struct shm_header {
    std::atomic<uint64_t> ready;          // kMagic once the creator initialised everything below
    int32_t               nranks;
    int32_t               joined;         // ranks that called ncclCommInitRank
    uint64_t              joined_mask[kMaxRanks / 64];
    int32_t               aborted_by;     // -1, or the rank that called ncclCommAbort
    int32_t               bar_count;      // ranks inside the current barrier
    uint64_t              bar_gen;        // completed barriers
    uint64_t              bar_mask[kMaxRanks / 64];   // who is inside the current barrier
    pthread_mutex_t       mu;             // process-shared, robust
    pthread_cond_t        cv;             // process-shared, CLOCK_MONOTONIC
    coll_desc             desc[kMaxRanks];
};
static_assert(sizeof(shm_header) <= kHeaderBytes, "NCCL emulator header too large");

long timeout_ms() {
    static const long t = [] {
        const char *v = getenv("UNMASK_EMU_NCCL_TIMEOUT_MS");
        long r = v && *v ? strtol(v, nullptr, 10) : 60000;
        return r > 0 ? r : 60000;
    }();
    return t;
}

thread_local char tl_last_error[512];

void set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void set_last_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_last_error, sizeof tl_last_error, fmt, ap);
    va_end(ap);
}

struct timespec deadline_after(long ms) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000l;
    if (ts.tv_nsec >= 1000000000l) ts.tv_sec++, ts.tv_nsec -= 1000000000l;
    return ts;
}

bool past(const struct timespec &d) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > d.tv_sec || (now.tv_sec == d.tv_sec && now.tv_nsec >= d.tv_nsec);
}

std::string missing_ranks(const uint64_t *mask, int n) {
    std::string s;
    for (int r = 0; r < n; r++)
        if (!(mask[r / 64] >> (r % 64) & 1)) s += (s.empty() ? "" : ",") + std::to_string(r);
    return s;
}

size_t dtype_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

const char *dtype_name(int t) {
    static const char *const n[] = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                                    "float64", "bfloat16"};
    return t >= 0 && t < 10 ? n[t] : "?";
}

const char *kind_name(int k) {
    return k == COLL_ALL_REDUCE ? "ncclAllReduce" : k == COLL_BROADCAST ? "ncclBroadcast"
           : k == COLL_ALL_GATHER ? "ncclAllGather" : "?";
}

// IEEE half <-> float (round to nearest even), for ncclFloat16 reductions
float half_to_f32(uint16_t h) {
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t u;
    if (e == 0x1f) u = s | 0x7f800000u | (m << 13);
    else if (e) u = s | ((e + 112) << 23) | (m << 13);
    else if (!m) u = s;
    else {   // subnormal: normalise
        int k = -1;
        uint32_t mm = m;
        do k++, mm <<= 1; while (!(mm & 0x400));
        u = s | ((uint32_t)(112 - k) << 23) | ((mm & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_half(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t s = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return s | 0x7e00;            // NaN
    if (a >= 0x477ff000u) return s | 0x7c00;           // rounds to >= 65520: inf
    if (a < 0x38800000u) {                             // subnormal or zero: scale by 2^24 and round
        float t;
        memcpy(&t, &a, 4);
        return s | (uint16_t)__builtin_lrintf(t * 16777216.0f);
    }
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return s | (uint16_t)(r >> 13);
}

template <typename T> T red(T a, T b, int op) {
    switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    default: return (T)(a + b);   // sum, avg (divided at the end)
    }
}

// recv[i] = slot_0[i] op slot_1[i] op ... in rank order, every partial result in the element type
template <typename T>
void reduce_typed(void *recv, const uint8_t *slots, int n, size_t elems, int op) {
    T *out = static_cast<T *>(recv);
    for (size_t i = 0; i < elems; i++) {
        T acc;
        memcpy(&acc, slots + i * sizeof(T), sizeof(T));
        for (int r = 1; r < n; r++) {
            T v;
            memcpy(&v, slots + (size_t)r * kSlotBytes + i * sizeof(T), sizeof(T));
            acc = red<T>(acc, v, op);
        }
        if (op == ncclAvg) acc = (T)(acc / (T)n);
        out[i] = acc;
    }
}

template <uint16_t (*to16)(float), float (*from16)(uint16_t)>
void reduce_16(void *recv, const uint8_t *slots, int n, size_t elems, int op) {
    uint16_t *out = static_cast<uint16_t *>(recv);
    for (size_t i = 0; i < elems; i++) {
        uint16_t a;
        memcpy(&a, slots + i * 2, 2);
        for (int r = 1; r < n; r++) {
            uint16_t b;
            memcpy(&b, slots + (size_t)r * kSlotBytes + i * 2, 2);
            a = to16(red<float>(from16(a), from16(b), op));
        }
        if (op == ncclAvg) a = to16(from16(a) / (float)n);
        out[i] = a;
    }
}

uint16_t bf16_from(float f) { return umk_emu_f32_to_bf16_bits(f); }
float bf16_to(uint16_t h) { return umk_emu_bf16_bits_to_f32(h); }

void reduce_chunk(void *recv, const uint8_t *slots, int n, size_t elems, ncclDataType_t t, int op) {
    switch (t) {
    case ncclInt8: reduce_typed<int8_t>(recv, slots, n, elems, op); break;
    case ncclUint8: reduce_typed<uint8_t>(recv, slots, n, elems, op); break;
    case ncclInt32: reduce_typed<int32_t>(recv, slots, n, elems, op); break;
    case ncclUint32: reduce_typed<uint32_t>(recv, slots, n, elems, op); break;
    case ncclInt64: reduce_typed<int64_t>(recv, slots, n, elems, op); break;
    case ncclUint64: reduce_typed<uint64_t>(recv, slots, n, elems, op); break;
    case ncclFloat32: reduce_typed<float>(recv, slots, n, elems, op); break;
    case ncclFloat64: reduce_typed<double>(recv, slots, n, elems, op); break;
    case ncclFloat16: reduce_16<f32_to_half, half_to_f32>(recv, slots, n, elems, op); break;
    case ncclBfloat16: reduce_16<bf16_from, bf16_to>(recv, slots, n, elems, op); break;
    default: umk_emu::fatal("NCCL: data type %d", (int)t);
    }
}

std::atomic<uint64_t> g_id_counter{0};

}  // namespace

struct umk_emu_nccl_comm {
    int         rank, nranks, device;
    char        name[NCCL_UNIQUE_ID_BYTES];
    shm_header *h;          // the mapped segment
    size_t      map_bytes;
    uint8_t    *slots;      // h + kHeaderBytes: nranks x kSlotBytes
    uint64_t    seq;        // collectives issued (graph replays included)
    bool        aborted;
    // non-blocking init (ncclCommInitRankConfig, blocking = 0); a blocking comm keeps the defaults
    std::thread       init_th;                      // the pending join; joined by GetAsyncError/Abort/Destroy
    std::atomic<int>  async_state{ncclSuccess};     // ncclInProgress until the join ended
    std::atomic<bool> cancel{false};                // ncclCommAbort during the join
    char              err[512] = {0};               // the failed join's message (ncclGetLastError(comm))
};

namespace {

// lock the segment; a peer process that died holding it is reported (its group cannot continue)
void seg_lock(umk_emu_nccl_comm *c, const char *what) {
    const int e = pthread_mutex_lock(&c->h->mu);
    if (e == EOWNERDEAD) {
        pthread_mutex_consistent(&c->h->mu);
        pthread_mutex_unlock(&c->h->mu);
        umk_emu::fatal("NCCL rank %d of %d (%s): a peer process died inside the communicator", c->rank, c->nranks,
                       what);
    }
    if (e != 0) umk_emu::fatal("NCCL rank %d: pthread_mutex_lock: %s", c->rank, strerror(e));
}

void check_abort(umk_emu_nccl_comm *c, const char *what) {
    if (c->h->aborted_by >= 0) {
        const int by = c->h->aborted_by;
        pthread_mutex_unlock(&c->h->mu);
        umk_emu::fatal("NCCL rank %d of %d: %s: rank %d aborted the communicator (ncclCommAbort)", c->rank, c->nranks,
                       what, by);
    }
}

// all nranks arrive; more than timeout_ms() of waiting aborts naming the missing ranks
void barrier(umk_emu_nccl_comm *c, const char *what) {
    shm_header *h = c->h;
    seg_lock(c, what);
    check_abort(c, what);
    const uint64_t gen = h->bar_gen;
    h->bar_mask[c->rank / 64] |= 1ull << (c->rank % 64);
    if (++h->bar_count == c->nranks) {
        h->bar_count = 0;
        memset(h->bar_mask, 0, sizeof h->bar_mask);
        h->bar_gen++;
        pthread_cond_broadcast(&h->cv);
    } else {
        const struct timespec d = deadline_after(timeout_ms());
        while (h->bar_gen == gen) {
            check_abort(c, what);
            const int e = pthread_cond_timedwait(&h->cv, &h->mu, &d);
            if (e == EOWNERDEAD) {
                pthread_mutex_consistent(&h->mu);
                pthread_mutex_unlock(&h->mu);
                umk_emu::fatal("NCCL rank %d of %d (%s): a peer process died inside the communicator", c->rank,
                               c->nranks, what);
            }
            if (h->bar_gen == gen && (e == ETIMEDOUT || past(d))) {
                const std::string miss = missing_ranks(h->bar_mask, c->nranks);
                pthread_mutex_unlock(&h->mu);
                umk_emu::fatal("NCCL rank %d of %d: %s waited %ld ms for rank(s) %s (a peer died, hangs, or issued "
                               "different collectives; UNMASK_EMU_NCCL_TIMEOUT_MS)", c->rank, c->nranks, what,
                               timeout_ms(), miss.c_str());
            }
        }
    }
    pthread_mutex_unlock(&h->mu);
}

void check_buffer(umk_emu_nccl_comm *c, const char *call, const char *which, const void *p, size_t bytes) {
    if (bytes == 0) return;
    if (!umk_emu::is_device_range(p, bytes, c->device))
        umk_emu::fatal("NCCL rank %d: %s: %s [%p, +%zu) is not inside a live device allocation of cuda:%d", c->rank,
                       call, which, p, bytes, c->device);
}

void check_stream(umk_emu_nccl_comm *c, const char *call, cudaStream_t s) {
    const int d = umk_emu::stream_device(s);
    if (d != c->device)
        umk_emu::fatal("NCCL rank %d: %s on a stream of cuda:%d, but the communicator's device is cuda:%d", c->rank,
                       call, d, c->device);
}

// the same collective on every rank (after the first barrier of a chunk, every desc is written)
void check_descs(umk_emu_nccl_comm *c, const coll_desc &mine) {
    for (int r = 0; r < c->nranks; r++) {
        const coll_desc &o = c->h->desc[r];
        if (o.seq != mine.seq || o.kind != mine.kind || o.dtype != mine.dtype || o.op != mine.op ||
            o.root != mine.root || o.count != mine.count)
            umk_emu::fatal("NCCL rank %d of %d: collective #%llu mismatch: this rank called %s(count %llu, %s, op %d, "
                           "root %d), rank %d called #%llu %s(count %llu, %s, op %d, root %d)", c->rank, c->nranks,
                           (unsigned long long)mine.seq, kind_name(mine.kind), (unsigned long long)mine.count,
                           dtype_name(mine.dtype), mine.op, mine.root, r, (unsigned long long)o.seq,
                           kind_name(o.kind), (unsigned long long)o.count, dtype_name(o.dtype), o.op, o.root);
    }
}

// Runs one collective now (enqueue time or graph replay).
void run_collective(umk_emu_nccl_comm *c, coll_desc d, const void *send, void *recv) {
    d.seq = ++c->seq;
    char what[96];
    snprintf(what, sizeof what, "%s #%llu", kind_name(d.kind), (unsigned long long)d.seq);
    if (c->aborted) umk_emu::fatal("NCCL rank %d: %s on an aborted communicator", c->rank, what);
    const ncclDataType_t t = (ncclDataType_t)d.dtype;
    const size_t eb = dtype_bytes(t), per_chunk = kSlotBytes / eb;
    const int n = c->nranks;
    const uint8_t *src = static_cast<const uint8_t *>(send);
    uint8_t *dst = static_cast<uint8_t *>(recv);
    size_t done = 0;
    do {   // at least one round, so zero-count collectives still pair up
        const size_t elems = d.count - done < per_chunk ? d.count - done : per_chunk, bytes = elems * eb;
        uint8_t *mine = c->slots + (size_t)c->rank * kSlotBytes;
        if (bytes && (d.kind != COLL_BROADCAST || c->rank == d.root)) memcpy(mine, src + done * eb, bytes);
        c->h->desc[c->rank] = d;
        barrier(c, what);
        check_descs(c, d);
        if (bytes == 0) {   // a zero-count collective only pairs up the ranks
        } else if (d.kind == COLL_ALL_REDUCE) {
            reduce_chunk(dst + done * eb, c->slots, n, elems, t, d.op);
        } else if (d.kind == COLL_BROADCAST) {
            memmove(dst + done * eb, c->slots + (size_t)d.root * kSlotBytes, bytes);
        } else {   // all-gather: rank r's chunk lands at r * count + done
            for (int r = 0; r < n; r++)
                memcpy(dst + ((size_t)r * d.count + done) * eb, c->slots + (size_t)r * kSlotBytes, bytes);
        }
        barrier(c, what);   // slots free again
        done += elems;
    } while (done < d.count);
}

ncclResult_t enqueue_collective(umk_emu_nccl_comm *c, const char *call, coll_desc d, const void *send, void *recv,
                                size_t send_bytes, size_t recv_bytes, cudaStream_t s) {
    if (!c) return set_last_error("%s: NULL communicator", call), ncclInvalidArgument;
    if (c->async_state.load() != ncclSuccess)
        umk_emu::fatal("NCCL: %s on a communicator whose non-blocking init has not succeeded (state %d)", call,
                       c->async_state.load());
    if (dtype_bytes((ncclDataType_t)d.dtype) == 0)
        return set_last_error("%s: invalid data type %d", call, d.dtype), ncclInvalidArgument;
    if (d.kind == COLL_ALL_REDUCE && (d.op < 0 || d.op >= ncclNumOps))
        return set_last_error("%s: invalid reduction op %d", call, d.op), ncclInvalidArgument;
    if (d.kind == COLL_BROADCAST && (d.root < 0 || d.root >= c->nranks))
        return set_last_error("%s: root %d out of range for %d ranks", call, d.root, c->nranks), ncclInvalidArgument;
    check_stream(c, call, s);
    if (send_bytes) check_buffer(c, call, "sendbuff", send, send_bytes);
    check_buffer(c, call, "recvbuff", recv, recv_bytes);
    umk_emu::enqueue(s, call, [c, d, send, recv] { run_collective(c, d, send, recv); });
    return ncclSuccess;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_MAJOR * 10000 + NCCL_MINOR * 100 + NCCL_PATCH;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) {
    if (comm && comm->err[0]) return comm->err;   // a non-blocking init's failure (set on its helper thread)
    return tl_last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return set_last_error("ncclGetUniqueId: NULL id"), ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "/umk-nccl-%ld-%llu-%lx", (long)getpid(),
             (unsigned long long)g_id_counter.fetch_add(1), (unsigned long)(ts.tv_nsec ^ (ts.tv_sec << 20)));
    return ncclSuccess;
}

}  // extern "C"

namespace {

// The join of ncclCommInitRank(Config): fills c (rank, segment). cancel (or nullptr): a non-blocking
// init's ncclCommAbort; checked every 20 ms of waiting.
ncclResult_t init_join(umk_emu_nccl_comm *c, int nranks, ncclUniqueId id, int rank, int device,
                       const std::atomic<bool> *cancel) {
    const size_t bytes = kHeaderBytes + (size_t)nranks * kSlotBytes;
    const struct timespec d = deadline_after(timeout_ms());
    auto cancelled = [cancel] { return cancel && cancel->load(); };
    bool creator = false;
    int fd = shm_open(id.internal, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        creator = true;
        if (ftruncate(fd, (off_t)bytes) != 0) {
            set_last_error("ncclCommInitRank: ftruncate %s: %s", id.internal, strerror(errno));
            close(fd);
            shm_unlink(id.internal);
            return ncclSystemError;
        }
    } else if (errno == EEXIST) {
        fd = shm_open(id.internal, O_RDWR, 0600);
    }
    if (fd < 0) {
        // EEXIST then ENOENT: the group already formed and unlinked the name (an id used twice)
        return set_last_error("ncclCommInitRank: rank %d: shm_open %s: %s (unique id already used by a complete "
                              "group, or /dev/shm unavailable)", rank, id.internal, strerror(errno)),
               ncclSystemError;
    }
    if (!creator) {   // wait for the creator's ftruncate
        struct stat st;
        while (fstat(fd, &st) == 0 && (size_t)st.st_size < kHeaderBytes) {
            if (past(d) || cancelled()) {
                close(fd);
                return set_last_error("ncclCommInitRank: rank %d: %s never initialised%s", rank, id.internal,
                                      cancelled() ? " (aborted)" : ""),
                       ncclSystemError;
            }
            usleep(1000);
        }
        if ((size_t)st.st_size != bytes) {
            close(fd);
            return set_last_error("ncclCommInitRank: rank %d: nranks %d differs from the other ranks' (segment of "
                                  "%lld bytes)", rank, nranks, (long long)st.st_size), ncclInvalidArgument;
        }
    }
    void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return set_last_error("ncclCommInitRank: mmap: %s", strerror(errno)), ncclSystemError;
    shm_header *h = static_cast<shm_header *>(p);
    if (creator) {
        h->nranks = nranks;
        h->joined = 0;
        h->aborted_by = -1;
        pthread_mutexattr_t ma;
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&h->mu, &ma);
        pthread_mutexattr_destroy(&ma);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&h->cv, &ca);
        pthread_condattr_destroy(&ca);
        h->ready.store(kMagic, std::memory_order_release);
    } else {
        while (h->ready.load(std::memory_order_acquire) != kMagic) {
            if (past(d) || cancelled()) {
                munmap(p, bytes);
                return set_last_error("ncclCommInitRank: rank %d: %s never initialised%s", rank, id.internal,
                                      cancelled() ? " (aborted)" : ""),
                       ncclSystemError;
            }
            usleep(1000);
        }
    }
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    memcpy(c->name, id.internal, sizeof c->name);
    c->h = h;
    c->map_bytes = bytes;
    c->slots = static_cast<uint8_t *>(p) + kHeaderBytes;
    // join: every rank once; the last one unlinks the name; wait for all (timeout -> error)
    seg_lock(c, "ncclCommInitRank");
    ncclResult_t res = ncclSuccess;
    if (h->nranks != nranks) {
        set_last_error("ncclCommInitRank: rank %d says nranks %d, the group was created with %d", rank, nranks,
                       h->nranks);
        res = ncclInvalidArgument;
    } else if (h->joined_mask[rank / 64] >> (rank % 64) & 1) {
        set_last_error("ncclCommInitRank: rank %d joined twice", rank);
        res = ncclInvalidUsage;
    } else {
        h->joined_mask[rank / 64] |= 1ull << (rank % 64);
        if (++h->joined == nranks) {
            shm_unlink(c->name);
            pthread_cond_broadcast(&h->cv);
        }
        while (h->joined < nranks && h->aborted_by < 0) {
            // a non-blocking init wakes every 20 ms to see whether it was aborted
            const struct timespec slice = deadline_after(20);
            const bool use_slice = cancel && (slice.tv_sec < d.tv_sec || (slice.tv_sec == d.tv_sec && slice.tv_nsec < d.tv_nsec));
            const int e = pthread_cond_timedwait(&h->cv, &h->mu, use_slice ? &slice : &d);
            if (e == EOWNERDEAD) pthread_mutex_consistent(&h->mu);
            if (h->joined < nranks && cancelled()) {
                set_last_error("emulated NCCL: rank %d of %d: init aborted (ncclCommAbort) while waiting for rank(s) "
                               "%s", rank, nranks, missing_ranks(h->joined_mask, nranks).c_str());
                h->aborted_by = rank;   // the others stop waiting too
                pthread_cond_broadcast(&h->cv);
                shm_unlink(c->name);
                res = ncclSystemError;
                break;
            }
            if (h->joined < nranks && ((e == ETIMEDOUT && !use_slice) || past(d))) {
                const std::string miss = missing_ranks(h->joined_mask, nranks);
                set_last_error("emulated NCCL: rank %d of %d waited %ld ms for rank(s) %s to join (%d of %d joined)",
                               rank, nranks, timeout_ms(), miss.c_str(), h->joined, nranks);
                h->aborted_by = rank;   // the others stop waiting too
                pthread_cond_broadcast(&h->cv);
                shm_unlink(c->name);
                res = ncclSystemError;
                break;
            }
        }
        if (res == ncclSuccess && h->joined < nranks) {   // another rank gave up (a later abort does not count)
            set_last_error("emulated NCCL: rank %d of %d: rank %d gave up waiting for the group to form", rank, nranks,
                           h->aborted_by);
            res = ncclSystemError;
        }
    }
    pthread_mutex_unlock(&h->mu);
    if (res != ncclSuccess) {
        munmap(p, bytes);
        c->h = nullptr;
        return res;
    }
    return ncclSuccess;
}

// arguments common to both init entry points; 0 or an error (last error set)
ncclResult_t init_args_check(ncclComm_t *out, int nranks, const ncclUniqueId &id, int rank) {
    if (!out) return set_last_error("ncclCommInitRank: NULL comm"), ncclInvalidArgument;
    *out = nullptr;
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
        return set_last_error("ncclCommInitRank: rank %d / nranks %d invalid (emulator: at most %d ranks)", rank,
                              nranks, kMaxRanks), ncclInvalidArgument;
    if (id.internal[0] != '/' || !memchr(id.internal, 0, sizeof id.internal) ||
        strncmp(id.internal, "/umk-nccl-", 10) != 0)
        return set_last_error("ncclCommInitRank: the unique id was not made by ncclGetUniqueId"), ncclInvalidArgument;
    return ncclSuccess;
}

// a non-blocking init still running: wait for its helper thread
void init_wait(umk_emu_nccl_comm *c) {
    if (c->init_th.joinable()) c->init_th.join();
}

}  // namespace

extern "C" {

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    const ncclResult_t a = init_args_check(out, nranks, id, rank);
    if (a != ncclSuccess) return a;
    int device = 0;
    cudaGetDevice(&device);
    umk_emu_nccl_comm *c = new umk_emu_nccl_comm();
    const ncclResult_t r = init_join(c, nranks, id, rank, device, nullptr);
    if (r != ncclSuccess) {
        delete c;
        return r;
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank, ncclConfig_t *config) {
    if (config && (config->size != sizeof(ncclConfig_t) || config->magic != 0xcafebeef))
        return set_last_error("ncclCommInitRankConfig: config not made by NCCL_CONFIG_INITIALIZER"), ncclInvalidArgument;
    if (!config || config->blocking != 0) return ncclCommInitRank(out, nranks, id, rank);
    const ncclResult_t a = init_args_check(out, nranks, id, rank);
    if (a != ncclSuccess) return a;
    int device = 0;
    cudaGetDevice(&device);
    umk_emu_nccl_comm *c = new umk_emu_nccl_comm();
    c->rank = rank;
    c->nranks = nranks;
    c->device = device;
    c->async_state.store(ncclInProgress);
    c->init_th = std::thread([c, nranks, id, rank, device] {
        const ncclResult_t r = init_join(c, nranks, id, rank, device, &c->cancel);
        if (r != ncclSuccess) snprintf(c->err, sizeof c->err, "%s", tl_last_error);
        c->async_state.store(r);
    });
    *out = c;
    return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
    if (!c || !state) return ncclInvalidArgument;
    const int s = c->async_state.load();
    if (s != ncclInProgress) init_wait(c);   // the helper has finished: reap it
    *state = (ncclResult_t)s;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
    if (!c) return ncclInvalidArgument;
    return ncclSuccess;   // collectives run when enqueued: nothing is left to flush
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (c->async_state.load() == ncclInProgress)
        umk_emu::fatal("NCCL rank %d: ncclCommDestroy during a non-blocking init (poll ncclCommGetAsyncError, or "
                       "ncclCommAbort)", c->rank);
    init_wait(c);
    if (c->h) munmap(c->h, c->map_bytes);
    delete c;
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
    if (!c) return ncclSuccess;
    if (c->init_th.joinable()) {   // a non-blocking init: cancel the pending join first
        c->cancel.store(true);
        init_wait(c);
    }
    if (!c->h) {   // the init failed or was cancelled: nothing is mapped
        delete c;
        return ncclSuccess;
    }
    seg_lock(c, "ncclCommAbort");
    if (c->h->aborted_by < 0) c->h->aborted_by = c->rank;
    pthread_cond_broadcast(&c->h->cv);
    pthread_mutex_unlock(&c->h->mu);
    c->aborted = true;
    return ncclCommDestroy(c);
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
    if (!c || !count) return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
    if (!c || !rank) return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
    if (!c || !device) return ncclInvalidArgument;
    *device = c->device;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t s) {
    const size_t b = count * dtype_bytes(t);
    return enqueue_collective(c, "ncclAllReduce", coll_desc{0, COLL_ALL_REDUCE, (int32_t)t, (int32_t)op, -1, count},
                              send, recv, b, b, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t s) {
    const size_t b = count * dtype_bytes(t);
    // sendbuff is only read on the root (NCCL documents it as significant there only)
    return enqueue_collective(c, "ncclBroadcast", coll_desc{0, COLL_BROADCAST, (int32_t)t, -1, root, count}, send,
                              recv, c && c->rank == root ? b : 0, b, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t, ncclComm_t c,
                           cudaStream_t s) {
    const size_t b = sendcount * dtype_bytes(t);
    return enqueue_collective(c, "ncclAllGather", coll_desc{0, COLL_ALL_GATHER, (int32_t)t, -1, -1, sendcount}, send,
                              recv, b, c ? b * (size_t)c->nranks : 0, s);
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

}  // extern "C"
