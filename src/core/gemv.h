/* Matrix-vector products and row widening over weights stored as float32, bfloat16 or
   float16: what one decoding step (batch 1) spends its time in. Internal (fx__ names).

     fx__gemv(y, w, FX_DT_BF16, x, O, I, false);   // y [O] = W [O, I] x [I]

   W stays in its dtype; each row is widened to float32 as it is read and every product is
   computed in float32. Rows are independent and each row's sum is taken in one fixed order
   (8 lanes in two accumulators, then the lanes pairwise), so y is bitwise the same for any
   thread count. The scalar reference is the tests' check and the path without AVX2. */
#ifndef FX_CORE_GEMV_H
#define FX_CORE_GEMV_H

#include "core/core.h"

#include <flexc/safetensors.h>

/* y [O] = W [O, I] x [I] (+ y when acc). W row-major in dt (F32: 4-byte aligned; BF16, F16:
   2-byte aligned). Threads split O in static blocks. */
void fx__gemv(float *y, const void *w, fx_dtype dt, const float *x, int64_t O, int64_t I, bool acc);

/* dst [r1 - r0, I] = rows r0 .. r1-1 of W widened to float32 (exact: every BF16 and F16
   value is a float32). */
void fx__widen_rows(float *dst, const void *w, fx_dtype dt, int64_t r0, int64_t r1, int64_t I);

/* Rows per tile of fx__linear_dt's widening: scratch of FX__WIDEN_TILE * I floats. */
enum { FX__WIDEN_TILE = 128 };

/* y [N, O] = x [N, I] W [O, I]^T (+ y when acc) for W in dt, y's rows ldy apart (>= O): N == 1
   is fx__gemv; F32 goes to fx__sgemm in place; BF16 on the AVX-512 path to fx__sgemm's own
   tiled GEMM, which widens W as it packs it (the bits of fx__sgemm over the widened W); F16,
   and BF16 elsewhere, are widened FX__WIDEN_TILE rows at a time into scratch
   [FX__WIDEN_TILE * I] and multiplied by fx__sgemm. */
void fx__linear_dt(float *y, int64_t ldy, const float *x, const void *w, fx_dtype dt, int64_t N, int64_t I,
                   int64_t O, bool acc, float *scratch);

/* dx [N, I] = dy [N, O] W [O, I] (+ dx when acc) for W in dt, dy's rows ldy apart (>= O): the
   backward of fx__linear_dt through a frozen W. F32 goes to fx__sgemm in place, BF16 on the
   AVX-512 path to its own tiled GEMM as above (both: the bits of fx__sgemm over the widened
   W); F16, and BF16 elsewhere, are widened FX__WIDEN_TILE rows at a time into scratch
   [FX__WIDEN_TILE * I] and each tile's dy[:, r0:r1] W[r0:r1, :] is added in the order of the
   tiles (deterministic for any thread count, as fx__sgemm is). */
void fx__linear_dt_t(float *dx, const float *dy, int64_t ldy, const void *w, fx_dtype dt, int64_t N, int64_t I,
                     int64_t O, bool acc, float *scratch);

/* The same two products with bfloat16 inputs (--dtype bf16 over a mapped base): x (or dy)
   rounded to bfloat16 as read, W's rows bfloat16 (BF16, read in place) or rounded (F32), every
   product exact and the sums float32 (fx__gemm_bf16: bitwise the same at any thread count).
   FX__BF16_ROWS rows of W a call, in order (dx adds the calls' results in that order): a
   layer's matrix of up to 4096 rows in one call (x packed once for gate and up; 1.01-1.04x
   a `--dtype bf16` LoRA step against 1024 rows, three alternated pairs), a head in pieces; ws:
   fx__linear_bf16_ws(N, I, O) floats. dt must be BF16 or F32. */
enum { FX__BF16_ROWS = 4096 };
size_t fx__linear_bf16_ws(int64_t N, int64_t I, int64_t O);
void fx__linear_bf16(float *y, int64_t ldy, const float *x, const void *w, fx_dtype dt, int64_t N, int64_t I,
                     int64_t O, bool acc, float *ws);
void fx__linear_bf16_t(float *dx, const float *dy, int64_t ldy, const void *w, fx_dtype dt, int64_t N, int64_t I,
                       int64_t O, bool acc, float *ws);

/* The row kernels (rows r0 .. r1-1 of y), without threads: the reference and its AVX2 twin
   (called only when fx_get_isa() allows). */
void fx__gemv_rows_scalar(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I,
                          bool acc);
void fx__gemv_rows_avx2(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I,
                        bool acc);
/* dst [n] = src [n] widened (BF16 or F16). */
void fx__widen_avx2(float *dst, const void *src, fx_dtype dt, int64_t n);

/* The kernel table of a CPU path (docs/dispatch.md): the AVX2 twins on AVX2 and AVX-512, the
   reference on the scalar path and in a build with FLEXC_REFERENCE_KERNELS. */
typedef struct fx__gemv_kernels {
    const char *name; /* what `flexc --version` prints */
    void (*rows)(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I, bool acc);
    void (*widen)(float *dst, const void *src, fx_dtype dt, int64_t n);
} fx__gemv_kernels;
extern const fx__gemv_kernels fx__gemv_kernels_scalar, fx__gemv_kernels_avx2;
const fx__gemv_kernels *fx__gemv_kernels_for(fx_isa isa);
const fx__gemv_kernels *fx__gemv_kernels_now(void); /* fx_get_isa()'s */

#endif
