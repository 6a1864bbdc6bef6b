/* The training step and evaluation, shared by `flexc train`, the benchmark and the tests. */
#include "model.h"
#include "model/lora.h"

#include <math.h>

int fx__model_train_step(fx__model *m, const fx__model_data *d, fx__model_train_state *s, int32_t *tokens,
                       int32_t *targets, fx__model_step_info *info)
{
    /* With adapters only they train (lora.h): their gradients, norm and AdamW. */
    if (m->lora && !m->device) {
        int rc = fx__lora_alloc_train(m->lora);
        if (rc)
            return rc;
    } else if (!m->grads || (!m->adam && !m->adam16))
        return fx__error(FX_EINVAL, "fx__model_train_step: no gradient or optimizer buffers (fx__model_alloc_train)");
    int rc = fx__model_set_batch(m, s->batch, s->seq);
    if (rc)
        return rc;
    if (!m->grads_zero)
        fx__model_zero_grad(m);
    double loss = 0.0, t_fwd = 0.0, t_bwd = 0.0;
    for (int64_t a = 0; a < s->accum; a++) {
        fx__model_data_batch(d, &s->rng, s->batch, s->seq, tokens, targets);
        s->data_pos += s->batch;
        float l;
        double t0 = fx__seconds();
        if ((rc = fx__model_forward(m, tokens, targets, &l, true)) != FX_OK)
            return rc;
        /* (On a device the forward returns once the loss is read back; the backward is timed
           to the end of its queued work.) */
        double t1 = fx__seconds();
        if ((rc = fx__model_backward(m)) != FX_OK || (m->device && (rc = m->device->sync(m)) != FX_OK))
            return rc;
        t_fwd += t1 - t0, t_bwd += fx__seconds() - t1;
        loss += l;
    }
    double t_opt = fx__seconds();
    /* The gradient of the mean over micro-batches, clipped to the global norm: one scale
       that AdamW applies as it reads the gradients. */
    double norm;
    if (!m->device)
        norm = fx__model_grad_norm(m);
    else if ((rc = m->device->grad_norm(m, &norm)) != FX_OK)
        return rc;
    norm /= (double)s->accum;
    double scale = 1.0 / (double)s->accum;
    if (s->clip > 0.0f && norm > s->clip)
        scale *= s->clip / norm;
    float lr = fx__lr_schedule(s->step, s->warmup, s->steps, s->lr, s->min_lr);
    float lossf = (float)(loss / (double)s->accum);
    /* A non-finite loss or norm would write NaN into every weight: the step is not applied,
       and the caller stops with the state of the previous step. */
    if (isfinite(lossf) && isfinite(norm)) {
        fx__adamw o = {.lr = lr, .beta1 = s->beta1, .beta2 = s->beta2, .eps = 1e-8f,
                       .weight_decay = s->weight_decay, .grad_scale = (float)scale, .zero_grad = true};
        if (!m->device)
            fx__model_adamw(m, &o, s->step + 1);
        else if ((rc = m->device->adamw(m, &o, s->step + 1)) != FX_OK || (rc = m->device->sync(m)) != FX_OK)
            return rc;
        s->step++;
    }
    if (info)
        *info = (fx__model_step_info){.loss = lossf, .lr = lr, .grad_norm = (float)norm,
                                    .time_s = {t_fwd, t_bwd, fx__seconds() - t_opt}};
    return FX_OK;
}

int fx__model_eval(fx__model *m, const fx__model_data *d, int64_t batches, int32_t *tokens, int32_t *targets, float *loss)
{
    double sum = 0.0;
    for (int64_t i = 0; i < batches; i++) {
        fx__model_data_val_batch(d, i, m->B, m->T, tokens, targets);
        float l;
        int rc = fx__model_forward(m, tokens, targets, &l, false);
        if (rc)
            return rc;
        sum += l;
    }
    *loss = (float)(sum / (double)batches);
    return FX_OK;
}
