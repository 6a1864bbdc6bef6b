/* flexc bench train --gemm: how fast the step's matrix products run, shape by shape, against
   the same GEMM (fx__sgemm) called alone on operands already in cache, and against BLIS
   running each shape alone with its own threading. */
#include "util.h"
#include "core/core.h"

#include <flexc.h>

#include <stdio.h>
#include <stdlib.h>

void bench_gemm_report(const fx__gemm_shape *shapes, int n, int64_t dropped, int steps, double step_s, bool json)
{
    double step_gemm = 0.0, step_alone = 0.0, step_blis = 0.0, step_flops = 0.0;
    if (!json)
        printf("  matrix products per step (outside the fused loss), against the same GEMM alone and one float32 BLIS "
               "call\n  (in: f32, or bf16 with A's and B's storage, h bfloat16 or f float32 rounded as read):\n"
               "    %-3s %-7s %6s %6s %6s %6s %9s %9s %9s %7s %9s\n", "op", "in", "M", "N", "K", "calls", "ms",
               "GFLOP/s", "alone", "ratio", "BLIS");
    for (int i = 0; i < n && steps > 0; i++) {
        const fx__gemm_shape *g = &shapes[i];
        const double flops = 2.0 * (double)g->M * (double)g->N * (double)g->K;
        const double alone = bench_gemm_seconds(false, g), blis = bench_gemm_seconds(true, g);
        if (alone < 0.0 || blis < 0.0) {
            fprintf(stderr, "bench train --gemm: out of memory\n");
            return;
        }
        const double per_call = g->seconds / (double)g->calls, calls = (double)g->calls / steps;
        step_gemm += g->seconds / steps;
        step_alone += alone * calls;
        step_blis += blis * calls;
        step_flops += flops * calls;
        char in[8] = "f32";
        if (g->bf16)
            snprintf(in, sizeof in, "bf16 %c%c", g->a16 ? 'h' : 'f', g->b16 ? 'h' : 'f');
        if (!json)
            printf("    %c%c  %-7s %6lld %6lld %6lld %6.1f %9.2f %9.1f %9.1f %7.3f %9.1f\n", g->ta ? 'T' : 'N',
                   g->tb ? 'T' : 'N', in, (long long)g->M, (long long)g->N, (long long)g->K, calls,
                   1e3 * g->seconds / steps, flops / per_call * 1e-9, flops / alone * 1e-9, alone / per_call,
                   flops / blis * 1e-9);
    }
    if (json)
        printf("{\"case\":\"train_gemm\",\"shapes\":%d,\"dropped_calls\":%lld,\"steps\":%d,\"step_s\":%.4f,"
               "\"gemm_s\":%.4f,\"gemm_share\":%.3f,\"gemm_gflops\":%.1f,\"alone_s\":%.4f,\"alone_gflops\":%.1f,"
               "\"ratio\":%.3f,\"blis_alone_s\":%.4f,\"blis_alone_gflops\":%.1f,\"ratio_blis\":%.3f}\n",
               n, (long long)dropped, steps, step_s, step_gemm, step_gemm / step_s, step_flops / step_gemm * 1e-9,
               step_alone, step_flops / step_alone * 1e-9, step_alone / step_gemm, step_blis,
               step_flops / step_blis * 1e-9, step_blis / step_gemm);
    else
        printf("  all: %.3f s of the %.3f s step (%.0f%%), %.1f GFLOP/s; the same GEMM alone at the same shapes "
               "%.1f GFLOP/s: the step's matrix work runs at %.0f%% of its rate (BLIS alone: %.1f GFLOP/s)%s\n",
               step_gemm, step_s, 100.0 * step_gemm / step_s, step_flops / step_gemm * 1e-9,
               step_flops / step_alone * 1e-9, 100.0 * step_alone / step_gemm, step_flops / step_blis * 1e-9,
               dropped ? " (some shapes not traced)" : "");
}
