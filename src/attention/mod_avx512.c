/* The expression mods' AVX-512 path: mod_eval.h's loops built for AVX-512, exp / tanh /
   sigmoid and the affine index forms by mod_simd.h over 16-float vectors. */
#include "attention/mod_eval.h"
#include "core/simd_avx512.h"

#define MOD_VNAN(x) _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q)
static inline __m512 mod_pow2k_avx512(__m512 p, __m512 n)
{
    const __m512i k = _mm512_cvtps_epi32(n), k1 = _mm512_srai_epi32(k, 1), k2 = _mm512_sub_epi32(k, k1);
    const __m512i bias = _mm512_set1_epi32(127);
    p = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23)));
    return _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23)));
}
#define MOD_POW2K(p, n) mod_pow2k_avx512(p, n)
typedef __m512i vi; /* int32 lanes */
#define VI_SET1(x) _mm512_set1_epi32(x)
#define VI_IOTA() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_MUL(a, b) _mm512_mullo_epi32(a, b)
#define VI_MAX(a, b) _mm512_max_epi32(a, b)
#define VI_MIN(a, b) _mm512_min_epi32(a, b)
#define VI_TO_PS(a) _mm512_cvtepi32_ps(a)
#define VI_GATHER(p, i) _mm512_i32gather_ps(i, p, 4)
#define VI_REV(x) _mm512_permutexvar_ps(_mm512_setr_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), x)

#include "attention/mod_simd.h"

#define MOD_FN(name) name##_avx512
#include "attention/mod_eval.h"

const fx__mod_kernels fx__mod_kernels_avx512 = {"avx512", run_avx512, score_avx512, score_grad_avx512};
