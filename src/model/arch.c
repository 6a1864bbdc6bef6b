/* The architecture table (arch.h): the Llama family's tensors, and walking them for a
   configuration. */
#include "arch.h"

#include "core/core.h"

#include <stdio.h>

/* clang-format off */
const fx__arch_tensor fx__arch_layer[FX__MODEL_PER_LAYER_BIAS] = {
    /*                 flexc       Hugging Face                        rows          cols          RoPE'd rows  decay  init  present */
    [FX__MODEL_LN1] = {"norm1",    "input_layernorm.weight",          FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES, FX__WHEN_ALWAYS},
    [FX__MODEL_WQ]  = {"attn.wq",  "self_attn.q_proj.weight",         FX__LEN_Q,    FX__LEN_DIM,  FX__LEN_Q,    true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__MODEL_WK]  = {"attn.wk",  "self_attn.k_proj.weight",         FX__LEN_KV,   FX__LEN_DIM,  FX__LEN_KV,   true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__MODEL_WV]  = {"attn.wv",  "self_attn.v_proj.weight",         FX__LEN_KV,   FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__MODEL_WO]  = {"attn.wo",  "self_attn.o_proj.weight",         FX__LEN_DIM,  FX__LEN_Q,    FX__LEN_NONE, true,  FX__INIT_RESIDUAL, FX__WHEN_ALWAYS},
    [FX__MODEL_LN2] = {"norm2",    "post_attention_layernorm.weight", FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES, FX__WHEN_ALWAYS},
    [FX__MODEL_W1]  = {"mlp.w1",   "mlp.gate_proj.weight",            FX__LEN_FFN,  FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__MODEL_W3]  = {"mlp.w3",   "mlp.up_proj.weight",              FX__LEN_FFN,  FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__MODEL_W2]  = {"mlp.w2",   "mlp.down_proj.weight",            FX__LEN_DIM,  FX__LEN_FFN,  FX__LEN_NONE, true,  FX__INIT_RESIDUAL, FX__WHEN_ALWAYS},
    [FX__MODEL_BQ]  = {"attn.bq",  "self_attn.q_proj.bias",           FX__LEN_Q,    FX__LEN_NONE, FX__LEN_Q,    false, FX__INIT_ZEROS, FX__WHEN_QKV_BIAS},
    [FX__MODEL_BK]  = {"attn.bk",  "self_attn.k_proj.bias",           FX__LEN_KV,   FX__LEN_NONE, FX__LEN_KV,   false, FX__INIT_ZEROS, FX__WHEN_QKV_BIAS},
    [FX__MODEL_BV]  = {"attn.bv",  "self_attn.v_proj.bias",           FX__LEN_KV,   FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ZEROS, FX__WHEN_QKV_BIAS},
};

const fx__arch_tensor fx__arch_model[FX__ARCH_MODEL] = {
    [FX__ARCH_WTE]     = {"wte",       "model.embed_tokens.weight",   FX__LEN_VOCAB, FX__LEN_DIM, FX__LEN_NONE, true,  FX__INIT_NORMAL, FX__WHEN_ALWAYS},
    [FX__ARCH_NORM]    = {"norm",      "model.norm.weight",           FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES, FX__WHEN_ALWAYS},
    [FX__ARCH_LM_HEAD] = {"lm_head",   "lm_head.weight",              FX__LEN_VOCAB, FX__LEN_DIM, FX__LEN_NONE, true,  FX__INIT_NORMAL, FX__WHEN_UNTIED},
};
/* clang-format on */

int64_t fx__arch_len_of(fx__arch_len len, const fx_model_config *c)
{
    switch (len) {
    case FX__LEN_NONE: return 0;
    case FX__LEN_VOCAB: return c->vocab;
    case FX__LEN_DIM: return c->dim;
    case FX__LEN_Q: return c->heads * c->head_dim;
    case FX__LEN_KV: return c->kv_heads * c->head_dim;
    case FX__LEN_FFN: return c->ffn;
    }
    return 0;
}

bool fx__arch_has(const fx__arch_tensor *t, const fx_model_config *c)
{
    switch (t->when) {
    case FX__WHEN_ALWAYS: return true;
    case FX__WHEN_QKV_BIAS: return c->qkv_bias;
    case FX__WHEN_UNTIED: return !c->tied_embeddings;
    }
    return false;
}

static int visit(const fx_model_config *c, const fx__arch_tensor *t, int64_t layer,
                 int (*fn)(void *, const fx__arch_entry *), void *ctx)
{
    if (!fx__arch_has(t, c))
        return FX_OK;
    fx__arch_entry e = {.t = t, .layer = layer};
    if (layer < 0) {
        snprintf(e.name, sizeof e.name, "%s", t->name);
        snprintf(e.hf, sizeof e.hf, "%s", t->hf);
    } else {
        snprintf(e.name, sizeof e.name, "layers.%lld.%s", (long long)layer, t->name);
        snprintf(e.hf, sizeof e.hf, "model.layers.%lld.%s", (long long)layer, t->hf);
    }
    e.ndim = t->cols == FX__LEN_NONE ? 1 : 2;
    e.shape[0] = fx__arch_len_of(t->rows, c);
    e.shape[1] = fx__arch_len_of(t->cols, c);
    e.rope_heads = t->rope == FX__LEN_Q ? c->heads : t->rope == FX__LEN_KV ? c->kv_heads : 0;
    return fn(ctx, &e);
}

int fx__arch_each(const fx_model_config *c, int (*fn)(void *ctx, const fx__arch_entry *e), void *ctx)
{
    int rc = visit(c, &fx__arch_model[FX__ARCH_WTE], -1, fn, ctx);
    for (int64_t l = 0; l < c->layers && rc == FX_OK; l++)
        for (int k = 0; k < FX__MODEL_PER_LAYER_BIAS && rc == FX_OK; k++)
            rc = visit(c, &fx__arch_layer[k], l, fn, ctx);
    for (int k = FX__ARCH_NORM; k < FX__ARCH_MODEL && rc == FX_OK; k++)
        rc = visit(c, &fx__arch_model[k], -1, fn, ctx);
    return rc;
}

static int count_one(void *ctx, const fx__arch_entry *e)
{
    (void)e;
    ++*(size_t *)ctx;
    return FX_OK;
}

size_t fx__arch_count(const fx_model_config *c)
{
    size_t n = 0;
    fx__arch_each(c, count_one, &n);
    return n;
}
