/* The vector twins of lce.c's per-row kernels (fx__lce_row_kernels) and of the statistics and
   gradients over a vocabulary-major tile (fx__lce_tile_kernels), written once over the SIMD layer
   (core/simd_avx2.h or core/simd_avx512.h, included first; see core/simd_math.h) and
   included by lce_avx2.c and lce_avx512.c. Every exponent here is of a value <= 0 (logits
   minus their max or their log-sum-exp), the domain of vexp. */
#ifndef FX_LCE_SIMD_H
#define FX_LCE_SIMD_H

#include "lce_internal.h"

#include <float.h>
#include <math.h>

enum { LCE_BLOCK = 1024 }; /* as in lce.c */

/* The soft cap, cap tanh(x / cap), when cap > 0. */
static inline vf SIMD_FN(lce_cap)(vf x, float cap, float inv_cap)
{
    return cap > 0.0f ? V_MUL(V_SET1(cap), SIMD_FN(vtanh)(V_MUL(x, V_SET1(inv_cap)))) : x;
}

/* g (1 - t^2) with t = x / cap: the soft cap's derivative, when cap > 0. */
static inline vf SIMD_FN(lce_cap_grad)(vf g, vf x, float cap, vf inv_cap)
{
    if (cap <= 0.0f)
        return g;
    const vf t = V_MUL(x, inv_cap);
    return V_MUL(g, V_FMA(V_SUB(V_ZERO(), t), t, V_SET1(1.0f)));
}

/* ---- one row of a token-major tile (fx__lce_row_kernels) ---- */

static void SIMD_FN(lce_prep)(float *z, int64_t n, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < n; j += VL) {
        const vm k = V_TAIL(n - j);
        vf x = V_MLOAD(k, z + j);
        if (bias)
            x = V_ADD(x, V_MLOAD(k, bias + j));
        V_MSTORE(z + j, k, SIMD_FN(lce_cap)(x, cap, inv_cap));
    }
}

static void SIMD_FN(lce_stats)(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const vf ninf = V_SET1(-INFINITY);
    for (int64_t j0 = 0; j0 < n; j0 += LCE_BLOCK) {
        const int64_t j1 = j0 + LCE_BLOCK < n ? j0 + LCE_BLOCK : n;
        vf vmax = ninf, vz = V_ZERO();
        for (int64_t j = j0; j < j1; j += VL) {
            const vm k = V_TAIL(j1 - j);
            vf x = V_MLOAD(k, z + j);
            if (bias)
                x = V_ADD(x, V_MLOAD(k, bias + j));
            x = SIMD_FN(lce_cap)(x, cap, inv_cap);
            V_MSTORE(z + j, k, x);
            vmax = V_MAX(vmax, V_SEL(k, x, ninf));
            vz = V_ADD(vz, V_SEL(k, x, V_ZERO()));
        }
        const float bm = V_HMAX(vmax);
        st->sum_z += (double)V_HSUM(vz);
        if (bm == -INFINITY)
            continue; /* a block of masked entries adds nothing to the sum of exps */
        if (bm > st->m) {
            st->s *= exp((double)st->m - (double)bm);
            st->m = bm;
        }
        const vf m = V_SET1(st->m);
        vf vs = V_ZERO();
        for (int64_t j = j0; j < j1; j += VL) {
            const vm k = V_TAIL(j1 - j);
            vs = V_ADD(vs, V_SEL(k, SIMD_FN(vexp)(V_SUB(V_MLOAD(k, z + j), m)), V_ZERO()));
        }
        st->s += (double)V_HSUM(vs);
    }
}

static void SIMD_FN(lce_grad)(float *z, int64_t n, float lse, float a, float b, float cap)
{
    const vf vl = V_SET1(lse), va = V_SET1(a), nb = V_SET1(-b);
    const vf vic = V_SET1(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t j = 0; j < n; j += VL) {
        const vm k = V_TAIL(n - j);
        const vf x = V_MLOAD(k, z + j);
        const vf g = V_FMA(va, SIMD_FN(vexp)(V_SUB(x, vl)), nb);
        V_MSTORE(z + j, k, SIMD_FN(lce_cap_grad)(g, x, cap, vic));
    }
}

/* ---- a vocabulary-major tile, vectors across tokens (fx__lce_tile_kernels) ---- */

static void SIMD_FN(lce_stats_t)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap,
                                 float *pm, float *ps, float *pz)
{
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t i = 0; i < c; i += VL) {
        const vm k = V_TAIL(c - i);
        vf vmax = V_SET1(-INFINITY), vz = V_ZERO();
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            vf x = V_MLOAD(k, z);
            if (bias)
                x = V_ADD(x, V_SET1(bias[j]));
            x = SIMD_FN(lce_cap)(x, cap, inv_cap);
            V_MSTORE(z, k, x);
            vmax = V_MAX(vmax, x);
            vz = V_ADD(vz, x);
        }
        /* A token whose entries are all -inf (masked) sums exp(-inf) = 0. */
        const vf m = V_SEL(V_LT(vmax, V_SET1(-FLT_MAX)), V_ZERO(), vmax);
        vf vs = V_ZERO();
        for (int64_t j = 0; j < nj; j++)
            vs = V_ADD(vs, SIMD_FN(vexp)(V_SUB(V_MLOAD(k, zt + j * ldz + i), m)));
        V_MSTORE(pm + i, k, vmax);
        V_MSTORE(ps + i, k, vs);
        V_MSTORE(pz + i, k, vz);
    }
}

static void SIMD_FN(lce_prep_t)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *bias, float cap)
{
    if (!bias && cap <= 0.0f)
        return;
    const float inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    for (int64_t j = 0; j < nj; j++) {
        const vf bj = V_SET1(bias ? bias[j] : 0.0f);
        for (int64_t i = 0; i < c; i += VL) {
            const vm k = V_TAIL(c - i);
            float *z = zt + j * ldz + i;
            vf x = V_MLOAD(k, z);
            if (bias)
                x = V_ADD(x, bj);
            V_MSTORE(z, k, SIMD_FN(lce_cap)(x, cap, inv_cap));
        }
    }
}

static void SIMD_FN(lce_grad_t)(float *zt, int64_t nj, int64_t c, int64_t ldz, const float *lse, const float *a,
                                const float *b, const float *keep, float cap)
{
    const vf vic = V_SET1(cap > 0.0f ? 1.0f / cap : 0.0f);
    for (int64_t i = 0; i < c; i += VL) {
        const vm k = V_TAIL(c - i);
        const vf vl = V_MLOAD(k, lse + i), va = V_MLOAD(k, a + i);
        const vf nb = V_SUB(V_ZERO(), V_MLOAD(k, b + i));
        /* Dropped tokens get exact zeros, whatever their (unused) lse holds. */
        const vm kept = V_LT(V_ZERO(), V_ABS(V_MLOAD(k, keep + i)));
        for (int64_t j = 0; j < nj; j++) {
            float *z = zt + j * ldz + i;
            const vf x = V_MLOAD(k, z);
            const vf g = V_FMA(va, SIMD_FN(vexp)(V_SUB(x, vl)), nb);
            V_MSTORE(z, k, V_SEL(kept, SIMD_FN(lce_cap_grad)(g, x, cap, vic), V_ZERO()));
        }
    }
}

#endif
