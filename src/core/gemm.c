/* The one GEMM entry point of the library, row-major, over CBLAS. */
#include "core.h"

#include <assert.h>
#include <limits.h>

#include <cblas.h>

/* OpenBLAS's threading model: 0 sequential, 1 pthreads, 2 OpenMP. */
int openblas_get_parallel(void);

static void fx__cblas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                      int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    /* CBLAS takes int; callers size their chunks so that this holds. */
    assert(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

/* OpenBLAS splits K differently on one thread than on several (past K of a few hundred), so
   a multi-threaded call is not bitwise reproducible across thread counts. Instead, C is cut
   into a fixed number of row (or column) blocks that depends on the shape only, and OpenMP
   threads share them out, each block a one-thread GEMM (an OpenMP OpenBLAS runs one thread
   inside a parallel region). Every element is then computed the same way at any count. */
enum { FX__GEMM_MIN_BLOCK = 64, FX__GEMM_MAX_BLOCKS = 16 };

void fx__sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc)
{
#ifdef FLEXC_REFERENCE_KERNELS
    fx__sgemm_ref(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    if (M == 0 || N == 0)
        return;
    const bool split_rows = M >= N;
    const int64_t dim = split_rows ? M : N;
    int64_t bs = (dim + FX__GEMM_MAX_BLOCKS - 1) / FX__GEMM_MAX_BLOCKS;
    bs = bs < FX__GEMM_MIN_BLOCK ? FX__GEMM_MIN_BLOCK : (bs + 15) / 16 * 16;
    const int64_t nblocks = (dim + bs - 1) / bs;
    /* A pthreads OpenBLAS would not stay on one thread per block; it runs whole calls on its
       own threads instead, with K cut into blocks short enough that it never splits them,
       added in order. */
    if (openblas_get_parallel() == 1) {
        enum { KBLOCK = 256 };
        for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += KBLOCK) {
            const int64_t kn = K - k0 < KBLOCK ? K - k0 : KBLOCK;
            fx__cblas(ta, tb, M, N, kn, alpha, ta ? A + k0 * lda : A + k0, lda, tb ? B + k0 : B + k0 * ldb, ldb,
                      k0 ? 1.0f : beta, C, ldc);
        }
        return;
    }
    /* Inside a parallel region the blocks run in turn on the calling thread: the same calls
       as outside it, since some OpenBLAS kernels (Zen's, for one) round an element
       differently depending on the shape of the call it is part of. Outside, the blocks
       always run in a region of their own, so that OpenBLAS never threads a call itself
       (its split depends on the thread count and changes the rounding too). */
    const bool nested = fx__in_parallel();
#pragma omp parallel for schedule(static) if (!nested)
    for (int64_t blk = 0; blk < nblocks; blk++) {
        const int64_t lo = blk * bs, n = dim - lo < bs ? dim - lo : bs;
        if (split_rows)
            fx__cblas(ta, tb, n, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
        else
            fx__cblas(ta, tb, M, n, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
    }
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
