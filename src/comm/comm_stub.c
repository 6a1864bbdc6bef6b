/* The communication layer of a build without MPI: the same functions, each refusing with
   FX_EUNSUPPORTED, so that programs compile and link either way. cmake/comm.cmake adds this
   file only when MPI is missing; with MPI it compiles to nothing. */
#ifndef FLEXC_HAVE_MPI
#include "core/core.h"
#include "flexc/comm.h"

static int fx__no_mpi(void) { return fx__error(FX_EUNSUPPORTED, "flexc was built without MPI"); }

int fx_comm_init(fx_comm **out, int *argc, char ***argv) { (void)out, (void)argc, (void)argv; return fx__no_mpi(); }
int fx_comm_dup(fx_comm **out, fx_comm *parent, const char *name) { (void)out, (void)parent, (void)name; return fx__no_mpi(); }
void fx_comm_free(fx_comm *c) { (void)c; }
int fx_comm_finalize(void) { return FX_OK; }
int fx_comm_rank(const fx_comm *c) { (void)c; return -1; }
int fx_comm_size(const fx_comm *c) { (void)c; return 0; }
const char *fx_comm_name(const fx_comm *c) { (void)c; return ""; }
void *fx_comm_mpi_handle(fx_comm *c) { (void)c; return NULL; }
int fx_comm_status(const fx_comm *c) { (void)c; return FX_EUNSUPPORTED; }
int fx_comm_set_timeout(fx_comm *c, double seconds) { (void)c, (void)seconds; return fx__no_mpi(); }
double fx_comm_timeout(const fx_comm *c) { (void)c; return 0.0; }
int fx_comm_set_deterministic(fx_comm *c, bool on) { (void)c, (void)on; return fx__no_mpi(); }
int fx_comm_set_tracking(fx_comm *c, bool on) { (void)c, (void)on; return fx__no_mpi(); }
int fx_comm_check(fx_comm *c) { (void)c; return fx__no_mpi(); }
int fx_comm_progress(fx_comm *c) { (void)c; return fx__no_mpi(); }
int fx_comm_all_reduce(fx_comm *c, float *buf, int64_t n, fx_comm_work **work)
{
    (void)c, (void)buf, (void)n, (void)work;
    return fx__no_mpi();
}
int fx_comm_all_gather_single(fx_comm *c, float *out, const float *in, int64_t n, fx_comm_work **work)
{
    (void)c, (void)out, (void)in, (void)n, (void)work;
    return fx__no_mpi();
}
int fx_comm_reduce_scatter_single(fx_comm *c, float *out, const float *in, int64_t n, fx_comm_work **work)
{
    (void)c, (void)out, (void)in, (void)n, (void)work;
    return fx__no_mpi();
}
int fx_comm_broadcast(fx_comm *c, void *buf, int64_t bytes, int root, fx_comm_work **work)
{
    (void)c, (void)buf, (void)bytes, (void)root, (void)work;
    return fx__no_mpi();
}
int fx_comm_barrier(fx_comm *c, fx_comm_work **work) { (void)c, (void)work; return fx__no_mpi(); }
int fx_comm_work_wait(fx_comm_work *w, double timeout) { (void)w, (void)timeout; return fx__no_mpi(); }
int fx_comm_work_test(fx_comm_work *w, bool *done) { (void)w, (void)done; return fx__no_mpi(); }
int64_t fx_comm_work_seq(const fx_comm_work *w) { (void)w; return -1; }
void fx_comm_work_free(fx_comm_work *w) { (void)w; }
int fx_comm_log_open(const char *path) { (void)path; return fx__no_mpi(); }
void fx_comm_log_close(void) {}
int fx_comm_set_recorder_size(int64_t n) { (void)n; return fx__no_mpi(); }
void fx_comm_set_dump_fd(int fd) { (void)fd; }
int fx_comm_dump(int fd) { (void)fd; return fx__no_mpi(); }
int fx_comm_install_sigusr1(void) { return fx__no_mpi(); }
#else
/* ISO C wants at least one declaration in a translation unit. */
typedef int fx__comm_stub_unused;
#endif
