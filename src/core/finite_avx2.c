/* The AVX2 twin of fx__first_nonfinite_f32: 32 floats per step, tested on their exponent
   bits; called only when fx_get_isa() allows. */
#include "core/finite.h"

#include <immintrin.h>

int64_t fx__first_nonfinite_f32_avx2(const float *x, size_t n)
{
    const __m256i em = _mm256_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i any = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(x + i + 8 * j)), em);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi32(b, em));
        }
        if (!_mm256_testz_si256(any, any))
            break; /* the scalar tail finds the exact index */
    }
    for (; i < n; i++) {
        uint32_t b;
        __builtin_memcpy(&b, x + i, 4);
        if ((b & 0x7f800000u) == 0x7f800000u)
            return (int64_t)i;
    }
    return -1;
}
