/* Sharded checkpoints: a Hugging Face model.safetensors.index.json names, in "weight_map", the
   shard file of each tensor. Every shard is opened and validated once; lookups go through the
   weight map. Shard names are confined to the index's directory. */
#include "st_internal.h"

#include "core/file.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct ix_entry {
    const char *name;           /* the shard's copy */
    const fx_tensor_view *view;
    size_t shard;
} ix_entry;

struct fx_safetensors_index {
    size_t nshards;
    char **shard_names;
    fx_safetensors **shards;
    size_t n;
    ix_entry *entries;          /* weight_map order */
    const ix_entry **by_name;
};

/* A shard name must name a file inside the index's directory: relative, no "." or ".."
   component, no empty component, no backslash (a separator elsewhere). Symbolic links inside
   the directory are followed as the file system says; that is the directory owner's choice. */
static int check_shard_name(const char *tensor, const char *s)
{
    char q[FX__ST_QUOTE_CAP], qt[FX__ST_QUOTE_CAP];
    const char *why = NULL;
    if (!s[0])
        why = "is empty";
    else if (s[0] == '/')
        why = "is an absolute path";
    else if (strchr(s, '\\'))
        why = "contains a backslash";
    else {
        for (const char *p = s; *p;) {
            const char *e = strchr(p, '/');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.')) {
                why = "has an empty, '.' or '..' component (shards must stay inside the index's directory)";
                break;
            }
            p += len + (e != NULL);
            if (e && !*p) {
                why = "ends with '/'";
                break;
            }
        }
    }
    if (why)
        return fx__error(FX_EFORMAT, "weight_map: shard name %s of tensor %s %s", fx__st_quote(q, s),
                         fx__st_quote(qt, tensor), why);
    return FX_OK;
}

int fx__st_index_check(const char *text, size_t len, void **root_out)
{
    size_t bad;
    if (!fx__st_utf8_valid((const unsigned char *)text, len, &bad))
        return fx__error(FX_EFORMAT, "index is not valid UTF-8 (byte %zu)", bad);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    char q[FX__ST_QUOTE_CAP];
    if (!root)
        return fx__error(FX_EFORMAT, "index is not strict JSON: %s at byte %d (line %d, column %d)",
                         fx__st_printable(q, jerr.text), jerr.position, jerr.line, jerr.column);
    int rc = FX_OK;
    const json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(root)) {
        rc = fx__error(FX_EFORMAT, "index is not a JSON object");
    } else if (!wm || !json_is_object(wm)) {
        rc = fx__error(FX_EFORMAT, "index has no \"weight_map\" object");
    } else {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)wm, key, val) {
            if (!json_is_string(val)) {
                rc = fx__error(FX_EFORMAT, "weight_map: the shard of tensor %s is not a string",
                               fx__st_quote(q, key));
                break;
            }
            if ((rc = check_shard_name(key, json_string_value(val))) != FX_OK)
                break;
        }
    }
    if (rc != FX_OK || !root_out)
        json_decref(root);
    else
        *root_out = root;
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp((*(const ix_entry *const *)a)->name, (*(const ix_entry *const *)b)->name);
}

void fx_safetensors_index_free(fx_safetensors_index *x)
{
    if (!x)
        return;
    for (size_t i = 0; i < x->nshards; i++) {
        if (x->shards)
            fx_safetensors_free(x->shards[i]);
        if (x->shard_names)
            fx__free(x->shard_names[i]);
    }
    fx__free(x->shards);
    fx__free(x->shard_names);
    fx__free(x->entries);
    fx__free(x->by_name);
    fx__free(x);
}

/* The former name, exported for the callers linked against it (deprecated). */
void fx_safetensors_index_close(fx_safetensors_index *x) { fx_safetensors_index_free(x); }

static char *str_dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = fx__alloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int index_build(fx_safetensors_index *x, const char *path, json_t *root)
{
    const json_t *wm = json_object_get(root, "weight_map");
    size_t n = json_object_size(wm);
    const char *key;
    json_t *val;

    /* Distinct shard names, sorted. */
    const char **all = fx__alloc((n ? n : 1) * sizeof *all);
    if (!all)
        return FX_ENOMEM;
    size_t k = 0;
    json_object_foreach((json_t *)wm, key, val)
        all[k++] = json_string_value(val);
    qsort(all, n, sizeof *all, cmp_str);
    size_t ns = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || strcmp(all[i], all[i - 1]))
            all[ns++] = all[i];

    x->shard_names = fx__calloc(ns ? ns : 1, sizeof *x->shard_names);
    x->shards = fx__calloc(ns ? ns : 1, sizeof *x->shards);
    x->entries = fx__calloc(n ? n : 1, sizeof *x->entries);
    x->by_name = fx__calloc(n ? n : 1, sizeof *x->by_name);
    int rc = (!x->shard_names || !x->shards || !x->entries || !x->by_name) ? FX_ENOMEM : FX_OK;
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
    for (size_t i = 0; rc == FX_OK && i < ns; i++) {
        x->nshards = i + 1;
        x->shard_names[i] = str_dup(all[i]);
        size_t plen = dirlen + strlen(all[i]) + 1;
        char *sp = fx__alloc(plen);
        if (!x->shard_names[i] || !sp) {
            fx__free(sp);
            rc = FX_ENOMEM;
            break;
        }
        memcpy(sp, path, dirlen);
        memcpy(sp + dirlen, all[i], plen - dirlen);
        rc = fx_safetensors_open(&x->shards[i], sp); /* its message names the shard's path */
        fx__free(sp);
    }

    /* Every listed tensor must be in its shard. */
    k = 0;
    if (rc == FX_OK) {
        json_object_foreach((json_t *)wm, key, val) {
            const char **hit = bsearch(&(const char *){json_string_value(val)}, all, ns, sizeof *all, cmp_str);
            size_t s = (size_t)(hit - all);
            const fx_tensor_view *v = fx_safetensors_find(x->shards[s], key);
            if (!v) {
                char q[FX__ST_QUOTE_CAP], qs[FX__ST_QUOTE_CAP];
                rc = fx__error(FX_EFORMAT, "weight_map: tensor %s is listed in shard %s, which has no such tensor",
                               fx__st_quote(q, key), fx__st_quote(qs, x->shard_names[s]));
                break;
            }
            x->entries[k] = (ix_entry){v->name, v, s};
            x->by_name[k] = &x->entries[k];
            k++;
        }
    }
    if (rc == FX_OK) {
        x->n = n;
        qsort(x->by_name, n, sizeof *x->by_name, cmp_entry_name);
    }
    fx__free(all);
    return rc;
}

int fx_safetensors_index_open(fx_safetensors_index **out, const char *path)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "%s is NULL", !out ? "out" : "path");
    char *text = NULL;
    size_t len = 0;
    int rc = fx__read_regular(&text, &len, path, FX__ST_MAX_HEADER);
    if (rc != FX_OK)
        return fx__error_context(rc, "%s", path);
    void *root = NULL;
    rc = fx__st_index_check(text, len, &root);
    fx__free(text);
    if (rc != FX_OK)
        return fx__error_context(rc, "%s", path);
    fx_safetensors_index *x = fx__calloc(1, sizeof *x);
    if (!x) {
        json_decref(root);
        return fx__error_context(FX_ENOMEM, "%s", path);
    }
    rc = index_build(x, path, root);
    json_decref(root);
    if (rc != FX_OK) {
        fx_safetensors_index_free(x);
        /* Shard failures already name the shard; say which index pulled it in. */
        return fx__error_context(rc, "%s", path);
    }
    *out = x;
    return FX_OK;
}

size_t fx_safetensors_index_count(const fx_safetensors_index *x) { return x ? x->n : 0; }

const fx_tensor_view *fx_safetensors_index_tensor(const fx_safetensors_index *x, size_t i, size_t *shard)
{
    if (!x || i >= x->n)
        return NULL;
    if (shard)
        *shard = x->entries[i].shard;
    return x->entries[i].view;
}

const fx_tensor_view *fx_safetensors_index_find(const fx_safetensors_index *x, const char *name)
{
    if (!x || !name)
        return NULL;
    size_t lo = 0, hi = x->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, x->by_name[mid]->name);
        if (c == 0)
            return x->by_name[mid]->view;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

size_t fx_safetensors_index_shard_count(const fx_safetensors_index *x) { return x ? x->nshards : 0; }

const fx_safetensors *fx_safetensors_index_shard(const fx_safetensors_index *x, size_t i)
{
    return x && i < x->nshards ? x->shards[i] : NULL;
}

const char *fx_safetensors_index_shard_name(const fx_safetensors_index *x, size_t i)
{
    return x && i < x->nshards ? x->shard_names[i] : NULL;
}
