/* The AVX2 FMA loop of bench_fma_peak_gflops(). */
#include "core/simd_avx2.h"
#include "peak_simd.h"
