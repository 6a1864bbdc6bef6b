/* The architecture table (arch.h): the Llama family's tensors, and walking them for a
   configuration. */
#include "arch.h"

#include "core/core.h"

#include <stddef.h>
#include <stdio.h>

/* Which configurations have a row: every one, those with the bool field f, those without. */
#define ALWAYS {false, false, 0}
#define WHEN(f) {true, false, offsetof(fx_model_config, f)}
#define UNLESS(f) {true, true, offsetof(fx_model_config, f)}
#define NONE (-1)

/* clang-format off */
const fx__arch_tensor fx__arch_layer[] = {
    /*                 flexc       Hugging Face                        rows          cols          RoPE'd rows  decay  init               present           bias of */
    [FX__MODEL_LN1] = {"norm1",    "input_layernorm.weight",          FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES,     ALWAYS,           NONE},
    [FX__MODEL_WQ]  = {"attn.wq",  "self_attn.q_proj.weight",         FX__LEN_Q,    FX__LEN_DIM,  FX__LEN_Q,    true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__MODEL_WK]  = {"attn.wk",  "self_attn.k_proj.weight",         FX__LEN_KV,   FX__LEN_DIM,  FX__LEN_KV,   true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__MODEL_WV]  = {"attn.wv",  "self_attn.v_proj.weight",         FX__LEN_KV,   FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__MODEL_WO]  = {"attn.wo",  "self_attn.o_proj.weight",         FX__LEN_DIM,  FX__LEN_Q,    FX__LEN_NONE, true,  FX__INIT_RESIDUAL, ALWAYS,           NONE},
    [FX__MODEL_LN2] = {"norm2",    "post_attention_layernorm.weight", FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES,     ALWAYS,           NONE},
    [FX__MODEL_W1]  = {"mlp.w1",   "mlp.gate_proj.weight",            FX__LEN_FFN,  FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__MODEL_W3]  = {"mlp.w3",   "mlp.up_proj.weight",              FX__LEN_FFN,  FX__LEN_DIM,  FX__LEN_NONE, true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__MODEL_W2]  = {"mlp.w2",   "mlp.down_proj.weight",            FX__LEN_DIM,  FX__LEN_FFN,  FX__LEN_NONE, true,  FX__INIT_RESIDUAL, ALWAYS,           NONE},
    [FX__MODEL_BQ]  = {"attn.bq",  "self_attn.q_proj.bias",           FX__LEN_Q,    FX__LEN_NONE, FX__LEN_Q,    false, FX__INIT_ZEROS,    WHEN(qkv_bias),   FX__MODEL_WQ},
    [FX__MODEL_BK]  = {"attn.bk",  "self_attn.k_proj.bias",           FX__LEN_KV,   FX__LEN_NONE, FX__LEN_KV,   false, FX__INIT_ZEROS,    WHEN(qkv_bias),   FX__MODEL_WK},
    [FX__MODEL_BV]  = {"attn.bv",  "self_attn.v_proj.bias",           FX__LEN_KV,   FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ZEROS,    WHEN(qkv_bias),   FX__MODEL_WV},
};
const size_t fx__arch_nlayer = sizeof fx__arch_layer / sizeof fx__arch_layer[0];
_Static_assert(sizeof fx__arch_layer / sizeof fx__arch_layer[0] <= FX__ARCH_LAYER_MAX,
               "more layer rows than FX__ARCH_LAYER_MAX");

const fx__arch_tensor fx__arch_model[FX__ARCH_MODEL] = {
    [FX__ARCH_WTE]     = {"wte",       "model.embed_tokens.weight",   FX__LEN_VOCAB, FX__LEN_DIM, FX__LEN_NONE, true,  FX__INIT_NORMAL,   ALWAYS,           NONE},
    [FX__ARCH_NORM]    = {"norm",      "model.norm.weight",           FX__LEN_DIM,  FX__LEN_NONE, FX__LEN_NONE, false, FX__INIT_ONES,     ALWAYS,           NONE},
    [FX__ARCH_LM_HEAD] = {"lm_head",   "lm_head.weight",              FX__LEN_VOCAB, FX__LEN_DIM, FX__LEN_NONE, true,  FX__INIT_NORMAL,   UNLESS(tied_embeddings), NONE},
};
/* clang-format on */
#undef ALWAYS
#undef WHEN
#undef UNLESS
#undef NONE

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
    if (!t->when.on)
        return true;
    const bool *f = (const bool *)((const char *)c + t->when.field);
    return *f != t->when.unless;
}

size_t fx__arch_layer_count(const fx_model_config *c)
{
    size_t n = 0;
    for (size_t k = 0; k < fx__arch_nlayer; k++)
        n += fx__arch_has(&fx__arch_layer[k], c);
    return n;
}

int fx__arch_bias_row(int which)
{
    if (which < 0)
        return -1;
    for (size_t k = 0; k < fx__arch_nlayer; k++)
        if (fx__arch_layer[k].bias_of == which)
            return (int)k;
    return -1;
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
        for (size_t k = 0; k < fx__arch_nlayer && rc == FX_OK; k++)
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
