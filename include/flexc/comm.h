/*
 * Collectives between processes, over MPI, with deadlines, tracing and fingerprint checks.
 *
 *     fx_comm *world;
 *     if (fx_comm_init(&world, &argc, &argv) != FX_OK) { ... fx_last_error() ... }
 *     fx_comm_set_timeout(world, 60.0);                  // every op must finish within 60 s
 *     int rc = fx_comm_all_reduce(world, grad, n, NULL); // blocking, in place, sum
 *     if (rc != FX_OK) {                                  // FX_ETIMEDOUT or FX_ECOMM: a peer is
 *         fprintf(stderr, "%s\n", fx_last_error());       // lost or the ranks disagree; the
 *         exit(1);                                        // message names the op, seq and ranks
 *     }
 *
 *     fx_comm *rs;                                        // a second communicator, so that a
 *     fx_comm_dup(&rs, world, "reduce_scatter");          // reduce-scatter overlaps all-gathers
 *     fx_comm_work *w;
 *     fx_comm_reduce_scatter_single(rs, shard, grads, shard_n, &w);   // non-blocking
 *     ...compute...
 *     rc = fx_comm_work_wait(w, -1.0);                    // -1: the op's own deadline
 *     fx_comm_work_free(w);
 *
 *     fx_comm_free(rs);
 *     fx_comm_free(world);
 *     fx_comm_finalize();
 *
 * Every operation has a sequence number (per communicator, from 0) and a deadline (start +
 * the communicator's timeout, 600 s by default). Past the deadline it returns FX_ETIMEDOUT
 * with a message naming the op, its sequence number and the ranks that have not arrived.
 * Ranks tell each other which op they enter (a small message per peer on a private
 * communicator), so a rank that calls a different collective is reported as FX_ECOMM naming
 * both sides. After any FX_ETIMEDOUT or FX_ECOMM the communicator is unusable (MPI cannot
 * cancel a collective): every later call on it returns FX_ECOMM, and the process should exit
 * with the message. The library never calls MPI_Abort and never prints on its own.
 *
 * Threads: calls on one process must not run concurrently (MPI_THREAD_SERIALIZED).
 * A build without MPI declares the same functions: those that communicate or configure return
 * FX_EUNSUPPORTED ("flexc was built without MPI"), fx_comm_finalize returns FX_OK, the getters
 * return empty values (rank -1, size 0, name "", status FX_EUNSUPPORTED, seq -1), and
 * fx_comm_op_name and fx_comm_sum_pairwise work as with MPI.
 * See docs/comm.md.
 */
#ifndef FLEXC_COMM_H
#define FLEXC_COMM_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fx_comm fx_comm;
/* A non-blocking operation in flight; owned by the caller until fx_comm_work_free(). */
typedef struct fx_comm_work fx_comm_work;

typedef enum fx_comm_op {
    FX_COMM_ALL_REDUCE = 0,
    FX_COMM_ALL_GATHER = 1,
    FX_COMM_REDUCE_SCATTER = 2,
    FX_COMM_BROADCAST = 3,
    FX_COMM_BARRIER = 4,
} fx_comm_op;

#define FX_COMM_DEFAULT_TIMEOUT 600.0

/* "all_reduce", "all_gather", ...; "unknown" otherwise. */
FX_API const char *fx_comm_op_name(fx_comm_op op);

/* ---- communicators ----------------------------------------------------------------------- */

/* Initialises MPI (MPI_Init_thread, SERIALIZED) unless the program already did, and creates
   the communicator "world" over every process. argc/argv may be NULL. */
FX_API int fx_comm_init(fx_comm **out, int *argc, char ***argv);
/* A new communicator over the same processes with its own ordering of collectives (MPI_Comm_dup),
   so that its operations run concurrently with the parent's. Collective: every rank calls it
   in the same order. Settings (timeout, deterministic, tracking) are copied; name may be NULL. */
FX_API int fx_comm_dup(fx_comm **out, fx_comm *parent, const char *name);
/* Waits for operations still in flight (within their deadlines) and frees. NULL is a no-op.
   After a failure nothing is waited for: the MPI objects are left to process exit. */
FX_API void fx_comm_free(fx_comm *c);
/* MPI_Finalize, when fx_comm_init initialised MPI. Refused with FX_ECOMM after any
   communicator failed (finalising with a lost peer can hang): exit the process instead. */
FX_API int fx_comm_finalize(void);

FX_API int fx_comm_rank(const fx_comm *c);
FX_API int fx_comm_size(const fx_comm *c);
FX_API const char *fx_comm_name(const fx_comm *c);
/* The MPI_Comm that carries the collectives, as a pointer to it (cast to MPI_Comm *). */
FX_API void *fx_comm_mpi_handle(fx_comm *c);
/* FX_OK while usable; the status of the failure that made it unusable otherwise. */
FX_API int fx_comm_status(const fx_comm *c);

/* Seconds every later operation may take, > 0 (the CLI's --comm-timeout). */
FX_API int fx_comm_set_timeout(fx_comm *c, double seconds);
FX_API double fx_comm_timeout(const fx_comm *c);
/* Deterministic sums: all_reduce and reduce_scatter add the ranks' values in the order of
   fx_comm_sum_pairwise over ranks, identical on every rank and bitwise reproducible for a
   given N, whatever MPI's algorithm. all_reduce then moves (N-1)*n floats per rank instead of
   about 2n. Every rank must use the same setting. Default off. */
FX_API int fx_comm_set_deterministic(fx_comm *c, bool on);
/* x [count, n] -> out [n]: the rows summed by a left-aligned binary tree (a range of rows is
   split after its largest power of two below its length: ((x0+x1)+(x2+x3))+x4 for 5 rows),
   the order of deterministic reductions. x is overwritten (scratch); out may be x, else it
   must not overlap x (FX_EINVAL). It
   composes: summing N*K rows equals summing N partial sums of K consecutive rows each when K
   is a power of two, so a 1-process run over N*K slices reproduces an N-rank run with K
   slices per rank bit for bit. Needs no MPI. */
FX_API int fx_comm_sum_pairwise(float *out, float *x, int64_t n, int count);
/* Arrival notices and fingerprint checks (default on). Off saves 2(N-1) small messages per
   op, but a timeout can then not name the missing ranks and mismatches go undetected.
   Every rank must use the same setting; change it only with no operation in flight. */
FX_API int fx_comm_set_tracking(fx_comm *c, bool on);
/* Waits (within the timeout) until every peer's fingerprint of every op so far has arrived
   and compared equal: FX_ECOMM naming both sides on a divergence. Operations already check
   the fingerprints they can at completion; call this periodically (each training step) to
   cover the rest (a broadcast root does not wait for its receivers). */
FX_API int fx_comm_check(fx_comm *c);
/* Drives MPI's progress of the operations in flight (call between compute phases so that
   non-blocking collectives advance), and serves a pending SIGUSR1 dump request. */
FX_API int fx_comm_progress(fx_comm *c);

/* ---- collectives (float32, sum) ----------------------------------------------------------
   work == NULL: blocking, returns when done (or failed). work != NULL: starts the operation,
   sets *work, returns at once; buffers stay in use until the work completes.
   Counts are elements and must be <= INT_MAX. */

/* buf [n], in place: buf = sum over ranks. */
FX_API int fx_comm_all_reduce(fx_comm *c, float *buf, int64_t n, fx_comm_work **work);
/* in [n] -> out [size * n], rank r's block at out + r*n. in may be out + rank*n. */
FX_API int fx_comm_all_gather_single(fx_comm *c, float *out, const float *in, int64_t n,
                                     fx_comm_work **work);
/* in [size * n] -> out [n] = sum over ranks of their block [rank * n, (rank+1) * n). out may
   be in (in place: the sum lands in in[0, n), the rest of in is undefined afterwards). */
FX_API int fx_comm_reduce_scatter_single(fx_comm *c, float *out, const float *in, int64_t n,
                                         fx_comm_work **work);
/* bytes from root's buf to every rank's buf. */
FX_API int fx_comm_broadcast(fx_comm *c, void *buf, int64_t bytes, int root, fx_comm_work **work);
FX_API int fx_comm_barrier(fx_comm *c, fx_comm_work **work);

/* Waits until the work is done: at most timeout seconds (> 0), or until the op's deadline
   when timeout < 0, whichever comes first. Expiry is FX_ETIMEDOUT and fails the communicator.
   Returns the work's final status; calling it again returns the same status. */
FX_API int fx_comm_work_wait(fx_comm_work *w, double timeout);
/* *done = whether it finished; FX_ETIMEDOUT once its deadline has passed, or its error. */
FX_API int fx_comm_work_test(fx_comm_work *w, bool *done);
FX_API int64_t fx_comm_work_seq(const fx_comm_work *w);
/* Frees the handle. A work still in flight stays with its communicator, which completes it
   in later calls (its buffers must stay valid until then). NULL is a no-op. */
FX_API void fx_comm_work_free(fx_comm_work *w);

/* ---- logs and the flight recorder (per process) --------------------------------------------
   Records are JSON objects: {"rank","comm","seq","op","bytes","root","start" (Unix seconds),
   "duration" (s),"status","state"}. */

/* Appends one JSON line per finished or failed operation of every communicator to path
   ("{rank}" in path is replaced by the world rank). NULL closes the log. */
FX_API int fx_comm_log_open(const char *path);
FX_API void fx_comm_log_close(void);
/* Records kept per communicator (default 256, >= 1); applies to communicators created later. */
FX_API int fx_comm_set_recorder_size(int64_t n);
/* Where the flight recorder is dumped on a timeout, an error and SIGUSR1: a file descriptor
   the caller owns (2 for stderr), or -1 for no automatic dumps (the default). */
FX_API void fx_comm_set_dump_fd(int fd);
/* Writes every live communicator's recorder (oldest first) to fd now; FX_EIO when a write fails. */
FX_API int fx_comm_dump(int fd);
/* Installs a SIGUSR1 handler that only sets a flag; the next fx_comm call that waits or
   progresses (a stuck wait polls continuously) writes the dump to the dump fd, or to stderr
   when none is set. */
FX_API int fx_comm_install_sigusr1(void);

#ifdef __cplusplus
}
#endif
#endif
