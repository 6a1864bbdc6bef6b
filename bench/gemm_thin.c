/* The float32 GEMM's thin path (src/core/sgemm.h: one side of C at most 48 wide) against its
   tiled path on the same operands, at the shapes of a LoRA step on SmolLM2-135M (rank 16,
   batch 4 x 512 tokens: N = 2048 rows; the adapters' u = x A^T, d(u) = dy B, dB = dy^T u,
   dA = d(u)^T x, their inputs' rows as far apart as in the step). Calls in turn, medians;
   checks that the two agree to the bit; prints one JSON object per shape with both rates and
   thin / tiled speed. AVX-512 CPUs only (the thin path's). Threads: OMP_NUM_THREADS.

       OMP_NUM_THREADS=2 build/bench_gemm_thin [REPS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "median.h"
#include "core/sgemm.h"

enum { MAX_REPS = 64 };

typedef struct thin_shape {
    const char *what;
    bool ta, tb;
    int64_t M, N, K, lda; /* lda: op(A)'s rows (columns where ta) this far apart */
} thin_shape;

static const thin_shape shapes[] = {
    {"u = x A^T, q k v (3 adapters)", false, true, 2048, 48, 576, 576},
    {"u = x A^T, down", false, true, 2048, 16, 1536, 1536},
    {"d(u) = dy B, o", false, false, 2048, 16, 576, 576},
    {"d(u) = dy B, gate (dy of gate and up)", false, false, 2048, 16, 1536, 3072},
    {"dB = dy^T u, o", true, false, 576, 16, 2048, 576},
    {"dB = dy^T u, gate", true, false, 1536, 16, 2048, 3072},
    {"dA = d(u)^T x, q k v", true, false, 48, 576, 2048, 48},
    {"dA = d(u)^T x, down", true, false, 16, 1536, 2048, 16},
};

static float *random_floats(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; p && i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    return p;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 15;
    if (argc > 2 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_gemm_thin [REPS (1..%d, default 15)]\n", MAX_REPS);
        return 2;
    }
    if (fx_get_isa() != FX_ISA_AVX512) {
        fprintf(stderr, "bench_gemm_thin: the thin path needs AVX-512\n");
        return 1;
    }
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const thin_shape *g = &shapes[s];
        const int64_t M = g->M, N = g->N, K = g->K, lda = g->lda, ldb = g->tb ? K : N;
        const size_t na = (size_t)((g->ta ? K : M) * lda), nb = (size_t)(K * N), nc = (size_t)(M * N);
        float *A = random_floats(na, 1), *B = random_floats(nb, 2), *C1 = random_floats(nc, 3);
        float *C2 = malloc(nc * sizeof(float));
        float *ws = malloc(fx__sgemm_tiled_ws(M, N, K) * sizeof(float));
        float *wt = malloc(fx__sgemm_thin_ws(M, N, K, fx_get_num_threads()) * sizeof(float));
        if (!A || !B || !C1 || !C2 || !ws || !wt) {
            fprintf(stderr, "bench_gemm_thin: out of memory\n");
            return 1;
        }
        memcpy(C2, C1, nc * sizeof(float));
        double tiled[MAX_REPS], thin[MAX_REPS];
        for (int r = 0; r < reps; r++) { /* C += op(A) op(B) each call, both sides alike */
            double t0 = fx__seconds();
            fx__sgemm_tiled(&fx__sgemm_path_avx512, FX__SG_AUTO, g->ta, g->tb, M, N, K, 1.0f, fx__sgemm_f32(A), lda,
                            fx__sgemm_f32(B), ldb, 1.0f, C1, N, ws);
            tiled[r] = fx__seconds() - t0;
            t0 = fx__seconds();
            fx__sgemm_thin(g->ta, g->tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C2, N, wt);
            thin[r] = fx__seconds() - t0;
        }
        const double gf = 2e-9 * (double)(M * N * K), a = gf / median(tiled, reps), b = gf / median(thin, reps);
        printf("{\"shape\": \"%s\", \"ta\": %d, \"tb\": %d, \"M\": %lld, \"N\": %lld, \"K\": %lld, \"lda\": %lld, "
               "\"tiled_gflops\": %.1f, \"thin_gflops\": %.1f, \"thin_over_tiled\": %.2f, \"bitwise\": %s}\n",
               g->what, g->ta, g->tb, (long long)M, (long long)N, (long long)K, (long long)lda, a, b, b / a,
               memcmp(C1, C2, nc * sizeof(float)) ? "false" : "true");
        free(A), free(B), free(C1), free(C2), free(ws), free(wt);
    }
    return 0;
}
