/* AVX2 twins of the per-row kernels in lce.c; called only when fx_get_isa() allows. */
#include "lce_internal.h"

#include <immintrin.h>
#include <math.h>

enum { LCE_BLOCK = 1024 }; /* as in lce.c */

/* exp(x), about 1 ulp, as in lce_avx512.c; 2^n is built in the exponent field, so inputs
   below -87.3 (where 2^n would leave the normal range) give 0 explicitly. */
static inline __m256 exp256(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.3365479f);
    const __m256 tiny = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.3762589f), x);
    x = _mm256_max_ps(lo, x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 q = _mm256_set1_ps(1.0f / 720.0f);
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 120.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 24.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f / 6.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(q, _mm256_castsi256_ps(e)));
}

/* tanh(x): the odd Taylor series below 0.55, 1 - 2/(e^2x + 1) above (see lce_avx512.c). */
static inline __m256 tanh256(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(6404582.0f / 10854718875.0f);
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-929569.0f / 638512875.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(21844.0f / 6081075.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1382.0f / 155925.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(62.0f / 2835.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, x2), x, x);
    __m256 e = exp256(_mm256_add_ps(ax, ax));
    __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                               _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    big = _mm256_or_ps(big, _mm256_and_ps(x, sign));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.55f), _CMP_LT_OQ));
}

/* Lanes [0, left) of a vector of 8. */
static inline __m256i tail_mask(int64_t left)
{
    const int l = left >= 8 ? 8 : (int)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(l), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static inline __m256 transform256(__m256 x, const float *bias, int64_t j, __m256i k, float cap, float inv_cap)
{
    if (bias)
        x = _mm256_add_ps(x, _mm256_maskload_ps(bias + j, k));
    if (cap > 0.0f)
        x = _mm256_mul_ps(_mm256_set1_ps(cap), tanh256(_mm256_mul_ps(x, _mm256_set1_ps(inv_cap))));
    return x;
}

static float hmax256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}

static float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static void lce_prep_avx2(float *z, int64_t n, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < n; j += 8) {
        __m256i k = tail_mask(n - j);
        __m256 x = _mm256_maskload_ps(z + j, k);
        _mm256_maskstore_ps(z + j, k, transform256(x, bias, j, k, cap, inv_cap));
    }
}

static void lce_stats_avx2(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const __m256 ninf = _mm256_set1_ps(-INFINITY), zero = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < n; j0 += LCE_BLOCK) {
        const int64_t j1 = j0 + LCE_BLOCK < n ? j0 + LCE_BLOCK : n;
        __m256 vm = ninf, vz = zero;
        for (int64_t j = j0; j < j1; j += 8) {
            __m256i k = tail_mask(j1 - j);
            __m256 x = transform256(_mm256_maskload_ps(z + j, k), bias, j, k, cap, inv_cap);
            _mm256_maskstore_ps(z + j, k, x);
            __m256 on = _mm256_castsi256_ps(k);
            vm = _mm256_max_ps(vm, _mm256_blendv_ps(ninf, x, on));
            vz = _mm256_add_ps(vz, _mm256_and_ps(x, on));
        }
        const float bm = hmax256(vm);
        st->sum_z += (double)hsum256(vz);
        if (bm == -INFINITY)
            continue; /* a block of masked entries adds nothing to the sum of exps */
        if (bm > st->m) {
            st->s *= exp((double)st->m - (double)bm);
            st->m = bm;
        }
        const __m256 m = _mm256_set1_ps(st->m);
        __m256 vs = zero;
        for (int64_t j = j0; j < j1; j += 8) {
            __m256i k = tail_mask(j1 - j);
            __m256 e = exp256(_mm256_sub_ps(_mm256_maskload_ps(z + j, k), m));
            vs = _mm256_add_ps(vs, _mm256_and_ps(e, _mm256_castsi256_ps(k)));
        }
        st->s += (double)hsum256(vs);
    }
}

static void lce_grad_avx2(float *z, int64_t n, float lse, float a, float b, float cap)
{
    const __m256 vl = _mm256_set1_ps(lse), va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    const __m256 one = _mm256_set1_ps(1.0f), vic = _mm256_set1_ps(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t j = 0; j < n; j += 8) {
        __m256i k = tail_mask(n - j);
        __m256 x = _mm256_maskload_ps(z + j, k);
        __m256 g = _mm256_fmsub_ps(va, exp256(_mm256_sub_ps(x, vl)), vb);
        if (cap > 0.0f) {
            __m256 t = _mm256_mul_ps(x, vic);
            g = _mm256_mul_ps(g, _mm256_fnmadd_ps(t, t, one));
        }
        _mm256_maskstore_ps(z + j, k, g);
    }
}

const fx__lce_kernels fx__lce_kernels_avx2 = {lce_stats_avx2, lce_prep_avx2, lce_grad_avx2};

/* ---- per-token statistics and gradients over a vocabulary-major tile (lce_internal.h) ----
   On this path the GEMMs are OpenBLAS's (NULL pointers in the table). */

static inline __m256 transform_row256(__m256 x, const float *bias, int64_t j, float cap, float inv_cap)
{
    if (bias)
        x = _mm256_add_ps(x, _mm256_set1_ps(bias[j]));
    if (cap > 0.0f)
        x = _mm256_mul_ps(_mm256_set1_ps(cap), tanh256(_mm256_mul_ps(x, _mm256_set1_ps(inv_cap))));
    return x;
}

static void lce_stats_t_avx2(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap, float *pm,
                             float *ps, float *pz)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < c; i += 8) {
        const __m256i k = tail_mask(c - i);
        __m256 vm = ninf, vz = _mm256_setzero_ps();
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            const __m256 x = transform_row256(_mm256_maskload_ps(z, k), bias, j, cap, inv_cap);
            _mm256_maskstore_ps(z, k, x);
            vm = _mm256_max_ps(vm, x);
            vz = _mm256_add_ps(vz, x);
        }
        const __m256 m = _mm256_blendv_ps(vm, _mm256_setzero_ps(), _mm256_cmp_ps(vm, ninf, _CMP_EQ_OQ));
        __m256 vs = _mm256_setzero_ps();
        for (int64_t j = 0; j < nj; j++)
            vs = _mm256_add_ps(vs, exp256(_mm256_sub_ps(_mm256_maskload_ps(zt + j * ldz + i, k), m)));
        _mm256_maskstore_ps(pm + i, k, vm);
        _mm256_maskstore_ps(ps + i, k, vs);
        _mm256_maskstore_ps(pz + i, k, vz);
    }
}

static void lce_prep_t_avx2(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < nj; j++) {
        for (int64_t i = 0; i < c; i += 8) {
            const __m256i k = tail_mask(c - i);
            float *z = zt + j * ldz + i;
            _mm256_maskstore_ps(z, k, transform_row256(_mm256_maskload_ps(z, k), bias, j, cap, inv_cap));
        }
    }
}

static void lce_grad_t_avx2(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *lse, const float *a,
                            const float *b, const float *keep, float cap)
{
    const __m256 one = _mm256_set1_ps(1.0f), vic = _mm256_set1_ps(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t i = 0; i < c; i += 8) {
        const __m256i k = tail_mask(c - i);
        const __m256 vl = _mm256_maskload_ps(lse + i, k), va = _mm256_maskload_ps(a + i, k);
        const __m256 vb = _mm256_maskload_ps(b + i, k);
        const __m256 kk = _mm256_cmp_ps(_mm256_maskload_ps(keep + i, k), _mm256_setzero_ps(), _CMP_NEQ_OQ);
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            const __m256 x = _mm256_maskload_ps(z, k);
            __m256 g = _mm256_fmsub_ps(va, exp256(_mm256_sub_ps(x, vl)), vb);
            if (cap > 0.0f) {
                const __m256 t = _mm256_mul_ps(x, vic);
                g = _mm256_mul_ps(g, _mm256_fnmadd_ps(t, t, one));
            }
            _mm256_maskstore_ps(z, k, _mm256_and_ps(g, kk));
        }
    }
}

const fx__lce_ops fx__lce_ops_avx2 = {NULL, lce_stats_t_avx2, lce_prep_t_avx2, lce_grad_t_avx2, NULL, NULL};
