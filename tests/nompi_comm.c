/* A build without MPI: the communication API is there and refuses with FX_EUNSUPPORTED. */
#include "harness.h"

static void test_unsupported(void)
{
    fx_comm *c = NULL;
    float x[2] = {1, 2};
    FXT_STATUS(fx_comm_init(&c, NULL, NULL), FX_EUNSUPPORTED, "without MPI");
    FXT_CHECK(c == NULL);
    FXT_STATUS(fx_comm_all_reduce(c, x, 2, NULL), FX_EUNSUPPORTED, "without MPI");
    FXT_STATUS(fx_comm_barrier(c, NULL), FX_EUNSUPPORTED, "without MPI");
    FXT_STATUS(fx_comm_log_open("/tmp/x"), FX_EUNSUPPORTED, "without MPI");
    FXT_EQ_INT(fx_comm_size(c), 0);
    FXT_EQ_STR(fx_comm_op_name(FX_COMM_BROADCAST), "broadcast");
    FXT_OK(fx_comm_finalize());
    fx_comm_free(c);
    FXT_EQ_INT(x[1], 2);
}

/* The pairwise sum needs no MPI: it works, and checks its sizes, in this build too. */
static void test_sum_pairwise(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6}, out[2] = {0, 0};
    FXT_OK(fx_comm_sum_pairwise(out, x, 2, 3));
    FXT_EQ_INT(out[0], 9);
    FXT_EQ_INT(out[1], 12);
    FXT_STATUS(fx_comm_sum_pairwise(out, x, INT64_MAX / 2, 3), FX_EINVAL, "overflows");
    FXT_EQ_INT(out[0], 9);
}

int main(int argc, char **argv)
{
    FXT_INIT(argc, argv);
    FXT_RUN(test_unsupported);
    FXT_RUN(test_sum_pairwise);
    return fxt_finish();
}
