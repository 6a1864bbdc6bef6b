/* The AVX512-BF16 micro-kernel of the bfloat16 GEMM (gemm_bf16_dp.h), built for CPUs with
   vdpbf16ps and called only where fx__cpu_avx512bf16() says the CPU has it. */
#include <immintrin.h>

#define FX__DP_KERNEL fx__bf16_dp_kernel_avx512bf16
#include "gemm_bf16_dp.h"
