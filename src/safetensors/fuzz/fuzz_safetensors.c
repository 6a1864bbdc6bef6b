/* libFuzzer target: the safetensors validator and the index checker on arbitrary bytes.
   Beyond "no crash, no out-of-bounds access" it checks properties of every accepted file:
   views lie inside the data buffer and tile it, lookups find every view, conversions run,
   and writing the views back and reading them again gives the same tensors. */
#include "safetensors/st_internal.h"
#include "core/fuzz_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void roundtrip(const fx_safetensors *f)
{
    size_t n = f->n;
    size_t *order = malloc((n ? n : 1) * sizeof *order);
    FUZZ_CHECK(order);
    const char **meta = calloc(2 * f->nmeta + 1, sizeof *meta);
    FUZZ_CHECK(meta);
    for (size_t i = 0; i < f->nmeta; i++) {
        meta[2 * i] = f->meta[i];
        meta[2 * i + 1] = fx_safetensors_metadata(f, f->meta[i]);
    }
    FUZZ_CHECK(fx__st_save_check(f->views, n, meta, order) == FX_OK);
    char *hdr;
    size_t hlen;
    FUZZ_CHECK(fx__st_header_build(&hdr, &hlen, f->views, order, n, meta) == FX_OK);
    size_t total = 8 + hlen + f->buffer_len;
    unsigned char *file = malloc(total);
    FUZZ_CHECK(file);
    for (int k = 0; k < 8; k++)
        file[k] = (unsigned char)((uint64_t)hlen >> 8 * k);
    memcpy(file + 8, hdr, hlen);
    size_t off = 8 + hlen;
    for (size_t k = 0; k < n; k++) {
        const fx_tensor_view *v = &f->views[order[k]];
        if (v->nbytes)
            memcpy(file + off, v->data, v->nbytes);
        off += v->nbytes;
    }
    FUZZ_CHECK(off == total);
    fx_safetensors g;
    FUZZ_CHECK(fx__st_parse(&g, file, total) == FX_OK);
    FUZZ_CHECK(g.n == n && g.nmeta == f->nmeta);
    for (size_t i = 0; i < n; i++) {
        const fx_tensor_view *a = &f->views[i], *b = fx_safetensors_find(&g, a->name);
        FUZZ_CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
        FUZZ_CHECK(!memcmp(a->shape, b->shape, sizeof a->shape));
        FUZZ_CHECK(a->nbytes == 0 || !memcmp(a->data, b->data, a->nbytes));
        /* Saved files align every tensor for its dtype (relative to the file start). */
        FUZZ_CHECK(((const unsigned char *)b->data - file) % fx_dtype_size(b->dtype) == 0);
    }
    for (size_t i = 0; i < f->nmeta; i++)
        FUZZ_CHECK(!strcmp(fx_safetensors_metadata(&g, f->meta[i]), fx_safetensors_metadata(f, f->meta[i])));
    fx__st_release(&g);
    free(file);
    fx__free(hdr);
    free(meta);
    free(order);
}

static void check_accepted(const fx_safetensors *f, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(f->buffer >= data && f->buffer + f->buffer_len == data + size);
    size_t covered = 0;
    for (size_t i = 0; i < f->n; i++) {
        const fx_tensor_view *v = fx_safetensors_tensor(f, i);
        const unsigned char *p = v->data;
        FUZZ_CHECK(p >= f->buffer && (size_t)(p - f->buffer) <= f->buffer_len);
        FUZZ_CHECK(v->nbytes <= f->buffer_len - (size_t)(p - f->buffer));
        FUZZ_CHECK((size_t)(p - f->buffer) == covered); /* file order tiles the buffer */
        covered += v->nbytes;
        FUZZ_CHECK(fx_safetensors_find(f, v->name) == v);
        int64_t numel = fx_tensor_numel(v);
        FUZZ_CHECK(numel >= 0 && (uint64_t)numel * fx_dtype_size(v->dtype) == v->nbytes);
        float *out = malloc((size_t)numel * sizeof(float) + 1);
        FUZZ_CHECK(out);
        int rc = fx_tensor_to_f32(out, (size_t)numel, v);
        FUZZ_CHECK(rc == FX_OK || rc == FX_EUNSUPPORTED);
        free(out);
    }
    FUZZ_CHECK(covered == f->buffer_len);
    for (size_t i = 0; i < f->nmeta; i++)
        FUZZ_CHECK(fx_safetensors_metadata(f, fx_safetensors_metadata_key(f, i)) ==
                   f->meta[i] + strlen(f->meta[i]) + 1);
    roundtrip(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fx_safetensors f;
    int rc = fx__st_parse(&f, data, size);
    if (rc == FX_OK) {
        check_accepted(&f, data, size);
        fx__st_release(&f);
    } else {
        FUZZ_CHECK(rc == FX_EFORMAT || rc == FX_ENOMEM);
        FUZZ_CHECK(fx_last_error()[0] != '\0');
    }
    /* The same bytes as an index file. */
    rc = fx__st_index_check((const char *)data, size, NULL);
    FUZZ_CHECK(rc == FX_OK || rc == FX_EFORMAT || rc == FX_ENOMEM);
    return 0;
}
