/* The forward with its products in bfloat16 (FX__ATTN_BF16): forward_simd.h over 16-float
   vectors with forward_bf16.h's vdpbf16ps strips: the AVX-512 table's forward_bf16
   (fx__attn_fwd_kernels), called only where fx__attn16_cpu() says the CPU has the instruction. */
#include "attention/internal.h"
#include "core/simd_avx512.h"

#define NC 4
#define FWD_BF16 1
#define FWD_ENTRY fx__flex_forward_avx512bf16

#include "attention/forward_simd.h"
