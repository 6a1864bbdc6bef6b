/* The public model API (include/flexc/model.h) over the internal model: argument checks up
   front, then the internal passes. */
#include "model_internal.h"

#include "core/file.h"
#include "dist.h"
#include "hf/hf.h"
#include "lora.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* ---- memory: what a model, a training run or a KV cache will take, checked before it is taken ---- */

/* The bytes of config c's float32 parameters, by the layout a model of it carves. */
static int fx__param_bytes(const fx_model_config *c, uint64_t *bytes)
{
    fx__model *shell = NULL;
    int rc = fx__model_new_mapped(&shell, c, NULL); /* the layout alone, no buffers */
    if (rc)
        return rc;
    *bytes = (uint64_t)shell->lay.total * sizeof(float);
    fx__model_free(shell);
    return FX_OK;
}

int fx__model_mem_train(fx__model_mem *mem, const fx_model_config *c, const fx__model_mem_opts *o)
{
    if (o->B < 1 || o->T < 1 || o->T > c->ctx)
        return fx__error(FX_EINVAL, "a batch of %lld x %lld tokens does not fit the model's context %lld",
                         (long long)o->B, (long long)o->T, (long long)c->ctx);
    fx__model *s = NULL;
    int rc = fx__model_new_mapped(&s, c, NULL);
    if (rc)
        return rc;
    s->recompute = o->recompute;
    const fx_model_config *k = &s->c; /* checked: head_dim and ffn filled in */
    const uint64_t P = s->lay.total, N = (uint64_t)(o->B * o->T);
    *mem = (fx__model_mem){0};
    mem->params = P * sizeof(float) + (o->bf16 ? P * sizeof(uint16_t) : 0);
    mem->grads = P * sizeof(float) + (P + FX__NORM_CHUNK - 1) / FX__NORM_CHUNK * sizeof(double);
    if (o->sum_slices > 0) /* fx__dist_create's stack and sum, rows of P + 1 */
        mem->grads += (uint64_t)(fx__dist_sum_levels(o->sum_slices) + 1) * (P + 1) * sizeof(float);
    mem->adam = 2 * P * (o->adam_bf16 ? sizeof(uint16_t) : sizeof(float));
    if (!o->device) { /* on a GPU the activations and the step's scratch are the device's */
        /* fx__model_set_batch's buffers: the activations, then the batch's targets, tokens and
           document ids. */
        mem->acts = fx__model_acts_floats(s, o->B, o->T) * sizeof(float) +
                    N * (sizeof(int64_t) + sizeof(int32_t) + sizeof(int64_t));
        if (o->bf16)
            mem->acts += fx__model_bf16_ws_floats(s, o->B, o->T) * sizeof(float);
        /* The fused loss's chunk, the attention backward's per-row sums (D_i), the RoPE table. */
        fx_lce p = {.N = (int64_t)N, .D = k->dim, .V = k->vocab, .ignore_index = -100,
                    .reduction = FX_REDUCTION_MEAN, .chunk = fx__loss_chunk((int64_t)N, k->vocab)};
        size_t loss = 0;
        if (fx_linear_cross_entropy_plan(&p, NULL, NULL, &loss) != FX_OK)
            loss = 0;
        mem->scratch = loss + N * (uint64_t)k->heads * sizeof(float) + (uint64_t)(o->T * k->head_dim) * sizeof(float);
    }
    fx__model_free(s);
    mem->data = o->data;
    /* The rest of the process as it is now: code, libraries, a tokenizer, the held data and
       weights taken out (they have their own parts). */
    uint64_t own = o->data + (o->params_held ? P * sizeof(float) : 0), rss = fx__mem_resident();
    mem->process = rss > own ? rss - own : 0;
    mem->held = mem->process + own;
    mem->total = mem->params + mem->grads + mem->adam + mem->acts + mem->scratch + mem->data + mem->process;
    return FX_OK;
}

void fx__model_mem_parts(char *buf, size_t n, const fx__model_mem *mem)
{
    double s;
    fx__mem_unit(mem->total, &s);
    snprintf(buf, n,
             "params %.2f + grads %.2f + adam %.2f + activations %.2f + scratch %.2f + data %.2f + process %.2f",
             (double)mem->params / s, (double)mem->grads / s, (double)mem->adam / s, (double)mem->acts / s,
             (double)mem->scratch / s, (double)mem->data / s, (double)mem->process / s);
}

int fx__model_mem_check(const fx__model_mem *mem, fx__mem_avail *avail)
{
    char parts[256];
    fx__model_mem_parts(parts, sizeof parts, mem);
    return fx__mem_check(mem->total, mem->held, "training", parts, avail);
}

/* ---- configuration and lifetime --------------------------------------------------------------- */

int fx_model_preset(fx_model_config *c, const char *name)
{
    if (!c)
        return fx__error(FX_EINVAL, "fx_model_preset: config is NULL");
    return fx__model_preset(c, name);
}

int fx_model_config_validate(fx_model_config *c)
{
    return fx__model_config_check(c);
}

int fx_model_create(fx_model **out, const fx_model_config *c, uint64_t seed)
{
    if (!out || !c)
        return fx__error(FX_EINVAL, "fx_model_create: %s is NULL", !out ? "out" : "config");
    uint64_t bytes;
    int rc = fx__param_bytes(c, &bytes);
    if (!rc)
        rc = fx__mem_check(bytes, 0, "the model", "its float32 parameters", NULL);
    return rc ? rc : fx__model_create(out, c, seed);
}

/* A flexc model or checkpoint file: its config, its mask, its parameters. */
static int fx__load_flexc(fx_model **out, const char *file)
{
    fx_model_config cfg;
    fx__model_train_state ts;
    int rc = fx__model_read_config(file, &cfg, &ts, NULL);
    if (rc)
        return rc;
    uint64_t bytes;
    if ((rc = fx__param_bytes(&cfg, &bytes)) != FX_OK ||
        (rc = fx__mem_check(bytes, 0, "the model", "its float32 parameters", NULL)) != FX_OK)
        return fx__error_context(rc, "%s", file);
    fx__model *m = NULL;
    if ((rc = fx__model_new(&m, &cfg)) != FX_OK) /* fx__model_load fills every tensor */
        return rc;
    /* The mask the model was trained with (read_config checked that it parses). */
    fx__model_mask_parse(ts.attn, &m->mask, &m->window);
    if ((rc = fx__model_load(m, file, false)) != FX_OK) {
        fx__model_free(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

int fx_model_load(fx_model **out, const char *path)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "fx_model_load: %s is NULL", !out ? "out" : "path");
    struct stat st;
    if (stat(path, &st) != 0)
        return fx__error(FX_EIO, "'%s': no such file or directory", path);
    /* LoRA adapters (a LoRA run's, or PEFT's) load on top of their base, mapped. */
    fx__lora_source src;
    bool lora;
    int rc = fx__lora_source_find(path, &src, &lora);
    if (rc != FX_OK || lora)
        return rc != FX_OK ? rc : fx__lora_open(out, &src, false);
    if (!S_ISDIR(st.st_mode))
        return fx__load_flexc(out, path);
    size_t n = strlen(path) + 32;
    char *file = fx__alloc(n);
    if (!file)
        return FX_ENOMEM;
    snprintf(file, n, "%s/config.json", path);
    if (fx__is_regular(file)) {
        /* The weights are read into float32 (fx_model_load_inference maps them instead): checked
           first when the config reads (else the loader says what is wrong with it). */
        fx__hf_config hc;
        uint64_t bytes;
        if (fx__hf_config_read(&hc, path) == FX_OK && fx__param_bytes(&hc.m, &bytes) == FX_OK &&
            (rc = fx__mem_check(bytes, 0, "the model", "its float32 parameters", NULL)) != FX_OK) {
            fx__error_context(rc, "%s", path);
            goto done;
        }
        rc = fx__hf_load(out, path);
        goto done;
    }
    snprintf(file, n, "%s/model.safetensors", path);
    if (!fx__is_regular(file))
        snprintf(file, n, "%s/checkpoint.safetensors", path);
    if (!fx__is_regular(file)) {
        rc = fx__error(FX_EINVAL,
                       "'%s' holds neither config.json (a Hugging Face model) nor model.safetensors or "
                       "checkpoint.safetensors (a flexc training directory)",
                       path);
        goto done;
    }
    rc = fx__load_flexc(out, file);
done:
    fx__free(file);
    return rc;
}

int fx_model_load_inference(fx_model **out, const char *path)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "fx_model_load_inference: %s is NULL", !out ? "out" : "path");
    struct stat st;
    if (stat(path, &st) != 0)
        return fx__error(FX_EIO, "'%s': no such file or directory", path);
    size_t n = strlen(path) + 32;
    char *file = fx__alloc(n);
    if (!file)
        return FX_ENOMEM;
    snprintf(file, n, "%s/config.json", path);
    bool hf = S_ISDIR(st.st_mode) && fx__is_regular(file);
    fx__free(file);
    return hf ? fx__hf_load_mapped(out, path) : fx_model_load(out, path);
}

void fx_model_free(fx_model *m)
{
    fx__model_free(m);
}

const fx_model_config *fx_model_get_config(const fx_model *m)
{
    return m ? &m->c : NULL;
}

size_t fx_model_num_params(const fx_model *m)
{
    return m ? m->lay.total : 0;
}

int fx_model_save(const fx_model *m, const char *path, bool bf16)
{
    if (!m || !path)
        return fx__error(FX_EINVAL, "fx_model_save: %s is NULL", !m ? "model" : "path");
    int rc = fx__model_own_params((fx_model *)m);
    if (rc)
        return rc;
    if (!m->params || m->hooks.layer_params)
        return fx__error(FX_EINVAL, "fx_model_save: the model's parameters are sharded");
    return fx__model_save_model(m, path, bf16);
}

/* ---- tensors --------------------------------------------------------------------------------------- */

size_t fx_model_tensor_count(const fx_model *m)
{
    return m ? m->lay.n : 0;
}

static void fx__tensor_view(const fx_model *m, size_t i, fx_model_tensor *out)
{
    const fx__model_tensor *t = &m->lay.t[i];
    *out = (fx_model_tensor){.name = t->name, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                             .numel = t->numel, .data = m->params + t->offset,
                             .grad = m->grads ? m->grads + t->offset : NULL};
}

int fx_model_tensor_at(const fx_model *m, size_t i, fx_model_tensor *out)
{
    if (!m || !out)
        return fx__error(FX_EINVAL, "fx_model_tensor_at: %s is NULL", !m ? "model" : "out");
    if (i >= m->lay.n)
        return fx__error(FX_ERANGE, "tensor %zu is outside [0, %zu)", i, m->lay.n);
    int rc = fx__model_own_params((fx_model *)m);
    if (rc)
        return rc;
    fx__tensor_view(m, i, out);
    return FX_OK;
}

int fx_model_tensor_find(const fx_model *m, const char *name, fx_model_tensor *out)
{
    if (!m || !name || !out)
        return fx__error(FX_EINVAL, "fx_model_tensor_find: %s is NULL", !m ? "model" : !name ? "name" : "out");
    const fx__model_tensor *t = fx__model_find(m, name);
    if (!t)
        return fx__error(FX_EINVAL, "the model has no tensor '%s'", name);
    int rc = fx__model_own_params((fx_model *)m);
    if (rc)
        return rc;
    fx__tensor_view(m, (size_t)(t - m->lay.t), out);
    return FX_OK;
}

/* ---- forward and backward ------------------------------------------------------------------------ */

static int fx__check_ids(const char *what, const int32_t *ids, int64_t n, int64_t V, bool ignore)
{
    for (int64_t i = 0; i < n; i++)
        if ((ids[i] < 0 || ids[i] >= V) && !(ignore && ids[i] == -100))
            return fx__error(FX_ERANGE, "%s[%lld] = %d is outside [0, %lld)", what, (long long)i, ids[i],
                             (long long)V);
    return FX_OK;
}

/* What a forward pass is about to allocate (the gradients, the activations of a new shape, which
   replace the old ones), checked against what is available before it does. */
static int fx__forward_mem_check(const fx__model *m, int64_t B, int64_t T, bool grad)
{
    uint64_t need = grad && !m->grads ? (uint64_t)m->lay.total * sizeof(float) : 0, held = 0;
    const uint64_t ids = sizeof(int64_t) + sizeof(int32_t) + sizeof(int64_t); /* target, token, doc id */
    size_t acts = m->gpu ? 0 : fx__model_acts_floats(m, B, T);
    if (!m->gpu && !(m->acts && m->B == B && m->T == T && m->acts_floats == acts)) {
        need += acts * sizeof(float) + (uint64_t)(B * T) * ids;
        held = m->acts ? m->acts_floats * sizeof(float) + (uint64_t)(m->B * m->T) * ids : 0;
    }
    char what[96];
    snprintf(what, sizeof what, "a forward pass of %lld x %lld tokens", (long long)B, (long long)T);
    return need ? fx__mem_check(need + held, held, what, NULL, NULL) : FX_OK;
}

int fx_model_forward(fx_model *m, float *loss, float *logits, const int32_t *tokens, const int32_t *targets,
                     int64_t B, int64_t T, unsigned flags)
{
    if (!m || !tokens)
        return fx__error(FX_EINVAL, "fx_model_forward: %s is NULL", !m ? "model" : "tokens");
    if (flags & ~(unsigned)(FX_MODEL_GRAD | FX_MODEL_LOGITS_LAST))
        return fx__error(FX_EINVAL, "fx_model_forward: flags 0x%x has unknown bits", flags);
    bool grad = flags & FX_MODEL_GRAD;
    if ((grad || loss) && !targets)
        return fx__error(FX_EINVAL, "fx_model_forward: %s needs targets", grad ? "FX_MODEL_GRAD" : "a loss");
    if (B < 1 || B > (1 << 20))
        return fx__error(FX_EINVAL, "B = %lld is outside [1, 1048576]", (long long)B);
    if (T < 1 || T > m->c.ctx)
        return fx__error(FX_EINVAL, "T = %lld is outside [1, %lld] (the model's context)", (long long)T,
                         (long long)m->c.ctx);
    int rc;
    if (m->mapped && (rc = fx__model_own_params(m)) != FX_OK)
        return rc;
    if (m->hooks.layer_params || !m->params)
        return fx__error(FX_EINVAL, "fx_model_forward: the model's parameters are sharded");
    if ((rc = fx__check_ids("token", tokens, B * T, m->c.vocab, false)) != FX_OK ||
        (targets && (rc = fx__check_ids("target", targets, B * T, m->c.vocab, true)) != FX_OK))
        return rc;
    if ((rc = fx__forward_mem_check(m, B, T, grad)) != FX_OK)
        return rc;
    if (grad && (rc = fx__model_alloc_grads(m)) != FX_OK)
        return rc;
    if ((rc = fx__model_set_batch(m, B, T)) != FX_OK)
        return rc;
    float l = 0.0f;
    if ((rc = fx__model_forward(m, tokens, targets, &l, grad)) != FX_OK)
        return rc;
    if (logits)
        fx__model_logits(m, logits, flags & FX_MODEL_LOGITS_LAST);
    if (loss)
        *loss = l;
    return FX_OK;
}

int fx_model_backward(fx_model *m)
{
    if (!m)
        return fx__error(FX_EINVAL, "fx_model_backward: model is NULL");
    return fx__model_backward(m);
}

void fx_model_zero_grad(fx_model *m)
{
    if (m)
        fx__model_zero_grad(m);
}

/* ---- the KV cache ------------------------------------------------------------------------------------ */

int fx_model_cache_create(fx_model_cache **out, fx_model *m, int64_t max_len)
{
    if (!out || !m)
        return fx__error(FX_EINVAL, "fx_model_cache_create: %s is NULL", !out ? "out" : "model");
    if (max_len < 1 || max_len > m->c.ctx)
        return fx__error(FX_EINVAL, "max_len = %lld is outside [1, %lld] (the model's context)", (long long)max_len,
                         (long long)m->c.ctx);
    /* The cache, and the RoPE table grown to its length. */
    fx__model_cache_bytes b = fx__model_cache_size(m, max_len);
    uint64_t rope = max_len > m->rope_len ? (uint64_t)(max_len * m->c.head_dim) * sizeof(float) : 0;
    char what[96];
    snprintf(what, sizeof what, "a KV cache of %lld positions", (long long)max_len);
    int rc = fx__mem_check(2 * (uint64_t)b.kv + b.doc + b.scratch + rope, 0, what, NULL, NULL);
    return rc ? rc : fx__model_cache_create(out, m, max_len);
}

void fx_model_cache_free(fx_model_cache *c)
{
    fx__model_cache_free(c);
}

int64_t fx_model_cache_len(const fx_model_cache *c)
{
    return c ? c->len : 0;
}

int64_t fx_model_cache_capacity(const fx_model_cache *c)
{
    return c ? c->cap : 0;
}

void fx_model_cache_reset(fx_model_cache *c)
{
    if (c)
        c->len = 0;
}

static int fx__check_cache(const fx_model *m, const fx_model_cache *c, const void *logits, const char *fn)
{
    if (!m || !c || !logits)
        return fx__error(FX_EINVAL, "%s: %s is NULL", fn, !m ? "model" : !c ? "cache" : "logits");
    if (c->m != m)
        return fx__error(FX_EINVAL, "%s: the cache was made for another model", fn);
    return FX_OK;
}

int fx_model_prefill(fx_model *m, fx_model_cache *c, float *logits, const int32_t *tokens, int64_t n)
{
    int rc = fx__check_cache(m, c, logits, "fx_model_prefill");
    if (rc)
        return rc;
    if (!tokens || n < 1)
        return fx__error(FX_EINVAL, "fx_model_prefill: %s", !tokens ? "tokens is NULL" : "n must be >= 1");
    if (n > c->cap)
        return fx__error(FX_ERANGE, "prefill of %lld tokens: the cache holds %lld positions", (long long)n,
                         (long long)c->cap);
    if ((rc = fx__check_ids("token", tokens, n, m->c.vocab, false)) != FX_OK)
        return rc;
    c->len = 0;
    return fx__model_decode(m, c, tokens, n, logits);
}

int fx_model_decode_step(fx_model *m, fx_model_cache *c, float *logits, int32_t token)
{
    int rc = fx__check_cache(m, c, logits, "fx_model_decode_step");
    if (rc)
        return rc;
    if (c->len == 0)
        return fx__error(FX_EINVAL, "fx_model_decode_step: the cache is empty (fx_model_prefill first)");
    if (c->len >= c->cap)
        return fx__error(FX_ERANGE, "the cache is full (%lld positions)", (long long)c->cap);
    if ((rc = fx__check_ids("token", &token, 1, m->c.vocab, false)) != FX_OK)
        return rc;
    return fx__model_decode(m, c, &token, 1, logits);
}

/* ---- sampling ---------------------------------------------------------------------------------------- */

size_t fx_sample_scratch_bytes(int64_t V)
{
    return V > 0 ? (size_t)V * (sizeof(double) + sizeof(int32_t)) : 0;
}

/* a ranks before b: the larger logit, the lower id among equals. */
static inline bool fx__before(const float *l, int32_t a, int32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

/* Sift down in a heap whose root is the candidate ranked last. */
static void fx__sift(int32_t *h, int64_t n, int64_t i, const float *l)
{
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && fx__before(l, h[c], h[c + 1]))
            c++;
        if (!fx__before(l, h[i], h[c]))
            return;
        int32_t t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* The k best ids in rank order into idx [k]: a heap of the k best so far (O(V log k)), then
   sorted by popping. */
static void fx__top_k(int32_t *idx, const float *l, int64_t V, int64_t k)
{
    for (int64_t i = 0; i < k; i++)
        idx[i] = (int32_t)i;
    for (int64_t i = k / 2 - 1; i >= 0; i--)
        fx__sift(idx, k, i, l);
    for (int64_t v = k; v < V; v++)
        if (fx__before(l, (int32_t)v, idx[0])) {
            idx[0] = (int32_t)v;
            fx__sift(idx, k, 0, l);
        }
    /* Pop the last-ranked to the end, repeatedly: idx ends in rank order. */
    for (int64_t n = k - 1; n > 0; n--) {
        int32_t t = idx[0];
        idx[0] = idx[n];
        idx[n] = t;
        fx__sift(idx, n, 0, l);
    }
}

static int fx__check_sample(const fx_sample_opts *o)
{
    if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
        return fx__error(FX_EINVAL, "temperature = %g must be finite and >= 0", (double)o->temperature);
    if (o->top_k < 0)
        return fx__error(FX_EINVAL, "top_k = %lld must be >= 0 (0: all)", (long long)o->top_k);
    if (!(o->top_p > 0.0f && o->top_p <= 1.0f))
        return fx__error(FX_EINVAL, "top_p = %g is outside (0, 1]", (double)o->top_p);
    return FX_OK;
}

int fx_sample(int32_t *token, const float *logits, int64_t V, const fx_sample_opts *o, fx_rng *rng, void *scratch)
{
    if (!token || !logits || !o)
        return fx__error(FX_EINVAL, "fx_sample: %s is NULL", !token ? "token" : !logits ? "logits" : "options");
    if (V < 1 || V > INT32_MAX)
        return fx__error(FX_EINVAL, "fx_sample: V = %lld is outside [1, 2147483647]", (long long)V);
    int rc = fx__check_sample(o);
    if (rc)
        return rc;
    if (o->temperature > 0.0f && (!rng || !scratch))
        return fx__error(FX_EINVAL, "fx_sample: %s is NULL", !rng ? "rng" : "scratch");
    if (o->temperature == 0.0f) {
        int64_t best = 0;
        for (int64_t v = 1; v < V; v++)
            if (logits[v] > logits[best])
                best = v;
        *token = (int32_t)best;
        return FX_OK;
    }
    double *prob = scratch;
    int32_t *idx = (int32_t *)(prob + V);
    int64_t k = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    fx__top_k(idx, logits, V, k);
    double mx = logits[idx[0]], temp = o->temperature, sum = 0.0;
    for (int64_t i = 0; i < k; i++)
        sum += prob[i] = exp(((double)logits[idx[i]] - mx) / temp);
    if (o->top_p < 1.0f) {
        /* The smallest prefix whose probability reaches top_p (at least one token). */
        double acc = 0.0, want = (double)o->top_p * sum;
        int64_t keep = 0;
        while (keep < k && acc < want)
            acc += prob[keep++];
        k = keep, sum = acc;
    }
    double u = (double)fx_rng_uniform(rng) * sum, acc = 0.0;
    for (int64_t i = 0; i < k; i++) {
        acc += prob[i];
        if (u < acc) {
            *token = idx[i];
            return FX_OK;
        }
    }
    *token = idx[k - 1];
    return FX_OK;
}

/* ---- generation ----------------------------------------------------------------------------------------- */

fx_generate_opts fx_generate_defaults(void)
{
    return (fx_generate_opts){.max_tokens = 256, .sample = {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f},
                              .seed = 1, .stop_at_eos = true};
}

static bool fx__is_eos(const fx_model_config *c, int32_t t)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos[i] == t)
            return true;
    return false;
}

int fx_model_generate(fx_model *m, fx_model_cache *c, int32_t *out, int64_t *n_out, const int32_t *prompt,
                      int64_t n_prompt, const fx_generate_opts *o)
{
    if (!m || !c || !n_out || !prompt || !o)
        return fx__error(FX_EINVAL, "fx_model_generate: %s is NULL",
                         !m ? "model" : !c ? "cache" : !n_out ? "n_out" : !prompt ? "prompt" : "options");
    if (o->max_tokens < 0 || (o->max_tokens > 0 && !out))
        return fx__error(FX_EINVAL, "fx_model_generate: %s", o->max_tokens < 0 ? "max_tokens must be >= 0"
                                                                                : "out is NULL");
    if (c->m != m)
        return fx__error(FX_EINVAL, "fx_model_generate: the cache was made for another model");
    if (n_prompt < 1)
        return fx__error(FX_EINVAL, "fx_model_generate: the prompt needs at least one token");
    if (n_prompt > c->cap)
        return fx__error(FX_ERANGE, "a prompt of %lld tokens: the cache holds %lld positions", (long long)n_prompt,
                         (long long)c->cap);
    int rc;
    fx_sample_opts so = o->sample;
    if ((rc = fx__check_ids("prompt", prompt, n_prompt, m->c.vocab, false)) != FX_OK ||
        (rc = fx__check_sample(&so)) != FX_OK)
        return rc;
    int64_t V = m->c.vocab;
    float *logits = fx__alloc((size_t)V * sizeof(float));
    void *scratch = fx__alloc(fx_sample_scratch_bytes(V));
    if (!logits || !scratch) {
        fx__free(logits), fx__free(scratch);
        return FX_ENOMEM;
    }
    fx_rng rng;
    fx_rng_init(&rng, o->seed, 0);
    int64_t n = 0;
    if ((rc = fx_model_prefill(m, c, logits, prompt, n_prompt)) != FX_OK)
        goto done;
    while (n < o->max_tokens) {
        int32_t t;
        if ((rc = fx_sample(&t, logits, V, &so, &rng, scratch)) != FX_OK)
            goto done;
        out[n++] = t;
        if (o->on_token && o->on_token(t, o->user) != 0)
            break;
        if ((o->stop_at_eos && fx__is_eos(&m->c, t)) || n == o->max_tokens || c->len >= c->cap)
            break;
        if ((rc = fx_model_decode_step(m, c, logits, t)) != FX_OK)
            goto done;
    }
done:
    *n_out = n;
    fx__free(logits), fx__free(scratch);
    return rc;
}
