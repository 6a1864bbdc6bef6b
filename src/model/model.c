/* The model: configuration and presets, the parameter table, creation and initialisation,
   and the buffers of training (gradients, Adam moments, activations). */
#include "model_internal.h"
#include "cuda/model_gpu.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ------------------------------------------------------------------------- */

int fx__model_preset(fx__model_config *c, const char *name)
{
    fx__model_config base = {.arch = "flexc-gpt", .vocab = FX__MODEL_VOCAB, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
                           .tied_embeddings = true, .eos = {FX__MODEL_EOT}, .n_eos = 1};
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

int fx__model_config_check(fx__model_config *c)
{
    if (!c)
        return fx__error(FX_EINVAL, "model config is NULL");
#define FX__RANGE(field, lo, hi)                                                              \
    if (c->field < (lo) || c->field > (hi))                                                   \
        return fx__error(FX_EINVAL, #field " = %lld is outside [%lld, %lld]", (long long)c->field, \
                         (long long)(lo), (long long)(hi));
    FX__RANGE(vocab, 2, INT32_MAX)
    FX__RANGE(ctx, 1, 1 << 24)
    FX__RANGE(layers, 1, 1024)
    FX__RANGE(dim, 2, 65536)
    FX__RANGE(heads, 1, 4096)
    FX__RANGE(kv_heads, 1, 4096)
    FX__RANGE(head_dim, 0, 512)
    FX__RANGE(ffn, 0, 1 << 20)
    FX__RANGE(sliding_window, 0, INT64_MAX)
    FX__RANGE(n_eos, 0, FX_MODEL_MAX_EOS)
#undef FX__RANGE
    if (c->head_dim == 0) {
        if (c->dim % c->heads)
            return fx__error(FX_EINVAL, "dim = %lld is not a multiple of heads = %lld (or set head_dim)",
                             (long long)c->dim, (long long)c->heads);
        if (c->dim / c->heads > 512)
            return fx__error(FX_EINVAL, "head_dim = dim/heads = %lld is outside [2, 512]",
                             (long long)(c->dim / c->heads));
        c->head_dim = c->dim / c->heads;
    }
    if (c->head_dim % 2 || c->head_dim < 2)
        return fx__error(FX_EINVAL, "head_dim = %lld must be even and >= 2 (RoPE rotates pairs)",
                         (long long)c->head_dim);
    if (c->heads % c->kv_heads)
        return fx__error(FX_EINVAL, "heads = %lld is not a multiple of kv_heads = %lld", (long long)c->heads,
                         (long long)c->kv_heads);
    if (c->heads * c->head_dim > (1 << 20))
        return fx__error(FX_EINVAL, "heads * head_dim = %lld is above 1048576", (long long)(c->heads * c->head_dim));
    if (c->ffn == 0)
        c->ffn = (8 * c->dim / 3 + 31) / 32 * 32;
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return fx__error(FX_EINVAL, "rope_theta = %g must be finite and > 1", (double)c->rope_theta);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return fx__error(FX_EINVAL, "norm_eps = %g must be finite and > 0", (double)c->norm_eps);
    switch (c->rope_scaling.type) {
    case FX_ROPE_SCALING_NONE: break;
    case FX_ROPE_SCALING_LLAMA3:
        if (!(c->rope_scaling.factor >= 1.0f) || !isfinite(c->rope_scaling.factor))
            return fx__error(FX_EINVAL, "rope_scaling.factor = %g must be finite and >= 1",
                             (double)c->rope_scaling.factor);
        if (!(c->rope_scaling.low_freq_factor > 0.0f) ||
            !(c->rope_scaling.high_freq_factor > c->rope_scaling.low_freq_factor) ||
            !isfinite(c->rope_scaling.high_freq_factor))
            return fx__error(FX_EINVAL, "rope_scaling.low_freq_factor = %g and high_freq_factor = %g must satisfy "
                             "0 < low < high",
                             (double)c->rope_scaling.low_freq_factor, (double)c->rope_scaling.high_freq_factor);
        if (c->rope_scaling.original_max_position_embeddings < 1)
            return fx__error(FX_EINVAL, "rope_scaling.original_max_position_embeddings = %lld must be >= 1",
                             (long long)c->rope_scaling.original_max_position_embeddings);
        break;
    default:
        return fx__error(FX_EINVAL, "rope_scaling.type = %d is not none (0) or llama3 (1)", (int)c->rope_scaling.type);
    }
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] < 0 || c->eos[i] >= c->vocab)
            return fx__error(FX_EINVAL, "eos[%d] = %d is outside [0, %lld)", i, c->eos[i], (long long)c->vocab);
    if (!memchr(c->arch, 0, sizeof c->arch))
        return fx__error(FX_EINVAL, "arch is not a string of at most %zu bytes", sizeof c->arch - 1);
    if (!c->arch[0])
        snprintf(c->arch, sizeof c->arch, "flexc-gpt");
    return FX_OK;
}

int fx__model_mask_parse(const char *s, fx__model_mask *mask, int64_t *window)
{
    *window = 0;
    if (!s)
        return fx__error(FX_EINVAL, "attention mask is NULL");
    if (!strcmp(s, "causal"))
        *mask = FX__MODEL_MASK_CAUSAL;
    else if (!strcmp(s, "document"))
        *mask = FX__MODEL_MASK_DOCUMENT;
    else if (!strcmp(s, "dense"))
        *mask = FX__MODEL_MASK_CAUSAL_DENSE;
    else if (!strncmp(s, "sliding:", 8)) {
        char *end = NULL;
        errno = 0;
        long long w = strtoll(s + 8, &end, 10);
        if (end == s + 8 || *end || w < 1 || errno == ERANGE)
            return fx__error(FX_EINVAL, "attention '%s': the window after 'sliding:' must be an integer >= 1", s);
        *mask = FX__MODEL_MASK_SLIDING;
        *window = w;
    } else {
        return fx__error(FX_EINVAL, "attention '%s' is not causal, sliding:W, document or dense", s);
    }
    return FX_OK;
}

void fx__model_mask_name(fx__model_mask mask, int64_t window, char *buf, size_t n)
{
    switch (mask) {
    case FX__MODEL_MASK_CAUSAL: snprintf(buf, n, "causal"); break;
    case FX__MODEL_MASK_SLIDING: snprintf(buf, n, "sliding:%lld", (long long)window); break;
    case FX__MODEL_MASK_DOCUMENT: snprintf(buf, n, "document"); break;
    case FX__MODEL_MASK_CAUSAL_DENSE: snprintf(buf, n, "dense"); break;
    }
}

/* ---- the parameter table ------------------------------------------------------------------------ */

static void fx__add_tensor(fx__model_layout *lay, const char *name, int64_t d0, int64_t d1)
{
    fx__model_tensor *t = &lay->t[lay->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = d1 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    t->offset = lay->total;
    t->decay = d1 != 0;
    lay->total += t->numel;
}

static int fx__layout_build(fx__model_layout *lay, const fx__model_config *c)
{
    lay->per_layer = c->qkv_bias ? FX__MODEL_PER_LAYER_BIAS : FX__MODEL_PER_LAYER;
    size_t n = 3 + (size_t)c->layers * lay->per_layer;
    lay->t = fx__calloc(n, sizeof *lay->t);
    if (!lay->t)
        return FX_ENOMEM;
    lay->n = 0;
    lay->total = 0;
    int64_t C = c->dim, hd = c->head_dim, QD = c->heads * hd, KD = c->kv_heads * hd, F = c->ffn;
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
        if (c->qkv_bias) {
            FX__T("attn.bq", QD, 0);
            FX__T("attn.bk", KD, 0);
            FX__T("attn.bv", KD, 0);
        }
#undef FX__T
    }
    fx__add_tensor(lay, "norm", C, 0);
    if (!c->tied_embeddings)
        fx__add_tensor(lay, "lm_head", c->vocab, C);
    /* Biases are vectors like the norms but take no decay either way. */
    return FX_OK;
}

const fx__model_tensor *fx__model_find(const fx__model *m, const char *name)
{
    for (size_t i = 0; i < m->lay.n; i++)
        if (!strcmp(m->lay.t[i].name, name))
            return &m->lay.t[i];
    return NULL;
}

/* ---- the model ------------------------------------------------------------------------------------ */

/* The model's struct and layout, no buffers. */
static int fx__model_shell(fx__model **out, const fx__model_config *cfg)
{
    if (!out || !cfg)
        return fx__error(FX_EINVAL, "fx__model_new: NULL argument");
    fx__model_config c = *cfg;
    int rc = fx__model_config_check(&c);
    if (rc)
        return rc;
    fx__model *m = fx__calloc(1, sizeof *m);
    if (!m)
        return FX_ENOMEM;
    m->c = c;
    if (c.sliding_window > 0)
        m->mask = FX__MODEL_MASK_SLIDING, m->window = c.sliding_window;
    if ((rc = fx__layout_build(&m->lay, &c)) != FX_OK) {
        fx__model_free(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

void fx__model_mapped_free(fx__model_mapped *mp)
{
    if (!mp)
        return;
    if (mp->close)
        mp->close(mp->file);
    fx__free(mp->t);
    fx__free(mp->own);
    fx__free(mp);
}

int fx__model_new_mapped(fx__model **out, const fx__model_config *cfg, fx__model_mapped *mp)
{
    fx__model *m = NULL;
    int rc = fx__model_shell(&m, cfg);
    if (rc) {
        fx__model_mapped_free(mp);
        return rc;
    }
    m->mapped = mp;
    *out = m;
    return FX_OK;
}

int fx__model_own_params(fx__model *m)
{
    if (m->params || !m->mapped)
        return FX_OK;
    float *p = fx__alloc_huge(m->lay.total * sizeof(float));
    if (!p)
        return FX_ENOMEM;
    for (size_t i = 0; i < m->lay.n; i++) {
        int rc = m->mapped->read(m->mapped->file, i, p + m->lay.t[i].offset);
        if (rc) {
            fx__free(p);
            return fx__error_context(rc, "tensor %s", m->lay.t[i].name);
        }
    }
    m->params = p;
    fx__model_mapped_free(m->mapped);
    m->mapped = NULL;
    return FX_OK;
}

int fx__model_new(fx__model **out, const fx__model_config *cfg)
{
    fx__model *m = NULL;
    int rc = fx__model_shell(&m, cfg);
    if (rc)
        return rc;
    if (!(m->params = fx__alloc_huge(m->lay.total * sizeof(float)))) {
        fx__model_free(m);
        return FX_ENOMEM;
    }
    *out = m;
    return FX_OK;
}

int fx__model_create(fx__model **out, const fx__model_config *cfg, uint64_t seed)
{
    fx__model *m = NULL;
    int rc = fx__model_new(&m, cfg);
    if (rc)
        return rc;
    /* N(0, 0.02) for matrices, the residual projections scaled by 1/sqrt(2L) (GPT-2),
       ones for norms, zeros for biases; tensor i draws from stream i, so the init is
       thread-independent. */
    float resid_std = 0.02f / sqrtf(2.0f * (float)m->c.layers);
    for (size_t i = 0; i < m->lay.n; i++) {
        const fx__model_tensor *t = &m->lay.t[i];
        float *p = m->params + t->offset;
        if (t->ndim == 1) {
            float one = strstr(t->name, "attn.b") ? 0.0f : 1.0f;
            for (size_t j = 0; j < t->numel; j++)
                p[j] = one;
            continue;
        }
        bool resid = strstr(t->name, "attn.wo") || strstr(t->name, "mlp.w2");
        fx_rng_fill_normal(p, (int64_t)t->numel, resid ? resid_std : 0.02f, seed, (uint64_t)i);
    }
    *out = m;
    return FX_OK;
}

void fx__model_free(fx__model *m)
{
    if (!m)
        return;
    fx__model_gpu_free(m->gpu);
    fx_block_mask_free(m->bmask);
    fx__model_mapped_free(m->mapped);
    fx__free(m->lay.t);
    fx__free(m->params);
    fx__free(m->grads);
    fx__free(m->adam);
    fx__free(m->adam16);
    fx__free(m->params16);
    fx__free(m->bf16_ws);
    fx__free(m->rope);
    fx__free(m->acts);
    fx__free(m->targets);
    fx__free(m->tokens);
    fx__free(m->doc);
    fx__free(m->norm_parts);
    fx__free(m);
}

/* Gradient-norm partial sums: one per fixed chunk of the flat buffer. */

int fx__model_alloc_grads(fx__model *m)
{
    if (m->grads)
        return FX_OK;
    size_t P = m->lay.total;
    m->grads = fx__calloc_huge(P, sizeof(float));
    m->norm_parts = fx__calloc((P + FX__NORM_CHUNK - 1) / FX__NORM_CHUNK, sizeof(double));
    if (!m->grads || !m->norm_parts) {
        fx__free(m->grads), fx__free(m->norm_parts);
        m->grads = NULL;
        m->norm_parts = NULL;
        return FX_ENOMEM;
    }
    m->grads_zero = true;
    return FX_OK;
}

int fx__model_alloc_train(fx__model *m)
{
    if (m->adam || m->adam16)
        return FX_OK;
    int rc = fx__model_alloc_grads(m);
    if (rc)
        return rc;
    size_t P = m->lay.total;
    if (m->adam_bf16)
        m->adam16 = fx__calloc_huge(2 * P, sizeof(uint16_t)); /* bfloat16 zero is all zero bits */
    else
        m->adam = fx__calloc_huge(2 * P, sizeof(float));
    return m->adam || m->adam16 ? FX_OK : FX_ENOMEM;
}

int fx__model_rope_ensure(fx__model *m, int64_t len)
{
    if (len <= m->rope_len)
        return FX_OK;
    if (len > m->c.ctx)
        return fx__error(FX_EINVAL, "position %lld is past the model's context %lld", (long long)(len - 1),
                         (long long)m->c.ctx);
    /* Grow by at least doubling, so a sequence of longer batches costs little. */
    int64_t want = len < 2 * m->rope_len ? 2 * m->rope_len : len;
    want = want > m->c.ctx ? m->c.ctx : want;
    int64_t hd = m->c.head_dim;
    float *r = fx__alloc((size_t)(want * hd) * sizeof(float));
    double *freq = fx__alloc((size_t)(hd / 2) * sizeof(double));
    if (!r || !freq) {
        fx__free(r), fx__free(freq);
        return FX_ENOMEM;
    }
    if (m->rope_len)
        memcpy(r, m->rope, (size_t)(m->rope_len * hd) * sizeof(float));
    fx__rope_freqs(freq, &m->c);
    fx__rope_rows(r, m->rope_len, want, freq, hd);
    fx__free(freq);
    fx__free(m->rope);
    m->rope = r;
    m->rope_len = want;
    return FX_OK;
}

float *fx__model_head(const fx__model *m, bool grads)
{
    if (m->c.tied_embeddings)
        return grads ? m->grads : m->params;
    /* After the final norm, in its unit (the same buffer under sharded training). */
    const fx__model_tensor *tn = fx__layer_first(m, m->c.layers);
    return fx__layer_base(m, grads, m->c.layers) + (tn[1].offset - tn->offset);
}

/* Views of the activation buffer for (B, T). Carved in a fixed order; `base` NULL only
   counts. */
/* With recompute, the per-layer activations have one slot (the layer being worked on) and
   only the residual stream is kept for every layer. */
void fx__acts_carve(fx__acts *a, float *base, const fx__model_config *c, int64_t B, int64_t T, bool unfused,
                           bool recompute)
{
    size_t N = (size_t)(B * T), L = recompute ? 1 : (size_t)c->layers, C = (size_t)c->dim, F = (size_t)c->ffn;
    size_t hd = (size_t)c->head_dim, QD = (size_t)c->heads * hd, KD = (size_t)c->kv_heads * hd;
    /* work: the MLP's [N, F], or the attention's gradients and the q, k, v one's ([N, QD + 2 KD] each) */
    size_t wide = F > 2 * (QD + 2 * KD) ? F : 2 * (QD + 2 * KD);
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
    FX__CARVE(xn2, L * N * (QD > C ? QD : C)); /* backward: also d(att) [N, QD] */
    FX__CARVE(rstd2, L * N);
    FX__CARVE(h13, L * N * 2 * F);
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

size_t fx__model_acts_floats(const fx__model *m, int64_t B, int64_t T)
{
    fx__acts a;
    fx__acts_carve(&a, NULL, &m->c, B, T, m->loss_impl == FX__MODEL_LOSS_UNFUSED, m->recompute);
    return a.total;
}

int fx__model_set_batch(fx__model *m, int64_t B, int64_t T)
{
    if (B < 1 || B > (1 << 20))
        return fx__error(FX_EINVAL, "batch = %lld is outside [1, 1048576]", (long long)B);
    if (T < 1 || T > m->c.ctx)
        return fx__error(FX_EINVAL, "sequence length %lld is outside [1, %lld] (the model's context)",
                         (long long)T, (long long)m->c.ctx);
    if (m->gpu) /* the activations live on the device */
        return fx__model_gpu_set_batch(m, B, T);
    int rc = fx__model_rope_ensure(m, T);
    if (rc)
        return rc;
    size_t need = fx__model_acts_floats(m, B, T);
    if (m->acts && m->B == B && m->T == T && m->acts_floats == need)
        return FX_OK;
    m->grad_ready = false;
    fx__free(m->acts), fx__free(m->targets), fx__free(m->tokens), fx__free(m->doc);
    fx_block_mask_free(m->bmask);
    m->bmask = NULL;
    m->acts = fx__alloc_huge(need * sizeof(float));
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

