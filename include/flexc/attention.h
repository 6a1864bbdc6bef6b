/*
 * FlexAttention: attention with user-defined masks and score modifiers, run as a
 * block-sparse kernel (DESIGN.md §3). Implemented by the attention module.
 */
#ifndef FLEXC_ATTENTION_H
#define FLEXC_ATTENTION_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef bool (*fx_mask_fn)(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* Score modifier on a tile, in place: s[i*ld + j] is the scaled score of query q0+i and key kv0+j.
   Positions passed to mods and masks are absolute: query row r of a call has position q_offset + r. */
typedef void (*fx_score_fn)(float *s, int64_t ld, int64_t nq, int64_t nkv,
                            int64_t b, int64_t h, int64_t q0, int64_t kv0, const void *ctx);
/* Its derivative: s holds the raw (pre-modifier) scores, g the gradient w.r.t. the modified
   scores; replace g with the gradient w.r.t. the raw scores. */
typedef void (*fx_score_grad_fn)(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv,
                                 int64_t b, int64_t h, int64_t q0, int64_t kv0, const void *ctx);

typedef struct fx_block_mask fx_block_mask;
/* B or H may be 1: the mask is then the same for every batch / head. block_q, block_kv: 0 means 128. */
FX_API int fx_block_mask_create(fx_block_mask **out, fx_mask_fn mask, const void *ctx,
                                int64_t B, int64_t H, int64_t q_len, int64_t kv_len,
                                int64_t block_q, int64_t block_kv);
FX_API void fx_block_mask_free(fx_block_mask *m);
FX_API double fx_block_mask_density(const fx_block_mask *m); /* visited blocks / all blocks */

typedef struct fx_attention {
    int64_t B, Hq, Hkv, Lq, Lkv, D, Dv;
    float scale;                     /* 0: 1/sqrt(D) */
    int64_t q_offset;                /* absolute position of query row 0 (decoding with a KV cache) */
    const fx_block_mask *mask;       /* NULL: no mask. Needs q_len >= q_offset+Lq, kv_len >= Lkv */
    fx_score_fn score_mod;           /* NULL: identity */
    fx_score_grad_fn score_mod_grad; /* required by the backward pass when score_mod is set */
    const void *score_ctx;
} fx_attention;

/* q [B,Hq,Lq,D], k [B,Hkv,Lkv,D], v [B,Hkv,Lkv,Dv] -> out [B,Hq,Lq,Dv], lse [B,Hq,Lq] (may be NULL) */
FX_API int fx_flex_attention(const fx_attention *a, const float *q, const float *k, const float *v,
                             float *out, float *lse);
/* Gradients of sum(out * dout); dq, dk, dv are overwritten. Deterministic for any thread count. */
FX_API int fx_flex_attention_backward(const fx_attention *a, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse,
                                      const float *dout, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif
#endif
