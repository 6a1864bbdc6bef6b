/* flexc bench attention: the backward pass (backward / forward time on the sliding-window
   cases) and the decoding path (split-KV vs. the prefill kernel, bandwidth vs. triad). */
#include "attention_bwd.h"

#include "attention/backward.h"
#include "util.h"
#include "cli/cli.h"

#include <flexc.h>

#include <stdio.h>
#include <stdlib.h>

typedef struct bwd_bench {
    const fx_attention *a;
    const float *q, *k, *v, *dout;
    float *out, *lse, *dq, *dk, *dv;
    int rc;
} bwd_bench;

static void run_forward(void *p)
{
    bwd_bench *b = p;
    int rc = fx_flex_attention(b->a, b->q, b->k, b->v, b->out, b->lse);
    if (rc != FX_OK)
        b->rc = rc;
}

static void run_backward(void *p)
{
    bwd_bench *b = p;
    int rc = fx_flex_attention_backward(b->a, b->q, b->k, b->v, b->out, b->lse, b->dout, b->dq, b->dk, b->dv);
    if (rc != FX_OK)
        b->rc = rc;
}

static float *bench_alloc(size_t n, float lo, float hi, uint64_t seed)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (p)
        fx_rng_fill_uniform(p, (int64_t)n, lo, hi, seed, 0);
    return p;
}

int bench_attention_backward_case(const char *name, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t D,
                                  int64_t window, int reps, double peak_gflops, bool json)
{
    fx_mask_sliding_window_ctx sw = {.window = window};
    fx_block_mask *m = NULL;
    if (fx_block_mask_create(&m, fx_mask_sliding_window, &sw, 1, 1, L, L, 0, 0) != FX_OK) {
        cli_error("bench attention backward: %s", fx_last_error());
        return 1;
    }
    fx_attention a = {.B = B, .Hq = H, .Hkv = Hkv, .Lq = L, .Lkv = L, .D = D, .Dv = D, .mask = m};
    size_t n = (size_t)(B * H * L * D), nkv = (size_t)(B * Hkv * L * D), nl = (size_t)(B * H * L);
    bwd_bench bb = {.a = &a};
    float *q = bench_alloc(n, -1, 1, 1), *k = bench_alloc(nkv, -1, 1, 2), *v = bench_alloc(nkv, -1, 1, 3);
    float *dout = bench_alloc(n, -1, 1, 4), *out = bench_alloc(n, 0, 0, 5), *lse = bench_alloc(nl, 0, 0, 6);
    float *dq = bench_alloc(n, 0, 0, 7), *dk = bench_alloc(nkv, 0, 0, 8), *dv = bench_alloc(nkv, 0, 0, 9);
    int ret = 1;
    if (!q || !k || !v || !dout || !out || !lse || !dq || !dk || !dv) {
        cli_error("bench attention backward: out of memory");
        goto done;
    }
    bb = (bwd_bench){.a = &a, .q = q, .k = k, .v = v, .dout = dout, .out = out, .lse = lse, .dq = dq, .dk = dk, .dv = dv};
    double t_fwd, t_bwd;
    bench_pair(run_forward, &bb, run_backward, &bb, reps, &t_fwd, &t_bwd);
    if (bb.rc != FX_OK) {
        cli_error("bench attention backward: %s", fx_last_error());
        goto done;
    }
    double density = fx_block_mask_density(m);
    /* Visited blocks, 5 matrix products of the block each: S, dP (D, Dv), dV, dK, dQ. */
    double elems = density * (double)L * (double)L * (double)(B * H);
    double gflops = elems * 2.0 * (3.0 * (double)D + 2.0 * (double)D) / t_bwd * 1e-9;
    double ratio = t_bwd / t_fwd;
    if (json)
        printf("{\"case\":\"%s_backward\",\"B\":%lld,\"H\":%lld,\"Hkv\":%lld,\"L\":%lld,\"D\":%lld,\"window\":%lld,"
               "\"density\":%.5f,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,\"bwd_over_fwd\":%.3f,\"bwd_gflops\":%.1f,"
               "\"peak_gflops\":%.1f,\"bwd_peak_fraction\":%.3f,\"deterministic\":true,\"threads\":%d,"
               "\"isa\":\"%s\",\"reps\":%d}\n",
               name, (long long)B, (long long)H, (long long)Hkv, (long long)L, (long long)D, (long long)window,
               density, t_fwd * 1e3, t_bwd * 1e3, ratio, gflops, peak_gflops, gflops / peak_gflops,
               fx_get_num_threads(), fx_isa_name(fx_get_isa()), reps);
    else
        printf("    backward %7.2f ms  %7.1f GFLOP/s on visited blocks (%.0f%% of peak %.0f); forward %.2f ms, "
               "backward/forward %.2fx (deterministic)\n",
               t_bwd * 1e3, gflops, 100.0 * gflops / peak_gflops, peak_gflops, t_fwd * 1e3, ratio);
    fflush(stdout);
    ret = 0;
done:
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    fx_block_mask_free(m);
    return ret;
}

typedef struct dec_bench {
    const fx_attention *a;
    const float *q, *k, *v;
    float *out, *lse;
    bool split;
    int rc;
} dec_bench;

static void run_decode(void *p)
{
    dec_bench *d = p;
    int rc = d->split ? fx__attention_decode(d->a, d->q, d->k, d->v, d->out, d->lse)
                      : fx__flex_forward(d->a, d->q, d->k, d->v, d->out, d->lse);
    if (rc != FX_OK)
        d->rc = rc;
}

/* One STREAM-triad pass over arrays far beyond the caches, to time alternately with the
   decode runs (the machine is shared: both then see the same neighbours). */
typedef struct triad_pass {
    float *a, *b, *c;
    int64_t n;
} triad_pass;

static void run_triad(void *p)
{
    triad_pass *t = p;
    float *a = t->a;
    const float *b = t->b, *c = t->c;
    int64_t n = t->n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        a[i] = b[i] + 3.0f * c[i];
}

int bench_attention_decode_case(const char *name, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv,
                                int64_t D, int reps, double triad_gbs, bool json)
{
    fx_attention a = {.B = B, .Hq = Hq, .Hkv = Hkv, .Lq = Lq, .Lkv = Lkv, .D = D, .Dv = D, .q_offset = Lkv - Lq};
    size_t nq = (size_t)(B * Hq * Lq * D), nk = (size_t)(B * Hkv * Lkv * D);
    float *q = bench_alloc(nq, -1, 1, 11), *k = bench_alloc(nk, -1, 1, 12), *v = bench_alloc(nk, -1, 1, 13);
    float *o1 = bench_alloc(nq, 0, 0, 14), *o2 = bench_alloc(nq, 0, 0, 15);
    float *l1 = bench_alloc((size_t)(B * Hq * Lq), 0, 0, 16), *l2 = bench_alloc((size_t)(B * Hq * Lq), 0, 0, 17);
    int ret = 1;
    if (!q || !k || !v || !o1 || !o2 || !l1 || !l2) {
        cli_error("bench attention decode: out of memory");
        goto done;
    }
    if (fx__attention_check(&a, q, k, v) != FX_OK) {
        cli_error("bench attention decode: %s", fx_last_error());
        goto done;
    }
    dec_bench split = {.a = &a, .q = q, .k = k, .v = v, .out = o1, .lse = l1, .split = true};
    dec_bench prefill = {.a = &a, .q = q, .k = k, .v = v, .out = o2, .lse = l2, .split = false};
    double t_split, t_prefill;
    bench_pair(run_decode, &split, run_decode, &prefill, reps, &t_split, &t_prefill);
    if (split.rc != FX_OK || prefill.rc != FX_OK) {
        cli_error("bench attention decode: %s", fx_last_error());
        goto done;
    }
    /* The split-KV path against triad passes, alternately. */
    triad_pass tp = {.n = 16 * 1024 * 1024};
    tp.a = bench_alloc((size_t)tp.n, 0, 0, 18), tp.b = bench_alloc((size_t)tp.n, 1, 1, 19);
    tp.c = bench_alloc((size_t)tp.n, 2, 2, 20);
    double t_split2 = 0, t_triad = 0;
    if (tp.a && tp.b && tp.c)
        bench_pair(run_decode, &split, run_triad, &tp, reps, &t_split2, &t_triad);
    free(tp.a), free(tp.b), free(tp.c);
    double max_diff = 0;
    for (size_t i = 0; i < nq; i++) {
        double d = o1[i] > o2[i] ? o1[i] - o2[i] : o2[i] - o1[i];
        max_diff = d > max_diff ? d : max_diff;
    }
    double bytes = 2.0 * (double)nk * sizeof(float);
    double gbs = bytes / t_split * 1e-9;
    double gbs2 = t_split2 > 0 ? bytes / t_split2 * 1e-9 : 0, triad2 = t_triad > 0 ? 12.0 * (double)tp.n / t_triad * 1e-9 : 0;
    if (json)
        printf("{\"case\":\"%s\",\"B\":%lld,\"Hq\":%lld,\"Hkv\":%lld,\"Lq\":%lld,\"Lkv\":%lld,\"D\":%lld,"
               "\"split_ms\":%.3f,\"prefill_ms\":%.3f,\"speedup\":%.3f,\"kv_gbs\":%.2f,\"triad_gbs\":%.2f,"
               "\"triad_fraction\":%.3f,\"alt_kv_gbs\":%.2f,\"alt_triad_gbs\":%.2f,\"alt_triad_fraction\":%.3f,"
               "\"max_abs_diff\":%.3g,\"peer\":\"prefill kernel\",\"threads\":%d,"
               "\"isa\":\"%s\",\"reps\":%d}\n",
               name, (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lkv, (long long)D,
               t_split * 1e3, t_prefill * 1e3, t_prefill / t_split, gbs, triad_gbs, gbs / triad_gbs, gbs2, triad2,
               triad2 > 0 ? gbs2 / triad2 : 0, max_diff, fx_get_num_threads(), fx_isa_name(fx_get_isa()), reps);
    else
        printf("%-12s B=%lld Hq=%lld Hkv=%lld Lq=%lld Lkv=%lld D=%lld: split-KV %.2f ms, prefill kernel %.2f ms "
               "(%.2fx), K+V %.1f GB/s = %.0f%% of triad %.1f GB/s (alternating with triad passes: %.1f of %.1f GB/s, "
               "%.0f%%), max |diff| %.2g\n",
               name, (long long)B, (long long)Hq, (long long)Hkv, (long long)Lq, (long long)Lkv, (long long)D,
               t_split * 1e3, t_prefill * 1e3, t_prefill / t_split, gbs, 100.0 * gbs / triad_gbs, triad_gbs, gbs2,
               triad2, triad2 > 0 ? 100.0 * gbs2 / triad2 : 0, max_diff);
    ret = 0;
done:
    free(q), free(k), free(v), free(o1), free(o2), free(l1), free(l2);
    return ret;
}
