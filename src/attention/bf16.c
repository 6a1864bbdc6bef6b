/* The kernel table of the attention's bfloat16 products (bf16.h). */
#include "attention/bf16.h"
#include "core/gemm_bf16.h"

#include <stdatomic.h>

const fx__attn16_kernels *fx__attn16_kernels_for(fx_isa isa)
{
#if !defined(FLEXC_REFERENCE_KERNELS) && defined(__x86_64__)
    if (fx__gemm_bf16_kernels_for(isa) == &fx__bf16_tiled_dp)
        return &fx__attn16_kernels_avx512bf16;
#else
    (void)isa;
#endif
    return NULL;
}

bool fx__attn16_cpu(void) { return fx__attn16_kernels_for(fx__isa()) != NULL; }

static _Atomic(const fx__attn16_kernels *) attn16_forced;

void fx__attn16_force(const fx__attn16_kernels *k) { atomic_store(&attn16_forced, k); }

const fx__attn16_kernels *fx__attn16_kernels_now(void)
{
    const fx__attn16_kernels *k = atomic_load(&attn16_forced);
    return k ? k : fx__attn16_kernels_for(fx__isa());
}
