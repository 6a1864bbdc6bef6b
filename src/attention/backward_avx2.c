/* The backward's AVX2 path: backward_simd.h over 8-float vectors, 4 x 3 register tiles
   (12 accumulators of the 16 registers). */
#include "attention/backward.h"
#include "core/simd_avx2.h"

#define NV 3

#include "attention/backward_simd.h"
