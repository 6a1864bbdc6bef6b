/* Timing, medians and this machine's measured limits. */
#include "util.h"
#include "cli/cli.h"

#include <flexc.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "core/gemm_bf16.h"

#include <blis.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_median(double *x, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

void bench_pair_warm(bench_fn a, void *ctx_a, bench_fn b, void *ctx_b, int reps, double warm_b_below, double *med_a,
                     double *med_b)
{
    enum { MAX_REPS = 64 };
    double ta[MAX_REPS], tb[MAX_REPS];
    reps = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    const double t0 = fx__seconds();
    a(ctx_a);
    if (fx__seconds() - t0 < warm_b_below)
        b(ctx_b);
    for (int r = 0; r < reps; r++) {
        const double t1 = fx__seconds();
        a(ctx_a);
        const double t2 = fx__seconds();
        b(ctx_b);
        const double t3 = fx__seconds();
        ta[r] = t2 - t1;
        tb[r] = t3 - t2;
    }
    *med_a = bench_median(ta, reps);
    *med_b = bench_median(tb, reps);
}

void bench_pair(bench_fn a, void *ctx_a, bench_fn b, void *ctx_b, int reps, double *med_a, double *med_b)
{
    bench_pair_warm(a, ctx_a, b, ctx_b, reps, INFINITY, med_a, med_b);
}

double bench_time(bench_fn f, void *ctx, int reps)
{
    enum { MAX_REPS = 64 };
    double t[MAX_REPS];
    if (reps > MAX_REPS)
        reps = MAX_REPS;
    if (reps < 1)
        reps = 1;
    f(ctx);
    for (int r = 0; r < reps; r++) {
        double t0 = fx__seconds();
        f(ctx);
        t[r] = fx__seconds() - t0;
    }
    return bench_median(t, reps);
}

double bench_fma_loop_scalar(int64_t iters)
{
    /* Eight independent chains so the loop is bound by FMA throughput, not latency. */
    float acc[8] = {1.0f, 1.1f, 1.2f, 1.3f, 1.4f, 1.5f, 1.6f, 1.7f}; /* distinct: not merged */
    const float m = 0.9999999f, c = 1e-7f;
    for (int64_t i = 0; i < iters; i++)
        for (int j = 0; j < 8; j++)
            acc[j] = acc[j] * m + c;
    volatile float sink = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
    (void)sink;
    return 2.0 * 8 * (double)iters;
}

double bench_fma_peak_gflops(void)
{
    fx_isa isa = fx_get_isa();
    const int64_t iters = isa == FX_ISA_SCALAR ? 20000000 : 4000000;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        /* Each thread times its own loop after a barrier, so thread start-up is not counted;
           the rates add up. */
        double rate = 0.0;
#pragma omp parallel reduction(+ : rate)
        {
#pragma omp barrier
            double t0 = fx__seconds();
            double flops = isa == FX_ISA_AVX512 ? bench_fma_loop_avx512(iters)
                         : isa == FX_ISA_AVX2   ? bench_fma_loop_avx2(iters)
                                                : bench_fma_loop_scalar(iters);
            rate += flops / (fx__seconds() - t0);
        }
        best = rate * 1e-9 > best ? rate * 1e-9 : best;
    }
    return best;
}

/* Something for each thread to do that the compiler cannot drop (GCC drops an empty region). */
static volatile int bench_sync_word;
static void bench_sync_sink(int r)
{
    if (r < 0)
        bench_sync_word = r;
}

void bench_sync_us(double *region_us, double *barrier_us)
{
    enum { REPS = 1000 };
    double region = 1e30, barrier = 1e30;
    if (fx_get_num_threads() < 2) {
        *region_us = *barrier_us = 0.0;
        return;
    }
    for (int run = 0; run < 5; run++) {
        double t0 = fx__seconds();
        for (int r = 0; r < REPS; r++) {
#pragma omp parallel
            {
                bench_sync_sink(r);
            }
        }
        double t1 = fx__seconds();
#pragma omp parallel
        for (int r = 0; r < REPS; r++) {
            bench_sync_sink(r);
#pragma omp barrier
        }
        double t2 = fx__seconds();
        region = t1 - t0 < region ? t1 - t0 : region;
        barrier = t2 - t1 < barrier ? t2 - t1 : barrier;
    }
    *region_us = region / REPS * 1e6;
    *barrier_us = barrier / REPS * 1e6;
}

double bench_triad_gbs(void)
{
    /* 3 x 64 MiB: far beyond any cache. */
    const int64_t n = 16 * 1024 * 1024;
    float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b), *c = malloc((size_t)n * sizeof *c);
    if (!a || !b || !c) {
        free(a), free(b), free(c);
        return 0.0;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        const float s = 3.0f;
        double t0 = fx__seconds();
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            a[i] = b[i] + s * c[i];
        double gbs = 3.0 * 4.0 * (double)n / (fx__seconds() - t0) * 1e-9;
        best = gbs > best ? gbs : best;
    }
    volatile float sink = a[n / 2];
    (void)sink;
    free(a), free(b), free(c);
    return best;
}

/* One call of the GEMM bench_gemm_seconds times. */
typedef struct bench_gemm_call {
    bool blis;
    const fx__gemm_shape *g;
    const float *A, *B;         /* float32 operands */
    const uint16_t *A16, *B16;  /* their bfloat16 copies (g->bf16) */
    float *C, *ws;              /* ws: fx__gemm_bf16's scratch (g->bf16) */
    rntm_t rntm;
} bench_gemm_call;

static double bench_gemm_once(bench_gemm_call *c)
{
    const fx__gemm_shape *g = c->g;
    const int64_t lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    float one = 1.0f, zero = 0.0f;
    const double t0 = fx__seconds();
    if (c->blis)
        bli_sgemm_ex(g->ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g->tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g->M, g->N,
                     g->K, &one, (float *)c->A, lda, 1, (float *)c->B, ldb, 1, &zero, c->C, g->N, 1, NULL, &c->rntm);
    else if (g->bf16)
        fx__gemm_bf16(g->ta, g->tb, g->M, g->N, g->K, g->a16 ? fx__bf16_of(c->A16) : fx__bf16_of_f32(c->A), lda,
                      g->b16 ? fx__bf16_of(c->B16) : fx__bf16_of_f32(c->B), ldb, zero, c->C, g->N, c->ws);
    else
        fx__sgemm(g->ta, g->tb, g->M, g->N, g->K, one, c->A, lda, c->B, ldb, zero, c->C, g->N);
    return fx__seconds() - t0;
}

double bench_gemm_seconds(bool blis, const fx__gemm_shape *g)
{
    const int64_t M = g->M, N = g->N, K = g->K;
    const bool bf16 = g->bf16 && !blis;
    float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(N * K) * sizeof *B),
          *C = malloc((size_t)(M * N) * sizeof *C), *ws = bf16 ? malloc(fx__gemm_bf16_ws(M, N, K) * sizeof *ws) : NULL;
    uint16_t *A16 = bf16 ? malloc((size_t)(M * K) * sizeof *A16) : NULL,
             *B16 = bf16 ? malloc((size_t)(N * K) * sizeof *B16) : NULL;
    double s = -1.0;
    if (!A || !B || !C || (bf16 && (!ws || !A16 || !B16)))
        goto done;
    fx_rng_fill_uniform(A, M * K, -1, 1, 1, 0);
    fx_rng_fill_uniform(B, N * K, -1, 1, 2, 0);
    if (bf16) {
        fx__f32_to_bf16_n(A16, A, M * K);
        fx__f32_to_bf16_n(B16, B, N * K);
    }
    bench_gemm_call c = {blis, g, A, B, A16, B16, C, ws, BLIS_RNTM_INITIALIZER};
    bli_rntm_set_num_threads_only(fx_get_num_threads(), &c.rntm);
    /* Warm-up calls for a tenth of a second (at least one, at most 64): on the virtual
       machines measured here the first ~20 ms of calls after a pause ran at two thirds of the
       later speed. */
    const double warm_until = fx__seconds() + 0.1;
    for (int r = 0; r < 64 && (r == 0 || fx__seconds() < warm_until); r++)
        bench_gemm_once(&c);
    double t[5];
    for (int r = 0; r < 5; r++)
        t[r] = bench_gemm_once(&c);
    s = bench_median(t, 5);
done:
    free(A), free(B), free(C), free(ws), free(A16), free(B16);
    return s;
}

double bench_sgemm_gflops(bool blis, int64_t M, int64_t N, int64_t K)
{
    const double s = bench_gemm_seconds(blis, &(fx__gemm_shape){.tb = true, .M = M, .N = N, .K = K});
    return s > 0.0 ? 2.0 * (double)M * (double)N * (double)K / s * 1e-9 : 0.0;
}

size_t bench_max_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss * 1024;
}

bool bench_train_data_new(bench_train_data *b, int64_t n, int64_t seq, int64_t batch, int64_t vocab)
{
    *b = (bench_train_data){.d = {.n = n, .n_train = n - (seq + 1)}};
    b->d.tok = malloc((size_t)n * sizeof *b->d.tok);
    b->tok = malloc((size_t)(batch * seq) * sizeof *b->tok);
    b->tgt = malloc((size_t)(batch * seq) * sizeof *b->tgt);
    if (!b->d.tok || !b->tok || !b->tgt) {
        cli_error("bench train: out of memory");
        bench_train_data_free(b);
        return false;
    }
    fx_rng r;
    fx_rng_init(&r, 7, 0);
    for (int64_t i = 0; i < n; i++)
        b->d.tok[i] = (uint32_t)(fx_rng_u32(&r) % (uint32_t)vocab);
    return true;
}

void bench_train_data_free(bench_train_data *b)
{
    free(b->d.tok), free(b->tok), free(b->tgt);
    *b = (bench_train_data){0};
}
