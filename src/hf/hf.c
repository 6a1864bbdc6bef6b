/* fx__hf_load: a Hugging Face directory into an fx_model (what fx_model_load calls for a
   directory holding config.json), and back: the HF configuration of a model that came from one. */
#include "hf/hf.h"

#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The open directory behind a mapped model, and where each of the model's tensors is in it. */
typedef struct fx__hf_source {
    fx__hf_model *h;
    size_t *idx; /* [model tensors]: index in h->t */
} fx__hf_source;

static void fx__hf_source_close(void *p)
{
    fx__hf_source *s = p;
    if (!s)
        return;
    fx__hf_close(s->h);
    fx__free(s->idx);
    fx__free(s);
}

/* Tensor i of the model as float32 in flexc's row order; its file pages are dropped once
   read, so converting a whole model holds the model plus one tensor, not the file too. */
static int fx__hf_source_read(void *p, size_t i, float *dst)
{
    fx__hf_source *s = p;
    int rc = fx__hf_tensor_read(s->h, s->idx[i], dst);
    if (rc != FX_OK)
        fx__error_context(rc, "%s", s->h->t[s->idx[i]].hf_name);
    fx__hf_tensor_release(s->h, s->idx[i]);
    return rc;
}

/* Where decoding reads tensor v: in place when it is a matrix whose bytes are aligned for
   its dtype, else widened to float32 at own (vectors: norms and biases). Rows stay in the
   file's order (rotate-half for q and k). */
static int fx__hf_place(fx__model_weight *w, float **own, const fx_tensor_view *v, bool matrix)
{
    size_t esz = fx_dtype_size(v->dtype);
    if (matrix && (uintptr_t)v->data % esz == 0) {
        *w = (fx__model_weight){v->data, v->dtype};
        return FX_OK;
    }
    size_t n = (size_t)fx_tensor_numel(v);
    int rc = fx_tensor_to_f32(*own, n, v);
    *w = (fx__model_weight){*own, FX_DT_F32};
    *own += (n + 15) / 16 * 16;
    return rc;
}

int fx__hf_load_mapped(fx_model **out, const char *dir)
{
    if (!out || !dir)
        return fx__error(FX_EINVAL, "out and dir must not be NULL");
    fx__hf_source *src = fx__calloc(1, sizeof *src);
    fx__model_mapped *mp = fx__calloc(1, sizeof *mp);
    if (!src || !mp) {
        fx__free(src), fx__free(mp);
        return FX_ENOMEM;
    }
    int rc = fx__hf_open(&src->h, dir);
    if (rc != FX_OK) {
        fx__free(src), fx__free(mp);
        return rc;
    }
    mp->file = src;
    mp->read = fx__hf_source_read;
    mp->close = fx__hf_source_close;
    mp->rope_half = true;
    const fx__hf_model *h = src->h;
    fx_model *m = NULL;
    if ((rc = fx__model_new_mapped(&m, &h->c.m, mp)) != FX_OK)
        return rc;
    const size_t n = m->lay.n;
    if (n != h->n) {
        rc = fx__error(FX_EFORMAT, "%s: the model has %zu tensors, the directory %zu", dir, n, h->n);
        goto fail;
    }
    src->idx = fx__alloc(n * sizeof *src->idx);
    mp->t = fx__calloc(n, sizeof *mp->t);
    if (!src->idx || !mp->t) {
        rc = FX_ENOMEM;
        goto fail;
    }
    size_t own = 0;
    for (size_t i = 0; i < n; i++) {
        const fx__model_tensor *t = &m->lay.t[i];
        int64_t k = fx__hf_find(h->t, h->n, t->name);
        if (k < 0) {
            rc = fx__error(FX_EFORMAT, "%s: the directory has no tensor for %s", dir, t->name);
            goto fail;
        }
        const fx_tensor_view *v = h->views[k];
        if ((int64_t)t->numel != fx_tensor_numel(v)) {
            rc = fx__error(FX_EFORMAT, "%s: tensor %s has %lld values, the model's %s %zu", dir, h->t[k].hf_name,
                           (long long)fx_tensor_numel(v), t->name, t->numel);
            goto fail;
        }
        src->idx[i] = (size_t)k;
        if (t->ndim == 1 || (uintptr_t)v->data % fx_dtype_size(v->dtype))
            own += (t->numel + 15) / 16 * 16;
    }
    if (own && !(mp->own = fx__alloc(own * sizeof(float)))) {
        rc = FX_ENOMEM;
        goto fail;
    }
    float *at = mp->own;
    for (size_t i = 0; i < n; i++) {
        size_t k = src->idx[i];
        if ((rc = fx__hf_place(&mp->t[i], &at, h->views[k], m->lay.t[i].ndim == 2)) != FX_OK) {
            fx__error_context(rc, "%s: %s", dir, h->t[k].hf_name);
            goto fail;
        }
    }
    *out = m;
    return FX_OK;
fail:
    fx_model_free(m);
    return rc;
}

int fx__hf_load(fx_model **out, const char *dir)
{
    fx_model *m = NULL;
    int rc = fx__hf_load_mapped(&m, dir);
    if (rc == FX_OK && (rc = fx__model_own_params(m)) != FX_OK)
        fx__error_context(rc, "%s", dir);
    if (rc != FX_OK) {
        fx_model_free(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

int fx__hf_config_from_model(fx__hf_config *c, const fx_model_config *mc)
{
    memset(c, 0, sizeof *c);
    c->arch = FX__HF_LLAMA; /* flexc's own GPT is a Llama block (tied, no biases, no window) */
    for (int a = FX__HF_LLAMA; a <= FX__HF_QWEN2; a++)
        if (strcmp(mc->arch, fx__hf_arch_name((fx__hf_arch)a)) == 0)
            c->arch = (fx__hf_arch)a;
    if (mc->qkv_bias && c->arch != FX__HF_QWEN2)
        return fx__error(FX_EUNSUPPORTED, "a %s model with q/k/v biases has no Hugging Face architecture here "
                         "(Qwen2ForCausalLM carries them)", mc->arch);
    if (mc->sliding_window && c->arch == FX__HF_LLAMA)
        return fx__error(FX_EUNSUPPORTED, "a %s model with a sliding window has no Hugging Face architecture "
                         "here (MistralForCausalLM carries one)", mc->arch);
    c->m = *mc;
    snprintf(c->m.arch, sizeof c->m.arch, "%s", fx__hf_arch_name(c->arch));
    if (!c->m.head_dim)
        c->m.head_dim = mc->dim / mc->heads;
    c->bos = -1;
    c->dtype = FX_DT_F32;
    return FX_OK;
}
