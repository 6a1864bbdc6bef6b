/* The AVX2 + FMA twins of the matrix-vector kernels (gemv.h): a row at a time, BF16 widened
   by a shift, F16 by F16C. Called only when fx_get_isa() allows. */
#include "core/gemv.h"

#include <immintrin.h>

/* Bytes per element, known at compile time where dt is. */
static inline size_t fx__esz(fx_dtype dt)
{
    return dt == FX_DT_F32 ? 4 : 2;
}

/* Eight elements of a row from p, widened to float32. */
static inline __m256 fx__load8(const void *p, fx_dtype dt)
{
    if (dt == FX_DT_F32)
        return _mm256_loadu_ps(p);
    __m128i h = _mm_loadu_si128(p);
    if (dt == FX_DT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The last n < 8 elements, zero-padded (a zero weight against a zero x adds nothing). */
static inline __m256 fx__load_tail(const void *p, fx_dtype dt, int64_t n)
{
    unsigned char buf[32] = {0};
    __builtin_memcpy(buf, p, (size_t)n * fx__esz(dt));
    return fx__load8(buf, dt);
}

/* The lanes of a + b, summed pairwise in a fixed order. */
static inline float fx__hsum(__m256 a, __m256 b)
{
    __m256 s = _mm256_add_ps(a, b);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}

/* One row: 16 elements into accumulators a and b, then 8 into a, then the tail into b, and
   the lanes summed in a fixed order. Rows go one at a time, so the weights stream through
   memory in order: four rows interleaved (sharing the loads of x) decoded 1.3x slower with
   BF16 weights, their four streams outrunning the prefetchers. */
static inline __attribute__((always_inline)) float fx__row(const unsigned char *w, fx_dtype dt, const float *x,
                                                           int64_t I)
{
    const size_t esz = fx__esz(dt);
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= I; i += 16) {
        a = _mm256_fmadd_ps(fx__load8(w + (size_t)i * esz, dt), _mm256_loadu_ps(x + i), a);
        b = _mm256_fmadd_ps(fx__load8(w + (size_t)(i + 8) * esz, dt), _mm256_loadu_ps(x + i + 8), b);
    }
    if (i + 8 <= I) {
        a = _mm256_fmadd_ps(fx__load8(w + (size_t)i * esz, dt), _mm256_loadu_ps(x + i), a);
        i += 8;
    }
    if (i < I) {
        float xt[8] = {0};
        __builtin_memcpy(xt, x + i, (size_t)(I - i) * sizeof(float));
        b = _mm256_fmadd_ps(fx__load_tail(w + (size_t)i * esz, dt, I - i), _mm256_loadu_ps(xt), b);
    }
    return fx__hsum(a, b);
}

/* One body per dtype, so the inner loop carries no dtype test. */
#define FX__GEMV_ROWS(name, DT)                                                                               \
    static void name(float *y, const unsigned char *w, const float *x, int64_t r0, int64_t r1, int64_t I,     \
                     bool acc)                                                                                \
    {                                                                                                         \
        const size_t stride = (size_t)I * fx__esz(DT);                                                        \
        for (int64_t r = r0; r < r1; r++) {                                                                   \
            const float s = fx__row(w + (size_t)r * stride, DT, x, I);                                        \
            y[r] = acc ? y[r] + s : s;                                                                        \
        }                                                                                                     \
    }
FX__GEMV_ROWS(fx__rows_f32, FX_DT_F32)
FX__GEMV_ROWS(fx__rows_bf16, FX_DT_BF16)
FX__GEMV_ROWS(fx__rows_f16, FX_DT_F16)
#undef FX__GEMV_ROWS

void fx__gemv_rows_avx2(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I,
                        bool acc)
{
    switch (dt) {
    case FX_DT_BF16: fx__rows_bf16(y, w, x, r0, r1, I, acc); break;
    case FX_DT_F16: fx__rows_f16(y, w, x, r0, r1, I, acc); break;
    default: fx__rows_f32(y, w, x, r0, r1, I, acc); break;
    }
}

void fx__widen_avx2(float *dst, const void *src, fx_dtype dt, int64_t n)
{
    const uint16_t *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, fx__load8(s + i, dt));
    for (; i < n; i++)
        dst[i] = dt == FX_DT_BF16 ? fx_bf16_to_f32(s[i]) : fx_f16_to_f32(s[i]);
}
