/* The micro-kernel of the vdpbf16ps bfloat16 GEMM (AVX512-BF16): a FX__DP_MR x FX__DP_NR tile
   of C from one panel of each operand packed pair by pair (fx__bf16_pack_pairs), every
   element summed over all of k in increasing pairs, then stored.

   Written with the intrinsics' names only, so that one body serves two builds: the library's
   (gemm_bf16_avx512bf16.c, compiled with -mavx512bf16, run where the CPU has the instruction)
   and the tests' (tests/gemm_bf16_simde.c, the same names from SIMDe's portable definitions,
   run on any CPU). Define FX__DP_KERNEL to the function's name before including. */
#ifndef FX__DP_KERNEL
#error "define FX__DP_KERNEL before including gemm_bf16_dp.h"
#endif

#include "gemm_bf16.h"

/* An accumulator row: FX__DP_NR / 16 vectors. */
enum { FX__DP_NV = FX__DP_NR / 16 };

static inline __m512bh fx__dp_bh(__m512i x) { return (__m512bh)x; }

void FX__DP_KERNEL(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                   int64_t mr, int64_t nr)
{
    /* The accumulators are indexed by constants only (the loops unrolled), so that they live
       in registers: 24 of the 32 vector registers, with 2 for b and 1 for a's broadcast. */
    __m512 acc[FX__DP_MR][FX__DP_NV];
#pragma GCC unroll 16
    for (int r = 0; r < FX__DP_MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < FX__DP_NV; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const uint32_t *ap = a + p * FX__DP_MR;
        __m512i bv[FX__DP_NV];
#pragma GCC unroll 4
        for (int v = 0; v < FX__DP_NV; v++)
            bv[v] = _mm512_loadu_si512((const void *)(b + p * FX__DP_NR + 16 * v));
#pragma GCC unroll 16
        for (int r = 0; r < FX__DP_MR; r++) {
            const __m512bh ar = fx__dp_bh(_mm512_set1_epi32((int)ap[r]));
#pragma GCC unroll 4
            for (int v = 0; v < FX__DP_NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, fx__dp_bh(bv[v]));
        }
    }
    /* A whole row of the tile is stored straight from the accumulators, C = acc + beta * C
       (the sum and product rounded separately, as fx__bf16_tile_store does); a tile cut
       short by C's last columns goes through fx__bf16_tile_store. */
    if (nr == FX__DP_NR) {
        const __m512 vbeta = _mm512_set1_ps(beta);
#pragma GCC unroll 16
        for (int r = 0; r < FX__DP_MR; r++) {
            if (r >= mr)
                break;
#pragma GCC unroll 4
            for (int v = 0; v < FX__DP_NV; v++) {
                float *c = C + r * ldc + 16 * v;
                __m512 x = acc[r][v];
                if (beta != 0.0f)
                    x = _mm512_add_ps(x, _mm512_mul_ps(vbeta, _mm512_loadu_ps(c)));
                _mm512_storeu_ps(c, x);
            }
        }
        return;
    }
    float tile[FX__DP_MR * FX__DP_NR];
#pragma GCC unroll 16
    for (int r = 0; r < FX__DP_MR; r++)
#pragma GCC unroll 4
        for (int v = 0; v < FX__DP_NV; v++)
            _mm512_storeu_ps(tile + r * FX__DP_NR + 16 * v, acc[r][v]);
    fx__bf16_tile_store(tile, FX__DP_NR, beta, C, ldc, mr, nr);
}
