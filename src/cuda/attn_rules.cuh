/* The rules every attention kernel applies (attention.cu's scalar kernels, the tensor-core
   forward and backward, the decoding kernel), written once: the built-in score mods and their
   derivative, the block mask's slots and bits, and the fast base-2 exponential the
   tensor-core kernels and the decoding kernel compute probabilities with. */
#ifndef FX_CUDA_ATTN_RULES_CUH
#define FX_CUDA_ATTN_RULES_CUH

#include "cuda/common.cuh"

namespace fxcu {

constexpr float LOG2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

/* The rel_bias entry of distance d: clamp(d + zero, 0, size - 1), without overflow. */
__device__ __forceinline__ int64_t rel_entry(const fx__cu_attn &a, int64_t d)
{
    if (a.tzero > 0 && d > INT64_MAX - a.tzero)
        return a.tsize - 1;
    if (a.tzero < 0 && d < INT64_MIN - a.tzero)
        return 0;
    const int64_t e = d + a.tzero;
    return e < 0 ? 0 : e >= a.tsize ? a.tsize - 1 : e;
}

/* The modified score of raw score s (query qpos, key kpos, query head h). */
__device__ __forceinline__ float score_mod(const fx__cu_attn &a, float s, int64_t h, int64_t qpos, int64_t kpos)
{
    switch (a.mod) {
    case FX__CU_MOD_ALIBI:
        return s + a.slopes[h] * (float)(kpos - qpos);
    case FX__CU_MOD_SOFTCAP:
        return a.cap * tanhf(s / a.cap);
    case FX__CU_MOD_REL_BIAS:
        return s + a.table[(a.theads == 1 ? 0 : h) * a.tsize + rel_entry(a, qpos - kpos)];
    default:
        return s;
    }
}

/* Gradient w.r.t. the raw score s from g, the gradient w.r.t. the modified one. */
__device__ __forceinline__ float score_grad(const fx__cu_attn &a, float s, float g)
{
    if (a.mod == FX__CU_MOD_SOFTCAP) {
        const float t = tanhf(s / a.cap);
        return g * (1.0f - t * t);
    }
    return g;
}

/* Bit (i, j) of the bitmap at word offset off. */
__device__ __forceinline__ bool mask_bit(const fx__cu_mask &m, int64_t off, int64_t i, int64_t j)
{
    return (m.bits[off + i * m.bm_words + (j >> 6)] >> (j & 63)) & 1u;
}

/* The mask's (batch, head) slot: a mask made for one batch or one head serves all. */
__device__ __forceinline__ int64_t mask_slot(const fx__cu_mask &m, int64_t b, int64_t h)
{
    return (m.B == 1 ? 0 : b) * m.H + (m.H == 1 ? 0 : h);
}

/* 2^x; -inf gives 0. On a GPU the hardware's approximation (2 ulp, subnormal results flushed
   to zero): exp2f's handling of results below 2^-126 costs instructions per pair. */
__device__ __forceinline__ float exp2_fast(float x)
{
#ifdef FX_CUDA_EMU
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

} // namespace fxcu

#endif
