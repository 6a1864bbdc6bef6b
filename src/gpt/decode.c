/* Decoding with a KV cache: prefill and one-token steps over the same layer code as the
   forward pass, attention through the decoding path of fx_flex_attention. */
#include "model_internal.h"

#include <string.h>

/* ---- decoding ------------------------------------------------------------------------------------------ */

int fx__gpt_cache_create(fx__gpt_cache **out, fx__gpt *m, int64_t max_len)
{
    if (!out || !m)
        return fx__error(FX_EINVAL, "fx__gpt_cache_create: NULL argument");
    const fx__gpt_config *c = &m->c;
    int64_t cap = max_len ? max_len : c->ctx;
    if (cap < 1 || cap > c->ctx)
        return fx__error(FX_EINVAL, "cache length %lld is outside [1, %lld] (the model's context)", (long long)cap,
                         (long long)c->ctx);
    int rc = fx__gpt_rope_ensure(m, cap);
    if (rc)
        return rc;
    int64_t hd = c->head_dim, QD = c->heads * hd, KD = c->kv_heads * hd, F = c->ffn;
    int64_t wide = F > QD ? F : QD;
    fx__gpt_cache *k = fx__calloc(1, sizeof *k);
    if (!k)
        return FX_ENOMEM;
    k->cap = cap;
    k->m = m;
    size_t kv = (size_t)(c->layers * KD * cap);
    k->k = fx__alloc(kv * sizeof(float));
    k->v = fx__alloc(kv * sizeof(float));
    k->doc = fx__alloc((size_t)cap * sizeof(int64_t));
    k->scratch = fx__alloc((size_t)(cap * (2 * c->dim + 3 * QD + 2 * KD + wide + 2 * F + 1)) * sizeof(float));
    if (!k->k || !k->v || !k->doc || !k->scratch) {
        fx__gpt_cache_free(k);
        return FX_ENOMEM;
    }
    *out = k;
    return FX_OK;
}

void fx__gpt_cache_free(fx__gpt_cache *c)
{
    if (!c)
        return;
    fx__free(c->k), fx__free(c->v), fx__free(c->doc), fx__free(c->scratch);
    fx_block_mask_free(c->bmask);
    fx__free(c);
}

/* The mask over absolute positions [cap, cap] for a sequence starting with `first`. Only a
   leading end-of-text can start a new document (generation stops at one). */
static int fx__cache_mask(fx__gpt *m, fx__gpt_cache *kc, int32_t first)
{
    int64_t ctx = kc->cap;
    kc->mctx.sliding.window = m->window;
    kc->mctx.document = (fx_mask_document_ctx){.doc_ids = kc->doc, .len = ctx, .batch_stride = 0};
    for (int64_t t = 0; t < ctx; t++)
        kc->doc[t] = t > 0 && first == FX__GPT_EOT;
    fx_block_mask_free(kc->bmask);
    kc->bmask = NULL;
    if (m->attn_impl == FX__GPT_ATTN_REF)
        return FX_OK;
    const void *mctx;
    fx_mask_fn fn = fx__gpt_mask_fn(m->mask, &kc->mctx, &mctx);
    int rc = fx_block_mask_create(&kc->bmask, fn, mctx, 1, 1, ctx, ctx, 0, 0);
    return rc ? fx__error_context(rc, "attention mask") : FX_OK;
}

int fx__gpt_decode(fx__gpt *m, fx__gpt_cache *kc, const int32_t *tokens, int64_t n, float *logits)
{
    const fx__gpt_config *c = &m->c;
    int64_t C = c->dim, F = c->ffn, V = c->vocab, ctx = kc->cap; /* ctx: the cache's positions */
    int64_t Hq = c->heads, Hkv = c->kv_heads, hd = c->head_dim, QD = Hq * hd, KD = Hkv * hd, G = Hq / Hkv;
    int64_t p0 = kc->len;
    if (!tokens || !logits || n < 1 || p0 + n > ctx)
        return fx__error(FX_EINVAL, "decoding %lld tokens at position %lld: outside the cache's %lld positions",
                         (long long)n, (long long)p0, (long long)ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return fx__error(FX_ERANGE, "token[%lld] = %d is outside [0, %lld)", (long long)i, tokens[i], (long long)V);
    int rc;
    if (p0 == 0 && (rc = fx__cache_mask(m, kc, tokens[0])) != FX_OK)
        return rc;
    int64_t wide = F > QD ? F : QD;
    float *x = kc->scratch, *xn = x + ctx * C, *qt = xn + ctx * C, *q = qt + ctx * QD, *att = q + ctx * QD;
    float *t1 = att + ctx * QD, *t2 = t1 + ctx * KD, *sx = t2 + ctx * KD, *h1 = sx + ctx * wide;
    float *h3 = h1 + ctx * F, *rstd = h3 + ctx * F;

    fx__embed_forward(x, tokens, m->params, n, C);
    for (int64_t l = 0; l < c->layers; l++) {
        fx__layer_params p = fx__layer(m, false, l);
        float *kl = kc->k + l * KD * ctx, *vl = kc->v + l * KD * ctx;
        fx__rmsnorm_forward(xn, rstd, x, p.ln1, n, C, c->norm_eps);
        fx__linear(qt, xn, p.wq, n, C, QD, false);
        fx__linear(t1, xn, p.wk, n, C, KD, false);
        fx__linear(t2, xn, p.wv, n, C, KD, false);
        if (p.bq) {
            fx__bias_forward(qt, p.bq, n, QD);
            fx__bias_forward(t1, p.bk, n, KD);
            fx__bias_forward(t2, p.bv, n, KD);
        }
        fx__rope_forward(q, qt, m->rope, 1, n, Hq, hd, p0);
        /* New keys and values go to positions p0.. of each head's [cap, hd] cache. */
        fx__rope_forward(sx, t1, m->rope, 1, n, Hkv, hd, p0);
        for (int64_t h = 0; h < Hkv; h++)
            memcpy(kl + (h * ctx + p0) * hd, sx + h * n * hd, (size_t)(n * hd) * sizeof(float));
        fx__to_heads(sx, t2, 1, n, Hkv, hd);
        for (int64_t h = 0; h < Hkv; h++)
            memcpy(vl + (h * ctx + p0) * hd, sx + h * n * hd, (size_t)(n * hd) * sizeof(float));
        /* The cache holds each KV head's keys with a stride of cap, so each KV head and its
           group of query heads is one call. One causal query sees every cached key. */
        for (int64_t h = 0; h < Hkv; h++) {
            fx__attn_call call = {.B = 1, .Hq = G, .Hkv = 1, .Lq = n, .Lkv = p0 + n, .D = hd, .q_offset = p0};
            call.fn = fx__gpt_mask_fn(m->mask, &kc->mctx, &call.ctx);
            bool need_mask = n > 1 || m->mask == FX__GPT_MASK_SLIDING || m->mask == FX__GPT_MASK_DOCUMENT;
            call.bm = need_mask ? kc->bmask : NULL;
            if (!need_mask)
                call.fn = NULL;
            rc = fx__attn_fwd(m, &call, q + h * G * n * hd, kl + h * ctx * hd, vl + h * ctx * hd,
                              att + h * G * n * hd, NULL);
            if (rc)
                return fx__error_context(rc, "layer %lld attention", (long long)l);
        }
        fx__from_heads(sx, att, 1, n, Hq, hd);
        fx__linear(x, sx, p.wo, n, QD, C, true);
        fx__rmsnorm_forward(xn, rstd, x, p.ln2, n, C, c->norm_eps);
        fx__linear(h1, xn, p.w1, n, C, F, false);
        fx__linear(h3, xn, p.w3, n, C, F, false);
        fx__swiglu_forward(sx, h1, h3, n * F);
        fx__linear(x, sx, p.w2, n, F, C, true);
    }
    const fx__gpt_tensor *tn = fx__layer_first(m, c->layers);
    fx__rmsnorm_forward(xn, rstd, x + (n - 1) * C, m->params + tn->offset, 1, C, c->norm_eps);
    fx__linear(logits, xn, fx__gpt_head(m, false), 1, C, V, false);
    kc->len = p0 + n;
    return FX_OK;
}
