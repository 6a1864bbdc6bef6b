/* The shapes at which bench/gemm_bf16.c and bench/gemm_bf16_onednn.c time the bfloat16 GEMM:
   the projections of the `small` model (1024 tokens, dim 384, ffn 1024) and of the GPT-2
   124M shape (256 tokens, 768, 3072), as a step's forward x W^T and backward dy W and dy^T x. */
#ifndef FX_BENCH_GEMM_BF16_SHAPES_H
#define FX_BENCH_GEMM_BF16_SHAPES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/gemm_bf16.h"

typedef struct bench_gemm_shape {
    const char *name;
    int64_t M, N, K;
    bool ta, tb;
} bench_gemm_shape;

enum { BENCH_GEMM_STEP_SHAPES = 6 };

static const bench_gemm_shape bench_gemm_step_shapes[BENCH_GEMM_STEP_SHAPES] = {
    {"small x W^T", 1024, 1024, 384, false, true}, {"small dy W", 1024, 384, 1024, false, false},
    {"small dy^T x", 1024, 384, 1024, true, false}, {"gpt2 x W^T", 256, 3072, 768, false, true},
    {"gpt2 dy W", 256, 768, 3072, false, false},   {"gpt2 dy^T x", 3072, 768, 256, true, false},
};

/* The operands of a shape, A [M * K] and B [K * N]: the same pseudo-random values in [-0.5,
   0.5] in both benchmarks, rounded to bfloat16 (so that every storage holds them exactly). */
static inline void bench_gemm_operands(const bench_gemm_shape *sh, float *A, float *B)
{
    unsigned seed = 1;
    for (int64_t i = 0; i < sh->M * sh->K; i++)
        A[i] = fx__bf16_round((float)rand_r(&seed) / (float)RAND_MAX - 0.5f);
    for (int64_t i = 0; i < sh->K * sh->N; i++)
        B[i] = fx__bf16_round((float)rand_r(&seed) / (float)RAND_MAX - 0.5f);
}

#endif
