/* Backends: where a call's tensors live decides which code runs it (docs/dispatch.md).

   The CPU is no backend of its own: each module runs host memory itself, through its kernel
   tables chosen by the CPU path. A device backend (CUDA, src/cuda) is a table of the public
   calls' contracts on its memory. The modules reach it through this header only, so none of
   them includes a backend, and a backend may include the modules' internal headers (for
   their argument checks) without a loop. Internal (fx__). */
#ifndef FX_CORE_BACKEND_H
#define FX_CORE_BACKEND_H

#include "core/core.h"

typedef struct fx__backend {
    const char *name; /* "cuda" */
    /* The device its calls would run on, for `flexc --version`: its name written into buf
       (cap bytes), and buf returned; NULL when none is usable (a build without the backend,
       no driver, no device). */
    const char *(*device_name)(char *buf, size_t cap);
    /* fx_flex_attention and fx_flex_attention_backward, whole: every check, on the device. */
    int (*flex_attention)(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                          float *lse);
    int (*flex_attention_backward)(const fx_attention *a, const float *q, const float *k, const float *v,
                                   const float *out, const float *lse, const float *dout, float *dq, float *dk,
                                   float *dv);
    /* fx_linear_cross_entropy (lse_in and grad_loss NULL: loss and lse written) and its
       backward (lse_in and grad_loss given: loss and lse NULL). */
    int (*lce)(const fx_lce *p, const float *h, const float *w, const float *bias, const int64_t *target,
               float *loss, float *lse, const float *lse_in, const float *grad_loss, float *dh, float *dw,
               float *dbias);
    /* Frees the backend's copy of a block mask, if it holds one (fx_block_mask_to_device). */
    void (*block_mask_release)(fx_block_mask *m);
} fx__backend;

/* The device backends built in: src/cuda's host side is built in every configuration (without
   CUDA its calls check their arguments and return FX_EUNSUPPORTED). */
extern const fx__backend fx__cuda_backend;

/* The backend of a call whose tensors live on `device` (0: host memory; k > 0: device k - 1)
   with element type `dtype` (0 or FX_DT_F32: float32): NULL for host float32, which the
   module runs itself on the CPU; else the device backend, which also refuses, with its own
   message, what no backend runs (bfloat16 on the host, a negative device, an unknown dtype). */
static inline const fx__backend *fx__backend_of(int device, int dtype)
{
    return device != 0 || (dtype != 0 && dtype != FX_DT_F32) ? &fx__cuda_backend : NULL;
}

/* What every backend holds for a block mask, released: fx_block_mask_free's call. */
void fx__backend_block_mask_release(fx_block_mask *m);

#endif
