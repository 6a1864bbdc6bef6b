/* The CPU path (fx_get_isa, FLEXC_ISA, fx_set_isa) and the CPU features beyond it: what every
   module's kernel table is chosen by (docs/dispatch.md). */
#include "core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static fx_isa fx__isa_supported(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(FLEXC_REFERENCE_KERNELS)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma"))
        return FX_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return FX_ISA_AVX2;
#endif
    return FX_ISA_SCALAR;
}

/* -1: not decided yet. Decided once from the CPU and FLEXC_ISA; fx_set_isa() overrides. */
static atomic_int fx__isa_now = -1;

static fx_isa fx__isa_from_env(fx_isa best)
{
    const char *env = getenv("FLEXC_ISA");
    if (!env || !*env)
        return best;
    fx_isa want = best;
    if (!strcmp(env, "scalar"))
        want = FX_ISA_SCALAR;
    else if (!strcmp(env, "avx2"))
        want = FX_ISA_AVX2;
    else if (!strcmp(env, "avx512"))
        want = FX_ISA_AVX512;
    else
        fx__log(FX_LOG_WARN, "FLEXC_ISA=%s is not scalar, avx2 or avx512; ignored", env);
    return want < best ? want : best;
}

fx_isa fx_get_isa(void)
{
    int isa = atomic_load(&fx__isa_now);
    if (isa < 0) {
        isa = (int)fx__isa_from_env(fx__isa_supported());
        atomic_store(&fx__isa_now, isa);
    }
    return (fx_isa)isa;
}

int fx_set_isa(fx_isa isa)
{
    if (isa < FX_ISA_SCALAR || isa > FX_ISA_AVX512)
        return fx__error(FX_EINVAL, "isa %d is not an fx_isa", (int)isa);
    if (isa > fx__isa_supported())
        return fx__error(FX_EUNSUPPORTED, "this CPU or build cannot run the %s path", fx_isa_name(isa));
    atomic_store(&fx__isa_now, (int)isa);
    return FX_OK;
}

bool fx__cpu_has_avx512bf16(void)
{
#if defined(__x86_64__) && defined(__GNUC__) && !defined(FLEXC_REFERENCE_KERNELS)
    static atomic_int has = -1;
    int h = atomic_load(&has);
    if (h < 0) {
        __builtin_cpu_init();
        h = __builtin_cpu_supports("avx512bf16") && fx__isa_supported() == FX_ISA_AVX512;
        atomic_store(&has, h);
    }
    return h;
#else
    return false;
#endif
}

bool fx__cpu_avx512bf16(void) { return fx__cpu_has_avx512bf16() && fx_get_isa() == FX_ISA_AVX512; }

bool fx__cpu_vendor_amd(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    /* Read once: CPUID is slow (in a virtual machine it exits to the hypervisor), and every
       bfloat16 product asks. */
    static atomic_int amd = -1;
    int h = atomic_load(&amd);
    if (h < 0) {
        unsigned a, b, c, d;
        /* the vendor string is EBX, EDX, ECX of leaf 0: "Auth" "enti" "cAMD" */
        h = __get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
        atomic_store(&amd, h);
    }
    return h;
#else
    return false;
#endif
}

/* Linux hands out AMX's tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
   XTILEDATA, once per process); a tile instruction without it faults. */
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && !defined(FLEXC_REFERENCE_KERNELS)
enum { FX__ARCH_REQ_XCOMP_PERM = 0x1023, FX__XFEATURE_XTILEDATA = 18 };

bool fx__cpu_has_amx_bf16(void)
{
    static atomic_int has = -1;
    int h = atomic_load(&has);
    if (h < 0) {
        __builtin_cpu_init();
        /* CPUID leaf 7: EDX bit 24 AMX-TILE, bit 22 AMX-BF16 (read directly: not every
           compiler's __builtin_cpu_supports knows them). */
        unsigned a, b, c, d;
        const bool amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 1) && (d >> 22 & 1);
        h = amx && fx__isa_supported() == FX_ISA_AVX512 &&
            syscall(SYS_arch_prctl, FX__ARCH_REQ_XCOMP_PERM, FX__XFEATURE_XTILEDATA) == 0;
        atomic_store(&has, h);
    }
    return h;
}
#else
bool fx__cpu_has_amx_bf16(void) { return false; }
#endif

bool fx__cpu_amx_bf16(void) { return fx__cpu_has_amx_bf16() && fx_get_isa() == FX_ISA_AVX512; }

const char *fx_isa_name(fx_isa isa)
{
    switch (isa) {
    case FX_ISA_SCALAR: return "scalar";
    case FX_ISA_AVX2: return "avx2";
    case FX_ISA_AVX512: return "avx512";
    }
    return "unknown";
}
