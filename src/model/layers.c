/* The GPT's layers: RMSNorm, RoPE, SwiGLU, embedding, the reference attention and the
   unfused loss. Plain C, parallel over rows; every reduction over tokens runs in a fixed
   order so results do not depend on the thread count. */
#include "model.h"
#include "model/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Channels per task when a reduction runs over tokens: each task owns a slice of channels
   and walks the tokens in order. */
enum { FX__CBLOCK = 64 };

/* ---- RMSNorm --------------------------------------------------------------------------- */

/* The row sums of RMSNorm in float64, in 8 lanes (element c in lane c % 8) added pairwise at
   the end: eight independent chains instead of one (a float64 add waits 4 cycles for the
   previous), in an order that depends on C only, so that a vector of 8 doubles
   (rmsnorm_avx512.c), or two of 4 (rmsnorm_avx2.c), computes the same bits. */
double fx__rms_lanes_sum(double *lane)
{
    for (int w = FX__RMS_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++)
            lane[j] += lane[j + w];
    return lane[0];
}

static double rms_sumsq_scalar(const float *x, int64_t C)
{
    double lane[FX__RMS_LANES] = {0};
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES)
        for (int j = 0; j < FX__RMS_LANES; j++)
            lane[j] += (double)x[c + j] * x[c + j];
    for (int j = 0; c + j < C; j++)
        lane[j] += (double)x[c + j] * x[c + j];
    return fx__rms_lanes_sum(lane);
}

static double rms_dot3_scalar(const float *dy, const float *w, const float *x, int64_t C)
{
    double lane[FX__RMS_LANES] = {0};
    int64_t c = 0;
    for (; c + FX__RMS_LANES <= C; c += FX__RMS_LANES)
        for (int j = 0; j < FX__RMS_LANES; j++)
            lane[j] += (double)dy[c + j] * w[c + j] * x[c + j];
    for (int j = 0; c + j < C; j++)
        lane[j] += (double)dy[c + j] * w[c + j] * x[c + j];
    return fx__rms_lanes_sum(lane);
}

static void rms_scale_scalar(float *y, const float *x, float r, const float *w, int64_t C)
{
    for (int64_t c = 0; c < C; c++)
        y[c] = x[c] * r * w[c];
}

static void rms_dx_scalar(float *dx, const float *dy, const float *w, const float *x, float r, float k, int64_t C)
{
    for (int64_t c = 0; c < C; c++)
        dx[c] += r * dy[c] * w[c] - k * x[c];
}

static void rms_dw_scalar(float *acc, const float *dy, const float *x, float r, int64_t n)
{
    for (int64_t c = 0; c < n; c++)
        acc[c] += dy[c] * x[c] * r;
}

static const fx__rms_ops fx__rms_ops_scalar = {rms_sumsq_scalar, rms_dot3_scalar, rms_scale_scalar, rms_dx_scalar,
                                               rms_dw_scalar};

const fx__rmsnorm_kernels fx__rmsnorm_kernels_scalar = {"scalar", &fx__rms_ops_scalar};
const fx__rmsnorm_kernels fx__rmsnorm_kernels_avx2 = {"avx2", &fx__rms_ops_avx2};
const fx__rmsnorm_kernels fx__rmsnorm_kernels_avx512 = {"avx512", &fx__rms_ops_avx512};

const fx__rmsnorm_kernels *fx__rmsnorm_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__rmsnorm_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__rmsnorm_kernels_scalar, &fx__rmsnorm_kernels_avx2, &fx__rmsnorm_kernels_avx512);
#endif
}

const fx__rmsnorm_kernels *fx__rmsnorm_kernels_now(void) { return fx__rmsnorm_kernels_for(fx__isa()); }

/* The loops of a path, under the name model.h gives them. */
const fx__rms_ops *fx__rms_ops_for(fx_isa isa) { return fx__rmsnorm_kernels_for(isa)->ops; }

void fx__rmsnorm_forward_copy(float *out, float *rstd, float *copy, const float *inp, const float *w, int64_t N,
                              int64_t C, float eps)
{
    const double t0 = fx__op_begin();
    const fx__rms_ops *op = fx__rmsnorm_kernels_now()->ops;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float r = (float)(1.0 / sqrt(op->sumsq(inp + n * C, C) / (double)C + (double)eps));
        op->scale(out + n * C, inp + n * C, r, w, C);
        rstd[n] = r;
        if (copy)
            memcpy(copy + n * C, inp + n * C, (size_t)C * sizeof(float));
    }
    fx__op_end(FX__OP_NORM, t0);
}

void fx__rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int64_t N, int64_t C, float eps)
{
    fx__rmsnorm_forward_copy(out, rstd, NULL, inp, w, N, C, eps);
}

void fx__rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, int64_t N, int64_t C)
{
    const double t0 = fx__op_begin();
    /* y = x r w with r = (mean x^2 + eps)^-1/2:
       dx = r (dy w) - x r^3 mean(dy w x),  dw = sum_n dy x r (in token order, per channel). */
    const fx__rms_ops *op = fx__rmsnorm_kernels_now()->ops;
    const int64_t nblk = (C + FX__CBLOCK - 1) / FX__CBLOCK;
#pragma omp parallel
    {
#pragma omp for schedule(static) nowait
        for (int64_t n = 0; n < N; n++) {
            const float r = rstd[n];
            const float k = (float)(op->dot3(dout + n * C, w, inp + n * C, C) / (double)C) * r * r * r;
            op->dx(dinp + n * C, dout + n * C, w, inp + n * C, r, k, C);
        }
#pragma omp for schedule(static) nowait /* the region's end joins the threads */
        for (int64_t blk = 0; blk < nblk; blk++) {
            const int64_t c0 = blk * FX__CBLOCK, nc = C - c0 < FX__CBLOCK ? C - c0 : FX__CBLOCK;
            float acc[FX__CBLOCK] = {0};
            for (int64_t n = 0; n < N; n++)
                op->dw(acc, dout + n * C + c0, inp + n * C + c0, rstd[n], nc);
            for (int64_t c = 0; c < nc; c++)
                dw[c0 + c] += acc[c];
        }
    }
    fx__op_end(FX__OP_NORM, t0);
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

void fx__rope_freqs(double *freq, const fx_model_config *c)
{
    int64_t hd = c->head_dim, half = hd / 2;
    for (int64_t i = 0; i < half; i++)
        freq[i] = pow((double)c->rope_theta, -2.0 * (double)i / (double)hd);
    if (c->rope_scaling.type != FX_ROPE_SCALING_LLAMA3)
        return;
    /* transformers' _compute_llama3_parameters: long wavelengths (low frequencies) are
       divided by factor, short ones kept, and the band between interpolated smoothly. */
    double factor = c->rope_scaling.factor, lo = c->rope_scaling.low_freq_factor;
    double hi = c->rope_scaling.high_freq_factor, old = (double)c->rope_scaling.original_max_position_embeddings;
    double lo_wavelen = old / lo, hi_wavelen = old / hi;
    for (int64_t i = 0; i < half; i++) {
        double wavelen = 2.0 * 3.14159265358979323846 / freq[i];
        if (wavelen > lo_wavelen) {
            freq[i] /= factor;
        } else if (wavelen >= hi_wavelen) {
            double smooth = (old / wavelen - lo) / (hi - lo);
            freq[i] = (1.0 - smooth) * freq[i] / factor + smooth * freq[i];
        }
    }
}

void fx__rope_rows(float *rope, int64_t t0, int64_t t1, const double *freq, int64_t hd)
{
    int64_t half = hd / 2;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)t * freq[i];
            rope[(t * half + i) * 2 + 0] = (float)cos(ang);
            rope[(t * half + i) * 2 + 1] = (float)sin(ang);
        }
}

/* One token's H heads of hd floats, head h at src + h * src_step to dst + h * dst_step:
   rotated by the table's row cs, the sine taken with sign sg (+1: RoPE; -1: its transpose,
   the backward pass), or copied when cs is NULL. Between a token-major row (heads hd apart)
   and the head-major layout (heads T * hd apart), either way. */
static void rope_heads(float *dst, int64_t dst_step, const float *src, int64_t src_step, const float *cs, float sg,
                       int64_t H, int64_t hd)
{
    for (int64_t h = 0; h < H; h++) {
        const float *x = src + h * src_step;
        float *y = dst + h * dst_step;
        if (!cs) {
            memcpy(y, x, (size_t)hd * sizeof(float));
            continue;
        }
        for (int64_t i = 0; i < hd / 2; i++) {
            float c = cs[2 * i], s = sg * cs[2 * i + 1];
            float x0 = x[2 * i], x1 = x[2 * i + 1];
            y[2 * i] = x0 * c - x1 * s;
            y[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

/* As rope_heads forward, for heads whose rotated pairs are halves (x[i] with x[i + hd/2],
   frequency i: Hugging Face's row order, as a mapped file holds wq and wk): the same products,
   other places. */
static void rope_heads_half(float *dst, int64_t dst_step, const float *src, const float *cs, int64_t H, int64_t hd)
{
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < H; h++) {
        const float *x = src + h * hd;
        float *y = dst + h * dst_step;
        for (int64_t i = 0; i < half; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = x[i], x1 = x[i + half];
            y[i] = x0 * c - x1 * s;
            y[i + half] = x0 * s + x1 * c;
        }
    }
}

void fx__rope_forward(float *out, const float *x, int64_t ldx, const float *rope, int64_t B, int64_t T, int64_t H,
                      int64_t hd, int64_t pos0)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        rope_heads(out + (b * H * T + t) * hd, T * hd, x + bt * ldx, hd, rope + (pos0 + t) * hd, 1.0f, H, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

void fx__rope_backward(float *dx, int64_t ldx, const float *dout, const float *rope, int64_t B, int64_t T, int64_t H,
                       int64_t hd)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        rope_heads(dx + bt * ldx, hd, dout + (b * H * T + t) * hd, T * hd, rope + t * hd, -1.0f, H, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

void fx__to_heads(float *out, const float *x, int64_t ldx, int64_t B, int64_t T, int64_t H, int64_t hd)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        rope_heads(out + (b * H * T + t) * hd, T * hd, x + bt * ldx, hd, NULL, 1.0f, H, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

void fx__from_heads(float *out, int64_t ldo, const float *x, int64_t B, int64_t T, int64_t H, int64_t hd)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        rope_heads(out + bt * ldo, hd, x + (b * H * T + t) * hd, T * hd, NULL, -1.0f, H, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

void fx__qkv_to_heads(fx__heads q, fx__heads k, fx__heads v, const float *qkv, int64_t ld, const float *rope,
                      bool halves, int64_t B, int64_t T, int64_t pos0, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        const float *row = qkv + bt * ld, *cs = rope + (pos0 + t) * hd;
        float *qd = q.p + b * q.seq + t * hd, *kd = k.p + b * k.seq + t * hd, *vd = v.p + b * v.seq + t * hd;
        if (halves) {
            rope_heads_half(qd, q.head, row, cs, Hq, hd);
            rope_heads_half(kd, k.head, row + Hq * hd, cs, Hkv, hd);
        } else {
            rope_heads(qd, q.head, row, hd, cs, 1.0f, Hq, hd);
            rope_heads(kd, k.head, row + Hq * hd, hd, cs, 1.0f, Hkv, hd);
        }
        rope_heads(vd, v.head, row + (Hq + Hkv) * hd, hd, NULL, 1.0f, Hkv, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

void fx__qkv_from_heads(float *dqkv, const float *dq, const float *dk, const float *dv, const float *rope, int64_t B,
                        int64_t T, int64_t Hq, int64_t Hkv, int64_t hd)
{
    const double t0 = fx__op_begin();
    const int64_t ld = (Hq + 2 * Hkv) * hd;
#pragma omp parallel for schedule(static)
    for (int64_t bt = 0; bt < B * T; bt++) {
        const int64_t b = bt / T, t = bt % T;
        float *row = dqkv + bt * ld;
        const float *cs = rope + t * hd;
        rope_heads(row, hd, dq + (b * Hq * T + t) * hd, T * hd, cs, -1.0f, Hq, hd);
        rope_heads(row + Hq * hd, hd, dk + (b * Hkv * T + t) * hd, T * hd, cs, -1.0f, Hkv, hd);
        rope_heads(row + (Hq + Hkv) * hd, hd, dv + (b * Hkv * T + t) * hd, T * hd, NULL, -1.0f, Hkv, hd);
    }
    fx__op_end(FX__OP_HEADS, t0);
}

/* ---- SwiGLU ------------------------------------------------------------------------------- */

void fx__swiglu_forward_scalar(float *out, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-a[i]));
        out[i] = a[i] * s * b[i];
    }
}

void fx__swiglu_backward_scalar(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + expf(-a[i]));
        float silu = a[i] * s;
        float d = dout[i], y = b[i];
        da[i] = d * y * (s + silu * (1.0f - s));
        db[i] = d * silu;
    }
}

static const fx__swiglu_ops fx__swiglu_ops_scalar = {fx__swiglu_forward_scalar, fx__swiglu_backward_scalar};

const fx__swiglu_kernels fx__swiglu_kernels_scalar = {"scalar", &fx__swiglu_ops_scalar};
const fx__swiglu_kernels fx__swiglu_kernels_avx2 = {"avx2", &fx__swiglu_ops_avx2};
const fx__swiglu_kernels fx__swiglu_kernels_avx512 = {"avx512", &fx__swiglu_ops_avx512};

const fx__swiglu_kernels *fx__swiglu_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__swiglu_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__swiglu_kernels_scalar, &fx__swiglu_kernels_avx2, &fx__swiglu_kernels_avx512);
#endif
}

const fx__swiglu_kernels *fx__swiglu_kernels_now(void) { return fx__swiglu_kernels_for(fx__isa()); }

/* The loops of a path, under the name model.h gives them (the tests'). */
const fx__swiglu_ops *fx__swiglu_ops_for(fx_isa isa) { return fx__swiglu_kernels_for(isa)->ops; }

/* Elements per task: fixed blocks of a row (multiples of every vector width), so which
   elements a vector loop's scalar tail handles does not depend on the thread count. */
enum { FX__EW_BLOCK = 1 << 12 };

void fx__swiglu_forward(float *out, int64_t ldo, const float *a, const float *b, int64_t ld, int64_t rows,
                        int64_t cols)
{
    const double t0 = fx__op_begin();
    const fx__swiglu_ops *op = fx__swiglu_kernels_now()->ops;
    const int64_t nb = (cols + FX__EW_BLOCK - 1) / FX__EW_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows * nb; t++) {
        const int64_t r = t / nb, j = t % nb * FX__EW_BLOCK, len = cols - j < FX__EW_BLOCK ? cols - j : FX__EW_BLOCK;
        op->forward(out + r * ldo + j, a + r * ld + j, b + r * ld + j, len);
    }
    fx__op_end(FX__OP_SWIGLU, t0);
}

void fx__swiglu_backward(float *da, float *db, int64_t ld, const float *dout, int64_t ldo, const float *a,
                         const float *b, int64_t rows, int64_t cols)
{
    const double t0 = fx__op_begin();
    const fx__swiglu_ops *op = fx__swiglu_kernels_now()->ops;
    const int64_t nb = (cols + FX__EW_BLOCK - 1) / FX__EW_BLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < rows * nb; t++) {
        const int64_t r = t / nb, j = t % nb * FX__EW_BLOCK, len = cols - j < FX__EW_BLOCK ? cols - j : FX__EW_BLOCK;
        op->backward(da + r * ld + j, db + r * ld + j, dout + r * ldo + j, a + r * ld + j, b + r * ld + j, len);
    }
    fx__op_end(FX__OP_SWIGLU, t0);
}

/* ---- embedding ------------------------------------------------------------------------------- */

void fx__embed_forward(float *out, const int32_t *tokens, const float *wte, int64_t N, int64_t C)
{
    const double t0 = fx__op_begin();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        memcpy(out + n * C, wte + (int64_t)tokens[n] * C, (size_t)C * sizeof(float));
    fx__op_end(FX__OP_EMBED, t0);
}

void fx__embed_backward(float *dwte, const float *dout, const int32_t *tokens, int64_t N, int64_t C)
{
    const double t0 = fx__op_begin();
    /* Tokens repeat, so rows of dwte collect several updates: each task owns a slice of
       channels and adds the tokens in order. */
    int64_t nblk = (C + FX__CBLOCK - 1) / FX__CBLOCK;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * FX__CBLOCK, c1 = c0 + FX__CBLOCK < C ? c0 + FX__CBLOCK : C;
        for (int64_t n = 0; n < N; n++) {
            float *d = dwte + (int64_t)tokens[n] * C;
            const float *g = dout + n * C;
            for (int64_t c = c0; c < c1; c++)
                d[c] += g[c];
        }
    }
    fx__op_end(FX__OP_EMBED, t0);
}

/* ---- projection biases ------------------------------------------------------------------ */

/* Threads only for sizes worth a parallel region; each element's result is the same either way. */
enum { FX__BIAS_PAR = 1 << 15 };

void fx__bias_forward(float *y, int64_t ldy, const float *b, int64_t N, int64_t O)
{
#pragma omp parallel for schedule(static) if (N * O >= FX__BIAS_PAR)
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++)
            y[n * ldy + o] += b[o];
}

void fx__bias_backward(float *db, const float *dy, int64_t ldy, int64_t N, int64_t O)
{
    /* Each task owns a slice of outputs and adds the rows in order. */
    int64_t nblk = (O + FX__CBLOCK - 1) / FX__CBLOCK;
#pragma omp parallel for schedule(static) if (N * O >= FX__BIAS_PAR)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t o0 = blk * FX__CBLOCK, o1 = o0 + FX__CBLOCK < O ? o0 + FX__CBLOCK : O;
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = o0; o < o1; o++)
                db[o] += dy[n * ldy + o];
    }
}

/* ---- masks ------------------------------------------------------------------------------------ */

fx_mask_fn fx__model_mask_fn(fx__model_mask mask, const fx__model_mask_ctx *mc, const void **ctx)
{
    switch (mask) {
    case FX__MODEL_MASK_SLIDING:
        *ctx = &mc->sliding;
        return fx_mask_sliding_window;
    case FX__MODEL_MASK_DOCUMENT:
        *ctx = &mc->document;
        return fx_mask_document;
    case FX__MODEL_MASK_CAUSAL:
    case FX__MODEL_MASK_CAUSAL_DENSE:
        break;
    }
    *ctx = NULL;
    return fx_mask_causal;
}

/* ---- reference attention ---------------------------------------------------------------------- */

void fx__attn_ref_forward(const fx__attn_ref *a, const float *q, const float *k, const float *v, float *out, float *lse)
{
    int64_t G = a->Hq / a->Hkv, D = a->D, Lq = a->Lq, Lkv = a->Lkv;
    double scale = 1.0 / sqrt((double)D);
#pragma omp parallel for schedule(static)
    for (int64_t bhi = 0; bhi < a->B * a->Hq * Lq; bhi++) {
        int64_t b = bhi / (a->Hq * Lq), h = (bhi / Lq) % a->Hq, i = bhi % Lq;
        int64_t pos = a->q_offset + i;
        const float *qi = q + bhi * D;
        const float *kb = k + (b * a->Hkv + h / G) * Lkv * D;
        const float *vb = v + (b * a->Hkv + h / G) * Lkv * D;
        double mx = -INFINITY;
        for (int64_t j = 0; j < Lkv; j++) {
            if (a->mask && !a->mask(b, h, pos, j, a->ctx))
                continue;
            double s = 0.0;
            for (int64_t d = 0; d < D; d++)
                s += (double)qi[d] * kb[j * D + d];
            s *= scale;
            if (s > mx)
                mx = s;
        }
        float *o = out + bhi * D;
        if (mx == -INFINITY) {
            memset(o, 0, (size_t)D * sizeof(float));
            if (lse)
                lse[bhi] = -INFINITY;
            continue;
        }
        double sum = 0.0, acc[512] = {0}; /* D <= 512 is checked by the model config */
        for (int64_t j = 0; j < Lkv; j++) {
            if (a->mask && !a->mask(b, h, pos, j, a->ctx))
                continue;
            double s = 0.0;
            for (int64_t d = 0; d < D; d++)
                s += (double)qi[d] * kb[j * D + d];
            double p = exp(s * scale - mx);
            sum += p;
            for (int64_t d = 0; d < D; d++)
                acc[d] += p * vb[j * D + d];
        }
        for (int64_t d = 0; d < D; d++)
            o[d] = (float)(acc[d] / sum);
        if (lse)
            lse[bhi] = (float)(mx + log(sum));
    }
}

/* The score, probability and dS of query row (b, h, i) against key j; false when masked. */
static bool fx__ref_pair(const fx__attn_ref *a, int64_t b, int64_t h, int64_t i, int64_t j, const float *q,
                         const float *k, const float *v, const float *lse, const float *dout, double Di,
                         double *p_out, double *ds_out)
{
    int64_t G = a->Hq / a->Hkv, D = a->D;
    int64_t row = (b * a->Hq + h) * a->Lq + i;
    if (lse[row] == -INFINITY || (a->mask && !a->mask(b, h, a->q_offset + i, j, a->ctx)))
        return false;
    const float *qi = q + row * D, *doi = dout + row * D;
    const float *kj = k + ((b * a->Hkv + h / G) * a->Lkv + j) * D;
    const float *vj = v + ((b * a->Hkv + h / G) * a->Lkv + j) * D;
    double s = 0.0, dp = 0.0;
    for (int64_t d = 0; d < D; d++) {
        s += (double)qi[d] * kj[d];
        dp += (double)doi[d] * vj[d];
    }
    double scale = 1.0 / sqrt((double)D);
    double p = exp(s * scale - (double)lse[row]);
    *p_out = p;
    *ds_out = p * (dp - Di) * scale;
    return true;
}

static double fx__ref_delta(const fx__attn_ref *a, int64_t row, const float *out, const float *dout)
{
    double Di = 0.0;
    for (int64_t d = 0; d < a->D; d++)
        Di += (double)dout[row * a->D + d] * out[row * a->D + d];
    return Di;
}

void fx__attn_ref_backward(const fx__attn_ref *a, const float *q, const float *k, const float *v,
                           const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    int64_t G = a->Hq / a->Hkv, D = a->D, Lq = a->Lq, Lkv = a->Lkv;
    /* dq: one query row per task. */
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < a->B * a->Hq * Lq; row++) {
        int64_t b = row / (a->Hq * Lq), h = (row / Lq) % a->Hq, i = row % Lq;
        double Di = fx__ref_delta(a, row, out, dout), gq[512] = {0}, p, ds;
        const float *kb = k + (b * a->Hkv + h / G) * Lkv * D;
        for (int64_t j = 0; j < Lkv; j++)
            if (fx__ref_pair(a, b, h, i, j, q, k, v, lse, dout, Di, &p, &ds))
                for (int64_t d = 0; d < D; d++)
                    gq[d] += ds * kb[j * D + d];
        for (int64_t d = 0; d < D; d++)
            dq[row * D + d] = (float)gq[d];
    }
    /* dk, dv: one key per task, summing its query heads and rows in order. */
#pragma omp parallel for schedule(static)
    for (int64_t kr = 0; kr < a->B * a->Hkv * Lkv; kr++) {
        int64_t b = kr / (a->Hkv * Lkv), hk = (kr / Lkv) % a->Hkv, j = kr % Lkv;
        double gk[512] = {0}, gv[512] = {0}, p, ds;
        for (int64_t h = hk * G; h < (hk + 1) * G; h++)
            for (int64_t i = 0; i < Lq; i++) {
                int64_t row = (b * a->Hq + h) * Lq + i;
                double Di = fx__ref_delta(a, row, out, dout);
                if (!fx__ref_pair(a, b, h, i, j, q, k, v, lse, dout, Di, &p, &ds))
                    continue;
                for (int64_t d = 0; d < D; d++) {
                    gk[d] += ds * q[row * D + d];
                    gv[d] += p * dout[row * D + d];
                }
            }
        for (int64_t d = 0; d < D; d++) {
            dk[kr * D + d] = (float)gk[d];
            dv[kr * D + d] = (float)gv[d];
        }
    }
}

/* ---- unfused loss ------------------------------------------------------------------------------ */

float fx__loss_unfused(float *logits, float *row_loss, const float *h, const float *w, const int64_t *target,
                       int64_t N, int64_t D, int64_t V, float *dh, float *dw)
{
    fx__sgemm(false, true, N, V, D, 1.0f, h, D, w, D, 0.0f, logits, V);
    int64_t count = 0;
    for (int64_t n = 0; n < N; n++)
        count += target[n] >= 0;
    float inv = count ? 1.0f / (float)count : 0.0f;
    /* Each row becomes its gradient (softmax - onehot) / count in place. */
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *z = logits + n * V;
        row_loss[n] = 0.0f;
        if (target[n] < 0) {
            memset(z, 0, (size_t)V * sizeof(float));
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; j++)
            mx = z[j] > mx ? z[j] : mx;
        double sum = 0.0;
        for (int64_t j = 0; j < V; j++)
            sum += exp((double)z[j] - mx);
        double lse = mx + log(sum);
        row_loss[n] = (float)(lse - z[target[n]]);
        for (int64_t j = 0; j < V; j++)
            z[j] = (float)exp((double)z[j] - lse) * inv;
        z[target[n]] -= inv;
    }
    double total = 0.0;
    for (int64_t n = 0; n < N; n++)
        total += row_loss[n];
    if (dh)
        fx__sgemm(false, false, N, D, V, 1.0f, logits, V, w, D, 0.0f, dh, D);
    if (dw)
        fx__sgemm(true, false, V, D, N, 1.0f, logits, V, h, D, 1.0f, dw, D);
    return count ? (float)(total / (double)count) : NAN;
}
