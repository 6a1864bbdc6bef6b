/* AVX-512 SwiGLU loops; called only when fx_get_isa() allows. */
#include "core/simd_avx512.h"
#include "swiglu_simd.h"
