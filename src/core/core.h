/* Internal helpers shared by every module: errors, logging, allocation, threads, CPU path,
   GEMM. Nothing here is public; names carry the fx__ prefix. */
#ifndef FX_CORE_H
#define FX_CORE_H

#include "flexc.h"

#include <stdarg.h>

#if defined(__GNUC__)
#define FX__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FX__PRINTF(fmt, args)
#endif

/* Sets this thread's fx_last_error() message and returns code, so a check reads
   `if (n <= 0) return fx__error(FX_EINVAL, "N = %lld must be > 0", (long long)n);` */
int fx__error(int code, const char *fmt, ...) FX__PRINTF(2, 3);
/* Prefixes the current message with "context: " (e.g. a file name); returns code. */
int fx__error_context(int code, const char *fmt, ...) FX__PRINTF(2, 3);

void fx__log(fx_log_level level, const char *fmt, ...) FX__PRINTF(2, 3);

/* 64-byte aligned, counted in fx_mem_stats(). fx__alloc returns NULL (and sets FX_ENOMEM's
   message) on failure or when n == 0 overflows; fx__calloc zero-fills. */
void *fx__alloc(size_t n);
void *fx__calloc(size_t count, size_t size);
void fx__free(void *p);
/* Asks the OS (Linux: madvise MADV_HUGEPAGE) to back the 2 MiB pages wholly inside
   [p, p + n) with huge pages when they are first written. A large output fresh from the
   allocator otherwise costs one page fault per 4 KiB as the kernel writes it, a sizeable
   part of a sparse kernel's time. Only a hint: contents and results are unchanged, and
   nothing happens below a few huge pages, on other systems or where the OS declines. */
void fx__advise_huge_pages(void *p, size_t n);
/* fx__alloc / fx__calloc advised as above before anything touches the block: for the
   buffers every training step streams through (weights, gradients, optimizer moments,
   activations), where 4 KiB pages cost TLB misses on every pass (docs/train-profile.md). */
void *fx__alloc_huge(size_t n);
void *fx__calloc_huge(size_t count, size_t size);

/* Threads: the OpenMP team size kernels use, and this thread's index in a team. */
int fx__max_threads(void);
int fx__thread_id(void);
/* True inside an OpenMP parallel region. */
bool fx__in_parallel(void);

/* Seconds on the monotonic clock (for intervals), and Unix seconds (for timestamps). */
double fx__seconds(void);
double fx__wall_seconds(void);

/* The CPU path kernels take now (fx_get_isa()). */
static inline fx_isa fx__isa(void) { return fx_get_isa(); }

/* The one of a path's three values (a module's kernel table) that isa takes: each *_ops_for
   picks its table by this, so a new path is one more argument in every module. */
#define FX__PER_ISA(isa, scalar, avx2, avx512) \
    ((isa) == FX_ISA_AVX512 ? (avx512) : (isa) == FX_ISA_AVX2 ? (avx2) : (scalar))
/* The CPU has AVX512-BF16 (vdpbf16ps) and the AVX-512 path is allowed (fx_get_isa()). */
bool fx__cpu_avx512bf16(void);
/* The CPU is AMD's (CPUID's vendor string AuthenticAMD). */
bool fx__cpu_vendor_amd(void);
/* The CPU has AMX tiles with bfloat16 (tdpbf16ps), the kernel lets this process use them, and
   the AVX-512 path is allowed. */
bool fx__cpu_amx_bf16(void);
/* The two above as the CPU (and the OS) offer them, whatever fx_get_isa() allows now: what
   a kernel table's fx__*_kernels_for(isa) weighs for the AVX-512 path (docs/dispatch.md). */
bool fx__cpu_has_avx512bf16(void);
bool fx__cpu_has_amx_bf16(void);

/* Row-major C[M,N] = alpha * op(A)[M,K] op(B)[K,N] + beta * C; op transposes when ta/tb.
   lda/ldb/ldc are the row strides of A, B and C as stored. Goes to flexc's own tiled
   path on the AVX-512 path (sgemm.h), to BLIS elsewhere, or to the reference below when built
   with FLEXC_REFERENCE_KERNELS. Bitwise identical for any thread count and any split of C
   into calls (see gemm.c). */
void fx__sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc);
/* fx__sgemm, never traced (below): the products of an op the trace does not split into its
   GEMMs (the fused loss's blocks, which run on the calling thread for small shapes or one
   thread). */
void fx__sgemm_untraced(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* Accounting of the matrix work (`flexc bench train --gemm`): between fx__gemm_trace_start
   and fx__gemm_trace_stop, every fx__sgemm and fx__gemm_bf16 call made outside a parallel
   region adds its wall time to the entry of its shape and kind (up to `cap` distinct ones;
   later new ones are only counted in *dropped). Calls inside parallel regions, inside an op
   timed by the op trace (below), and the fused loss's (fx__sgemm_untraced) are not traced. One trace at a time, started and stopped by
   the thread that makes the calls. */
typedef struct fx__gemm_shape {
    bool ta, tb;
    int64_t M, N, K;
    bool bf16;     /* a call of fx__gemm_bf16 (gemm_bf16.h), not of fx__sgemm */
    bool a16, b16; /* with bf16: the operand stored in bfloat16, not float32 rounded as read */
    int64_t calls;
    double seconds;
} fx__gemm_shape;
void fx__gemm_trace_start(fx__gemm_shape *shapes, int cap);
/* Stops tracing; returns the number of entries filled and sets *dropped (may be NULL). */
int fx__gemm_trace_stop(int64_t *dropped);
/* The traced GEMMs' bracket around one call: fx__gemm_trace_begin gives the clock, or a
   negative value when the call is not traced (no trace on, a parallel region, or within
   another traced call: fx__gemm_bf16's float32 route calling fx__sgemm counts once); with a
   clock, fx__gemm_trace_end adds the call to the entry of `shape` (its calls and seconds
   ignored). */
double fx__gemm_trace_begin(void);
void fx__gemm_trace_end(const fx__gemm_shape *shape, double t0);

/* Accounting of a step's other work by op (`flexc bench train --ops`), in trace.c with the GEMM
   trace: between fx__op_trace_start and fx__op_trace_stop, each call of an op's function
   made outside a parallel region and outside another timed call (a traced GEMM or op) adds
   its wall time to the op's entry. The same thread starts, stops and makes the calls. */
typedef enum fx__op {
    FX__OP_ATTN_FWD, /* the attention kernel, forward */
    FX__OP_ATTN_BWD, /* and backward */
    FX__OP_NORM,     /* RMSNorm, forward and backward */
    FX__OP_HEADS,    /* RoPE and the moves between token rows and heads, both ways */
    FX__OP_SWIGLU,   /* SwiGLU, forward (also recomputed in the backward pass) and backward */
    FX__OP_LOSS,     /* the loss (the fused linear + cross-entropy), its own products included */
    FX__OP_EMBED,    /* the embedding's gather and its gradient's scatter */
    FX__OP_COUNT
} fx__op;
typedef struct fx__op_time {
    int64_t calls;
    double seconds;
} fx__op_time;
/* times: FX__OP_COUNT entries, cleared here. */
void fx__op_trace_start(fx__op_time *times);
void fx__op_trace_stop(void);
/* The bracket of one op call, as fx__gemm_trace_begin / _end: fx__op_end(op, t0) does nothing
   when fx__op_begin gave a negative t0. */
double fx__op_begin(void);
void fx__op_end(fx__op op, double t0);
const char *fx__op_name(fx__op op);

/* The plain triple loop (float64 accumulation), same contract: the tests' reference. */
void fx__sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc);

/* Argument aliasing. Kernels write outputs while inputs are still read, so an output that
   shares memory with an input (or with another output) would silently corrupt the result. */
static inline bool fx__bytes_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a && b && na > 0 && nb > 0 && a0 < b0 + nb && b0 < a0 + na;
}
/* A named argument's bytes (ptr NULL: absent, skipped). */
typedef struct fx__span {
    const char *name;
    const void *ptr;
    size_t bytes;
} fx__span;
/* FX_OK, or FX_EINVAL naming the first output that overlaps an input ("dq overlaps the
   input q") or an earlier output ("dk overlaps dq"). */
int fx__check_overlaps(const fx__span *in, size_t nin, const fx__span *out, size_t nout);

/* Overflow-checked size arithmetic: false when the result does not fit. */
static inline bool fx__mul_size(size_t a, size_t b, size_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool fx__add_size(size_t a, size_t b, size_t *out) { return !__builtin_add_overflow(a, b, out); }

/* ---- memory available (memory.c) ----------------------------------------------------------- */

/* What this process may still take, and which limit said so. */
typedef struct fx__mem_avail {
    uint64_t bytes;     /* UINT64_MAX when nothing could be read (no check then) */
    const char *source; /* "MemAvailable", "cgroup v2 memory.max - memory.current", "cgroup v1
                           memory.limit_in_bytes - memory.usage_in_bytes", "FLEXC_MEM_AVAILABLE" */
} fx__mem_avail;
/* The files the probe reads; the tests point it at their own. */
typedef struct fx__mem_files {
    const char *meminfo;     /* /proc/meminfo */
    const char *self_cgroup; /* /proc/self/cgroup */
    const char *cgroup_root; /* /sys/fs/cgroup: v2 there (or in unified/), v1 in memory/ */
} fx__mem_files;
/* MemAvailable of /proc/meminfo's text, in bytes; false when it has none. */
bool fx__mem_parse_meminfo(const char *text, uint64_t *bytes);
/* The room under a cgroup's limit: limit - (usage - inactive file cache, from memory.stat's
   text when stat is not NULL), 0 when over; false for no limit ("max", or v1's 2^63 - 1 page
   rounded) or text that is not a number. */
bool fx__mem_parse_cgroup(const char *limit, const char *usage, const char *stat, uint64_t *room);
/* The smaller of MemAvailable and the room under every cgroup limit from this process's
   cgroup up to the root (v2 memory.max, v1 memory.limit_in_bytes), read from f's files (NULL:
   the system's). Never fails: what cannot be read is left out. */
void fx__mem_probe(fx__mem_avail *out, const fx__mem_files *f);
/* fx__mem_probe, or the bytes FLEXC_MEM_AVAILABLE gives (an override for tests and for users
   who know better); FX_EINVAL when that is not a number. */
int fx__mem_available(fx__mem_avail *out);
/* This process's resident bytes now (/proc/self/statm), 0 when unknown. */
uint64_t fx__mem_resident(void);
/* The checks below are on unless FLEXC_NO_MEMORY_CHECK is set (not "0") or this process
   turned them off. */
void fx__mem_set_check(bool on);
bool fx__mem_check_on(void);
/* The share of what is available that a run may plan to take. */
enum { FX__MEM_USABLE_PERCENT = 90 };
/* What a caller holding `held` bytes may reach: held + FX__MEM_USABLE_PERCENT % of a's bytes
   (UINT64_MAX when a is unknown). */
uint64_t fx__mem_room(const fx__mem_avail *a, uint64_t held);
/* Before allocating: FX_OK when a peak of `need` bytes, of which the caller holds `held`
   already, fits in fx__mem_room; else FX_ENOMEM: "WHAT needs 3.20 GB of memory (DETAIL), and
   2.10 GB is available (90% of MemAvailable)" (detail may be NULL). *avail (may be NULL) gets
   the probe's answer, also with checks off. */
int fx__mem_check(uint64_t need, uint64_t held, const char *what, const char *detail, fx__mem_avail *avail);
/* The unit a figure of `bytes` is printed in: "GB" (*scale 1e9) from a gigabyte up, else "MB". */
const char *fx__mem_unit(uint64_t bytes, double *scale);

#endif
