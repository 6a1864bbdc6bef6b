/* The communication layer across processes, run under mpirun: `mpi_comm CASE`.
 *   collectives  every collective, blocking and non-blocking, plain and deterministic, on
 *                two communicators at once; any number of ranks
 *   timeout      rank 1 arrives 4 s late: rank 0 gets FX_ETIMEDOUT naming rank 1 (2 ranks)
 *   mismatch     ranks call different collectives: FX_ECOMM naming both sides (2 ranks)
 *   kill         rank 1 dies by SIGKILL before an op: rank 0 reports the error naming it and
 *                exits 3 (2 ranks; driven by tests/mpi_comm_kill.sh)
 *   kill_inside  the same, but rank 1 dies inside the op, after announcing it
 * Every rank checks its own results; the exit status is non-zero when any check failed. */
#include "harness.h"

#include <mpi.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

static fx_comm *world;
static int rank, nranks;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank r's input element i, the same formula everywhere so each rank knows all inputs. */
static float input(int r, int64_t i) { return (float)(((i * 7 + r * 13) % 101) - 50) / 16.0f + 0.1f * (float)r; }

/* ---- collectives ---------------------------------------------------------------------------- */

static void run_collectives(bool det, bool nonblocking)
{
    const int64_t n = 1537; /* not a multiple of anything convenient */
    FXT_OK(fx_comm_set_deterministic(world, det));
    float *ar = fxt_guarded((size_t)n), *ag = fxt_guarded((size_t)(n * nranks)),
          *rs_in = malloc(sizeof(float) * (size_t)(n * nranks)), *rs = fxt_guarded((size_t)n),
          *bc = fxt_guarded((size_t)n), *mine = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        ar[i] = mine[i] = input(rank, i);
        bc[i] = rank == nranks - 1 ? input(100, i) : -1.0f;
    }
    /* Block b of rank r's reduce-scatter input: input(r, b * n + i). */
    for (int64_t i = 0; i < n * nranks; i++)
        rs_in[i] = input(rank, i);
    fx_comm_work *w[6] = {0};
    fx_comm_work **h[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (nonblocking)
        for (int i = 0; i < 6; i++)
            h[i] = &w[i];
    FXT_OK(fx_comm_all_reduce(world, ar, n, h[0]));
    FXT_OK(fx_comm_all_gather_single(world, ag, mine, n, h[1]));
    FXT_OK(fx_comm_reduce_scatter_single(world, rs, rs_in, n, h[2]));
    FXT_OK(fx_comm_broadcast(world, bc, n * 4, nranks - 1, h[3]));
    FXT_OK(fx_comm_barrier(world, h[4]));
    /* The in-place reduce-scatter: the sum lands at the start of the input. */
    float *rs_ip = fxt_guarded((size_t)(n * nranks));
    memcpy(rs_ip, rs_in, sizeof(float) * (size_t)(n * nranks));
    FXT_OK(fx_comm_reduce_scatter_single(world, rs_ip, rs_ip, n, h[5]));
    if (nonblocking) {
        /* Finish them out of order: completion does not depend on the order of waits. */
        for (int i = 5; i >= 0; i--) {
            FXT_OK(fx_comm_work_wait(w[i], -1.0));
            fx_comm_work_free(w[i]);
        }
    }
    double *ref = fxt_alloc_f64((size_t)(n * nranks));
    float *ordered = malloc(sizeof(float) * (size_t)n);
    /* all_reduce: float64 sum; in deterministic mode also fx_comm_sum_pairwise over the
       ranks' inputs, bitwise. */
    float *rows = malloc(sizeof(float) * (size_t)(n * nranks));
    for (int64_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int r = 0; r < nranks; r++) {
            s += input(r, i);
            rows[r * n + i] = input(r, i);
        }
        ref[i] = s;
    }
    FXT_OK(fx_comm_sum_pairwise(ordered, rows, n, nranks));
    fxt_close_f32("all_reduce", ar, ref, (size_t)n, 1e-5, 1e-6);
    if (det)
        fxt_bitwise_f32("deterministic all_reduce", ar, ordered, (size_t)n);
    for (int r = 0; r < nranks; r++)
        for (int64_t i = 0; i < n; i++)
            ref[r * n + i] = input(r, i);
    fxt_close_f32("all_gather", ag, ref, (size_t)(n * nranks), 0.0, 0.0);
    for (int64_t i = 0; i < n; i++) {
        double s = 0.0;
        for (int r = 0; r < nranks; r++) {
            s += input(r, rank * n + i);
            rows[r * n + i] = input(r, rank * n + i);
        }
        ref[i] = s;
    }
    FXT_OK(fx_comm_sum_pairwise(ordered, rows, n, nranks));
    fxt_close_f32("reduce_scatter", rs, ref, (size_t)n, 1e-5, 1e-6);
    fxt_close_f32("in-place reduce_scatter", rs_ip, ref, (size_t)n, 1e-5, 1e-6);
    if (det) {
        fxt_bitwise_f32("deterministic reduce_scatter", rs, ordered, (size_t)n);
        fxt_bitwise_f32("deterministic in-place reduce_scatter", rs_ip, ordered, (size_t)n);
    }
    for (int64_t i = 0; i < n; i++)
        ref[i] = input(100, i);
    fxt_close_f32("broadcast", bc, ref, (size_t)n, 0.0, 0.0);
    fxt_guarded_free("all_reduce", ar);
    fxt_guarded_free("all_gather", ag);
    fxt_guarded_free("reduce_scatter", rs);
    fxt_guarded_free("in-place reduce_scatter", rs_ip);
    fxt_guarded_free("broadcast", bc);
    free(rs_in);
    free(mine);
    free(ref);
    free(ordered);
    free(rows);
    FXT_OK(fx_comm_set_deterministic(world, false));
}

static void test_blocking(void) { run_collectives(false, false); }
static void test_nonblocking(void) { run_collectives(false, true); }
static void test_deterministic(void)
{
    run_collectives(true, false);
    run_collectives(true, true);
}

/* FSDP's pattern: a reduce-scatter on its own communicator in flight while all-gathers run
   on the other, many ops deep (more than the notice window). */
static void test_two_communicators(void)
{
    fx_comm *rs_comm;
    FXT_OK(fx_comm_dup(&rs_comm, world, "reduce_scatter"));
    const int layers = 80;
    const int64_t n = 64;
    float *g = malloc(sizeof(float) * (size_t)(n * nranks * layers));
    float *shard = malloc(sizeof(float) * (size_t)(n * layers));
    float *p = malloc(sizeof(float) * (size_t)n), *full = malloc(sizeof(float) * (size_t)(n * nranks * layers));
    fx_comm_work **rsw = calloc((size_t)layers, sizeof *rsw), **agw = calloc((size_t)layers, sizeof *agw);
    for (int64_t i = 0; i < n * nranks * layers; i++)
        g[i] = (float)(rank + 1);
    for (int64_t i = 0; i < n; i++)
        p[i] = (float)(rank * 1000 + i);
    for (int l = 0; l < layers; l++) {
        FXT_OK(fx_comm_reduce_scatter_single(rs_comm, shard + l * n, g + (int64_t)l * n * nranks, n, &rsw[l]));
        FXT_OK(fx_comm_all_gather_single(world, full + (int64_t)l * n * nranks, p, n, &agw[l]));
        FXT_OK(fx_comm_progress(world));
        FXT_OK(fx_comm_progress(rs_comm));
    }
    for (int l = 0; l < layers; l++) {
        FXT_OK(fx_comm_work_wait(agw[l], -1.0));
        FXT_OK(fx_comm_work_wait(rsw[l], -1.0));
        fx_comm_work_free(agw[l]);
        fx_comm_work_free(rsw[l]);
    }
    double expect = nranks * (nranks + 1) / 2.0;
    for (int64_t i = 0; i < n * layers; i++)
        if (shard[i] != (float)expect) {
            FXT_FAIL("shard[%lld] = %g, expected %g", (long long)i, (double)shard[i], expect);
            break;
        }
    for (int l = 0; l < layers; l++)
        for (int r = 0; r < nranks; r++)
            for (int64_t i = 0; i < n; i++)
                if (full[((int64_t)l * nranks + r) * n + i] != (float)(r * 1000 + i)) {
                    FXT_FAIL("gathered layer %d rank %d [%lld] wrong", l, r, (long long)i);
                    l = layers, r = nranks, i = n;
                }
    FXT_OK(fx_comm_check(world));
    FXT_OK(fx_comm_check(rs_comm));
    fx_comm_free(rs_comm);
    free(g), free(shard), free(p), free(full), free(rsw), free(agw);
}

/* Broadcast roots do not wait for their receivers; fx_comm_check collects those notices. */
static void test_check(void)
{
    int v = rank == 0 ? 42 : 0;
    for (int i = 0; i < 10; i++)
        FXT_OK(fx_comm_broadcast(world, &v, sizeof v, 0, NULL));
    FXT_EQ_INT(v, 42);
    FXT_OK(fx_comm_check(world));
}

static void test_log_per_rank(void)
{
    char path[256], mine[256];
    snprintf(path, sizeof path, "/tmp/flexc_mpi_comm_%d_{rank}.jsonl", (int)getppid());
    snprintf(mine, sizeof mine, "/tmp/flexc_mpi_comm_%d_%d.jsonl", (int)getppid(), rank);
    unlink(mine);
    FXT_OK(fx_comm_log_open(path));
    FXT_OK(fx_comm_barrier(world, NULL));
    fx_comm_log_close();
    FILE *f = fopen(mine, "r");
    char line[512] = "";
    FXT_CHECK(f != NULL);
    if (f) {
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
    }
    char expect[64];
    snprintf(expect, sizeof expect, "{\"rank\":%d,\"comm\":\"world\"", rank);
    FXT_HAS_STR(line, expect);
    FXT_HAS_STR(line, "\"op\":\"barrier\"");
    unlink(mine);
}

static int case_collectives(void)
{
    FXT_RUN(test_blocking);
    FXT_RUN(test_nonblocking);
    FXT_RUN(test_deterministic);
    FXT_RUN(test_two_communicators);
    FXT_RUN(test_check);
    FXT_RUN(test_log_per_rank);
    fx_comm_free(world);
    int rc = fx_comm_finalize();
    if (rc != FX_OK) {
        fprintf(stderr, "rank %d: fx_comm_finalize: %s\n", rank, fx_last_error());
        return 1;
    }
    return fxt_finish();
}

/* ---- timeout -------------------------------------------------------------------------------- */

/* After a failure the survivors resynchronise on a fresh MPI communicator, so that the test
   can finalise cleanly (a real program would exit instead). */
static void resync_and_finalize(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
}

static void test_timeout(void)
{
    fx_comm *b;
    FXT_OK(fx_comm_dup(&b, world, "second"));
    FXT_OK(fx_comm_set_timeout(world, 1.5));
    char dump_path[256];
    snprintf(dump_path, sizeof dump_path, "/tmp/flexc_mpi_dump_%d_%d.jsonl", (int)getppid(), rank);
    FILE *dump = fopen(dump_path, "w+");
    FXT_CHECK(dump != NULL);
    if (dump)
        fx_comm_set_dump_fd(fileno(dump));
    /* Static: MPI may still write into the buffers of an abandoned op after this returns. */
    static float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = 1.0f;
    /* Rank 1 learns rank 0's pid, to ask it for a dump (SIGUSR1) while it is stuck. */
    int pid0 = (int)getpid();
    FXT_OK(fx_comm_broadcast(b, &pid0, sizeof pid0, 0, NULL)); /* seq 0 of "second" */
    FXT_OK(fx_comm_install_sigusr1());
    FXT_OK(fx_comm_all_reduce(world, x, 256, NULL)); /* seq 0: everybody */
    if (rank == 1) {
        usleep(500000);
        kill(pid0, SIGUSR1);
        sleep(4);
        FXT_OK(fx_comm_all_reduce(world, x, 256, NULL));
        FXT_OK(fx_comm_all_reduce(b, x, 256, NULL));
        FXT_EQ_INT(fx_comm_status(world), FX_OK);
    } else {
        double t0 = now();
        FXT_STATUS(fx_comm_all_reduce(world, x, 256, NULL), FX_ETIMEDOUT,
                   "all_reduce seq 1 on communicator 'world' (1024 bytes) timed out after");
        double took = now() - t0;
        FXT_HAS_STR(fx_last_error(), "not arrived: rank 1 (last entered seq 0)");
        if (took < 1.4 || took > 2.5)
            FXT_FAIL("timeout after %.2f s, expected about 1.5 s", took);
        /* The communicator is now unusable, and says why. */
        FXT_EQ_INT(fx_comm_status(world), FX_ETIMEDOUT);
        FXT_STATUS(fx_comm_barrier(world, NULL), FX_ECOMM, "unusable after an earlier failure: all_reduce seq 1");
        /* The non-blocking form with a wait timeout, on the other communicator. */
        fx_comm_work *w;
        FXT_OK(fx_comm_all_reduce(b, x, 256, &w));
        t0 = now();
        FXT_STATUS(fx_comm_work_wait(w, 0.5), FX_ETIMEDOUT, "all_reduce seq 1 on communicator 'second'");
        took = now() - t0;
        if (took < 0.45 || took > 1.5)
            FXT_FAIL("wait timed out after %.2f s, expected about 0.5 s", took);
        FXT_STATUS(fx_comm_work_wait(w, -1.0), FX_ETIMEDOUT, "not arrived: rank 1");
        bool done = false;
        FXT_STATUS(fx_comm_work_test(w, &done), FX_ETIMEDOUT, "second");
        FXT_CHECK(done);
        fx_comm_work_free(w);
        FXT_STATUS(fx_comm_finalize(), FX_ECOMM, "exit the process instead");
        /* The flight recorder went to the dump fd, with the failed op in it. */
        if (dump) {
            char buf[8192];
            rewind(dump);
            size_t len = fread(buf, 1, sizeof buf - 1, dump);
            buf[len] = '\0';
            FXT_HAS_STR(buf, "{\"flight_recorder\":\"world\",\"rank\":0,\"size\":2,\"next_seq\":2");
            FXT_HAS_STR(buf, "\"seq\":1,\"op\":\"all_reduce\",\"bytes\":1024");
            FXT_HAS_STR(buf, "\"status\":\"FX_ETIMEDOUT\",\"state\":\"failed\"");
            /* The SIGUSR1 dump, taken while the op was stuck, shows it pending. */
            FXT_HAS_STR(buf, "\"seq\":1,\"op\":\"all_reduce\",\"bytes\":1024,\"root\":-1");
            FXT_HAS_STR(buf, "\"status\":\"FX_OK\",\"state\":\"pending\"");
            FXT_HAS_STR(buf, "{\"flight_recorder\":\"second\"");
        }
    }
    fx_comm_set_dump_fd(-1);
    signal(SIGUSR1, SIG_DFL);
    if (dump)
        fclose(dump);
    unlink(dump_path);
    fx_comm_free(b);
}

static int case_timeout(void)
{
    FXT_RUN(test_timeout);
    fx_comm_free(world);
    int rc = fxt_finish();
    resync_and_finalize();
    return rc;
}

/* ---- mismatch ------------------------------------------------------------------------------- */

static void test_mismatch(void)
{
    fx_comm *b;
    FXT_OK(fx_comm_dup(&b, world, "sizes"));
    FXT_OK(fx_comm_set_timeout(world, 10.0));
    FXT_OK(fx_comm_set_timeout(b, 10.0));
    /* Static: MPI may still write into the buffers of a mismatched op after this returns. */
    static float x[32];
    FXT_OK(fx_comm_barrier(world, NULL));
    double t0 = now();
    /* Different ops at seq 1: both sides must say who called what. */
    if (rank == 0)
        FXT_STATUS(fx_comm_all_reduce(world, x, 16, NULL), FX_ECOMM,
                   "collective mismatch on communicator 'world' at seq 1: rank 0 called all_reduce (64 bytes) "
                   "but rank 1 called barrier (0 bytes)");
    else
        FXT_STATUS(fx_comm_barrier(world, NULL), FX_ECOMM,
                   "collective mismatch on communicator 'world' at seq 1: rank 1 called barrier (0 bytes) "
                   "but rank 0 called all_reduce (64 bytes)");
    /* The same op with different sizes. */
    if (rank == 0)
        FXT_STATUS(fx_comm_all_reduce(b, x, 16, NULL), FX_ECOMM,
                   "rank 0 called all_reduce (64 bytes) but rank 1 called all_reduce (128 bytes)");
    else
        FXT_STATUS(fx_comm_all_reduce(b, x, 32, NULL), FX_ECOMM,
                   "rank 1 called all_reduce (128 bytes) but rank 0 called all_reduce (64 bytes)");
    double took = now() - t0;
    if (took > 5.0)
        FXT_FAIL("mismatches took %.2f s to detect; the timeout is 10 s, detection must not wait for it", took);
    fx_comm_free(b);
}

static int case_mismatch(void)
{
    FXT_RUN(test_mismatch);
    fx_comm_free(world);
    int rc = fxt_finish();
    resync_and_finalize();
    return rc;
}

/* ---- a killed rank -------------------------------------------------------------------------- */

static int case_kill(void)
{
    FXT_OK(fx_comm_set_timeout(world, 2.0));
    fx_comm_set_dump_fd(2);
    float x[1024] = {0};
    FXT_OK(fx_comm_all_reduce(world, x, 1024, NULL));
    if (rank == 1)
        raise(SIGKILL);
    double t0 = now();
    int rc = fx_comm_all_reduce(world, x, 1024, NULL);
    printf("survivor: %s after %.2f s: %s\n", fx_status_name(rc), now() - t0, fx_last_error());
    fflush(stdout);
    /* What a program does after a communication failure: exit non-zero without finalising. */
    _exit(3);
}

/* Rank 1 dies inside an op it already announced: the survivor cannot name it from the
   notices, so it probes who still answers. */
static int case_kill_inside(void)
{
    FXT_OK(fx_comm_set_timeout(world, 2.0));
    fx_comm_set_dump_fd(2);
    const int64_t n = 1 << 20; /* beyond the eager limit: the data waits for both sides */
    float *big = calloc((size_t)n, sizeof(float));
    FXT_OK(fx_comm_barrier(world, NULL));
    if (rank == 1) {
        fx_comm_work *w;
        FXT_OK(fx_comm_all_reduce(world, big, n, &w));
        FXT_OK(fx_comm_progress(world));
        raise(SIGKILL);
    }
    usleep(300000);
    double t0 = now();
    int rc = fx_comm_all_reduce(world, big, n, NULL);
    printf("survivor: %s after %.2f s: %s\n", fx_status_name(rc), now() - t0, fx_last_error());
    fflush(stdout);
    _exit(3);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: mpi_comm collectives|timeout|mismatch|kill|kill_inside\n");
        return 2;
    }
    int rc = fx_comm_init(&world, &argc, &argv);
    if (rc != FX_OK) {
        fprintf(stderr, "fx_comm_init: %s: %s\n", fx_status_name(rc), fx_last_error());
        return 1;
    }
    rank = fx_comm_rank(world);
    nranks = fx_comm_size(world);
    const char *what = argv[1];
    if (!strcmp(what, "collectives"))
        return case_collectives();
    bool two = nranks == 2;
    if (!two)
        fprintf(stderr, "mpi_comm %s needs exactly 2 ranks (got %d)\n", what, nranks);
    if (two && !strcmp(what, "timeout"))
        return case_timeout();
    if (two && !strcmp(what, "mismatch"))
        return case_mismatch();
    if (two && !strcmp(what, "kill"))
        return case_kill();
    if (two && !strcmp(what, "kill_inside"))
        return case_kill_inside();
    fprintf(stderr, "mpi_comm: unknown case %s\n", what);
    return 2;
}
