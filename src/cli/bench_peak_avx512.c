/* The AVX-512 register-only FMA loop of bench_fma_peak_gflops(). */
#include "bench_util.h"

#include <immintrin.h>

double bench_fma_loop_avx512(int64_t iters)
{
    /* Distinct starting values: identical chains would be merged into one by the compiler,
       and the loop would time one FMA chain while counting ten. */
    __m512 a0 = _mm512_set1_ps(1.0f), a1 = _mm512_set1_ps(1.1f), a2 = _mm512_set1_ps(1.2f),
           a3 = _mm512_set1_ps(1.3f), a4 = _mm512_set1_ps(1.4f), a5 = _mm512_set1_ps(1.5f),
           a6 = _mm512_set1_ps(1.6f), a7 = _mm512_set1_ps(1.7f), a8 = _mm512_set1_ps(1.8f),
           a9 = _mm512_set1_ps(1.9f);
    const __m512 m = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
    for (int64_t i = 0; i < iters; i++) {
        a0 = _mm512_fmadd_ps(a0, m, c), a1 = _mm512_fmadd_ps(a1, m, c);
        a2 = _mm512_fmadd_ps(a2, m, c), a3 = _mm512_fmadd_ps(a3, m, c);
        a4 = _mm512_fmadd_ps(a4, m, c), a5 = _mm512_fmadd_ps(a5, m, c);
        a6 = _mm512_fmadd_ps(a6, m, c), a7 = _mm512_fmadd_ps(a7, m, c);
        a8 = _mm512_fmadd_ps(a8, m, c), a9 = _mm512_fmadd_ps(a9, m, c);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(_mm512_add_ps(a6, a7), _mm512_add_ps(a8, a9))));
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return 2.0 * 16 * 10 * (double)iters;
}
