/* The AVX-512 FMA loop of bench_fma_peak_gflops(). */
#include "core/simd_avx512.h"
#include "peak_simd.h"
