/* The bfloat16 GEMM of `--dtype bf16` (fx__gemm_bf16, whichever path the CPU takes: AMX tiles
   where it has AMX-BF16, vdpbf16ps on AMD CPUs with AVX512-BF16, else float32 products of the
   bfloat16 values) against the float32 GEMM
   (fx__sgemm) on the same operands, at the projections' shapes of the `small` and `gpt2`
   models (a step's forward x W^T, backward dy W and dy^T x). Calls in turn (bf16, f32, and
   where the CPU has vdpbf16ps but takes another path, the vdpbf16ps path forced), medians;
   prints one JSON object per shape with the rates and bf16 / f32 speed.
   Threads: OMP_NUM_THREADS. Built by CMake as bench_gemm_bf16 (and into the GPU bundle, so
   that scripts/gpu-check.sh measures the GPU machine's CPU too).

       OMP_NUM_THREADS=2 build/bench_gemm_bf16 [REPS] */
#include <stdio.h>
#include <stdlib.h>

#include "gemm_bf16_shapes.h"
#include "median.h"
#include "core/gemm_bf16.h"

enum { MAX_REPS = 64 };

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (argc > 2 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_gemm_bf16 [REPS (1..%d, default 7)]\n", MAX_REPS);
        return 2;
    }
    const bench_gemm_shape *shapes = bench_gemm_step_shapes;
    const fx__bf16_tiled *cpu = fx__gemm_bf16_cpu_path();
    const char *path = cpu == &fx__bf16_tiled_amx ? "AMX" : cpu == &fx__bf16_tiled_dp ? "vdpbf16ps" : "float32";
    const bool dp_too = fx__cpu_avx512bf16() && cpu != &fx__bf16_tiled_dp;
    for (size_t s = 0; s < BENCH_GEMM_STEP_SHAPES; s++) {
        const int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        const bool ta = shapes[s].ta, tb = shapes[s].tb;
        float *A = malloc((size_t)(M * K) * sizeof(float)), *B = malloc((size_t)(K * N) * sizeof(float));
        float *C = malloc((size_t)(M * N) * sizeof(float)), *ws = malloc(fx__gemm_bf16_ws(M, N, K) * sizeof(float));
        if (!A || !B || !C || !ws) {
            fprintf(stderr, "bench_gemm_bf16: out of memory\n");
            return 1;
        }
        bench_gemm_operands(&shapes[s], A, B);
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        double t16[MAX_REPS], t32[MAX_REPS], tdp[MAX_REPS];
        for (int r = -1; r < reps; r++) { /* r = -1: a warm-up of each */
            double t0 = fx__seconds();
            fx__gemm_bf16(ta, tb, M, N, K, fx__bf16_of_f32(A), lda, fx__bf16_of_f32(B), ldb, 0.0f, C, N, ws);
            const double a = fx__seconds() - t0;
            t0 = fx__seconds();
            fx__sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
            const double b = fx__seconds() - t0;
            double c = 0.0;
            if (dp_too) {
                fx__gemm_bf16_force_tiled(&fx__bf16_tiled_dp);
                t0 = fx__seconds();
                fx__gemm_bf16(ta, tb, M, N, K, fx__bf16_of_f32(A), lda, fx__bf16_of_f32(B), ldb, 0.0f, C, N, ws);
                c = fx__seconds() - t0;
                fx__gemm_bf16_force_tiled(NULL);
            }
            if (r >= 0)
                t16[r] = a, t32[r] = b, tdp[r] = c;
        }
        const double m16 = median(t16, reps), m32 = median(t32, reps), gf = 2e-9 * (double)(M * N * K);
        printf("{\"case\":\"gemm_bf16\",\"shape\":\"%s\",\"M\":%lld,\"N\":%lld,\"K\":%lld,\"bf16_path\":\"%s\","
               "\"threads\":%d,\"reps\":%d,\"bf16_gflops\":%.1f,\"f32_gflops\":%.1f,\"bf16_over_f32\":%.2f",
               shapes[s].name, (long long)M, (long long)N, (long long)K, path, fx_get_num_threads(), reps, gf / m16,
               gf / m32, m32 / m16);
        if (dp_too)
            printf(",\"vdpbf16ps_gflops\":%.1f", gf / median(tdp, reps));
        printf("}\n");
        free(A), free(B), free(C), free(ws);
    }
    return 0;
}
