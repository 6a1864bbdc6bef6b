/* Training over several processes: DDP, FSDP and the deterministic sliced step (dist.h). */
#include "dist.h"
#include "model/lora.h"

#include <assert.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* FSDP's whole-layer buffers: the fewest that let a gather and a reduce-scatter overlap the
   backward of a layer (see the FSDP section). */
enum { FX__SLOTS = 3 };

struct fx__dist {
    fx__model *m;
    fx_comm *world, *rs; /* rs: FSDP's reduce-scatter communicator */
    fx__par mode;
    bool det, serial;
    int rank, size;
    int64_t batch, local; /* global and per-rank sequences per micro-batch */
    int err;              /* first communication failure seen inside a hook */
    int phase;            /* 0: before the first layer, 1: the layers, 2: after backward */
    fx__dist_stats cur, last;

    /* DDP: the all-reduces started by the gradient hook during the last micro-batch. */
    bool reducing;
    fx_comm_work **works;
    int nworks, cap;

    /* Deterministic: one row per slice (its gradient, then its loss), summed by a stack that
       builds the left-aligned pairwise tree as slices arrive. */
    size_t row;
    float *stack, *acc;
    int64_t *stack_n;
    int levels;

    /* FSDP: unit u = 0 the embedding, 1..L layer u-1, L+1 the final norm (and the LM head
       when it is not tied: it follows the norm in the flat buffer, is read right after it by
       the loss, and its gradient is final with the norm's). */
    int64_t units;
    size_t *uoff, *unum, *ush, *soff; /* flat offset, size, shard size, offset in the shards */
    size_t S, maxsh;
    float *sp, *sg, *sm, *sv;          /* the shards: parameters, gradients, Adam m and v */
    float *slot[FX__SLOTS];                     /* whole-layer buffers */
    int skind[FX__SLOTS], slayer[FX__SLOTS];    /* what each buffer holds, for which layer */
    int64_t sage[FX__SLOTS], clock;             /* last use, for eviction */
    fx_comm_work *sw[FX__SLOTS];                /* the gather or reduce-scatter in flight */
    int cur_layer, want;                        /* the layer computed, the one to prefetch */
    float *normp, *normg, *rs_wte, *rs_norm;
    fx_comm_work *w_wte, *w_norm, *w_rs_wte, *w_rs_norm;
    float **lp, **lg;                  /* m->hooks.layer_params / layer_grads */
};

int fx__par_parse(const char *s, fx__par *out)
{
    if (s && !strcmp(s, "none"))
        *out = FX__PAR_NONE;
    else if (s && !strcmp(s, "ddp"))
        *out = FX__PAR_DDP;
    else if (s && !strcmp(s, "fsdp"))
        *out = FX__PAR_FSDP;
    else
        return fx__error(FX_EINVAL, "--parallel '%s' is not none, ddp or fsdp", s ? s : "(null)");
    return FX_OK;
}

/* ---- collectives with bookkeeping ------------------------------------------------------------- */

static int fx__fail(fx__dist *d, int rc)
{
    if (rc && !d->err)
        d->err = rc;
    return rc;
}

static void fx__waited(fx__dist *d, double t0)
{
    double dt = fx__seconds() - t0;
    d->cur.wait_s += dt;
    if (d->phase == 0)
        d->cur.wait_head_s += dt;
    else if (d->phase == 2)
        d->cur.wait_tail_s += dt;
}

static int fx__wait(fx__dist *d, fx_comm_work **w)
{
    if (!*w)
        return FX_OK;
    double t0 = fx__seconds();
    int rc = fx_comm_work_wait(*w, -1.0);
    fx__waited(d, t0);
    fx_comm_work_free(*w);
    *w = NULL;
    return fx__fail(d, rc);
}

static int fx__started(fx__dist *d, int rc, double bytes)
{
    if (rc)
        return fx__fail(d, rc);
    d->cur.comm_bytes += bytes;
    d->cur.collectives++;
    return FX_OK;
}

static void fx__progress(fx__dist *d)
{
    if (d->err)
        return;
    d->cur.progress_calls++;
    double t0 = fx__seconds();
    int rc = fx_comm_progress(d->world);
    if (!rc && d->rs)
        rc = fx_comm_progress(d->rs);
    d->cur.progress_s += fx__seconds() - t0;
    fx__fail(d, rc);
}

static void fx__progress_hook(void *user)
{
    fx__progress(user);
}

/* A blocking all-reduce, timed as a wait. */
static int fx__all_reduce(fx__dist *d, float *buf, int64_t n)
{
    if (d->err)
        return d->err;
    double t0 = fx__seconds();
    int rc = fx_comm_all_reduce(d->world, buf, n, NULL);
    fx__waited(d, t0);
    return fx__started(d, rc, 4.0 * (double)n);
}

/* ---- DDP: all-reduce each layer's gradients as the backward pass finishes them ---------------- */

static void fx__ddp_hook(int layer, float *grad, size_t numel, void *user)
{
    fx__dist *d = user;
    (void)layer;
    if (!d->reducing || d->err)
        return;
    fx_comm_work *w = NULL;
    double t0 = fx__seconds();
    int rc = fx_comm_all_reduce(d->world, grad, (int64_t)numel, &w);
    d->cur.progress_s += fx__seconds() - t0; /* starting it: communication time too */
    if (fx__started(d, rc, 4.0 * (double)numel))
        return;
    d->works[d->nworks++] = w;
    if (d->serial)
        fx__wait(d, &d->works[--d->nworks]);
    fx__progress(d);
}

/* ---- FSDP -------------------------------------------------------------------------------------- */

/* The layer buffers: FX__SLOTS whole-layer buffers shared by gathered parameters and layer
   gradients. Forward: the current layer and the next one arriving (the third keeps the layer
   before, so the last layers are still there when backward starts). Backward: the current
   layer's parameters and its gradient, and one buffer that first carries the layer above's
   gradient out (reduce-scatter) and then the layer below's parameters in (prefetch): the
   prefetch starts as soon as that reduce-scatter is done, from any progress point. */
enum { FX__SLOT_FREE = 0, FX__SLOT_PARAMS = 1, FX__SLOT_GRADS = 2, FX__SLOT_RS = 3 };

static int fx__slot_find(const fx__dist *d, int kind, int layer)
{
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == kind && d->slayer[b] == layer)
            return b;
    return -1;
}

/* Adds a finished reduce-scatter's block into this rank's gradient shard. */
static void fx__rs_add(fx__dist *d, const float *out, int64_t u)
{
    float *g = d->sg + d->soff[u];
    for (size_t i = 0; i < d->ush[u]; i++)
        g[i] += out[i];
}

/* Waits for a reduce-scatter of unit u and adds this rank's block into the gradient shard. */
static int fx__rs_finish(fx__dist *d, fx_comm_work **w, const float *out, int64_t u)
{
    if (!*w)
        return FX_OK;
    int rc = fx__wait(d, w);
    if (rc)
        return rc;
    fx__rs_add(d, out, u);
    return FX_OK;
}

static int fx__slot_rs_finish(fx__dist *d, int b)
{
    if (fx__rs_finish(d, &d->sw[b], d->slot[b], d->slayer[b] + 1))
        return d->err;
    d->skind[b] = FX__SLOT_FREE, d->slayer[b] = -1;
    return FX_OK;
}

static int fx__gather(fx__dist *d, int64_t u, float *out, fx_comm_work **w)
{
    if (d->err)
        return d->err;
    double t0 = fx__seconds();
    int rc = fx_comm_all_gather_single(d->world, out, d->sp + d->soff[u], (int64_t)d->ush[u], w);
    d->cur.progress_s += fx__seconds() - t0; /* starting it: communication time too */
    if (fx__started(d, rc, 4.0 * (double)(d->ush[u] * (size_t)d->size)))
        return rc;
    return d->serial ? fx__wait(d, w) : FX_OK;
}

/* A buffer to overwrite: a free one, else gathered parameters no longer wanted (not layer
   keep0 or keep1), else, when `wait`, the oldest reduce-scatter once it is done. -1: none
   without waiting (or a failure). */
static int fx__slot_take(fx__dist *d, int keep0, int keep1, bool wait)
{
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == FX__SLOT_FREE)
            return b;
    int best = -1;
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == FX__SLOT_PARAMS && d->slayer[b] != keep0 && d->slayer[b] != keep1 &&
            (best < 0 || d->sage[b] < d->sage[best]))
            best = b;
    if (best >= 0) {
        if (fx__wait(d, &d->sw[best])) /* done long ago in practice */
            return -1;
        d->skind[best] = FX__SLOT_FREE, d->slayer[best] = -1;
        return best;
    }
    if (!wait)
        return -1;
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == FX__SLOT_RS && (best < 0 || d->sage[b] < d->sage[best]))
            best = b;
    if (best < 0 || fx__slot_rs_finish(d, best))
        return -1;
    return best;
}

/* Starts gathering layer l into buffer b. */
static int fx__slot_gather(fx__dist *d, int b, int l)
{
    d->skind[b] = FX__SLOT_PARAMS, d->slayer[b] = l, d->sage[b] = ++d->clock;
    if (fx__gather(d, l + 1, d->slot[b], &d->sw[b])) {
        d->skind[b] = FX__SLOT_FREE, d->slayer[b] = -1;
        return d->err ? d->err : FX_ECOMM;
    }
    return FX_OK;
}

/* The prefetch wanted (d->want), if not there yet and a buffer can be had without waiting. */
static void fx__prefetch(fx__dist *d)
{
    if (d->serial || d->want < 0 || d->err || fx__slot_find(d, FX__SLOT_PARAMS, d->want) >= 0)
        return;
    int b = fx__slot_take(d, d->cur_layer, d->want, false);
    if (b >= 0)
        fx__slot_gather(d, b, d->want);
}

/* A progress point: drives both communicators, retires finished reduce-scatters (freeing
   their buffers) and starts the wanted prefetch in a freed buffer. All of it is counted as
   communication time on this rank's core (MPI's copies happen inside these calls). */
static void fx__fsdp_poll(fx__dist *d)
{
    if (d->err)
        return;
    d->cur.progress_calls++;
    double t0 = fx__seconds();
    int rc = fx_comm_progress(d->world);
    if (!rc)
        rc = fx_comm_progress(d->rs);
    for (int b = 0; b < FX__SLOTS && !rc; b++) {
        if (d->skind[b] != FX__SLOT_RS)
            continue;
        bool done = false;
        if ((rc = fx_comm_work_test(d->sw[b], &done)) != FX_OK || !done)
            continue;
        fx_comm_work_free(d->sw[b]);
        d->sw[b] = NULL;
        d->skind[b] = FX__SLOT_FREE;
        d->cur.progress_s += fx__seconds() - t0;
        fx__rs_add(d, d->slot[b], d->slayer[b] + 1); /* compute: not timed */
        t0 = fx__seconds();
        d->slayer[b] = -1;
    }
    d->cur.progress_s += fx__seconds() - t0;
    if (!rc)
        fx__prefetch(d); /* timed where the gather starts */
    fx__fail(d, rc);
}

static void fx__fsdp_progress_hook(void *user)
{
    fx__fsdp_poll(user);
}

/* The status to return when no buffer could be had: the communication failure that stopped
   it, or (a schedule bug, never expected) an error saying so. */
static int fx__slot_none(fx__dist *d, int layer)
{
    if (d->err)
        return d->err;
    return fx__error(FX_EINVAL, "fsdp: no free layer buffer for layer %d", layer);
}

static int fx__fsdp_layer_hook(int layer, bool backward, void *user)
{
    fx__dist *d = user;
    fx__model *m = d->m;
    int64_t L = m->c.layers;
    if (d->err)
        return d->err;
    if (layer == L) { /* the final norm: gathered with the embedding at the start */
        fx__wait(d, &d->w_norm);
        return d->err;
    }
    d->cur_layer = layer;
    int next = backward ? layer - 1 : layer + 1;
    d->want = next >= 0 && next < L ? next : -1;
    /* The parameters: prefetched, still there from the forward pass, or gathered now. */
    int b = fx__slot_find(d, FX__SLOT_PARAMS, layer);
    if (b < 0) {
        if ((b = fx__slot_take(d, layer, d->want, true)) < 0)
            return fx__slot_none(d, layer);
        if (fx__slot_gather(d, b, layer))
            return d->err ? d->err : FX_ECOMM;
    }
    d->sage[b] = ++d->clock;
    if (backward) {
        /* The gradient buffer before the prefetch: the layer needs it now. */
        int g = fx__slot_take(d, layer, d->want, true);
        if (g < 0)
            return fx__slot_none(d, layer);
        d->skind[g] = FX__SLOT_GRADS, d->slayer[g] = layer, d->sage[g] = ++d->clock;
        memset(d->slot[g], 0, d->ush[layer + 1] * (size_t)d->size * sizeof(float));
        d->lg[layer] = d->slot[g];
    }
    fx__fsdp_poll(d);
    if (fx__wait(d, &d->sw[b]))
        return d->err;
    d->lp[layer] = d->slot[b];
    if (!backward && layer == 0)
        d->phase = 1;
    return d->err;
}

static void fx__fsdp_grad_hook(int layer, float *grad, size_t numel, void *user)
{
    fx__dist *d = user;
    int64_t L = d->m->c.layers, u = layer + 1;
    (void)numel;
    if (d->err)
        return;
    float *out;
    fx_comm_work **w;
    int b = -1;
    if (u == 0) {
        out = d->rs_wte, w = &d->w_rs_wte;
    } else if (u == L + 1) {
        out = d->rs_norm, w = &d->w_rs_norm;
    } else {
        /* In place: this rank's block of the sum lands at the start of the buffer. */
        b = fx__slot_find(d, FX__SLOT_GRADS, layer);
        out = grad, w = &d->sw[b];
        d->skind[b] = FX__SLOT_RS, d->sage[b] = ++d->clock;
    }
    double t0 = fx__seconds();
    int rc = fx_comm_reduce_scatter_single(d->rs, out, grad, (int64_t)d->ush[u], w);
    d->cur.progress_s += fx__seconds() - t0; /* starting it: communication time too */
    if (fx__started(d, rc, 4.0 * (double)(d->ush[u] * (size_t)d->size)))
        return;
    if (d->serial) {
        if (b >= 0)
            fx__slot_rs_finish(d, b);
        else
            fx__rs_finish(d, w, out, u);
    }
    fx__fsdp_poll(d);
}

/* After a micro-batch's backward: every reduce-scatter finished, and the gathered layers
   reduced to layer 0. Which other layers are still there depends on when reduce-scatters
   happened to complete on this rank; the next micro-batch's forward must gather the same
   layers on every rank, in the same order (the gathers of all layers look alike to the
   fingerprints, so a divergence would go unnoticed or hang). */
static int fx__rs_finish_all(fx__dist *d)
{
    int64_t L = d->m->c.layers;
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == FX__SLOT_RS && fx__slot_rs_finish(d, b))
            return d->err;
    for (int b = 0; b < FX__SLOTS; b++)
        if (d->skind[b] == FX__SLOT_PARAMS && d->slayer[b] != 0) {
            if (fx__wait(d, &d->sw[b]))
                return d->err;
            d->skind[b] = FX__SLOT_FREE, d->slayer[b] = -1;
        }
    if (fx__rs_finish(d, &d->w_rs_norm, d->rs_norm, L + 1) || fx__rs_finish(d, &d->w_rs_wte, d->rs_wte, 0))
        return d->err;
    return FX_OK;
}

/* New parameters: forget the gathered layers, gather the embedding and the norm (and
   prefetch layer 0), and wait for the embedding, which the forward pass needs first. */
static int fx__fsdp_begin(fx__dist *d)
{
    int64_t L = d->m->c.layers;
    for (int b = 0; b < FX__SLOTS; b++) {
        if (fx__wait(d, &d->sw[b]))
            return d->err;
        d->skind[b] = FX__SLOT_FREE, d->slayer[b] = -1;
    }
    d->cur_layer = -1, d->want = 0;
    if (fx__gather(d, 0, d->m->params, &d->w_wte) || fx__gather(d, L + 1, d->normp, &d->w_norm))
        return d->err;
    fx__prefetch(d);
    return fx__wait(d, &d->w_wte);
}

static int fx__fsdp_create(fx__dist *d)
{
    fx__model *m = d->m;
    int64_t L = m->c.layers, N = d->size;
    d->units = L + 2;
    size_t U = (size_t)d->units;
    d->uoff = fx__calloc(4 * U, sizeof(size_t));
    d->lp = fx__calloc((size_t)L + 1, sizeof(float *));
    d->lg = fx__calloc((size_t)L + 1, sizeof(float *));
    if (!d->uoff || !d->lp || !d->lg)
        return FX_ENOMEM;
    d->unum = d->uoff + U, d->ush = d->uoff + 2 * U, d->soff = d->uoff + 3 * U;
    const fx__model_layout *lay = &m->lay;
    for (int64_t u = 0; u < d->units; u++) {
        size_t first = u == 0 ? 0 : 1 + (size_t)(u - 1) * lay->per_layer;
        size_t end = u == 0 ? 1 : u == L + 1 ? lay->n : first + lay->per_layer;
        d->uoff[u] = lay->t[first].offset;
        d->unum[u] = lay->t[end - 1].offset + lay->t[end - 1].numel - d->uoff[u];
        d->ush[u] = (d->unum[u] + (size_t)N - 1) / (size_t)N;
        d->soff[u] = d->S;
        d->S += d->ush[u];
        if (u >= 1 && u <= L && d->ush[u] > d->maxsh)
            d->maxsh = d->ush[u];
    }
    size_t S = d->S, full = d->maxsh * (size_t)N;
    d->sp = fx__calloc(4 * S, sizeof(float));
    for (int b = 0; b < FX__SLOTS; b++) {
        d->slot[b] = fx__alloc(full * sizeof(float));
        d->skind[b] = FX__SLOT_FREE, d->slayer[b] = -1;
    }
    float *wte = fx__calloc(d->ush[0] * (size_t)N, sizeof(float));
    float *wteg = fx__calloc(d->ush[0] * (size_t)N, sizeof(float));
    d->normp = fx__calloc(d->ush[L + 1] * (size_t)N, sizeof(float));
    d->normg = fx__calloc(d->ush[L + 1] * (size_t)N, sizeof(float));
    d->rs_wte = fx__alloc(d->ush[0] * sizeof(float));
    d->rs_norm = fx__alloc(d->ush[L + 1] * sizeof(float));
    bool ok = d->sp && wte && wteg && d->normp && d->normg && d->rs_wte && d->rs_norm;
    for (int b = 0; b < FX__SLOTS; b++)
        ok = ok && d->slot[b];
    if (!ok) {
        fx__free(wte), fx__free(wteg);
        return FX_ENOMEM;
    }
    d->sg = d->sp + S, d->sm = d->sp + 2 * S, d->sv = d->sp + 3 * S;
    /* This rank's shard of each unit (the padding stays zero), then the whole buffers go. */
    size_t P = lay->total;
    for (int64_t u = 0; u < d->units; u++) {
        size_t lo = (size_t)d->rank * d->ush[u];
        for (size_t i = 0; i < d->ush[u] && lo + i < d->unum[u]; i++) {
            size_t src = d->uoff[u] + lo + i, dst = d->soff[u] + i;
            d->sp[dst] = m->params[src];
            d->sm[dst] = m->adam[src];
            d->sv[dst] = m->adam[P + src];
        }
    }
    fx__free(m->params), fx__free(m->grads), fx__free(m->adam);
    m->params = wte, m->grads = wteg, m->adam = NULL;
    d->lp[L] = d->normp, d->lg[L] = d->normg;
    m->hooks.layer_params = d->lp, m->hooks.layer_grads = d->lg;
    m->hooks.layer = fx__fsdp_layer_hook;
    m->hooks.grad = fx__fsdp_grad_hook;
    m->hooks.progress = fx__fsdp_progress_hook;
    m->hooks.user = d;
    return fx_comm_dup(&d->rs, d->world, "reduce_scatter");
}

/* AdamW on this rank's shard: each tensor's part of it, with the tensor's decay. */
static void fx__fsdp_adamw(fx__dist *d, const fx__adamw *o, int64_t t)
{
    const fx__model_layout *lay = &d->m->lay;
    int64_t L = d->m->c.layers;
    for (size_t ti = 0; ti < lay->n; ti++) {
        const fx__model_tensor *tt = &lay->t[ti];
        int64_t u = ti == 0 ? 0 : ti >= 1 + (size_t)L * lay->per_layer ? L + 1 : 1 + (int64_t)(ti - 1) / (int64_t)lay->per_layer;
        size_t a = tt->offset - d->uoff[u], b = a + tt->numel; /* within the unit */
        size_t lo = (size_t)d->rank * d->ush[u], hi = lo + d->ush[u];
        size_t x = a > lo ? a : lo, y = b < hi ? b : hi;
        if (x >= y)
            continue;
        size_t k = d->soff[u] + (x - lo);
        fx__adamw_f32(d->sp + k, d->sg + k, d->sm + k, d->sv + k, (int64_t)(y - x), o,
                      tt->decay ? o->weight_decay : 0.0f, t);
    }
}

/* ---- deterministic slices ----------------------------------------------------------------------- */

/* What the step trains, *n floats: the parameters' gradients, or with LoRA adapters (only they
   train) theirs. */
static float *fx__trained_grads(const fx__model *m, size_t *n)
{
    *n = m->lora ? m->lora->total : m->lay.total;
    return m->lora ? m->lora->grads : m->grads;
}

static void fx__rows_add(float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= 65536)
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* The gradient of `count` slices of one sequence each, starting at sequence first of the
   batch, summed by the left-aligned pairwise tree into row 0 of the stack (loss last). */
static int fx__slices(fx__dist *d, const int32_t *tokens, const int32_t *targets, int64_t first, int64_t count,
                      int64_t T)
{
    fx__model *m = d->m;
    size_t P, R = d->row;
    const float *g = fx__trained_grads(m, &P);
    fx__lora *lora = m->lora;
    const uint64_t drop_step = lora ? lora->drop_step : 0;
    int depth = 0, rc;
    for (int64_t k = 0; k < count; k++) {
        fx__model_zero_grad(m);
        /* Each sequence's dropout masks are the ones a pass over the whole batch draws. */
        if (lora)
            lora->drop_step = drop_step, lora->drop_row = (first + k) * T;
        float l;
        const int32_t *tk = tokens + (first + k) * T, *tg = targets + (first + k) * T;
        if ((rc = fx__model_forward(m, tk, tg, &l, true)) != FX_OK || (rc = fx__model_backward(m)) != FX_OK)
            return rc;
        float *r = d->stack + (size_t)depth * R;
        memcpy(r, g, P * sizeof(float));
        r[P] = l;
        d->stack_n[depth++] = 1;
        while (depth >= 2 && d->stack_n[depth - 1] == d->stack_n[depth - 2]) {
            fx__rows_add(d->stack + (size_t)(depth - 2) * R, d->stack + (size_t)(depth - 1) * R, R);
            d->stack_n[depth - 2] *= 2;
            depth--;
        }
    }
    /* The blocks left are powers of two, largest first: fold them from the right. */
    for (; depth >= 2; depth--)
        fx__rows_add(d->stack + (size_t)(depth - 2) * R, d->stack + (size_t)(depth - 1) * R, R);
    return FX_OK;
}

/* ---- the ranks agree on the run ----------------------------------------------------------------- */

/* A hash of n bytes for telling replicas apart (not against an adversary): four lanes of
   64-bit multiply-xorshift over 8-byte words, so that a model's weights hash at memory speed. */
static uint64_t fx__hash_bytes(const void *p, size_t n, uint64_t seed)
{
    const unsigned char *b = p;
    uint64_t h[4] = {seed ^ 0x9e3779b97f4a7c15u, seed ^ 0xc2b2ae3d27d4eb4fu, seed ^ 0x165667b19e3779f9u,
                     seed ^ 0x27d4eb2f165667c5u};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, b + i + 8 * k, 8);
            h[k] = (h[k] ^ w) * 0x9fb21c651e98df25u;
            h[k] ^= h[k] >> 29;
        }
    uint64_t x = (uint64_t)n;
    for (int k = 0; k < 4; k++)
        x = (x ^ h[k]) * 0x9fb21c651e98df25u, x ^= x >> 32;
    for (; i < n; i++)
        x = (x ^ b[i]) * 0x100000001b3u;
    return x ^ (x >> 31);
}

enum { FX__AGREE_TEXT = 120, FX__AGREE_MAX = 32 };

/* One option in the record the ranks exchange: a hash of its whole value and the value as
   text for messages. The names stay local: every rank builds the same list in the same order. */
typedef struct fx__agree_item {
    uint64_t hash;
    char text[FX__AGREE_TEXT];
} fx__agree_item;

/* The data's item: its message has a form of its own. */
static const char fx__agree_data[] = "the data";

typedef struct fx__agree {
    fx__agree_item it[FX__AGREE_MAX];
    const char *name[FX__AGREE_MAX];
    int n;
} fx__agree;

/* An item whose hash is given (a value larger than its text). */
static void FX__PRINTF(4, 5) fx__agree_put_hash(fx__agree *a, const char *name, uint64_t hash, const char *fmt, ...)
{
    assert(a->n < FX__AGREE_MAX);
    fx__agree_item *it = &a->it[a->n];
    a->name[a->n++] = name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->text, sizeof it->text, fmt, ap);
    va_end(ap);
    it->hash = hash;
}

/* An item whose text is its whole value. */
static void FX__PRINTF(3, 4) fx__agree_put(fx__agree *a, const char *name, const char *fmt, ...)
{
    assert(a->n < FX__AGREE_MAX);
    fx__agree_item *it = &a->it[a->n];
    a->name[a->n++] = name;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it->text, sizeof it->text, fmt, ap);
    va_end(ap);
    it->hash = fx__hash_bytes(it->text, strlen(it->text), 0);
}

/* A float32 by its bits, shown in the fewest digits that read back as it (0.001, not
   0.00100000005). */
static void fx__agree_float(fx__agree *a, const char *name, float v)
{
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    fx__agree_put_hash(a, name, fx__hash_bytes(&bits, sizeof bits, 0), "%s", buf);
}

/* The model's configuration, field by field as files record them (config.c's table; the
   struct has padding): a field added to the table is compared without code here. */
static uint64_t fx__config_hash(const fx_model_config *c)
{
    uint64_t h = 1;
    char v[160];
    for (size_t i = 0; i < fx__config_nfields; i++) {
        const fx__config_field *f = &fx__config_fields[i];
        fx__config_field_format(f, c, v, sizeof v);
        h = fx__hash_bytes(f->key, strlen(f->key) + 1, h);
        h = fx__hash_bytes(v, strlen(v) + 1, h);
    }
    return h;
}

/* Where the run starts: the step, and the sampler's state (a resumed checkpoint's). */
static uint64_t fx__start_hash(const fx__model_train_state *st)
{
    const uint64_t v[] = {(uint64_t)st->step, (uint64_t)st->data_pos, st->rng.seed, st->rng.stream,
                          st->rng.counter, st->rng.buf[0], st->rng.buf[1], st->rng.buf[2], st->rng.buf[3],
                          st->rng.used};
    return fx__hash_bytes(v, sizeof v, 2);
}

/* The record of this rank's run, in the order options are named in when several differ. */
static void fx__agree_build(fx__agree *a, const fx__dist_run *run)
{
    const fx_model_config *c = run->cfg;
    const fx__model_train_state *st = run->st;
    const fx__model_data *d = run->data;
    static const char *const par[] = {"none", "ddp", "fsdp"};
    fx__agree_put(a, "--parallel", "%s", par[run->mode]);
    fx__agree_put_hash(a, "the model (--model, --layers, --dim, --heads, --kv-heads)", fx__config_hash(c),
                       "%s (%lld layers, dim %lld, %lld/%lld heads, vocab %lld, context %lld)", c->arch,
                       (long long)c->layers, (long long)c->dim, (long long)c->heads, (long long)c->kv_heads,
                       (long long)c->vocab, (long long)c->ctx);
    fx__agree_put(a, "--seq", "%lld", (long long)st->seq);
    fx__agree_put(a, "--batch", "%lld", (long long)st->batch);
    fx__agree_put(a, "--accum", "%lld", (long long)st->accum);
    fx__agree_put(a, "--steps", "%lld", (long long)st->steps);
    fx__agree_put(a, "--warmup", "%lld", (long long)st->warmup);
    fx__agree_put(a, "--until", "%lld", (long long)run->until);
    fx__agree_float(a, "--lr", st->lr);
    fx__agree_float(a, "--min-lr", st->min_lr);
    fx__agree_float(a, "--weight-decay", st->weight_decay);
    fx__agree_float(a, "--clip", st->clip);
    fx__agree_float(a, "Adam's beta1", st->beta1);
    fx__agree_float(a, "Adam's beta2", st->beta2);
    fx__agree_put(a, "--seed", "%llu", (unsigned long long)st->seed);
    fx__agree_put(a, "--attn", "%s", st->attn);
    fx__agree_put_hash(a, "--mask-mod", fx__hash_bytes(st->mask_mod, strlen(st->mask_mod), 0), "\"%s\"",
                       st->mask_mod);
    fx__agree_put_hash(a, "--score-mod", fx__hash_bytes(st->score_mod, strlen(st->score_mod), 0), "\"%s\"",
                       st->score_mod);
    if (run->lora) {
        char targets[64];
        fx__lora_targets_format(run->lora->targets, targets, sizeof targets);
        fx__agree_put(a, "--lora", "%lld", (long long)run->lora->rank);
        fx__agree_float(a, "--lora-alpha", run->lora->alpha);
        fx__agree_float(a, "--lora-dropout", run->lora->dropout);
        fx__agree_put(a, "--lora-targets", "%s", targets);
    } else {
        fx__agree_put(a, "--lora", "off");
    }
    fx__agree_put(a, "--dtype", "%s", st->bf16 ? "bf16" : "f32");
    fx__agree_put(a, "--adam-bf16", "%s", st->adam_bf16 ? "on" : "off");
    fx__agree_put(a, "--deterministic", "%s", st->deterministic ? "on" : "off");
    fx__agree_put(a, "--eval-every", "%lld", (long long)run->eval_every);
    fx__agree_put(a, "--eval-batches", "%lld", (long long)run->eval_batches);
    fx__agree_put(a, "--save-every", "%lld", (long long)run->save_every);
    fx__agree_put_hash(a, "the step to start from (--resume)", fx__start_hash(st), "step %lld", (long long)st->step);
    /* The tokens actually trained on (whatever the file is called on each node), and their
       split into training and validation. */
    const int64_t split[] = {d->n, d->n_train, d->docs};
    size_t len = strlen(d->source);
    fx__agree_put_hash(a, fx__agree_data, fx__hash_bytes(split, sizeof split, d->hash), "%s",
                       len < FX__AGREE_TEXT ? d->source : d->source + len - (FX__AGREE_TEXT - 1));
}

int fx__dist_agree(fx_comm *world, const fx__dist_run *run)
{
    if (!world || !run || !run->cfg || !run->st || !run->data)
        return fx__error(FX_EINVAL, "fx__dist_agree: needs a communicator, a configuration, a state and data");
    int size = fx_comm_size(world);
    if (size < 2)
        return FX_OK;
    /* float-aligned storage: the record travels as floats (an all-gather only copies them) */
    _Static_assert(sizeof(fx__agree_item) % sizeof(float) == 0, "the record is whole floats");
    fx__agree *mine = fx__calloc(1, sizeof *mine);
    fx__agree_item *all = fx__calloc((size_t)size * FX__AGREE_MAX, sizeof *all);
    if (!mine || !all) {
        fx__free(mine), fx__free(all);
        return FX_ENOMEM;
    }
    fx__agree_build(mine, run);
    const int64_t n = (int64_t)FX__AGREE_MAX * (int64_t)(sizeof(fx__agree_item) / sizeof(float));
    int rc = fx_comm_all_gather_single(world, (float *)(void *)all, (const float *)(const void *)mine->it, n, NULL);
    /* The first option (in the record's order) on which some rank differs from rank 0. */
    for (int i = 0; rc == FX_OK && i < mine->n; i++) {
        const fx__agree_item *r0 = &all[i];
        int first = -1, others = 0;
        for (int r = 1; r < size; r++) {
            if (all[(size_t)r * FX__AGREE_MAX + i].hash == r0->hash)
                continue;
            if (first < 0)
                first = r;
            else
                others++;
        }
        if (first < 0)
            continue;
        const fx__agree_item *rf = &all[(size_t)first * FX__AGREE_MAX + i];
        char more[64] = "";
        if (others)
            snprintf(more, sizeof more, " (and %d other rank%s)", others, others == 1 ? "" : "s");
        if (mine->name[i] == fx__agree_data) {
            char from[FX__AGREE_TEXT + 8] = "";
            if (strcmp(rf->text, r0->text))
                snprintf(from, sizeof from, " %s", r0->text);
            rc = fx__error(FX_EINVAL,
                           "ranks disagree on the data: rank %d's --data %s differs from rank 0's%s%s (hash "
                           "%016llx, rank 0's %016llx); every rank must train on the same tokens",
                           first, rf->text, from, more, (unsigned long long)rf->hash,
                           (unsigned long long)r0->hash);
        } else if (!strcmp(rf->text, r0->text)) { /* the same summary, another value */
            rc = fx__error(FX_EINVAL, "ranks disagree on %s: rank 0 has %s (hash %016llx), rank %d has %s (hash "
                                      "%016llx)%s",
                           mine->name[i], r0->text, (unsigned long long)r0->hash, first, rf->text,
                           (unsigned long long)rf->hash, more);
        } else {
            rc = fx__error(FX_EINVAL, "ranks disagree on %s: rank 0 has %s, rank %d has %s%s", mine->name[i],
                           r0->text, first, rf->text, more);
        }
    }
    fx__free(mine), fx__free(all);
    return rc;
}

/* The weights (and Adam moments: a resumed checkpoint's) every replica starts from: the same
   options and data with another --model directory or checkpoint at the same path would train
   replicas that no longer match, every step applying one averaged gradient to each. */
static int fx__dist_same_weights(fx__dist *d)
{
    const fx__model *m = d->m;
    if (d->size < 2 || m->gpu || (!m->params && !m->mapped))
        return FX_OK;
    size_t P = m->lay.total;
    uint64_t h = 3;
    if (m->params) {
        h = fx__hash_bytes(m->params, P * sizeof(float), h);
    } else { /* a mapped base (LoRA), tensor by tensor in its file's dtype */
        for (size_t i = 0; i < m->lay.n; i++)
            h = fx__hash_bytes(m->mapped->t[i].data, m->lay.t[i].numel * fx_dtype_size(m->mapped->t[i].dtype), h);
    }
    if (m->lora) {
        const fx__lora *a = m->lora;
        h = fx__hash_bytes(a->params, a->total * sizeof(float), h);
        h = fx__hash_bytes(a->adam_m, a->total * sizeof(float), h);
        h = fx__hash_bytes(a->adam_v, a->total * sizeof(float), h);
    } else if (m->adam) {
        h = fx__hash_bytes(m->adam, 2 * P * sizeof(float), h);
    } else if (m->adam16) {
        h = fx__hash_bytes(m->adam16, 2 * P * sizeof(uint16_t), h);
    }
    uint64_t *all = fx__calloc((size_t)d->size, sizeof *all);
    if (!all)
        return FX_ENOMEM;
    int rc = fx_comm_all_gather_single(d->world, (float *)(void *)all, (const float *)(const void *)&h, 2, NULL);
    for (int r = 1; rc == FX_OK && r < d->size; r++)
        if (all[r] != all[0])
            rc = fx__error(FX_EINVAL,
                           "ranks disagree on the weights they start from (--model or the --resume checkpoint): "
                           "rank %d's differ from rank 0's (hash %016llx, rank 0's %016llx)",
                           r, (unsigned long long)all[r], (unsigned long long)all[0]);
    fx__free(all);
    return rc;
}

/* ---- create / free --------------------------------------------------------------------------------- */

int fx__dist_sum_levels(int64_t slices)
{
    int levels = 0;
    while ((int64_t)1 << levels < slices)
        levels++;
    return levels + 1;
}

int fx__dist_create(fx__dist **out, fx__model *m, fx_comm *world, fx__par mode, bool deterministic, int64_t batch)
{
    if (!out || !m || (!m->grads && !m->lora) || (mode != FX__PAR_NONE && !world) ||
        (mode == FX__PAR_NONE && !deterministic))
        return fx__error(FX_EINVAL, "fx__dist_create: needs a model with gradients, and a communicator for ddp/fsdp");
    int size = world ? fx_comm_size(world) : 1, rank = world ? fx_comm_rank(world) : 0;
    if (batch < 1 || batch % size)
        return fx__error(FX_EINVAL, "--batch %lld is not a multiple of the %d processes (it is the global batch)",
                         (long long)batch, size);
    int64_t local = batch / size;
    if (deterministic && mode == FX__PAR_FSDP && local != 1)
        return fx__error(FX_EINVAL,
                         "--deterministic with fsdp needs one sequence per process per micro-batch (--batch %d "
                         "for %d processes; use --accum for more), not --batch %lld",
                         size, size, (long long)batch);
    if (deterministic && mode == FX__PAR_DDP && size > 1 && (local & (local - 1)))
        return fx__error(FX_EINVAL,
                         "--deterministic needs --batch / processes to be a power of two; --batch %lld over %d "
                         "processes gives %lld",
                         (long long)batch, size, (long long)local);
    if (mode == FX__PAR_FSDP && m->lora)
        return fx__error(FX_EUNSUPPORTED, "--parallel fsdp shards the weights that train, and LoRA's adapters are "
                         "small enough for every process to hold: use --parallel ddp");
    if (mode == FX__PAR_FSDP && m->adam_bf16)
        return fx__error(FX_EUNSUPPORTED, "--parallel fsdp keeps float32 Adam moments; drop --adam-bf16");
    fx__dist *d = fx__calloc(1, sizeof *d);
    if (!d)
        return FX_ENOMEM;
    *d = (fx__dist){.m = m, .world = world, .mode = mode, .det = deterministic, .rank = rank, .size = size,
                    .batch = batch, .local = local};
    int rc = FX_OK;
    if (world && (rc = fx__dist_same_weights(d)) != FX_OK)
        goto fail;
    if (world && deterministic && (rc = fx_comm_set_deterministic(world, true)) != FX_OK)
        goto fail;
    if (deterministic && mode != FX__PAR_FSDP) {
        size_t P;
        (void)fx__trained_grads(m, &P);
        d->row = P + 1;
        d->levels = fx__dist_sum_levels(mode == FX__PAR_NONE ? batch : local);
        d->stack = fx__alloc((size_t)d->levels * d->row * sizeof(float));
        d->acc = fx__alloc(d->row * sizeof(float));
        d->stack_n = fx__calloc((size_t)d->levels, sizeof(int64_t));
        if (!d->stack || !d->acc || !d->stack_n) {
            rc = FX_ENOMEM;
            goto fail;
        }
    } else if (mode == FX__PAR_DDP) {
        d->cap = (int)m->c.layers + 2;
        d->works = fx__calloc((size_t)d->cap, sizeof *d->works);
        if (!d->works) {
            rc = FX_ENOMEM;
            goto fail;
        }
        m->hooks.grad = fx__ddp_hook;
        m->hooks.progress = fx__progress_hook;
        m->hooks.user = d;
    } else if (mode == FX__PAR_FSDP) {
        if ((rc = fx__fsdp_create(d)) != FX_OK)
            goto fail;
    }
    *out = d;
    return FX_OK;
fail:
    fx__dist_free(d);
    return rc;
}

void fx__dist_free(fx__dist *d)
{
    if (!d)
        return;
    /* After a failure MPI may still write the buffers of collectives in flight: leave them. */
    if (d->err)
        return;
    fx__model *m = d->m;
    for (int i = 0; i < d->nworks; i++)
        fx_comm_work_free(d->works[i]);
    for (int b = 0; b < FX__SLOTS; b++) {
        fx_comm_work_free(d->sw[b]);
        fx__free(d->slot[b]);
    }
    fx_comm_work_free(d->w_wte), fx_comm_work_free(d->w_norm);
    fx_comm_work_free(d->w_rs_wte), fx_comm_work_free(d->w_rs_norm);
    fx_comm_free(d->rs);
    if (m->hooks.user == d) {
        m->hooks = (fx__model_hooks){0};
    }
    fx__free(d->works), fx__free(d->stack), fx__free(d->acc), fx__free(d->stack_n);
    fx__free(d->uoff), fx__free(d->lp), fx__free(d->lg), fx__free(d->sp);
    fx__free(d->normp), fx__free(d->normg), fx__free(d->rs_wte), fx__free(d->rs_norm);
    fx__free(d);
}

int fx__dist_status(const fx__dist *d)
{
    return d ? d->err : FX_OK;
}

void fx__dist_set_serial(fx__dist *d, bool on)
{
    d->serial = on;
}

fx__dist_stats fx__dist_last_stats(const fx__dist *d)
{
    return d->last;
}

size_t fx__dist_state_bytes(const fx__dist *d)
{
    const fx__model *m = d->m;
    if (d->mode != FX__PAR_FSDP)
        return 4 * m->lay.total * sizeof(float);
    int64_t L = m->c.layers;
    size_t N = (size_t)d->size;
    size_t floats = 4 * d->S + 2 * N * (d->ush[0] + d->ush[L + 1]) + FX__SLOTS * N * d->maxsh + d->ush[0] +
                    d->ush[L + 1];
    return floats * sizeof(float);
}

size_t fx__dist_shard_bytes(const fx__dist *d)
{
    return d->mode == FX__PAR_FSDP ? 4 * d->S * sizeof(float) : fx__dist_state_bytes(d);
}

size_t fx__dist_layer_bytes(const fx__dist *d)
{
    return d->mode == FX__PAR_FSDP ? (size_t)d->size * d->maxsh * sizeof(float) : 0;
}

/* ---- the step ------------------------------------------------------------------------------------------ */

/* The clip-and-average scale of fx__model_train_step for a gradient sum over `parts` means. */
static void fx__finish(fx__dist *d, fx__model_train_state *s, double sumsq, double parts, float loss,
                       fx__model_step_info *info)
{
    double norm = sqrt(sumsq) / parts, scale = 1.0 / parts;
    if (s->clip > 0.0f && norm > s->clip)
        scale *= s->clip / norm;
    float lr = fx__lr_schedule(s->step, s->warmup, s->steps, s->lr, s->min_lr);
    fx__adamw o = {.lr = lr, .beta1 = s->beta1, .beta2 = s->beta2, .eps = 1e-8f, .weight_decay = s->weight_decay,
                   .grad_scale = (float)scale};
    /* Every rank sees the same reduced loss and norm, so all skip a non-finite step alike
       (fx__model_train_step's rule). */
    if (isfinite(loss) && isfinite(norm)) {
        if (d->mode == FX__PAR_FSDP)
            fx__fsdp_adamw(d, &o, s->step + 1);
        else
            fx__model_adamw(d->m, &o, s->step + 1);
        s->step++;
    }
    if (info)
        *info = (fx__model_step_info){.loss = loss, .lr = lr, .grad_norm = (float)norm};
}

int fx__dist_step(fx__dist *d, const fx__model_data *data, fx__model_train_state *s, int32_t *tokens,
                  int32_t *targets, fx__model_step_info *info, bool *stop)
{
    fx__model *m = d->m;
    if (s->batch != d->batch)
        return fx__error(FX_EINVAL, "fx__dist_step: batch %lld, but set up for %lld", (long long)s->batch,
                         (long long)d->batch);
    if (d->err)
        return fx__error(d->err, "%s", fx_last_error());
    d->cur = (fx__dist_stats){0};
    d->phase = 0;
    int64_t T = s->seq, first = (int64_t)d->rank * d->local;
    int rc = fx__model_set_batch(m, d->det && d->mode != FX__PAR_FSDP ? 1 : d->local, T);
    if (rc)
        return rc;
    double loss = 0.0, sumsq = 0.0, parts;
    float lossf = 0.0f;
    if (d->det && d->mode != FX__PAR_FSDP) {
        /* Per micro-batch: this rank's slices summed by the tree, the ranks' sums by the same
           tree (the deterministic all-reduce), then added to the step's sum. */
        size_t R = d->row, P;
        float *g = fx__trained_grads(m, &P);
        memset(d->acc, 0, R * sizeof(float));
        for (int64_t a = 0; a < s->accum; a++) {
            fx__model_data_batch(data, &s->rng, s->batch, T, tokens, targets);
            s->data_pos += s->batch;
            if ((rc = fx__slices(d, tokens, targets, first, d->local, T)) != FX_OK)
                return rc;
            if (d->size > 1 && (rc = fx__all_reduce(d, d->stack, (int64_t)R)) != FX_OK)
                return rc;
            fx__rows_add(d->acc, d->stack, R);
        }
        memcpy(g, d->acc, P * sizeof(float));
        lossf = d->acc[P];
        parts = (double)(s->accum * s->batch);
    } else {
        if (d->mode == FX__PAR_FSDP) {
            memset(d->sg, 0, d->S * sizeof(float));
            if ((rc = fx__fsdp_begin(d)) != FX_OK)
                return rc;
        } else {
            fx__model_zero_grad(m);
        }
        for (int64_t a = 0; a < s->accum; a++) {
            fx__model_data_batch(data, &s->rng, s->batch, T, tokens, targets);
            s->data_pos += s->batch;
            if (d->mode == FX__PAR_FSDP) {
                memset(m->grads, 0, d->ush[0] * (size_t)d->size * sizeof(float));
                memset(d->normg, 0, d->ush[m->c.layers + 1] * (size_t)d->size * sizeof(float));
            }
            d->reducing = a == s->accum - 1;
            d->phase = d->mode == FX__PAR_FSDP && a == 0 ? 0 : 1; /* FSDP: until layer 0 is in */
            if (m->lora) /* this rank's rows of the batch draw their own dropout masks */
                m->lora->drop_row = first * T;
            float l;
            if ((rc = fx__model_forward(m, tokens + first * T, targets + first * T, &l, true)) != FX_OK)
                return d->err ? d->err : rc;
            if ((rc = fx__model_backward(m)) != FX_OK || d->err)
                return d->err ? d->err : rc;
            if (d->reducing)
                d->phase = 2;
            if (d->mode == FX__PAR_FSDP && (rc = fx__rs_finish_all(d)) != FX_OK)
                return rc;
            if (d->det) { /* fsdp: one slice per rank, the ranks' losses by the tree */
                if ((rc = fx__all_reduce(d, &l, 1)) != FX_OK)
                    return rc;
                lossf += l;
            }
            loss += l;
        }
        for (int i = 0; i < d->nworks; i++)
            if ((rc = fx__wait(d, &d->works[i])) != FX_OK)
                return rc;
        d->nworks = 0;
        parts = (double)(s->accum * (d->det ? s->batch : d->size));
    }
    /* The squared gradient norm: whole on every rank, or summed from the shards in rank order. */
    if (d->mode == FX__PAR_FSDP) {
        double part = 0.0;
        for (size_t i = 0; i < d->S; i++)
            part += (double)d->sg[i] * d->sg[i];
        double all[64], *allp = d->size <= 64 ? all : fx__alloc((size_t)d->size * sizeof(double));
        if (!allp)
            return FX_ENOMEM;
        float pf[2];
        memcpy(pf, &part, sizeof part);
        double t0 = fx__seconds();
        rc = fx_comm_all_gather_single(d->world, (float *)allp, pf, 2, NULL);
        fx__waited(d, t0);
        if (!fx__fail(d, fx__started(d, rc, 8.0 * d->size)))
            for (int r = 0; r < d->size; r++)
                sumsq += allp[r];
        if (allp != all)
            fx__free(allp);
        if (d->err)
            return d->err;
    } else {
        double n = fx__model_grad_norm(m);
        sumsq = n * n;
    }
    /* The loss for printing, and whether any rank was asked to stop. */
    float fin[2] = {(float)loss, stop && *stop ? 1.0f : 0.0f};
    if (d->size > 1 && (rc = fx__all_reduce(d, fin, 2)) != FX_OK)
        return rc;
    if (stop)
        *stop = fin[1] > 0.0f;
    float shown = d->det ? (float)((double)lossf / parts) : (float)((double)fin[0] / (double)(s->accum * d->size));
    fx__finish(d, s, sumsq, parts, shown, info);
    d->last = d->cur;
    return FX_OK;
}

int fx__dist_eval(fx__dist *d, const fx__model_data *data, int64_t batches, int64_t seq, int32_t *tokens,
                  int32_t *targets, float *loss)
{
    fx__model *m = d->m;
    int rc = fx__model_set_batch(m, d->local, seq);
    if (rc)
        return rc;
    if (d->mode == FX__PAR_FSDP && (rc = fx__fsdp_begin(d)) != FX_OK)
        return rc;
    int64_t first = (int64_t)d->rank * d->local;
    double sum = 0.0;
    for (int64_t i = 0; i < batches; i++) {
        fx__model_data_val_batch(data, i, d->batch, seq, tokens, targets);
        float l;
        if ((rc = fx__model_forward(m, tokens + first * seq, targets + first * seq, &l, false)) != FX_OK)
            return d->err ? d->err : rc;
        sum += l;
    }
    float x = (float)sum;
    if (d->size > 1 && (rc = fx__all_reduce(d, &x, 1)) != FX_OK)
        return rc;
    *loss = d->size > 1 ? (float)((double)x / (double)(d->size * batches)) : (float)(sum / (double)batches);
    return FX_OK;
}

/* ---- checkpoints ------------------------------------------------------------------------------------- */

int fx__dist_full(fx__dist *d, fx__model **full)
{
    *full = NULL;
    if (d->mode != FX__PAR_FSDP) {
        *full = d->rank == 0 ? d->m : NULL; /* every rank holds it; rank 0 writes */
        return FX_OK;
    }
    fx__model *m = d->m, *f = NULL;
    int rc = FX_OK;
    if (d->rank == 0) {
        if ((rc = fx__model_create(&f, &m->c, 0)) != FX_OK || (rc = fx__model_alloc_train(f)) != FX_OK) {
            fx__model_free(f);
            return rc;
        }
        f->mask = m->mask, f->window = m->window;
        if ((rc = fx__model_set_mods(f, m->score_src, m->mask_src)) != FX_OK) {
            fx__model_free(f);
            return rc;
        }
    }
    size_t N = (size_t)d->size, P = m->lay.total, bigsh = d->ush[0] > d->maxsh ? d->ush[0] : d->maxsh;
    float *tmp = fx__alloc(bigsh * N * sizeof(float));
    if (!tmp) {
        fx__model_free(f);
        return FX_ENOMEM;
    }
    const float *src[3] = {d->sp, d->sm, d->sv};
    for (int64_t u = 0; u < d->units && !rc; u++)
        for (int k = 0; k < 3 && !rc; k++) {
            rc = fx_comm_all_gather_single(d->world, tmp, src[k] + d->soff[u], (int64_t)d->ush[u], NULL);
            if (fx__fail(d, rc) || !f)
                continue;
            float *dst = k == 0 ? f->params : k == 1 ? f->adam : f->adam + P;
            /* Rank r's block holds the unit's elements [r * ush, (r+1) * ush): contiguous. */
            memcpy(dst + d->uoff[u], tmp, d->unum[u] * sizeof(float));
        }
    fx__free(tmp);
    if (rc) {
        fx__model_free(f);
        return rc;
    }
    *full = f;
    return FX_OK;
}

void fx__dist_full_release(fx__dist *d, fx__model *full)
{
    if (full && full != d->m)
        fx__model_free(full);
}
