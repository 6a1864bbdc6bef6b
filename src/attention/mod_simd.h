/* The expression mods' vectorised exp, tanh and sigmoid (mod_eval.h gives their scalar twins,
   whose bits they give lane for lane: the same fmaf, multiplies, divides and selects in the
   same order). Included by mod_avx2.c and mod_avx512.c after core/simd_<isa>.h and
   mod_eval.h, with MOD_VNAN(x) (the lanes that are NaN, as a vm) and MOD_POW2K(p, n) (p * 2^k1
   * 2^k2 for k = n, k1 = k >> 1, k2 = k - k1, each factor built from its exponent bits) and
   the int32 lanes vi (VI_SET1, VI_IOTA, VI_ADD, VI_MUL, VI_MAX, VI_MIN, VI_TO_PS, VI_GATHER, and VI_REV: a float
   vector's lanes in reverse order)
   defined. */
#ifndef FLEXC_ATTENTION_MOD_SIMD_H
#define FLEXC_ATTENTION_MOD_SIMD_H

#include "core/simd_math.h"

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

/* simd_math.h's tanh formula over this file's exp (whose bits the scalar twin gives). */
static inline vf SIMD_FN(mod_tanh)(vf x)
{
    return SIMD_FN(vtanh_of)(x, SIMD_FN(mod_exp)(V_MUL(V_ABS(x), V_SET1(-2.0f))));
}

static inline vf SIMD_FN(mod_sigmoid)(vf x)
{
    vf one = V_SET1(1.0f);
    return V_DIV(one, V_ADD(one, SIMD_FN(mod_exp)(V_SUB(V_ZERO(), x))));
}

/* The affine forms (O_FAFF, O_GATHER_AFF of a float32 tensor) in int32 lanes, when every value
   the int64 loop would compute for these positions fits: a + i * kv is then linear between its
   ends without wrapping, int32 arithmetic (wrapping) gives it exactly, clamping by bounds
   saturated to int32 gives what clamping by the bounds gives (a value in range and the final
   clamp to [0, top]), and the flat index is below numel. */
static inline bool SIMD_FN(mod_i32)(int64_t u0, int64_t c, int64_t n)
{
    const int64_t lim = (int64_t)1 << 31;
    if (c <= -lim || c >= lim || u0 < -lim || u0 >= lim)
        return false;
    const int64_t u1 = u0 + c * (n - 1);
    return u1 >= -lim && u1 < lim;
}
static inline int32_t SIMD_FN(mod_sat32)(int64_t x)
{
    return x < INT32_MIN ? INT32_MIN : x > INT32_MAX ? INT32_MAX : (int32_t)x;
}

/* clamp(clamp(v, lo, hi), 0, top), as the loops of O_GATHER_AFF compute it. */
static inline int64_t SIMD_FN(mod_clamp2)(int64_t v, int64_t lo, int64_t hi, int64_t top)
{
    v = v > lo ? v : lo;
    v = v < hi ? v : hi;
    return v < 0 ? 0 : v > top ? top : v;
}

/* The instructions done here by hand (the tails by the scalar twins); false for the others. */
static inline bool SIMD_FN(mod_vec_op)(const fx__mod_ins *I, fx__mod_slot *R, int64_t n, const fx__mod_env *e)
{
    float *restrict d = I->dst == FX__MOD_OUT ? e->o : R[I->dst].f;
    const float *restrict a = R[I->a < 0 ? 0 : I->a].f;
    int64_t j = 0;
    switch (I->op) {
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
    case O_FAFF: {
        const int64_t c = I->i, u0 = fx__mod_wrap_add(R[I->a].i[0], fx__mod_wrap_mul(c, e->kv0));
        if (!SIMD_FN(mod_i32)(u0, c, n))
            return false;
        const vi vc = VI_SET1((int32_t)c), step = VI_SET1((int32_t)(c * VL));
        vi u = VI_ADD(VI_SET1((int32_t)u0), VI_MUL(vc, VI_IOTA()));
        for (; j + VL <= n; j += VL, u = VI_ADD(u, step))
            V_STORE(d + j, VI_TO_PS(u));
        for (; j < n; j++)
            d[j] = (float)(u0 + c * j);
        return true;
    }
    case O_GATHER_AFF: {
        const fx__mod_tensor *t = &e->t[I->t];
        const int64_t c = I->i, u0 = fx__mod_wrap_add(R[I->a].i[0], fx__mod_wrap_mul(c, e->kv0));
        if (t->dtype != FX_DT_F32 || t->numel > INT32_MAX || !SIMD_FN(mod_i32)(u0, c, n))
            return false;
        const int64_t lo = R[I->b].i[0], hi = R[I->c].i[0], off = R[I->d].i[0];
        const int64_t top = t->shape[I->dim] - 1, st = t->stride[I->dim];
        const float *p = t->data;
        const vi vc = VI_SET1((int32_t)c), step = VI_SET1((int32_t)(c * VL));
        const vi vlo = VI_SET1(SIMD_FN(mod_sat32)(lo)), vhi = VI_SET1(SIMD_FN(mod_sat32)(hi));
        const vi vzero = VI_SET1(0), vtop = VI_SET1((int32_t)top), vst = VI_SET1((int32_t)st);
        const vi voff = VI_SET1((int32_t)off);
#define W_AT(j) SIMD_FN(mod_clamp2)(u0 + c * (j), lo, hi, top)
        /* With unit steps the clamped index is monotone and moves by at most one a lane: a
           vector whose end lanes are equal is one element, one whose ends are VL - 1 apart is
           VL consecutive ones (reversed when c = -1); the others (the clamps' edges) gather. */
        const bool unit = st == 1 && (c == 1 || c == -1);
        vi u = VI_ADD(VI_SET1((int32_t)u0), VI_MUL(vc, VI_IOTA()));
        for (; j + VL <= n; j += VL, u = VI_ADD(u, step)) {
            if (unit) {
                const int64_t w0 = W_AT(j), w1 = W_AT(j + VL - 1);
                if (w0 == w1) {
                    V_STORE(d + j, V_SET1(p[off + w0]));
                    continue;
                }
                if (w1 - w0 == c * (VL - 1)) {
                    V_STORE(d + j, c > 0 ? V_LOAD(p + off + w0) : VI_REV(V_LOAD(p + off + w1)));
                    continue;
                }
            }
            vi w = VI_MIN(VI_MAX(u, vlo), vhi);
            w = VI_MIN(VI_MAX(w, vzero), vtop);
            V_STORE(d + j, VI_GATHER(p, VI_ADD(voff, VI_MUL(w, vst))));
        }
        for (; j < n; j++)
            d[j] = p[off + W_AT(j) * st];
#undef W_AT
        return true;
    }
    default:
        return false;
    }
}

#define MOD_VEC_OP SIMD_FN(mod_vec_op)

#endif
