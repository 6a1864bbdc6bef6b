/* FlexAttention on a CUDA device against the CPU path of the same call on the same inputs:
   every built-in mask (and a custom one, through its block mask), every built-in score mod,
   GQA, q_offset and split-KV decoding, odd head sizes, rows that see no key, float32 and
   bfloat16 (on tensor cores where the forward takes the shape); each device result is also computed twice and must repeat bitwise. The
   backward's dQ, dK, dV and the rel_bias table gradient are compared the same way.
   Skipped (77) without a GPU; see tests/cuda_gpu.h for the tolerances. */
#include "cuda_attn.h"

/* Runs a on the CPU and on device 1 (float32 or bfloat16) and compares. */
static void check_attention(const char *name, fx_attention a, bool bf16, bool backward)
{
    printf("  %s%s%s\n", name, bf16 ? " (bf16)" : "", backward ? " + backward" : "");
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
    const size_t nqd = nq * (size_t)a.D, nqv = nq * (size_t)a.Dv, nkd = nk * (size_t)a.D, nkv = nk * (size_t)a.Dv;
    float *q = fxt_random(nqd, -1, 1, 11), *k = fxt_random(nkd, -1, 1, 12), *v = fxt_random(nkv, -1, 1, 13);
    float *dout = fxt_random(nqv, -1, 1, 14);
    if (bf16) {
        bf16_round(q, nqd), bf16_round(k, nkd), bf16_round(v, nkv), bf16_round(dout, nqv);
    }
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
    void *dq_ = gpu_upload_as(q, nqd, bf16), *dk_ = gpu_upload_as(k, nkd, bf16), *dv_ = gpu_upload_as(v, nkv, bf16);
    void *dout_dev = gpu_alloc(nqv * (bf16 ? 2 : 4)), *dlse = gpu_alloc(nq * sizeof(float));
    float *out1 = fxt_guarded(nqv), *out2 = fxt_guarded(nqv), *lse1 = fxt_guarded(nq), *lse2 = fxt_guarded(nq);
    FXT_OK(fx_flex_attention(&d, dq_, dk_, dv_, dout_dev, dlse));
    gpu_download_as(out1, dout_dev, nqv, bf16);
    gpu_download(lse1, dlse, nq * sizeof(float));
    FXT_OK(fx_flex_attention(&d, dq_, dk_, dv_, dout_dev, dlse));
    gpu_download_as(out2, dout_dev, nqv, bf16);
    gpu_download(lse2, dlse, nq * sizeof(float));
    gpu_close("out", out1, out_ref, nqv, bf16);
    gpu_close("lse", lse1, lse_ref, nq, bf16);
    gpu_same("out, two runs", out1, out2, nqv);
    gpu_same("lse, two runs", lse1, lse2, nq);

    if (backward) {
        /* Both sides take the same out and lse (the CPU's, rounded like the device's inputs). */
        if (bf16)
            bf16_round(out_ref, nqv);
        const fx_score_rel_bias_ctx *rel = a.score_mod == fx_score_rel_bias ? a.score_ctx : NULL;
        if (rel && rel->grad_table)
            memset(rel->grad_table, 0, dc.ntab * sizeof(float));
        float *dq_ref = fxt_guarded(nqd), *dk_ref = fxt_guarded(nkd), *dv_ref = fxt_guarded(nkv);
        FXT_OK(fx_flex_attention_backward(&a, q, k, v, out_ref, lse_ref, dout, dq_ref, dk_ref, dv_ref));
        void *o_dev = gpu_upload_as(out_ref, nqv, bf16), *l_dev = gpu_upload(lse_ref, nq * sizeof(float));
        void *g_dev = gpu_upload_as(dout, nqv, bf16);
        void *gq = gpu_alloc(nqd * 4), *gk = gpu_alloc(nkd * 4), *gv = gpu_alloc(nkv * 4);
        float *res[2][4];
        for (int run = 0; run < 2; run++) {
            float *tab = NULL;
            if (dc.grad_table)
                cudaMemset(dc.grad_table, 0, dc.ntab * sizeof(float));
            FXT_OK(fx_flex_attention_backward(&d, dq_, dk_, dv_, o_dev, l_dev, g_dev, gq, gk, gv));
            res[run][0] = fxt_guarded(nqd), res[run][1] = fxt_guarded(nkd), res[run][2] = fxt_guarded(nkv);
            gpu_download_as(res[run][0], gq, nqd, bf16);
            gpu_download_as(res[run][1], gk, nkd, bf16);
            gpu_download_as(res[run][2], gv, nkv, bf16);
            if (dc.grad_table) {
                tab = fxt_guarded(dc.ntab);
                gpu_download(tab, dc.grad_table, dc.ntab * sizeof(float));
            }
            res[run][3] = tab;
        }
        gpu_close("dq", res[0][0], dq_ref, nqd, bf16);
        gpu_close("dk", res[0][1], dk_ref, nkd, bf16);
        gpu_close("dv", res[0][2], dv_ref, nkv, bf16);
        gpu_same("dq, two runs", res[0][0], res[1][0], nqd);
        gpu_same("dk, two runs", res[0][1], res[1][1], nkd);
        gpu_same("dv, two runs", res[0][2], res[1][2], nkv);
        if (dc.grad_table) {
            gpu_close("rel_bias grad_table", res[0][3], rel->grad_table, dc.ntab, bf16);
            gpu_same("grad_table, two runs", res[0][3], res[1][3], dc.ntab);
        }
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 4; i++)
                fxt_guarded_free("device result", res[run][i]);
        fxt_guarded_free("dq_ref", dq_ref), fxt_guarded_free("dk_ref", dk_ref), fxt_guarded_free("dv_ref", dv_ref);
        gpu_free(o_dev), gpu_free(l_dev), gpu_free(g_dev), gpu_free(gq), gpu_free(gk), gpu_free(gv);
    }
    fxt_guarded_free("out1", out1), fxt_guarded_free("out2", out2);
    fxt_guarded_free("lse1", lse1), fxt_guarded_free("lse2", lse2);
    fxt_guarded_free("out_ref", out_ref), fxt_guarded_free("lse_ref", lse_ref);
    gpu_free(dq_), gpu_free(dk_), gpu_free(dv_), gpu_free(dout_dev), gpu_free(dlse);
    dev_ctx_free(&dc);
    free(q), free(k), free(v), free(dout);
}

static fx_attention shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D, int64_t Dv)
{
    return (fx_attention){.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = Dv};
}

static fx_block_mask *mask_of(fx_mask_fn fn, const void *ctx, int64_t B, int64_t H, int64_t ql, int64_t kl,
                              int64_t bq, int64_t bk)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fn, ctx, B, H, ql, kl, bq, bk));
    return m;
}

static void test_dense(void)
{
    fx_attention a = shape(2, 4, 2, 77, 77, 64, 64);
    check_attention("dense, GQA 4/2, L 77", a, false, true);
    check_attention("dense, GQA 4/2, L 77", a, true, true);
    check_attention("dense, Lq 50 != Lkv 130", shape(1, 2, 2, 50, 130, 32, 32), false, true);
    fx_attention off = shape(1, 2, 1, 10, 50, 16, 16);
    off.q_offset = 40; /* no mask: rows see every key wherever they are */
    check_attention("dense, q_offset 40", off, false, true);
}

static void test_head_sizes(void)
{
    check_attention("D 5, Dv 7, L 33", shape(1, 3, 3, 33, 33, 5, 7), false, true);
    check_attention("D 128, Dv 64", shape(1, 2, 2, 45, 45, 128, 64), false, true);
    check_attention("D 256, Dv 256", shape(1, 1, 1, 40, 40, 256, 256), false, true);
    check_attention("D 1, Dv 1", shape(1, 1, 1, 9, 9, 1, 1), false, true);
}

static void test_masks(void)
{
    fx_attention a = shape(2, 2, 2, 100, 100, 32, 32);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 100, 100, 32, 32);
    check_attention("causal, blocks 32", a, false, true);
    check_attention("causal, blocks 32", a, true, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 100, 100, 0, 0);
    check_attention("causal, blocks 128", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_mask_sliding_window_ctx w = {.window = 17};
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 100, 100, 16, 16);
    check_attention("sliding window 17, blocks 16", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);

    int64_t prefix[2] = {5, 40};
    fx_mask_prefix_lm_ctx pl = {.prefix_len = prefix, .n = 2};
    a.mask = mask_of(fx_mask_prefix_lm, &pl, 2, 1, 100, 100, 32, 64);
    check_attention("prefix LM, per batch", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);

    int64_t ids[2 * 100];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 100; i++)
            ids[b * 100 + i] = b == 0 ? i / 23 : i / 41;
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 100, .batch_stride = 100};
    a.mask = mask_of(fx_mask_document, &doc, 2, 1, 100, 100, 32, 32);
    check_attention("document", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_mask_pair_ctx pand = {fx_mask_causal, NULL, fx_mask_sliding_window, &w};
    a.mask = mask_of(fx_mask_and, &pand, 1, 1, 100, 100, 32, 32);
    check_attention("causal and sliding", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
    fx_mask_pair_ctx por = {fx_mask_sliding_window, &w, fx_mask_prefix_lm, &pl};
    a.mask = mask_of(fx_mask_or, &por, 2, 1, 100, 100, 32, 32);
    check_attention("sliding or prefix LM", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* A custom mask that differs per head and leaves every fourth query row with no key. */
static bool odd_mask(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)ctx;
    if (q % 4 == 0)
        return false;
    return (q * 7 + kv * 3 + h) % 5 != 0 && kv <= q + h;
}

static void test_custom_mask_gqa_empty_rows(void)
{
    fx_attention a = shape(1, 4, 1, 70, 70, 24, 24);
    a.mask = mask_of(odd_mask, NULL, 1, 4, 70, 70, 16, 32);
    check_attention("custom per-head mask, GQA 4/1, empty rows", a, false, true);
    check_attention("custom per-head mask, GQA 4/1, empty rows", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

static void test_score_mods(void)
{
    fx_attention a = shape(1, 4, 2, 60, 60, 32, 32);
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fx_score_alibi_ctx al = {.slopes = slopes};
    a.score_mod = fx_score_alibi;
    a.score_ctx = &al;
    check_attention("alibi", a, false, true);
    fx_score_softcap_ctx cap = {.cap = 2.0f};
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    check_attention("softcap 2", a, false, true);
    check_attention("softcap 2", a, true, true);
    float *table = fxt_random(4 * 21, -1, 1, 21), gt[4 * 21];
    fx_score_rel_bias_ctx rel = {.table = table, .grad_table = gt, .size = 21, .zero = 10, .heads = 1};
    a.score_mod = fx_score_rel_bias;
    a.score_ctx = &rel;
    check_attention("rel_bias, one table", a, false, true);
    rel.heads = 4;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 60, 60, 16, 16);
    check_attention("rel_bias, a table per head, causal", a, false, true);
    rel.size = 2, rel.zero = 0; /* both ends clamped: the diagonal, and every other distance */
    check_attention("rel_bias, two entries", a, false, true);
    fx_block_mask_free((fx_block_mask *)a.mask);
    free(table);
}

static void test_decode(void)
{
    /* Few rows against many keys: the forward splits the keys (split-KV). */
    fx_attention a = shape(1, 4, 1, 3, 1000, 64, 64);
    a.q_offset = 997;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 1000, 1000, 0, 0);
    check_attention("decode, causal, q_offset 997", a, false, true);
    check_attention("decode, causal, q_offset 997", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
    check_attention("decode, dense, 1 row x 3000 keys", shape(2, 2, 2, 1, 3000, 32, 32), false, true);
    fx_mask_sliding_window_ctx w = {.window = 300};
    fx_attention s = shape(1, 2, 2, 2, 2000, 32, 32);
    s.q_offset = 1998;
    s.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 2000, 2000, 64, 64);
    check_attention("decode, sliding window 300", s, false, false);
    fx_block_mask_free((fx_block_mask *)s.mask);
}

/* A NaN in a query row reaches that row's lse and output; the other rows are unchanged. */
static void test_nan(void)
{
    fx_attention a = shape(1, 1, 1, 20, 20, 8, 8);
    a.device = 1;
    const size_t n = 20 * 8;
    float *q = fxt_random(n, -1, 1, 31), *k = fxt_random(n, -1, 1, 32), *v = fxt_random(n, -1, 1, 33);
    void *dq = gpu_upload(q, n * 4), *dk = gpu_upload(k, n * 4), *dv = gpu_upload(v, n * 4);
    void *dout = gpu_alloc(n * 4), *dlse = gpu_alloc(20 * 4);
    float out0[20 * 8], lse0[20], out1[20 * 8], lse1[20];
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download(out0, dout, n * 4);
    gpu_download(lse0, dlse, 20 * 4);
    q[5 * 8 + 3] = NAN;
    gpu_free(dq);
    dq = gpu_upload(q, n * 4);
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download(out1, dout, n * 4);
    gpu_download(lse1, dlse, 20 * 4);
    FXT_CHECK(isnan(lse1[5]));
    for (int d = 0; d < 8; d++)
        FXT_CHECK(isnan(out1[5 * 8 + d]));
    for (int i = 0; i < 20; i++)
        if (i != 5) {
            FXT_CHECK(memcmp(&lse0[i], &lse1[i], 4) == 0);
            FXT_CHECK(memcmp(&out0[i * 8], &out1[i * 8], 8 * 4) == 0);
        }
    gpu_free(dq), gpu_free(dk), gpu_free(dv), gpu_free(dout), gpu_free(dlse);
    free(q), free(k), free(v);
}

/* bfloat16 calls with D == Dv in {32, 64, 96, 128, 256} run on tensor cores (attn_fwd_tc.cu):
   64- or 128-row blocks of 64-key tiles, so lengths that are not multiples of 64, mask blocks
   smaller than a tile or not a multiple of it and rows that see nothing are the cases to
   cover, with every mask kind and score mod, GQA, q_offset, both 128-row shapes and both the
   plain and the split-KV grids. */
static void test_tensor_cores(void)
{
    fx_attention a = shape(1, 4, 2, 200, 200, 128, 128);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 200, 200, 0, 0);
    check_attention("tc: causal, GQA 4/2, L 200, D 128", a, true, false);
    setenv("FLEXC_CUDA_FWD_WARPS", "8", 1); /* the other 128-row shape: 8 warps of one m-tile */
    check_attention("tc: causal, GQA 4/2, L 200, D 128, 8 warps", a, true, false);
    unsetenv("FLEXC_CUDA_FWD_WARPS");
    fx_block_mask_free((fx_block_mask *)a.mask);
    a = shape(1, 16, 16, 320, 320, 64, 64);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 320, 320, 0, 0);
    check_attention("tc: causal, 16 heads, L 320, D 64", a, true, false);
    setenv("FLEXC_CUDA_FWD_WARPS", "8", 1);
    check_attention("tc: causal, 16 heads, L 320, D 64, 8 warps", a, true, false);
    unsetenv("FLEXC_CUDA_FWD_WARPS");
    fx_block_mask_free((fx_block_mask *)a.mask);
    check_attention("tc: dense, Lq 70 != Lkv 130, D 128", shape(2, 2, 1, 70, 130, 128, 128), true, false);
    check_attention("tc: dense, L 90, D 96", shape(1, 3, 3, 90, 90, 96, 96), true, false);
    check_attention("tc: dense, L 65, D 32", shape(1, 2, 2, 65, 65, 32, 32), true, false);
    a = shape(1, 2, 2, 130, 130, 64, 64);
    a.scale = -0.3f; /* the row max of negated products: full tiles take the masked path */
    check_attention("tc: dense, scale -0.3, D 64", a, true, false);
    a = shape(1, 2, 1, 100, 100, 256, 256);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 100, 100, 0, 0);
    check_attention("tc: causal, GQA 2/1, L 100, D 256", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_mask_sliding_window_ctx w = {.window = 40};
    a = shape(1, 2, 2, 300, 300, 64, 64);
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 300, 300, 64, 64);
    check_attention("tc: sliding window 40, blocks 64, D 64", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 300, 300, 128, 16);
    check_attention("tc: sliding window 40, blocks 128 x 16, D 64", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    /* Blocks that are not multiples of 16 or 64: tiles of 23 keys; 200-key blocks in four
       tiles and four bitmap words a row, 136-row q-blocks in a 128-row and an 8-row piece. */
    a = shape(1, 2, 2, 300, 300, 64, 64);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 300, 300, 17, 23);
    check_attention("tc: causal, blocks 17 x 23, D 64", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 300, 300, 136, 200);
    check_attention("tc: sliding window 40, blocks 136 x 200, D 64", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    int64_t ids[2 * 150];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 150; i++)
            ids[b * 150 + i] = b == 0 ? i / 37 : i / 100;
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 150, .batch_stride = 150};
    a = shape(2, 2, 2, 150, 150, 128, 128);
    a.mask = mask_of(fx_mask_document, &doc, 2, 1, 150, 150, 32, 32);
    check_attention("tc: document, blocks 32, D 128", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    a = shape(1, 4, 1, 70, 70, 64, 64);
    a.mask = mask_of(odd_mask, NULL, 1, 4, 70, 70, 16, 32);
    check_attention("tc: custom per-head mask, blocks 16 x 32, GQA 4/1, empty rows", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);

    /* Rows 130 .. 229 of a causal 230 x 230 mask: the first q-block starts before the call
       (100 rows a head: more than the decoding kernel takes). */
    a = shape(1, 2, 2, 100, 230, 128, 128);
    a.q_offset = 130;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 230, 230, 64, 64);
    check_attention("tc: causal, q_offset 130, D 128", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

static void test_tensor_cores_score_mods(void)
{
    fx_attention a = shape(1, 4, 2, 100, 100, 128, 128);
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fx_score_alibi_ctx al = {.slopes = slopes};
    a.score_mod = fx_score_alibi;
    a.score_ctx = &al;
    check_attention("tc: alibi, D 128", a, true, false);
    fx_score_softcap_ctx cap = {.cap = 2.0f};
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 100, 100, 32, 64);
    check_attention("tc: softcap 2, causal, D 128", a, true, false);
    float *table = fxt_random(4 * 41, -1, 1, 22);
    fx_score_rel_bias_ctx rel = {.table = table, .size = 41, .zero = 20, .heads = 4};
    a.score_mod = fx_score_rel_bias;
    a.score_ctx = &rel;
    check_attention("tc: rel_bias, a table per head, causal, D 128", a, true, false);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a = shape(1, 2, 2, 100, 100, 64, 64);
    rel.heads = 1;
    a.score_mod = fx_score_rel_bias;
    a.score_ctx = &rel;
    check_attention("tc: rel_bias, one table, D 64", a, true, false);
    free(table);
}

/* The forward of bfloat16 a on device 1 (inputs from fixed seeds) into out, lse. */
static void tc_forward(fx_attention a, float *out, float *lse)
{
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
    const size_t nqd = nq * (size_t)a.D, nkd = nk * (size_t)a.D, nkv = nk * (size_t)a.Dv, nqv = nq * (size_t)a.Dv;
    float *q = fxt_random(nqd, -1, 1, 71), *k = fxt_random(nkd, -1, 1, 72), *v = fxt_random(nkv, -1, 1, 73);
    a.device = 1;
    a.dtype = FX_DT_BF16;
    void *dq = gpu_upload_as(q, nqd, true), *dk = gpu_upload_as(k, nkd, true), *dv = gpu_upload_as(v, nkv, true);
    void *dout = gpu_alloc(nqv * 2), *dlse = gpu_alloc(nq * 4);
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download_as(out, dout, nqv, true);
    gpu_download(lse, dlse, nq * 4);
    gpu_free(dq), gpu_free(dk), gpu_free(dv), gpu_free(dout), gpu_free(dlse);
    free(q), free(k), free(v);
}

/* The grid's order (heaviest row blocks first over groups of heads, FLEXC_CUDA_L2_HEADS KV
   heads a group) changes which thread block does what, never a result: groups of 4 KV heads
   out of 2 x 3 (the last group short) and of 1, against the default (one group), bitwise,
   and against the CPU. */
static void test_tensor_cores_order(void)
{
    fx_attention a = shape(2, 6, 3, 200, 200, 64, 64);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 200, 200, 64, 64);
    FXT_OK(fx_block_mask_to_device((fx_block_mask *)a.mask, 1));
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), n = nq * (size_t)a.Dv;
    float *out0 = fxt_guarded(n), *lse0 = fxt_guarded(nq), *out1 = fxt_guarded(n), *lse1 = fxt_guarded(nq);
    tc_forward(a, out0, lse0);
    const char *groups[2] = {"4", "1"};
    for (int i = 0; i < 2; i++) {
        setenv("FLEXC_CUDA_L2_HEADS", groups[i], 1);
        printf("  tc: causal, GQA 6/3, batch 2, %s KV heads a group\n", groups[i]);
        tc_forward(a, out1, lse1);
        gpu_same("out, grouped against default", out0, out1, n);
        gpu_same("lse, grouped against default", lse0, lse1, nq);
        check_attention("tc: causal, GQA 6/3, batch 2, grouped", a, true, false);
        unsetenv("FLEXC_CUDA_L2_HEADS");
    }
    fxt_guarded_free("out0", out0), fxt_guarded_free("lse0", lse0);
    fxt_guarded_free("out1", out1), fxt_guarded_free("lse1", lse1);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* A NaN in one query row of a bfloat16 call on tensor cores: that row's lse and output are
   NaN, every other row keeps its bits. A NaN in V leaves the rows that see no key at zeros. */
static void test_tensor_cores_nan(void)
{
    enum { L = 80, D = 64 };
    fx_attention a = shape(1, 1, 1, L, L, D, D);
    a.device = 1;
    a.dtype = FX_DT_BF16;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, L, L, 0, 0);
    FXT_OK(fx_block_mask_to_device((fx_block_mask *)a.mask, 1));
    const size_t n = L * D;
    float *q = fxt_random(n, -1, 1, 34), *k = fxt_random(n, -1, 1, 35), *v = fxt_random(n, -1, 1, 36);
    void *dq = gpu_upload_as(q, n, true), *dk = gpu_upload_as(k, n, true), *dv = gpu_upload_as(v, n, true);
    void *dout = gpu_alloc(n * 2), *dlse = gpu_alloc(L * 4);
    float out0[L * D], lse0[L], out1[L * D], lse1[L];
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download_as(out0, dout, n, true);
    gpu_download(lse0, dlse, L * 4);
    q[70 * D + 9] = NAN;
    gpu_free(dq);
    dq = gpu_upload_as(q, n, true);
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download_as(out1, dout, n, true);
    gpu_download(lse1, dlse, L * 4);
    FXT_CHECK(isnan(lse1[70]));
    for (int d = 0; d < D; d++)
        FXT_CHECK(isnan(out1[70 * D + d]));
    for (int i = 0; i < L; i++)
        if (i != 70) {
            FXT_CHECK(memcmp(&lse0[i], &lse1[i], 4) == 0);
            FXT_CHECK(memcmp(&out0[i * D], &out1[i * D], D * 4) == 0);
        }
    fx_block_mask_free((fx_block_mask *)a.mask);

    /* A NaN in V under a mask: rows that see no key still get zeros and -inf (one kv-block:
       no split, the tensor-core kernel writes out itself). */
    a.mask = mask_of(odd_mask, NULL, 1, 1, L, L, 16, 128);
    FXT_OK(fx_block_mask_to_device((fx_block_mask *)a.mask, 1));
    q[70 * D + 9] = 0.5f;
    v[3 * D] = v[3 * D + 1] = NAN;
    gpu_free(dq), gpu_free(dv);
    dq = gpu_upload_as(q, n, true), dv = gpu_upload_as(v, n, true);
    FXT_OK(fx_flex_attention(&a, dq, dk, dv, dout, dlse));
    gpu_download_as(out1, dout, n, true);
    gpu_download(lse1, dlse, L * 4);
    for (int i = 0; i < L; i += 4) {
        FXT_CHECK(lse1[i] == -INFINITY);
        for (int d = 0; d < D; d++)
            FXT_CHECK(out1[i * D + d] == 0.0f);
    }
    fx_block_mask_free((fx_block_mask *)a.mask);
    gpu_free(dq), gpu_free(dk), gpu_free(dv), gpu_free(dout), gpu_free(dlse);
    free(q), free(k), free(v);
}

/* Clear errors for what a device call cannot take. */
static void test_errors(void)
{
    fx_attention a = shape(1, 1, 1, 16, 16, 8, 8);
    a.device = 1;
    const size_t n = 16 * 8;
    float *hq = fxt_random(n, -1, 1, 41), hout[16 * 8];
    void *q = gpu_upload(hq, n * 4), *k = gpu_upload(hq, n * 4), *v = gpu_upload(hq, n * 4), *out = gpu_alloc(n * 4);
    FXT_STATUS(fx_flex_attention(&a, hq, k, v, out, NULL), FX_EINVAL, "q = ");
    FXT_STATUS(fx_flex_attention(&a, q, k, v, hout, NULL), FX_EINVAL, "host memory");
    fx_attention far = a;
    far.device = fx_cuda_device_count() + 1;
    FXT_STATUS(fx_flex_attention(&far, q, k, v, out, NULL), FX_EINVAL, "visible");
    fx_block_mask *m = mask_of(fx_mask_causal, NULL, 1, 1, 16, 16, 0, 0);
    a.mask = m;
    FXT_STATUS(fx_flex_attention(&a, q, k, v, out, NULL), FX_EINVAL, "fx_block_mask_to_device");
    FXT_OK(fx_block_mask_to_device(m, 1));
    FXT_OK(fx_flex_attention(&a, q, k, v, out, NULL));
    float slopes[1] = {0.5f};
    fx_score_alibi_ctx al = {.slopes = slopes}; /* host slopes: refused */
    a.score_mod = fx_score_alibi;
    a.score_ctx = &al;
    FXT_STATUS(fx_flex_attention(&a, q, k, v, out, NULL), FX_EINVAL, "slopes");
    fx_block_mask_free(m);
    gpu_free(q), gpu_free(k), gpu_free(v), gpu_free(out);
    free(hq);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    gpu_require();
    FXT_RUN(test_errors);
    FXT_RUN(test_dense);
    FXT_RUN(test_head_sizes);
    FXT_RUN(test_masks);
    FXT_RUN(test_custom_mask_gqa_empty_rows);
    FXT_RUN(test_score_mods);
    FXT_RUN(test_decode);
    FXT_RUN(test_nan);
    FXT_RUN(test_tensor_cores);
    FXT_RUN(test_tensor_cores_score_mods);
    FXT_RUN(test_tensor_cores_order);
    FXT_RUN(test_tensor_cores_nan);
    return fxt_finish();
}
