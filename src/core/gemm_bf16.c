/* The bfloat16 GEMM (bf16 inputs, float32 accumulation): dispatch, the plain-C packing and
   conversion loops, and the fixed-order reference. See gemm_bf16.h. */
#include "gemm_bf16.h"

/* ---- conversions ----------------------------------------------------------------------------- */

void fx__f32_to_bf16_n_scalar(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = fx__f32_to_bf16(src[i]);
}

void fx__f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n)
{
    if (fx__isa() != FX_ISA_SCALAR)
        fx__f32_to_bf16_n_avx2(dst, src, n);
    else
        fx__f32_to_bf16_n_scalar(dst, src, n);
}

/* ---- packing --------------------------------------------------------------------------------- */

void fx__bf16_pack_scalar(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++) {
        float *d = dst + r * cols;
        if (src.bf16) {
            const uint16_t *s = (const uint16_t *)src.p + r * ld;
            for (int64_t c = 0; c < cols; c++)
                d[c] = fx__bf16_to_f32(s[c]);
        } else {
            const float *s = (const float *)src.p + r * ld;
            for (int64_t c = 0; c < cols; c++)
                d[c] = fx__bf16_round(s[c]);
        }
    }
}

typedef void (*fx__bf16_pack_fn)(float *, fx__bf16_mat, int64_t, int64_t, int64_t);

/* Rows per packing task: the split depends on the shape only, and each element's value on
   nothing else, so the packed operand is the same at any thread count. */
enum { FX__PACK_ROWS = 32 };

static fx__bf16_pack_fn fx__bf16_pack_kernel(void)
{
    switch (fx__isa()) {
    case FX_ISA_AVX512:
    case FX_ISA_AVX2: return fx__bf16_pack_avx2;
    case FX_ISA_SCALAR: break;
    }
    return fx__bf16_pack_scalar;
}

void fx__bf16_pack(float *dst, fx__bf16_mat src, int64_t rows, int64_t cols, int64_t ld)
{
    const fx__bf16_pack_fn pack = fx__bf16_pack_kernel();
    const int64_t ntask = (rows + FX__PACK_ROWS - 1) / FX__PACK_ROWS;
    const bool nested = fx__in_parallel();
    (void)nested; /* read only by the pragma, which is gone without OpenMP */
#pragma omp parallel for schedule(static) if (!nested && rows * cols >= (1 << 15))
    for (int64_t t = 0; t < ntask; t++) {
        const int64_t r0 = t * FX__PACK_ROWS, n = rows - r0 < FX__PACK_ROWS ? rows - r0 : FX__PACK_ROWS;
        fx__bf16_mat s = src;
        s.p = src.bf16 ? (const void *)((const uint16_t *)src.p + r0 * ld) : (const void *)((const float *)src.p + r0 * ld);
        pack(dst + r0 * cols, s, n, cols, ld);
    }
}

/* ---- the GEMM ------------------------------------------------------------------------------- */

size_t fx__gemm_bf16_ws(int64_t M, int64_t N, int64_t K)
{
    return (size_t)M * (size_t)K + (size_t)K * (size_t)N;
}

void fx__gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda, fx__bf16_mat B,
                   int64_t ldb, float beta, float *C, int64_t ldc, float *ws)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)ws;
    fx__gemm_bf16_ref(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
#else
    if (M == 0 || N == 0)
        return;
    /* Every path widens into ws and multiplies in float32 (fx__bf16_pack_kernel picks the
       widening loop). A vdpbf16ps (AVX512-BF16) or AMX kernel would be a switch on the CPU's
       features here, reading the bfloat16 operands directly; none exists yet. */
    /* The operands keep their stored orientation (transposes stay flags of fx__sgemm). */
    const int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    float *a32 = ws, *b32 = ws + ar * ac;
    fx__bf16_pack(a32, A, ar, ac, lda);
    fx__bf16_pack(b32, B, br, bc, ldb);
    fx__sgemm(ta, tb, M, N, K, 1.0f, a32, ac, b32, bc, beta, C, ldc);
#endif
}

static inline float fx__bf16_at(fx__bf16_mat x, int64_t i)
{
    return x.bf16 ? fx__bf16_to_f32(((const uint16_t *)x.p)[i]) : fx__bf16_round(((const float *)x.p)[i]);
}

void fx__gemm_bf16_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                       fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc += fx__bf16_at(A, ta ? k * lda + i : i * lda + k) * fx__bf16_at(B, tb ? j * ldb + k : k * ldb + j);
            /* beta == 0 overwrites, as BLAS does, so NaN garbage in C does not survive. */
            C[i * ldc + j] = beta == 0.0f ? acc : acc + beta * C[i * ldc + j];
        }
    }
}
