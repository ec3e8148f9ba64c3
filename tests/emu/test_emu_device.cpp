/*
 * test_emu_device.cpp — self-tests of the CUDA emulator's device side (tests/emu/umk_emu_exec.cpp),
 * compiled like kernels/ (umk_emu_device.h force-included):
 *   - mma.sync m16n8k16 bf16 against a plain fp64 matmul of the same bf16 matrices, with fragments
 *     loaded per the PTX ISA layout written out here independently of the emulator (random A, B, C);
 *   - __syncthreads orders shared-memory writes and reads (a block-wide reversal through __shared__),
 *     static __shared__ and dynamic shared memory are per block;
 *   - __shfl_xor_sync butterfly sums, __ballot_sync bits, atomics;
 *   - grid / block indices cover every (block, thread) once;
 *   - misuse aborts with a message (each in a forked child): divergent __syncthreads, a shuffle whose
 *     mask names an exited lane, a deadlock, too much dynamic shared memory without the attribute,
 *     and (ASan builds only) a kernel reading past its device allocation.
 * Prints "N passed, N failed"; exit 1 on failure. Main thread (and forked children).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "test.h"
#include "umk_portable.h"

namespace {

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
double urand() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

uint16_t bf(float f) { return umk_emu_f32_to_bf16_bits(f); }
float fb(uint16_t h) { return umk_emu_bf16_bits_to_f32(h); }

// ---------------------------------------------------------------- mma

// A [16][16] row-major bf16, B [16][8] (k, n) bf16, C/D [16][8] f32
__global__ void k_mma(const uint16_t *A, const uint16_t *B, const float *C, float *D) {
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    // PTX ISA m16n8k16 .bf16: a_i row = g (+8 for a2,a3,a6,a7), col = 2t + (i&1) (+8 for a4..a7)
    auto pk = [](uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); };
    uint32_t a[4];
    a[0] = pk(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]);
    a[1] = pk(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]);
    a[2] = pk(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]);
    a[3] = pk(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9]);
    // b_i: k = 2t + (i&1) (+8 for b2,b3), n = g
    const uint32_t b0 = pk(B[(2 * t) * 8 + g], B[(2 * t + 1) * 8 + g]);
    const uint32_t b1 = pk(B[(2 * t + 8) * 8 + g], B[(2 * t + 9) * 8 + g]);
    // c_i: row = g (+8 for c2,c3), col = 2t + (i&1)
    float d[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
    umk_mma_bf16_16816(d, a, b0, b1);
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

template <typename T>
T *dev_copy(const std::vector<T> &h) {
    void *p = nullptr;
    cudaMalloc(&p, h.size() * sizeof(T));
    cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return static_cast<T *>(p);
}

void test_mma() {
    double worst = 0.0;
    for (int trial = 0; trial < 20; trial++) {
        std::vector<uint16_t> A(256), B(128);
        std::vector<float> C(128), D(128, 0.0f);
        for (auto &x : A) x = bf((float)(urand() * 4.0 - 2.0));
        for (auto &x : B) x = bf((float)(urand() * 4.0 - 2.0));
        for (auto &x : C) x = (float)(urand() * 2.0 - 1.0);
        uint16_t *dA = dev_copy(A), *dB = dev_copy(B);
        float *dC = dev_copy(C), *dD = dev_copy(D);
        UMK_LAUNCH(k_mma, 1, 32, 0, (cudaStream_t) nullptr, dA, dB, dC, dD);
        TEST_CHECK(cudaGetLastError() == cudaSuccess, "mma launch");
        cudaMemcpy(D.data(), dD, 128 * sizeof(float), cudaMemcpyDeviceToHost);
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                double ref = C[i * 8 + j];
                for (int k = 0; k < 16; k++) ref += (double)fb(A[i * 16 + k]) * (double)fb(B[k * 8 + j]);
                const double e = fabs(D[i * 8 + j] - ref);
                if (e > worst) worst = e;
            }
        cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
    }
    TEST_CHECK(worst < 1e-4, "mma vs fp64 matmul: max abs error %g", worst);
}

// ---------------------------------------------------------------- barriers, shared memory

__global__ void k_reverse(const int *in, int *out, int n) {
    __shared__ int buf[256];
    UMK_DYNAMIC_SMEM(dyn);
    int *d = reinterpret_cast<int *>(dyn);
    const int t = threadIdx.x, base = blockIdx.x * n;
    buf[t] = in[base + t];
    d[t] = in[base + t] * 2;
    __syncthreads();   // every write above before any read below
    out[base + t] = buf[n - 1 - t] + d[n - 1 - t];
}

void test_barrier_smem() {
    const int n = 256, blocks = 3;
    std::vector<int> in(n * blocks), out(n * blocks, 0);
    for (int i = 0; i < n * blocks; i++) in[i] = i * 7 + 1;
    int *di = dev_copy(in), *dout = dev_copy(out);
    UMK_LAUNCH(k_reverse, blocks, n, n * sizeof(int), (cudaStream_t) nullptr, di, dout, n);
    cudaMemcpy(out.data(), dout, out.size() * sizeof(int), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++) bad += out[b * n + t] != 3 * in[b * n + n - 1 - t];
    TEST_CHECK(bad == 0, "block reversal through shared memory: %d wrong", bad);
    cudaFree(di), cudaFree(dout);
}

// ---------------------------------------------------------------- shuffles, ballot, atomics, indices

__global__ void k_warp(const float *in, float *sums, unsigned *ballots, unsigned *count, int *seen) {
    const int t = threadIdx.x + blockIdx.x * blockDim.x;
    float v = in[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const double dv = __shfl_xor_sync(0xffffffffu, (double)t, 1);   // 8-byte payload: the neighbour's id
    sums[t] = v + (float)(dv - (double)(t ^ 1));
    const unsigned b = __ballot_sync(0xffffffffu, (threadIdx.x & 3) == 1);
    if ((threadIdx.x & 31) == 0) ballots[t / 32] = b;
    atomicAdd(count, 1u);
    atomicAdd(&seen[t], 1);
}

void test_warp() {
    const int blocks = 2, threads = 96, n = blocks * threads;
    std::vector<float> in(n);
    for (int i = 0; i < n; i++) in[i] = (float)(i % 13) - 6.0f;
    std::vector<float> sums(n, 0.0f);
    std::vector<unsigned> ballots(n / 32, 0), count(1, 0);
    std::vector<int> seen(n, 0);
    float *din = dev_copy(in), *ds = dev_copy(sums);
    unsigned *db = dev_copy(ballots), *dc = dev_copy(count);
    int *dseen = dev_copy(seen);
    UMK_LAUNCH(k_warp, blocks, threads, 0, (cudaStream_t) nullptr, din, ds, db, dc, dseen);
    cudaMemcpy(sums.data(), ds, n * sizeof(float), cudaMemcpyDeviceToHost);
    cudaMemcpy(ballots.data(), db, ballots.size() * sizeof(unsigned), cudaMemcpyDeviceToHost);
    cudaMemcpy(count.data(), dc, sizeof(unsigned), cudaMemcpyDeviceToHost);
    cudaMemcpy(seen.data(), dseen, n * sizeof(int), cudaMemcpyDeviceToHost);
    int bad_sum = 0, bad_ballot = 0, bad_seen = 0;
    for (int w = 0; w < n / 32; w++) {
        float ref = 0.0f;
        for (int l = 0; l < 32; l++) ref += in[w * 32 + l];
        for (int l = 0; l < 32; l++) bad_sum += sums[w * 32 + l] != ref;
        bad_ballot += ballots[w] != 0x22222222u;
    }
    for (int i = 0; i < n; i++) bad_seen += seen[i] != 1;
    TEST_CHECK(bad_sum == 0, "butterfly sums: %d lanes wrong", bad_sum);
    TEST_CHECK(bad_ballot == 0, "ballots: %d warps wrong", bad_ballot);
    TEST_CHECK(count[0] == (unsigned)n, "atomic count %u, expected %d", count[0], n);
    TEST_CHECK(bad_seen == 0, "every (block, thread) once: %d wrong", bad_seen);
    cudaFree(din), cudaFree(ds), cudaFree(db), cudaFree(dc), cudaFree(dseen);
}

__global__ void k_index3d(int *out) {
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * (blockDim.x * blockDim.y * blockDim.z) + t] += 1;
}

void test_index3d() {
    const dim3 grid(3, 2, 2), block(4, 3, 2);
    const int n = 12 * 24;
    std::vector<int> h(n, 0);
    int *d = dev_copy(h);
    UMK_LAUNCH(k_index3d, grid, block, 0, (cudaStream_t) nullptr, d);
    cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int v : h) bad += v != 1;
    TEST_CHECK(bad == 0, "3-d grid/block indices: %d cells not hit exactly once", bad);
    cudaFree(d);
}

// ---------------------------------------------------------------- misuse (forked)

__global__ void k_divergent_barrier(int *x) {
    if (threadIdx.x < 32) {
        x[threadIdx.x] = 1;
        __syncthreads();
    } else {
        __syncthreads();
    }
}

__global__ void k_shfl_exited(int *x) {
    if (threadIdx.x >= 16) return;
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

__global__ void k_deadlock(int *x) {
    // lanes 0..15 wait in a full-warp shuffle for lanes 16..31, which wait at the block barrier
    if (threadIdx.x < 16) x[0] = __shfl_xor_sync(0xffffffffu, 1, 1);
    __syncthreads();
}

__global__ void k_oob(const int *in, int *out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[0] += in[i];   // no i < n guard: the last block reads past the allocation
    (void)n;
}

__global__ void k_big_smem(int *x) {
    UMK_DYNAMIC_SMEM(dyn);
    x[0] = dyn[0];
}

// runs fn in a child; returns its stderr, *sig = terminating signal (0 if it exited)
std::string in_child(void (*fn)(), int *sig, int *code) {
    int fds[2];
    if (pipe(fds) != 0) return "";
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    std::string out;
    char buf[512];
    ssize_t r;
    while ((r = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)r);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    *sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

int *scratch() {
    void *p = nullptr;
    cudaMalloc(&p, 4096);
    return static_cast<int *>(p);
}

void run_divergent() { UMK_LAUNCH(k_divergent_barrier, 1, 64, 0, (cudaStream_t) nullptr, scratch()); }
void run_shfl_exited() { UMK_LAUNCH(k_shfl_exited, 1, 32, 0, (cudaStream_t) nullptr, scratch()); }
void run_deadlock() { UMK_LAUNCH(k_deadlock, 1, 64, 0, (cudaStream_t) nullptr, scratch()); }
void run_oob() {
    int *in = nullptr;
    cudaMalloc((void **)&in, 100 * sizeof(int));
    UMK_LAUNCH(k_oob, 1, 128, 0, (cudaStream_t) nullptr, in, scratch(), 100);
}

void run_big_smem() {
    UMK_LAUNCH(k_big_smem, 1, 32, 64 * 1024, (cudaStream_t) nullptr, scratch());
    // without the attribute the launch fails (no abort): report it through the exit code
    const cudaError_t e = cudaGetLastError();
    if (e != cudaErrorInvalidValue) _exit(10);
    cudaFuncSetAttribute(k_big_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024);
    UMK_LAUNCH(k_big_smem, 1, 32, 64 * 1024, (cudaStream_t) nullptr, scratch());
    _exit(cudaGetLastError() == cudaSuccess ? 42 : 11);
}

void test_misuse() {
    int sig = 0, code = 0;
    std::string e = in_child(run_divergent, &sig, &code);
    TEST_CHECK(sig == SIGABRT && e.find("divergent __syncthreads") != std::string::npos &&
                   e.find("test_emu_device.cpp:") != std::string::npos,
               "divergent barrier: signal %d, stderr: %s", sig, e.c_str());
    e = in_child(run_shfl_exited, &sig, &code);
    TEST_CHECK(sig == SIGABRT && e.find("has exited") != std::string::npos, "shuffle naming an exited lane: %d, %s",
               sig, e.c_str());
    e = in_child(run_deadlock, &sig, &code);
    TEST_CHECK(sig == SIGABRT && e.find("deadlock") != std::string::npos, "deadlock: %d, %s", sig, e.c_str());
#if defined(__SANITIZE_ADDRESS__)
    // under -DUNMASK_SANITIZE=ON device memory is ASan-guarded host memory: a kernel reading past its
    // allocation is reported (a memcheck)
    e = in_child(run_oob, &sig, &code);
    TEST_CHECK(sig != 0 || code != 0, "ASan: out-of-bounds kernel read not reported");
    TEST_CHECK(e.find("heap-buffer-overflow") != std::string::npos && e.find("k_oob") != std::string::npos,
               "ASan report names the kernel: %s", e.substr(0, 400).c_str());
#else
    (void)run_oob;
#endif
    e = in_child(run_big_smem, &sig, &code);
    TEST_CHECK(sig == 0 && code == 42, "64 KiB dynamic smem: fails without the attribute, runs with it (exit %d, %s)",
               code, e.c_str());
}

}  // namespace

int main() {
    test_mma();
    test_barrier_smem();
    test_warp();
    test_index3d();
    test_misuse();
    return test_report();
}
