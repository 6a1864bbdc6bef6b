/* The one GEMM entry point of the library, row-major, and its kernel table (sgemm.h): flexc's
   own tiled path on the AVX-512 path, BLIS elsewhere. */
#include "sgemm.h"
#include "gemm_bf16.h"

#include <blis.h>
#include <math.h>

/* On the AVX-512 path the product is flexc's own (sgemm.h, fx__sgemm_tiled): every element of
   C is computed the same way whatever the call's shape, tile or thread.

   Elsewhere it is BLIS's. Why BLIS: with its small-matrix path off, BLIS computes every element
   of C the same way whatever the shape of the call it is part of: the same micro-kernel over K
   in the same blocks, edge tiles included (tests/test_core.c checks it against calls on random
   row and column blocks). So C can be cut into any blocks, one per thread, and the result is
   bitwise that of one call: determinism across thread counts without fixing the blocks by shape.

   The threads are flexc's (OpenMP), not BLIS's: BLIS's own threads wait for each other by
   spinning, which stalls whole time slices when the cores are shared (several processes of
   an MPI run, a busy machine), while OpenMP's idle threads yield. Each thread's call packs
   the operand the blocks share once more; with one block per thread that costs little. */
enum {
    FX__GEMM_ALIGN = 16,           /* block edges on multiples of this (the micro-tiles' size) */
    FX__GEMM_MIN_FLOPS = 1 << 20,  /* below this, one thread: waking the team costs more */
};

static void fx__blis(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    bli_rntm_set_num_threads_only(1, &rntm);
    bli_rntm_disable_l3_sup(&rntm);
    /* BLIS takes each operand as stored (row stride, column stride) with a transposition
       flag, and alpha and beta by address. A and B are only read. */
    bli_sgemm_ex(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, M, N, K,
                 &alpha, (float *)A, lda, 1, (float *)B, ldb, 1, &beta, C, ldc, 1, NULL, &rntm);
}

void fx__sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float beta, float *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    const double t0 = fx__gemm_trace_begin();
    fx__sgemm_untraced(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (t0 >= 0.0)
        fx__gemm_trace_end(&(fx__gemm_shape){.ta = ta, .tb = tb, .M = M, .N = N, .K = K}, t0);
}

/* BLIS, C cut into one block per thread. */
static void fx__sgemm_blis(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    const int nt = fx__in_parallel() || flops < FX__GEMM_MIN_FLOPS ? 1 : fx__max_threads();
    if (nt == 1) {
        fx__blis(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    /* One block of the longer side of C per thread. */
    const bool split_rows = M >= N;
    const int64_t dim = split_rows ? M : N;
    const int64_t per = (dim + nt - 1) / nt, bs = (per + FX__GEMM_ALIGN - 1) / FX__GEMM_ALIGN * FX__GEMM_ALIGN;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t blk = 0; blk < nt; blk++) {
        const int64_t lo = blk * bs, len = lo >= dim ? 0 : (dim - lo < bs ? dim - lo : bs);
        if (len > 0 && split_rows)
            fx__blis(ta, tb, len, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
        else if (len > 0)
            fx__blis(ta, tb, M, len, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
    }
}

/* The own tiled path on AVX-512. */
static void fx__sgemm_own_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    /* The scratch is two blocks of k of both operands ((M + N) x 4 KiB at most), or the thin
       path's (the thin operand whole, a wide tile per thread); where it cannot be had, BLIS,
       which needs none of ours (its sums in another order: a process out of memory may see
       other bits). */
    const bool thin = fx__sgemm_thin_fits(M, N);
    float *ws = fx__alloc((thin ? fx__sgemm_thin_ws(M, N, K, fx__max_threads()) : fx__sgemm_tiled_ws(M, N, K)) *
                          sizeof(float));
    if (!ws) {
        fx__sgemm_blis(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (thin)
        fx__sgemm_thin(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ws);
    else
        fx__sgemm_tiled(&fx__sgemm_path_avx512, FX__SG_AUTO, ta, tb, M, N, K, alpha, fx__sgemm_f32(A), lda,
                        fx__sgemm_f32(B), ldb, beta, C, ldc, ws);
    fx__free(ws);
}

const fx__gemm_kernels fx__gemm_kernels_avx512 = {"own avx512", fx__sgemm_own_avx512, &fx__sgemm_path_avx512};
const fx__gemm_kernels fx__gemm_kernels_blis = {"blis", fx__sgemm_blis, NULL};
const fx__gemm_kernels fx__gemm_kernels_ref = {"reference", fx__sgemm_ref, NULL};

const fx__gemm_kernels *fx__gemm_kernels_for(fx_isa isa)
{
#ifdef FLEXC_REFERENCE_KERNELS
    (void)isa;
    return &fx__gemm_kernels_ref;
#else
    return FX__PER_ISA(isa, &fx__gemm_kernels_blis, &fx__gemm_kernels_blis, &fx__gemm_kernels_avx512);
#endif
}

const fx__gemm_kernels *fx__gemm_kernels_now(void) { return fx__gemm_kernels_for(fx__isa()); }

void fx__sgemm_untraced(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc)
{
    if (M == 0 || N == 0)
        return;
    fx__gemm_kernels_now()->sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void fx__sgemm_ref(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const float *B, int64_t ldb,
                   float beta, float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k];
                double b = tb ? B[j * ldb + k] : B[k * ldb + j];
                acc += a * b;
            }
            /* beta == 0 overwrites, as BLAS does, so NaN garbage in C does not survive. */
            double c = beta == 0.0f ? 0.0 : (double)beta * C[i * ldc + j];
            C[i * ldc + j] = (float)((double)alpha * acc + c);
        }
    }
}

/* ---- the tiled path (sgemm.h) --------------------------------------------------------------- */

static void fx__sgemm_kernel_scalar(int64_t kc, const float *a, const float *b, float alpha, float beta, float *C,
                                    int64_t ldc, int64_t mr, int64_t nr)
{
    for (int64_t r = 0; r < mr; r++) {
        for (int64_t j = 0; j < nr; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < kc; k++)
                s = fmaf(a[k * FX__SG_MR + r], b[k * FX__SG_NR + j], s);
            const float x = alpha * s;
            C[r * ldc + j] = beta == 0.0f ? x : fmaf(beta, C[r * ldc + j], x);
        }
    }
}

static float fx__sgemm_at(fx__sgemm_mat x, int64_t i)
{
    switch (x.elem) {
    case FX__SG_BF16: return fx__bf16_to_f32(((const uint16_t *)x.p)[i]);
    case FX__SG_F32_AS_BF16: return fx__bf16_round(((const float *)x.p)[i]);
    case FX__SG_F32: break;
    }
    return ((const float *)x.p)[i];
}

static void fx__sgemm_pack_scalar(float *dst, fx__sgemm_mat x, int64_t ld, bool lk, int64_t lines, int64_t k0,
                                  int64_t kc, int64_t width, int64_t q)
{
    const int64_t l0 = q * width, nl = lines - l0 < width ? lines - l0 : width;
    for (int64_t k = 0; k < kc; k++)
        for (int64_t l = 0; l < width; l++)
            dst[k * width + l] =
                l >= nl ? 0.0f : fx__sgemm_at(x, lk ? (l0 + l) * ld + k0 + k : (k0 + k) * ld + l0 + l);
}

const fx__sgemm_path fx__sgemm_path_avx512 = {fx__sgemm_kernel_avx512, fx__sgemm_pack_avx512};
const fx__sgemm_path fx__sgemm_path_scalar = {fx__sgemm_kernel_scalar, fx__sgemm_pack_scalar};

static int64_t fx__sgemm_panels(int64_t n, int64_t width) { return (n + width - 1) / width; }

size_t fx__sgemm_tiled_ws(int64_t M, int64_t N, int64_t K)
{
    /* Two blocks of k where there are two or more (fx__sgemm_tiled alternates them), one
       otherwise: at most the operands' own size plus the panels' padding. */
    const int64_t k2 = K < 2 * FX__SG_KC ? K : 2 * FX__SG_KC;
    return (size_t)(fx__sgemm_panels(M, FX__SG_MR) * FX__SG_MR + fx__sgemm_panels(N, FX__SG_NR) * FX__SG_NR) *
           (size_t)(k2 > 0 ? k2 : 1);
}

/* FX__SG_AUTO's choice: the operand whose block is smaller is shared if it fits
   FX__SG_GROUP_BYTES, the other streamed; both packed whole when neither fits. */
static fx__sgemm_scheme fx__sgemm_scheme_of(int64_t mp, int64_t np, int64_t kmax)
{
    const int64_t line = kmax * (int64_t)sizeof(float), a = mp * FX__SG_MR * line, b = np * FX__SG_NR * line;
    if ((a <= b ? a : b) > FX__SG_GROUP_BYTES)
        return FX__SG_BOTH;
    return a <= b ? FX__SG_SHARE_A : FX__SG_SHARE_B;
}

/* One call of fx__sgemm_tiled, as its blocks of k see it. */
typedef struct fx__sgemm_call {
    const fx__sgemm_path *p;
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    fx__sgemm_mat A, B;
    float *C, *ws;
    int64_t mp, np, kmax; /* panels of op(A) and op(B), values of k in a whole block */
    int64_t slots;        /* a streaming scheme's slots in ws: the team's size */
} fx__sgemm_call;

/* Both operands packed whole per block of k, then every tile of C by one thread: group by
   group, in a group B panel by B panel, each over the group's A panels. A thread's
   consecutive tiles share their B panel (in L1) while the group's A panels come from L2; a
   whole A of more than L2 would come from L3 once per B panel (docs/train-profile.md:
   1.06-1.18x at 1024 rows on a 2 MiB L2). */
static void fx__sgemm_both(const fx__sgemm_call *c, int64_t kc, int64_t k0, int blk)
{
    const int64_t mp = c->mp, np = c->np;
    /* The A panels in groups of at most FX__SG_GROUP_BYTES packed, made equal: g panels each
       (the last one fewer). */
    const int64_t gmax = FX__SG_GROUP_BYTES / ((int64_t)sizeof(float) * FX__SG_MR * (c->kmax > 0 ? c->kmax : 1));
    const int64_t ngroups = (mp + gmax - 1) / gmax, g = (mp + ngroups - 1) / ngroups;
    const int64_t half = (mp * FX__SG_MR + np * FX__SG_NR) * c->kmax;
    float *ap = c->ws + (blk & 1) * half, *bp = ap + mp * FX__SG_MR * kc;
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < mp; q++)
        c->p->pack(ap + q * FX__SG_MR * kc, c->A, c->lda, !c->ta, c->M, k0, kc, FX__SG_MR, q);
#pragma omp for schedule(static)
    for (int64_t q = 0; q < np; q++)
        c->p->pack(bp + q * FX__SG_NR * kc, c->B, c->ldb, c->tb, c->N, k0, kc, FX__SG_NR, q);
#pragma omp for schedule(static) nowait
    for (int64_t t = 0; t < mp * np; t++) {
        const int64_t i0 = t / (g * np) * g, in = mp - i0 < g ? mp - i0 : g, r = t - i0 * np;
        const int64_t i = i0 + r % in, j = r / in, mr = c->M - i * FX__SG_MR, nr = c->N - j * FX__SG_NR;
        c->p->kernel(kc, ap + i * FX__SG_MR * kc, bp + j * FX__SG_NR * kc, c->alpha, k0 == 0 ? c->beta : 1.0f,
                     c->C + i * FX__SG_MR * c->ldc + j * FX__SG_NR, c->ldc, mr < FX__SG_MR ? mr : FX__SG_MR,
                     nr < FX__SG_NR ? nr : FX__SG_NR);
    }
}

/* One operand packed whole per block of k and shared (A where sa, else B); the other
   streamed: each thread packs its panels of it one at a time into its own slot of ws and
   runs that panel's tiles against every shared panel while it is in L1 or L2. The streamed
   operand is read once and its packed copy never leaves the cache: at 256 rows (a GPT-2
   step's B x T) the whole-packing writes out and reads back a packed weight of several MiB
   per call. */
static void fx__sgemm_streamed(const fx__sgemm_call *c, bool sa, int64_t kc, int64_t k0, int blk)
{
    const int64_t sw = sa ? FX__SG_MR : FX__SG_NR, sp = sa ? c->mp : c->np, pw = sa ? FX__SG_NR : FX__SG_MR;
    const int64_t pp = sa ? c->np : c->mp;
    /* ws: a slot per thread of the team, then the two halves of the shared operand (the
       second holds a whole block only when K has three or more, as fx__sgemm_tiled_ws
       counts). */
    float *own = c->ws + (int64_t)fx__thread_id() * pw * c->kmax;
    float *shared = c->ws + c->slots * pw * c->kmax + (blk & 1) * sp * sw * c->kmax;
#pragma omp for schedule(static)
    for (int64_t q = 0; q < sp; q++) {
        if (sa)
            c->p->pack(shared + q * sw * kc, c->A, c->lda, !c->ta, c->M, k0, kc, sw, q);
        else
            c->p->pack(shared + q * sw * kc, c->B, c->ldb, c->tb, c->N, k0, kc, sw, q);
    }
#pragma omp for schedule(static) nowait
    for (int64_t q = 0; q < pp; q++) {
        if (sa)
            c->p->pack(own, c->B, c->ldb, c->tb, c->N, k0, kc, pw, q);
        else
            c->p->pack(own, c->A, c->lda, !c->ta, c->M, k0, kc, pw, q);
        for (int64_t s = 0; s < sp; s++) {
            const int64_t i = sa ? s : q, j = sa ? q : s, mr = c->M - i * FX__SG_MR, nr = c->N - j * FX__SG_NR;
            const float *a = sa ? shared + s * sw * kc : own, *b = sa ? own : shared + s * sw * kc;
            c->p->kernel(kc, a, b, c->alpha, k0 == 0 ? c->beta : 1.0f, c->C + i * FX__SG_MR * c->ldc + j * FX__SG_NR,
                         c->ldc, mr < FX__SG_MR ? mr : FX__SG_MR, nr < FX__SG_NR ? nr : FX__SG_NR);
        }
    }
}

void fx__sgemm_tiled(const fx__sgemm_path *p, fx__sgemm_scheme scheme, bool ta, bool tb, int64_t M, int64_t N,
                     int64_t K, float alpha, fx__sgemm_mat A, int64_t lda, fx__sgemm_mat B, int64_t ldb, float beta,
                     float *C, int64_t ldc, float *ws)
{
    fx__sgemm_call c = {.p = p, .ta = ta, .tb = tb, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
                        .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C, .ws = ws,
                        .mp = fx__sgemm_panels(M, FX__SG_MR), .np = fx__sgemm_panels(N, FX__SG_NR),
                        .kmax = K < FX__SG_KC ? K : FX__SG_KC};
    const fx__sgemm_scheme share = scheme == FX__SG_AUTO ? fx__sgemm_scheme_of(c.mp, c.np, c.kmax) : scheme;
    const bool nested = fx__in_parallel();
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    /* A streamed operand gives each thread a slot of one panel, which the scratch holds for
       as many threads as that operand has panels (fx__sgemm_tiled_ws). */
    const int64_t streamed = share == FX__SG_SHARE_A ? c.np : c.mp;
    const int team = share == FX__SG_BOTH || streamed >= fx__max_threads() ? fx__max_threads() : (int)streamed;
    c.slots = team;
    (void)nested, (void)flops; /* read only by the pragma, which is gone without OpenMP */
    _Static_assert(FX__SG_GROUP_BYTES >= sizeof(float) * FX__SG_MR * FX__SG_KC, "a group holds an A panel");
    /* Per block of k, one barrier: between the packing of what the threads share and the
       tiles. Consecutive blocks pack into the two halves of the shared part of ws in turn, so
       a thread may pack block b + 1 while another still multiplies block b; block b + 2
       reuses b's half only after every thread has passed b + 1's barrier, done with b. A
       tile's blocks add up in order: the static schedule gives a tile to the same thread in
       every block. K = 0 is one empty block (C = beta C). (With passive waiting a barrier is
       a sleep and a wake-up: 35-40 us each on a 2-core virtual machine.) */
#pragma omp parallel if (!nested && flops >= FX__GEMM_MIN_FLOPS) num_threads(team)
    {
        int64_t k0 = 0;
        int blk = 0;
        do {
            const int64_t kc = K - k0 < FX__SG_KC ? K - k0 : FX__SG_KC;
            if (share == FX__SG_BOTH)
                fx__sgemm_both(&c, kc, k0, blk);
            else
                fx__sgemm_streamed(&c, share == FX__SG_SHARE_A, kc, k0, blk);
            k0 += kc, blk++;
        } while (k0 < K);
    }
}

/* ---- the thin path (sgemm.h) ---------------------------------------------------------------- */

/* An operand of the thin path by its lines (rows of op(A) or columns of op(B)): element (line
   l, k) at p[l * ld + k] when lk, else p[k * ld + l], as the packing reads it. */
typedef struct thin_side {
    fx__sgemm_mat x;
    int64_t ld, lines;
    bool lk;
} thin_side;

bool fx__sgemm_thin_fits(int64_t M, int64_t N)
{
    return (N <= FX__SG_THIN_MAX && M >= FX__SG_THIN_RATIO * N) || (M <= FX__SG_THIN_MAX && N >= FX__SG_THIN_RATIO * M);
}

/* Vectors of the thin side n. */
static int64_t thin_vectors(int64_t n) { return (n + 15) / 16; }

size_t fx__sgemm_thin_ws(int64_t M, int64_t N, int64_t K, int threads)
{
    const int64_t nv = thin_vectors(M < N ? M : N), kmax = K < FX__SG_KC ? K : FX__SG_KC;
    /* The thin side packed whole, then a slot of one wide tile's block of k per thread. */
    return (size_t)(16 * nv * K + threads * (FX__SG_THIN_ACC / nv) * kmax + 1);
}

void fx__sgemm_thin(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                    const float *B, int64_t ldb, float beta, float *C, int64_t ldc, float *ws)
{
    /* C's rows are the wide side's lines unless N is the longer: then C transposed. */
    const bool ct = N > M;
    const thin_side a = {fx__sgemm_f32(A), lda, M, !ta}, b = {fx__sgemm_f32(B), ldb, N, tb};
    const thin_side wide = ct ? b : a, thin = ct ? a : b;
    const int64_t nv = thin_vectors(thin.lines), width = 16 * nv;
    const int64_t kmax = K < FX__SG_KC ? K : FX__SG_KC;
    const double flops = 2.0 * (double)M * (double)N * (double)K;
    const bool nested = fx__in_parallel();
    (void)nested, (void)flops; /* read only by the pragma, which is gone without OpenMP */
    float *packed = ws, *slots = ws + width * K;
    /* Lines ld floats apart, read side by side, fall in as many of L1's sets (64-byte lines, a
       4 KiB period) as 4096 / gcd(4 ld, 4096): with 512-byte steps or finer, 8 sets or more,
       at most three lines of a tile in each of a set's 8 ways (two where a line's 16 values
       straddle); coarser ones evict each other at every k (55 against 209 GFLOP/s, 24 rows
       12 KiB apart, 2 threads of an AMD EPYC). Steps of 1 or 2 KiB leave 4 or 2 sets, coarser
       ones 1: with one vector, tiles of FX__SG_THIN_NARROW lines, or half that, still fit
       their ways (u of down 1.5-1.7x, d(u) of gate 1.5-1.6x the packed tiles, in
       docs/train-profile.md); wider thin sides pack. Where a k's lines lie side by side
       instead, a tile's values of one k are one run of memory. */
    const int64_t step = wide.lk ? 4 * wide.ld : 4, low = step & -step;
    const bool narrow = low > 512 && nv == 1, in_place = low <= 512 || narrow;
    const int64_t rows = !narrow ? FX__SG_THIN_ACC / nv : low <= 2048 ? FX__SG_THIN_NARROW : FX__SG_THIN_NARROW / 2;
    const int64_t tiles = (wide.lines + rows - 1) / rows, blocks = (K + FX__SG_KC - 1) / FX__SG_KC;
    /* One barrier: between the thin side's packing, block by block, and the tiles. */
#pragma omp parallel if (!nested && flops >= FX__GEMM_MIN_FLOPS)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < blocks; q++) {
            const int64_t k0 = q * FX__SG_KC, kc = K - k0 < FX__SG_KC ? K - k0 : FX__SG_KC;
            fx__sgemm_pack_avx512(packed + k0 * width, thin.x, thin.ld, thin.lk, thin.lines, k0, kc, width, 0);
        }
        float *own = slots + (int64_t)fx__thread_id() * rows * kmax;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            const int64_t l0 = t * rows, mr = wide.lines - l0 < rows ? wide.lines - l0 : rows;
            float *c = ct ? C + l0 : C + l0 * ldc;
            int64_t k0 = 0;
            do { /* K = 0: one empty block, C = beta C */
                const int64_t kc = K - k0 < FX__SG_KC ? K - k0 : FX__SG_KC;
                /* A whole tile is read where it lies when its lines do not crowd the cache;
                   else packed (the last tile's lines past the operand as zeros). */
                const float *at = own;
                int64_t as = rows, ls = 1;
                if (mr == rows && in_place && kc > 0) {
                    at = (const float *)wide.x.p + (wide.lk ? l0 * wide.ld + k0 : k0 * wide.ld + l0);
                    as = wide.lk ? 1 : wide.ld, ls = wide.lk ? wide.ld : 1;
                } else {
                    fx__sgemm_pack_avx512(own, wide.x, wide.ld, wide.lk, wide.lines, k0, kc, rows, t);
                }
                fx__sgemm_thin_kernel_avx512(kc, at, as, ls, packed + k0 * width, alpha, k0 == 0 ? beta : 1.0f, c,
                                             ldc, mr, thin.lines, ct);
                k0 += kc;
            } while (k0 < K);
        }
    }
}
