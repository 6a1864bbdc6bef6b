/* The SIMD layer for AVX-512: 16-float vectors (the operations are listed in simd_math.h). */
#ifndef FX_CORE_SIMD_AVX512_H
#define FX_CORE_SIMD_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

typedef __m512 vf;
typedef __mmask16 vm;
#define VL 16
#define SIMD_FN(name) name##_avx512
#define SIMD_NAME "avx512" /* the kernel tables' name (docs/dispatch.md) */
#define V_ZERO() _mm512_setzero_ps()
#define V_SET1(x) _mm512_set1_ps(x)
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, x) _mm512_storeu_ps(p, x)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_MIN(a, b) _mm512_min_ps(a, b)
#define V_GATHER(t, e) _mm512_i32gather_ps(_mm512_cvtps_epi32(e), t, 4)
#define V_HMAX(x) _mm512_reduce_max_ps(x)
#define V_HSUM(x) _mm512_reduce_add_ps(x)
#define V_LT(a, b) _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)
#define V_SEL(m, a, b) _mm512_mask_blend_ps(m, b, a)
#define V_ROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2N(p, n) _mm512_scalef_ps(p, n)
#define V_ABS(x) _mm512_abs_ps(x)
#define V_COPYSIGN(y, x)                                                                           \
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y),                                   \
                                        _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN))))
#define V_BITS(x, w) _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), (__mmask16)(w), x)
#define V_FROM_I(i0)                                                                               \
    _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_set1_epi32(i0),                                    \
                                        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)))
#define V_TAIL(n) ((n) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n)) - 1u))
#define V_MLOAD(m, p) _mm512_maskz_loadu_ps(m, p)
#define V_MSTORE(p, m, x) _mm512_mask_storeu_ps(p, m, x)
#define V_SUMS(a) sums_avx512(a)
#define V_SQRT(x) _mm512_sqrt_ps(x)
#define V_BF16_LOAD(h) bf16_load_avx512(h)
#define V_BF16_STORE(h, x) bf16_store_avx512(h, x)

static inline __m512 bf16_load_avx512(const uint16_t *h)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Nearest even, NaN kept quiet (a quiet bit set), sixteen at a time. */
static inline void bf16_store_avx512(uint16_t *h, __m512 f)
{
    __m512i u = _mm512_castps_si512(f);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_mov_epi32(r, nan, q);
    _mm256_storeu_si256((__m256i *)h, _mm512_cvtepi32_epi16(r));
}

/* Lane n of the result is the sum of a[n]'s lanes, for 16 vectors: a transpose-and-add tree
   (48 shuffles and adds instead of 16 full horizontal sums). */
static inline __m512 sums_avx512(const __m512 *a)
{
    __m512 t[8], u[4];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]), _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512d x = _mm512_castps_pd(t[2 * q]), y = _mm512_castps_pd(t[2 * q + 1]);
        u[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

#include "core/simd_math.h"

#endif
