/* config.json and generation_config.json of a Hugging Face Llama-family model: parsed with
   jansson, every field the model depends on checked, anything it cannot run refused by name. */
#include "hf/hf.h"

#include "core/file.h"
#include "model/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const struct {
    const char *arch, *model_type;
} archs[] = {
    [FX__HF_LLAMA] = {"LlamaForCausalLM", "llama"},
    [FX__HF_MISTRAL] = {"MistralForCausalLM", "mistral"},
    [FX__HF_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
};
enum { NARCH = sizeof archs / sizeof archs[0] };

const char *fx__hf_arch_name(fx__hf_arch a)
{
    return (unsigned)a < NARCH ? archs[a].arch : "?";
}

/* ---- field readers ------------------------------------------------------------------------- */

/* An absent key and an explicit null both mean "not given". */
static const json_t *field(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* An integer in [lo, hi]; def when absent (required: absent is an error). */
static int get_int(int64_t *out, const json_t *o, const char *where, const char *key, bool required,
                   int64_t def, int64_t lo, int64_t hi)
{
    const json_t *v = field(o, key);
    if (!v) {
        if (required)
            return fx__error(FX_EFORMAT, "%s: \"%s\" is missing", where, key);
        *out = def;
        return FX_OK;
    }
    if (!json_is_integer(v))
        return fx__error(FX_EFORMAT, "%s: \"%s\" must be an integer", where, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return fx__error(FX_EFORMAT, "%s: \"%s\" = %lld is outside [%lld, %lld]", where, key, (long long)x,
                         (long long)lo, (long long)hi);
    *out = (int64_t)x;
    return FX_OK;
}

/* A finite number > 0 (integer or real). */
static int get_pos(double *out, const json_t *o, const char *where, const char *key, bool required, double def)
{
    const json_t *v = field(o, key);
    if (!v) {
        if (required)
            return fx__error(FX_EFORMAT, "%s: \"%s\" is missing", where, key);
        *out = def;
        return FX_OK;
    }
    if (!json_is_number(v))
        return fx__error(FX_EFORMAT, "%s: \"%s\" must be a number", where, key);
    double x = json_number_value(v);
    if (!(x > 0.0) || !isfinite(x))
        return fx__error(FX_EFORMAT, "%s: \"%s\" = %g must be a finite number > 0", where, key, x);
    *out = x;
    return FX_OK;
}

static int get_bool(bool *out, const json_t *o, const char *where, const char *key, bool def)
{
    const json_t *v = field(o, key);
    if (!v) {
        *out = def;
        return FX_OK;
    }
    if (!json_is_boolean(v))
        return fx__error(FX_EFORMAT, "%s: \"%s\" must be true or false", where, key);
    *out = json_is_true(v);
    return FX_OK;
}

/* eos_token_id: an int or a list of ints (each a valid token id). found: the key was there. */
static int get_ids(int32_t *ids, int *n, bool *found, const json_t *o, const char *where, const char *key,
                   int64_t vocab)
{
    const json_t *v = field(o, key);
    *found = v != NULL;
    if (!v)
        return FX_OK;
    size_t count = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_integer(v))
        return fx__error(FX_EFORMAT, "%s: \"%s\" must be an integer or a list of integers", where, key);
    if (count > FX_MODEL_MAX_EOS)
        return fx__error(FX_EFORMAT, "%s: \"%s\" lists %zu ids, more than %d", where, key, count,
                         (int)FX_MODEL_MAX_EOS);
    for (size_t i = 0; i < count; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return fx__error(FX_EFORMAT, "%s: \"%s\"[%zu] must be an integer", where, key, i);
        json_int_t x = json_integer_value(e);
        if (x < 0 || x >= vocab)
            return fx__error(FX_EFORMAT, "%s: \"%s\" = %lld is outside the vocabulary [0, %lld)", where, key,
                             (long long)x, (long long)vocab);
        ids[i] = (int32_t)x; /* < vocab <= 2^31 */
    }
    *n = (int)count;
    return FX_OK;
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

/* rope_theta + rope_scaling (older spelling; rope_scaling may say "type" or "rope_type"), or
   rope_parameters (transformers 5: rope_theta inside). */
static int parse_rope(fx__hf_config *c, const json_t *root)
{
    const json_t *params = field(root, "rope_parameters");
    const json_t *scaling = field(root, "rope_scaling");
    const char *where = "config.json";
    const json_t *rp = params ? params : scaling;
    const char *rp_name = params ? "rope_parameters" : "rope_scaling";
    if (params && scaling && !json_equal((json_t *)params, (json_t *)scaling))
        return fx__error(FX_EFORMAT, "%s: both \"rope_parameters\" and \"rope_scaling\" are given, and differ",
                         where);
    if (rp && !json_is_object(rp))
        return fx__error(FX_EFORMAT, "%s: \"%s\" must be an object", where, rp_name);

    /* rope_theta: inside rope_parameters when it is there, else at the top level. */
    int rc;
    double theta;
    if (params && field(params, "rope_theta"))
        rc = get_pos(&theta, params, "config.json: rope_parameters", "rope_theta", true, 0);
    else
        rc = get_pos(&theta, root, where, "rope_theta", false, 10000.0);
    if (rc != FX_OK)
        return rc;
    c->m.rope_theta = (float)theta;

    memset(&c->m.rope_scaling, 0, sizeof c->m.rope_scaling);
    double partial = 1.0;
    if ((rc = get_pos(&partial, root, where, "partial_rotary_factor", false, 1.0)) != FX_OK)
        return rc;
    if (rp && (rc = get_pos(&partial, rp, where, "partial_rotary_factor", false, partial)) != FX_OK)
        return rc;
    if (partial != 1.0)
        return fx__error(FX_EUNSUPPORTED, "%s: partial_rotary_factor = %g is not supported (RoPE on every "
                         "dimension of a head only)", where, partial);
    if (!rp)
        return FX_OK;

    const json_t *t = field(rp, "rope_type");
    const json_t *t2 = field(rp, "type");
    if (t && t2 && !json_equal((json_t *)t, (json_t *)t2))
        return fx__error(FX_EFORMAT, "%s: %s has both \"rope_type\" and \"type\", and they differ", where, rp_name);
    if (!t)
        t = t2;
    if (t && !json_is_string(t))
        return fx__error(FX_EFORMAT, "%s: %s's type must be a string", where, rp_name);
    const char *type = t ? json_string_value(t) : "default";
    if (strcmp(type, "default") == 0)
        return FX_OK;
    if (strcmp(type, "llama3") != 0)
        return fx__error(FX_EUNSUPPORTED, "%s: %s type \"%s\" is not supported (supported: default, llama3)",
                         where, rp_name, type);
    char w[64];
    snprintf(w, sizeof w, "config.json: %s", rp_name);
    double factor, low, high;
    int64_t original;
    if ((rc = get_pos(&factor, rp, w, "factor", true, 0)) != FX_OK ||
        (rc = get_pos(&low, rp, w, "low_freq_factor", true, 0)) != FX_OK ||
        (rc = get_pos(&high, rp, w, "high_freq_factor", true, 0)) != FX_OK ||
        (rc = get_int(&original, rp, w, "original_max_position_embeddings", true, 0, 1, INT64_C(1) << 40)) != FX_OK)
        return rc;
    if (!(high > low))
        return fx__error(FX_EFORMAT, "%s: high_freq_factor = %g must be > low_freq_factor = %g", w, high, low);
    c->m.rope_scaling.type = FX_ROPE_SCALING_LLAMA3;
    c->m.rope_scaling.factor = (float)factor;
    c->m.rope_scaling.low_freq_factor = (float)low;
    c->m.rope_scaling.high_freq_factor = (float)high;
    c->m.rope_scaling.original_max_position_embeddings = original;
    return FX_OK;
}

/* ---- the whole configuration --------------------------------------------------------------- */

static int parse_arch(fx__hf_arch *arch, const json_t *root)
{
    const json_t *a = field(root, "architectures");
    const json_t *mt = field(root, "model_type");
    if (mt && !json_is_string(mt))
        return fx__error(FX_EFORMAT, "config.json: \"model_type\" must be a string");
    const char *name = NULL;
    if (a) {
        if (!json_is_array(a) || json_array_size(a) != 1 || !json_is_string(json_array_get(a, 0)))
            return fx__error(FX_EFORMAT, "config.json: \"architectures\" must be a list of one name");
        name = json_string_value(json_array_get(a, 0));
        for (int i = 0; i < NARCH; i++)
            if (strcmp(name, archs[i].arch) == 0) {
                if (mt && strcmp(json_string_value(mt), archs[i].model_type) != 0)
                    return fx__error(FX_EFORMAT, "config.json: model_type \"%s\" disagrees with architecture %s",
                                     json_string_value(mt), name);
                *arch = (fx__hf_arch)i;
                return FX_OK;
            }
        return fx__error(FX_EUNSUPPORTED, "config.json: architecture %s is not supported (supported: "
                         "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)", name);
    }
    if (!mt)
        return fx__error(FX_EFORMAT, "config.json: neither \"architectures\" nor \"model_type\" is given");
    for (int i = 0; i < NARCH; i++)
        if (strcmp(json_string_value(mt), archs[i].model_type) == 0) {
            *arch = (fx__hf_arch)i;
            return FX_OK;
        }
    return fx__error(FX_EUNSUPPORTED, "config.json: model_type \"%s\" is not supported (supported: llama, "
                     "mistral, qwen2)", json_string_value(mt));
}

/* Qwen2: the window applies to layers i >= max_window_layers (or as layer_types says) when
   use_sliding_window; flexc runs one window for every layer, so a mix is refused. */
static int parse_window(fx__hf_config *c, const json_t *root)
{
    const char *where = "config.json";
    int64_t w = 0;
    int rc = get_int(&w, root, where, "sliding_window", false, 0, 1, INT64_C(1) << 40);
    if (rc != FX_OK)
        return rc;
    c->m.sliding_window = 0;
    if (c->arch == FX__HF_LLAMA)
        return FX_OK; /* LlamaForCausalLM has no sliding window (the key is not read) */
    if (c->arch == FX__HF_MISTRAL) {
        c->m.sliding_window = w;
        return FX_OK;
    }
    bool use = false;
    if ((rc = get_bool(&use, root, where, "use_sliding_window", false)) != FX_OK)
        return rc;
    const json_t *lt = field(root, "layer_types");
    int64_t sliding = 0;
    if (lt) {
        if (!json_is_array(lt) || (int64_t)json_array_size(lt) != c->m.layers)
            return fx__error(FX_EFORMAT, "%s: \"layer_types\" must list one type per layer (%lld)", where,
                             (long long)c->m.layers);
        for (size_t i = 0; i < json_array_size(lt); i++) {
            const json_t *e = json_array_get(lt, i);
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(s, "sliding_attention") == 0)
                sliding++;
            else if (strcmp(s, "full_attention") != 0)
                return fx__error(FX_EUNSUPPORTED, "%s: layer_types[%zu] = \"%s\" is not supported "
                                 "(full_attention, sliding_attention)", where, i, s);
        }
    } else if (use) {
        int64_t mwl = 0;
        if ((rc = get_int(&mwl, root, where, "max_window_layers", false, c->m.layers, 0, INT64_C(1) << 40)) != FX_OK)
            return rc;
        sliding = mwl >= c->m.layers ? 0 : c->m.layers - mwl;
    }
    if (sliding > 0 && sliding < c->m.layers)
        return fx__error(FX_EUNSUPPORTED, "%s: a sliding window on %lld of %lld layers is not supported (one "
                         "window for every layer or none)", where, (long long)sliding, (long long)c->m.layers);
    if (sliding == c->m.layers) {
        if (w == 0)
            return fx__error(FX_EFORMAT, "%s: sliding attention without \"sliding_window\"", where);
        c->m.sliding_window = w;
    }
    return FX_OK;
}

/* The model's sizes: vocabulary, width, MLP width, layers, heads (query and key/value, the
   second dividing the first) and head_dim (even; hidden_size / heads where not given), the
   context and the norm's epsilon. */
static int parse_sizes(fx__hf_config *c, const json_t *root)
{
    const char *where = "config.json";
    const int64_t big = INT64_C(1) << 31; /* sizes: anything larger is a corrupt file */
    int rc;
    double eps;
    if ((rc = get_int(&c->m.vocab, root, where, "vocab_size", true, 0, 1, big)) != FX_OK ||
        (rc = get_int(&c->m.dim, root, where, "hidden_size", true, 0, 1, big)) != FX_OK ||
        (rc = get_int(&c->m.ffn, root, where, "intermediate_size", true, 0, 1, big)) != FX_OK ||
        (rc = get_int(&c->m.layers, root, where, "num_hidden_layers", true, 0, 1, 1 << 16)) != FX_OK ||
        (rc = get_int(&c->m.heads, root, where, "num_attention_heads", true, 0, 1, 1 << 16)) != FX_OK ||
        (rc = get_int(&c->m.kv_heads, root, where, "num_key_value_heads", false, c->m.heads, 1, 1 << 16)) != FX_OK ||
        (rc = get_int(&c->m.head_dim, root, where, "head_dim", false, 0, 1, 1 << 16)) != FX_OK ||
        (rc = get_int(&c->m.ctx, root, where, "max_position_embeddings", true, 0, 1, big)) != FX_OK ||
        (rc = get_pos(&eps, root, where, "rms_norm_eps", false, 1e-6)) != FX_OK)
        return rc;
    c->m.norm_eps = (float)eps;
    if (c->m.head_dim == 0) {
        if (c->m.dim % c->m.heads != 0)
            return fx__error(FX_EFORMAT, "config.json: hidden_size = %lld is not a multiple of num_attention_heads = "
                             "%lld and head_dim is not given", (long long)c->m.dim, (long long)c->m.heads);
        c->m.head_dim = c->m.dim / c->m.heads;
    }
    if (c->m.heads % c->m.kv_heads != 0)
        return fx__error(FX_EFORMAT, "config.json: num_attention_heads = %lld is not a multiple of "
                         "num_key_value_heads = %lld", (long long)c->m.heads, (long long)c->m.kv_heads);
    if (c->m.head_dim % 2 != 0)
        return fx__error(FX_EFORMAT, "config.json: head_dim = %lld must be even (RoPE rotates pairs)",
                         (long long)c->m.head_dim);
    return FX_OK;
}

/* The configuration's fields that config.json holds as one key of their kind, or that the
   model class implies (model/config.c's table: hf, hf_classes). */
static int parse_fields(fx__hf_config *c, const json_t *root)
{
    const char *where = "config.json";
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        void *at = (char *)&c->m + f->offset;
        int rc = FX_OK;
        if (f->hf && f->kind == FX__FIELD_BOOL)
            rc = get_bool(at, root, where, f->hf, false);
        else if (f->hf && f->kind == FX__FIELD_I64)
            rc = get_int(at, root, where, f->hf, false, 0, f->lo, f->hi);
        else if (f->hf_classes && f->kind == FX__FIELD_BOOL)
            *(bool *)at = fx__config_hf_class(f, archs[c->arch].arch);
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

/* Keys that add something flexc does not run when true, unless a field of the configuration
   reads them (parse_fields). */
static const char *const refused_when_true[] = {"mlp_bias"};

/* What flexc cannot run: attention_bias on another architecture than Qwen2 (it adds an o_proj
   bias to q/k/v's), and refused_when_true's keys. */
static int parse_refusals(fx__hf_config *c, const json_t *root)
{
    const char *where = "config.json";
    int rc;
    bool attn_bias = false;
    if ((rc = get_bool(&attn_bias, root, where, "attention_bias", false)) != FX_OK)
        return rc;
    if (attn_bias && c->arch != FX__HF_QWEN2)
        return fx__error(FX_EUNSUPPORTED, "config.json: attention_bias = true is not supported (it adds an o_proj "
                         "bias; only Qwen2's q/k/v biases are)");
    for (size_t k = 0; k < sizeof refused_when_true / sizeof refused_when_true[0]; k++) {
        bool read = false, on = false;
        for (size_t i = 0; i < fx__config_nfields; i++)
            read |= fx__config_fields[i].hf && strcmp(fx__config_fields[i].hf, refused_when_true[k]) == 0;
        if (!read && (rc = get_bool(&on, root, where, refused_when_true[k], false)) != FX_OK)
            return rc;
        if (on)
            return fx__error(FX_EUNSUPPORTED, "config.json: %s = true is not supported", refused_when_true[k]);
    }
    return FX_OK;
}

/* The special ids: eos (one or several) and bos (at most one), each from
   generation_config.json (gen, when given) first and config.json where it has none. */
static int parse_special_ids(fx__hf_config *c, const json_t *root, const char *gen, size_t gen_len)
{
    const char *where = "config.json";
    json_t *groot = NULL;
    json_error_t jerr;
    int rc = FX_OK;
    bool found = false;
    if (gen) {
        groot = json_loadb(gen, gen_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!groot || !json_is_object(groot)) {
            rc = groot ? fx__error(FX_EFORMAT, "generation_config.json is not a JSON object")
                       : fx__error(FX_EFORMAT, "generation_config.json is not valid JSON: %s (line %d, column %d)",
                                   jerr.text, jerr.line, jerr.column);
            goto done;
        }
        rc = get_ids(c->m.eos, &c->m.n_eos, &found, groot, "generation_config.json", "eos_token_id", c->m.vocab);
        if (rc != FX_OK)
            goto done;
    }
    if (!found && (rc = get_ids(c->m.eos, &c->m.n_eos, &found, root, where, "eos_token_id", c->m.vocab)) != FX_OK)
        goto done;
    int32_t bos[FX_MODEL_MAX_EOS];
    int nbos = 0;
    found = false;
    if (groot && (rc = get_ids(bos, &nbos, &found, groot, "generation_config.json", "bos_token_id", c->m.vocab)) != FX_OK)
        goto done;
    if (!found && (rc = get_ids(bos, &nbos, &found, root, where, "bos_token_id", c->m.vocab)) != FX_OK)
        goto done;
    if (nbos > 1) {
        rc = fx__error(FX_EFORMAT, "bos_token_id must be one id");
        goto done;
    }
    c->bos = nbos ? bos[0] : -1;
done:
    json_decref(groot);
    return rc;
}

int fx__hf_config_parse(fx__hf_config *out, const char *text, size_t len, const char *gen, size_t gen_len)
{
    if (!out || !text)
        return fx__error(FX_EINVAL, "config text is NULL");
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return fx__error(FX_EFORMAT, "config.json is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                         jerr.column);
    fx__hf_config c;
    memset(&c, 0, sizeof c);
    c.bos = -1;
    int rc = FX_OK;
    if (!json_is_object(root)) {
        rc = fx__error(FX_EFORMAT, "config.json is not a JSON object");
        goto done;
    }
    if ((rc = parse_arch(&c.arch, root)) != FX_OK)
        goto done;

    const json_t *q = field(root, "quantization_config");
    if (q) {
        const json_t *m = json_is_object(q) ? field(q, "quant_method") : NULL;
        rc = fx__error(FX_EUNSUPPORTED, "config.json: quantized weights (quantization_config%s%s) are not supported",
                       m && json_is_string(m) ? ", quant_method " : "", m && json_is_string(m) ? json_string_value(m) : "");
        goto done;
    }
    const json_t *act = field(root, "hidden_act");
    if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        rc = fx__error(FX_EUNSUPPORTED, "config.json: hidden_act \"%s\" is not supported (silu only)",
                       json_is_string(act) ? json_string_value(act) : "?");
        goto done;
    }
    if ((rc = parse_sizes(&c, root)) != FX_OK || (rc = parse_fields(&c, root)) != FX_OK ||
        (rc = parse_refusals(&c, root)) != FX_OK)
        goto done;
    if ((rc = parse_rope(&c, root)) != FX_OK || (rc = parse_window(&c, root)) != FX_OK)
        goto done;

    /* The dtype the weights were saved in (informative: the files say what they hold). */
    const json_t *dt = field(root, "dtype") ? field(root, "dtype") : field(root, "torch_dtype");
    const char *dts = dt && json_is_string(dt) ? json_string_value(dt) : "float32";
    c.dtype = strcmp(dts, "bfloat16") == 0 ? FX_DT_BF16 : strcmp(dts, "float16") == 0 ? FX_DT_F16 : FX_DT_F32;

    if ((rc = parse_special_ids(&c, root, gen, gen_len)) != FX_OK)
        goto done;
    snprintf(c.m.arch, sizeof c.m.arch, "%s", archs[c.arch].arch);
    if (fx__model_config_check(&c.m) != FX_OK) {
        rc = fx__error_context(FX_EFORMAT, "config.json");
        goto done;
    }
    *out = c;
done:
    json_decref(root);
    return rc;
}

/* ---- files --------------------------------------------------------------------------------- */

int fx__hf_read_text(char **out, size_t *len, const char *path)
{
    int rc = fx__read_regular(out, len, path, (size_t)64 << 20);
    return rc ? fx__error_context(rc, "%s", path) : FX_OK;
}

int fx__hf_config_read(fx__hf_config *c, const char *dir)
{
    char path[4096];
    char *text = NULL, *gen = NULL;
    size_t len = 0, glen = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = fx__hf_read_text(&text, &len, path);
    if (rc != FX_OK)
        return rc;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) == 0 && (rc = fx__hf_read_text(&gen, &glen, path)) != FX_OK) {
        fx__free(text);
        return rc;
    }
    rc = fx__hf_config_parse(c, text, len, gen, glen);
    if (rc != FX_OK)
        fx__error_context(rc, "%s", dir);
    fx__free(text);
    fx__free(gen);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------- */

static int dump(char **out, json_t *root)
{
    if (!root)
        return fx__error(FX_ENOMEM, "out of memory building JSON");
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!s)
        return fx__error(FX_ENOMEM, "out of memory building JSON");
    size_t n = strlen(s);
    char *buf = fx__alloc(n + 2);
    if (buf) {
        memcpy(buf, s, n);
        buf[n] = '\n';
        buf[n + 1] = '\0';
    }
    free(s);
    *out = buf;
    return buf ? FX_OK : FX_ENOMEM;
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

static json_t *ids_json(const int32_t *ids, int n)
{
    if (n == 1)
        return json_integer(ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

int fx__hf_config_json(char **out, const fx__hf_config *c, const char *dtype)
{
    /* The fields the class implies must be what it implies. */
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        if (!f->hf_classes || f->kind != FX__FIELD_BOOL)
            continue;
        const bool on = *(const bool *)((const char *)&c->m + f->offset);
        if (on != fx__config_hf_class(f, archs[c->arch].arch))
            return fx__error(FX_EUNSUPPORTED, "a %s model always has %s = %d (the classes with %s: %s)",
                             archs[c->arch].arch, f->key, !on, f->key, f->hf_classes);
    }
    json_t *o = json_object();
    if (!o)
        return fx__error(FX_ENOMEM, "out of memory building JSON");
    json_t *arch = json_array();
    json_array_append_new(arch, json_string(archs[c->arch].arch));
    json_object_set_new(o, "architectures", arch);
    json_object_set_new(o, "model_type", json_string(archs[c->arch].model_type));
    json_object_set_new(o, "vocab_size", json_integer(c->m.vocab));
    json_object_set_new(o, "hidden_size", json_integer(c->m.dim));
    json_object_set_new(o, "intermediate_size", json_integer(c->m.ffn));
    json_object_set_new(o, "num_hidden_layers", json_integer(c->m.layers));
    json_object_set_new(o, "num_attention_heads", json_integer(c->m.heads));
    json_object_set_new(o, "num_key_value_heads", json_integer(c->m.kv_heads));
    json_object_set_new(o, "head_dim", json_integer(c->m.head_dim));
    json_object_set_new(o, "max_position_embeddings", json_integer(c->m.ctx));
    json_object_set_new(o, "rms_norm_eps", json_real(short_double(c->m.norm_eps)));
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "dtype", json_string(dtype ? dtype : "float32"));
    if (c->arch == FX__HF_LLAMA) {
        json_object_set_new(o, "attention_bias", json_false());
        json_object_set_new(o, "mlp_bias", json_false());
    }
    if (c->arch == FX__HF_MISTRAL)
        json_object_set_new(o, "sliding_window", c->m.sliding_window ? json_integer(c->m.sliding_window) : json_null());
    if (c->arch == FX__HF_QWEN2) {
        json_object_set_new(o, "use_sliding_window", json_boolean(c->m.sliding_window > 0));
        json_object_set_new(o, "sliding_window", c->m.sliding_window ? json_integer(c->m.sliding_window) : json_null());
        json_object_set_new(o, "max_window_layers", json_integer(c->m.sliding_window ? 0 : c->m.layers));
    }
    json_t *rp = json_object();
    const fx_model_config *m = &c->m;
    json_object_set_new(rp, "rope_theta", json_real(short_double(m->rope_theta)));
    if (m->rope_scaling.type == FX_ROPE_SCALING_LLAMA3) {
        json_object_set_new(rp, "rope_type", json_string("llama3"));
        json_object_set_new(rp, "factor", json_real(short_double(m->rope_scaling.factor)));
        json_object_set_new(rp, "low_freq_factor", json_real(short_double(m->rope_scaling.low_freq_factor)));
        json_object_set_new(rp, "high_freq_factor", json_real(short_double(m->rope_scaling.high_freq_factor)));
        json_object_set_new(rp, "original_max_position_embeddings",
                            json_integer(m->rope_scaling.original_max_position_embeddings));
    } else {
        json_object_set_new(rp, "rope_type", json_string("default"));
    }
    json_object_set_new(o, "rope_parameters", rp);
    if (c->m.n_eos)
        json_object_set_new(o, "eos_token_id", ids_json(c->m.eos, c->m.n_eos));
    if (c->bos >= 0)
        json_object_set_new(o, "bos_token_id", json_integer(c->bos));
    /* The fields that are one key of their kind (model/config.c's table). */
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        const void *at = (const char *)&c->m + f->offset;
        if (f->hf && f->kind == FX__FIELD_BOOL)
            json_object_set_new(o, f->hf, json_boolean(*(const bool *)at));
        else if (f->hf && f->kind == FX__FIELD_I64)
            json_object_set_new(o, f->hf, json_integer(*(const int64_t *)at));
    }
    return dump(out, o);
}

int fx__hf_generation_json(char **out, const fx__hf_config *c)
{
    json_t *o = json_object();
    if (!o)
        return fx__error(FX_ENOMEM, "out of memory building JSON");
    if (c->m.n_eos)
        json_object_set_new(o, "eos_token_id", ids_json(c->m.eos, c->m.n_eos));
    if (c->bos >= 0)
        json_object_set_new(o, "bos_token_id", json_integer(c->bos));
    return dump(out, o);
}
