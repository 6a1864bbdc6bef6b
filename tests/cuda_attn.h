/* The attention GPU tests' shared piece: a score mod's context with its arrays copied to the
   device, as a device call takes it (the context structs stay on the host). */
#ifndef FLEXC_TEST_CUDA_ATTN_H
#define FLEXC_TEST_CUDA_ATTN_H

#include "cuda_gpu.h"

/* The score mod's context with its arrays on the device (what a device call takes). */
typedef struct dev_ctx {
    fx_score_alibi_ctx alibi;
    fx_score_rel_bias_ctx rel;
    const void *ctx;
    float *grad_table; /* device, NULL when not wanted */
    size_t ntab;
} dev_ctx;

static inline void dev_ctx_make(dev_ctx *d, const fx_attention *a)
{
    memset(d, 0, sizeof *d);
    d->ctx = a->score_ctx;
    if (a->score_mod == fx_score_alibi) {
        d->alibi.slopes = gpu_upload(((const fx_score_alibi_ctx *)a->score_ctx)->slopes, (size_t)a->Hq * sizeof(float));
        d->ctx = &d->alibi;
    } else if (a->score_mod == fx_score_rel_bias) {
        d->rel = *(const fx_score_rel_bias_ctx *)a->score_ctx;
        d->ntab = (size_t)(d->rel.heads * d->rel.size);
        d->rel.table = gpu_upload(d->rel.table, d->ntab * sizeof(float));
        if (d->rel.grad_table) {
            d->grad_table = gpu_alloc(d->ntab * sizeof(float));
            d->rel.grad_table = d->grad_table;
        }
        d->ctx = &d->rel;
    }
}

static inline void dev_ctx_free(dev_ctx *d)
{
    gpu_free((void *)d->alibi.slopes);
    gpu_free((void *)d->rel.table);
    gpu_free(d->grad_table);
}

#endif
