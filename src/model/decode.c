/* Decoding with a KV cache: prefill and one-token steps, attention through the decoding
   path of fx_flex_attention. The projections read each weight where it is (the model's
   float32 buffer, or a mapped file in F32, BF16 or F16): one token is a matrix-vector
   product per weight (fx__gemv), a prompt a matrix product (fx__linear_dt). */
#include "model_internal.h"

#include "core/gemv.h"
#include "cuda/model_gpu.h"

#include <string.h>

/* ---- where the weights are ----------------------------------------------------------------------------- */

/* Tensor `which` of layer l (l == layers: the final norm, then lm_head). */
static fx__model_weight fx__weight(const fx__model *m, int64_t l, int which)
{
    const fx__model_tensor *t = fx__layer_first(m, l);
    if (m->mapped)
        return m->mapped->t[(size_t)(t - m->lay.t) + (size_t)which];
    return (fx__model_weight){fx__layer_base(m, false, l) + (t[which].offset - t->offset), FX_DT_F32};
}

static fx__model_weight fx__embedding(const fx__model *m)
{
    return m->mapped ? m->mapped->t[0] : (fx__model_weight){m->params, FX_DT_F32};
}

static fx__model_weight fx__head(const fx__model *m)
{
    return m->c.tied_embeddings ? fx__embedding(m) : fx__weight(m, m->c.layers, 1);
}

/* The longest row a projection reads (C, Hq*hd or F): the widening tile's width. */
static int64_t fx__widest_input(const fx_model_config *c)
{
    int64_t QD = c->heads * c->head_dim, w = c->dim > QD ? c->dim : QD;
    return w > c->ffn ? w : c->ffn;
}

/* As fx__rope_forward, for q and k whose heads hold the rotated pairs as halves (x[i] with
   x[i + hd/2], frequency i: Hugging Face's order): the same products, other places. */
static void fx__rope_half_forward(float *out, const float *x, const float *rope, int64_t T, int64_t H, int64_t hd,
                                  int64_t pos0)
{
    int64_t half = hd / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *cs = rope + (pos0 + t) * half * 2;
        for (int64_t h = 0; h < H; h++) {
            const float *src = x + (t * H + h) * hd;
            float *dst = out + (h * T + t) * hd;
            for (int64_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1];
                float x0 = src[i], x1 = src[i + half];
                dst[i] = x0 * c - x1 * s;
                dst[i + half] = x0 * s + x1 * c;
            }
        }
    }
}

/* ---- decoding ------------------------------------------------------------------------------------------ */

fx__model_cache_bytes fx__model_cache_size(const fx__model *m, int64_t cap)
{
    const fx_model_config *c = &m->c;
    int64_t hd = c->head_dim, QD = c->heads * hd, KD = c->kv_heads * hd, F = c->ffn;
    int64_t wide = F > QD ? F : QD;
    /* A mapped model in BF16 or F16 widens a tile of weight rows per prompt product. */
    bool widen = false;
    for (size_t i = 0; m->mapped && i < m->lay.n; i++)
        widen = widen || m->mapped->t[i].dtype != FX_DT_F32;
    size_t tile = widen ? (size_t)(FX__WIDEN_TILE * fx__widest_input(c)) : 0;
    return (fx__model_cache_bytes){
        .kv = (size_t)(c->layers * KD * cap) * sizeof(float), .doc = (size_t)cap * sizeof(int64_t),
        .scratch = (size_t)(cap * (2 * c->dim + 3 * QD + 2 * KD + wide + 2 * F + 1)) * sizeof(float) +
                   tile * sizeof(float)};
}

int fx__model_cache_create(fx__model_cache **out, fx__model *m, int64_t max_len)
{
    if (!out || !m)
        return fx__error(FX_EINVAL, "fx__model_cache_create: NULL argument");
    const fx_model_config *c = &m->c;
    int64_t cap = max_len ? max_len : c->ctx;
    if (cap < 1 || cap > c->ctx)
        return fx__error(FX_EINVAL, "cache length %lld is outside [1, %lld] (the model's context)", (long long)cap,
                         (long long)c->ctx);
    int rc = fx__model_rope_ensure(m, cap);
    if (rc)
        return rc;
    fx__model_cache *k = fx__calloc(1, sizeof *k);
    if (!k)
        return FX_ENOMEM;
    k->cap = cap;
    k->m = m;
    fx__model_cache_bytes b = fx__model_cache_size(m, cap);
    k->k = fx__alloc(b.kv);
    k->v = fx__alloc(b.kv);
    k->doc = fx__alloc(b.doc);
    k->scratch = fx__alloc(b.scratch);
    if (!k->k || !k->v || !k->doc || !k->scratch) {
        fx__model_cache_free(k);
        return FX_ENOMEM;
    }
    *out = k;
    return FX_OK;
}

void fx__model_cache_free(fx__model_cache *c)
{
    if (!c)
        return;
    fx__free(c->k), fx__free(c->v), fx__free(c->doc), fx__free(c->scratch);
    fx_block_mask_free(c->bmask);
    fx__free(c);
}

/* The mask over absolute positions [cap, cap] for a sequence starting with `first`. Only a
   leading document separator (the model's first eos id, as in training: forward.c) can start
   a new document (generation stops at one). */
static int fx__cache_mask(fx__model *m, fx__model_cache *kc, int32_t first)
{
    int64_t ctx = kc->cap;
    const int32_t sep = m->c.n_eos ? m->c.eos[0] : -1;
    kc->mctx.sliding.window = m->window;
    kc->mctx.document = (fx_mask_document_ctx){.doc_ids = kc->doc, .len = ctx, .batch_stride = 0};
    for (int64_t t = 0; t < ctx; t++)
        kc->doc[t] = t > 0 && first == sep;
    fx_block_mask_free(kc->bmask);
    kc->bmask = NULL;
    if (m->attn_impl == FX__MODEL_ATTN_REF)
        return FX_OK;
    const void *mctx;
    fx_mask_fn fn = fx__model_mask_fn(m->mask, &kc->mctx, &mctx);
    int rc = fx_block_mask_create(&kc->bmask, fn, mctx, 1, 1, ctx, ctx, 0, 0);
    return rc ? fx__error_context(rc, "attention mask") : FX_OK;
}

/* The scratch of one decoding call, carved from the cache's: rows of n tokens (at most cap). */
typedef struct decode_ws {
    float *x, *xn;      /* the residual stream and its norm [n, C] */
    float *qt, *q, *att; /* q as projected, rotated head-major, attention's output [n, QD] */
    float *t1, *t2;     /* k and v as projected [n, KD] */
    float *sx;          /* rotated k, v or attention head-major, token-major attention, SwiGLU [n, max(F, QD)] */
    float *h1, *h3;     /* gate and up [n, F] */
    float *rstd, *tile; /* the norm's per-row scale; the widening tile of bfloat16 weights */
} decode_ws;

static decode_ws decode_scratch(const fx_model_config *c, float *at, int64_t ctx)
{
    const int64_t C = c->dim, F = c->ffn, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
    const int64_t wide = F > QD ? F : QD;
    decode_ws w;
    w.x = at, w.xn = w.x + ctx * C, w.qt = w.xn + ctx * C, w.q = w.qt + ctx * QD, w.att = w.q + ctx * QD;
    w.t1 = w.att + ctx * QD, w.t2 = w.t1 + ctx * KD, w.sx = w.t2 + ctx * KD, w.h1 = w.sx + ctx * wide;
    w.h3 = w.h1 + ctx * F, w.rstd = w.h3 + ctx * F, w.tile = w.rstd + ctx;
    return w;
}

/* Layer l's norm and projections of w->x into q (rotated, head-major, w->q), and the n new
   keys and values into positions p0.. of each head's [cap, hd] cache. */
static void decode_qkv(const fx__model *m, fx__model_cache *kc, int64_t l, const decode_ws *w, int64_t n)
{
    const fx_model_config *c = &m->c;
    const int64_t C = c->dim, ctx = kc->cap, p0 = kc->len, Hq = c->heads, Hkv = c->kv_heads, hd = c->head_dim;
    const int64_t QD = Hq * hd, KD = Hkv * hd;
    fx__model_weight wq = fx__weight(m, l, FX__MODEL_WQ), wk = fx__weight(m, l, FX__MODEL_WK);
    fx__model_weight wv = fx__weight(m, l, FX__MODEL_WV);
    float *kl = kc->k + l * KD * ctx, *vl = kc->v + l * KD * ctx;
    fx__rmsnorm_forward(w->xn, w->rstd, w->x, fx__weight(m, l, FX__MODEL_LN1).data, n, C, c->norm_eps);
    fx__linear_dt(w->qt, w->xn, wq.data, wq.dtype, n, C, QD, false, w->tile);
    fx__linear_dt(w->t1, w->xn, wk.data, wk.dtype, n, C, KD, false, w->tile);
    fx__linear_dt(w->t2, w->xn, wv.data, wv.dtype, n, C, KD, false, w->tile);
    if (c->qkv_bias) {
        fx__bias_forward(w->qt, fx__weight(m, l, FX__MODEL_BQ).data, n, QD);
        fx__bias_forward(w->t1, fx__weight(m, l, FX__MODEL_BK).data, n, KD);
        fx__bias_forward(w->t2, fx__weight(m, l, FX__MODEL_BV).data, n, KD);
    }
    if (m->mapped && m->mapped->rope_half) {
        fx__rope_half_forward(w->q, w->qt, m->rope, n, Hq, hd, p0);
        fx__rope_half_forward(w->sx, w->t1, m->rope, n, Hkv, hd, p0);
    } else {
        fx__rope_forward(w->q, w->qt, QD, m->rope, 1, n, Hq, hd, p0);
        fx__rope_forward(w->sx, w->t1, KD, m->rope, 1, n, Hkv, hd, p0);
    }
    for (int64_t h = 0; h < Hkv; h++)
        memcpy(kl + (h * ctx + p0) * hd, w->sx + h * n * hd, (size_t)(n * hd) * sizeof(float));
    const float *v = w->t2; /* one token: [1, Hkv, hd] is already head-major */
    if (n > 1) {
        fx__to_heads(w->sx, w->t2, KD, 1, n, Hkv, hd);
        v = w->sx;
    }
    for (int64_t h = 0; h < Hkv; h++)
        memcpy(vl + (h * ctx + p0) * hd, v + h * n * hd, (size_t)(n * hd) * sizeof(float));
}

/* Layer l's attention of the n queries in w->q over the cache into w->att. The cache holds
   each KV head's keys with a stride of cap, so each KV head and its group of query heads is
   one call. One causal query sees every cached key. */
static int decode_attention(fx__model *m, fx__model_cache *kc, int64_t l, const decode_ws *w, int64_t n)
{
    const fx_model_config *c = &m->c;
    const int64_t ctx = kc->cap, p0 = kc->len, Hkv = c->kv_heads, hd = c->head_dim, G = c->heads / Hkv;
    const float *kl = kc->k + l * Hkv * hd * ctx, *vl = kc->v + l * Hkv * hd * ctx;
    const bool need_mask = n > 1 || m->mask == FX__MODEL_MASK_SLIDING || m->mask == FX__MODEL_MASK_DOCUMENT;
    for (int64_t h = 0; h < Hkv; h++) {
        fx__attn_call call = {.B = 1, .Hq = G, .Hkv = 1, .Lq = n, .Lkv = p0 + n, .D = hd, .q_offset = p0};
        call.fn = fx__model_mask_fn(m->mask, &kc->mctx, &call.ctx);
        if (!need_mask)
            call.fn = NULL;
        call.bm = need_mask ? kc->bmask : NULL;
        const int rc = fx__attn_fwd(m, &call, w->q + h * G * n * hd, kl + h * ctx * hd, vl + h * ctx * hd,
                                    w->att + h * G * n * hd, NULL);
        if (rc)
            return fx__error_context(rc, "layer %lld attention", (long long)l);
    }
    return FX_OK;
}

/* Layer l's output projection of w->att and its MLP, each added into w->x. */
static void decode_out_mlp(const fx__model *m, int64_t l, const decode_ws *w, int64_t n)
{
    const fx_model_config *c = &m->c;
    const int64_t C = c->dim, F = c->ffn, Hq = c->heads, hd = c->head_dim, QD = Hq * hd;
    fx__model_weight wo = fx__weight(m, l, FX__MODEL_WO), w1 = fx__weight(m, l, FX__MODEL_W1);
    fx__model_weight w3 = fx__weight(m, l, FX__MODEL_W3), w2 = fx__weight(m, l, FX__MODEL_W2);
    const float *ao = w->att; /* one token: [Hq, 1, hd] is already token-major */
    if (n > 1) {
        fx__from_heads(w->sx, QD, w->att, 1, n, Hq, hd);
        ao = w->sx;
    }
    fx__linear_dt(w->x, ao, wo.data, wo.dtype, n, QD, C, true, w->tile);
    fx__rmsnorm_forward(w->xn, w->rstd, w->x, fx__weight(m, l, FX__MODEL_LN2).data, n, C, c->norm_eps);
    fx__linear_dt(w->h1, w->xn, w1.data, w1.dtype, n, C, F, false, w->tile);
    fx__linear_dt(w->h3, w->xn, w3.data, w3.dtype, n, C, F, false, w->tile);
    fx__swiglu_forward(w->sx, F, w->h1, w->h3, F, n, F);
    fx__linear_dt(w->x, w->sx, w2.data, w2.dtype, n, F, C, true, w->tile);
}

int fx__model_decode(fx__model *m, fx__model_cache *kc, const int32_t *tokens, int64_t n, float *logits)
{
    const fx_model_config *c = &m->c;
    const int64_t C = c->dim, V = c->vocab, ctx = kc->cap, p0 = kc->len; /* ctx: the cache's positions */
    if (!tokens || !logits || n < 1 || p0 + n > ctx)
        return fx__error(FX_EINVAL, "decoding %lld tokens at position %lld: outside the cache's %lld positions",
                         (long long)n, (long long)p0, (long long)ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return fx__error(FX_ERANGE, "token[%lld] = %d is outside [0, %lld)", (long long)i, tokens[i], (long long)V);
    int rc;
    if (p0 == 0 && (rc = fx__cache_mask(m, kc, tokens[0])) != FX_OK)
        return rc;
    if (m->gpu)
        return fx__model_gpu_decode(m, kc, tokens, n, logits);
    const decode_ws w = decode_scratch(c, kc->scratch, ctx);
    fx__model_weight wte = fx__embedding(m);
    for (int64_t i = 0; i < n; i++)
        fx__widen_rows(w.x + i * C, wte.data, wte.dtype, tokens[i], tokens[i] + 1, C);
    for (int64_t l = 0; l < c->layers; l++) {
        decode_qkv(m, kc, l, &w, n);
        if ((rc = decode_attention(m, kc, l, &w, n)) != FX_OK)
            return rc;
        decode_out_mlp(m, l, &w, n);
    }
    fx__rmsnorm_forward(w.xn, w.rstd, w.x + (n - 1) * C, fx__weight(m, c->layers, 0).data, 1, C, c->norm_eps);
    fx__model_weight head = fx__head(m);
    fx__gemv(logits, head.data, head.dtype, w.xn, V, C, false);
    kc->len = p0 + n;
    return FX_OK;
}
