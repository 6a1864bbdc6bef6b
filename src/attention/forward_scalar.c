/* The forward's plain reference path: the same block schedule and online softmax as the
   vector paths, written as simple loops. FLEXC_ISA=scalar selects it. */
#include "attention/internal.h"

typedef struct scratch_sizes {
    size_t s, o, ml, total; /* floats per thread */
} scratch_sizes;

int fx__flex_forward_scalar(const fx_attention *a, const float *q, const float *k, const float *v,
                            float *out, float *lse)
{
    fx__fwd_plan p;
    fx__fwd_plan_init(&p, a);
    const fx_block_mask *m = a->mask;
    const int64_t D = a->D, Dv = a->Dv, bq = p.bq, bk = p.bk, gs = p.gs;
    const size_t s_len = (size_t)(bq * bk), o_len = (size_t)(gs * bq * Dv), ml_len = (size_t)(gs * bq);
    const size_t per = s_len + o_len + 2 * ml_len;
    const int nt = fx__max_threads();
    float *scratch = fx__alloc((size_t)nt * per * sizeof(float));
    if (!scratch)
        return fx__error(FX_ENOMEM, "attention: out of memory for %d x %zu scratch floats", nt, per);

#pragma omp parallel for schedule(static, 1)
    for (int64_t item = 0; item < p.n_items; item++) {
        float *S = scratch + (size_t)fx__thread_id() * per, *O = S + s_len, *M = O + o_len, *L = M + ml_len;
        fx__fwd_item it;
        fx__fwd_item_init(&p, a, item, &it);
        const int64_t b = it.b, h0 = it.h0, qa0 = it.qa0, nr = it.nr, brow = it.brow;
        fx__fwd_state_reset(M, L, gs * bq, O, o_len);

        const float *kh = fx__fwd_kv_rows(a, &it, k, D);
        const float *vh = fx__fwd_kv_rows(a, &it, v, Dv);
        for (int64_t e = it.e0; e < it.e1; e++) {
            int64_t kb, k0, nk;
            const uint64_t *bits;
            if (!fx__fwd_kv_block(m, a, bk, e, &kb, &k0, &nk, &bits))
                continue;
            for (int64_t g = 0; g < gs; g++) {
                const int64_t h = h0 + g;
                const float *qh = fx__fwd_q_rows(a, &it, q, h);
                for (int64_t i = 0; i < nr; i++)
                    for (int64_t j = 0; j < nk; j++) {
                        float acc = 0.0f;
                        for (int64_t d = 0; d < D; d++)
                            acc += qh[i * D + d] * kh[(k0 + j) * D + d];
                        S[i * bk + j] = acc * p.scale;
                    }
                if (a->score_mod)
                    a->score_mod(S, bk, nr, nk, b, h, qa0, k0, a->score_ctx);
                for (int64_t i = 0; i < nr; i++) {
                    float *s = S + i * bk, *o = O + (g * bq + i) * Dv;
                    if (bits)
                        for (int64_t j = 0; j < nk; j++)
                            if (!fx__bm_test(bits, m->bm_words, brow + i, j))
                                s[j] = -INFINITY;
                    /* A NaN score makes the row's max NaN, and from it M, L and the output:
                       the row reads NaN, not "fully masked" (-inf). */
                    float mx = M[g * bq + i];
                    for (int64_t j = 0; j < nk; j++)
                        mx = s[j] > mx || isnan(s[j]) ? s[j] : mx;
                    if (mx == -INFINITY)
                        continue; /* nothing visible in this row yet */
                    const float alpha = expf(M[g * bq + i] - mx);
                    float sum = 0.0f;
                    for (int64_t d = 0; d < Dv; d++)
                        o[d] *= alpha;
                    for (int64_t j = 0; j < nk; j++) {
                        const float pj = expf(s[j] - mx);
                        sum += pj;
                        for (int64_t d = 0; d < Dv; d++)
                            o[d] += pj * vh[(k0 + j) * Dv + d];
                    }
                    M[g * bq + i] = mx;
                    L[g * bq + i] = L[g * bq + i] * alpha + sum;
                }
            }
        }
        fx__fwd_item_store(&p, a, &it, O, Dv, M, L, out, lse);
    }
    fx__free(scratch);
    return FX_OK;
}
