/*
 * racecheck_repro — the smallest program that shows compute-sanitizer's racecheck failing on its own
 * (docs/gpu.md, "racecheck"): one bf16 product of 1 x 256 by 256 x 384 on cuBLAS, the shape for
 * which cuBLAS 13 picks its split-K nvjet kernel. Clean under `compute-sanitizer --tool racecheck`;
 * with a kernel filter that leaves that kernel unchecked (`--kernel-name kns=no_such_kernel`, or the
 * `--kernel-name-exclude kns=nvjet` the lease once used) the sanitizer reports "Internal Sanitizer
 * Error: The Sanitizer failed to handle a hardware exception" and the next synchronisation fails with
 * an illegal address. scripts/gpu/run-checks.sh racecheck runs it both ways.
 * Does not: check results. Main thread only.
 */
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "backend/backend_impl.h"
#include "backend/cuda/cuda_backend.h"
#include "util/dtype.h"

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "cuda:0";
    um_err err = {0};
    backend *be = backend_cuda_init(device, NULL, &err);
    if (!be) {
        fprintf(stderr, "racecheck_repro: %s\n", err.msg);
        return 1;
    }
    backend_cuda_gemm_cublas(be, 1);   /* the product on cuBLAS, not our skinny kernel */
    enum { OUT = 384, IN = 256 };
    uint16_t *w = malloc((size_t)OUT * IN * 2);
    for (int i = 0; i < OUT * IN; i++) w[i] = f32_to_bf16((float)((i % 13) - 6) * 0.01f);
    bweight_src src = {.name = "repro", .data = w, .type = DTYPE_BF16, .rows = OUT, .cols = IN};
    bweight wt;
    if (be->ops->weight_upload(be, &src, &wt, &err) != 0) {
        fprintf(stderr, "racecheck_repro: %s\n", err.msg);
        return 1;
    }
    void *x = be->ops->act_alloc(be, IN), *y = be->ops->act_alloc(be, OUT);
    backend_act_zero(be, x, IN);
    be->ops->matmul(be, x, &wt, NULL, 1, y);
    backend_synchronize(be);
    printf("racecheck_repro: one cuBLAS product 1 x %d x %d done\n", IN, OUT);
    be->ops->act_free(be, x);
    be->ops->act_free(be, y);
    be->ops->weight_free(be, &wt);
    backend_free(be);
    free(w);
    return 0;
}
