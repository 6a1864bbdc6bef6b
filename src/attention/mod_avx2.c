/* The expression mods' AVX2 path: mod_eval.h's loops built for AVX2, exp / tanh / sigmoid and
   the affine index forms by mod_simd.h over 8-float vectors. */
#include "attention/mod_eval.h"
#include "core/simd_avx2.h"

#define MOD_VNAN(x) _mm256_cmp_ps(x, x, _CMP_UNORD_Q)
static inline __m256 mod_pow2k_avx2(__m256 p, __m256 n)
{
    const __m256i k = _mm256_cvtps_epi32(n), k1 = _mm256_srai_epi32(k, 1), k2 = _mm256_sub_epi32(k, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23)));
    return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23)));
}
#define MOD_POW2K(p, n) mod_pow2k_avx2(p, n)
typedef __m256i vi; /* int32 lanes */
#define VI_SET1(x) _mm256_set1_epi32(x)
#define VI_IOTA() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_MUL(a, b) _mm256_mullo_epi32(a, b)
#define VI_MAX(a, b) _mm256_max_epi32(a, b)
#define VI_MIN(a, b) _mm256_min_epi32(a, b)
#define VI_TO_PS(a) _mm256_cvtepi32_ps(a)
#define VI_GATHER(p, i) _mm256_i32gather_ps(p, i, 4)
#define VI_REV(x) _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0))

#include "attention/mod_simd.h"

#define MOD_FN(name) name##_avx2
#include "attention/mod_eval.h"

const fx__mod_kernels fx__mod_kernels_avx2 = {"avx2", run_avx2, score_avx2, score_grad_avx2};
