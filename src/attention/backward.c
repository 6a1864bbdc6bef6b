/* FlexAttention backward (FlashAttention-2 style, deterministic).

   For a tile of query rows i and a kv-block j the pass recomputes
       S = scale * Q_i K_j^T,  S' = score_mod(S),  P = exp(S' - lse_i)  (0 where masked),
       dP = dO_i V_j^T,  dS' = P * (dP - D_i),  dS = score_mod_grad(S, dS') * scale,
   with D_i = rowsum(dO_i * O_i), then accumulates
       dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j.

   Determinism: every sum has one fixed order that does not depend on the thread count.
   dK_j / dV_j sum over the group's query heads (ascending) and then over the q-blocks that
   visit j (ascending); dQ_i sums over the kv-blocks it visits (ascending). Two walks produce
   exactly these orders:
     - one pass: a work unit is a (batch, kv-head) pair; it walks its kv-blocks and adds
       into dQ directly, since no other unit touches those dQ rows;
     - two passes: dK/dV by (batch, kv-head, kv-block), then dQ by (batch, q-head, q-block),
       for when there are fewer (batch, kv-head) pairs than threads.
   Both call the same tile code in the same order per output element, so they agree to the
   bit and the choice between them may depend on the thread count. */
#include "attention/backward.h"
#include "attention/bf16.h"
#include "attention/mod_internal.h"
#include "core/backend.h"

#include <string.h>

/* Query rows per tile: keeps S, P, dS of a tile in L1/L2 next to the kv-block. */
enum { BW_ROWS = 32 };
/* What a tile adds to. */
enum { BW_DKV = 1, BW_DQ = 2 };

typedef struct bw_scratch {
    float *Kt, *Vt;         /* [D, ldk], [Dv, ldk]: the kv-block, transposed */
    float *S, *raw, *P, *dS; /* [BW_ROWS, ldk] */
    float *dK, *dV;         /* [bk, D], [bk, Dv]: this kv-block's gradients */
    /* bfloat16 products only (bf16.h's layouts): the kv-block's Kt and Vt in pairs of their
       rows, K's rows in pairs; a tile's Q and dO in rows and in pairs, P and dS in pairs,
       dS in rows. */
    uint32_t *Kt2, *Vt2, *Kp, *Q2, *Qp, *dO2, *dOp, *Pp, *dSp, *dS2;
} bw_scratch;

typedef struct bw_ctx {
    const fx_attention *a;
    const float *q, *k, *v, *lse, *dout, *Di;
    float *dq, *dk, *dv;
    const fx__attn_bwd_kernels *kr;
    const fx__attn16_kernels *k16; /* the products in bfloat16 (FX__ATTN_BF16), NULL: float32 */
    float scale;
    int64_t G, bq, bk, ldk;
    int64_t qb_lo, qb_hi; /* absolute q-blocks that hold rows q_offset .. q_offset+Lq-1 */
    int64_t nkb;          /* kv-blocks that hold keys 0 .. Lkv-1 */
    const fx_block_mask *m;
    fx_score_fn mod;
    fx_score_grad_fn mod_grad; /* NULL when the derivative is the identity */
    const fx_score_rel_bias_ctx *bias; /* set when its table's gradient is wanted */
    double *tab;                      /* [B*Hkv, Gt, size] partial table gradients */
    const fx_mod *emod;               /* an expression mod whose captured tensors want gradients */
    int64_t tab_heads;                /* Gt: tables one unit touches */
} bw_ctx;

static int bw_mode = FX__BWD_AUTO;

void fx__attention_backward_set_mode(int mode) { bw_mode = mode; }

const fx__attn_bwd_kernels *fx__attn_bwd_kernels_for(fx_isa isa)
{
#if !defined(FLEXC_REFERENCE_KERNELS) && defined(__x86_64__)
    return FX__PER_ISA(isa, &fx__attn_bwd_kernels_scalar, &fx__attn_bwd_kernels_avx2, &fx__attn_bwd_kernels_avx512);
#else
    (void)isa;
    return &fx__attn_bwd_kernels_scalar;
#endif
}

const fx__attn_bwd_kernels *fx__attn_bwd_kernels_now(void) { return fx__attn_bwd_kernels_for(fx__isa()); }

/* ---- scalar kernels (the reference twin) --------------------------------------------------- */

static void nn_scalar(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                      int64_t M, int64_t N, int64_t K, float alpha, bool acc)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float s = acc ? C[m * ldc + n] : 0.0f;
            for (int64_t kk = 0; kk < K; kk++)
                s += A[m * lda + kk] * B[kk * ldb + n];
            C[m * ldc + n] = acc ? s : alpha * s;
        }
}

static void tn_scalar(float *C, int64_t ldc, const float *A, int64_t lda, const float *B, int64_t ldb,
                      int64_t M, int64_t N, int64_t K)
{
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float s = C[m * ldc + n];
            for (int64_t kk = 0; kk < K; kk++)
                s += A[kk * lda + m] * B[kk * ldb + n];
            C[m * ldc + n] = s;
        }
}

static void probs_scalar(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, const float *lse)
{
    for (int64_t i = 0; i < nq; i++) {
        float l = lse[i];
        for (int64_t j = 0; j < nk; j++) {
            float s = S[i * ld + j];
            P[i * ld + j] = (l == -INFINITY || s == -INFINITY) ? 0.0f : expf(s - l);
        }
    }
}

static void dscores_scalar(float *dP, const float *P, int64_t ld, int64_t nq, int64_t nk, const float *Di,
                           float alpha)
{
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++)
            dP[i * ld + j] = P[i * ld + j] * (dP[i * ld + j] - Di[i]) * alpha;
}

static void mask_bits_scalar(float *S, int64_t ld, int64_t nq, int64_t nk, const uint64_t *bits,
                             int64_t words, int64_t i0, int64_t j0)
{
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++)
            if (!fx__bm_test(bits, words, i0 + i, j0 + j))
                S[i * ld + j] = -INFINITY;
}

static void dots_scalar(float *S, int64_t ld, const float *Q, const float *K, int64_t R, int64_t nk, int64_t D,
                        float alpha)
{
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < nk; j++) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++)
                s += Q[r * D + d] * K[j * D + d];
            S[r * ld + j] = alpha * s;
        }
}

static void softmax_chunk_scalar(float *P, const float *S, int64_t ld, int64_t nq, int64_t nk, float *m, float *l,
                                 float *alpha)
{
    for (int64_t i = 0; i < nq; i++) {
        float mx = m[i];
        for (int64_t j = 0; j < nk; j++) /* a NaN score makes the max NaN (see forward_scalar.c) */
            mx = S[i * ld + j] > mx || isnan(S[i * ld + j]) ? S[i * ld + j] : mx;
        if (mx == -INFINITY) {
            alpha[i] = 1.0f;
            for (int64_t j = 0; j < nk; j++)
                P[i * ld + j] = 0.0f;
            continue;
        }
        alpha[i] = m[i] == -INFINITY ? 0.0f : expf(m[i] - mx);
        float acc = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            float s = S[i * ld + j];
            float p = s == -INFINITY ? 0.0f : expf(s - mx);
            P[i * ld + j] = p;
            acc += p;
        }
        l[i] = l[i] * alpha[i] + acc;
        m[i] = mx;
    }
}

static void transpose_scalar(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

const fx__attn_bwd_kernels fx__attn_bwd_kernels_scalar = {
    .name = "scalar",
    .nn = nn_scalar,
    .tn = tn_scalar,
    .probs = probs_scalar,
    .dscores = dscores_scalar,
    .mask_bits = mask_bits_scalar,
    .dots = dots_scalar,
    .softmax_chunk = softmax_chunk_scalar,
    .transpose = transpose_scalar,
};

/* ---- tiles --------------------------------------------------------------------------------- */

/* Loads kv-block kb of (b, kv-head hk) transposed into Kt / Vt. */
static void bw_load_kv(const bw_ctx *c, bw_scratch *s, int64_t b, int64_t hk, int64_t kb)
{
    const fx_attention *a = c->a;
    int64_t c0 = kb * c->bk, nk = a->Lkv - c0 < c->bk ? a->Lkv - c0 : c->bk;
    const float *kp = c->k + ((b * a->Hkv + hk) * a->Lkv + c0) * a->D;
    const float *vp = c->v + ((b * a->Hkv + hk) * a->Lkv + c0) * a->Dv;
    c->kr->transpose(s->Kt, c->ldk, kp, a->D, nk, a->D);
    c->kr->transpose(s->Vt, c->ldk, vp, a->Dv, nk, a->Dv);
    if (c->k16) {
        c->k16->pairs(s->Kt2, c->ldk, s->Kt, c->ldk, a->D, nk);
        c->k16->pairs(s->Vt2, c->ldk, s->Vt, c->ldk, a->Dv, nk);
        c->k16->pairs(s->Kp, a->D, kp, a->D, nk, a->D);
    }
}

/* Adds dS' of a tile to this unit's table gradient, by relative distance. */
static void bw_table_grad(const bw_ctx *c, double *tab, const float *dS, int64_t ld, int64_t nq,
                          int64_t nk, int64_t q0, int64_t kv0)
{
    const fx_score_rel_bias_ctx *t = c->bias;
    for (int64_t i = 0; i < nq; i++)
        for (int64_t j = 0; j < nk; j++) {
            tab[fx__rel_bias_entry(t, q0 + i - (kv0 + j))] += dS[i * ld + j];
        }
}

/* One tile: query rows r0 .. r0+nq-1 (absolute positions) of head h against kv-block kb,
   which bw_load_kv put in s. bits: the block's bitmap (NULL: full), row i0 = r0's row in it.
   Adds into s->dK / s->dV (BW_DKV) and dq (BW_DQ) as want says. tab: the table gradient. */
/* The keys [*lo, *hi) that rows i0 .. i0+nq-1 of a block bitmap can see, lo rounded down to
   a multiple of 16 (so bitmap windows of 16 never straddle a word); *lo >= *hi when none. */
static void bw_visible(const uint64_t *bits, int64_t words, int64_t i0, int64_t nq, int64_t *lo, int64_t *hi)
{
    int64_t first = INT64_MAX, last = -1;
    for (int64_t i = i0; i < i0 + nq; i++)
        for (int64_t w = 0; w < words; w++) {
            uint64_t x = bits[i * words + w];
            if (!x)
                continue;
            int64_t f = w * 64 + __builtin_ctzll(x), l = w * 64 + 63 - __builtin_clzll(x);
            first = f < first ? f : first;
            last = l > last ? l : last;
        }
    *lo = last < 0 ? 0 : first / 16 * 16;
    *hi = last + 1;
}

static void bw_tile(const bw_ctx *c, bw_scratch *s, int64_t b, int64_t h, int64_t r0, int64_t nq,
                    int64_t kb, const uint64_t *bits, int64_t i0, int want, double *tab)
{
    const fx_attention *a = c->a;
    const fx__attn_bwd_kernels *kr = c->kr;
    int64_t ld = c->ldk, D = a->D, Dv = a->Dv;
    int64_t c0 = kb * c->bk, nk = a->Lkv - c0 < c->bk ? a->Lkv - c0 : c->bk;
    /* A partial block: only the keys these rows can see (the others have P = dS = 0). */
    int64_t j0 = 0;
    if (bits) {
        int64_t j1;
        bw_visible(bits, c->m->bm_words, i0, nq, &j0, &j1);
        nk = j1 < nk ? j1 - j0 : nk - j0;
        if (nk <= 0)
            return;
    }
    int64_t kv0 = c0 + j0;
    int64_t row = (b * a->Hq + h) * a->Lq + (r0 - a->q_offset); /* flat index of local row */
    const float *qr = c->q + row * D;
    const float *dor = c->dout + row * Dv;

    const fx__attn16_kernels *k16 = c->k16;
    const int64_t D2 = (D + 1) / 2, Dv2 = (Dv + 1) / 2, nq2 = (nq + 1) / 2;
    if (k16) {
        k16->rows(s->Q2, D2, qr, D, nq, D);
        k16->rows(s->dO2, Dv2, dor, Dv, nq, Dv);
        k16->mm(s->S, ld, s->Q2, D2, 1, s->Kt2 + j0, ld, nq, nk, D2, c->scale, false);
    } else {
        kr->nn(s->S, ld, qr, D, s->Kt + j0, ld, nq, nk, D, c->scale, false);
    }
    if (c->mod) {
        for (int64_t i = 0; i < nq; i++)
            memcpy(s->raw + i * ld, s->S + i * ld, (size_t)nk * sizeof(float));
        c->mod(s->S, ld, nq, nk, b, h, r0, kv0, a->score_ctx);
    }
    if (bits)
        kr->mask_bits(s->S, ld, nq, nk, bits, c->m->bm_words, i0, j0);
    kr->probs(s->P, s->S, ld, nq, nk, c->lse + row);
    if (k16)
        k16->mm(s->dS, ld, s->dO2, Dv2, 1, s->Vt2 + j0, ld, nq, nk, Dv2, 1.0f, false);
    else
        kr->nn(s->dS, ld, dor, Dv, s->Vt + j0, ld, nq, nk, Dv, 1.0f, false);
    bool separate_scale = c->mod_grad || tab;
    kr->dscores(s->dS, s->P, ld, nq, nk, c->Di + row, separate_scale ? 1.0f : c->scale);
    if (tab && c->emod)
        fx__mod_grad_accum(c->emod, tab, s->raw, s->dS, ld, nq, nk, b, h, r0, kv0);
    else if (tab)
        bw_table_grad(c, tab, s->dS, ld, nq, nk, r0, kv0);
    if (c->mod_grad)
        c->mod_grad(s->raw, s->dS, ld, nq, nk, b, h, r0, kv0, a->score_ctx);
    if (separate_scale)
        for (int64_t i = 0; i < nq; i++)
            for (int64_t j = 0; j < nk; j++)
                s->dS[i * ld + j] *= c->scale;

    if ((want & BW_DKV) && k16) {
        /* dV += P^T dO and dK += dS^T Q: P and dS read down their columns, as pairs of rows */
        k16->pairs(s->Pp, ld, s->P, ld, nq, nk);
        k16->pairs(s->dOp, Dv, dor, Dv, nq, Dv);
        k16->mm(s->dV + j0 * Dv, Dv, s->Pp, 1, ld, s->dOp, Dv, nk, Dv, nq2, 1.0f, true);
        k16->pairs(s->dSp, ld, s->dS, ld, nq, nk);
        k16->pairs(s->Qp, D, qr, D, nq, D);
        k16->mm(s->dK + j0 * D, D, s->dSp, 1, ld, s->Qp, D, nk, D, nq2, 1.0f, true);
    } else if (want & BW_DKV) {
        kr->tn(s->dV + j0 * Dv, Dv, s->P, ld, dor, Dv, nk, Dv, nq);
        kr->tn(s->dK + j0 * D, D, s->dS, ld, qr, D, nk, D, nq);
    }
    if ((want & BW_DQ) && k16) {
        /* j0 is even (a multiple of 16): key kv0 starts pair j0 / 2 of the block's K */
        k16->rows(s->dS2, ld / 2, s->dS, ld, nq, nk);
        k16->mm(c->dq + row * D, D, s->dS2, ld / 2, 1, s->Kp + j0 / 2 * D, D, nq, D, (nk + 1) / 2, 1.0f, true);
    } else if (want & BW_DQ) {
        const float *kp = c->k + ((b * a->Hkv + h / c->G) * a->Lkv + kv0) * D;
        kr->nn(c->dq + row * D, D, s->dS, ld, kp, D, nq, D, nk, 1.0f, true);
    }
}

/* The rows of absolute q-block qb inside this call, split into tiles. */
static void bw_qblock(const bw_ctx *c, bw_scratch *s, int64_t b, int64_t h, int64_t qb, int64_t kb,
                      const uint64_t *bits, int want, double *tab)
{
    const fx_attention *a = c->a;
    int64_t lo = qb * c->bq, hi = lo + c->bq;
    int64_t r0 = lo > a->q_offset ? lo : a->q_offset;
    int64_t r1 = hi < a->q_offset + a->Lq ? hi : a->q_offset + a->Lq;
    for (int64_t r = r0; r < r1; r += BW_ROWS) {
        int64_t nq = r1 - r < BW_ROWS ? r1 - r : BW_ROWS;
        bw_tile(c, s, b, h, r, nq, kb, bits, r - lo, want, tab);
    }
}

/* dK / dV of kv-block kb of (b, hk), summed over the group's heads and their q-blocks, written
   to dk / dv. With BW_DQ in want, dQ of every tile is added to dq on the way. */
static void bw_kv_block(const bw_ctx *c, bw_scratch *s, int64_t b, int64_t hk, int64_t kb, int want,
                        double *tab)
{
    const fx_attention *a = c->a;
    int64_t c0 = kb * c->bk, nk = a->Lkv - c0 < c->bk ? a->Lkv - c0 : c->bk;
    memset(s->dK, 0, (size_t)(nk * a->D) * sizeof(float));
    memset(s->dV, 0, (size_t)(nk * a->Dv) * sizeof(float));
    bw_load_kv(c, s, b, hk, kb);
    for (int64_t g = 0; g < c->G; g++) {
        int64_t h = hk * c->G + g;
        /* an expression mod's partial covers its tensors whole (it is indexed by the mod) */
        double *tg = !tab ? NULL : c->emod ? tab : tab + (c->tab_heads == 1 ? 0 : g) * c->bias->size;
        if (c->m) {
            const fx_block_mask *m = c->m;
            int64_t col = fx__bm_col(m, fx__bm_slot(m, b, h), kb);
            for (int64_t e = m->q_ptr[col]; e < m->q_ptr[col + 1]; e++) {
                int64_t qb = m->q_idx[e];
                if (qb < c->qb_lo || qb > c->qb_hi)
                    continue;
                bw_qblock(c, s, b, h, qb, kb, fx__bm_bits(m, m->q_bits[e]), want, tg);
            }
        } else {
            for (int64_t qb = c->qb_lo; qb <= c->qb_hi; qb++)
                bw_qblock(c, s, b, h, qb, kb, NULL, want, tg);
        }
    }
    memcpy(c->dk + ((b * a->Hkv + hk) * a->Lkv + c0) * a->D, s->dK, (size_t)(nk * a->D) * sizeof(float));
    memcpy(c->dv + ((b * a->Hkv + hk) * a->Lkv + c0) * a->Dv, s->dV, (size_t)(nk * a->Dv) * sizeof(float));
}

/* dQ of the rows of absolute q-block qb of heads h0 .. h1-1 (one GQA group, or part of one),
   over the kv-blocks they visit. The heads must share their block lists (slot of h0), so each
   kv-block is loaded once for all of them. */
static void bw_q_block(const bw_ctx *c, bw_scratch *s, int64_t b, int64_t h0, int64_t h1, int64_t qb)
{
    const fx_attention *a = c->a;
    int64_t lo = qb * c->bq, hi = lo + c->bq;
    int64_t r0 = lo > a->q_offset ? lo : a->q_offset;
    int64_t r1 = hi < a->q_offset + a->Lq ? hi : a->q_offset + a->Lq;
    for (int64_t h = h0; h < h1; h++) {
        int64_t row = (b * a->Hq + h) * a->Lq + (r0 - a->q_offset);
        memset(c->dq + row * a->D, 0, (size_t)((r1 - r0) * a->D) * sizeof(float));
    }
    int64_t hk = h0 / c->G;
    if (c->m) {
        const fx_block_mask *m = c->m;
        int64_t r = fx__bm_row(m, fx__bm_slot(m, b, h0), qb);
        for (int64_t e = m->kv_ptr[r]; e < m->kv_ptr[r + 1]; e++) {
            int64_t kb = m->kv_idx[e];
            if (kb >= c->nkb)
                continue;
            bw_load_kv(c, s, b, hk, kb);
            for (int64_t h = h0; h < h1; h++)
                bw_qblock(c, s, b, h, qb, kb, fx__bm_bits(m, m->kv_bits[e]), BW_DQ, NULL);
        }
    } else {
        for (int64_t kb = 0; kb < c->nkb; kb++) {
            bw_load_kv(c, s, b, hk, kb);
            for (int64_t h = h0; h < h1; h++)
                bw_qblock(c, s, b, h, qb, kb, NULL, BW_DQ, NULL);
        }
    }
}

/* ---- driver -------------------------------------------------------------------------------- */

static int bw_check(const fx_attention *a, const float *q, const float *k, const float *v,
                    const float *out, const float *lse, const float *dout, float *dq, float *dk, float *dv)
{
    int rc = fx__attention_check(a, q, k, v);
    if (rc != FX_OK)
        return rc;
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL (the backward pass needs the forward's output)");
    if (!lse)
        return fx__error(FX_EINVAL, "lse is NULL (the backward pass needs the forward's lse)");
    if (!dout)
        return fx__error(FX_EINVAL, "dout is NULL");
    if (!dq || !dk || !dv)
        return fx__error(FX_EINVAL, "%s is NULL", !dq ? "dq" : !dk ? "dk" : "dv");
    const size_t nq = (size_t)(a->B * a->Hq * a->Lq), nkv = (size_t)(a->B * a->Hkv * a->Lkv);
    const size_t f = sizeof(float), qd = nq * (size_t)a->D * f, qv = nq * (size_t)a->Dv * f;
    const size_t kd = nkv * (size_t)a->D * f, kv = nkv * (size_t)a->Dv * f;
    const fx__span in[] = {{"q", q, qd},     {"k", k, kd},         {"v", v, kv},
                           {"out", out, qv}, {"lse", lse, nq * f}, {"dout", dout, qv}};
    const fx__span outs[] = {{"dq", dq, qd}, {"dk", dk, kd}, {"dv", dv, kv}};
    rc = fx__check_overlaps(in, 6, outs, 3);
    if (rc != FX_OK)
        return rc;
    int kind = fx__score_kind(a->score_mod);
    if (kind == FX__SCORE_CUSTOM && !a->score_mod_grad)
        return fx__error(FX_EINVAL, "score_mod is set but score_mod_grad is NULL: the backward pass "
                                    "needs the derivative of a custom score_mod");
    return FX_OK; /* rel_bias's table and heads were checked with the other arguments */
}

/* The derivative the tiles call: NULL when it is the identity (additive built-ins). */
static fx_score_grad_fn bw_mod_grad(const fx_attention *a)
{
    switch (fx__score_kind(a->score_mod)) {
    case FX__SCORE_NONE:
        return NULL;
    case FX__SCORE_ALIBI:
    case FX__SCORE_REL_BIAS:
        if (!a->score_mod_grad || a->score_mod_grad == fx_score_alibi_grad ||
            a->score_mod_grad == fx_score_rel_bias_grad)
            return NULL;
        return a->score_mod_grad;
    case FX__SCORE_SOFTCAP:
        return a->score_mod_grad ? a->score_mod_grad : fx_score_softcap_grad;
    default:
        return a->score_mod_grad;
    }
}

int fx_flex_attention_backward(const fx_attention *a, const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const float *dout, float *dq,
                               float *dk, float *dv)
{
    const fx__backend *dev = a ? fx__backend_of(a->device, a->dtype) : NULL;
    if (dev) /* device memory or bfloat16 tensors: that backend's call */
        return dev->flex_attention_backward(a, q, k, v, out, lse, dout, dq, dk, dv);
    return fx__flex_attention_backward_with(a, 0, q, k, v, out, lse, dout, dq, dk, dv);
}

/* The words of a thread's bfloat16 operands (bw_scratch), carved from base in that order
   (base NULL: only counted). */
static size_t bw_words16(const bw_ctx *c, uint32_t *base, bw_scratch *s)
{
    bw_scratch count_only;
    s = s ? s : &count_only;
    const int64_t D = c->a->D, Dv = c->a->Dv, D2 = (D + 1) / 2, Dv2 = (Dv + 1) / 2, ld = c->ldk;
    const int64_t half = BW_ROWS / 2, kp = (c->bk + 1) / 2 * D;
    const int64_t n[] = {D2 * ld, Dv2 * ld, kp, BW_ROWS * D2, half * D, BW_ROWS * Dv2, half * Dv, half * ld, half * ld,
                         BW_ROWS * ld / 2};
    uint32_t **field[] = {&s->Kt2, &s->Vt2, &s->Kp, &s->Q2, &s->Qp, &s->dO2, &s->dOp, &s->Pp, &s->dSp, &s->dS2};
    size_t off = 0;
    for (size_t i = 0; i < sizeof n / sizeof n[0]; i++) {
        if (base)
            *field[i] = base + off;
        off += ((size_t)n[i] + 15) / 16 * 16;
    }
    return off;
}

int fx__flex_attention_backward_with(const fx_attention *a, unsigned flags, const float *q, const float *k,
                                     const float *v, const float *out, const float *lse, const float *dout, float *dq,
                                     float *dk, float *dv)
{
    int rc = bw_check(a, q, k, v, out, lse, dout, dq, dk, dv);
    if (rc != FX_OK)
        return rc;

    bw_ctx c = {.a = a, .q = q, .k = k, .v = v, .lse = lse, .dout = dout, .dq = dq, .dk = dk, .dv = dv};
    c.kr = fx__attn_bwd_kernels_now();
    c.k16 = flags & FX__ATTN_BF16 ? fx__attn16_kernels_now() : NULL;
    c.scale = fx__attention_scale(a);
    c.G = a->Hq / a->Hkv;
    c.m = a->mask;
    c.bq = c.m ? c.m->block_q : FX__DENSE_BLOCK_Q;
    c.bk = c.m ? c.m->block_kv : FX__DENSE_BLOCK_KV;
    c.ldk = (c.bk + 15) / 16 * 16;
    c.qb_lo = a->q_offset / c.bq;
    c.qb_hi = (a->q_offset + a->Lq - 1) / c.bq;
    c.nkb = (a->Lkv + c.bk - 1) / c.bk;
    c.mod = a->score_mod;
    c.mod_grad = bw_mod_grad(a);
    if (fx__score_kind(a->score_mod) == FX__SCORE_REL_BIAS) {
        const fx_score_rel_bias_ctx *t = a->score_ctx;
        if (t->grad_table) {
            c.bias = t;
            c.tab_heads = t->heads == 1 ? 1 : c.G;
        }
    }
    /* An expression mod (mod.c) with captured tensors that want gradients: its partials are
       per unit too, all the tensors' elements one after another. */
    int64_t mod_elems = a->score_mod == fx_mod_score ? fx__mod_grad_elems(a->score_ctx) : 0;
    if (mod_elems)
        c.emod = a->score_ctx;

    int nt = fx__max_threads();
    int64_t units = a->B * a->Hkv;
    /* The table gradient's partials are per (batch, kv-head) unit: one pass only. */
    bool one_pass = c.bias || c.emod || (bw_mode == FX__BWD_AUTO ? units >= nt : bw_mode == FX__BWD_ONE_PASS);

    /* Scratch: D_i, per-thread tiles, and the units' table gradients. */
    size_t nrows = (size_t)(a->B * a->Hq * a->Lq);
    size_t per_thread = (size_t)(c.ldk * (a->D + a->Dv) + 4 * BW_ROWS * c.ldk + c.bk * (a->D + a->Dv));
    per_thread += c.k16 ? bw_words16(&c, NULL, NULL) : 0; /* 32-bit words, as many bytes as floats */
    float *Di = fx__alloc(nrows * sizeof(float));
    float *scr = fx__alloc((size_t)nt * per_thread * sizeof(float));
    size_t tab_n = c.bias ? (size_t)units * (size_t)(c.tab_heads * c.bias->size) : 0;
    if (c.emod)
        tab_n = (size_t)units * (size_t)mod_elems;
    double *tab = tab_n ? fx__calloc(tab_n, sizeof(double)) : NULL;
    if (!Di || !scr || (tab_n && !tab)) {
        fx__free(Di);
        fx__free(scr);
        fx__free(tab);
        return fx__error(FX_ENOMEM, "attention backward: out of memory for %zu bytes of scratch",
                         (nrows + (size_t)nt * per_thread) * sizeof(float) + tab_n * sizeof(double));
    }
    c.Di = Di;
    c.tab = tab;

    /* One parallel region: D_i, a barrier, then both passes, which read D_i and write
       disjoint gradients (dK, dV by kv-block; dQ by q-block), so they need none between
       them. (With passive waiting, each region and each barrier is a sleep and a wake-up.) */
    int64_t nr = (int64_t)nrows, Dv = a->Dv;
#pragma omp parallel
    {
        /* D_i = rowsum(dout * out), in order. */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nr; r++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < Dv; d++)
                acc += dout[r * Dv + d] * out[r * Dv + d];
            Di[r] = acc;
        }
        float *base = scr + (size_t)fx__thread_id() * per_thread;
        bw_scratch s;
        s.Kt = base;
        s.Vt = s.Kt + c.ldk * a->D;
        s.S = s.Vt + c.ldk * a->Dv;
        s.raw = s.S + BW_ROWS * c.ldk;
        s.P = s.raw + BW_ROWS * c.ldk;
        s.dS = s.P + BW_ROWS * c.ldk;
        s.dK = s.dS + BW_ROWS * c.ldk;
        s.dV = s.dK + c.bk * a->D;
        if (c.k16)
            bw_words16(&c, (uint32_t *)(s.dV + c.bk * a->Dv), &s);
        if (one_pass) {
#pragma omp for schedule(static) nowait
            for (int64_t u = 0; u < units; u++) {
                int64_t b = u / a->Hkv, hk = u % a->Hkv;
                for (int64_t g = 0; g < c.G; g++)
                    memset(dq + (b * a->Hq + hk * c.G + g) * a->Lq * a->D, 0,
                           (size_t)(a->Lq * a->D) * sizeof(float));
                double *ut = !tab ? NULL
                             : c.emod ? tab + (size_t)u * (size_t)mod_elems
                                      : tab + (size_t)u * (size_t)(c.tab_heads * c.bias->size);
                for (int64_t kb = 0; kb < c.nkb; kb++)
                    bw_kv_block(&c, &s, b, hk, kb, BW_DKV | BW_DQ, ut);
            }
        } else {
            /* Round-robin: under a causal mask the work per kv-block (q-block) falls (rises)
               along the sequence. Which thread runs a unit never changes its result. */
            int64_t n1 = units * c.nkb;
#pragma omp for schedule(static, 1) nowait
            for (int64_t u = 0; u < n1; u++)
                bw_kv_block(&c, &s, u / c.nkb / a->Hkv, u / c.nkb % a->Hkv, u % c.nkb, BW_DKV, NULL);
            /* Heads that share block lists (a mask broadcast over heads, or none) go by GQA
               group, so each kv-block is loaded once per group. */
            int64_t gs = (!c.m || c.m->H == 1) ? c.G : 1;
            int64_t nqb = c.qb_hi - c.qb_lo + 1, ng = a->Hq / gs, n2 = a->B * ng * nqb;
#pragma omp for schedule(static, 1) nowait
            for (int64_t u = 0; u < n2; u++) {
                int64_t h0 = u / nqb % ng * gs;
                bw_q_block(&c, &s, u / nqb / ng, h0, h0 + gs, c.qb_lo + u % nqb);
            }
        }
    }

    if (tab && c.emod) {
        fx__mod_grad_reduce(c.emod, tab, units); /* fixed order over units, as below */
    } else if (tab) {
        /* Fixed order over units: batch, then kv-head. */
        const fx_score_rel_bias_ctx *t = c.bias;
        int64_t per_unit = c.tab_heads * t->size, total = t->heads * t->size;
#pragma omp parallel for schedule(static)
        for (int64_t e = 0; e < total; e++) {
            double acc = 0.0;
            if (t->heads == 1) {
                for (int64_t u = 0; u < units; u++)
                    acc += tab[u * per_unit + e];
            } else {
                int64_t h = e / t->size, hk = h / c.G, g = h % c.G;
                for (int64_t b = 0; b < a->B; b++)
                    acc += tab[(b * a->Hkv + hk) * per_unit + g * t->size + e % t->size];
            }
            t->grad_table[e] += (float)acc;
        }
    }
    fx__free(Di);
    fx__free(scr);
    fx__free(tab);
    return FX_OK;
}
