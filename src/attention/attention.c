/* fx_flex_attention: argument checks, work plan, the forward's kernel tables, and the choice
   between the CPU and a device backend. */
#include "attention/internal.h"
#include "attention/backward.h"
#include "attention/bf16.h"
#include "core/backend.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

static bool fits(int64_t a, int64_t b, int64_t c, int64_t d)
{
    size_t x;
    return fx__mul_size((size_t)a, (size_t)b, &x) && fx__mul_size(x, (size_t)c, &x) &&
           fx__mul_size(x, (size_t)d, &x) && fx__mul_size(x, sizeof(float), &x) && x <= (size_t)INT64_MAX;
}

static int check_score_mod(const fx_attention *a)
{
    const void *ctx = a->score_ctx;
    switch (fx__score_kind(a->score_mod)) {
    case FX__SCORE_ALIBI:
        if (!ctx || !((const fx_score_alibi_ctx *)ctx)->slopes)
            return fx__error(FX_EINVAL, "score_ctx: alibi needs slopes (one per query head), got NULL");
        break;
    case FX__SCORE_SOFTCAP: {
        float c = ctx ? ((const fx_score_softcap_ctx *)ctx)->cap : 0.0f;
        if (!(c > 0.0f) || !isfinite(c))
            return fx__error(FX_EINVAL, "score_ctx: softcap cap = %g must be finite and > 0", (double)c);
        if (!isfinite(1.0f / c)) /* the vector paths multiply by 1/cap */
            return fx__error(FX_EINVAL, "score_ctx: softcap cap = %g is too small: 1/cap overflows float",
                             (double)c);
        break;
    }
    case FX__SCORE_REL_BIAS: {
        const fx_score_rel_bias_ctx *c = ctx;
        if (!c || !c->table)
            return fx__error(FX_EINVAL, "score_ctx: rel_bias table is NULL");
        if (c->size < 1)
            return fx__error(FX_EINVAL, "score_ctx: rel_bias size = %lld must be >= 1", (long long)c->size);
        if (c->heads != 1 && c->heads != a->Hq)
            return fx__error(FX_EINVAL, "score_ctx: rel_bias heads = %lld must be 1 or Hq = %lld",
                             (long long)c->heads, (long long)a->Hq);
        break;
    }
    default:
        break;
    }
    return FX_OK;
}

int fx__attention_check(const fx_attention *a, const float *q, const float *k, const float *v)
{
    if (!a)
        return fx__error(FX_EINVAL, "attention parameters a is NULL");
    const struct { const char *name; int64_t v; } sizes[] = {
        {"B", a->B}, {"Hq", a->Hq}, {"Hkv", a->Hkv}, {"Lq", a->Lq}, {"Lkv", a->Lkv}, {"D", a->D}, {"Dv", a->Dv},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v < 1)
            return fx__error(FX_EINVAL, "%s = %lld must be >= 1", sizes[i].name, (long long)sizes[i].v);
    if (a->Hq % a->Hkv != 0)
        return fx__error(FX_EINVAL, "Hq = %lld is not a multiple of Hkv = %lld", (long long)a->Hq,
                         (long long)a->Hkv);
    const int64_t dmax = a->D > a->Dv ? a->D : a->Dv;
    if (!fits(a->B, a->Hq, a->Lq, dmax) || !fits(a->B, a->Hkv, a->Lkv, dmax))
        return fx__error(FX_EINVAL, "tensor sizes overflow (B = %lld, Hq = %lld, Lq = %lld, Lkv = %lld)",
                         (long long)a->B, (long long)a->Hq, (long long)a->Lq, (long long)a->Lkv);
    /* A thread's scratch holds tiles of up to Hq x (block + padding) x (D + Dv) floats (the
       largest block is 4096): refuse sizes whose scratch arithmetic would overflow, far
       beyond any memory, instead of letting it wrap. */
    if (!fits(a->Hq, a->D + a->Dv + 64, 2 * (4096 + 64), 16 * (int64_t)fx__max_threads()))
        return fx__error(FX_EINVAL, "Hq = %lld, D = %lld, Dv = %lld: the kernels' scratch size overflows",
                         (long long)a->Hq, (long long)a->D, (long long)a->Dv);
    if (!isfinite(a->scale))
        return fx__error(FX_EINVAL, "scale = %g must be finite (0: 1/sqrt(D))", (double)a->scale);
    if (a->q_offset < 0)
        return fx__error(FX_EINVAL, "q_offset = %lld must be >= 0", (long long)a->q_offset);
    if (a->q_offset > INT64_MAX - a->Lq)
        return fx__error(FX_EINVAL, "q_offset = %lld + Lq overflows", (long long)a->q_offset);
    const fx_block_mask *m = a->mask;
    if (m) {
        if (m->q_len < a->q_offset + a->Lq)
            return fx__error(FX_EINVAL, "mask q_len = %lld is shorter than q_offset + Lq = %lld", (long long)m->q_len,
                             (long long)(a->q_offset + a->Lq));
        if (m->kv_len < a->Lkv)
            return fx__error(FX_EINVAL, "mask kv_len = %lld is shorter than Lkv = %lld", (long long)m->kv_len,
                             (long long)a->Lkv);
        if (m->B != 1 && m->B != a->B)
            return fx__error(FX_EINVAL, "mask B = %lld must be 1 or B = %lld", (long long)m->B, (long long)a->B);
        if (m->H != 1 && m->H != a->Hq)
            return fx__error(FX_EINVAL, "mask H = %lld must be 1 or Hq = %lld", (long long)m->H, (long long)a->Hq);
    }
    int rc = check_score_mod(a);
    if (rc != FX_OK)
        return rc;
    if (!q)
        return fx__error(FX_EINVAL, "q is NULL");
    if (!k)
        return fx__error(FX_EINVAL, "k is NULL");
    if (!v)
        return fx__error(FX_EINVAL, "v is NULL");
    return FX_OK;
}

float fx__attention_scale(const fx_attention *a)
{
    return a->scale != 0.0f ? a->scale : (float)(1.0 / sqrt((double)a->D));
}

void fx__fwd_plan_init(fx__fwd_plan *p, const fx_attention *a)
{
    const fx_block_mask *m = a->mask;
    p->bq = m ? m->block_q : FX__DENSE_BLOCK_Q;
    p->bk = m ? m->block_kv : FX__DENSE_BLOCK_KV;
    if (m) {
        p->qb_lo = a->q_offset / p->bq;
        p->n_qb = (a->q_offset + a->Lq - 1) / p->bq - p->qb_lo + 1;
    } else {
        p->qb_lo = 0;
        p->n_qb = (a->Lq + p->bq - 1) / p->bq;
    }
    p->nkb = (a->Lkv + p->bk - 1) / p->bk;
    p->G = a->Hq / a->Hkv;
    p->gs = (!m || m->H == 1) ? p->G : 1;
    p->n_hg = a->Hq / p->gs;
    p->n_items = a->B * p->n_hg * p->n_qb;
    p->scale = fx__attention_scale(a);
    p->stream = (size_t)(a->B * a->Hq * a->Lq) * (size_t)a->Dv * sizeof(float) >= FX__STREAM_OUT_BYTES;
}

void fx__fwd_item_init(const fx__fwd_plan *p, const fx_attention *a, int64_t item, fx__fwd_item *it)
{
    const int64_t qbi = item % p->n_qb;
    it->b = item / (p->n_hg * p->n_qb);
    it->h0 = (item / p->n_qb) % p->n_hg * p->gs;
    it->hkv = it->h0 / p->G;
    const int64_t end = a->q_offset + a->Lq;
    int64_t stop;
    if (!a->mask) {
        it->qa0 = a->q_offset + qbi * p->bq;
        it->brow = 0;
        stop = it->qa0 + p->bq;
        it->e0 = 0, it->e1 = p->nkb;
    } else {
        const fx_block_mask *m = a->mask;
        const int64_t base = (p->qb_lo + qbi) * p->bq;
        it->qa0 = base > a->q_offset ? base : a->q_offset;
        it->brow = it->qa0 - base;
        stop = base + p->bq;
        const int64_t r = fx__bm_row(m, fx__bm_slot(m, it->b, it->h0), p->qb_lo + qbi);
        it->e0 = m->kv_ptr[r], it->e1 = m->kv_ptr[r + 1];
    }
    it->nr = (stop < end ? stop : end) - it->qa0;
}

void fx__fwd_item_store(const fx__fwd_plan *p, const fx_attention *a, const fx__fwd_item *it, const float *O,
                        int64_t ldo, const float *M, const float *L, float *out, float *lse)
{
    for (int64_t g = 0; g < p->gs; g++) {
        const int64_t row0 = (it->b * a->Hq + it->h0 + g) * a->Lq + (it->qa0 - a->q_offset);
        for (int64_t i = 0; i < it->nr; i++) {
            const float l = L[g * p->bq + i], *o = O + (g * p->bq + i) * ldo;
            float *dst = out + (size_t)(row0 + i) * (size_t)a->Dv;
            /* l is NaN when a visible score was NaN: out and lse are NaN then (as in PyTorch),
               and -inf stays the mark of a row that saw no key. */
            const float inv = l > 0.0f ? 1.0f / l : isnan(l) ? l : 0.0f;
            int64_t d = 0;
#ifdef __SSE2__
            if (p->stream && (uintptr_t)dst % 16 == 0) {
                const __m128 vi = _mm_set1_ps(inv);
                for (; d + 4 <= a->Dv; d += 4)
                    _mm_stream_ps(dst + d, _mm_mul_ps(_mm_loadu_ps(o + d), vi));
            }
#endif
            for (; d < a->Dv; d++)
                dst[d] = o[d] * inv;
            if (lse)
                lse[row0 + i] = l > 0.0f ? M[g * p->bq + i] + logf(l) : isnan(l) ? l : -INFINITY;
        }
    }
#ifdef __SSE2__
    if (p->stream)
        _mm_sfence(); /* the streamed rows are visible to every thread from here on */
#endif
}

const fx__attn_fwd_kernels fx__attn_fwd_kernels_scalar = {"scalar", fx__flex_forward_scalar, NULL};
const fx__attn_fwd_kernels fx__attn_fwd_kernels_avx2 = {"avx2", fx__flex_forward_avx2, NULL};
const fx__attn_fwd_kernels fx__attn_fwd_kernels_avx512 = {"avx512", fx__flex_forward_avx512,
                                                          fx__flex_forward_avx512bf16};

const fx__attn_fwd_kernels *fx__attn_fwd_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__attn_fwd_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__attn_fwd_kernels_scalar, &fx__attn_fwd_kernels_avx2, &fx__attn_fwd_kernels_avx512);
#endif
}

const fx__attn_fwd_kernels *fx__attn_fwd_kernels_now(void) { return fx__attn_fwd_kernels_for(fx__isa()); }

static int fx__flex_forward_flags(const fx_attention *a, unsigned flags, const float *q, const float *k,
                                  const float *v, float *out, float *lse)
{
    /* A sparse forward is fast enough that first writes of a fresh output (one page fault
       per 4 KiB) were a tenth of its time at L = 32768, window 256. */
    fx__advise_huge_pages(out, (size_t)(a->B * a->Hq * a->Lq) * (size_t)a->Dv * sizeof(float));
    const fx__attn_fwd_kernels *kf = fx__attn_fwd_kernels_now();
    if ((flags & FX__ATTN_BF16) && kf->forward_bf16 && fx__attn16_cpu())
        return kf->forward_bf16(a, q, k, v, out, lse);
    return kf->forward(a, q, k, v, out, lse);
}

int fx__flex_forward(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                     float *lse)
{
    return fx__flex_forward_flags(a, 0, q, k, v, out, lse);
}

fx_attention fx_attention_defaults(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D)
{
    return (fx_attention){.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = D, .dtype = FX_DT_F32};
}

int fx_flex_attention(const fx_attention *a, const float *q, const float *k, const float *v, float *out,
                      float *lse)
{
    const fx__backend *dev = a ? fx__backend_of(a->device, a->dtype) : NULL;
    if (dev) /* device memory or bfloat16 tensors: that backend's call */
        return dev->flex_attention(a, q, k, v, out, lse);
    return fx__flex_attention_with(a, 0, q, k, v, out, lse);
}

int fx__flex_attention_with(const fx_attention *a, unsigned flags, const float *q, const float *k, const float *v,
                            float *out, float *lse)
{
    int rc = fx__attention_check(a, q, k, v);
    if (rc != FX_OK)
        return rc;
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    const size_t nq = (size_t)(a->B * a->Hq * a->Lq), nkv = (size_t)(a->B * a->Hkv * a->Lkv);
    const size_t f = sizeof(float);
    const fx__span in[] = {{"q", q, nq * (size_t)a->D * f}, {"k", k, nkv * (size_t)a->D * f},
                           {"v", v, nkv * (size_t)a->Dv * f}};
    const fx__span outs[] = {{"out", out, nq * (size_t)a->Dv * f}, {"lse", lse, nq * f}};
    rc = fx__check_overlaps(in, 3, outs, 2);
    if (rc != FX_OK)
        return rc;
    if (fx__attention_use_decode(a)) /* few query rows, many keys: split-KV (decode.c) */
        return fx__attention_decode(a, q, k, v, out, lse);
    return fx__flex_forward_flags(a, flags, q, k, v, out, lse);
}
