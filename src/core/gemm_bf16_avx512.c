/* The AVX-512 packing of the tiled bfloat16 GEMM (fx__bf16_pack_pairs' contract, bitwise the
   plain-C loop's words): sixteen lines or sixteen pairs per step, float32 operands rounded to
   bfloat16 in registers. Called only when fx_get_isa() allows. */
#include "gemm_bf16.h"

#include "transpose16_avx512.h"

#include <immintrin.h>

/* Pairs [p0, p0 + 16) of a line whose k are contiguous from `at` (flat index of k = 0), as
   sixteen words; zeros past K. */
static inline __m512i fx__line_words16(fx__bf16_mat x, int64_t at, int64_t K, int64_t p0)
{
    const int64_t k0 = 2 * p0, nk = K - k0 < 32 ? K - k0 : 32;
    if (x.bf16) {
        const __mmask32 m = nk >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << nk) - 1u);
        return _mm512_maskz_loadu_epi16(m, (const uint16_t *)x.p + at + k0);
    }
    const float *s = (const float *)x.p + at + k0;
    const __m512i lo = fx__bf16_hi(_mm512_maskz_loadu_ps(fx__tail16(nk), s));
    const __m512i hi = fx__bf16_hi(_mm512_maskz_loadu_ps(fx__tail16(nk - 16 > 0 ? nk - 16 : 0), s + 16));
    /* word i: the high halves of floats 2i and 2i + 1 of the 32 */
    const __m512i odd_halves = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29,
                                                27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(lo, odd_halves, hi);
}

/* Sixteen consecutive elements (masked by m) of a row from flat index `at`, as bfloat16
   values in the low halves of sixteen lanes (zero high halves). */
static inline __m512i fx__row16(fx__bf16_mat x, int64_t at, __mmask16 m)
{
    if (x.bf16)
        return _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x.p + at));
    return _mm512_srli_epi32(fx__bf16_hi(_mm512_maskz_loadu_ps(m, (const float *)x.p + at)), 16);
}

void fx__bf16_pack_pairs_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                                int64_t pairs, int64_t width, int64_t q)
{
    const int64_t K2 = (K + 1) / 2, l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    for (int64_t lb = 0; lb < nl; lb += 16) {
        const int64_t nb = nl - lb < 16 ? nl - lb : 16;
        const __mmask16 m = fx__tail16(nb);
        if (lk) {
            /* Sixteen lines by sixteen pairs: each line's words, transposed into pairs. */
            for (int64_t p0 = 0; p0 < K2; p0 += 16) {
                __m512i r[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    r[i] = i < nb ? fx__line_words16(x, (l0 + lb + i) * ld, K, p0) : _mm512_setzero_si512();
                fx__transpose16(r);
                const int64_t np = K2 - p0 < 16 ? K2 - p0 : 16;
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    if (i < np)
                        _mm512_mask_storeu_epi32(dst + (p0 + i) * width + lb, m, r[i]);
            }
        } else {
            /* Pair p of sixteen lines: rows 2p and 2p + 1 interleaved. */
            for (int64_t p = 0; p < K2; p++) {
                const __m512i lo = fx__row16(x, 2 * p * ld + l0 + lb, m);
                const __m512i hi = 2 * p + 1 < K ? fx__row16(x, (2 * p + 1) * ld + l0 + lb, m) : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(dst + p * width + lb, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
    }
    fx__bf16_pack_pairs_pad(dst, K2, nl, pairs, width);
}

void fx__bf16_pack_rows_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, bool lk, int64_t lines, int64_t K,
                               int64_t pairs, int64_t width, int64_t q)
{
    const int64_t K2 = (K + 1) / 2, l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    if (!lk) {
        /* Lines across the rows: sixteen pairs of sixteen lines (rows 2p and 2p + 1
           interleaved, a vector per pair), transposed into each line's sixteen words. */
        for (int64_t lb = 0; lb < width; lb += 16) {
            const int64_t nb = nl - lb < 16 ? nl - lb : 16, span = width - lb < 16 ? width - lb : 16;
            const __mmask16 m = fx__tail16(nb);
            for (int64_t p0 = 0; p0 < pairs; p0 += FX__AMX_PAIRS) {
                __m512i r[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const int64_t p = p0 + i;
                    if (nb <= 0 || p >= K2) {
                        r[i] = _mm512_setzero_si512();
                        continue;
                    }
                    const __m512i lo = fx__row16(x, 2 * p * ld + l0 + lb, m);
                    const __m512i hi =
                        2 * p + 1 < K ? fx__row16(x, (2 * p + 1) * ld + l0 + lb, m) : _mm512_setzero_si512();
                    r[i] = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
                }
                fx__transpose16(r);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    if (i < span)
                        _mm512_storeu_si512(dst + fx__bf16_row_word(width, lb + i, p0), r[i]);
            }
        }
        return;
    }
    for (int64_t l = 0; l < width; l++) {
        const int64_t n = l < nl ? K2 : 0; /* pairs of data; zeros after them */
        for (int64_t p0 = 0; p0 < pairs; p0 += FX__AMX_PAIRS) /* a line's words of one block */
            _mm512_storeu_si512(dst + fx__bf16_row_word(width, l, p0),
                                p0 < n ? fx__line_words16(x, (l0 + l) * ld, K, p0) : _mm512_setzero_si512());
    }
}

void fx__bf16_pack_pairs_sweep_avx512(uint32_t *dst, fx__bf16_mat x, int64_t ld, int64_t lines, int64_t K,
                                      int64_t pairs, int64_t width, int64_t p0, int64_t p1)
{
    const int64_t panels = (lines + width - 1) / width;
    for (int64_t p = p0; p < p1; p++) {
        const bool lo_in = 2 * p < K, hi_in = 2 * p + 1 < K;
        /* rows 2p and 2p + 1 read front to back, sixteen lines of a panel a step */
        for (int64_t q = 0; q < panels; q++) {
            uint32_t *d = dst + (q * pairs + p) * width;
            for (int64_t lb = 0; lb < width; lb += 16) {
                const int64_t l = q * width + lb, span = width - lb < 16 ? width - lb : 16;
                const int64_t n = lines - l < span ? (lines > l ? lines - l : 0) : span;
                const __mmask16 m = fx__tail16(n), all = fx__tail16(span);
                const __m512i lo = lo_in ? fx__row16(x, 2 * p * ld + l, m) : _mm512_setzero_si512();
                const __m512i hi = hi_in ? fx__row16(x, (2 * p + 1) * ld + l, m) : _mm512_setzero_si512();
                _mm512_mask_storeu_epi32(d + lb, all, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
            }
        }
    }
}
