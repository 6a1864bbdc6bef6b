/* The forward's packing with its products in bfloat16 (bf16.h), included by forward_simd.h
   when forward_avx512bf16.c defines FWD_BF16, whose strip kernels then read words: a strip's
   Q rows and P in the rows layout, and the kv-block's Kt and V's panels, packed here, in the
   pairs layout, so that each word multiplies one pair of channels (Q K^T) or of keys (P V). */

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
