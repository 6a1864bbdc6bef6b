/* Internal pieces of the fused linear + cross-entropy: the per-row kernels (a scalar
   reference, AVX2 and AVX-512 twins), shared with the benchmark's unfused peer. */
#ifndef FX_LCE_INTERNAL_H
#define FX_LCE_INTERNAL_H

#include "core/core.h"

/* The running statistics of one token's logits row, folded tile by tile. */
typedef struct fx__lce_stat {
    float m;      /* max so far (-inf before the first tile) */
    double s;     /* sum of exp(z - m) */
    double sum_z; /* sum of z (label smoothing) */
} fx__lce_stat;

/* Per-row kernels over one row of a logits tile, z [n], in place.
   stats: z += bias (bias [n] or NULL), then z = cap tanh(z / cap) when cap > 0; folds z into st.
   prep:  the same transform without statistics (recomputed tiles).
   grad:  z (transformed logits) -> gradient w.r.t. the raw logits of the non-target terms:
          (a exp(z - lse) - b) (1 - (z/cap)^2 when cap > 0). */
typedef struct fx__lce_kernels {
    void (*stats)(float *z, int64_t n, const float *bias, float cap, fx__lce_stat *st);
    void (*prep)(float *z, int64_t n, const float *bias, float cap);
    void (*grad)(float *z, int64_t n, float lse, float a, float b, float cap);
} fx__lce_kernels;

extern const fx__lce_kernels fx__lce_kernels_scalar;
extern const fx__lce_kernels fx__lce_kernels_avx2;
extern const fx__lce_kernels fx__lce_kernels_avx512;

/* The kernels for the current CPU path (fx_get_isa()). */
const fx__lce_kernels *fx__lce_kernels_now(void);

#endif
