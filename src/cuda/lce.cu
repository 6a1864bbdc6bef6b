/* The fused linear + cross-entropy on CUDA: the CPU path's algorithm (docs/lce.md) on device
   memory, float32 or bfloat16 in and out, float32 arithmetic with float64 row sums.

   Tokens go in chunks of at most p->chunk rows, in order: the chunk's logits Z = h W^T are
   one GEMM into a [chunk, V] float buffer (never all N rows); one thread block per row then
   applies bias and softcap, finds the log-sum-exp and the loss, and turns the row into
   d loss / d logits in place; two more GEMMs give dh = G W (overwritten) and dw += G^T h,
   and a column sum gives dbias. The GEMM is a plain 64 x 64 tiled kernel in which each
   output element is summed by one thread in ascending k: with chunks in order, the result
   is the same on every run and for any grid. */
#include "cuda/common.cuh"

namespace fxcu {
namespace {

enum { GT = 64, GK = 16, GTHREADS = 256, RTHREADS = 256 };

/* C[M,N] (ldc) = (acc ? C : 0) + op(A)[M,K] op(B)[K,N], with op(A)[m,k] = ta ? A[k*lda+m] :
   A[m*lda+k] and op(B)[k,n] = tb ? B[n*ldb+k] : B[k*ldb+n]. */
template <typename TA, typename TB, typename TC>
__global__ void __launch_bounds__(GTHREADS)
    gemm_kernel(int64_t M, int64_t N, int64_t K, const TA *A, int64_t lda, int ta, const TB *B, int64_t ldb, int tb,
                TC *C, int64_t ldc, int acc)
{
    __shared__ float As[GK][GT + 1], Bs[GK][GT + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int64_t m0 = (int64_t)blockIdx.y * GT, n0 = (int64_t)blockIdx.x * GT;
    float c[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            c[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += GK) {
        /* Consecutive threads read consecutive addresses in either layout. */
        for (int i = threadIdx.x; i < GK * GT; i += GTHREADS) {
            const int kk = ta ? i / GT : i % GK, mm = ta ? i % GT : i / GK;
            const int64_t m = m0 + mm, k = k0 + kk;
            As[kk][mm] = m < M && k < K ? load(A, ta ? k * lda + m : m * lda + k) : 0.0f;
            const int kb = tb ? i % GK : i / GT, nb = tb ? i / GK : i % GT;
            const int64_t n = n0 + nb, kq = k0 + kb;
            Bs[kb][nb] = n < N && kq < K ? load(B, tb ? n * ldb + kq : kq * ldb + n) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++)
                b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    c[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m < M && n < N) {
                float x = c[i][j];
                if (acc)
                    x += load(C, m * ldc + n);
                store(C, m * ldc + n, x);
            }
        }
}

template <typename TA, typename TB, typename TC>
int gemm(cudaStream_t st, int64_t M, int64_t N, int64_t K, const TA *A, int64_t lda, bool ta, const TB *B,
         int64_t ldb, bool tb, TC *C, int64_t ldc, bool acc, const char *what)
{
    if ((M + GT - 1) / GT > 65535 || (N + GT - 1) / GT > INT32_MAX)
        return fx__error(FX_EUNSUPPORTED, "%s: a %lld x %lld product is past the GEMM kernel's grid", what,
                         (long long)M, (long long)N);
    const dim3 grid((unsigned)((N + GT - 1) / GT), (unsigned)((M + GT - 1) / GT));
    auto kernel = gemm_kernel<TA, TB, TC>;
    FX_LAUNCH(kernel, grid, GTHREADS, 0, st)(M, N, K, A, lda, ta, B, ldb, tb, C, ldc, acc);
    return launched(what);
}

/* Fixed-tree block reductions over RTHREADS threads (every thread gets the result). */
__device__ float block_max(float x, float *sh)
{
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int s = RTHREADS / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            const float o = sh[threadIdx.x + s];
            sh[threadIdx.x] = o > sh[threadIdx.x] ? o : sh[threadIdx.x];
        }
        __syncthreads();
    }
    const float r = sh[0];
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

/* One token row of the chunk: z = cap tanh((z + bias) / cap); the forward finds lse and the
   loss; with grads the row becomes d loss / d z (the CPU path's formula:
   p_j (1 + 2 s lse) sc - eps sc / V - (1 - eps) sc [j == y], times 1 - (z/cap)^2). */
template <typename T>
__global__ void __launch_bounds__(RTHREADS) row_kernel(fx__cu_lce p, float *Z, int64_t n0, double *row_loss, int grads)
{
    __shared__ float shf[RTHREADS];
    __shared__ double shd[RTHREADS];
    const int64_t r = blockIdx.x, n = n0 + r, V = p.V;
    float *z = Z + r * V;
    const T *bias = (const T *)p.bias;
    const int64_t y = p.target[n];
    const bool valid = y != p.ignore_index, forward = p.lse_in == NULL;
    const float cap = p.cap, eps = p.eps, zl = p.zl;

    float mx = -INFINITY;
    double sz = 0.0;
    for (int64_t j = threadIdx.x; j < V; j += RTHREADS) {
        float x = z[j] + (bias ? load(bias, j) : 0.0f);
        if (cap > 0.0f)
            x = cap * tanhf(x / cap);
        z[j] = x;
        mx = x > mx ? x : mx; /* a NaN reaches the result through the sum of exps */
        sz += x;
    }
    double lse;
    if (forward) {
        const float M = block_max(mx, shf);
        const double sum_z = block_sum(sz, shd);
        double s = 0.0;
        if (M != -INFINITY)
            for (int64_t j = threadIdx.x; j < V; j += RTHREADS)
                s += expf(z[j] - M);
        s = block_sum(s, shd);
        lse = (double)M + log(s);
        double loss = 0.0;
        if (valid) {
            loss = lse - (1.0 - (double)eps) * (double)z[y] + (double)zl * lse * lse;
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
        __syncthreads(); /* z[y] below may come from another thread */
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
    const float zy = valid ? z[y] : 0.0f;
    __syncthreads(); /* every thread has read z[y] before any overwrites it */
    for (int64_t j = threadIdx.x; j < V; j += RTHREADS) {
        const float x = z[j];
        float g = a * expf(x - lf) - b;
        if (valid && j == y)
            g = a * expf(zy - lf) - b - sc * (1.0f - eps);
        if (cap > 0.0f) {
            const float u = x / cap;
            g *= 1.0f - u * u;
        }
        z[j] = g;
    }
}

/* dbias[j] += sum over the chunk's rows (ascending) of G[r, j]. */
template <typename T> __global__ void dbias_kernel(const float *G, int64_t c, int64_t V, T *dbias)
{
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= V)
        return;
    float s = 0.0f;
    for (int64_t r = 0; r < c; r++)
        s += G[r * V + j];
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
    const T *h = (const T *)p->h, *w = (const T *)p->w;
    T *dh = (T *)p->dh, *dw = (T *)p->dw, *dbias = (T *)p->dbias;
    float *Z = NULL;
    double *row_loss = NULL;
    cudaError_t e = cudaMallocAsync((void **)&Z, (size_t)C * (size_t)V * sizeof(float), st);
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
        rc = gemm<T, T, float>(st, c, V, D, h + n0 * D, D, false, w, D, true, Z, V, false, "fused cross-entropy: logits");
        if (rc != FX_OK)
            break;
        FX_LAUNCH(row_kernel<T>, (unsigned)c, RTHREADS, 0, st)(*p, Z, n0, row_loss, grads && any_valid);
        if ((rc = launched("fused cross-entropy: rows")) != FX_OK || !grads)
            continue;
        if (!any_valid) {
            if (dh)
                e = cudaMemsetAsync(dh + n0 * D, 0, (size_t)(c * D) * sizeof(T), st);
            continue;
        }
        if (dh)
            rc = gemm<float, T, T>(st, c, D, V, Z, V, false, w, D, false, dh + n0 * D, D, false,
                                   "fused cross-entropy: dh");
        if (rc == FX_OK && dw)
            rc = gemm<float, T, T>(st, V, D, c, Z, V, true, h + n0 * D, D, false, dw, D, true, "fused cross-entropy: dw");
        if (rc == FX_OK && dbias) {
            FX_LAUNCH(dbias_kernel<T>, (unsigned)((V + 255) / 256), 256, 0, st)(Z, c, V, dbias);
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
