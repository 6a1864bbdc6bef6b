/* The AVX-512 micro-kernel and packing of the float32 GEMM's tiled path (sgemm.h). Called
   only when fx_get_isa() allows AVX-512. */
#include "sgemm.h"
#include "transpose16_avx512.h"

#include <immintrin.h>

void fx__sgemm_kernel_avx512(int64_t kc, const float *a, const float *b, float alpha, float beta, float *C,
                             int64_t ldc, int64_t mr, int64_t nr)
{
    /* The accumulators are indexed by constants only (the loops unrolled), so that they live
       in registers: 24 of the 32, with 2 for b and 1 for a's broadcast. */
    __m512 acc[FX__SG_MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < FX__SG_MR; r++) {
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        /* The tile of C, wanted at the end: fetched while the sums run (a step's C is often
           not in cache, a weight gradient's read and written). */
        if (r < mr) {
            __builtin_prefetch(C + r * ldc, 1, 3);
            __builtin_prefetch(C + r * ldc + nr - 1, 1, 3);
        }
    }
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_loadu_ps(b + k * FX__SG_NR), b1 = _mm512_loadu_ps(b + k * FX__SG_NR + 16);
        const float *ak = a + k * FX__SG_MR;
#pragma GCC unroll 12
        for (int r = 0; r < FX__SG_MR; r++) {
            const __m512 ar = _mm512_set1_ps(ak[r]);
            acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
    const __mmask16 m0 = fx__tail16(nr), m1 = fx__tail16(nr - 16);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 12
    for (int r = 0; r < FX__SG_MR; r++) {
        if (r >= mr)
            break;
        float *c = C + r * ldc;
        __m512 x0 = _mm512_mul_ps(va, acc[r][0]), x1 = _mm512_mul_ps(va, acc[r][1]);
        if (beta != 0.0f) {
            x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), x0);
            x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), x1);
        }
        _mm512_mask_storeu_ps(c, m0, x0);
        _mm512_mask_storeu_ps(c + 16, m1, x1);
    }
}

void fx__sgemm_pack_avx512(float *dst, const float *x, int64_t ld, bool lk, int64_t lines, int64_t k0, int64_t kc,
                           int64_t width, int64_t q)
{
    const int64_t l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    for (int64_t lb = 0; lb < width; lb += 16) {
        const int64_t span = width - lb < 16 ? width - lb : 16, n = nl - lb < span ? nl - lb : span;
        const __mmask16 m = fx__tail16(n), all = fx__tail16(span);
        if (n <= 0) { /* lines past the operand: zeros */
            for (int64_t k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(dst + k * width + lb, all, _mm512_setzero_ps());
        } else if (!lk) { /* a row of x holds sixteen lines of one k */
            const float *s = x + k0 * ld + l0 + lb;
            for (int64_t k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(dst + k * width + lb, all, _mm512_maskz_loadu_ps(m, s + k * ld));
        } else { /* sixteen lines by sixteen k, transposed */
            const float *s = x + (l0 + lb) * ld + k0;
            for (int64_t kb = 0; kb < kc; kb += 16) {
                const int64_t nk = kc - kb < 16 ? kc - kb : 16;
                const __mmask16 mk = fx__tail16(nk);
                __m512i r[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    r[i] = i < n ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mk, s + i * ld + kb)) : _mm512_setzero_si512();
                fx__transpose16(r);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    if (i < nk)
                        _mm512_mask_storeu_epi32(dst + (kb + i) * width + lb, all, r[i]);
            }
        }
    }
}
