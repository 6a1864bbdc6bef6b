/*
 * float64 reference of FlexAttention forward and backward for the attention tests: dense
 * loops over every (query, key) pair, an arbitrary mask callback and a score modifier given
 * as a scalar float64 function with its derivative. Slow on purpose; shapes stay small.
 *
 *     ref_attn r = {.B = 1, .Hq = 4, .Hkv = 2, .Lq = 33, .Lkv = 40, .D = 16, .Dv = 8,
 *                   .scale = 0.25, .mask = my_mask, .mod = my_mod, .mod_grad = my_mod_grad};
 *     ref_forward(&r, q, k, v, out, lse);
 *     ref_backward(&r, q, k, v, dout, dq, dk, dv);
 */
#ifndef FLEXC_TEST_ATTENTION_REF_H
#define FLEXC_TEST_ATTENTION_REF_H

#include <flexc.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* s is the scaled raw score of absolute query position q and key kv. */
typedef double (*ref_mod_fn)(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx);
/* Where a score reads a learnable table (or -1): its gradient lands there. */
typedef int64_t (*ref_table_index_fn)(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx);

typedef struct ref_attn {
    int64_t B, Hq, Hkv, Lq, Lkv, D, Dv;
    double scale;         /* already resolved (no 0 default here) */
    int64_t q_offset;
    fx_mask_fn mask;      /* NULL: every key visible */
    const void *mask_ctx;
    ref_mod_fn mod;       /* NULL: identity */
    ref_mod_fn mod_grad;  /* d mod / d s */
    ref_table_index_fn table_index; /* NULL: no learnable table */
    const void *mod_ctx;
    int64_t mask_B, mask_H; /* 1 when the mask is broadcast over B / H */
} ref_attn;

/* The modified, masked scores of one (b, h) head into s[Lq*Lkv] (-inf where masked) and the
   raw scaled scores into raw. */
static inline void ref_scores(const ref_attn *r, const float *q, const float *k, int64_t b, int64_t h,
                              double *s, double *raw)
{
    int64_t G = r->Hq / r->Hkv, hk = h / G;
    const float *qh = q + (b * r->Hq + h) * r->Lq * r->D;
    const float *kh = k + (b * r->Hkv + hk) * r->Lkv * r->D;
    for (int64_t i = 0; i < r->Lq; i++) {
        int64_t qi = r->q_offset + i;
        for (int64_t j = 0; j < r->Lkv; j++) {
            double acc = 0.0;
            for (int64_t d = 0; d < r->D; d++)
                acc += (double)qh[i * r->D + d] * (double)kh[j * r->D + d];
            acc *= r->scale;
            raw[i * r->Lkv + j] = acc;
            double m = r->mod ? r->mod(acc, b, h, qi, j, r->mod_ctx) : acc;
            int64_t mb = r->mask_B == 1 ? 0 : b, mh = r->mask_H == 1 ? 0 : h;
            if (r->mask && !r->mask(mb, mh, qi, j, r->mask_ctx))
                m = -INFINITY;
            s[i * r->Lkv + j] = m;
        }
    }
}

/* out [B,Hq,Lq,Dv], lse [B,Hq,Lq] (natural log; -inf for a fully masked row, whose out is 0). */
static inline void ref_forward(const ref_attn *r, const float *q, const float *k, const float *v,
                               double *out, double *lse)
{
    double *s = (double *)malloc(sizeof(double) * (size_t)(r->Lq * r->Lkv));
    double *raw = (double *)malloc(sizeof(double) * (size_t)(r->Lq * r->Lkv));
    int64_t G = r->Hq / r->Hkv;
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t h = 0; h < r->Hq; h++) {
            ref_scores(r, q, k, b, h, s, raw);
            const float *vh = v + (b * r->Hkv + h / G) * r->Lkv * r->Dv;
            for (int64_t i = 0; i < r->Lq; i++) {
                double *o = out + ((b * r->Hq + h) * r->Lq + i) * r->Dv;
                double mx = -INFINITY;
                for (int64_t j = 0; j < r->Lkv; j++)
                    mx = fmax(mx, s[i * r->Lkv + j]);
                for (int64_t d = 0; d < r->Dv; d++)
                    o[d] = 0.0;
                double *l = lse ? lse + (b * r->Hq + h) * r->Lq + i : NULL;
                if (mx == -INFINITY) {
                    if (l)
                        *l = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < r->Lkv; j++)
                    sum += exp(s[i * r->Lkv + j] - mx);
                for (int64_t j = 0; j < r->Lkv; j++) {
                    double p = exp(s[i * r->Lkv + j] - mx) / sum;
                    for (int64_t d = 0; d < r->Dv; d++)
                        o[d] += p * vh[j * r->Dv + d];
                }
                if (l)
                    *l = mx + log(sum);
            }
        }
    free(s);
    free(raw);
}

/* Gradients of sum(out * dout): dq [B,Hq,Lq,D], dk [B,Hkv,Lkv,D], dv [B,Hkv,Lkv,Dv],
   overwritten; dtable (may be NULL) accumulates the learnable table's gradient. */
static inline void ref_backward(const ref_attn *r, const float *q, const float *k, const float *v,
                                const float *dout, double *dq, double *dk, double *dv, double *dtable)
{
    int64_t Lq = r->Lq, Lkv = r->Lkv, G = r->Hq / r->Hkv;
    double *s = (double *)malloc(sizeof(double) * (size_t)(Lq * Lkv));
    double *raw = (double *)malloc(sizeof(double) * (size_t)(Lq * Lkv));
    double *p = (double *)malloc(sizeof(double) * (size_t)(Lq * Lkv));
    memset(dq, 0, sizeof(double) * (size_t)(r->B * r->Hq * Lq * r->D));
    memset(dk, 0, sizeof(double) * (size_t)(r->B * r->Hkv * Lkv * r->D));
    memset(dv, 0, sizeof(double) * (size_t)(r->B * r->Hkv * Lkv * r->Dv));
    for (int64_t b = 0; b < r->B; b++)
        for (int64_t h = 0; h < r->Hq; h++) {
            int64_t hk = h / G;
            ref_scores(r, q, k, b, h, s, raw);
            const float *qh = q + (b * r->Hq + h) * Lq * r->D;
            const float *kh = k + (b * r->Hkv + hk) * Lkv * r->D;
            const float *vh = v + (b * r->Hkv + hk) * Lkv * r->Dv;
            const float *doh = dout + (b * r->Hq + h) * Lq * r->Dv;
            double *dqh = dq + (b * r->Hq + h) * Lq * r->D;
            double *dkh = dk + (b * r->Hkv + hk) * Lkv * r->D;
            double *dvh = dv + (b * r->Hkv + hk) * Lkv * r->Dv;
            for (int64_t i = 0; i < Lq; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < Lkv; j++)
                    mx = fmax(mx, s[i * Lkv + j]);
                if (mx == -INFINITY)
                    continue; /* a fully masked row has no gradient */
                for (int64_t j = 0; j < Lkv; j++)
                    sum += exp(s[i * Lkv + j] - mx);
                for (int64_t j = 0; j < Lkv; j++)
                    p[i * Lkv + j] = exp(s[i * Lkv + j] - mx) / sum;
                /* dp_ij = dout_i . v_j;  ds_ij = p_ij (dp_ij - sum_l p_il dp_il) */
                double dsum = 0.0;
                double *dp = (double *)malloc(sizeof(double) * (size_t)Lkv);
                for (int64_t j = 0; j < Lkv; j++) {
                    double acc = 0.0;
                    for (int64_t d = 0; d < r->Dv; d++)
                        acc += (double)doh[i * r->Dv + d] * (double)vh[j * r->Dv + d];
                    dp[j] = acc;
                    dsum += p[i * Lkv + j] * acc;
                }
                for (int64_t j = 0; j < Lkv; j++) {
                    double pij = p[i * Lkv + j];
                    if (pij == 0.0)
                        continue;
                    for (int64_t d = 0; d < r->Dv; d++)
                        dvh[j * r->Dv + d] += pij * doh[i * r->Dv + d];
                    double ds = pij * (dp[j] - dsum);
                    if (dtable && r->table_index) {
                        int64_t t = r->table_index(b, h, r->q_offset + i, j, r->mod_ctx);
                        if (t >= 0)
                            dtable[t] += ds;
                    }
                    if (r->mod_grad)
                        ds *= r->mod_grad(raw[i * Lkv + j], b, h, r->q_offset + i, j, r->mod_ctx);
                    ds *= r->scale;
                    for (int64_t d = 0; d < r->D; d++) {
                        dqh[i * r->D + d] += ds * kh[j * r->D + d];
                        dkh[j * r->D + d] += ds * qh[i * r->D + d];
                    }
                }
                free(dp);
            }
        }
    free(s);
    free(raw);
    free(p);
}

/* sum(out * dout) of the float64 forward: the loss the finite differences differentiate. */
static inline double ref_loss(const ref_attn *r, const float *q, const float *k, const float *v,
                              const float *dout)
{
    size_t n = (size_t)(r->B * r->Hq * r->Lq * r->Dv);
    double *out = (double *)malloc(sizeof(double) * n);
    ref_forward(r, q, k, v, out, NULL);
    double loss = 0.0;
    for (size_t i = 0; i < n; i++)
        loss += out[i] * dout[i];
    free(out);
    return loss;
}

#endif
