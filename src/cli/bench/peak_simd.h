/* The register-only FMA loop of bench_fma_peak_gflops(), written once over the SIMD layer
   (core/simd_avx2.h or core/simd_avx512.h, included first) for peak_avx2.c and
   peak_avx512.c. */
#include "util.h"

enum { CHAINS = 10 }; /* independent accumulators: enough for FMA latency x throughput */

double SIMD_FN(bench_fma_loop)(int64_t iters)
{
    /* Distinct starting values: identical chains would be merged into one by the compiler,
       and the loop would time one FMA chain while counting ten. */
    vf a[CHAINS];
#pragma GCC unroll 10
    for (int c = 0; c < CHAINS; c++)
        a[c] = V_SET1(1.0f + 0.1f * (float)c);
    const vf m = V_SET1(0.9999999f), k = V_SET1(1e-7f);
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 10
        for (int c = 0; c < CHAINS; c++)
            a[c] = V_FMA(a[c], m, k);
    }
    vf s = V_ZERO();
#pragma GCC unroll 10
    for (int c = 0; c < CHAINS; c++)
        s = V_ADD(s, a[c]);
    volatile float sink = V_HSUM(s);
    (void)sink;
    return 2.0 * VL * CHAINS * (double)iters;
}
