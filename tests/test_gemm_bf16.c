/* The bfloat16 GEMM (src/core/gemm_bf16.c): the conversions (nearest even, NaN, infinities;
   every path bitwise the scalar loop), the GEMM's paths and its fixed-order reference
   against a float64 sum of the bfloat16-rounded inputs at odd shapes, every transpose and
   both operand kinds, and its results bitwise equal across thread counts and paths. The
   tiled paths are tested the same way on any CPU: the vdpbf16ps (AVX512-BF16) one with its
   micro-kernel built from SIMDe's portable intrinsics (gemm_bf16_simde.c), the AMX one's
   packing and tiling with a plain C kernel of the same contract; and with the library's own
   kernels where the CPU has them (test_gemm_bf16_emu runs those on an emulated CPU).

   Tolerance: |c - ref| <= 1e-5 * (sum_k |a_ik b_kj| + |beta c_ij|), ref the float64 value of
   the same sum over the rounded inputs (float32 sums of K exact products, in whatever
   order, stay well inside it at these K). */
#include "harness.h"

#include "core/gemm_bf16.h"
#include "core/sgemm.h"

#include <float.h>
#include <math.h>

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- conversions ----------------------------------------------------------------------------- */

static void test_bf16_rounding(void)
{
    const struct { uint32_t in; uint16_t out; } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0x3f808000u, 0x3f80}, /* a tie rounds to even (down) */
        {0x3f818000u, 0x3f82}, /* a tie rounds to even (up) */
        {0x3f808001u, 0x3f81}, /* just above a tie */
        {0x3f807fffu, 0x3f80}, /* just below */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* inf */
        {0xff800000u, 0xff80}, /* -inf */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds up to inf */
        {0x7f800001u, 0x7fc0}, /* a signalling NaN comes back quiet */
        {0xffc00000u, 0xffc0}, /* a quiet NaN keeps its sign */
        {0x00000001u, 0x0000}, /* the smallest subnormal rounds to 0 */
        {0x00018000u, 0x0002}, /* a subnormal tie to even */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = fx__f32_to_bf16(float_of(cases[i].in));
        if (got != cases[i].out)
            FXT_FAIL("case %zu: 0x%08x -> 0x%04x, want 0x%04x", i, cases[i].in, got, cases[i].out);
        FXT_EQ_INT(got, fx_f32_to_bf16(float_of(cases[i].in))); /* the public conversion agrees */
        FXT_EQ_INT(bits_of(fx__bf16_to_f32(got)), (uint32_t)got << 16);
    }
}

/* Every path's conversion and packing loops are bitwise the scalar ones: random values and
   every special case above, at lengths that leave each vector tail. */
static void test_bf16_paths_bitwise(void)
{
    enum { N = 203 };
    float *x = fxt_random(N, -3, 3, 5);
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                0x7f800001u, 0xffc00000u, 0x00018000u, 0x80000000u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[7 * i + 3] = float_of(special[i]);
    if (fx_get_isa() == FX_ISA_SCALAR) {
        fprintf(stderr, "  (no AVX2: the scalar loops only)\n");
        free(x);
        return;
    }
    for (int64_t n = 0; n <= N; n += n < 20 ? 1 : 61) {
        uint16_t a[N], b[N];
        memset(a, 0xee, sizeof a), memset(b, 0xee, sizeof b);
        fx__f32_to_bf16_n_scalar(a, x, n);
        fx__f32_to_bf16_n_avx2(b, x, n);
        if (memcmp(a, b, sizeof a) != 0)
            FXT_FAIL("f32 -> bf16, n = %lld: the AVX2 loop differs from the scalar one", (long long)n);
    }
    uint16_t h[N];
    fx__f32_to_bf16_n_scalar(h, x, N);
    /* Packing: 7 rows of 29 (rows 29 apart), from float32 and from bfloat16. */
    float p1[N], p2[N];
    for (int kind = 0; kind < 2; kind++) {
        fx__bf16_mat src = kind ? fx__bf16_of(h) : fx__bf16_of_f32(x);
        fx__bf16_pack_scalar(p1, src, 7, 27, 29);
        fx__bf16_pack_avx2(p2, src, 7, 27, 29);
        fxt_bitwise_f32(kind ? "pack bf16" : "pack f32", p1, p2, 7 * 27);
        for (int64_t r = 0; r < 7; r++)
            for (int64_t c = 0; c < 27; c++)
                if (bits_of(p1[r * 27 + c]) != (uint32_t)h[r * 29 + c] << 16) {
                    FXT_FAIL("pack %s [%lld, %lld]: 0x%08x, want 0x%04x0000", kind ? "bf16" : "f32", (long long)r,
                             (long long)c, bits_of(p1[r * 27 + c]), h[r * 29 + c]);
                    r = 7;
                    break;
                }
    }
    free(x);
}

/* ---- the GEMM ------------------------------------------------------------------------------- */

typedef struct operand {
    float *f;     /* float32 values (rounded as read when the operand is given in float32) */
    uint16_t *h;  /* the same, in bfloat16 */
    int64_t rows, cols, ld;
} operand;

static operand operand_new(int64_t rows, int64_t cols, int64_t ld, uint64_t seed)
{
    operand o = {fxt_random((size_t)(rows * ld), -1, 1, seed), malloc((size_t)(rows * ld) * sizeof(uint16_t)), rows,
                 cols, ld};
    fx__f32_to_bf16_n_scalar(o.h, o.f, rows * ld);
    return o;
}

static void operand_free(operand *o) { free(o->f), free(o->h); }

/* The value the GEMM reads at flat index i: the bfloat16 rounding of the float32 value. */
static double rd(const operand *o, int64_t i) { return (double)fx__bf16_to_f32(o->h[i]); }

/* C (M x ldc, padded) against the float64 sum of the rounded inputs; also returns the
   largest error against the unrounded inputs relative to sum |a b| (a product that skipped
   the rounding would show there). */
static bool gemm_check(const char *what, const float *C, const float *C0, bool ta, bool tb, int64_t M, int64_t N,
                       int64_t K, const operand *A, const operand *B, float beta, double *unrounded)
{
    size_t bad = 0, first = 0;
    double worst = 0.0, worst_un = 0.0;
    size_t worst_i = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0, un = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                int64_t ia = ta ? k * A->ld + i : i * A->ld + k, ib = tb ? j * B->ld + k : k * B->ld + j;
                acc += rd(A, ia) * rd(B, ib);
                un += (double)A->f[ia] * B->f[ib];
                mag += fabs(rd(A, ia) * rd(B, ib));
            }
            double c0 = beta == 0.0f ? 0.0 : (double)beta * C0[i * N + j];
            double ref = acc + c0, bound = 1e-5 * (mag + fabs(c0)) + 1e-30;
            double err = fabs((double)C[i * N + j] - ref);
            if (!(err <= bound)) {
                if (!bad++)
                    first = (size_t)(i * N + j);
            }
            if (err / bound > worst) {
                worst = err / bound;
                worst_i = (size_t)(i * N + j);
            }
            double e_un = fabs((double)C[i * N + j] - (un + c0)) / (mag + 1e-30);
            worst_un = e_un > worst_un ? e_un : worst_un;
        }
    if (unrounded)
        *unrounded = worst_un;
    if (bad)
        FXT_FAIL("%s (M %lld N %lld K %lld ta %d tb %d): %zu values off; first at [%zu] = %.9g; largest error "
                 "%.3g of its bound at [%zu]",
                 what, (long long)M, (long long)N, (long long)K, ta, tb, bad, first, (double)C[first], worst, worst_i);
    return bad == 0;
}

/* A GEMM under test: fx__gemm_bf16's contract, its scratch allocated by the caller. */
typedef void (*gemm_fn)(const void *ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                        int64_t lda, fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc);

/* gemm against the float64 sums of the rounded inputs (gemm_check) over shapes, every
   transpose, both operand kinds and beta 0 (over NaN) and 1; also fx__gemm_bf16_ref when
   with_ref. Returns the largest error against the unrounded inputs. */
static double reference_sweep(const char *what, gemm_fn gemm, const void *ctx, const int64_t (*shapes)[3], size_t ns,
                              bool with_ref)
{
    const int64_t pad = 3;
    double unrounded_max = 0.0;
    for (size_t s = 0; s < ns; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            operand A = operand_new(ta ? K : M, ta ? M : K, (ta ? M : K) + pad, 100 + s);
            operand B = operand_new(tb ? N : K, tb ? K : N, (tb ? K : N) + pad, 200 + s);
            for (int kinds = 0; kinds < 3; kinds++) { /* f32 x bf16, bf16 x f32, bf16 x bf16 */
                fx__bf16_mat a = kinds == 0 ? fx__bf16_of_f32(A.f) : fx__bf16_of(A.h);
                fx__bf16_mat b = kinds == 1 ? fx__bf16_of_f32(B.f) : fx__bf16_of(B.h);
                for (int bi = 0; bi < 2; bi++) {
                    float beta = bi ? 1.0f : 0.0f;
                    float *C0 = fxt_random((size_t)(M * N), -1, 1, 300 + s);
                    if (!bi)
                        for (int64_t i = 0; i < M * N; i++)
                            C0[i] = NAN; /* beta 0 overwrites, NaN included */
                    float *C = fxt_guarded_copy(C0, (size_t)(M * N));
                    gemm(ctx, ta, tb, M, N, K, a, A.ld, b, B.ld, beta, C, N);
                    double un = 0.0;
                    gemm_check(what, C, C0, ta, tb, M, N, K, &A, &B, beta, &un);
                    unrounded_max = un > unrounded_max ? un : unrounded_max;
                    fxt_guarded_free("C", C);
                    if (with_ref) {
                        float *R = fxt_guarded_copy(C0, (size_t)(M * N));
                        fx__gemm_bf16_ref(ta, tb, M, N, K, a, A.ld, b, B.ld, beta, R, N);
                        gemm_check("fx__gemm_bf16_ref", R, C0, ta, tb, M, N, K, &A, &B, beta, NULL);
                        fxt_guarded_free("R", R);
                    }
                    free(C0);
                }
            }
            operand_free(&A), operand_free(&B);
        }
    }
    return unrounded_max;
}

static void gemm_best(const void *ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                      fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    (void)ctx;
    float *ws = malloc(fx__gemm_bf16_ws(M, N, K) * sizeof(float));
    fx__gemm_bf16(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ws);
    free(ws);
}

static void test_gemm_bf16_against_reference(void)
{
    const int64_t shapes[][3] = {{37, 29, 53}, {1, 17, 300}, {65, 3, 1}, {130, 70, 513}, {8, 8, 8}, {3, 97, 17}};
    const double unrounded_max =
        reference_sweep("fx__gemm_bf16", gemm_best, NULL, shapes, sizeof shapes / sizeof shapes[0], true);
    /* The inputs were rounded: against the unrounded values the results are off by about
       bfloat16's precision (2^-9 relative per input), far more than the tolerance. */
    if (!(unrounded_max > 1e-3))
        FXT_FAIL("the products look like float32 ones: largest error against unrounded inputs %.3g of sum |ab|",
                 unrounded_max);
}

/* Bitwise the same at 1 and 2 threads on the CPU's best path, and on the scalar path as on
   the AVX2 one (both widen to float32; the vdpbf16ps path sums in another order). */
static void test_gemm_bf16_deterministic(void)
{
    const int64_t shapes[][3] = {{300, 70, 1000}, {70, 300, 1000}, {1, 2000, 777}, {513, 129, 2049}};
    const int before = fx_get_num_threads();
    const fx_isa best = fx_get_isa();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            operand A = operand_new(ta ? K : M, ta ? M : K, ta ? M : K, 10 + s);
            operand B = operand_new(tb ? N : K, tb ? K : N, tb ? K : N, 20 + s);
            float *ws = malloc(fx__gemm_bf16_ws(M, N, K) * sizeof(float));
            /* C[0], C[1]: the best path on 1 and 2 threads; C[2], C[3]: scalar, AVX2 (or best). */
            const fx_isa isa[4] = {best, best, FX_ISA_SCALAR, best < FX_ISA_AVX2 ? best : FX_ISA_AVX2};
            float *C[4];
            for (int r = 0; r < 4; r++) {
                C[r] = fxt_guarded((size_t)(M * N));
                fx_set_num_threads(r == 1 ? 2 : 1);
                fx_set_isa(isa[r]);
                fx__gemm_bf16(ta, tb, M, N, K, fx__bf16_of_f32(A.f), A.ld, fx__bf16_of(B.h), B.ld, 0.0f, C[r], N, ws);
                fx_set_isa(best);
            }
            fxt_bitwise_f32("bf16 gemm, 1 vs 2 threads", C[0], C[1], (size_t)(M * N));
            fxt_bitwise_f32("bf16 gemm, AVX2 vs scalar path", C[3], C[2], (size_t)(M * N));
            for (int r = 0; r < 4; r++)
                fxt_guarded_free("C", C[r]);
            free(ws);
            operand_free(&A), operand_free(&B);
        }
    }
    fx_set_num_threads(before);
}

static void gemm_forced_f32(const void *ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A,
                            int64_t lda, fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    fx__gemm_bf16_force_tiled(&fx__bf16_tiled_f32);
    gemm_best(ctx, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    fx__gemm_bf16_force_tiled(NULL);
}

/* The float32 route (fx__bf16_tiled_f32), forced whatever path the CPU takes: against the
   float64 sums of the rounded inputs, and bitwise equal to the operands widened by hand
   (fx__bf16_pack) and multiplied by fx__sgemm, for every operand kind and transpose, at
   shapes whose K spans several of the float32 GEMM's blocks of k, one with a single row
   and column (panels mostly padding), on the CPU's path and on the AVX2 one. On the
   AVX-512 path the route reads the operands in the float32 GEMM's own packing (the scratch
   always holds its blocks); the values, and so the bits, must be those of the widened
   copies. On AVX2 it widens them itself. */
static void test_gemm_bf16_f32_route(void)
{
    const int64_t shapes[][3] = {{37, 29, 53}, {1, 1, 300}, {130, 70, 2 * FX__SG_KC + 13}, {3, 97, 17}};
    reference_sweep("fx__gemm_bf16 (float32 route)", gemm_forced_f32, NULL, shapes, sizeof shapes / sizeof shapes[0],
                    false);
    const fx_isa best = fx_get_isa(), isas[] = {best, FX_ISA_AVX2};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if ((i > 0 && isas[i] == best) || fx_set_isa(isas[i]) != FX_OK)
            continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            for (int t = 0; t < 8; t++) {
                const bool ta = t & 1, tb = t & 2, a_bf16 = t & 4;
                operand A = operand_new(ta ? K : M, ta ? M : K, ta ? M : K, 40 + s);
                operand B = operand_new(tb ? N : K, tb ? K : N, tb ? K : N, 50 + s);
                const fx__bf16_mat a = a_bf16 ? fx__bf16_of(A.h) : fx__bf16_of_f32(A.f);
                const fx__bf16_mat b = a_bf16 ? fx__bf16_of_f32(B.f) : fx__bf16_of(B.h);
                float *aw = malloc((size_t)(M * K) * sizeof(float)), *bw = malloc((size_t)(K * N) * sizeof(float));
                float *C = fxt_guarded((size_t)(M * N)), *W = fxt_guarded((size_t)(M * N));
                fx__bf16_pack(aw, a, A.rows, A.cols, A.ld);
                fx__bf16_pack(bw, b, B.rows, B.cols, B.ld);
                fx__sgemm(ta, tb, M, N, K, 1.0f, aw, A.cols, bw, B.cols, 0.0f, W, N);
                gemm_forced_f32(NULL, ta, tb, M, N, K, a, A.ld, b, B.ld, 0.0f, C, N);
                fxt_bitwise_f32("float32 route vs widened operands", C, W, (size_t)(M * N));
                fxt_guarded_free("C", C), fxt_guarded_free("W", W);
                free(aw), free(bw);
                operand_free(&A), operand_free(&B);
            }
        }
    }
    fx_set_isa(best);
}

/* The float32 GEMM's packing of bfloat16 operands (sgemm.h's fx__sgemm_mat): the AVX-512 loop
   gives its plain C twin's floats, and both the float32 packing of the values rounded by
   fx__bf16_round, with every special case of the rounding in the data (ties, infinities,
   FLT_MAX, NaNs, subnormals), both layouts, a partial panel and a partial block of 16 k. */
static void test_sgemm_pack_bf16(void)
{
    enum { LINES = 45, KK = 37, W = FX__SG_NR };
    const int64_t ld = KK + 3;
    float *x = fxt_random(LINES * ld, -3, 3, 9), *xr = malloc(LINES * ld * sizeof(float));
    uint16_t *h = malloc(LINES * ld * sizeof(uint16_t));
    const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0xff800000u, 0x7f7fffffu,
                                0x7f800001u, 0xffc00000u, 0x00018000u, 0x80000000u, 0x00000001u};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        x[37 * i + 5] = float_of(special[i]);
    for (int64_t i = 0; i < LINES * ld; i++)
        xr[i] = fx__bf16_round(x[i]), h[i] = fx__f32_to_bf16(x[i]);
    const bool avx512 = fx_get_isa() == FX_ISA_AVX512;
    for (int kind = 0; kind < 2; kind++)
        for (int lk = 0; lk < 2; lk++)
            for (int64_t q = 0; q < 2; q++) { /* panel 1 holds 13 of the 32 lines */
                /* lk: lines are rows of x (LINES x KK); else columns: k < LINES rows of KK lines */
                const int64_t lines = lk ? LINES : KK, kc = lk ? KK : LINES - 5;
                const fx__sgemm_mat m = kind ? (fx__sgemm_mat){h, FX__SG_BF16} : (fx__sgemm_mat){x, FX__SG_F32_AS_BF16};
                float want[KK * W > LINES * W ? KK * W : LINES * W], got[sizeof want / sizeof want[0]];
                fx__sgemm_path_scalar.pack(want, fx__sgemm_f32(xr), ld, lk, lines, 2, kc - 2, W, q);
                fx__sgemm_path_scalar.pack(got, m, ld, lk, lines, 2, kc - 2, W, q);
                fxt_bitwise_f32(kind ? "pack bf16 (plain C)" : "pack f32 as bf16 (plain C)", got, want,
                                (size_t)((kc - 2) * W));
                if (avx512) {
                    fx__sgemm_pack_avx512(got, m, ld, lk, lines, 2, kc - 2, W, q);
                    fxt_bitwise_f32(kind ? "pack bf16 (AVX-512)" : "pack f32 as bf16 (AVX-512)", got, want,
                                    (size_t)((kc - 2) * W));
                }
            }
    free(x), free(xr), free(h);
}

/* ---- the tiled paths (vdpbf16ps, AMX) ---------------------------------------------------------- */

#ifdef FXT_HAVE_SIMDE
void fxt_bf16_dp_kernel_simde(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                              int64_t mr, int64_t nr);
#endif

static float lo_of(uint32_t w) { return fx__bf16_to_f32((uint16_t)w); }
static float hi_of(uint32_t w) { return fx__bf16_to_f32((uint16_t)(w >> 16)); }

/* The AMX kernel's contract in plain C (A row by row, B pair by pair, 32 x 32 tiles), so that
   the AMX path's packing and tiling run on any CPU. */
static void amx_contract_kernel(int64_t pairs, const uint32_t *a, const uint32_t *b, float beta, float *C, int64_t ldc,
                                int64_t mr, int64_t nr)
{
    float tile[FX__AMX_MR * FX__AMX_NR];
    for (int64_t r = 0; r < FX__AMX_MR; r++)
        for (int64_t j = 0; j < FX__AMX_NR; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < pairs; p++) {
                const uint32_t wa = a[fx__bf16_row_word(FX__AMX_MR, r, p)], wb = b[p * FX__AMX_NR + j];
                acc += lo_of(wa) * lo_of(wb);
                acc += hi_of(wa) * hi_of(wb);
            }
            tile[r * FX__AMX_NR + j] = acc;
        }
    fx__bf16_tile_store(tile, FX__AMX_NR, beta, C, ldc, mr, nr);
}

/* The paths to test: each contract with a kernel that runs on any CPU (SIMDe's build of the
   vdpbf16ps one, the plain C one above), and the library's own where the CPU has them. */
static int tiled_paths(fx__bf16_tiled *t, const char **name)
{
    int n = 0;
#ifdef FXT_HAVE_SIMDE
    t[n] = fx__bf16_tiled_dp, t[n].kernel = fxt_bf16_dp_kernel_simde, name[n++] = "vdpbf16ps (SIMDe)";
#else
    fprintf(stderr, "  (no SIMDe: the vdpbf16ps kernel's portable build is not tested)\n");
#endif
    t[n] = fx__bf16_tiled_amx, t[n].kernel = amx_contract_kernel, t[n].enter = t[n].leave = NULL,
    name[n++] = "AMX packing (plain C kernel)";
    if (fx__cpu_avx512bf16())
        t[n] = fx__bf16_tiled_dp, name[n++] = "vdpbf16ps (AVX512-BF16)";
    if (fx__cpu_amx_bf16())
        t[n] = fx__bf16_tiled_amx, name[n++] = "AMX-BF16";
    return n;
}

/* Packing: each word holds (x(l, 2p), x(l, 2p+1)) in its low and high halves, zeros past the
   lines, past an odd K and up to the padded pair count, in both orders (pair by pair, row by
   row), both element layouts and operand kinds, a full and a partial panel, both panel widths
   (A's 12 lines, B's 32), and a K that spans several of the packing's steps along a line; the
   pair-by-pair order by each of its loops (plain C, AVX-512, and the AVX-512 sweep of all
   panels in two ranges of pairs, where the CPU has AVX-512), the row-by-row order by both of
   its loops (plain C, AVX-512; whole blocks of 16 pairs). The data hold the special values of
   the rounding, subnormals among them, in both layouts. */
typedef void (*pack_fn)(uint32_t *, fx__bf16_mat, int64_t, bool, int64_t, int64_t, int64_t, int64_t, int64_t);

static void test_gemm_bf16_pack(void)
{
    enum { LD = 140, MAXW = 32, MAXP = 80, PANELS = 2 };
    const int64_t Ks[][2] = {{7, 4}, {7, 16}, {131, 66}, {131, 80}}; /* K, pairs */
    const int64_t Ws[][2] = {{12, 13}, {32, 45}};                     /* width, lines: a full panel, a partial one */
    const bool avx512 = fx_get_isa() == FX_ISA_AVX512;
    const struct { pack_fn fn; const char *name; bool run, rows; } packs[] = {
        {fx__bf16_pack_rows_scalar, "rows (plain C)", true, true},
        {fx__bf16_pack_rows_avx512, "rows (AVX-512)", avx512, true},
        {fx__bf16_pack_pairs_scalar, "pairs (plain C)", true, false},
        {fx__bf16_pack_pairs_avx512, "pairs (AVX-512)", avx512, false},
        {NULL, "pairs (AVX-512 sweep)", avx512, false},
    };
    operand X = operand_new(LD, LD, LD, 7); /* room for either layout */
    /* Special values the rounding must keep: NaN (quiet and signalling), infinities, a tie,
       and subnormals (one that rounds up to a normal, a tie to even, one that rounds to -0),
       on a row and down a column, so that both layouts read them. */
    const uint32_t special[] = {0x7fc00000u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x3f808000u,
                                0x007fffffu, 0x00018000u, 0x80000001u};
    for (size_t s = 0; s < sizeof special / sizeof special[0]; s++)
        X.f[3 * LD + 5 + s] = X.f[(9 + 2 * s) * LD + 11] = float_of(special[s]);
    fx__f32_to_bf16_n_scalar(X.h, X.f, LD * LD);
    const size_t words = PANELS * MAXW * MAXP + 1; /* and a word past the largest operand */
    uint32_t *P = malloc(words * sizeof(uint32_t));
    for (size_t pi = 0; pi < sizeof packs / sizeof packs[0]; pi++) {
        if (!packs[pi].run) {
            fprintf(stderr, "  (no AVX-512 here: %s not tested)\n", packs[pi].name);
            continue;
        }
        const bool rows = packs[pi].rows;
        for (size_t wi = 0; wi < sizeof Ws / sizeof Ws[0]; wi++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                const int64_t W = Ws[wi][0], LINES = Ws[wi][1], K = Ks[ki][0], pairs = Ks[ki][1];
                if (rows && pairs % FX__AMX_PAIRS)
                    continue; /* row by row: whole blocks of 16 pairs */
                for (int lk = 0; lk < 2; lk++)
                    for (int kind = 0; kind < 2; kind++) {
                        if (!packs[pi].fn && lk)
                            continue; /* the sweep packs lines held by rows only */
                        fx__bf16_mat x = kind ? fx__bf16_of(X.h) : fx__bf16_of_f32(X.f);
                        memset(P, 0xab, words * sizeof(uint32_t));
                        if (packs[pi].fn) {
                            for (int64_t q = 0; q < PANELS; q++)
                                packs[pi].fn(P + q * W * pairs, x, LD, lk, LINES, K, pairs, W, q);
                        } else {
                            fx__bf16_pack_pairs_sweep_avx512(P, x, LD, LINES, K, pairs, W, 0, pairs / 2 + 1);
                            fx__bf16_pack_pairs_sweep_avx512(P, x, LD, LINES, K, pairs, W, pairs / 2 + 1, pairs);
                        }
                        size_t bad = 0;
                        for (int64_t q = 0; q < PANELS; q++)
                            for (int64_t p = 0; p < pairs; p++)
                                for (int64_t l = 0; l < W; l++) {
                                    uint32_t want = 0;
                                    for (int64_t h = 0; h < 2; h++) {
                                        const int64_t line = q * W + l, k = 2 * p + h;
                                        if (line < LINES && k < K)
                                            want |= (uint32_t)X.h[lk ? line * LD + k : k * LD + line] << (16 * h);
                                    }
                                    const uint32_t got =
                                        P[q * W * pairs + (rows ? fx__bf16_row_word(W, l, p) : p * W + l)];
                                    if (got != want && !bad++)
                                        FXT_FAIL("%s: width %lld K %lld pairs %lld lk %d kind %d panel %lld word "
                                                 "(%lld, %lld): 0x%08x, want 0x%08x",
                                                 packs[pi].name, (long long)W, (long long)K, (long long)pairs, lk, kind,
                                                 (long long)q, (long long)p, (long long)l, got, want);
                                }
                        if (P[PANELS * W * pairs] != 0xabababab)
                            FXT_FAIL("%s: width %lld K %lld pairs %lld: the packing wrote past its operand",
                                     packs[pi].name, (long long)W, (long long)K, (long long)pairs);
                    }
            }
    }
    free(P);
    operand_free(&X);
}

static void gemm_tiled(const void *ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, fx__bf16_mat A, int64_t lda,
                       fx__bf16_mat B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const fx__bf16_tiled *t = ctx;
    uint32_t *ws = malloc(fx__bf16_tiled_words(t, M, N, K) * sizeof(uint32_t));
    fx__gemm_bf16_tiled(t, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, ws);
    free(ws);
}

/* Each path through fx__gemm_bf16_tiled against the float64 sums of the rounded inputs, at
   shapes that leave partial tiles in M and N, an odd K and K = 0 (C = beta C), every
   transpose, both operand kinds, beta 0 (over NaN) and 1. */
static void test_gemm_bf16_tiled_against_reference(void)
{
    fx__bf16_tiled path[4];
    const char *name[4];
    const int np = tiled_paths(path, name);
    const int64_t shapes[][3] = {{37, 29, 53}, {1, 17, 300}, {65, 3, 1}, {130, 70, 513},
                                 {12, 32, 8},  {3, 97, 17},  {5, 7, 0}};
    for (int q = 0; q < np; q++) {
        const double unrounded_max =
            reference_sweep(name[q], gemm_tiled, &path[q], shapes, sizeof shapes / sizeof shapes[0], false);
        if (!(unrounded_max > 1e-3))
            FXT_FAIL("%s: the products look like float32 ones (%.3g)", name[q], unrounded_max);
    }
}

/* Each path's results bitwise the same at 1, 2 and 3 threads. */
static void test_gemm_bf16_tiled_deterministic(void)
{
    fx__bf16_tiled path[4];
    const char *name[4];
    const int np = tiled_paths(path, name);
    const int64_t shapes[][3] = {{300, 70, 1000}, {70, 300, 1001}, {513, 129, 257}};
    const int before = fx_get_num_threads();
    for (int q = 0; q < np; q++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            operand A = operand_new(M, K, K, 10 + s), B = operand_new(N, K, K, 20 + s);
            uint32_t *ws = malloc(fx__bf16_tiled_words(&path[q], M, N, K) * sizeof(uint32_t));
            float *C[3];
            for (int r = 0; r < 3; r++) {
                C[r] = fxt_guarded((size_t)(M * N));
                fx_set_num_threads(r + 1);
                fx__gemm_bf16_tiled(&path[q], false, true, M, N, K, fx__bf16_of_f32(A.f), K, fx__bf16_of(B.h), K, 0.0f,
                                    C[r], N, ws);
            }
            fxt_bitwise_f32(name[q], C[0], C[1], (size_t)(M * N));
            fxt_bitwise_f32(name[q], C[0], C[2], (size_t)(M * N));
            for (int r = 0; r < 3; r++)
                fxt_guarded_free("C", C[r]);
            free(ws);
            operand_free(&A), operand_free(&B);
        }
    fx_set_num_threads(before);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_bf16_rounding);
    FXT_RUN(test_bf16_paths_bitwise);
    FXT_RUN(test_gemm_bf16_against_reference);
    FXT_RUN(test_gemm_bf16_deterministic);
    FXT_RUN(test_gemm_bf16_f32_route);
    FXT_RUN(test_sgemm_pack_bf16);
    FXT_RUN(test_gemm_bf16_pack);
    FXT_RUN(test_gemm_bf16_tiled_against_reference);
    FXT_RUN(test_gemm_bf16_tiled_deterministic);
    return fxt_finish();
}
