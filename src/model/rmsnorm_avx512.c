/* AVX-512 twins of RMSNorm's row loops (model.h, fx__rms_ops); called only when fx_get_isa()
   allows. Each gives the plain C loop's bits: a vector of 8 doubles is its 8 lanes, and the
   file is built without contraction (CMakeLists.txt), so a product and a sum stay two
   roundings where the C code has two. Tails are masked: a lane past C is left as it was. */
#include "model.h"

#include <immintrin.h>

static inline __mmask8 rms_tail8(int64_t n) { return (__mmask8)((1u << n) - 1u); }
static inline __mmask16 rms_tail16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* Eight floats from p as doubles (m: which). */
static inline __m512d rms_load8(const float *p, __mmask8 m)
{
    return _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, p));
}

static double rms_sumsq(const float *x, int64_t C)
{
    __m512d acc = _mm512_setzero_pd();
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES) {
        const __m512d v = rms_load8(x + c, 0xff);
        acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
    }
    if (c < C) {
        const __mmask8 m = rms_tail8(C - c);
        const __m512d v = rms_load8(x + c, m);
        acc = _mm512_mask_add_pd(acc, m, acc, _mm512_mul_pd(v, v));
    }
    double lane[FX__RMS_LANES];
    _mm512_storeu_pd(lane, acc);
    return fx__rms_lanes_sum(lane);
}

static double rms_dot3(const float *dy, const float *w, const float *x, int64_t C)
{
    __m512d acc = _mm512_setzero_pd();
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES) {
        const __m512d p = _mm512_mul_pd(_mm512_mul_pd(rms_load8(dy + c, 0xff), rms_load8(w + c, 0xff)),
                                        rms_load8(x + c, 0xff));
        acc = _mm512_add_pd(acc, p);
    }
    if (c < C) {
        const __mmask8 m = rms_tail8(C - c);
        const __m512d p = _mm512_mul_pd(_mm512_mul_pd(rms_load8(dy + c, m), rms_load8(w + c, m)), rms_load8(x + c, m));
        acc = _mm512_mask_add_pd(acc, m, acc, p);
    }
    double lane[FX__RMS_LANES];
    _mm512_storeu_pd(lane, acc);
    return fx__rms_lanes_sum(lane);
}

static void rms_scale(float *y, const float *x, float r, const float *w, int64_t C)
{
    const __m512 vr = _mm512_set1_ps(r);
    for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 m = rms_tail16(C - c);
        _mm512_mask_storeu_ps(y + c, m,
                              _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + c), vr),
                                            _mm512_maskz_loadu_ps(m, w + c)));
    }
}

static void rms_dx(float *dx, const float *dy, const float *w, const float *x, float r, float k, int64_t C)
{
    const __m512 vr = _mm512_set1_ps(r), vk = _mm512_set1_ps(k);
    for (int64_t c = 0; c < C; c += 16) {
        const __mmask16 m = rms_tail16(C - c);
        const __m512 a = _mm512_mul_ps(_mm512_mul_ps(vr, _mm512_maskz_loadu_ps(m, dy + c)), _mm512_maskz_loadu_ps(m, w + c));
        const __m512 d = _mm512_sub_ps(a, _mm512_mul_ps(vk, _mm512_maskz_loadu_ps(m, x + c)));
        _mm512_mask_storeu_ps(dx + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, dx + c), d));
    }
}

static void rms_dw(float *acc, const float *dy, const float *x, float r, int64_t n)
{
    const __m512 vr = _mm512_set1_ps(r);
    for (int64_t c = 0; c < n; c += 16) {
        const __mmask16 m = rms_tail16(n - c);
        const __m512 p = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, dy + c), _mm512_maskz_loadu_ps(m, x + c)), vr);
        _mm512_mask_storeu_ps(acc + c, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, acc + c), p));
    }
}

const fx__rms_ops fx__rms_ops_avx512 = {rms_sumsq, rms_dot3, rms_scale, rms_dx, rms_dw};
