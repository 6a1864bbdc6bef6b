/* Helper of the Python interoperability check (bench/safetensors_interop.py):
     safetensors_interop spec            prints the test tensors and metadata as JSON
     safetensors_interop write FILE      saves them with fx_safetensors_save
     safetensors_interop check FILE N    opens FILE (written by the Python package) and checks
                                         that it holds N of the test tensors, byte for byte,
                                         and the test metadata if it has any
   Exit status 0 when everything matches. */
#include <flexc.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NT = FX_DT_COUNT + 3 };
static char names[NT][32];
static fx_tensor_view views[NT];
static unsigned char *bufs[NT];
static const char *const meta[] = {"format", "pt", "note", "a \"quoted\" \xc3\xbcnicode\nline", NULL};

static void build(void)
{
    for (int i = 0; i < NT; i++) {
        fx_tensor_view *v = &views[i];
        if (i < FX_DT_COUNT) {
            v->dtype = (fx_dtype)i;
            snprintf(names[i], sizeof names[i], "t_%s", fx_dtype_name(v->dtype));
            v->ndim = 1 + i % 3;
            for (int d = 0; d < v->ndim; d++)
                v->shape[d] = 2 + (i + d) % 3;
        } else if (i == FX_DT_COUNT) {
            strcpy(names[i], "scalar");
            v->dtype = FX_DT_F32;
            v->ndim = 0;
        } else if (i == FX_DT_COUNT + 1) {
            strcpy(names[i], "empty");
            v->dtype = FX_DT_F16;
            v->ndim = 2;
            v->shape[0] = 0, v->shape[1] = 4;
        } else {
            strcpy(names[i], "\xc3\xa9mbed.weight");
            v->dtype = FX_DT_BF16;
            v->ndim = 2;
            v->shape[0] = 3, v->shape[1] = 5;
        }
        v->name = names[i];
        v->nbytes = (size_t)fx_tensor_numel(v) * fx_dtype_size(v->dtype);
        bufs[i] = malloc(v->nbytes + 1);
        for (size_t j = 0; j < v->nbytes; j++)
            bufs[i][j] = v->dtype == FX_DT_BOOL ? (unsigned char)(j & 1) : (unsigned char)(j * 31 + (size_t)i * 7 + 3);
        v->data = bufs[i];
    }
}

static int check(const char *path, int want)
{
    fx_safetensors *f;
    if (fx_safetensors_open(&f, path) != FX_OK) {
        fprintf(stderr, "open: %s\n", fx_last_error());
        return 1;
    }
    int bad = 0;
    if ((int)fx_safetensors_count(f) != want) {
        fprintf(stderr, "%s: %zu tensors, expected %d\n", path, fx_safetensors_count(f), want);
        bad++;
    }
    for (size_t i = 0; i < fx_safetensors_count(f); i++) {
        const fx_tensor_view *g = fx_safetensors_tensor(f, i);
        const fx_tensor_view *e = NULL;
        for (int k = 0; k < NT; k++)
            if (!strcmp(views[k].name, g->name))
                e = &views[k];
        if (!e || e->dtype != g->dtype || e->ndim != g->ndim || e->nbytes != g->nbytes ||
            memcmp(e->shape, g->shape, sizeof e->shape) || (e->nbytes && memcmp(e->data, g->data, e->nbytes))) {
            fprintf(stderr, "%s: tensor '%s' differs\n", path, g->name);
            bad++;
        }
    }
    if (fx_safetensors_metadata_key(f, 0)) {
        for (int k = 0; meta[k]; k += 2) {
            const char *v = fx_safetensors_metadata(f, meta[k]);
            if (!v || strcmp(v, meta[k + 1])) {
                fprintf(stderr, "%s: metadata '%s' differs\n", path, meta[k]);
                bad++;
            }
        }
    }
    fx_safetensors_free(f);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    build();
    int rc = 2;
    if (argc == 2 && !strcmp(argv[1], "spec")) {
        printf("{\"metadata\": {\"format\": \"pt\", \"note\": \"a \\\"quoted\\\" \\u00fcnicode\\nline\"},\n \"tensors\": [");
        for (int i = 0; i < NT; i++) {
            const fx_tensor_view *v = &views[i];
            printf("%s\n  {\"name\": \"%s\", \"dtype\": \"%s\", \"shape\": [", i ? "," : "",
                   i == NT - 1 ? "\\u00e9mbed.weight" : v->name, fx_dtype_name(v->dtype));
            for (int d = 0; d < v->ndim; d++)
                printf("%s%lld", d ? ", " : "", (long long)v->shape[d]);
            printf("], \"hex\": \"");
            for (size_t j = 0; j < v->nbytes; j++)
                printf("%02x", bufs[i][j]);
            printf("\"}");
        }
        printf("\n]}\n");
        rc = 0;
    } else if (argc == 3 && !strcmp(argv[1], "write")) {
        rc = fx_safetensors_save(argv[2], views, NT, meta) == FX_OK ? 0 : 1;
        if (rc)
            fprintf(stderr, "save: %s\n", fx_last_error());
    } else if (argc == 4 && !strcmp(argv[1], "check")) {
        rc = check(argv[2], atoi(argv[3]));
    } else {
        fprintf(stderr, "usage: safetensors_interop spec | write FILE | check FILE N\n");
    }
    for (int i = 0; i < NT; i++)
        free(bufs[i]);
    return rc;
}
