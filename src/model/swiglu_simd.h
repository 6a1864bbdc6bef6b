/* The SwiGLU element loops on the library's SIMD layer (core/simd_avx2.h or
   core/simd_avx512.h, included first): the vector twins of fx__swiglu_*_scalar in
   layers.c, within a few ulp of them (a polynomial exp instead of expf), for the path's
   fx__swiglu_ops. Include only from files built for that width. */
#ifndef FX_MODEL_SWIGLU_SIMD_H
#define FX_MODEL_SWIGLU_SIMD_H

#include "model.h"

/* 1 / (1 + e^-a) from e = e^-|a| (the exp's domain is x <= 0): 1 / (1 + e) for a >= 0,
   e / (1 + e) below. */
static inline vf SIMD_FN(fx__sigmoid)(vf a, vf one)
{
    vf e = SIMD_FN(vexp)(V_MUL(V_ABS(a), V_SET1(-1.0f)));
    vf r = V_DIV(one, V_ADD(one, e));
    return V_SEL(V_LT(a, V_ZERO()), V_MUL(e, r), r);
}

static void SIMD_FN(swiglu_forward)(float *out, const float *a, const float *b, int64_t n)
{
    const vf one = V_SET1(1.0f);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf x = V_LOAD(a + i);
        V_STORE(out + i, V_MUL(V_MUL(x, SIMD_FN(fx__sigmoid)(x, one)), V_LOAD(b + i)));
    }
    fx__swiglu_forward_scalar(out + i, a + i, b + i, n - i);
}

static void SIMD_FN(swiglu_backward)(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n)
{
    const vf one = V_SET1(1.0f);
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf x = V_LOAD(a + i), y = V_LOAD(b + i), d = V_LOAD(dout + i);
        vf s = SIMD_FN(fx__sigmoid)(x, one), silu = V_MUL(x, s);
        vf ds = V_ADD(s, V_MUL(silu, V_SUB(one, s)));
        V_STORE(da + i, V_MUL(V_MUL(d, y), ds));
        V_STORE(db + i, V_MUL(d, silu));
    }
    fx__swiglu_backward_scalar(da + i, db + i, dout + i, a + i, b + i, n - i);
}

#endif
