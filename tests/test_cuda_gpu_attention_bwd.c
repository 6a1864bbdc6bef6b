/* The bfloat16 FlexAttention backward on a CUDA device for the head sizes the tensor-core
   kernels take (D = Dv = 32, 64, 96, 128; src/cuda/attn_bwd_tc.cu) against the CPU path of the same
   call on the same inputs: causal, sliding-window, document and custom masks with small
   blocks and rows that see no key, every built-in score mod with the rel_bias table's
   gradient, GQA with and without the head-split partials, q_offset and odd lengths. Each
   device call runs twice and must repeat bitwise; the device outputs are followed by guard
   words that must survive. Skipped (77) without a GPU; see tests/cuda_gpu.h for the
   tolerances. */
#include "cuda_attn.h"

#include "cuda/cuda.h"

int fx__cu_attn_backward_tc_ok(const fx__cu_attn *a);

enum { GUARD_BYTES = 256 };

/* A device buffer of `bytes` followed by GUARD_BYTES of 0xa5. */
static void *gpu_alloc_guarded(size_t bytes)
{
    unsigned char g[GUARD_BYTES];
    memset(g, 0xa5, sizeof g);
    unsigned char *p = gpu_alloc(bytes + GUARD_BYTES);
    cudaMemcpy(p + bytes, g, sizeof g, cudaMemcpyHostToDevice);
    return p;
}

static void gpu_guard_check(const char *what, const void *p, size_t bytes)
{
    unsigned char g[GUARD_BYTES];
    gpu_download(g, (const unsigned char *)p + bytes, sizeof g);
    for (size_t i = 0; i < sizeof g; i++)
        if (g[i] != 0xa5) {
            FXT_FAIL("%s: guard byte %zu past the end overwritten (0x%02x)", what, i, g[i]);
            return;
        }
}

/* The backward of a in bfloat16 on device 1 against the CPU path, from the CPU's forward;
   nan_at >= 0: q[nan_at] is NaN (NaN and infinities must then match the CPU's exactly). */
static void check_backward_nan(const char *name, fx_attention a, int64_t nan_at)
{
    printf("  %s (bf16 backward)\n", name);
    const size_t nq = (size_t)(a.B * a.Hq * a.Lq), nk = (size_t)(a.B * a.Hkv * a.Lkv);
    const size_t nqd = nq * (size_t)a.D, nqv = nq * (size_t)a.Dv, nkd = nk * (size_t)a.D, nkv = nk * (size_t)a.Dv;
    float *q = fxt_random(nqd, -1, 1, 51), *k = fxt_random(nkd, -1, 1, 52), *v = fxt_random(nkv, -1, 1, 53);
    float *dout = fxt_random(nqv, -1, 1, 54);
    bf16_round(q, nqd), bf16_round(k, nkd), bf16_round(v, nkv), bf16_round(dout, nqv);
    if (nan_at >= 0)
        q[nan_at] = NAN;
    float *out = fxt_guarded(nqv), *lse = fxt_guarded(nq);
    FXT_OK(fx_flex_attention(&a, q, k, v, out, lse));
    bf16_round(out, nqv); /* both sides take the device's rounded forward output */

    const fx_score_rel_bias_ctx *rel = a.score_mod == fx_score_rel_bias ? a.score_ctx : NULL;
    if (rel && rel->grad_table)
        memset(rel->grad_table, 0, (size_t)(rel->heads * rel->size) * sizeof(float));
    float *dq_ref = fxt_guarded(nqd), *dk_ref = fxt_guarded(nkd), *dv_ref = fxt_guarded(nkv);
    FXT_OK(fx_flex_attention_backward(&a, q, k, v, out, lse, dout, dq_ref, dk_ref, dv_ref));

    fx_attention d = a;
    d.device = 1;
    d.dtype = FX_DT_BF16;
    if (a.mask)
        FXT_OK(fx_block_mask_to_device((fx_block_mask *)a.mask, 1));
    dev_ctx dc;
    dev_ctx_make(&dc, &a);
    d.score_ctx = dc.ctx;
    void *q_ = gpu_upload_as(q, nqd, true), *k_ = gpu_upload_as(k, nkd, true), *v_ = gpu_upload_as(v, nkv, true);
    void *o_ = gpu_upload_as(out, nqv, true), *l_ = gpu_upload(lse, nq * sizeof(float));
    void *g_ = gpu_upload_as(dout, nqv, true);
    void *gq = gpu_alloc_guarded(nqd * 2), *gk = gpu_alloc_guarded(nkd * 2), *gv = gpu_alloc_guarded(nkv * 2);
    float *res[2][4];
    for (int run = 0; run < 2; run++) {
        if (dc.grad_table)
            cudaMemset(dc.grad_table, 0, dc.ntab * sizeof(float));
        FXT_OK(fx_flex_attention_backward(&d, q_, k_, v_, o_, l_, g_, gq, gk, gv));
        res[run][0] = fxt_guarded(nqd), res[run][1] = fxt_guarded(nkd), res[run][2] = fxt_guarded(nkv);
        gpu_download_as(res[run][0], gq, nqd, true);
        gpu_download_as(res[run][1], gk, nkd, true);
        gpu_download_as(res[run][2], gv, nkv, true);
        res[run][3] = NULL;
        if (dc.grad_table) {
            res[run][3] = fxt_guarded(dc.ntab);
            gpu_download(res[run][3], dc.grad_table, dc.ntab * sizeof(float));
        }
    }
    gpu_close("dq", res[0][0], dq_ref, nqd, true);
    gpu_close("dk", res[0][1], dk_ref, nkd, true);
    gpu_close("dv", res[0][2], dv_ref, nkv, true);
    gpu_same("dq, two runs", res[0][0], res[1][0], nqd);
    gpu_same("dk, two runs", res[0][1], res[1][1], nkd);
    gpu_same("dv, two runs", res[0][2], res[1][2], nkv);
    if (dc.grad_table) {
        gpu_close("rel_bias grad_table", res[0][3], rel->grad_table, dc.ntab, true);
        gpu_same("grad_table, two runs", res[0][3], res[1][3], dc.ntab);
    }
    gpu_guard_check("dq", gq, nqd * 2), gpu_guard_check("dk", gk, nkd * 2), gpu_guard_check("dv", gv, nkv * 2);
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 4; i++)
            fxt_guarded_free("device result", res[run][i]);
    fxt_guarded_free("dq_ref", dq_ref), fxt_guarded_free("dk_ref", dk_ref), fxt_guarded_free("dv_ref", dv_ref);
    fxt_guarded_free("out", out), fxt_guarded_free("lse", lse);
    gpu_free(q_), gpu_free(k_), gpu_free(v_), gpu_free(o_), gpu_free(l_), gpu_free(g_);
    gpu_free(gq), gpu_free(gk), gpu_free(gv);
    dev_ctx_free(&dc);
    free(q), free(k), free(v), free(dout);
}

static void check_backward(const char *name, fx_attention a) { check_backward_nan(name, a, -1); }

static fx_attention shape(int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv, int64_t D)
{
    return (fx_attention){.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = D};
}

static fx_block_mask *mask_of(fx_mask_fn fn, const void *ctx, int64_t B, int64_t H, int64_t ql, int64_t kl,
                              int64_t bq, int64_t bk)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, fn, ctx, B, H, ql, kl, bq, bk));
    return m;
}

/* Which calls the tensor-core kernels take: bf16, D = Dv = 32, 64, 96 or 128, 16-byte aligned. */
static void test_route(void)
{
    static _Alignas(16) char buf[64];
    fx__cu_attn c = {.bf16 = 1, .D = 64, .Dv = 64, .q = buf, .k = buf, .v = buf, .dout = buf, .dq = buf, .dk = buf,
                     .dv = buf};
    FXT_CHECK(fx__cu_attn_backward_tc_ok(&c));
    c.D = c.Dv = 128;
    FXT_CHECK(fx__cu_attn_backward_tc_ok(&c));
    c.Dv = 64;
    FXT_CHECK(!fx__cu_attn_backward_tc_ok(&c));
    c.D = c.Dv = 96;
    FXT_CHECK(fx__cu_attn_backward_tc_ok(&c));
    c.D = c.Dv = 80;
    FXT_CHECK(!fx__cu_attn_backward_tc_ok(&c));
    c.D = c.Dv = 256;
    FXT_CHECK(!fx__cu_attn_backward_tc_ok(&c));
    c.D = c.Dv = 64;
    c.bf16 = 0;
    FXT_CHECK(!fx__cu_attn_backward_tc_ok(&c));
    c.bf16 = 1;
    c.dk = buf + 2;
    FXT_CHECK(!fx__cu_attn_backward_tc_ok(&c));
}

static void test_dense(void)
{
    check_backward("dense, D 64, L 77", shape(1, 2, 2, 77, 77, 64));
    check_backward("dense, D 128, Lq 50, Lkv 130, batch 2", shape(2, 1, 1, 50, 130, 128));
    fx_attention off = shape(1, 2, 1, 10, 70, 64);
    off.q_offset = 60; /* no mask: rows see every key wherever they are */
    check_backward("dense, q_offset 60, GQA 2/1", off);
    check_backward("dense, D 32, L 90", shape(1, 2, 2, 90, 90, 32));
    check_backward("dense, D 96, L 70", shape(1, 2, 2, 70, 70, 96));
    /* Every key sees the row: dq of that row, every dk and dv NaN, the other rows' dq not. */
    check_backward_nan("dense, NaN in one query row", shape(1, 1, 1, 40, 40, 64), 5 * 64 + 3);
}

static void test_masks(void)
{
    fx_attention a = shape(1, 2, 2, 150, 150, 128);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 150, 150, 0, 0);
    check_backward("causal, blocks 128, D 128, L 150", a);
    setenv("FLEXC_CUDA_BWD_WARPS", "8", 1); /* the 128-row thread blocks on the same blocks */
    check_backward("causal, blocks 128, D 128, L 150, 8 warps", a);
    unsetenv("FLEXC_CUDA_BWD_WARPS");
    fx_block_mask_free((fx_block_mask *)a.mask);

    a = shape(2, 1, 1, 100, 100, 64);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 100, 100, 32, 32);
    check_backward("causal, blocks 32, batch 2", a);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_mask_sliding_window_ctx w = {.window = 17};
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 100, 100, 16, 16);
    check_backward("sliding window 17, blocks 16", a);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 100, 100, 96, 80);
    check_backward("sliding window 17, blocks 96 x 80", a);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.mask = mask_of(fx_mask_sliding_window, &w, 1, 1, 100, 100, 17, 23);
    check_backward("sliding window 17, blocks 17 x 23", a);
    fx_block_mask_free((fx_block_mask *)a.mask);

    fx_attention big = shape(1, 1, 1, 260, 260, 64);
    big.mask = mask_of(fx_mask_causal, NULL, 1, 1, 260, 260, 136, 200); /* 4 bitmap words a row */
    check_backward("causal, blocks 136 x 200, L 260", big);
    fx_block_mask_free((fx_block_mask *)big.mask);
    big.mask = mask_of(fx_mask_causal, NULL, 1, 1, 260, 260, 256, 256); /* 128-key tiles, 2 per block */
    check_backward("causal, blocks 256, L 260", big);
    fx_block_mask_free((fx_block_mask *)big.mask);

    int64_t ids[2 * 100];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 100; i++)
            ids[b * 100 + i] = b == 0 ? i / 23 : i / 41;
    fx_mask_document_ctx doc = {.doc_ids = ids, .len = 100, .batch_stride = 100};
    a.mask = mask_of(fx_mask_document, &doc, 2, 1, 100, 100, 32, 64);
    check_backward("document, per batch", a);
    fx_block_mask_free((fx_block_mask *)a.mask);

    /* Rows 60.. of a longer causal mask: the q-blocks' bitmaps from their middle. */
    fx_attention off = shape(1, 2, 2, 41, 101, 64);
    off.q_offset = 60;
    off.mask = mask_of(fx_mask_causal, NULL, 1, 1, 101, 101, 32, 32);
    check_backward("causal, q_offset 60, Lq 41, Lkv 101", off);
    fx_block_mask_free((fx_block_mask *)off.mask);
}

/* A custom mask that differs per head and leaves every fourth query row with no key. */
static bool odd_mask(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)ctx;
    if (q % 4 == 0)
        return false;
    return (q * 7 + kv * 3 + h) % 5 != 0 && kv <= q + h;
}

static void test_custom_mask_gqa(void)
{
    fx_attention a = shape(1, 4, 1, 70, 70, 64);
    a.mask = mask_of(odd_mask, NULL, 1, 4, 70, 70, 16, 32);
    check_backward("custom per-head mask, GQA 4/1, empty rows, blocks 16 x 32", a);
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* GQA 4/1: with the emulation's 132 multiprocessors the few key tiles are split by head
   range (float32 partials, then the sum); with 1 the thread blocks walk the whole group. */
static void test_gqa(void)
{
    fx_attention a = shape(1, 8, 2, 67, 67, 128);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 67, 67, 0, 0);
    check_backward("GQA 8/2, causal, D 128", a);
#ifdef FX_CUDA_EMU
    fxemu_set_sm_count(1);
    check_backward("GQA 8/2, causal, D 128, one thread block per key tile", a);
    fxemu_set_sm_count(132);
#endif
    fx_block_mask_free((fx_block_mask *)a.mask);
}

/* The grids' order (heaviest tiles first over groups of heads, FLEXC_CUDA_L2_HEADS KV heads
   a group) changes which thread block does what, never a result: groups of 4 KV heads out of
   2 x 3 (the last one short) and of 1. */
static void test_order(void)
{
    fx_attention a = shape(2, 6, 3, 150, 150, 64);
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 150, 150, 64, 64);
    check_backward("causal, GQA 6/3, batch 2", a);
    setenv("FLEXC_CUDA_L2_HEADS", "4", 1);
    check_backward("causal, GQA 6/3, batch 2, 4 KV heads a group", a);
    setenv("FLEXC_CUDA_L2_HEADS", "1", 1);
    check_backward("causal, GQA 6/3, batch 2, 1 KV head a group", a);
    unsetenv("FLEXC_CUDA_L2_HEADS");
    fx_block_mask_free((fx_block_mask *)a.mask);
}

static void test_score_mods(void)
{
    fx_attention a = shape(1, 4, 2, 60, 60, 64);
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fx_score_alibi_ctx al = {.slopes = slopes};
    a.score_mod = fx_score_alibi;
    a.score_ctx = &al;
    check_backward("alibi, GQA 4/2", a);
    fx_score_softcap_ctx cap = {.cap = 2.0f};
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    check_backward("softcap 2, GQA 4/2", a);
    float *table = fxt_random(4 * 21, -1, 1, 61), gt[4 * 21];
    fx_score_rel_bias_ctx rel = {.table = table, .grad_table = gt, .size = 21, .zero = 10, .heads = 1};
    a.score_mod = fx_score_rel_bias;
    a.score_ctx = &rel;
    check_backward("rel_bias, one table", a);
    rel.heads = 4;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 60, 60, 16, 16);
    check_backward("rel_bias, a table per head, causal blocks 16", a);
    fx_block_mask_free((fx_block_mask *)a.mask);
    a.D = a.Dv = 128;
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    a.mask = mask_of(fx_mask_causal, NULL, 1, 1, 60, 60, 32, 32);
    check_backward("softcap 2, causal, D 128", a);
    fx_block_mask_free((fx_block_mask *)a.mask);
    free(table);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    FXT_RUN(test_route);
    gpu_require();
    FXT_RUN(test_dense);
    FXT_RUN(test_masks);
    FXT_RUN(test_custom_mask_gqa);
    FXT_RUN(test_gqa);
    FXT_RUN(test_order);
    FXT_RUN(test_score_mods);
    return fxt_finish();
}
