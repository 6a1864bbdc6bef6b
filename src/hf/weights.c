/* The weights of a Hugging Face Llama-family model: the HF <-> flexc name table, RoPE row
   permutations, and opening a model directory with every tensor checked before any is read. */
#include "hf/hf.h"

#include "core/finite.h"
#include "model/arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the name table ------------------------------------------------------------------------ */

typedef struct layout_fill {
    fx__hf_tensor *t;
    size_t n;
} layout_fill;

static int add(void *ctx, const fx__arch_entry *e)
{
    layout_fill *f = ctx;
    fx__hf_tensor *t = &f->t[f->n++];
    snprintf(t->name, sizeof t->name, "%s", e->name);
    snprintf(t->hf_name, sizeof t->hf_name, "%s", e->hf);
    t->ndim = e->ndim;
    t->shape[0] = e->shape[0];
    t->shape[1] = e->shape[1];
    t->rope_heads = e->rope_heads;
    return FX_OK;
}

int fx__hf_layout(fx__hf_tensor **out, size_t *n_out, const fx_model_config *c)
{
    layout_fill f = {fx__calloc(fx__arch_count(c), sizeof *f.t), 0};
    if (!f.t)
        return FX_ENOMEM;
    fx__arch_each(c, add, &f);
    *out = f.t;
    *n_out = f.n;
    return FX_OK;
}

int64_t fx__hf_find(const fx__hf_tensor *t, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return (int64_t)i;
    return -1;
}

/* ---- RoPE row order ------------------------------------------------------------------------ */

/* Within a head, flexc row 2i+s holds HF row i + s*hd/2 (s = 0, 1): HF pairs the halves,
   flexc pairs neighbours, both with frequency i. */
void fx__hf_rows_to_flexc(float *dst, const float *src, int64_t heads, int64_t hd, int64_t cols)
{
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(dst + (h * hd + 2 * i + s) * cols, src + (h * hd + i + s * half) * cols,
                       (size_t)cols * sizeof(float));
}

void fx__hf_rows_to_hf(float *dst, const float *src, int64_t heads, int64_t hd, int64_t cols)
{
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < half; i++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(dst + (h * hd + i + s * half) * cols, src + (h * hd + 2 * i + s) * cols,
                       (size_t)cols * sizeof(float));
}

/* ---- opening a directory ------------------------------------------------------------------- */

static size_t file_count(const fx__hf_model *m)
{
    return m->file ? fx_safetensors_count(m->file) : fx_safetensors_index_count(m->index);
}

static const fx_tensor_view *file_tensor(const fx__hf_model *m, size_t i)
{
    return m->file ? fx_safetensors_tensor(m->file, i) : fx_safetensors_index_tensor(m->index, i, NULL);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

static int cmp_hf_name(const void *a, const void *b)
{
    const fx__hf_tensor *x = *(const fx__hf_tensor *const *)a, *y = *(const fx__hf_tensor *const *)b;
    return strcmp(x->hf_name, y->hf_name);
}

/* Every tensor of the files is expected, every expected tensor is there with its shape, and
   they share one dtype among F32, BF16, F16. */
static int check_tensors(fx__hf_model *m)
{
    const fx__hf_tensor **sorted = fx__alloc(m->n * sizeof *sorted);
    if (!sorted)
        return FX_ENOMEM;
    for (size_t i = 0; i < m->n; i++)
        sorted[i] = &m->t[i];
    qsort(sorted, m->n, sizeof *sorted, cmp_hf_name);
    int rc = FX_OK;
    const fx_tensor_view *tied_head = NULL;
    const size_t nf = file_count(m);
    for (size_t i = 0; i < nf && rc == FX_OK; i++) {
        const fx_tensor_view *v = file_tensor(m, i);
        fx__hf_tensor key, *kp = &key;
        snprintf(key.hf_name, sizeof key.hf_name, "%s", v->name);
        const fx__hf_tensor **hit = strlen(v->name) < sizeof key.hf_name
                                        ? bsearch(&kp, sorted, m->n, sizeof *sorted, cmp_hf_name)
                                        : NULL;
        if (hit) {
            m->views[*hit - m->t] = v;
        } else if (ends_with(v->name, ".rotary_emb.inv_freq")) {
            continue; /* derived from rope_theta; recomputed */
        } else if (m->c.m.tied_embeddings && strcmp(v->name, "lm_head.weight") == 0) {
            tied_head = v;
        } else {
            rc = fx__error(FX_EFORMAT, "unexpected tensor %s (not part of a %s with this config.json)", v->name,
                           fx__hf_arch_name(m->c.arch));
        }
    }
    fx__free(sorted);
    for (size_t i = 0; i < m->n && rc == FX_OK; i++) {
        const fx_tensor_view *v = m->views[i];
        const fx__hf_tensor *t = &m->t[i];
        if (!v) {
            rc = fx__error(FX_EFORMAT, "tensor %s is missing", t->hf_name);
            break;
        }
        if (v->dtype != FX_DT_F32 && v->dtype != FX_DT_BF16 && v->dtype != FX_DT_F16) {
            rc = fx__error(FX_EUNSUPPORTED, "tensor %s is %s (F32, BF16 and F16 are supported)", t->hf_name,
                           fx_dtype_name(v->dtype));
            break;
        }
        if (i == 0)
            m->dtype = v->dtype;
        else if (v->dtype != m->dtype) {
            rc = fx__error(FX_EUNSUPPORTED, "tensor %s is %s but %s is %s (one dtype for all tensors)", t->hf_name,
                           fx_dtype_name(v->dtype), m->t[0].hf_name, fx_dtype_name(m->dtype));
            break;
        }
        if (v->ndim != t->ndim || v->shape[0] != t->shape[0] || (t->ndim == 2 && v->shape[1] != t->shape[1])) {
            char got[96], want[64];
            shape_str(got, sizeof got, v->ndim, v->shape);
            shape_str(want, sizeof want, t->ndim, t->shape);
            rc = fx__error(FX_EFORMAT, "tensor %s has shape %s, config.json implies %s", t->hf_name, got, want);
            break;
        }
        /* A NaN or an infinity would load and then decode garbage or train to NaN far from
           the cause: one pass over each tensor (its pages are read at the first forward
           anyway). */
        const int64_t numel = t->shape[0] * (t->ndim == 2 ? t->shape[1] : 1);
        const int64_t bad = fx__first_nonfinite(v->data, v->dtype, (size_t)numel);
        if (bad >= 0) {
            rc = fx__error(FX_EFORMAT, "tensor %s holds %s at index %lld (a model with non-finite weights cannot "
                           "be used)", t->hf_name, fx__nonfinite_name(v->data, v->dtype, (size_t)bad),
                           (long long)bad);
            break;
        }
        m->params += numel;
    }
    if (rc == FX_OK && tied_head) {
        /* A tied checkpoint may store the head anyway; it must then be the embedding. */
        const fx_tensor_view *e = m->views[0];
        if (tied_head->dtype != e->dtype || tied_head->nbytes != e->nbytes ||
            memcmp(tied_head->data, e->data, e->nbytes) != 0)
            rc = fx__error(FX_EFORMAT, "tensor lm_head.weight differs from model.embed_tokens.weight, but "
                           "tie_word_embeddings is true");
    }
    return rc;
}

int fx__hf_open(fx__hf_model **out, const char *dir)
{
    if (!out || !dir)
        return fx__error(FX_EINVAL, "out and dir must not be NULL");
    fx__hf_model *m = fx__calloc(1, sizeof *m);
    if (!m)
        return FX_ENOMEM;
    char path[4096];
    size_t len = 0, glen = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = fx__hf_read_text(&m->config_text, &len, path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (rc == FX_OK && access(path, F_OK) == 0)
        rc = fx__hf_read_text(&m->gen_text, &glen, path);
    if (rc == FX_OK && (rc = fx__hf_config_parse(&m->c, m->config_text, len, m->gen_text, glen)) != FX_OK)
        fx__error_context(rc, "%s", dir);
    if (rc == FX_OK)
        rc = fx__hf_layout(&m->t, &m->n, &m->c.m);
    if (rc == FX_OK && !(m->views = fx__calloc(m->n, sizeof *m->views)))
        rc = FX_ENOMEM;
    if (rc == FX_OK) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0)
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (access(path, F_OK) != 0)
            rc = fx__error(FX_EIO, "%s: neither model.safetensors nor model.safetensors.index.json is there", dir);
        else if (ends_with(path, ".json"))
            rc = fx_safetensors_index_open(&m->index, path);
        else
            rc = fx_safetensors_open(&m->file, path);
        if (rc != FX_OK && access(path, F_OK) == 0)
            fx__error_context(rc, "%s", path);
    }
    if (rc == FX_OK && (rc = check_tensors(m)) != FX_OK)
        fx__error_context(rc, "%s", dir);
    if (rc != FX_OK) {
        fx__hf_close(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

void fx__hf_close(fx__hf_model *m)
{
    if (!m)
        return;
    fx_safetensors_free(m->file);
    fx_safetensors_index_free(m->index);
    fx__free(m->views);
    fx__free(m->t);
    fx__free(m->config_text);
    fx__free(m->gen_text);
    fx__free(m);
}

int fx__hf_tensor_read(const fx__hf_model *m, size_t i, float *dst)
{
    if (!m || !dst || i >= m->n)
        return fx__error(FX_EINVAL, "fx__hf_tensor_read: bad model, tensor %zu or NULL dst", i);
    const fx__hf_tensor *t = &m->t[i];
    const fx_tensor_view *v = m->views[i];
    const size_t numel = (size_t)fx_tensor_numel(v);
    if (!t->rope_heads)
        return fx_tensor_to_f32(dst, numel, v);
    float *tmp = fx__alloc(numel * sizeof(float));
    if (!tmp)
        return FX_ENOMEM;
    int rc = fx_tensor_to_f32(tmp, numel, v);
    if (rc == FX_OK)
        fx__hf_rows_to_flexc(dst, tmp, t->rope_heads, m->c.m.head_dim, t->ndim == 2 ? t->shape[1] : 1);
    fx__free(tmp);
    return rc;
}

void fx__hf_tensor_release(const fx__hf_model *m, size_t i)
{
    if (!m || i >= m->n)
        return;
    /* The whole pages inside the tensor's bytes: dropping them from a read-only file mapping
       only frees memory (a later read faults them back in from the file). */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)m->views[i]->data, b = a + m->views[i]->nbytes;
    a = (a + page - 1) / page * page;
    b = b / page * page;
    if (b > a)
        (void)madvise((void *)a, b - a, MADV_DONTNEED);
}
