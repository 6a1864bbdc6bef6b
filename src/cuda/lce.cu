/* The fused linear + cross-entropy on CUDA: the CPU path's algorithm (docs/lce.md) on device
   memory, float32 or bfloat16 in and out, float32 arithmetic with float64 row sums.

   Tokens go in chunks of at most p->chunk rows, in order: the chunk's logits Z = h W^T are
   one product (cuBLASLt, src/cuda/blas.h) into a [chunk, V] float32 buffer (never all N rows);
   one thread block per row then applies bias and softcap, finds the log-sum-exp and the loss,
   and turns the row into G = d loss / d logits in place; two more products give dh = G W
   (overwritten) and dw += G^T h, and a column sum gives dbias. With bfloat16 tensors G is
   written as bfloat16 over the first half of its own float32 row (products take one input
   type; float32 accumulation either way), so the chunk needs no second buffer. Every product
   and sum has an order fixed by the sizes: the result is the same on every run. */
#include "cuda/blas.h"
#include "cuda/common.cuh"

#include <string.h>

namespace fxcu {
namespace {

enum { RTHREADS = 256 };

template <typename T> struct dtype_of;
template <> struct dtype_of<float> {
    enum { value = FX_DT_F32 };
};
template <> struct dtype_of<bf16> {
    enum { value = FX_DT_BF16 };
};

/* C = op(A) op(B) (+ C when acc) by cuBLASLt; ab and c are FX_DT_* types. */
int gemm(cudaStream_t st, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda, bool ta, const void *B,
         int64_t ldb, bool tb, int ab, void *C, int64_t ldc, int c, bool acc)
{
    fx__cu_gemm g;
    memset(&g, 0, sizeof g);
    g.m = M, g.n = N, g.k = K, g.a = A, g.b = B, g.c = C, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    g.ta = ta, g.tb = tb, g.ab_type = ab, g.c_type = c, g.alpha = 1.0f, g.beta = acc ? 1.0f : 0.0f, g.stream = st;
    return fx__cu_gemm_run(&g);
}

/* A running (max, sum of exp(x - max)) pair, and two of them merged; -inf maxima (nothing
   seen) contribute nothing, a NaN reaches the sum. */
struct lse_acc {
    float m;
    double s;
};

__device__ __forceinline__ lse_acc lse_merge(lse_acc a, lse_acc b)
{
    const float M = a.m > b.m ? a.m : b.m;
    if (M == -INFINITY)
        return lse_acc{M, a.s + b.s};
    return lse_acc{M, a.s * (double)expf(a.m - M) + b.s * (double)expf(b.m - M)};
}

/* Fixed-tree block reductions over RTHREADS threads (every thread gets the result). */
__device__ lse_acc block_lse(lse_acc x, float *shm, double *shs)
{
    shm[threadIdx.x] = x.m;
    shs[threadIdx.x] = x.s;
    __syncthreads();
    for (int s = RTHREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const lse_acc r = lse_merge(lse_acc{shm[threadIdx.x], shs[threadIdx.x]},
                                        lse_acc{shm[threadIdx.x + s], shs[threadIdx.x + s]});
            shm[threadIdx.x] = r.m;
            shs[threadIdx.x] = r.s;
        }
        __syncthreads();
    }
    const lse_acc r = {shm[0], shs[0]};
    __syncthreads();
    return r;
}

__device__ double block_sum(double x, double *sh)
{
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int s = RTHREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

/* Logit j of a row after bias and softcap (z: the product's raw row). */
template <typename T>
__device__ __forceinline__ float logit(const float *z, const T *bias, int64_t j, float cap)
{
    float x = z[j] + (bias ? load(bias, j) : 0.0f);
    return cap > 0.0f ? cap * tanhf(x / cap) : x;
}

/* One token row of the chunk: the forward finds lse and the loss in one pass (a running max
   and sum); with grads the row becomes G = d loss / d z (the CPU path's formula:
   p_j (1 + 2 s lse) sc - eps sc / V - (1 - eps) sc [j == y], times 1 - (z/cap)^2), stored as T
   from the start of the row's memory. Each pass recomputes bias and softcap from the raw
   product instead of storing the modified row. */
template <typename T>
__global__ void __launch_bounds__(RTHREADS) row_kernel(fx__cu_lce p, float *Z, int64_t ldz, int64_t n0, double *row_loss, int grads)
{
    __shared__ float shf[RTHREADS];
    __shared__ double shd[RTHREADS];
    const int64_t r = blockIdx.x, n = n0 + r, V = p.V;
    const float *z = Z + r * ldz;
    const T *bias = (const T *)p.bias;
    const int64_t y = p.target[n];
    const bool valid = y != p.ignore_index, forward = p.lse_in == NULL;
    const float cap = p.cap, eps = p.eps, zl = p.zl;
    const float zy = valid ? logit(z, bias, y, cap) : 0.0f; /* read before any thread writes G */

    double lse;
    if (forward) {
        lse_acc acc = {-INFINITY, 0.0};
        double sz = 0.0;
        for (int64_t j = threadIdx.x; j < V; j += RTHREADS) {
            const float x = logit(z, bias, j, cap);
            sz += x;
            if (x > acc.m) {
                acc.s = acc.s * (double)expf(acc.m - x) + 1.0;
                acc.m = x;
            } else if (x != -INFINITY) {
                acc.s += (double)expf(x - acc.m); /* NaN: reaches the sum */
            }
        }
        acc = block_lse(acc, shf, shd);
        const double sum_z = eps > 0.0f ? block_sum(sz, shd) : 0.0;
        lse = (double)acc.m + log(acc.s);
        double loss = 0.0;
        if (valid) {
            loss = lse - (1.0 - (double)eps) * (double)zy + (double)zl * lse * lse;
            if (eps > 0.0f)
                loss -= (double)eps * sum_z / (double)V;
        }
        if (threadIdx.x == 0) {
            row_loss[n] = loss;
            if (p.lse_out)
                p.lse_out[n] = (float)lse;
            if (p.loss && p.reduction == FX_REDUCTION_NONE)
                p.loss[n] = (float)loss;
        }
    } else {
        lse = p.lse_in[n];
    }
    if (!grads)
        return;

    /* d(reduced loss)/d(token loss) times the upstream gradient. */
    double gscale = 1.0;
    if (!forward)
        gscale = p.reduction == FX_REDUCTION_NONE ? (double)p.grad_loss[n] : (double)p.grad_loss[0];
    if (p.reduction == FX_REDUCTION_MEAN)
        gscale = p.n_valid > 0 ? gscale / (double)p.n_valid : 0.0;
    const float sc = valid ? (float)gscale : 0.0f, lf = (float)lse;
    const float a = sc * (1.0f + 2.0f * zl * lf), b = sc * eps * (float)(1.0 / (double)V);
    T *g = (T *)(Z + r * ldz);
    __syncthreads(); /* every thread has read z[y] before any G lands on it */
    /* Tiles of 2 x RTHREADS entries: a tile's G lands on memory whose float32 logits every
       thread has read by the barrier (a bfloat16 G is half as wide). */
    for (int64_t t0 = 0; t0 < V; t0 += 2 * RTHREADS) {
        float gv[2];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int64_t j = t0 + u * RTHREADS + threadIdx.x;
            gv[u] = 0.0f;
            if (j < V) {
                const float x = logit(z, bias, j, cap);
                float gj = a * expf(x - lf) - b;
                if (valid && j == y)
                    gj = a * expf(zy - lf) - b - sc * (1.0f - eps);
                if (cap > 0.0f) {
                    const float w = x / cap;
                    gj *= 1.0f - w * w;
                }
                gv[u] = gj;
            }
        }
        if (sizeof(T) != sizeof(float))
            __syncthreads();
#pragma unroll
        for (int u = 0; u < 2; u++) {
            const int64_t j = t0 + u * RTHREADS + threadIdx.x;
            if (j < V)
                store(g, j, gv[u]);
        }
    }
}

/* dbias[j] += sum over the chunk's rows (ascending) of G[r, j] (row stride ldg). */
template <typename T> __global__ void dbias_kernel(const T *G, int64_t ldg, int64_t c, int64_t V, T *dbias)
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= V)
        return;
    float s = 0.0f;
    for (int64_t r = 0; r < c; r++)
        s += load(G, r * ldg + j);
    store(dbias, j, load(dbias, j) + s);
}

/* MEAN / SUM: the row losses summed in token order, as the CPU path does. */
__global__ void loss_kernel(const double *row_loss, int64_t N, int reduction, int64_t n_valid, float *loss)
{
    double total = 0.0;
    for (int64_t i = 0; i < N; i++)
        total += row_loss[i];
    if (reduction == FX_REDUCTION_MEAN)
        loss[0] = n_valid > 0 ? (float)(total / (double)n_valid) : NAN;
    else
        loss[0] = (float)total;
}

template <typename T> int run(const fx__cu_lce *p)
{
    cudaStream_t st = (cudaStream_t)p->stream;
    const bool forward = p->lse_in == NULL, grads = p->dh || p->dw || p->dbias;
    const int64_t N = p->N, D = p->D, V = p->V, C = p->chunk;
    const int ty = dtype_of<T>::value;
    /* The logits' row stride: V rounded up to 8 floats, so that every row of Z, and of the
       gradient G written over it in bfloat16, starts on 16 bytes. With an odd V (50257) the
       products would otherwise run the matrix library's unaligned kernels (measured on an
       H200: a 14 ms product of 2 ms). */
    const int64_t ldz = (V + 7) / 8 * 8;
    const int64_t ldg = ldz * (int64_t)(sizeof(float) / sizeof(T)); /* G's row stride, in T */
    const T *h = (const T *)p->h, *w = (const T *)p->w;
    T *dh = (T *)p->dh, *dw = (T *)p->dw, *dbias = (T *)p->dbias;
    float *Z = NULL;
    double *row_loss = NULL;
    cudaError_t e = cudaMallocAsync((void **)&Z, (size_t)C * (size_t)ldz * sizeof(float), st);
    if (e == cudaSuccess && forward)
        e = cudaMallocAsync((void **)&row_loss, (size_t)N * sizeof(double), st);
    if (e != cudaSuccess) {
        if (Z)
            (void)cudaFreeAsync(Z, st);
        (void)cudaStreamSynchronize(st);
        return fx__cuda_status((int)e, "fused cross-entropy: logits buffer");
    }
    int rc = FX_OK;
    /* Chunks share the tokens evenly (at most C each), as on the CPU. */
    const int64_t nch = (N + C - 1) / C, base = N / nch, rem = N % nch;
    for (int64_t q = 0; q < nch && rc == FX_OK; q++) {
        const int64_t n0 = q * base + (q < rem ? q : rem), c = base + (q < rem);
        bool any_valid = false;
        for (int64_t r = 0; r < c; r++)
            any_valid |= p->host_target[n0 + r] != p->ignore_index;
        if (!forward && (!grads || !any_valid)) {
            if (dh)
                e = cudaMemsetAsync(dh + n0 * D, 0, (size_t)(c * D) * sizeof(T), st);
            continue;
        }
        rc = gemm(st, c, V, D, h + n0 * D, D, false, w, D, true, ty, Z, ldz, FX_DT_F32, false);
        if (rc != FX_OK)
            break;
        FX_LAUNCH(row_kernel<T>, (unsigned)c, RTHREADS, 0, st)(*p, Z, ldz, n0, row_loss, grads && any_valid);
        if ((rc = launched("fused cross-entropy: rows")) != FX_OK || !grads)
            continue;
        if (!any_valid) {
            if (dh)
                e = cudaMemsetAsync(dh + n0 * D, 0, (size_t)(c * D) * sizeof(T), st);
            continue;
        }
        const T *G = (const T *)Z;
        if (dh)
            rc = gemm(st, c, D, V, G, ldg, false, w, D, false, ty, dh + n0 * D, D, ty, false);
        if (rc == FX_OK && dw)
            rc = gemm(st, V, D, c, G, ldg, true, h + n0 * D, D, false, ty, dw, D, ty, true);
        if (rc == FX_OK && dbias) {
            FX_LAUNCH(dbias_kernel<T>, (unsigned)((V + 255) / 256), 256, 0, st)(G, ldg, c, V, dbias);
            rc = launched("fused cross-entropy: dbias");
        }
    }
    if (rc == FX_OK && e != cudaSuccess)
        rc = fx__cuda_status((int)e, "fused cross-entropy: clearing dh");
    if (rc == FX_OK && forward && p->loss && p->reduction != FX_REDUCTION_NONE) {
        FX_LAUNCH(loss_kernel, 1, 1, 0, st)(row_loss, N, p->reduction, p->n_valid, p->loss);
        rc = launched("fused cross-entropy: loss");
    }
    (void)cudaFreeAsync(Z, st);
    if (row_loss)
        (void)cudaFreeAsync(row_loss, st);
    e = cudaStreamSynchronize(st);
    if (rc == FX_OK && e != cudaSuccess)
        rc = fx__cuda_status((int)e, "fused cross-entropy");
    return rc;
}

} // namespace
} // namespace fxcu

extern "C" int fx__cu_lce_run(const fx__cu_lce *p)
{
    return p->bf16 ? fxcu::run<fxcu::bf16>(p) : fxcu::run<float>(p);
}
