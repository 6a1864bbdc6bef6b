/* The AdamW element loops of optim.c (fx__adamw_*_scalar) on the SIMD layer (core/simd_avx2.h
   or core/simd_avx512.h, included first), for optim_avx2.c and optim_avx512.c. Operation for
   operation the scalar loop (multiplies and adds stay separate: ISO C mode does not contract
   them into FMAs), so the results are bitwise those of the scalar twin. */
#ifndef FX_MODEL_OPTIM_SIMD_H
#define FX_MODEL_OPTIM_SIMD_H

#include "model.h"

#include <stdbool.h>

typedef struct SIMD_FN(adamw_v) {
    vf gs, b1, nb1, b2, nb2, lr, bc1, bc2, eps, wd;
} SIMD_FN(adamw_v);

/* VL elements from i on, while whole vectors fit; returns where the scalar tail starts. m and
   v are float, or bfloat16 (uint16_t) when bf16. */
static inline __attribute__((always_inline)) int64_t SIMD_FN(adamw_run)(float *p, float *g, void *m, void *v,
                                                                        int64_t n, const fx__adamw_k *k, bool bf16)
{
    const SIMD_FN(adamw_v) c = {V_SET1(k->gs),  V_SET1(k->b1),  V_SET1(k->nb1), V_SET1(k->b2),  V_SET1(k->nb2),
                                V_SET1(k->lr),  V_SET1(k->bc1), V_SET1(k->bc2), V_SET1(k->eps), V_SET1(k->wd)};
    float *m32 = m, *v32 = v;
    uint16_t *m16 = m, *v16 = v;
    int64_t i = 0;
    for (; i + VL <= n; i += VL) {
        vf mi = bf16 ? V_BF16_LOAD(m16 + i) : V_LOAD(m32 + i);
        vf vi = bf16 ? V_BF16_LOAD(v16 + i) : V_LOAD(v32 + i);
        vf pi = V_LOAD(p + i), gi = V_MUL(V_LOAD(g + i), c.gs);
        mi = V_ADD(V_MUL(c.b1, mi), V_MUL(c.nb1, gi));
        vi = V_ADD(V_MUL(c.b2, vi), V_MUL(V_MUL(c.nb2, gi), gi));
        vf den = V_ADD(V_SQRT(V_DIV(vi, c.bc2)), c.eps);
        vf u = V_ADD(V_DIV(V_DIV(mi, c.bc1), den), V_MUL(c.wd, pi));
        if (bf16) {
            V_BF16_STORE(m16 + i, mi);
            V_BF16_STORE(v16 + i, vi);
        } else {
            V_STORE(m32 + i, mi);
            V_STORE(v32 + i, vi);
        }
        V_STORE(p + i, V_SUB(pi, V_MUL(c.lr, u)));
        if (k->zero_grad)
            V_STORE(g + i, V_ZERO());
    }
    return i;
}

void SIMD_FN(fx__adamw_f32)(float *p, float *g, float *m, float *v, int64_t n, const fx__adamw_k *k)
{
    int64_t i = SIMD_FN(adamw_run)(p, g, m, v, n, k, false);
    if (i < n)
        fx__adamw_f32_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

void SIMD_FN(fx__adamw_bf16)(float *p, float *g, uint16_t *m, uint16_t *v, int64_t n, const fx__adamw_k *k)
{
    int64_t i = SIMD_FN(adamw_run)(p, g, m, v, n, k, true);
    if (i < n)
        fx__adamw_bf16_scalar(p + i, g + i, m + i, v + i, n - i, k);
}

#endif
