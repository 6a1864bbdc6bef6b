/* The vdpbf16ps micro-kernel (src/core/gemm_bf16_dp.h) built from SIMDe's portable definitions
   of the AVX-512 intrinsics, so that test_gemm_bf16 runs the AVX512-BF16 path's code on any
   CPU; the library's own build of the same body runs only where the CPU has the instruction. */
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#define FX__DP_KERNEL fxt_bf16_dp_kernel_simde
#include "core/gemm_bf16_dp.h"
