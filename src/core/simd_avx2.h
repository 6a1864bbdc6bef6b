/* The SIMD layer for AVX2: 8-float vectors (the operations are listed in simd_math.h). */
#ifndef FX_CORE_SIMD_AVX2_H
#define FX_CORE_SIMD_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

typedef __m256 vf;
typedef __m256 vm;
#define VL 8
#define SIMD_FN(name) name##_avx2
#define SIMD_NAME "avx2" /* the kernel tables' name (docs/dispatch.md) */

static inline float hmax_avx2(__m256 x)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Fixed order (halves, then pairs), so the sum is the same on every call. */
static inline float hsum_avx2(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p * 2^n for integral n in [-126, 127]: n added to the exponent field. */
static inline __m256 pow2n_avx2(__m256 p, __m256 n)
{
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}

/* Lanes whose bit in w is clear become -inf. */
static inline __m256 bits_avx2(__m256 x, uint32_t w)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)(w & 0xffu)), sel), sel);
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x, _mm256_castsi256_ps(on));
}

/* Lanes [0, n) set (n clamped to 8). */
static inline __m256 tail_avx2(int64_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx));
}

/* Lane n of the result is the sum of a[n]'s lanes, for 8 vectors. */
static inline __m256 sums_avx2(const __m256 *a)
{
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#define V_ZERO() _mm256_setzero_ps()
#define V_SET1(x) _mm256_set1_ps(x)
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, x) _mm256_storeu_ps(p, x)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_MIN(a, b) _mm256_min_ps(a, b)
#define V_GATHER(t, e) _mm256_i32gather_ps(t, _mm256_cvtps_epi32(e), 4)
#define V_HMAX(x) hmax_avx2(x)
#define V_HSUM(x) hsum_avx2(x)
#define V_LT(a, b) _mm256_cmp_ps(a, b, _CMP_LT_OQ)
#define V_SEL(m, a, b) _mm256_blendv_ps(b, a, m)
#define V_ROUND(x) _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define V_POW2N(p, n) pow2n_avx2(p, n)
#define V_ABS(x) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define V_COPYSIGN(y, x) _mm256_or_ps(y, _mm256_and_ps(x, _mm256_set1_ps(-0.0f)))
#define V_BITS(x, w) bits_avx2(x, w)
#define V_FROM_I(i0)                                                                               \
    _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_set1_epi32(i0), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))
#define V_TAIL(n) tail_avx2(n)
#define V_MLOAD(m, p) _mm256_maskload_ps(p, _mm256_castps_si256(m))
#define V_MSTORE(p, m, x) _mm256_maskstore_ps(p, _mm256_castps_si256(m), x)
#define V_SUMS(a) sums_avx2(a)
#define V_SQRT(x) _mm256_sqrt_ps(x)
#define V_BF16_LOAD(h) bf16_load_avx2(h)
#define V_BF16_STORE(h, x) bf16_store_avx2(h, x)

static inline __m256 bf16_load_avx2(const uint16_t *h)
{
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

/* Nearest even, NaN kept quiet (a quiet bit set), eight at a time. */
static inline void bf16_store_avx2(uint16_t *h, __m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
    /* |u| > 0x7f800000 as a signed compare: |u| has its sign bit clear. */
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* Values fit 16 bits: pack within lanes, then gather the two 64-bit halves. */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)h, _mm256_castsi256_si128(packed));
}

#include "core/simd_math.h"

#endif
