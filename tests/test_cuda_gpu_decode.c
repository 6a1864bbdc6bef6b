/* Decoding on a CUDA device (src/cuda/attn_decode.cu: few query rows against a long KV cache,
   one thread block per KV head reading each K/V row once for the whole GQA group) against
   the CPU path of the same call: GQA 8/2 with Lq 1 to 4, dense and causal with q_offset,
   sliding windows, a custom per-head mask with rows that see nothing, every built-in score
   mod, head sizes 32 to 256, float32 and bfloat16, a NaN in one query, shapes the kernel does
   not take (the general forward answers them), and every device call twice, bitwise equal.
   Skipped (77) without a GPU; see tests/cuda_gpu.h for the tolerances. */
#include "cuda_attn.h"
#include "cuda/cuda.h"

/* Runs a on the CPU and on device 1 and compares out and lse; the mask (if any) gets its
   device copy here, the score mod's arrays are uploaded. */
static void check_decode(const char *name, fx_attention a, bool bf16)
{
    printf("  %s%s\n", name, bf16 ? " (bf16)" : "");
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
    const size_t nqd = nq * (size_t)a.D, nqv = nq * (size_t)a.Dv, nkd = nk * (size_t)a.D, nkv = nk * (size_t)a.Dv;
    float *q = fxt_random(nqd, -1, 1, 71), *k = fxt_random(nkd, -1, 1, 72), *v = fxt_random(nkv, -1, 1, 73);
    if (bf16)
        bf16_round(q, nqd), bf16_round(k, nkd), bf16_round(v, nkv);
    float *out_ref = fxt_guarded(nqv), *lse_ref = fxt_guarded(nq);
    FXT_OK(fx_flex_attention(&a, q, k, v, out_ref, lse_ref));

    fx_attention d = a;
    d.device = 1;
    d.dtype = bf16 ? FX_DT_BF16 : 0;
    if (a.mask)
        FXT_OK(fx_block_mask_to_device((fx_block_mask *)a.mask, 1));
    dev_ctx dc;
    dev_ctx_make(&dc, &a);
    d.score_ctx = dc.ctx;
    void *gq = gpu_upload_as(q, nqd, bf16), *gk = gpu_upload_as(k, nkd, bf16), *gv = gpu_upload_as(v, nkv, bf16);
    void *gout = gpu_alloc(nqv * (bf16 ? 2 : 4)), *glse = gpu_alloc(nq * sizeof(float));
    float *out[2], *lse[2];
    for (int run = 0; run < 2; run++) {
        FXT_OK(fx_flex_attention(&d, gq, gk, gv, gout, glse));
        out[run] = fxt_guarded(nqv), lse[run] = fxt_guarded(nq);
        gpu_download_as(out[run], gout, nqv, bf16);
        gpu_download(lse[run], glse, nq * sizeof(float));
    }
    gpu_close("out", out[0], out_ref, nqv, bf16);
    gpu_close("lse", lse[0], lse_ref, nq, bf16);
    gpu_same("out, two runs", out[0], out[1], nqv);
    gpu_same("lse, two runs", lse[0], lse[1], nq);
    for (int run = 0; run < 2; run++)
        fxt_guarded_free("out", out[run]), fxt_guarded_free("lse", lse[run]);
    fxt_guarded_free("out_ref", out_ref), fxt_guarded_free("lse_ref", lse_ref);
    gpu_free(gq), gpu_free(gk), gpu_free(gv), gpu_free(gout), gpu_free(glse);
    dev_ctx_free(&dc);
    free(q), free(k), free(v);
}

static fx_attention shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D)
{
    return (fx_attention){.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = D};
}

static fx_block_mask *mask_of(fx_mask_fn fn, const void *ctx, int64_t H, int64_t L, int64_t bq, int64_t bk)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fn, ctx, 1, H, L, L, bq, bk));
    return m;
}

/* Which calls the decode kernel takes (the rest go to the general forward). */
static void test_fits(void)
{
    static float buf[64]; /* any 16-byte aligned addresses */
    fx__cu_attn c = {.q = buf, .k = buf, .v = buf, .B = 2, .Hq = 8, .Hkv = 2, .Lq = 1, .Lkv = 3000, .D = 64,
                     .Dv = 64};
    FXT_CHECK(fx__cu_attn_decode_fits(&c));
    c.Lq = 8; /* the most positions */
    FXT_CHECK(fx__cu_attn_decode_fits(&c));
    c.Lq = 9;
    FXT_CHECK(!fx__cu_attn_decode_fits(&c));
    c.Hq = 32, c.Lq = 4; /* 4 x 16 = 64 rows: the most */
    FXT_CHECK(fx__cu_attn_decode_fits(&c));
    c.Lq = 5;
    FXT_CHECK(!fx__cu_attn_decode_fits(&c));
    c.Hq = 8;
    c.Lq = 1, c.D = 48, c.Dv = 48;
    FXT_CHECK(!fx__cu_attn_decode_fits(&c));
    c.D = 64, c.Dv = 32;
    FXT_CHECK(!fx__cu_attn_decode_fits(&c));
    c.Dv = 64, c.k = (const char *)buf + 4;
    FXT_CHECK(!fx__cu_attn_decode_fits(&c));
}

static void test_dense(void)
{
    for (int64_t lq = 1; lq <= 4; lq++) {
        char name[64];
        snprintf(name, sizeof name, "dense, GQA 8/2, Lq %lld, Lkv 3000, D 64", (long long)lq);
        fx_attention a = shape(2, 8, 2, lq, 3000, 64);
        a.q_offset = 3000 - lq;
        check_decode(name, a, false);
        check_decode(name, a, true);
    }
    check_decode("dense, MHA 4/4, Lq 1, Lkv 1, D 32", shape(2, 4, 4, 1, 1, 32), false);
    check_decode("dense, MQA 16/1, Lq 4 (64 rows), D 32", shape(1, 16, 1, 4, 700, 32), false);
    check_decode("dense, GQA 8/2, Lq 3, D 128", shape(2, 8, 2, 3, 1100, 128), true);
    check_decode("dense, GQA 8/2, Lq 2, D 256", shape(1, 8, 2, 2, 900, 256), false);
    check_decode("dense, GQA 8/2, Lq 2, D 256", shape(1, 8, 2, 2, 900, 256), true);
}

static void test_masks(void)
{
    const int64_t L = 2500;
    fx_attention a = shape(2, 8, 2, 4, L, 64);
    a.q_offset = L - 4;
    a.mask = mask_of(fx_mask_causal, NULL, 1, L, 0, 0);
    check_decode("causal, q_offset 2496, Lq 4", a, false);
    check_decode("causal, q_offset 2496, Lq 4", a, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
    /* Lq 3 across a q-block boundary: rows of one call in two mask rows. */
    a = shape(2, 8, 2, 3, 1000, 32);
    a.q_offset = 126;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1000, 64, 32);
    check_decode("causal, rows in two q-blocks", a, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_mask_sliding_window_ctx w = {.window = 300};
    a = shape(2, 8, 2, 2, L, 64);
    a.q_offset = L - 2;
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, L, 64, 64);
    check_decode("sliding window 300, Lq 2", a, false);
    check_decode("sliding window 300, Lq 2", a, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* Differs per head, leaves some rows without keys, and keeps one block of keys in three. */
static bool sparse_mask(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)ctx;
    if (q % 5 == 0)
        return false;
    return (kv / 48) % 3 != 1 && (q * 7 + kv * 3 + h) % 5 != 0 && kv <= q;
}

static void test_custom_mask(void)
{
    fx_attention a = shape(2, 8, 2, 3, 1200, 64);
    a.q_offset = 1197; /* rows 1197 .. 1199: 1200 % 5 == 0 is not among them */
    a.mask = mask_of(sparse_mask, NULL, 8, 1200, 32, 48);
    check_decode("custom per-head mask", a, false);
    check_decode("custom per-head mask", a, true);
    a.q_offset = 1195; /* row 1195 sees nothing: zeros and lse -inf */
    a.Lq = 3;
    check_decode("custom per-head mask, a row with no key", a, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

static void test_score_mods(void)
{
    fx_attention a = shape(2, 8, 2, 2, 1500, 64);
    a.q_offset = 1498;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1500, 0, 0);
    float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.03f, 0.02f, 0.01f, 0.005f};
    fx_score_alibi_ctx al = {.slopes = slopes};
    a.score_mod = fx_score_alibi;
    a.score_ctx = &al;
    check_decode("alibi, causal", a, false);
    fx_score_softcap_ctx cap = {.cap = 3.0f};
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    check_decode("softcap 3, causal", a, false);
    check_decode("softcap 3, causal", a, true);
    float *table = fxt_random(8 * 41, -1, 1, 74);
    fx_score_rel_bias_ctx rel = {.table = table, .size = 41, .zero = 20, .heads = 8};
    a.score_mod = fx_score_rel_bias;
    a.score_ctx = &rel;
    check_decode("rel_bias per head, causal", a, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
    free(table);
}

/* Shapes the decode kernel does not take, answered by the general forward. */
static void test_fallback(void)
{
    check_decode("D 48 (general forward)", shape(2, 8, 2, 1, 800, 48), false);
    check_decode("Lq 20 x GQA 4 = 80 rows (general forward)", shape(1, 8, 2, 20, 300, 32), false);
    check_decode("Lq 12 > 8 positions (general forward)", shape(1, 4, 2, 12, 300, 64), true);
}

/* A NaN in one query row reaches that row's output and lse only. */
static void test_nan(void)
{
    fx_attention a = shape(1, 4, 1, 1, 600, 32);
    a.device = 1;
    const size_t nq = 4 * 32, nk = 600 * 32;
    float *q = fxt_random(nq, -1, 1, 75), *k = fxt_random(nk, -1, 1, 76), *v = fxt_random(nk, -1, 1, 77);
    q[2 * 32 + 5] = NAN; /* head 2 */
    void *gq = gpu_upload(q, nq * 4), *gk = gpu_upload(k, nk * 4), *gv = gpu_upload(v, nk * 4);
    void *gout = gpu_alloc(nq * 4), *glse = gpu_alloc(4 * 4);
    float out[4 * 32], lse[4];
    FXT_OK(fx_flex_attention(&a, gq, gk, gv, gout, glse));
    gpu_download(out, gout, sizeof out);
    gpu_download(lse, glse, sizeof lse);
    for (int h = 0; h < 4; h++) {
        FXT_CHECK(isnan(lse[h]) == (h == 2));
        for (int d = 0; d < 32; d++)
            FXT_CHECK(isnan(out[h * 32 + d]) == (h == 2));
    }
    gpu_free(gq), gpu_free(gk), gpu_free(gv), gpu_free(gout), gpu_free(glse);
    free(q), free(k), free(v);
}

#ifdef FX_CUDA_EMU
/* Other split counts: few resident blocks (one split) and many (8, a kv-block each). */
static void test_split_counts(void)
{
    fx_attention a = shape(2, 8, 2, 2, 1000, 64);
    a.q_offset = 998;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1000, 0, 0);
    fxemu_set_sm_count(1);
    check_decode("causal, 3 resident blocks: one split", a, false);
    fxemu_set_sm_count(1000);
    check_decode("causal, 3000 resident blocks: 8 splits", a, false);
    fxemu_set_sm_count(132);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* The K/V pipeline over long splits: more kv-blocks than the kernel stages the views of at
   once (32), the last tile of the keys partly past Lkv, kv-blocks shorter than a tile, blocks
   no row visits between visited ones, splits of uneven length and an empty one. */
static void test_pipeline(void)
{
    fx_attention a = shape(2, 8, 2, 1, 4820, 64); /* 38 kv-blocks of 128, the last of 84 keys */
    a.q_offset = 4819;
    fxemu_set_sm_count(1);
    check_decode("dense, Lkv 4820: one split of 38 kv-blocks", a, true);
    check_decode("dense, Lkv 4820: one split of 38 kv-blocks", a, false);
    fxemu_set_sm_count(5);
    check_decode("dense, Lkv 4820: 7 splits, 6 kv-blocks each but the last (2)", a, true);
    a.Lkv = 4600; /* 36 kv-blocks: 7 splits of 6, the last empty */
    a.q_offset = 4599;
    check_decode("dense, Lkv 4600: 7 splits, the last empty", a, false);
    a = shape(2, 8, 2, 3, 2400, 64);
    a.q_offset = 2397; /* 50 kv-blocks of 48 keys, one in three never visited */
    a.mask = mask_of(sparse_mask, NULL, 8, 2400, 32, 48);
    fxemu_set_sm_count(1);
    check_decode("custom per-head mask, Lkv 2400: one split of 50 kv-blocks", a, true);
    check_decode("custom per-head mask, Lkv 2400: one split of 50 kv-blocks", a, false);
    fxemu_set_sm_count(132);
    fx_block_mask_free((fx_block_mask *)a.mask);
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    gpu_require();
    FXT_RUN(test_fits);
    FXT_RUN(test_dense);
    FXT_RUN(test_masks);
    FXT_RUN(test_custom_mask);
    FXT_RUN(test_score_mods);
    FXT_RUN(test_fallback);
    FXT_RUN(test_nan);
#ifdef FX_CUDA_EMU
    FXT_RUN(test_split_counts);
    FXT_RUN(test_pipeline);
#endif
    return fxt_finish();
}
