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

/* ---- GEMM kernels of the fused pass (the layout is described in lce_internal.h) ----------
   Register tiles of 6 x 4 vectors (24 accumulators): each step loads 4 vectors and
   broadcasts 6 scalars for 24 FMAs. The constant tile sizes below are unrolled by the
   compiler, so the accumulators live in registers. */

#define LCE_UNROLL _Pragma("GCC unroll 8")

/* Vectors needed for n lanes (at most 4) and the mask of the last one. */
static inline int nvec(int64_t n) { return n >= 64 ? 4 : (int)((n + 15) / 16); }
static inline __mmask16 last_mask(int64_t n, int nv) { return tail_mask(n - 16 * (nv - 1)); }

/* zt[j, i] for j < JN, i < 16 NV (the last vector masked by km): sum_d w[j, d] hT[d, i]. */
static inline __attribute__((always_inline)) void logits_tile(const int JN, const int NV, int64_t D, const float *w,
                                                              const float *hT, int64_t ldh, float *zt, int64_t ldz,
                                                              __mmask16 km)
{
    __m512 acc[6][4];
    LCE_UNROLL for (int a = 0; a < JN; a++) LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 hv[4];
        LCE_UNROLL for (int v = 0; v < NV; v++) hv[v] = _mm512_loadu_ps(hT + d * ldh + 16 * v);
        LCE_UNROLL for (int a = 0; a < JN; a++)
        {
            const __m512 wb = _mm512_set1_ps(w[a * D + d]);
            LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_fmadd_ps(wb, hv[v], acc[a][v]);
        }
    }
    LCE_UNROLL for (int a = 0; a < JN; a++) LCE_UNROLL for (int v = 0; v < NV; v++)
    {
        if (v == NV - 1)
            _mm512_mask_storeu_ps(zt + a * ldz + 16 * v, km, acc[a][v]);
        else
            _mm512_storeu_ps(zt + a * ldz + 16 * v, acc[a][v]);
    }
}

#define LCE_JN_SWITCH(JN, CALL)                                                                                       \
    switch (JN) {                                                                                                     \
    case 6: CALL(6); break;                                                                                           \
    case 5: CALL(5); break;                                                                                           \
    case 4: CALL(4); break;                                                                                           \
    case 3: CALL(3); break;                                                                                           \
    case 2: CALL(2); break;                                                                                           \
    default: CALL(1); break;                                                                                          \
    }

static void lce_logits_avx512(int64_t nj, int64_t c, int64_t D, const float *w, const float *hT, int64_t ldh,
                              float *zt, int64_t ldz)
{
    for (int64_t i0 = 0; i0 < c; i0 += 64) {
        const int nv = nvec(c - i0);
        const __mmask16 km = last_mask(c - i0, nv);
        for (int64_t j0 = 0; j0 < nj; j0 += 6) {
            const int jn = nj - j0 < 6 ? (int)(nj - j0) : 6;
            const float *wj = w + j0 * D;
            const float *hi = hT + i0;
            float *z = zt + j0 * ldz + i0;
#define LCE_CALL_L(J)                                                                                                 \
    do {                                                                                                              \
        if (nv == 4) logits_tile(J, 4, D, wj, hi, ldh, z, ldz, km);                                                   \
        else if (nv == 3) logits_tile(J, 3, D, wj, hi, ldh, z, ldz, km);                                              \
        else if (nv == 2) logits_tile(J, 2, D, wj, hi, ldh, z, ldz, km);                                              \
        else logits_tile(J, 1, D, wj, hi, ldh, z, ldz, km);                                                           \
    } while (0)
            LCE_JN_SWITCH(jn, LCE_CALL_L)
#undef LCE_CALL_L
        }
    }
}

/* out[a, d + 16 v] (+)= sum_k s[a, k] x[k, d + 16 v] for a < AN, v < NV: the shared shape of
   the dw and dh kernels, with s read at s[a * sa + k * sk] and x rows ldx apart. pf (or NULL):
   a line prefetched into L2 per step, at pf + k * ldp; pf_out: the next 64 columns of the
   output rows prefetched first (past a row's end they touch the next row or nothing: a
   prefetch never faults). */
static inline __attribute__((always_inline)) void bcast_tile(const int AN, const int NV, int64_t K, const float *s,
                                                             int64_t sa, int64_t sk, const float *x, int64_t ldx,
                                                             float *out, int64_t ldo, bool accumulate, __mmask16 km,
                                                             const float *pf, int64_t ldp, bool pf_out)
{
    __m512 acc[6][4];
    /* dw: the next 64 columns of the output rows, which stream from memory. */
    if (pf_out)
        LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < 4; v++)
            _mm_prefetch((const char *)(out + a * ldo + 64 + 16 * v), _MM_HINT_T0);
    LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (pf)
            _mm_prefetch((const char *)(pf + k * ldp), _MM_HINT_T1);
        __m512 xv[4];
        LCE_UNROLL for (int v = 0; v < NV; v++)
        {
            const __mmask16 m = v == NV - 1 ? km : (__mmask16)0xffff;
            xv[v] = _mm512_maskz_loadu_ps(m, x + k * ldx + 16 * v);
        }
        LCE_UNROLL for (int a = 0; a < AN; a++)
        {
            const __m512 sb = _mm512_set1_ps(s[a * sa + k * sk]);
            LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_fmadd_ps(sb, xv[v], acc[a][v]);
        }
    }
    /* The step's sum is added to the output last, so that rounding errors grow with the
       steps (chunks, tiles of rows) rather than with every term. */
    LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < NV; v++)
    {
        const __mmask16 m = v == NV - 1 ? km : (__mmask16)0xffff;
        float *o = out + a * ldo + 16 * v;
        _mm512_mask_storeu_ps(o, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), acc[a][v]) : acc[a][v]);
    }
}

#define LCE_CALL_B(J)                                                                                                 \
    do {                                                                                                              \
        if (nv == 4) bcast_tile(J, 4, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                        \
        else if (nv == 3) bcast_tile(J, 3, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                   \
        else if (nv == 2) bcast_tile(J, 2, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                   \
        else bcast_tile(J, 1, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                                \
    } while (0)

/* dw[j, :] += sum_i g[j, i] h[i, :] for j < nj (g rows ldz apart, i < c). */
static void lce_dw_avx512(int64_t nj, int64_t c, int64_t D, const float *g, int64_t ldz, const float *h, float *dw)
{
    const int64_t K = c, sa = ldz, sk = 1, ldx = D, ldo = D;
    const bool acc = true;
    for (int64_t j0 = 0; j0 < nj; j0 += 6) {
        const int jn = nj - j0 < 6 ? (int)(nj - j0) : 6;
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int nv = nvec(D - d0);
            const __mmask16 km = last_mask(D - d0, nv);
            const float *s = g + j0 * ldz, *x = h + d0, *pf = NULL;
            const bool pf_out = true;
            float *o = dw + j0 * D + d0;
            LCE_JN_SWITCH(jn, LCE_CALL_B)
        }
    }
}

/* dh[i, d] (+)= sum_j g[j, i] w[j, d] for i < c, d in [d0, d1), j < nj. The rows of w are
   taken a slice of columns at a time, a pattern the hardware prefetchers do not follow: the
   first four passes over each slice fetch the same slice of the next nj rows (the caller's
   next step) into L2, a cache line per row per pass. Prefetches past the end of w are
   harmless (they never fault). (Copying each slice to a contiguous block first, against
   the L1 set conflicts of rows 4 KB apart, measured slower.) */
static void lce_dh_avx512(int64_t nj, int64_t c, int64_t D, int64_t d0, int64_t d1, const float *g, int64_t ldz,
                          const float *w, float *dh, bool accumulate)
{
    const int64_t K = nj, sa = 1, sk = ldz, ldx = D, ldo = D;
    const bool acc = accumulate;
    for (int64_t d = d0; d < d1; d += 64) {
        const int nv = nvec(d1 - d);
        const __mmask16 km = last_mask(d1 - d, nv);
        for (int64_t i0 = 0; i0 < c; i0 += 6) {
            const int in = c - i0 < 6 ? (int)(c - i0) : 6;
            const float *s = g + i0, *x = w + d;
            const float *pf = i0 < 4 * 6 ? w + nj * D + d + 16 * (i0 / 6) : NULL;
            const bool pf_out = false;
            float *o = dh + i0 * D + d;
            LCE_JN_SWITCH(in, LCE_CALL_B)
        }
    }
}

/* ---- per-token statistics and gradients over a vocabulary-major tile --------------------- */

/* transform512 with the bias of one vocabulary entry (the same arithmetic). */
static inline __m512 transform_row512(__m512 x, const float *bias, int64_t j, float cap, float inv_cap)
{
    if (bias)
        x = _mm512_add_ps(x, _mm512_set1_ps(bias[j]));
    if (cap > 0.0f)
        x = _mm512_mul_ps(_mm512_set1_ps(cap), tanh512(_mm512_mul_ps(x, _mm512_set1_ps(inv_cap))));
    return x;
}

static void lce_stats_t_avx512(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap, float *pm,
                               float *ps, float *pz)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t i = 0; i < c; i += 16) {
        const __mmask16 k = tail_mask(c - i);
        __m512 vm = _mm512_set1_ps(-INFINITY), vz = _mm512_setzero_ps();
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            const __m512 x = transform_row512(_mm512_maskz_loadu_ps(k, z), bias, j, cap, inv_cap);
            _mm512_mask_storeu_ps(z, k, x);
            vm = _mm512_max_ps(vm, x);
            vz = _mm512_add_ps(vz, x);
        }
        /* A token whose entries are all -inf (masked) sums exp(-inf) = 0. */
        const __m512 m = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(vm, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), vm,
                                              _mm512_setzero_ps());
        __m512 vs = _mm512_setzero_ps();
        for (int64_t j = 0; j < nj; j++)
            vs = _mm512_add_ps(vs, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, zt + j * ldz + i), m)));
        _mm512_mask_storeu_ps(pm + i, k, vm);
        _mm512_mask_storeu_ps(ps + i, k, vs);
        _mm512_mask_storeu_ps(pz + i, k, vz);
    }
}

static void lce_prep_t_avx512(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < nj; j++) {
        for (int64_t i = 0; i < c; i += 16) {
            const __mmask16 k = tail_mask(c - i);
            float *z = zt + j * ldz + i;
            _mm512_mask_storeu_ps(z, k, transform_row512(_mm512_maskz_loadu_ps(k, z), bias, j, cap, inv_cap));
        }
    }
}

static void lce_grad_t_avx512(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *lse, const float *a,
                              const float *b, const float *keep, float cap)
{
    const __m512 one = _mm512_set1_ps(1.0f), vic = _mm512_set1_ps(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t i = 0; i < c; i += 16) {
        const __mmask16 k = tail_mask(c - i);
        const __m512 vl = _mm512_maskz_loadu_ps(k, lse + i), va = _mm512_maskz_loadu_ps(k, a + i);
        const __m512 vb = _mm512_maskz_loadu_ps(k, b + i);
        const __mmask16 kk = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, keep + i), _mm512_setzero_ps(),
                                                     _CMP_NEQ_UQ);
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            const __m512 x = _mm512_maskz_loadu_ps(k, z);
            __m512 g = _mm512_fmsub_ps(va, exp512(_mm512_sub_ps(x, vl)), vb);
            if (cap > 0.0f) {
                const __m512 t = _mm512_mul_ps(x, vic);
                g = _mm512_mul_ps(g, _mm512_fnmadd_ps(t, t, one));
            }
            _mm512_mask_storeu_ps(z, k, _mm512_maskz_mov_ps(kk, g));
        }
    }
}

const fx__lce_ops fx__lce_ops_avx512 = {lce_logits_avx512, lce_stats_t_avx512, lce_prep_t_avx512,
                                        lce_grad_t_avx512, lce_dw_avx512, lce_dh_avx512};
