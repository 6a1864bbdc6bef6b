/* Counted, 64-byte aligned allocation: every byte the library holds shows in fx_mem_stats(). */
#include "core.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* The size lives in a 64-byte header in front of the block, so alignment is kept. */
enum { FX__ALIGN = 64 };

static atomic_size_t fx__mem_current;
static atomic_size_t fx__mem_peak;

static void fx__mem_add(size_t n)
{
    size_t now = atomic_fetch_add(&fx__mem_current, n) + n;
    size_t peak = atomic_load(&fx__mem_peak);
    while (now > peak && !atomic_compare_exchange_weak(&fx__mem_peak, &peak, now)) {
    }
}

void *fx__alloc(size_t n)
{
    size_t total;
    if (!fx__add_size(n, FX__ALIGN, &total) || !fx__add_size(total, FX__ALIGN - 1, &total)) {
        fx__error(FX_ENOMEM, "allocation of %zu bytes overflows", n);
        return NULL;
    }
    total &= ~(size_t)(FX__ALIGN - 1);
    unsigned char *base = aligned_alloc(FX__ALIGN, total);
    if (!base) {
        fx__error(FX_ENOMEM, "cannot allocate %zu bytes", n);
        return NULL;
    }
    memcpy(base, &n, sizeof n);
    fx__mem_add(n);
    return base + FX__ALIGN;
}

/* fx__calloc, advised for huge pages first (fx__advise_huge_pages) when huge. */
static void *fx__calloc_as(size_t count, size_t size, bool huge)
{
    size_t n;
    if (!fx__mul_size(count, size, &n)) {
        fx__error(FX_ENOMEM, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = fx__alloc(n);
    if (huge)
        fx__advise_huge_pages(p, n);
    if (p)
        memset(p, 0, n);
    return p;
}

void *fx__calloc(size_t count, size_t size) { return fx__calloc_as(count, size, false); }

void fx__free(void *p)
{
    if (!p)
        return;
    unsigned char *base = (unsigned char *)p - FX__ALIGN;
    size_t n;
    memcpy(&n, base, sizeof n);
    atomic_fetch_sub(&fx__mem_current, n);
    free(base);
}

void fx_mem_stats(size_t *current, size_t *peak)
{
    if (current)
        *current = atomic_load(&fx__mem_current);
    if (peak)
        *peak = atomic_load(&fx__mem_peak);
}

void fx_mem_reset_peak(void) { atomic_store(&fx__mem_peak, atomic_load(&fx__mem_current)); }

void fx__advise_huge_pages(void *p, size_t n)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (!p || n < 4 * huge)
        return;
    const uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + n) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* EINVAL etc.: not anonymous memory, no THP */
#else
    (void)p, (void)n;
#endif
}

void *fx__alloc_huge(size_t n)
{
    void *p = fx__alloc(n);
    fx__advise_huge_pages(p, n);
    return p;
}

void *fx__calloc_huge(size_t count, size_t size) { return fx__calloc_as(count, size, true); }
