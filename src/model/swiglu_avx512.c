/* AVX-512 SwiGLU loops (fx__swiglu_ops); called only when fx_get_isa() allows. */
#include "core/simd_avx512.h"
#include "swiglu_simd.h"

const fx__swiglu_ops fx__swiglu_ops_avx512 = {SIMD_FN(swiglu_forward), SIMD_FN(swiglu_backward)};
