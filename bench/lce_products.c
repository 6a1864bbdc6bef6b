/* How close the fused loss runs to its matrix products: fx_linear_cross_entropy (MEAN loss,
   dh and dw, float32, the automatic plan) against the same products alone, issued as the
   plan issues them on two threads: per chunk of c tokens, the logits of every block of w's
   rows (512 in a tiled plan, 1024 with whole rows: lce.c's lce_vblock), then per block the
   logits again, its dw and its dh partial, each thread taking every other block. Calls in turn (products, fused, products, ...); prints one JSON object with
   the medians and fused / products (1: nothing but the products' time).

   The products use the library's internal fx__sgemm, so link the static library of a build
   without CUDA:

       cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DFLEXC_CUDA=OFF -DFLEXC_MPI=OFF
       cmake --build build-cpu --target flexc_static
       cc -O2 -fopenmp -Iinclude -Isrc bench/lce_products.c build-cpu/libflexc.a -lblis -lm -o lce_products
       OMP_NUM_THREADS=2 ./lce_products 4096 512 32768 5 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "median.h"
#include "core/core.h"
#include "flexc/lce.h"

enum { MAX_REPS = 64 };

static float *filled(size_t n, float scale, unsigned *seed)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++)
        p[i] = scale * ((float)rand_r(seed) / (float)RAND_MAX - 0.5f);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: lce_products N D V REPS\n");
        return 2;
    }
    const int64_t N = atoll(argv[1]), D = atoll(argv[2]), V = atoll(argv[3]);
    const int reps = atoi(argv[4]);
    if (N <= 0 || D <= 0 || V <= 0 || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "lce_products: N, D, V > 0, 1 <= REPS <= %d\n", MAX_REPS);
        return 2;
    }
    fx_lce p = fx_lce_defaults(N, D, V);
    int64_t c, vb;
    size_t ws;
    if (fx_linear_cross_entropy_plan(&p, &c, &vb, &ws) != FX_OK) {
        fprintf(stderr, "lce_products: %s\n", fx_last_error());
        return 1;
    }
    const int64_t BLOCK = vb < V ? 512 : 1024;
    if (V % BLOCK != 0) {
        fprintf(stderr, "lce_products: V = %lld is not a multiple of the plan's %lld-entry blocks\n", (long long)V,
                (long long)BLOCK);
        return 2;
    }
    unsigned seed = 1;
    float *h = filled((size_t)(N * D), 2.0f, &seed), *w = filled((size_t)(V * D), 0.1f, &seed);
    float *dw = calloc((size_t)(V * D), sizeof(float)), *dh = calloc((size_t)(N * D), sizeof(float)), loss;
    int64_t *target = malloc((size_t)N * sizeof *target);
    float *z = malloc(2 * (size_t)(BLOCK * c) * sizeof(float)), *part = malloc(2 * (size_t)(c * D) * sizeof(float));
    if (!h || !w || !dw || !dh || !target || !z || !part) {
        fprintf(stderr, "lce_products: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < N; i++)
        target[i] = rand_r(&seed) % V;

    const int64_t nch = (N + c - 1) / c, nb = V / BLOCK;
    double t_prod[MAX_REPS], t_fused[MAX_REPS], ratio[MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = fx__seconds();
        for (int64_t q = 0; q < nch; q++) {
            const int64_t n0 = q * (N / nch) + (q < N % nch ? q : N % nch), cc = N / nch + (q < N % nch);
            const float *hc = h + n0 * D;
#pragma omp parallel num_threads(2)
            {
                const int t = omp_get_thread_num();
                float *zt = z + t * BLOCK * c, *dp = part + t * c * D;
                for (int64_t b = t; b < nb; b += 2) /* the logits for every token's lse */
                    fx__sgemm(false, true, BLOCK, cc, D, 1.0f, w + b * BLOCK * D, D, hc, D, 0.0f, zt, cc);
#pragma omp barrier
                for (int64_t b = t; b < nb; b += 2) { /* again, then dw and dh */
                    fx__sgemm(false, true, BLOCK, cc, D, 1.0f, w + b * BLOCK * D, D, hc, D, 0.0f, zt, cc);
                    fx__sgemm(false, false, BLOCK, D, cc, 1.0f, zt, cc, hc, D, 1.0f, dw + b * BLOCK * D, D);
                    fx__sgemm(true, false, cc, D, BLOCK, 1.0f, zt, cc, w + b * BLOCK * D, D, b > t ? 1.0f : 0.0f, dp, D);
                }
            }
        }
        t_prod[r] = fx__seconds() - t0;
        t0 = fx__seconds();
        if (fx_linear_cross_entropy(&p, h, w, NULL, target, &loss, NULL, dh, dw, NULL) != FX_OK) {
            fprintf(stderr, "lce_products: %s\n", fx_last_error());
            return 1;
        }
        t_fused[r] = fx__seconds() - t0;
        ratio[r] = t_fused[r] / t_prod[r];
    }
    printf("{\"case\":\"lce_products\",\"N\":%lld,\"D\":%lld,\"V\":%lld,\"chunk\":%lld,\"vocab_chunk\":%lld,"
           "\"block\":%lld,\"scratch_bytes\":%zu,\"reps\":%d,\"products_s\":%.4f,\"fused_s\":%.4f,\"fused_over_products\":%.3f}\n",
           (long long)N, (long long)D, (long long)V, (long long)c, (long long)vb, (long long)BLOCK, ws, reps, median(t_prod, reps),
           median(t_fused, reps), median(ratio, reps));
    free(h), free(w), free(dw), free(dh), free(target), free(z), free(part);
    return 0;
}
