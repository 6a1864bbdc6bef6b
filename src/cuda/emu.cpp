// The CPU emulation declared in emu.h: a tracked host allocator standing in for device
// memory, and a launcher that runs each block's threads as fibers. Test-only code.
#include "cuda/emu.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

std::map<uintptr_t, size_t> allocations; // device allocations: start -> bytes
cudaError_t last_error = cudaSuccess;
int sm_count = 132;

cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

} // namespace

extern "C" {

void fxemu_set_sm_count(int n) { sm_count = n; }

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int device)
{
    (void)attr, (void)device;
    *v = sm_count;
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    default:
        return "invalid argument";
    }
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = std::malloc(bytes ? bytes : 1);
    if (!*p)
        return fail(cudaErrorMemoryAllocation);
    allocations[(uintptr_t)*p] = bytes ? bytes : 1;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end())
        return fail(cudaErrorInvalidValue);
    allocations.erase(it);
    std::free(p);
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t) { return cudaMalloc(p, bytes); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t) { return cudaFree(p); }
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind)
{
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t)
{
    return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void *p, int v, size_t bytes)
{
    std::memset(p, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t) { return cudaMemset(p, v, bytes); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p)
{
    std::memset(at, 0, sizeof *at);
    at->type = cudaMemoryTypeUnregistered;
    const uintptr_t u = (uintptr_t)p;
    auto it = allocations.upper_bound(u);
    if (it != allocations.begin()) {
        --it;
        if (u < it->first + it->second) {
            at->type = cudaMemoryTypeDevice;
            at->device = 0;
            at->devicePointer = (void *)p;
        }
    }
    return cudaSuccess;
}

} // extern "C"

namespace fxemu {

uint3_ block_idx, block_dim, grid_dim;

namespace {

enum { STACK = 256 * 1024 };
enum Wait { RUN = 0, BLOCK = 1, WARP = 2, DONE = 3 };

#if defined(__x86_64__)
// A context switch without the signal-mask system call swapcontext makes (the emulation
// switches at every barrier and shuffle): saves the callee-saved registers on the current
// stack, stores its pointer in *from, and continues on stack `to`.
extern "C" void fxemu_switch(void **from, void *to);
asm(".text\n"
    ".globl fxemu_switch\n"
    ".type fxemu_switch, @function\n"
    "fxemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size fxemu_switch, .-fxemu_switch\n");
struct Context {
    void *sp;
};
#else
struct Context {
    ucontext_t uc;
};
#endif

struct Fiber {
    Context ctx;
    uint3_ tid;
    Wait state;
    float slot; // this lane's value in a shuffle
    alignas(16) unsigned char xslot[64]; // this lane's bytes in a warp_gather
    std::vector<char> stack;
};

std::vector<Fiber> fibers;
Context sched_ctx;
Fiber *cur = nullptr;
const std::function<void()> *body_now = nullptr;
std::vector<float> smem;

void to_scheduler()
{
#if defined(__x86_64__)
    fxemu_switch(&cur->ctx.sp, sched_ctx.sp);
#else
    swapcontext(&cur->ctx.uc, &sched_ctx.uc);
#endif
}

void to_fiber(Fiber *f)
{
    cur = f;
#if defined(__x86_64__)
    fxemu_switch(&sched_ctx.sp, f->ctx.sp);
#else
    swapcontext(&sched_ctx.uc, &f->ctx.uc);
#endif
}

void fiber_main()
{
    (*body_now)();
    cur->state = DONE;
    to_scheduler(); // never resumed
    std::abort();
}

void fiber_start(Fiber &f)
{
#if defined(__x86_64__)
    // The first switch pops six registers and "returns" into fiber_main, with the stack
    // aligned as at a call.
    uintptr_t top = ((uintptr_t)f.stack.data() + f.stack.size()) & ~(uintptr_t)15;
    void **sp = (void **)(top - 64);
    for (int i = 0; i < 6; i++)
        sp[i] = nullptr;
    sp[6] = (void *)&fiber_main;
    sp[7] = nullptr;
    f.ctx.sp = sp;
#else
    getcontext(&f.ctx.uc);
    f.ctx.uc.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc.uc_stack.ss_size = f.stack.size();
    f.ctx.uc.uc_link = nullptr;
    makecontext(&f.ctx.uc, fiber_main, 0);
#endif
}

void yield_as(Wait w)
{
    cur->state = w;
    to_scheduler();
}

void deadlock(const char *what)
{
    std::fprintf(stderr, "cuda emulation: deadlock at %s in block (%u, %u): not every live thread reached it\n", what,
                 block_idx.x, block_idx.y);
    std::abort();
}

} // namespace

const uint3_ &thread_idx() { return cur->tid; }

void syncthreads() { yield_as(BLOCK); }

float shfl(float v, int src_lane)
{
    const unsigned base = cur->tid.x & ~31u;
    cur->slot = v;
    yield_as(WARP); // every lane has written its slot
    const float r = fibers[base + (unsigned)(src_lane & 31)].slot;
    yield_as(WARP); // every lane has read before any slot is written again
    return r;
}

void warp_gather(const void *mine, void *all32, size_t bytes)
{
    if (bytes > sizeof cur->xslot) {
        std::fprintf(stderr, "cuda emulation: warp_gather of %zu bytes (at most %zu)\n", bytes, sizeof cur->xslot);
        std::abort();
    }
    const unsigned base = cur->tid.x & ~31u;
    std::memcpy(cur->xslot, mine, bytes);
    yield_as(WARP); // every lane has written its slot
    for (unsigned l = 0; l < 32; l++)
        std::memcpy((unsigned char *)all32 + l * bytes, fibers[base + l].xslot, bytes);
    yield_as(WARP); // every lane has read before any slot is written again
}

float *dyn_smem() { return smem.data(); }

void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body)
{
    const unsigned nt = block.x * block.y * block.z;
    if (block.y != 1 || block.z != 1 || nt == 0 || nt > 1024) {
        std::fprintf(stderr, "cuda emulation: unsupported block (%u, %u, %u)\n", block.x, block.y, block.z);
        std::abort();
    }
    fibers.resize(nt);
    for (auto &f : fibers)
        f.stack.resize(STACK);
    smem.assign(smem_bytes / sizeof(float) + 1, 0.0f);
    block_dim = {block.x, 1, 1};
    grid_dim = {grid.x, grid.y, grid.z};
    body_now = &body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                block_idx = {bx, by, bz};
                for (unsigned t = 0; t < nt; t++) {
                    Fiber &f = fibers[t];
                    f.tid = {t, 0, 0};
                    f.state = RUN;
                    fiber_start(f);
                }
                for (;;) {
                    bool ran = false;
                    for (unsigned t = 0; t < nt; t++) {
                        if (fibers[t].state != RUN)
                            continue;
                        to_fiber(&fibers[t]);
                        ran = true;
                    }
                    // Release a block barrier when every live thread waits at it, and a warp
                    // barrier when every live lane of the warp does.
                    unsigned live = 0, at_block = 0;
                    for (unsigned t = 0; t < nt; t++) {
                        live += fibers[t].state != DONE;
                        at_block += fibers[t].state == BLOCK;
                    }
                    if (live == 0)
                        break;
                    bool released = false;
                    if (at_block == live) {
                        for (unsigned t = 0; t < nt; t++)
                            if (fibers[t].state == BLOCK)
                                fibers[t].state = RUN;
                        released = true;
                    }
                    for (unsigned w = 0; w < (nt + 31) / 32; w++) {
                        const unsigned t1 = w * 32 + 32 < nt ? w * 32 + 32 : nt;
                        unsigned wl = 0, ww = 0;
                        for (unsigned t = w * 32; t < t1; t++) {
                            wl += fibers[t].state != DONE;
                            ww += fibers[t].state == WARP;
                        }
                        if (ww > 0 && ww == wl) {
                            if (wl != t1 - w * 32)
                                deadlock("a warp shuffle with exited lanes");
                            for (unsigned t = w * 32; t < t1; t++)
                                fibers[t].state = RUN;
                            released = true;
                        }
                    }
                    if (!ran && !released)
                        deadlock(at_block ? "__syncthreads" : "a warp shuffle");
                }
            }
    body_now = nullptr;
    cur = nullptr;
}

} // namespace fxemu
