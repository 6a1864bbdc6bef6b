/* The forward's products in bfloat16 (bf16.h), included by forward_simd.h when
   forward_avx512bf16.c defines FWD_BF16: the kv-block packed as bfloat16 pairs, and the
   strip kernels' vdpbf16ps twins. A strip's Q rows and P are bfloat16 words in the rows
   layout; Kt and V's panels in the pairs layout, so that each word multiplies one pair of
   keys (P V) or of channels (Q K^T). */

#include "attention/bf16.h"

/* Kt2 [D2, bkp] words: channels 2p and 2p + 1 of key j in word p * bkp + j (zero past nk
   and past D); through Kt [D, bkp], float32, in tmp. */
static void SIMD_FN(pack_kt16)(const float *ks, int64_t D, int64_t nk, uint32_t *kt2, int64_t bkp, float *tmp)
{
    SIMD_FN(pack_kt)(ks, D, nk, tmp, bkp);
    fx__attn16_kernels_avx512bf16.pairs(kt2, bkp, tmp, bkp, D, bkp);
}

/* V's panels as pack_v lays them out, in pairs of keys: the panel of columns [c, c + w)
   starts at vp + c * bk2 and holds keys 2p, 2p + 1 at word p * w (zero past nk and Dv). */
static void SIMD_FN(pack_v16)(const float *vs, int64_t Dv, int64_t nk, uint32_t *vp, int64_t bk2, int64_t dvp)
{
    for (int64_t c = 0; c < dvp; c += NC * VL) {
        const int64_t w = dvp - c < NC * VL ? dvp - c : NC * VL, cols = Dv - c < w ? Dv - c : w;
        fx__attn16_kernels_avx512bf16.pairs(vp + c * bk2, w, vs + c, Dv, nk, cols);
        if (cols < w) /* the panel's columns past Dv */
            for (int64_t p = 0; p < (nk + 1) / 2; p++)
                memset(vp + c * bk2 + p * w + cols, 0, (size_t)(w - cols) * sizeof(uint32_t));
    }
}

/* S[r, c0 .. c0 + nc*VL) = scale * sum_p Q2[r, p] . Kt2[p, ...] for r < mr. */
static inline __attribute__((always_inline)) void SIMD_FN(qk_tile16)(int mr, int nc, const uint32_t *q2, int64_t D2,
                                                                      const uint32_t *kt2, int64_t ldk, float *s,
                                                                      int64_t lds, float scale)
{
    vf acc[MRMAX][NC];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[r][c] = V_ZERO();
    for (int64_t p = 0; p < D2; p++) {
        __m512bh kv[NC];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            kv[c] = (__m512bh)_mm512_loadu_si512((const void *)(kt2 + p * ldk + c * VL));
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)q2[r * D2 + p]);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qb, kv[c]);
        }
    }
    vf sc = V_SET1(scale);
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            V_STORE(s + r * lds + c * VL, V_MUL(acc[r][c], sc));
}

/* O[r, c0 .. c0 + nc*VL) = alpha[r] O[r, ...] + sum_{p < np} P2[r, p] . V2[p, ...] for r < mr. */
static inline __attribute__((always_inline)) void SIMD_FN(pv_tile16)(int mr, int nc, const uint32_t *p2, int64_t ldp,
                                                                      const uint32_t *vv, int64_t ldv, int64_t np,
                                                                      float *o, int64_t ldo, const float *alpha)
{
    vf acc[MRMAX][NC];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        vf al = V_SET1(alpha[r]);
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            acc[r][c] = V_MUL(V_LOAD(o + r * ldo + c * VL), al);
    }
    for (int64_t p = 0; p < np; p++) {
        __m512bh vr[NC];
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            vr[c] = (__m512bh)_mm512_loadu_si512((const void *)(vv + p * ldv + c * VL));
#pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const __m512bh pb = (__m512bh)_mm512_set1_epi32((int)p2[r * ldp + p]);
#pragma GCC unroll 8
            for (int c = 0; c < nc; c++)
                acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vr[c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int c = 0; c < nc; c++)
            V_STORE(o + r * ldo + c * VL, acc[r][c]);
}

static void SIMD_FN(qk_strip16)(int mr, const uint32_t *q2, int64_t D2, const uint32_t *kt2, int64_t ldk, float *s,
                                int64_t lds, int64_t width, float scale)
{
    for (int64_t c0 = 0; c0 < width; c0 += NC * VL) {
        int nc = (int)((width - c0) / VL < NC ? (width - c0) / VL : NC);
#define QK_(MRV, NCV, ...) SIMD_FN(qk_tile16)(MRV, NCV, q2, D2, kt2 + c0, ldk, s + c0, lds, scale)
        SIMD_MR_CASES(QK_, 0)
#undef QK_
    }
}

/* O[r, ...] = alpha[r] O[r, ...] + sum of P2's np pairs against V's pairs j2 .. j2 + np - 1. */
static void SIMD_FN(pv_strip16)(int mr, const uint32_t *p2, int64_t ldp, const uint32_t *vp, int64_t bk2, int64_t j2,
                                int64_t np, float *o, int64_t dvp, const float *alpha)
{
    for (int64_t c0 = 0; c0 < dvp; c0 += NC * VL) {
        const int64_t w = dvp - c0 < NC * VL ? dvp - c0 : NC * VL;
        const int nc = (int)(w / VL);
        const uint32_t *vv = vp + c0 * bk2 + j2 * w;
#define PV_(MRV, NCV, ...) SIMD_FN(pv_tile16)(MRV, NCV, p2, ldp, vv, w, np, o + c0, dvp, alpha)
        SIMD_MR_CASES(PV_, 0)
#undef PV_
    }
}
