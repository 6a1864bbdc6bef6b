/* AVX-512 twins of the AdamW element loops in gpt.c (fx__adamw_*_scalar); called only when
   fx_get_isa() allows. The arithmetic is the scalar loop's, operation for operation
   (multiplies and adds stay separate: ISO C mode does not contract them into FMAs), so the
   results are bitwise those of the scalar twin. */
#include "gpt.h"

#include <immintrin.h>

typedef struct k512 {
    __m512 gs, b1, nb1, b2, nb2, lr, bc1, bc2, eps, wd;
} k512;

static inline k512 fx__k512(const fx__adamw_k *k)
{
    return (k512){_mm512_set1_ps(k->gs),  _mm512_set1_ps(k->b1),  _mm512_set1_ps(k->nb1), _mm512_set1_ps(k->b2),
                  _mm512_set1_ps(k->nb2), _mm512_set1_ps(k->lr),  _mm512_set1_ps(k->bc1), _mm512_set1_ps(k->bc2),
                  _mm512_set1_ps(k->eps), _mm512_set1_ps(k->wd)};
}

/* One vector of the update: new moments in *m, *v; returns the new parameters. */
static inline __m512 fx__step512(const k512 *k, __m512 p, __m512 g, __m512 *m, __m512 *v)
{
    __m512 gi = _mm512_mul_ps(g, k->gs);
    __m512 mi = _mm512_add_ps(_mm512_mul_ps(k->b1, *m), _mm512_mul_ps(k->nb1, gi));
    __m512 vi = _mm512_add_ps(_mm512_mul_ps(k->b2, *v), _mm512_mul_ps(_mm512_mul_ps(k->nb2, gi), gi));
    *m = mi, *v = vi;
    __m512 den = _mm512_add_ps(_mm512_sqrt_ps(_mm512_div_ps(vi, k->bc2)), k->eps);
    __m512 u = _mm512_add_ps(_mm512_div_ps(_mm512_div_ps(mi, k->bc1), den), _mm512_mul_ps(k->wd, p));
    return _mm512_sub_ps(p, _mm512_mul_ps(k->lr, u));
}

void fx__adamw_f32_avx512(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k)
{
    const k512 c = fx__k512(k);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 mi = _mm512_loadu_ps(m + i), vi = _mm512_loadu_ps(v + i);
        __m512 pi = fx__step512(&c, _mm512_loadu_ps(p + i), _mm512_loadu_ps(g + i), &mi, &vi);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(p + i, pi);
        if (k->zero_grad)
            _mm512_storeu_ps(g + i, _mm512_setzero_ps());
    }
    if (i < n)
        fx__adamw_f32_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

static inline __m512 fx__bf16_load512(const uint16_t *h)
{
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

/* Nearest even, NaN kept quiet: fx__bf16_store in gpt.c, sixteen at a time. */
static inline void fx__bf16_store512(uint16_t *h, __m512 f)
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

void fx__adamw_bf16_avx512(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k)
{
    const k512 c = fx__k512(k);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 mi = fx__bf16_load512(m + i), vi = fx__bf16_load512(v + i);
        __m512 pi = fx__step512(&c, _mm512_loadu_ps(p + i), _mm512_loadu_ps(g + i), &mi, &vi);
        fx__bf16_store512(m + i, mi);
        fx__bf16_store512(v + i, vi);
        _mm512_storeu_ps(p + i, pi);
        if (k->zero_grad)
            _mm512_storeu_ps(g + i, _mm512_setzero_ps());
    }
    if (i < n)
        fx__adamw_bf16_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

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
