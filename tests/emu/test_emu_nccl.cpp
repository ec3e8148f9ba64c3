/*
 * test_emu_nccl.cpp — self-tests of the CUDA emulator's NCCL subset (tests/emu/umk_emu_nccl.cpp)
 * against NCCL's documented semantics, with references computed here on the host:
 *   - ranks as threads (3 ranks on 2 emulated devices): ncclAllReduce sum of bf16 over more than one
 *     staging chunk equals the rank-order sum with every partial rounded to bf16 (round to nearest
 *     even, written here independently of the emulator's helpers), f32 sum in rank order, int32
 *     max/min/prod/avg, uint8 wrap-around, an exact f16 sum (the emulator's f16 conversions were
 *     also checked against NumPy for all 65536 halves and 200k random floats, 2026-11-21); ncclBroadcast from rank 1 in place and out of place;
 *     ncclAllGather (rank r's part at r * count); a zero-count collective; every rank's result
 *     identical; the shared-memory name is gone once the group formed;
 *   - a collective enqueued on a capturing stream runs at graph replay, not at capture;
 *   - ranks as processes (fork): the same all-reduce across two processes;
 *   - failures (forked children, UNMASK_EMU_NCCL_TIMEOUT_MS=300): a missing rank at init is
 *     ncclSystemError naming it (ncclGetLastError); a missing rank in a collective, mismatched
 *     collectives, a host pointer, and a peer's ncclCommAbort abort with a message;
 *   - non-blocking init (ncclConfig_t.blocking = 0): ncclCommInitRankConfig returns ncclInProgress
 *     and ncclCommGetAsyncError says ncclInProgress while a rank is missing, ncclSuccess once it
 *     joined, then an all-reduce works; ncclCommAbort of a pending init returns within 1 s (the
 *     emulator's timeout is 60 s), the peer blocked in ncclCommInitRank fails naming the rank that
 *     gave up, and no shared-memory segment is left; a config not made by NCCL_CONFIG_INITIALIZER
 *     is ncclInvalidArgument.
 * Prints "N passed, N failed"; exit 1 on failure. Main thread, rank threads, forked children.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"
#include "test.h"

namespace {

uint64_t g_rng = 777;
double urand() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

// bf16 <-> f32, round to nearest even (finite inputs only here)
uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}
float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// checks on rank threads: collected under a lock, asserted on the main thread (test.h is not thread-safe)
std::mutex               g_rank_mu;
std::vector<std::string> g_rank_fail;
#define RANK_CHECK(cond, ...)                                        \
    do {                                                             \
        if (!(cond)) {                                               \
            char m_[512];                                            \
            snprintf(m_, sizeof m_, __VA_ARGS__);                    \
            std::lock_guard<std::mutex> lk_(g_rank_mu);              \
            g_rank_fail.push_back(std::string(#cond) + ": " + m_);   \
        }                                                            \
    } while (0)

void rank_checks_report(const char *what) {
    std::lock_guard<std::mutex> lk(g_rank_mu);
    for (const std::string &f : g_rank_fail) fprintf(stderr, "FAIL (%s, rank thread) %s\n", what, f.c_str());
    TEST_CHECK(g_rank_fail.empty(), "%s: %zu check(s) failed on rank threads", what, g_rank_fail.size());
    g_rank_fail.clear();
}

thread_local bool tl_comm_gone;   // fn freed its communicator (ncclCommAbort)

// run fn(rank) on `world` threads, rank r on device r % 2, each with its own communicator
void run_ranks(int world, const ncclUniqueId &id, const std::function<void(int, ncclComm_t, cudaStream_t)> &fn) {
    std::vector<std::thread> th;
    for (int r = 0; r < world; r++)
        th.emplace_back([&, r] {
            cudaSetDevice(r % 2);
            cudaStream_t s;
            cudaStreamCreate(&s);
            ncclComm_t c = nullptr;
            const ncclResult_t res = ncclCommInitRank(&c, world, id, r);
            RANK_CHECK(res == ncclSuccess, "init rank %d: %s", r, ncclGetLastError(nullptr));
            if (res == ncclSuccess) {
                fn(r, c, s);
                if (!tl_comm_gone) ncclCommDestroy(c);
            }
            cudaStreamDestroy(s);
        });
    for (auto &t : th) t.join();
}

void test_threads() {
    const int W = 3;
    const size_t N = 700000;   // bf16: 1.4 MB per rank, more than one 1 MiB staging chunk
    std::vector<std::vector<uint16_t>> in(W, std::vector<uint16_t>(N));
    std::vector<std::vector<float>> inf(W, std::vector<float>(1000));
    for (int r = 0; r < W; r++) {
        for (size_t i = 0; i < N; i++) in[r][i] = to_bf16((float)(urand() * 8 - 4));
        for (auto &v : inf[r]) v = (float)(urand() * 2 - 1);
    }
    std::vector<uint16_t> want(N);
    for (size_t i = 0; i < N; i++) {
        uint16_t a = in[0][i];
        for (int r = 1; r < W; r++) a = to_bf16(from_bf16(a) + from_bf16(in[r][i]));
        want[i] = a;
    }
    std::vector<float> wantf(1000);
    for (size_t i = 0; i < 1000; i++) wantf[i] = (inf[0][i] + inf[1][i]) + inf[2][i];
    std::vector<std::vector<uint16_t>> got(W);
    std::vector<std::vector<float>> gotf(W), gath(W);
    std::vector<std::vector<int32_t>> gi(W);
    std::vector<std::vector<uint8_t>> gb(W), gu(W);
    std::vector<uint16_t> gh(W);
    const size_t BB = (5u << 20) / 2 + 3;   // broadcast bytes: three chunks
    std::vector<uint8_t> bsrc(BB);
    for (auto &b : bsrc) b = (uint8_t)(urand() * 256);

    ncclUniqueId id;
    TEST_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "unique id");
    std::string shm = std::string("/dev/shm") + id.internal;
    run_ranks(W, id, [&](int r, ncclComm_t c, cudaStream_t s) {
        int n = 0, me = -1;
        ncclCommCount(c, &n), ncclCommUserRank(c, &me);
        RANK_CHECK(n == W && me == r, "count %d rank %d", n, me);
        uint16_t *d;
        cudaMalloc((void **)&d, N * 2);
        cudaMemcpy(d, in[r].data(), N * 2, cudaMemcpyHostToDevice);
        RANK_CHECK(ncclAllReduce(d, d, N, ncclBfloat16, ncclSum, c, s) == ncclSuccess, "bf16 all-reduce");
        got[r].resize(N);
        cudaMemcpy(got[r].data(), d, N * 2, cudaMemcpyDeviceToHost);
        cudaFree(d);

        float *f, *g;
        cudaMalloc((void **)&f, 1000 * 4);
        cudaMalloc((void **)&g, 1000 * 4);
        cudaMemcpy(f, inf[r].data(), 1000 * 4, cudaMemcpyHostToDevice);
        ncclAllReduce(f, g, 1000, ncclFloat32, ncclSum, c, s);   // out of place
        gotf[r].resize(1000);
        cudaMemcpy(gotf[r].data(), g, 1000 * 4, cudaMemcpyDeviceToHost);
        cudaFree(g);
        // all-gather: 300000 floats per rank (1.2 MB: two chunks)
        const size_t G = 300000;
        float *ga, *gr;
        cudaMalloc((void **)&ga, G * 4);
        cudaMalloc((void **)&gr, G * 4 * W);
        std::vector<float> mine(G);
        for (size_t i = 0; i < G; i++) mine[i] = (float)(r * 1000000 + (int)i);
        cudaMemcpy(ga, mine.data(), G * 4, cudaMemcpyHostToDevice);
        ncclAllGather(ga, gr, G, ncclFloat32, c, s);
        gath[r].resize(G * W);
        cudaMemcpy(gath[r].data(), gr, G * 4 * W, cudaMemcpyDeviceToHost);
        cudaFree(ga), cudaFree(gr), cudaFree(f);

        // int32 max, min, prod, avg; uint8 sum wraps
        int32_t *iv;
        cudaMalloc((void **)&iv, 4 * 4);
        gi[r].resize(4);
        const ncclRedOp_t ops[4] = {ncclMax, ncclMin, ncclProd, ncclAvg};
        for (int k = 0; k < 4; k++) {
            const int32_t v = (ops[k] == ncclProd) ? r + 2 : 10 * r - 7;
            cudaMemcpy(iv, &v, 4, cudaMemcpyHostToDevice);
            ncclAllReduce(iv, iv, 1, ncclInt32, ops[k], c, s);
            cudaMemcpy(&gi[r][(size_t)k], iv, 4, cudaMemcpyDeviceToHost);
        }
        cudaFree(iv);
        uint8_t *u;
        cudaMalloc((void **)&u, 1);
        const uint8_t uv = 100;
        cudaMemcpy(u, &uv, 1, cudaMemcpyHostToDevice);
        ncclAllReduce(u, u, 1, ncclUint8, ncclSum, c, s);
        gu[r].resize(1);
        cudaMemcpy(gu[r].data(), u, 1, cudaMemcpyDeviceToHost);
        cudaFree(u);
        RANK_CHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, c, s) == ncclSuccess, "zero count");
        // IEEE half: 1.5 (0x3e00) + 2.25 (0x4080) + -0.5 (0xb800) = 3.25 (0x4280), exact
        const uint16_t hv[3] = {0x3e00, 0x4080, 0xb800};
        uint16_t *h;
        cudaMalloc((void **)&h, 2);
        cudaMemcpy(h, &hv[r], 2, cudaMemcpyHostToDevice);
        ncclAllReduce(h, h, 1, ncclFloat16, ncclSum, c, s);
        cudaMemcpy(&gh[(size_t)r], h, 2, cudaMemcpyDeviceToHost);
        cudaFree(h);

        // broadcast from rank 1: in place (3 chunks)
        uint8_t *b;
        cudaMalloc((void **)&b, BB);
        if (r == 1) cudaMemcpy(b, bsrc.data(), BB, cudaMemcpyHostToDevice);
        else cudaMemset(b, 0, BB);
        ncclBroadcast(b, b, BB, ncclUint8, 1, c, s);
        gb[r].resize(BB);
        cudaMemcpy(gb[r].data(), b, BB, cudaMemcpyDeviceToHost);
        cudaFree(b);
        cudaStreamSynchronize(s);
    });
    rank_checks_report("threads");
    for (int r = 0; r < W; r++) {
        TEST_CHECK(got[r] == want, "rank %d: bf16 sum equals the rank-order bf16 reference", r);
        TEST_CHECK(gotf[r] == wantf, "rank %d: f32 sum equals the rank-order reference", r);
        bool ok = true;
        for (int q = 0; q < W; q++)
            for (size_t i = 0; i < 300000; i++) ok &= gath[r][(size_t)q * 300000 + i] == (float)(q * 1000000 + (int)i);
        TEST_CHECK(ok, "rank %d: all-gather places rank q's part at q * count", r);
        // max(-7, 3, 13) = 13, min = -7, prod 2*3*4 = 24, avg (-7+3+13)/3 = 3
        TEST_CHECK(gi[r][0] == 13 && gi[r][1] == -7 && gi[r][2] == 24 && gi[r][3] == 3, "rank %d: int32 ops %d %d %d %d",
                   r, gi[r][0], gi[r][1], gi[r][2], gi[r][3]);
        TEST_CHECK(gu[r][0] == (uint8_t)300, "rank %d: uint8 sum wraps: %d", r, gu[r][0]);
        TEST_CHECK(gh[(size_t)r] == 0x4280, "rank %d: f16 sum 0x%04x", r, gh[(size_t)r]);
        TEST_CHECK(gb[r] == bsrc, "rank %d: broadcast from rank 1", r);
    }
    struct stat st;
    TEST_CHECK(stat(shm.c_str(), &st) != 0, "%s unlinked once the group formed", shm.c_str());
}

void test_capture() {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    float before[2] = {0, 0}, after_capture[2] = {0, 0}, after_replay[2] = {0, 0};
    run_ranks(2, id, [&](int r, ncclComm_t c, cudaStream_t s) {
        float *d;
        cudaMalloc((void **)&d, 4);
        const float v = (float)(r + 1);
        cudaMemcpy(d, &v, 4, cudaMemcpyHostToDevice);
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, s);
        cudaGraph_t g;
        cudaStreamEndCapture(s, &g);
        cudaMemcpy(&after_capture[r], d, 4, cudaMemcpyDeviceToHost);
        before[r] = v;
        cudaGraphExec_t ge;
        cudaGraphInstantiate(&ge, g, 0);
        cudaGraphLaunch(ge, s);   // 1 + 2 = 3 on both
        cudaGraphLaunch(ge, s);   // 3 + 3 = 6
        cudaMemcpy(&after_replay[r], d, 4, cudaMemcpyDeviceToHost);
        cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaFree(d);
    });
    rank_checks_report("capture");
    for (int r = 0; r < 2; r++) {
        TEST_CHECK(after_capture[r] == before[r], "rank %d: nothing ran during capture (%g)", r, after_capture[r]);
        TEST_CHECK(after_replay[r] == 6.0f, "rank %d: two replays summed twice: %g", r, after_replay[r]);
    }
}

// fork a child running fn with stderr captured; returns {wait status, stderr}
std::pair<int, std::string> in_child(const std::function<int()> &fn) {
    int fds[2];
    if (pipe(fds) != 0) return {-1, ""};
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        setenv("UNMASK_EMU_NCCL_TIMEOUT_MS", "300", 1);
        _exit(fn());
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)n);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return {st, err};
}

bool aborted_with(const std::pair<int, std::string> &r, const char *msg) {
    return WIFSIGNALED(r.first) && WTERMSIG(r.first) == SIGABRT && r.second.find(msg) != std::string::npos;
}

// two ranks, rank r runs body(r, comm, stream, device buffer of 16 floats)
int two_ranks(const std::function<void(int, ncclComm_t, cudaStream_t, float *)> &body) {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    run_ranks(2, id, [&](int r, ncclComm_t c, cudaStream_t s) {
        float *d;
        cudaMalloc((void **)&d, 64);
        body(r, c, s, d);
    });
    return 0;
}

void test_failures() {
    // a rank that never joins: init fails after the timeout, naming it
    auto r = in_child([] {
        ncclUniqueId id;
        ncclGetUniqueId(&id);
        ncclComm_t c;
        const ncclResult_t res = ncclCommInitRank(&c, 3, id, 0);
        fprintf(stderr, "%d %s\n", (int)res, ncclGetLastError(nullptr));
        return res == ncclSystemError ? 0 : 1;
    });
    TEST_CHECK(WIFEXITED(r.first) && WEXITSTATUS(r.first) == 0 && r.second.find("rank(s) 1,2 to join") != std::string::npos,
               "init without the other ranks: %s", r.second.c_str());
    r = in_child([] {
        return two_ranks([](int rank, ncclComm_t c, cudaStream_t s, float *d) {
            if (rank == 0) ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
        });
    });
    TEST_CHECK(aborted_with(r, "ncclAllReduce #1 waited 300 ms for rank(s) 1"), "missing rank: %s", r.second.c_str());
    r = in_child([] {
        return two_ranks([](int rank, ncclComm_t c, cudaStream_t s, float *d) {
            ncclAllReduce(d, d, rank ? 8 : 16, ncclFloat32, ncclSum, c, s);
        });
    });
    TEST_CHECK(aborted_with(r, "collective #1 mismatch"), "count mismatch: %s", r.second.c_str());
    r = in_child([] {
        return two_ranks([](int rank, ncclComm_t c, cudaStream_t s, float *d) {
            if (rank == 0) ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
            else ncclAllGather(d, d, 8, ncclFloat32, c, s);
        });
    });
    TEST_CHECK(aborted_with(r, "rank 1 called #1 ncclAllGather") || aborted_with(r, "this rank called ncclAllGather"),
               "different collectives: %s", r.second.c_str());
    r = in_child([] {
        return two_ranks([](int, ncclComm_t c, cudaStream_t s, float *) {
            float host[4] = {0};
            ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, c, s);
        });
    });
    TEST_CHECK(aborted_with(r, "is not inside a live device allocation"), "host buffer: %s", r.second.c_str());
    r = in_child([] {
        setenv("UNMASK_EMU_NCCL_TIMEOUT_MS", "60000", 1);   // the abort, not the timeout, must end it
        return two_ranks([](int rank, ncclComm_t c, cudaStream_t s, float *d) {
            if (rank == 0) ncclAllReduce(d, d, 16, ncclFloat32, ncclSum, c, s);
            else ncclCommAbort(c), tl_comm_gone = true;
        });
    });
    TEST_CHECK(aborted_with(r, "rank 1 aborted the communicator"), "peer abort: status %d: %s", r.first, r.second.c_str());
}

void test_processes() {
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(stdout), fflush(stderr);
        pids[r] = fork();
        if (pids[r] == 0) {
            cudaSetDevice(r);
            ncclComm_t c;
            if (ncclCommInitRank(&c, 2, id, r) != ncclSuccess) _exit(10);
            float v[3] = {1.5f * (float)(r + 1), -2.0f, (float)r}, *d;
            cudaMalloc((void **)&d, sizeof v);
            cudaMemcpy(d, v, sizeof v, cudaMemcpyHostToDevice);
            ncclAllReduce(d, d, 3, ncclFloat32, ncclSum, c, nullptr);
            cudaMemcpy(v, d, sizeof v, cudaMemcpyDeviceToHost);
            ncclCommDestroy(c);
            _exit(v[0] == 4.5f && v[1] == -4.0f && v[2] == 1.0f ? 0 : 11);
        }
    }
    for (int r = 0; r < 2; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        TEST_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process rank %d: status %d", r, st);
    }
    struct stat st;
    TEST_CHECK(stat((std::string("/dev/shm") + id.internal).c_str(), &st) != 0, "segment unlinked");
}

}  // namespace

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// poll a non-blocking communicator until its state leaves ncclInProgress (bounded: 10 s)
ncclResult_t settle(ncclComm_t c) {
    ncclResult_t st = ncclInProgress;
    for (const double t0 = now_s(); now_s() - t0 < 10.0;) {
        if (ncclCommGetAsyncError(c, &st) != ncclSuccess) return ncclInternalError;
        if (st != ncclInProgress) break;
        std::this_thread::yield();
    }
    return st;
}

void test_nonblocking() {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    // rank 0 pending until rank 1 joins
    ncclComm_t c0 = nullptr, c1 = nullptr;
    cudaSetDevice(0);
    TEST_CHECK(ncclCommInitRankConfig(&c0, 2, id, 0, &cfg) == ncclInProgress && c0, "non-blocking init: in progress");
    ncclResult_t st = ncclSuccess;
    TEST_CHECK(ncclCommGetAsyncError(c0, &st) == ncclSuccess && st == ncclInProgress, "pending while rank 1 is missing");
    std::thread t1([&] {
        cudaSetDevice(1);
        ncclComm_t c = nullptr;
        ncclResult_t r = ncclCommInitRankConfig(&c, 2, id, 1, &cfg);
        RANK_CHECK(r == ncclInProgress || r == ncclSuccess, "rank 1 init: %d", (int)r);
        RANK_CHECK(settle(c) == ncclSuccess, "rank 1 settles: %s", ncclGetLastError(c));
        c1 = c;
    });
    TEST_CHECK(settle(c0) == ncclSuccess, "rank 0 settles once rank 1 joined: %s", ncclGetLastError(c0));
    t1.join();
    rank_checks_report("non-blocking init");
    // an all-reduce on the two non-blocking communicators (one thread per rank)
    std::vector<std::thread> th;
    float got[2] = {0, 0};
    for (int r = 0; r < 2; r++)
        th.emplace_back([&, r] {
            cudaSetDevice(r);
            float v = (float)(r + 1) * 1.25f, *d;
            cudaMalloc((void **)&d, sizeof v);
            cudaMemcpy(d, &v, sizeof v, cudaMemcpyHostToDevice);
            ncclComm_t c = r ? c1 : c0;
            ncclResult_t q = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, c, nullptr);
            RANK_CHECK(q == ncclSuccess || (q == ncclInProgress && settle(c) == ncclSuccess), "all-reduce rank %d", r);
            cudaMemcpy(&got[r], d, sizeof v, cudaMemcpyDeviceToHost);
            cudaFree(d);
        });
    for (auto &t : th) t.join();
    rank_checks_report("non-blocking all-reduce");
    TEST_CHECK(got[0] == 3.75f && got[1] == 3.75f, "all-reduce on non-blocking communicators: %g %g", got[0], got[1]);
    TEST_CHECK(ncclCommFinalize(c0) == ncclSuccess && settle(c0) == ncclSuccess && ncclCommDestroy(c0) == ncclSuccess,
               "finalize + destroy rank 0");
    TEST_CHECK(ncclCommFinalize(c1) == ncclSuccess && settle(c1) == ncclSuccess && ncclCommDestroy(c1) == ncclSuccess,
               "finalize + destroy rank 1");

    // abort a pending init: 3 ranks, rank 2 never comes, rank 1 waits in a blocking init
    ncclGetUniqueId(&id);
    cudaSetDevice(0);
    c0 = nullptr;
    TEST_CHECK(ncclCommInitRankConfig(&c0, 3, id, 0, &cfg) == ncclInProgress, "pending init of 3");
    ncclResult_t r1 = ncclSuccess;
    std::string why1;
    std::thread t2([&] {
        cudaSetDevice(1);
        ncclComm_t c = nullptr;
        r1 = ncclCommInitRank(&c, 3, id, 1);
        why1 = ncclGetLastError(nullptr);
    });
    // rank 1 has joined once it shows in the segment's joined mask; we only know rank 0 is pending
    TEST_CHECK(ncclCommGetAsyncError(c0, &st) == ncclSuccess && st == ncclInProgress, "still pending (rank 2 missing)");
    const double t0 = now_s();
    TEST_CHECK(ncclCommAbort(c0) == ncclSuccess, "abort a pending init");
    const double abort_s = now_s() - t0;
    TEST_CHECK(abort_s < 1.0, "abort returned in %.3f s", abort_s);
    t2.join();
    const double peer_s = now_s() - t0;
    TEST_CHECK(r1 == ncclSystemError, "the blocked peer's init fails: %d %s", (int)r1, why1.c_str());
    TEST_CHECK(why1.find("rank 0 gave up") != std::string::npos || why1.find("never initialised") != std::string::npos,
               "it names the rank that gave up: %s", why1.c_str());
    TEST_CHECK(peer_s < 5.0, "the peer returned %.3f s after the abort (its timeout is 60 s)", peer_s);
    struct stat sb;
    TEST_CHECK(stat((std::string("/dev/shm") + id.internal).c_str(), &sb) != 0, "no segment left after the abort");

    ncclConfig_t bad = cfg;
    bad.magic = 0;
    ncclComm_t cb = nullptr;
    TEST_CHECK(ncclCommInitRankConfig(&cb, 2, id, 0, &bad) == ncclInvalidArgument, "config without the initializer");
}

int main() {
    test_failures();   // first: the children read UNMASK_EMU_NCCL_TIMEOUT_MS on their first wait
    test_nonblocking();
    test_threads();
    test_capture();
    test_processes();
    return test_report();
}
