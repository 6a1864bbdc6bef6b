/* Measurement helpers for `flexc bench` (bench/README.md): wall-clock medians of alternating runs,
   and this machine's limits measured in the same run: fp32 FMA peak, STREAM-triad bandwidth
   and float32 GEMM throughput (flexc's own and BLIS's). */
#ifndef FX_BENCH_UTIL_H
#define FX_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/core.h" /* fx__seconds(): the clock of every measurement */
#include "model/model.h"   /* fx__model_data */

/* The median of x[0..n) (sorts x in place). */
double bench_median(double *x, int n);

typedef void (*bench_fn)(void *ctx);
/* Runs each once to warm up, then a, b, a, b, ... `reps` pairs; medians in seconds. */
void bench_pair(bench_fn a, void *ctx_a, bench_fn b, void *ctx_b, int reps, double *med_a, double *med_b);
/* As bench_pair, but b is warmed up only when a's warm-up took under warm_b_below seconds, so
   that a slow peer (a dense 32768-token forward) is not run once more for nothing. */
void bench_pair_warm(bench_fn a, void *ctx_a, bench_fn b, void *ctx_b, int reps, double warm_b_below, double *med_a,
                     double *med_b);
/* Median seconds of `reps` runs after one warm-up. */
double bench_time(bench_fn f, void *ctx, int reps);

/* fp32 FMA peak in GFLOP/s on all flexc threads: a register-only FMA loop with the widest
   vectors the CPU path allows. */
double bench_fma_peak_gflops(void);
/* STREAM triad a[i] = b[i] + s*c[i] bandwidth in GB/s (3 x 4 bytes per element counted). */
double bench_triad_gbs(void);
/* What waking and joining flexc's threads costs, in microseconds: an empty parallel region,
   and a barrier inside one (the best of 5 runs of 1000 each). With OMP_WAIT_POLICY=passive
   each is a sleep and a wake-up of the threads; spinning threads make it a few cache misses.
   0 for both on one thread. */
void bench_sync_us(double *region_us, double *barrier_us);
/* Median seconds of one GEMM C[M,N] = op(A) op(B) of g's shape (core.h) on random operands
   after a warm-up: the library's own on flexc's threads (fx__gemm_bf16 with g's operand
   storage where g->bf16, else fx__sgemm), or, with blis, one float32 BLIS call on BLIS's own
   threads (its default settings, flexc's thread count); -1 when the operands cannot be
   allocated. */
double bench_gemm_seconds(bool blis, const fx__gemm_shape *g);
/* C[M,N] = A[M,K] B[K,N]^T in GFLOP/s (bench_gemm_seconds; 0 without memory). */
double bench_sgemm_gflops(bool blis, int64_t M, int64_t N, int64_t K);

/* Per-thread FMA loops of each width: flops done in `iters` iterations (called inside an
   OpenMP region by bench_fma_peak_gflops). */
double bench_fma_loop_scalar(int64_t iters);
double bench_fma_loop_avx2(int64_t iters);
double bench_fma_loop_avx512(int64_t iters);

/* The matrix products of `steps` traced training steps (`bench train --gemm`, core.h's trace):
   per shape, the time the steps spent in it against the same GEMM called alone on operands
   already in cache (bench_gemm_seconds), and against one BLIS call of that shape on BLIS's
   own threads; and the totals; a table, or one JSON line. step_s: the traced steps' mean
   seconds. */
void bench_gemm_report(const fx__gemm_shape *shapes, int n, int64_t dropped, int steps, double step_s,
                       bool json);

/* A training benchmark's data: n random tokens in [0, vocab) (the speed and memory do not
   depend on the text), all but the last window of seq + 1 for training, and a batch x seq
   buffer each for a step's tokens and targets. */
typedef struct bench_train_data {
    fx__model_data d;
    int32_t *tok, *tgt;
} bench_train_data;

/* false (the error printed, nothing held) without memory. */
bool bench_train_data_new(bench_train_data *b, int64_t n, int64_t seq, int64_t batch, int64_t vocab);
void bench_train_data_free(bench_train_data *b);

/* Maximum resident set size of this process, in bytes. */
size_t bench_max_rss(void);

#endif
