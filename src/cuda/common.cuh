/* Pieces shared by the CUDA kernels: element loads and stores for float32 and bfloat16,
   NaN-propagating max, and warp reductions whose result is the same in every lane and on
   every run (a butterfly: each level adds the same two values, commutatively, in each
   lane of a pair). */
#ifndef FX_CUDA_COMMON_CUH
#define FX_CUDA_COMMON_CUH

#ifdef FX_CUDA_EMU
#include "cuda/emu.h" /* the CPU emulation the emu tests build these files with */
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
/* kernel<<<grid, block, smem, stream>>>, spelled so that the emulation can take it too. */
#define FX_LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define FX_DYN_SMEM(type, name) extern __shared__ type name[]
#endif
#include <math.h>
#include <stdint.h>

#include "cuda/cuda.h"

namespace fxcu {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float load(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const bf16 *p, int64_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void store(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store(bf16 *p, int64_t i, float x) { p[i] = __float2bfloat16_rn(x); }

/* max that returns NaN when either side is NaN (fmaxf would drop it). */
__device__ __forceinline__ float nmax(float a, float b) { return (a > b || a != a) ? a : b; }

__device__ __forceinline__ float warp_max(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x = nmax(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* Launch-error check after a kernel: FX_OK or the runtime's error as a status. */
static inline int launched(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? FX_OK : fx__cuda_status((int)e, what);
}

/* Allows a kernel dynamic shared memory above the 48 KiB default. */
template <typename K> static inline int allow_smem(K kernel, size_t bytes, const char *what)
{
    if (bytes <= 48 * 1024)
        return FX_OK;
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    return e == cudaSuccess ? FX_OK : fx__cuda_status((int)e, what);
}

} // namespace fxcu

#endif
