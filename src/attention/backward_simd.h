/* The vector tile kernels of the backward pass and decoding path (backward.h), written once
   over the SIMD layer (simd_avx2.h / simd_avx512.h, see simd_math.h) and included by
   backward_avx2.c and backward_avx512.c, which also define NV: the matrix microkernel keeps
   MR (4) rows x NV vectors of C in registers. Same contracts and summation orders as the
   scalar twins in backward.c; results differ from them only by FMA rounding. */

#include "attention/transpose.h"

#define MK_INLINE static inline __attribute__((always_inline))

enum { MR = 4 };

/* C[mr, VL*nv] block; a(i, k) = A[i*sa_m + k*sa_k]; `last` holds the lanes of the last
   vector, which is whole when `full`. acc: C += A B, else C = alpha * A B.
   Whole vectors use plain loads: with MR x NV accumulators, NV vectors of B and the
   broadcast a, a mask register more would not fit the 16 of AVX2 and an accumulator would
   live on the stack (half the kernel's time went to that spill). Only a block that ends
   inside a vector pays for it. */
MK_INLINE void SIMD_FN(mk)(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k, const float *B,
                           int64_t ldb, int mr, int nv, bool full, vm last, int64_t K, float alpha, bool acc)
{
#define MK_LD(v, p) (full || (v) < nv - 1 ? V_LOAD(p) : V_MLOAD(last, p))
#define MK_ST(v, p, x)                                                                                    \
    do {                                                                                                  \
        if (full || (v) < nv - 1)                                                                         \
            V_STORE(p, x);                                                                                \
        else                                                                                              \
            V_MSTORE(p, last, x);                                                                         \
    } while (0)
    vf c[MR][NV];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            c[i][v] = acc ? MK_LD(v, C + i * ldc + VL * v) : V_ZERO();
    for (int64_t k = 0; k < K; k++) {
        vf b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            b[v] = MK_LD(v, B + k * ldb + VL * v);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            vf a = V_SET1(A[i * sa_m + k * sa_k]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                c[i][v] = V_FMA(a, b[v], c[i][v]);
        }
    }
    vf al = V_SET1(alpha);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            MK_ST(v, C + i * ldc + VL * v, acc ? c[i][v] : V_MUL(c[i][v], al));
#undef MK_LD
#undef MK_ST
}

/* One switch case a block shape (and whether its last vector is whole), so that every shape
   runs a fully unrolled kernel. */
#define MK_CASE(mr_, nv_)                                                                         \
    case (mr_) * 8 + (nv_):                                                                       \
        if (full)                                                                                 \
            SIMD_FN(mk)(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, true, last, K, alpha, acc);   \
        else                                                                                      \
            SIMD_FN(mk)(Cb, ldc, Ab, sa_m, sa_k, Bb, ldb, mr_, nv_, false, last, K, alpha, acc);  \
        break;
#if NV == 4
#define MK_CASE4(mr_) MK_CASE(mr_, 4)
#elif NV == 3
#define MK_CASE4(mr_)
#else
#error "NV must be 3 or 4"
#endif
#define MK_ROW(mr_) MK_CASE(mr_, 1) MK_CASE(mr_, 2) MK_CASE(mr_, 3) MK_CASE4(mr_)

static void SIMD_FN(mk_dispatch)(float *C, int64_t ldc, const float *A, int64_t sa_m, int64_t sa_k,
                                 const float *B, int64_t ldb, int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    for (int64_t n0 = 0; n0 < N; n0 += VL * NV) {
        int64_t nn = N - n0 < VL * NV ? N - n0 : VL * NV;
        int nv = (int)((nn + VL - 1) / VL);
        const bool full = nn % VL == 0;
        vm last = V_TAIL(nn - VL * (nv - 1));
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            int mr = (int)(M - m0 < MR ? M - m0 : MR);
            float *Cb = C + m0 * ldc + n0;
            const float *Ab = A + m0 * sa_m;
            const float *Bb = B + n0;
            switch (mr * 8 + nv) {
                MK_ROW(1) MK_ROW(2) MK_ROW(3) MK_ROW(4)
            default:
                break;
            }
        }
    }
}

static void SIMD_FN(nn)(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                        int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    SIMD_FN(mk_dispatch)(C, ldc, A, lda, 1, B, ldb, M, N, K, alpha, acc);
}

static void SIMD_FN(tn)(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                        int64_t M, int64_t N, int64_t K)
{
    SIMD_FN(mk_dispatch)(C, ldc, A, 1, lda, B, ldb, M, N, K, 1.0f, true);
}

static void SIMD_FN(zero_row)(float *p, int64_t n)
{
    for (int64_t j = 0; j < n; j += VL)
        V_MSTORE(p + j, V_TAIL(n - j), V_ZERO());
}

static void SIMD_FN(probs)(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, const float *lse)
{
    for (int64_t i = 0; i < nq; i++) {
        if (lse[i] == -INFINITY) {
            SIMD_FN(zero_row)(P + i * ld, nk);
            continue;
        }
        vf lv = V_SET1(lse[i]);
        for (int64_t j = 0; j < nk; j += VL) {
            vm t = V_TAIL(nk - j);
            V_MSTORE(P + i * ld + j, t, SIMD_FN(vexp)(V_SUB(V_MLOAD(t, S + i * ld + j), lv)));
        }
    }
}

static void SIMD_FN(dscores)(float *dP, const float *P, int64_t ld, int64_t nq, int64_t nk, const float *Di,
                             float alpha)
{
    vf al = V_SET1(alpha);
    for (int64_t i = 0; i < nq; i++) {
        vf d = V_SET1(Di[i]);
        for (int64_t j = 0; j < nk; j += VL) {
            vm t = V_TAIL(nk - j);
            vf dp = V_MLOAD(t, dP + i * ld + j), p = V_MLOAD(t, P + i * ld + j);
            V_MSTORE(dP + i * ld + j, t, V_MUL(V_MUL(p, V_SUB(dp, d)), al));
        }
    }
}

static void SIMD_FN(mask_bits)(float *S, int64_t ld, int64_t nq, int64_t nk, const uint64_t *bits,
                               int64_t words, int64_t i0, int64_t j0)
{
    for (int64_t i = 0; i < nq; i++) {
        const uint64_t *row = bits + (i0 + i) * words;
        for (int64_t j = 0; j < nk; j += VL) {
            vm t = V_TAIL(nk - j);
            uint32_t w = (uint32_t)(row[(j0 + j) >> 6] >> ((j0 + j) & 63));
            V_MSTORE(S + i * ld + j, t, V_BITS(V_MLOAD(t, S + i * ld + j), w));
        }
    }
}

/* DR rows x 4 keys of dot products per pass over D (VL accumulators): each K row is loaded
   once per DR query rows and the independent FMA chains hide the latency. Past the last row
   or key the block repeats the last one and drops the result, so every block runs the same
   code. */
enum { DR = VL / 4 };

static void SIMD_FN(dots)(float *S, int64_t ld, const float *Q, const float *K, int64_t R, int64_t nk, int64_t D,
                          float alpha)
{
    vf al = V_SET1(alpha);
    for (int64_t j0 = 0; j0 < nk; j0 += 4) {
        int nj = (int)(nk - j0 < 4 ? nk - j0 : 4);
        const float *kp[4];
        for (int j = 0; j < 4; j++)
            kp[j] = K + (j0 + (j < nj ? j : nj - 1)) * D;
        for (int64_t r0 = 0; r0 < R; r0 += DR) {
            int nr = (int)(R - r0 < DR ? R - r0 : DR);
            const float *qp[DR];
            for (int r = 0; r < DR; r++)
                qp[r] = Q + (r0 + (r < nr ? r : nr - 1)) * D;
            vf acc[VL];
#pragma GCC unroll 16
            for (int n = 0; n < VL; n++)
                acc[n] = V_ZERO();
            for (int64_t d = 0; d < D; d += VL) {
                vm t = V_TAIL(D - d);
                vf kv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    kv[j] = V_MLOAD(t, kp[j] + d);
#pragma GCC unroll 4
                for (int r = 0; r < DR; r++) {
                    vf qv = V_MLOAD(t, qp[r] + d);
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++)
                        acc[4 * r + j] = V_FMA(qv, kv[j], acc[4 * r + j]);
                }
            }
            float out[VL];
            V_STORE(out, V_MUL(V_SUMS(acc), al));
            for (int r = 0; r < nr; r++)
                for (int j = 0; j < nj; j++)
                    S[(r0 + r) * ld + j0 + j] = out[4 * r + j];
        }
    }
}

static void SIMD_FN(softmax_chunk)(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, float *m, float *l,
                                   float *alpha)
{
    const vf ninf = V_SET1(-INFINITY);
    for (int64_t i = 0; i < nq; i++) {
        vf mv = V_SET1(m[i]);
        for (int64_t j = 0; j < nk; j += VL) {
            vm t = V_TAIL(nk - j);
            mv = V_MAX(mv, V_SEL(t, V_MLOAD(t, S + i * ld + j), ninf));
        }
        float mx = V_HMAX(mv);
        if (mx == -INFINITY) {
            alpha[i] = 1.0f;
            SIMD_FN(zero_row)(P + i * ld, nk);
            continue;
        }
        alpha[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
        vf mm = V_SET1(mx), acc = V_ZERO();
        for (int64_t j = 0; j < nk; j += VL) {
            vm t = V_TAIL(nk - j);
            vf p = V_SEL(t, SIMD_FN(vexp)(V_SUB(V_MLOAD(t, S + i * ld + j), mm)), V_ZERO());
            V_MSTORE(P + i * ld + j, t, p);
            acc = V_ADD(acc, p);
        }
        l[i] = l[i] * alpha[i] + V_HSUM(acc);
        m[i] = mx;
    }
}

const fx__attn_bwd_kernels SIMD_FN(fx__attn_bwd_kernels) = {
    .name = SIMD_NAME,
    .nn = SIMD_FN(nn),
    .tn = SIMD_FN(tn),
    .probs = SIMD_FN(probs),
    .dscores = SIMD_FN(dscores),
    .mask_bits = SIMD_FN(mask_bits),
    .dots = SIMD_FN(dots),
    .softmax_chunk = SIMD_FN(softmax_chunk),
    .transpose = fx__transpose,
};
