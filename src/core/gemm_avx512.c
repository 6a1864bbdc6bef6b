/* The AVX-512 micro-kernel and packing of the float32 GEMM's tiled path (sgemm.h). Called
   only when fx_get_isa() allows AVX-512. */
#include "sgemm.h"
#include "transpose16_avx512.h"

#include <immintrin.h>
#include <math.h>

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

/* Sixteen elements of x from flat index i (masked by m; zeros elsewhere) as float32: the
   operand's element kind is a constant where fx__sgemm_pack_lines is inlined. */
static inline __m512 fx__sgemm_load16(fx__sgemm_mat x, fx__sgemm_elem elem, int64_t i, __mmask16 m)
{
    switch (elem) {
    case FX__SG_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)x.p + i)), 16));
    case FX__SG_F32_AS_BF16:
        return _mm512_castsi512_ps(_mm512_and_si512(fx__bf16_hi(_mm512_maskz_loadu_ps(m, (const float *)x.p + i)),
                                                    _mm512_set1_epi32((int)0xffff0000u)));
    case FX__SG_F32: break;
    }
    return _mm512_maskz_loadu_ps(m, (const float *)x.p + i);
}

/* Lines of x read by a row-by-row packing ahead of the one it copies: rows ld apart are as
   many pages apart when ld is a few thousand floats, where the hardware's prefetchers (which
   follow a stride within a page) stop, and each row's few lines would be fetched at full
   latency. The prefetch touches no memory (an address past x is harmless). */
enum { FX__SG_AHEAD = 8 };

/* The address `bytes` past p, computed as an integer: a prefetch may aim past the array. */
static inline const void *fx__ahead(const void *p, int64_t bytes)
{
    return (const void *)((uintptr_t)p + (uintptr_t)bytes);
}

static inline void fx__sgemm_prefetch16(fx__sgemm_mat x, fx__sgemm_elem elem, int64_t i)
{
    const int64_t size = elem == FX__SG_BF16 ? 2 : 4;
    __builtin_prefetch(fx__ahead(x.p, i * size));
    __builtin_prefetch(fx__ahead(x.p, i * size + 16 * size - 1));
}

static inline __attribute__((always_inline)) void fx__sgemm_pack_lines(float *dst, fx__sgemm_mat x,
                                                                       fx__sgemm_elem elem, int64_t ld, bool lk,
                                                                       int64_t lines, int64_t k0, int64_t kc,
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
            const int64_t at = k0 * ld + l0 + lb;
            for (int64_t k = 0; k < kc; k++) {
                fx__sgemm_prefetch16(x, elem, at + (k + FX__SG_AHEAD) * ld);
                _mm512_mask_storeu_ps(dst + k * width + lb, all, fx__sgemm_load16(x, elem, at + k * ld, m));
            }
        } else { /* sixteen lines by sixteen k, transposed */
            const int64_t at = (l0 + lb) * ld + k0;
            for (int64_t kb = 0; kb < kc; kb += 16) {
                const int64_t nk = kc - kb < 16 ? kc - kb : 16;
                const __mmask16 mk = fx__tail16(nk);
                __m512i r[16];
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    r[i] = i < n ? _mm512_castps_si512(fx__sgemm_load16(x, elem, at + i * ld + kb, mk))
                                 : _mm512_setzero_si512();
                fx__transpose16(r);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++)
                    if (i < nk)
                        _mm512_mask_storeu_epi32(dst + (kb + i) * width + lb, all, r[i]);
            }
        }
    }
}

void fx__sgemm_pack_avx512(float *dst, fx__sgemm_mat x, int64_t ld, bool lk, int64_t lines, int64_t k0, int64_t kc,
                           int64_t width, int64_t q)
{
    switch (x.elem) { /* one copy of the loops per element kind */
    case FX__SG_BF16: fx__sgemm_pack_lines(dst, x, FX__SG_BF16, ld, lk, lines, k0, kc, width, q); return;
    case FX__SG_F32_AS_BF16: fx__sgemm_pack_lines(dst, x, FX__SG_F32_AS_BF16, ld, lk, lines, k0, kc, width, q); return;
    case FX__SG_F32: break;
    }
    fx__sgemm_pack_lines(dst, x, FX__SG_F32, ld, lk, lines, k0, kc, width, q);
}

/* The thin kernel (sgemm.h): the tile's nv vectors of columns held in accumulators, `rows`
   lines of them (24 / nv, or a narrow tile's fewer). The arithmetic of
   fx__sgemm_kernel_avx512, element by element. */
static inline __attribute__((always_inline)) void fx__sgemm_thin_tile(int nv, int rows, int64_t kc, const float *a,
                                                                      int64_t as, int64_t ls, const float *b,
                                                                      float alpha, float beta, float *C, int64_t ldc,
                                                                      int64_t mr, int64_t nr, bool ct)
{
    const int w = 16 * nv;
    __m512 acc[FX__SG_THIN_ACC];
#pragma GCC unroll 24
    for (int i = 0; i < FX__SG_THIN_ACC; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m512 bk[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            bk[v] = _mm512_loadu_ps(b + k * w + 16 * v);
        const float *ak = a + k * as;
        /* Read in place, a k's values side by side: FX__SG_AHEAD k's ahead. (A packed tile's k's
           are at most FX__SG_THIN_ACC values apart, whichever rows the kernel reads of it.) */
        if (ls == 1 && as > FX__SG_THIN_ACC) {
            __builtin_prefetch(fx__ahead(ak, 4 * FX__SG_AHEAD * as));
            __builtin_prefetch(fx__ahead(ak, 4 * (FX__SG_AHEAD * as + rows - 1)));
        }
#pragma GCC unroll 24
        for (int r = 0; r < rows; r++) {
            const __m512 ar = _mm512_set1_ps(ak[r * ls]);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                acc[r * nv + v] = _mm512_fmadd_ps(ar, bk[v], acc[r * nv + v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    if (ct) { /* C [nr, mr] transposed: alpha s through the vector unit, beta C added one by one */
        float t[FX__SG_THIN_ACC * 16];
#pragma GCC unroll 24
        for (int i = 0; i < FX__SG_THIN_ACC; i++)
            _mm512_storeu_ps(t + 16 * i, _mm512_mul_ps(va, acc[i]));
        for (int64_t j = 0; j < nr; j++)
            for (int64_t r = 0; r < mr; r++) {
                const float x = t[r * w + j];
                float *c = C + j * ldc + r;
                *c = beta != 0.0f ? fmaf(beta, *c, x) : x;
            }
        return;
    }
#pragma GCC unroll 24
    for (int r = 0; r < rows; r++) {
        if (r >= mr)
            break;
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            float *c = C + r * ldc + 16 * v;
            const __mmask16 m = fx__tail16(nr - 16 * v);
            __m512 x = _mm512_mul_ps(va, acc[r * nv + v]);
            if (beta != 0.0f)
                x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, c), x);
            _mm512_mask_storeu_ps(c, m, x);
        }
    }
}

void fx__sgemm_thin_kernel_avx512(int64_t kc, const float *a, int64_t as, int64_t ls, const float *b, float alpha,
                                  float beta, float *C, int64_t ldc, int64_t mr, int64_t nr, bool ct)
{
    switch ((nr + 15) / 16) { /* one copy of the loops per width */
    case 1:
        /* only the lines a narrow tile has are read */
        if (mr <= FX__SG_THIN_NARROW / 2)
            fx__sgemm_thin_tile(1, FX__SG_THIN_NARROW / 2, kc, a, as, ls, b, alpha, beta, C, ldc, mr, nr, ct);
        else if (mr <= FX__SG_THIN_NARROW)
            fx__sgemm_thin_tile(1, FX__SG_THIN_NARROW, kc, a, as, ls, b, alpha, beta, C, ldc, mr, nr, ct);
        else
            fx__sgemm_thin_tile(1, FX__SG_THIN_ACC, kc, a, as, ls, b, alpha, beta, C, ldc, mr, nr, ct);
        return;
    case 2: fx__sgemm_thin_tile(2, FX__SG_THIN_ACC / 2, kc, a, as, ls, b, alpha, beta, C, ldc, mr, nr, ct); return;
    default: fx__sgemm_thin_tile(3, FX__SG_THIN_ACC / 3, kc, a, as, ls, b, alpha, beta, C, ldc, mr, nr, ct); return;
    }
}
