/* Matrix-vector products over float32 / bfloat16 / float16 weights (see gemv.h): the
   scalar reference, the thread split and the ISA dispatch. */
#include "core/gemv.h"

#include <string.h>

/* Element i of W as float32. */
static inline float fx__elem(const void *w, fx_dtype dt, size_t i)
{
    switch (dt) {
    case FX_DT_BF16: return fx_bf16_to_f32(((const uint16_t *)w)[i]);
    case FX_DT_F16: return fx_f16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

void fx__gemv_rows_scalar(float *y, const void *w, fx_dtype dt, const float *x, int64_t r0, int64_t r1, int64_t I,
                          bool acc)
{
    for (int64_t r = r0; r < r1; r++) {
        float s = 0.0f;
        for (int64_t i = 0; i < I; i++)
            s += fx__elem(w, dt, (size_t)(r * I + i)) * x[i];
        y[r] = acc ? y[r] + s : s;
    }
}

static bool fx__use_avx2(void)
{
#ifdef FLEXC_REFERENCE_KERNELS
    return false;
#else
    return fx__isa() >= FX_ISA_AVX2;
#endif
}

/* Rows per block of the thread split. */
enum { FX__GEMV_BLOCK = 32 };

void fx__gemv(float *y, const void *w, fx_dtype dt, const float *x, int64_t O, int64_t I, bool acc)
{
    const bool avx2 = fx__use_avx2();
    const int64_t nb = (O + FX__GEMV_BLOCK - 1) / FX__GEMV_BLOCK;
    /* Threads only when the matrix is worth waking them for (about 64 KB of float32). */
#pragma omp parallel for schedule(static) if (O * I >= (1 << 14) && nb > 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t r0 = b * FX__GEMV_BLOCK, r1 = r0 + FX__GEMV_BLOCK < O ? r0 + FX__GEMV_BLOCK : O;
        if (avx2)
            fx__gemv_rows_avx2(y, w, dt, x, r0, r1, I, acc);
        else
            fx__gemv_rows_scalar(y, w, dt, x, r0, r1, I, acc);
    }
}

void fx__widen_rows(float *dst, const void *w, fx_dtype dt, int64_t r0, int64_t r1, int64_t I)
{
    const size_t esz = fx_dtype_size(dt);
    const unsigned char *src = (const unsigned char *)w + (size_t)(r0 * I) * esz;
    const int64_t n = (r1 - r0) * I;
    if (dt == FX_DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const bool avx2 = fx__use_avx2();
    enum { CHUNK = 1 << 14 };
    const int64_t nc = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static) if (nc > 1)
    for (int64_t c = 0; c < nc; c++) {
        int64_t a = c * CHUNK, e = a + CHUNK < n ? a + CHUNK : n;
        if (avx2) {
            fx__widen_avx2(dst + a, src + (size_t)a * esz, dt, e - a);
        } else {
            for (int64_t i = a; i < e; i++)
                dst[i] = fx__elem(src, dt, (size_t)i);
        }
    }
}

void fx__linear_dt(float *y, const float *x, const void *w, fx_dtype dt, int64_t N, int64_t I, int64_t O, bool acc,
                   float *scratch)
{
    if (N == 1) {
        fx__gemv(y, w, dt, x, O, I, acc);
        return;
    }
    if (dt == FX_DT_F32) {
        fx__sgemm(false, true, N, O, I, 1.0f, x, I, w, I, acc ? 1.0f : 0.0f, y, O);
        return;
    }
    for (int64_t r0 = 0; r0 < O; r0 += FX__WIDEN_TILE) {
        int64_t r1 = r0 + FX__WIDEN_TILE < O ? r0 + FX__WIDEN_TILE : O;
        fx__widen_rows(scratch, w, dt, r0, r1, I);
        fx__sgemm(false, true, N, r1 - r0, I, 1.0f, x, I, scratch, I, acc ? 1.0f : 0.0f, y + r0, O);
    }
}
