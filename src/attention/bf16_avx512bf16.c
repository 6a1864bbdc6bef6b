/* The attention's bfloat16 kernels (bf16_dp.h) built for CPUs with vdpbf16ps: the table
   fx__attn16_kernels_for returns only where the CPU has it. */
#include <immintrin.h>

#define FX__ATTN16_TABLE fx__attn16_kernels_avx512bf16
#include "attention/bf16_dp.h"
