/* AVX2 twins of RMSNorm's row loops (model.h, fx__rms_ops); called only when fx_get_isa()
   allows. Each gives the plain C loop's bits: the 8 float64 lanes are two vectors of 4
   doubles, and the file is built without contraction (CMakeLists.txt), so a product and a sum
   stay two roundings where the C code has two. Tails are masked: a lane past C is left as it
   was. */
#include "model.h"

#include <immintrin.h>

/* Lanes [0, n) of a mask of eight floats (n clamped to [0, 8]). */
static inline __m256i rms_mask(int64_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx);
}

/* Eight lanes of float64 sums: lanes 0-3 and 4-7. */
typedef struct {
    __m256d lo, hi;
} rms_acc;

/* Eight floats as doubles. */
static inline rms_acc rms_widen(__m256 v)
{
    return (rms_acc){_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))};
}

/* acc + p in the lanes of m (all of them: m NULL), acc elsewhere. */
static inline rms_acc rms_add(rms_acc acc, rms_acc p, const __m256i *m)
{
    const rms_acc s = {_mm256_add_pd(acc.lo, p.lo), _mm256_add_pd(acc.hi, p.hi)};
    if (!m)
        return s;
    const __m256d mlo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(*m)));
    const __m256d mhi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(*m, 1)));
    return (rms_acc){_mm256_blendv_pd(acc.lo, s.lo, mlo), _mm256_blendv_pd(acc.hi, s.hi, mhi)};
}

static inline rms_acc rms_mul(rms_acc a, rms_acc b)
{
    return (rms_acc){_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)};
}

static double rms_lanes(rms_acc acc)
{
    double lane[FX__RMS_LANES];
    _mm256_storeu_pd(lane, acc.lo);
    _mm256_storeu_pd(lane + 4, acc.hi);
    return fx__rms_lanes_sum(lane);
}

static double rms_sumsq(const float *x, int64_t C)
{
    rms_acc acc = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES) {
        const rms_acc v = rms_widen(_mm256_loadu_ps(x + c));
        acc = rms_add(acc, rms_mul(v, v), NULL);
    }
    if (c < C) {
        const __m256i m = rms_mask(C - c);
        const rms_acc v = rms_widen(_mm256_maskload_ps(x + c, m));
        acc = rms_add(acc, rms_mul(v, v), &m);
    }
    return rms_lanes(acc);
}

static double rms_dot3(const float *dy, const float *w, const float *x, int64_t C)
{
    rms_acc acc = {_mm256_setzero_pd(), _mm256_setzero_pd()};
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES) {
        const rms_acc p = rms_mul(rms_mul(rms_widen(_mm256_loadu_ps(dy + c)), rms_widen(_mm256_loadu_ps(w + c))),
                                  rms_widen(_mm256_loadu_ps(x + c)));
        acc = rms_add(acc, p, NULL);
    }
    if (c < C) {
        const __m256i m = rms_mask(C - c);
        const rms_acc p = rms_mul(rms_mul(rms_widen(_mm256_maskload_ps(dy + c, m)), rms_widen(_mm256_maskload_ps(w + c, m))),
                                  rms_widen(_mm256_maskload_ps(x + c, m)));
        acc = rms_add(acc, p, &m);
    }
    return rms_lanes(acc);
}

/* The three float loops: whole vectors, then the tail under a mask. */
static inline __m256 rms_ld(const float *p, int64_t n)
{
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, rms_mask(n));
}

static inline void rms_st(float *p, __m256 v, int64_t n)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else
        _mm256_maskstore_ps(p, rms_mask(n), v);
}

static void rms_scale(float *y, const float *x, float r, const float *w, int64_t C)
{
    const __m256 vr = _mm256_set1_ps(r);
    for (int64_t c = 0; c < C; c += 8)
        rms_st(y + c, _mm256_mul_ps(_mm256_mul_ps(rms_ld(x + c, C - c), vr), rms_ld(w + c, C - c)), C - c);
}

static void rms_dx(float *dx, const float *dy, const float *w, const float *x, float r, float k, int64_t C)
{
    const __m256 vr = _mm256_set1_ps(r), vk = _mm256_set1_ps(k);
    for (int64_t c = 0; c < C; c += 8) {
        const int64_t n = C - c;
        const __m256 a = _mm256_mul_ps(_mm256_mul_ps(vr, rms_ld(dy + c, n)), rms_ld(w + c, n));
        const __m256 d = _mm256_sub_ps(a, _mm256_mul_ps(vk, rms_ld(x + c, n)));
        rms_st(dx + c, _mm256_add_ps(rms_ld(dx + c, n), d), n);
    }
}

static void rms_dw(float *acc, const float *dy, const float *x, float r, int64_t n)
{
    const __m256 vr = _mm256_set1_ps(r);
    for (int64_t c = 0; c < n; c += 8) {
        const __m256 p = _mm256_mul_ps(_mm256_mul_ps(rms_ld(dy + c, n - c), rms_ld(x + c, n - c)), vr);
        rms_st(acc + c, _mm256_add_ps(rms_ld(acc + c, n - c), p), n - c);
    }
}

const fx__rms_ops fx__rms_ops_avx2 = {rms_sumsq, rms_dot3, rms_scale, rms_dx, rms_dw};
