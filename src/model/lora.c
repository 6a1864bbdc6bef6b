/* LoRA adapters (lora.h): the table, the buffers, the adapter's products and their
   backward, merging, and the optimizer over the adapters. */
#include "model/lora.h"

#include "core/core.h"
#include "model/arch.h"
#include "model/dist.h" /* the deterministic sum's stack, in the memory plan */
#include "model/model.h"

#include <flexc/rng.h>

#include <assert.h>
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

/* The scratch of a group's products (fx__lora_group_*) over N rows of inputs I wide: U and dU
   ([N, G r] each: the group's u side by side, and their gradients), the group's A stacked and
   their gradients ([G r, I] each), a dropped x and its d(x) ([N, I] each), G the largest group. */
static size_t scratch_floats(int64_t r, int64_t I, int64_t N)
{
    const int64_t gr = FX__LORA_GROUP_MAX * r;
    return (size_t)(2 * N * gr + 2 * gr * I + 2 * N * I);
}

/* The widest input of a model's projections. */
static int64_t widest_input(const fx_model_config *c)
{
    int64_t I = c->dim;
    I = c->heads * c->head_dim > I ? c->heads * c->head_dim : I;
    return c->ffn > I ? c->ffn : I;
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
    a->in_max = widest_input(c);
    if (fx__lora_scratch(a, scratch_floats(lc->rank, a->in_max, FX__LORA_ROWS)) != FX_OK) {
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

/* Floats of the adapters' kept u over N rows: [N, r] for every target of every layer. */
static size_t kept_floats(int64_t r, int64_t layers, int64_t N)
{
    return (size_t)(layers * FX__LORA_TARGETS * N * r);
}

size_t fx__lora_scratch_floats(const fx__lora *a, const fx_model_config *c, int64_t N)
{
    return scratch_floats(a->cfg.rank, widest_input(c), N) + kept_floats(a->cfg.rank, c->layers, N);
}

/* Where the forward pass keeps the u of parts starting at target t of layer l ([N, n r], the
   parts side by side: a group's targets are consecutive), or NULL when it keeps none. */
static float *kept_u(const fx__lora *a, int64_t l, fx__lora_target t, int64_t N)
{
    if (a->kept_rows != N || !a->training)
        return NULL;
    const int64_t r = a->cfg.rank;
    return a->scratch + scratch_floats(r, a->in_max, N) + (size_t)((l * FX__LORA_TARGETS + t) * N * r);
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

/* The scratch's pieces for N rows of I inputs (scratch_floats' layout). */
typedef struct lora_ws {
    float *u, *du, *acat, *dacat, *xd, *dxd;
} lora_ws;

static lora_ws ws_of(const fx__lora *a, int64_t N, int64_t I)
{
    const int64_t gr = FX__LORA_GROUP_MAX * a->cfg.rank;
    lora_ws w = {.u = a->scratch};
    w.du = w.u + N * gr;
    w.acat = w.du + N * gr;
    w.dacat = w.acat + gr * I;
    w.xd = w.dacat + gr * I;
    w.dxd = w.xd + N * I;
    return w;
}

/* acat [n r, I] = the parts' A stacked, in the parts' order. */
static void stack_a(const fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *acat, int64_t I)
{
    const size_t each = (size_t)(a->cfg.rank * I);
    for (int i = 0; i < n; i++)
        memcpy(acat + (size_t)i * each, fx__lora_a(a, l, p[i].t), each * sizeof(float));
}

/* y [nr, cols] (rows ldy apart) += scale u_i B_i^T for each part, u [nr, n r] (rows ldu apart). */
static void up_products(const fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *y, int64_t ldy,
                        const float *u, int64_t ldu, int64_t nr)
{
    const int64_t r = a->cfg.rank;
    for (int i = 0; i < n; i++)
        fx__sgemm(false, true, nr, p[i].O, r, a->scale, u + i * r, ldu, fx__lora_b(a, l, p[i].t), r, 1.0f,
                  y + p[i].col, ldy);
}

void fx__lora_group_forward(fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *y, int64_t ldy,
                            const float *x, int64_t N, int64_t I)
{
    assert(n >= 1 && n <= FX__LORA_GROUP_MAX);
    const int64_t r = a->cfg.rank, gr = FX__LORA_GROUP_MAX * r;
    /* As many rows at a time as the scratch holds: at least FX__LORA_ROWS (reserved at
       creation: decoding a long prompt needs no more), all of them in training (the backward's
       scratch is larger). Rows are independent, and fx__sgemm computes each element alike
       whatever the rows of the call: the passes change no bit. */
    float *keep = kept_u(a, l, p[0].t, N);
    if (keep) { /* all rows at once, u where the backward pass finds it */
        const lora_ws w = ws_of(a, N, I);
        if (!dropping(a)) {
            stack_a(a, l, p, n, w.acat, I);
            fx__sgemm(false, true, N, n * r, I, 1.0f, x, I, w.acat, I, 0.0f, keep, n * r);
        } else {
            for (int i = 0; i < n; i++) {
                drop_apply(a, l, p[i].t, w.xd, x, 0, N, I);
                fx__sgemm(false, true, N, r, I, 1.0f, w.xd, I, fx__lora_a(a, l, p[i].t), I, 0.0f, keep + i * r, n * r);
            }
        }
        up_products(a, l, p, n, y, ldy, keep, n * r, N);
        return;
    }
    const int64_t per_row = gr + (dropping(a) ? I : 0);
    const int64_t fit = (int64_t)((a->scratch_n - (size_t)(gr * I)) / (size_t)per_row);
    const int64_t rows = fit > FX__LORA_ROWS ? fit : FX__LORA_ROWS;
    float *acat = a->scratch, *u = acat + gr * I, *xd = u + rows * gr;
    if (!dropping(a)) {
        /* One product for the group's u (x is read once), then each part's B. */
        stack_a(a, l, p, n, acat, I);
        for (int64_t n0 = 0; n0 < N; n0 += rows) {
            const int64_t nr = N - n0 < rows ? N - n0 : rows;
            fx__sgemm(false, true, nr, n * r, I, 1.0f, x + n0 * I, I, acat, I, 0.0f, u, n * r);
            up_products(a, l, p, n, y + n0 * ldy, ldy, u, n * r, nr);
        }
        return;
    }
    /* Dropout: each part reads its own drop(x). */
    for (int i = 0; i < n; i++)
        for (int64_t n0 = 0; n0 < N; n0 += rows) {
            const int64_t nr = N - n0 < rows ? N - n0 : rows;
            drop_apply(a, l, p[i].t, xd, x, n0, nr, I);
            fx__sgemm(false, true, nr, r, I, 1.0f, xd, I, fx__lora_a(a, l, p[i].t), I, 0.0f, u, r);
            up_products(a, l, &p[i], 1, y + n0 * ldy, ldy, u, r, nr);
        }
}

void fx__lora_group_grads(fx__lora *a, int64_t l, const fx__lora_part *p, int n, const float *dy, int64_t ldy,
                          const float *x, int64_t N, int64_t I)
{
    assert(n >= 1 && n <= FX__LORA_GROUP_MAX);
    const int64_t r = a->cfg.rank, nr = n * r;
    lora_ws w = ws_of(a, N, I);
    float *kept = kept_u(a, l, p[0].t, N);
    if (!dropping(a)) {
        /* The group's A stacked (fx__lora_group_dx reads it too); u = x A^T the forward pass's,
           else made again for the whole group in one product. */
        stack_a(a, l, p, n, w.acat, I);
        if (!kept)
            fx__sgemm(false, true, N, nr, I, 1.0f, x, I, w.acat, I, 0.0f, w.u, nr);
    }
    if (kept)
        w.u = kept;
    for (int i = 0; i < n; i++) {
        const int32_t k = a->index[l * FX__LORA_TARGETS + p[i].t];
        float *dA = a->grads + a->t[k].offset, *dB = a->grads + a->t[k + 1].offset;
        const float *B = a->params + a->t[k + 1].offset, *dyi = dy + p[i].col;
        if (dropping(a)) {
            drop_apply(a, l, p[i].t, w.xd, x, 0, N, I);
            if (!kept)
                fx__sgemm(false, true, N, r, I, 1.0f, w.xd, I, a->params + a->t[k].offset, I, 0.0f, w.u + i * r, nr);
        }
        fx__sgemm(true, false, p[i].O, r, N, a->scale, dyi, ldy, w.u + i * r, nr, 1.0f, dB, r); /* dB += s dy^T u */
        fx__sgemm(false, false, N, r, p[i].O, a->scale, dyi, ldy, B, r, 0.0f, w.du + i * r, nr); /* du = s dy B */
        if (dropping(a))
            fx__sgemm(true, false, r, I, N, 1.0f, w.du + i * r, nr, w.xd, I, 1.0f, dA, I); /* dA += du^T drop(x) */
    }
    if (dropping(a))
        return;
    /* dA += du^T x for the whole group in one product (x read once), then into each part's. */
    fx__sgemm(true, false, nr, I, N, 1.0f, w.du, nr, x, I, 0.0f, w.dacat, I);
    for (int i = 0; i < n; i++) {
        float *dA = a->grads + a->t[a->index[l * FX__LORA_TARGETS + p[i].t]].offset;
        const float *d = w.dacat + i * r * I;
        for (int64_t j = 0; j < r * I; j++)
            dA[j] += d[j];
    }
}

void fx__lora_group_dx(fx__lora *a, int64_t l, const fx__lora_part *p, int n, float *dx, int64_t N, int64_t I)
{
    const int64_t r = a->cfg.rank, nr = n * r;
    const lora_ws w = ws_of(a, N, I);
    if (!dropping(a)) { /* dx += du A over the group's stacked A (fx__lora_group_grads left both) */
        fx__sgemm(false, false, N, I, nr, 1.0f, w.du, nr, w.acat, I, 1.0f, dx, I);
        return;
    }
    /* (du A) * mask / (1 - p) for each part: the mask is drop's, drawn again. */
    for (int i = 0; i < n; i++) {
        fx__sgemm(false, false, N, I, r, 1.0f, w.du + i * r, nr, fx__lora_a(a, l, p[i].t), I, 0.0f, w.dxd, I);
        drop_apply(a, l, p[i].t, w.xd, w.dxd, 0, N, I);
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < N; j++)
            for (int64_t c = 0; c < I; c++)
                dx[j * I + c] += w.xd[j * I + c];
    }
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
    const uint64_t base = base_bytes ? base_bytes : P * sizeof(float);
    mem->params = base + A * sizeof(float);
    mem->grads = A * sizeof(float) + (uint64_t)k.dim * sizeof(float);
    if (o->sum_slices > 0) /* the deterministic sum's stack and sum, rows of A + 1 (dist.h) */
        mem->grads += (uint64_t)(fx__dist_sum_levels(o->sum_slices) + 1) * (A + 1) * sizeof(float);
    mem->adam = 2 * A * sizeof(float);
    const size_t lora_floats =
        scratch_floats(lc->rank, widest_input(&k), (int64_t)N) + kept_floats(lc->rank, k.layers, (int64_t)N);
    mem->scratch += lora_floats * sizeof(float);
    if (o->bf16) /* the bfloat16 products over the mapped rows (fx__linear_bf16), the packed head */
        mem->scratch += fx__model_bf16_map_ws_floats(&k, (int64_t)N) * sizeof(float) +
                        fx__model_head16_bytes(&k, (int64_t)N);
    /* A mapped base's pages read so far (the loader reads every tensor) are in the process's
       resident set, and counted in params already: taken out of process, as held weights are. */
    mem->process -= base_bytes < mem->process ? base_bytes : mem->process;
    mem->total = mem->params + mem->grads + mem->adam + mem->acts + mem->scratch + mem->data + mem->process;
    return FX_OK;
}
