/*
 * Counter-based random numbers (Philox-4x32-10).
 *
 * A number depends only on (seed, stream, index), never on which thread asks for it or in
 * which order, so anything filled from it is the same at any thread count:
 *
 *     fx_rng r;
 *     fx_rng_init(&r, 1234, 0);            // seed 1234, stream 0
 *     float u = fx_rng_uniform(&r);         // [0, 1)
 *     fx_rng_fill_normal(w, n, 0.02f, 1234, 7);   // element i from (1234, 7, i): thread-independent
 *
 * The state is a plain struct that can be saved and restored (checkpoints do).
 */
#ifndef FLEXC_RNG_H
#define FLEXC_RNG_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fx_rng {
    uint64_t seed;
    uint64_t stream;
    uint64_t counter; /* index of the next 4-word block */
    uint32_t buf[4];  /* the current block */
    uint32_t used;    /* words of buf already handed out (4: refill) */
} fx_rng;

/* One Philox-4x32-10 block: out = philox(ctr, key). */
FX_API void fx_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

FX_API void fx_rng_init(fx_rng *r, uint64_t seed, uint64_t stream);
FX_API uint32_t fx_rng_u32(fx_rng *r);
/* Uniform in [0, 1) with 24 random bits. */
FX_API float fx_rng_uniform(fx_rng *r);
/* Standard normal (Box-Muller). */
FX_API float fx_rng_normal(fx_rng *r);

/* x[i] = std * N(0,1) drawn from (seed, stream, i); parallel and thread-count independent. */
FX_API void fx_rng_fill_normal(float *x, int64_t n, float std, uint64_t seed, uint64_t stream);
/* x[i] = lo + (hi - lo) * U[0,1) drawn from (seed, stream, i), in float: the rounding can give
   hi itself, so values lie in [lo, hi]. hi - lo must be finite (else some values are inf or NaN). */
FX_API void fx_rng_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed, uint64_t stream);

#ifdef __cplusplus
}
#endif
#endif
