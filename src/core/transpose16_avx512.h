/* Helpers of the AVX-512 GEMM packings (gemm_avx512.c, gemm_bf16_avx512.c); include only from
   *_avx512.c files. */
#ifndef FX_CORE_TRANSPOSE16_AVX512_H
#define FX_CORE_TRANSPOSE16_AVX512_H

#include <immintrin.h>
#include <stdint.h>

/* The first n of sixteen lanes (n clamped to [0, 16]). */
static inline __mmask16 fx__tail16(int64_t n)
{
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* Sixteen floats rounded to bfloat16 (nearest even, NaN kept quiet: fx__f32_to_bf16), each
   value in the high half of its lane; the low halves are garbage. */
static inline __m512i fx__bf16_hi(__m512 f)
{
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd);
    const __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
}

/* r[i] word j <-> r[j] word i: 32-bit, then 64-bit interleaves within 128-bit lanes, then two
   rounds of 128-bit lane shuffles. */
static inline __attribute__((always_inline)) void fx__transpose16(__m512i r[16])
{
    __m512i t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* r[4g + c], 128-bit lane k: word 4k + c of rows 4g .. 4g + 3 */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        r[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
        r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
        r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        t[4 * c] = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(2, 0, 2, 0));
        t[4 * c + 1] = _mm512_shuffle_i32x4(r[c], r[4 + c], _MM_SHUFFLE(3, 1, 3, 1));
        t[4 * c + 2] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(2, 0, 2, 0));
        t[4 * c + 3] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], _MM_SHUFFLE(3, 1, 3, 1));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_i32x4(t[4 * c], t[4 * c + 2], _MM_SHUFFLE(2, 0, 2, 0));
        r[8 + c] = _mm512_shuffle_i32x4(t[4 * c], t[4 * c + 2], _MM_SHUFFLE(3, 1, 3, 1));
        r[4 + c] = _mm512_shuffle_i32x4(t[4 * c + 1], t[4 * c + 3], _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + c] = _mm512_shuffle_i32x4(t[4 * c + 1], t[4 * c + 3], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

#endif
