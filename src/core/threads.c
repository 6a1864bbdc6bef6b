/* Thread count (of the kernels and the GEMMs). The CPU path is cpu.c's. */
#include "core.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
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
