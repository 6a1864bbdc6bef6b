/* flexc bench lce: the fused linear cross-entropy against the unfused computation it
   replaces (materialised [N, V] logits, softmax, two GEMMs), at the benchmark shapes (docs/lce.md).
   Time: the two alternate in one run (A, B, A, B, ...), medians. Memory: the bytes each
   allocates, and the growth of the maximum resident set in a child process per mode.
   Throughput: 6 N V D flops per call against the library's sgemm at the logits GEMM's shape. */
#include "util.h"
#include "cli/cli.h"

#include "lce/lce_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct lce_bench {
    fx_lce p;
    const float *h, *w;
    const int64_t *target;
    float *dh, *dw;      /* [N,D], [V,D] */
    float *logits;       /* unfused: [N,V], allocated once (NULL: allocate in every call) */
    double *tok_loss;    /* unfused: [N] */
    float loss;
    int status;
} lce_bench;

static void run_fused(void *ctx)
{
    lce_bench *b = ctx;
    b->status = fx_linear_cross_entropy(&b->p, b->h, b->w, NULL, b->target, &b->loss, NULL, b->dh, b->dw, NULL);
}

/* The unfused peer, MEAN reduction, no options: logits = h w^T; softmax and its gradient
   row by row in place (the library's own row kernels, so only the memory schedule differs);
   dh = G w; dw += G^T h. */
static void run_unfused(void *ctx)
{
    lce_bench *b = ctx;
    const int64_t N = b->p.N, D = b->p.D, V = b->p.V;
    float *z = b->logits ? b->logits : malloc((size_t)(N * V) * sizeof(float));
    if (!z) {
        b->status = FX_ENOMEM;
        return;
    }
    const fx__lce_row_kernels *k = fx__lce_row_kernels_now();
    fx__sgemm(false, true, N, V, D, 1.0f, b->h, D, b->w, D, 0.0f, z, V);
    const float inv_n = 1.0f / (float)N;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; i++) {
        float *row = z + i * V;
        fx__lce_stat st = {-INFINITY, 0.0, 0.0};
        k->stats(row, V, NULL, 0.0f, &st);
        const double lse = (double)st.m + log(st.s);
        const int64_t y = b->target[i];
        b->tok_loss[i] = lse - (double)row[y];
        k->grad(row, V, (float)lse, inv_n, 0.0f, 0.0f);
        row[y] -= inv_n;
    }
    double total = 0.0;
    for (int64_t i = 0; i < N; i++)
        total += b->tok_loss[i];
    b->loss = (float)(total / (double)N);
    fx__sgemm(false, false, N, D, V, 1.0f, z, V, b->w, D, 0.0f, b->dh, D);
    fx__sgemm(true, false, V, D, N, 1.0f, z, V, b->h, D, 1.0f, b->dw, D);
    if (!b->logits)
        free(z);
    b->status = FX_OK;
}

typedef struct inputs {
    float *h, *w, *dh, *dw;
    int64_t *target;
    double *tok_loss;
} inputs;

static bool inputs_make(inputs *in, int64_t N, int64_t D, int64_t V)
{
    memset(in, 0, sizeof *in);
    in->h = malloc((size_t)(N * D) * sizeof(float));
    in->w = malloc((size_t)(V * D) * sizeof(float));
    in->dh = malloc((size_t)(N * D) * sizeof(float));
    in->dw = malloc((size_t)(V * D) * sizeof(float));
    in->target = malloc((size_t)N * sizeof(int64_t));
    in->tok_loss = malloc((size_t)N * sizeof(double));
    if (!in->h || !in->w || !in->dh || !in->dw || !in->target || !in->tok_loss)
        return false;
    /* Scaled like a trained model's last layer: logits of order one. */
    const float a = 2.0f / sqrtf((float)D);
    fx_rng_fill_uniform(in->h, N * D, -1.0f, 1.0f, 11, 0);
    fx_rng_fill_uniform(in->w, V * D, -a, a, 12, 0);
    /* Every page written now, so that the RSS baseline of a child holds all of the inputs and
       outputs and its growth is the computation's own memory. */
    memset(in->dh, 0, (size_t)(N * D) * sizeof(float));
    memset(in->dw, 0, (size_t)(V * D) * sizeof(float));
    memset(in->tok_loss, 0, (size_t)N * sizeof(double));
    for (int64_t i = 0; i < N; i++)
        in->target[i] = (int64_t)((uint64_t)(i * 2654435761u) % (uint64_t)V);
    return true;
}

static void inputs_free(inputs *in)
{
    free(in->h), free(in->w), free(in->dh), free(in->dw), free(in->target), free(in->tok_loss);
}

static lce_bench bench_ctx(const fx_lce *p, const inputs *in)
{
    return (lce_bench){.p = *p, .h = in->h, .w = in->w, .target = in->target, .dh = in->dh, .dw = in->dw,
                       .tok_loss = in->tok_loss};
}

/* The child's side of the memory measurement: allocates its own inputs, runs a tiny problem
   of the same mode (so that the libraries' buffers and thread stacks exist), then the real
   one, and prints the growth of its maximum resident set and the library's peak bytes. */
static int rss_child(const fx_lce *p, bool fused)
{
    inputs in;
    if (!inputs_make(&in, p->N, p->D, p->V)) {
        inputs_free(&in);
        return CLI_EXIT_FAIL;
    }
    /* The warm-up: the first 16 tokens against the first 1024 vocabulary rows, small enough
       that its own scratch does not raise the baseline. */
    fx_lce small = *p;
    small.N = p->N < 16 ? p->N : 16;
    small.V = p->V < 1024 ? p->V : 1024;
    small.chunk = 0;
    int64_t small_target[16];
    for (int64_t i = 0; i < small.N; i++)
        small_target[i] = i % small.V;
    lce_bench w = bench_ctx(&small, &in);
    w.target = small_target;
    if (fused)
        run_fused(&w);
    else
        run_unfused(&w);
    lce_bench b = bench_ctx(p, &in);
    size_t before = bench_max_rss(), cur0, peak;
    fx_mem_stats(&cur0, &peak);
    fx_mem_reset_peak();
    if (fused)
        run_fused(&b);
    else
        run_unfused(&b);
    fx_mem_stats(NULL, &peak);
    size_t after = bench_max_rss();
    inputs_free(&in);
    if (b.status != FX_OK || w.status != FX_OK)
        return cli_fail(b.status != FX_OK ? b.status : w.status, "bench lce");
    printf("%zu %zu\n", after > before ? after - before : 0, peak - cur0);
    return CLI_EXIT_OK;
}

/* Runs one mode once in a fresh process (this program again, not a bare fork: OpenMP's
   thread pool does not survive a fork) and reads what rss_child printed. */
static bool measure_child(const fx_lce *p, bool fused, size_t *rss_delta, size_t *lib_bytes)
{
    char shape[96], chunk[32];
    snprintf(shape, sizeof shape, "%lld,%lld,%lld", (long long)p->N, (long long)p->D, (long long)p->V);
    snprintf(chunk, sizeof chunk, "%lld", (long long)p->chunk);
    char *argv[] = {"flexc", "bench", "lce", "--rss-child", fused ? "fused" : "unfused", "--shape", shape,
                    "--chunk", chunk, NULL};
    int fd[2];
    if (pipe(fd) != 0)
        return false;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]), close(fd[1]);
        return false;
    }
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]), close(fd[1]);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    close(fd[1]);
    char buf[128];
    size_t got = 0;
    ssize_t rd;
    while (got < sizeof buf - 1 && (rd = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)rd;
    buf[got] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 && sscanf(buf, "%zu %zu", rss_delta, lib_bytes) == 2;
}

static double max_rel_diff(const float *a, const float *b, size_t n)
{
    double m = 0.0, s = 0.0;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)a[i] - (double)b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0.0 ? m / s : m;
}

/* One shape's measurements. */
typedef struct lce_result {
    int64_t chunk, vocab_chunk;     /* the fused call's plan */
    size_t ws;                      /* and its scratch bytes */
    size_t rss_f, rss_u, lib_f;     /* max-RSS growth of each mode's child; the library's peak, fused */
    double tf, tu, sgemm;           /* seconds a call, fused and unfused; sgemm GFLOP/s at [N, V, D] */
    double dh_diff, dw_diff;        /* the two modes' agreement */
    float loss_f, loss_u;
} lce_result;

/* The timed pairs of calls on p, the unfused peer's logits reused unless fresh, with sgemm
   measured right before and right after; the better of the two, so that a burst of load on
   a shared machine cannot flatter the fractions. */
static int bench_timed(const fx_lce *p, int reps, bool fresh, lce_result *r)
{
    const int64_t N = p->N, D = p->D, V = p->V;
    inputs a, b;
    if (!inputs_make(&a, N, D, V) || !inputs_make(&b, N, D, V)) {
        inputs_free(&a), inputs_free(&b);
        cli_error("bench lce: out of memory for N=%lld D=%lld V=%lld", (long long)N, (long long)D, (long long)V);
        return CLI_EXIT_FAIL;
    }
    lce_bench fb = bench_ctx(p, &a), ub = bench_ctx(p, &b);
    if (!fresh) {
        ub.logits = malloc((size_t)(N * V) * sizeof(float));
        if (!ub.logits) {
            inputs_free(&a), inputs_free(&b);
            cli_error("bench lce: cannot allocate the %.0f MB of unfused logits", 4.0 * (double)N * (double)V / 1e6);
            return CLI_EXIT_FAIL;
        }
        memset(ub.logits, 0, (size_t)(N * V) * sizeof(float)); /* fault the pages in outside the timing */
    }
    const double sgemm0 = bench_sgemm_gflops(false, N, V, D);
    bench_pair(run_fused, &fb, run_unfused, &ub, reps, &r->tf, &r->tu);
    if (fb.status != FX_OK || ub.status != FX_OK) {
        free(ub.logits), inputs_free(&a), inputs_free(&b);
        return cli_fail(fb.status != FX_OK ? fb.status : ub.status, "bench lce");
    }
    /* Agreement after the same number of calls (dw accumulated reps + 1 times in both). */
    r->dh_diff = max_rel_diff(a.dh, b.dh, (size_t)(N * D));
    r->dw_diff = max_rel_diff(a.dw, b.dw, (size_t)(V * D));
    r->loss_f = fb.loss, r->loss_u = ub.loss;
    free(ub.logits);
    inputs_free(&a), inputs_free(&b);
    r->sgemm = fmax(sgemm0, bench_sgemm_gflops(false, N, V, D));
    return CLI_EXIT_OK;
}

static void report_json(const fx_lce *p, const lce_result *r, int reps, bool fresh, bool rss)
{
    const double logits_bytes = 4.0 * (double)p->N * (double)p->V, unfused_bytes = logits_bytes + 8.0 * (double)p->N;
    const double flops = 6.0 * (double)p->N * (double)p->V * (double)p->D;
    const double gf = flops / r->tf * 1e-9, gu = flops / r->tu * 1e-9;
    printf("{\"case\":\"lce\",\"N\":%lld,\"D\":%lld,\"V\":%lld,\"threads\":%d,\"isa\":\"%s\",\"reps\":%d,"
           "\"chunk\":%lld,\"vocab_chunk\":%lld,\"fused_gemm\":\"%s\",\"peer\":\"unfused (materialised logits%s)\","
           "\"logits_bytes\":%.0f,\"fused_alloc_bytes\":%zu,\"unfused_alloc_bytes\":%.0f,"
           "\"fused_alloc_vs_logits\":%.5f,",
           (long long)p->N, (long long)p->D, (long long)p->V, fx_get_num_threads(), fx_isa_name(fx_get_isa()), reps,
           (long long)r->chunk, (long long)r->vocab_chunk, fx__lce_f32_products(),
           fresh ? ", allocated per call" : ", buffer reused", logits_bytes, r->ws, unfused_bytes,
           (double)r->ws / logits_bytes);
    if (rss)
        printf("\"fused_rss_delta_bytes\":%zu,\"unfused_rss_delta_bytes\":%zu,\"rss_ratio\":%.5f,"
               "\"fused_lib_peak_bytes\":%zu,",
               r->rss_f, r->rss_u, r->rss_u ? (double)r->rss_f / (double)r->rss_u : 0.0, r->lib_f);
    printf("\"fused_s\":%.4f,\"unfused_s\":%.4f,\"time_ratio\":%.3f,\"fused_gflops\":%.1f,\"unfused_gflops\":%.1f,"
           "\"sgemm_gflops\":%.1f,\"fused_vs_sgemm\":%.3f,\"unfused_vs_sgemm\":%.3f,"
           "\"loss_fused\":%.7g,\"loss_unfused\":%.7g,\"dh_max_rel_diff\":%.3g,\"dw_max_rel_diff\":%.3g}\n",
           r->tf, r->tu, r->tf / r->tu, gf, gu, r->sgemm, gf / r->sgemm, gu / r->sgemm, (double)r->loss_f,
           (double)r->loss_u, r->dh_diff, r->dw_diff);
}

static void report_text(const fx_lce *p, const lce_result *r, int reps, bool rss)
{
    const double logits_bytes = 4.0 * (double)p->N * (double)p->V, unfused_bytes = logits_bytes + 8.0 * (double)p->N;
    const double flops = 6.0 * (double)p->N * (double)p->V * (double)p->D;
    const double gf = flops / r->tf * 1e-9, gu = flops / r->tu * 1e-9;
    /* Which GEMMs the fused path ran: its own kernels, or BLIS's (the AVX2 path). */
    printf("N=%lld D=%lld V=%lld: threads %d, path %s (%s), chunk %lld x %lld, %d reps\n", (long long)p->N,
           (long long)p->D, (long long)p->V, fx_get_num_threads(), fx_isa_name(fx_get_isa()), fx__lce_f32_products(),
           (long long)r->chunk, (long long)r->vocab_chunk, reps);
    printf("  extra memory   fused %9.1f MB allocated (%.4f of the logits)   unfused %9.1f MB\n", (double)r->ws / 1e6,
           (double)r->ws / logits_bytes, unfused_bytes / 1e6);
    if (rss)
        printf("  max-RSS growth fused %9.1f MB                                unfused %9.1f MB (ratio %.4f)\n",
               (double)r->rss_f / 1e6, (double)r->rss_u / 1e6, r->rss_u ? (double)r->rss_f / (double)r->rss_u : 0.0);
    printf("  time           fused %9.3f s   unfused %9.3f s   ratio %.3f\n", r->tf, r->tu, r->tf / r->tu);
    printf("  throughput     fused %7.1f GFLOP/s (%.0f%% of sgemm)   unfused %7.1f (%.0f%%)   sgemm %.1f\n", gf,
           100.0 * gf / r->sgemm, gu, 100.0 * gu / r->sgemm, r->sgemm);
    printf("  agreement      loss %.7g vs %.7g, dh max rel diff %.2g, dw %.2g\n", (double)r->loss_f,
           (double)r->loss_u, r->dh_diff, r->dw_diff);
}

static int bench_shape(int64_t N, int64_t D, int64_t V, int64_t chunk, int reps, bool fresh, bool rss, bool json)
{
    fx_lce p = fx_lce_defaults(N, D, V);
    p.chunk = chunk;
    lce_result r = {0};
    int rc = fx_linear_cross_entropy_plan(&p, &r.chunk, &r.vocab_chunk, &r.ws);
    if (rc != FX_OK)
        return cli_fail(rc, "bench lce");
    /* Memory first, in children, before this process holds anything large. */
    size_t lib_u = 0; /* the unfused path makes no library allocation worth reporting */
    if (rss && (!measure_child(&p, true, &r.rss_f, &r.lib_f) || !measure_child(&p, false, &r.rss_u, &lib_u))) {
        cli_error("bench lce: the memory measurement in a child process failed (N=%lld D=%lld V=%lld)",
                  (long long)N, (long long)D, (long long)V);
        return CLI_EXIT_FAIL;
    }
    if ((rc = bench_timed(&p, reps, fresh, &r)) != CLI_EXIT_OK)
        return rc;
    if (json)
        report_json(&p, &r, reps, fresh, rss);
    else
        report_text(&p, &r, reps, rss);
    fflush(stdout);
    return CLI_EXIT_OK;
}

int bench_lce(int argc, char **argv)
{
    bool json = false, quick = false, fresh = false, no_rss = false;
    const char *shape = NULL, *child = NULL;
    int64_t reps = 3, chunk = 0;
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &json, "one JSON object per shape"},
        {"--quick", CLI_FLAG, &quick, "small shapes (seconds instead of minutes)"},
        {"--shape", CLI_STRING, &shape, "N,D,V: this shape only"},
        {"--reps", CLI_INT, &reps, "timed pairs per shape (default 3)"},
        {"--chunk", CLI_INT, &chunk, "tokens per chunk of the fused path (default automatic)"},
        {"--fresh", CLI_FLAG, &fresh, "the unfused peer allocates its logits in every call"},
        {"--no-rss", CLI_FLAG, &no_rss, "skip the per-mode child processes that measure max RSS"},
        {"--rss-child", CLI_STRING, &child, NULL}, /* internal: the child of measure_child */
    };
    int rc = cli_parse("bench lce", "[--json] [--quick] [--shape N,D,V] [--reps R] [--chunk C] [--fresh] [--no-rss]",
                       argc, argv, opts, sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : rc;
    if (reps < 1 || reps > 64) {
        cli_error("bench lce: --reps %lld must be in [1, 64]", (long long)reps);
        return CLI_EXIT_USAGE;
    }
    if (chunk < 0) {
        cli_error("bench lce: --chunk %lld must be >= 0 (0: automatic)", (long long)chunk);
        return CLI_EXIT_USAGE;
    }
    int64_t shapes[2][3] = {{4096, 1024, 32768}, {2048, 1024, 128256}};
    int nshapes = 2;
    if (quick) {
        const int64_t q[2][3] = {{1024, 256, 32768}, {512, 256, 128256}};
        memcpy(shapes, q, sizeof q);
    }
    if (shape) {
        long long n, d, v;
        char tail;
        if (sscanf(shape, "%lld,%lld,%lld%c", &n, &d, &v, &tail) != 3 || n <= 0 || d <= 0 || v <= 0 || n > 1000000 ||
            d > 100000 || v > 10000000) {
            cli_error("bench lce: --shape '%s' is not N,D,V with positive sizes", shape);
            return CLI_EXIT_USAGE;
        }
        shapes[0][0] = n, shapes[0][1] = d, shapes[0][2] = v;
        nshapes = 1;
    }
    if (child) {
        fx_lce p = fx_lce_defaults(shapes[0][0], shapes[0][1], shapes[0][2]);
        p.chunk = chunk;
        return rss_child(&p, strcmp(child, "fused") == 0);
    }
    for (int s = 0; s < nshapes; s++) {
        rc = bench_shape(shapes[s][0], shapes[s][1], shapes[s][2], chunk, (int)reps, fresh, !no_rss, json);
        if (rc != CLI_EXIT_OK)
            return rc;
    }
    return CLI_EXIT_OK;
}
