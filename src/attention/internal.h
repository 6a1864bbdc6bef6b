/* FlexAttention internals shared by the forward pass, the backward pass and decoding: the
   block mask's layout, accessors, the recognition of built-in mods, and the internal entry
   points. This layout is relied on by several files: fields are only ever added, never
   renamed or given a new meaning. */
#ifndef FX_ATTENTION_INTERNAL_H
#define FX_ATTENTION_INTERNAL_H

#include "core/core.h"

#include <math.h>
#include <string.h>

/* ---- block mask ---------------------------------------------------------------------------

   The mask is cut into blocks of block_q query positions x block_kv key positions. Each block
   of each slot is empty (never visited), full (visited without masking) or partial (visited,
   masked with a bitmap).

   Slots: one per (b, h) of the mask; B == 1 or H == 1 broadcast, so a slot is
   fx__bm_slot(m, b, h) and there are B * H slots.

   Forward lists (as PyTorch's kv_num_blocks / kv_indices with full_kv_* merged): row
   r = slot * nqb + qb lists the kv-blocks to visit, ascending:
       for (int64_t e = m->kv_ptr[r]; e < m->kv_ptr[r + 1]; e++) {
           int64_t kb = m->kv_idx[e];
           const uint64_t *bits = fx__bm_bits(m, m->kv_bits[e]);   // NULL: full block
       }
   Transposed lists (for dK / dV): column c = slot * nkb + kb lists the q-blocks that visit
   kv-block kb, ascending, in q_ptr / q_idx / q_bits, with the same bitmap offsets.

   Bitmaps: a partial block owns block_q rows of bm_words 64-bit words; bit j of row i is
   mask(b, h, qb * block_q + i, kb * block_kv + j). Bits of positions past q_len / kv_len are
   0. Test one with fx__bm_test(bits, m->bm_words, i, j). */

enum { FX__BLOCK_EMPTY = 0, FX__BLOCK_PARTIAL = 1, FX__BLOCK_FULL = 2 };

struct fx_block_mask {
    int64_t B, H;              /* as created: 1 means broadcast over batch / heads */
    int64_t q_len, kv_len;     /* absolute positions covered */
    int64_t block_q, block_kv; /* block sizes */
    int64_t nqb, nkb;          /* ceil(q_len / block_q), ceil(kv_len / block_kv) */
    int64_t nslots;            /* B * H */
    int mask_kind;             /* fx__mask_kind() of the mask it was built from */

    int64_t *kv_ptr;  /* [nslots * nqb + 1] offsets into kv_idx / kv_bits */
    int32_t *kv_idx;  /* [n_visited] kv-block of each entry */
    int64_t *kv_bits; /* [n_visited] word offset of the entry's bitmap in bits, -1 if full */

    int64_t *q_ptr;   /* [nslots * nkb + 1] offsets into q_idx / q_bits */
    int32_t *q_idx;   /* [n_visited] q-block of each entry */
    int64_t *q_bits;  /* [n_visited] word offset of the bitmap, -1 if full */

    uint64_t *bits;   /* [n_partial * block_q * bm_words] */
    int64_t bm_words; /* 64-bit words per bitmap row: ceil(block_kv / 64) */

    int64_t n_visited, n_partial, n_full; /* over all slots */
    size_t bytes;                         /* what fx_block_mask_bytes reports */

    int dev_index; /* fx_attention.device of the copy made by fx_block_mask_to_device, 0: none */
    void *dev;     /* that copy (src/cuda/device.c), NULL: none */
};

static inline int64_t fx__bm_slot(const fx_block_mask *m, int64_t b, int64_t h)
{
    return (m->B == 1 ? 0 : b) * m->H + (m->H == 1 ? 0 : h);
}
/* Forward row of (slot, q-block) and transposed column of (slot, kv-block). */
static inline int64_t fx__bm_row(const fx_block_mask *m, int64_t slot, int64_t qb) { return slot * m->nqb + qb; }
static inline int64_t fx__bm_col(const fx_block_mask *m, int64_t slot, int64_t kb) { return slot * m->nkb + kb; }
/* The bitmap at a word offset from kv_bits / q_bits; NULL for a full block (offset -1). */
static inline const uint64_t *fx__bm_bits(const fx_block_mask *m, int64_t off)
{
    return off < 0 ? NULL : m->bits + off;
}
/* Bit (i, j) of a block's bitmap: query i, key j inside the block. */
static inline bool fx__bm_test(const uint64_t *bits, int64_t bm_words, int64_t i, int64_t j)
{
    return (bits[i * bm_words + (j >> 6)] >> (j & 63)) & 1u;
}

/* ---- recognition of built-ins ------------------------------------------------------------- */

enum {
    FX__MASK_NONE = 0, /* mask fn NULL */
    FX__MASK_CUSTOM,
    FX__MASK_CAUSAL,
    FX__MASK_SLIDING_WINDOW,
    FX__MASK_PREFIX_LM,
    FX__MASK_DOCUMENT,
    FX__MASK_AND,
    FX__MASK_OR,
};
int fx__mask_kind(fx_mask_fn fn);

enum {
    FX__SCORE_NONE = 0, /* score_mod NULL */
    FX__SCORE_CUSTOM,
    FX__SCORE_ALIBI,
    FX__SCORE_SOFTCAP,
    FX__SCORE_REL_BIAS,
};
int fx__score_kind(fx_score_fn fn);

/* The rel_bias entry of relative distance d: clamp(d + zero, 0, size - 1). zero is the
   caller's and may be any int64_t: where d + zero overflows, the sum is past that end. */
static inline int64_t fx__rel_bias_entry(const fx_score_rel_bias_ctx *c, int64_t d)
{
    int64_t e;
    if (__builtin_add_overflow(d, c->zero, &e))
        return c->zero > 0 ? c->size - 1 : 0;
    return e < 0 ? 0 : e >= c->size ? c->size - 1 : e;
}

/* Classifies the block q in [q0, q1], kv in [k0, k1] (inclusive, in range) of a built-in
   mask analytically: FX__BLOCK_* or -1 when it cannot tell (custom masks). A PARTIAL answer
   may still turn out empty or full when the bits are evaluated. */
int fx__mask_classify(fx_mask_fn fn, const void *ctx, int64_t b, int64_t h, int64_t q0, int64_t q1,
                      int64_t k0, int64_t k1);

/* A document-mask block from the id ranges of its queries [qmin, qmax] and keys [kmin, kmax]
   (q in [q0, q1], kv in [k0, k1]): empty when the ranges miss each other or every key is
   after every query, the causal class when one id covers both, else partial. */
int fx__classify_document_ranges(int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax, int64_t q0, int64_t q1,
                                 int64_t k0, int64_t k1);

/* ---- attention entry points --------------------------------------------------------------- */

/* Checks everything about a call that does not depend on the direction: a != NULL, sizes > 0,
   Hq % Hkv, scale finite, q_offset >= 0, the mask's extent, B and H against the call, score
   mod, and q, k, v non-NULL. FX_OK or FX_EINVAL with a message. Outputs are checked by the
   caller. */
int fx__attention_check(const fx_attention *a, const float *q, const float *k, const float *v);
/* The scale the kernels use: a->scale, or 1/sqrt(D) when it is 0. */
float fx__attention_scale(const fx_attention *a);

/* The forward after fx__attention_check passed: runs the path of fx__attn_fwd_kernels_now().
   out [B,Hq,Lq,Dv] and lse [B,Hq,Lq] (may be NULL) are overwritten. FX_OK or FX_ENOMEM. */
int fx__flex_forward(const fx_attention *a, const float *q, const float *k, const float *v,
                     float *out, float *lse);
/* The paths themselves (same contract). The scalar one is the plain reference twin. */
int fx__flex_forward_scalar(const fx_attention *a, const float *q, const float *k, const float *v,
                            float *out, float *lse);
int fx__flex_forward_avx2(const fx_attention *a, const float *q, const float *k, const float *v,
                          float *out, float *lse);
int fx__flex_forward_avx512(const fx_attention *a, const float *q, const float *k, const float *v,
                            float *out, float *lse);
/* The AVX-512 path with its products in bfloat16 (bf16.h), where fx__attn16_cpu(). */
int fx__flex_forward_avx512bf16(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                                float *lse);

/* The forward's kernel table (docs/dispatch.md): one path each. */
typedef struct fx__attn_fwd_kernels {
    const char *name; /* what `flexc --version` prints */
    int (*forward)(const fx_attention *a, const float *q, const float *k, const float *v, float *out, float *lse);
    /* The same with the products in bfloat16 (FX__ATTN_BF16), taken where fx__attn16_cpu();
       NULL: the path has none (the call runs forward, in float32). */
    int (*forward_bf16)(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                        float *lse);
} fx__attn_fwd_kernels;
extern const fx__attn_fwd_kernels fx__attn_fwd_kernels_scalar, fx__attn_fwd_kernels_avx2,
    fx__attn_fwd_kernels_avx512;
/* The table of a CPU path (the scalar one in a build with FLEXC_REFERENCE_KERNELS), and of
   the current one (fx_get_isa()). */
const fx__attn_fwd_kernels *fx__attn_fwd_kernels_for(fx_isa isa);
const fx__attn_fwd_kernels *fx__attn_fwd_kernels_now(void);
/* The path of the mods' expression interpreter (mod.c's table), for flexc --version. */
const char *fx__mod_kernels_name(void);

/* Options of the internal entry points. FX__ATTN_BF16: the products take bfloat16 operands
   (bf16.h; the trainer's --dtype bf16) where the CPU has the kernels (the forward's
   forward_bf16 where fx__attn16_cpu(), the backward's fx__attn16_kernels_now()), float32
   elsewhere; the split-KV decoding path stays float32. */
enum { FX__ATTN_BF16 = 1u };
/* fx_flex_attention and fx_flex_attention_backward on the CPU, with options. */
int fx__flex_attention_with(const fx_attention *a, unsigned flags, const float *q, const float *k, const float *v,
                            float *out, float *lse);
int fx__flex_attention_backward_with(const fx_attention *a, unsigned flags, const float *q, const float *k,
                                     const float *v, const float *out, const float *lse, const float *dout, float *dq,
                                     float *dk, float *dv);

/* How a forward call is cut into work items (shared by every path). An item is (b, head
   group, q-block): the gs query heads of a head group share each K/V tile; gs is the GQA
   group size G when the mask is the same for every head (or absent), else 1.
   Item i: b = i / (n_hg * n_qb), hg = (i / n_qb) % n_hg, qbi = i % n_qb; its query heads are
   hg * gs + g (g < gs), all reading KV head (hg * gs) / G. */
typedef struct fx__fwd_plan {
    int64_t bq, bk;      /* block sizes (the mask's, or the dense ones) */
    int64_t qb_lo, n_qb; /* absolute q-blocks qb_lo .. qb_lo + n_qb - 1 hold rows q_offset .. q_offset + Lq - 1 */
    int64_t nkb;         /* kv-blocks holding keys 0 .. Lkv - 1 */
    int64_t G, gs, n_hg; /* GQA group size, heads per item, head groups per batch */
    int64_t n_items;     /* B * n_hg * n_qb */
    float scale;
    bool stream;         /* out is written with non-temporal stores (FX__STREAM_OUT_BYTES) */
} fx__fwd_plan;
/* Outputs of at least this many bytes are streamed to memory: more than the caches would keep
   until the caller reads them, so fetching their lines before overwriting them is wasted
   (6-14% of a sliding-window forward at L = 32768 and 8192). Smaller ones, such as a training
   step's, stay in cache for the next product to read. */
#define FX__STREAM_OUT_BYTES ((size_t)16 << 20)
void fx__fwd_plan_init(fx__fwd_plan *p, const fx_attention *a);
/* One work item of a plan: its rows and the kv-blocks it visits. */
typedef struct fx__fwd_item {
    int64_t b, h0, hkv; /* batch, first query head, the KV head they read */
    int64_t qa0, nr;    /* absolute position of the first row, and the row count */
    int64_t brow;       /* row of qa0 inside its mask block (bitmap lookups; 0 without a mask) */
    int64_t e0, e1;     /* the visited entries of the mask row (every kv-block without a mask) */
} fx__fwd_item;
void fx__fwd_item_init(const fx__fwd_plan *p, const fx_attention *a, int64_t item, fx__fwd_item *it);
/* An item's running state before its first kv-block: row maxima -inf, sums and outputs 0
   (rows: gs * bq; O: o_len floats, any padding included). */
static inline void fx__fwd_state_reset(float *M, float *L, int64_t rows, float *O, size_t o_len)
{
    for (int64_t i = 0; i < rows; i++) {
        M[i] = -INFINITY;
        L[i] = 0.0f;
    }
    memset(O, 0, o_len * sizeof(float));
}
/* The rows an item reads: its KV head's Lkv rows of k (width D) or v (width Dv), and the
   item's first query row of head h (width D). */
static inline const float *fx__fwd_kv_rows(const fx_attention *a, const fx__fwd_item *it, const float *x,
                                           int64_t width)
{
    return x + (size_t)((it->b * a->Hkv + it->hkv) * a->Lkv) * (size_t)width;
}
static inline const float *fx__fwd_q_rows(const fx_attention *a, const fx__fwd_item *it, const float *q, int64_t h)
{
    return q + (size_t)((it->b * a->Hq + h) * a->Lq + (it->qa0 - a->q_offset)) * (size_t)a->D;
}
/* Entry e of an item's mask row (kv-block e without a mask): its kv-block *kb, first key
   *k0, key count *nk and bitmap *bits (NULL: every key visible). False when the block
   starts past the call's keys (a mask longer than the call). */
static inline bool fx__fwd_kv_block(const fx_block_mask *m, const fx_attention *a, int64_t bk, int64_t e,
                                    int64_t *kb, int64_t *k0, int64_t *nk, const uint64_t **bits)
{
    *kb = m ? m->kv_idx[e] : e;
    *bits = m ? fx__bm_bits(m, m->kv_bits[e]) : NULL;
    *k0 = *kb * bk;
    if (*k0 >= a->Lkv)
        return false;
    *nk = a->Lkv - *k0 < bk ? a->Lkv - *k0 : bk;
    return true;
}
/* Writes an item's output rows from its running state: out = O / L (O rows of stride ldo, g
   major as [gs, bq]) and lse = M + log L (-inf and zeros where a row saw no key). */
void fx__fwd_item_store(const fx__fwd_plan *p, const fx_attention *a, const fx__fwd_item *it, const float *O,
                        int64_t ldo, const float *M, const float *L, float *out, float *lse);

/* Dense path's block sizes (mask == NULL): queries per work item and keys per tile. */
enum { FX__DENSE_BLOCK_Q = 128, FX__DENSE_BLOCK_KV = 128 };

#endif
