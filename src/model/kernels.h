/* The model's element kernels, one table per op and CPU path (docs/dispatch.md): RMSNorm's
   row loops, SwiGLU's element loops and the optimizer's. Each table names its path and holds
   the op's loops (fx__rms_ops, fx__swiglu_ops, fx__optim_ops, model.h); the scalar tables
   hold the plain C references, which a build with FLEXC_REFERENCE_KERNELS always takes. */
#ifndef FX_MODEL_KERNELS_H
#define FX_MODEL_KERNELS_H

#include "model/model.h"

typedef struct fx__rmsnorm_kernels {
    const char *name; /* what `flexc --version` prints */
    const fx__rms_ops *ops;
} fx__rmsnorm_kernels;
extern const fx__rmsnorm_kernels fx__rmsnorm_kernels_scalar, fx__rmsnorm_kernels_avx2, fx__rmsnorm_kernels_avx512;
const fx__rmsnorm_kernels *fx__rmsnorm_kernels_for(fx_isa isa);
const fx__rmsnorm_kernels *fx__rmsnorm_kernels_now(void); /* fx_get_isa()'s */

typedef struct fx__swiglu_kernels {
    const char *name;
    const fx__swiglu_ops *ops;
} fx__swiglu_kernels;
extern const fx__swiglu_kernels fx__swiglu_kernels_scalar, fx__swiglu_kernels_avx2, fx__swiglu_kernels_avx512;
const fx__swiglu_kernels *fx__swiglu_kernels_for(fx_isa isa);
const fx__swiglu_kernels *fx__swiglu_kernels_now(void);

typedef struct fx__optim_kernels {
    const char *name;
    const fx__optim_ops *ops;
} fx__optim_kernels;
extern const fx__optim_kernels fx__optim_kernels_scalar, fx__optim_kernels_avx2, fx__optim_kernels_avx512;
const fx__optim_kernels *fx__optim_kernels_for(fx_isa isa);
const fx__optim_kernels *fx__optim_kernels_now(void);

#endif
