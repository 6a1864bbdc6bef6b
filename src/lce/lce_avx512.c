/* AVX-512 twins of the per-row kernels in lce.c; called only when fx_get_isa() allows. */
#include "lce_internal.h"

#include <immintrin.h>
#include <math.h>

enum { LCE_BLOCK = 1024 }; /* as in lce.c */

/* exp(x), about 1 ulp: x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for exp(r),
   and scalef for 2^n (which also underflows gracefully). NaN stays NaN: min/max return
   their second operand when either is NaN. */
static inline __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(88.7228317f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-103.972084f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 q = _mm512_set1_ps(1.0f / 720.0f);
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 120.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 24.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 6.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(q, n);
}

/* tanh(x): the odd Taylor series below 0.55 (where 1 - 2/(e^2x + 1) would cancel), that
   formula above; a few ulp everywhere. */
static inline __m512 tanh512(__m512 x)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 ax = _mm512_andnot_ps(sign, x);
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(6404582.0f / 10854718875.0f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-929569.0f / 638512875.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(21844.0f / 6081075.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1382.0f / 155925.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(62.0f / 2835.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
    __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);
    __m512 e = exp512(_mm512_add_ps(ax, ax));
    __m512 big = _mm512_sub_ps(_mm512_set1_ps(1.0f),
                               _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
    big = _mm512_or_ps(big, _mm512_and_ps(x, sign));
    __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.55f), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(is_small, big, small);
}

static inline __m512 transform512(__m512 x, const float *bias, int64_t j, __mmask16 k, float cap, float inv_cap)
{
    if (bias)
        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(k, bias + j));
    if (cap > 0.0f)
        x = _mm512_mul_ps(_mm512_set1_ps(cap), tanh512(_mm512_mul_ps(x, _mm512_set1_ps(inv_cap))));
    return x;
}

static inline __mmask16 tail_mask(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1); }

static void lce_prep_avx512(float *z, int64_t n, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 x = _mm512_maskz_loadu_ps(k, z + j);
        _mm512_mask_storeu_ps(z + j, k, transform512(x, bias, j, k, cap, inv_cap));
    }
}

static void lce_stats_avx512(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += LCE_BLOCK) {
        const int64_t j1 = j0 + LCE_BLOCK < n ? j0 + LCE_BLOCK : n;
        __m512 vm = _mm512_set1_ps(-INFINITY), vz = _mm512_setzero_ps();
        for (int64_t j = j0; j < j1; j += 16) {
            __mmask16 k = tail_mask(j1 - j);
            __m512 x = transform512(_mm512_maskz_loadu_ps(k, z + j), bias, j, k, cap, inv_cap);
            _mm512_mask_storeu_ps(z + j, k, x);
            vm = _mm512_mask_max_ps(vm, k, vm, x);
            vz = _mm512_mask_add_ps(vz, k, vz, x);
        }
        const float bm = _mm512_reduce_max_ps(vm);
        st->sum_z += (double)_mm512_reduce_add_ps(vz);
        if (bm == -INFINITY)
            continue; /* a block of masked entries adds nothing to the sum of exps */
        if (bm > st->m) {
            st->s *= exp((double)st->m - (double)bm);
            st->m = bm;
        }
        const __m512 m = _mm512_set1_ps(st->m);
        __m512 vs = _mm512_setzero_ps();
        for (int64_t j = j0; j < j1; j += 16) {
            __mmask16 k = tail_mask(j1 - j);
            __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, z + j), m));
            vs = _mm512_mask_add_ps(vs, k, vs, e);
        }
        st->s += (double)_mm512_reduce_add_ps(vs);
    }
}

static void lce_grad_avx512(float *z, int64_t n, float lse, float a, float b, float cap)
{
    const __m512 vl = _mm512_set1_ps(lse), va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
    const __m512 one = _mm512_set1_ps(1.0f), vic = _mm512_set1_ps(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 x = _mm512_maskz_loadu_ps(k, z + j);
        __m512 g = _mm512_fmsub_ps(va, exp512(_mm512_sub_ps(x, vl)), vb);
        if (cap > 0.0f) {
            __m512 t = _mm512_mul_ps(x, vic);
            g = _mm512_mul_ps(g, _mm512_fnmadd_ps(t, t, one));
        }
        _mm512_mask_storeu_ps(z + j, k, g);
    }
}

const fx__lce_kernels fx__lce_kernels_avx512 = {lce_stats_avx512, lce_prep_avx512, lce_grad_avx512};
