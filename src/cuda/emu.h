/* A CPU emulation of the part of CUDA the kernels in src/cuda use, for testing them on a
   machine without a GPU (the test_cuda_emu_* programs; never part of the library).

   The runtime calls work on host memory (allocations are tracked, so a pointer that did not
   come from cudaMalloc is reported as host memory, as a GPU would). A kernel launch runs the
   grid's blocks one after another; the threads of a block are cooperative fibers
   (stack switching), switched at __syncthreads and at warp shuffles, so barriers and shuffles have
   their CUDA meaning. The warp-wide tensor-core operations (mma.sync, ldmatrix of
   src/cuda/mma.cuh) exchange the lanes' operands the same way (warp_gather) and compute the
   PTX ISA's fragments on the CPU. A barrier that not every live thread of the block (or warp)
   reaches is reported as a deadlock and aborts the program: on a GPU it would hang or be
   undefined.
   __shared__ variables are function statics, shared by the block's fibers (one block runs
   at a time). Floating-point results follow the host's arithmetic, not the GPU's (no fused
   multiply-add contraction guarantees), so comparisons against the CPU path use the same
   tolerances as the GPU tests. */
#ifndef FX_CUDA_EMU_H
#define FX_CUDA_EMU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime API (C) ---------------------------------------------------------------------- */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
} cudaError_t;
typedef void *cudaStream_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost, cudaMemoryTypeDevice, cudaMemoryTypeManaged };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int device);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t st);
cudaError_t cudaFreeAsync(void *p, cudaStream_t st);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t st);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t st);
cudaError_t cudaStreamSynchronize(cudaStream_t st);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *at, const void *p);
/* Multiprocessors the emulated device reports (the split-KV choice); default 132. */
void fxemu_set_sm_count(int n);

#ifdef __cplusplus
}

/* ---- kernel side (C++) -------------------------------------------------------------------- */

#include <cmath>
#include <cstring>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace fxemu {
struct uint3_ {
    unsigned x, y, z;
};
extern uint3_ block_idx, block_dim, grid_dim;
const uint3_ &thread_idx();
void syncthreads();
float shfl(float v, int src_lane);
/* The warp's exchange: this lane's `bytes` (at most 64) in, every lane's copy out, all32
   holding 32 x bytes in lane order. Every lane of the warp must call it, as with a shuffle;
   the tensor-core primitives of src/cuda/mma.cuh are built on it. */
void warp_gather(const void *mine, void *all32, size_t bytes);
float *dyn_smem();
void launch(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);
template <typename K> inline cudaError_t func_set_attribute(K, enum cudaFuncAttribute, int) { return cudaSuccess; }

/* kernel<<<grid, block, smem, stream>>>(args...) */
struct Launch {
    dim3 g, b;
    size_t s;
    cudaStream_t st; /* work runs at once: streams only order it */
    template <typename K> struct Bound {
        const Launch &l;
        K k;
        template <typename... A> void operator()(A... args) const
        {
            K kk = k;
            launch(l.g, l.b, l.s, [=]() { kk(args...); });
        }
    };
    template <typename K> Bound<K> operator()(K k) const { return Bound<K>{*this, k}; }
};
} // namespace fxemu

#define threadIdx (fxemu::thread_idx())
#define blockIdx (fxemu::block_idx)
#define blockDim (fxemu::block_dim)
#define gridDim (fxemu::grid_dim)
#define __syncthreads() fxemu::syncthreads()
#define __shfl_sync(mask, v, lane) fxemu::shfl((v), (lane))
#define __shfl_xor_sync(mask, v, o) fxemu::shfl((v), (int)((threadIdx.x & 31) ^ (unsigned)(o)))
#define cudaFuncSetAttribute(k, attr, v) fxemu::func_set_attribute(k, attr, v)
/* The launch syntax the kernels use (src/cuda/common.cuh). */
#define FX_LAUNCH(kernel, grid, block, smem, stream) fxemu::Launch{dim3(grid), dim3(block), (size_t)(smem), (stream)}(kernel)
#define FX_DYN_SMEM(type, name) type *name = (type *)fxemu::dyn_smem()

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

static inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

/* bfloat16 as the host sees it. */
struct __nv_bfloat16 {
    uint16_t x;
};
static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.x = (uint16_t)((u >> 16) | 0x40);
    else
        h.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return h;
}

/* IEEE half precision as the host sees it. */
struct __half {
    uint16_t x;
};
static inline float __half2float(__half h)
{
    const uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | m << 13; /* inf, NaN (payload kept) */
    } else if (e != 0) {
        u = sign | (e + 112) << 23 | m << 13;
    } else {
        float f = (float)m * 0x1p-24f; /* subnormal or zero: exact */
        std::memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline __half __float2half_rn(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    __half h;
    if (a > 0x7f800000u) {
        h.x = (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    } else if (a >= 0x477ff000u) { /* rounds to 65520 or more: infinity */
        h.x = (uint16_t)(sign | 0x7c00u);
    } else if (a >= 0x38800000u) { /* normal: 2^-14 and up */
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
        h.x = (uint16_t)(sign | (r >> 13));
    } else { /* subnormal: a multiple of 2^-24, rounded to nearest even by the FPU */
        float mag;
        std::memcpy(&mag, &a, 4);
        h.x = (uint16_t)(sign | (uint16_t)std::nearbyint(mag * 0x1p24f));
    }
    return h;
}
#endif /* __cplusplus */

#endif
