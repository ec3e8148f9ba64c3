/*
 * cuda_backend.c — the CUDA backend behind backend.h: device selection, weight upload (mmapped
 * checkpoint -> pinned staging buffers -> HBM, converted to bf16 on the device, with progress and a
 * "does not fit" um_err), bf16 activation buffers (exact-size caching allocator), cuBLAS GEMMs
 * (bf16 in/out, fp32 compute) and the kernels/ launchers for every other op; CUDA graph capture and
 * device-resident input aliases for the decode engine (cuda_backend.h).
 *
 * Does not: validate per-request input (model_forward does; bad indices here are bugs -> CHECK);
 * decide anything about decoding (decode/device_step.c). Built without CUDA, only the stubs at the end
 * are compiled. Threading: one driving thread at a time per backend (see cuda_backend.h).
 */
#include "backend/cuda/cuda_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

int backend_cuda_parse_device(const char *s) {
    if (!s || strncmp(s, "cuda", 4) != 0) return -1;
    if (s[4] == '\0') return 0;
    if (s[4] != ':' || s[5] < '0' || s[5] > '9') return -1;
    char *end = NULL;
    long v = strtol(s + 5, &end, 10);
    if (*end != '\0' || v < 0 || v > 1024) return -1;
    return (int)v;
}

#ifdef UNMASK_HAVE_CUDA

#include <math.h>
#include <unistd.h>

#include "backend/cuda/cuda_internal.h"
#include "util/timeutil.h"

#define STAGE_CHUNK_MIN (4u << 20)       /* first staging chunk: 4 MiB */
#define UPLOAD_CHUNK (32u << 20)         /* weight upload staging buffer: 32 MiB each, two of them */
#define CUBLAS_WS_BYTES (32u << 20)
/* attention key-split partials (kernels/attention.cu): a cached step of the 8B shape at batch 1 takes
 * 8 splits x 32 rows x 32 heads x 130 floats = 4.3 MB; the kernel takes fewer splits when it is short */
#define ATTN_WS_BYTES ((size_t)16 << 20)
#define GS_WS_FLOATS ((size_t)8 << 20)   /* skinny GEMM split-K partials: 32 MiB */
#define GS_COUNTS 16384                   /* its per-tile counts (a tile = 128 output columns) */
#define FP8_DEQ_ELEMS ((size_t)32 << 20)  /* bf16 rows of an FP8 weight for cuBLAS: 64 MiB */
#define FIT_RESERVE_BYTES (512ull << 20) /* kept free for cuBLAS, staging, the CUDA context growth */

const char *cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_?";
    }
}

static _Thread_local int tl_device = -1;

void cuda_use_device(const cuda_impl *ci) {
    if (tl_device != ci->device) {
        CUDA_CHECK(cudaSetDevice(ci->device));
        tl_device = ci->device;
    }
}

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }
static double mib(uint64_t b) { return (double)b / (double)(1ull << 20); }

/* ---------------------------------------------------------------- staging arenas */

static void arena_insert_chunk(cuda_arena *a, int at, size_t cap) {
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 4;
        a->chunks = xrealloc(a->chunks, (size_t)a->cap * sizeof *a->chunks);
    }
    memmove(a->chunks + at + 1, a->chunks + at, (size_t)(a->n - at) * sizeof *a->chunks);
    cuda_chunk *c = &a->chunks[at];
    memset(c, 0, sizeof *c);
    c->cap = cap;
    CUDA_CHECK(cudaMallocHost((void **)&c->host, cap));
    CUDA_CHECK(cudaMalloc((void **)&c->dev, cap));
    CUDA_CHECK(cudaEventCreateWithFlags(&c->last_use, cudaEventDisableTiming));
    a->n++;
}

static void arena_free(cuda_arena *a) {
    for (int i = 0; i < a->n; i++) {
        CUDA_CHECK(cudaFreeHost(a->chunks[i].host));
        CUDA_CHECK(cudaFree(a->chunks[i].dev));
        CUDA_CHECK(cudaEventDestroy(a->chunks[i].last_use));
    }
    free(a->chunks);
    memset(a, 0, sizeof *a);
}

/* Room for `bytes` in the arena: returns the chunk index, with used advanced past the block. */
static cuda_chunk *arena_take(cuda_arena *a, size_t bytes, size_t *off) {
    bytes = (bytes + 255) & ~(size_t)255;
    if (a->n == 0) arena_insert_chunk(a, 0, bytes > STAGE_CHUNK_MIN ? bytes : STAGE_CHUNK_MIN);
    cuda_chunk *c = &a->chunks[a->cur];
    if (c->used + bytes > c->cap) {
        int next = (a->cur + 1) % a->n;
        /* reusable: big enough, and either empty or fenced (an unfenced chunk holds arrays of the
         * op being staged right now, not yet launched) */
        if (a->ring && next != a->cur && a->chunks[next].cap >= bytes &&
            (a->chunks[next].recorded || a->chunks[next].used == 0)) {
            cuda_chunk *nc = &a->chunks[next];
            if (nc->recorded) CUDA_CHECK(cudaEventSynchronize(nc->last_use));
            nc->used = 0;
            a->cur = next;
        } else {
            size_t cap = 2 * c->cap > bytes ? 2 * c->cap : bytes;
            arena_insert_chunk(a, a->cur + 1, cap);
            a->cur++;
        }
        c = &a->chunks[a->cur];
    }
    *off = c->used;
    c->used += bytes;
    c->recorded = 0;   /* this chunk is read by an op not yet fenced */
    return c;
}

static cuda_arena *stage_arena(cuda_impl *ci) { return ci->capturing ? ci->graph_stage : &ci->stage; }

/* arena_take on the active arena; a new chunk during capture is allocated in relaxed capture mode.
 * Moving to another chunk (which may reset it) or inserting one (which renumbers) clears the memo. */
static cuda_chunk *stage_take(cuda_impl *ci, size_t bytes, size_t *off) {
    cuda_arena *a = stage_arena(ci);
    const int cur = a->cur, n = a->n;
    cuda_chunk *c;
    if (!ci->capturing) {
        c = arena_take(a, bytes, off);
    } else {
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        c = arena_take(a, bytes, off);
        CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    }
    if (a->cur != cur || a->n != n) ci->n_memo = 0;
    return c;
}

const void *cuda_stage(cuda_impl *ci, const void *host, size_t bytes) {
    if (!host || bytes == 0) return NULL;
    const char *h = host;
    for (int i = 0; i < ci->n_alias; i++) {
        const cuda_alias *al = &ci->aliases[i];
        if (h >= al->host && h + bytes <= al->host + al->bytes) return al->dev + (h - al->host);
    }
    cuda_arena *a = stage_arena(ci);
    for (int i = 0; i < ci->n_memo && !ci->memo_off; i++) {
        const cuda_stage_memo *m = &ci->memo[i];
        cuda_chunk *c = &a->chunks[m->chunk];
        if (m->bytes == bytes && memcmp(c->host + m->off, host, bytes) == 0) {
            c->recorded = 0;   /* read by the op being staged: cuda_stage_done fences the chunk again */
            ci->stage_hits++;
            return c->dev + m->off;
        }
    }
    size_t off;
    cuda_chunk *c = stage_take(ci, bytes, &off);
    memcpy(c->host + off, host, bytes);
    CUDA_CHECK(cudaMemcpyAsync(c->dev + off, c->host + off, bytes, cudaMemcpyHostToDevice, ci->stream));
    ci->stage_copies++;
    cuda_stage_memo *m = &ci->memo[ci->n_memo < STAGE_MEMO ? ci->n_memo++ : ci->memo_next];
    if (ci->n_memo == STAGE_MEMO) ci->memo_next = (ci->memo_next + 1) % STAGE_MEMO;
    *m = (cuda_stage_memo){(int)(c - a->chunks), off, bytes};
    return c->dev + off;
}

void cuda_stage_done(cuda_impl *ci) {
    if (ci->capturing) return;   /* graph arenas are never reused */
    cuda_arena *a = &ci->stage;
    for (int i = 0; i < a->n; i++) {
        cuda_chunk *c = &a->chunks[i];
        if (c->used && !c->recorded) {
            CUDA_CHECK(cudaEventRecord(c->last_use, ci->stream));
            c->recorded = 1;
        }
    }
}

/* ---------------------------------------------------------------- weights */

static void upload_progress(cuda_impl *ci, int final) {
    const uint64_t step = ci->up_total ? (ci->up_total / 100 > 0 ? ci->up_total / 100 : 1) : (2ull << 30);
    if (!final && ci->up_done - ci->up_shown < step) return;
    if (final && ci->up_done == ci->up_shown) return;
    ci->up_shown = ci->up_done;
    const double secs = time_now_s() - ci->up_t0;
    const double rate = secs > 0 ? gib(ci->up_done) / secs : 0.0;
    const char *label = ci->up_label[0] ? ci->up_label : "weights";
    const int tty = isatty(STDERR_FILENO);
    if (ci->up_total) {
        const int pct = (int)(100.0 * (double)ci->up_done / (double)ci->up_total);
        const int done = ci->up_done >= ci->up_total;
        if (tty) {
            fprintf(stderr, "\r%s: uploading %s: %.2f / %.2f GiB (%d%%), %.1f GiB/s%s", ci->name, label,
                    gib(ci->up_done), gib(ci->up_total), pct, rate, done ? "\n" : "");
        } else if (done || pct / 25 != (int)(100.0 * (double)(ci->up_done - step) / (double)ci->up_total) / 25) {
            log_info("%s: uploading %s: %.2f / %.2f GiB (%d%%), %.1f GiB/s", ci->name, label, gib(ci->up_done),
                     gib(ci->up_total), pct, rate);
        }
    } else {
        log_info("%s: uploaded %.2f GiB of %s, %.1f GiB/s", ci->name, gib(ci->up_done), label, rate);
    }
}

/* Copy a host matrix to the device through the two pinned staging buffers (the host copy of one
 * overlaps the DMA of the other): BF16 and F8_E4M3 sources byte for byte into dst, F32 / F16
 * converted to bf16 on the device (dst then holds bf16). The progress counts kept_es bytes per
 * element (what the weight keeps on the device: 1 for a matrix quantized to FP8 afterwards), or
 * the bytes written to dst when 0. */
static void upload_elems(cuda_impl *ci, const bweight_src *t, void *dst, size_t kept_es) {
    const size_t n = (size_t)(t->rows * t->cols), es = dtype_size(t->type);
    const int raw = t->type == DTYPE_BF16 || t->type == DTYPE_F8_E4M3;
    const size_t des = raw ? es : 2;   /* device bytes per element */
    if (ci->up_done == 0) ci->up_t0 = time_now_s();
    const char *src = t->data;
    const size_t per = ci->up_chunk / es;
    for (size_t off = 0; off < n; off += per) {
        const size_t cnt = n - off < per ? n - off : per;
        const int b = ci->up_next;
        ci->up_next ^= 1;
        if (ci->up_used[b]) CUDA_CHECK(cudaEventSynchronize(ci->up_ev[b]));   /* buffer b free again */
        memcpy(ci->up_host[b], src + off * es, cnt * es);                     /* reads the mapping */
        if (raw) {
            CUDA_CHECK(cudaMemcpyAsync((char *)dst + off * des, ci->up_host[b], cnt * es, cudaMemcpyHostToDevice,
                                       ci->stream));
        } else {
            CUDA_CHECK(cudaMemcpyAsync(ci->up_dev[b], ci->up_host[b], cnt * es, cudaMemcpyHostToDevice, ci->stream));
            CUDA_CHECK(umk_to_bf16(ci->up_dev[b], t->type == DTYPE_F16, cnt, (uint16_t *)dst + off, ci->stream));
        }
        CUDA_CHECK(cudaEventRecord(ci->up_ev[b], ci->stream));
        ci->up_used[b] = 1;
        ci->up_done += cnt * (kept_es ? kept_es : des);
        upload_progress(ci, 0);
    }
    if (ci->up_total && ci->up_done >= ci->up_total) upload_progress(ci, 1);
}

/* cudaMalloc with the "does not fit" message of a weight */
static int weight_alloc(backend *be, cuda_impl *ci, const char *name, size_t bytes, void **out, um_err *err) {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if ((uint64_t)bytes + FIT_RESERVE_BYTES / 4 > (uint64_t)free_b)
        return um_err_set(err, UM_ERR_RESOURCE,
                          "model does not fit on %s (%s): tensor '%s' needs %.1f MiB but only %.1f MiB of %.1f GiB "
                          "are free after %.2f GiB of weights",
                          be->name, ci->name, name, mib(bytes), mib(free_b), gib(total_b), gib(ci->up_done));
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return um_err_set(err, UM_ERR_RESOURCE, "model does not fit on %s (%s): allocating %.1f MiB for tensor '%s': %s",
                          be->name, ci->name, mib(bytes), name, cudaGetErrorString(e));
    }
    return 0;
}

/* The scratch an FP8 weight needs at > 64 rows (cuda_matmul): allocated with the first FP8 weight,
 * never while a graph is captured. */
static int fp8_scratch(backend *be, cuda_impl *ci, const char *name, um_err *err) {
    if (ci->fp8_deq) return 0;
    void *p = NULL;
    if (weight_alloc(be, ci, name, FP8_DEQ_ELEMS * 2, &p, err) != 0) return -1;
    ci->fp8_deq = p;
    return 0;
}

/* FP8 E4M3 weights: one allocation holds the bytes, then (256-byte aligned) the f32 block scales.
 * From an F8_E4M3 source with its scales as stored; from a float source (quant == F8_E4M3) the
 * matrix goes up as bf16 into a temporary buffer and is quantized per output channel there. */
static int upload_fp8(backend *be, cuda_impl *ci, const bweight_src *t, bweight *out, um_err *err) {
    const int64_t rows = t->rows, cols = t->cols;
    const int from_fp8 = t->type == DTYPE_F8_E4M3;
    const int sr = from_fp8 ? t->scale_rows : 1, sc = from_fp8 ? t->scale_cols : (int)cols;
    CHECK(sr >= 1 && sc >= 1 && (!from_fp8 || t->scale));
    const size_t n = (size_t)(rows * cols), q_bytes = (n + 255) & ~(size_t)255;
    const size_t n_scale = (size_t)((rows + sr - 1) / sr) * (size_t)((cols + sc - 1) / sc);
    void *base = NULL;
    if (fp8_scratch(be, ci, t->name, err) != 0) return -1;
    if (weight_alloc(be, ci, t->name, q_bytes + n_scale * sizeof(float), &base, err) != 0) return -1;
    float *scale = (float *)((char *)base + q_bytes);
    if (from_fp8) {
        upload_elems(ci, t, base, 0);
        CUDA_CHECK(cudaMemcpyAsync(scale, t->scale, n_scale * sizeof(float), cudaMemcpyHostToDevice, ci->stream));
        CUDA_CHECK(cudaStreamSynchronize(ci->stream));   /* t->scale may go after this call */
    } else {
        void *tmp = NULL;
        if (weight_alloc(be, ci, t->name, n * 2, &tmp, err) != 0) {
            CUDA_CHECK(cudaFree(base));
            return -1;
        }
        upload_elems(ci, t, tmp, 1);
        CUDA_CHECK(umk_fp8_quantize_rows(tmp, rows, cols, base, scale, ci->stream));
        CUDA_CHECK(cudaStreamSynchronize(ci->stream));
        CUDA_CHECK(cudaFree(tmp));
    }
    out->data = base;
    out->owned = base;
    out->type = DTYPE_F8_E4M3;
    out->rows = rows;
    out->cols = cols;
    out->scale = scale;
    out->scale_rows = sr;
    out->scale_cols = sc;
    return 0;
}

static int cuda_weight_upload(backend *be, const bweight_src *t, bweight *out, um_err *err) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(!ci->capturing);
    memset(out, 0, sizeof *out);
    CHECK((t->type == DTYPE_F32 || t->type == DTYPE_BF16 || t->type == DTYPE_F16 || t->type == DTYPE_F8_E4M3) &&
          t->rows > 0 && t->cols > 0);
    if (t->type == DTYPE_F8_E4M3 || (t->quant == DTYPE_F8_E4M3 && !t->rows_only))
        return upload_fp8(be, ci, t, out, err);
    const int64_t rows = t->rows, cols = t->cols;
    void *d = NULL;
    if (weight_alloc(be, ci, t->name, (size_t)(rows * cols) * 2, &d, err) != 0) return -1;
    if (t->n_parts > 0) {   /* a joined weight: its row blocks one after another */
        int64_t r0 = 0;
        for (int j = 0; j < t->n_parts; j++) {
            bweight_src part = *t;
            part.n_parts = 0;
            part.data = t->part_data[j];
            part.rows = t->part_rows[j];
            upload_elems(ci, &part, (uint16_t *)d + r0 * cols, 0);
            r0 += part.rows;
        }
        CHECK(r0 == rows);
    } else {
        upload_elems(ci, t, d, 0);
    }
    out->data = d;
    out->owned = d;
    out->type = DTYPE_BF16;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

/* backend_weight_keeps_source: never — every weight is copied to device memory (the checkpoint's
 * pages and host copies can go once uploaded) */
static int cuda_weight_keeps_source(backend *be, const bweight *w) {
    (void)be, (void)w;
    return 0;
}

static void cuda_weight_free(backend *be, bweight *w) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    if (w->owned) CUDA_CHECK(cudaFree(w->owned));
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------- activations */

static size_t act_bytes(size_t n) { return ((n * 2) + 255) & ~(size_t)255; }

static void block_push(cuda_free_block **arr, int *n, int *cap, void *p, size_t bytes) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        *arr = xrealloc(*arr, (size_t)*cap * sizeof **arr);
    }
    (*arr)[(*n)++] = (cuda_free_block){p, bytes};
}

/* cudaFree every cached free block (cudaFree waits for the device); returns the bytes released */
static size_t release_free_blocks(cuda_impl *ci) {
    size_t bytes = 0;
    for (int i = 0; i < ci->n_free; i++) {
        CUDA_CHECK(cudaFree(ci->free_blocks[i].p));
        bytes += ci->free_blocks[i].bytes;
    }
    if (ci->n_free > 0) ci->buf_epoch++;   /* (already bumped when they were freed; kept explicit) */
    ci->n_free = 0;
    return bytes;
}

static void *cuda_act_alloc(backend *be, size_t n) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    const size_t bytes = act_bytes(n ? n : 1);
    void *p = NULL;
    for (int i = 0; i < ci->n_free; i++) {
        if (ci->free_blocks[i].bytes == bytes) {
            p = ci->free_blocks[i].p;
            ci->free_blocks[i] = ci->free_blocks[--ci->n_free];
            break;
        }
    }
    if (!p) {
        /* a new block; allowed during capture (relaxed capture mode around the allocation) */
        enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        if (ci->capturing) CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        cudaError_t e = cudaMalloc(&p, bytes);
        if (e != cudaSuccess && ci->n_free > 0) {
            (void)cudaGetLastError();
            release_free_blocks(ci);   /* cudaFree waits for the device */
            e = cudaMalloc(&p, bytes);
        }
        if (ci->capturing) CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            size_t fb = 0, tb = 0;
            (void)cudaMemGetInfo(&fb, &tb);
            UM_FATAL("%s (%s): out of GPU memory allocating a %.1f MiB activation buffer (%.1f MiB live, %.1f MiB "
                     "free of %.1f GiB): lower the batch size or sequence length (backend_cuda_check_fit sizes "
                     "this up front)",
                     be->name, ci->name, mib(bytes), mib(ci->act_live_bytes), mib(fb), gib(tb));
        }
    }
    block_push(&ci->live_blocks, &ci->n_live, &ci->cap_live, p, bytes);
    ci->act_live_bytes += bytes;
    return p;
}

static void cuda_act_free(backend *be, void *p) {
    if (!p) return;
    cuda_impl *ci = cuda_impl_of(be);
    for (int i = 0; i < ci->n_live; i++) {
        if (ci->live_blocks[i].p == p) {
            const size_t bytes = ci->live_blocks[i].bytes;
            ci->live_blocks[i] = ci->live_blocks[--ci->n_live];
            ci->act_live_bytes -= bytes;
            /* a graph captured while p was live may still read/write it: from now on p can go to
             * another owner (exact-size reuse) or back to the driver (release_free_blocks) */
            ci->buf_epoch++;
            /* stream-ordered reuse: later work on the same stream runs after earlier readers */
            block_push(&ci->free_blocks, &ci->n_free, &ci->cap_free, p, bytes);
            return;
        }
    }
    UM_FATAL("act_free(%p): not an activation buffer of %s", p, be->name);
}

static size_t live_bytes_of(const cuda_impl *ci, const void *p) {
    for (int i = 0; i < ci->n_live; i++)
        if (ci->live_blocks[i].p == p) return ci->live_blocks[i].bytes;
    return 0;
}

static void *tmp_reserve(cuda_impl *ci, size_t bytes) {
    if (bytes > ci->tmp_bytes) {
        if (ci->tmp) {
            CUDA_CHECK(cudaFree(ci->tmp));   /* synchronous: no pending reader survives */
            ci->buf_epoch++;                 /* but a captured graph may still name it */
        }
        ci->tmp_bytes = bytes + bytes / 4;
        CUDA_CHECK(cudaMalloc(&ci->tmp, ci->tmp_bytes));
    }
    return ci->tmp;
}

static uint16_t *bounce_reserve(cuda_impl *ci, size_t bytes) {
    if (bytes > ci->bounce_bytes) {
        if (ci->bounce) CUDA_CHECK(cudaFreeHost(ci->bounce));
        ci->bounce_bytes = bytes;
        CUDA_CHECK(cudaMallocHost((void **)&ci->bounce, bytes));
    }
    return ci->bounce;
}

#define BOUNCE_CHUNK (16u << 20)

static void cuda_act_to_host(backend *be, const void *src, size_t n, float *dst) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    if (ci->capturing) UM_FATAL("act_to_host inside a CUDA graph capture (the step must stay on the device)");
    const size_t per = BOUNCE_CHUNK / 2;
    uint16_t *b = bounce_reserve(ci, BOUNCE_CHUNK);
    for (size_t off = 0; off < n; off += per) {
        const size_t cnt = n - off < per ? n - off : per;
        CUDA_CHECK(cudaMemcpyAsync(b, (const uint16_t *)src + off, cnt * 2, cudaMemcpyDeviceToHost, ci->stream));
        CUDA_CHECK(cudaStreamSynchronize(ci->stream));
        float *d = dst + off;
#pragma omp parallel for simd schedule(static) if (cnt >= (1u << 20))
        for (size_t i = 0; i < cnt; i++) d[i] = bf16_to_f32(b[i]);
    }
}

void backend_cuda_act_from_host(backend *be, void *dst, const float *src, size_t n) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(!ci->capturing);
    const size_t per = BOUNCE_CHUNK / 2;
    uint16_t *b = bounce_reserve(ci, BOUNCE_CHUNK);
    for (size_t off = 0; off < n; off += per) {
        const size_t cnt = n - off < per ? n - off : per;
        CUDA_CHECK(cudaStreamSynchronize(ci->stream));   /* the bounce buffer is free */
        for (size_t i = 0; i < cnt; i++) b[i] = f32_to_bf16(src[off + i]);
        CUDA_CHECK(cudaMemcpyAsync((uint16_t *)dst + off, b, cnt * 2, cudaMemcpyHostToDevice, ci->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
}

/* ---------------------------------------------------------------- ops */

static void cuda_embed(backend *be, const bweight *wte, const int32_t *ids, int n, void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(wte->type == DTYPE_BF16);
    if (n <= 0) return;
    const int32_t *d_ids = cuda_stage(ci, ids, (size_t)n * sizeof *ids);
    if (d_ids == NULL) return;
    CUDA_CHECK(umk_embed(wte->data, wte->cols, d_ids, n, out, ci->stream));
    cuda_stage_done(ci);
}

static void cuda_rmsnorm(backend *be, const void *x, const bweight *w, int n, int d, float eps, void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(w->rows * w->cols == d && w->type == DTYPE_BF16);
    CUDA_CHECK(umk_rmsnorm(x, w->data, n, d, eps, out, ci->stream));
}

/* The skinny kernel takes this weight at n rows: FP8 always when its shape allows; bf16 unless
 * --cuda-gemm cublas. */
static int skinny_takes(const cuda_impl *ci, const bweight *w, int n) {
    if (w->type == DTYPE_F8_E4M3) return umk_gemm_skinny_supported(n, (int)w->cols, 1, w->scale_rows, w->scale_cols);
    return w->type == DTYPE_BF16 && !ci->gemm_cublas && umk_gemm_skinny_supported(n, (int)w->cols, 0, 1, 1);
}

/* Fill the launch's workspace fields; fewer K splits when the partials would not fit. 0, or -1
 * when even one split does not (the caller takes another path). */
static int skinny_plan(cuda_impl *ci, umk_gemm_skinny_args *a) {
    a->n_sm = ci->n_sm;
    a->ws = ci->gs_ws;
    a->ws_floats = GS_WS_FLOATS;
    a->count = ci->gs_count;
    a->n_count = GS_COUNTS;
    if (umk_gemm_skinny_tiles(a) > GS_COUNTS) return -1;
    a->splits = ci->gs_splits;
    int sp = umk_gemm_skinny_splits(a);
    while (umk_gemm_skinny_ws_floats(a) > GS_WS_FLOATS) {
        if (sp <= 1) return -1;
        a->splits = --sp;
    }
    ci->gs_last_splits = umk_gemm_skinny_splits(a);
    return 0;
}

/* y = x · Wᵀ for an FP8 weight at more rows than the skinny kernel takes: FP8_DEQ_ELEMS-sized row
 * blocks of W dequantized to bf16, each a cuBLAS GEMM into its columns of y. */
static void fp8_matmul_dequant(cuda_impl *ci, const void *x, const bweight *w, int n, void *y) {
    CHECK(ci->fp8_deq);
    const float one = 1.0f, zero = 0.0f;
    const int m_out = (int)w->rows, k_in = (int)w->cols;
    /* whole multiples of 128 rows: each block's output columns then start 256-byte aligned (at
     * k = 12288, 2730-row blocks left cuBLAS a misaligned y + r0 and its slow kernels: the down
     * product at 512 rows took 274 µs against bf16's 66 on the H200) */
    int64_t per = (int64_t)(FP8_DEQ_ELEMS / (size_t)k_in);
    if (per >= 128) per -= per % 128;
    CHECK(per >= 1);
    for (int64_t r0 = 0; r0 < m_out; r0 += per) {
        const int rn = (int)(m_out - r0 < per ? m_out - r0 : per);
        CUDA_CHECK(umk_fp8_dequantize(w->data, w->scale, w->scale_rows, w->scale_cols, k_in, r0, rn, ci->fp8_deq,
                                      ci->stream));
        CUBLAS_CHECK(ci->cb->gemm_ex(ci->cublas, CUBLAS_OP_T, CUBLAS_OP_N, rn, n, k_in, &one, ci->fp8_deq, CUDA_R_16BF,
                                     k_in, x, CUDA_R_16BF, k_in, &zero, (uint16_t *)y + r0, CUDA_R_16BF, m_out,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

static void cuda_matmul(backend *be, const void *x, const bweight *w, const bweight *bias, int n, void *y) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(w->type == DTYPE_BF16 || w->type == DTYPE_F8_E4M3);
    if (n <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    const int m_out = (int)w->rows, k_in = (int)w->cols;
    umk_gemm_skinny_args a = {.x = x, .m = n, .k = k_in, .n_prod = 1, .w = {w->data}, .scale = {w->scale},
                              .scale_rows = {w->scale_rows}, .scale_cols = {w->scale_cols}, .y = {y}, .n = {m_out},
                              .epi = UMK_GEMM_STORE};
    if (skinny_takes(ci, w, n) && skinny_plan(ci, &a) == 0) {
        CUDA_CHECK(umk_gemm_skinny(&a, ci->stream));
    } else if (w->type == DTYPE_F8_E4M3) {
        fp8_matmul_dequant(ci, x, w, n, y);
    } else {
        /* row-major y[n, out] = x[n, in] · Wᵀ  ==  column-major yᵀ[out, n] = W[out, in] (stored as in x out
         * column-major, so op T) · xᵀ[in, n] */
        CUBLAS_CHECK(ci->cb->gemm_ex(ci->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m_out, n, k_in, &one, w->data, CUDA_R_16BF,
                                     k_in, x, CUDA_R_16BF, k_in, &zero, y, CUDA_R_16BF, m_out, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
    }
    if (bias) {
        CHECK(bias->type == DTYPE_BF16 && bias->rows * bias->cols == w->rows);
        CUDA_CHECK(umk_bias_add(y, bias->data, n, m_out, ci->stream));
    }
}

/* backend_linear at <= 64 rows: the op's products in one skinny launch with its epilogue (q/k/v
 * together, gate/up with the SwiGLU, o / down with the residual add). 0 when the op is not one it
 * takes (the caller runs another path); nothing has been launched then. */
static int linear_skinny(backend *be, const blinear *op) {
    cuda_impl *ci = cuda_impl_of(be);
    if (op->n <= 0 || op->n > UMK_GEMM_SKINNY_MAX_M || op->n_w < 1 || op->n_w > 3) return 0;
    if (op->epi == BLIN_ADD && op->n_w != 1) return 0;
    if (op->epi == BLIN_SWIGLU && (op->n_w != 2 || op->w[1]->rows != op->w[0]->rows)) return 0;
    umk_gemm_skinny_args a = {.x = op->norm ? op->tmp_h : op->x, .m = op->n, .k = (int)op->w[0]->cols,
                              .n_prod = op->n_w,
                              .epi = op->epi == BLIN_ADD      ? UMK_GEMM_ADD
                                     : op->epi == BLIN_SWIGLU ? UMK_GEMM_SWIGLU
                                                              : UMK_GEMM_STORE};
    for (int j = 0; j < op->n_w; j++) {
        const bweight *w = op->w[j];
        if (w->type != op->w[0]->type || w->cols != op->w[0]->cols || !skinny_takes(ci, w, op->n)) return 0;
        if (w->type == DTYPE_F8_E4M3 && (w->scale_cols >= w->cols) != (op->w[0]->scale_cols >= op->w[0]->cols))
            return 0;
        a.w[j] = w->data;
        a.scale[j] = w->scale;
        a.scale_rows[j] = w->scale_rows;
        a.scale_cols[j] = w->scale_cols;
        a.n[j] = (int)w->rows;
        a.y[j] = op->y[op->epi == BLIN_STORE ? j : 0];
    }
    if (skinny_plan(ci, &a) != 0) return 0;
    cuda_use_device(ci);
    if (op->norm) {
        CHECK(op->tmp_h);
        cuda_rmsnorm(be, op->x, op->norm, op->n, a.k, op->eps, op->tmp_h);
    }
    CUDA_CHECK(umk_gemm_skinny(&a, ci->stream));
    return 1;
}

/* backend_linear's SwiGLU with gate and up joined (BACKEND_PACK_GATE_UP: up's rows continue gate's
 * in one bf16 allocation, and tmp_y holds both products): one product of the 2 x ffn rows into tmp_y,
 * then the SwiGLU over its row halves into y[0]. 0 when the op is not that (nothing launched). */
static int linear_gate_up(backend *be, const blinear *op) {
    if (op->epi != BLIN_SWIGLU || op->n_w != 2 || !op->wide_tmp || op->n <= 0) return 0;
    const bweight *g = op->w[0], *u = op->w[1];
    if (g->type != DTYPE_BF16 || u->type != DTYPE_BF16 || g->rows != u->rows || g->cols != u->cols ||
        (const char *)u->data != (const char *)g->data + (size_t)g->rows * (size_t)g->cols * 2)
        return 0;
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    const void *h = op->x;
    if (op->norm) {
        CHECK(op->tmp_h);
        cuda_rmsnorm(be, op->x, op->norm, op->n, (int)g->cols, op->eps, op->tmp_h);
        h = op->tmp_h;
    }
    const bweight joined = {.data = g->data, .type = DTYPE_BF16, .rows = 2 * g->rows, .cols = g->cols};
    cuda_matmul(be, h, &joined, NULL, op->n, op->tmp_y);
    CUDA_CHECK(umk_swiglu_rows(op->tmp_y, op->n, (int)g->rows, 2 * g->rows, op->y[0], ci->stream));
    return 1;
}

/* backend_linear: the skinny launch where it takes the op, else gate|up joined, else the single ops. */
static void cuda_linear(backend *be, const blinear *op) {
    if (!linear_skinny(be, op) && !linear_gate_up(be, op)) backend_linear_unfused(be, op);
}
/* The cos/sin table of positions pos (umk_rope_table), reused while the positions, the rotated
 * half and theta stay the same (every layer of a forward). */
static const float *rope_table(cuda_impl *ci, int n, int half, const int32_t *pos, float theta) {
    const int hit = ci->rope_valid && ci->rope_n == n && ci->rope_half == half && ci->rope_theta == theta &&
                    memcmp(ci->rope_pos, pos, (size_t)n * sizeof *pos) == 0;
    if (hit) return ci->rope_tab;
    const size_t elems = (size_t)n * (size_t)half;   /* float2 entries */
    if (ci->capturing) {   /* the graph keeps reading the table: it lives in the graph's arena */
        size_t off;
        cuda_chunk *c = stage_take(ci, elems * 2 * sizeof(float), &off);
        ci->rope_tab = (float *)(c->dev + off);
    } else {
        if (elems > ci->rope_own_cap) {
            if (ci->rope_own) CUDA_CHECK(cudaFree(ci->rope_own));   /* synchronous */
            ci->rope_own_cap = elems + elems / 4;
            CUDA_CHECK(cudaMalloc((void **)&ci->rope_own, ci->rope_own_cap * 2 * sizeof(float)));
        }
        ci->rope_tab = ci->rope_own;
    }
    const int32_t *d_pos = cuda_stage(ci, pos, (size_t)n * sizeof *pos);
    CUDA_CHECK(umk_rope_table(d_pos, n, half, theta, ci->rope_tab, ci->stream));
    cuda_stage_done(ci);
    if (n > ci->rope_pos_cap) {
        ci->rope_pos_cap = n;
        ci->rope_pos = xrealloc(ci->rope_pos, (size_t)n * sizeof *ci->rope_pos);
    }
    memcpy(ci->rope_pos, pos, (size_t)n * sizeof *pos);
    ci->rope_n = n;
    ci->rope_half = half;
    ci->rope_theta = theta;
    ci->rope_valid = 1;
    return ci->rope_tab;
}

static void cuda_rope(backend *be, void *x, int n, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                      float theta) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_dim);
    if (n <= 0) return;
    const float *tab = rope_table(ci, n, rot_dim / 2, pos, theta);
    CUDA_CHECK(umk_rope_apply(x, n, n_heads, head_dim, rot_dim, tab, ci->stream));
}

static void cuda_store_rows(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start,
                            const int32_t *pos, void *const *dst);

/* backend_rope_kv: one k_rope_kv launch (the table as cuda_rope's); --cuda-fuse off: the two ropes
 * and the two stores. */
static void cuda_rope_kv(backend *be, const brope_kv *op) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(op->rot_dim > 0 && op->rot_dim % 2 == 0 && op->rot_dim <= op->head_dim);
    CHECK(!op->k_dst == !op->v_dst);
    const int kvd = op->n_kv_heads * op->head_dim;
    CHECK(!op->qkv || op->ld_qkv >= op->n_heads * op->head_dim + 2 * kvd);
    if (ci->unfused) {
        if (op->qkv && op->n > 0)   /* the single kernels start from q, k, v rows: unpack them first */
            CUDA_CHECK(umk_rope_kv(op->q, op->k, op->v, op->qkv, op->ld_qkv, op->n, op->n_heads, op->n_kv_heads,
                                   op->head_dim, op->rot_dim, NULL, 0, NULL, NULL, NULL, NULL, ci->stream));
        cuda_rope(be, op->q, op->n, op->n_heads, op->head_dim, op->rot_dim, op->pos, op->theta);
        cuda_rope(be, op->k, op->n, op->n_kv_heads, op->head_dim, op->rot_dim, op->pos, op->theta);
        if (op->k_dst) {
            cuda_store_rows(be, op->k, kvd, op->n_seqs, op->seq_start, op->pos, op->k_dst);
            cuda_store_rows(be, op->v, kvd, op->n_seqs, op->seq_start, op->pos, op->v_dst);
        }
        return;
    }
    if (op->n <= 0) return;
    const float *tab = rope_table(ci, op->n, op->rot_dim / 2, op->pos, op->theta);
    const int32_t *d_start = NULL, *d_pos = NULL;
    uint16_t *const *d_k = NULL, *const *d_v = NULL;
    if (op->k_dst) {
        CHECK(op->n_seqs > 0 && op->seq_start[0] == 0 && op->seq_start[op->n_seqs] == op->n);
        for (int s = 0; s < op->n_seqs; s++) CHECK(op->seq_start[s + 1] >= op->seq_start[s]);
        d_start = cuda_stage(ci, op->seq_start, (size_t)(op->n_seqs + 1) * sizeof *op->seq_start);
        d_pos = cuda_stage(ci, op->pos, (size_t)op->n * sizeof *op->pos);
        d_k = cuda_stage(ci, op->k_dst, (size_t)op->n_seqs * sizeof *op->k_dst);
        d_v = cuda_stage(ci, op->v_dst, (size_t)op->n_seqs * sizeof *op->v_dst);
    }
    CUDA_CHECK(umk_rope_kv(op->q, op->k, op->v, op->qkv, op->ld_qkv, op->n, op->n_heads, op->n_kv_heads, op->head_dim,
                           op->rot_dim, tab, op->n_seqs, d_start, d_pos, d_k, d_v, ci->stream));
    if (op->k_dst) cuda_stage_done(ci);
}

/* backend_packs: one q|k|v product and one gate|up product (cuBLAS at 32 rows streamed 12288 x 4096
 * at ~3.3 TB/s on the H200 where 4096 x 4096 managed ~2.6 — the 8B cached b1 step's q/k/v 39 µs vs
 * gate's 30 for the same bytes — and the LM head, 126464 rows, at the copy bandwidth); what
 * UNMASK_CUDA_PACK names: all (the default), qkv, gate_up or none */
static unsigned cuda_packs(backend *be) { return cuda_impl_of(be)->pack; }

static unsigned pack_from_env(void) {
    const char *env = getenv("UNMASK_CUDA_PACK");
    if (!env || !*env || strcmp(env, "all") == 0) return BACKEND_PACK_QKV | BACKEND_PACK_GATE_UP;
    if (strcmp(env, "qkv") == 0) return BACKEND_PACK_QKV;
    if (strcmp(env, "gate_up") == 0) return BACKEND_PACK_GATE_UP;
    if (strcmp(env, "none") == 0) return 0;
    UM_FATAL("UNMASK_CUDA_PACK=%s: expected all (the default), qkv, gate_up or none", env);
}

static void cuda_attention(backend *be, const attn_params *p, const void *q, const void *k, const void *v,
                           void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(p->n_heads > 0 && p->n_kv_heads > 0 && p->head_dim > 0 && p->n_heads % p->n_kv_heads == 0);
    CHECK(p->n_seqs > 0 && p->q_start && p->k_start);
    CHECK(!p->block_causal || (p->q_pos && p->k_pos));
    CHECK(p->head_dim <= 256);
    int max_q = 0, max_k = 0;
    for (int s = 0; s < p->n_seqs; s++) {
        CHECK(p->q_start[s + 1] >= p->q_start[s] && p->k_start[s + 1] >= p->k_start[s]);
        if (p->q_start[s + 1] - p->q_start[s] > max_q) max_q = p->q_start[s + 1] - p->q_start[s];
        if (p->k_start[s + 1] - p->k_start[s] > max_k) max_k = p->k_start[s + 1] - p->k_start[s];
    }
    const int n_q = p->q_start[p->n_seqs], n_k = p->k_start[p->n_seqs];
    if (n_q <= 0) return;
    umk_attn a;
    memset(&a, 0, sizeof a);
    a.n_seqs = p->n_seqs;
    a.q_start = cuda_stage(ci, p->q_start, (size_t)(p->n_seqs + 1) * sizeof(int32_t));
    a.k_start = cuda_stage(ci, p->k_start, (size_t)(p->n_seqs + 1) * sizeof(int32_t));
    if (p->block_causal > 0) {
        a.q_pos = cuda_stage(ci, p->q_pos, (size_t)n_q * sizeof(int32_t));
        a.k_pos = cuda_stage(ci, p->k_pos, (size_t)n_k * sizeof(int32_t));
    }
    if (p->key_valid && n_k > 0) a.key_valid = cuda_stage(ci, p->key_valid, (size_t)n_k);
    if (p->k_seq) {   /* per-sequence key/value buffers (KV caches): device pointers staged as data */
        CHECK(p->v_seq);
        a.k_seq = cuda_stage(ci, p->k_seq, (size_t)p->n_seqs * sizeof(void *));
        a.v_seq = cuda_stage(ci, p->v_seq, (size_t)p->n_seqs * sizeof(void *));
    }
    a.block_causal = p->block_causal;
    a.n_heads = p->n_heads;
    a.n_kv_heads = p->n_kv_heads;
    a.head_dim = p->head_dim;
    a.scale = p->scale;
    a.n_q = n_q;
    a.max_q_len = max_q;
    a.max_k_len = max_k;
    const umk_attn_split split = {ci->attn_ws, ATTN_WS_BYTES, ci->n_sm, ci->attn_splits};
    CUDA_CHECK(umk_attention(&a, q, k, v, out, ci->force_generic_attn, &split, ci->stream));
    cuda_stage_done(ci);
}

static void cuda_swiglu(backend *be, const void *gate, const void *up, size_t n, void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(umk_swiglu(gate, up, n, out, ci->stream));
}

static void cuda_add(backend *be, void *x, const void *y, size_t n) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(umk_add(x, y, n, ci->stream));
}

/* backend_add_rmsnorm: one kernel; --cuda-fuse off: the add, then the norm. */
static void cuda_add_rmsnorm(backend *be, void *x, const void *y, const bweight *w, int n, int d, float eps,
                             void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(w->rows * w->cols == d && w->type == DTYPE_BF16 && out != x);
    if (ci->unfused) {
        cuda_add(be, x, y, (size_t)n * (size_t)d);
        cuda_rmsnorm(be, x, w, n, d, eps, out);
        return;
    }
    CUDA_CHECK(umk_add_rmsnorm(x, y, w->data, n, d, eps, out, ci->stream));
}

static void cuda_act_zero(backend *be, void *p, size_t n) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemsetAsync(p, 0, n * dtype_size(backend_act_dtype(be)), ci->stream));
}

static void cuda_get_rows(backend *be, const void *x, int d, const int32_t *rows, int n, void *out) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    if (n <= 0) return;
    const int32_t *d_rows = cuda_stage(ci, rows, (size_t)n * sizeof *rows);
    const size_t out_bytes = (size_t)n * (size_t)d * 2;
    /* the CPU backend allows out == x (in-place compaction); on the device that would race, so an
     * overlapping gather goes through scratch */
    const char *xs = x, *os = out;
    size_t x_bytes = live_bytes_of(ci, x);
    const int overlap = xs == os || (x_bytes && os >= xs && os < xs + x_bytes) ||
                        (xs >= os && xs < os + out_bytes);
    if (overlap) {
        void *t = tmp_reserve(ci, out_bytes);
        CUDA_CHECK(umk_get_rows(x, d, d_rows, n, t, ci->stream));
        CUDA_CHECK(cudaMemcpyAsync(out, t, out_bytes, cudaMemcpyDeviceToDevice, ci->stream));
    } else {
        CUDA_CHECK(umk_get_rows(x, d, d_rows, n, out, ci->stream));
    }
    cuda_stage_done(ci);
}

static void cuda_moe_combine(backend *be, void *x, const void *y, int d, int n, int k, const int32_t *slot,
                             const float *w) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    const size_t nk = (size_t)n * (size_t)k;
    const int32_t *d_slot = cuda_stage(ci, slot, nk * sizeof *slot);
    const float *d_w = cuda_stage(ci, w, nk * sizeof *w);
    CUDA_CHECK(umk_moe_combine(x, y, d, n, k, d_slot, d_w, ci->stream));
    cuda_stage_done(ci);
}

/* ---------------------------------------------------------------- lifetime */

static void cuda_store_rows(backend *be, const void *x, int d, int n_seqs, const int32_t *seq_start,
                            const int32_t *pos, void *const *dst) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    int max_rows = 0, any = 0;
    for (int s = 0; s < n_seqs; s++) {
        CHECK(seq_start[s + 1] >= seq_start[s]);
        if (!dst[s]) continue;
        any = 1;
        if (seq_start[s + 1] - seq_start[s] > max_rows) max_rows = seq_start[s + 1] - seq_start[s];
    }
    if (!any || max_rows == 0) return;
    const int n = seq_start[n_seqs];
    const int32_t *d_start = cuda_stage(ci, seq_start, (size_t)(n_seqs + 1) * sizeof *seq_start);
    const int32_t *d_pos = cuda_stage(ci, pos, (size_t)n * sizeof *pos);
    uint16_t *const *d_dst = cuda_stage(ci, dst, (size_t)n_seqs * sizeof *dst);
    CUDA_CHECK(umk_store_rows(x, d, n_seqs, d_start, d_pos, d_dst, max_rows, ci->stream));
    cuda_stage_done(ci);
}

static void cuda_free_backend(backend *be) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
    release_free_blocks(ci);
    for (int i = 0; i < ci->n_live; i++) CUDA_CHECK(cudaFree(ci->live_blocks[i].p));
    free(ci->live_blocks);
    free(ci->free_blocks);
    arena_free(&ci->stage);
    for (int b = 0; b < 2; b++) {
        CUDA_CHECK(cudaFreeHost(ci->up_host[b]));
        CUDA_CHECK(cudaFree(ci->up_dev[b]));
        CUDA_CHECK(cudaEventDestroy(ci->up_ev[b]));
    }
    if (ci->rope_own) CUDA_CHECK(cudaFree(ci->rope_own));
    free(ci->rope_pos);
    if (ci->tmp) CUDA_CHECK(cudaFree(ci->tmp));
    if (ci->bounce) CUDA_CHECK(cudaFreeHost(ci->bounce));
    free(ci->aliases);
    CUBLAS_CHECK(ci->cb->destroy(ci->cublas));
    CUDA_CHECK(cudaFree(ci->cublas_ws));
    CUDA_CHECK(cudaFree(ci->attn_ws));
    CUDA_CHECK(cudaFree(ci->gs_ws));
    CUDA_CHECK(cudaFree(ci->gs_count));
    if (ci->fp8_deq) CUDA_CHECK(cudaFree(ci->fp8_deq));
    CUDA_CHECK(cudaStreamDestroy(ci->stream));
    free((char *)be->name);
    free(ci);
    free(be);
}

/* ---------------------------------------------------------------- optional ops (backend_impl.h) */

static void cuda_graph_launch_on(backend *be, backend_graph *g) {
    (void)be;   /* g knows its backend */
    cuda_graph_launch(g);
}

static int cuda_graph_stale_on(backend *be, const backend_graph *g) {
    (void)be;   /* g knows its backend */
    return cuda_graph_stale(g);
}

static void cuda_graph_free_on(backend *be, backend_graph *g) {
    (void)be;   /* g knows its backend */
    cuda_graph_free(g);
}

static void cuda_buf_set_async(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream));
}

static void cuda_buf_get_async(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream));
}

static void *cuda_host_alloc(backend *be, size_t bytes) {
    cuda_use_device(cuda_impl_of(be));
    void *p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 16));
    return p;
}

static void cuda_host_free(backend *be, void *p) {
    cuda_use_device(cuda_impl_of(be));
    CUDA_CHECK(cudaFreeHost(p));
}

struct backend_event {
    cudaEvent_t ev;   /* timing enabled */
};

static backend_event *cuda_event_new(backend *be) {
    cuda_use_device(cuda_impl_of(be));
    backend_event *e = xcalloc(1, sizeof *e);
    CUDA_CHECK(cudaEventCreateWithFlags(&e->ev, cudaEventDefault));
    return e;
}

static void cuda_event_free(backend *be, backend_event *e) {
    cuda_use_device(cuda_impl_of(be));
    CUDA_CHECK(cudaEventDestroy(e->ev));
    free(e);
}

static void cuda_event_record(backend *be, backend_event *e) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaEventRecord(e->ev, ci->stream));
}

static int cuda_event_query(backend *be, backend_event *e) {
    cuda_use_device(cuda_impl_of(be));
    cudaError_t r = cudaEventQuery(e->ev);
    if (r == cudaErrorNotReady) return 0;
    CUDA_CHECK(r);
    return 1;
}

static void cuda_event_wait(backend *be, backend_event *e) {
    cuda_use_device(cuda_impl_of(be));
    CUDA_CHECK(cudaEventSynchronize(e->ev));
}

static double cuda_event_elapsed_ms(backend *be, backend_event *a, backend_event *b) {
    cuda_use_device(cuda_impl_of(be));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a->ev, b->ev));
    return ms;
}

static void cuda_decode_begin(backend *be, const bdec_launch *l) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(umk_decode_begin(l->state, l->n_seqs, l->block_len, l->ids, l->tokens, l->blk_steps, l->jobs,
                                l->out_rows, ci->stream));
}

static void cuda_decode_sample(backend *be, const bdec_launch *l, const void *logits) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(umk_sample(logits, l->ids, l->jobs, l->n_seqs * l->block_len, l->cfg, l->x0, l->conf, ci->stream));
}

static void cuda_decode_commit(backend *be, const bdec_launch *l) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(umk_decode_commit(l->state, l->n_seqs, l->block_len, l->ids, l->tokens, l->blk_steps, l->x0, l->conf,
                                 l->events, l->jobs, l->out_rows, ci->stream));
}

#ifdef UNMASK_HAVE_NCCL
static comm *cuda_comm_join(backend *be, const uint8_t id[COMM_ID_BYTES], int rank, int world,
                            int (*cancelled)(void *user), void *user, int timeout_ms, um_err *err) {
    cuda_impl *ci = cuda_impl_of(be);
    return comm_nccl_init(id, rank, world, ci->device, ci->stream, cancelled, user, timeout_ms, err);
}
#endif

/* Host loops (the host decode loop's sampling rows) on OpenMP threads: this backend has no host
 * pool of its own, and its forward runs on the device, so they compete with nothing here. */
static void cuda_host_parallel_for(backend *be, int64_t n, int64_t grain, backend_range_fn fn, void *arg) {
    (void)be;
    const int64_t chunks = (n + grain - 1) / grain;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; c++) fn(arg, c * grain, c * grain + grain < n ? c * grain + grain : n);
}

static const backend_ops k_cuda_ops = {
    .name = "cuda",
    .weight_upload = cuda_weight_upload,
    .fp8_weights = 1,
    .weight_free = cuda_weight_free,
    .weight_keeps_source = cuda_weight_keeps_source,
    .act_alloc = cuda_act_alloc,
    .act_free = cuda_act_free,
    .act_to_host = cuda_act_to_host,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .linear = cuda_linear,
    .rope = cuda_rope,
    .attention = cuda_attention,
    .swiglu = cuda_swiglu,
    .add = cuda_add,
    .get_rows = cuda_get_rows,
    .store_rows = cuda_store_rows,
    .moe_combine = cuda_moe_combine,
    .rope_kv = cuda_rope_kv,
    .packs = cuda_packs,
    .add_rmsnorm = cuda_add_rmsnorm,
    .act_zero = cuda_act_zero,
    .host_parallel_for = cuda_host_parallel_for,
    .free = cuda_free_backend,
    .mem_info = backend_cuda_mem_info,
    .check_fit = backend_cuda_check_fit,
    .set_upload_total = backend_cuda_set_upload_total,
    .trim = backend_cuda_trim,
    .mem_bandwidth = backend_cuda_copy_bandwidth,
    .synchronize = backend_cuda_sync,
    .graph_begin = backend_cuda_capture_begin,
    .graph_end = backend_cuda_capture_end,
    .graph_launch = cuda_graph_launch_on,
    .graph_stale = cuda_graph_stale_on,
    .graph_free = cuda_graph_free_on,
    .buf_alloc = backend_cuda_malloc,
    .buf_free = backend_cuda_free_dev,
    .buf_set_async = cuda_buf_set_async,
    .buf_get_async = cuda_buf_get_async,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .event_new = cuda_event_new,
    .event_free = cuda_event_free,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_wait = cuda_event_wait,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .moe_prepare = cuda_moe_prepare,
    .moe_release = cuda_moe_release,
    .moe_workspace = cuda_moe_workspace,
    .moe_forward = cuda_moe_forward,
    .alias_add = backend_cuda_alias_add,
    .alias_clear = backend_cuda_alias_clear,
    .stage_stats = backend_cuda_stage_stats,
    .decode_begin = cuda_decode_begin,
    .decode_sample = cuda_decode_sample,
    .decode_commit = cuda_decode_commit,
#ifdef UNMASK_HAVE_NCCL
    .comm_join = cuda_comm_join,
#endif
};

int backend_cuda_compiled(void) { return 1; }

int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* cuBLAS's reductions: fp32 only (allow 0: unmask's setting, every split-K partial summed in fp32),
 * or bf16 allowed (PyTorch's default for bf16; measured by gpu_gemm_bench only). */
static void cublas_set_reductions(cuda_impl *ci, int allow) {
    const cublasMath_t mode =
        allow ? CUBLAS_DEFAULT_MATH : CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    CUBLAS_CHECK(ci->cb->set_math_mode(ci->cublas, mode));
}

backend *backend_cuda_init(const char *device, const backend_options *o, um_err *err) {
    const int idx = backend_cuda_parse_device(device);
    if (idx < 0) {
        um_err_param(err, "device", "'%s' is not a CUDA device (expected cuda or cuda:N)", device ? device : "");
        return NULL;
    }
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        um_err_set(err, UM_ERR_RESOURCE, "no CUDA device: %s",
                   e != cudaSuccess ? cudaGetErrorString(e) : "the driver reports 0 devices");
        return NULL;
    }
    if (idx >= count) {
        um_err_param(err, "device", "%s: only %d CUDA device%s (cuda:0..cuda:%d)", device, count, count == 1 ? "" : "s",
                     count - 1);
        return NULL;
    }
    struct cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        um_err_set(err, UM_ERR_RESOURCE, "%s: cannot query the device: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    if (prop.major < 9) {
        um_err_set(err, UM_ERR_UNSUPPORTED, "%s (%s) has compute capability %d.%d; unmask's kernels are built for "
                   "sm_90 (Hopper, 9.0) and newer", device, prop.name, prop.major, prop.minor);
        return NULL;
    }
    e = cudaSetDevice(idx);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        um_err_set(err, UM_ERR_RESOURCE, "%s: cannot open the device: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    tl_device = idx;

    const cublas_fns *cb = cuda_dl_cublas(err);
    if (!cb) {
        um_err_prefix(err, "%s", device);
        return NULL;
    }
    /* the backend's own buffers (cuBLAS workspace, upload staging, first index chunk): a device that
     * another process filled is a um_err here, not a CUDA_CHECK abort below */
    size_t free0 = 0, total0 = 0;
    e = cudaMemGetInfo(&free0, &total0);
    const uint64_t own = (uint64_t)CUBLAS_WS_BYTES + 2ull * UPLOAD_CHUNK + STAGE_CHUNK_MIN + ATTN_WS_BYTES +
                         GS_WS_FLOATS * sizeof(float);
    if (e != cudaSuccess || (uint64_t)free0 < own + FIT_RESERVE_BYTES / 4) {
        (void)cudaGetLastError();
        um_err_set(err, UM_ERR_RESOURCE,
                   "%s (%s): not enough free device memory for the backend's buffers: %.1f MiB free of %.2f GiB, "
                   "%.1f MiB needed", device, prop.name, mib(free0), gib(total0), mib(own + FIT_RESERVE_BYTES / 4));
        return NULL;
    }
    cuda_impl *ci = xcalloc(1, sizeof *ci);
    ci->cb = cb;
    ci->device = idx;
    snprintf(ci->name, sizeof ci->name, "%s", prop.name);
    ci->cc_major = prop.major;
    ci->cc_minor = prop.minor;
    ci->n_sm = prop.multiProcessorCount;
    ci->l2_bytes = (size_t)prop.l2CacheSize;
    ci->unfused = o && o->cuda_unfused;   /* A/B switch (docs/gpu.md) */
    ci->gemm_cublas = !(o && o->cuda_skinny);   /* A/B switch (docs/gpu.md) */
    ci->pack = pack_from_env();   /* A/B switch (docs/gpu.md) */
    CUDA_CHECK(cudaStreamCreateWithFlags(&ci->stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cb->create(&ci->cublas));
    CUBLAS_CHECK(cb->set_stream(ci->cublas, ci->stream));
    ci->cublas_ws_bytes = CUBLAS_WS_BYTES;
    CUDA_CHECK(cudaMalloc(&ci->cublas_ws, ci->cublas_ws_bytes));
    CUDA_CHECK(cudaMalloc((void **)&ci->attn_ws, ATTN_WS_BYTES));
    CUDA_CHECK(cudaMalloc((void **)&ci->gs_ws, GS_WS_FLOATS * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&ci->gs_count, GS_COUNTS * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(ci->gs_count, 0, GS_COUNTS * sizeof(unsigned)));
    CUDA_CHECK(umk_gemm_skinny_prepare());
    CUBLAS_CHECK(cb->set_workspace(ci->cublas, ci->cublas_ws, ci->cublas_ws_bytes));
    cublas_set_reductions(ci, 0);
    ci->stage.ring = 1;
    ci->up_chunk = UPLOAD_CHUNK;
    for (int b = 0; b < 2; b++) {
        CUDA_CHECK(cudaMallocHost(&ci->up_host[b], ci->up_chunk));
        CUDA_CHECK(cudaMalloc(&ci->up_dev[b], ci->up_chunk));
        CUDA_CHECK(cudaEventCreateWithFlags(&ci->up_ev[b], cudaEventDisableTiming));
    }
    backend *be = xcalloc(1, sizeof *be);
    char name[32];
    snprintf(name, sizeof name, "cuda:%d", idx);
    be->ops = &k_cuda_ops;
    be->name = xstrdup(name);
    be->description = ci->name;
    be->act_dtype = DTYPE_BF16;
    be->n_threads = 1;
    be->impl = ci;
    size_t fb = 0, tb = 0;
    CUDA_CHECK(cudaMemGetInfo(&fb, &tb));
    log_info("%s: %s, compute capability %d.%d, %d SMs, %.1f GiB free of %.1f GiB", be->name, ci->name, prop.major,
             prop.minor, ci->n_sm, gib(fb), gib(tb));
    return be;
}

int backend_is_cuda(const backend *be) { return be && be->ops == &k_cuda_ops; }

const char *backend_cuda_device_name(const backend *be) { return ((const cuda_impl *)be->impl)->name; }
size_t      backend_cuda_l2_bytes(const backend *be) { return ((const cuda_impl *)be->impl)->l2_bytes; }

void backend_cuda_mem_info(backend *be, size_t *free_bytes, size_t *total_bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    size_t fb = 0, tb = 0;
    CUDA_CHECK(cudaMemGetInfo(&fb, &tb));
    if (free_bytes) *free_bytes = fb;
    if (total_bytes) *total_bytes = tb;
}

int backend_cuda_check_fit(backend *be, uint64_t weight_bytes, uint64_t act_bytes_, um_err *err) {
    size_t fb = 0, tb = 0;
    backend_cuda_mem_info(be, &fb, &tb);
    const uint64_t need = weight_bytes + act_bytes_ + FIT_RESERVE_BYTES;
    if (need > (uint64_t)fb)
        return um_err_set(err, UM_ERR_RESOURCE,
                          "model does not fit on %s (%s): needs %.2f GiB (weights %.2f GiB bf16 + activations %.2f "
                          "GiB + %.2f GiB reserve) but %.2f GiB of %.2f GiB are free",
                          be->name, cuda_impl_of(be)->name, gib(need), gib(weight_bytes), gib(act_bytes_),
                          gib(FIT_RESERVE_BYTES), gib(fb), gib(tb));
    return 0;
}

void backend_cuda_set_upload_total(backend *be, uint64_t bytes, const char *label) {
    cuda_impl *ci = cuda_impl_of(be);
    ci->up_total = bytes;
    ci->up_done = 0;
    ci->up_shown = 0;
    snprintf(ci->up_label, sizeof ci->up_label, "%s", label ? label : "");
}

void backend_cuda_sync(backend *be) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
}

void *backend_cuda_stream(backend *be) { return cuda_impl_of(be)->stream; }

void backend_cuda_alias_add(backend *be, const void *host, const void *dev, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    if (ci->n_alias == ci->cap_alias) {
        ci->cap_alias = ci->cap_alias ? 2 * ci->cap_alias : 4;
        ci->aliases = xrealloc(ci->aliases, (size_t)ci->cap_alias * sizeof *ci->aliases);
    }
    ci->aliases[ci->n_alias++] = (cuda_alias){host, dev, bytes};
}

void backend_cuda_alias_clear(backend *be) { cuda_impl_of(be)->n_alias = 0; }

void backend_cuda_force_generic_attention(backend *be, int on) { cuda_impl_of(be)->force_generic_attn = on; }
void backend_cuda_attention_splits(backend *be, int n) { cuda_impl_of(be)->attn_splits = n; }

void backend_cuda_stage_stats(backend *be, uint64_t *copies, uint64_t *reused) {
    const cuda_impl *ci = cuda_impl_of(be);
    *copies = ci->stage_copies;
    *reused = ci->stage_hits;
}

void backend_cuda_gemm_cublas(backend *be, int on) { cuda_impl_of(be)->gemm_cublas = on; }
void backend_cuda_cublas_reduced_precision(backend *be, int allow) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    cublas_set_reductions(ci, allow);
}
void backend_cuda_gemm_splits(backend *be, int n) { cuda_impl_of(be)->gs_splits = n > 0 ? n : 0; }
int  backend_cuda_gemm_last_splits(backend *be) { return cuda_impl_of(be)->gs_last_splits; }
void backend_cuda_fuse(backend *be, int on) { cuda_impl_of(be)->unfused = !on; }
void backend_cuda_pack(backend *be, unsigned mask) { cuda_impl_of(be)->pack = mask; }

void backend_cuda_stage_reuse(backend *be, int on) {
    cuda_impl *ci = cuda_impl_of(be);
    ci->memo_off = !on;
    ci->n_memo = 0;
}

/* ---------------------------------------------------------------- graphs */

struct backend_graph {
    cuda_impl      *ci;
    uint64_t        epoch;   /* ci->buf_epoch when the capture began (see cuda_graph_stale) */
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    cuda_arena      arena;   /* index arrays and RoPE tables the graph reads */
};

void backend_cuda_capture_begin(backend *be) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(!ci->capturing);
    ci->graph_stage = xcalloc(1, sizeof *ci->graph_stage);
    ci->graph_stage->ring = 0;
    /* the arena's first chunk is allocated before capture starts */
    size_t off;
    (void)arena_take(ci->graph_stage, STAGE_CHUNK_MIN, &off);
    ci->graph_stage->chunks[0].used = 0;
    ci->rope_valid = 0;
    ci->n_memo = 0;   /* the memo follows the active arena */
    ci->capturing = 1;
    ci->capture_epoch = ci->buf_epoch;
    CUDA_CHECK(cudaStreamBeginCapture(ci->stream, cudaStreamCaptureModeThreadLocal));
}

cuda_graph *backend_cuda_capture_end(backend *be) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(ci->capturing);
    cuda_graph *g = xcalloc(1, sizeof *g);
    g->ci = ci;
    g->epoch = ci->capture_epoch;   /* a buffer freed during the capture makes it stale at once */
    CUDA_CHECK(cudaStreamEndCapture(ci->stream, &g->graph));
    CUDA_CHECK(cudaGraphInstantiate(&g->exec, g->graph, 0));
    ci->capturing = 0;
    ci->n_memo = 0;
    g->arena = *ci->graph_stage;
    free(ci->graph_stage);
    ci->graph_stage = NULL;
    ci->rope_valid = 0;   /* the cached table lives in the graph's arena */
    return g;
}

int cuda_graph_stale(const cuda_graph *g) { return g->epoch != g->ci->buf_epoch; }

void cuda_graph_launch(cuda_graph *g) {
    cuda_use_device(g->ci);
    CHECK(!cuda_graph_stale(g));   /* it would read or write memory that is no longer its buffers' */
    CUDA_CHECK(cudaGraphLaunch(g->exec, g->ci->stream));
}

void cuda_graph_free(cuda_graph *g) {
    if (!g) return;
    cuda_use_device(g->ci);
    CUDA_CHECK(cudaStreamSynchronize(g->ci->stream));
    CUDA_CHECK(cudaGraphExecDestroy(g->exec));
    CUDA_CHECK(cudaGraphDestroy(g->graph));
    arena_free(&g->arena);
    free(g);
}

/* ---------------------------------------------------------------- tools */

size_t backend_cuda_trim(backend *be) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CHECK(!ci->capturing);
    return release_free_blocks(ci);
}

double backend_cuda_copy_bandwidth(backend *be, size_t bytes, int reps) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    if (reps < 1) reps = 1;
    void *a = NULL, *b = NULL;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemsetAsync(a, 0x3c, bytes, ci->stream));   /* not zeros: real data patterns */
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, ci->stream));   /* warm-up */
    float *ms = xmalloc((size_t)reps * sizeof *ms);
    for (int r = 0; r < reps; r++) {
        CUDA_CHECK(cudaEventRecord(e0, ci->stream));
        CUDA_CHECK(cudaMemcpyAsync(r % 2 ? a : b, r % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, ci->stream));
        CUDA_CHECK(cudaEventRecord(e1, ci->stream));
        CUDA_CHECK(cudaEventSynchronize(e1));
        CUDA_CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    for (int i = 1; i < reps; i++)   /* insertion sort for the median */
        for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
            float t = ms[j];
            ms[j] = ms[j - 1];
            ms[j - 1] = t;
        }
    const double med = ms[reps / 2];
    free(ms);
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaFree(a));
    CUDA_CHECK(cudaFree(b));
    return med > 0 ? 2.0 * (double)bytes / (med * 1e-3) : 0.0;
}

void *backend_cuda_malloc(backend *be, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    void *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

void backend_cuda_free_dev(backend *be, void *p) {
    cuda_use_device(cuda_impl_of(be));
    if (p) CUDA_CHECK(cudaFree(p));
}

void backend_cuda_memcpy_h2d(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ci->stream));
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
}

void backend_cuda_memcpy_d2h(backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *ci = cuda_impl_of(be);
    cuda_use_device(ci);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ci->stream));
    CUDA_CHECK(cudaStreamSynchronize(ci->stream));
}

#else /* !UNMASK_HAVE_CUDA: stubs so callers need no #ifdefs */

int backend_cuda_compiled(void) { return 0; }
int backend_cuda_device_count(void) { return 0; }

backend *backend_cuda_init(const char *device, const backend_options *o, um_err *err) {
    (void)o;
    um_err_set(err, UM_ERR_UNSUPPORTED, "%s: this unmask was built without CUDA (no nvcc at build time)",
               device ? device : "cuda");
    return NULL;
}

int backend_is_cuda(const backend *be) {
    (void)be;
    return 0;
}

#define CUDA_UNAVAILABLE() UM_FATAL("CUDA backend function called in a build without CUDA")

const char *backend_cuda_device_name(const backend *be) { (void)be; CUDA_UNAVAILABLE(); }
size_t backend_cuda_l2_bytes(const backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void backend_cuda_mem_info(backend *be, size_t *f, size_t *t) { (void)be, (void)f, (void)t; CUDA_UNAVAILABLE(); }
int backend_cuda_check_fit(backend *be, uint64_t w, uint64_t a, um_err *err) { (void)be, (void)w, (void)a, (void)err; CUDA_UNAVAILABLE(); }
void backend_cuda_set_upload_total(backend *be, uint64_t b, const char *l) { (void)be, (void)b, (void)l; CUDA_UNAVAILABLE(); }
void backend_cuda_sync(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void *backend_cuda_stream(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void backend_cuda_alias_add(backend *be, const void *h, const void *d, size_t n) { (void)be, (void)h, (void)d, (void)n; CUDA_UNAVAILABLE(); }
void backend_cuda_alias_clear(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void backend_cuda_capture_begin(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
cuda_graph *backend_cuda_capture_end(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void cuda_graph_launch(cuda_graph *g) { (void)g; CUDA_UNAVAILABLE(); }
void cuda_graph_free(cuda_graph *g) { (void)g; CUDA_UNAVAILABLE(); }
int cuda_graph_stale(const cuda_graph *g) { (void)g; CUDA_UNAVAILABLE(); }
size_t backend_cuda_trim(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void backend_cuda_act_from_host(backend *be, void *d, const float *s, size_t n) { (void)be, (void)d, (void)s, (void)n; CUDA_UNAVAILABLE(); }
void backend_cuda_force_generic_attention(backend *be, int on) { (void)be, (void)on; CUDA_UNAVAILABLE(); }
void backend_cuda_attention_splits(backend *be, int n) { (void)be, (void)n; CUDA_UNAVAILABLE(); }
void backend_cuda_stage_stats(backend *be, uint64_t *c, uint64_t *r) { (void)be, (void)c, (void)r; CUDA_UNAVAILABLE(); }
void backend_cuda_stage_reuse(backend *be, int on) { (void)be, (void)on; CUDA_UNAVAILABLE(); }
void backend_cuda_gemm_cublas(backend *be, int on) { (void)be, (void)on; CUDA_UNAVAILABLE(); }
void backend_cuda_cublas_reduced_precision(backend *be, int allow) { (void)be, (void)allow; CUDA_UNAVAILABLE(); }
void backend_cuda_gemm_splits(backend *be, int n) { (void)be, (void)n; CUDA_UNAVAILABLE(); }
int  backend_cuda_gemm_last_splits(backend *be) { (void)be; CUDA_UNAVAILABLE(); }
void backend_cuda_fuse(backend *be, int on) { (void)be, (void)on; CUDA_UNAVAILABLE(); }
void backend_cuda_pack(backend *be, unsigned mask) { (void)be, (void)mask; CUDA_UNAVAILABLE(); }
double backend_cuda_copy_bandwidth(backend *be, size_t b, int r) { (void)be, (void)b, (void)r; CUDA_UNAVAILABLE(); }
void *backend_cuda_malloc(backend *be, size_t b) { (void)be, (void)b; CUDA_UNAVAILABLE(); }
void backend_cuda_free_dev(backend *be, void *p) { (void)be, (void)p; CUDA_UNAVAILABLE(); }
void backend_cuda_memcpy_h2d(backend *be, void *d, const void *s, size_t b) { (void)be, (void)d, (void)s, (void)b; CUDA_UNAVAILABLE(); }
void backend_cuda_memcpy_d2h(backend *be, void *d, const void *s, size_t b) { (void)be, (void)d, (void)s, (void)b; CUDA_UNAVAILABLE(); }

#endif /* UNMASK_HAVE_CUDA */
