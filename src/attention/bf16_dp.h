/* The attention's bfloat16 operands and products (bf16.h) with AVX512-BF16 intrinsics:
   sixteen floats rounded a step, and a 4 x 64 vdpbf16ps micro-kernel. Written with the
   intrinsics' names only, so that one body serves two builds: the library's
   (bf16_avx512bf16.c, compiled with -mavx512bf16, run where the CPU has the instruction)
   and the tests' (tests/attention_bf16_simde.c, SIMDe's portable definitions, any CPU).
   Define FX__ATTN16_TABLE to the table's name before including (and FX__A16_MASK to SIMDe's
   name of __mmask16, which it does not alias). */
#ifndef FX__ATTN16_TABLE
#error "define FX__ATTN16_TABLE before including attention/bf16_dp.h"
#endif
#ifndef FX__A16_MASK
#define FX__A16_MASK __mmask16
#endif

#include "attention/bf16.h"

typedef FX__A16_MASK a16_mask;

/* The bfloat16 values of sixteen floats, nearest even (NaN kept quiet, as fx__f32_to_bf16),
   in the low halves of sixteen lanes. */
static inline __m512i a16_round16(__m512 f)
{
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const a16_mask nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000)); /* abs < 2^31 */
    return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
}

static inline a16_mask a16_tail16(int64_t n) { return n >= 16 ? (a16_mask)0xffff : (a16_mask)((1u << n) - 1u); }

static void a16_rows(uint32_t *dst, int64_t ldw, const float *src, int64_t lds, int64_t rows, int64_t cols)
{
    const int64_t words = (cols + 1) / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c += 32) {
            const float *s = src + r * lds + c;
            const __m512i lo = a16_round16(_mm512_maskz_loadu_ps(a16_tail16(cols - c), s));
            const __m512i hi =
                a16_round16(_mm512_maskz_loadu_ps(a16_tail16(cols - c > 16 ? cols - c - 16 : 0), s + 16));
            /* 32 values in order are 16 words: (c, c + 1) in word c / 2 */
            const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(lo)),
                                                 _mm512_cvtepi32_epi16(hi), 1);
            _mm512_mask_storeu_epi32(dst + r * ldw + c / 2, a16_tail16(words - c / 2), w);
        }
}

static void a16_pairs(uint32_t *dst, int64_t ldw, const float *src, int64_t lds, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r += 2)
        for (int64_t c = 0; c < cols; c += 16) {
            const a16_mask m = a16_tail16(cols - c);
            const __m512i lo = a16_round16(_mm512_maskz_loadu_ps(m, src + r * lds + c));
            const __m512i hi =
                r + 1 < rows ? a16_round16(_mm512_maskz_loadu_ps(m, src + (r + 1) * lds + c)) : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(dst + r / 2 * ldw + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
}

enum { MR = 4, NV = 4 };

/* C [mr, 16 nv] block of mm; `last` holds the lanes of the last vector, whole when `full`.
   Unrolled over constant mr and nv so that the accumulators stay in registers. */
static inline __attribute__((always_inline)) void a16_mk(float *C, int64_t ldc, const uint32_t *A, int64_t sa_m,
                                                        int64_t sa_k, const uint32_t *B, int64_t ldb, int mr, int nv,
                                                        bool full, a16_mask last, int64_t np, float alpha, bool acc)
{
#define LD_(v, p) (full || (v) < nv - 1 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(last, p))
    __m512 c[MR][NV];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            c[i][v] = acc ? LD_(v, C + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t p = 0; p < np; p++) {
        __m512bh b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            b[v] = (__m512bh)(full || v < nv - 1 ? _mm512_loadu_si512((const void *)(B + p * ldb + 16 * v))
                                                 : _mm512_maskz_loadu_epi32(last, B + p * ldb + 16 * v));
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[i * sa_m + p * sa_k]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                c[i][v] = _mm512_dpbf16_ps(c[i][v], a, b[v]);
        }
    }
    const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            const __m512 x = acc ? c[i][v] : _mm512_mul_ps(c[i][v], al);
            if (full || v < nv - 1)
                _mm512_storeu_ps(C + i * ldc + 16 * v, x);
            else
                _mm512_mask_storeu_ps(C + i * ldc + 16 * v, last, x);
        }
#undef LD_
}

#define MK16_CASE(mr_, nv_)                                                                       \
    case (mr_) * 8 + (nv_):                                                                       \
        if (full)                                                                                 \
            a16_mk(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, true, last, np, alpha, acc);         \
        else                                                                                      \
            a16_mk(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, false, last, np, alpha, acc);        \
        break;
#define MK16_ROW(mr_) MK16_CASE(mr_, 1) MK16_CASE(mr_, 2) MK16_CASE(mr_, 3) MK16_CASE(mr_, 4)

static void a16_mm(float *C, int64_t ldc, const uint32_t *A, int64_t sa_m, int64_t sa_k, const uint32_t *B,
                          int64_t ldb, int64_t M, int64_t N, int64_t np, float alpha, bool acc)
{
    for (int64_t n0 = 0; n0 < N; n0 += 16 * NV) {
        const int64_t nn = N - n0 < 16 * NV ? N - n0 : 16 * NV;
        const int nv = (int)((nn + 15) / 16);
        const bool full = nn % 16 == 0;
        const a16_mask last = a16_tail16(nn - 16 * (nv - 1));
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int mr = (int)(M - m0 < MR ? M - m0 : MR);
            float *Cb = C + m0 * ldc + n0;
            const uint32_t *Ab = A + m0 * sa_m, *Bb = B + n0;
            switch (mr * 8 + nv) {
                MK16_ROW(1) MK16_ROW(2) MK16_ROW(3) MK16_ROW(4)
            default:
                break;
            }
        }
    }
}

const fx__attn16_kernels FX__ATTN16_TABLE = {
    .name = "vdpbf16ps",
    .rows = a16_rows,
    .pairs = a16_pairs,
    .mm = a16_mm,
};
