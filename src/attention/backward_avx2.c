/* AVX2 tile kernels of the attention backward pass and decoding path (backward.h): the
   AVX-512 kernels at half the width, with masked loads built from lane counts. Same contracts
   and summation orders as the scalar twins. */
#include "attention/backward.h"
#include "attention/backward_transpose.h"
#include "attention/simd_avx2.h"

#define MK_INLINE static inline __attribute__((always_inline))

/* Register block: MR rows x NV vectors of 8 columns (12 accumulators of 16 registers). */
enum { MR = 4, NV = 3 };

/* Lanes [0, n) on (n clamped to 8). */
static inline __m256i lanes(int64_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 8 ? n : 8)), idx);
}

/* C[mr, 8*nv] block; a(i, k) = A[i*sa_m + k*sa_k]. acc: C += A B, else C = alpha * A B. */
MK_INLINE void mk(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k, const float *B,
                  int64_t ldb, int mr, int nv, __m256i last, int64_t K, float alpha, bool acc)
{
    __m256 c[MR][NV];
    __m256i mv[NV];
#pragma GCC unroll 3
    for (int v = 0; v < nv; v++)
        mv[v] = v == nv - 1 ? last : _mm256_set1_epi32(-1);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            c[i][v] = acc ? _mm256_maskload_ps(C + i * ldc + 8 * v, mv[v]) : _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 b[NV];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            b[v] = _mm256_maskload_ps(B + k * ldb + 8 * v, mv[v]);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m256 a = _mm256_broadcast_ss(A + i * sa_m + k * sa_k);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++)
                c[i][v] = _mm256_fmadd_ps(a, b[v], c[i][v]);
        }
    }
    __m256 al = _mm256_set1_ps(alpha);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++)
            _mm256_maskstore_ps(C + i * ldc + 8 * v, mv[v], acc ? c[i][v] : _mm256_mul_ps(c[i][v], al));
}

#define MK_CASE(mr_, nv_)                                                                         \
    case (mr_) * 8 + (nv_):                                                                       \
        mk(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, last, K, alpha, acc);                      \
        break;

static void mk_dispatch(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k, const float *B,
                        int64_t ldb, int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    for (int64_t n0 = 0; n0 < N; n0 += 8 * NV) {
        int64_t nn = N - n0 < 8 * NV ? N - n0 : 8 * NV;
        int nv = (int)((nn + 7) / 8);
        __m256i last = lanes(nn - 8 * (nv - 1));
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = (int)(M - m0 < MR ? M - m0 : MR);
            float *Cb = C + m0 * ldc + n0;
            const float *Ab = A + m0 * sa_m;
            const float *Bb = B + n0;
            switch (mr * 8 + nv) {
                MK_CASE(1, 1) MK_CASE(1, 2) MK_CASE(1, 3)
                MK_CASE(2, 1) MK_CASE(2, 2) MK_CASE(2, 3)
                MK_CASE(3, 1) MK_CASE(3, 2) MK_CASE(3, 3)
                MK_CASE(4, 1) MK_CASE(4, 2) MK_CASE(4, 3)
            default:
                break;
            }
        }
    }
}

static void nn_avx2(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb, int64_t M,
                    int64_t N, int64_t K, float alpha, bool acc)
{
    mk_dispatch(C, ldc, A, lda, 1, B, ldb, M, N, K, alpha, acc);
}

static void tn_avx2(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb, int64_t M,
                    int64_t N, int64_t K)
{
    mk_dispatch(C, ldc, A, 1, lda, B, ldb, M, N, K, 1.0f, true);
}

static void probs_avx2(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, const float *lse)
{
    for (int64_t i = 0; i < nq; i++) {
        float l = lse[i];
        __m256 lv = _mm256_set1_ps(l);
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i t = lanes(nk - j);
            __m256 p = l == -INFINITY ? _mm256_setzero_ps()
                                      : vexp_avx2(_mm256_sub_ps(_mm256_maskload_ps(S + i * ld + j, t), lv));
            _mm256_maskstore_ps(P + i * ld + j, t, p);
        }
    }
}

static void dscores_avx2(float *dP, const float *P, int64_t ld, int64_t nq, int64_t nk, const float *Di, float alpha)
{
    __m256 al = _mm256_set1_ps(alpha);
    for (int64_t i = 0; i < nq; i++) {
        __m256 d = _mm256_set1_ps(Di[i]);
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i t = lanes(nk - j);
            __m256 dp = _mm256_maskload_ps(dP + i * ld + j, t), p = _mm256_maskload_ps(P + i * ld + j, t);
            _mm256_maskstore_ps(dP + i * ld + j, t, _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(dp, d)), al));
        }
    }
}

static void mask_bits_avx2(float *S, int64_t ld, int64_t nq, int64_t nk, const uint64_t *bits, int64_t words,
                           int64_t i0, int64_t j0)
{
    const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < nq; i++) {
        const uint64_t *row = bits + (i0 + i) * words;
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i t = lanes(nk - j);
            int byte = (int)((row[(j0 + j) >> 6] >> ((j0 + j) & 63)) & 0xffu);
            __m256i keep = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(byte), sel), sel);
            __m256 s = _mm256_maskload_ps(S + i * ld + j, t);
            _mm256_maskstore_ps(S + i * ld + j, t, _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(keep)));
        }
    }
}

/* a[n] summed over its lanes into lane n, for 8 vectors. */
MK_INLINE __m256 reduce8(const __m256 *a)
{
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* 4 keys x 2 rows per pass over D (8 accumulators); tails repeat the last row / key. */
static void dots_avx2(float *S, int64_t ld, const float *Q, const float *K, int64_t R, int64_t nk, int64_t D,
                      float alpha)
{
    __m256 al = _mm256_set1_ps(alpha);
    for (int64_t j0 = 0; j0 < nk; j0 += 4) {
        int nj = (int)(nk - j0 < 4 ? nk - j0 : 4);
        const float *kp[4];
        for (int j = 0; j < 4; j++)
            kp[j] = K + (j0 + (j < nj ? j : nj - 1)) * D;
        for (int64_t r0 = 0; r0 < R; r0 += 2) {
            int nr = (int)(R - r0 < 2 ? R - r0 : 2);
            const float *qp[2] = {Q + r0 * D, Q + (r0 + nr - 1) * D};
            __m256 acc[8];
#pragma GCC unroll 8
            for (int n = 0; n < 8; n++)
                acc[n] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8) {
                __m256i t = lanes(D - d);
                __m256 kv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    kv[j] = _mm256_maskload_ps(kp[j] + d, t);
#pragma GCC unroll 2
                for (int r = 0; r < 2; r++) {
                    __m256 qv = _mm256_maskload_ps(qp[r] + d, t);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        acc[4 * r + j] = _mm256_fmadd_ps(qv, kv[j], acc[4 * r + j]);
                }
            }
            float out[8];
            _mm256_storeu_ps(out, _mm256_mul_ps(reduce8(acc), al));
            for (int r = 0; r < nr; r++)
                for (int j = 0; j < nj; j++)
                    S[(r0 + r) * ld + j0 + j] = out[4 * r + j];
        }
    }
}

static void softmax_chunk_avx2(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, float *m, float *l,
                               float *alpha)
{
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t i = 0; i < nq; i++) {
        __m256 mv = _mm256_set1_ps(m[i]);
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i t = lanes(nk - j);
            __m256 s = _mm256_blendv_ps(ninf, _mm256_maskload_ps(S + i * ld + j, t), _mm256_castsi256_ps(t));
            mv = _mm256_max_ps(mv, s);
        }
        float mx = hmax_avx2(mv);
        if (mx == -INFINITY) {
            alpha[i] = 1.0f;
            for (int64_t j = 0; j < nk; j += 8)
                _mm256_maskstore_ps(P + i * ld + j, lanes(nk - j), _mm256_setzero_ps());
            continue;
        }
        alpha[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
        __m256 mm = _mm256_set1_ps(mx), acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i t = lanes(nk - j);
            __m256 p = _mm256_and_ps(vexp_avx2(_mm256_sub_ps(_mm256_maskload_ps(S + i * ld + j, t), mm)),
                                     _mm256_castsi256_ps(t));
            _mm256_maskstore_ps(P + i * ld + j, t, p);
            acc = _mm256_add_ps(acc, p);
        }
        l[i] = l[i] * alpha[i] + hsum_avx2(acc);
        m[i] = mx;
    }
}

const fx__attn_kernels fx__attn_kernels_avx2 = {
    .nn = nn_avx2,
    .tn = tn_avx2,
    .probs = probs_avx2,
    .dscores = dscores_avx2,
    .mask_bits = mask_bits_avx2,
    .dots = dots_avx2,
    .softmax_chunk = softmax_chunk_avx2,
    .transpose = fx__bw_transpose,
};
