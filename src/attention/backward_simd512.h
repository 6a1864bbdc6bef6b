/* AVX-512 helpers of the backward and decoding kernels; include only from *_avx512.c files. */
#ifndef FX_ATTENTION_BACKWARD_SIMD512_H
#define FX_ATTENTION_BACKWARD_SIMD512_H

#include <immintrin.h>
#include <math.h>

/* exp(x) to about 1 ulp for x in [-87, 88]; exactly 0 below -87 (so -inf gives 0), which
   is below float's normal range anyway. Range reduction x = n ln2 + r, |r| <= ln2/2, a
   degree-6 Taylor polynomial for exp(r), and scalef for 2^n. */
static inline __m512 fx__exp512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __mmask16 ok = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(ok, _mm512_scalef_ps(p, n));
}

#endif
