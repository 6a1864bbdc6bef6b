/* Thread count (of the kernels and the GEMMs) and the CPU path. */
#include "core.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __linux__
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

/* The cores online and kernel.threads-max (0: unknown), read once: fx_set_num_threads is
   called around every call of the Python binding. */
static atomic_int fx__cores_online = 0;
static atomic_llong fx__threads_max = -1;

static void fx__threads_machine(int *cores, long long *tmax)
{
    long long t = atomic_load(&fx__threads_max);
    if (t < 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        atomic_store(&fx__cores_online, c > 0 && c <= INT_MAX ? (int)c : 0);
        t = 0;
        FILE *f = fopen("/proc/sys/kernel/threads-max", "re");
        if (f) {
            if (fscanf(f, "%lld", &t) != 1 || t < 0)
                t = 0;
            fclose(f);
        }
        atomic_store(&fx__threads_max, t);
    }
    *cores = atomic_load(&fx__cores_online);
    *tmax = t;
}

/* The most threads fx_set_num_threads accepts, and a message part saying why: the larger of
   4 x the cores online and 256 (more threads than cores can hide memory stalls), never above
   what the process may create, past which OpenMP aborts or crashes as it starts the team.
   RLIMIT_NPROC is read on every call: setrlimit may change it. */
static long long fx__threads_bound(char *why, size_t cap)
{
    int cores;
    long long tmax;
    fx__threads_machine(&cores, &tmax);
    long long b = 4 * (long long)cores > 256 ? 4 * (long long)cores : 256;
    snprintf(why, cap, "4 x the %d cores online, at least 256", cores);
    if (tmax > 0 && tmax < b) {
        b = tmax;
        snprintf(why, cap, "kernel.threads-max");
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < (rlim_t)b) {
        b = rl.rlim_cur > 0 ? (long long)rl.rlim_cur : 1;
        snprintf(why, cap, "RLIMIT_NPROC, the most processes and threads this user may run");
    }
    return b;
}

int fx_set_num_threads(int n)
{
    if (n < 1)
        return fx__error(FX_EINVAL, "thread count %d must be >= 1", n);
    char why[96];
    long long bound = fx__threads_bound(why, sizeof why);
    if (n > bound)
        return fx__error(FX_EINVAL, "thread count %d is more than the bound of %lld threads (%s)", n, bound, why);
#ifdef _OPENMP
    /* The GEMMs take their count from here too (gemm.c passes it to BLIS per call). */
    omp_set_num_threads(n);
#endif
    /* Without OpenMP the kernels and the GEMMs run on one thread, so results do not depend
       on n either. */
    return FX_OK;
}

int fx_get_num_threads(void) { return fx__max_threads(); }

int fx__max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

bool fx__in_parallel(void)
{
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return false;
#endif
}

int fx__thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* ---- CPU path ---------------------------------------------------------------------------- */

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
