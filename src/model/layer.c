/* One layer of the model, run the same way by training and by decoding: the attention's norm,
   the q, k, v products, RoPE into heads, the attention, the output product, the MLP's norm,
   gate and up, SwiGLU and the down product. What differs between the two is said by the
   arguments: where the weights are and how they are multiplied (fx__layer_w), how many rows
   there are (fx__layer_rows), where each step writes (fx__layer_io) and how the attention is
   called (a callback: over the batch with its block mask, or over a KV cache). */
#include "model_internal.h"

#include "core/gemv.h"

/* ---- where the weights are ---------------------------------------------------------------------- */

/* The row of the layer's table that the layout's tensor t is. */
static size_t row_of(const fx__model_tensor *t)
{
    return (size_t)(t->arch - fx__arch_layer);
}

fx__layer_w fx__layer_w_train(const fx__model *m, int64_t l)
{
    fx__layer_w W = {.m = m, .train = true, .lora = m->lora, .l = l};
    const fx__model_tensor *t = fx__layer_first(m, l);
    const float *base = fx__layer_base(m, false, l);
    for (size_t i = 0; i < m->lay.per_layer; i++)
        W.t[row_of(&t[i])] = (fx__model_weight){base + (t[i].offset - t->offset), FX_DT_F32};
    return W;
}

fx__layer_w fx__layer_w_decode(const fx__model *m, int64_t l, float *tile)
{
    if (!m->mapped) {
        fx__layer_w W = fx__layer_w_train(m, l);
        W.train = false;
        W.tile = tile;
        return W;
    }
    fx__layer_w W = {.m = m, .halves = m->mapped->rope_half, .tile = tile, .bf16 = m->map_bf16, .ws = m->bf16_ws,
                     .lora = m->lora, .l = l};
    const size_t first = (size_t)(fx__layer_first(m, l) - m->lay.t);
    for (size_t i = 0; i < m->lay.per_layer; i++)
        W.t[row_of(&m->lay.t[first + i])] = m->mapped->t[first + i];
    return W;
}

float *fx__layer_grad(const fx__model *m, int64_t l, int which)
{
    const fx__model_tensor *t = fx__layer_first(m, l);
    size_t i = 0;
    while (i + 1 < m->lay.per_layer && t[i].arch != &fx__arch_layer[which])
        i++;
    assert(t[i].arch == &fx__arch_layer[which]); /* a tensor the config has */
    return fx__layer_base(m, true, l) + (t[i].offset - t->offset);
}

/* ---- products ----------------------------------------------------------------------------------- */

/* Tensors multiplied by the same input, their outputs side by side in one row: q, k, v; gate
   and up. */
static const int qkv_weights[] = {FX__MODEL_WQ, FX__MODEL_WK, FX__MODEL_WV};
static const int gate_up[] = {FX__MODEL_W1, FX__MODEL_W3};
static const struct {
    const int *t;
    int n;
} groups[] = {[FX__GROUP_QKV] = {qkv_weights, 3}, [FX__GROUP_GATE_UP] = {gate_up, 2}};

static int64_t rows_of(const fx__layer_w *W, int which)
{
    return fx__arch_len_of(fx__arch_layer[which].rows, &W->m->c);
}

/* Whether the n tensors of t lie one after another in one dtype, rows of `cols` each: then
   they are one matrix (or one vector), read in one product. */
static bool group_whole(const fx__layer_w *W, const int *t, int n, int64_t cols)
{
    for (int i = 1; i < n; i++) {
        const fx__model_weight a = W->t[t[i - 1]], b = W->t[t[i]];
        const size_t bytes = (size_t)(rows_of(W, t[i - 1]) * cols) * fx_dtype_size(a.dtype);
        if (b.dtype != a.dtype || (const char *)b.data != (const char *)a.data + bytes)
            return false;
    }
    return true;
}

/* ---- biases: any row of the table that is the bias of another's product -------------------------- */

/* The bias of tensor `which` in W (its row, -1 when the config has none: W->t's data NULL). */
static int bias_of(const fx__layer_w *W, int which)
{
    const int b = fx__arch_bias_row(which);
    return b >= 0 && W->t[b].data ? b : -1;
}

/* The biases of the n tensors t, into b: whether every one has one. */
static bool biases_of(const fx__layer_w *W, const int *t, int n, int *b)
{
    bool all = true;
    for (int i = 0; i < n; i++)
        all &= (b[i] = bias_of(W, t[i])) >= 0;
    return all;
}

/* y [N, columns] += the biases of the n tensors t, each on its tensor's columns: one vector
   when they are one. */
static void bias_forward(const fx__layer_w *W, const int *t, int n, float *y, int64_t ldy, int64_t N)
{
    int b[FX__ARCH_LAYER_MAX] = {0}; /* a group has fewer tensors than a layer */
    if (biases_of(W, t, n, b) && group_whole(W, b, n, 1)) {
        int64_t O = 0;
        for (int i = 0; i < n; i++)
            O += rows_of(W, t[i]);
        fx__bias_forward(y, ldy, W->t[b[0]].data, N, O);
        return;
    }
    for (int i = 0, col = 0; i < n; col += (int)rows_of(W, t[i]), i++)
        if (b[i] >= 0)
            fx__bias_forward(y + col, ldy, W->t[b[i]].data, N, rows_of(W, t[i]));
}

/* The biases' gradients (+=) of the n tensors t from dy [N, columns]: the column sums, one
   vector's when they are one. Not for a frozen base. */
static void bias_backward(const fx__layer_w *W, int64_t l, const int *t, int n, const float *dy, int64_t ldy,
                          int64_t N)
{
    int b[FX__ARCH_LAYER_MAX] = {0}; /* a group has fewer tensors than a layer */
    if (W->lora)
        return;
    if (biases_of(W, t, n, b) && group_whole(W, b, n, 1)) {
        int64_t O = 0;
        for (int i = 0; i < n; i++)
            O += rows_of(W, t[i]);
        fx__bias_backward(fx__layer_grad(W->m, l, b[0]), dy, ldy, N, O);
        return;
    }
    for (int i = 0, col = 0; i < n; col += (int)rows_of(W, t[i]), i++)
        if (b[i] >= 0)
            fx__bias_backward(fx__layer_grad(W->m, l, b[i]), dy + col, ldy, N, rows_of(W, t[i]));
}

/* The adapter of tensor `which` (an FX__MODEL_* index) in W's layer, as a target (-1: none). */
static int adapted(const fx__layer_w *W, int which)
{
    const int t = W->lora ? fx__lora_target_of(which) : -1;
    return t >= 0 && fx__lora_a(W->lora, W->l, (fx__lora_target)t) ? t : -1;
}

/* y [N, O] (rows ldy apart; + y when acc) = x [N, I] w [O, I]^T: the base's product. */
static void base_product(const fx__layer_w *W, float *y, int64_t ldy, const float *x, fx__model_weight w, int64_t N,
                         int64_t I, int64_t O, bool acc)
{
    if (W->train)
        fx__mm(W->m, false, true, N, O, I, x, false, I, w.data, true, I, acc ? 1.0f : 0.0f, y, ldy);
    else if (W->bf16)
        fx__linear_bf16(y, ldy, x, w.data, w.dtype, N, I, O, acc, W->ws);
    else
        fx__linear_dt(y, ldy, x, w.data, w.dtype, N, I, O, acc, W->tile);
}

/* The adapted tensors among the n of t, whose outputs lie side by side in that order, as the
   adapters' parts (lora.h): how many. */
static int lora_parts(const fx__layer_w *W, const int *t, int n, fx__lora_part *p)
{
    int k = 0;
    for (int i = 0, col = 0; i < n; col += (int)rows_of(W, t[i]), i++) {
        const int a = adapted(W, t[i]);
        if (a >= 0)
            p[k++] = (fx__lora_part){(fx__lora_target)a, col, rows_of(W, t[i])};
    }
    return k;
}

/* y [N, the n tensors' rows] += the adapters' terms of those of t that have one. */
static void lora_forward(const fx__layer_w *W, const int *t, int n, float *y, int64_t ldy, const float *x,
                         int64_t N, int64_t I)
{
    fx__lora_part p[FX__LORA_GROUP_MAX];
    const int k = lora_parts(W, t, n, p);
    if (k)
        fx__lora_group_forward(W->lora, W->l, p, k, y, ldy, x, N, I);
}

/* y (+ y when acc) = x W->t[which]^T, and the tensor's adapter's term added when it has one. */
static void product(const fx__layer_w *W, float *y, int64_t ldy, const float *x, int which, int64_t N, int64_t I,
                    int64_t O, bool acc)
{
    base_product(W, y, ldy, x, W->t[which], N, I, O, acc);
    lora_forward(W, &which, 1, y, ldy, x, N, I);
}

/* product(), then the tensor's bias added when it has one. */
static void product_bias(const fx__layer_w *W, float *y, int64_t ldy, const float *x, int which, int64_t N,
                         int64_t I, int64_t O, bool acc)
{
    product(W, y, ldy, x, which, N, I, O, acc);
    bias_forward(W, &which, 1, y, ldy, N);
}

/* dx = dy w (+ dx when acc) through the base's weight, in its dtype. */
static void base_dx(const fx__layer_w *W, float *dx, const float *dy, int64_t ldy, fx__model_weight w, int64_t N,
                    int64_t I, int64_t O, bool acc)
{
    if (W->train)
        fx__mm(W->m, false, false, N, I, O, dy, false, ldy, w.data, true, I, acc ? 1.0f : 0.0f, dx, I);
    else if (W->bf16)
        fx__linear_bf16_t(dx, dy, ldy, w.data, w.dtype, N, I, O, acc, W->ws);
    else
        fx__linear_dt_t(dx, dy, ldy, w.data, w.dtype, N, I, O, acc, W->tile);
}

void fx__layer_product_backward(const fx__layer_w *W, int which, float *dx, const float *dy, int64_t ldy,
                                const float *x, int64_t N, int64_t I, int64_t O)
{
    const fx__model *m = W->m;
    bias_backward(W, W->l, &which, 1, dy, ldy, N);
    if (!W->lora)
        fx__mm(m, true, false, O, I, N, dy, false, ldy, x, false, I, 1.0f, fx__layer_grad(m, W->l, which), I);
    /* The adapter reads x before the base's d(x) overwrites it (they may share memory). */
    fx__lora_part p[1];
    const int k = lora_parts(W, &which, 1, p);
    if (k)
        fx__lora_group_grads(W->lora, W->l, p, k, dy, ldy, x, N, I);
    base_dx(W, dx, dy, ldy, W->t[which], N, I, O, false);
    if (k)
        fx__lora_group_dx(W->lora, W->l, p, k, dx, N, I);
}

/* The group's products alone (group_forward's, before the biases). */
static void group_products(const fx__layer_w *W, fx__group g, float *y, int64_t ldy, const float *x, int64_t N,
                           int64_t I)
{
    const int *t = groups[g].t, n = groups[g].n;
    if (group_whole(W, t, n, I)) {
        int64_t O = 0;
        for (int i = 0; i < n; i++)
            O += rows_of(W, t[i]);
        base_product(W, y, ldy, x, W->t[t[0]], N, I, O, false);
    } else {
        for (int i = 0, col = 0; i < n; col += (int)rows_of(W, t[i]), i++)
            base_product(W, y + col, ldy, x, W->t[t[i]], N, I, rows_of(W, t[i]), false);
    }
    lora_forward(W, t, n, y, ldy, x, N, I); /* every adapter's term into its tensor's columns */
}

/* y [N, sum of the group's rows] = x [N, I] times the group's tensors transposed, each one's
   outputs in its columns: one product when they are one matrix, else one each (each element
   is the same sum over I either way); then the tensors' biases. */
static void group_forward(const fx__layer_w *W, fx__group g, float *y, int64_t ldy, const float *x, int64_t N,
                          int64_t I)
{
    group_products(W, g, y, ldy, x, N, I);
    bias_forward(W, groups[g].t, groups[g].n, y, ldy, N);
}

void fx__layer_group_backward(const fx__layer_w *W, int64_t l, fx__group g, float *dx, const float *dy, int64_t ldy,
                              const float *x, int64_t N, int64_t I)
{
    const fx__model *m = W->m;
    const int *t = groups[g].t, n = groups[g].n;
    const bool frozen = W->lora != NULL; /* adapters: the base gets no gradients */
    bias_backward(W, l, t, n, dy, ldy, N);
    /* The gradients follow the parameters' layout: one matrix where the weights are one. */
    if (group_whole(W, t, n, I)) {
        int64_t O = 0;
        for (int i = 0; i < n; i++)
            O += rows_of(W, t[i]);
        base_dx(W, dx, dy, ldy, W->t[t[0]], N, I, O, false);
        if (!frozen)
            fx__mm(m, true, false, O, I, N, dy, false, ldy, x, false, I, 1.0f, fx__layer_grad(m, l, t[0]), I);
    } else {
        for (int i = 0, col = 0; i < n; col += (int)rows_of(W, t[i]), i++) {
            const int64_t O = rows_of(W, t[i]);
            base_dx(W, dx, dy + col, ldy, W->t[t[i]], N, I, O, i > 0);
            if (!frozen)
                fx__mm(m, true, false, O, I, N, dy + col, false, ldy, x, false, I, 1.0f, fx__layer_grad(m, l, t[i]),
                       I);
        }
    }
    /* The adapters' gradients, and their d(x) added (x is not dx here). */
    fx__lora_part p[FX__LORA_GROUP_MAX];
    const int k = lora_parts(W, t, n, p);
    if (k) {
        fx__lora_group_grads(W->lora, l, p, k, dy, ldy, x, N, I);
        fx__lora_group_dx(W->lora, l, p, k, dx, N, I);
    }
}

/* ---- the layer ------------------------------------------------------------------------------------ */

int fx__layer_run(const fx__layer_w *W, const fx__layer_rows *r, const fx__layer_io *io, fx__layer_attn_fn attn,
                  void *ctx)
{
    const fx__model *m = W->m;
    const fx_model_config *c = &m->c;
    const int64_t B = r->B, T = r->T, N = B * T, C = c->dim, F = c->ffn, Hq = c->heads, Hkv = c->kv_heads;
    const int64_t hd = c->head_dim, QD = Hq * hd, QKV = QD + 2 * Hkv * hd;

    /* Attention: mid = in + from_heads(attention(rope(q), rope(k), v)) Wo^T. The norm copies
       the stream into mid as it reads each row when mid is a buffer of its own. */
    fx__rmsnorm_forward_copy(io->xn1, io->rstd1, io->mid != io->in ? io->mid : NULL, io->in,
                             W->t[FX__MODEL_LN1].data, N, C, c->norm_eps);
    group_forward(W, FX__GROUP_QKV, io->qkv, QKV, io->xn1, N, C);
    fx__progress_point(m);
    fx__qkv_to_heads(io->q, io->k, io->v, io->qkv, QKV, m->rope, W->halves, B, T, r->pos0, Hq, Hkv, hd);
    int rc = attn(ctx, io);
    if (rc)
        return rc;
    fx__progress_point(m);
    const float *ao = io->att; /* one row: [Hq, 1, hd] is already token-major */
    if (N > 1) {
        fx__from_heads(io->work, QD, io->att, B, T, Hq, hd);
        ao = io->work;
    }
    product_bias(W, io->mid, C, ao, FX__MODEL_WO, N, QD, C, true);
    fx__progress_point(m);

    /* MLP: out = mid + swiglu(gate, up) W2^T, gate and up side by side in h13. */
    fx__rmsnorm_forward_copy(io->xn2, io->rstd2, io->out && io->out != io->mid ? io->out : NULL, io->mid,
                             W->t[FX__MODEL_LN2].data, N, C, c->norm_eps);
    group_forward(W, FX__GROUP_GATE_UP, io->h13, 2 * F, io->xn2, N, C);
    fx__progress_point(m);
    if (io->out) {
        fx__swiglu_forward(io->work, F, io->h13, io->h13 + F, 2 * F, N, F);
        product_bias(W, io->out, C, io->work, FX__MODEL_W2, N, F, C, true);
    }
    return FX_OK;
}
