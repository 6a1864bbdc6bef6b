/* Checkpoints and model files: safetensors with the config (and training state) in the
   metadata. Everything read is checked against the config before a byte is copied. */
#include "ckpt.h"

#include "core/finite.h"
#include "hf/hf.h"
#include "run_params.h"

#include <flexc/mod.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fx__meta_add(fx__meta *m, const char *key, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->val[m->n], FX__META_LEN, fmt, ap);
    va_end(ap);
    m->kv[2 * m->n] = key;
    m->kv[2 * m->n + 1] = m->val[m->n];
    m->n++;
    m->kv[2 * m->n] = NULL;
}

void fx__meta_add_ref(fx__meta *m, const char *key, const char *value)
{
    m->kv[2 * m->n] = key;
    m->kv[2 * m->n + 1] = value;
    m->n++;
    m->kv[2 * m->n] = NULL;
}

void fx__meta_config(fx__meta *md, const fx__model *m, const char *kind)
{
    const fx_model_config *c = &m->c;
    char attn[48];
    fx__model_attn_name(m, attn, sizeof attn);
    fx__meta_add(md, "format", FX__FORMAT);
    fx__meta_add(md, "format_version", FX__FORMAT_VERSION);
    fx__meta_add(md, "kind", "%s", kind);
    /* The fields every file has, the mask, then those added with the model API. */
    char val[FX__META_LEN];
    for (int always = 1; always >= 0; always--) {
        for (size_t i = 0; i < fx__config_nfields; i++) {
            const fx__config_field *f = &fx__config_fields[i];
            if (f->always != (bool)always)
                continue;
            fx__config_field_format(f, c, val, sizeof val);
            fx__meta_add(md, f->key, "%s", val);
        }
        if (always) {
            fx__meta_add(md, "attn", "%s", attn);
            /* The mods' texts, only where there are mods (files without them are as before). */
            if (m->mask_src)
                fx__meta_add_ref(md, "mask_mod", m->mask_src);
            if (m->score_src)
                fx__meta_add_ref(md, "score_mod", m->score_src);
        }
    }
    bool bytes = !strcmp(c->arch, "flexc-gpt") && c->vocab == FX__MODEL_VOCAB;
    fx__meta_add(md, "tokenizer", "%s", bytes ? "bytes+eot" : "external");
}

void fx__meta_state(fx__meta *md, const fx__model_train_state *s)
{
    fx__meta_add(md, "step", "%lld", (long long)s->step);
    fx__meta_add(md, "data_pos", "%lld", (long long)s->data_pos);
    fx__meta_add(md, "rng", "%llu:%llu:%llu:%u:%u:%u:%u:%u", (unsigned long long)s->rng.seed,
                 (unsigned long long)s->rng.stream, (unsigned long long)s->rng.counter, s->rng.buf[0], s->rng.buf[1],
                 s->rng.buf[2], s->rng.buf[3], s->rng.used);
    fx__meta_add(md, "steps", "%lld", (long long)s->steps);
    fx__meta_add(md, "warmup", "%lld", (long long)s->warmup);
    fx__meta_add(md, "batch", "%lld", (long long)s->batch);
    fx__meta_add(md, "seq", "%lld", (long long)s->seq);
    fx__meta_add(md, "accum", "%lld", (long long)s->accum);
    fx__meta_add(md, "lr", "%.9g", (double)s->lr);
    fx__meta_add(md, "min_lr", "%.9g", (double)s->min_lr);
    fx__meta_add(md, "weight_decay", "%.9g", (double)s->weight_decay);
    fx__meta_add(md, "clip", "%.9g", (double)s->clip);
    fx__meta_add(md, "beta1", "%.9g", (double)s->beta1);
    fx__meta_add(md, "beta2", "%.9g", (double)s->beta2);
    fx__meta_add(md, "seed", "%llu", (unsigned long long)s->seed);
    fx__meta_add(md, "data_hash", "%016llx", (unsigned long long)s->data_hash);
    fx__meta_add(md, "deterministic", "%d", s->deterministic ? 1 : 0);
    fx__meta_add(md, "dtype", "%s", s->bf16 ? "bf16" : "f32");
    fx__meta_add_ref(md, "data", s->data); /* a path may be longer than the other values */
}

static fx_tensor_view fx__view(const fx__model_tensor *t, const void *data, fx_dtype dt, size_t esize)
{
    fx_tensor_view v = {.name = t->name, .dtype = dt, .ndim = t->ndim, .data = data, .nbytes = t->numel * esize};
    v.shape[0] = t->shape[0];
    v.shape[1] = t->shape[1];
    return v;
}

int fx__model_save_checkpoint(const fx__model *m, const fx__model_train_state *s, const char *path)
{
    if (!m->adam && !m->adam16)
        return fx__error(FX_EINVAL, "checkpoint '%s': the model has no optimizer state", path);
    size_t n = m->lay.n + 2, P = m->lay.total;
    fx_dtype adt = m->adam16 ? FX_DT_BF16 : FX_DT_F32;
    size_t aes = m->adam16 ? 2 : 4;
    const char *am = m->adam16 ? (const char *)m->adam16 : (const char *)m->adam;
    fx_tensor_view *v = fx__calloc(n, sizeof *v);
    if (!v)
        return FX_ENOMEM;
    for (size_t i = 0; i < m->lay.n; i++)
        v[i] = fx__view(&m->lay.t[i], m->params + m->lay.t[i].offset, FX_DT_F32, 4);
    v[n - 2] = (fx_tensor_view){.name = "optim.m", .dtype = adt, .ndim = 1, .shape = {(int64_t)P},
                                .data = am, .nbytes = P * aes};
    v[n - 1] = (fx_tensor_view){.name = "optim.v", .dtype = adt, .ndim = 1, .shape = {(int64_t)P},
                                .data = am + P * aes, .nbytes = P * aes};
    fx__meta md = {0};
    fx__meta_config(&md, m, "checkpoint");
    fx__meta_state(&md, s);
    int rc = fx_safetensors_save(path, v, n, md.kv);
    fx__free(v);
    return rc;
}

int fx__model_save_model(const fx__model *m, const char *path, bool bf16)
{
    size_t n = m->lay.n, P = m->lay.total;
    fx_tensor_view *v = fx__calloc(n, sizeof *v);
    uint16_t *h = bf16 ? fx__alloc(P * sizeof(uint16_t)) : NULL;
    if (!v || (bf16 && !h)) {
        fx__free(v), fx__free(h);
        return FX_ENOMEM;
    }
    if (bf16)
        for (size_t i = 0; i < P; i++)
            h[i] = fx_f32_to_bf16(m->params[i]);
    for (size_t i = 0; i < n; i++) {
        const fx__model_tensor *t = &m->lay.t[i];
        v[i] = bf16 ? fx__view(t, h + t->offset, FX_DT_BF16, 2) : fx__view(t, m->params + t->offset, FX_DT_F32, 4);
    }
    fx__meta md = {0};
    fx__meta_config(&md, m, "model");
    int rc = fx_safetensors_save(path, v, n, md.kv);
    fx__free(v), fx__free(h);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------------------ */

int fx__meta_i64(const fx_safetensors *f, const char *path, const char *key, int64_t *out)
{
    const char *s = fx_safetensors_metadata(f, key);
    if (!s)
        return fx__error(FX_EFORMAT, "'%s': metadata has no '%s'", path, key);
    return fx__meta_parse_i64(s, path, key, out);
}

int fx__meta_f32(const fx_safetensors *f, const char *path, const char *key, float *out)
{
    const char *s = fx_safetensors_metadata(f, key);
    if (!s)
        return fx__error(FX_EFORMAT, "'%s': metadata has no '%s'", path, key);
    return fx__meta_parse_f32(s, path, key, out);
}

/* The configuration from the metadata, field by field (config.h): a field every file has
   must be there; one added with the model API and absent (files written before it) takes
   the byte-level GPT's value. */
static int fx__read_config_fields(const fx_safetensors *f, const char *path, fx_model_config *cc)
{
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *fl = &fx__config_fields[i];
        const char *text = fx_safetensors_metadata(f, fl->key);
        if (!text && fl->always)
            return fx__error(FX_EFORMAT, "'%s': metadata has no '%s'", path, fl->key);
        if (!text)
            fx__config_field_default(fl, cc);
        else if (fx__config_field_parse(fl, cc, text, path) != FX_OK)
            return FX_EFORMAT;
    }
    return FX_OK;
}

/* The attention of a file (fx__model_attn_name): the built-in mask's name, or "mod" with the
   mask mod, and the mods' texts (NULL: none), each compiled to check it. A file that names
   mods in "attn" has them, and one that does not has none. */
static int fx__read_attn(const fx_safetensors *f, const char *path, char name[32], const char **score,
                         const char **mask)
{
    const char *attn = fx_safetensors_metadata(f, "attn");
    *score = fx_safetensors_metadata(f, "score_mod");
    *mask = fx_safetensors_metadata(f, "mask_mod");
    fx__model_mask mk;
    int64_t w;
    const bool mod = attn && !strcmp(attn, "mod"), over = attn && !strncmp(attn, "mod:", 4);
    const char *builtin = over ? attn + 4 : attn;
    if (!attn || (!mod && fx__model_mask_parse(builtin, &mk, &w) != FX_OK))
        return fx__error(FX_EFORMAT, "'%s': metadata attn = '%s' is not a known mask", path, attn ? attn : "(none)");
    if ((mod && !*mask) || (over && !*score) || (!mod && *mask) || (!mod && !over && *score))
        return fx__error(FX_EFORMAT, "'%s': metadata attn = '%s' with%s mask_mod and with%s score_mod", path, attn,
                         *mask ? "" : "out", *score ? "" : "out");
    const char *src[2] = {*score, *mask};
    for (int i = 0; i < 2; i++) {
        fx_mod *md = NULL;
        if (src[i] && fx__model_mod_compile(&md, src[i], i == 1) != FX_OK)
            return fx__error(FX_EFORMAT, "'%s': metadata %s: %s", path, i ? "mask_mod" : "score_mod", fx_last_error());
        fx_mod_free(md);
    }
    snprintf(name, 32, "%s", mod ? "mod" : builtin);
    return FX_OK;
}

int fx__ckpt_read(const fx_safetensors *f, const char *path, fx_model_config *c, fx__model_train_state *s,
                  bool *has_adam)
{
    const char *fmt = fx_safetensors_metadata(f, "format");
    if (!fmt || strcmp(fmt, FX__FORMAT) != 0)
        return fx__error(FX_EFORMAT, "'%s' is not a flexc GPT checkpoint or model (metadata format = '%s')", path,
                         fmt ? fmt : "(none)");
    const char *ver = fx_safetensors_metadata(f, "format_version");
    if (!ver || strcmp(ver, FX__FORMAT_VERSION) != 0)
        return fx__error(FX_EFORMAT, "'%s': format version '%s' is not supported (this flexc reads %s)", path,
                         ver ? ver : "(none)", FX__FORMAT_VERSION);
    const char *kind = fx_safetensors_metadata(f, "kind");
    if (!kind || (strcmp(kind, "checkpoint") != 0 && strcmp(kind, "model") != 0 && strcmp(kind, "lora") != 0))
        return fx__error(FX_EFORMAT, "'%s': metadata kind = '%s' is not checkpoint, model or lora", path,
                         kind ? kind : "(none)");
    fx_model_config cc = {0};
    int rc;
    if ((rc = fx__read_config_fields(f, path, &cc)) != FX_OK)
        return rc;
    /* 0 asks fx__model_config_check to derive them; a file records the values it was built
       with, so 0 there is not one. */
    if (cc.ffn == 0)
        return fx__error(FX_EFORMAT, "'%s': metadata ffn = 0", path);
    if (cc.head_dim == 0 && fx_safetensors_metadata(f, "head_dim"))
        return fx__error(FX_EFORMAT, "'%s': metadata head_dim = 0 (a file records the heads' size)", path);
    bool known = !strcmp(cc.arch, "flexc-gpt");
    for (int a = FX__HF_LLAMA; a <= FX__HF_QWEN2; a++)
        known = known || !strcmp(cc.arch, fx__hf_arch_name((fx__hf_arch)a));
    if (!known)
        return fx__error(FX_EFORMAT, "'%s': metadata arch = '%s' is not flexc-gpt, %s, %s or %s", path, cc.arch,
                         fx__hf_arch_name(FX__HF_LLAMA), fx__hf_arch_name(FX__HF_MISTRAL),
                         fx__hf_arch_name(FX__HF_QWEN2));
    if ((rc = fx__model_config_check(&cc)) != FX_OK)
        return fx__error_context(FX_EFORMAT, "'%s': config", path);
    const char *tok = fx_safetensors_metadata(f, "tokenizer");
    if ((!tok || !strcmp(tok, "bytes+eot")) && cc.vocab != FX__MODEL_VOCAB)
        return fx__error(FX_EFORMAT, "'%s': vocab = %lld, but flexc's byte tokenizer has %d tokens", path,
                         (long long)cc.vocab, FX__MODEL_VOCAB);
    bool adam = fx_safetensors_find(f, "optim.m") != NULL;
    if (s) {
        char mask_name[32];
        const char *score_mod = NULL, *mask_mod = NULL;
        if ((rc = fx__read_attn(f, path, mask_name, &score_mod, &mask_mod)) != FX_OK)
            return rc;
        memset(s, 0, sizeof *s);
        snprintf(s->attn, sizeof s->attn, "%s", mask_name);
        snprintf(s->score_mod, sizeof s->score_mod, "%s", score_mod ? score_mod : "");
        snprintf(s->mask_mod, sizeof s->mask_mod, "%s", mask_mod ? mask_mod : "");
        if (adam) {
            int64_t seed = 0;
            const char *r = fx_safetensors_metadata(f, "rng");
            unsigned long long a0, a1, a2;
            unsigned b0, b1, b2, b3, used;
            char tail;
            if (!r || sscanf(r, "%llu:%llu:%llu:%u:%u:%u:%u:%u%c", &a0, &a1, &a2, &b0, &b1, &b2, &b3, &used, &tail) != 8 ||
                used > 4)
                return fx__error(FX_EFORMAT, "'%s': metadata rng = '%s' is not a generator state", path,
                                 r ? r : "(none)");
            s->rng = (fx_rng){.seed = a0, .stream = a1, .counter = a2, .buf = {b0, b1, b2, b3}, .used = used};
            if ((rc = fx__meta_i64(f, path, "step", &s->step)) || (rc = fx__meta_i64(f, path, "data_pos", &s->data_pos)) ||
                (rc = fx__meta_i64(f, path, "steps", &s->steps)) || (rc = fx__meta_i64(f, path, "warmup", &s->warmup)) ||
                (rc = fx__meta_i64(f, path, "batch", &s->batch)) || (rc = fx__meta_i64(f, path, "seq", &s->seq)) ||
                (rc = fx__meta_i64(f, path, "accum", &s->accum)) || (rc = fx__meta_f32(f, path, "lr", &s->lr)) ||
                (rc = fx__meta_f32(f, path, "min_lr", &s->min_lr)) ||
                (rc = fx__meta_f32(f, path, "weight_decay", &s->weight_decay)) ||
                (rc = fx__meta_f32(f, path, "clip", &s->clip)) || (rc = fx__meta_f32(f, path, "beta1", &s->beta1)) ||
                (rc = fx__meta_f32(f, path, "beta2", &s->beta2)) || (rc = fx__meta_i64(f, path, "seed", &seed)))
                return rc;
            s->seed = (uint64_t)seed;
            const char *data = fx_safetensors_metadata(f, "data"), *dh = fx_safetensors_metadata(f, "data_hash");
            if (!data)
                return fx__error(FX_EFORMAT, "'%s': metadata has no 'data'", path);
            if (strlen(data) >= sizeof s->data)
                return fx__error(FX_EFORMAT, "'%s': metadata 'data' is %zu bytes, more than %zu", path, strlen(data),
                                 sizeof s->data - 1);
            if (!dh)
                return fx__error(FX_EFORMAT, "'%s': metadata has no 'data_hash'", path);
            if (sscanf(dh, "%16llx%c", &a0, &tail) != 1)
                return fx__error(FX_EFORMAT, "'%s': metadata data_hash = '%s' is not 16 hexadecimal digits", path, dh);
            snprintf(s->data, sizeof s->data, "%s", data);
            s->data_hash = a0;
            s->adam_bf16 = fx_safetensors_find(f, "optim.m")->dtype == FX_DT_BF16;
            /* Absent in checkpoints written before it was recorded: not deterministic. */
            const char *det = fx_safetensors_metadata(f, "deterministic");
            if (det && strcmp(det, "0") != 0 && strcmp(det, "1") != 0)
                return fx__error(FX_EFORMAT, "'%s': metadata deterministic = '%s' is not 0 or 1", path, det);
            s->deterministic = det && det[0] == '1';
            /* The matrix products' dtype; absent in checkpoints written before it was
               recorded: f32. */
            const char *dt = fx_safetensors_metadata(f, "dtype");
            if (dt && strcmp(dt, "f32") != 0 && strcmp(dt, "bf16") != 0)
                return fx__error(FX_EFORMAT, "'%s': metadata dtype = '%s' is not f32 or bf16", path, dt);
            s->bf16 = dt && strcmp(dt, "bf16") == 0;
            /* The ranges the command line would hold them to (run_params.c). */
            bool order;
            const fx__run_param *bad = fx__run_params_check(s, cc.ctx, &order);
            if (bad) {
                char val[48], rule[64];
                fx__run_param_format(bad, s, val, sizeof val);
                if (order)
                    return fx__error(FX_EFORMAT, "'%s': training state min_lr = %s is above lr = %.9g", path, val,
                                     (double)s->lr);
                fx__run_param_rule(bad, cc.ctx, rule, sizeof rule);
                return fx__error(FX_EFORMAT, "'%s': training state %s = %s %s", path, bad->key, val, rule);
            }
        }
    }
    *c = cc;
    if (has_adam)
        *has_adam = adam;
    return FX_OK;
}

/* A file of another kind is refused from its metadata alone, before its tensor table is
   built (a header of a million tensors takes a while to index). */
int fx__check_format(const char *path)
{
    char fmt[32];
    bool found = false;
    int rc = fx_safetensors_peek_metadata(path, "format", fmt, sizeof fmt, &found);
    if (rc == FX_ERANGE)
        return fx__error(FX_EFORMAT, "'%s' is not a flexc GPT checkpoint or model (its metadata format is a long "
                         "string)", path);
    if (rc != FX_OK)
        return rc;
    if (!found || strcmp(fmt, FX__FORMAT) != 0)
        return fx__error(FX_EFORMAT, "'%s' is not a flexc GPT checkpoint or model (metadata format = '%s')", path,
                         found ? fmt : "(none)");
    return FX_OK;
}

int fx__model_read_config(const char *path, fx_model_config *c, fx__model_train_state *s, bool *has_adam)
{
    fx_safetensors *f = NULL;
    int rc = fx__check_format(path);
    if (rc)
        return rc;
    rc = fx_safetensors_open(&f, path);
    if (rc)
        return rc;
    rc = fx__ckpt_read(f, path, c, s, has_adam);
    fx_safetensors_close(f);
    return rc;
}

int fx__check_view(const char *path, const fx_tensor_view *v, const char *name, int ndim, const int64_t *shape,
                          bool allow_bf16)
{
    if (!v)
        return fx__error(FX_EFORMAT, "'%s' has no tensor '%s'", path, name);
    if (v->dtype != FX_DT_F32 && !(allow_bf16 && v->dtype == FX_DT_BF16))
        return fx__error(FX_EFORMAT, "'%s': tensor '%s' has dtype %s, not F32%s", path, name,
                         fx_dtype_name(v->dtype), allow_bf16 ? " or BF16" : "");
    bool same = v->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = v->shape[d] == shape[d];
    if (!same)
        return fx__error(FX_EFORMAT, "'%s': tensor '%s' has shape [%lld%s...], the config says [%lld, %lld]", path,
                         name, (long long)(v->ndim > 0 ? v->shape[0] : 0), v->ndim > 1 ? ", " : "",
                         (long long)shape[0], (long long)(ndim > 1 ? shape[1] : 0));
    return FX_OK;
}

/* The Adam moments of a checkpoint: both finite, the second never negative (it is a running
   mean of squares). Anything else is a corrupt file, not a training problem: resuming it
   would fail steps later with a message about the learning rate. */
int fx__check_moments(const char *path, const fx_tensor_view *mv, const fx_tensor_view *vv)
{
    const fx_tensor_view *both[2] = {mv, vv};
    for (int k = 0; k < 2; k++) {
        const fx_tensor_view *t = both[k];
        size_t n = (size_t)fx_tensor_numel(t);
        int64_t bad = fx__first_nonfinite(t->data, t->dtype, n);
        if (bad >= 0)
            return fx__error(FX_EFORMAT, "'%s' is corrupt: optimizer state %s[%lld] is %s (the moments of a "
                             "checkpoint are always finite)", path, t->name, (long long)bad,
                             fx__nonfinite_name(t->data, t->dtype, (size_t)bad));
    }
    /* Negative: the sign bit set on anything but zero. */
    const unsigned char *p = vv->data;
    size_t n = (size_t)fx_tensor_numel(vv), es = fx_dtype_size(vv->dtype);
    for (size_t i = 0; i < n; i++) {
        uint32_t w = es == 4 ? (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 | (uint32_t)p[4 * i + 2] << 16 |
                                   (uint32_t)p[4 * i + 3] << 24
                             : ((uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8) << 16;
        if ((w & 0x80000000u) && (w & 0x7fffffffu)) {
            float x;
            memcpy(&x, &w, 4);
            return fx__error(FX_EFORMAT, "'%s' is corrupt: optimizer state optim.v[%zu] = %g is negative (a second "
                             "moment is a mean of squares)", path, i, (double)x);
        }
    }
    return FX_OK;
}

int fx__model_load(fx__model *m, const char *path, bool load_adam)
{
    fx_safetensors *f = NULL;
    int rc = fx__check_format(path);
    if (rc)
        return rc;
    rc = fx_safetensors_open(&f, path);
    if (rc)
        return rc;
    fx_model_config c;
    bool adam = false;
    if ((rc = fx__ckpt_read(f, path, &c, NULL, &adam)) != FX_OK)
        goto done;
    if (!strcmp(fx_safetensors_metadata(f, "kind"), "lora")) {
        rc = fx__error(FX_EFORMAT, "'%s' holds LoRA adapters, not a whole model (read it with fx_model_load, which "
                       "maps the base model it names)", path);
        goto done;
    }
    if (c.layers != m->c.layers || c.dim != m->c.dim || c.heads != m->c.heads || c.kv_heads != m->c.kv_heads ||
        c.ffn != m->c.ffn || c.vocab != m->c.vocab || c.ctx != m->c.ctx || c.head_dim != m->c.head_dim ||
        c.qkv_bias != m->c.qkv_bias || c.tied_embeddings != m->c.tied_embeddings) {
        rc = fx__error(FX_EINVAL,
                       "'%s' holds a model with layers=%lld dim=%lld heads=%lld kv_heads=%lld head_dim=%lld ffn=%lld "
                       "ctx=%lld qkv_bias=%d tied=%d, not layers=%lld dim=%lld heads=%lld kv_heads=%lld "
                       "head_dim=%lld ffn=%lld ctx=%lld qkv_bias=%d tied=%d",
                       path, (long long)c.layers, (long long)c.dim, (long long)c.heads, (long long)c.kv_heads,
                       (long long)c.head_dim, (long long)c.ffn, (long long)c.ctx, c.qkv_bias, c.tied_embeddings,
                       (long long)m->c.layers, (long long)m->c.dim, (long long)m->c.heads, (long long)m->c.kv_heads,
                       (long long)m->c.head_dim, (long long)m->c.ffn, (long long)m->c.ctx, m->c.qkv_bias,
                       m->c.tied_embeddings);
        goto done;
    }
    if (load_adam && (!adam || (!m->adam && !m->adam16))) {
        rc = fx__error(FX_EFORMAT, "'%s' holds no optimizer state (a model file, not a checkpoint)", path);
        goto done;
    }
    /* Check everything, then copy. */
    size_t expect = m->lay.n + (adam ? 2 : 0);
    if (fx_safetensors_count(f) != expect) {
        rc = fx__error(FX_EFORMAT, "'%s' holds %zu tensor%s; the config needs %zu", path, fx_safetensors_count(f),
                       fx_safetensors_count(f) == 1 ? "" : "s", expect);
        goto done;
    }
    for (size_t i = 0; i < m->lay.n && !rc; i++) {
        const fx__model_tensor *t = &m->lay.t[i];
        rc = fx__check_view(path, fx_safetensors_find(f, t->name), t->name, t->ndim, t->shape, true);
    }
    int64_t P = (int64_t)m->lay.total;
    if (!rc && adam) {
        rc = fx__check_view(path, fx_safetensors_find(f, "optim.m"), "optim.m", 1, &P, true);
        if (!rc)
            rc = fx__check_view(path, fx_safetensors_find(f, "optim.v"), "optim.v", 1, &P, true);
        fx_dtype want = m->adam16 ? FX_DT_BF16 : FX_DT_F32;
        if (!rc && load_adam &&
            (fx_safetensors_find(f, "optim.m")->dtype != want || fx_safetensors_find(f, "optim.v")->dtype != want))
            rc = fx__error(FX_EINVAL, "'%s' holds %s Adam moments; the model keeps them in %s", path,
                           want == FX_DT_BF16 ? "float32" : "bfloat16", want == FX_DT_BF16 ? "bfloat16" : "float32");
    }
    /* Values: a NaN or an infinity would load and then decode garbage or train to NaN far
       from the cause. One pass over each tensor, before anything is copied. */
    for (size_t i = 0; i < m->lay.n && !rc; i++) {
        const fx_tensor_view *v = fx_safetensors_find(f, m->lay.t[i].name);
        int64_t bad = fx__first_nonfinite(v->data, v->dtype, m->lay.t[i].numel);
        if (bad >= 0)
            rc = fx__error(FX_EFORMAT, "'%s': tensor '%s' holds %s at index %lld (a model with non-finite weights "
                           "cannot be used)", path, v->name, fx__nonfinite_name(v->data, v->dtype, (size_t)bad),
                           (long long)bad);
    }
    if (!rc && load_adam)
        rc = fx__check_moments(path, fx_safetensors_find(f, "optim.m"), fx_safetensors_find(f, "optim.v"));
    /* A file trained with attention mods gives them to the model (other files leave its
       attention as it is), before anything is copied. */
    const char *score = fx_safetensors_metadata(f, "score_mod"), *mask = fx_safetensors_metadata(f, "mask_mod");
    if (!rc && (score || mask) && (rc = fx__model_set_mods(m, score, mask)) != FX_OK)
        fx__error_context(rc, "'%s'", path);
    if (rc)
        goto done;
    for (size_t i = 0; i < m->lay.n; i++) {
        const fx__model_tensor *t = &m->lay.t[i];
        const fx_tensor_view *v = fx_safetensors_find(f, t->name);
        if ((rc = fx_tensor_to_f32(m->params + t->offset, t->numel, v)) != FX_OK)
            goto done; /* not reached: dtype and size were checked above */
    }
    if (load_adam) {
        size_t es = m->adam16 ? 2 : 4;
        char *dst = m->adam16 ? (char *)m->adam16 : (char *)m->adam;
        memcpy(dst, fx_safetensors_find(f, "optim.m")->data, (size_t)P * es);
        memcpy(dst + (size_t)P * es, fx_safetensors_find(f, "optim.v")->data, (size_t)P * es);
    }
    fx__model_bf16_sync(m); /* bf16 training: the weights' copy follows what was loaded */
done:
    fx_safetensors_close(f);
    return rc;
}
