/* The parts of the communication layer that need no MPI: built with it and without it (then
   beside comm_stub.c, see cmake/comm.cmake). */
#include "core/core.h"
#include "flexc/comm.h"
#include "pairwise.h"

const char *fx_comm_op_name(fx_comm_op op)
{
    switch (op) {
    case FX_COMM_ALL_REDUCE: return "all_reduce";
    case FX_COMM_ALL_GATHER: return "all_gather";
    case FX_COMM_REDUCE_SCATTER: return "reduce_scatter";
    case FX_COMM_BROADCAST: return "broadcast";
    case FX_COMM_BARRIER: return "barrier";
    }
    return "unknown";
}

/* Pure arithmetic: works without MPI, so a 1-process run can reproduce a deterministic sum. */
int fx_comm_sum_pairwise(float *out, float *x, int64_t n, int count)
{
    if ((!out || !x) && n > 0)
        return fx__error(FX_EINVAL, "%s is NULL with n = %lld", !out ? "out" : "x", (long long)n);
    if (n < 0 || count < 1)
        return fx__error(FX_EINVAL, "n = %lld, count = %d: need n >= 0 and count >= 1", (long long)n, count);
    if (n > INT64_MAX / (int64_t)sizeof(float) / count)
        return fx__error(FX_EINVAL, "n = %lld, count = %d: x's size overflows", (long long)n, count);
    /* Blocks of out are written while later blocks of x are still to be read. */
    const uintptr_t o = (uintptr_t)out, x0 = (uintptr_t)x, bytes = (uintptr_t)n * sizeof(float);
    if (out != x && o < x0 + bytes * (uintptr_t)count && x0 < o + bytes)
        return fx__error(FX_EINVAL, "out overlaps x without being x (out may be x itself, or apart from it)");
    fx__pairwise_sum_rows(out, x, n, count);
    return FX_OK;
}
