/* The device fields of fx_attention and fx_lce, checked without a GPU: argument errors, the
   refusals of what cannot run on a device, the clear "no CUDA" answers of a machine (or a
   build) without one, outputs untouched on failure, and the host-side plan of the CUDA
   path. On a machine with a GPU the same calls with host pointers are refused as such.
   The device kernels themselves are tested by test_cuda_gpu_*.c (label gpu). */
#include "harness.h"

#include "cuda/cuda.h"

static bool have_gpu(void) { return fx_cuda_device_count() > 0; }

/* What a device call with otherwise valid (host) arguments answers here. */
static void expect_no_device(int rc, const char *what)
{
    if (have_gpu()) {
        if (rc != FX_EINVAL || !strstr(fx_last_error(), "host memory"))
            FXT_FAIL("%s: with a GPU, host pointers must give FX_EINVAL \"host memory\"; got %s: %s", what,
                     fx_status_name(rc), fx_last_error());
        return;
    }
#ifdef FLEXC_HAVE_CUDA
    const char *msg = "no CUDA device";
#else
    const char *msg = "no CUDA backend";
#endif
    if (rc != FX_EUNSUPPORTED || !strstr(fx_last_error(), msg))
        FXT_FAIL("%s: expected FX_EUNSUPPORTED \"%s\", got %s: %s", what, msg, fx_status_name(rc), fx_last_error());
}

static void test_status_code(void)
{
    FXT_EQ_STR(fx_status_name(FX_EDEVICE), "FX_EDEVICE");
    FXT_EQ_STR(fx_strerror(FX_EDEVICE), "CUDA device error");
    FXT_CHECK(fx_cuda_device_count() >= 0);
#ifndef FLEXC_HAVE_CUDA
    FXT_EQ_INT(fx_cuda_device_count(), 0);
#endif
    printf("  CUDA devices visible: %d\n", fx_cuda_device_count());
}

enum { B = 1, H = 2, L = 40, D = 16 };

typedef struct attn_bufs {
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
} attn_bufs;

static attn_bufs attn_alloc(void)
{
    const size_t n = (size_t)B * H * L * D;
    attn_bufs b = {fxt_random(n, -1, 1, 1), fxt_random(n, -1, 1, 2), fxt_random(n, -1, 1, 3), fxt_guarded(n),
                   fxt_guarded((size_t)B * H * L), fxt_random(n, -1, 1, 4), fxt_guarded(n), fxt_guarded(n),
                   fxt_guarded(n)};
    return b;
}

static void attn_free(attn_bufs *b)
{
    free(b->q), free(b->k), free(b->v), free(b->dout);
    fxt_guarded_free("out", b->out);
    fxt_guarded_free("lse", b->lse);
    fxt_guarded_free("dq", b->dq);
    fxt_guarded_free("dk", b->dk);
    fxt_guarded_free("dv", b->dv);
}

/* Every output still holds the guard pattern: a failed call wrote nothing. */
static void untouched(const char *what, const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &p[i], sizeof u);
        if (u != FXT_GUARD_BITS) {
            FXT_FAIL("%s: written at [%zu] by a call that failed", what, i);
            return;
        }
    }
}

static int fwd(const fx_attention *a, attn_bufs *b) { return fx_flex_attention(a, b->q, b->k, b->v, b->out, b->lse); }
static int bwd(const fx_attention *a, attn_bufs *b)
{
    return fx_flex_attention_backward(a, b->q, b->k, b->v, b->out, b->lse, b->dout, b->dq, b->dk, b->dv);
}

static bool custom_mask(int64_t b, int64_t h, int64_t q, int64_t kv, const void *ctx)
{
    (void)b, (void)h, (void)ctx;
    return (q + kv) % 3 != 0;
}

static void custom_mod(float *s, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h, int64_t q0, int64_t kv0,
                       const void *ctx)
{
    (void)s, (void)ld, (void)nq, (void)nkv, (void)b, (void)h, (void)q0, (void)kv0, (void)ctx;
}

static void custom_grad(const float *s, float *g, int64_t ld, int64_t nq, int64_t nkv, int64_t b, int64_t h,
                        int64_t q0, int64_t kv0, const void *ctx)
{
    (void)s, (void)g, (void)ld, (void)nq, (void)nkv, (void)b, (void)h, (void)q0, (void)kv0, (void)ctx;
}

static void test_attention_fields(void)
{
    attn_bufs b = attn_alloc();
    const size_t n = (size_t)B * H * L * D;
    fx_attention a = {.B = B, .Hq = H, .Hkv = H, .Lq = L, .Lkv = L, .D = D, .Dv = D};

    a.dtype = 3; /* FX_DT_I16: not a compute type */
    FXT_STATUS(fwd(&a, &b), FX_EINVAL, "dtype = 3");
    FXT_STATUS(bwd(&a, &b), FX_EINVAL, "dtype = 3");
    a.dtype = FX_DT_BF16;
    FXT_STATUS(fwd(&a, &b), FX_EUNSUPPORTED, "CUDA devices only");
    FXT_STATUS(bwd(&a, &b), FX_EUNSUPPORTED, "CUDA devices only");
    a.dtype = 0;
    a.device = -1;
    FXT_STATUS(fwd(&a, &b), FX_EINVAL, "device = -1");
    FXT_STATUS(bwd(&a, &b), FX_EINVAL, "device = -1");

    /* What cannot run on a device is refused before the device is looked at. */
    a.device = 1;
    a.score_mod = custom_mod;
    a.score_mod_grad = custom_grad;
    FXT_STATUS(fwd(&a, &b), FX_EUNSUPPORTED, "custom C function");
    FXT_STATUS(bwd(&a, &b), FX_EUNSUPPORTED, "custom C function");
    fx_score_softcap_ctx cap = {.cap = 5.0f};
    a.score_mod = fx_score_softcap;
    a.score_ctx = &cap;
    FXT_STATUS(bwd(&a, &b), FX_EUNSUPPORTED, "score_mod_grad");
    a.score_mod_grad = fx_score_softcap_grad; /* the built-in's own: accepted */
    expect_no_device(bwd(&a, &b), "softcap backward");
    a.score_mod = NULL, a.score_mod_grad = NULL, a.score_ctx = NULL;
    fx_attention big = a;
    big.D = big.Dv = 257;
    big.Lq = big.Lkv = 1;
    FXT_STATUS(fx_flex_attention(&big, b.q, b.k, b.v, b.out, b.lse), FX_EUNSUPPORTED, "head sizes up to 256");
    /* Argument errors stay FX_EINVAL on the device path. */
    fx_attention bad = a;
    bad.Hkv = 3;
    FXT_STATUS(fwd(&bad, &b), FX_EINVAL, "Hq = 2 is not a multiple of Hkv = 3");
    FXT_STATUS(fx_flex_attention(&a, b.q, b.k, b.v, NULL, NULL), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_flex_attention_backward(&a, b.q, b.k, b.v, b.out, NULL, b.dout, b.dq, b.dk, b.dv), FX_EINVAL,
               "lse is NULL");
    FXT_STATUS(fx_flex_attention(&a, b.q, b.k, b.v, b.q, NULL), FX_EINVAL, "overlaps");

    expect_no_device(fwd(&a, &b), "forward");
    expect_no_device(bwd(&a, &b), "backward");
    a.dtype = FX_DT_BF16;
    expect_no_device(fwd(&a, &b), "bf16 forward");
    untouched("out", b.out, n);
    untouched("lse", b.lse, (size_t)B * H * L);
    untouched("dq", b.dq, n);
    untouched("dk", b.dk, n);
    untouched("dv", b.dv, n);

    /* dtype FX_DT_F32 on the CPU is the float32 path itself, bitwise. */
    a.device = 0;
    a.dtype = 0;
    FXT_OK(fwd(&a, &b));
    float *out0 = fxt_guarded_copy(b.out, n);
    a.dtype = FX_DT_F32;
    FXT_OK(fwd(&a, &b));
    fxt_bitwise_f32("out with dtype FX_DT_F32", b.out, out0, n);
    fxt_guarded_free("out0", out0);
    attn_free(&b);
}

static void test_block_mask_to_device(void)
{
    fx_block_mask *m = NULL;
    FXT_OK(fx_block_mask_create(&m, custom_mask, NULL, 1, 1, L, L, 16, 16));
    FXT_STATUS(fx_block_mask_to_device(NULL, 1), FX_EINVAL, "m is NULL");
    FXT_STATUS(fx_block_mask_to_device(m, 0), FX_EINVAL, "device = 0");
    int rc = fx_block_mask_to_device(m, 1);
    if (have_gpu()) {
        FXT_OK(rc);
        FXT_OK(fx_block_mask_to_device(m, 1)); /* a second copy replaces the first */
    } else {
        FXT_CHECK(rc == FX_EUNSUPPORTED);
        FXT_HAS_STR(fx_last_error(), "fx_block_mask_to_device");
        /* The CPU path still uses the mask as before. */
        attn_bufs b = attn_alloc();
        fx_attention a = {.B = B, .Hq = H, .Hkv = H, .Lq = L, .Lkv = L, .D = D, .Dv = D, .mask = m};
        FXT_OK(fwd(&a, &b));
        /* A device call with a mask that has no device copy. */
        a.device = 1;
        expect_no_device(fwd(&a, &b), "masked forward");
        attn_free(&b);
    }
    fx_block_mask_free(m); /* releases the device copy too (ASan / LSan see the host side) */
}

static void test_lce_fields(void)
{
    enum { N = 6, DD = 8, V = 11 };
    float *h = fxt_random(N * DD, -1, 1, 5), *w = fxt_random(V * DD, -1, 1, 6);
    int64_t target[N] = {0, 3, -100, 10, 5, 1};
    float loss = 0.0f, lse[N], g = 1.0f;
    float *dh = fxt_guarded(N * DD);
    fx_lce p = fx_lce_defaults(N, DD, V);
    p.dtype = 100;
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL), FX_EINVAL, "dtype = 100");
    p.dtype = FX_DT_BF16;
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL), FX_EUNSUPPORTED,
               "CUDA devices only");
    FXT_STATUS(fx_linear_cross_entropy_backward(&p, h, w, NULL, target, lse, &g, dh, NULL, NULL), FX_EUNSUPPORTED,
               "CUDA devices only");
    p.dtype = 0;
    p.device = -2;
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL), FX_EINVAL, "device = -2");
    p.device = 1;
    p.label_smoothing = 2.0f; /* the CPU path's own checks come first */
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL), FX_EINVAL,
               "label_smoothing");
    p.label_smoothing = 0.0f;
    FXT_STATUS(fx_linear_cross_entropy_backward(&p, h, w, NULL, target, NULL, &g, dh, NULL, NULL), FX_EINVAL,
               "lse is NULL");
    expect_no_device(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL), "lce forward");
    expect_no_device(fx_linear_cross_entropy_backward(&p, h, w, NULL, target, lse, &g, dh, NULL, NULL),
                     "lce backward");
    untouched("dh", dh, N * DD);
    /* FX_DT_F32 on the CPU: the float32 path. */
    p.device = 0;
    p.dtype = FX_DT_F32;
    FXT_OK(fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, lse, dh, NULL, NULL));
    FXT_CHECK(isfinite(loss));
    free(h), free(w);
    fxt_guarded_free("dh", dh);
}

/* The host-side plan of the device path. */
static void test_plan(void)
{
    fx__cu_attn c = {.B = 1, .Hq = 8, .Lq = 4, .bq = 128, .n_qb = 1, .max_entries = 100};
    FXT_EQ_INT(fx__cu_attn_row_blocks(&c), 8 * 8); /* 8 heads x 8 row chunks of 16 */
    FXT_EQ_INT(fx__cu_attn_busy_blocks(&c), 8);     /* 4 rows: one chunk a head holds them */
    FXT_EQ_INT(fx__cu_attn_splits(&c, 132), 32);     /* ceil(264 / 8), at most 32 */
    FXT_EQ_INT(fx__cu_attn_splits(&c, 32), 8);       /* ceil(64 / 8) */
    c.Lq = 128;                                     /* every chunk busy */
    FXT_EQ_INT(fx__cu_attn_busy_blocks(&c), 64);
    FXT_EQ_INT(fx__cu_attn_splits(&c, 132), 5);      /* ceil(264 / 64) */
    FXT_EQ_INT(fx__cu_attn_splits(&c, 32), 1);       /* 64 row blocks fill 2 x 32 */
    c.Lq = 300, c.q_offset = 100, c.has_mask = 1, c.qb_lo = 0, c.n_qb = 4; /* rows 100 .. 399 */
    FXT_EQ_INT(fx__cu_attn_busy_blocks(&c), 8 * (2 + 8 + 8 + 1)); /* rows 100-127, two full, 384-399 */
    c.Lq = 1, c.q_offset = 200, c.qb_lo = 1, c.n_qb = 1; /* one row in the second q-block */
    FXT_EQ_INT(fx__cu_attn_busy_blocks(&c), 8);
    c.Lq = 4, c.q_offset = 0, c.has_mask = 0, c.qb_lo = 0;
    c.bq = 16;                                      /* 8 row blocks: as many splits as allowed */
    FXT_EQ_INT(fx__cu_attn_splits(&c, 132), 32);
    c.max_entries = 3;                              /* never more splits than kv-blocks */
    FXT_EQ_INT(fx__cu_attn_splits(&c, 132), 3);
    c.max_entries = 1;
    FXT_EQ_INT(fx__cu_attn_splits(&c, 132), 1);
    FXT_EQ_INT(fx__cu_lce_chunk(1000, 50000, 0), 671);          /* the 128 MiB floor / (50000 * 4) */
    FXT_EQ_INT(fx__cu_lce_chunk(16384, 128256, 0), 893);        /* (N V / 4 - 64 MiB) / (V * 4) */
    FXT_EQ_INT(fx__cu_lce_chunk(100000, 256000, 0), 1048);      /* the 1 GiB ceiling / (256000 * 4) */
    FXT_EQ_INT(fx__cu_lce_chunk(100, 50000, 0), 100);           /* at most N */
    FXT_EQ_INT(fx__cu_lce_chunk(10, (int64_t)1 << 40, 0), 1); /* at least one row */
    FXT_EQ_INT(fx__cu_lce_chunk(100, 50, 7), 7);
    FXT_EQ_INT(fx__cu_lce_chunk(5, 50, 7), 5);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    FXT_RUN(test_status_code);
    FXT_RUN(test_attention_fields);
    FXT_RUN(test_block_mask_to_device);
    FXT_RUN(test_lce_fields);
    FXT_RUN(test_plan);
    return fxt_finish();
}
