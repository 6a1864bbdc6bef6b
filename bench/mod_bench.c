/* Expression mods against their built-in twins (docs/attention.md, "Mods as expressions"):
   forward and forward + backward of B x H x L x D causal attention with softcap, ALiBi and
   rel_bias, each as the built-in and as the hand-written expression. Prints the times and the
   ratios. Build: cc -O2 bench/mod_bench.c -Iinclude BUILD/libflexc.a -lm -fopenmp -ljansson ...
   (or link the shared library); run: mod_bench [L] [reps] [mod] [--cpu] (mod: softcap, alibi or
   rel_bias alone; --cpu: process CPU seconds instead of wall seconds, less sensitive to other
   processes taking a core). Each rep runs the built-in, then the expression. */
#include <flexc.h>
#include <flexc/mod.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool use_cpu;

static double now(void)
{
    struct timespec t;
    clock_gettime(use_cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--cpu")) {
            use_cpu = true;
            for (int j = i; j < argc - 1; j++)
                argv[j] = argv[j + 1];
            argc--;
            break;
        }
    const int64_t B = 1, H = 8, L = argc > 1 ? atoll(argv[1]) : 4096, D = 64;
    const int reps = argc > 2 ? atoi(argv[2]) : 2;
    size_t n = (size_t)(B * H * L * D);
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *o = malloc(n * 4), *dout = malloc(n * 4),
          *lse = malloc((size_t)(B * H * L) * 4), *dq = malloc(n * 4), *dk = malloc(n * 4), *dv = malloc(n * 4);
    uint32_t r = 1;
    for (size_t i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u, q[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        r = r * 1664525u + 1013904223u, k[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        r = r * 1664525u + 1013904223u, v[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
        dout[i] = q[i] * 0.5f;
    }
    float slopes[8], bias[8 * 256], gbias[8 * 256] = {0}, gbias2[8 * 256] = {0};
    for (int h = 0; h < 8; h++)
        slopes[h] = 1.0f / (float)(1 << (h + 1));
    for (int i = 0; i < 8 * 256; i++)
        bias[i] = 0.01f * (float)(i % 17);
    fx_score_softcap_ctx sc = {.cap = 5.0f};
    fx_score_alibi_ctx al = {.slopes = slopes};
    fx_score_rel_bias_ctx rb = {.table = bias, .grad_table = gbias, .size = 256, .zero = 128, .heads = 8};
    fx_mod_tensor t[2] = {{.name = "slopes", .dtype = FX_DT_F32, .ndim = 1, .shape = {8}, .data = slopes},
                          {.name = "bias", .dtype = FX_DT_F32, .ndim = 2, .shape = {8, 256}, .data = bias,
                           .grad = gbias2}};
    struct {
        const char *name, *expr;
        fx_score_fn fn;
        fx_score_grad_fn grad;
        const void *ctx;
    } c[] = {
        {"softcap", "5 * tanh(score / 5)", fx_score_softcap, fx_score_softcap_grad, &sc},
        {"alibi", "score + slopes[h] * (kv_idx - q_idx)", fx_score_alibi, fx_score_alibi_grad, &al},
        {"rel_bias", "score + bias[h, clamp(q_idx - kv_idx + 128, 0, 255)]", fx_score_rel_bias,
         fx_score_rel_bias_grad, &rb},
    };
    fx_block_mask *m;
    if (fx_block_mask_create(&m, fx_mask_causal, NULL, 1, 1, L, L, 0, 0) != FX_OK)
        return 1;
    printf("%lldx%lldx%lldx%lld causal, %d threads, best of %d (%s seconds)\n", (long long)B, (long long)H,
           (long long)L, (long long)D, fx_get_num_threads(), reps, use_cpu ? "CPU" : "wall");
    printf("%-9s %10s %10s %6s %12s %12s %6s\n", "mod", "fwd built", "fwd expr", "ratio", "f+b built",
           "f+b expr", "ratio");
    for (int i = 0; i < 3; i++) {
        if (argc > 3 && strcmp(argv[3], c[i].name))
            continue;
        fx_mod *mod;
        if (fx_mod_compile(&mod, c[i].expr, t, 2) != FX_OK) {
            fprintf(stderr, "%s\n", fx_last_error());
            return 1;
        }
        double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};
        for (int rep = 0; rep < reps; rep++)
            for (int e = 0; e < 2; e++) {
                fx_attention a = fx_attention_defaults(B, H, H, L, L, D);
                a.mask = m;
                a.score_mod = e ? fx_mod_score : c[i].fn;
                a.score_mod_grad = e ? fx_mod_score_grad : c[i].grad;
                a.score_ctx = e ? (const void *)mod : c[i].ctx;
                double t0 = now();
                if (fx_flex_attention(&a, q, k, v, o, lse) != FX_OK)
                    return 1;
                double t1 = now();
                if (fx_flex_attention_backward(&a, q, k, v, o, lse, dout, dq, dk, dv) != FX_OK)
                    return 1;
                double t2 = now();
                best[e][0] = t1 - t0 < best[e][0] ? t1 - t0 : best[e][0];
                best[e][1] = t2 - t0 < best[e][1] ? t2 - t0 : best[e][1];
            }
        printf("%-9s %9.1fms %9.1fms %5.2fx %11.1fms %11.1fms %5.2fx\n", c[i].name, 1e3 * best[0][0],
               1e3 * best[1][0], best[1][0] / best[0][0], 1e3 * best[0][1], 1e3 * best[1][1],
               best[1][1] / best[0][1]);
        fx_mod_free(mod);
    }
    fx_block_mask_free(m);
    return 0;
}
