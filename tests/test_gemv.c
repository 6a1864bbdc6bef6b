/* The matrix-vector kernels (src/core/gemv.c): fx__gemv over F32, BF16 and F16 weights
   against a float64 reference at odd sizes on every CPU path, bitwise equal at 1 and N
   threads, exact widening, and fx__linear_dt (the prompt's tiled path). */
#include "harness.h"
#include "core/core.h"
#include "core/gemv.h"
#include "core/sgemm.h"
#include "core/gemm_bf16.h"

static const fx_dtype dtypes[] = {FX_DT_F32, FX_DT_BF16, FX_DT_F16};
static const char *const dtype_names[] = {"F32", "BF16", "F16"};

/* W [n] in dt from uniform floats; widened [n] gets the values as stored. */
static void *make_weights(fx_dtype dt, size_t n, uint64_t seed, double *widened)
{
    float *f = fxt_random(n, -1.0f, 1.0f, seed);
    void *w;
    if (dt == FX_DT_F32) {
        w = f;
        for (size_t i = 0; i < n; i++)
            widened[i] = f[i];
        return w;
    }
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) {
        h[i] = dt == FX_DT_BF16 ? fx_f32_to_bf16(f[i]) : fx_f32_to_f16(f[i]);
        widened[i] = dt == FX_DT_BF16 ? fx_bf16_to_f32(h[i]) : fx_f16_to_f32(h[i]);
    }
    free(f);
    return h;
}

/* The ISA paths this CPU has (the scalar reference always). */
static int paths(fx_isa *out)
{
    fx_isa best = fx_get_isa();
    int n = 0;
    out[n++] = FX_ISA_SCALAR;
    if (best >= FX_ISA_AVX2)
        out[n++] = FX_ISA_AVX2;
    return n;
}

/* y = W x (+ y0) against float64, for sizes that are not multiples of 8 or 16, I = 1. */
static void test_gemv_reference(void)
{
    static const int64_t sizes[][2] = {{1, 1}, {3, 1}, {5, 7}, {4, 8}, {13, 9}, {7, 16}, {37, 33}, {67, 129},
                                       {130, 1000}, {33, 2051}};
    fx_isa best = fx_get_isa(), isa[3];
    int np = paths(isa);
    for (int p = 0; p < np; p++) {
        FXT_OK(fx_set_isa(isa[p]));
        for (int d = 0; d < 3; d++)
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                const int64_t O = sizes[s][0], I = sizes[s][1];
                double *wd = fxt_alloc_f64((size_t)(O * I));
                void *w = make_weights(dtypes[d], (size_t)(O * I), 11 + s, wd);
                float *x = fxt_random((size_t)I, -1.0f, 1.0f, 7 + s);
                float *y0 = fxt_random((size_t)O, -1.0f, 1.0f, 3 + s);
                for (int acc = 0; acc < 2; acc++) {
                    float *y = fxt_guarded_copy(y0, (size_t)O);
                    double *ref = fxt_alloc_f64((size_t)O);
                    double worst = 0.0;
                    for (int64_t r = 0; r < O; r++) {
                        double sum = 0.0, mag = 0.0;
                        for (int64_t i = 0; i < I; i++)
                            sum += wd[r * I + i] * x[i], mag += fabs(wd[r * I + i] * x[i]);
                        ref[r] = sum + (acc ? y0[r] : 0.0);
                        mag += acc ? fabs(y0[r]) : 0.0;
                        worst = mag > worst ? mag : worst;
                    }
                    fx__gemv(y, w, dtypes[d], x, O, I, acc);
                    char what[96];
                    snprintf(what, sizeof what, "gemv %s %s O=%lld I=%lld acc=%d", fx_isa_name(isa[p]),
                             dtype_names[d], (long long)O, (long long)I, acc);
                    /* float32 sums of I products: rounding grows like sqrt(I) ulp of the
                       largest row's magnitude; a lost or doubled term is far above it. */
                    fxt_close_f32(what, y, ref, (size_t)O, 2e-7 * sqrt((double)I) * worst + 1e-7, 0);
                    fxt_guarded_free(what, y);
                    free(ref);
                }
                free(wd), free(w), free(x), free(y0);
            }
    }
    FXT_OK(fx_set_isa(best));
}

/* Every row is its own fixed-order sum: 1 and N threads give the same bits, on each path. */
static void test_gemv_threads(void)
{
    const int64_t O = 1003, I = 517;
    fx_isa best = fx_get_isa(), isa[3];
    int np = paths(isa);
    int before = fx_get_num_threads();
    for (int p = 0; p < np; p++) {
        FXT_OK(fx_set_isa(isa[p]));
        for (int d = 0; d < 3; d++) {
            double *wd = fxt_alloc_f64((size_t)(O * I));
            void *w = make_weights(dtypes[d], (size_t)(O * I), 5, wd);
            float *x = fxt_random((size_t)I, -1.0f, 1.0f, 6);
            float *y1 = fxt_guarded((size_t)O), *y4 = fxt_guarded((size_t)O), *y3 = fxt_guarded((size_t)O);
            FXT_OK(fx_set_num_threads(1));
            fx__gemv(y1, w, dtypes[d], x, O, I, false);
            FXT_OK(fx_set_num_threads(4));
            fx__gemv(y4, w, dtypes[d], x, O, I, false);
            FXT_OK(fx_set_num_threads(3));
            fx__gemv(y3, w, dtypes[d], x, O, I, false);
            char what[64];
            snprintf(what, sizeof what, "gemv %s %s 1 vs 4 threads", fx_isa_name(isa[p]), dtype_names[d]);
            fxt_bitwise_f32(what, y1, y4, (size_t)O);
            snprintf(what, sizeof what, "gemv %s %s 1 vs 3 threads", fx_isa_name(isa[p]), dtype_names[d]);
            fxt_bitwise_f32(what, y1, y3, (size_t)O);
            fxt_guarded_free("y1", y1), fxt_guarded_free("y4", y4), fxt_guarded_free("y3", y3);
            free(wd), free(w), free(x);
        }
    }
    FXT_OK(fx_set_num_threads(before));
    FXT_OK(fx_set_isa(best));
}

/* Widening is exact (every BF16 / F16 value is a float32), on every path and at odd counts. */
static void test_widen_rows(void)
{
    fx_isa best = fx_get_isa(), isa[3];
    int np = paths(isa);
    const int64_t O = 9, I = 70001; /* more than one chunk of the thread split */
    for (int p = 0; p < np; p++) {
        FXT_OK(fx_set_isa(isa[p]));
        for (int d = 0; d < 3; d++) {
            double *wd = fxt_alloc_f64((size_t)(O * I));
            void *w = make_weights(dtypes[d], (size_t)(O * I), 9, wd);
            for (int64_t r0 = 0; r0 < O; r0 += 4) {
                int64_t r1 = r0 + 3 < O ? r0 + 3 : O;
                float *dst = fxt_guarded((size_t)((r1 - r0) * I));
                fx__widen_rows(dst, w, dtypes[d], r0, r1, I);
                char what[64];
                snprintf(what, sizeof what, "widen %s %s rows %lld..%lld", fx_isa_name(isa[p]), dtype_names[d],
                         (long long)r0, (long long)r1);
                fxt_close_f32(what, dst, wd + r0 * I, (size_t)((r1 - r0) * I), 0, 0);
                fxt_guarded_free(what, dst);
            }
            free(wd), free(w);
        }
    }
    FXT_OK(fx_set_isa(best));
}

/* W's values (exact in float32) as a float32 matrix. */
static float *widened(const double *wd, size_t n)
{
    float *w = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        w[i] = (float)wd[i];
    return w;
}

/* y [N, O] = x W^T (+ y) through fx__linear_dt: N = 1 (gemv), N > 1 (sgemm in place for F32,
   BF16 packed as read by the own tiled GEMM where the path has it, tiles of widened rows
   otherwise, O not a multiple of the tile); the same bits at 1 thread and 3, and a BF16 W
   on the own tiled GEMM the bits of its float32 widening. */
static void test_linear_dt(void)
{
    const int64_t I = 45, O = FX__WIDEN_TILE * 2 + 17;
    const int before = fx_get_num_threads();
    for (int d = 0; d < 3; d++)
        for (int k = 0; k < 3; k++) {
            const int64_t N = k == 0 ? 1 : k == 1 ? 5 : 200;
            double *wd = fxt_alloc_f64((size_t)(O * I));
            void *w = make_weights(dtypes[d], (size_t)(O * I), 21, wd);
            float *x = fxt_random((size_t)(N * I), -1.0f, 1.0f, 22);
            float *y0 = fxt_random((size_t)(N * O), -1.0f, 1.0f, 23);
            float *y = fxt_guarded_copy(y0, (size_t)(N * O)), *y3 = fxt_guarded_copy(y0, (size_t)(N * O));
            float *scratch = fxt_guarded((size_t)(FX__WIDEN_TILE * I));
            double *ref = fxt_alloc_f64((size_t)(N * O));
            for (int64_t n = 0; n < N; n++)
                for (int64_t o = 0; o < O; o++) {
                    double s = y0[n * O + o];
                    for (int64_t i = 0; i < I; i++)
                        s += (double)x[n * I + i] * wd[o * I + i];
                    ref[n * O + o] = s;
                }
            FXT_OK(fx_set_num_threads(1));
            fx__linear_dt(y, O, x, w, dtypes[d], N, I, O, true, scratch);
            FXT_OK(fx_set_num_threads(3));
            fx__linear_dt(y3, O, x, w, dtypes[d], N, I, O, true, scratch);
            char what[64];
            snprintf(what, sizeof what, "linear_dt %s N=%lld", dtype_names[d], (long long)N);
            fxt_close_f32(what, y, ref, (size_t)(N * O), 1e-5, 1e-5);
            fxt_bitwise_f32(what, y, y3, (size_t)(N * O));
            if (N > 1 && dtypes[d] == FX_DT_BF16 && fx__gemm_kernels_now()->tiled) {
                /* BF16 on the own tiled GEMM: the bits of its float32 widening */
                float *w32 = widened(wd, (size_t)(O * I)), *yf = fxt_guarded_copy(y0, (size_t)(N * O));
                fx__linear_dt(yf, O, x, w32, FX_DT_F32, N, I, O, true, scratch);
                fxt_bitwise_f32("linear_dt BF16 vs its float32 widening", y3, yf, (size_t)(N * O));
                fxt_guarded_free(what, yf);
                free(w32);
            }
            fxt_guarded_free(what, y);
            fxt_guarded_free(what, y3);
            fxt_guarded_free("scratch", scratch);
            free(wd), free(w), free(x), free(y0), free(ref);
        }
    FXT_OK(fx_set_num_threads(before));
}

/* dx [N, I] = dy W (+ dx) through fx__linear_dt_t against float64: O over several tiles and
   not a multiple of one, dy's rows wider than O; bitwise the same at 1 and 3 threads (with
   N = 200, the rows split among the threads), and as test_linear_dt for a BF16 W. */
static void test_linear_dt_t(void)
{
    const int64_t I = 45, O = FX__WIDEN_TILE * 2 + 17, ldy = O + 3;
    int before = fx_get_num_threads();
    for (int d = 0; d < 3; d++)
        for (int case_ = 0; case_ < 4; case_++) {
            const int acc = case_ & 1;
            const int64_t N = case_ < 2 ? 7 : 200;
            double *wd = fxt_alloc_f64((size_t)(O * I));
            void *w = make_weights(dtypes[d], (size_t)(O * I), 31, wd);
            float *dy = fxt_random((size_t)(N * ldy), -1.0f, 1.0f, 32);
            float *dx0 = fxt_random((size_t)(N * I), -1.0f, 1.0f, 33);
            float *dx = fxt_guarded_copy(dx0, (size_t)(N * I)), *dx3 = fxt_guarded_copy(dx0, (size_t)(N * I));
            float *scratch = fxt_guarded((size_t)(FX__WIDEN_TILE * I));
            double *ref = fxt_alloc_f64((size_t)(N * I));
            for (int64_t n = 0; n < N; n++)
                for (int64_t i = 0; i < I; i++) {
                    double s = acc ? dx0[n * I + i] : 0.0;
                    for (int64_t o = 0; o < O; o++)
                        s += (double)dy[n * ldy + o] * wd[o * I + i];
                    ref[n * I + i] = s;
                }
            FXT_OK(fx_set_num_threads(1));
            fx__linear_dt_t(dx, dy, ldy, w, dtypes[d], N, I, O, acc, scratch);
            FXT_OK(fx_set_num_threads(3));
            fx__linear_dt_t(dx3, dy, ldy, w, dtypes[d], N, I, O, acc, scratch);
            char what[64];
            snprintf(what, sizeof what, "linear_dt_t %s acc=%d N=%lld", dtype_names[d], acc, (long long)N);
            fxt_close_f32(what, dx, ref, (size_t)(N * I), 1e-5, 1e-5);
            fxt_bitwise_f32(what, dx, dx3, (size_t)(N * I));
            if (dtypes[d] == FX_DT_BF16 && fx__gemm_kernels_now()->tiled) {
                float *w32 = widened(wd, (size_t)(O * I)), *dxf = fxt_guarded_copy(dx0, (size_t)(N * I));
                fx__linear_dt_t(dxf, dy, ldy, w32, FX_DT_F32, N, I, O, acc, scratch);
                fxt_bitwise_f32("linear_dt_t BF16 vs its float32 widening", dx3, dxf, (size_t)(N * I));
                fxt_guarded_free(what, dxf);
                free(w32);
            }
            fxt_guarded_free(what, dx);
            fxt_guarded_free(what, dx3);
            fxt_guarded_free("scratch", scratch);
            free(wd), free(w), free(dy), free(dx0), free(ref);
        }
    FXT_OK(fx_set_num_threads(before));
}

/* fx__linear_bf16 / _t (bfloat16 products over BF16 or F32 rows, FX__BF16_ROWS a call): against
   float64 sums of the bfloat16-rounded inputs, and bitwise at 1 and 3 threads; O over two calls. */
static void test_linear_bf16(void)
{
    const int64_t N = 70, I = 40, O = FX__BF16_ROWS + 37, ldy = O + 5;
    const fx_dtype dts[2] = {FX_DT_BF16, FX_DT_F32};
    const int before = fx_get_num_threads();
    for (int d = 0; d < 2; d++) {
        double *wd = fxt_alloc_f64((size_t)(O * I));
        void *w = make_weights(dts[d], (size_t)(O * I), 41, wd);
        float *x = fxt_random((size_t)(N * I), -1.0f, 1.0f, 42), *dy = fxt_random((size_t)(N * ldy), -1.0f, 1.0f, 43);
        float *ws = malloc(fx__linear_bf16_ws(N, I, O) * sizeof(float));
        float *y1 = calloc((size_t)(N * ldy), sizeof(float)), *y3 = calloc((size_t)(N * ldy), sizeof(float));
        float *dx1 = malloc((size_t)(N * I) * sizeof(float)), *dx3 = malloc((size_t)(N * I) * sizeof(float));
        double *ry = fxt_alloc_f64((size_t)(N * O)), *rdx = fxt_alloc_f64((size_t)(N * I));
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < O; o++) {
                double s = 0.0;
                for (int64_t i = 0; i < I; i++)
                    s += (double)fx__bf16_round(x[n * I + i]) * (double)fx__bf16_round((float)wd[o * I + i]);
                ry[n * O + o] = s;
            }
        for (int64_t n = 0; n < N; n++)
            for (int64_t i = 0; i < I; i++) {
                double s = 0.0;
                for (int64_t o = 0; o < O; o++)
                    s += (double)fx__bf16_round(dy[n * ldy + o]) * (double)fx__bf16_round((float)wd[o * I + i]);
                rdx[n * I + i] = s;
            }
        FXT_OK(fx_set_num_threads(1));
        fx__linear_bf16(y1, ldy, x, w, dts[d], N, I, O, false, ws);
        fx__linear_bf16_t(dx1, dy, ldy, w, dts[d], N, I, O, false, ws);
        FXT_OK(fx_set_num_threads(3));
        fx__linear_bf16(y3, ldy, x, w, dts[d], N, I, O, false, ws);
        fx__linear_bf16_t(dx3, dy, ldy, w, dts[d], N, I, O, false, ws);
        float *yc = malloc((size_t)(N * O) * sizeof(float));
        for (int64_t n = 0; n < N; n++)
            memcpy(yc + n * O, y1 + n * ldy, (size_t)O * sizeof(float));
        fxt_close_f32(d ? "linear_bf16 F32 rows" : "linear_bf16 BF16 rows", yc, ry, (size_t)(N * O), 1e-4, 1e-4);
        fxt_close_f32(d ? "linear_bf16_t F32 rows" : "linear_bf16_t BF16 rows", dx1, rdx, (size_t)(N * I), 1e-3, 1e-4);
        fxt_bitwise_f32("linear_bf16 threads", y1, y3, (size_t)(N * ldy));
        fxt_bitwise_f32("linear_bf16_t threads", dx1, dx3, (size_t)(N * I));
        free(wd), free(w), free(x), free(dy), free(ws), free(y1), free(y3), free(dx1), free(dx3), free(ry), free(rdx),
            free(yc);
    }
    FXT_OK(fx_set_num_threads(before));
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_gemv_reference);
    FXT_RUN(test_gemv_threads);
    FXT_RUN(test_widen_rows);
    FXT_RUN(test_linear_dt);
    FXT_RUN(test_linear_dt_t);
    FXT_RUN(test_linear_bf16);
    return fxt_finish();
}
