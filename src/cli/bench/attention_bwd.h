/* The backward and decoding cases of `flexc bench attention` (docs/attention-backward.md). */
#ifndef FX_BENCH_ATTENTION_BWD_H
#define FX_BENCH_ATTENTION_BWD_H

#include <stdbool.h>
#include <stdint.h>

/* Sliding-window case B x H (Hkv kv-heads) x L x D, window W: forward and backward timed alternately in one
   run; prints backward/forward, backward GFLOP/s on visited blocks and its fraction of
   peak_gflops (the FMA peak measured in the same run). 0, or 1 when setup failed. */
int bench_attention_backward_case(const char *name, int64_t B, int64_t H, int64_t Hkv, int64_t L, int64_t D,
                                  int64_t window, int reps, double peak_gflops, bool json);

/* Decoding: B x Hq (Hkv kv-heads) x Lq against Lkv cached keys of width D, the split-KV path
   against the prefill kernel on the same call, and the split-KV path's K+V bandwidth as a
   fraction of triad_gbs (STREAM triad measured in the same run), and once more against
   triad passes timed alternately with it (alt_*: robust to a busy machine). */
int bench_attention_decode_case(const char *name, int64_t B, int64_t Hq, int64_t Hkv, int64_t Lq, int64_t Lkv,
                                int64_t D, int reps, double triad_gbs, bool json);

#endif
