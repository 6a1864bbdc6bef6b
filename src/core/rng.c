/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11). */
#include "core.h"

#include <math.h>

#define FX__PHILOX_M0 0xD2511F53u
#define FX__PHILOX_M1 0xCD9E8D57u
#define FX__PHILOX_W0 0x9E3779B9u
#define FX__PHILOX_W1 0xBB67AE85u

void fx_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)FX__PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)FX__PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += FX__PHILOX_W0;
        k1 += FX__PHILOX_W1;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

/* Block `index` of (seed, stream): the counter holds index and stream, the key the seed. */
static void fx__rng_block(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4])
{
    const uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    fx_philox4x32(ctr, key, out);
}

void fx_rng_init(fx_rng *r, uint64_t seed, uint64_t stream)
{
    *r = (fx_rng){.seed = seed, .stream = stream, .counter = 0, .used = 4};
}

uint32_t fx_rng_u32(fx_rng *r)
{
    if (r->used == 4) {
        fx__rng_block(r->seed, r->stream, r->counter++, r->buf);
        r->used = 0;
    }
    return r->buf[r->used++];
}

static float fx__u32_to_unit(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }

float fx_rng_uniform(fx_rng *r) { return fx__u32_to_unit(fx_rng_u32(r)); }

/* Box-Muller on two words; u1 is kept away from 0 so log() stays finite. */
static float fx__normal_from(uint32_t a, uint32_t b)
{
    float u1 = ((float)(a >> 8) + 0.5f) * 0x1p-24f;
    float u2 = fx__u32_to_unit(b);
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

float fx_rng_normal(fx_rng *r)
{
    uint32_t a = fx_rng_u32(r);
    uint32_t b = fx_rng_u32(r);
    return fx__normal_from(a, b);
}

/* Element i uses words 2i and 2i+1 of the stream (block i/2), whatever thread computes it. */
void fx_rng_fill_normal(float *x, int64_t n, float std, uint64_t seed, uint64_t stream)
{
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < (n + 1) / 2; blk++) {
        uint32_t w[4];
        fx__rng_block(seed, stream, (uint64_t)blk, w);
        x[2 * blk] = std * fx__normal_from(w[0], w[1]);
        if (2 * blk + 1 < n)
            x[2 * blk + 1] = std * fx__normal_from(w[2], w[3]);
    }
}

void fx_rng_fill_uniform(float *x, int64_t n, float lo, float hi, uint64_t seed, uint64_t stream)
{
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < (n + 3) / 4; blk++) {
        uint32_t w[4];
        fx__rng_block(seed, stream, (uint64_t)blk, w);
        for (int j = 0; j < 4 && 4 * blk + j < n; j++)
            x[4 * blk + j] = lo + (hi - lo) * fx__u32_to_unit(w[j]);
    }
}
