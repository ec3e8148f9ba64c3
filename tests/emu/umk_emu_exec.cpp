/*
 * umk_emu_exec.cpp — the unmask CUDA emulator's kernel executor: runs a grid's blocks one after
 * another on the calling host thread, each block's threads as cooperative fibers (ucontext), and
 * implements the device-side synchronisation of umk_emu_device.h: __syncthreads (block barrier),
 * warp collectives (__shfl_xor_sync, __ballot_sync, mma.sync m16n8k16 bf16) as barriers of the
 * lanes their mask names, with the data exchange done by the scheduler once every lane arrived.
 *
 * Checks (abort with call sites): __syncthreads reached from different call sites in one block,
 * a warp collective whose mask names an exited or missing lane or lanes at different call sites,
 * a calling lane outside its own mask, mma.sync without all 32 lanes, deadlock (nothing runnable
 * and no barrier can complete). Dynamic shared memory is refilled with 0xff bytes for every block.
 * Threads that exited count as arrived at __syncthreads (as on sm_70+).
 *
 * mma.sync: the fragment layouts are those of the PTX ISA for mma.m16n8k16 with .bf16 inputs
 * (groupID = lane >> 2, threadID_in_group = lane % 4), not those our kernels happen to assume.
 *
 * Does not: run blocks concurrently, model timing or the memory model between blocks.
 * Threading: each host thread has its own executor (fibers, stacks, dynamic shared memory).
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <vector>

#include "umk_emu_device.h"
#include "umk_emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define UMK_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UMK_EMU_ASAN 1
#endif
#endif
#ifdef UMK_EMU_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

// Fiber switch. x86-64: a minimal switch of the callee-saved registers (+ MXCSR / x87 control
// word) — ucontext's swapcontext makes a sigprocmask system call per switch, which dominated the
// run time. Elsewhere: ucontext.
#if defined(__x86_64__)
#define UMK_EMU_FAST_SWITCH 1
extern "C" void umk_emu_ctx_switch(void **save_sp, void *load_sp);
__asm__(
    ".text\n"
    ".globl umk_emu_ctx_switch\n"
    ".type umk_emu_ctx_switch,@function\n"
    "umk_emu_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    subq $8, %rsp\n"
    "    stmxcsr (%rsp)\n"
    "    fnstcw 4(%rsp)\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    ldmxcsr (%rsp)\n"
    "    fldcw 4(%rsp)\n"
    "    addq $8, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size umk_emu_ctx_switch,.-umk_emu_ctx_switch\n");
#endif

namespace umk_emu {

__thread thread_ctx *tl_thread;
__thread uint3 tl_block_idx;
__thread dim3 tl_block_dim, tl_grid_dim;

namespace {

enum fiber_state { F_RUN, F_BAR, F_WARP, F_DONE };
enum warp_op { W_SHFL_XOR, W_SHFL_IDX, W_BALLOT, W_MMA };
const char *const k_op_name[] = {"__shfl_xor_sync", "__shfl_sync", "__ballot_sync", "mma.sync.m16n8k16"};

struct fiber {
    thread_ctx  ctx;
#ifdef UMK_EMU_FAST_SWITCH
    void       *sp;
#else
    ucontext_t  uc;
#endif
    char       *stack;
    int         state;
    int         linear, warp, lane;
    // wait site and warp-collective operands
    const char *file;
    int         line;
    int         op;
    uint32_t    mask;
    uint64_t    in, out;
    int         arg;
    uint32_t    a[4], b[2];
    float       c[4];
    void       *asan_fake;
};

#ifdef UMK_EMU_ASAN
constexpr size_t k_stack_bytes = 1u << 20;
#else
constexpr size_t k_stack_bytes = 256u << 10;
#endif
constexpr size_t k_guard_bytes = 4096;
constexpr int k_max_threads = 1024;

struct executor {
    fiber                      *fibers = nullptr;   // [k_max_threads]
    char                       *stacks = nullptr;   // k_max_threads x (guard + stack)
#ifdef UMK_EMU_FAST_SWITCH
    void                       *sched_sp = nullptr;
#else
    ucontext_t                  sched;
#endif
    const std::function<void()> *body = nullptr;
    unsigned char              *dyn = nullptr;   // dynamic shared memory of the running launch
    size_t                      dyn_bytes = 0;
    fiber                      *cur = nullptr;
    int                         n = 0;
    const char                 *kernel = nullptr;
    const void                 *sched_bottom = nullptr;
    size_t                      sched_size = 0;
    void                       *sched_fake = nullptr;
    uint64_t                    shuffle_state = 0x5eed;   // UNMASK_EMU_ORDER=shuffle
};

thread_local executor *tl_exec;

// frees the calling thread's executor when the thread exits (engine threads come and go)
struct executor_owner {
    executor *ex = nullptr;
    ~executor_owner() {
        if (!ex) return;
        munmap(ex->stacks, (k_guard_bytes + k_stack_bytes) * k_max_threads);
        delete[] ex->fibers;
        delete ex;
        tl_exec = nullptr;
    }
};
thread_local executor_owner tl_exec_owner;

executor *exec_get() {
    if (tl_exec) return tl_exec;
    executor *ex = new executor;
    tl_exec_owner.ex = ex;
    ex->fibers = new fiber[k_max_threads];
    const size_t per = k_guard_bytes + k_stack_bytes;
    void *m = mmap(nullptr, per * k_max_threads, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) fatal("cannot map %zu bytes of fiber stacks", per * k_max_threads);
    ex->stacks = static_cast<char *>(m);
    for (int i = 0; i < k_max_threads; i++) {
        if (mprotect(ex->stacks + (size_t)i * per, k_guard_bytes, PROT_NONE) != 0) fatal("mprotect of a stack guard");
        ex->fibers[i].stack = ex->stacks + (size_t)i * per + k_guard_bytes;
    }
    tl_exec = ex;
    return ex;
}

fiber *cur_fiber(const char *what) {
    executor *ex = tl_exec;
    if (!ex || !ex->cur) fatal("%s called outside a kernel", what);
    return ex->cur;
}

// fiber -> scheduler; returns when the scheduler resumes this fiber
void to_scheduler(fiber *f, bool dying) {
    executor *ex = tl_exec;
#ifdef UMK_EMU_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f->asan_fake, ex->sched_bottom, ex->sched_size);
#else
    (void)dying;
#endif
#ifdef UMK_EMU_FAST_SWITCH
    umk_emu_ctx_switch(&f->sp, ex->sched_sp);
#else
    if (swapcontext(&f->uc, &ex->sched) != 0) fatal("swapcontext");
#endif
#ifdef UMK_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &ex->sched_bottom, &ex->sched_size);
#endif
}

void fiber_main() {
    executor *ex = tl_exec;
    fiber *f = ex->cur;
#ifdef UMK_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &ex->sched_bottom, &ex->sched_size);
#endif
    (*ex->body)();
    f->state = F_DONE;
    to_scheduler(f, true);
    fatal("a finished fiber was resumed");
}

void run_fiber(executor *ex, fiber *f) {
    ex->cur = f;
    tl_thread = &f->ctx;
#ifdef UMK_EMU_ASAN
    __sanitizer_start_switch_fiber(&ex->sched_fake, f->stack, k_stack_bytes);
#endif
#ifdef UMK_EMU_FAST_SWITCH
    umk_emu_ctx_switch(&ex->sched_sp, f->sp);
#else
    if (swapcontext(&ex->sched, &f->uc) != 0) fatal("swapcontext");
#endif
#ifdef UMK_EMU_ASAN
    __sanitizer_finish_switch_fiber(ex->sched_fake, nullptr, nullptr);
#endif
    ex->cur = nullptr;
    tl_thread = nullptr;
}

const char *tid_str(const fiber &f, char *buf, size_t n) {
    snprintf(buf, n, "thread (%u,%u,%u) [warp %d lane %d]", f.ctx.thread_idx.x, f.ctx.thread_idx.y,
             f.ctx.thread_idx.z, f.warp, f.lane);
    return buf;
}

const char *block_str(char *buf, size_t n) {
    snprintf(buf, n, "block (%u,%u,%u) of grid (%u,%u,%u), blockDim (%u,%u,%u)", tl_block_idx.x, tl_block_idx.y,
             tl_block_idx.z, tl_grid_dim.x, tl_grid_dim.y, tl_grid_dim.z, tl_block_dim.x, tl_block_dim.y,
             tl_block_dim.z);
    return buf;
}

float bf16_lo(uint32_t r) { return __uint_as_float(r << 16); }
float bf16_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }

// PTX ISA, mma.m16n8k16, .bf16 A/B, .f32 C/D. groupID = lane >> 2, tig = lane % 4.
//  A (16x16, .row): a0..a7 in 4 regs (2 per reg, lower index in the low half);
//    row = groupID for a0,a1,a4,a5 and groupID+8 for a2,a3,a6,a7;
//    col = tig*2 + (i & 1) for a0..a3 and tig*2 + (i & 1) + 8 for a4..a7.
//  B (16x8, .col): b0..b3 in 2 regs; row (k) = tig*2 + (i & 1) for b0,b1 and +8 for b2,b3; col = groupID.
//  C/D (16x8): c0..c3; row = groupID for c0,c1 and groupID+8 for c2,c3; col = tig*2 + (i & 1).
void mma_exec(fiber *lanes[32]) {
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const fiber &f = *lanes[l];
        const int g = l >> 2, t = l & 3;
        float a[8], b[4];
        for (int r = 0; r < 4; r++) a[2 * r] = bf16_lo(f.a[r]), a[2 * r + 1] = bf16_hi(f.a[r]);
        for (int r = 0; r < 2; r++) b[2 * r] = bf16_lo(f.b[r]), b[2 * r + 1] = bf16_hi(f.b[r]);
        for (int i = 0; i < 8; i++) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = a[i];
        }
        for (int i = 0; i < 4; i++) B[t * 2 + (i & 1) + (i >= 2 ? 8 : 0)][g] = b[i];
        for (int i = 0; i < 4; i++) C[i < 2 ? g : g + 8][t * 2 + (i & 1)] = f.c[i];
    }
    float D[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            float acc = 0.0f;
            for (int k = 0; k < 16; k++) acc += A[i][k] * B[k][j];
            D[i][j] = C[i][j] + acc;
        }
    for (int l = 0; l < 32; l++) {
        fiber &f = *lanes[l];
        const int g = l >> 2, t = l & 3;
        for (int i = 0; i < 4; i++) f.c[i] = D[i < 2 ? g : g + 8][t * 2 + (i & 1)];
    }
}

// Try to complete the warp collectives every named lane has reached. Returns whether any did.
bool release_warps(executor *ex) {
    bool any = false;
    char b1[96], b2[96], b3[160];
    const int n_warps = (ex->n + 31) / 32;
    for (int w = 0; w < n_warps; w++) {
        uint32_t handled = 0;
        for (int l0 = 0; l0 < 32; l0++) {
            const int i0 = w * 32 + l0;
            if (i0 >= ex->n || (handled >> l0 & 1u)) continue;
            fiber &lead = ex->fibers[i0];
            if (lead.state != F_WARP) continue;
            const uint32_t m = lead.mask;
            if (!(m >> l0 & 1u))
                fatal("%s at %s:%d: the calling lane is not in its mask 0x%08x (%s, %s, kernel %s)", k_op_name[lead.op],
                      lead.file, lead.line, m, tid_str(lead, b1, sizeof b1), block_str(b3, sizeof b3), ex->kernel);
            bool ready = true;
            fiber *lanes[32] = {};
            for (int l = 0; l < 32; l++) {
                if (!(m >> l & 1u)) continue;
                const int i = w * 32 + l;
                if (i >= ex->n)
                    fatal("%s at %s:%d: mask 0x%08x names lane %d, which does not exist (blockDim has %d threads; %s, "
                          "kernel %s)", k_op_name[lead.op], lead.file, lead.line, m, l, ex->n,
                          block_str(b3, sizeof b3), ex->kernel);
                fiber &f = ex->fibers[i];
                if (f.state == F_DONE)
                    fatal("%s at %s:%d: mask 0x%08x names lane %d, which has exited (%s waits; %s, kernel %s)",
                          k_op_name[lead.op], lead.file, lead.line, m, l, tid_str(lead, b1, sizeof b1),
                          block_str(b3, sizeof b3), ex->kernel);
                if (f.state != F_WARP) {
                    ready = false;
                    continue;
                }
                if (f.op != lead.op || f.file != lead.file || f.line != lead.line || f.mask != m)
                    fatal("divergent warp collective: %s at %s:%d (mask 0x%08x, %s) and %s at %s:%d (mask 0x%08x, "
                          "%s); %s, kernel %s", k_op_name[lead.op], lead.file, lead.line, m, tid_str(lead, b1, sizeof b1),
                          k_op_name[f.op], f.file, f.line, f.mask, tid_str(f, b2, sizeof b2), block_str(b3, sizeof b3),
                          ex->kernel);
                lanes[l] = &f;
            }
            handled |= m;
            if (!ready) continue;
            if (lead.op == W_MMA) {
                if (m != 0xffffffffu)
                    fatal("mma.sync.aligned at %s:%d executed by lanes 0x%08x: all 32 lanes must execute it (%s, "
                          "kernel %s)", lead.file, lead.line, m, block_str(b3, sizeof b3), ex->kernel);
                mma_exec(lanes);
            } else if (lead.op == W_BALLOT) {
                uint32_t bal = 0;
                for (int l = 0; l < 32; l++)
                    if (lanes[l] && lanes[l]->in) bal |= 1u << l;
                for (int l = 0; l < 32; l++)
                    if (lanes[l]) lanes[l]->out = bal;
            } else {   // shuffles: every lane reads the value its source lane passed
                for (int l = 0; l < 32; l++) {
                    if (!lanes[l]) continue;
                    const int src = lead.op == W_SHFL_IDX ? (lanes[l]->arg & 31) : l ^ (lanes[l]->arg & 31);
                    if (!(m >> src & 1u))
                        fatal("%s at %s:%d: lane %d reads lane %d, which is not in the mask 0x%08x (%s, kernel %s)",
                              k_op_name[lead.op], lead.file, lead.line, l, src, m, block_str(b3, sizeof b3), ex->kernel);
                    lanes[l]->out = lanes[src]->in;
                }
            }
            for (int l = 0; l < 32; l++)
                if (lanes[l]) lanes[l]->state = F_RUN;
            any = true;
        }
    }
    return any;
}

[[noreturn]] void deadlock(executor *ex) {
    char b1[96], b3[160];
    fprintf(stderr, "unmask CUDA emulator: deadlock in kernel %s, %s: no thread can run and no barrier can "
                    "complete. Waiting threads:\n", ex->kernel, block_str(b3, sizeof b3));
    int shown = 0;
    for (int i = 0; i < ex->n && shown < 64; i++) {
        const fiber &f = ex->fibers[i];
        if (f.state == F_BAR) fprintf(stderr, "  %s at __syncthreads %s:%d\n", tid_str(f, b1, sizeof b1), f.file, f.line);
        else if (f.state == F_WARP)
            fprintf(stderr, "  %s at %s %s:%d (mask 0x%08x)\n", tid_str(f, b1, sizeof b1), k_op_name[f.op], f.file,
                    f.line, f.mask);
        else continue;
        shown++;
    }
    fatal("deadlock (a warp collective waits for lanes held at __syncthreads, or the reverse)");
}

// getcontext returns twice: kept out of run_block so its locals are not clobbered
__attribute__((noinline)) void fiber_init(executor *ex, int i) {
    fiber &f = ex->fibers[i];
    f.linear = i;
    f.warp = i / 32;
    f.lane = i % 32;
    f.ctx.thread_idx.x = (unsigned)i % tl_block_dim.x;
    f.ctx.thread_idx.y = (unsigned)i / tl_block_dim.x % tl_block_dim.y;
    f.ctx.thread_idx.z = (unsigned)i / (tl_block_dim.x * tl_block_dim.y);
    f.state = F_RUN;
    f.asan_fake = nullptr;
#ifdef UMK_EMU_FAST_SWITCH
    // initial frame for umk_emu_ctx_switch: MXCSR + x87 control word, six zeroed registers, then the
    // "return address" fiber_main; it starts with rsp = top - 8 (= 8 mod 16, as after a call)
    uintptr_t top = ((uintptr_t)f.stack + k_stack_bytes) & ~(uintptr_t)15;
    uint64_t *sp = reinterpret_cast<uint64_t *>(top - 72);
    uint32_t csr[2];
    __asm__ volatile("stmxcsr %0" : "=m"(csr[0]));
    __asm__ volatile("fnstcw %0" : "=m"(csr[1]));
    memcpy(&sp[0], csr, 8);
    for (int r = 1; r <= 6; r++) sp[r] = 0;
    sp[7] = (uint64_t)(uintptr_t)&fiber_main;
    sp[8] = 0;   // fiber_main never returns
    f.sp = sp;
#else
    if (getcontext(&f.uc) != 0) fatal("getcontext");
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = k_stack_bytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main, 0);
#endif
}

// UNMASK_EMU_ORDER: the order in which runnable threads run to their next barrier —
// forward (default), reverse, or shuffle (a different seeded permutation for every phase of every
// block). Correct kernels give the same results (up to floating-point atomics) in every order; a
// missing __syncthreads / __syncwarp between a write and another thread's read usually does not.
enum order_kind { ORDER_FORWARD, ORDER_REVERSE, ORDER_SHUFFLE };

order_kind order_policy() {
    static const order_kind k = [] {
        const char *v = getenv("UNMASK_EMU_ORDER");
        if (!v || !*v || !strcmp(v, "forward")) return ORDER_FORWARD;
        if (!strcmp(v, "reverse")) return ORDER_REVERSE;
        if (!strcmp(v, "shuffle")) return ORDER_SHUFFLE;
        fatal("UNMASK_EMU_ORDER=%s: expected forward, reverse or shuffle", v);
    }();
    return k;
}

void next_order(executor *ex, int *order) {
    const int n = ex->n;
    const order_kind k = order_policy();
    for (int i = 0; i < n; i++) order[i] = k == ORDER_REVERSE ? n - 1 - i : i;
    if (k != ORDER_SHUFFLE) return;
    for (int i = n - 1; i > 0; i--) {   // Fisher-Yates with a splitmix64 stream
        uint64_t z = (ex->shuffle_state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const int j = (int)(z % (uint64_t)(i + 1));
        const int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

void run_block(executor *ex) {
    const int n = ex->n;
    int order[k_max_threads];
    for (int i = 0; i < n; i++) fiber_init(ex, i);
    if (ex->dyn_bytes) memset(ex->dyn, 0xff, ex->dyn_bytes);
    char b1[96], b2[96], b3[160];
    for (;;) {
        next_order(ex, order);
        for (int k = 0; k < n; k++) {
            fiber *f = &ex->fibers[order[k]];
            if (f->state == F_RUN) run_fiber(ex, f);
        }
        int done = 0, bar = 0, warp = 0;
        for (int i = 0; i < n; i++) {
            const int s = ex->fibers[i].state;
            done += s == F_DONE;
            bar += s == F_BAR;
            warp += s == F_WARP;
        }
        if (done == n) return;
        if (warp && release_warps(ex)) continue;
        if (bar && bar + done == n) {
            const fiber *first = nullptr;
            for (int i = 0; i < n; i++) {
                fiber &f = ex->fibers[i];
                if (f.state != F_BAR) continue;
                if (!first) first = &f;
                else if (f.file != first->file || f.line != first->line)
                    fatal("divergent __syncthreads in kernel %s, %s: %s waits at %s:%d, %s at %s:%d", ex->kernel,
                          block_str(b3, sizeof b3), tid_str(*first, b1, sizeof b1), first->file, first->line,
                          tid_str(f, b2, sizeof b2), f.file, f.line);
                f.state = F_RUN;
            }
            continue;
        }
        deadlock(ex);
    }
}

}  // namespace

void run_grid(const char *name, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
    executor *ex = exec_get();
    if (ex->cur) fatal("kernel launch from device code (not supported)");
    ex->kernel = name;
    ex->body = &body;
    ex->n = (int)(block.x * block.y * block.z);
    if (ex->n > k_max_threads) fatal("block of %d threads", ex->n);
    ex->dyn_bytes = smem;
    ex->dyn = smem ? static_cast<unsigned char *>(malloc(smem)) : nullptr;   // 16-byte aligned (glibc)
    const dim3 saved_bd = tl_block_dim, saved_gd = tl_grid_dim;
    tl_block_dim = block;
    tl_grid_dim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                tl_block_idx.x = x;
                tl_block_idx.y = y;
                tl_block_idx.z = z;
                run_block(ex);
            }
    free(ex->dyn);
    ex->dyn = nullptr;
    tl_block_dim = saved_bd;
    tl_grid_dim = saved_gd;
    ex->body = nullptr;
    ex->kernel = nullptr;
}

// ---------------------------------------------------------------- device-side entry points

void syncthreads(const char *file, int line) {
    fiber *f = cur_fiber("__syncthreads");
    f->state = F_BAR;
    f->file = file;
    f->line = line;
    to_scheduler(f, false);
}

static void warp_wait(fiber *f, int op, uint32_t mask, const char *file, int line) {
    f->state = F_WARP;
    f->op = op;
    f->mask = mask;
    f->file = file;
    f->line = line;
    to_scheduler(f, false);
}

uint64_t shfl(uint32_t mask, uint64_t bits, int arg, bool xor_, const char *file, int line) {
    fiber *f = cur_fiber(xor_ ? "__shfl_xor_sync" : "__shfl_sync");
    f->in = bits;
    f->arg = arg;
    warp_wait(f, xor_ ? W_SHFL_XOR : W_SHFL_IDX, mask, file, line);
    return f->out;
}

uint32_t ballot(uint32_t mask, int pred, const char *file, int line) {
    fiber *f = cur_fiber("__ballot_sync");
    f->in = pred ? 1u : 0u;
    warp_wait(f, W_BALLOT, mask, file, line);
    return (uint32_t)f->out;
}

void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    fiber *f = cur_fiber("mma.sync");
    for (int i = 0; i < 4; i++) f->a[i] = a[i], f->c[i] = d[i];
    f->b[0] = b0;
    f->b[1] = b1;
    warp_wait(f, W_MMA, 0xffffffffu, "kernels/umk_portable.h (umk_mma_bf16_16816)", 0);
    for (int i = 0; i < 4; i++) d[i] = f->c[i];
}

unsigned char *dynamic_smem() {
    executor *ex = tl_exec;
    if (!ex || !ex->cur) fatal("dynamic shared memory used outside a kernel");
    return ex->dyn;
}

}  // namespace umk_emu
