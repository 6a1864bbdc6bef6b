/* The AVX2 optimizer loops: optim_simd.h's AdamW over 8-float vectors, and the sum of
   squares of the gradient norm; called only when fx_get_isa() allows. */
#include "core/simd_avx2.h"
#include "optim_simd.h"

/* sum g^2 over 16 double lanes (element i in lane i % 16), combined as the scalar twin
   does. */
double fx__sumsq_avx2(const float *g, int64_t n)
{
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++) {
            __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(g + i + 4 * j));
            a[j] = _mm256_add_pd(a[j], _mm256_mul_pd(x, x));
        }
    double lane[16];
    for (int j = 0; j < 4; j++)
        _mm256_storeu_pd(lane + 4 * j, a[j]);
    return fx__sumsq_finish(lane, g + i, n - i);
}
