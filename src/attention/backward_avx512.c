/* The backward's AVX-512 path: backward_simd.h over 16-float vectors, 4 x 4 register tiles. */
#include "attention/backward.h"
#include "core/simd_avx512.h"

#define NV 4

#include "attention/backward_simd.h"
