/*
 * backend.c — backend-independent helpers around the ops interface (backend.h).
 * Does not: implement any op (cpu/, cuda/ do). Any thread that owns the backend.
 */
#include "backend/backend.h"

#include <string.h>

#include "backend/cuda/cuda_backend.h"

void backend_free(backend *be) {
    if (be) be->ops->free(be);
}

backend *backend_init_device(const char *device, int n_threads, um_err *err) {
    if (!device || strcmp(device, "cpu") == 0) return backend_cpu_init(n_threads);
    if (backend_cuda_parse_device(device) >= 0) return backend_cuda_init(device, err);
    um_err_param(err, "device", "unknown device '%s' (expected cpu, cuda or cuda:N)", device);
    return NULL;
}
