/*
 * FlexAttention: attention with user-defined masks and score modifiers, run as a
 * block-sparse kernel (docs/attention.md).
 *
 *     fx_block_mask *m;                                  // once per shape, reused
 *     fx_mask_sliding_window_ctx w = {.window = 256};
 *     int rc = fx_block_mask_create(&m, fx_mask_sliding_window, &w, 1, 1, L, L, 0, 0);
 *     fx_attention a = fx_attention_defaults(1, 8, 2, L, L, 64); // Dv = D, CPU, float32
 *     a.mask = m;
 *     rc = fx_flex_attention(&a, q, k, v, out, lse);     // lse may be NULL
 *     fx_block_mask_free(m);
 *
 * Masks are evaluated only while the block mask is built (a custom one in parallel: it must
 * be pure and thread-safe); empty blocks are skipped, full blocks run unmasked, partial
 * blocks use a bitmap. Built-in masks and score mods below are recognised by address.
 *
 * On a CUDA device (.device = k > 0, docs/cuda.md) the same call takes device pointers, after
 * fx_block_mask_to_device(m, k); only the built-in score mods run there.
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
/* B or H may be 1: the mask is then the same for every batch / head. block_q, block_kv: 0 means
   128, at most 4096. *out is set only on success. */
FX_API int fx_block_mask_create(fx_block_mask **out, fx_mask_fn mask, const void *ctx,
                                int64_t B, int64_t H, int64_t q_len, int64_t kv_len,
                                int64_t block_q, int64_t block_kv);
FX_API void fx_block_mask_free(fx_block_mask *m);
FX_API double fx_block_mask_density(const fx_block_mask *m); /* visited blocks / all blocks */
/* Bytes the mask holds (visit lists, transposed lists, bitmaps of partial blocks). */
FX_API size_t fx_block_mask_bytes(const fx_block_mask *m);
/* The most bytes one block mask may take while it is built: its block tables (a class byte
   per block of all B * H slots, the offsets of every block row and column), the visit lists
   in both directions (24 bytes a visited block) and the partial blocks' bitmaps (block_q x
   block_kv bits each). Every creator checks its dimensions against it before allocating
   (then the lists and bitmaps once their sizes are known) and refuses a larger mask with
   FX_EINVAL, naming the dimensions, the bytes needed and the bound. The default, 4 GiB, holds
   a causal mask over 1M positions in 128 x 128 blocks (about 0.9 GB) with room to spare;
   0 restores it. Process-wide. */
#define FX_BLOCK_MASK_DEFAULT_MAX_BYTES ((size_t)4 << 30)
FX_API void fx_block_mask_set_max_bytes(size_t bytes);
FX_API size_t fx_block_mask_max_bytes(void);
/* Copies the mask's lists and bitmaps to CUDA device device - 1 (device >= 1), where calls
   with that fx_attention.device use them; the host copy stays. Any mask can be copied,
   custom ones included (their bits were evaluated here). A later copy to another device
   replaces the earlier one; fx_block_mask_free releases it. FX_EUNSUPPORTED without CUDA in
   the build or without a device (docs/cuda.md). */
FX_API int fx_block_mask_to_device(fx_block_mask *m, int device);

/* Fills the mask of nq query rows from q0 of batch b, head h: bit j % 64 of bits[i * words + j / 64]
   is mask(b, h, q0 + i, j) for j < kv_len (words = ceil(kv_len / 64)); the rows arrive zeroed.
   Returns FX_OK, or anything else to stop the build (a negative fx_status is passed on). */
typedef int (*fx_mask_rows_fn)(uint64_t *bits, int64_t words, int64_t b, int64_t h, int64_t q0, int64_t nq,
                               void *ctx);
/* A block mask from its rows, one block row (block_q query rows x kv_len keys) at a time: fill
   is called B * H * ceil(q_len / block_q) times, in order, on the calling thread (it need not
   be thread-safe), and memory beyond the mask itself is one block row of bits. For masks
   evaluated by other code (a vectorised mask in another language, a precomputed table). */
FX_API int fx_block_mask_create_rows(fx_block_mask **out, fx_mask_rows_fn fill, void *ctx, int64_t B, int64_t H,
                                     int64_t q_len, int64_t kv_len, int64_t block_q, int64_t block_kv);

/* ---- built-in masks -----------------------------------------------------------------------
   Ordinary fx_mask_fn functions; the library recognises them by address and classifies
   blocks analytically (no per-element evaluation of empty or full blocks). */

/* kv_idx <= q_idx. ctx: unused (NULL). */
FX_API bool fx_mask_causal(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

typedef struct fx_mask_sliding_window_ctx {
    int64_t window; /* W >= 1: each query sees itself and the W-1 keys before it */
} fx_mask_sliding_window_ctx;
/* Causal with a window: kv_idx <= q_idx && q_idx - kv_idx < W. */
FX_API bool fx_mask_sliding_window(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

typedef struct fx_mask_prefix_lm_ctx {
    const int64_t *prefix_len; /* [n]: prefix length of batch b (b >= n reads prefix_len[n-1]) */
    int64_t n;                 /* >= 1 */
} fx_mask_prefix_lm_ctx;
/* Bidirectional over the prefix, causal after it: kv_idx < prefix_len[b] || kv_idx <= q_idx. */
FX_API bool fx_mask_prefix_lm(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

typedef struct fx_mask_document_ctx {
    const int64_t *doc_ids; /* [len] per batch row: the document id of each position */
    int64_t len;            /* positions per batch row; must cover q_len and kv_len */
    int64_t batch_stride;   /* elements between batch rows; 0: the same ids for every batch */
} fx_mask_document_ctx;
/* Causal within a document: doc[q_idx] == doc[kv_idx] && kv_idx <= q_idx. */
FX_API bool fx_mask_document(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

typedef struct fx_mask_pair_ctx {
    fx_mask_fn a;
    const void *a_ctx;
    fx_mask_fn b;
    const void *b_ctx;
} fx_mask_pair_ctx;
/* a && b, a || b. The operands may be built-ins (classified analytically) or custom. */
FX_API bool fx_mask_and(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);
FX_API bool fx_mask_or(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx);

/* ---- built-in score modifiers ------------------------------------------------------------- */

typedef struct fx_score_alibi_ctx {
    const float *slopes; /* [Hq]: slope of each query head */
} fx_score_alibi_ctx;
/* s + slopes[h] * (kv_idx - q_idx). */
FX_API void fx_score_alibi(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                           int64_t q0, int64_t kv0, const void *ctx);
FX_API void fx_score_alibi_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv,
                                int64_t b, int64_t h, int64_t q0, int64_t kv0, const void *ctx);

typedef struct fx_score_softcap_ctx {
    float cap; /* c > 0, finite, with 1/c finite (c > 1/FLT_MAX, about 2.9e-39) */
} fx_score_softcap_ctx;
/* c * tanh(s / c). */
FX_API void fx_score_softcap(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                             int64_t q0, int64_t kv0, const void *ctx);
FX_API void fx_score_softcap_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv,
                                  int64_t b, int64_t h, int64_t q0, int64_t kv0, const void *ctx);

typedef struct fx_score_rel_bias_ctx {
    const float *table; /* [heads, size]: bias of relative distance d = q_idx - kv_idx */
    float *grad_table;  /* NULL, or [heads, size]: the backward pass ADDS the gradient of the
                           loss w.r.t. table here (deterministically); the forward ignores it */
    int64_t size;       /* entries per head, >= 1 */
    int64_t zero;       /* index of distance 0: entry = clamp(d + zero, 0, size - 1) */
    int64_t heads;      /* 1: one table for every head; else Hq tables, one per query head */
} fx_score_rel_bias_ctx;
/* s + table[hh * size + clamp(q_idx - kv_idx + zero, 0, size - 1)], hh = heads == 1 ? 0 : h. */
FX_API void fx_score_rel_bias(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                              int64_t q0, int64_t kv0, const void *ctx);
/* The gradient w.r.t. the raw score is g itself; the table's gradient goes to grad_table,
   accumulated by the backward pass (not by this function). */
FX_API void fx_score_rel_bias_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv,
                                   int64_t b, int64_t h, int64_t q0, int64_t kv0, const void *ctx);

typedef struct fx_attention {
    int64_t B, Hq, Hkv, Lq, Lkv, D, Dv;
    float scale;                     /* 0: 1/sqrt(D) */
    int64_t q_offset;                /* absolute position of query row 0 (decoding with a KV cache) */
    const fx_block_mask *mask;       /* NULL: no mask. Needs q_len >= q_offset+Lq, kv_len >= Lkv */
    fx_score_fn score_mod;           /* NULL: identity */
    fx_score_grad_fn score_mod_grad; /* required by the backward pass when score_mod is set */
    const void *score_ctx;
    /* Where the call runs (docs/cuda.md); all zero keeps the CPU path and float32. */
    int device;   /* 0: the CPU, host pointers; k > 0: CUDA device k - 1, every tensor (and the
                     mask's copy, the score mods' slopes or tables) in that device's memory */
    void *stream; /* device calls: the cudaStream_t they are queued on, NULL: the default stream */
    fx_dtype dtype; /* FX_DT_F32: float32; FX_DT_BF16 (device only): q, k, v, out, dout, dq, dk,
                       dv are bfloat16 (lse stays float32; accumulation is float32). 0 (which is
                       FX_DT_BOOL) is also taken as float32, so that a zero-initialised struct is
                       a float32 CPU call, as it always was; fx_attention_defaults sets FX_DT_F32 */
} fx_attention;

/* The call of those sizes with every option off: Dv = D, scale 0 (1/sqrt(D)), no mask, no
   score mod, q_offset 0, the CPU, float32. Set the fields that differ afterwards.

       fx_attention a = fx_attention_defaults(B, Hq, Hkv, L, L, 64);
       a.mask = m;                                   // a block mask, or leave NULL
       rc = fx_flex_attention(&a, q, k, v, out, lse); */
FX_API fx_attention fx_attention_defaults(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D);

/* q [B,Hq,Lq,D], k [B,Hkv,Lkv,D], v [B,Hkv,Lkv,Dv] -> out [B,Hq,Lq,Dv], lse [B,Hq,Lq] (may be NULL).
   A fully masked row gives out = 0 and lse = -inf; a row that meets a NaN score gives NaN in
   out and lse (as PyTorch does), so the two can be told apart; the backward propagates it.
   Outputs must not overlap the inputs or each other (FX_EINVAL), here and in the backward. */
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
