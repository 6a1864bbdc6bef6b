/* The device products of src/cuda/blas.c (fx__cu_gemm_run) against a float64 host reference:
   every transpose combination, float32 and bfloat16 inputs, float32 and bfloat16 outputs, beta
   0, 1 and another, odd shapes, leading dimensions past the row length, and each product run
   twice, bitwise equal. Argument errors and the k = 0 and m = 0 cases. Skipped (77) without a
   GPU; built against the CPU emulation as test_cuda_emu_gemm.

   Tolerance: |got - ref| <= 2e-5 * sum_k |alpha a_ik b_kj| + |beta c_ij| * 2e-5 (float32
   accumulation of products that are exact in float32), plus 2^-8 |ref| for a bfloat16 output
   (its rounding). */
#include "cuda_gpu.h"
#include "cuda/blas.h"

typedef struct gemm_shape {
    int64_t m, n, k;
} gemm_shape;

/* One product of the given shape and options, checked against float64 and repeated. */
static void check_gemm(gemm_shape s, bool ta, bool tb, bool bf16_in, bool bf16_out, float alpha, float beta,
                       int64_t pad, uint64_t seed)
{
    const int64_t m = s.m, n = s.n, k = s.k;
    const int64_t ra = ta ? k : m, ca = ta ? m : k, rb = tb ? n : k, cb = tb ? k : n;
    const int64_t lda = ca + pad, ldb = cb + pad, ldc = n + pad;
    const size_t na = (size_t)(ra * lda), nb = (size_t)(rb * ldb), nc = (size_t)(m * ldc);
    float *a = fxt_random(na, -1, 1, seed), *b = fxt_random(nb, -1, 1, seed + 1);
    float *c0 = fxt_random(nc, -1, 1, seed + 2);
    if (bf16_in)
        bf16_round(a, na), bf16_round(b, nb);
    if (bf16_out)
        bf16_round(c0, nc);
    double *ref = fxt_alloc_f64(nc), *mag = fxt_alloc_f64(nc);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0, am = 0.0;
            for (int64_t kk = 0; kk < k; kk++) {
                const double p = (double)a[ta ? kk * lda + i : i * lda + kk] * b[tb ? j * ldb + kk : kk * ldb + j];
                acc += p;
                am += fabs(p);
            }
            const double cold = c0[i * ldc + j];
            ref[i * ldc + j] = alpha * acc + (beta != 0.0f ? beta * cold : 0.0);
            mag[i * ldc + j] = fabs(alpha) * am + fabs(beta * cold);
        }
    void *ga = gpu_upload_as(a, na, bf16_in), *gb = gpu_upload_as(b, nb, bf16_in);
    float *got[2];
    for (int run = 0; run < 2; run++) {
        void *gc = gpu_upload_as(c0, nc, bf16_out);
        const fx__cu_gemm g = {.m = m, .n = n, .k = k, .a = ga, .b = gb, .c = gc, .lda = lda, .ldb = ldb,
                               .ldc = ldc, .ta = ta, .tb = tb, .ab_type = bf16_in ? FX_DT_BF16 : FX_DT_F32,
                               .c_type = bf16_out ? FX_DT_BF16 : FX_DT_F32, .alpha = alpha, .beta = beta};
        FXT_OK(fx__cu_gemm_run(&g));
        FXT_CHECK(cudaStreamSynchronize(NULL) == cudaSuccess);
        got[run] = malloc(nc * sizeof(float));
        gpu_download_as(got[run], gc, nc, bf16_out);
        gpu_free(gc);
    }
    size_t bad = 0, first = 0, worst = 0;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++) {
            const size_t x = (size_t)(i * ldc + j);
            double tol, err;
            if (j >= n) { /* the padding between rows is never written */
                tol = 0.0;
                err = memcmp(&got[0][x], &c0[x], 4) ? INFINITY : 0.0;
            } else {
                /* A bfloat16 output may be rounded twice: cuBLASLt's epilogue can round alpha A B to
                   bfloat16 before it adds beta C (seen on an H200: ~4% of the elements one unit off
                   at beta 1), so one unit in the last place, not half. */
                tol = 2e-5 * mag[x] + (bf16_out ? ldexp(fabs(ref[x]), -7) : 0.0) + 1e-30;
                err = fabs((double)got[0][x] - ref[x]);
                if (isnan(err))
                    err = INFINITY;
            }
            if (err > tol && !bad++)
                first = x;
            if (err / (tol > 0 ? tol : 1e-30) > worst_ratio)
                worst_ratio = err / (tol > 0 ? tol : 1e-30), worst = x;
        }
    if (bad)
        FXT_FAIL("gemm %lldx%lldx%lld ta %d tb %d %s->%s alpha %g beta %g pad %lld: %zu of %zu off; first [%zu] "
                 "%.9g vs %.9g; worst [%zu] %.9g vs %.9g (%.3g x tolerance)",
                 (long long)m, (long long)n, (long long)k, ta, tb, bf16_in ? "bf16" : "f32", bf16_out ? "bf16" : "f32",
                 (double)alpha, (double)beta, (long long)pad, bad, nc, first, (double)got[0][first], ref[first],
                 worst, (double)got[0][worst], ref[worst], worst_ratio);
    gpu_same("gemm repeat", got[0], got[1], nc);
    gpu_free(ga), gpu_free(gb);
    free(a), free(b), free(c0), free(ref), free(mag), free(got[0]), free(got[1]);
}

static void test_shapes(void)
{
    const gemm_shape shapes[] = {{1, 1, 1}, {7, 129, 13}, {129, 7, 65}, {33, 65, 257}, {1, 70, 3}, {64, 1, 128}};
    uint64_t seed = 100;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int t = 0; t < 4; t++)
            for (int ty = 0; ty < 3; ty++) { /* f32 -> f32, bf16 -> f32, bf16 -> bf16 */
                const bool bin = ty > 0, bout = ty == 2;
                check_gemm(shapes[i], t & 1, t >> 1, bin, bout, 1.0f, 0.0f, 0, seed++);
                check_gemm(shapes[i], t & 1, t >> 1, bin, bout, 1.0f, 1.0f, 3, seed++);
            }
}

static void test_scales(void)
{
    const gemm_shape s = {17, 31, 45};
    check_gemm(s, false, true, false, false, -2.0f, 0.5f, 5, 300);
    check_gemm(s, true, false, true, true, 0.25f, -1.0f, 1, 301);
    check_gemm(s, true, true, true, false, 0.0f, 1.0f, 0, 302); /* alpha 0: C unchanged */
}

/* A product the size of the fused loss's tiles, where the library takes its fastest kernels. */
static void test_large(void)
{
#ifdef FX_CUDA_EMU
    const gemm_shape s = {96, 160, 192}; /* the emulation is a plain loop */
#else
    const gemm_shape s = {256, 1000, 1024};
#endif
    check_gemm(s, false, true, true, false, 1.0f, 0.0f, 0, 400);  /* Z = h W^T */
    check_gemm(s, false, false, true, true, 1.0f, 0.0f, 0, 401);  /* dh = G W */
    check_gemm(s, true, false, true, true, 1.0f, 1.0f, 0, 402);   /* dw += G^T h */
    check_gemm(s, false, true, false, false, 1.0f, 0.0f, 8, 403); /* float32, padded */
}

static void test_edges(void)
{
    float host[12];
    for (int i = 0; i < 12; i++)
        host[i] = (float)i + 1;
    void *c = gpu_upload(host, sizeof host), *a = gpu_upload(host, sizeof host);
    fx__cu_gemm g = {.m = 3, .n = 4, .k = 0, .a = a, .b = a, .c = c, .lda = 1, .ldb = 4, .ldc = 4,
                     .ab_type = FX_DT_F32, .c_type = FX_DT_F32, .alpha = 1.0f, .beta = 1.0f};
    FXT_OK(fx__cu_gemm_run(&g)); /* k = 0, beta 1: C unchanged */
    float back[12];
    gpu_download(back, c, sizeof back);
    FXT_CHECK(!memcmp(back, host, sizeof host));
    g.beta = 0.0f; /* k = 0, beta 0: zeros */
    FXT_OK(fx__cu_gemm_run(&g));
    FXT_CHECK(cudaStreamSynchronize(NULL) == cudaSuccess);
    gpu_download(back, c, sizeof back);
    for (int i = 0; i < 12; i++)
        FXT_CHECK(back[i] == 0.0f);
    g.m = 0; /* nothing to do: even NULL C is fine */
    g.c = NULL;
    FXT_OK(fx__cu_gemm_run(&g));

    const fx__cu_gemm ok = {.m = 2, .n = 2, .k = 2, .a = a, .b = a, .c = c, .lda = 2, .ldb = 2, .ldc = 2,
                            .ab_type = FX_DT_F32, .c_type = FX_DT_F32, .alpha = 1.0f};
    FXT_STATUS(fx__cu_gemm_run(NULL), FX_EINVAL, "g is NULL");
    g = ok, g.lda = 1;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EINVAL, "lda = 1");
    g = ok, g.ta = 1, g.m = 3, g.lda = 2; /* stored [k, m]: lda >= m */
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EINVAL, "must be >= 3");
    g = ok, g.ldc = 1;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EINVAL, "ldc = 1");
    g = ok, g.k = -1;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EINVAL, "k = -1");
    g = ok, g.b = NULL;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EINVAL, "b is NULL");
    g = ok, g.c_type = FX_DT_BF16;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EUNSUPPORTED, "c_type FX_DT_BF16 with ab_type FX_DT_F32");
    g = ok, g.ab_type = FX_DT_I32;
    FXT_STATUS(fx__cu_gemm_run(&g), FX_EUNSUPPORTED, "ab_type");
    gpu_free(a), gpu_free(c);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        fxt_only = argv[1];
    gpu_require();
    (void)gpu_close; /* cuda_gpu.h's comparison: the products state their own tolerance */
    FXT_RUN(test_edges);
    FXT_RUN(test_shapes);
    FXT_RUN(test_scales);
    FXT_RUN(test_large);
    return fxt_finish();
}
