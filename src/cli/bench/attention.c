/* flexc bench attention: flex attention (block-sparse) against the dense flash SDPA kernel
   (mask == NULL), timed alternately in one run, with GFLOP/s on visited blocks and the
   fraction of this machine's fp32 FMA peak measured in the same run. */
#include "attention.h"
#include "attention_bwd.h"

#include "util.h"
#include "cli/cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *bench_attn_mask_name(bench_attn_mask m)
{
    switch (m) {
    case BENCH_MASK_CAUSAL: return "causal";
    case BENCH_MASK_SLIDING: return "sliding";
    case BENCH_MASK_DOCUMENT: return "document";
    default: return "dense";
    }
}

static float *random_floats(size_t n, uint64_t seed)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (p)
        fx_rng_fill_uniform(p, (int64_t)n, -1.0f, 1.0f, seed, 0);
    return p;
}

void bench_attn_teardown(bench_attn_data *d)
{
    free(d->q), free(d->k), free(d->v), free(d->out), free(d->out2), free(d->lse), free(d->doc_ids);
    fx_block_mask_free(d->mask);
    memset(d, 0, sizeof *d);
}

int bench_attn_setup(bench_attn_data *d, const bench_attn_case *c)
{
    memset(d, 0, sizeof *d);
    fx_attention *a = &d->a;
    a->B = c->B, a->Hq = c->Hq, a->Hkv = c->Hkv, a->Lq = c->L, a->Lkv = c->L, a->D = c->D, a->Dv = c->D;
    size_t nq = (size_t)(c->B * c->Hq * c->L), nk = (size_t)(c->B * c->Hkv * c->L);
    d->q = random_floats(nq * (size_t)c->D, 1);
    d->k = random_floats(nk * (size_t)c->D, 2);
    d->v = random_floats(nk * (size_t)c->D, 3);
    d->out = random_floats(nq * (size_t)c->D, 4);
    d->out2 = random_floats(nq * (size_t)c->D, 5);
    d->lse = random_floats(nq, 6);
    if (!d->q || !d->k || !d->v || !d->out || !d->out2 || !d->lse) {
        cli_error("bench attention: out of memory for case %s", c->name);
        bench_attn_teardown(d);
        return 1;
    }
    int rc = FX_OK;
    double t0 = fx__seconds();
    switch (c->mask) {
    case BENCH_MASK_CAUSAL:
        rc = fx_block_mask_create(&d->mask, fx_mask_causal, NULL, 1, 1, c->L, c->L, 0, 0);
        break;
    case BENCH_MASK_SLIDING:
        d->sliding.window = c->window;
        rc = fx_block_mask_create(&d->mask, fx_mask_sliding_window, &d->sliding, 1, 1, c->L, c->L, 0, 0);
        break;
    case BENCH_MASK_DOCUMENT: {
        d->doc_ids = malloc((size_t)c->L * sizeof(int64_t));
        if (!d->doc_ids) {
            bench_attn_teardown(d);
            cli_error("bench attention: out of memory");
            return 1;
        }
        for (int64_t i = 0; i < c->L; i++)
            d->doc_ids[i] = i * c->docs / c->L;
        d->document = (fx_mask_document_ctx){.doc_ids = d->doc_ids, .len = c->L};
        rc = fx_block_mask_create(&d->mask, fx_mask_document, &d->document, 1, 1, c->L, c->L, 0, 0);
        break;
    }
    default:
        break;
    }
    d->mask_ms = (fx__seconds() - t0) * 1e3;
    if (rc != FX_OK) {
        cli_fail(rc, "block mask");
        bench_attn_teardown(d);
        return 1;
    }
    a->mask = d->mask;
    return 0;
}

double bench_attn_flops(const fx_attention *a, double density)
{
    return 2.0 * (double)(a->D + a->Dv) * (double)a->B * (double)a->Hq * (double)a->Lq * (double)a->Lkv * density;
}

typedef struct run_ctx {
    const fx_attention *a;
    bench_attn_data *d;
    float *out;
    int rc;
} run_ctx;

static void run_forward(void *p)
{
    run_ctx *r = p;
    int rc = fx_flex_attention(r->a, r->d->q, r->d->k, r->d->v, r->out, r->d->lse);
    if (rc != FX_OK)
        r->rc = rc;
}

/* One case: flex (with its mask) and dense (mask == NULL) alternately. */
static int run_case(const bench_attn_case *c, double peak, bool json)
{
    bench_attn_data d;
    if (bench_attn_setup(&d, c))
        return CLI_EXIT_FAIL;
    fx_attention dense = d.a;
    dense.mask = NULL;
    run_ctx flex_run = {.a = &d.a, .d = &d, .out = d.out}, dense_run = {.a = &dense, .d = &d, .out = d.out2};
    double t_flex, t_dense;
    bench_pair_warm(run_forward, &flex_run, run_forward, &dense_run, c->reps, 0.05, &t_flex, &t_dense);
    if (flex_run.rc != FX_OK || dense_run.rc != FX_OK) {
        cli_fail(flex_run.rc != FX_OK ? flex_run.rc : dense_run.rc, "flex attention");
        bench_attn_teardown(&d);
        return CLI_EXIT_FAIL;
    }
    double density = d.mask ? fx_block_mask_density(d.mask) : 1.0;
    double gflops = bench_attn_flops(&d.a, density) / t_flex * 1e-9;
    double dense_gflops = bench_attn_flops(&d.a, 1.0) / t_dense * 1e-9;
    size_t mask_bytes = d.mask ? fx_block_mask_bytes(d.mask) : 0;
    if (json) {
        char window[32] = "null";
        if (c->mask == BENCH_MASK_SLIDING)
            snprintf(window, sizeof window, "%lld", (long long)c->window);
        printf("{\"case\":\"%s\",\"mask\":\"%s\",\"B\":%lld,\"H\":%lld,\"Hkv\":%lld,\"L\":%lld,\"D\":%lld,"
               "\"window\":%s,\"density\":%.5f,\"mask_bytes\":%zu,\"mask_ms\":%.3f,\"flex_ms\":%.3f,\"dense_ms\":%.3f,"
               "\"speedup\":%.3f,\"gflops\":%.1f,\"peak_fraction\":%.3f,\"dense_gflops\":%.1f,"
               "\"dense_peak_fraction\":%.3f,\"fma_peak_gflops\":%.1f,\"threads\":%d,\"isa\":\"%s\",\"reps\":%d}\n",
               c->name, bench_attn_mask_name(c->mask), (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
               (long long)c->L, (long long)c->D, window, density, mask_bytes, d.mask_ms, t_flex * 1e3, t_dense * 1e3,
               t_dense / t_flex, gflops, gflops / peak, dense_gflops, dense_gflops / peak, peak,
               fx_get_num_threads(), fx_isa_name(fx_get_isa()), c->reps);
    } else {
        printf("%-12s %-8s B=%lld H=%lld/%lld L=%lld D=%lld", c->name, bench_attn_mask_name(c->mask),
               (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->L, (long long)c->D);
        if (c->mask == BENCH_MASK_SLIDING)
            printf(" W=%lld", (long long)c->window);
        printf("  density %.4f", density);
        if (d.mask)
            printf(", mask %.1f KiB built in %.2f ms", (double)mask_bytes / 1024.0, d.mask_ms);
        printf("\n");
        printf("    flex  %10.2f ms  %7.1f GFLOP/s on visited blocks (%.0f%% of peak)\n", t_flex * 1e3, gflops,
               100 * gflops / peak);
        printf("    dense %10.2f ms  %7.1f GFLOP/s (%.0f%% of peak)\n", t_dense * 1e3, dense_gflops,
               100 * dense_gflops / peak);
        printf("    speedup %.2fx (1/density %.1fx), fp32 FMA peak %.1f GFLOP/s\n", t_dense / t_flex, 1.0 / density,
               peak);
    }
    fflush(stdout);
    bench_attn_teardown(&d);
    return CLI_EXIT_OK;
}

/* The benchmark cases (docs/attention.md); the big ones take fewer timed pairs (a dense 32768 run takes 10-30 s). */
static const bench_attn_case default_cases[] = {
    {"sliding32k", 1, 8, 8, 32768, 64, BENCH_MASK_SLIDING, 256, 0, 1},
    {"sliding8k", 1, 8, 8, 8192, 64, BENCH_MASK_SLIDING, 64, 0, 5},
    {"causal8k", 1, 8, 8, 8192, 64, BENCH_MASK_CAUSAL, 0, 0, 5},
    {"document16k", 1, 8, 8, 16384, 64, BENCH_MASK_DOCUMENT, 0, 16, 2},
};

static int parse_mask(const char *s, bench_attn_mask *m)
{
    static const bench_attn_mask all[] = {BENCH_MASK_DENSE, BENCH_MASK_CAUSAL, BENCH_MASK_SLIDING, BENCH_MASK_DOCUMENT};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(s, bench_attn_mask_name(all[i])) == 0) {
            *m = all[i];
            return 0;
        }
    return -1;
}

int bench_attention(int argc, char **argv)
{
    bool json = false, quick = false;
    const char *only = NULL, *mask_name = NULL;
    int64_t B = 1, H = 8, Hkv = 0, L = 0, D = 64, window = 256, docs = 16, reps = 0;
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &json, "one JSON object per line"},
        {"--case", CLI_STRING, &only, "run one default case: sliding32k, sliding8k, causal8k, document16k, decode"},
        {"--quick", CLI_FLAG, &quick, "the default cases at a quarter of their length"},
        {"--mask", CLI_STRING, &mask_name, "custom case: dense|causal|sliding|document (needs --L)"},
        {"--L", CLI_INT, &L, "custom case: sequence length"},
        {"--B", CLI_INT, &B, "custom case: batch (default 1)"},
        {"--H", CLI_INT, &H, "custom case: query heads (default 8)"},
        {"--Hkv", CLI_INT, &Hkv, "custom case: KV heads (default H)"},
        {"--D", CLI_INT, &D, "custom case: head dimension (default 64)"},
        {"--window", CLI_INT, &window, "custom case: sliding window (default 256)"},
        {"--docs", CLI_INT, &docs, "custom case: documents (default 16)"},
        {"--reps", CLI_INT, &reps, "timed pairs per case (default: 1 to 5 by size)"},
    };
    int rc = cli_parse("bench attention", "[--json] [--case NAME | --mask M --L N ...] [--reps N]", argc, argv, opts,
                       sizeof opts / sizeof opts[0], NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : rc;
    if (reps < 0 || reps > 64) {
        cli_error("bench attention: --reps %lld is outside [0, 64] (0: by size)", (long long)reps);
        return CLI_EXIT_USAGE;
    }
    bench_attn_case cases[sizeof default_cases / sizeof default_cases[0]];
    size_t n = 0;
    if (mask_name || L) {
        bench_attn_case c = {"custom", B, H, Hkv ? Hkv : H, L, D, BENCH_MASK_DENSE, window, docs, 3};
        if (!mask_name || parse_mask(mask_name, &c.mask)) {
            cli_error("bench attention: --mask must be dense, causal, sliding or document");
            return CLI_EXIT_USAGE;
        }
        if (L < 1 || B < 1 || H < 1 || D < 1 || c.Hkv < 1 || H % c.Hkv || window < 1 || docs < 1 || docs > L) {
            cli_error("bench attention: custom case needs --L >= 1, B, H, D, window >= 1, H a multiple of Hkv, "
                      "1 <= docs <= L");
            return CLI_EXIT_USAGE;
        }
        /* The buffers are sized in int64 products of these; bound them before they can overflow. */
        double elems = (double)B * (double)H * (double)L * (double)D;
        if (elems > 0x1p36) {
            cli_error("bench attention: custom case --B %lld --H %lld --L %lld --D %lld has %.3g elements per "
                      "tensor, more than 2^36",
                      (long long)B, (long long)H, (long long)L, (long long)D, elems);
            return CLI_EXIT_USAGE;
        }
        if (c.mask != BENCH_MASK_SLIDING)
            c.window = 0;
        cases[n++] = c;
    } else {
        for (size_t i = 0; i < sizeof default_cases / sizeof default_cases[0]; i++)
            if (!only || strcmp(only, default_cases[i].name) == 0) {
                cases[n] = default_cases[i];
                if (quick) {
                    cases[n].L /= 4;
                    cases[n].reps += 2;
                }
                n++;
            }
        if (n == 0 && strcmp(only, "decode") != 0) {
            cli_error("bench attention: unknown case '%s'", only);
            return CLI_EXIT_USAGE;
        }
    }
    if (!json)
        printf("%d threads, path %s; peak measured before each case\n", fx_get_num_threads(),
               fx_isa_name(fx_get_isa()));
    for (size_t i = 0; i < n; i++) {
        if (reps)
            cases[i].reps = (int)reps;
        double peak = bench_fma_peak_gflops(); /* the machine is shared: measured before each case */
        rc = run_case(&cases[i], peak, json);
        if (rc != CLI_EXIT_OK)
            return rc;
        if (cases[i].mask == BENCH_MASK_SLIDING && /* backward / forward (attention_bwd.c) */
            bench_attention_backward_case(cases[i].name, cases[i].B, cases[i].Hq, cases[i].Hkv, cases[i].L,
                                          cases[i].D, cases[i].window, cases[i].reps + 1, bench_fma_peak_gflops(),
                                          json))
            return CLI_EXIT_FAIL;
    }
    if ((!only || strcmp(only, "decode") == 0) && !mask_name && !L && /* decode case (attention_bwd.c) */
        bench_attention_decode_case("decode", 8, 32, 8, 1, quick ? 8192 : 32768, 128, reps ? (int)reps : 5,
                                    bench_triad_gbs(), json))
        return CLI_EXIT_FAIL;
    return CLI_EXIT_OK;
}
