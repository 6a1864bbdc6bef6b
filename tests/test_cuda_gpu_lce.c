/* The fused linear + cross-entropy on a CUDA device against the CPU path of the same call on
   the same inputs: every reduction, ignore_index, label smoothing, z-loss, softcap, bias,
   several chunks, all tokens ignored, the backward with a general upstream gradient, float32
   and bfloat16; each device result is computed twice and must repeat bitwise. dw and dbias
   start from non-zero values (they are accumulated). Skipped (77) without a GPU. */
#include "cuda_gpu.h"

typedef struct lce_case {
    const char *name;
    fx_lce p;
    bool bias, all_ignored;
} lce_case;

static void check_lce(const lce_case *c, bool bf16)
{
    const fx_lce p = c->p;
    printf("  %s%s\n", c->name, bf16 ? " (bf16)" : "");
    const size_t N = (size_t)p.N, D = (size_t)p.D, V = (size_t)p.V;
    const size_t nl = p.reduction == FX_REDUCTION_NONE ? N : 1;
    float *h = fxt_random(N * D, -1, 1, 51), *w = fxt_random(V * D, -0.5f, 0.5f, 52);
    float *bias = c->bias ? fxt_random(V, -1, 1, 53) : NULL;
    float *dw0 = fxt_random(V * D, -1, 1, 54), *db0 = fxt_random(V, -1, 1, 55);
    float *gl = fxt_random(nl, 0.5f, 1.5f, 56);
    if (bf16) {
        bf16_round(h, N * D), bf16_round(w, V * D), bf16_round(dw0, V * D), bf16_round(db0, V);
        if (bias)
            bf16_round(bias, V);
    }
    int64_t *target = malloc(N * sizeof(int64_t));
    for (size_t i = 0; i < N; i++)
        target[i] = c->all_ignored || i % 7 == 3 ? p.ignore_index : (int64_t)((i * 37 + 11) % V);

    /* CPU: forward with gradients, then the backward with grad_loss. */
    float *loss_ref = fxt_guarded(nl), *lse_ref = fxt_guarded(N), *dh_ref = fxt_guarded(N * D);
    float *dw_ref = fxt_guarded_copy(dw0, V * D), *db_ref = fxt_guarded_copy(db0, V);
    FXT_OK(fx_linear_cross_entropy(&p, h, w, bias, target, loss_ref, lse_ref, dh_ref, dw_ref, db_ref));
    float *bdh_ref = fxt_guarded(N * D), *bdw_ref = fxt_guarded_copy(dw0, V * D), *bdb_ref = fxt_guarded_copy(db0, V);
    FXT_OK(fx_linear_cross_entropy_backward(&p, h, w, bias, target, lse_ref, gl, bdh_ref, bdw_ref, bdb_ref));

    fx_lce d = p;
    d.device = 1;
    d.dtype = bf16 ? FX_DT_BF16 : 0;
    void *gh = gpu_upload_as(h, N * D, bf16), *gw = gpu_upload_as(w, V * D, bf16);
    void *gb = bias ? gpu_upload_as(bias, V, bf16) : NULL, *gt = gpu_upload(target, N * sizeof(int64_t));
    void *gloss = gpu_alloc(nl * 4), *glse = gpu_alloc(N * 4), *gdh = gpu_alloc(N * D * 4);
    void *ggl = gpu_upload(gl, nl * 4), *glse_in = gpu_upload(lse_ref, N * 4);
    float *r[2][8];
    for (int run = 0; run < 2; run++) {
        void *gdw = gpu_upload_as(dw0, V * D, bf16), *gdb = gpu_upload_as(db0, V, bf16);
        FXT_OK(fx_linear_cross_entropy(&d, gh, gw, gb, gt, gloss, glse, gdh, gdw, gdb));
        for (int i = 0; i < 8; i++)
            r[run][i] = NULL;
        r[run][0] = fxt_guarded(nl), r[run][1] = fxt_guarded(N), r[run][2] = fxt_guarded(N * D);
        r[run][3] = fxt_guarded(V * D), r[run][4] = fxt_guarded(V);
        gpu_download(r[run][0], gloss, nl * 4);
        gpu_download(r[run][1], glse, N * 4);
        gpu_download_as(r[run][2], gdh, N * D, bf16);
        gpu_download_as(r[run][3], gdw, V * D, bf16);
        gpu_download_as(r[run][4], gdb, V, bf16);
        gpu_free(gdw), gpu_free(gdb);
        gdw = gpu_upload_as(dw0, V * D, bf16), gdb = gpu_upload_as(db0, V, bf16);
        FXT_OK(fx_linear_cross_entropy_backward(&d, gh, gw, gb, gt, glse_in, ggl, gdh, gdw, gdb));
        r[run][5] = fxt_guarded(N * D), r[run][6] = fxt_guarded(V * D), r[run][7] = fxt_guarded(V);
        gpu_download_as(r[run][5], gdh, N * D, bf16);
        gpu_download_as(r[run][6], gdw, V * D, bf16);
        gpu_download_as(r[run][7], gdb, V, bf16);
        gpu_free(gdw), gpu_free(gdb);
    }
    const char *names[8] = {"loss", "lse", "dh", "dw", "dbias", "backward dh", "backward dw", "backward dbias"};
    const float *refs[8] = {loss_ref, lse_ref, dh_ref, dw_ref, db_ref, bdh_ref, bdw_ref, bdb_ref};
    const size_t ns[8] = {nl, N, N * D, V * D, V, N * D, V * D, V};
    for (int i = 0; i < 8; i++) {
        gpu_close(names[i], r[0][i], refs[i], ns[i], bf16);
        gpu_same(names[i], r[0][i], r[1][i], ns[i]);
    }
    for (int run = 0; run < 2; run++)
        for (int i = 0; i < 8; i++)
            fxt_guarded_free(names[i], r[run][i]);
    for (int i = 0; i < 8; i++)
        fxt_guarded_free(names[i], (float *)refs[i]);
    gpu_free(gh), gpu_free(gw), gpu_free(gb), gpu_free(gt), gpu_free(gloss), gpu_free(glse), gpu_free(gdh);
    gpu_free(ggl), gpu_free(glse_in);
    free(h), free(w), free(bias), free(dw0), free(db0), free(gl), free(target);
}

static void test_options(void)
{
    fx_lce base = fx_lce_defaults(37, 48, 301);
    lce_case cases[] = {
        {"MEAN, defaults", base, false, false},
        {"SUM, bias", base, true, false},
        {"NONE, ignore_index", base, false, false},
        {"label smoothing, z-loss, softcap, bias", base, true, false},
        {"chunks of 8 tokens", base, true, false},
        {"every token ignored (MEAN: NaN, zero gradients)", base, false, true},
    };
    cases[1].p.reduction = FX_REDUCTION_SUM;
    cases[2].p.reduction = FX_REDUCTION_NONE;
    cases[2].p.ignore_index = 5;
    cases[3].p.label_smoothing = 0.1f;
    cases[3].p.z_loss = 1e-3f;
    cases[3].p.softcap = 15.0f;
    cases[4].p.chunk = 8;
    cases[4].p.reduction = FX_REDUCTION_NONE;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_lce(&cases[i], false);
    check_lce(&cases[0], true);
    check_lce(&cases[3], true);
    check_lce(&cases[4], true); /* bfloat16 G over the float32 logits, chunk after chunk */
}

static void test_sizes(void)
{
    lce_case c = {"N 1, D 1, V 2", fx_lce_defaults(1, 1, 2), false, false};
    check_lce(&c, false);
#ifdef FX_CUDA_EMU
    lce_case big = {"N 130, D 64, V 1500", fx_lce_defaults(130, 64, 1500), true, false}; /* the emulation is slow */
#else
    lce_case big = {"N 300, D 64, V 5000", fx_lce_defaults(300, 64, 5000), true, false};
#endif
    check_lce(&big, false);
    check_lce(&big, true);
}

static void test_errors(void)
{
    fx_lce p = fx_lce_defaults(4, 8, 10);
    p.device = 1;
    float *hh = fxt_random(4 * 8, -1, 1, 61), *hw = fxt_random(10 * 8, -1, 1, 62), loss;
    int64_t ht[4] = {1, 2, 10, 3}; /* 10 is out of range */
    void *h = gpu_upload(hh, 4 * 8 * 4), *w = gpu_upload(hw, 10 * 8 * 4), *t = gpu_upload(ht, sizeof ht);
    void *l = gpu_alloc(4);
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, t, l, NULL, NULL, NULL, NULL), FX_ERANGE, "target[2] = 10");
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, ht, l, NULL, NULL, NULL, NULL), FX_EINVAL, "host memory");
    FXT_STATUS(fx_linear_cross_entropy(&p, h, w, NULL, t, &loss, NULL, NULL, NULL, NULL), FX_EINVAL, "loss");
    gpu_free(h), gpu_free(w), gpu_free(t), gpu_free(l);
    free(hh), free(hw);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    gpu_require();
    FXT_RUN(test_errors);
    FXT_RUN(test_options);
    FXT_RUN(test_sizes);
    return fxt_finish();
}
