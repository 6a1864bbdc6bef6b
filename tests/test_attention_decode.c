/* FlexAttention decoding path (split-KV): against the float64 reference and the prefill
   kernel, with a KV cache (q_offset, Lkv shorter than the mask), masks and mods, GQA, fully
   masked rows, bitwise equality at 1 and 2 threads, guard zones; and the routing of
   fx_flex_attention. */
#include "harness.h"

#include "attention/backward.h"
#include "attention_ref.h"

static double mod_softcap(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)q, (void)kv;
    double c = ((const fx_score_softcap_ctx *)ctx)->cap;
    return c * tanh(s / c);
}
static double mod_alibi(double s, int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b;
    return s + (double)((const fx_score_alibi_ctx *)ctx)->slopes[h] * (double)(kv - q);
}
/* Per head and batch, with whole blocks empty for some rows: keys in [h*37, h*37 + 300) and
   every 3rd key besides, none at all for query positions divisible by 7. */
static bool mask_custom(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)ctx;
    if (q % 7 == 0)
        return false;
    return (kv >= h * 37 + b && kv < h * 37 + 300) || kv % 3 == 0;
}

typedef struct dcase {
    int64_t B, Hq, Hkv, Lq, Lkv, D, Dv, q_offset, mask_len, block;
    int mask; /* 0 none, 1 causal, 2 sliding, 3 custom */
    int mod;  /* 0 none, 1 softcap, 2 alibi */
    float scale; /* 0: 1/sqrt(D) */
    double tol;  /* 0: float32 rounding of O(1) scores; larger for huge scores */
} dcase;

static void run_case(const dcase *dc, uint64_t seed)
{
    fx_mask_sliding_window_ctx sw = {.window = 100};
    fx_score_softcap_ctx cap = {.cap = 2.0f};
    float slopes[32];
    for (int i = 0; i < 32; i++)
        slopes[i] = 0.01f * (float)(i + 1);
    fx_score_alibi_ctx al = {.slopes = slopes};
    fx_mask_fn mf = dc->mask == 1 ? fx_mask_causal : dc->mask == 2 ? fx_mask_sliding_window : dc->mask == 3 ? mask_custom : NULL;
    const void *mctx = dc->mask == 2 ? (const void *)&sw : NULL;
    int64_t mB = dc->mask == 3 ? dc->B : 1, mH = dc->mask == 3 ? dc->Hq : 1;
    fx_block_mask *bm = NULL;
    if (mf)
        FXT_OK(fx_block_mask_create(&bm, mf, mctx, mB, mH, dc->mask_len, dc->mask_len, dc->block, dc->block));
    fx_attention a = {.B = dc->B, .Hq = dc->Hq, .Hkv = dc->Hkv, .Lq = dc->Lq, .Lkv = dc->Lkv, .D = dc->D, .Dv = dc->Dv,
                      .q_offset = dc->q_offset, .mask = bm, .scale = dc->scale};
    ref_attn r = {.B = dc->B, .Hq = dc->Hq, .Hkv = dc->Hkv, .Lq = dc->Lq, .Lkv = dc->Lkv, .D = dc->D, .Dv = dc->Dv,
                  .scale = dc->scale ? dc->scale : 1.0 / sqrt((double)dc->D), .q_offset = dc->q_offset, .mask = mf, .mask_ctx = mctx,
                  .mask_B = mB, .mask_H = mH};
    if (dc->mod == 1) {
        a.score_mod = fx_score_softcap, a.score_ctx = &cap;
        r.mod = mod_softcap, r.mod_ctx = &cap;
    } else if (dc->mod == 2) {
        a.score_mod = fx_score_alibi, a.score_ctx = &al;
        r.mod = mod_alibi, r.mod_ctx = &al;
    }
    size_t nq = (size_t)(dc->B * dc->Hq * dc->Lq * dc->D), nk = (size_t)(dc->B * dc->Hkv * dc->Lkv * dc->D);
    size_t nv = (size_t)(dc->B * dc->Hkv * dc->Lkv * dc->Dv), no = (size_t)(dc->B * dc->Hq * dc->Lq * dc->Dv);
    size_t nl = (size_t)(dc->B * dc->Hq * dc->Lq);
    float *q = fxt_random(nq, -2, 2, seed), *k = fxt_random(nk, -2, 2, seed + 1), *v = fxt_random(nv, -1, 1, seed + 2);
    double *ro = fxt_alloc_f64(no), *rl = fxt_alloc_f64(nl);
    ref_forward(&r, q, k, v, ro, rl);
    float *o1 = fxt_guarded(no), *l1 = fxt_guarded(nl), *o2 = fxt_guarded(no), *l2 = fxt_guarded(nl);
    float *o3 = fxt_guarded(no), *l3 = fxt_guarded(nl);
    int threads = fx_get_num_threads();
    fx_set_num_threads(1);
    FXT_OK(fx__attention_decode(&a, q, k, v, o1, l1));
    fx_set_num_threads(2);
    FXT_OK(fx__attention_decode(&a, q, k, v, o3, l3));
    fx_set_num_threads(threads);
    FXT_OK(fx__flex_forward(&a, q, k, v, o2, l2));
    double tol = dc->tol ? dc->tol : 2e-5;
    fxt_close_f32("decode out", o1, ro, no, tol, 5 * tol);
    fxt_close_f32("decode lse", l1, rl, nl, tol, 1e-5);
    fxt_bitwise_f32("decode out 1 vs 2 threads", o1, o3, no);
    fxt_bitwise_f32("decode lse 1 vs 2 threads", l1, l3, nl);
    /* Within float32 rounding of the prefill kernel. */
    double *p64 = fxt_alloc_f64(no), *pl64 = fxt_alloc_f64(nl);
    for (size_t i = 0; i < no; i++)
        p64[i] = o2[i];
    for (size_t i = 0; i < nl; i++)
        pl64[i] = l2[i];
    fxt_close_f32("decode vs prefill out", o1, p64, no, tol, 5 * tol);
    fxt_close_f32("decode vs prefill lse", l1, pl64, nl, tol, 1e-5);
    fxt_guarded_free("o1", o1), fxt_guarded_free("l1", l1), fxt_guarded_free("o2", o2);
    fxt_guarded_free("l2", l2), fxt_guarded_free("o3", o3), fxt_guarded_free("l3", l3);
    free(q), free(k), free(v), free(ro), free(rl), free(p64), free(pl64);
    fx_block_mask_free(bm);
}

static void for_each_path(const dcase *cases, int n)
{
    fx_isa saved = fx_get_isa();
    for (int p = FX_ISA_SCALAR; p <= (int)saved; p++) { /* every path this machine has */
        fx_isa paths[3] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};
        fx_set_isa(paths[p]);
        for (int i = 0; i < n; i++) {
            fprintf(stderr, "  %s case %d\n", fx_isa_name(paths[p]), i);
            run_case(&cases[i], 40 + (uint64_t)i);
        }
    }
    fx_set_isa(saved);
}

/* Dense, causal, sliding and custom masks; softcap / ALiBi; GQA 1, 4, 8; D 40 / Dv 24. */
static void test_decode_vs_reference(void)
{
    static const dcase cases[] = {
        {.B = 2, .Hq = 4, .Hkv = 1, .Lq = 1, .Lkv = 700, .D = 32, .Dv = 32, .q_offset = 699, .mask_len = 700},
        {.B = 1, .Hq = 8, .Hkv = 1, .Lq = 3, .Lkv = 1000, .D = 40, .Dv = 24, .q_offset = 997, .mask_len = 1000,
         .mask = 1, .block = 64, .mod = 1},
        {.B = 2, .Hq = 2, .Hkv = 2, .Lq = 16, .Lkv = 900, .D = 16, .Dv = 16, .q_offset = 884, .mask_len = 1024,
         .mask = 2, .block = 128, .mod = 2},
        {.B = 2, .Hq = 4, .Hkv = 2, .Lq = 5, .Lkv = 777, .D = 8, .Dv = 12, .q_offset = 300, .mask_len = 800,
         .mask = 3, .block = 32},
        {.B = 1, .Hq = 4, .Hkv = 4, .Lq = 4, .Lkv = 530, .D = 24, .Dv = 16, .q_offset = 500, .mask_len = 600,
         .mask = 2, .block = 40, .mod = 1}, /* blocks not a multiple of 16 keys */
        {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 2, .Lkv = 600, .D = 16, .Dv = 16, .q_offset = 598, .mask_len = 600,
         .mask = 1, .block = 128, .scale = 3000.0f, .tol = 5e-3}, /* scores of 1e4: no overflow */
    };
    for_each_path(cases, 6);
}

/* A KV cache: the mask is built once for the full capacity; each step passes the keys so far. */
static void test_decode_kv_cache(void)
{
    dcase cases[3];
    for (int s = 0; s < 3; s++) {
        int64_t len = 300 + 97 * s;
        cases[s] = (dcase){.B = 1, .Hq = 4, .Hkv = 2, .Lq = 1, .Lkv = len, .D = 16, .Dv = 16, .q_offset = len - 1,
                           .mask_len = 2048, .mask = s == 1 ? 2 : 1, .block = 128, .mod = s == 2 ? 1 : 0};
    }
    for_each_path(cases, 3);
}

/* A row whose keys are all masked: out 0, lse -inf, no NaN, next to rows that see keys. */
static void test_decode_fully_masked(void)
{
    static const dcase cases[] = {
        {.B = 1, .Hq = 2, .Hkv = 1, .Lq = 8, .Lkv = 600, .D = 8, .Dv = 8, .q_offset = 0, .mask_len = 600, .mask = 3,
         .block = 64},
    };
    for_each_path(cases, 1);
}

/* fx_flex_attention takes the split-KV path for few rows and many keys: same bits as a direct call. */
static void test_routing(void)
{
    fx_attention a = {.B = 1, .Hq = 4, .Hkv = 2, .Lq = 2, .Lkv = 1500, .D = 16, .Dv = 16, .q_offset = 1498};
    FXT_CHECK(fx__attention_use_decode(&a));
    fx_attention big = a;
    big.Lq = 64;
    FXT_CHECK(!fx__attention_use_decode(&big));
    size_t nq = 4 * 2 * 16, nk = 2 * 1500 * 16;
    float *q = fxt_random(nq, -1, 1, 1), *k = fxt_random(nk, -1, 1, 2), *v = fxt_random(nk, -1, 1, 3);
    float o1[128], o2[128], l1[8], l2[8];
    FXT_OK(fx_flex_attention(&a, q, k, v, o1, l1));
    FXT_OK(fx__attention_decode(&a, q, k, v, o2, l2));
    fxt_bitwise_f32("routed out", o1, o2, nq);
    fxt_bitwise_f32("routed lse", l1, l2, 8);
    free(q), free(k), free(v);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_decode_vs_reference);
    FXT_RUN(test_decode_kv_cache);
    FXT_RUN(test_decode_fully_masked);
    FXT_RUN(test_routing);
    return fxt_finish();
}
