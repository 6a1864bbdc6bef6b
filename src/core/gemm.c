/* The one GEMM entry point of the library, row-major, over CBLAS. */
#include "core.h"

#include <assert.h>
#include <limits.h>

#include <cblas.h>

void fx__sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc)
{
#ifdef FLEXC_REFERENCE_KERNELS
    fx__sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    /* CBLAS takes int; callers size their chunks so that this holds. */
    assert(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    if (M == 0 || N == 0)
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#endif
}

void fx__sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += a * b;
            }
            /* beta == 0 overwrites, as BLAS does, so NaN garbage in C does not survive. */
            double c = beta == 0.0f ? 0.0 : (double)beta * C[i * ldc + j];
            C[i * ldc + j] = (float)((double)alpha * acc + c);
        }
    }
}
