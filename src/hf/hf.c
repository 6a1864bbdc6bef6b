/* fx__hf_load: a Hugging Face directory into an fx_model (what fx_model_load calls for a
   directory holding config.json), and back: the HF configuration of a model that came from one. */
#include "hf/hf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fx__hf_model_config(fx_model_config *mc, const fx__hf_config *c)
{
    memset(mc, 0, sizeof *mc);
    snprintf(mc->arch, sizeof mc->arch, "%s", fx__hf_arch_name(c->arch));
    mc->vocab = c->vocab;
    mc->ctx = c->max_pos;
    mc->layers = c->layers;
    mc->dim = c->dim;
    mc->heads = c->heads;
    mc->kv_heads = c->kv_heads;
    mc->head_dim = c->head_dim;
    mc->ffn = c->ffn;
    mc->rope_theta = (float)c->rope_theta;
    if (c->rope_type == FX__HF_ROPE_LLAMA3) {
        mc->rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
        mc->rope_scaling.factor = (float)c->rope_factor;
        mc->rope_scaling.low_freq_factor = (float)c->rope_low_freq_factor;
        mc->rope_scaling.high_freq_factor = (float)c->rope_high_freq_factor;
        mc->rope_scaling.original_max_position_embeddings = c->rope_original_max_pos;
    }
    mc->norm_eps = (float)c->norm_eps;
    mc->qkv_bias = c->qkv_bias;
    mc->tied_embeddings = c->tied;
    mc->sliding_window = c->window;
    for (int i = 0; i < c->n_eos; i++)
        mc->eos[i] = (int32_t)c->eos[i];
    mc->n_eos = c->n_eos;
    return fx_model_config_validate(mc);
}

int fx__hf_load(fx_model **out, const char *dir)
{
    if (!out || !dir)
        return fx__error(FX_EINVAL, "out and dir must not be NULL");
    fx__hf_model *h = NULL;
    int rc = fx__hf_open(&h, dir);
    if (rc != FX_OK)
        return rc;
    fx_model_config mc;
    fx_model *m = NULL;
    if ((rc = fx__hf_model_config(&mc, &h->c)) != FX_OK)
        fx__error_context(rc, "%s: config.json", dir);
    if (rc == FX_OK)
        rc = fx_model_create(&m, &mc, 0);
    for (size_t i = 0; rc == FX_OK && i < h->n; i++) {
        fx_model_tensor t;
        if ((rc = fx_model_tensor_find(m, h->t[i].name, &t)) != FX_OK)
            break;
        if ((int64_t)t.numel != fx_tensor_numel(h->views[i])) {
            rc = fx__error(FX_EFORMAT, "%s: tensor %s has %lld values, the model's %s %zu", dir, h->t[i].hf_name,
                           (long long)fx_tensor_numel(h->views[i]), h->t[i].name, t.numel);
            break;
        }
        if ((rc = fx__hf_tensor_read(h, i, t.data)) != FX_OK)
            fx__error_context(rc, "%s: %s", dir, h->t[i].hf_name);
        fx__hf_tensor_release(h, i);
    }
    if (rc == FX_OK && m && fx_model_tensor_count(m) != h->n)
        rc = fx__error(FX_EFORMAT, "%s: the model has %zu tensors, the directory %zu", dir, fx_model_tensor_count(m),
                       h->n);
    fx__hf_close(h);
    if (rc != FX_OK) {
        fx_model_free(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

/* The shortest decimal that reads back as the same float: 1e-05f is written 1e-05, not
   9.9999997e-06, so a generated config.json reads as a person would write it. */
static double short_double(float x)
{
    char buf[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x)
            return d;
    }
    return (double)x;
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
    c->vocab = mc->vocab;
    c->dim = mc->dim;
    c->layers = mc->layers;
    c->heads = mc->heads;
    c->kv_heads = mc->kv_heads;
    c->head_dim = mc->head_dim ? mc->head_dim : mc->dim / mc->heads;
    c->ffn = mc->ffn;
    c->max_pos = mc->ctx;
    c->norm_eps = short_double(mc->norm_eps);
    c->tied = mc->tied_embeddings;
    c->qkv_bias = mc->qkv_bias;
    c->window = mc->sliding_window;
    c->rope_theta = short_double(mc->rope_theta);
    if (mc->rope_scaling.type == FX_ROPE_SCALING_LLAMA3) {
        c->rope_type = FX__HF_ROPE_LLAMA3;
        c->rope_factor = short_double(mc->rope_scaling.factor);
        c->rope_low_freq_factor = short_double(mc->rope_scaling.low_freq_factor);
        c->rope_high_freq_factor = short_double(mc->rope_scaling.high_freq_factor);
        c->rope_original_max_pos = mc->rope_scaling.original_max_position_embeddings;
    }
    for (int i = 0; i < mc->n_eos && i < FX__HF_MAX_EOS; i++)
        c->eos[i] = mc->eos[i];
    c->n_eos = mc->n_eos < FX__HF_MAX_EOS ? mc->n_eos : FX__HF_MAX_EOS;
    c->bos = -1;
    c->dtype = FX_DT_F32;
    return FX_OK;
}
