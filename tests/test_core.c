/* The foundation: status strings, last error, version, logging, threads, CPU path, memory
   accounting, GEMM against its reference, the counter-based RNG, and whole-file reads. */
#include "harness.h"
#include "tmpdir.h"

#include "core/core.h"
#include "core/file.h"
#include "core/finite.h"
#include "core/sgemm.h"

#include <float.h>
#include <limits.h>
#include <math.h>

#include <stdarg.h>
#include <sys/resource.h>

static void test_status_strings(void)
{
    FXT_EQ_STR(fx_strerror(FX_OK), "success");
    FXT_EQ_STR(fx_strerror(FX_EINVAL), "invalid argument");
    FXT_EQ_STR(fx_strerror(FX_ECOMM), "communication failure");
    FXT_EQ_STR(fx_strerror(-1000), "unknown status");
    FXT_EQ_STR(fx_status_name(FX_ETIMEDOUT), "FX_ETIMEDOUT");
    FXT_EQ_STR(fx_status_name(42), "FX_UNKNOWN");
    /* The public contract fixes the values (docs/api.md). */
    FXT_EQ_INT(FX_EINVAL, -1);
    FXT_EQ_INT(FX_ENOMEM, -2);
    FXT_EQ_INT(FX_EIO, -3);
    FXT_EQ_INT(FX_EFORMAT, -4);
    FXT_EQ_INT(FX_ERANGE, -5);
    FXT_EQ_INT(FX_EUNSUPPORTED, -6);
    FXT_EQ_INT(FX_ETIMEDOUT, -7);
    FXT_EQ_INT(FX_ECOMM, -8);
}

static void test_last_error(void)
{
    fx_clear_error();
    FXT_EQ_STR(fx_last_error(), "");
    FXT_EQ_INT(fx__error(FX_ERANGE, "target[%d] = %d is outside [0, %d)", 17, 50300, 50257), FX_ERANGE);
    FXT_EQ_STR(fx_last_error(), "target[17] = 50300 is outside [0, 50257)");
    FXT_EQ_INT(fx__error_context(FX_EFORMAT, "%s", "model.safetensors"), FX_EFORMAT);
    FXT_EQ_STR(fx_last_error(), "model.safetensors: target[17] = 50300 is outside [0, 50257)");
    /* A message longer than the buffer is cut, not overflowed. */
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    fx__error(FX_EINVAL, "%s", big);
    FXT_CHECK(strlen(fx_last_error()) < sizeof big - 1);
    FXT_STATUS(fx_set_num_threads(0), FX_EINVAL, "thread count 0");
}

static void test_version(void)
{
    FXT_EQ_STR(fx_version(), FX_VERSION_STRING);
    char expect[32];
    snprintf(expect, sizeof expect, "%d.%d.%d", FX_VERSION_MAJOR, FX_VERSION_MINOR, FX_VERSION_PATCH);
    FXT_EQ_STR(fx_version(), expect);
}

typedef struct log_capture {
    int calls;
    fx_log_level level;
    char msg[256];
} log_capture;

static void capture(fx_log_level level, const char *msg, void *user)
{
    log_capture *c = user;
    c->calls++;
    c->level = level;
    snprintf(c->msg, sizeof c->msg, "%s", msg);
}

static void test_logging(void)
{
    log_capture c = {0};
    fx__log(FX_LOG_ERROR, "dropped: no hook");
    fx_set_log_callback(capture, &c, FX_LOG_INFO);
    fx__log(FX_LOG_DEBUG, "below the level");
    FXT_EQ_INT(c.calls, 0);
    fx__log(FX_LOG_WARN, "value %d", 7);
    FXT_EQ_INT(c.calls, 1);
    FXT_EQ_INT(c.level, FX_LOG_WARN);
    FXT_EQ_STR(c.msg, "value 7");
    fx_set_log_callback(NULL, NULL, FX_LOG_DEBUG);
    fx__log(FX_LOG_ERROR, "off again");
    FXT_EQ_INT(c.calls, 1);
}

static void test_threads(void)
{
    int before = fx_get_num_threads();
    FXT_OK(fx_set_num_threads(1));
    FXT_EQ_INT(fx_get_num_threads(), 1);
    FXT_OK(fx_set_num_threads(2));
#ifdef _OPENMP
    FXT_EQ_INT(fx_get_num_threads(), 2);
#else
    FXT_EQ_INT(fx_get_num_threads(), 1);
#endif
    FXT_OK(fx_set_num_threads(before));
}

/* More threads than the process may create is refused before OpenMP sees it (libgomp aborts
   at 50000 and crashes at 100000), and the count in effect stays as it was. */
static void test_threads_bound(void)
{
    int before = fx_get_num_threads();
    FXT_STATUS(fx_set_num_threads(100000), FX_EINVAL, "thread count 100000 is more than the bound of");
    FXT_EQ_INT(fx_get_num_threads(), before);
    FXT_STATUS(fx_set_num_threads(INT_MAX), FX_EINVAL, "thread count 2147483647");
    FXT_EQ_INT(fx_get_num_threads(), before);
    /* A lower RLIMIT_NPROC lowers the bound (the soft limit may be lowered and raised back
       up to the hard one). */
    struct rlimit rl, low;
    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 3)) {
        low = rl;
        low.rlim_cur = 3;
        if (setrlimit(RLIMIT_NPROC, &low) == 0) {
            FXT_STATUS(fx_set_num_threads(4), FX_EINVAL, "bound of 3 threads (RLIMIT_NPROC");
            FXT_OK(fx_set_num_threads(3));
            FXT_CHECK(setrlimit(RLIMIT_NPROC, &rl) == 0);
            FXT_OK(fx_set_num_threads(4));
        }
    }
    FXT_OK(fx_set_num_threads(before));
}

static void test_isa(void)
{
    fx_isa best = fx_get_isa();
    FXT_CHECK(best >= FX_ISA_SCALAR && best <= FX_ISA_AVX512);
    FXT_OK(fx_set_isa(FX_ISA_SCALAR));
    FXT_EQ_INT(fx_get_isa(), FX_ISA_SCALAR);
    FXT_EQ_STR(fx_isa_name(FX_ISA_AVX2), "avx2");
    FXT_STATUS(fx_set_isa((fx_isa)7), FX_EINVAL, "isa 7");
    if (best < FX_ISA_AVX512)
        FXT_STATUS(fx_set_isa(FX_ISA_AVX512), FX_EUNSUPPORTED, "avx512");
    FXT_OK(fx_set_isa(best));
}

static void test_alloc_accounting(void)
{
    size_t cur0, peak0, cur1, peak1;
    fx_mem_reset_peak();
    fx_mem_stats(&cur0, &peak0);
    float *p = fx__alloc(1000 * sizeof(float));
    FXT_CHECK(p != NULL);
    FXT_EQ_INT((uintptr_t)p % 64, 0);
    fx_mem_stats(&cur1, &peak1);
    FXT_EQ_INT(cur1 - cur0, 4000);
    FXT_CHECK(peak1 >= cur1);
    fx__free(p);
    fx_mem_stats(&cur1, NULL);
    FXT_EQ_INT(cur1, cur0);
    FXT_CHECK(fx__alloc(SIZE_MAX - 10) == NULL);
    FXT_HAS_STR(fx_last_error(), "overflows");
    FXT_CHECK(fx__calloc(SIZE_MAX / 2, 4) == NULL);
    double *z = fx__calloc(3, sizeof(double));
    FXT_CHECK(z && z[0] == 0.0 && z[2] == 0.0);
    fx__free(z);
    fx__free(NULL);
}

/* The huge-page advice is only a hint: memory already written keeps every byte, at any
   alignment and size (below four huge pages, unaligned ends, NULL), and stays writable. */
static void test_advise_huge_pages(void)
{
    const size_t n = (size_t)11 << 20;
    unsigned char *p = malloc(n);
    FXT_CHECK(p != NULL);
    if (!p)
        return;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131 + (i >> 12));
    fx__advise_huge_pages(p + 4097, n - 5000);
    fx__advise_huge_pages(p + 3, 100);
    fx__advise_huge_pages(NULL, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 131 + (i >> 12)) && bad++ == 0)
            first = i;
    if (bad)
        FXT_FAIL("advise_huge_pages changed %zu bytes, first at %zu", bad, first);
    memset(p, 7, n);
    FXT_CHECK(p[0] == 7 && p[n / 2] == 7 && p[n - 1] == 7);
    free(p);
}

/* Every transpose combination and leading dimensions wider than the matrices. */
static void test_gemm_against_reference(void)
{
    const int64_t M = 37, N = 29, K = 53, pad = 3;
    for (int ta = 0; ta < 2; ta++) {
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            float *A = fxt_random((size_t)(ta ? K : M) * lda, -1, 1, 1);
            float *B = fxt_random((size_t)(tb ? N : K) * ldb, -1, 1, 2);
            float *C0 = fxt_random((size_t)M * ldc, -1, 1, 3);
            float *C = fxt_guarded_copy(C0, (size_t)M * ldc);
            float *R = fxt_guarded_copy(C0, (size_t)M * ldc);
            fx__sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, ldc);
            fx__sgemm_ref(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, R, ldc);
            double *ref = fxt_alloc_f64((size_t)M * ldc);
            for (int64_t i = 0; i < M; i++) {
                for (int64_t j = 0; j < ldc; j++) {
                    ref[i * ldc + j] = C0[i * ldc + j]; /* columns past N are padding: untouched */
                    if (j >= N)
                        continue;
                    double acc = 0;
                    for (int64_t k = 0; k < K; k++)
                        acc += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                    ref[i * ldc + j] = 0.5 * acc + 2.0 * C0[i * ldc + j];
                }
            }
            fxt_close_f32("sgemm", C, ref, (size_t)M * ldc, 1e-5, 1e-5);
            fxt_close_f32("sgemm_ref", R, ref, (size_t)M * ldc, 1e-6, 1e-6);
            fxt_guarded_free("C", C);
            fxt_guarded_free("R", R);
            free(A), free(B), free(C0), free(ref);
        }
    }
}

/* The traces of `bench train --gemm` and `--ops`: a GEMM outside any op is one entry of its
   shape; a GEMM inside an op counts in the op only; nothing counts once the traces stop, or
   inside a parallel region. */
static void test_traces(void)
{
    float a[4 * 8] = {0}, b[8 * 5] = {0}, c[4 * 5];
    fx__gemm_shape shapes[4];
    fx__op_time ops[FX__OP_COUNT];
    fx__gemm_trace_start(shapes, 4);
    fx__op_trace_start(ops);
    fx__sgemm(false, false, 4, 5, 8, 1.0f, a, 8, b, 5, 0.0f, c, 5);
    fx__sgemm(false, false, 4, 5, 8, 1.0f, a, 8, b, 5, 0.0f, c, 5);
    double t0 = fx__op_begin();
    FXT_CHECK(t0 >= 0.0);
    FXT_CHECK(fx__op_begin() < 0.0); /* nested: timed by the outer call */
    fx__sgemm(true, false, 8, 5, 4, 1.0f, a, 8, b, 5, 0.0f, c, 5);
    fx__op_end(FX__OP_NORM, t0);
#ifdef _OPENMP
    int inner = 0;
#pragma omp parallel num_threads(2) reduction(+ : inner)
    inner += fx__op_begin() >= 0.0 || fx__gemm_trace_begin() >= 0.0;
    FXT_EQ_INT(inner, 0);
#endif
    int64_t dropped = -1;
    const int n = fx__gemm_trace_stop(&dropped);
    fx__op_trace_stop();
    FXT_EQ_INT(n, 1);
    FXT_EQ_INT(dropped, 0);
    FXT_CHECK(!shapes[0].ta && shapes[0].M == 4 && shapes[0].N == 5 && shapes[0].K == 8);
    FXT_EQ_INT(shapes[0].calls, 2);
    FXT_EQ_INT(ops[FX__OP_NORM].calls, 1);
    FXT_CHECK(ops[FX__OP_NORM].seconds >= 0.0);
    for (int op = 0; op < FX__OP_COUNT; op++)
        if (op != FX__OP_NORM)
            FXT_EQ_INT(ops[op].calls, 0);
    FXT_CHECK(fx__op_begin() < 0.0 && fx__gemm_trace_begin() < 0.0); /* both stopped */
    FXT_EQ_STR(fx__op_name(FX__OP_ATTN_BWD), "attention backward");
}

/* beta = 0 must overwrite, NaN included, as BLAS does. */
static void test_gemm_beta_zero(void)
{
    float A[4] = {1, 2, 3, 4}, B[4] = {1, 0, 0, 1}, C[4] = {NAN, NAN, NAN, NAN}, R[4] = {NAN, NAN, NAN, NAN};
    fx__sgemm(false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, C, 2);
    fx__sgemm_ref(false, false, 2, 2, 2, 1.0f, A, 2, B, 2, 0.0f, R, 2);
    for (int i = 0; i < 4; i++) {
        FXT_NEAR(C[i], A[i], 0, 0);
        FXT_NEAR(R[i], A[i], 0, 0);
    }
}

/* Known-answer vectors of the Random123 distribution (kat_vectors, philox4x32 10 rounds). */
static void test_philox_known_answers(void)
{
    struct { uint32_t ctr[4], key[2], out[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t t = 0; t < sizeof kat / sizeof kat[0]; t++) {
        uint32_t out[4];
        fx_philox4x32(kat[t].ctr, kat[t].key, out);
        for (int i = 0; i < 4; i++)
            FXT_EQ_INT(out[i], kat[t].out[i]);
    }
}

static void test_rng_streams(void)
{
    fx_rng a, b, c;
    fx_rng_init(&a, 42, 0);
    fx_rng_init(&b, 42, 0);
    fx_rng_init(&c, 42, 1);
    int same_c = 0;
    for (int i = 0; i < 100; i++) {
        uint32_t x = fx_rng_u32(&a), y = fx_rng_u32(&b), z = fx_rng_u32(&c);
        FXT_EQ_INT(x, y);
        same_c += x == z;
    }
    FXT_CHECK(same_c < 3);
    /* Saving and restoring the struct continues the sequence. */
    fx_rng saved = a;
    uint32_t next = fx_rng_u32(&a);
    FXT_EQ_INT(fx_rng_u32(&saved), next);

    /* Moments of the distributions, loosely. */
    fx_rng r;
    fx_rng_init(&r, 7, 0);
    double su = 0, sn = 0, sn2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = fx_rng_uniform(&r);
        FXT_CHECK(u >= 0.0f && u < 1.0f);
        su += u;
        float g = fx_rng_normal(&r);
        FXT_CHECK(isfinite(g));
        sn += g, sn2 += (double)g * g;
    }
    FXT_NEAR(su / n, 0.5, 0.01, 0);
    FXT_NEAR(sn / n, 0.0, 0.01, 0);
    FXT_NEAR(sn2 / n, 1.0, 0.02, 0);
}

/* Filling is the same at 1 and 2 threads, and element i does not depend on n. */
static void test_rng_fill_thread_independent(void)
{
    const int64_t n = 100003;
    float *a = fxt_guarded(n), *b = fxt_guarded(n), *c = fxt_guarded(n - 1);
    int before = fx_get_num_threads();
    fx_set_num_threads(1);
    fx_rng_fill_normal(a, n, 0.02f, 99, 3);
    fx_set_num_threads(2);
    fx_rng_fill_normal(b, n, 0.02f, 99, 3);
    fx_rng_fill_normal(c, n - 1, 0.02f, 99, 3);
    fxt_bitwise_f32("fill_normal 1 vs 2 threads", a, b, n);
    fxt_bitwise_f32("fill_normal prefix", a, c, n - 1);
    fx_set_num_threads(1);
    fx_rng_fill_uniform(a, n, -2, 3, 5, 0);
    fx_set_num_threads(2);
    fx_rng_fill_uniform(b, n, -2, 3, 5, 0);
    fxt_bitwise_f32("fill_uniform 1 vs 2 threads", a, b, n);
    for (int64_t i = 0; i < n; i++)
        FXT_CHECK(a[i] >= -2 && a[i] <= 3);
    fx_set_num_threads(before);
    fxt_guarded_free("a", a);
    fxt_guarded_free("b", b);
    fxt_guarded_free("c", c);
}

/* C computed block by block (random row or column blocks, each its own call) is bitwise C
   computed by one call: what lets fx__sgemm cut C into one block per thread (gemm.c). */
static void gemm_by_blocks(bool ta, bool tb, bool rows, int64_t M, int64_t N, int64_t K, const float *A,
                           const float *B, float *C, uint64_t seed)
{
    const int64_t lda = ta ? M : K, ldb = tb ? K : N, dim = rows ? M : N;
    for (int64_t lo = 0, len; lo < dim; lo += len) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        len = 1 + (int64_t)((seed >> 33) % 97);
        len = len < dim - lo ? len : dim - lo;
        if (rows)
            fx__sgemm(ta, tb, len, N, K, 1.0f, ta ? A + lo : A + lo * lda, lda, B, ldb, 0.0f, C + lo * N, N);
        else
            fx__sgemm(ta, tb, M, len, K, 1.0f, A, lda, tb ? B + lo * ldb : B + lo, ldb, 0.0f, C + lo, N);
    }
}

/* Long K, both split directions and transposes: bitwise equal at 1, 2 and 3 threads, and to
   the same product computed in random row blocks and in random column blocks. */
static void test_gemm_thread_independent(void)
{
    const int64_t shapes[][3] = {{300, 70, 1000}, {70, 300, 1000}, {1, 2000, 777}, {513, 129, 2049}};
    int before = fx_get_num_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int t = 0; t < 4; t++) {
            bool ta = t & 1, tb = t & 2;
            float *A = fxt_random((size_t)(M * K), -1, 1, 10 + s), *B = fxt_random((size_t)(K * N), -1, 1, 20 + s);
            float *C1 = fxt_guarded((size_t)(M * N)), *C2 = fxt_guarded((size_t)(M * N));
            fx_set_num_threads(1);
            fx__sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C1, N);
            for (int nt = 2; nt <= 3; nt++) {
                fx_set_num_threads(nt);
                fx__sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, C2, N);
                fxt_bitwise_f32(nt == 2 ? "sgemm 1 vs 2 threads" : "sgemm 1 vs 3 threads", C1, C2, (size_t)(M * N));
            }
            fx_set_num_threads(1);
            gemm_by_blocks(ta, tb, true, M, N, K, A, B, C2, 7 + s);
            fxt_bitwise_f32("sgemm in row blocks", C1, C2, (size_t)(M * N));
            gemm_by_blocks(ta, tb, false, M, N, K, A, B, C2, 9 + s);
            fxt_bitwise_f32("sgemm in column blocks", C1, C2, (size_t)(M * N));
            fxt_guarded_free("C1", C1);
            fxt_guarded_free("C2", C2);
            free(A), free(B);
        }
    }
    fx_set_num_threads(before);
}

/* C0 [M, ldc] against 0.5 op(A) op(B) + beta C0 in float64 into ref; returns the largest sum
   of the terms' magnitudes (the scale of a float32 sum's rounding). */
static double gemm_ref_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, const float *C0, int64_t ldc, double *ref)
{
    double bound = 0.0;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < ldc; j++) {
            ref[i * ldc + j] = C0[i * ldc + j]; /* columns past N: untouched */
            if (j >= N)
                continue;
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                const double p = (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                acc += p, mag += fabs(p);
            }
            ref[i * ldc + j] = 0.5 * acc + (beta == 0.0f ? 0.0 : (double)beta * C0[i * ldc + j]);
            bound = fmax(bound, mag);
        }
    }
    return bound;
}

/* One shape and transposition of test_gemm_tiled_paths. */
static void check_gemm_tiled(bool ta, bool tb, int64_t M, int64_t N, int64_t K, uint64_t seed)
{
    if (M < 1 || M > 4096 || N < 1 || N > 4096 || K < 0 || K > 4096) {
        FXT_FAIL("shape %lld x %lld x %lld outside the test's range", (long long)M, (long long)N, (long long)K);
        return;
    }
    const int64_t pad = 3, lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * (size_t)lda, nb = (size_t)(tb ? N : K) * (size_t)ldb;
    const size_t nc = (size_t)M * (size_t)ldc;
    const float betas[] = {0.0f, 1.0f, -0.75f};
    const bool avx512 = fx_get_isa() == FX_ISA_AVX512;
    float *A = fxt_random(na ? na : 1, -1, 1, seed), *B = fxt_random(nb ? nb : 1, -1, 1, seed + 1);
    float *C0 = fxt_random(nc, -1, 1, seed + 2), *ws = fxt_guarded(fx__sgemm_tiled_ws(M, N, K)); /* no write past it */
    double *ref = fxt_alloc_f64(nc);
    FXT_CHECK(ws != NULL);
    for (size_t bi = 0; bi < sizeof betas / sizeof betas[0]; bi++) {
        const float beta = betas[bi];
        float *C = fxt_guarded_copy(C0, nc), *C3 = fxt_guarded_copy(C0, nc), *CV = fxt_guarded_copy(C0, nc);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N && beta == 0.0f; j++)
                C[i * ldc + j] = C3[i * ldc + j] = CV[i * ldc + j] = NAN; /* must not survive */
        const double bound = gemm_ref_f64(ta, tb, M, N, K, A, lda, B, ldb, beta, C0, ldc, ref);
        fx_set_num_threads(1);
        fx__sgemm_tiled(&fx__sgemm_path_scalar, FX__SG_AUTO, ta, tb, M, N, K, 0.5f, fx__sgemm_f32(A), lda,
                        fx__sgemm_f32(B), ldb, beta, C, ldc, ws);
        /* a float32 sum of K terms: a few ulps of the sum of their magnitudes per term */
        fxt_close_f32("tiled (plain C)", C, ref, nc, 1e-6 + 4.0 * FLT_EPSILON * (double)K * bound, 0.0);
        /* Every scheme, whichever the shape would take, on 3 threads and on the AVX-512 path. */
        static const fx__sgemm_scheme schemes[] = {FX__SG_BOTH, FX__SG_SHARE_A, FX__SG_SHARE_B};
        static const char *names[] = {"both packed", "A shared", "B shared"};
        for (size_t si = 0; si < 3; si++) {
            fx_set_num_threads(3);
            memcpy(C3, C0, nc * sizeof(float)), memcpy(CV, C0, nc * sizeof(float));
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N && beta == 0.0f; j++)
                    C3[i * ldc + j] = CV[i * ldc + j] = NAN;
            fx__sgemm_tiled(&fx__sgemm_path_scalar, schemes[si], ta, tb, M, N, K, 0.5f, fx__sgemm_f32(A), lda,
                            fx__sgemm_f32(B), ldb, beta, C3, ldc, ws);
            if (!fxt_bitwise_f32(names[si], C, C3, nc))
                printf("  plain C on 3 threads, %lld x %lld x %lld\n", (long long)M, (long long)N, (long long)K);
            if (avx512) {
                fx__sgemm_tiled(&fx__sgemm_path_avx512, schemes[si], ta, tb, M, N, K, 0.5f, fx__sgemm_f32(A), lda,
                                fx__sgemm_f32(B), ldb, beta, CV, ldc, ws);
                if (!fxt_bitwise_f32(names[si], C, CV, nc))
                    printf("  AVX-512 vs plain C, %lld x %lld x %lld\n", (long long)M, (long long)N, (long long)K);
            }
        }
        fxt_guarded_free("C", C);
        fxt_guarded_free("C3", C3);
        fxt_guarded_free("CV", CV);
    }
    fxt_guarded_free("ws", ws);
    free(A), free(B), free(C0), free(ref);
}

/* The float32 GEMM's tiled path (sgemm.h) on its plain C twin, which runs on any CPU: against
   float64 sums at shapes with partial tiles, K across several blocks and K = 0, A panels in
   several groups, every transpose, leading dimensions wider than the matrices, beta 0 over
   NaN, 1 and -0.75; and every packing scheme, on 3 threads, bitwise as the automatic one on 1
   (3 threads take fewer where a streamed operand has fewer panels). Where the CPU has AVX-512,
   the AVX-512 path must give the twin's bits exactly (the same packing, the same fused
   multiply-add chains). */
static void test_gemm_tiled_paths(void)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {13, 33, 7}, {12, 32, FX__SG_KC}, {25, 65, FX__SG_KC + 1},
                                 {37, 29, 2 * FX__SG_KC + 77}, {5, 100, 0}, {64, 17, 300},
                                 {529, 40, FX__SG_KC + 88}}; /* the last: two groups of A panels, 23 and 22 */
    const int before = fx_get_num_threads();
    if (fx_get_isa() != FX_ISA_AVX512)
        printf("  (no AVX-512 on this CPU: the plain C twin only)\n");
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            check_gemm_tiled(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], 100 + 10 * s);
    fx_set_num_threads(before);
}

/* One shape and transposition of test_gemm_thin_path. */
static void check_gemm_thin(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, uint64_t seed)
{
    if (M < 1 || M > 4096 || N < 1 || N > 4096 || K < 0 || K > 4096 || !fx__sgemm_thin_fits(M, N)) {
        FXT_FAIL("shape %lld x %lld x %lld outside the test's range", (long long)M, (long long)N, (long long)K);
        return;
    }
    const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + 2;
    const size_t na = (size_t)(ta ? K : M) * (size_t)lda, nb = (size_t)(tb ? N : K) * (size_t)ldb;
    const size_t nc = (size_t)M * (size_t)ldc;
    const float betas[] = {0.0f, 1.0f, -0.75f};
    float *A = fxt_random(na ? na : 1, -1, 1, seed), *B = fxt_random(nb ? nb : 1, -1, 1, seed + 1);
    float *C0 = fxt_random(nc, -1, 1, seed + 2), *ws = fxt_guarded(fx__sgemm_tiled_ws(M, N, K));
    float *wt = fxt_guarded(fx__sgemm_thin_ws(M, N, K, 3)); /* no write past it */
    for (size_t bi = 0; bi < sizeof betas / sizeof betas[0]; bi++) {
        const float beta = betas[bi];
        float *C = fxt_guarded_copy(C0, nc), *CT = fxt_guarded_copy(C0, nc);
        for (int64_t i = 0; i < M && beta == 0.0f; i++)
            for (int64_t j = 0; j < N; j++)
                C[i * ldc + j] = NAN; /* must not survive */
        fx_set_num_threads(1);
        fx__sgemm_tiled(&fx__sgemm_path_avx512, FX__SG_AUTO, ta, tb, M, N, K, 0.5f, fx__sgemm_f32(A), lda,
                        fx__sgemm_f32(B), ldb, beta, C, ldc, ws);
        for (int nt = 1; nt <= 3; nt += 2) {
            fx_set_num_threads(nt);
            memcpy(CT, C0, nc * sizeof(float));
            for (int64_t i = 0; i < M && beta == 0.0f; i++)
                for (int64_t j = 0; j < N; j++)
                    CT[i * ldc + j] = NAN;
            fx__sgemm_thin(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, beta, CT, ldc, wt);
            if (!fxt_bitwise_f32("thin vs tiled", C, CT, nc))
                printf("  %lld x %lld x %lld, ta %d tb %d, beta %g, %d threads\n", (long long)M, (long long)N,
                       (long long)K, ta, tb, (double)beta, nt);
        }
        fxt_guarded_free("C", C);
        fxt_guarded_free("CT", CT);
    }
    fxt_guarded_free("ws", ws);
    fxt_guarded_free("wt", wt);
    free(A), free(B), free(C0);
}

/* The thin path (sgemm.h) against the tiled one on the AVX-512 path: the same bits at thin
   widths from 1 to FX__SG_THIN_MAX (one, two and three vectors, partial ones), C transposed
   where M is the thin side, the wide side read in place and packed, partial wide tiles, K
   across blocks and K = 0, every transpose, padded leading dimensions, beta 0 over NaN, 1 and
   -0.75, on 1 and 3 threads. */
static void test_gemm_thin_path(void)
{
    if (fx_get_isa() != FX_ISA_AVX512) {
        printf("  (no AVX-512 on this CPU: no thin path)\n");
        return;
    }
    /* M, N, K and the operands' padding (their lines 1024 floats apart in the 13th and 14th: a
       wide side whose rows would crowd L1, packed where the thin side is two vectors or
       more; the last five, one vector, lines 256 to 1536 floats apart: narrow tiles read in
       place, 8 or 4 lines, and a partial last tile) */
    const int64_t shapes[][4] = {{100, 1, 7, 3},     {97, 16, FX__SG_KC + 1, 3},      {200, 17, 300, 5},
                                 {140, 33, 64, 3},   {150, 32, 2 * FX__SG_KC + 5, 1}, {333, 48, 100, 3},
                                 {64, 16, 0, 3},     {16, 300, FX__SG_KC + 9, 3},     {1, 50, 40, 3},
                                 {9, 97, 1000, 5},   {20, 100, 50, 3},                {40, 200, FX__SG_KC + 3, 3},
                                 {100, 20, 700, 324}, {10, 120, 600, 424},               {101, 16, 700, 836},
                                 {103, 9, 600, 424},  {90, 12, 300, 212},                {77, 5, 200, 56},
                                 {7, 99, 600, 424}};
    const int before = fx_get_num_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++)
            check_gemm_thin(t & 1, t & 2, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], 300 + 10 * s);
    fx_set_num_threads(before);
}

/* The harness itself: a guard that is overwritten must be caught. */
/* The finite check: every path finds the first NaN or infinity at every position and
   alignment (vector body and scalar tail), and returns -1 for finite data including the
   largest values and subnormals. Other dtypes are tested on their bits. */
static void test_first_nonfinite(void)
{
    enum { N = 300 };
    float *x = fxt_random(N + 1, -1e38f, 1e38f, 7);
    x[5] = FLT_MAX, x[6] = -FLT_MAX, x[7] = 1e-45f;
    static const fx_isa isas[] = {FX_ISA_SCALAR, FX_ISA_AVX2, FX_ISA_AVX512};
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    fx_isa best = fx_get_isa();
    for (size_t t = 0; t < 3; t++) {
        if (fx_set_isa(isas[t]) != FX_OK)
            continue;
        for (int off = 0; off < 2; off++) {
            float *y = x + off;
            FXT_CHECK(fx__first_nonfinite_f32(y, N) == -1);
            for (int i = 0; i < N; i += 1 + i / 40)
                for (size_t b = 0; b < 4; b++) {
                    float keep = y[i];
                    y[i] = bad[b];
                    y[N - 1] = NAN; /* a later one must not be reported first */
                    int64_t got = fx__first_nonfinite_f32(y, N);
                    if (got != i)
                        FXT_FAIL("[%s] offset %d: bad value at %d, found %lld", fx_isa_name(isas[t]), off, i,
                                 (long long)got);
                    y[i] = keep;
                    y[N - 1] = 0.5f;
                }
        }
    }
    fx_set_isa(best);
    uint16_t h[4] = {0x3c00, 0x7bff, 0x7c00, 0}; /* F16: 1, 65504, +inf */
    FXT_CHECK(fx__first_nonfinite(h, FX_DT_F16, 4) == 2);
    FXT_EQ_STR(fx__nonfinite_name(h, FX_DT_F16, 2), "+Inf");
    uint16_t bf[3] = {0x3f80, 0xff81, 0}; /* BF16: 1, NaN */
    FXT_CHECK(fx__first_nonfinite(bf, FX_DT_BF16, 3) == 1);
    FXT_EQ_STR(fx__nonfinite_name(bf, FX_DT_BF16, 1), "NaN");
    double d[2] = {1e308, -INFINITY};
    FXT_CHECK(fx__first_nonfinite(d, FX_DT_F64, 2) == 1);
    FXT_EQ_STR(fx__nonfinite_name(d, FX_DT_F64, 1), "-Inf");
    uint8_t e4[3] = {0x7e, 0xfe, 0xff}; /* E4M3: 448, -448, NaN */
    FXT_CHECK(fx__first_nonfinite(e4, FX_DT_F8_E4M3, 3) == 2);
    uint8_t e5[2] = {0x7b, 0x7c}; /* E5M2: 57344, +inf */
    FXT_CHECK(fx__first_nonfinite(e5, FX_DT_F8_E5M2, 2) == 1);
    int32_t i32[2] = {-1, 0x7fffffff};
    FXT_CHECK(fx__first_nonfinite(i32, FX_DT_I32, 2) == -1);
    free(x);
}

static void test_harness_catches_guard_overwrite(void)
{
    float *p = fxt_guarded(8);
    p[8] = 1.0f; /* one past the end, inside the guard zone */
    int before = fxt_failed_checks;
    fprintf(stderr, "(an expected guard failure follows)\n");
    fxt_guards_ok("p", p);
    FXT_EQ_INT(fxt_failed_checks, before + 1);
    fxt_failed_checks = before; /* the failure was the point */
    p[8] = (float)NAN;
    uint32_t bits = FXT_GUARD_BITS;
    memcpy(&p[8], &bits, sizeof bits);
    fxt_guarded_free("p", p);
}

/* fx__read_regular: the whole file, NUL-terminated; the size limit; missing files,
   directories and FIFOs refused at once with the outputs untouched. */
static void test_read_regular(void)
{
    char dir[512], path[600], fifo[600], missing[600];
    fxt_make_tmpdir(dir, sizeof dir, "flexc_core");
    snprintf(path, sizeof path, "%s/text", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    snprintf(missing, sizeof missing, "%s/missing", dir);
    const char text[] = "{\"a\": 1}\nsecond line";
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f && fwrite(text, 1, sizeof text - 1, f) == sizeof text - 1);
    if (f)
        fclose(f);
    char *buf = NULL;
    size_t len = 0;
    FXT_OK(fx__read_regular(&buf, &len, path, sizeof text - 1));
    FXT_EQ_INT((long long)len, (long long)(sizeof text - 1));
    if (buf) {
        FXT_CHECK(memcmp(buf, text, sizeof text - 1) == 0 && buf[len] == '\0');
        fx__free(buf);
    }
    char *keep = (char *)&len;
    buf = keep, len = 7;
    FXT_STATUS(fx__read_regular(&buf, &len, path, sizeof text - 2), FX_EFORMAT, "-byte limit");
    FXT_STATUS(fx__read_regular(&buf, &len, missing, 1000), FX_EIO, "cannot open: No such file");
    FXT_STATUS(fx__read_regular(&buf, &len, dir, 1000), FX_EIO, "not a regular file");
    FXT_CHECK(mkfifo(fifo, 0600) == 0);
    alarm(20); /* a FIFO with no writer would block a plain open forever */
    FXT_STATUS(fx__read_regular(&buf, &len, fifo, 1000), FX_EIO, "not a regular file");
    alarm(0);
    FXT_CHECK(buf == keep && len == 7);
    /* An empty file: an empty string. */
    f = fopen(path, "wb");
    if (f)
        fclose(f);
    FXT_OK(fx__read_regular(&buf, &len, path, 0));
    FXT_CHECK(buf != keep && len == 0 && buf && buf[0] == '\0');
    if (buf != keep)
        fx__free(buf);
    fxt_rm_tree(dir);
}

/* Writes text to dir/name. */
static void write_text(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f && fputs(text, f) >= 0);
    if (f)
        fclose(f);
}

static void test_mem_parse(void)
{
    uint64_t v = 7;
    FXT_CHECK(fx__mem_parse_meminfo("MemTotal:       24567890 kB\nMemFree:        19000000 kB\n"
                                    "MemAvailable:   24020008 kB\nBuffers:  1 kB\n", &v));
    FXT_EQ_INT(v, 24020008ull * 1024);
    v = 7;
    FXT_CHECK(!fx__mem_parse_meminfo("MemTotal: 1 kB\nMemFree: 1 kB\n", &v)); /* kernels before 3.14 */
    FXT_CHECK(!fx__mem_parse_meminfo("MemAvailable: lots\n", &v));
    FXT_EQ_INT(v, 7);
    /* v2: memory.max, memory.current, memory.stat; inactive file cache is given back on demand. */
    FXT_CHECK(!fx__mem_parse_cgroup("max\n", "536870912\n", NULL, &v));
    FXT_CHECK(fx__mem_parse_cgroup("1073741824\n", "536870912\n", NULL, &v));
    FXT_EQ_INT(v, 536870912);
    FXT_CHECK(fx__mem_parse_cgroup("1073741824\n", "536870912\n", "anon 400000000\nfile 130000000\n"
                                   "active_file 20000000\ninactive_file 104857600\n", &v));
    FXT_EQ_INT(v, 1073741824 - (536870912 - 104857600));
    /* v1: no limit is 2^63 - 1 rounded down to a page; the hierarchical counter comes first. */
    FXT_CHECK(!fx__mem_parse_cgroup("9223372036854771712\n", "30826496\n", NULL, &v));
    FXT_CHECK(fx__mem_parse_cgroup("4294967296\n", "1000000000\n", "inactive_file 1\ntotal_inactive_file 200000000\n",
                                   &v));
    FXT_EQ_INT(v, 4294967296 - 800000000);
    /* Over the limit: no room. Text that is not a number: no limit read. */
    FXT_CHECK(fx__mem_parse_cgroup("1000\n", "5000\n", NULL, &v));
    FXT_EQ_INT(v, 0);
    FXT_CHECK(!fx__mem_parse_cgroup("12k\n", "5000\n", NULL, &v));
    FXT_CHECK(!fx__mem_parse_cgroup("1000\n", "-5\n", NULL, &v));
    FXT_CHECK(!fx__mem_parse_cgroup("", "", NULL, &v));
}

static void test_mem_probe(void)
{
    char dir[512], root[600], d[700], mi[600], self[600];
    fxt_make_tmpdir(dir, sizeof dir, "flexc_mem");
    snprintf(root, sizeof root, "%s/cg", dir);
    snprintf(mi, sizeof mi, "%s/meminfo", dir);
    snprintf(self, sizeof self, "%s/self", dir);
    fx__mem_files f = {mi, self, root};
    fx__mem_avail a;
    /* Nothing readable: unknown, and no check. */
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes == UINT64_MAX, 1);
    FXT_EQ_STR(a.source, "unknown");
    write_text(dir, "meminfo", "MemTotal: 16000000 kB\nMemAvailable:    8000000 kB\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 8000000ull * 1024);
    FXT_EQ_STR(a.source, "MemAvailable");
    /* v2: the process in /job/task, whose limit is "max"; its parent's limit binds. */
    write_text(dir, "self", "0::/job/task\n");
    FXT_CHECK(mkdir(root, 0700) == 0);
    write_text(root, "cgroup.controllers", "cpu memory pids\n");
    snprintf(d, sizeof d, "%s/job", root);
    FXT_CHECK(mkdir(d, 0700) == 0);
    write_text(d, "memory.max", "2000000000\n");
    write_text(d, "memory.current", "600000000\n");
    write_text(d, "memory.stat", "anon 500000000\ninactive_file 100000000\n");
    snprintf(d, sizeof d, "%s/job/task", root);
    FXT_CHECK(mkdir(d, 0700) == 0);
    write_text(d, "memory.max", "max\n");
    write_text(d, "memory.current", "400000000\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 1500000000);
    FXT_EQ_STR(a.source, "cgroup v2 memory.max - memory.current");
    /* A tighter limit on the process's own cgroup wins. */
    write_text(d, "memory.max", "1000000000\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 600000000);
    /* MemAvailable below the cgroup's room: MemAvailable. */
    write_text(dir, "meminfo", "MemAvailable:  500000 kB\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 512000000);
    FXT_EQ_STR(a.source, "MemAvailable");
    /* Under a cgroup namespace the path is not below the mount: the mount's root is the process's
       cgroup (here without a limit of its own). */
    write_text(dir, "meminfo", "MemAvailable:  8000000 kB\n");
    write_text(dir, "self", "0::/elsewhere/job\n");
    write_text(root, "memory.max", "3000000000\n");
    write_text(root, "memory.current", "1000000000\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 2000000000);
    FXT_EQ_STR(a.source, "cgroup v2 memory.max - memory.current");
    fxt_rm_tree(root);
    /* v1 (beside an empty v2 hierarchy): the memory controller's line, with others on it. */
    write_text(dir, "self", "9:name=systemd:/\n4:cpuacct,memory:/grp\n0::/\n");
    FXT_CHECK(mkdir(root, 0700) == 0);
    snprintf(d, sizeof d, "%s/memory", root);
    FXT_CHECK(mkdir(d, 0700) == 0);
    write_text(d, "memory.limit_in_bytes", "9223372036854771712\n");
    write_text(d, "memory.usage_in_bytes", "9000000000\n");
    snprintf(d, sizeof d, "%s/memory/grp", root);
    FXT_CHECK(mkdir(d, 0700) == 0);
    write_text(d, "memory.limit_in_bytes", "3000000000\n");
    write_text(d, "memory.usage_in_bytes", "1000000000\n");
    write_text(d, "memory.stat", "cache 10\ntotal_inactive_file 250000000\n");
    fx__mem_probe(&a, &f);
    FXT_EQ_INT(a.bytes, 2250000000);
    FXT_EQ_STR(a.source, "cgroup v1 memory.limit_in_bytes - memory.usage_in_bytes");
    /* A FIFO where a file should be is skipped, not waited on. */
    unlink(mi);
    FXT_CHECK(mkfifo(mi, 0600) == 0);
    alarm(20);
    fx__mem_probe(&a, &f);
    alarm(0);
    FXT_EQ_INT(a.bytes, 2250000000);
    fxt_rm_tree(dir);
}

static void test_mem_check(void)
{
    fx__mem_avail a;
    FXT_CHECK(fx__mem_resident() > 0);
    setenv("FLEXC_MEM_AVAILABLE", "1000000", 1);
    FXT_OK(fx__mem_available(&a));
    FXT_EQ_INT(a.bytes, 1000000);
    FXT_EQ_STR(a.source, "FLEXC_MEM_AVAILABLE");
    FXT_EQ_INT(fx__mem_room(&a, 50), 900050);
    /* 90% of it, and what the caller holds already. */
    FXT_OK(fx__mem_check(900000, 0, "a run", NULL, NULL));
    FXT_STATUS(fx__mem_check(900001, 0, "a run", "all of it", &a), FX_ENOMEM,
               "a run needs 0.90 MB of memory (all of it), and 0.90 MB is available (90% of FLEXC_MEM_AVAILABLE)");
    FXT_EQ_INT(a.bytes, 1000000);
    FXT_OK(fx__mem_check(1400000, 500000, "a run", NULL, NULL));
    FXT_STATUS(fx__mem_check(3000000000, 0, "training", NULL, NULL), FX_ENOMEM,
               "training needs 3.00 GB of memory, and 0.90 MB is available");
    /* Turned off: by the process, or by FLEXC_NO_MEMORY_CHECK. */
    fx__mem_set_check(false);
    FXT_OK(fx__mem_check(3000000000, 0, "training", NULL, NULL));
    fx__mem_set_check(true);
    setenv("FLEXC_NO_MEMORY_CHECK", "1", 1);
    FXT_OK(fx__mem_check(3000000000, 0, "training", NULL, NULL));
    setenv("FLEXC_NO_MEMORY_CHECK", "0", 1);
    FXT_CHECK(fx__mem_check(3000000000, 0, "training", NULL, NULL) == FX_ENOMEM);
    unsetenv("FLEXC_NO_MEMORY_CHECK");
    setenv("FLEXC_MEM_AVAILABLE", "12x", 1);
    FXT_STATUS(fx__mem_available(&a), FX_EINVAL, "FLEXC_MEM_AVAILABLE='12x' is not a number of bytes");
    unsetenv("FLEXC_MEM_AVAILABLE");
    FXT_OK(fx__mem_available(&a));
    FXT_CHECK(strcmp(a.source, "FLEXC_MEM_AVAILABLE") != 0);
}

/* fx_abi_layout: the table's answers are the compiler's sizeof and offsetof, for the structs
   and a few fields, including the last field of each call struct (a field added without its
   line would leave it, or the size, wrong); the field list is in declaration order and ends;
   unknown names are refused with a message. tests/python/test_abi.py checks every ctypes
   mirror against the same table. */
static void test_abi_layout(void)
{
    size_t off = 99, size = 0;
    FXT_OK(fx_abi_layout("fx_attention", NULL, &off, &size));
    FXT_EQ_INT(off, 0);
    FXT_EQ_INT(size, sizeof(fx_attention));
    FXT_OK(fx_abi_layout("fx_attention", "dtype", &off, &size));
    FXT_EQ_INT(off, offsetof(fx_attention, dtype));
    FXT_EQ_INT(size, sizeof(fx_dtype));
    FXT_OK(fx_abi_layout("fx_attention", "scale", &off, &size));
    FXT_EQ_INT(off, offsetof(fx_attention, scale));
    FXT_EQ_INT(size, sizeof(float));
    FXT_OK(fx_abi_layout("fx_lce", NULL, NULL, &size));
    FXT_EQ_INT(size, sizeof(fx_lce));
    FXT_OK(fx_abi_layout("fx_lce", "stream", &off, NULL));
    FXT_EQ_INT(off, offsetof(fx_lce, stream));
    FXT_OK(fx_abi_layout("fx_score_rel_bias_ctx", "heads", &off, &size));
    FXT_EQ_INT(off, offsetof(fx_score_rel_bias_ctx, heads));
    FXT_EQ_INT(size, sizeof(int64_t));
    FXT_OK(fx_abi_layout("fx_mask_pair_ctx", NULL, NULL, &size));
    FXT_EQ_INT(size, sizeof(fx_mask_pair_ctx));
    /* Every struct: its fields lie inside it, in ascending order, without overlapping. */
    int nstructs = 0;
    for (size_t i = 0; fx_abi_struct(i); i++, nstructs++) {
        const char *s = fx_abi_struct(i);
        size_t total, end = 0;
        FXT_OK(fx_abi_layout(s, NULL, NULL, &total));
        int nfields = 0;
        for (size_t j = 0; fx_abi_field(s, j); j++, nfields++) {
            FXT_OK(fx_abi_layout(s, fx_abi_field(s, j), &off, &size));
            if (off < end || off + size > total || size == 0)
                FXT_FAIL("%s.%s: offset %zu size %zu (previous field ends at %zu, struct is %zu)", s,
                         fx_abi_field(s, j), off, size, end, total);
            end = off + size;
        }
        FXT_CHECK(nfields > 0);
    }
    FXT_EQ_INT(nstructs, 10); /* the call structs, the seven mod contexts, fx_mod_tensor */
    FXT_OK(fx_abi_layout("fx_mod_tensor", "grad", &off, &size));
    FXT_EQ_INT(off, offsetof(fx_mod_tensor, grad));
    FXT_EQ_INT(size, sizeof(float *));
    FXT_EQ_STR(fx_abi_field("fx_attention", 0), "B");
    FXT_EQ_STR(fx_abi_field("fx_attention", 15), "dtype");
    FXT_CHECK(fx_abi_field("fx_attention", 16) == NULL);
    FXT_EQ_STR(fx_abi_field("fx_lce", 12), "dtype");
    FXT_CHECK(fx_abi_field("fx_lce", 13) == NULL);
    FXT_CHECK(fx_abi_field("fx_nothing", 0) == NULL);
    FXT_CHECK(fx_abi_struct(1000) == NULL);

    off = 7;
    FXT_STATUS(fx_abi_layout("fx_nothing", NULL, &off, &size), FX_EINVAL, "fx_nothing");
    FXT_STATUS(fx_abi_layout(NULL, NULL, &off, &size), FX_EINVAL, "(NULL)");
    FXT_STATUS(fx_abi_layout("fx_attention", "nope", &off, &size), FX_EINVAL, "fx_attention has no field named nope");
    FXT_STATUS(fx_abi_layout("fx_tensor_view", NULL, &off, &size), FX_EINVAL, "fx_tensor_view");
    FXT_EQ_INT(off, 7);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_status_strings);
    FXT_RUN(test_last_error);
    FXT_RUN(test_version);
    FXT_RUN(test_logging);
    FXT_RUN(test_threads);
    FXT_RUN(test_threads_bound);
    FXT_RUN(test_isa);
    FXT_RUN(test_alloc_accounting);
    FXT_RUN(test_advise_huge_pages);
    FXT_RUN(test_gemm_against_reference);
    FXT_RUN(test_gemm_beta_zero);
    FXT_RUN(test_traces);
    FXT_RUN(test_gemm_thread_independent);
    FXT_RUN(test_gemm_tiled_paths);
    FXT_RUN(test_gemm_thin_path);
    FXT_RUN(test_philox_known_answers);
    FXT_RUN(test_rng_streams);
    FXT_RUN(test_rng_fill_thread_independent);
    FXT_RUN(test_first_nonfinite);
    FXT_RUN(test_read_regular);
    FXT_RUN(test_mem_parse);
    FXT_RUN(test_mem_probe);
    FXT_RUN(test_mem_check);
    FXT_RUN(test_abi_layout);
    FXT_RUN(test_harness_catches_guard_overwrite);
    return fxt_finish();
}
