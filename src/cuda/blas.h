/* Matrix products on a CUDA device by cuBLASLt (docs/cuda.md, "cuBLASLt"), for the device
   paths that need large products (the fused loss, a training step on the GPU).

   The library is opened at run time (dlopen): libcublasLt.so.13, then libcublasLt.so.12, or
   the file FLEXC_CUBLASLT names. A machine without it gets FX_EUNSUPPORTED naming it, and
   libflexc itself never depends on it at load time.

   Every call of one shape repeats bitwise: float32 accumulation (CUBLAS_COMPUTE_32F, no TF32),
   one algorithm per (device, shape, leading dimensions, types, transposes, pointer alignment)
   chosen once by the heuristic and kept, and a fixed workspace per stream (split-K is allowed:
   cuBLASLt's reductions repeat bitwise for one algorithm, workspace and GPU).

   Built in every configuration: without CUDA, fx__cu_gemm_run returns FX_EUNSUPPORTED; in the
   CPU emulation of the kernels (FX_CUDA_EMU) it is a plain loop over host memory. */
#ifndef FX_CUDA_BLAS_H
#define FX_CUDA_BLAS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C = alpha * op(A) op(B) + beta * C, row-major, float32 accumulation.
   op(A) is [m, k]: A stored [m, k] (lda >= k), or [k, m] when ta (lda >= m); likewise op(B)
   is [k, n]: B stored [k, n] (ldb >= n), or [n, k] when tb (ldb >= k). C is [m, n], ldc >= n.
   ab_type in {FX_DT_BF16, FX_DT_F16, FX_DT_F32} for both A and B; c_type in {FX_DT_F32,
   FX_DT_BF16} (FX_DT_F16 too when ab_type is). Device pointers of the current device.
   beta = 0 ignores C's old values (NaN included). */
typedef struct fx__cu_gemm {
    int64_t m, n, k;
    const void *a, *b;
    void *c;
    int64_t lda, ldb, ldc;
    int ta, tb;
    int ab_type, c_type;
    float alpha, beta;
    void *stream; /* cudaStream_t; NULL: the default stream */
} fx__cu_gemm;

/* Queues the product on g->stream and returns without waiting for it: FX_OK, FX_EINVAL (the
   arguments), FX_EUNSUPPORTED (no CUDA in the build, no cuBLASLt, a combination of types it
   does not take), FX_ENOMEM, or FX_EDEVICE, with fx_last_error() set. */
int fx__cu_gemm_run(const fx__cu_gemm *g);

/* Checks the arguments only (FX_OK or FX_EINVAL / FX_EUNSUPPORTED with the message). */
int fx__cu_gemm_check(const fx__cu_gemm *g);

#ifdef __cplusplus
}
#endif
#endif
