/* The model: configuration and presets, the parameter table, creation and initialisation,
   and the buffers of training (gradients, Adam moments, activations). */
#include "model_internal.h"

#include <flexc/mod.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- attention mods ------------------------------------------------------------------------------ */

int fx__model_mod_compile(fx_mod **out, const char *src, bool mask)
{
    *out = NULL;
    if (strlen(src) >= FX__MOD_SRC_MAX)
        return fx__error(FX_EINVAL, "the expression is %zu bytes long, more than %d", strlen(src),
                         FX__MOD_SRC_MAX - 1);
    fx_mod *md = NULL;
    int rc = fx_mod_compile(&md, src, NULL, 0);
    if (rc)
        return rc;
    if (fx_mod_is_mask(md) != mask) {
        fx_mod_free(md);
        return fx__error(FX_EINVAL, mask ? "'%s' is not a mask: its value is not bool (a comparison, &&, ||, ...)"
                                         : "'%s' is a mask (its value is bool), not a score",
                         src);
    }
    *out = md;
    return FX_OK;
}

bool fx__mod_src_reads(const char *src, char leaf)
{
    for (const char *s = src; s && *s;) {
        const unsigned char c = (unsigned char)*s;
        if (isdigit(c) || (c == '.' && isdigit((unsigned char)s[1]))) {
            /* a number, its exponent's sign included */
            for (s++; isalnum((unsigned char)*s) || *s == '_' || *s == '.' ||
                      ((*s == '+' || *s == '-') && (s[-1] == 'e' || s[-1] == 'E'));
                 s++)
                ;
        } else if (isalpha(c) || c == '_') {
            const char *w = s;
            while (isalnum((unsigned char)*s) || *s == '_')
                s++;
            if (s - w == 1 && *w == leaf)
                return true;
        } else {
            s++;
        }
    }
    return false;
}

static char *mod_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = fx__alloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int fx__model_set_mods(fx__model *m, const char *score, const char *mask)
{
    fx_mod *sm = NULL, *mm = NULL;
    char *ss = NULL, *ms = NULL;
    int rc = FX_OK;
    if (score && *score && (rc = fx__model_mod_compile(&sm, score, false)) != FX_OK)
        return fx__error_context(rc, "score mod");
    if (mask && *mask && (rc = fx__model_mod_compile(&mm, mask, true)) != FX_OK) {
        fx_mod_free(sm);
        return fx__error_context(rc, "mask mod");
    }
    if ((sm && !(ss = mod_strdup(score))) || (mm && !(ms = mod_strdup(mask)))) {
        fx_mod_free(sm), fx_mod_free(mm), fx__free(ss);
        return FX_ENOMEM;
    }
    fx_mod_free(m->score_mod), fx_mod_free(m->mask_mod);
    fx__free(m->score_src), fx__free(m->mask_src);
    m->score_mod = sm, m->mask_mod = mm, m->score_src = ss, m->mask_src = ms;
    m->mods_b = fx__mod_src_reads(ss, 'b') || fx__mod_src_reads(ms, 'b');
    m->mods_h = fx__mod_src_reads(ss, 'h') || fx__mod_src_reads(ms, 'h');
    /* The block mask is rebuilt for the new mask. */
    fx_block_mask_free(m->bmask);
    m->bmask = NULL;
    return FX_OK;
}

void fx__model_attn_name(const fx__model *m, char *buf, size_t n)
{
    char name[32];
    fx__model_mask_name(m->mask, m->window, name, sizeof name);
    if (m->mask_mod)
        snprintf(buf, n, "mod");
    else if (m->score_mod)
        snprintf(buf, n, "mod:%s", name);
    else
        snprintf(buf, n, "%s", name);
}

/* ---- the parameter table ------------------------------------------------------------------------ */

static int fx__add_tensor(void *ctx, const fx__arch_entry *e)
{
    fx__model_layout *lay = ctx;
    fx__model_tensor *t = &lay->t[lay->n++];
    snprintf(t->name, sizeof t->name, "%s", e->name);
    t->ndim = e->ndim;
    t->shape[0] = e->shape[0];
    t->shape[1] = e->shape[1];
    t->numel = (size_t)e->shape[0] * (size_t)(e->ndim == 2 ? e->shape[1] : 1);
    t->offset = lay->total;
    t->decay = e->t->decay;
    t->arch = e->t;
    t->layer = e->layer;
    lay->total += t->numel;
    return FX_OK;
}

static int fx__layout_build(fx__model_layout *lay, const fx_model_config *c)
{
    lay->per_layer = fx__arch_layer_count(c);
    lay->t = fx__calloc(fx__arch_count(c), sizeof *lay->t);
    if (!lay->t)
        return FX_ENOMEM;
    lay->n = 0;
    lay->total = 0;
    return fx__arch_each(c, fx__add_tensor, lay);
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
static int fx__model_shell(fx__model **out, const fx_model_config *cfg)
{
    if (!out || !cfg)
        return fx__error(FX_EINVAL, "fx__model_new: NULL argument");
    fx_model_config c = *cfg;
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

int fx__model_new_mapped(fx__model **out, const fx_model_config *cfg, fx__model_mapped *mp)
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
    /* Adapters follow the base's rows: flexc's order from here on. */
    int rc = m->lora && m->mapped->rope_half ? fx__lora_rows_to_flexc(m->lora, m->c.head_dim) : FX_OK;
    if (rc) {
        fx__free(p);
        return rc;
    }
    m->params = p;
    fx__model_mapped_free(m->mapped);
    m->mapped = NULL;
    return FX_OK;
}

int fx__model_new(fx__model **out, const fx_model_config *cfg)
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

int fx__model_create(fx__model **out, const fx_model_config *cfg, uint64_t seed)
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
        switch (t->arch->init) {
        case FX__INIT_ONES:
        case FX__INIT_ZEROS:
            for (size_t j = 0; j < t->numel; j++)
                p[j] = t->arch->init == FX__INIT_ONES ? 1.0f : 0.0f;
            break;
        case FX__INIT_NORMAL:
        case FX__INIT_RESIDUAL:
            fx_rng_fill_normal(p, (int64_t)t->numel, t->arch->init == FX__INIT_RESIDUAL ? resid_std : 0.02f, seed,
                               (uint64_t)i);
            break;
        }
    }
    *out = m;
    return FX_OK;
}

void fx__model_free(fx__model *m)
{
    if (!m)
        return;
    if (m->device)
        m->device->release(m->gpu);
    fx_block_mask_free(m->bmask);
    fx__model_mapped_free(m->mapped);
    fx__free(m->lay.t);
    fx__free(m->params);
    fx__free(m->grads);
    fx__free(m->adam);
    fx__free(m->adam16);
    fx__free(m->params16);
    fx__free(m->bf16_ws);
    fx__free(m->head16);
    fx__free(m->rope);
    fx__free(m->acts);
    fx__free(m->targets);
    fx__free(m->tokens);
    fx__free(m->doc);
    fx__free(m->norm_parts);
    fx__lora_free(m->lora);
    fx__free(m->map_tile);
    fx_mod_free(m->score_mod), fx_mod_free(m->mask_mod);
    fx__free(m->score_src), fx__free(m->mask_src);
    fx__free(m);
}

int fx__model_set_lora(fx__model *m, fx__lora *a)
{
    if (a && a->layers != m->c.layers) {
        fx__lora_free(a);
        return fx__error(FX_EINVAL, "LoRA adapters for %lld layers on a model of %lld", (long long)a->layers,
                         (long long)m->c.layers);
    }
    if (a && m->device) {
        fx__lora_free(a);
        return fx__error(FX_EUNSUPPORTED, "LoRA adapters on a device model");
    }
    fx__lora_free(m->lora);
    m->lora = a;
    m->grad_ready = false;
    return FX_OK;
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
void fx__acts_carve(fx__acts *a, float *base, const fx_model_config *c, int64_t B, int64_t T, bool unfused,
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
    if (m->device) /* the activations live on the device */
        return m->device->set_batch(m, B, T);
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

