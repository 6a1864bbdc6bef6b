/* flexc bench attention: the benchmark cases (docs/attention.md) and the helpers they share (inputs, masks,
   flop counts, JSON output), so that further attention benchmarks (backward, decoding) reuse
   them. */
#ifndef FX_BENCH_ATTENTION_H
#define FX_BENCH_ATTENTION_H

#include <flexc.h>

#include <stdio.h>

#include "util.h"

typedef enum bench_attn_mask { BENCH_MASK_DENSE, BENCH_MASK_CAUSAL, BENCH_MASK_SLIDING, BENCH_MASK_DOCUMENT } bench_attn_mask;

typedef struct bench_attn_case {
    const char *name;
    int64_t B, Hq, Hkv, L, D;
    bench_attn_mask mask;
    int64_t window; /* sliding window W (0: none) */
    int64_t docs;   /* document mask: number of equal documents */
    int reps;       /* timed pairs */
} bench_attn_case;

/* Inputs of one case: q, k, v, out (and a second out for the peer), lse; and its mask. */
typedef struct bench_attn_data {
    fx_attention a;     /* shape, mask set */
    float *q, *k, *v, *out, *out2, *lse;
    fx_block_mask *mask;
    int64_t *doc_ids;   /* document mask ids [L] */
    fx_mask_sliding_window_ctx sliding;
    fx_mask_document_ctx document;
    double mask_ms;     /* time fx_block_mask_create took */
} bench_attn_data;

/* Allocates random inputs and builds the case's mask (block 128). 0, or 1 after printing
   an error. */
int bench_attn_setup(bench_attn_data *d, const bench_attn_case *c);
void bench_attn_teardown(bench_attn_data *d);
/* Flops of one forward: 2 (D + Dv) per (query, key) pair, over all pairs (dense) or over
   the pairs of visited blocks (density). */
double bench_attn_flops(const fx_attention *a, double density);
const char *bench_attn_mask_name(bench_attn_mask m);

#endif
