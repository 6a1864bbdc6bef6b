/* AVX-512 tile kernels of the attention backward pass and decoding path (backward.h). Same
   contracts and summation orders as the scalar twins in backward.c; results differ from them
   only by FMA rounding. */
#include "attention/backward.h"
#include "attention/backward_transpose.h"
#include "attention/simd_avx512.h"

#define MK_INLINE static inline __attribute__((always_inline))

/* Register block of the matrix kernels: MR rows x NV vectors of 16 columns. */
enum { MR = 4, NV = 4 };

static inline __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* C[mr, 16*nv] block; a(i, k) = A[i*sa_m + k*sa_k]. acc: C += A B, else C = alpha * A B. */
MK_INLINE void mk(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k, const float *B,
                  int64_t ldb, int mr, int nv, __mmask16 last, int64_t K, float alpha, bool acc)
{
    __m512 c[MR][NV];
    __mmask16 mv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++)
        mv[v] = v == nv - 1 ? last : (__mmask16)0xffff;
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            c[i][v] = acc ? _mm512_maskz_loadu_ps(mv[v], C + i * ldc + 16 * v) : _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            b[v] = _mm512_maskz_loadu_ps(mv[v], B + k * ldb + 16 * v);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m512 a = _mm512_set1_ps(A[i * sa_m + k * sa_k]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                c[i][v] = _mm512_fmadd_ps(a, b[v], c[i][v]);
        }
    }
    __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            _mm512_mask_storeu_ps(C + i * ldc + 16 * v, mv[v], acc ? c[i][v] : _mm512_mul_ps(c[i][v], al));
}

#define MK_CASE(mr_, nv_)                                                                         \
    case (mr_) * 8 + (nv_):                                                                       \
        mk(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, last, K, alpha, acc);                         \
        break;

static void mk_dispatch(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k, const float *B,
                        int64_t ldb, int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    for (int64_t n0 = 0; n0 < N; n0 += 16 * NV) {
        int64_t nn = N - n0 < 16 * NV ? N - n0 : 16 * NV;
        int nv = (int)((nn + 15) / 16);
        __mmask16 last = tail_mask(nn - 16 * (nv - 1));
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = (int)(M - m0 < MR ? M - m0 : MR);
            float *Cb = C + m0 * ldc + n0;
            const float *Ab = A + m0 * sa_m;
            const float *Bb = B + n0;
            switch (mr * 8 + nv) {
                MK_CASE(1, 1) MK_CASE(1, 2) MK_CASE(1, 3) MK_CASE(1, 4)
                MK_CASE(2, 1) MK_CASE(2, 2) MK_CASE(2, 3) MK_CASE(2, 4)
                MK_CASE(3, 1) MK_CASE(3, 2) MK_CASE(3, 3) MK_CASE(3, 4)
                MK_CASE(4, 1) MK_CASE(4, 2) MK_CASE(4, 3) MK_CASE(4, 4)
            default:
                break;
            }
        }
    }
}

static void nn_avx512(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                      int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    mk_dispatch(C, ldc, A, lda, 1, B, ldb, M, N, K, alpha, acc);
}

static void tn_avx512(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                      int64_t M, int64_t N, int64_t K)
{
    mk_dispatch(C, ldc, A, 1, lda, B, ldb, M, N, K, 1.0f, true);
}

static void probs_avx512(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, const float *lse)
{
    for (int64_t i = 0; i < nq; i++) {
        float l = lse[i];
        if (l == -INFINITY) {
            for (int64_t j = 0; j < nk; j += 16)
                _mm512_mask_storeu_ps(P + i * ld + j, tail_mask(nk - j), _mm512_setzero_ps());
            continue;
        }
        __m512 lv = _mm512_set1_ps(l);
        for (int64_t j = 0; j < nk; j += 16) {
            __mmask16 t = tail_mask(nk - j);
            __m512 s = _mm512_maskz_loadu_ps(t, S + i * ld + j);
            _mm512_mask_storeu_ps(P + i * ld + j, t, vexp_avx512(_mm512_sub_ps(s, lv)));
        }
    }
}

static void dscores_avx512(float *dP, const float *P, int64_t ld, int64_t nq, int64_t nk, const float *Di,
                           float alpha)
{
    __m512 al = _mm512_set1_ps(alpha);
    for (int64_t i = 0; i < nq; i++) {
        __m512 d = _mm512_set1_ps(Di[i]);
        for (int64_t j = 0; j < nk; j += 16) {
            __mmask16 t = tail_mask(nk - j);
            __m512 dp = _mm512_maskz_loadu_ps(t, dP + i * ld + j);
            __m512 p = _mm512_maskz_loadu_ps(t, P + i * ld + j);
            _mm512_mask_storeu_ps(dP + i * ld + j, t, _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(dp, d)), al));
        }
    }
}

static void mask_bits_avx512(float *S, int64_t ld, int64_t nq, int64_t nk, const uint64_t *bits,
                             int64_t words, int64_t i0, int64_t j0)
{
    __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t i = 0; i < nq; i++) {
        const uint64_t *row = bits + (i0 + i) * words;
        for (int64_t j = 0; j < nk; j += 16) {
            __mmask16 t = tail_mask(nk - j);
            __mmask16 keep = (__mmask16)(row[(j0 + j) >> 6] >> ((j0 + j) & 63));
            __m512 s = _mm512_maskz_loadu_ps(t, S + i * ld + j);
            _mm512_mask_storeu_ps(S + i * ld + j, t, _mm512_mask_blend_ps(keep, ninf, s));
        }
    }
}

/* acc[n] for n = 4r + j summed over its lanes into lane n of the result: a transpose-and-add
   tree (48 shuffles and adds instead of 16 full horizontal sums). */
MK_INLINE __m512 reduce16(const __m512 *a)
{
    __m512 t[8], u[4];
#pragma GCC unroll 8
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]), _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512d x = _mm512_castps_pd(t[2 * q]), y = _mm512_castps_pd(t[2 * q + 1]);
        u[q] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* 4 keys x 4 rows of dot products per pass over D: each K row is loaded once per 4 query
   rows and 16 independent FMA chains hide the latency. Past the last row or key the block
   repeats the last one and drops the result, so every block runs the same code. */
static void dots_avx512(float *S, int64_t ld, const float *Q, const float *K, int64_t R, int64_t nk, int64_t D,
                        float alpha)
{
    __m512 al = _mm512_set1_ps(alpha);
    for (int64_t j0 = 0; j0 < nk; j0 += 4) {
        int nj = (int)(nk - j0 < 4 ? nk - j0 : 4);
        const float *kp[4];
        for (int j = 0; j < 4; j++)
            kp[j] = K + (j0 + (j < nj ? j : nj - 1)) * D;
        for (int64_t r0 = 0; r0 < R; r0 += 4) {
            int nr = (int)(R - r0 < 4 ? R - r0 : 4);
            const float *qp[4];
            for (int r = 0; r < 4; r++)
                qp[r] = Q + (r0 + (r < nr ? r : nr - 1)) * D;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int n = 0; n < 16; n++)
                acc[n] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) {
                __mmask16 t = tail_mask(D - d);
                __m512 kv[4], qv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    kv[j] = _mm512_maskz_loadu_ps(t, kp[j] + d);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
                    qv[r] = _mm512_maskz_loadu_ps(t, qp[r] + d);
#pragma GCC unroll 4
                for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        acc[4 * r + j] = _mm512_fmadd_ps(qv[r], kv[j], acc[4 * r + j]);
            }
            float out[16];
            _mm512_storeu_ps(out, _mm512_mul_ps(reduce16(acc), al));
            for (int r = 0; r < nr; r++)
                for (int j = 0; j < nj; j++)
                    S[(r0 + r) * ld + j0 + j] = out[4 * r + j];
        }
    }
}

static void softmax_chunk_avx512(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, float *m, float *l,
                                 float *alpha)
{
    for (int64_t i = 0; i < nq; i++) {
        __m512 mv = _mm512_set1_ps(m[i]);
        for (int64_t j = 0; j < nk; j += 16)
            mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail_mask(nk - j), S + i * ld + j));
        float mx = _mm512_reduce_max_ps(mv);
        if (mx == -INFINITY) {
            alpha[i] = 1.0f;
            for (int64_t j = 0; j < nk; j += 16)
                _mm512_mask_storeu_ps(P + i * ld + j, tail_mask(nk - j), _mm512_setzero_ps());
            continue;
        }
        alpha[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
        __m512 mm = _mm512_set1_ps(mx), acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; j += 16) {
            __mmask16 t = tail_mask(nk - j);
            __m512 s = _mm512_maskz_loadu_ps(t, S + i * ld + j);
            __m512 p = _mm512_maskz_mov_ps(t, vexp_avx512(_mm512_sub_ps(s, mm)));
            _mm512_mask_storeu_ps(P + i * ld + j, t, p);
            acc = _mm512_add_ps(acc, p);
        }
        l[i] = l[i] * alpha[i] + _mm512_reduce_add_ps(acc);
        m[i] = mx;
    }
}

const fx__attn_kernels fx__attn_kernels_avx512 = {
    .nn = nn_avx512,
    .tn = tn_avx512,
    .probs = probs_avx512,
    .dscores = dscores_avx512,
    .mask_bits = mask_bits_avx512,
    .dots = dots_avx512,
    .softmax_chunk = softmax_chunk_avx512,
    .transpose = fx__bw_transpose,
};
