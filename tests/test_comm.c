/* The communication layer in one process (MPI singleton): argument checks, every collective
   as the identity it is at size 1, work handles, the log, the flight recorder and its dumps,
   SIGUSR1. The multi-process behaviour (sums, timeouts, mismatches, a killed rank) is in
   tests/mpi_comm.c, run under mpirun. */
#include "harness.h"

#include <limits.h>
#include <signal.h>
#include <unistd.h>

static fx_comm *world;

/* The whole content of a file, NUL-terminated (static buffer). */
static const char *slurp(const char *path)
{
    static char buf[1 << 16];
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static void temp_path(char *buf, size_t cap, const char *stem)
{
    snprintf(buf, cap, "/tmp/flexc_test_comm_%d_%s", (int)getpid(), stem);
}

static void test_basics(void)
{
    FXT_EQ_INT(fx_comm_rank(world), 0);
    FXT_EQ_INT(fx_comm_size(world), 1);
    FXT_EQ_STR(fx_comm_name(world), "world");
    FXT_EQ_INT(fx_comm_status(world), FX_OK);
    FXT_CHECK(fx_comm_timeout(world) == FX_COMM_DEFAULT_TIMEOUT);
    FXT_CHECK(fx_comm_mpi_handle(world) != NULL);
    FXT_EQ_STR(fx_comm_op_name(FX_COMM_REDUCE_SCATTER), "reduce_scatter");
    FXT_EQ_STR(fx_comm_op_name((fx_comm_op)99), "unknown");
    FXT_OK(fx_comm_set_timeout(world, 30.0));
    FXT_CHECK(fx_comm_timeout(world) == 30.0);
    FXT_EQ_INT(fx_comm_rank(NULL), -1);
    FXT_EQ_INT(fx_comm_size(NULL), 0);
}

static void test_argument_checks(void)
{
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    fx_comm *d = NULL;
    FXT_STATUS(fx_comm_init(NULL, NULL, NULL), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_comm_all_reduce(NULL, x, 4, NULL), FX_EINVAL, "communicator is NULL");
    FXT_STATUS(fx_comm_all_reduce(world, x, -1, NULL), FX_EINVAL, "n = -1");
    FXT_STATUS(fx_comm_all_reduce(world, x, (int64_t)INT_MAX + 1, NULL), FX_EINVAL, "MPI count limit");
    FXT_STATUS(fx_comm_all_reduce(world, NULL, 4, NULL), FX_EINVAL, "buf is NULL");
    FXT_STATUS(fx_comm_all_gather_single(world, NULL, x, 4, NULL), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_comm_all_gather_single(world, x, x + 1, 2, NULL), FX_EINVAL, "overlaps");
    FXT_STATUS(fx_comm_reduce_scatter_single(world, y, NULL, 4, NULL), FX_EINVAL, "in is NULL");
    FXT_STATUS(fx_comm_reduce_scatter_single(world, x + 1, x, 2, NULL), FX_EINVAL, "overlaps");
    FXT_STATUS(fx_comm_broadcast(world, x, 16, 1, NULL), FX_EINVAL, "root = 1");
    FXT_STATUS(fx_comm_broadcast(world, x, 16, -1, NULL), FX_EINVAL, "root = -1");
    FXT_STATUS(fx_comm_broadcast(world, NULL, 16, 0, NULL), FX_EINVAL, "buf is NULL");
    FXT_STATUS(fx_comm_barrier(NULL, NULL), FX_EINVAL, "NULL");
    FXT_STATUS(fx_comm_set_timeout(world, 0.0), FX_EINVAL, "timeout = 0");
    FXT_STATUS(fx_comm_set_timeout(world, -2.0), FX_EINVAL, "timeout = -2");
    FXT_STATUS(fx_comm_set_timeout(world, INFINITY), FX_EINVAL, "finite");
    FXT_STATUS(fx_comm_set_timeout(world, NAN), FX_EINVAL, "timeout");
    FXT_STATUS(fx_comm_dup(&d, world, "has space"), FX_EINVAL, "character 3");
    FXT_STATUS(fx_comm_dup(&d, world, "a\"b"), FX_EINVAL, "character 1");
    FXT_STATUS(fx_comm_dup(&d, world, "a_name_that_is_far_too_long_for_it"), FX_EINVAL, "longer than 31");
    FXT_CHECK(d == NULL);
    FXT_STATUS(fx_comm_dup(NULL, world, "x"), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_comm_work_wait(NULL, 1.0), FX_EINVAL, "work is NULL");
    FXT_STATUS(fx_comm_work_test(NULL, NULL), FX_EINVAL, "work is NULL");
    FXT_STATUS(fx_comm_set_recorder_size(0), FX_EINVAL, "recorder size = 0");
    FXT_STATUS(fx_comm_dump(-1), FX_EINVAL, "fd = -1");
    FXT_STATUS(fx_comm_log_open("/nonexistent-dir/x.jsonl"), FX_EIO, "nonexistent-dir");
    /* Refused calls leave the buffers and the sequence alone. */
    FXT_EQ_INT(x[0], 1);
    FXT_EQ_INT(y[0], 0);
    FXT_EQ_INT(fx_comm_status(world), FX_OK);
}

/* At size 1 each collective is a copy: the values must come through unchanged and nothing
   outside the buffers may be written. Blocking and non-blocking, plain and deterministic. */
static void run_identities(bool det, bool nonblocking)
{
    const int64_t n = 1000;
    FXT_OK(fx_comm_set_deterministic(world, det));
    float *src = fxt_random((size_t)n, -1.0f, 1.0f, 7);
    float *buf = fxt_guarded_copy(src, (size_t)n);
    float *out = fxt_guarded((size_t)n);
    float *out2 = fxt_guarded((size_t)n);
    unsigned char *bytes = (unsigned char *)fxt_guarded(64);
    for (int i = 0; i < 256; i++)
        bytes[i] = (unsigned char)i;
    fx_comm_work *w[5] = {0};
    fx_comm_work **slot[5] = {NULL, NULL, NULL, NULL, NULL};
    if (nonblocking)
        for (int i = 0; i < 5; i++)
            slot[i] = &w[i];
    FXT_OK(fx_comm_all_reduce(world, buf, n, slot[0]));
    FXT_OK(fx_comm_all_gather_single(world, out, src, n, slot[1]));
    FXT_OK(fx_comm_reduce_scatter_single(world, out2, src, n, slot[2]));
    FXT_OK(fx_comm_broadcast(world, bytes, 256, 0, slot[3]));
    FXT_OK(fx_comm_barrier(world, slot[4]));
    if (nonblocking) {
        bool done = false;
        FXT_OK(fx_comm_work_test(w[0], &done));
        for (int i = 0; i < 5; i++) {
            FXT_OK(fx_comm_work_wait(w[i], -1.0));
            FXT_OK(fx_comm_work_wait(w[i], 5.0)); /* again: the same final status */
            FXT_OK(fx_comm_work_test(w[i], &done));
            FXT_CHECK(done);
            if (i > 0)
                FXT_EQ_INT(fx_comm_work_seq(w[i]), fx_comm_work_seq(w[i - 1]) + 1);
            fx_comm_work_free(w[i]);
        }
    }
    fxt_bitwise_f32("all_reduce", buf, src, (size_t)n);
    fxt_bitwise_f32("all_gather", out, src, (size_t)n);
    fxt_bitwise_f32("reduce_scatter", out2, src, (size_t)n);
    /* In place (out == in): the one rank's block is its sum. */
    float *ip = fxt_guarded_copy(src, (size_t)n);
    fx_comm_work *wi = NULL;
    FXT_OK(fx_comm_reduce_scatter_single(world, ip, ip, n, nonblocking ? &wi : NULL));
    if (wi) {
        FXT_OK(fx_comm_work_wait(wi, -1.0));
        fx_comm_work_free(wi);
    }
    fxt_bitwise_f32("in-place reduce_scatter", ip, src, (size_t)n);
    fxt_guarded_free("in-place reduce_scatter", ip);
    for (int i = 0; i < 256; i++)
        if (bytes[i] != (unsigned char)i) {
            FXT_FAIL("broadcast byte %d changed to %d", i, bytes[i]);
            break;
        }
    fxt_guarded_free("all_reduce buf", buf);
    fxt_guarded_free("all_gather out", out);
    fxt_guarded_free("reduce_scatter out", out2);
    fxt_guarded_free("broadcast buf", (float *)bytes);
    free(src);
    FXT_OK(fx_comm_set_deterministic(world, false));
}

static void test_collectives_blocking(void) { run_identities(false, false); }
static void test_collectives_nonblocking(void) { run_identities(false, true); }
static void test_collectives_deterministic(void)
{
    run_identities(true, false);
    run_identities(true, true);
}

static void test_zero_counts_and_in_place(void)
{
    float x[3] = {1, 2, 3};
    FXT_OK(fx_comm_all_reduce(world, NULL, 0, NULL));
    FXT_OK(fx_comm_broadcast(world, NULL, 0, 0, NULL));
    /* all_gather with in == out + rank * n is in place. */
    FXT_OK(fx_comm_all_gather_single(world, x, x, 3, NULL));
    FXT_EQ_INT(x[2], 3);
}

/* A work freed in flight is completed by the communicator; sequence numbers keep counting. */
static void test_detached_work(void)
{
    float x[8] = {0};
    fx_comm_work *a, *b;
    FXT_OK(fx_comm_all_reduce(world, x, 8, &a));
    int64_t s = fx_comm_work_seq(a);
    fx_comm_work_free(a);
    FXT_OK(fx_comm_barrier(world, &b));
    FXT_EQ_INT(fx_comm_work_seq(b), s + 1);
    FXT_OK(fx_comm_progress(world));
    FXT_OK(fx_comm_work_wait(b, -1.0));
    fx_comm_work_free(b);
    FXT_OK(fx_comm_check(world));
    fx_comm_work *c;
    FXT_OK(fx_comm_barrier(world, &c));
    FXT_STATUS(fx_comm_work_wait(c, 0.0), FX_EINVAL, "timeout = 0");
    FXT_OK(fx_comm_work_wait(c, 1.0));
    fx_comm_work_free(c);
    /* More ops in flight than notice slots. */
    fx_comm_work *many[150];
    for (int i = 0; i < 150; i++)
        FXT_OK(fx_comm_barrier(world, &many[i]));
    for (int i = 149; i >= 0; i--) {
        FXT_OK(fx_comm_work_wait(many[i], -1.0));
        fx_comm_work_free(many[i]);
    }
}

static void test_dup(void)
{
    fx_comm *d = NULL, *e = NULL;
    FXT_OK(fx_comm_set_timeout(world, 12.0));
    FXT_OK(fx_comm_dup(&d, world, "reduce_scatter"));
    FXT_OK(fx_comm_dup(&e, world, NULL));
    FXT_EQ_STR(fx_comm_name(d), "reduce_scatter");
    FXT_EQ_STR(fx_comm_name(e), "world.dup");
    FXT_CHECK(fx_comm_timeout(d) == 12.0);
    FXT_EQ_INT(fx_comm_size(d), 1);
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    fx_comm_work *w1, *w2;
    FXT_OK(fx_comm_reduce_scatter_single(d, b, a, 4, &w1));
    FXT_OK(fx_comm_all_reduce(e, a, 4, &w2));
    FXT_OK(fx_comm_work_wait(w2, -1.0));
    FXT_OK(fx_comm_work_wait(w1, -1.0));
    fx_comm_work_free(w1);
    fx_comm_work_free(w2);
    FXT_EQ_INT(b[3], 4);
    fx_comm_free(d);
    fx_comm_free(e);
    fx_comm_free(NULL);
}

static void test_log(void)
{
    char path[256], expect[256];
    temp_path(path, sizeof path, "log_{rank}.jsonl");
    temp_path(expect, sizeof expect, "log_0.jsonl");
    unlink(expect);
    FXT_OK(fx_comm_log_open(path));
    float x[16] = {0};
    FXT_OK(fx_comm_all_reduce(world, x, 16, NULL));
    FXT_OK(fx_comm_broadcast(world, x, 8, 0, NULL));
    fx_comm_log_close();
    FXT_OK(fx_comm_barrier(world, NULL)); /* not logged */
    const char *s = slurp(expect);
    FXT_EQ_INT(count_lines(s), 2);
    FXT_HAS_STR(s, "\"op\":\"all_reduce\",\"bytes\":64,\"root\":-1");
    FXT_HAS_STR(s, "\"op\":\"broadcast\",\"bytes\":8,\"root\":0");
    FXT_HAS_STR(s, "\"comm\":\"world\"");
    FXT_HAS_STR(s, "\"status\":\"FX_OK\",\"state\":\"done\"");
    FXT_HAS_STR(s, "\"duration\":");
    unlink(expect);
}

static void test_recorder_dump(void)
{
    char path[256];
    temp_path(path, sizeof path, "dump.jsonl");
    FXT_OK(fx_comm_set_recorder_size(4));
    fx_comm *d;
    FXT_OK(fx_comm_dup(&d, world, "small"));
    FXT_OK(fx_comm_set_recorder_size(256));
    for (int i = 0; i < 6; i++)
        FXT_OK(fx_comm_barrier(d, NULL));
    fx_comm_work *w;
    float x[2] = {0};
    FXT_OK(fx_comm_all_reduce(d, x, 2, &w));
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f != NULL);
    if (f) {
        FXT_OK(fx_comm_dump(fileno(f)));
        fclose(f);
    }
    /* A descriptor that cannot be written: an error, not a silent success. */
    FILE *ro = fopen(path, "rb");
    FXT_CHECK(ro != NULL);
    if (ro) {
        FXT_STATUS(fx_comm_dump(fileno(ro)), FX_EIO, "cannot write the flight recorder");
        fclose(ro);
    }
    const char *s = slurp(path);
    FXT_HAS_STR(s, "{\"flight_recorder\":\"small\",\"rank\":0,\"size\":1,\"next_seq\":7");
    FXT_HAS_STR(s, "{\"flight_recorder\":\"world\"");
    /* The small recorder keeps seq 3..6 only; seq 6 may still be pending. */
    FXT_HAS_STR(s, "\"comm\":\"small\",\"seq\":3,\"op\":\"barrier\"");
    FXT_HAS_STR(s, "\"comm\":\"small\",\"seq\":6,\"op\":\"all_reduce\"");
    FXT_CHECK(strstr(s, "\"comm\":\"small\",\"seq\":2,") == NULL);
    FXT_OK(fx_comm_work_wait(w, -1.0));
    fx_comm_work_free(w);
    fx_comm_free(d);
    unlink(path);
}

static void test_sigusr1(void)
{
    char path[256];
    temp_path(path, sizeof path, "sig.jsonl");
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f != NULL);
    if (!f)
        return;
    fx_comm_set_dump_fd(fileno(f));
    FXT_OK(fx_comm_install_sigusr1());
    FXT_OK(fx_comm_barrier(world, NULL));
    FXT_EQ_INT(count_lines(slurp(path)), 0); /* nothing without a request */
    raise(SIGUSR1);
    FXT_OK(fx_comm_progress(world)); /* the dump happens here, outside the handler */
    fflush(f);
    const char *s = slurp(path);
    FXT_HAS_STR(s, "{\"flight_recorder\":\"world\"");
    FXT_HAS_STR(s, "\"op\":\"barrier\"");
    int lines = count_lines(s);
    FXT_OK(fx_comm_progress(world)); /* served once */
    FXT_EQ_INT(count_lines(slurp(path)), lines);
    fx_comm_set_dump_fd(-1);
    signal(SIGUSR1, SIG_DFL);
    fclose(f);
    unlink(path);
}

static void test_tracking_off(void)
{
    float x[4] = {1, 1, 1, 1};
    FXT_OK(fx_comm_set_tracking(world, false));
    FXT_OK(fx_comm_all_reduce(world, x, 4, NULL));
    FXT_OK(fx_comm_check(world));
    FXT_OK(fx_comm_set_tracking(world, true));
    fx_comm_work *w;
    FXT_OK(fx_comm_barrier(world, &w));
    FXT_STATUS(fx_comm_set_tracking(world, false), FX_EINVAL, "in flight");
    FXT_OK(fx_comm_work_wait(w, -1.0));
    fx_comm_work_free(w);
    FXT_EQ_INT(x[0], 1);
}

/* The definition, written recursively: [lo, hi) splits after its largest power of two
   strictly below its length. */
static float pairwise_ref(const float *x, int64_t n, int64_t i, int lo, int hi)
{
    if (hi - lo == 1)
        return x[(int64_t)lo * n + i];
    int p = 1;
    while (p * 2 < hi - lo)
        p *= 2;
    return pairwise_ref(x, n, i, lo, lo + p) + pairwise_ref(x, n, i, lo + p, hi);
}

static void test_sum_pairwise(void)
{
    const int64_t n = 2500; /* more than one block of the implementation */
    float *x = fxt_random((size_t)(n * 24), -1.0f, 1.0f, 11);
    float *work = malloc(sizeof(float) * (size_t)(n * 24));
    float *ref = malloc(sizeof(float) * (size_t)n), *out = fxt_guarded((size_t)n), *out2 = malloc(sizeof(float) * (size_t)n);
    for (int count = 1; count <= 24; count++) {
        for (int64_t i = 0; i < n; i++)
            ref[i] = pairwise_ref(x, n, i, 0, count);
        memcpy(work, x, sizeof(float) * (size_t)(n * count));
        FXT_OK(fx_set_num_threads(1));
        FXT_OK(fx_comm_sum_pairwise(out, work, n, count));
        char what[64];
        snprintf(what, sizeof what, "pairwise sum of %d rows", count);
        fxt_bitwise_f32(what, out, ref, (size_t)n);
        /* In place, on two threads: the same bits. */
        memcpy(work, x, sizeof(float) * (size_t)(n * count));
        FXT_OK(fx_set_num_threads(2));
        FXT_OK(fx_comm_sum_pairwise(work, work, n, count));
        fxt_bitwise_f32(what, work, ref, (size_t)n);
    }
    /* The order is a tree, not a chain: ((x0+x1)+(x2+x3)) differs from ((x0+x1)+x2)+x3 here. */
    float t[4] = {1.0f, 1e8f, -1e8f, 1.0f};
    FXT_OK(fx_comm_sum_pairwise(t, t, 1, 4));
    FXT_CHECK(t[0] == ((1.0f + 1e8f) + (-1e8f + 1.0f)));
    FXT_CHECK(t[0] == 0.0f); /* the chain would give 1 */
    /* Composition: N*K rows == N partial sums of K consecutive rows, for K a power of two. */
    for (int K = 1; K <= 4; K *= 2) {
        for (int N = 1; N * K <= 24; N++) {
            memcpy(work, x, sizeof(float) * (size_t)(n * N * K));
            FXT_OK(fx_comm_sum_pairwise(out, work, n, N * K));
            float *partial = malloc(sizeof(float) * (size_t)(n * N));
            for (int r = 0; r < N; r++) {
                memcpy(work, x + (int64_t)r * K * n, sizeof(float) * (size_t)(n * K));
                FXT_OK(fx_comm_sum_pairwise(partial + (int64_t)r * n, work, n, K));
            }
            FXT_OK(fx_comm_sum_pairwise(out2, partial, n, N));
            char what[64];
            snprintf(what, sizeof what, "%d x %d rows vs %d partial sums", N, K, N);
            fxt_bitwise_f32(what, out2, out, (size_t)n);
            free(partial);
        }
    }
    FXT_STATUS(fx_comm_sum_pairwise(out, work, n, 0), FX_EINVAL, "count = 0");
    FXT_STATUS(fx_comm_sum_pairwise(NULL, work, n, 2), FX_EINVAL, "out is NULL");
    FXT_STATUS(fx_comm_sum_pairwise(out, work, INT64_MAX / 2, 3), FX_EINVAL, "overflows");
    /* out inside x but not x itself: its first block would be written over rows still to be
       read. */
    FXT_STATUS(fx_comm_sum_pairwise(work + 1, work, n, 2), FX_EINVAL, "out overlaps x");
    FXT_STATUS(fx_comm_sum_pairwise(work + n, work, n, 2), FX_EINVAL, "out overlaps x");
    FXT_OK(fx_set_num_threads(1));
    fxt_guarded_free("pairwise out", out);
    free(x), free(work), free(ref), free(out2);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    fx_comm *again = NULL;
    int rc = fx_comm_init(&world, &argc, &argv);
    if (rc != FX_OK) {
        fprintf(stderr, "fx_comm_init: %s: %s\n", fx_status_name(rc), fx_last_error());
        return 1;
    }
    /* A second init reuses the running MPI. */
    FXT_OK(fx_comm_init(&again, NULL, NULL));
    fx_comm_free(again);
    size_t mem_before, peak;
    fx_mem_stats(&mem_before, &peak);
    FXT_RUN(test_basics);
    FXT_RUN(test_argument_checks);
    FXT_RUN(test_collectives_blocking);
    FXT_RUN(test_collectives_nonblocking);
    FXT_RUN(test_collectives_deterministic);
    FXT_RUN(test_zero_counts_and_in_place);
    FXT_RUN(test_detached_work);
    FXT_RUN(test_dup);
    FXT_RUN(test_log);
    FXT_RUN(test_recorder_dump);
    FXT_RUN(test_sigusr1);
    FXT_RUN(test_tracking_off);
    FXT_RUN(test_sum_pairwise);
    fx_comm_free(world);
    size_t mem_after;
    fx_mem_stats(&mem_after, &peak);
    (void)mem_before;
    if (mem_after != 0) {
        /* Every communicator is freed: the library holds nothing from this module. */
        fprintf(stderr, "library still holds %zu bytes after freeing every communicator\n", mem_after);
        fxt_failed_tests++;
    }
    rc = fx_comm_finalize();
    if (rc != FX_OK) {
        fprintf(stderr, "fx_comm_finalize: %s\n", fx_last_error());
        fxt_failed_tests++;
    }
    return fxt_finish();
}
