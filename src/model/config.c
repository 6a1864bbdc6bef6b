/* The model's configuration: its fields declared once (config.h), the presets, and the
   check every configuration passes before a model is built from it. */
#include "config.h"

#include "core/core.h"
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* key, kind, always, shape, range; the Hugging Face config.json key; the classes that imply it. */
#define F(key, kind, always, shape, lo, hi, hf, hf_classes)                                                    \
    {#key, FX__FIELD_##kind, offsetof(fx_model_config, key), always, shape, lo, hi, hf, hf_classes}
/* The order is the files' metadata order: the fields every file has, then those added with
   the model API. */
/* clang-format off */
const fx__config_field fx__config_fields[] = {
    F(vocab,           I64,  true,  true,  2, INT32_MAX, NULL, NULL),
    F(ctx,             I64,  true,  false, 1, 1 << 24,   NULL, NULL),
    F(layers,          I64,  true,  true,  1, 1024,      NULL, NULL),
    F(dim,             I64,  true,  true,  2, 65536,     NULL, NULL),
    F(heads,           I64,  true,  true,  1, 4096,      NULL, NULL),
    F(kv_heads,        I64,  true,  true,  1, 4096,      NULL, NULL),
    F(ffn,             I64,  true,  true,  0, 1 << 20,   NULL, NULL),
    F(rope_theta,      F32,  true,  false, 0, 0,         NULL, NULL),
    F(norm_eps,        F32,  true,  false, 0, 0,         NULL, NULL),
    F(arch,            STR,  false, false, 0, 0,         NULL, NULL),
    F(head_dim,        I64,  false, true,  0, 512,       NULL, NULL),
    F(qkv_bias,        BOOL, false, true,  0, 0,         NULL, "Qwen2ForCausalLM"),
    F(tied_embeddings, BOOL, false, true,  0, 0,         "tie_word_embeddings", NULL),
    F(sliding_window,  I64,  false, false, 0, INT64_MAX, NULL, NULL),
    F(rope_scaling,    ROPE, false, false, 0, 0,         NULL, NULL),
    F(eos,             EOS,  false, false, 0, 0,         NULL, NULL),
};
/* clang-format on */
#undef F
const size_t fx__config_nfields = sizeof fx__config_fields / sizeof fx__config_fields[0];

#define AT(type, c, f) ((type *)((char *)(c) + (f)->offset))
#define CAT(type, c, f) ((const type *)((const char *)(c) + (f)->offset))

void fx__config_field_format(const fx__config_field *f, const fx_model_config *c, char *buf, size_t n)
{
    switch (f->kind) {
    case FX__FIELD_I64: snprintf(buf, n, "%lld", (long long)*CAT(int64_t, c, f)); break;
    case FX__FIELD_F32: snprintf(buf, n, "%.9g", (double)*CAT(float, c, f)); break;
    case FX__FIELD_BOOL: snprintf(buf, n, "%d", *CAT(bool, c, f) ? 1 : 0); break;
    case FX__FIELD_STR: snprintf(buf, n, "%s", CAT(char, c, f)); break;
    case FX__FIELD_ROPE:
        if (c->rope_scaling.type == FX_ROPE_SCALING_LLAMA3)
            snprintf(buf, n, "llama3:%.9g:%.9g:%.9g:%lld", (double)c->rope_scaling.factor,
                     (double)c->rope_scaling.low_freq_factor, (double)c->rope_scaling.high_freq_factor,
                     (long long)c->rope_scaling.original_max_position_embeddings);
        else
            snprintf(buf, n, "none");
        break;
    case FX__FIELD_EOS:
        buf[0] = '\0';
        for (int i = 0; i < c->n_eos; i++)
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%d", i ? "," : "", c->eos[i]);
        break;
    }
}

int fx__meta_parse_i64(const char *s, const char *where, const char *key, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return fx__error(FX_EFORMAT, "'%s': metadata '%s' = '%s' is not an integer", where, key, s);
    *out = x;
    return FX_OK;
}

int fx__meta_parse_f32(const char *s, const char *where, const char *key, float *out)
{
    char *end = NULL;
    errno = 0;
    float x = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(x))
        return fx__error(FX_EFORMAT, "'%s': metadata '%s' = '%s' is not a finite number", where, key, s);
    *out = x;
    return FX_OK;
}

int fx__config_field_parse(const fx__config_field *f, fx_model_config *c, const char *s, const char *where)
{
    char *end = NULL;
    switch (f->kind) {
    case FX__FIELD_I64: return fx__meta_parse_i64(s, where, f->key, AT(int64_t, c, f));
    case FX__FIELD_BOOL: {
        int64_t x;
        int rc = fx__meta_parse_i64(s, where, f->key, &x);
        *AT(bool, c, f) = rc == FX_OK ? x != 0 : *AT(bool, c, f);
        return rc;
    }
    case FX__FIELD_F32: return fx__meta_parse_f32(s, where, f->key, AT(float, c, f));
    case FX__FIELD_STR:
        if (strlen(s) >= sizeof c->arch)
            return fx__error(FX_EFORMAT, "'%s': metadata %s is longer than %zu bytes", where, f->key,
                             sizeof c->arch - 1);
        snprintf(AT(char, c, f), sizeof c->arch, "%s", s);
        return FX_OK;
    case FX__FIELD_ROPE: {
        memset(&c->rope_scaling, 0, sizeof c->rope_scaling);
        if (strcmp(s, "none") == 0)
            return FX_OK;
        float fa, lo, hi;
        long long old;
        char tail;
        if (sscanf(s, "llama3:%g:%g:%g:%lld%c", &fa, &lo, &hi, &old, &tail) != 4)
            return fx__error(FX_EFORMAT, "'%s': metadata %s = '%s' is not none or llama3:F:LO:HI:N", where, f->key, s);
        c->rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
        c->rope_scaling.factor = fa, c->rope_scaling.low_freq_factor = lo, c->rope_scaling.high_freq_factor = hi;
        c->rope_scaling.original_max_position_embeddings = old;
        return FX_OK;
    }
    case FX__FIELD_EOS:
        c->n_eos = 0;
        for (const char *p = s; *p;) {
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX || c->n_eos == FX_MODEL_MAX_EOS || (*end && *end != ','))
                return fx__error(FX_EFORMAT, "'%s': metadata %s = '%s' is not a list of at most %d ids", where, f->key,
                                 s, FX_MODEL_MAX_EOS);
            c->eos[c->n_eos++] = (int32_t)v;
            p = *end ? end + 1 : end;
        }
        return FX_OK;
    }
    return FX_OK;
}

void fx__config_field_default(const fx__config_field *f, fx_model_config *c)
{
    switch (f->kind) {
    case FX__FIELD_I64: *AT(int64_t, c, f) = 0; break;
    case FX__FIELD_F32: *AT(float, c, f) = 0.0f; break;
    case FX__FIELD_BOOL: *AT(bool, c, f) = f->offset == offsetof(fx_model_config, tied_embeddings); break;
    case FX__FIELD_STR: snprintf(AT(char, c, f), sizeof c->arch, "flexc-gpt"); break;
    case FX__FIELD_ROPE: memset(&c->rope_scaling, 0, sizeof c->rope_scaling); break;
    case FX__FIELD_EOS:
        c->eos[0] = FX__MODEL_EOT;
        c->n_eos = 1;
        break;
    }
}

static bool field_same(const fx__config_field *f, const fx_model_config *a, const fx_model_config *b)
{
    switch (f->kind) {
    case FX__FIELD_I64: return *CAT(int64_t, a, f) == *CAT(int64_t, b, f);
    case FX__FIELD_F32: return *CAT(float, a, f) == *CAT(float, b, f);
    case FX__FIELD_BOOL: return *CAT(bool, a, f) == *CAT(bool, b, f);
    case FX__FIELD_STR: return strcmp(CAT(char, a, f), CAT(char, b, f)) == 0;
    case FX__FIELD_ROPE: {
        char x[96], y[96]; /* as files store them: the type, then the llama3 numbers */
        fx__config_field_format(f, a, x, sizeof x);
        fx__config_field_format(f, b, y, sizeof y);
        return strcmp(x, y) == 0;
    }
    case FX__FIELD_EOS:
        return a->n_eos == b->n_eos && memcmp(a->eos, b->eos, (size_t)a->n_eos * sizeof a->eos[0]) == 0;
    }
    return false;
}

const fx__config_field *fx__config_diff(const fx_model_config *a, const fx_model_config *b)
{
    for (size_t i = 0; i < fx__config_nfields; i++)
        if (!field_same(&fx__config_fields[i], a, b))
            return &fx__config_fields[i];
    return NULL;
}

const fx__config_field *fx__config_diff_shape(const fx_model_config *a, const fx_model_config *b)
{
    for (size_t i = 0; i < fx__config_nfields; i++)
        if (fx__config_fields[i].shape && !field_same(&fx__config_fields[i], a, b))
            return &fx__config_fields[i];
    return NULL;
}

bool fx__config_hf_class(const fx__config_field *f, const char *cls)
{
    const size_t n = strlen(cls);
    for (const char *p = f->hf_classes; p && *p;) {
        const char *end = strchr(p, ',');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, cls, n) == 0)
            return true;
        p = end ? end + 1 : p + len;
    }
    return false;
}

/* ---- printing ------------------------------------------------------------------------------ */

/* Field f of c as a person reads it: a float that is a whole number as one ("10000"), another
   in the fewest digits that give the same float ("1e-05"). */
static void field_show(const fx__config_field *f, const fx_model_config *c, char *buf, size_t n)
{
    if (f->kind != FX__FIELD_F32) {
        fx__config_field_format(f, c, buf, n);
        return;
    }
    const float x = *CAT(float, c, f);
    if (fabsf(x) < 1e9f && x == truncf(x)) {
        snprintf(buf, n, "%.0f", (double)x);
        return;
    }
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, n, "%.*g", p, (double)x);
        if (strtof(buf, NULL) == x)
            return;
    }
}

size_t fx__config_format(const fx_model_config *c, char *buf, size_t n)
{
    size_t len = 0;
    if (n)
        buf[0] = '\0';
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        if (!f->always) { /* left out at the value a file without it is read with */
            fx_model_config d = *c;
            fx__config_field_default(f, &d);
            if (field_same(f, c, &d))
                continue;
        }
        char v[96];
        field_show(f, c, v, sizeof v);
        const int w = snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s%s=%s", len ? " " : "", f->key, v);
        len += w > 0 ? (size_t)w : 0;
    }
    return len;
}

/* ---- presets and the check ------------------------------------------------------------------ */

int fx__model_preset(fx_model_config *c, const char *name)
{
    fx_model_config base = {.arch = "flexc-gpt", .vocab = FX__MODEL_VOCAB, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
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

int fx__model_config_check(fx_model_config *c)
{
    if (!c)
        return fx__error(FX_EINVAL, "model config is NULL");
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        if (f->kind != FX__FIELD_I64)
            continue;
        int64_t x = *CAT(int64_t, c, f);
        if (x < f->lo || x > f->hi)
            return fx__error(FX_EINVAL, "%s = %lld is outside [%lld, %lld]", f->key, (long long)x, (long long)f->lo,
                             (long long)f->hi);
    }
    if (c->n_eos < 0 || c->n_eos > FX_MODEL_MAX_EOS)
        return fx__error(FX_EINVAL, "n_eos = %d is outside [0, %d]", c->n_eos, FX_MODEL_MAX_EOS);
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
