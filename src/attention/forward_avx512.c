/* The forward's avx512 path. */
#include "attention/internal.h"

int fx__flex_forward_avx512(const fx_attention *a, const float *q, const float *k, const float *v,
                          float *out, float *lse)
{
    return fx__flex_forward_scalar(a, q, k, v, out, lse);
}
