/* Decoding with a KV cache: prefill and one-token steps, attention through the decoding
   path of fx_flex_attention. The projections read each weight where it is (the model's
   float32 buffer, or a mapped file in F32, BF16 or F16): one token is a matrix-vector
   product per weight (fx__gemv), a prompt a matrix product (fx__linear_dt). */
#include "model_internal.h"

#include "core/gemv.h"

#include <flexc/mod.h>

#include <string.h>

/* ---- where the weights are ----------------------------------------------------------------------------- */

/* Tensor `which` after the layers: 0 the final norm, 1 lm_head. */
static fx__model_weight fx__final(const fx__model *m, int which)
{
    const fx__model_tensor *t = fx__layer_first(m, m->c.layers);
    if (m->mapped)
        return m->mapped->t[(size_t)(t - m->lay.t) + (size_t)which];
    return (fx__model_weight){fx__layer_base(m, false, m->c.layers) + (t[which].offset - t->offset), FX_DT_F32};
}

static fx__model_weight fx__embedding(const fx__model *m)
{
    return m->mapped ? m->mapped->t[0] : (fx__model_weight){m->params, FX_DT_F32};
}

static fx__model_weight fx__head(const fx__model *m)
{
    return m->c.tied_embeddings ? fx__embedding(m) : fx__final(m, 1);
}

/* The longest row a projection reads (C, Hq*hd or F): the widening tile's width. */
static int64_t fx__widest_input(const fx_model_config *c)
{
    int64_t QD = c->heads * c->head_dim, w = c->dim > QD ? c->dim : QD;
    return w > c->ffn ? w : c->ffn;
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
    /* Mods that read h: a layer's keys and values gathered for one call over every head. */
    size_t kvm = m->mods_h ? (size_t)(2 * KD * cap) : 0;
    return (fx__model_cache_bytes){
        .kv = (size_t)(c->layers * KD * cap) * sizeof(float), .doc = (size_t)cap * sizeof(int64_t),
        .scratch = (size_t)(cap * (2 * c->dim + 3 * QD + 2 * KD + wide + 2 * F + 1)) * sizeof(float) +
                   (tile + kvm) * sizeof(float)};
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
    if (m->mods_h)
        k->kvm = fx__alloc((size_t)(2 * c->kv_heads * c->head_dim * cap) * sizeof(float));
    if (!k->k || !k->v || !k->doc || !k->scratch || (m->mods_h && !k->kvm)) {
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
    fx__free(c->k), fx__free(c->v), fx__free(c->doc), fx__free(c->scratch), fx__free(c->kvm);
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
    if (m->mask_mod) {
        /* Decoding is one sequence: b is 0. */
        int rc = fx_block_mask_create_mod(&kc->bmask, m->mask_mod, 1, m->mods_h ? m->c.heads : 1, ctx, ctx, 0, 0);
        return rc ? fx__error_context(rc, "attention mask mod") : FX_OK;
    }
    const void *mctx;
    fx_mask_fn fn = fx__model_mask_fn(m->mask, &kc->mctx, &mctx);
    int rc = fx_block_mask_create(&kc->bmask, fn, mctx, 1, 1, ctx, ctx, 0, 0);
    return rc ? fx__error_context(rc, "attention mask") : FX_OK;
}

/* The scratch of one decoding call, carved from the cache's: rows of n tokens (at most cap). */
typedef struct decode_ws {
    float *x, *xn;      /* the residual stream and its norm [n, C] */
    float *qkv;         /* the projections [n, QD + 2 KD] */
    float *q, *att;     /* q rotated, head-major, and the attention's output [Hq, n, hd] */
    float *work;        /* token-major attention, SwiGLU [n, max(F, QD)] */
    float *h13;         /* gate and up [n, 2F] */
    float *rstd, *tile; /* the norm's per-row scale; the widening tile of bfloat16 weights */
} decode_ws;

static decode_ws decode_scratch(const fx_model_config *c, float *at, int64_t ctx)
{
    const int64_t C = c->dim, F = c->ffn, QD = c->heads * c->head_dim, KD = c->kv_heads * c->head_dim;
    const int64_t wide = F > QD ? F : QD;
    decode_ws w;
    w.x = at, w.xn = w.x + ctx * C, w.qkv = w.xn + ctx * C, w.q = w.qkv + ctx * (QD + 2 * KD);
    w.att = w.q + ctx * QD, w.work = w.att + ctx * QD, w.h13 = w.work + ctx * wide, w.rstd = w.h13 + ctx * 2 * F;
    w.tile = w.rstd + ctx;
    return w;
}

/* Layer l's attention of the n queries in io->q over the cache (which the layer has just
   written the n new keys and values into) into io->att. The cache holds each KV head's keys
   with a stride of cap, so each KV head and its group of query heads is one call. One causal
   query sees every cached key. */
typedef struct decode_attn {
    const fx__model *m;
    const fx__model_cache *kc;
    int64_t l, n;
} decode_attn;

static int decode_attn_run(void *ctx, const fx__layer_io *io)
{
    const decode_attn *d = ctx;
    const fx__model *m = d->m;
    const fx__model_cache *kc = d->kc;
    const fx_model_config *c = &m->c;
    const int64_t n = d->n, cap = kc->cap, p0 = kc->len, Hkv = c->kv_heads, hd = c->head_dim, G = c->heads / Hkv;
    const float *kl = kc->k + d->l * Hkv * hd * cap, *vl = kc->v + d->l * Hkv * hd * cap;
    const bool need_mask = n > 1 || m->mask == FX__MODEL_MASK_SLIDING || m->mask == FX__MODEL_MASK_DOCUMENT ||
                           m->mask_mod;
    if (m->mods_h) {
        /* Mods that read h see every head by its number in one call over the keys and values
           gathered out of the cache (whose heads are cap positions apart). */
        const int64_t L = p0 + n;
        float *kg = kc->kvm, *vg = kc->kvm + Hkv * L * hd;
        for (int64_t h = 0; h < Hkv; h++) {
            memcpy(kg + h * L * hd, kl + h * cap * hd, (size_t)(L * hd) * sizeof(float));
            memcpy(vg + h * L * hd, vl + h * cap * hd, (size_t)(L * hd) * sizeof(float));
        }
        fx__attn_call call = {.B = 1, .Hq = c->heads, .Hkv = Hkv, .Lq = n, .Lkv = L, .D = hd, .q_offset = p0,
                              .score = m->score_mod, .bm = need_mask ? kc->bmask : NULL};
        call.fn = m->mask_mod ? fx_mod_mask : fx__model_mask_fn(m->mask, &kc->mctx, &call.ctx);
        if (m->mask_mod)
            call.ctx = m->mask_mod;
        const int rc = fx__attn_fwd(m, &call, io->q.p, kg, vg, io->att, NULL);
        return rc ? fx__error_context(rc, "layer %lld attention", (long long)d->l) : FX_OK;
    }
    for (int64_t h = 0; h < Hkv; h++) {
        fx__attn_call call = {.B = 1, .Hq = G, .Hkv = 1, .Lq = n, .Lkv = p0 + n, .D = hd, .q_offset = p0,
                              .score = m->score_mod};
        call.fn = fx__model_mask_fn(m->mask, &kc->mctx, &call.ctx);
        if (m->mask_mod)
            call.fn = fx_mod_mask, call.ctx = m->mask_mod;
        if (!need_mask)
            call.fn = NULL;
        call.bm = need_mask ? kc->bmask : NULL;
        const int rc = fx__attn_fwd(m, &call, io->q.p + h * G * n * hd, kl + h * cap * hd, vl + h * cap * hd,
                                    io->att + h * G * n * hd, NULL);
        if (rc)
            return fx__error_context(rc, "layer %lld attention", (long long)d->l);
    }
    return FX_OK;
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
    if (m->mods_h && !kc->kvm)
        return fx__error(FX_EINVAL, "the cache was made before the model's attention mods were set (make it again)");
    if (m->device && (m->score_mod || m->mask_mod))
        return fx__error(FX_EUNSUPPORTED, "attention mods run on the CPU only, not on %s", m->device->name);
    if (p0 == 0 && (rc = fx__cache_mask(m, kc, tokens[0])) != FX_OK)
        return rc;
    if (m->device)
        return m->device->decode(m, kc, tokens, n, logits);
    const decode_ws w = decode_scratch(c, kc->scratch, ctx);
    fx__model_weight wte = fx__embedding(m);
    for (int64_t i = 0; i < n; i++)
        fx__widen_rows(w.x + i * C, wte.data, wte.dtype, tokens[i], tokens[i] + 1, C);
    /* The layers in place on the stream w.x; k and v go straight into the cache's heads. */
    const int64_t hd = c->head_dim, KD = c->kv_heads * hd;
    const fx__layer_rows r = {.B = 1, .T = n, .pos0 = p0};
    for (int64_t l = 0; l < c->layers; l++) {
        const fx__layer_w W = fx__layer_w_decode(m, l, w.tile);
        const fx__layer_io io = {
            .in = w.x, .mid = w.x, .out = w.x, .xn1 = w.xn, .rstd1 = w.rstd, .xn2 = w.xn, .rstd2 = w.rstd,
            .qkv = w.qkv, .q = {w.q, n * hd, 0}, .k = {kc->k + l * KD * ctx + p0 * hd, ctx * hd, 0},
            .v = {kc->v + l * KD * ctx + p0 * hd, ctx * hd, 0}, .att = w.att, .h13 = w.h13, .work = w.work};
        decode_attn d = {m, kc, l, n};
        if ((rc = fx__layer_run(&W, &r, &io, decode_attn_run, &d)) != FX_OK)
            return rc;
    }
    fx__rmsnorm_forward(w.xn, w.rstd, w.x + (n - 1) * C, fx__final(m, 0).data, 1, C, c->norm_eps);
    fx__model_weight head = fx__head(m);
    fx__gemv(logits, head.data, head.dtype, w.xn, V, C, false);
    kc->len = p0 + n;
    return FX_OK;
}
