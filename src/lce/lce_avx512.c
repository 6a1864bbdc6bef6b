/* The AVX-512 path of the fused loss: lce_simd.h's row and tile kernels over 16-float
   vectors, and the three GEMMs of the fused pass; called only when fx_get_isa() allows. */
#include "core/simd_avx512.h"
#include "lce_simd.h"

const fx__lce_row_kernels fx__lce_row_kernels_avx512 = {SIMD_FN(lce_stats), SIMD_FN(lce_prep), SIMD_FN(lce_grad)};

/* ---- GEMM kernels of the fused pass (the layout is described in lce_internal.h) ----------
   Register tiles of 6 x 4 vectors (24 accumulators): each step loads 4 vectors and
   broadcasts 6 scalars for 24 FMAs. The constant tile sizes below are unrolled by the
   compiler, so the accumulators live in registers. */

#define LCE_UNROLL _Pragma("GCC unroll 8")

/* Vectors needed for n lanes (at most 4) and the mask of the last one. */
static inline int nvec(int64_t n) { return n >= 64 ? 4 : (int)((n + 15) / 16); }
static inline __mmask16 last_mask(int64_t n, int nv) { return V_TAIL(n - 16 * (nv - 1)); }

/* zt[j, i] for j < JN, i < 16 NV (the last vector masked by km): sum_d w[j, d] hT[d, i]. */
static inline __attribute__((always_inline)) void logits_tile(const int JN, const int NV, int64_t D, const float *w,
                                                              const float *hT, int64_t ldh, float *zt, int64_t ldz,
                                                              __mmask16 km)
{
    __m512 acc[6][4];
    LCE_UNROLL for (int a = 0; a < JN; a++) LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 hv[4];
        LCE_UNROLL for (int v = 0; v < NV; v++) hv[v] = _mm512_loadu_ps(hT + d * ldh + 16 * v);
        LCE_UNROLL for (int a = 0; a < JN; a++)
        {
            const __m512 wb = _mm512_set1_ps(w[a * D + d]);
            LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_fmadd_ps(wb, hv[v], acc[a][v]);
        }
    }
    LCE_UNROLL for (int a = 0; a < JN; a++) LCE_UNROLL for (int v = 0; v < NV; v++)
    {
        if (v == NV - 1)
            _mm512_mask_storeu_ps(zt + a * ldz + 16 * v, km, acc[a][v]);
        else
            _mm512_storeu_ps(zt + a * ldz + 16 * v, acc[a][v]);
    }
}

#define LCE_JN_SWITCH(JN, CALL)                                                                                       \
    switch (JN) {                                                                                                     \
    case 6: CALL(6); break;                                                                                           \
    case 5: CALL(5); break;                                                                                           \
    case 4: CALL(4); break;                                                                                           \
    case 3: CALL(3); break;                                                                                           \
    case 2: CALL(2); break;                                                                                           \
    default: CALL(1); break;                                                                                          \
    }

static void lce_logits_avx512(int64_t nj, int64_t c, int64_t D, const float *w, const float *hT, int64_t ldh,
                              float *zt, int64_t ldz)
{
    for (int64_t j0 = 0; j0 < nj; j0 += 6) {
        const int jn = nj - j0 < 6 ? (int)(nj - j0) : 6;
        for (int64_t i0 = 0; i0 < c; i0 += 64) {
            const int nv = nvec(c - i0);
            const __mmask16 km = last_mask(c - i0, nv);
            const float *wj = w + j0 * D;
            const float *hi = hT + i0;
            float *z = zt + j0 * ldz + i0;
#define LCE_CALL_L(J)                                                                                                 \
    do {                                                                                                              \
        if (nv == 4) logits_tile(J, 4, D, wj, hi, ldh, z, ldz, km);                                                   \
        else if (nv == 3) logits_tile(J, 3, D, wj, hi, ldh, z, ldz, km);                                              \
        else if (nv == 2) logits_tile(J, 2, D, wj, hi, ldh, z, ldz, km);                                              \
        else logits_tile(J, 1, D, wj, hi, ldh, z, ldz, km);                                                           \
    } while (0)
            LCE_JN_SWITCH(jn, LCE_CALL_L)
#undef LCE_CALL_L
        }
    }
}

/* out[a, d + 16 v] (+)= sum_k s[a, k] x[k, d + 16 v] for a < AN, v < NV: the shared shape of
   the dw and dh kernels, with s read at s[a * sa + k * sk] and x rows ldx apart. pf (or NULL):
   a line prefetched into L2 per step, at pf + k * ldp; pf_out: the next 64 columns of the
   output rows prefetched first (past a row's end they touch the next row or nothing: a
   prefetch never faults). */
static inline __attribute__((always_inline)) void bcast_tile(const int AN, const int NV, int64_t K, const float *s,
                                                             int64_t sa, int64_t sk, const float *x, int64_t ldx,
                                                             float *out, int64_t ldo, bool accumulate, __mmask16 km,
                                                             const float *pf, int64_t ldp, bool pf_out)
{
    __m512 acc[6][4];
    /* dw: the next 64 columns of the output rows, which stream from memory. */
    if (pf_out)
        LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < 4; v++)
            _mm_prefetch((const char *)(out + a * ldo + 64 + 16 * v), _MM_HINT_T0);
    LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        if (pf)
            _mm_prefetch((const char *)(pf + k * ldp), _MM_HINT_T1);
        __m512 xv[4];
        LCE_UNROLL for (int v = 0; v < NV; v++)
        {
            const __mmask16 m = v == NV - 1 ? km : (__mmask16)0xffff;
            xv[v] = _mm512_maskz_loadu_ps(m, x + k * ldx + 16 * v);
        }
        LCE_UNROLL for (int a = 0; a < AN; a++)
        {
            const __m512 sb = _mm512_set1_ps(s[a * sa + k * sk]);
            LCE_UNROLL for (int v = 0; v < NV; v++) acc[a][v] = _mm512_fmadd_ps(sb, xv[v], acc[a][v]);
        }
    }
    /* The step's sum is added to the output last, so that rounding errors grow with the
       steps (chunks, tiles of rows) rather than with every term. */
    LCE_UNROLL for (int a = 0; a < AN; a++) LCE_UNROLL for (int v = 0; v < NV; v++)
    {
        const __mmask16 m = v == NV - 1 ? km : (__mmask16)0xffff;
        float *o = out + a * ldo + 16 * v;
        _mm512_mask_storeu_ps(o, m, accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), acc[a][v]) : acc[a][v]);
    }
}

#define LCE_CALL_B(J)                                                                                                 \
    do {                                                                                                              \
        if (nv == 4) bcast_tile(J, 4, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                        \
        else if (nv == 3) bcast_tile(J, 3, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                   \
        else if (nv == 2) bcast_tile(J, 2, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                   \
        else bcast_tile(J, 1, K, s, sa, sk, x, ldx, o, ldo, acc, km, pf, D, pf_out);                                                \
    } while (0)

/* dw[j, :] += sum_i g[j, i] h[i, :] for j < nj (g rows ldz apart, i < c). */
static void lce_dw_avx512(int64_t nj, int64_t c, int64_t D, const float *g, int64_t ldz, const float *h, float *dw)
{
    const int64_t K = c, sa = ldz, sk = 1, ldx = D, ldo = D;
    const bool acc = true;
    for (int64_t j0 = 0; j0 < nj; j0 += 6) {
        const int jn = nj - j0 < 6 ? (int)(nj - j0) : 6;
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int nv = nvec(D - d0);
            const __mmask16 km = last_mask(D - d0, nv);
            const float *s = g + j0 * ldz, *x = h + d0, *pf = NULL;
            const bool pf_out = true;
            float *o = dw + j0 * D + d0;
            LCE_JN_SWITCH(jn, LCE_CALL_B)
        }
    }
}

/* dh[i, d] (+)= sum_j g[j, i] w[j, d] for i < c, d in [d0, d1), j < nj. The rows of w are
   taken a slice of columns at a time, a pattern the hardware prefetchers do not follow: the
   first four passes over each slice fetch the same slice of the next nj rows (the caller's
   next step) into L2, a cache line per row per pass. Prefetches past the end of w are
   harmless (they never fault). (Copying each slice to a contiguous block first, against
   the L1 set conflicts of rows 4 KB apart, measured slower.) */
static void lce_dh_avx512(int64_t nj, int64_t c, int64_t D, int64_t d0, int64_t d1, const float *g, int64_t ldz,
                          const float *w, float *dh, bool accumulate)
{
    const int64_t K = nj, sa = 1, sk = ldz, ldx = D, ldo = D;
    const bool acc = accumulate;
    for (int64_t d = d0; d < d1; d += 64) {
        const int nv = nvec(d1 - d);
        const __mmask16 km = last_mask(d1 - d, nv);
        for (int64_t i0 = 0; i0 < c; i0 += 6) {
            const int in = c - i0 < 6 ? (int)(c - i0) : 6;
            const float *s = g + i0, *x = w + d;
            const float *pf = i0 < 4 * 6 ? w + nj * D + d + 16 * (i0 / 6) : NULL;
            const bool pf_out = false;
            float *o = dh + i0 * D + d;
            LCE_JN_SWITCH(in, LCE_CALL_B)
        }
    }
}

const fx__lce_tile_kernels fx__lce_tile_kernels_avx512 = {SIMD_FN(lce_stats_t), SIMD_FN(lce_prep_t),
                                                          SIMD_FN(lce_grad_t)};
const fx__lce_tile_gemms fx__lce_tile_gemms_avx512 = {lce_logits_avx512, lce_dw_avx512, lce_dh_avx512};
