/* The backward pass: gradients of the last forward's mean loss, accumulated into the
   gradient buffer layer by layer, with the distributed hooks called as they become final. */
#include "model_internal.h"

#include <string.h>

/* fx__qkv_from_heads for q and k whose rotated pairs are halves (x[i] with x[i + hd/2], a
   mapped file's row order): d(row) = R^T d(head), the transpose of rope_heads_half's rotation. */
static void qkv_from_heads_half(float *dqkv, const float *dq, const float *dk, const float *dv, const float *rope,
                                int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const int64_t ld = (Hq + 2 * Hkv) * hd, half = hd / 2;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        float *row = dqkv + bt * ld;
        const float *cs = rope + t * hd;
        for (int64_t h = 0; h < Hq + 2 * Hkv; h++) {
            const bool isq = h < Hq, isk = !isq && h < Hq + Hkv;
            const float *src = isq ? dq + ((b * Hq + h) * T + t) * hd
                               : isk ? dk + ((b * Hkv + h - Hq) * T + t) * hd
                                     : dv + ((b * Hkv + h - Hq - Hkv) * T + t) * hd;
            float *y = row + h * hd;
            if (!isq && !isk) {
                memcpy(y, src, (size_t)hd * sizeof(float));
                continue;
            }
            for (int64_t i = 0; i < half; i++) {
                const float c = cs[2 * i], s = cs[2 * i + 1], d0 = src[i], d1 = src[i + half];
                y[i] = d0 * c + d1 * s;
                y[i + half] = d1 * c - d0 * s;
            }
        }
    }
}

/* ---- backward ---------------------------------------------------------------------------------------- */

int fx__model_backward(fx__model *m)
{
    if (m && m->device)
        return m->device->backward(m);
    if (!m || (!m->grads && !m->lora) || !m->acts || !m->grad_ready)
        return fx__error(FX_EINVAL, "fx__model_backward: no forward with gradients before it");
    m->grad_ready = false;
    m->grads_zero = false;
    const fx_model_config *c = &m->c;
    int64_t B = m->B, T = m->T, N = B * T, C = c->dim, F = c->ffn;
    int64_t Hq = c->heads, Hkv = c->kv_heads, hd = c->head_dim, QD = Hq * hd, KD = Hkv * hd;
    fx__acts a;
    fx__acts_carve(&a, m->acts, c, B, T, m->loss_impl == FX__MODEL_LOSS_UNFUSED, m->recompute);
    fx__attn_call call;
    int rc = fx__train_attn(m, &call, false);
    if (rc)
        return rc;

    /* The final norm: its input gradient d(xnf) came with the loss. */
    const fx__model_tensor *tn = fx__layer_first(m, c->layers);
    memset(a.dres, 0, (size_t)(N * C) * sizeof(float));
    if ((rc = fx__layer_hook(m, c->layers, true)) != FX_OK)
        return rc;
    /* With adapters the base is frozen: its norms' gradients go to a sink, never read. */
    fx__lora *lora = m->lora;
    float *gn = lora ? lora->sink : fx__layer_base(m, true, c->layers);
    fx__rmsnorm_backward(a.dres, gn, a.dxn, fx__res_at(m, &a, c->layers), fx__final_norm_w(m), a.rstdf, N, C);
    if (!lora)
        fx__grad_hook(m, (int)c->layers, gn, m->lay.total - tn->offset); /* the norm, and lm_head when untied */

    for (int64_t l = c->layers - 1; l >= 0; l--) {
        if ((rc = fx__layer_hook(m, l, true)) != FX_OK)
            return rc;
        const fx__layer_w W = fx__model_on_map(m) ? fx__layer_w_decode(m, l, m->map_tile) : fx__layer_w_train(m, l);
        /* The forward pass leaves the last layer's activations in the recompute slot (and
           layer 0's when the others are parked). */
        if (m->recompute && !m->park.acts_parked && l < c->layers - 1 &&
            (rc = fx__layer_forward(m, &a, &call, l, false)) != FX_OK)
            return rc;
        if (m->park.acts_parked) /* what is parked in layer l's gradients is dead now */
            fx__park_clear(m, &a, l);
        fx__layer_acts x = fx__layer_acts_at(m, &a, l);
        float *res = x.res, *xn1 = x.xn1, *rstd1 = x.rstd1, *q = x.q, *k = x.k, *v = x.v, *att = x.att;
        float *lse = x.lse, *resm = x.resm, *xn2 = x.xn2, *rstd2 = x.rstd2, *h13 = x.h13;

        /* MLP: out = resm + swiglu(gate, up) W2^T, dres holds d(out). The gradients of gate
           and up replace them in h13 (their last use), the A operand of the one product
           of d(xn2) over all 2F, and of d(w1, w3) as one [2F, C] matrix. */
        fx__swiglu_forward(a.work, F, h13, h13 + F, 2 * F, N, F);
        fx__layer_product_backward(&W, FX__MODEL_W2, a.work, a.dres, C, a.work, N, F, C);
        fx__progress_point(m);
        float *dh13 = h13;
        fx__swiglu_backward(dh13, dh13 + F, 2 * F, a.work, F, h13, h13 + F, N, F);
        fx__layer_group_backward(&W, l, FX__GROUP_GATE_UP, a.dxn, dh13, 2 * F, xn2, N, C);
        fx__rmsnorm_backward(a.dres, lora ? lora->sink : fx__layer_grad(m, l, FX__MODEL_LN2), a.dxn, resm, W.t[FX__MODEL_LN2].data, rstd2, N,
                             C);
        fx__progress_point(m);

        /* Attention: resm = res + from_heads(att) Wo^T, dres holds d(resm). */
        /* d(att) goes to xn2's slot ([N, max(C, QD)], dead now). */
        float *datt = xn2;
        fx__from_heads(a.work, QD, att, B, T, Hq, hd);
        fx__layer_product_backward(&W, FX__MODEL_WO, a.work, a.dres, C, a.work, N, QD, C);
        fx__progress_point(m);
        fx__to_heads(datt, a.work, QD, B, T, Hq, hd);
        float *dq = a.work, *dk = a.work + N * QD, *dv = a.work + N * (QD + KD);
        if ((rc = fx__attn_bwd(m, &call, q, k, v, att, lse, datt, dq, dk, dv)) != FX_OK)
            return fx__error_context(rc, "layer %lld attention backward", (long long)l);
        fx__progress_point(m);
        /* The gradient of the forward pass's q, k, v rows ([N, QKV], after the attention's
           gradients in work), and of its product: d(xn1) over all of QKV, and d(wq, wk, wv)
           (one [QKV, C] matrix in the training layout), and their biases' when they have them. */
        const int64_t QKV = QD + 2 * KD;
        float *dqkv = a.work + N * QKV;
        if (W.halves)
            qkv_from_heads_half(dqkv, dq, dk, dv, m->rope, B, T, Hq, Hkv, hd);
        else
            fx__qkv_from_heads(dqkv, dq, dk, dv, m->rope, B, T, Hq, Hkv, hd);
        fx__layer_group_backward(&W, l, FX__GROUP_QKV, a.dxn, dqkv, QKV, xn1, N, C);
        fx__rmsnorm_backward(a.dres, lora ? lora->sink : fx__layer_grad(m, l, FX__MODEL_LN1), a.dxn, res, W.t[FX__MODEL_LN1].data, rstd1,
                             N, C);

        if (lora) { /* the layer's adapter gradients are final */
            size_t numel;
            float *g = fx__lora_layer_grads(lora, l, &numel);
            fx__grad_hook(m, (int)l, g, numel);
            continue;
        }
        const fx__model_tensor *t0 = fx__layer_first(m, l);
        size_t numel = fx__layer_first(m, l + 1)->offset - t0->offset;
        fx__grad_hook(m, (int)l, fx__layer_base(m, true, l), numel);
    }
    if (lora)
        return FX_OK;
    fx__embed_backward(m->grads, a.dres, m->tokens, N, C);
    fx__grad_hook(m, -1, m->grads, m->lay.t[0].numel);
    return FX_OK;
}

void fx__model_zero_grad(fx__model *m)
{
    if (m->device) {
        (void)m->device->zero_grad(m); /* a failure shows in the next device call */
        return;
    }
    if (m->grads)
        memset(m->grads, 0, m->lay.total * sizeof(float));
    if (m->lora)
        fx__lora_zero_grad(m->lora);
    m->grads_zero = m->grads != NULL;
}

