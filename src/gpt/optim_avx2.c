/* AVX2 twins of the AdamW element loops in gpt.c (fx__adamw_*_scalar); called only when
   fx_get_isa() allows. Operation for operation the scalar loop (no FMA contraction in ISO C
   mode), so bitwise the same results. */
#include "gpt.h"

#include <immintrin.h>

typedef struct k256 {
    __m256 gs, b1, nb1, b2, nb2, lr, bc1, bc2, eps, wd;
} k256;

static inline k256 fx__k256(const fx__adamw_k *k)
{
    return (k256){_mm256_set1_ps(k->gs),  _mm256_set1_ps(k->b1),  _mm256_set1_ps(k->nb1), _mm256_set1_ps(k->b2),
                  _mm256_set1_ps(k->nb2), _mm256_set1_ps(k->lr),  _mm256_set1_ps(k->bc1), _mm256_set1_ps(k->bc2),
                  _mm256_set1_ps(k->eps), _mm256_set1_ps(k->wd)};
}

static inline __m256 fx__step256(const k256 *k, __m256 p, __m256 g, __m256 *m, __m256 *v)
{
    __m256 gi = _mm256_mul_ps(g, k->gs);
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(k->b1, *m), _mm256_mul_ps(k->nb1, gi));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(k->b2, *v), _mm256_mul_ps(_mm256_mul_ps(k->nb2, gi), gi));
    *m = mi, *v = vi;
    __m256 den = _mm256_add_ps(_mm256_sqrt_ps(_mm256_div_ps(vi, k->bc2)), k->eps);
    __m256 u = _mm256_add_ps(_mm256_div_ps(_mm256_div_ps(mi, k->bc1), den), _mm256_mul_ps(k->wd, p));
    return _mm256_sub_ps(p, _mm256_mul_ps(k->lr, u));
}

void fx__adamw_f32_avx2(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k)
{
    const k256 c = fx__k256(k);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
        __m256 pi = fx__step256(&c, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), &mi, &vi);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
        if (k->zero_grad)
            _mm256_storeu_ps(g + i, _mm256_setzero_ps());
    }
    if (i < n)
        fx__adamw_f32_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

static inline __m256 fx__bf16_load256(const uint16_t *h)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Nearest even, NaN kept quiet: fx__bf16_store in gpt.c, eight at a time. */
static inline void fx__bf16_store256(uint16_t *h, __m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    /* |u| > 0x7f800000 as signed compare: |u| has its sign bit clear. */
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* Values fit 16 bits: pack within lanes, then gather the two 64-bit halves. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)h, _mm256_castsi256_si128(packed));
}

void fx__adamw_bf16_avx2(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k)
{
    const k256 c = fx__k256(k);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 mi = fx__bf16_load256(m + i), vi = fx__bf16_load256(v + i);
        __m256 pi = fx__step256(&c, _mm256_loadu_ps(p + i), _mm256_loadu_ps(g + i), &mi, &vi);
        fx__bf16_store256(m + i, mi);
        fx__bf16_store256(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
        if (k->zero_grad)
            _mm256_storeu_ps(g + i, _mm256_setzero_ps());
    }
    if (i < n)
        fx__adamw_bf16_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

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
