/* Which kernels the attention's bfloat16 products take (bf16.h). */
#include "attention/bf16.h"
#include "core/gemm_bf16.h"

#include <stdatomic.h>

bool fx__attn16_cpu(void)
{
#if !defined(FLEXC_REFERENCE_KERNELS) && defined(__x86_64__)
    return fx__gemm_bf16_cpu_path() == &fx__bf16_tiled_dp;
#else
    return false;
#endif
}

static _Atomic(const fx__attn16_kernels *) attn16_forced;

void fx__attn16_force(const fx__attn16_kernels *k) { atomic_store(&attn16_forced, k); }

const fx__attn16_kernels *fx__attn16_kernels_now(void)
{
    const fx__attn16_kernels *k = atomic_load(&attn16_forced);
    if (k)
        return k;
#if !defined(FLEXC_REFERENCE_KERNELS) && defined(__x86_64__)
    if (fx__attn16_cpu())
        return &fx__attn16_kernels_avx512bf16;
#endif
    return NULL;
}
