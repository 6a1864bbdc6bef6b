/* The SIMD layer for AVX-512: 16-float vectors (the operations are listed in simd_math.h). */
#ifndef FX_ATTENTION_SIMD_AVX512_H
#define FX_ATTENTION_SIMD_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

typedef __m512 vf;
typedef __mmask16 vm;
#define VL 16
#define SIMD_FN(name) name##_avx512
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

#include "attention/simd_math.h"

#endif
