/* The GPT: configuration, the parameter table, forward, backward, AdamW and decoding. */
#include "gpt.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ------------------------------------------------------------------------- */

int fx__gpt_preset(fx__gpt_config *c, const char *name)
{
    fx__gpt_config base = {.vocab = FX__GPT_VOCAB, .rope_theta = 10000.0f, .norm_eps = 1e-5f};
    if (!name)
        return fx__error(FX_EINVAL, "model preset is NULL");
    if (!strcmp(name, "tiny")) {
        base.layers = 2, base.dim = 64, base.heads = 4, base.kv_heads = 2, base.ctx = 64;
    } else if (!strcmp(name, "small")) {
        base.layers = 6, base.dim = 384, base.heads = 6, base.kv_heads = 2, base.ctx = 256;
    } else if (!strcmp(name, "gpt2")) {
        base.layers = 12, base.dim = 768, base.heads = 12, base.kv_heads = 12, base.ctx = 1024;
    } else {
        return fx__error(FX_EINVAL, "model '%s' is not a preset (tiny, small, gpt2)", name);
    }
    *c = base;
    return FX_OK;
}

int fx__gpt_config_check(fx__gpt_config *c)
{
#define FX__RANGE(field, lo, hi)                                                              \
    if (c->field < (lo) || c->field > (hi))                                                   \
        return fx__error(FX_EINVAL, #field " = %lld is outside [%lld, %lld]", (long long)c->field, \
                         (long long)(lo), (long long)(hi));
    FX__RANGE(vocab, 2, 1 << 20)
    FX__RANGE(ctx, 1, 1 << 20)
    FX__RANGE(layers, 1, 1024)
    FX__RANGE(dim, 2, 65536)
    FX__RANGE(heads, 1, 4096)
    FX__RANGE(kv_heads, 1, 4096)
#undef FX__RANGE
    if (c->dim % c->heads)
        return fx__error(FX_EINVAL, "dim = %lld is not a multiple of heads = %lld", (long long)c->dim,
                         (long long)c->heads);
    int64_t hd = c->dim / c->heads;
    if (hd % 2 || hd > 512)
        return fx__error(FX_EINVAL, "head size dim/heads = %lld must be even and <= 512", (long long)hd);
    if (c->heads % c->kv_heads)
        return fx__error(FX_EINVAL, "heads = %lld is not a multiple of kv_heads = %lld", (long long)c->heads,
                         (long long)c->kv_heads);
    if (c->ffn == 0)
        c->ffn = (8 * c->dim / 3 + 31) / 32 * 32;
    if (c->ffn < 1 || c->ffn > (1 << 20))
        return fx__error(FX_EINVAL, "ffn = %lld is outside [1, 1048576]", (long long)c->ffn);
    if (!(c->rope_theta > 1.0f) || !(c->norm_eps > 0.0f))
        return fx__error(FX_EINVAL, "rope_theta = %g must be > 1 and norm_eps = %g > 0", (double)c->rope_theta,
                         (double)c->norm_eps);
    return FX_OK;
}

int fx__gpt_mask_parse(const char *s, fx__gpt_mask *mask, int64_t *window)
{
    *window = 0;
    if (!s)
        return fx__error(FX_EINVAL, "attention mask is NULL");
    if (!strcmp(s, "causal"))
        *mask = FX__GPT_MASK_CAUSAL;
    else if (!strcmp(s, "document"))
        *mask = FX__GPT_MASK_DOCUMENT;
    else if (!strcmp(s, "dense"))
        *mask = FX__GPT_MASK_DENSE;
    else if (!strncmp(s, "sliding:", 8)) {
        char *end = NULL;
        errno = 0;
        long long w = strtoll(s + 8, &end, 10);
        if (end == s + 8 || *end || w < 1 || errno == ERANGE)
            return fx__error(FX_EINVAL, "attention '%s': the window after 'sliding:' must be an integer >= 1", s);
        *mask = FX__GPT_MASK_SLIDING;
        *window = w;
    } else {
        return fx__error(FX_EINVAL, "attention '%s' is not causal, sliding:W, document or dense", s);
    }
    return FX_OK;
}

void fx__gpt_mask_name(fx__gpt_mask mask, int64_t window, char *buf, size_t n)
{
    switch (mask) {
    case FX__GPT_MASK_CAUSAL: snprintf(buf, n, "causal"); break;
    case FX__GPT_MASK_SLIDING: snprintf(buf, n, "sliding:%lld", (long long)window); break;
    case FX__GPT_MASK_DOCUMENT: snprintf(buf, n, "document"); break;
    case FX__GPT_MASK_DENSE: snprintf(buf, n, "dense"); break;
    }
}

/* ---- the parameter table ------------------------------------------------------------------------ */

static void fx__add_tensor(fx__gpt_layout *lay, const char *name, int64_t d0, int64_t d1)
{
    fx__gpt_tensor *t = &lay->t[lay->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    t->offset = lay->total;
    t->decay = d1 != 0;
    lay->total += t->numel;
}

static int fx__layout_build(fx__gpt_layout *lay, const fx__gpt_config *c)
{
    size_t n = 2 + (size_t)c->layers * FX__GPT_PER_LAYER;
    lay->t = fx__calloc(n, sizeof *lay->t);
    if (!lay->t)
        return FX_ENOMEM;
    lay->n = 0;
    lay->total = 0;
    int64_t C = c->dim, hd = c->dim / c->heads, QD = c->heads * hd, KD = c->kv_heads * hd, F = c->ffn;
    fx__add_tensor(lay, "wte", c->vocab, C);
    char name[48];
    for (int64_t l = 0; l < c->layers; l++) {
#define FX__T(suffix, d0, d1) (snprintf(name, sizeof name, "layers.%lld." suffix, (long long)l), \
                               fx__add_tensor(lay, name, d0, d1))
        FX__T("norm1", C, 0);
        FX__T("attn.wq", QD, C);
        FX__T("attn.wk", KD, C);
        FX__T("attn.wv", KD, C);
        FX__T("attn.wo", C, QD);
        FX__T("norm2", C, 0);
        FX__T("mlp.w1", F, C);
        FX__T("mlp.w3", F, C);
        FX__T("mlp.w2", C, F);
#undef FX__T
    }
    fx__add_tensor(lay, "norm", C, 0);
    return FX_OK;
}

const fx__gpt_tensor *fx__gpt_find(const fx__gpt *m, const char *name)
{
    for (size_t i = 0; i < m->lay.n; i++)
        if (!strcmp(m->lay.t[i].name, name))
            return &m->lay.t[i];
    return NULL;
}

/* The first tensor of layer l (l == layers: the final norm). */
static const fx__gpt_tensor *fx__layer_first(const fx__gpt *m, int64_t l)
{
    return &m->lay.t[1 + (size_t)l * FX__GPT_PER_LAYER];
}

/* ---- the model ------------------------------------------------------------------------------------ */

int fx__gpt_create(fx__gpt **out, const fx__gpt_config *cfg, uint64_t seed)
{
    if (!out || !cfg)
        return fx__error(FX_EINVAL, "fx__gpt_create: NULL argument");
    fx__gpt_config c = *cfg;
    int rc = fx__gpt_config_check(&c);
    if (rc)
        return rc;
    fx__gpt *m = fx__calloc(1, sizeof *m);
    if (!m)
        return FX_ENOMEM;
    m->c = c;
    int64_t hd = c.dim / c.heads;
    if ((rc = fx__layout_build(&m->lay, &c)) != FX_OK)
        goto fail;
    m->params = fx__alloc(m->lay.total * sizeof(float));
    m->rope = fx__alloc((size_t)(c.ctx * hd) * sizeof(float));
    if (!m->params || !m->rope) {
        rc = FX_ENOMEM;
        goto fail;
    }
    fx__rope_table(m->rope, c.ctx, hd, c.rope_theta);
    /* N(0, 0.02) for matrices, the residual projections scaled by 1/sqrt(2L) (GPT-2),
       ones for norms; tensor i draws from stream i, so the init is thread-independent. */
    float resid_std = 0.02f / sqrtf(2.0f * (float)c.layers);
    for (size_t i = 0; i < m->lay.n; i++) {
        const fx__gpt_tensor *t = &m->lay.t[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            for (size_t j = 0; j < t->numel; j++)
                p[j] = 1.0f;
            continue;
        }
        bool resid = strstr(t->name, "attn.wo") || strstr(t->name, "mlp.w2");
        fx_rng_fill_normal(p, (int64_t)t->numel, resid ? resid_std : 0.02f, seed, (uint64_t)i);
    }
    *out = m;
    return FX_OK;
fail:
    fx__gpt_free(m);
    return rc;
}

void fx__gpt_free(fx__gpt *m)
{
    if (!m)
        return;
    fx_block_mask_free(m->bmask);
    fx__free(m->lay.t);
    fx__free(m->params);
    fx__free(m->grads);
    fx__free(m->adam);
    fx__free(m->adam16);
    fx__free(m->rope);
    fx__free(m->acts);
    fx__free(m->targets);
    fx__free(m->tokens);
    fx__free(m->doc);
    fx__free(m->norm_parts);
    fx__free(m);
}

/* Gradient-norm partial sums: one per fixed chunk of the flat buffer. */
enum { FX__NORM_CHUNK = 1 << 14 };

int fx__gpt_alloc_train(fx__gpt *m)
{
    if (m->grads)
        return FX_OK;
    size_t P = m->lay.total;
    m->grads = fx__calloc(P, sizeof(float));
    if (m->adam_bf16)
        m->adam16 = fx__calloc(2 * P, sizeof(uint16_t)); /* bfloat16 zero is all zero bits */
    else
        m->adam = fx__calloc(2 * P, sizeof(float));
    m->norm_parts = fx__calloc((P + FX__NORM_CHUNK - 1) / FX__NORM_CHUNK, sizeof(double));
    if (!m->grads || (!m->adam && !m->adam16) || !m->norm_parts) {
        fx__free(m->grads), fx__free(m->adam), fx__free(m->adam16), fx__free(m->norm_parts);
        m->grads = m->adam = NULL;
        m->adam16 = NULL;
        m->norm_parts = NULL;
        return FX_ENOMEM;
    }
    m->grads_zero = true;
    return FX_OK;
}

/* Views of the activation buffer for (B, T). Carved in a fixed order; `base` NULL only
   counts. */
typedef struct fx__acts {
    float *res;   /* [L+1, N, C] residual stream entering each layer, then the last */
    float *xn1;   /* [L, N, C] */
    float *rstd1; /* [L, N] */
    float *q;     /* [L, B, Hq, T, hd] after RoPE */
    float *k;     /* [L, B, Hkv, T, hd] after RoPE */
    float *v;     /* [L, B, Hkv, T, hd] */
    float *att;   /* [L, B, Hq, T, hd] attention output */
    float *lse;   /* [L, B, Hq, T] */
    float *resm;  /* [L, N, C] residual after attention */
    float *xn2;   /* [L, N, C] */
    float *rstd2; /* [L, N] */
    float *h1;    /* [L, N, F] gate */
    float *h3;    /* [L, N, F] up */
    float *xnf;   /* [N, C] */
    float *rstdf; /* [N] */
    /* Scratch (forward and backward): each use ends before the next begins; what would need
       a second buffer goes to saved activations that are dead by then. */
    float *work; /* [N * max(F, QD + 2 KD)] */
    float *dres, *dxn; /* [N, C]; dxn holds d(xnf) from forward to backward */
    float *logits; /* [N, V] unfused loss only */
    float *rowloss; /* [N] */
    size_t total;
} fx__acts;

/* With recompute, the per-layer activations have one slot (the layer being worked on) and
   only the residual stream is kept for every layer. */
static void fx__acts_carve(fx__acts *a, float *base, const fx__gpt_config *c, int64_t B, int64_t T, bool unfused,
                           bool recompute)
{
    size_t N = (size_t)(B * T), L = recompute ? 1 : (size_t)c->layers, C = (size_t)c->dim, F = (size_t)c->ffn;
    size_t hd = C / (size_t)c->heads, QD = (size_t)c->heads * hd, KD = (size_t)c->kv_heads * hd;
    size_t wide = F > QD + 2 * KD ? F : QD + 2 * KD;
    size_t off = 0;
#define FX__CARVE(field, n) (a->field = base ? base + off : NULL, off += ((n) + 15) / 16 * 16)
    FX__CARVE(res, ((size_t)c->layers + 1) * N * C);
    FX__CARVE(xn1, L * N * C);
    FX__CARVE(rstd1, L * N);
    FX__CARVE(q, L * N * QD);
    FX__CARVE(k, L * N * KD);
    FX__CARVE(v, L * N * KD);
    FX__CARVE(att, L * N * QD);
    FX__CARVE(lse, L * N * (size_t)c->heads);
    FX__CARVE(resm, L * N * C);
    FX__CARVE(xn2, L * N * C);
    FX__CARVE(rstd2, L * N);
    FX__CARVE(h1, L * N * F);
    FX__CARVE(h3, L * N * F);
    FX__CARVE(xnf, N * C);
    FX__CARVE(rstdf, N);
    FX__CARVE(work, N * wide);
    FX__CARVE(dres, N * C);
    FX__CARVE(dxn, N * C);
    FX__CARVE(logits, unfused ? N * (size_t)c->vocab : 0);
    FX__CARVE(rowloss, N);
#undef FX__CARVE
    a->total = off;
}

size_t fx__gpt_acts_floats(const fx__gpt *m, int64_t B, int64_t T)
{
    fx__acts a;
    fx__acts_carve(&a, NULL, &m->c, B, T, m->loss_impl == FX__GPT_LOSS_UNFUSED, m->recompute);
    return a.total;
}

int fx__gpt_set_batch(fx__gpt *m, int64_t B, int64_t T)
{
    if (B < 1 || B > (1 << 20))
        return fx__error(FX_EINVAL, "batch = %lld is outside [1, 1048576]", (long long)B);
    if (T < 1 || T > m->c.ctx)
        return fx__error(FX_EINVAL, "sequence length %lld is outside [1, %lld] (the model's context)",
                         (long long)T, (long long)m->c.ctx);
    size_t need = fx__gpt_acts_floats(m, B, T);
    if (m->acts && m->B == B && m->T == T && m->acts_floats == need)
        return FX_OK;
    m->grad_ready = false;
    fx__free(m->acts), fx__free(m->targets), fx__free(m->tokens), fx__free(m->doc);
    fx_block_mask_free(m->bmask);
    m->bmask = NULL;
    m->acts = fx__alloc(need * sizeof(float));
    m->targets = fx__alloc((size_t)(B * T) * sizeof(int64_t));
    m->tokens = fx__alloc((size_t)(B * T) * sizeof(int32_t));
    m->doc = fx__alloc((size_t)(B * T) * sizeof(int64_t));
    if (!m->acts || !m->targets || !m->tokens || !m->doc) {
        fx__free(m->acts), fx__free(m->targets), fx__free(m->tokens), fx__free(m->doc);
        m->acts = NULL, m->targets = NULL, m->tokens = NULL, m->doc = NULL;
        m->B = m->T = 0;
        return FX_ENOMEM;
    }
    m->acts_floats = need;
    m->B = B, m->T = T;
    return FX_OK;
}

/* ---- attention through flex or the reference ------------------------------------------------------- */

/* Causality as a score modifier, for the dense path (no block mask: every block computed). */
static void fx__score_causal(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                             int64_t kv0, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            if (kv0 + j > q0 + i)
                s[i * ld + j] = -INFINITY;
}

static void fx__score_causal_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                                  int64_t h, int64_t q0, int64_t kv0, const void *ctx)
{
    (void)s, (void)b, (void)h, (void)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            if (kv0 + j > q0 + i)
                g[i * ld + j] = 0.0f;
}

typedef struct fx__attn_call {
    int64_t B, Hq, Hkv, Lq, Lkv, D, q_offset;
    const fx_block_mask *bm; /* flex: the block mask (NULL: dense with causal score_mod, or none) */
    bool dense_causal;       /* flex, no block mask: causality by score_mod */
    fx_mask_fn fn;           /* reference: the mask function */
    const void *ctx;
} fx__attn_call;

static fx_attention fx__flex_desc(const fx__attn_call *c)
{
    fx_attention a = {.B = c->B, .Hq = c->Hq, .Hkv = c->Hkv, .Lq = c->Lq, .Lkv = c->Lkv, .D = c->D, .Dv = c->D,
                      .scale = 0.0f, .q_offset = c->q_offset, .mask = c->bm};
    if (c->dense_causal) {
        a.score_mod = fx__score_causal;
        a.score_mod_grad = fx__score_causal_grad;
    }
    return a;
}

static fx__attn_ref fx__ref_desc(const fx__attn_call *c)
{
    return (fx__attn_ref){.B = c->B, .Hq = c->Hq, .Hkv = c->Hkv, .Lq = c->Lq, .Lkv = c->Lkv, .D = c->D,
                          .q_offset = c->q_offset, .mask = c->fn, .ctx = c->ctx};
}

static int fx__attn_fwd(const fx__gpt *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                        float *out, float *lse)
{
    if (m->attn_impl == FX__GPT_ATTN_REF) {
        fx__attn_ref r = fx__ref_desc(c);
        fx__attn_ref_forward(&r, q, k, v, out, lse);
        return FX_OK;
    }
    fx_attention a = fx__flex_desc(c);
    return fx_flex_attention(&a, q, k, v, out, lse);
}

static int fx__attn_bwd(const fx__gpt *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                        const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    if (m->attn_impl == FX__GPT_ATTN_REF) {
        fx__attn_ref r = fx__ref_desc(c);
        fx__attn_ref_backward(&r, q, k, v, out, lse, dout, dq, dk, dv);
        return FX_OK;
    }
    fx_attention a = fx__flex_desc(c);
    return fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq, dk, dv);
}

/* The training-shape attention call; builds the block mask when the flex path needs one
   (the backward pass reuses the forward's). */
static int fx__train_attn(fx__gpt *m, fx__attn_call *c, bool build)
{
    int64_t hd = m->c.dim / m->c.heads;
    m->mctx.sliding.window = m->window;
    m->mctx.document = (fx_mask_document_ctx){.doc_ids = m->doc, .len = m->T, .batch_stride = m->T};
    *c = (fx__attn_call){.B = m->B, .Hq = m->c.heads, .Hkv = m->c.kv_heads, .Lq = m->T, .Lkv = m->T, .D = hd};
    c->fn = fx__gpt_mask_fn(m->mask, &m->mctx, &c->ctx);
    if (m->attn_impl == FX__GPT_ATTN_REF)
        return FX_OK;
    if (m->mask == FX__GPT_MASK_DENSE) {
        c->dense_causal = true;
        return FX_OK;
    }
    /* Document masks change with every batch; the others only with the shape. */
    bool stale = !m->bmask || m->bmask_mask != m->mask || m->bmask_window != m->window;
    if ((build && m->mask == FX__GPT_MASK_DOCUMENT) || stale) {
        fx_block_mask_free(m->bmask);
        m->bmask = NULL;
        int64_t Bm = m->mask == FX__GPT_MASK_DOCUMENT ? m->B : 1;
        int rc = fx_block_mask_create(&m->bmask, c->fn, c->ctx, Bm, 1, m->T, m->T, 0, 0);
        if (rc)
            return fx__error_context(rc, "attention mask");
        m->bmask_mask = m->mask;
        m->bmask_window = m->window;
    }
    c->bm = m->bmask;
    return FX_OK;
}

/* ---- forward ------------------------------------------------------------------------------------------ */

/* y [N,O] = x [N,I] W[O,I]^T (+ y when acc) */
static void fx__linear(float *y, const float *x, const float *w, int64_t N, int64_t I, int64_t O, bool acc)
{
    fx__sgemm(false, true, N, O, I, 1.0f, x, I, w, I, acc ? 1.0f : 0.0f, y, O);
}

/* dx [N,I] (= or +=) dy [N,O] W [O,I];  dW [O,I] += dy^T x */
static void fx__linear_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, int64_t N,
                                int64_t I, int64_t O, bool acc_dx)
{
    fx__sgemm(false, false, N, I, O, 1.0f, dy, O, w, I, acc_dx ? 1.0f : 0.0f, dx, I);
    fx__sgemm(true, false, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I);
}

typedef struct fx__layer_params {
    float *ln1, *wq, *wk, *wv, *wo, *ln2, *w1, *w3, *w2;
} fx__layer_params;

/* Layer l's first float (l == layers: the final norm) in the parameters or the gradients:
   in the flat buffer, or in the layer's own buffer when sharded training set one. */
static float *fx__layer_base(const fx__gpt *m, bool grads, int64_t l)
{
    float **own = grads ? m->layer_grads : m->layer_params;
    if (own)
        return own[l];
    return (grads ? m->grads : m->params) + fx__layer_first(m, l)->offset;
}

static fx__layer_params fx__layer(const fx__gpt *m, bool grads, int64_t l)
{
    const fx__gpt_tensor *t = fx__layer_first(m, l);
    float *buf = fx__layer_base(m, grads, l);
    size_t o = t->offset;
    return (fx__layer_params){buf + (t[FX__GPT_LN1].offset - o), buf + (t[FX__GPT_WQ].offset - o),
                              buf + (t[FX__GPT_WK].offset - o), buf + (t[FX__GPT_WV].offset - o),
                              buf + (t[FX__GPT_WO].offset - o), buf + (t[FX__GPT_LN2].offset - o),
                              buf + (t[FX__GPT_W1].offset - o), buf + (t[FX__GPT_W3].offset - o),
                              buf + (t[FX__GPT_W2].offset - o)};
}

static int fx__layer_hook(fx__gpt *m, int64_t l, bool backward)
{
    return m->layer_hook ? m->layer_hook((int)l, backward, m->hook_user) : FX_OK;
}

/* Between the sub-operations of a layer: lets a multi-process trainer drive its collectives
   in flight (MPI moves them only inside its calls; each stage of a transfer waits for one). */
static void fx__progress_point(fx__gpt *m)
{
    if (m->progress)
        m->progress(m->hook_user);
}

/* Layer l's saved activations: slot l, or slot 0 when they are recomputed. */
typedef struct fx__layer_acts {
    float *res, *xn1, *rstd1, *q, *k, *v, *att, *lse, *resm, *xn2, *rstd2, *h1, *h3, *out;
} fx__layer_acts;

/* One layer's activations (all but its input and output) carved from base in slot order;
   returns the floats used. */
static size_t fx__slot_carve(fx__layer_acts *x, float *base, const fx__gpt *m)
{
    const fx__gpt_config *c = &m->c;
    size_t N = (size_t)(m->B * m->T), C = (size_t)c->dim, F = (size_t)c->ffn, Hq = (size_t)c->heads;
    size_t QD = C, KD = (size_t)c->kv_heads * (C / Hq), off = 0;
#define FX__SLOT(field, n) (x->field = base ? base + off : NULL, off += ((n) + 15) / 16 * 16)
    FX__SLOT(xn1, N * C);
    FX__SLOT(rstd1, N);
    FX__SLOT(q, N * QD);
    FX__SLOT(k, N * KD);
    FX__SLOT(v, N * KD);
    FX__SLOT(att, N * QD);
    FX__SLOT(lse, N * Hq);
    FX__SLOT(resm, N * C);
    FX__SLOT(xn2, N * C);
    FX__SLOT(rstd2, N);
    FX__SLOT(h1, N * F);
    FX__SLOT(h3, N * F);
#undef FX__SLOT
    return off;
}

/* With recompute, a step whose gradient buffer starts clear can park layer l's activations
   (l >= 1) in the gradient memory of layer l-1: the backward pass reaches layer l-1's
   gradients only after it is done with layer l, and clears what was parked just before.
   The activations then need no recomputation, for no memory beyond the recompute slot
   (layer 0's). The residual stream entering layer l goes after them, and the final norm's
   input in layer L-1's region. Where a region is too small for this (many tokens per step
   for the model's size), layers are recomputed as usual. */
static float *fx__park_base(const fx__gpt *m, int64_t l)
{
    float *g = m->grads + fx__layer_first(m, l - 1)->offset;
    return g + ((16 - ((uintptr_t)g / sizeof(float)) % 16) % 16); /* 64-byte aligned, as fx__alloc */
}

static bool fx__park_fits(const fx__gpt *m)
{
    fx__layer_acts x;
    size_t region = fx__layer_first(m, 1)->offset - fx__layer_first(m, 0)->offset;
    size_t stream = ((size_t)(m->B * m->T * m->c.dim) + 15) / 16 * 16;
    return m->c.layers > 1 && fx__slot_carve(&x, NULL, m) + stream + 16 <= region;
}

/* The residual stream entering layer l (l == layers: the final norm's input): parked, or
   in the activation buffer; a forward pass without gradients keeps only two, in turn. */
static float *fx__res_at(const fx__gpt *m, const fx__acts *a, int64_t l)
{
    int64_t NC = m->B * m->T * m->c.dim;
    if (m->acts_parked && l >= 1) {
        fx__layer_acts x;
        return fx__park_base(m, l) + (l == m->c.layers ? 0 : fx__slot_carve(&x, NULL, m));
    }
    return a->res + (m->res_two ? l % 2 : l) * NC;
}

/* Clears what is parked in layer l's gradient memory (layer l+1's activations and input,
   or the final norm's input when l is the last layer), before its gradients go there. */
static void fx__park_clear(const fx__gpt *m, const fx__acts *a, int64_t l)
{
    float *region = fx__layer_base(m, true, l);
    float *end = fx__res_at(m, a, l + 1) + m->B * m->T * m->c.dim;
    memset(region, 0, (size_t)(end - region) * sizeof(float));
}

static fx__layer_acts fx__layer_acts_at(const fx__gpt *m, const fx__acts *a, int64_t l)
{
    const fx__gpt_config *c = &m->c;
    int64_t N = m->B * m->T, C = c->dim, F = c->ffn, Hq = c->heads, hd = C / Hq, QD = Hq * hd;
    int64_t KD = c->kv_heads * hd, s = m->recompute ? 0 : l;
    if (m->acts_parked && l >= 1) {
        fx__layer_acts x = {.res = fx__res_at(m, a, l), .out = fx__res_at(m, a, l + 1)};
        fx__slot_carve(&x, fx__park_base(m, l), m);
        return x;
    }
    return (fx__layer_acts){.res = fx__res_at(m, a, l), .xn1 = a->xn1 + s * N * C, .rstd1 = a->rstd1 + s * N,
                            .q = a->q + s * N * QD, .k = a->k + s * N * KD, .v = a->v + s * N * KD,
                            .att = a->att + s * N * QD, .lse = a->lse + s * N * Hq, .resm = a->resm + s * N * C,
                            .xn2 = a->xn2 + s * N * C, .rstd2 = a->rstd2 + s * N, .h1 = a->h1 + s * N * F,
                            .h3 = a->h3 + s * N * F, .out = fx__res_at(m, a, l + 1)};
}

/* Layer l from its input res[l]; writes res[l+1] when write_out (a recomputation for the
   backward pass does not: the stream is already there, bit for bit). */
static int fx__layer_forward(fx__gpt *m, const fx__acts *a, const fx__attn_call *call, int64_t l, bool write_out)
{
    const fx__gpt_config *c = &m->c;
    int64_t B = m->B, T = m->T, N = B * T, C = c->dim, F = c->ffn;
    int64_t Hq = c->heads, Hkv = c->kv_heads, hd = C / Hq, QD = Hq * hd, KD = Hkv * hd;
    fx__layer_params p = fx__layer(m, false, l);
    fx__layer_acts x = fx__layer_acts_at(m, a, l);

    fx__rmsnorm_forward(x.xn1, x.rstd1, x.res, p.ln1, N, C, c->norm_eps);
    float *qt = a->work, *kt = a->work + N * QD, *vt = a->work + N * (QD + KD);
    fx__linear(qt, x.xn1, p.wq, N, C, QD, false);
    fx__linear(kt, x.xn1, p.wk, N, C, KD, false);
    fx__linear(vt, x.xn1, p.wv, N, C, KD, false);
    fx__progress_point(m);
    fx__rope_forward(x.q, qt, m->rope, B, T, Hq, hd, 0);
    fx__rope_forward(x.k, kt, m->rope, B, T, Hkv, hd, 0);
    fx__to_heads(x.v, vt, B, T, Hkv, hd);
    int rc = fx__attn_fwd(m, call, x.q, x.k, x.v, x.att, x.lse);
    if (rc)
        return fx__error_context(rc, "layer %lld attention", (long long)l);
    fx__progress_point(m);
    fx__from_heads(a->work, x.att, B, T, Hq, hd);
    memcpy(x.resm, x.res, (size_t)(N * C) * sizeof(float));
    fx__linear(x.resm, a->work, p.wo, N, QD, C, true);
    fx__progress_point(m);

    fx__rmsnorm_forward(x.xn2, x.rstd2, x.resm, p.ln2, N, C, c->norm_eps);
    fx__linear(x.h1, x.xn2, p.w1, N, C, F, false);
    fx__linear(x.h3, x.xn2, p.w3, N, C, F, false);
    fx__progress_point(m);
    if (write_out) {
        fx__swiglu_forward(a->work, x.h1, x.h3, N * F);
        memcpy(x.out, x.resm, (size_t)(N * C) * sizeof(float));
        fx__linear(x.out, a->work, p.w2, N, F, C, true);
    }
    return FX_OK;
}

/* Tokens per chunk of the fused loss. Each chunk reads the embedding twice (logits, then
   d(h)) and its gradient once, so at a GPT-2 vocabulary the number of chunks, not the
   arithmetic, sets the loss's time: the loss's automatic tile (under 1/32 of the logits)
   would take 16 rows at a time. A tile of at most 26 MB lets the 256 tokens of a B=4,
   T=64 step go in two chunks (a third of the time of sixteen); the chunks are made equal,
   so none is a sliver of a few rows. */
static int64_t fx__loss_chunk(int64_t N, int64_t V)
{
    int64_t rows = (int64_t)(26u << 20) / (4 * V);
    rows = rows < 16 ? 16 : rows;
    int64_t chunks = (N + rows - 1) / rows;
    return (N + chunks - 1) / chunks;
}

int fx__gpt_forward(fx__gpt *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad)
{
    if (!m || !tokens || !m->acts)
        return fx__error(FX_EINVAL, "fx__gpt_forward: no model, tokens or batch shape (fx__gpt_set_batch)");
    if (grad && (!m->grads || !targets))
        return fx__error(FX_EINVAL, "fx__gpt_forward: gradients need targets and fx__gpt_alloc_train");
    const fx__gpt_config *c = &m->c;
    int64_t B = m->B, T = m->T, N = B * T, C = c->dim, V = c->vocab;
    for (int64_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return fx__error(FX_ERANGE, "token[%lld] = %d is outside [0, %lld)", (long long)i, tokens[i], (long long)V);
        if (targets && targets[i] != -100 && (targets[i] < 0 || targets[i] >= V))
            return fx__error(FX_ERANGE, "target[%lld] = %d is outside [0, %lld)", (long long)i, targets[i],
                             (long long)V);
    }
    memcpy(m->tokens, tokens, (size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        m->targets[i] = targets ? targets[i] : -100;
    /* Document ids: an end-of-text token closes its document. */
    for (int64_t b = 0; b < B; b++) {
        int64_t d = 0;
        for (int64_t t = 0; t < T; t++) {
            m->doc[b * T + t] = d;
            d += tokens[b * T + t] == FX__GPT_EOT;
        }
    }
    fx__acts a;
    fx__acts_carve(&a, m->acts, c, B, T, m->loss_impl == FX__GPT_LOSS_UNFUSED, m->recompute);
    fx__attn_call call;
    m->grad_ready = false;
    int rc = fx__train_attn(m, &call, true);
    if (rc)
        return rc;

    /* Parking needs gradient memory known to be clear and laid out flat, and no hooks that
       might read it (multi-process training). */
    m->acts_parked = grad && m->recompute && m->grads_zero && !m->hook && !m->layer_grads && !m->layer_hook &&
                     fx__park_fits(m);
    if (m->acts_parked)
        m->grads_zero = false;
    m->res_two = !grad && m->recompute;
    fx__embed_forward(fx__res_at(m, &a, 0), tokens, m->params, N, C);
    for (int64_t l = 0; l < c->layers; l++)
        if ((rc = fx__layer_hook(m, l, false)) != FX_OK || (rc = fx__layer_forward(m, &a, &call, l, true)) != FX_OK)
            return rc;
    if ((rc = fx__layer_hook(m, c->layers, false)) != FX_OK)
        return rc;
    fx__rmsnorm_forward(a.xnf, a.rstdf, fx__res_at(m, &a, c->layers), fx__layer_base(m, false, c->layers), N, C,
                        c->norm_eps);
    if (!targets)
        return FX_OK;

    float *dwte = grad ? m->grads : NULL, *dxnf = grad ? a.dxn : NULL;
    float l_out;
    if (m->loss_impl == FX__GPT_LOSS_UNFUSED) {
        l_out = fx__loss_unfused(a.logits, a.rowloss, a.xnf, m->params, m->targets, N, C, V, dxnf, dwte);
    } else {
        fx_lce p = {.N = N, .D = C, .V = V, .ignore_index = -100, .reduction = FX_REDUCTION_MEAN,
                    .chunk = fx__loss_chunk(N, V)};
        rc = fx_linear_cross_entropy(&p, a.xnf, m->params, NULL, m->targets, &l_out, NULL, dxnf, dwte, NULL);
        if (rc)
            return fx__error_context(rc, "loss");
    }
    m->grad_ready = grad;
    if (grad)
        m->grads_zero = false;
    if (loss)
        *loss = l_out;
    return FX_OK;
}

/* ---- backward ---------------------------------------------------------------------------------------- */

static void fx__hook(fx__gpt *m, int layer, float *grad, size_t numel)
{
    if (m->hook)
        m->hook(layer, grad, numel, m->hook_user);
}

int fx__gpt_backward(fx__gpt *m)
{
    if (!m || !m->grads || !m->acts || !m->grad_ready)
        return fx__error(FX_EINVAL, "fx__gpt_backward: no forward with gradients before it");
    m->grad_ready = false;
    m->grads_zero = false;
    const fx__gpt_config *c = &m->c;
    int64_t B = m->B, T = m->T, N = B * T, C = c->dim, F = c->ffn;
    int64_t Hq = c->heads, Hkv = c->kv_heads, hd = C / Hq, QD = Hq * hd, KD = Hkv * hd;
    fx__acts a;
    fx__acts_carve(&a, m->acts, c, B, T, m->loss_impl == FX__GPT_LOSS_UNFUSED, m->recompute);
    fx__attn_call call;
    int rc = fx__train_attn(m, &call, false);
    if (rc)
        return rc;

    /* The final norm: its input gradient d(xnf) came with the loss. */
    const fx__gpt_tensor *tn = fx__layer_first(m, c->layers);
    memset(a.dres, 0, (size_t)(N * C) * sizeof(float));
    if ((rc = fx__layer_hook(m, c->layers, true)) != FX_OK)
        return rc;
    float *gn = fx__layer_base(m, true, c->layers);
    fx__rmsnorm_backward(a.dres, gn, a.dxn, fx__res_at(m, &a, c->layers), fx__layer_base(m, false, c->layers), a.rstdf,
                         N, C);
    fx__hook(m, (int)c->layers, gn, tn->numel);

    for (int64_t l = c->layers - 1; l >= 0; l--) {
        if ((rc = fx__layer_hook(m, l, true)) != FX_OK)
            return rc;
        fx__layer_params p = fx__layer(m, false, l), g = fx__layer(m, true, l);
        /* The forward pass leaves the last layer's activations in the recompute slot (and
           layer 0's when the others are parked). */
        if (m->recompute && !m->acts_parked && l < c->layers - 1 &&
            (rc = fx__layer_forward(m, &a, &call, l, false)) != FX_OK)
            return rc;
        if (m->acts_parked) /* what is parked in layer l's gradients is dead now */
            fx__park_clear(m, &a, l);
        fx__layer_acts x = fx__layer_acts_at(m, &a, l);
        float *res = x.res, *xn1 = x.xn1, *rstd1 = x.rstd1, *q = x.q, *k = x.k, *v = x.v, *att = x.att;
        float *lse = x.lse, *resm = x.resm, *xn2 = x.xn2, *rstd2 = x.rstd2, *h1 = x.h1, *h3 = x.h3;

        /* MLP: out = resm + swiglu(h1, h3) W2^T, dres holds d(out). The gradients of h1
           and h3 replace them (their last use). */
        fx__swiglu_forward(a.work, h1, h3, N * F);
        fx__sgemm(true, false, C, F, N, 1.0f, a.dres, C, a.work, F, 1.0f, g.w2, F);
        fx__sgemm(false, false, N, F, C, 1.0f, a.dres, C, p.w2, F, 0.0f, a.work, F);
        fx__progress_point(m);
        float *dh1 = h1, *dh3 = h3;
        fx__swiglu_backward(dh1, dh3, a.work, h1, h3, N * F);
        fx__linear_backward(a.dxn, g.w1, dh1, xn2, p.w1, N, C, F, false);
        fx__progress_point(m);
        fx__linear_backward(a.dxn, g.w3, dh3, xn2, p.w3, N, C, F, true);
        fx__rmsnorm_backward(a.dres, g.ln2, a.dxn, resm, p.ln2, rstd2, N, C);
        fx__progress_point(m);

        /* Attention: resm = res + from_heads(att) Wo^T, dres holds d(resm). */
        /* d(att) goes to xn2's slot ([N, C], dead now), and the projections' gradients to
           q, k and v once the attention's backward has read them. */
        float *datt = xn2;
        fx__from_heads(a.work, att, B, T, Hq, hd);
        fx__sgemm(true, false, C, QD, N, 1.0f, a.dres, C, a.work, QD, 1.0f, g.wo, QD);
        fx__sgemm(false, false, N, QD, C, 1.0f, a.dres, C, p.wo, QD, 0.0f, a.work, QD);
        fx__progress_point(m);
        fx__to_heads(datt, a.work, B, T, Hq, hd);
        float *dq = a.work, *dk = a.work + N * QD, *dv = a.work + N * (QD + KD);
        if ((rc = fx__attn_bwd(m, &call, q, k, v, att, lse, datt, dq, dk, dv)) != FX_OK)
            return fx__error_context(rc, "layer %lld attention backward", (long long)l);
        fx__progress_point(m);
        float *dqt = q, *dkt = k, *dvt = v;
        fx__rope_backward(dqt, dq, m->rope, B, T, Hq, hd);
        fx__rope_backward(dkt, dk, m->rope, B, T, Hkv, hd);
        fx__from_heads(dvt, dv, B, T, Hkv, hd);
        fx__linear_backward(a.dxn, g.wq, dqt, xn1, p.wq, N, C, QD, false);
        fx__progress_point(m);
        fx__linear_backward(a.dxn, g.wk, dkt, xn1, p.wk, N, C, KD, true);
        fx__linear_backward(a.dxn, g.wv, dvt, xn1, p.wv, N, C, KD, true);
        fx__rmsnorm_backward(a.dres, g.ln1, a.dxn, res, p.ln1, rstd1, N, C);

        const fx__gpt_tensor *t0 = fx__layer_first(m, l);
        size_t numel = fx__layer_first(m, l + 1)->offset - t0->offset;
        fx__hook(m, (int)l, fx__layer_base(m, true, l), numel);
    }
    fx__embed_backward(m->grads, a.dres, m->tokens, N, C);
    fx__hook(m, -1, m->grads, m->lay.t[0].numel);
    return FX_OK;
}

void fx__gpt_zero_grad(fx__gpt *m)
{
    if (m->grads)
        memset(m->grads, 0, m->lay.total * sizeof(float));
    m->grads_zero = m->grads != NULL;
}

/* ---- optimizer --------------------------------------------------------------------------------------- */

double fx__sumsq_scalar(const float *g, int64_t n)
{
    double lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            lane[j] += (double)g[i + j] * g[i + j];
    return fx__sumsq_finish(lane, g + i, n - i);
}

static double (*fx__sumsq_kernel(void))(const float *, int64_t)
{
    switch (fx__isa()) {
    case FX_ISA_AVX512: return fx__sumsq_avx512;
    case FX_ISA_AVX2: return fx__sumsq_avx2;
    case FX_ISA_SCALAR: break;
    }
    return fx__sumsq_scalar;
}

double fx__gpt_grad_norm(const fx__gpt *m)
{
    size_t P = m->lay.total, nchunk = (P + FX__NORM_CHUNK - 1) / FX__NORM_CHUNK;
    const float *g = m->grads;
    double *parts = m->norm_parts;
    double (*sumsq)(const float *, int64_t) = fx__sumsq_kernel();
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < nchunk; ch++) {
        size_t i0 = ch * FX__NORM_CHUNK, i1 = i0 + FX__NORM_CHUNK < P ? i0 + FX__NORM_CHUNK : P;
        parts[ch] = sumsq(g + i0, (int64_t)(i1 - i0));
    }
    double total = 0.0;
    for (size_t ch = 0; ch < nchunk; ch++)
        total += parts[ch];
    return sqrt(total);
}

void fx__gpt_grad_scale(fx__gpt *m, float s)
{
    size_t P = m->lay.total;
    float *g = m->grads;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < P; i++)
        g[i] *= s;
    m->grads_zero = false;
}

/* bfloat16 <-> float32 inline in the optimizer's loop (the same rounding as
   fx_f32_to_bf16: nearest even, NaN kept quiet). */
static inline float fx__bf16_load(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t fx__bf16_store(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

fx__adamw_k fx__adamw_consts(const fx__adamw *o, float wd, int64_t t)
{
    return (fx__adamw_k){.gs = o->grad_scale != 0.0f ? o->grad_scale : 1.0f, .b1 = o->beta1,
                         .nb1 = 1.0f - o->beta1, .b2 = o->beta2, .nb2 = 1.0f - o->beta2, .lr = o->lr,
                         .bc1 = 1.0f - powf(o->beta1, (float)t), .bc2 = 1.0f - powf(o->beta2, (float)t),
                         .eps = o->eps, .wd = wd, .zero_grad = o->zero_grad};
}

/* The reference loops. The vector twins repeat these operations in this order. */
void fx__adamw_f32_scalar(float *p, float *g, float *mm, float *vv, int64_t n, const fx__adamw_k *k)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k->gs;
        float mi = k->b1 * mm[i] + k->nb1 * gi;
        float vi = k->b2 * vv[i] + k->nb2 * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        p[i] -= k->lr * (mi / k->bc1 / (sqrtf(vi / k->bc2) + k->eps) + k->wd * p[i]);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

void fx__adamw_bf16_scalar(float *p, float *g, uint16_t *mm, uint16_t *vv, int64_t n, const fx__adamw_k *k)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k->gs;
        float mi = k->b1 * fx__bf16_load(mm[i]) + k->nb1 * gi;
        float vi = k->b2 * fx__bf16_load(vv[i]) + k->nb2 * gi * gi;
        mm[i] = fx__bf16_store(mi);
        vv[i] = fx__bf16_store(vi);
        p[i] -= k->lr * (mi / k->bc1 / (sqrtf(vi / k->bc2) + k->eps) + k->wd * p[i]);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

typedef void (*fx__adamw_f32_fn)(float *, float *, float *, float *, int64_t, const fx__adamw_k *);
typedef void (*fx__adamw_bf16_fn)(float *, float *, uint16_t *, uint16_t *, int64_t, const fx__adamw_k *);

static fx__adamw_f32_fn fx__adamw_f32_kernel(void)
{
    switch (fx__isa()) {
    case FX_ISA_AVX512: return fx__adamw_f32_avx512;
    case FX_ISA_AVX2: return fx__adamw_f32_avx2;
    case FX_ISA_SCALAR: break;
    }
    return fx__adamw_f32_scalar;
}

static fx__adamw_bf16_fn fx__adamw_bf16_kernel(void)
{
    switch (fx__isa()) {
    case FX_ISA_AVX512: return fx__adamw_bf16_avx512;
    case FX_ISA_AVX2: return fx__adamw_bf16_avx2;
    case FX_ISA_SCALAR: break;
    }
    return fx__adamw_bf16_scalar;
}

/* The optimizer walks the flat buffers in fixed blocks shared out statically: one parallel
   pass over parameters, gradients and moments (it is memory-bound), whatever the tensors. */
enum { FX__ADAM_BLOCK = 1 << 14 };

/* The tensor holding float i of the flat buffer. */
static size_t fx__tensor_at(const fx__gpt_layout *lay, size_t i)
{
    size_t lo = 0, hi = lay->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        if (lay->t[mid].offset <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void fx__gpt_adamw(fx__gpt *m, const fx__adamw *o, int64_t t)
{
    const fx__gpt_layout *lay = &m->lay;
    size_t P = lay->total, nblk = (P + FX__ADAM_BLOCK - 1) / FX__ADAM_BLOCK;
    const fx__adamw_k kd = fx__adamw_consts(o, o->weight_decay, t), k0 = fx__adamw_consts(o, 0.0f, t);
    const fx__adamw_f32_fn f32 = fx__adamw_f32_kernel();
    const fx__adamw_bf16_fn bf16 = fx__adamw_bf16_kernel();
    float *params = m->params, *grads = m->grads, *adam = m->adam;
    uint16_t *adam16 = m->adam16;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblk; b++) {
        size_t i = b * FX__ADAM_BLOCK, end = i + FX__ADAM_BLOCK < P ? i + FX__ADAM_BLOCK : P;
        for (size_t ti = fx__tensor_at(lay, i); i < end; ti++) {
            const fx__gpt_tensor *tt = &lay->t[ti];
            size_t e = tt->offset + tt->numel < end ? tt->offset + tt->numel : end;
            const fx__adamw_k *k = tt->decay ? &kd : &k0;
            if (adam16)
                bf16(params + i, grads + i, adam16 + i, adam16 + P + i, (int64_t)(e - i), k);
            else
                f32(params + i, grads + i, adam + i, adam + P + i, (int64_t)(e - i), k);
            i = e;
        }
    }
    if (o->zero_grad)
        m->grads_zero = true;
}

void fx__adamw_f32(float *p, float *g, float *mm, float *vv, int64_t n, const fx__adamw *o, float wd, int64_t t)
{
    const fx__adamw_k k = fx__adamw_consts(o, wd, t);
    const fx__adamw_f32_fn f32 = fx__adamw_f32_kernel();
    int64_t nblk = (n + FX__ADAM_BLOCK - 1) / FX__ADAM_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i = b * FX__ADAM_BLOCK, e = i + FX__ADAM_BLOCK < n ? i + FX__ADAM_BLOCK : n;
        f32(p + i, g + i, mm + i, vv + i, e - i, &k);
    }
}

float fx__lr_schedule(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr)
{
    if (step < warmup)
        return lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup || step >= total)
        return total <= warmup ? lr : min_lr;
    double frac = (double)(step - warmup) / (double)(total - warmup);
    return min_lr + (float)(0.5 * (1.0 + cos(3.14159265358979323846 * frac))) * (lr - min_lr);
}

/* ---- decoding ------------------------------------------------------------------------------------------ */

int fx__gpt_cache_create(fx__gpt_cache **out, const fx__gpt *m)
{
    const fx__gpt_config *c = &m->c;
    int64_t hd = c->dim / c->heads, QD = c->heads * hd, KD = c->kv_heads * hd, F = c->ffn;
    int64_t wide = F > QD ? F : QD;
    fx__gpt_cache *k = fx__calloc(1, sizeof *k);
    if (!k)
        return FX_ENOMEM;
    size_t kv = (size_t)(c->layers * KD * c->ctx);
    k->k = fx__alloc(kv * sizeof(float));
    k->v = fx__alloc(kv * sizeof(float));
    k->doc = fx__alloc((size_t)c->ctx * sizeof(int64_t));
    k->scratch = fx__alloc((size_t)(c->ctx * (2 * c->dim + 3 * QD + 2 * KD + wide + 2 * F + 1) + c->vocab) *
                           sizeof(float));
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

/* The mask over absolute positions [ctx, ctx] for a sequence starting with `first`. Only a
   leading end-of-text can start a new document (generation stops at one). */
static int fx__cache_mask(fx__gpt *m, fx__gpt_cache *kc, int32_t first)
{
    int64_t ctx = m->c.ctx;
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
    int64_t C = c->dim, F = c->ffn, V = c->vocab, ctx = c->ctx;
    int64_t Hq = c->heads, Hkv = c->kv_heads, hd = C / Hq, QD = Hq * hd, KD = Hkv * hd, G = Hq / Hkv;
    int64_t p0 = kc->len;
    if (!tokens || !logits || n < 1 || p0 + n > ctx)
        return fx__error(FX_EINVAL, "decoding %lld tokens at position %lld: outside the context %lld", (long long)n,
                         (long long)p0, (long long)ctx);
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
        fx__rope_forward(q, qt, m->rope, 1, n, Hq, hd, p0);
        /* New keys and values go to positions p0.. of each head's [ctx, hd] cache. */
        fx__rope_forward(sx, t1, m->rope, 1, n, Hkv, hd, p0);
        for (int64_t h = 0; h < Hkv; h++)
            memcpy(kl + (h * ctx + p0) * hd, sx + h * n * hd, (size_t)(n * hd) * sizeof(float));
        fx__to_heads(sx, t2, 1, n, Hkv, hd);
        for (int64_t h = 0; h < Hkv; h++)
            memcpy(vl + (h * ctx + p0) * hd, sx + h * n * hd, (size_t)(n * hd) * sizeof(float));
        /* The cache holds each KV head's keys with a stride of ctx, so each KV head and its
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
    fx__linear(logits, xn, m->params, 1, C, V, false);
    kc->len = p0 + n;
    return FX_OK;
}
