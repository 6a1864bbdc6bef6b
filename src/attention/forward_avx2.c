/* The forward's AVX2 path: forward_simd.h over 8-float vectors, 6 x 2 register tiles. */
#include "attention/internal.h"
#include "core/simd_avx2.h"

#define NC 2

#include "attention/forward_simd.h"
