/* LoRA adapters (lora.h): the table, the buffers, the adapter's products and their
   backward, merging, and the optimizer over the adapters. */
#include "model/lora.h"

#include "core/core.h"
#include "model/arch.h"
#include "model/dist.h" /* the deterministic sum's stack, in the memory plan */
#include "model/model.h"

#include <flexc/rng.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

static const int target_weight[FX__LORA_TARGETS] = {FX__MODEL_WQ, FX__MODEL_WK, FX__MODEL_WV, FX__MODEL_WO,
                                                    FX__MODEL_W1, FX__MODEL_W3, FX__MODEL_W2};

int fx__lora_weight_of(fx__lora_target t) { return target_weight[t]; }

int fx__lora_target_of(int which)
{
    for (int t = 0; t < FX__LORA_TARGETS; t++)
        if (target_weight[t] == which)
            return t;
    return -1;
}

fx__lora_config fx__lora_defaults(int64_t rank)
{
    return (fx__lora_config){.rank = rank, .alpha = 2.0f * (float)rank, .dropout = 0.0f, .targets = FX__LORA_ALL};
}

void fx__lora_free(fx__lora *a)
{
    if (!a)
        return;
    fx__free(a->t);
    fx__free(a->index);
    fx__free(a->params);
    fx__free(a->grads);
    fx__free(a->adam_m);
    fx__free(a->adam_v);
    fx__free(a->scratch);
    fx__free(a->sink);
    fx__free(a);
}

int fx__lora_create(fx__lora **out, const fx_model_config *c, const fx__lora_config *lc, uint64_t seed)
{
    *out = NULL;
    if (lc->rank < 1)
        return fx__error(FX_EINVAL, "LoRA rank %lld: must be at least 1", (long long)lc->rank);
    if (!(lc->dropout >= 0.0f && lc->dropout < 1.0f))
        return fx__error(FX_EINVAL, "LoRA dropout %g: must be in [0, 1)", (double)lc->dropout);
    if (!isfinite(lc->alpha))
        return fx__error(FX_EINVAL, "LoRA alpha %g: must be finite", (double)lc->alpha);
    if (!lc->targets || (lc->targets & ~(unsigned)FX__LORA_ALL))
        return fx__error(FX_EINVAL, "LoRA targets 0x%x: a non-empty subset of q, k, v, o, gate, up, down",
                         lc->targets);
    fx__lora *a = fx__calloc(1, sizeof *a);
    if (!a)
        return FX_ENOMEM;
    a->cfg = *lc;
    a->scale = lc->alpha / (float)lc->rank;
    a->layers = c->layers;
    int ntarget = 0;
    for (int t = 0; t < FX__LORA_TARGETS; t++)
        ntarget += (lc->targets >> t) & 1;
    a->n = (size_t)(c->layers * ntarget * 2);
    a->t = fx__calloc(a->n, sizeof *a->t);
    a->index = fx__alloc((size_t)(c->layers * FX__LORA_TARGETS) * sizeof *a->index);
    if (!a->t || !a->index) {
        fx__lora_free(a);
        return FX_ENOMEM;
    }
    const int64_t r = lc->rank, hd = c->head_dim;
    size_t i = 0, off = 0;
    for (int64_t l = 0; l < c->layers; l++)
        for (int t = 0; t < FX__LORA_TARGETS; t++) {
            a->index[l * FX__LORA_TARGETS + t] = -1;
            if (!((lc->targets >> t) & 1))
                continue;
            const fx__arch_tensor *w = &fx__arch_layer[target_weight[t]];
            const int64_t O = fx__arch_len_of(w->rows, c), I = fx__arch_len_of(w->cols, c);
            char base[80];
            /* "self_attn.q_proj.weight" without ".weight" */
            snprintf(base, sizeof base, "%.*s", (int)(strlen(w->hf) - strlen(".weight")), w->hf);
            a->index[l * FX__LORA_TARGETS + t] = (int32_t)i;
            for (int ab = 0; ab < 2; ab++, i++) {
                fx__lora_tensor *e = &a->t[i];
                snprintf(e->name, sizeof e->name, "base_model.model.model.layers.%lld.%s.lora_%c.weight",
                         (long long)l, base, ab ? 'B' : 'A');
                e->layer = l;
                e->target = (fx__lora_target)t;
                e->is_b = ab;
                e->shape[0] = ab ? O : r;
                e->shape[1] = ab ? r : I;
                e->rope_heads = ab && w->rope != FX__LEN_NONE ? fx__arch_len_of(w->rope, c) / hd : 0;
                e->numel = (size_t)(e->shape[0] * e->shape[1]);
                e->offset = off;
                off += (e->numel + 15) / 16 * 16;
            }
        }
    a->total = off;
    a->params = fx__calloc(off ? off : 1, sizeof(float));
    a->grads = fx__calloc(off ? off : 1, sizeof(float));
    a->sink = fx__calloc((size_t)c->dim, sizeof(float));
    if (!a->params || !a->grads || !a->sink) {
        fx__lora_free(a);
        return FX_ENOMEM;
    }
    /* PEFT's default: nn.init.kaiming_uniform_(A, a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound
       gain * sqrt(3 / fan_in) = 1 / sqrt(I). Each A from its own stream (its table row). */
    for (size_t k = 0; k < a->n; k++) {
        const fx__lora_tensor *e = &a->t[k];
        if (e->is_b)
            continue;
        const float bound = (float)(1.0 / sqrt((double)e->shape[1]));
        fx_rng_fill_uniform(a->params + e->offset, (int64_t)e->numel, -bound, bound, seed, 0x10ea0000u + k);
    }
    a->drop_seed = seed ^ 0xd509u;
    if (fx__lora_scratch(a, fx__lora_scratch_floats(a, c, FX__LORA_ROWS)) != FX_OK) {
        fx__lora_free(a);
        return FX_ENOMEM;
    }
    *out = a;
    return FX_OK;
}

int fx__lora_alloc_train(fx__lora *a)
{
    if (a->adam_m)
        return FX_OK;
    a->adam_m = fx__calloc(a->total ? a->total : 1, sizeof(float));
    a->adam_v = fx__calloc(a->total ? a->total : 1, sizeof(float));
    if (!a->adam_m || !a->adam_v) {
        fx__free(a->adam_m), fx__free(a->adam_v);
        a->adam_m = a->adam_v = NULL;
        return FX_ENOMEM;
    }
    return FX_OK;
}

ptrdiff_t fx__lora_find(const fx__lora *a, const char *name)
{
    for (size_t i = 0; i < a->n; i++)
        if (!strcmp(a->t[i].name, name))
            return (ptrdiff_t)i;
    return -1;
}

int fx__lora_set(fx__lora *a, size_t i, const float *values, size_t numel)
{
    if (i >= a->n || numel != a->t[i].numel)
        return fx__error(FX_ERANGE, "LoRA tensor %zu with %zu values: the table has %zu tensors%s", i, numel, a->n,
                         i < a->n ? " and another size" : "");
    memcpy(a->params + a->t[i].offset, values, numel * sizeof(float));
    return FX_OK;
}

const float *fx__lora_a(const fx__lora *a, int64_t l, fx__lora_target t)
{
    const int32_t i = a->index[l * FX__LORA_TARGETS + t];
    return i < 0 ? NULL : a->params + a->t[i].offset;
}

const float *fx__lora_b(const fx__lora *a, int64_t l, fx__lora_target t)
{
    const int32_t i = a->index[l * FX__LORA_TARGETS + t];
    return i < 0 ? NULL : a->params + a->t[i + 1].offset;
}

size_t fx__lora_bytes(const fx__lora *a, bool with_adam)
{
    return a->total * sizeof(float) * (with_adam ? 4 : 2);
}

/* The widest input of a target and u, du ([N, r] each), dropped x and its d(x) ([N, I]). */
size_t fx__lora_scratch_floats(const fx__lora *a, const fx_model_config *c, int64_t N)
{
    int64_t I = c->dim;
    I = c->heads * c->head_dim > I ? c->heads * c->head_dim : I;
    I = c->ffn > I ? c->ffn : I;
    return (size_t)(2 * N * a->cfg.rank + 2 * N * I);
}

int fx__lora_scratch(fx__lora *a, size_t n)
{
    if (a->scratch_n >= n)
        return FX_OK;
    fx__free(a->scratch);
    a->scratch = fx__alloc(n * sizeof(float));
    a->scratch_n = a->scratch ? n : 0;
    return a->scratch ? FX_OK : FX_ENOMEM;
}

/* ---- the products ------------------------------------------------------------------------------- */

/* The dropout mask's factor for element (n, i): 0 or 1 / (1 - p), a hash of (seed, step, l,
   t, (drop_row + n) * I + i), so the backward pass draws the same mask without keeping it, and a
   row's mask is the same whichever process or pass computes it. */
static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static bool dropping(const fx__lora *a) { return a->training && a->cfg.dropout > 0.0f; }

/* xd [nr, I] = drop(rows n0 .. n0 + nr - 1 of x): the mask of layer l's target t at this step. */
static void drop_apply(const fx__lora *a, int64_t l, fx__lora_target t, float *xd, const float *x, int64_t n0,
                       int64_t nr, int64_t I)
{
    const float p = a->cfg.dropout, keep = 1.0f / (1.0f - p);
    const uint64_t key = mix64(mix64(mix64(a->drop_seed) ^ a->drop_step) ^ (uint64_t)(l * FX__LORA_TARGETS + t));
    const uint64_t thresh = (uint64_t)((double)p * 18446744073709551616.0);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < nr; n++)
        for (int64_t i = 0; i < I; i++)
            xd[n * I + i] = mix64(key ^ (uint64_t)((a->drop_row + n0 + n) * I + i)) >= thresh
                                ? x[(n0 + n) * I + i] * keep
                                : 0.0f;
}

/* x [N, I] as the adapter reads it: x itself, or drop(x) in xd. */
static const float *adapter_input(const fx__lora *a, int64_t l, fx__lora_target t, float *xd, const float *x,
                                  int64_t N, int64_t I)
{
    if (!dropping(a))
        return x;
    drop_apply(a, l, t, xd, x, 0, N, I);
    return xd;
}

void fx__lora_forward(fx__lora *a, int64_t l, fx__lora_target t, float *y, int64_t ldy, const float *x, int64_t N,
                      int64_t I, int64_t O)
{
    const float *A = fx__lora_a(a, l, t), *B = fx__lora_b(a, l, t);
    const int64_t r = a->cfg.rank;
    /* As many rows at a time as the scratch holds: at least FX__LORA_ROWS (reserved at
       creation: decoding a long prompt needs no more), all of them in training (the backward's
       scratch is larger). Rows are independent, and fx__sgemm computes each element alike
       whatever the rows of the call: the passes change no bit. */
    const int64_t per_row = r + (dropping(a) ? I : 0), fit = (int64_t)(a->scratch_n / (size_t)per_row);
    const int64_t rows = fit > FX__LORA_ROWS ? fit : FX__LORA_ROWS;
    for (int64_t n0 = 0; n0 < N; n0 += rows) {
        const int64_t nr = N - n0 < rows ? N - n0 : rows;
        float *u = a->scratch, *xd = a->scratch + nr * r;
        const float *xa = x + n0 * I;
        if (dropping(a)) {
            drop_apply(a, l, t, xd, x, n0, nr, I);
            xa = xd;
        }
        fx__sgemm(false, true, nr, r, I, 1.0f, xa, I, A, I, 0.0f, u, r);
        fx__sgemm(false, true, nr, O, r, a->scale, u, r, B, r, 1.0f, y + n0 * ldy, ldy);
    }
}

float *fx__lora_backward(fx__lora *a, int64_t l, fx__lora_target t, const float *dy, int64_t ldy,
                       const float *x, int64_t N, int64_t I, int64_t O)
{
    const int32_t k = a->index[l * FX__LORA_TARGETS + t];
    const float *A = a->params + a->t[k].offset, *B = a->params + a->t[k + 1].offset;
    float *dA = a->grads + a->t[k].offset, *dB = a->grads + a->t[k + 1].offset;
    const int64_t r = a->cfg.rank;
    float *u = a->scratch, *du = u + N * r, *xd = du + N * r, *dxd = xd + N * I;
    const float *xa = adapter_input(a, l, t, xd, x, N, I);
    fx__sgemm(false, true, N, r, I, 1.0f, xa, I, A, I, 0.0f, u, r);          /* u = xa A^T */
    fx__sgemm(true, false, O, r, N, a->scale, dy, ldy, u, r, 1.0f, dB, r);    /* dB += s dy^T u */
    fx__sgemm(false, false, N, r, O, a->scale, dy, ldy, B, r, 0.0f, du, r);   /* du = s dy B */
    fx__sgemm(true, false, r, I, N, 1.0f, du, r, xa, I, 1.0f, dA, I);         /* dA += du^T xa */
    fx__sgemm(false, false, N, I, r, 1.0f, du, r, A, I, 0.0f, dxd, I);         /* du A */
    if (!dropping(a))
        return dxd;
    /* (du A) * mask / (1 - p): the mask is drop's, drawn again. */
    drop_apply(a, l, t, xd, dxd, 0, N, I);
    return xd;
}

void fx__lora_add(float *dx, const float *d, int64_t N, int64_t I)
{
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t i = 0; i < I; i++)
            dx[n * I + i] += d[n * I + i];
}

void fx__lora_merge(const fx__lora *a, int64_t l, fx__lora_target t, float *w, int64_t O, int64_t I)
{
    const float *A = fx__lora_a(a, l, t), *B = fx__lora_b(a, l, t);
    if (!A)
        return;
    const int64_t r = a->cfg.rank;
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < r; j++)
                s += (double)B[o * r + j] * A[j * I + i];
            w[o * I + i] = (float)((double)w[o * I + i] + (double)a->scale * s);
        }
}

/* ---- the optimizer ------------------------------------------------------------------------------ */

double fx__lora_grad_norm(const fx__lora *a)
{
    /* Chunks of fixed size summed in order: the same bits at any thread count. */
    enum { CHUNK = 1 << 14 };
    const size_t nchunk = (a->total + CHUNK - 1) / CHUNK;
    double total = 0.0;
    for (size_t ch = 0; ch < nchunk; ch++) {
        const size_t i0 = ch * CHUNK, i1 = i0 + CHUNK < a->total ? i0 + CHUNK : a->total;
        total += fx__sumsq_scalar(a->grads + i0, (int64_t)(i1 - i0));
    }
    return sqrt(total);
}

void fx__lora_adamw(fx__lora *a, const fx__adamw *o, int64_t t)
{
    fx__adamw_f32(a->params, a->grads, a->adam_m, a->adam_v, (int64_t)a->total, o, o->weight_decay, t);
}

void fx__lora_zero_grad(fx__lora *a) { memset(a->grads, 0, a->total * sizeof(float)); }

float *fx__lora_layer_grads(fx__lora *a, int64_t l, size_t *numel)
{
    const size_t per = a->n / (size_t)a->layers, first = a->t[(size_t)l * per].offset;
    const size_t end = l + 1 < a->layers ? a->t[(size_t)(l + 1) * per].offset : a->total;
    *numel = end - first;
    return a->grads + first;
}

/* ---- memory ------------------------------------------------------------------------------------- */

size_t fx__lora_floats(const fx_model_config *c, const fx__lora_config *lc)
{
    size_t total = 0;
    for (int t = 0; t < FX__LORA_TARGETS; t++) {
        if (!((lc->targets >> t) & 1))
            continue;
        const fx__arch_tensor *w = &fx__arch_layer[target_weight[t]];
        const size_t O = (size_t)fx__arch_len_of(w->rows, c), I = (size_t)fx__arch_len_of(w->cols, c);
        const size_t r = (size_t)lc->rank;
        total += (r * I + 15) / 16 * 16 + (O * r + 15) / 16 * 16;
    }
    return total * (size_t)c->layers;
}

int fx__lora_mem_train(fx__model_mem *mem, const fx_model_config *c, const fx__lora_config *lc,
                       const fx__model_mem_opts *o, uint64_t base_bytes)
{
    fx__model_mem_opts full = *o;
    full.bf16 = false, full.adam_bf16 = false, full.sum_slices = 0;
    int rc = fx__model_mem_train(mem, c, &full);
    if (rc)
        return rc;
    fx_model_config k = *c;
    if (!k.head_dim)
        k.head_dim = k.dim / k.heads;
    const uint64_t A = fx__lora_floats(&k, lc), N = (uint64_t)(o->B * o->T);
    const uint64_t P = mem->params / sizeof(float);
    uint64_t I = (uint64_t)k.dim;
    I = (uint64_t)(k.heads * k.head_dim) > I ? (uint64_t)(k.heads * k.head_dim) : I;
    I = (uint64_t)k.ffn > I ? (uint64_t)k.ffn : I;
    const uint64_t base = base_bytes ? base_bytes : P * sizeof(float);
    mem->params = base + A * sizeof(float);
    mem->grads = A * sizeof(float) + (uint64_t)k.dim * sizeof(float);
    if (o->sum_slices > 0) /* the deterministic sum's stack and sum, rows of A + 1 (dist.h) */
        mem->grads += (uint64_t)(fx__dist_sum_levels(o->sum_slices) + 1) * (A + 1) * sizeof(float);
    mem->adam = 2 * A * sizeof(float);
    mem->scratch += (2 * N * (uint64_t)lc->rank + 2 * N * I) * sizeof(float);
    if (o->bf16) /* the bfloat16 products over the mapped rows (fx__linear_bf16) */
        mem->scratch += fx__model_bf16_map_ws_floats(&k, (int64_t)N) * sizeof(float);
    /* A mapped base's pages read so far (the loader reads every tensor) are in the process's
       resident set, and counted in params already: taken out of process, as held weights are. */
    mem->process -= base_bytes < mem->process ? base_bytes : mem->process;
    mem->total = mem->params + mem->grads + mem->adam + mem->acts + mem->scratch + mem->data + mem->process;
    return FX_OK;
}
