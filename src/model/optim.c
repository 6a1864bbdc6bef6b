/* The optimizer: gradient norm and scaling, AdamW over the flat buffers (the element loops of
   the path's kernel table, fx__optim_kernels_now(), taken per call), and the learning-rate
   schedule. */
#include "model_internal.h"
#include "model/kernels.h"
#include "model/lora.h"

#include <math.h>
#include <string.h>

/* ---- optimizer --------------------------------------------------------------------------------------- */

double fx__sumsq_scalar(const float *g, int64_t n)
{
    double lane[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            lane[j] += (double)g[i + j] * g[i + j];
    return fx__sumsq_finish(lane, g + i, n - i);
}

double fx__model_grad_norm(const fx__model *m)
{
    if (m->lora) /* only the adapters train */
        return fx__lora_grad_norm(m->lora);
    size_t P = m->lay.total, nchunk = (P + FX__NORM_CHUNK - 1) / FX__NORM_CHUNK;
    const float *g = m->grads;
    double *parts = m->norm_parts;
    double (*sumsq)(const float *, int64_t) = fx__optim_kernels_now()->ops->sumsq;
#pragma omp parallel for schedule(static)
    for (size_t ch = 0; ch < nchunk; ch++) {
        size_t i0 = ch * FX__NORM_CHUNK, i1 = i0 + FX__NORM_CHUNK < P ? i0 + FX__NORM_CHUNK : P;
        parts[ch] = sumsq(g + i0, (int64_t)(i1 - i0));
    }
    double total = 0.0;
    for (size_t ch = 0; ch < nchunk; ch++)
        total += parts[ch];
    return sqrt(total);
}

void fx__model_grad_scale(fx__model *m, float s)
{
    size_t P = m->lay.total;
    float *g = m->grads;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < P; i++)
        g[i] *= s;
    m->grads_zero = false;
}

fx__adamw_k fx__adamw_consts(const fx__adamw *o, float wd, int64_t t)
{
    return (fx__adamw_k){.gs = o->grad_scale != 0.0f ? o->grad_scale : 1.0f, .b1 = o->beta1,
                         .nb1 = 1.0f - o->beta1, .b2 = o->beta2, .nb2 = 1.0f - o->beta2, .lr = o->lr,
                         .bc1 = 1.0f - powf(o->beta1, (float)t), .bc2 = 1.0f - powf(o->beta2, (float)t),
                         .eps = o->eps, .wd = wd, .zero_grad = o->zero_grad};
}

/* The reference loops. The vector twins repeat these operations in this order. */
void fx__adamw_f32_scalar(float *p, float *g, float *mm, float *vv, int64_t n, const fx__adamw_k *k)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k->gs;
        float mi = k->b1 * mm[i] + k->nb1 * gi;
        float vi = k->b2 * vv[i] + k->nb2 * gi * gi;
        mm[i] = mi;
        vv[i] = vi;
        p[i] -= k->lr * (mi / k->bc1 / (sqrtf(vi / k->bc2) + k->eps) + k->wd * p[i]);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

void fx__adamw_bf16_scalar(float *p, float *g, uint16_t *mm, uint16_t *vv, int64_t n, const fx__adamw_k *k)
{
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * k->gs;
        float mi = k->b1 * fx__bf16_to_f32(mm[i]) + k->nb1 * gi;
        float vi = k->b2 * fx__bf16_to_f32(vv[i]) + k->nb2 * gi * gi;
        mm[i] = fx__f32_to_bf16(mi);
        vv[i] = fx__f32_to_bf16(vi);
        p[i] -= k->lr * (mi / k->bc1 / (sqrtf(vi / k->bc2) + k->eps) + k->wd * p[i]);
        if (k->zero_grad)
            g[i] = 0.0f;
    }
}

static const fx__optim_ops fx__optim_ops_scalar = {fx__sumsq_scalar, fx__adamw_f32_scalar, fx__adamw_bf16_scalar};
static const fx__optim_ops fx__optim_ops_avx2 = {fx__sumsq_avx2, fx__adamw_f32_avx2, fx__adamw_bf16_avx2};
static const fx__optim_ops fx__optim_ops_avx512 = {fx__sumsq_avx512, fx__adamw_f32_avx512, fx__adamw_bf16_avx512};

const fx__optim_kernels fx__optim_kernels_scalar = {"scalar", &fx__optim_ops_scalar};
const fx__optim_kernels fx__optim_kernels_avx2 = {"avx2", &fx__optim_ops_avx2};
const fx__optim_kernels fx__optim_kernels_avx512 = {"avx512", &fx__optim_ops_avx512};

const fx__optim_kernels *fx__optim_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__optim_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__optim_kernels_scalar, &fx__optim_kernels_avx2, &fx__optim_kernels_avx512);
#endif
}

const fx__optim_kernels *fx__optim_kernels_now(void) { return fx__optim_kernels_for(fx__isa()); }

/* The loops of a path, under the name model.h gives them (the tests'). */
const fx__optim_ops *fx__optim_ops_for(fx_isa isa) { return fx__optim_kernels_for(isa)->ops; }

/* The optimizer walks the flat buffers in fixed blocks shared out statically: one parallel
   pass over parameters, gradients and moments (it is memory-bound), whatever the tensors. */
enum { FX__ADAM_BLOCK = 1 << 14 };

/* The tensor holding float i of the flat buffer. */
static size_t fx__tensor_at(const fx__model_layout *lay, size_t i)
{
    size_t lo = 0, hi = lay->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi + 1) / 2;
        if (lay->t[mid].offset <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void fx__model_adamw(fx__model *m, const fx__adamw *o, int64_t t)
{
    if (m->lora) {
        fx__lora_adamw(m->lora, o, t);
        return;
    }
    const fx__model_layout *lay = &m->lay;
    size_t P = lay->total, nblk = (P + FX__ADAM_BLOCK - 1) / FX__ADAM_BLOCK;
    const fx__adamw_k kd = fx__adamw_consts(o, o->weight_decay, t), k0 = fx__adamw_consts(o, 0.0f, t);
    const fx__optim_ops *op = fx__optim_kernels_now()->ops;
    float *params = m->params, *grads = m->grads, *adam = m->adam;
    uint16_t *adam16 = m->adam16, *params16 = m->params16;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nblk; b++) {
        size_t i = b * FX__ADAM_BLOCK, end = i + FX__ADAM_BLOCK < P ? i + FX__ADAM_BLOCK : P;
        for (size_t ti = fx__tensor_at(lay, i); i < end; ti++) {
            const fx__model_tensor *tt = &lay->t[ti];
            size_t e = tt->offset + tt->numel < end ? tt->offset + tt->numel : end;
            const fx__adamw_k *k = tt->decay ? &kd : &k0;
            if (adam16)
                op->adamw_bf16(params + i, grads + i, adam16 + i, adam16 + P + i, (int64_t)(e - i), k);
            else
                op->adamw_f32(params + i, grads + i, adam + i, adam + P + i, (int64_t)(e - i), k);
            i = e;
        }
        /* bf16 training: the weights' bfloat16 copy, while the block is still in cache. */
        if (params16) {
            size_t b0 = b * FX__ADAM_BLOCK;
            fx__f32_to_bf16_n(params16 + b0, params + b0, (int64_t)(end - b0));
        }
    }
    if (o->zero_grad)
        m->grads_zero = true;
}

void fx__adamw_f32(float *p, float *g, float *mm, float *vv, int64_t n, const fx__adamw *o, float wd, int64_t t)
{
    const fx__adamw_k k = fx__adamw_consts(o, wd, t);
    const fx__optim_ops *op = fx__optim_kernels_now()->ops;
    int64_t nblk = (n + FX__ADAM_BLOCK - 1) / FX__ADAM_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i = b * FX__ADAM_BLOCK, e = i + FX__ADAM_BLOCK < n ? i + FX__ADAM_BLOCK : n;
        op->adamw_f32(p + i, g + i, mm + i, vv + i, e - i, &k);
    }
}

float fx__lr_schedule(int64_t step, int64_t warmup, int64_t total, float lr, float min_lr)
{
    if (step < warmup)
        return lr * (float)(step + 1) / (float)warmup;
    if (total <= warmup || step >= total)
        return total <= warmup ? lr : min_lr;
    double frac = (double)(step - warmup) / (double)(total - warmup);
    return min_lr + (float)(0.5 * (1.0 + cos(3.14159265358979323846 * frac))) * (lr - min_lr);
}

