/* The AVX2 loops of the bfloat16 GEMM: packing (widening, or rounding float32 to bfloat16) and
   float32 -> bfloat16 conversion; bitwise the results of the scalar loops in gemm_bf16.c.
   Called only when fx_get_isa() allows. */
#include "gemm_bf16.h"
#include "simd_avx2.h"

/* Eight floats rounded to bfloat16 and back: nearest even, NaN kept quiet (bf16_store_avx2's
   rounding, without the narrowing). */
static inline __m256 fx__round8(__m256 f)
{
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

void fx__bf16_pack_avx2(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * cols;
        int64_t c = 0;
        if (src.bf16) {
            const uint16_t *s = (const uint16_t *)src.p + r * ld;
            for (; c + 8 <= cols; c += 8)
                _mm256_storeu_ps(d + c, bf16_load_avx2(s + c));
            for (; c < cols; c++)
                d[c] = fx__bf16_to_f32(s[c]);
        } else {
            const float *s = (const float *)src.p + r * ld;
            for (; c + 8 <= cols; c += 8)
                _mm256_storeu_ps(d + c, fx__round8(_mm256_loadu_ps(s + c)));
            for (; c < cols; c++)
                d[c] = fx__bf16_round(s[c]);
        }
    }
}

void fx__f32_to_bf16_n_avx2(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        bf16_store_avx2(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; i++)
        dst[i] = fx__f32_to_bf16(src[i]);
}
