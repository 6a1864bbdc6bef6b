// The GPT's layers on a CUDA device (train.h): embedding, RMSNorm, RoPE and the head
// layouts, SwiGLU, biases, bfloat16 rounding, AdamW and the gradient norm's partial sums.
// Plain kernels, one thread per element or one block per row; the layers' arithmetic is the
// CPU's (src/model/layers.c, optim.c), and every reduction has a fixed order.
#include "cuda/common.cuh"
#include "cuda/train.h"

namespace fxcu {
namespace {

constexpr int EW = 256;  // threads per block of the element-wise kernels
constexpr int ROW = 128; // threads per block of the row kernels (one row per block)

inline unsigned nblocks(int64_t n, int64_t per) { return (unsigned)((n + per - 1) / per); }

// Each product and sum rounded on its own, never contracted into a fused multiply-add: the
// CPU's layers are built that way too (-ffp-contract=off), so both give the same bits where
// their order of operations is the same.
#ifdef FX_CUDA_EMU
inline float rn_mul(float a, float b) { return a * b; }
inline float rn_add(float a, float b) { return a + b; }
inline float rn_sub(float a, float b) { return a - b; }
inline float rn_div(float a, float b) { return a / b; }
#else
__device__ __forceinline__ float rn_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float rn_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float rn_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float rn_div(float a, float b) { return __fdiv_rn(a, b); }
#endif

// The sum of one value per thread of a ROW-thread block, as a float64 tree of a fixed shape;
// every thread gets the result.
__device__ double row_sum(double x)
{
    __shared__ double sh[ROW];
    sh[threadIdx.x] = x;
    __syncthreads();
    for (int w = ROW / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    const double r = sh[0];
    __syncthreads();
    return r;
}

// ---- embedding -------------------------------------------------------------------------

__global__ void embed_fwd(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i < N * C)
        out[i] = wte[(int64_t)tokens[i / C] * C + i % C];
}

// Block (u, column block): token id uniq[u]'s row of dwte, its positions added in order.
__global__ void embed_bwd(float *dwte, const float *dout, const int32_t *uniq, const int32_t *ptr,
                          const int32_t *pos, int64_t C)
{
    const int64_t u = blockIdx.x, c = (int64_t)blockIdx.y * EW + threadIdx.x;
    if (c >= C)
        return;
    float *d = dwte + (int64_t)uniq[u] * C + c;
    float acc = *d;
    for (int32_t p = ptr[u]; p < ptr[u + 1]; p++)
        acc += dout[(int64_t)pos[p] * C + c];
    *d = acc;
}

// ---- RMSNorm -----------------------------------------------------------------------------

template <typename T>
__global__ void rms_fwd(T *out, float *rstd, const float *inp, const float *w, int64_t C, float eps)
{
    const int64_t n = blockIdx.x;
    const float *x = inp + n * C;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += ROW)
        s += (double)x[c] * x[c];
    s = row_sum(s);
    const float r = (float)(1.0 / sqrt(s / (double)C + (double)eps));
    for (int64_t c = threadIdx.x; c < C; c += ROW)
        store(out, n * C + c, rn_mul(rn_mul(x[c], r), w[c]));
    if (threadIdx.x == 0)
        rstd[n] = r;
}

// dx = r dy w - k x with k = r^3 mean(dy w x), added to dinp.
__global__ void rms_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w, const float *rstd,
                           int64_t C)
{
    const int64_t n = blockIdx.x;
    const float *dy = dout + n * C, *x = inp + n * C;
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < C; c += ROW)
        s += (double)dy[c] * w[c] * x[c];
    s = row_sum(s);
    const float r = rstd[n];
    const float k = rn_mul(rn_mul(rn_mul((float)(s / (double)C), r), r), r);
    for (int64_t c = threadIdx.x; c < C; c += ROW) {
        const float a = rn_mul(rn_mul(r, dy[c]), w[c]), b = rn_mul(k, x[c]);
        dinp[n * C + c] = rn_add(dinp[n * C + c], rn_sub(a, b));
    }
}

// Column sums, first pass: parts[chunk, c] = sum over the chunk's rows, in order, of x[n, c]
// (times y[n, c] r[n] when y is given: RMSNorm's weight gradient dy x r).
__global__ void colsum_parts(float *parts, const float *x, const float *y, const float *r, int64_t N, int64_t C)
{
    const int64_t c = (int64_t)blockIdx.x * EW + threadIdx.x, ch = blockIdx.y;
    if (c >= C)
        return;
    const int64_t n0 = ch * FX__CU_COLSUM_ROWS, n1 = n0 + FX__CU_COLSUM_ROWS < N ? n0 + FX__CU_COLSUM_ROWS : N;
    float acc = 0.0f;
    for (int64_t n = n0; n < n1; n++)
        acc = y ? rn_add(acc, rn_mul(rn_mul(x[n * C + c], y[n * C + c]), r[n])) : acc + x[n * C + c];
    parts[ch * C + c] = acc;
}

// Second pass: out[c] += the chunks' partials in chunk order.
__global__ void colsum_finish(float *out, const float *parts, int64_t nch, int64_t C)
{
    const int64_t c = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (c >= C)
        return;
    float acc = 0.0f;
    for (int64_t ch = 0; ch < nch; ch++)
        acc += parts[ch * C + c];
    out[c] += acc;
}

__global__ void bias_fwd(float *y, const float *b, int64_t N, int64_t O)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i < N * O)
        y[i] += b[i % O];
}

// ---- RoPE and the head layouts --------------------------------------------------------------

// One pair (x0, x1) rotated by the table's (cos, sin), the sine taken with sign sg (-1: the
// transpose, for the backward pass); as rope_heads in layers.c.
__device__ __forceinline__ void rotate(float &y0, float &y1, float x0, float x1, const float *cs, float sg)
{
    const float c = cs[0], s = sg * cs[1];
    y0 = rn_sub(rn_mul(x0, c), rn_mul(x1, s));
    y1 = rn_add(rn_mul(x0, s), rn_mul(x1, c));
}

// Where pair p (columns 2p, 2p+1) of a token's q, k, v row lives head-major, and whether RoPE
// turns it: *which 0, 1, 2 for q, k, v.
__device__ __forceinline__ int64_t qkv_place(int64_t p, int64_t b, int64_t t, int64_t T, int64_t Hq, int64_t Hkv,
                                             int64_t hd, int *which)
{
    int64_t col = 2 * p, H = Hq;
    *which = 0;
    if (col >= Hq * hd) {
        col -= Hq * hd, H = Hkv, *which = 1;
        if (col >= Hkv * hd)
            col -= Hkv * hd, *which = 2;
    }
    return ((b * H + col / hd) * T + t) * hd + col % hd;
}

template <typename T>
__global__ void qkv_to_heads(T *q, T *k, T *v, const float *qkv, const float *rope, int64_t B, int64_t Tn,
                             int64_t Hq, int64_t Hkv, int64_t hd)
{
    const int64_t half = (Hq + 2 * Hkv) * hd / 2, i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= B * Tn * half)
        return;
    const int64_t bt = i / half, p = i % half, b = bt / Tn, t = bt % Tn;
    int which;
    const int64_t o = qkv_place(p, b, t, Tn, Hq, Hkv, hd, &which);
    float y0 = qkv[bt * 2 * half + 2 * p], y1 = qkv[bt * 2 * half + 2 * p + 1];
    if (which < 2)
        rotate(y0, y1, y0, y1, rope + t * hd + o % hd, 1.0f);
    T *dst = which == 0 ? q : which == 1 ? k : v;
    store(dst, o, y0);
    store(dst, o + 1, y1);
}

template <typename T>
__global__ void qkv_from_heads(float *dqkv, const T *dq, const T *dk, const T *dv, const float *rope, int64_t B,
                               int64_t Tn, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const int64_t half = (Hq + 2 * Hkv) * hd / 2, i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= B * Tn * half)
        return;
    const int64_t bt = i / half, p = i % half, b = bt / Tn, t = bt % Tn;
    int which;
    const int64_t o = qkv_place(p, b, t, Tn, Hq, Hkv, hd, &which);
    const T *src = which == 0 ? dq : which == 1 ? dk : dv;
    float y0 = load(src, o), y1 = load(src, o + 1);
    if (which < 2)
        rotate(y0, y1, y0, y1, rope + t * hd + o % hd, -1.0f);
    dqkv[bt * 2 * half + 2 * p] = y0;
    dqkv[bt * 2 * half + 2 * p + 1] = y1;
}

// Token-major [B,T,H,hd] (rows ld apart) <-> head-major [B,H,T,hd], one thread per element
// of the head-major side; to_heads reads the token-major side.
template <typename TI, typename TO>
__device__ __forceinline__ void heads_move(TO *out, const TI *x, int64_t ld, int64_t B, int64_t Tn, int64_t H,
                                           int64_t hd, bool to_heads)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= B * H * Tn * hd)
        return;
    const int64_t d = i % hd, t = (i / hd) % Tn, h = (i / (hd * Tn)) % H, b = i / (hd * Tn * H);
    const int64_t tok = (b * Tn + t) * ld + h * hd + d;
    if (to_heads)
        store(out, i, load(x, tok));
    else
        store(out, tok, load(x, i));
}

template <typename T>
__global__ void to_heads(T *out, const float *x, int64_t ld, int64_t B, int64_t Tn, int64_t H, int64_t hd)
{
    heads_move(out, x, ld, B, Tn, H, hd, true);
}

template <typename T>
__global__ void from_heads(T *out, const T *x, int64_t ld, int64_t B, int64_t Tn, int64_t H, int64_t hd)
{
    heads_move(out, x, ld, B, Tn, H, hd, false);
}

// ---- SwiGLU ---------------------------------------------------------------------------------

template <typename T> __global__ void swiglu_fwd(T *out, const float *h13, int64_t N, int64_t F)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= N * F)
        return;
    const int64_t n = i / F, j = i % F;
    const float a = h13[n * 2 * F + j], b = h13[n * 2 * F + F + j];
    const float s = 1.0f / (1.0f + expf(-a));
    store(out, i, rn_mul(rn_mul(a, s), b));
}

__global__ void swiglu_bwd(float *dh13, const float *dout, const float *h13, int64_t N, int64_t F)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= N * F)
        return;
    const int64_t n = i / F, j = i % F;
    const float a = h13[n * 2 * F + j], y = h13[n * 2 * F + F + j], d = dout[i];
    const float s = 1.0f / (1.0f + expf(-a)), silu = rn_mul(a, s);
    dh13[n * 2 * F + j] = rn_mul(rn_mul(d, y), rn_add(s, rn_mul(silu, rn_sub(1.0f, s))));
    dh13[n * 2 * F + F + j] = rn_mul(d, silu);
}

// ---- casts, optimizer, norm ------------------------------------------------------------------

template <typename T> __global__ void round_bf16(T *out, const float *x, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i < n)
        store(out, i, __bfloat162float(__float2bfloat16_rn(x[i])));
}

__global__ void widen_bf16(float *out, int acc, const bf16 *x, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i < n)
        out[i] = acc ? out[i] + __bfloat162float(x[i]) : __bfloat162float(x[i]);
}

__global__ void adamw(float *p, float *g, float *m, float *v, bf16 *p16, int64_t n, fx__cu_adamw_k k)
{
    const int64_t i = (int64_t)blockIdx.x * EW + threadIdx.x;
    if (i >= n)
        return;
    const float gi = rn_mul(g[i], k.gs);
    const float mi = rn_add(rn_mul(k.b1, m[i]), rn_mul(k.nb1, gi));
    const float vi = rn_add(rn_mul(k.b2, v[i]), rn_mul(rn_mul(k.nb2, gi), gi));
    m[i] = mi;
    v[i] = vi;
    const float den = rn_add(sqrtf(rn_div(vi, k.bc2)), k.eps);
    const float upd = rn_add(rn_div(rn_div(mi, k.bc1), den), rn_mul(k.wd, p[i]));
    const float pn = rn_sub(p[i], rn_mul(k.lr, upd));
    p[i] = pn;
    if (p16)
        p16[i] = __float2bfloat16_rn(pn);
    if (k.zero_grad)
        g[i] = 0.0f;
}

__global__ void sumsq(double *parts, const float *g, int64_t n)
{
    const int64_t i0 = (int64_t)blockIdx.x * FX__CU_SUMSQ_CHUNK;
    const int64_t i1 = i0 + FX__CU_SUMSQ_CHUNK < n ? i0 + FX__CU_SUMSQ_CHUNK : n;
    double s = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += ROW)
        s += (double)g[i] * g[i];
    s = row_sum(s);
    if (threadIdx.x == 0)
        parts[blockIdx.x] = s;
}

} // namespace
} // namespace fxcu

using namespace fxcu;

// ---- launchers ------------------------------------------------------------------------------

int fx__cu_embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C)
{
    if (N * C == 0)
        return FX_OK;
    FX_LAUNCH(embed_fwd, nblocks(N * C, EW), EW, 0, 0)(out, tokens, wte, N, C);
    return launched("embedding forward");
}

int fx__cu_embed_backward(float *dwte, const float *dout, const int32_t *uniq, const int32_t *ptr,
                          const int32_t *pos, int64_t U, int64_t C)
{
    if (U == 0 || C == 0)
        return FX_OK;
    FX_LAUNCH(embed_bwd, dim3((unsigned)U, nblocks(C, EW)), EW, 0, 0)(dwte, dout, uniq, ptr, pos, C);
    return launched("embedding backward");
}

int fx__cu_rmsnorm_forward(void *out, int bf16_out, float *rstd, const float *inp, const float *w, int64_t N,
                           int64_t C, float eps)
{
    if (N == 0)
        return FX_OK;
    if (bf16_out)
        FX_LAUNCH(rms_fwd<bf16>, (unsigned)N, ROW, 0, 0)((bf16 *)out, rstd, inp, w, C, eps);
    else
        FX_LAUNCH(rms_fwd<float>, (unsigned)N, ROW, 0, 0)((float *)out, rstd, inp, w, C, eps);
    return launched("RMSNorm forward");
}

int fx__cu_rmsnorm_backward(float *dinp, float *dw, float *parts, const float *dout, const float *inp,
                            const float *w, const float *rstd, int64_t N, int64_t C)
{
    if (N == 0)
        return FX_OK;
    FX_LAUNCH(rms_bwd_dx, (unsigned)N, ROW, 0, 0)(dinp, dout, inp, w, rstd, C);
    int rc = launched("RMSNorm backward");
    if (rc != FX_OK)
        return rc;
    const int64_t nch = (N + FX__CU_COLSUM_ROWS - 1) / FX__CU_COLSUM_ROWS;
    FX_LAUNCH(colsum_parts, dim3(nblocks(C, EW), (unsigned)nch), EW, 0, 0)(parts, dout, inp, rstd, N, C);
    FX_LAUNCH(colsum_finish, nblocks(C, EW), EW, 0, 0)(dw, parts, nch, C);
    return launched("RMSNorm weight gradient");
}

int fx__cu_colsum(float *out, float *parts, const float *x, int64_t N, int64_t C)
{
    if (N == 0 || C == 0)
        return FX_OK;
    const int64_t nch = (N + FX__CU_COLSUM_ROWS - 1) / FX__CU_COLSUM_ROWS;
    FX_LAUNCH(colsum_parts, dim3(nblocks(C, EW), (unsigned)nch), EW, 0, 0)(parts, x, nullptr, nullptr, N, C);
    FX_LAUNCH(colsum_finish, nblocks(C, EW), EW, 0, 0)(out, parts, nch, C);
    return launched("column sums");
}

int fx__cu_bias_forward(float *y, const float *b, int64_t N, int64_t O)
{
    if (N * O == 0)
        return FX_OK;
    FX_LAUNCH(bias_fwd, nblocks(N * O, EW), EW, 0, 0)(y, b, N, O);
    return launched("bias");
}

int fx__cu_qkv_to_heads(void *q, void *k, void *v, int bf16_out, const float *qkv, const float *rope, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const int64_t n = B * T * (Hq + 2 * Hkv) * hd / 2;
    if (n == 0)
        return FX_OK;
    if (bf16_out)
        FX_LAUNCH(qkv_to_heads<bf16>, nblocks(n, EW), EW, 0, 0)((bf16 *)q, (bf16 *)k, (bf16 *)v, qkv, rope, B, T,
                                                                 Hq, Hkv, hd);
    else
        FX_LAUNCH(qkv_to_heads<float>, nblocks(n, EW), EW, 0, 0)((float *)q, (float *)k, (float *)v, qkv, rope, B,
                                                                  T, Hq, Hkv, hd);
    return launched("q, k, v to heads");
}

int fx__cu_qkv_from_heads(float *dqkv, const void *dq, const void *dk, const void *dv, int bf16_in, const float *rope,
                          int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const int64_t n = B * T * (Hq + 2 * Hkv) * hd / 2;
    if (n == 0)
        return FX_OK;
    if (bf16_in)
        FX_LAUNCH(qkv_from_heads<bf16>, nblocks(n, EW), EW, 0, 0)(dqkv, (const bf16 *)dq, (const bf16 *)dk,
                                                                   (const bf16 *)dv, rope, B, T, Hq, Hkv, hd);
    else
        FX_LAUNCH(qkv_from_heads<float>, nblocks(n, EW), EW, 0, 0)(dqkv, (const float *)dq, (const float *)dk,
                                                                    (const float *)dv, rope, B, T, Hq, Hkv, hd);
    return launched("q, k, v gradients from heads");
}

int fx__cu_to_heads(void *out, int bf16_out, const float *x, int64_t ldx, int64_t B, int64_t T, int64_t H, int64_t hd)
{
    const int64_t n = B * T * H * hd;
    if (n == 0)
        return FX_OK;
    if (bf16_out)
        FX_LAUNCH(to_heads<bf16>, nblocks(n, EW), EW, 0, 0)((bf16 *)out, x, ldx, B, T, H, hd);
    else
        FX_LAUNCH(to_heads<float>, nblocks(n, EW), EW, 0, 0)((float *)out, x, ldx, B, T, H, hd);
    return launched("to heads");
}

int fx__cu_from_heads(void *out, int64_t ldo, const void *x, int bf16_io, int64_t B, int64_t T, int64_t H, int64_t hd)
{
    const int64_t n = B * T * H * hd;
    if (n == 0)
        return FX_OK;
    if (bf16_io)
        FX_LAUNCH(from_heads<bf16>, nblocks(n, EW), EW, 0, 0)((bf16 *)out, (const bf16 *)x, ldo, B, T, H, hd);
    else
        FX_LAUNCH(from_heads<float>, nblocks(n, EW), EW, 0, 0)((float *)out, (const float *)x, ldo, B, T, H, hd);
    return launched("from heads");
}

int fx__cu_swiglu_forward(void *out, int bf16_out, const float *h13, int64_t N, int64_t F)
{
    if (N * F == 0)
        return FX_OK;
    if (bf16_out)
        FX_LAUNCH(swiglu_fwd<bf16>, nblocks(N * F, EW), EW, 0, 0)((bf16 *)out, h13, N, F);
    else
        FX_LAUNCH(swiglu_fwd<float>, nblocks(N * F, EW), EW, 0, 0)((float *)out, h13, N, F);
    return launched("SwiGLU forward");
}

int fx__cu_swiglu_backward(float *dh13, const float *dout, const float *h13, int64_t N, int64_t F)
{
    if (N * F == 0)
        return FX_OK;
    FX_LAUNCH(swiglu_bwd, nblocks(N * F, EW), EW, 0, 0)(dh13, dout, h13, N, F);
    return launched("SwiGLU backward");
}

int fx__cu_round_bf16(void *out, int bf16_out, const float *x, int64_t n)
{
    if (n == 0)
        return FX_OK;
    if (bf16_out)
        FX_LAUNCH(round_bf16<bf16>, nblocks(n, EW), EW, 0, 0)((bf16 *)out, x, n);
    else
        FX_LAUNCH(round_bf16<float>, nblocks(n, EW), EW, 0, 0)((float *)out, x, n);
    return launched("bfloat16 rounding");
}

int fx__cu_widen_bf16(float *out, int acc, const uint16_t *x, int64_t n)
{
    if (n == 0)
        return FX_OK;
    FX_LAUNCH(widen_bf16, nblocks(n, EW), EW, 0, 0)(out, acc, (const bf16 *)x, n);
    return launched("bfloat16 widening");
}

int fx__cu_adamw(float *p, float *g, float *m, float *v, uint16_t *p16, int64_t n, const fx__cu_adamw_k *k)
{
    if (n == 0)
        return FX_OK;
    FX_LAUNCH(adamw, nblocks(n, EW), EW, 0, 0)(p, g, m, v, (bf16 *)p16, n, *k);
    return launched("AdamW");
}

int fx__cu_sumsq(double *parts, const float *g, int64_t n)
{
    if (n == 0)
        return FX_OK;
    FX_LAUNCH(sumsq, nblocks(n, FX__CU_SUMSQ_CHUNK), ROW, 0, 0)(parts, g, n);
    return launched("gradient norm");
}
