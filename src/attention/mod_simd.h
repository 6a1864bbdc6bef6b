/* The expression mods' vectorised exp, tanh and sigmoid (mod_eval.h gives their scalar twins,
   whose bits they give lane for lane: the same fmaf, multiplies, divides and selects in the
   same order). Included by mod_avx2.c and mod_avx512.c after core/simd_<isa>.h and
   mod_eval.h, with MOD_VNAN(x) (the lanes that are NaN, as a vm) and MOD_POW2K(p, n) (p * 2^k1
   * 2^k2 for k = n, k1 = k >> 1, k2 = k - k1, each factor built from its exponent bits)
   defined. */
#ifndef FLEXC_ATTENTION_MOD_SIMD_H
#define FLEXC_ATTENTION_MOD_SIMD_H

static inline vf SIMD_FN(mod_exp)(vf x)
{
    vf xc = V_MAX(V_SET1(FX__MOD_EXP_LO), x); /* maxps(lo, x): x when it is NaN */
    xc = V_MIN(V_SET1(FX__MOD_EXP_HI), xc);
    vf n = V_ROUND(V_MUL(xc, V_SET1(FX__MOD_LOG2E)));
    vf r = V_FMA(n, V_SET1(-FX__MOD_LN2HI), xc);
    r = V_FMA(n, V_SET1(-FX__MOD_LN2LO), r);
    vf p = V_SET1(1.0f / 5040.0f);
    p = V_FMA(p, r, V_SET1(1.0f / 720.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 120.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 24.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 6.0f));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = MOD_POW2K(p, n);
    p = V_SEL(V_LT(x, V_SET1(FX__MOD_EXP_LO)), V_ZERO(), p);
    return V_SEL(MOD_VNAN(x), x, p);
}

static inline vf SIMD_FN(mod_tanh)(vf x)
{
    vf ax = V_ABS(x);
    vf t = SIMD_FN(mod_exp)(V_MUL(ax, V_SET1(-2.0f)));
    vf big = V_DIV(V_SUB(V_SET1(1.0f), t), V_ADD(V_SET1(1.0f), t));
    vf x2 = V_MUL(ax, ax);
    vf p = V_SET1(-17.0f / 315.0f);
    p = V_FMA(p, x2, V_SET1(2.0f / 15.0f));
    p = V_FMA(p, x2, V_SET1(-1.0f / 3.0f));
    p = V_FMA(p, x2, V_SET1(1.0f));
    vf small = V_MUL(p, ax);
    vf y = V_SEL(V_LT(ax, V_SET1(0.0625f)), small, big);
    return V_COPYSIGN(y, x);
}

static inline vf SIMD_FN(mod_sigmoid)(vf x)
{
    vf one = V_SET1(1.0f);
    return V_DIV(one, V_ADD(one, SIMD_FN(mod_exp)(V_SUB(V_ZERO(), x))));
}

/* exp, tanh and sigmoid over n floats (the tail by the scalar twins); false for other ops. */
static inline bool SIMD_FN(mod_vec_math)(int op, float *restrict d, const float *restrict a, int64_t n)
{
    int64_t j = 0;
    switch (op) {
    case O_EXP:
        for (; j + VL <= n; j += VL)
            V_STORE(d + j, SIMD_FN(mod_exp)(V_LOAD(a + j)));
        for (; j < n; j++)
            d[j] = fx__mod_exp(a[j]);
        return true;
    case O_TANH:
        for (; j + VL <= n; j += VL)
            V_STORE(d + j, SIMD_FN(mod_tanh)(V_LOAD(a + j)));
        for (; j < n; j++)
            d[j] = fx__mod_tanh(a[j]);
        return true;
    case O_SIGMOID:
        for (; j + VL <= n; j += VL)
            V_STORE(d + j, SIMD_FN(mod_sigmoid)(V_LOAD(a + j)));
        for (; j < n; j++)
            d[j] = fx__mod_sigmoid(a[j]);
        return true;
    default:
        return false;
    }
}

#define MOD_VEC_MATH SIMD_FN(mod_vec_math)

#endif
