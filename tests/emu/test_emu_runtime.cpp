/*
 * test_emu_runtime.cpp — self-tests of the CUDA emulator's runtime and cuBLAS subset
 * (tests/emu/umk_emu_runtime.cpp, umk_emu_cublas.cpp):
 *   - stream capture: launches (arguments by value at capture time), copies (host memory read at
 *     replay time, as a real graph does), memsets and GEMMs become nodes that run only on
 *     cudaGraphLaunch, in order, once per launch; synchronising the capturing stream or a
 *     cudaMalloc in the default (global) capture mode invalidates the capture, relaxed mode allows it;
 *   - cublasGemmEx for every op(A)/op(B) pair, padded leading dimensions, alpha/beta (beta = 0 ignores
 *     NaN in C), bf16 and f32 operands, against a naive column-major loop written from the cuBLAS
 *     documentation; invalid leading dimensions are CUBLAS_STATUS_INVALID_VALUE;
 *   - memory: cudaMemGetInfo = UNMASK_EMU_MEM_BYTES minus allocations, an allocation over it fails
 *     with cudaErrorMemoryAllocation (then cudaGetLastError reports and clears it), new memory is
 *     poisoned; UNMASK_EMU_DEVICES devices with per-thread cudaSetDevice; the device name says
 *     "emulator"; a copy overrunning its allocation aborts with a message (forked child).
 * Prints "N passed, N failed"; exit 1 on failure. Main thread (+ one helper thread, forked child).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "test.h"
#include "umk_portable.h"

namespace {

uint64_t g_rng = 12345;
double urand() {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}

__global__ void k_axpy(float *y, const float *x, float a, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

void test_capture() {
    const int n = 100;
    cudaStream_t s;
    TEST_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    float *x, *y, *host;
    cudaMalloc((void **)&x, n * sizeof(float));
    cudaMalloc((void **)&y, n * sizeof(float));
    cudaMallocHost((void **)&host, n * sizeof(float));
    for (int i = 0; i < n; i++) host[i] = (float)i;
    cudaMemcpy(x, host, n * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemset(y, 0, n * sizeof(float));
    const uint64_t launches0 = umk_emu_launch_count();

    TEST_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "begin capture");
    float a = 2.0f;
    UMK_LAUNCH(k_axpy, 1, 128, 0, s, y, x, a, n);   // a by value: 2
    a = 100.0f;                                     // must not affect the captured node
    for (int i = 0; i < n; i++) host[i] = 1.0f;     // read at replay: the node copies 1s
    cudaMemcpyAsync(x, host, n * sizeof(float), cudaMemcpyHostToDevice, s);
    UMK_LAUNCH(k_axpy, 1, 128, 0, s, y, x, 0.5f, n);
    cudaGraph_t g;
    TEST_CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "end capture");
    TEST_CHECK(umk_emu_launch_count() == launches0, "nothing ran during capture");
    std::vector<float> out(n);
    cudaMemcpy(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    int untouched = 0;
    for (int i = 0; i < n; i++) untouched += out[i] == 0.0f;
    TEST_CHECK(untouched == n, "y untouched before replay (%d of %d)", untouched, n);

    cudaGraphExec_t ge;
    TEST_CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
    for (int i = 0; i < n; i++) host[i] = 3.0f;     // replay copies what host holds now
    TEST_CHECK(cudaGraphLaunch(ge, s) == cudaSuccess, "launch 1");
    TEST_CHECK(cudaGraphLaunch(ge, s) == cudaSuccess, "launch 2");
    cudaStreamSynchronize(s);
    cudaMemcpy(out.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost);
    // replay 1: y = 2*i + 0.5*3; x = 3.  replay 2: y += 2*3 + 0.5*3
    int bad = 0;
    for (int i = 0; i < n; i++) bad += fabsf(out[i] - (2.0f * (float)i + 1.5f + 6.0f + 1.5f)) > 1e-4f;
    TEST_CHECK(bad == 0, "graph replayed twice, in order, captured args: %d wrong (y[5] = %g)", bad, out[5]);
    TEST_CHECK(umk_emu_launch_count() == launches0 + 4, "4 kernel launches on replay");

    // synchronising the capturing stream invalidates the capture
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    TEST_CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureUnsupported, "sync during capture refused");
    cudaGraph_t g2 = nullptr;
    TEST_CHECK(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated && g2 == nullptr, "invalidated");
    (void)cudaGetLastError();
    // cudaMalloc while capturing: refused in global mode, allowed after switching the thread to relaxed
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    void *p = nullptr;
    TEST_CHECK(cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported, "cudaMalloc during global capture refused");
    TEST_CHECK(cudaStreamEndCapture(s, &g2) == cudaErrorStreamCaptureInvalidated, "invalidated by cudaMalloc");
    (void)cudaGetLastError();
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    TEST_CHECK(cudaMalloc(&p, 64) == cudaSuccess && p, "cudaMalloc in relaxed mode during capture");
    cudaThreadExchangeStreamCaptureMode(&m);
    TEST_CHECK(m == cudaStreamCaptureModeRelaxed, "exchange returns the previous mode");
    TEST_CHECK(cudaStreamEndCapture(s, &g2) == cudaSuccess && g2, "capture survives a relaxed cudaMalloc");
    cudaGraphDestroy(g2);
    cudaFree(p);

    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaFree(x), cudaFree(y), cudaFreeHost(host);
    cudaStreamDestroy(s);
}

// naive column-major reference from the cuBLAS documentation
void ref_gemm(bool ta, bool tb, int m, int n, int k, float al, const std::vector<float> &A, int lda,
              const std::vector<float> &B, int ldb, float be, std::vector<double> &C, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0.0;
            for (int p = 0; p < k; p++) {
                const double a = ta ? A[(size_t)p + (size_t)i * lda] : A[(size_t)i + (size_t)p * lda];
                const double b = tb ? B[(size_t)j + (size_t)p * ldb] : B[(size_t)p + (size_t)j * ldb];
                acc += a * b;
            }
            double &c = C[(size_t)i + (size_t)j * ldc];
            c = al * acc + (be != 0.0f ? be * c : 0.0);
        }
}

void test_gemm() {
    cublasHandle_t h;
    TEST_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "create");
    const int m = 13, n = 7, k = 21;
    int cases = 0, bad_cases = 0;
    for (int dt = 0; dt < 2; dt++) {   // 0: bf16 A/B/C, 1: f32
        const cudaDataType_t ty = dt ? CUDA_R_32F : CUDA_R_16BF;
        const size_t es = dt ? 4 : 2;
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int beta_case = 0; beta_case < 2; beta_case++) {
                        const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
                        const int lda = ar + 3 * pad, ldb = br + 5 * pad, ldc = m + 2 * pad;
                        std::vector<float> A((size_t)lda * ac), B((size_t)ldb * bc), C((size_t)ldc * n);
                        auto q = [&](double v) {   // values exact in the operand type
                            return dt ? (float)v : umk_emu_bf16_bits_to_f32(umk_emu_f32_to_bf16_bits((float)v));
                        };
                        for (auto &v : A) v = q(urand() * 2 - 1);
                        for (auto &v : B) v = q(urand() * 2 - 1);
                        for (auto &v : C) v = beta_case ? q(urand() * 2 - 1) : NAN;   // beta = 0: C not read
                        const float al = 0.75f, be = beta_case ? -0.5f : 0.0f;
                        std::vector<double> R(C.begin(), C.end());
                        ref_gemm(ta, tb, m, n, k, al, A, lda, B, ldb, be, R, ldc);
                        auto up = [&](const std::vector<float> &v) {
                            std::vector<unsigned char> raw(v.size() * es);
                            for (size_t i = 0; i < v.size(); i++) {
                                if (dt) memcpy(&raw[i * 4], &v[i], 4);
                                else {
                                    const uint16_t b = umk_emu_f32_to_bf16_bits(v[i]);
                                    memcpy(&raw[i * 2], &b, 2);
                                }
                            }
                            void *d = nullptr;
                            cudaMalloc(&d, raw.size());
                            cudaMemcpy(d, raw.data(), raw.size(), cudaMemcpyHostToDevice);
                            return d;
                        };
                        void *dA = up(A), *dB = up(B), *dC = up(C);
                        const cublasStatus_t st =
                            cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                         &al, dA, ty, lda, dB, ty, ldb, &be, dC, ty, ldc, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
                        std::vector<unsigned char> raw(C.size() * es);
                        cudaMemcpy(raw.data(), dC, raw.size(), cudaMemcpyDeviceToHost);
                        double worst = 0.0;
                        for (int j = 0; j < n; j++)
                            for (int i = 0; i < m; i++) {
                                const size_t ci = (size_t)i + (size_t)j * ldc;
                                float got;
                                if (dt) memcpy(&got, &raw[ci * 4], 4);
                                else {
                                    uint16_t b;
                                    memcpy(&b, &raw[ci * 2], 2);
                                    got = umk_emu_bf16_bits_to_f32(b);
                                }
                                const double e = fabs(got - R[ci]) / (1.0 + fabs(R[ci]));
                                if (!(e <= worst)) worst = e;   // NaN-safe
                            }
                        // padding rows of C (i >= m) untouched
                        int pad_ok = 1;
                        for (int j = 0; j < n && pad; j++)
                            for (int i = m; i < ldc; i++) {
                                const size_t ci = (size_t)i + (size_t)j * ldc;
                                float got;
                                if (dt) memcpy(&got, &raw[ci * 4], 4);
                                else {
                                    uint16_t b;
                                    memcpy(&b, &raw[ci * 2], 2);
                                    got = umk_emu_bf16_bits_to_f32(b);
                                }
                                const float want = C[ci];
                                pad_ok &= (isnan(want) && isnan(got)) || got == want;
                            }
                        const double tol = dt ? 1e-5 : 1e-2;   // bf16 output rounding: 2^-8 relative
                        cases++;
                        if (st != CUBLAS_STATUS_SUCCESS || !(worst <= tol) || !pad_ok) {
                            bad_cases++;
                            fprintf(stderr, "gemm %s op %c%c pad %d beta %g: status %d, max rel err %g, pad %d\n",
                                    dt ? "f32" : "bf16", ta ? 'T' : 'N', tb ? 'T' : 'N', pad, be, (int)st, worst, pad_ok);
                        }
                        cudaFree(dA), cudaFree(dB), cudaFree(dC);
                    }
    }
    TEST_CHECK(cases == 32 && bad_cases == 0, "GemmEx: %d of %d op/ld/beta/type cases wrong", bad_cases, cases);
    const float one = 1.0f, zero = 0.0f;
    void *d = nullptr;
    cudaMalloc(&d, 4096);
    TEST_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 8, &one, d, CUDA_R_16BF, 4, d, CUDA_R_16BF, 8, &zero, d,
                            CUDA_R_16BF, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
               "lda < k with op T is invalid");
    TEST_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 8, &one, d, CUDA_R_16BF, 4, d, CUDA_R_16BF, 8, &zero, d,
                            CUDA_R_16BF, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE,
               "ldc < m is invalid");
    cudaFree(d);
    cublasDestroy(h);
}

void overrun_copy() {
    void *d = nullptr;
    cudaMalloc(&d, 100);
    char host[200] = {0};
    cudaMemcpy(d, host, 101, cudaMemcpyHostToDevice);
}

void test_memory() {
    // ctest runs this with UNMASK_EMU_MEM_BYTES=1073741824 and UNMASK_EMU_DEVICES=2
    int n = 0;
    TEST_CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2, "UNMASK_EMU_DEVICES=2: %d devices", n);
    struct cudaDeviceProp prop;
    TEST_CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 && prop.minor == 0 &&
                   strstr(prop.name, "emulator"),
               "sm_90, name '%s'", prop.name);
    size_t f0 = 0, t0 = 0;
    cudaMemGetInfo(&f0, &t0);
    TEST_CHECK(t0 == (1ull << 30), "total %zu", t0);
    void *p = nullptr;
    TEST_CHECK(cudaMalloc(&p, 256u << 20) == cudaSuccess, "256 MiB");
    size_t f1 = 0, t1 = 0;
    cudaMemGetInfo(&f1, &t1);
    TEST_CHECK(f0 - f1 == (256u << 20), "free dropped by %zu", f0 - f1);
    TEST_CHECK(((unsigned char *)p)[12345] == 0xff, "new device memory is poisoned");
    void *q = nullptr;
    TEST_CHECK(cudaMalloc(&q, 900u << 20) == cudaErrorMemoryAllocation && q == nullptr, "over the total fails");
    TEST_CHECK(cudaGetLastError() == cudaErrorMemoryAllocation && cudaGetLastError() == cudaSuccess,
               "last error reported once");
    // device 1 from another thread: its own accounting
    size_t f_other = 0;
    std::thread th([&] {
        cudaSetDevice(1);
        cudaMemGetInfo(&f_other, nullptr);
    });
    th.join();
    TEST_CHECK(f_other == (1ull << 30), "device 1 untouched by device 0's allocation (%zu)", f_other);
    int dev = -1;
    cudaGetDevice(&dev);
    TEST_CHECK(dev == 0, "cudaSetDevice is per thread (main still on %d)", dev);
    TEST_CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice, "device 2 does not exist");
    (void)cudaGetLastError();
    cudaFree(p);
    cudaMemGetInfo(&f1, nullptr);
    TEST_CHECK(f1 == f0, "free restored");

    int fds[2];
    TEST_CHECK(pipe(fds) == 0, "pipe");
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        overrun_copy();
        _exit(0);
    }
    close(fds[1]);
    std::string err;
    char buf[512];
    ssize_t r;
    while ((r = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, (size_t)r);
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    TEST_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && err.find("overruns its device allocation") != std::string::npos,
               "overrunning copy aborts: %s", err.c_str());
}

}  // namespace

int main() {
    test_capture();
    test_gemm();
    test_memory();
    return test_report();
}
