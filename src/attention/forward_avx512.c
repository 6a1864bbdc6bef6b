/* The forward's AVX-512 path: forward_simd.h over 16-float vectors, 6 x 4 register tiles. */
#include "attention/internal.h"
#include "core/simd_avx512.h"

#define NC 4

#include "attention/forward_simd.h"
