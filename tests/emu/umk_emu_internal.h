/*
 * umk_emu_internal.h — private to the emulator's .cpp files: the pieces the runtime (umk_emu_runtime.cpp),
 * the executor (umk_emu_exec.cpp) and the cuBLAS subset (umk_emu_cublas.cpp) share.
 * Does not: expose anything to kernels or to our C code.
 */
#ifndef UMK_EMU_INTERNAL_H
#define UMK_EMU_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <functional>

#include "cuda_runtime_api.h"

namespace umk_emu {

// "unmask CUDA emulator: <message>" on stderr, then abort (a bug the emulator caught)
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Runs `fn` now (everything is synchronous), or appends it to the capture when `s` is capturing.
// Returns cudaSuccess or the error of an invalidated capture.
cudaError_t enqueue(cudaStream_t s, const char *what, std::function<void()> fn);

// the per-thread "last error" cudaGetLastError returns
cudaError_t set_error(cudaError_t e);

int current_device();

// the device a stream belongs to (the legacy stream: the calling thread's current device)
int stream_device(cudaStream_t s);

// [p, p + bytes) lies inside one live device allocation of `device` (-1: any device)
bool is_device_range(const void *p, size_t bytes, int device);

// executes one kernel grid (umk_emu_exec.cpp)
void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

}  // namespace umk_emu

#endif
