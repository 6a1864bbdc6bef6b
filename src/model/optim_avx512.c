/* The AVX-512 optimizer loops: optim_simd.h's AdamW over 16-float vectors, and the sum of
   squares of the gradient norm; called only when fx_get_isa() allows. */
#include "core/simd_avx512.h"
#include "optim_simd.h"

/* sum g^2 over 16 double lanes (element i in lane i % 16), combined as the scalar twin
   does. */
double fx__sumsq_avx512(const float *g, int64_t n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512d x0 = _mm512_cvtps_pd(_mm256_loadu_ps(g + i)), x1 = _mm512_cvtps_pd(_mm256_loadu_ps(g + i + 8));
        a0 = _mm512_add_pd(a0, _mm512_mul_pd(x0, x0));
        a1 = _mm512_add_pd(a1, _mm512_mul_pd(x1, x1));
    }
    double lane[16];
    _mm512_storeu_pd(lane, a0);
    _mm512_storeu_pd(lane + 8, a1);
    return fx__sumsq_finish(lane, g + i, n - i);
}
