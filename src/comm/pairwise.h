/* The summation order of deterministic reductions, shared by the MPI build and the stub. */
#ifndef FX_COMM_PAIRWISE_H
#define FX_COMM_PAIRWISE_H

#include "core/core.h"

#include <string.h>

/* x [count, n], rows summed in place into row 0 by a left-aligned binary tree: a range of
   rows [lo, hi) is split after its largest power of two strictly below hi - lo. Done bottom
   up (stride 1, 2, 4, ...), which builds exactly that tree, then copied to out [n] (out may
   be x). Elements are independent, so any thread split gives the same bits. */
static inline void fx__pairwise_sum_rows(float *out, float *x, int64_t n, int count)
{
#pragma omp parallel for schedule(static) if (n * count >= 65536)
    for (int64_t i0 = 0; i0 < n; i0 += 1024) {
        int64_t len = n - i0 < 1024 ? n - i0 : 1024;
        for (int s = 1; s < count; s *= 2)
            for (int j = 0; j + s < count; j += 2 * s) {
                float *a = x + (int64_t)j * n + i0;
                const float *b = x + (int64_t)(j + s) * n + i0;
                for (int64_t i = 0; i < len; i++)
                    a[i] += b[i];
            }
        if (out != x)
            memcpy(out + i0, x + i0, (size_t)len * sizeof(float));
    }
}

#endif
