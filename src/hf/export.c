/* Writing a Hugging Face model directory from float32 tensors in flexc's layout: the RoPE rows
   go back to rotate-half order and the values are narrowed to the source dtype, so a model read
   and written unchanged gives the same tensor bytes. */
#include "hf/hf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes len bytes to path through path.tmp + fsync + rename: the old file or the new one. */
static int write_file(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fx__error(FX_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            unlink(tmp);
            return fx__error(FX_EIO, "%s: cannot write: %s", tmp, strerror(e));
        }
        done += (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return fx__error(FX_EIO, "%s: cannot write: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return fx__error(FX_EIO, "%s: cannot rename into place: %s", path, strerror(e));
    }
    return FX_OK;
}

static int write_text(const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return write_file(path, text, strlen(text));
}

/* The tokenizer files transformers reads, copied when the source has them. */
static int copy_tokenizer(const char *dir, const char *from)
{
    static const char *const names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                        "tokenizer.model"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[4096], dst[4096];
        snprintf(src, sizeof src, "%s/%s", from, names[i]);
        if (access(src, F_OK) != 0)
            continue;
        snprintf(dst, sizeof dst, "%s/%s", dir, names[i]);
        char *text = NULL;
        size_t len = 0;
        int rc = fx__hf_read_text(&text, &len, src);
        if (rc == FX_OK)
            rc = write_file(dst, text, len);
        fx__free(text);
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

static const char *dtype_word(fx_dtype dt)
{
    return dt == FX_DT_BF16 ? "bfloat16" : dt == FX_DT_F16 ? "float16" : "float32";
}

/* Refused before anything is read or written. */
static int check_args(const char *dir, const fx__hf_export_spec *s)
{
    if (!dir || !s || !s->c || !s->data)
        return fx__error(FX_EINVAL, "fx__hf_export: dir, spec, config and data must not be NULL");
    if (s->dtype != FX_DT_F32 && s->dtype != FX_DT_BF16 && s->dtype != FX_DT_F16)
        return fx__error(FX_EINVAL, "export dtype %s is not F32, BF16 or F16", fx_dtype_name(s->dtype) ?
                         fx_dtype_name(s->dtype) : "?");
    return FX_OK;
}

/* Each of the n tensors of the layout t has the caller's data. */
static int check_data(const fx__hf_export_spec *s, const fx__hf_tensor *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!s->data[i])
            return fx__error(FX_EINVAL, "export: tensor %s has no data", t[i].name);
    return FX_OK;
}

/* dir, created when missing; what is there must be a directory. */
static int make_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return fx__error(FX_EIO, "%s: cannot create: %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return fx__error(FX_EIO, "%s: not a directory", dir);
    return FX_OK;
}

/* views[i]: tensor i in HF order and the target dtype. float32 tensors that need no permutation
   are written straight from the caller's memory; the others from bufs[i], allocated here. */
static int make_views(const fx__hf_export_spec *s, const fx__hf_tensor *t, size_t n, fx_tensor_view *views,
                      void **bufs)
{
    float *tmp = NULL;
    size_t tmp_cap = 0;
    int rc = FX_OK;
    const size_t esz = fx_dtype_size(s->dtype);
    for (size_t i = 0; i < n && rc == FX_OK; i++) {
        const size_t numel = (size_t)t[i].shape[0] * (size_t)(t[i].ndim == 2 ? t[i].shape[1] : 1);
        const float *src = s->data[i];
        if (t[i].rope_heads) {
            if (numel > tmp_cap) {
                fx__free(tmp);
                tmp_cap = numel;
                if (!(tmp = fx__alloc(numel * sizeof(float)))) {
                    rc = FX_ENOMEM;
                    break;
                }
            }
            fx__hf_rows_to_hf(tmp, src, t[i].rope_heads, s->c->m.head_dim, t[i].ndim == 2 ? t[i].shape[1] : 1);
            src = tmp;
        }
        const void *data = src;
        if (s->dtype != FX_DT_F32 || src == tmp) {
            if (!(bufs[i] = fx__alloc(numel * esz))) {
                rc = FX_ENOMEM;
                break;
            }
            if (s->dtype == FX_DT_F32)
                memcpy(bufs[i], src, numel * sizeof(float));
            else if ((rc = fx_f32_to_dtype(bufs[i], s->dtype, src, numel)) != FX_OK)
                break;
            data = bufs[i];
        }
        views[i] = (fx_tensor_view){.name = t[i].hf_name, .dtype = s->dtype, .ndim = t[i].ndim,
                                    .shape = {t[i].shape[0], t[i].shape[1]}, .data = data,
                                    .nbytes = numel * esz};
    }
    fx__free(tmp);
    return rc;
}

/* dir/model.safetensors from the n tensors of the layout t (the views name them by t's HF names). */
static int write_model(const char *dir, const fx__hf_export_spec *s, const fx__hf_tensor *t, size_t n)
{
    fx_tensor_view *views = fx__calloc(n, sizeof *views);
    void **bufs = fx__calloc(n, sizeof *bufs);
    int rc = views && bufs ? make_views(s, t, n, views, bufs) : FX_ENOMEM;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    const char *meta[] = {"format", "pt", NULL};
    if (rc == FX_OK)
        rc = fx_safetensors_save(path, views, n, meta);
    for (size_t i = 0; bufs && i < n; i++)
        fx__free(bufs[i]);
    fx__free(bufs);
    fx__free(views);
    return rc;
}

/* A sharded source's index would now point at files that were not written. */
static int remove_index(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (unlink(path) != 0 && errno != ENOENT)
        return fx__error(FX_EIO, "%s: cannot remove: %s", path, strerror(errno));
    return FX_OK;
}

/* config.json and generation_config.json: the source's text when the spec has it, else made
   from the config. */
static int write_configs(const char *dir, const fx__hf_export_spec *s)
{
    char *text = NULL;
    int rc;
    if (s->config_text)
        rc = write_text(dir, "config.json", s->config_text);
    else if ((rc = fx__hf_config_json(&text, s->c, dtype_word(s->dtype))) == FX_OK)
        rc = write_text(dir, "config.json", text);
    fx__free(text);
    text = NULL;
    if (rc != FX_OK)
        return rc;
    if (s->gen_text)
        rc = write_text(dir, "generation_config.json", s->gen_text);
    else if ((rc = fx__hf_generation_json(&text, s->c)) == FX_OK)
        rc = write_text(dir, "generation_config.json", text);
    fx__free(text);
    return rc;
}

int fx__hf_export(const char *dir, const fx__hf_export_spec *s)
{
    int rc = check_args(dir, s);
    if (rc != FX_OK)
        return rc;
    fx__hf_tensor *t = NULL;
    size_t n = 0;
    if ((rc = fx__hf_layout(&t, &n, &s->c->m)) != FX_OK)
        return rc;
    if ((rc = check_data(s, t, n)) == FX_OK && (rc = make_dir(dir)) == FX_OK)
        rc = write_model(dir, s, t, n);
    fx__free(t);
    if (rc == FX_OK)
        rc = remove_index(dir);
    if (rc == FX_OK)
        rc = write_configs(dir, s);
    if (rc == FX_OK && s->tokenizer_dir)
        rc = copy_tokenizer(dir, s->tokenizer_dir);
    return rc;
}
