/* The AVX-512 twin of fx__first_nonfinite_f32: 64 floats per step, tested on their
   exponent bits; called only when fx_get_isa() allows. */
#include "core/finite.h"

#include <immintrin.h>

int64_t fx__first_nonfinite_f32_avx512(const float *x, size_t n)
{
    const __m512i em = _mm512_set1_epi32(0x7f800000);
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __mmask16 any = 0;
        for (int j = 0; j < 4; j++) {
            __m512i b = _mm512_and_si512(_mm512_loadu_si512(x + i + 16 * j), em);
            any |= _mm512_cmpeq_epi32_mask(b, em);
        }
        if (any)
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
