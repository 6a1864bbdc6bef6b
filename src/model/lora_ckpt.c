/* LoRA adapters in files: a LoRA run's checkpoint (kind "lora": the adapters, their AdamW
   moments, the training state and the base model's directory) and PEFT's adapter directories
   (adapter_config.json + adapter_model.safetensors), written and read. See docs/lora.md. */
#include "lora.h"

#include "ckpt.h"
#include "model_internal.h"
#include "core/file.h"
#include "core/finite.h"
#include "hf/hf.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The targets' short names (--lora-targets) and PEFT's module names, in the table's order. */
static const char *const short_name[FX__LORA_TARGETS] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const peft_name[FX__LORA_TARGETS] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                         "gate_proj", "up_proj", "down_proj"};

static int target_index(const char *s, size_t n)
{
    for (int t = 0; t < FX__LORA_TARGETS; t++)
        if ((strlen(short_name[t]) == n && !strncmp(s, short_name[t], n)) ||
            (strlen(peft_name[t]) == n && !strncmp(s, peft_name[t], n)))
            return t;
    return -1;
}

int fx__lora_targets_parse(const char *s, unsigned *out)
{
    *out = 0;
    if (!strcmp(s, "all")) {
        *out = FX__LORA_ALL;
        return FX_OK;
    }
    for (const char *p = s;;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        int t = target_index(p, n);
        if (t < 0)
            return fx__error(FX_EINVAL, "LoRA target '%.*s' is not one of q, k, v, o, gate, up, down (or all)",
                             (int)n, p);
        *out |= 1u << t;
        if (!end)
            return FX_OK;
        p = end + 1;
    }
}

void fx__lora_targets_format(unsigned targets, char *buf, size_t n)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int t = 0; t < FX__LORA_TARGETS; t++)
        if ((targets >> t) & 1)
            used += (size_t)snprintf(buf + used, used < n ? n - used : 0, "%s%s", used ? "," : "", short_name[t]);
}

/* ---- a LoRA run's checkpoint ---------------------------------------------------------------- */

int fx__lora_save_checkpoint(const fx__model *m, const fx__model_train_state *s, const char *base, const char *path)
{
    const fx__lora *a = m->lora;
    if (!a || !a->adam_m)
        return fx__error(FX_EINVAL, "checkpoint '%s': the model has no LoRA adapters in training", path);
    size_t n = a->n + 2;
    fx_tensor_view *v = fx__calloc(n, sizeof *v);
    if (!v)
        return FX_ENOMEM;
    for (size_t i = 0; i < a->n; i++) {
        const fx__lora_tensor *t = &a->t[i];
        v[i] = (fx_tensor_view){.name = t->name, .dtype = FX_DT_F32, .ndim = 2, .shape = {t->shape[0], t->shape[1]},
                                .data = a->params + t->offset, .nbytes = t->numel * sizeof(float)};
    }
    const int64_t P = (int64_t)a->total;
    v[n - 2] = (fx_tensor_view){.name = "optim.m", .dtype = FX_DT_F32, .ndim = 1, .shape = {P}, .data = a->adam_m,
                                .nbytes = a->total * sizeof(float)};
    v[n - 1] = (fx_tensor_view){.name = "optim.v", .dtype = FX_DT_F32, .ndim = 1, .shape = {P}, .data = a->adam_v,
                                .nbytes = a->total * sizeof(float)};
    fx__meta md = {0};
    fx__meta_config(&md, m, "lora");
    fx__meta_state(&md, s);
    char targets[64];
    fx__lora_targets_format(a->cfg.targets, targets, sizeof targets);
    fx__meta_add(&md, "lora_rank", "%lld", (long long)a->cfg.rank);
    fx__meta_add(&md, "lora_alpha", "%.9g", (double)a->cfg.alpha);
    fx__meta_add(&md, "lora_dropout", "%.9g", (double)a->cfg.dropout);
    fx__meta_add(&md, "lora_targets", "%s", targets);
    fx__meta_add(&md, "lora_dropout_state", "%llu:%llu", (unsigned long long)a->drop_seed,
                 (unsigned long long)a->drop_step);
    fx__meta_add_ref(&md, "base", base);
    int rc = fx_safetensors_save(path, v, n, md.kv);
    fx__free(v);
    return rc;
}

/* The adapters' settings and base of an open LoRA checkpoint. */
static int read_lora_meta(const fx_safetensors *f, const char *path, fx__lora_source *src)
{
    int64_t r;
    float alpha, dropout;
    int rc;
    if ((rc = fx__meta_i64(f, path, "lora_rank", &r)) || (rc = fx__meta_f32(f, path, "lora_alpha", &alpha)) ||
        (rc = fx__meta_f32(f, path, "lora_dropout", &dropout)))
        return rc;
    const char *targets = fx_safetensors_metadata(f, "lora_targets"), *base = fx_safetensors_metadata(f, "base");
    if (!targets || !base)
        return fx__error(FX_EFORMAT, "'%s': metadata has no '%s'", path, !targets ? "lora_targets" : "base");
    src->cfg = (fx__lora_config){.rank = r, .alpha = alpha, .dropout = dropout};
    if (fx__lora_targets_parse(targets, &src->cfg.targets) != FX_OK)
        return fx__error_context(FX_EFORMAT, "'%s': metadata lora_targets", path);
    if (r < 1 || !isfinite(alpha) || !(dropout >= 0.0f && dropout < 1.0f))
        return fx__error(FX_EFORMAT, "'%s': metadata lora_rank = %lld, lora_alpha = %g, lora_dropout = %g are not "
                         "LoRA settings (rank >= 1, finite alpha, dropout in [0, 1))",
                         path, (long long)r, (double)alpha, (double)dropout);
    if (strlen(base) >= sizeof src->base)
        return fx__error(FX_EFORMAT, "'%s': metadata base is %zu bytes long", path, strlen(base));
    snprintf(src->base, sizeof src->base, "%s", base);
    return FX_OK;
}

/* The adapter values of file f into a (fresh, of the file's settings): every table tensor
   there, no other, of its shape, finite; F32, BF16 or F16 (PEFT saves in the model's dtype).
   `extra` tensors the file may hold besides (a checkpoint's moments). */
static int read_adapters(fx__lora *a, const fx_safetensors *f, const char *path, size_t extra)
{
    if (fx_safetensors_count(f) != a->n + extra)
        return fx__error(FX_EFORMAT, "'%s' holds %zu tensors; LoRA rank %lld on %s needs %zu", path,
                         fx_safetensors_count(f), (long long)a->cfg.rank, "its targets", a->n + extra);
    for (size_t i = 0; i < a->n; i++) {
        const fx__lora_tensor *t = &a->t[i];
        const fx_tensor_view *v = fx_safetensors_find(f, t->name);
        if (!v)
            return fx__error(FX_EFORMAT, "'%s' has no tensor '%s'", path, t->name);
        if (v->dtype != FX_DT_F32 && v->dtype != FX_DT_BF16 && v->dtype != FX_DT_F16)
            return fx__error(FX_EFORMAT, "'%s': tensor '%s' has dtype %s, not F32, BF16 or F16", path, t->name,
                             fx_dtype_name(v->dtype));
        if (v->ndim != 2 || v->shape[0] != t->shape[0] || v->shape[1] != t->shape[1])
            return fx__error(FX_EFORMAT, "'%s': tensor '%s' is not [%lld, %lld] (the base model and rank %lld)", path,
                             t->name, (long long)t->shape[0], (long long)t->shape[1], (long long)a->cfg.rank);
        int64_t bad = fx__first_nonfinite(v->data, v->dtype, t->numel);
        if (bad >= 0)
            return fx__error(FX_EFORMAT, "'%s': tensor '%s' holds %s at index %lld", path, t->name,
                             fx__nonfinite_name(v->data, v->dtype, (size_t)bad), (long long)bad);
    }
    for (size_t i = 0; i < a->n; i++) {
        const fx__lora_tensor *t = &a->t[i];
        int rc = fx_tensor_to_f32(a->params + t->offset, t->numel, fx_safetensors_find(f, t->name));
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

int fx__lora_load(fx__model *m, const char *path, bool load_adam)
{
    fx_safetensors *f = NULL;
    int rc = fx__check_format(path);
    if (rc || (rc = fx_safetensors_open(&f, path)) != FX_OK)
        return rc;
    fx_model_config c;
    fx__lora_source src = {0};
    bool adam = false;
    fx__lora *a = NULL;
    if ((rc = fx__ckpt_read(f, path, &c, NULL, &adam)) != FX_OK || (rc = read_lora_meta(f, path, &src)) != FX_OK)
        goto done;
    const fx__config_field *d = fx__config_diff(&c, &m->c);
    if (d) {
        rc = fx__error(FX_EINVAL, "'%s' holds adapters for another model than its base (its %s differs)", path, d->key);
        goto done;
    }
    if (load_adam && !adam) {
        rc = fx__error(FX_EFORMAT, "'%s' holds no optimizer state", path);
        goto done;
    }
    if ((rc = fx__lora_create(&a, &m->c, &src.cfg, 0)) != FX_OK ||
        (rc = read_adapters(a, f, path, adam ? 2 : 0)) != FX_OK)
        goto done;
    if (adam) {
        const int64_t P = (int64_t)a->total;
        const fx_tensor_view *mv = fx_safetensors_find(f, "optim.m"), *vv = fx_safetensors_find(f, "optim.v");
        if ((rc = fx__check_view(path, mv, "optim.m", 1, &P, false)) != FX_OK ||
            (rc = fx__check_view(path, vv, "optim.v", 1, &P, false)) != FX_OK ||
            (rc = fx__check_moments(path, mv, vv)) != FX_OK)
            goto done;
        const char *ds = fx_safetensors_metadata(f, "lora_dropout_state");
        unsigned long long seed, step;
        char tail;
        if (!ds || sscanf(ds, "%llu:%llu%c", &seed, &step, &tail) != 2) {
            rc = fx__error(FX_EFORMAT, "'%s': metadata lora_dropout_state = '%s' is not SEED:STEP", path,
                           ds ? ds : "(none)");
            goto done;
        }
        a->drop_seed = seed, a->drop_step = step;
        if (load_adam) {
            if ((rc = fx__lora_alloc_train(a)) != FX_OK)
                goto done;
            memcpy(a->adam_m, mv->data, a->total * sizeof(float));
            memcpy(a->adam_v, vv->data, a->total * sizeof(float));
        }
    }
    rc = fx__model_set_lora(m, a);
    a = NULL;
done:
    fx__lora_free(a);
    fx_safetensors_close(f);
    return rc;
}

/* ---- PEFT's adapter directories ------------------------------------------------------------- */

/* adapter_config.json: LoRA of PEFT's plain kind on a local base (what flexc runs). */
static int read_peft_config(fx__lora_source *src, const char *dir)
{
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    int rc = fx__read_regular(&text, &len, path, 1u << 20);
    if (rc != FX_OK)
        return rc;
    json_error_t err;
    json_t *o = json_loadb(text, len, 0, &err);
    fx__free(text);
    if (!json_is_object(o)) {
        json_decref(o);
        return fx__error(FX_EFORMAT, "%s: not a JSON object (line %d: %s)", path, err.line, err.text);
    }
    const json_t *type = json_object_get(o, "peft_type"), *r = json_object_get(o, "r"),
                 *alpha = json_object_get(o, "lora_alpha"), *drop = json_object_get(o, "lora_dropout"),
                 *targets = json_object_get(o, "target_modules"),
                 *base = json_object_get(o, "base_model_name_or_path");
    rc = FX_EFORMAT;
    /* What changes the arithmetic and is not PEFT's plain LoRA is refused by name. */
    static const char *const off[] = {"use_dora", "use_rslora", "fan_in_fan_out", "lora_bias", "use_qalora"};
    static const char *const unset[] = {"layers_to_transform", "modules_to_save", "rank_pattern", "alpha_pattern",
                                        "exclude_modules", "target_parameters", "trainable_token_indices",
                                        "layer_replication", "alora_invocation_tokens"};
    if (!json_is_string(type) || strcmp(json_string_value(type), "LORA") != 0)
        fx__error(rc, "%s: peft_type is not \"LORA\"", path);
    else if (!json_is_integer(r) || json_integer_value(r) < 1)
        fx__error(rc, "%s: r is not a positive integer", path);
    else if (!json_is_number(alpha) || (drop && !json_is_null(drop) && !json_is_number(drop)))
        fx__error(rc, "%s: lora_alpha or lora_dropout is not a number", path);
    else if (!json_is_string(base))
        fx__error(rc, "%s: base_model_name_or_path is not a string", path);
    else if (!json_is_array(targets))
        fx__error(rc, "%s: target_modules is not a list of module names (a pattern is not supported)", path);
    else if (json_object_get(o, "bias") && !json_is_null(json_object_get(o, "bias")) &&
             strcmp(json_string_value(json_object_get(o, "bias")) ? json_string_value(json_object_get(o, "bias")) : "",
                    "none") != 0)
        fx__error(rc, "%s: bias is not \"none\" (trained biases are not supported)", path);
    else
        rc = FX_OK;
    for (size_t i = 0; rc == FX_OK && i < sizeof off / sizeof off[0]; i++)
        if (json_is_true(json_object_get(o, off[i])))
            rc = fx__error(FX_EFORMAT, "%s: %s is true, which flexc does not support", path, off[i]);
    for (size_t i = 0; rc == FX_OK && i < sizeof unset / sizeof unset[0]; i++) {
        const json_t *v = json_object_get(o, unset[i]);
        if (v && !json_is_null(v) && !(json_is_object(v) && json_object_size(v) == 0) &&
            !(json_is_array(v) && json_array_size(v) == 0))
            rc = fx__error(FX_EFORMAT, "%s: %s is set, which flexc does not support", path, unset[i]);
    }
    if (rc == FX_OK) {
        src->cfg = (fx__lora_config){.rank = (int64_t)json_integer_value(r), .alpha = (float)json_number_value(alpha),
                                     .dropout = drop && json_is_number(drop) ? (float)json_number_value(drop) : 0.0f};
        size_t i;
        const json_t *e;
        json_array_foreach(targets, i, e) {
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            int t = target_index(s, strlen(s));
            if (t < 0) {
                rc = fx__error(FX_EFORMAT, "%s: target module '%s' is not one of q_proj, k_proj, v_proj, o_proj, "
                               "gate_proj, up_proj, down_proj", path, s);
                break;
            }
            src->cfg.targets |= 1u << t;
        }
        /* A relative base is looked for beside the adapter first, then from the current
           directory (as PEFT does). */
        const char *b = json_string_value(base);
        char near[8400];
        struct stat st;
        snprintf(near, sizeof near, "%s/%s", dir, b);
        if (b[0] != '/' && stat(near, &st) == 0 && S_ISDIR(st.st_mode))
            b = near;
        if (rc == FX_OK && strlen(b) >= sizeof src->base)
            rc = fx__error(FX_EFORMAT, "%s: base_model_name_or_path is too long", path);
        if (rc == FX_OK)
            snprintf(src->base, sizeof src->base, "%s", b);
    }
    json_decref(o);
    return rc;
}

int fx__lora_source_find(const char *path, fx__lora_source *src, bool *found)
{
    memset(src, 0, sizeof *src);
    *found = false;
    struct stat st;
    if (stat(path, &st) != 0)
        return FX_OK; /* the loader says what is missing */
    char probe[4200];
    if (S_ISDIR(st.st_mode)) {
        snprintf(probe, sizeof probe, "%s/adapter_config.json", path);
        if (fx__is_regular(probe)) {
            src->peft = true;
            snprintf(src->file, sizeof src->file, "%s/adapter_model.safetensors", path);
            *found = true;
            return read_peft_config(src, path);
        }
        /* A training directory: its model file, when it has one, is what loads. */
        snprintf(probe, sizeof probe, "%s/model.safetensors", path);
        if (fx__is_regular(probe))
            return FX_OK;
        snprintf(probe, sizeof probe, "%s/checkpoint.safetensors", path);
    } else {
        snprintf(probe, sizeof probe, "%s", path);
    }
    char kind[16];
    bool has = false;
    if (!fx__is_regular(probe) || fx__check_format(probe) != FX_OK ||
        fx_safetensors_peek_metadata(probe, "kind", kind, sizeof kind, &has) != FX_OK || !has || strcmp(kind, "lora"))
        return FX_OK; /* not a LoRA run's: the model loaders say what it is */
    *found = true;
    snprintf(src->file, sizeof src->file, "%s", probe);
    fx_safetensors *f = NULL;
    int rc = fx_safetensors_open(&f, probe);
    if (rc == FX_OK)
        rc = read_lora_meta(f, probe, src);
    fx_safetensors_close(f);
    return rc;
}

/* The PEFT adapter of src into m (whose config is its base's). */
static int load_peft(fx__model *m, const fx__lora_source *src)
{
    fx_safetensors *f = NULL;
    int rc = fx_safetensors_open(&f, src->file);
    if (rc)
        return rc;
    fx__lora *a = NULL;
    if ((rc = fx__lora_create(&a, &m->c, &src->cfg, 0)) == FX_OK && (rc = read_adapters(a, f, src->file, 0)) == FX_OK) {
        rc = fx__model_set_lora(m, a);
        a = NULL;
    }
    fx__lora_free(a);
    fx_safetensors_close(f);
    return rc;
}

int fx__lora_rows_to_flexc(fx__lora *a, int64_t hd)
{
    for (size_t i = 0; i < a->n; i++) {
        const fx__lora_tensor *t = &a->t[i];
        if (!t->rope_heads)
            continue;
        float *tmp = fx__alloc(t->numel * sizeof *tmp);
        if (!tmp)
            return FX_ENOMEM;
        fx__hf_rows_to_flexc(tmp, a->params + t->offset, t->rope_heads, hd, t->shape[1]);
        memcpy(a->params + t->offset, tmp, t->numel * sizeof *tmp);
        fx__free(tmp);
    }
    return FX_OK;
}

int fx__lora_open(fx__model **out, const fx__lora_source *src, bool merged)
{
    *out = NULL;
    struct stat st;
    char cfg[4200];
    snprintf(cfg, sizeof cfg, "%s/config.json", src->base);
    if (stat(src->base, &st) != 0 || !S_ISDIR(st.st_mode) || !fx__is_regular(cfg))
        return fx__error(FX_EINVAL, "%s: its base model '%s' is not a Hugging Face model directory here (adapters "
                         "load on top of the base they were trained on)", src->file, src->base);
    fx__model *m = NULL;
    int rc = merged ? fx__hf_load(&m, src->base) : fx__hf_load_mapped(&m, src->base);
    if (rc != FX_OK)
        return fx__error_context(rc, "the base model of %s", src->file);
    if (src->peft) {
        rc = load_peft(m, src);
    } else {
        /* A run's mask and attention mods are its checkpoint's. */
        fx_model_config c;
        fx__model_train_state ts;
        if ((rc = fx__model_read_config(src->file, &c, &ts, NULL)) == FX_OK) {
            fx__model_mask_parse(ts.attn, &m->mask, &m->window);
            if ((rc = fx__model_set_mods(m, ts.score_mod, ts.mask_mod)) == FX_OK)
                rc = fx__lora_load(m, src->file, false);
        }
    }
    if (rc == FX_OK && merged) {
        fx__lora *a = m->lora;
        if ((rc = fx__lora_rows_to_flexc(a, m->c.head_dim)) == FX_OK)
            for (int64_t l = 0; l < m->c.layers; l++)
                for (int t = 0; t < FX__LORA_TARGETS; t++) {
                    const int which = fx__lora_weight_of((fx__lora_target)t);
                    const fx__model_tensor *w = fx__layer_first(m, l) + which;
                    if (fx__lora_a(a, l, (fx__lora_target)t))
                        fx__lora_merge(a, l, (fx__lora_target)t, m->params + w->offset, w->shape[0], w->shape[1]);
                }
        m->lora = NULL;
        fx__lora_free(a);
    }
    if (rc != FX_OK) {
        fx__model_free(m);
        return rc;
    }
    *out = m;
    return FX_OK;
}

/* ---- writing a PEFT adapter ----------------------------------------------------------------- */

static int write_text_file(const char *dir, const char *name, const char *text)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return fx__error(FX_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return fx__error(FX_EIO, "%s: cannot write: %s", path, strerror(errno));
    }
    return FX_OK;
}

/* The double whose shortest decimal reads back as x (0.1f as 0.1, not 0.100000001). */
static double shortest(float x)
{
    char buf[32];
    for (int digits = 1; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        if (strtof(buf, NULL) == x)
            break;
    }
    return strtod(buf, NULL);
}

int fx__lora_export_peft(const fx__lora *a, const char *dir, const char *base, fx_dtype dtype)
{
    json_t *o = json_object(), *targets = json_array();
    for (int t = 0; t < FX__LORA_TARGETS; t++)
        if ((a->cfg.targets >> t) & 1)
            json_array_append_new(targets, json_string(peft_name[t]));
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "base_model_name_or_path", json_string(base));
    json_object_set_new(o, "r", json_integer(a->cfg.rank));
    json_object_set_new(o, "lora_alpha", json_real(shortest(a->cfg.alpha)));
    json_object_set_new(o, "lora_dropout", json_real(shortest(a->cfg.dropout)));
    json_object_set_new(o, "target_modules", targets);
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "inference_mode", json_true());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "use_rslora", json_false());
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "modules_to_save", json_null());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(o);
    if (!text)
        return FX_ENOMEM;
    int rc = FX_OK;
    fx_tensor_view *v = fx__calloc(a->n, sizeof *v);
    void **bufs = fx__calloc(a->n, sizeof *bufs);
    const size_t es = fx_dtype_size(dtype);
    for (size_t i = 0; v && bufs && rc == FX_OK && i < a->n; i++) {
        const fx__lora_tensor *t = &a->t[i];
        const void *data = a->params + t->offset;
        if (dtype != FX_DT_F32) {
            if (!(bufs[i] = fx__alloc(t->numel * es)))
                rc = FX_ENOMEM;
            else
                rc = fx_f32_to_dtype(bufs[i], dtype, a->params + t->offset, t->numel);
            data = bufs[i];
        }
        v[i] = (fx_tensor_view){.name = t->name, .dtype = dtype, .ndim = 2, .shape = {t->shape[0], t->shape[1]},
                                .data = data, .nbytes = t->numel * es};
    }
    if (!v || !bufs)
        rc = FX_ENOMEM;
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const char *meta[] = {"format", "pt", NULL};
    if (rc == FX_OK)
        rc = fx_safetensors_save(path, v, a->n, meta);
    if (rc == FX_OK) {
        size_t len = strlen(text);
        char *nl = malloc(len + 2);
        if (!nl)
            rc = FX_ENOMEM;
        else {
            memcpy(nl, text, len);
            nl[len] = '\n', nl[len + 1] = '\0';
            rc = write_text_file(dir, "adapter_config.json", nl);
            free(nl);
        }
    }
    for (size_t i = 0; bufs && i < a->n; i++)
        fx__free(bufs[i]);
    fx__free(bufs);
    fx__free(v);
    free(text);
    return rc;
}
