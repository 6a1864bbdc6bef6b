/* An 8 x 8 float transpose in AVX registers and the block transpose built on it, shared by
   the AVX2 and AVX-512 forward and backward kernels; include only from *_avx2.c / *_avx512.c
   files. */
#ifndef FX_ATTENTION_TRANSPOSE_H
#define FX_ATTENTION_TRANSPOSE_H

#include <immintrin.h>
#include <stdint.h>

/* dst[c * ldd + r] = src[r * lds + c] for r, c < 8: pairs of rows interleave, then pairs of
   pairs, then the 128-bit halves swap. */
static inline void fx__transpose8(float *dst, int64_t ldd, const float *src, int64_t lds)
{
    __m256 r[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        r[i] = _mm256_loadu_ps(src + i * lds);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
}

/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols. */
static inline void fx__transpose(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                                    int64_t cols)
{
    int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t r = 0; r < r8; r += 8)
        for (int64_t c = 0; c < c8; c += 8)
            fx__transpose8(dst + c * ldd + r, ldd, src + r * lds + c, lds);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = r < r8 ? c8 : 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

#endif
