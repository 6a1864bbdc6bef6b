/* The AVX2 path of the fused loss: lce_simd.h's row and tile kernels over 8-float vectors
   (the fused pass's products are BLIS's on this path: lce.c). Called only when fx_get_isa()
   allows. */
#include "core/simd_avx2.h"
#include "lce_simd.h"

const fx__lce_row_kernels fx__lce_row_kernels_avx2 = {SIMD_FN(lce_stats), SIMD_FN(lce_prep), SIMD_FN(lce_grad)};

const fx__lce_tile_kernels fx__lce_tile_kernels_avx2 = {SIMD_FN(lce_stats_t), SIMD_FN(lce_prep_t),
                                                        SIMD_FN(lce_grad_t)};
