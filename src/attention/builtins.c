/* Built-in masks and score modifiers, their recognition by address, and the analytic
   classification of blocks for the built-in masks. */
#include "attention/internal.h"

/* ---- masks -------------------------------------------------------------------------------- */

bool fx_mask_causal(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    return kv_idx <= q_idx;
}

bool fx_mask_sliding_window(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    (void)b, (void)h;
    const fx_mask_sliding_window_ctx *c = ctx;
    return kv_idx <= q_idx && q_idx - kv_idx < c->window;
}

static int64_t prefix_of(const fx_mask_prefix_lm_ctx *c, int64_t b)
{
    return c->prefix_len[b < c->n ? b : c->n - 1];
}

bool fx_mask_prefix_lm(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    (void)h;
    return kv_idx < prefix_of(ctx, b) || kv_idx <= q_idx;
}

static const int64_t *doc_row(const fx_mask_document_ctx *c, int64_t b)
{
    return c->doc_ids + b * c->batch_stride;
}

bool fx_mask_document(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    (void)h;
    const int64_t *id = doc_row(ctx, b);
    return kv_idx <= q_idx && id[q_idx] == id[kv_idx];
}

bool fx_mask_and(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    const fx_mask_pair_ctx *c = ctx;
    return c->a(b, h, q_idx, kv_idx, c->a_ctx) && c->b(b, h, q_idx, kv_idx, c->b_ctx);
}

bool fx_mask_or(int64_t b, int64_t h, int64_t q_idx, int64_t kv_idx, const void *ctx)
{
    const fx_mask_pair_ctx *c = ctx;
    return c->a(b, h, q_idx, kv_idx, c->a_ctx) || c->b(b, h, q_idx, kv_idx, c->b_ctx);
}

int fx__mask_kind(fx_mask_fn fn)
{
    if (!fn)
        return FX__MASK_NONE;
    if (fn == fx_mask_causal)
        return FX__MASK_CAUSAL;
    if (fn == fx_mask_sliding_window)
        return FX__MASK_SLIDING_WINDOW;
    if (fn == fx_mask_prefix_lm)
        return FX__MASK_PREFIX_LM;
    if (fn == fx_mask_document)
        return FX__MASK_DOCUMENT;
    if (fn == fx_mask_and)
        return FX__MASK_AND;
    if (fn == fx_mask_or)
        return FX__MASK_OR;
    return FX__MASK_CUSTOM;
}

/* Causal part of a block: empty when every key is after every query, full when every key is
   at or before every query. */
static int classify_causal(int64_t q0, int64_t q1, int64_t k0, int64_t k1)
{
    if (k0 > q1)
        return FX__BLOCK_EMPTY;
    if (k1 <= q0)
        return FX__BLOCK_FULL;
    return FX__BLOCK_PARTIAL;
}

static int classify_document(const fx_mask_document_ctx *c, int64_t b, int64_t q0, int64_t q1,
                             int64_t k0, int64_t k1)
{
    int causal = classify_causal(q0, q1, k0, k1);
    if (causal == FX__BLOCK_EMPTY)
        return causal;
    const int64_t *id = doc_row(c, b);
    int64_t qmin = id[q0], qmax = id[q0], kmin = id[k0], kmax = id[k0];
    for (int64_t i = q0 + 1; i <= q1; i++) {
        qmin = id[i] < qmin ? id[i] : qmin;
        qmax = id[i] > qmax ? id[i] : qmax;
    }
    for (int64_t j = k0 + 1; j <= k1; j++) {
        kmin = id[j] < kmin ? id[j] : kmin;
        kmax = id[j] > kmax ? id[j] : kmax;
    }
    return fx__classify_document_ranges(qmin, qmax, kmin, kmax, q0, q1, k0, k1);
}

int fx__classify_document_ranges(int64_t qmin, int64_t qmax, int64_t kmin, int64_t kmax, int64_t q0, int64_t q1,
                                 int64_t k0, int64_t k1)
{
    int causal = classify_causal(q0, q1, k0, k1);
    if (causal == FX__BLOCK_EMPTY || qmax < kmin || kmax < qmin)
        return FX__BLOCK_EMPTY;
    if (qmin == qmax && kmin == kmax && qmin == kmin)
        return causal;
    return FX__BLOCK_PARTIAL;
}

int fx__mask_classify(fx_mask_fn fn, const void *ctx, int64_t b, int64_t h, int64_t q0, int64_t q1,
                      int64_t k0, int64_t k1)
{
    switch (fx__mask_kind(fn)) {
    case FX__MASK_CAUSAL:
        return classify_causal(q0, q1, k0, k1);
    case FX__MASK_SLIDING_WINDOW: {
        int64_t w = ((const fx_mask_sliding_window_ctx *)ctx)->window;
        int causal = classify_causal(q0, q1, k0, k1);
        if (causal == FX__BLOCK_EMPTY || q0 - k1 >= w) /* every key too far back */
            return FX__BLOCK_EMPTY;
        if (causal == FX__BLOCK_FULL && q1 - k0 < w)
            return FX__BLOCK_FULL;
        return FX__BLOCK_PARTIAL;
    }
    case FX__MASK_PREFIX_LM: {
        int64_t p = prefix_of(ctx, b);
        if (k1 < p)
            return FX__BLOCK_FULL;
        int causal = classify_causal(q0, q1, k0, k1);
        if (causal == FX__BLOCK_EMPTY && k0 >= p)
            return FX__BLOCK_EMPTY;
        if (causal == FX__BLOCK_FULL)
            return FX__BLOCK_FULL;
        return FX__BLOCK_PARTIAL;
    }
    case FX__MASK_DOCUMENT:
        return classify_document(ctx, b, q0, q1, k0, k1);
    case FX__MASK_AND:
    case FX__MASK_OR: {
        const fx_mask_pair_ctx *c = ctx;
        int x = fx__mask_classify(c->a, c->a_ctx, b, h, q0, q1, k0, k1);
        int y = fx__mask_classify(c->b, c->b_ctx, b, h, q0, q1, k0, k1);
        if (fn == fx_mask_and) {
            if (x == FX__BLOCK_EMPTY || y == FX__BLOCK_EMPTY)
                return FX__BLOCK_EMPTY;
            if (x == FX__BLOCK_FULL && y == FX__BLOCK_FULL)
                return FX__BLOCK_FULL;
        } else {
            if (x == FX__BLOCK_FULL || y == FX__BLOCK_FULL)
                return FX__BLOCK_FULL;
            if (x == FX__BLOCK_EMPTY && y == FX__BLOCK_EMPTY)
                return FX__BLOCK_EMPTY;
        }
        return x < 0 || y < 0 ? -1 : FX__BLOCK_PARTIAL;
    }
    default:
        return -1;
    }
}

/* ---- score modifiers ---------------------------------------------------------------------- */

void fx_score_alibi(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                    int64_t kv0, const void *ctx)
{
    (void)b;
    float slope = ((const fx_score_alibi_ctx *)ctx)->slopes[h];
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            s[i * ld + j] += slope * (float)((kv0 + j) - (q0 + i));
}

void fx_score_alibi_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                         int64_t h, int64_t q0, int64_t kv0, const void *ctx)
{
    /* An additive bias: the gradient passes through unchanged. */
    (void)s, (void)g, (void)ld, (void)nq, (void)nkv, (void)b, (void)h, (void)q0, (void)kv0, (void)ctx;
}

void fx_score_softcap(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                      int64_t q0, int64_t kv0, const void *ctx)
{
    (void)b, (void)h, (void)q0, (void)kv0;
    float c = ((const fx_score_softcap_ctx *)ctx)->cap;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            s[i * ld + j] = c * tanhf(s[i * ld + j] / c);
}

void fx_score_softcap_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                           int64_t h, int64_t q0, int64_t kv0, const void *ctx)
{
    (void)b, (void)h, (void)q0, (void)kv0;
    float c = ((const fx_score_softcap_ctx *)ctx)->cap;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++) {
            float t = tanhf(s[i * ld + j] / c);
            g[i * ld + j] *= 1.0f - t * t;
        }
}


void fx_score_rel_bias(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                       int64_t q0, int64_t kv0, const void *ctx)
{
    (void)b;
    const fx_score_rel_bias_ctx *c = ctx;
    const float *t = c->table + (c->heads == 1 ? 0 : h) * c->size;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            s[i * ld + j] += t[fx__rel_bias_entry(c, (q0 + i) - (kv0 + j))];
}

void fx_score_rel_bias_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                            int64_t h, int64_t q0, int64_t kv0, const void *ctx)
{
    (void)s, (void)g, (void)ld, (void)nq, (void)nkv, (void)b, (void)h, (void)q0, (void)kv0, (void)ctx;
}

int fx__score_kind(fx_score_fn fn)
{
    if (!fn)
        return FX__SCORE_NONE;
    if (fn == fx_score_alibi)
        return FX__SCORE_ALIBI;
    if (fn == fx_score_softcap)
        return FX__SCORE_SOFTCAP;
    if (fn == fx_score_rel_bias)
        return FX__SCORE_REL_BIAS;
    return FX__SCORE_CUSTOM;
}
