/* What the communication layer costs over plain MPI, measured side by side in one run
 * (bench/README.md): `mpirun -np N build/comm_bench [--json]`.
 *
 * Each case alternates A and B (A, B, A, B, ...; every rank runs the same sequence, so the
 * collectives line up), each sample being `iters` back-to-back operations, and reports the
 * medians per operation and their ratio B/A. Rank 0 prints. */
#include <flexc.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef enum {
    MPI_BLOCKING,
    MPI_NONBLOCKING,
    FX_TRACKED,
    FX_UNTRACKED,
    FX_DETERMINISTIC,
    MPI_RS,
    FX_RS_IN_PLACE
} variant;
static const char *variant_name[] = {"MPI_Allreduce", "MPI_Iallreduce+MPI_Wait", "fx_comm_all_reduce",
                                     "fx_comm_all_reduce(tracking off)", "fx_comm_all_reduce(deterministic)",
                                     "MPI_Ireduce_scatter_block+MPI_Wait", "fx_comm_reduce_scatter(in place)"};

typedef struct ctx {
    fx_comm *fx, *fx_untracked, *fx_det;
    MPI_Comm mpi;
    float *buf, *out; /* out: a reduce-scatter's block */
    int64_t n;
    int iters, size;
} ctx;

static void run(ctx *c, variant v)
{
    for (int i = 0; i < c->iters; i++) {
        int rc = FX_OK;
        switch (v) {
        case MPI_BLOCKING:
            MPI_Allreduce(MPI_IN_PLACE, c->buf, (int)c->n, MPI_FLOAT, MPI_SUM, c->mpi);
            break;
        case MPI_NONBLOCKING: {
            MPI_Request r;
            MPI_Iallreduce(MPI_IN_PLACE, c->buf, (int)c->n, MPI_FLOAT, MPI_SUM, c->mpi, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            break;
        }
        case FX_TRACKED: rc = fx_comm_all_reduce(c->fx, c->buf, c->n, NULL); break;
        case FX_UNTRACKED: rc = fx_comm_all_reduce(c->fx_untracked, c->buf, c->n, NULL); break;
        case FX_DETERMINISTIC: rc = fx_comm_all_reduce(c->fx_det, c->buf, c->n, NULL); break;
        /* Reduce-scatters of the whole buffer (a block of n / size each): Open MPI's own
           algorithm against the layer's in-place all-to-all plus local sum. */
        case MPI_RS: {
            MPI_Request r;
            int block = (int)(c->n / c->size);
            MPI_Ireduce_scatter_block(c->buf, c->out, block, MPI_FLOAT, MPI_SUM, c->mpi, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            break;
        }
        case FX_RS_IN_PLACE: rc = fx_comm_reduce_scatter_single(c->fx, c->buf, c->buf, c->n / c->size, NULL); break;
        }
        if (rc != FX_OK) {
            fprintf(stderr, "comm_bench: %s\n", fx_last_error());
            exit(1);
        }
    }
    /* Keep the values bounded across many sums. */
    for (int64_t i = 0; i < c->n; i++)
        c->buf[i] = 1.0f;
}

static void pair(ctx *c, variant a, variant b, int reps, bool json, int rank, int size)
{
    enum { MAX_REPS = 64 };
    double ta[MAX_REPS], tb[MAX_REPS];
    run(c, a);
    run(c, b);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        run(c, a);
        double t1 = now();
        run(c, b);
        double t2 = now();
        ta[r] = (t1 - t0) / c->iters;
        tb[r] = (t2 - t1) / c->iters;
    }
    qsort(ta, (size_t)reps, sizeof *ta, cmp);
    qsort(tb, (size_t)reps, sizeof *tb, cmp);
    double ma = ta[reps / 2], mb = tb[reps / 2];
    if (rank != 0)
        return;
    if (json)
        printf("{\"bench\":\"comm\",\"ranks\":%d,\"bytes\":%lld,\"a\":\"%s\",\"b\":\"%s\",\"median_a_us\":%.3f,"
               "\"median_b_us\":%.3f,\"ratio_b_over_a\":%.3f,\"reps\":%d,\"iters\":%d,\"threads\":%d}\n",
               size, (long long)c->n * 4, variant_name[a], variant_name[b], ma * 1e6, mb * 1e6, mb / ma, reps,
               c->iters, fx_get_num_threads());
    else
        printf("%2d ranks %9lld bytes  %-34s %10.2f us   %-34s %10.2f us   B/A %.3f\n", size, (long long)c->n * 4,
               variant_name[a], ma * 1e6, variant_name[b], mb * 1e6, mb / ma);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    bool json = argc > 1 && !strcmp(argv[1], "--json");
    ctx c = {0};
    if (fx_comm_init(&c.fx, &argc, &argv) != FX_OK || fx_comm_dup(&c.fx_untracked, c.fx, "untracked") != FX_OK ||
        fx_comm_dup(&c.fx_det, c.fx, "deterministic") != FX_OK) {
        fprintf(stderr, "comm_bench: %s\n", fx_last_error());
        return 1;
    }
    /* One thread per rank: the ranks share this machine's cores. */
    fx_set_num_threads(1);
    fx_comm_set_tracking(c.fx_untracked, false);
    fx_comm_set_deterministic(c.fx_det, true);
    MPI_Comm_dup(MPI_COMM_WORLD, &c.mpi);
    int rank = fx_comm_rank(c.fx), size = fx_comm_size(c.fx);
    c.size = size;
    const int64_t sizes[] = {256, 1 << 20};
    for (int s = 0; s < 2; s++) {
        c.n = sizes[s];
        c.iters = c.n < 4096 ? 200 : 5;
        c.buf = malloc(sizeof(float) * (size_t)c.n);
        c.out = malloc(sizeof(float) * (size_t)c.n);
        for (int64_t i = 0; i < c.n; i++)
            c.buf[i] = 1.0f;
        pair(&c, MPI_NONBLOCKING, FX_TRACKED, 15, json, rank, size);
        pair(&c, MPI_NONBLOCKING, FX_UNTRACKED, 15, json, rank, size);
        pair(&c, MPI_BLOCKING, FX_TRACKED, 15, json, rank, size);
        pair(&c, FX_TRACKED, FX_DETERMINISTIC, 15, json, rank, size);
        pair(&c, MPI_RS, FX_RS_IN_PLACE, 15, json, rank, size);
        free(c.buf), free(c.out);
    }
    MPI_Comm_free(&c.mpi);
    fx_comm_free(c.fx_det);
    fx_comm_free(c.fx_untracked);
    fx_comm_free(c.fx);
    return fx_comm_finalize() == FX_OK ? 0 : 1;
}
