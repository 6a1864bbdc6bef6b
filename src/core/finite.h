/* Finding the first NaN or infinity in a tensor: one pass over the values, vectorised. */
#ifndef FX_CORE_FINITE_H
#define FX_CORE_FINITE_H

#include "core/core.h"

/* The index of the first element of x[0..n) that is NaN or +-infinity; -1 when all are
   finite. */
int64_t fx__first_nonfinite_f32(const float *x, size_t n);
/* The same over n elements of a tensor's dtype (F32, F64, F16, BF16, F8_E4M3, F8_E5M2,
   little-endian, any alignment); integer and bool dtypes are always finite (-1). */
int64_t fx__first_nonfinite(const void *data, fx_dtype dt, size_t n);
/* "NaN", "+Inf" or "-Inf": the non-finite element i of data (as fx__first_nonfinite). */
const char *fx__nonfinite_name(const void *data, fx_dtype dt, size_t i);

/* The ISA twins of fx__first_nonfinite_f32; called only when fx_get_isa() allows. */
int64_t fx__first_nonfinite_f32_avx2(const float *x, size_t n);
int64_t fx__first_nonfinite_f32_avx512(const float *x, size_t n);

/* The kernel table of a CPU path (docs/dispatch.md): the reference on the scalar path and in a
   build with FLEXC_REFERENCE_KERNELS, a twin on the others. */
typedef struct fx__finite_kernels {
    const char *name; /* what `flexc --version` prints */
    int64_t (*first_nonfinite_f32)(const float *x, size_t n);
} fx__finite_kernels;
extern const fx__finite_kernels fx__finite_kernels_scalar, fx__finite_kernels_avx2, fx__finite_kernels_avx512;
const fx__finite_kernels *fx__finite_kernels_for(fx_isa isa);
const fx__finite_kernels *fx__finite_kernels_now(void); /* fx_get_isa()'s */

#endif
