/* Internals of the communication layer: the communicator, works, arrival notices and the
   flight recorder. Only src/comm/ includes this. */
#ifndef FX_COMM_INTERNAL_H
#define FX_COMM_INTERNAL_H

#include "core/core.h"
#include "flexc/comm.h"

#include <mpi.h>

/* Arrival notices in flight per communicator: op s uses slot s % FX__NOTICE_SLOTS. An op
   whose slot still waits for the notices of op s - SLOTS first collects them. */
enum { FX__NOTICE_SLOTS = 64, FX__NAME_CAP = 32, FX__MSG_CAP = 512 };

/* What a rank says when it enters an op: compared field by field across ranks. */
typedef struct fx__fingerprint {
    int64_t seq, op, bytes, root;
} fx__fingerprint;

typedef struct fx__slot {
    int64_t seq; /* -1: free */
    fx__fingerprint mine;
} fx__slot;

typedef enum fx__rec_state { FX__REC_PENDING = 0, FX__REC_DONE = 1, FX__REC_FAILED = 2 } fx__rec_state;

typedef struct fx__rec {
    int64_t seq; /* -1: empty */
    fx_comm_op op;
    int64_t bytes;
    int root;
    double start_wall; /* Unix seconds */
    double duration;   /* seconds, until completion or failure; 0 while pending */
    int status;
    fx__rec_state state;
} fx__rec;

struct fx_comm_work {
    fx_comm *c;
    int64_t seq;
    fx_comm_op op;
    int64_t n;   /* elements (bytes for broadcast) */
    int64_t bytes; /* this rank's input, as fingerprinted and recorded */
    int root;
    bool det;    /* the sum is finished locally: rows summed into out in the tree order */
    float *out;  /* where the local sum goes */
    float *rows;    /* the [size, n] rows summed into out: scratch, or out itself (in place) */
    float *scratch;
    size_t scratch_cap; /* floats */
    MPI_Request req;
    double t0, t0_wall, deadline; /* monotonic, wall, monotonic */
    bool data_done;     /* the MPI request completed (and the local sum is done) */
    bool finished;      /* status is final */
    int status;
    bool detached;      /* freed by the caller while in flight */
    fx_comm_work *next; /* in the communicator's in-flight list, or its free list */
};

struct fx_comm {
    MPI_Comm comm; /* collectives */
    MPI_Comm ctl;  /* arrival notices (point-to-point) */
    int rank, size;
    char name[FX__NAME_CAP];
    double timeout;
    bool deterministic, tracking;
    int64_t next_seq;
    int failed; /* FX_OK or the status of the failure */
    char fail_msg[FX__MSG_CAP];

    /* Notice tags are seq % tag_mod; tag_mod and tag_mod + 1 carry the liveness probe: a
       rank that sees a probe answers it from its poll loop. */
    int tag_mod;
    MPI_Request probe_recv;     /* a probe from any peer, always posted */
    int64_t probe_in, probe_out;
    MPI_Request *probe_send;    /* [size] probes and answers sent */
    MPI_Request *answer_recv;   /* [size] answers awaited */
    int64_t *answer_in;         /* [size] */
    fx__slot slots[FX__NOTICE_SLOTS];
    MPI_Request *nrecv;          /* [SLOTS][size], own rank MPI_REQUEST_NULL */
    MPI_Request *nsend;          /* [SLOTS][size] */
    fx__fingerprint *nbuf;       /* [SLOTS][size] received fingerprints */
    int64_t *last_seen;          /* [size] highest seq whose notice arrived, -1 none */
    int *idx_scratch;            /* [SLOTS * size] for MPI_Testsome */

    fx__rec *rec;
    int64_t rec_cap;

    fx_comm_work *inflight; /* oldest first */
    fx_comm_work *free_works;
    fx_comm *next_live;     /* registry of live communicators (dumps) */
};

/* trace.c: the registry, the recorder, the log and dumps. */
void fx__comm_register(fx_comm *c);
fx_comm *fx__comm_live(void);        /* the first live communicator; then ->next_live */
void fx__comm_unregister(fx_comm *c);
int64_t fx__comm_recorder_size(void);
void fx__comm_rec_start(fx_comm *c, const fx_comm_work *w);
void fx__comm_rec_finish(fx_comm *c, const fx_comm_work *w);
void fx__comm_dump_auto(void);       /* to the dump fd, if any */
void fx__comm_serve_signal(void);    /* dumps when SIGUSR1 came */
void fx__comm_note_failure(void);    /* finalize is refused from now on */
bool fx__comm_any_failure(void);

#endif
