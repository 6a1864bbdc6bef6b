/*
 * Fused linear + cross-entropy: the loss of logits = h W^T + bias and its gradients,
 * without ever holding the [N, V] logits (DESIGN.md §4). Implemented by the lce module.
 */
#ifndef FLEXC_LCE_H
#define FLEXC_LCE_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_reduction { FX_REDUCTION_MEAN = 0, FX_REDUCTION_SUM = 1, FX_REDUCTION_NONE = 2 } fx_reduction;

typedef struct fx_lce {
    int64_t N, D, V;       /* tokens, hidden size, vocabulary */
    int64_t ignore_index;  /* targets equal to it add nothing; PyTorch's default is -100 */
    fx_reduction reduction;
    float label_smoothing; /* eps in [0, 1] */
    float z_loss;          /* s: adds s * lse^2 per (non-ignored) token */
    float softcap;         /* 0: off; else logits = softcap * tanh(logits / softcap) */
    int64_t chunk;         /* tokens per chunk; 0: automatic */
} fx_lce;

/* h [N,D], w [V,D], bias [V] or NULL, target [N] -> loss [1] (MEAN, SUM) or [N] (NONE), lse [N] or NULL.
   dh [N,D] is overwritten; dw [V,D] and dbias [V] are accumulated (+=), so a tied embedding works.
   Any gradient pointer may be NULL. Gradients are those of the reduced loss (NONE: of its sum). */
FX_API int fx_linear_cross_entropy(const fx_lce *p, const float *h, const float *w, const float *bias,
                                   const int64_t *target, float *loss, float *lse,
                                   float *dh, float *dw, float *dbias);
/* General upstream gradient: grad_loss [1] (MEAN, SUM) or [N] (NONE); lse from the forward call. */
FX_API int fx_linear_cross_entropy_backward(const fx_lce *p, const float *h, const float *w,
                                            const float *bias, const int64_t *target,
                                            const float *lse, const float *grad_loss,
                                            float *dh, float *dw, float *dbias);

#ifdef __cplusplus
}
#endif
#endif
