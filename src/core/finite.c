/* Non-finite values: a checkpoint or model whose weights hold a NaN or an infinity would
   load and then produce garbage (or a loss of NaN far from the cause); loaders check every
   tensor once, here, and name the first bad element. Floating-point formats are tested on
   their bits (exponent all ones), so the check needs no FP environment and treats every
   NaN payload alike. */
#include "core/finite.h"

#include <string.h>

static int64_t first_nonfinite_f32_ref(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, 4);
        if ((b & 0x7f800000u) == 0x7f800000u)
            return (int64_t)i;
    }
    return -1;
}

const fx__finite_kernels fx__finite_kernels_scalar = {"scalar", first_nonfinite_f32_ref};
const fx__finite_kernels fx__finite_kernels_avx2 = {"avx2", fx__first_nonfinite_f32_avx2};
const fx__finite_kernels fx__finite_kernels_avx512 = {"avx512", fx__first_nonfinite_f32_avx512};

const fx__finite_kernels *fx__finite_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__finite_kernels_scalar;
#else
    return FX__PER_ISA(isa, &fx__finite_kernels_scalar, &fx__finite_kernels_avx2, &fx__finite_kernels_avx512);
#endif
}

const fx__finite_kernels *fx__finite_kernels_now(void) { return fx__finite_kernels_for(fx__isa()); }

int64_t fx__first_nonfinite_f32(const float *x, size_t n)
{
    return fx__finite_kernels_now()->first_nonfinite_f32(x, n);
}

/* Element i of a little-endian array of `size`-byte words (any alignment). */
static uint64_t word(const unsigned char *p, size_t size, size_t i)
{
    uint64_t w = 0;
    for (size_t k = size; k-- > 0;)
        w = w << 8 | p[i * size + k];
    return w;
}

/* Exponent mask (all ones: infinity or NaN) and sign bit of each float format; E4M3 has no
   infinity and one NaN pattern per sign (S.1111.111). */
static bool float_bits(fx_dtype dt, uint64_t *exp_mask, uint64_t *sign)
{
    switch (dt) {
    case FX_DT_F64: *exp_mask = 0x7ff0000000000000ull, *sign = 1ull << 63; return true;
    case FX_DT_F16: *exp_mask = 0x7c00, *sign = 0x8000; return true;
    case FX_DT_BF16: *exp_mask = 0x7f80, *sign = 0x8000; return true;
    case FX_DT_F8_E5M2: *exp_mask = 0x7c, *sign = 0x80; return true;
    case FX_DT_F8_E4M3: *exp_mask = 0x7f, *sign = 0x80; return true;
    default: return false;
    }
}

int64_t fx__first_nonfinite(const void *data, fx_dtype dt, size_t n)
{
    if (dt == FX_DT_F32) {
        if (((uintptr_t)data & 3) == 0)
            return fx__first_nonfinite_f32(data, n);
        return first_nonfinite_f32_ref(data, n); /* memcpy'd loads: any alignment */
    }
    uint64_t em, sg;
    if (!float_bits(dt, &em, &sg))
        return -1;
    const unsigned char *p = data;
    size_t size = fx_dtype_size(dt);
    for (size_t i = 0; i < n; i++)
        if ((word(p, size, i) & em) == em)
            return (int64_t)i;
    return -1;
}

const char *fx__nonfinite_name(const void *data, fx_dtype dt, size_t i)
{
    uint64_t em = 0x7f800000u, sg = 0x80000000u, w;
    if (dt != FX_DT_F32 && !float_bits(dt, &em, &sg))
        return "finite";
    w = word(data, fx_dtype_size(dt), i);
    if ((w & em) != em)
        return "finite";
    if (dt == FX_DT_F8_E4M3 || (w & ~sg & ~em) != 0)
        return "NaN";
    return w & sg ? "-Inf" : "+Inf";
}
