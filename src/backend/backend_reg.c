/*
 * backend_reg.c — the registry: which implementation a --device name selects, and what can be
 * said about a device name before opening it. The only file outside cpu/ and cuda/ that knows
 * the implementations exist. Any thread.
 */
#include "backend/backend.h"

#include <string.h>

#include "backend/cuda/cuda_backend.h"

int backend_device_parse(const char *device, int *index) {
    if (index) *index = 0;
    if (!device || strcmp(device, "cpu") == 0) return 0;
    const int i = backend_cuda_parse_device(device);
    if (i < 0) return -1;
    if (index) *index = i;
    return 1;
}

int backend_device_same(const char *a, const char *b) {
    int ia, ib;
    const int ka = backend_device_parse(a, &ia), kb = backend_device_parse(b, &ib);
    return ka >= 0 && ka == kb && ia == ib;
}

static backend_options g_options;   /* backend_options_select; zeroed = the defaults */

void backend_options_select(const backend_options *o) { g_options = *o; }

backend *backend_init_device(const char *device, int n_threads, um_err *err) {
    switch (backend_device_parse(device, NULL)) {
    case 0: return backend_cpu_init_opts(n_threads, &g_options);
    case 1: return backend_cuda_init(device, &g_options, err);
    default:
        um_err_param(err, "device", "unknown device '%s' (expected cpu, cuda or cuda:N)", device);
        return NULL;
    }
}

int backend_device_comm_available(const char *device) {
    return backend_device_parse(device, NULL) == 1 && comm_nccl_available();
}

int backend_device_comm_id(const char *device, uint8_t id[COMM_ID_BYTES], um_err *err) {
    if (!backend_device_comm_available(device))
        return um_err_set(err, UM_ERR_UNSUPPORTED, "%s: no device collectives in this build", device ? device : "cpu");
    return comm_nccl_unique_id(id, err);
}
