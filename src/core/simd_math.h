/* The SIMD layer of the vector kernels: one header per width (simd_avx2.h, simd_avx512.h)
   defines, and simd_math.h builds vexp, vexp2 and vtanh on:
     VL                 floats per vector; vf the vector type, vm a lane mask
     V_ZERO() V_SET1(x) V_LOAD(p) V_STORE(p, x) V_ADD V_MUL V_SUB V_FMA(a, b, c) = a*b+c
     V_DIV V_MAX V_MIN V_ABS V_ROUND V_HMAX(x) V_HSUM(x), V_POW2N(p, n) = p * 2^n,
     V_COPYSIGN(y, x) = |y| with the sign of x
     V_LT(a, b) -> vm    a < b lanewise, and V_SEL(m, a, b) = m ? a : b
     V_BITS(x, w)        lanes whose bit in w (low VL bits) is 0 become -inf
     V_FROM_I(i0)        (float)(i0 + lane) for int32 i0
     V_GATHER(t, e)      t[(int)e[lane]] for integral float e
     V_TAIL(n) -> vm     lanes [0, n) (n clamped to VL); V_MLOAD(m, p) loads those lanes (the
                         others 0) and V_MSTORE(p, m, x) stores them, touching no other memory
     V_SUMS(a)           lane n = the sum of a[n]'s lanes, for an array of VL vectors
     V_SQRT(x)           the correctly rounded square root
     V_BF16_LOAD(h), V_BF16_STORE(h, x)   VL bfloat16 values (uint16_t) from and to floats
                         (stores round to nearest even and keep NaN quiet)
     SIMD_FN(name)       name with the path's suffix
   Include only from files built for that width (*_avx2.c, *_avx512.c). */
#ifndef FX_CORE_SIMD_MATH_H
#define FX_CORE_SIMD_MATH_H

#include <math.h>
#include <stdint.h>

/* e^x for x <= 0 (and -inf): 2^n * e^r with |r| <= ln2/2 and a degree-7 Taylor polynomial
   (relative error < 1e-8 before rounding); inputs below -87 give exactly 0 and NaN stays NaN
   (a max returns its second operand when one is NaN). */
static inline vf SIMD_FN(vexp)(vf x)
{
    const vf lo = V_SET1(-87.0f);
    vm tiny = V_LT(x, lo);
    x = V_MAX(lo, x);
    vf n = V_ROUND(V_MUL(x, V_SET1(1.44269504088896341f)));
    vf r = V_FMA(n, V_SET1(-0.693145751953125f), x);
    r = V_FMA(n, V_SET1(-1.428606765330187045e-06f), r);
    vf p = V_SET1(1.0f / 5040.0f);
    p = V_FMA(p, r, V_SET1(1.0f / 720.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 120.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 24.0f));
    p = V_FMA(p, r, V_SET1(1.0f / 6.0f));
    p = V_FMA(p, r, V_SET1(0.5f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_POW2N(p, n);
    return V_SEL(tiny, V_ZERO(), p);
}

/* 2^x for x <= 0 (and -inf): 2^n * 2^r with n = round(x), |r| <= 1/2 and a degree-6
   polynomial fitted to 2^r there (relative error < 2e-9 before rounding; below 8e-8 in
   float32 over [-125, 0], checked every 1e-4); inputs below -125 give exactly 0 and NaN
   stays NaN. 6 multiplies and multiply-adds where vexp takes 10, for kernels that can carry
   their exponents in base 2. */
static inline vf SIMD_FN(vexp2)(vf x)
{
    const vf lo = V_SET1(-125.0f);
    vm tiny = V_LT(x, lo);
    x = V_MAX(lo, x);
    vf n = V_ROUND(x);
    vf r = V_SUB(x, n);
    vf p = V_SET1(1.5345810970757157e-04f);
    p = V_FMA(p, r, V_SET1(1.3399930903688073e-03f));
    p = V_FMA(p, r, V_SET1(9.618489071726799e-03f));
    p = V_FMA(p, r, V_SET1(5.550328642129898e-02f));
    p = V_FMA(p, r, V_SET1(2.4022646248340607e-01f));
    p = V_FMA(p, r, V_SET1(6.931471824645996e-01f));
    p = V_FMA(p, r, V_SET1(1.0f));
    p = V_POW2N(p, n);
    return V_SEL(tiny, V_ZERO(), p);
}

/* tanh(x) given t = e^-2|x| (from the caller's exp): an odd series near 0 (where 1 - t would
   cancel), (1 - t) / (1 + t) elsewhere. */
static inline vf SIMD_FN(vtanh_of)(vf x, vf t)
{
    vf ax = V_ABS(x);
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

/* tanh(x) with vexp's e^-2|x|. */
static inline vf SIMD_FN(vtanh)(vf x)
{
    return SIMD_FN(vtanh_of)(x, SIMD_FN(vexp)(V_MUL(V_ABS(x), V_SET1(-2.0f))));
}

#endif
