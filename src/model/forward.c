/* The forward pass: attention through flex or the reference, the views of a layer's saved
   activations (parked ones included), one layer, and the whole model with its loss. */
#include "model_internal.h"
#include "core/gemv.h"
#include "attention/internal.h"
#include "lce/lce_internal.h"

#include <flexc/mod.h>

#include <math.h>
#include <string.h>

/* ---- attention through flex or the reference ------------------------------------------------------- */

/* Causality as a score modifier, for the dense path (no block mask: every block computed). */
static void fx__score_causal(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0,
                             int64_t kv0, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            if (kv0 + j > q0 + i)
                s[i * ld + j] = -INFINITY;
}

static void fx__score_causal_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b,
                                  int64_t h, int64_t q0, int64_t kv0, const void *ctx)
{
    (void)s, (void)b, (void)h, (void)ctx;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nkv; j++)
            if (kv0 + j > q0 + i)
                g[i * ld + j] = 0.0f;
}

static fx_attention fx__flex_desc(const fx__attn_call *c)
{
    fx_attention a = {.B = c->B, .Hq = c->Hq, .Hkv = c->Hkv, .Lq = c->Lq, .Lkv = c->Lkv, .D = c->D, .Dv = c->D,
                      .scale = 0.0f, .q_offset = c->q_offset, .mask = c->bm};
    if (c->dense_causal) {
        a.score_mod = fx__score_causal;
        a.score_mod_grad = fx__score_causal_grad;
    }
    if (c->score) {
        a.score_mod = fx_mod_score;
        a.score_mod_grad = fx_mod_score_grad;
        a.score_ctx = c->score;
    }
    return a;
}

static fx__attn_ref fx__ref_desc(const fx__attn_call *c)
{
    return (fx__attn_ref){.B = c->B, .Hq = c->Hq, .Hkv = c->Hkv, .Lq = c->Lq, .Lkv = c->Lkv, .D = c->D,
                          .q_offset = c->q_offset, .mask = c->fn, .ctx = c->ctx};
}

/* Training in bf16 (params16 set) takes the attention's products in bfloat16 too. */
static unsigned fx__attn_flags(const fx__model *m) { return m->params16 || m->map_bf16 ? FX__ATTN_BF16 : 0u; }

int fx__attn_fwd(const fx__model *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                        float *out, float *lse)
{
    const double t0 = fx__op_begin();
    int rc = FX_OK;
    if (m->attn_impl == FX__MODEL_ATTN_REF) {
        fx__attn_ref r = fx__ref_desc(c);
        fx__attn_ref_forward(&r, q, k, v, out, lse);
    } else {
        fx_attention a = fx__flex_desc(c);
        rc = fx__flex_attention_with(&a, fx__attn_flags(m), q, k, v, out, lse);
    }
    fx__op_end(FX__OP_ATTN_FWD, t0);
    return rc;
}

int fx__attn_bwd(const fx__model *m, const fx__attn_call *c, const float *q, const float *k, const float *v,
                        const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    const double t0 = fx__op_begin();
    int rc = FX_OK;
    if (m->attn_impl == FX__MODEL_ATTN_REF) {
        fx__attn_ref r = fx__ref_desc(c);
        fx__attn_ref_backward(&r, q, k, v, out, lse, dout, dq, dk, dv);
    } else {
        fx_attention a = fx__flex_desc(c);
        rc = fx__flex_attention_backward_with(&a, fx__attn_flags(m), q, k, v, out, lse, dout, dq, dk, dv);
    }
    fx__op_end(FX__OP_ATTN_BWD, t0);
    return rc;
}

/* The training-shape attention call; builds the block mask when the flex path needs one
   (the backward pass reuses the forward's). */
int fx__train_attn(fx__model *m, fx__attn_call *c, bool build)
{
    int64_t hd = m->c.head_dim;
    m->mctx.sliding.window = m->window;
    m->mctx.document = (fx_mask_document_ctx){.doc_ids = m->doc, .len = m->T, .batch_stride = m->T};
    *c = (fx__attn_call){.B = m->B, .Hq = m->c.heads, .Hkv = m->c.kv_heads, .Lq = m->T, .Lkv = m->T, .D = hd,
                         .score = m->score_mod};
    c->fn = fx__model_mask_fn(m->mask, &m->mctx, &c->ctx);
    if (m->mask_mod)
        c->fn = fx_mod_mask, c->ctx = m->mask_mod;
    if (m->attn_impl == FX__MODEL_ATTN_REF)
        return m->score_mod ? fx__error(FX_EUNSUPPORTED, "a score mod runs through flex attention, not the "
                                                         "reference")
                            : FX_OK;
    if (m->mask_mod) {
        /* Built once per shape (fx__model_set_batch and fx__model_set_mods drop it), per batch
           row or head only when the mods read b or h. */
        if (!m->bmask || !m->bmask_of_mod) {
            fx_block_mask_free(m->bmask);
            m->bmask = NULL;
            int rc = fx_block_mask_create_mod(&m->bmask, m->mask_mod, m->mods_b ? m->B : 1,
                                              m->mods_h ? m->c.heads : 1, m->T, m->T, 0, 0);
            if (rc)
                return fx__error_context(rc, "attention mask mod");
            m->bmask_of_mod = true;
        }
        c->bm = m->bmask;
        return FX_OK;
    }
    if (m->mask == FX__MODEL_MASK_CAUSAL_DENSE && m->score_mod)
        return fx__error(FX_EUNSUPPORTED, "the dense baseline's causality is a score modifier: it takes no score "
                                          "mod (use the causal mask)");
    if (m->mask == FX__MODEL_MASK_CAUSAL_DENSE) {
        c->dense_causal = true;
        return FX_OK;
    }
    /* Document masks change with every batch; the others only with the shape. */
    bool stale = !m->bmask || m->bmask_of_mod || m->bmask_mask != m->mask || m->bmask_window != m->window;
    if ((build && m->mask == FX__MODEL_MASK_DOCUMENT) || stale) {
        fx_block_mask_free(m->bmask);
        m->bmask = NULL;
        int64_t Bm = m->mask == FX__MODEL_MASK_DOCUMENT ? m->B : 1;
        int rc = fx_block_mask_create(&m->bmask, c->fn, c->ctx, Bm, 1, m->T, m->T, 0, 0);
        if (rc)
            return fx__error_context(rc, "attention mask");
        m->bmask_mask = m->mask;
        m->bmask_window = m->window;
        m->bmask_of_mod = false;
    }
    c->bm = m->bmask;
    return FX_OK;
}

/* One layer's activations (all but its input and output) carved from base in slot order;
   returns the floats used. */
static size_t fx__slot_carve(fx__layer_acts *x, float *base, const fx__model *m)
{
    const fx_model_config *c = &m->c;
    size_t N = (size_t)(m->B * m->T), C = (size_t)c->dim, F = (size_t)c->ffn, Hq = (size_t)c->heads;
    size_t hd = (size_t)c->head_dim, QD = Hq * hd, KD = (size_t)c->kv_heads * hd, off = 0;
#define FX__SLOT(field, n) (x->field = base ? base + off : NULL, off += ((n) + 15) / 16 * 16)
    FX__SLOT(xn1, N * C);
    FX__SLOT(rstd1, N);
    FX__SLOT(q, N * QD);
    FX__SLOT(k, N * KD);
    FX__SLOT(v, N * KD);
    FX__SLOT(att, N * QD);
    FX__SLOT(lse, N * Hq);
    FX__SLOT(resm, N * C);
    FX__SLOT(xn2, N * (QD > C ? QD : C));
    FX__SLOT(rstd2, N);
    FX__SLOT(h13, N * 2 * F);
#undef FX__SLOT
    return off;
}

/* With recompute, a step whose gradient buffer starts clear can park layer l's activations
   (l >= 1) in the gradient memory of layer l-1: the backward pass reaches layer l-1's
   gradients only after it is done with layer l, and clears what was parked just before.
   The activations then need no recomputation, for no memory beyond the recompute slot
   (layer 0's). The residual stream entering layer l goes after them, and the final norm's
   input in layer L-1's region. Where a region is too small for this (many tokens per step
   for the model's size), layers are recomputed as usual. */
static float *fx__park_base(const fx__model *m, int64_t l)
{
    float *g = m->grads + fx__layer_first(m, l - 1)->offset;
    return g + ((16 - ((uintptr_t)g / sizeof(float)) % 16) % 16); /* 64-byte aligned, as fx__alloc */
}

static bool fx__park_fits(const fx__model *m)
{
    fx__layer_acts x;
    size_t region = fx__layer_first(m, 1)->offset - fx__layer_first(m, 0)->offset;
    size_t stream = ((size_t)(m->B * m->T * m->c.dim) + 15) / 16 * 16;
    return m->c.layers > 1 && fx__slot_carve(&x, NULL, m) + stream + 16 <= region;
}

/* The residual stream entering layer l (l == layers: the final norm's input): parked, or
   in the activation buffer; a forward pass without gradients keeps only two, in turn. */
float *fx__res_at(const fx__model *m, const fx__acts *a, int64_t l)
{
    int64_t NC = m->B * m->T * m->c.dim;
    if (m->park.acts_parked && l >= 1) {
        fx__layer_acts x;
        return fx__park_base(m, l) + (l == m->c.layers ? 0 : fx__slot_carve(&x, NULL, m));
    }
    return a->res + (m->park.res_two ? l % 2 : l) * NC;
}

/* Clears what is parked in layer l's gradient memory (layer l+1's activations and input,
   or the final norm's input when l is the last layer), before its gradients go there. */
void fx__park_clear(const fx__model *m, const fx__acts *a, int64_t l)
{
    float *region = fx__layer_base(m, true, l);
    float *end = fx__res_at(m, a, l + 1) + m->B * m->T * m->c.dim;
    memset(region, 0, (size_t)(end - region) * sizeof(float));
}

fx__layer_acts fx__layer_acts_at(const fx__model *m, const fx__acts *a, int64_t l)
{
    const fx_model_config *c = &m->c;
    int64_t N = m->B * m->T, C = c->dim, F = c->ffn, Hq = c->heads, hd = c->head_dim, QD = Hq * hd;
    int64_t KD = c->kv_heads * hd, s = m->recompute ? 0 : l;
    if (m->park.acts_parked && l >= 1) {
        fx__layer_acts x = {.res = fx__res_at(m, a, l), .out = fx__res_at(m, a, l + 1)};
        fx__slot_carve(&x, fx__park_base(m, l), m);
        return x;
    }
    return (fx__layer_acts){.res = fx__res_at(m, a, l), .xn1 = a->xn1 + s * N * C, .rstd1 = a->rstd1 + s * N,
                            .q = a->q + s * N * QD, .k = a->k + s * N * KD, .v = a->v + s * N * KD,
                            .att = a->att + s * N * QD, .lse = a->lse + s * N * Hq, .resm = a->resm + s * N * C,
                            .xn2 = a->xn2 + s * N * (QD > C ? QD : C), .rstd2 = a->rstd2 + s * N,
                            .h13 = a->h13 + s * N * 2 * F, .out = fx__res_at(m, a, l + 1)};
}

/* The training batch's attention, as fx__layer_run calls it. */
typedef struct train_attn {
    const fx__model *m;
    const fx__attn_call *call;
    int64_t l;
} train_attn;

static int train_attn_run(void *ctx, const fx__layer_io *io)
{
    const train_attn *t = ctx;
    const int rc = fx__attn_fwd(t->m, t->call, io->q.p, io->k.p, io->v.p, io->att, io->lse);
    return rc ? fx__error_context(rc, "layer %lld attention", (long long)t->l) : FX_OK;
}

/* Layer l from its input res[l]; writes res[l+1] when write_out (a recomputation for the
   backward pass does not: the stream is already there, bit for bit). The activations the
   backward pass reads are kept in x; q, k, v come out of one product where wq, wk, wv lie
   one after another (the training layout), and a token's q, k and v side by side in a row
   of work. */
int fx__layer_forward(fx__model *m, const fx__acts *a, const fx__attn_call *call, int64_t l, bool write_out)
{
    const fx_model_config *c = &m->c;
    const int64_t T = m->T, hd = c->head_dim;
    const fx__layer_acts x = fx__layer_acts_at(m, a, l);
    const fx__layer_w W = fx__model_on_map(m) ? fx__layer_w_decode(m, l, m->map_tile) : fx__layer_w_train(m, l);
    const fx__layer_rows r = {.B = m->B, .T = T};
    const fx__layer_io io = {
        .in = x.res, .mid = x.resm, .out = write_out ? x.out : NULL, .xn1 = x.xn1, .rstd1 = x.rstd1,
        .xn2 = x.xn2, .rstd2 = x.rstd2, .qkv = a->work,
        .q = {x.q, T * hd, c->heads * T * hd}, .k = {x.k, T * hd, c->kv_heads * T * hd},
        .v = {x.v, T * hd, c->kv_heads * T * hd}, .att = x.att, .lse = x.lse, .h13 = x.h13, .work = a->work};
    train_attn t = {m, call, l};
    return fx__layer_run(&W, &r, &io, train_attn_run, &t);
}

/* Tokens per chunk of the fused loss. Each chunk reads the embedding twice (logits, then
   d(h)) and its gradient once, so at a GPT-2 vocabulary the number of chunks, not the
   arithmetic, sets the loss's time: the loss's automatic tile (under 1/32 of the logits)
   would take 16 rows at a time. A tile of at most 26 MB lets the 256 tokens of a B=4,
   T=64 step go in two chunks (a third of the time of sixteen); the chunks are made equal,
   so none is a sliver of a few rows. */
int64_t fx__loss_chunk(int64_t N, int64_t V)
{
    int64_t rows = (int64_t)(26u << 20) / (4 * V);
    rows = rows < 16 ? 16 : rows;
    int64_t chunks = (N + rows - 1) / rows;
    return (N + chunks - 1) / chunks;
}

/* The batch's tokens and targets checked against the vocabulary and copied into m (no targets:
   every one ignored), and each token's document id (the model's first eos id, the one the
   data loader puts between documents, closes its document). */
static int forward_inputs(fx__model *m, const int32_t *tokens, const int32_t *targets)
{
    const fx_model_config *c = &m->c;
    const int64_t B = m->B, T = m->T, N = B * T, V = c->vocab;
    for (int64_t i = 0; i < N; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return fx__error(FX_ERANGE, "token[%lld] = %d is outside [0, %lld)", (long long)i, tokens[i], (long long)V);
        if (targets && targets[i] != -100 && (targets[i] < 0 || targets[i] >= V))
            return fx__error(FX_ERANGE, "target[%lld] = %d is outside [0, %lld)", (long long)i, targets[i],
                             (long long)V);
    }
    memcpy(m->tokens, tokens, (size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        m->targets[i] = targets ? targets[i] : -100;
    const int32_t sep = c->n_eos ? c->eos[0] : -1;
    for (int64_t b = 0; b < B; b++) {
        int64_t d = 0;
        for (int64_t t = 0; t < T; t++) {
            m->doc[b * T + t] = d;
            d += tokens[b * T + t] == sep;
        }
    }
    return FX_OK;
}

/* The LM head of a mapped file (the embedding when tied), in its dtype. */
static fx__model_weight map_head(const fx__model *m)
{
    return fx__map_t(m, m->c.tied_embeddings ? 0 : m->lay.n - 1);
}

/* The mean cross-entropy of xnf's rows against m->targets through a mapped head in its dtype
   (the head gets no gradient): chunks of fx__loss_chunk rows, their logits by fx__linear_dt
   (BF16 / F16 widened a tile of rows at a time), each row's log-sum-exp in float64 in one
   order, and with grad d(xnf) = (softmax - onehot) / count times the head (fx__linear_dt_t). */
static int loss_mapped(fx__model *m, const fx__acts *a, bool grad, float *out)
{
    const int64_t N = m->B * m->T, C = m->c.dim, V = m->c.vocab, rows = fx__loss_chunk(N, V);
    const fx__model_weight w = map_head(m);
    int64_t count = 0;
    for (int64_t n = 0; n < N; n++)
        count += m->targets[n] != -100;
    float *lg = fx__alloc((size_t)(rows * V + rows) * sizeof(float));
    if (!lg)
        return fx__error_context(FX_ENOMEM, "loss");
    float *rl = lg + rows * V;
    double total = 0.0;
    for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t nr = N - r0 < rows ? N - r0 : rows;
        if (m->map_bf16)
            fx__model_head16_logits(m, lg, a->xnf + r0 * C, w.data, w.dtype, nr, rows);
        else
            fx__linear_dt(lg, V, a->xnf + r0 * C, w.data, w.dtype, nr, C, V, false, m->map_tile);
        /* Each row's log-sum-exp and gradient by the fused loss's row kernels (vectorised,
           each row alone: the same bits at any thread count). */
        const fx__lce_row_kernels *rk = fx__lce_row_kernels_now();
        const float inv = count ? (float)(1.0 / (double)count) : 0.0f;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nr; i++) {
            float *z = lg + i * V;
            const int32_t t = m->targets[r0 + i];
            if (t == -100) {
                rl[i] = 0.0f;
                if (grad)
                    memset(z, 0, (size_t)V * sizeof(float));
                continue;
            }
            fx__lce_stat st = {.m = -INFINITY};
            rk->stats(z, V, NULL, 0.0f, &st);
            const double lse = (double)st.m + log(st.s);
            rl[i] = (float)(lse - (double)z[t]);
            if (grad) {
                rk->grad(z, V, (float)lse, inv, 0.0f, 0.0f);
                z[t] -= inv;
            }
        }
        for (int64_t i = 0; i < nr; i++)
            total += rl[i];
        if (grad && m->map_bf16)
            fx__model_head16_dx(m, a->dxn + r0 * C, lg, w.data, w.dtype, nr, rows);
        else if (grad)
            fx__linear_dt_t(a->dxn + r0 * C, lg, V, w.data, w.dtype, nr, C, V, false, m->map_tile);
    }
    fx__free(lg);
    *out = count ? (float)(total / (double)count) : 0.0f;
    return FX_OK;
}

/* forward_loss's work, untimed. */
static int loss_call(fx__model *m, const fx__acts *a, bool grad, float *out)
{
    if (fx__model_on_map(m))
        return loss_mapped(m, a, grad, out);
    const int64_t N = m->B * m->T, C = m->c.dim, V = m->c.vocab;
    const float *head = fx__model_head(m, false);
    float *dwte = grad && !m->lora ? fx__model_head(m, true) : NULL, *dxnf = grad ? a->dxn : NULL;
    if (m->loss_impl == FX__MODEL_LOSS_UNFUSED) {
        *out = fx__loss_unfused(a->logits, a->rowloss, a->xnf, head, m->targets, N, C, V, dxnf, dwte);
        return FX_OK;
    }
    fx_lce p = {.N = N, .D = C, .V = V, .ignore_index = -100, .reduction = FX_REDUCTION_MEAN,
                .chunk = fx__loss_chunk(N, V)};
    int rc;
    if (m->params16) {
        /* bf16: the loss's products read the final norm's output rounded to bfloat16 and the
           head's bfloat16 copy: as they are on the pair route, widened into the scratch for
           the float32 route's kernels. */
        fx__bf16_mat h = fx__bf16_of_f32(a->xnf), w = fx__bf16_of(m->params16 + (head - m->params));
        if (!fx__lce_bf16_pairs()) {
            float *h16 = m->bf16_ws, *w16 = m->bf16_ws + N * C;
            fx__bf16_pack(h16, h, N, C, C);
            fx__bf16_pack(w16, w, V, C, C);
            h = fx__bf16_of_f32(h16), w = fx__bf16_of_f32(w16);
        }
        rc = fx__linear_cross_entropy_bf16(&p, h, w, NULL, m->targets, out, NULL, dxnf, dwte, NULL);
    } else {
        rc = fx_linear_cross_entropy(&p, a->xnf, head, NULL, m->targets, out, NULL, dxnf, dwte, NULL);
    }
    return rc ? fx__error_context(rc, "loss") : FX_OK;
}

/* The loss of the final norm's output a->xnf against m->targets (*out), and with grad its
   gradients: the head's (accumulated) and a->dxn's (overwritten); timed as one op by the
   op trace (core.h). */
static int forward_loss(fx__model *m, const fx__acts *a, bool grad, float *out)
{
    const double t0 = fx__op_begin();
    const int rc = loss_call(m, a, grad, out);
    fx__op_end(FX__OP_LOSS, t0);
    return rc;
}

int fx__model_forward(fx__model *m, const int32_t *tokens, const int32_t *targets, float *loss, bool grad)
{
    if (m && m->device && (m->score_mod || m->mask_mod))
        return fx__error(FX_EUNSUPPORTED, "attention mods run on the CPU only, not on %s", m->device->name);
    if (m && m->device)
        return m->device->forward(m, tokens, targets, loss, grad);
    if (!m || !tokens || !m->acts)
        return fx__error(FX_EINVAL, "fx__model_forward: no model, tokens or batch shape (fx__model_set_batch)");
    if (grad && ((!m->grads && !m->lora) || !targets))
        return fx__error(FX_EINVAL, "fx__model_forward: gradients need targets and fx__model_alloc_train (or adapters)");
    if (m->params16 && m->loss_impl == FX__MODEL_LOSS_UNFUSED)
        return fx__error(FX_EUNSUPPORTED, "bf16 matrix products use the fused loss (not the unfused one)");
    int rc = forward_inputs(m, tokens, targets);
    if (rc)
        return rc;
    const fx_model_config *c = &m->c;
    const int64_t N = m->B * m->T, C = c->dim;
    if (fx__model_on_map(m) && !m->map_tile) {
        /* The widening scratch of the mapped products: FX__WIDEN_TILE rows of the widest input. */
        int64_t I = c->dim > c->heads * c->head_dim ? c->dim : c->heads * c->head_dim;
        I = c->ffn > I ? c->ffn : I;
        if (!(m->map_tile = fx__alloc((size_t)(FX__WIDEN_TILE * I) * sizeof(float))))
            return fx__error_context(FX_ENOMEM, "mapped weights' scratch");
    }
    fx__acts a;
    fx__acts_carve(&a, m->acts, c, m->B, m->T, m->loss_impl == FX__MODEL_LOSS_UNFUSED, m->recompute);
    fx__attn_call call;
    m->grad_ready = false;
    if ((rc = fx__model_bf16_ws_ensure(m)) != FX_OK || (rc = fx__train_attn(m, &call, true)) != FX_OK)
        return rc;

    /* Parking needs gradient memory known to be clear and laid out flat, and no hooks that
       might read it (multi-process training). */
    m->park.acts_parked = grad && m->recompute && m->grads_zero && !m->lora && !fx__model_hooks_any(&m->hooks) &&
                     fx__park_fits(m);
    if (m->park.acts_parked)
        m->grads_zero = false;
    m->park.res_two = !grad && m->recompute;
    if (m->lora) {
        /* Dropout only with gradients, a new mask each such pass (the backward draws it
           again); the backward's scratch for N rows. */
        m->lora->training = grad;
        m->lora->kept_rows = 0;
        if (grad) {
            m->lora->drop_step++;
            if ((rc = fx__lora_scratch(m->lora, fx__lora_scratch_floats(m->lora, c, N))) != FX_OK)
                return fx__error_context(rc, "LoRA scratch");
            m->lora->kept_rows = N;
        }
    }
    if (fx__model_on_map(m)) {
        /* The embedding's rows widened from the file. */
        float *res = fx__res_at(m, &a, 0);
        const fx__model_weight wte = fx__map_t(m, 0);
        for (int64_t n = 0; n < N; n++)
            fx__widen_rows(res + n * C, wte.data, wte.dtype, tokens[n], tokens[n] + 1, C);
    } else {
        fx__embed_forward(fx__res_at(m, &a, 0), tokens, m->params, N, C);
    }
    for (int64_t l = 0; l < c->layers; l++)
        if ((rc = fx__layer_hook(m, l, false)) != FX_OK || (rc = fx__layer_forward(m, &a, &call, l, true)) != FX_OK)
            return rc;
    if ((rc = fx__layer_hook(m, c->layers, false)) != FX_OK)
        return rc;
    fx__rmsnorm_forward(a.xnf, a.rstdf, fx__res_at(m, &a, c->layers), fx__final_norm_w(m), N, C, c->norm_eps);
    if (!targets)
        return FX_OK;
    float l_out;
    if ((rc = forward_loss(m, &a, grad, &l_out)) != FX_OK)
        return rc;
    m->grad_ready = grad;
    if (grad)
        m->grads_zero = false;
    if (loss)
        *loss = l_out;
    return FX_OK;
}


void fx__model_logits(const fx__model *m, float *logits, bool last_only)
{
    const fx_model_config *c = &m->c;
    int64_t B = m->B, T = m->T, C = c->dim, V = c->vocab;
    fx__acts a;
    fx__acts_carve(&a, m->acts, c, B, T, m->loss_impl == FX__MODEL_LOSS_UNFUSED, m->recompute);
    if (fx__model_on_map(m)) {
        const fx__model_weight w = map_head(m);
        for (int64_t b = 0; b < B; b++) {
            const int64_t t0 = last_only ? T - 1 : 0, n = last_only ? 1 : T;
            fx__linear_dt(logits + (last_only ? b : b * T) * V, V, a.xnf + (b * T + t0) * C, w.data, w.dtype, n, C,
                          V, false, m->map_tile);
        }
        return;
    }
    const float *head = fx__model_head(m, false);
    if (!last_only) {
        fx__linear(logits, a.xnf, head, B * T, C, V, false);
        return;
    }
    for (int64_t b = 0; b < B; b++)
        fx__linear(logits + b * V, a.xnf + (b * T + T - 1) * C, head, 1, C, V, false);
}
