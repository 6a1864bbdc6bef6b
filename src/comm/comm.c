/* Communicators and collectives over MPI: every op is a non-blocking MPI collective polled
   against a deadline, announced to the peers with a small fingerprint message on a private
   communicator so that a timeout can name who is missing and a divergence is caught. */
#include "comm_internal.h"
#include "pairwise.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static bool fx__we_initialised;

/* An op name for a fingerprint that came over the wire (may be anything). */
static const char *fx__op_name64(int64_t op)
{
    return op >= FX_COMM_ALL_REDUCE && op <= FX_COMM_BARRIER ? fx_comm_op_name((fx_comm_op)op) : "unknown";
}

static void fx__mpi_string(int mpi_rc, char *buf, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpi_rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error %d", mpi_rc);
    snprintf(buf, cap, "%s", s);
}

/* Spin on MPI first (ops often finish within microseconds; each test costs about one), then
   sleep 50 us between tests for a while, then 1 ms once the wait is clearly long, so that a
   long wait leaves the core to other processes. */
static void fx__backoff(int *spins)
{
    int s = (*spins)++;
    if (s < 1000)
        return;
    struct timespec ts = {0, s < 3000 ? 50000 : 1000000};
    nanosleep(&ts, NULL);
}

/* ---- failure ------------------------------------------------------------------------------- */

static void fx__work_finish(fx_comm_work *w, int status)
{
    w->finished = true;
    w->status = status;
    fx__comm_rec_finish(w->c, w);
}

/* Marks the communicator unusable with this message, finishes w (may be NULL) with code,
   dumps the flight recorder, and returns code with fx_last_error() set. */
FX__PRINTF(4, 5)
static int fx__fail(fx_comm *c, fx_comm_work *w, int code, const char *fmt, ...)
{
    if (c->failed == FX_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->fail_msg, sizeof c->fail_msg, fmt, ap);
        va_end(ap);
        c->failed = code;
        fx__comm_note_failure();
        if (w && !w->finished)
            fx__work_finish(w, code);
        fx__comm_dump_auto();
        return fx__error(code, "%s", c->fail_msg);
    }
    if (w && !w->finished)
        fx__work_finish(w, FX_ECOMM);
    return fx__error(FX_ECOMM, "communicator '%s' is unusable after an earlier failure: %s", c->name,
                     c->fail_msg);
}

static int fx__unusable(const fx_comm *c)
{
    return fx__error(FX_ECOMM, "communicator '%s' is unusable after an earlier failure: %s", c->name,
                     c->fail_msg);
}

/* ---- arrival notices ------------------------------------------------------------------------ */

static int fx__slot_of(int64_t seq) { return (int)(seq % FX__NOTICE_SLOTS); }

/* Whether rank p's notice of the op in slot k has arrived (own rank: always). */
static bool fx__arrived(const fx_comm *c, int k, int p)
{
    return c->nrecv[(size_t)k * (size_t)c->size + (size_t)p] == MPI_REQUEST_NULL;
}

/* The ranks whose notice of op seq has not arrived: "rank 1 (last entered seq 4)". Returns
   how many; every rank has arrived when the slot already moved on to a later op. */
static int fx__missing(const fx_comm *c, int64_t seq, char *buf, size_t cap)
{
    int k = fx__slot_of(seq), count = 0;
    size_t used = 0;
    buf[0] = '\0';
    if (c->slots[k].seq != seq)
        return 0;
    for (int p = 0; p < c->size; p++) {
        if (fx__arrived(c, k, p))
            continue;
        count++;
        if (count > 8)
            continue;
        int m;
        if (c->last_seen[p] < 0)
            m = snprintf(buf + used, cap - used, "%srank %d (no op entered yet)", count > 1 ? ", " : "", p);
        else
            m = snprintf(buf + used, cap - used, "%srank %d (last entered seq %lld)", count > 1 ? ", " : "",
                         p, (long long)c->last_seen[p]);
        if (m > 0)
            used = used + (size_t)m < cap ? used + (size_t)m : cap - 1;
    }
    if (count > 8)
        snprintf(buf + used, cap - used, " and %d more", count - 8);
    return count;
}

static void fx__describe_fp(const fx__fingerprint *f, char *buf, size_t cap)
{
    if (f->op == FX_COMM_BROADCAST)
        snprintf(buf, cap, "%s (%lld bytes, root %lld)", fx__op_name64(f->op), (long long)f->bytes,
                 (long long)f->root);
    else
        snprintf(buf, cap, "%s (%lld bytes)", fx__op_name64(f->op), (long long)f->bytes);
}

/* ---- liveness probe ------------------------------------------------------------------------- */

static void fx__probe_send(fx_comm *c, int p, int tag)
{
    int done = 1;
    if (c->probe_send[p] != MPI_REQUEST_NULL && MPI_Test(&c->probe_send[p], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        return;
    if (done)
        MPI_Isend(&c->probe_out, 1, MPI_INT64_T, p, tag, c->ctl, &c->probe_send[p]);
}

/* Answers the peers' probes: every poll loop calls this, so a rank waiting in any op answers. */
static void fx__serve_probes(fx_comm *c)
{
    while (c->probe_recv != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&c->probe_recv, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        fx__probe_send(c, st.MPI_SOURCE, c->tag_mod + 1);
        if (MPI_Irecv(&c->probe_in, 1, MPI_INT64_T, MPI_ANY_SOURCE, c->tag_mod, c->ctl, &c->probe_recv) != MPI_SUCCESS)
            c->probe_recv = MPI_REQUEST_NULL;
    }
}

/* Probes every peer and lists those that do not answer within `wait` seconds: dead, exited,
   or busy outside flexc calls. Used only to explain a failure. Returns how many. */
static int fx__probe_peers(fx_comm *c, double wait, char *buf, size_t cap)
{
    for (int p = 0; p < c->size; p++) {
        c->answer_recv[p] = MPI_REQUEST_NULL;
        if (p == c->rank)
            continue;
        MPI_Irecv(&c->answer_in[p], 1, MPI_INT64_T, p, c->tag_mod + 1, c->ctl, &c->answer_recv[p]);
        fx__probe_send(c, p, c->tag_mod);
    }
    double until = fx__seconds() + wait;
    int spins = 0, flag = 0;
    for (;;) {
        fx__serve_probes(c);
        if (MPI_Testall(c->size, c->answer_recv, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            flag = 0;
        if (flag || fx__seconds() > until)
            break;
        fx__backoff(&spins);
    }
    int count = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int p = 0; p < c->size; p++) {
        if (c->answer_recv[p] == MPI_REQUEST_NULL)
            continue;
        MPI_Cancel(&c->answer_recv[p]);
        MPI_Wait(&c->answer_recv[p], MPI_STATUS_IGNORE);
        if (++count > 8)
            continue;
        int m = snprintf(buf + used, cap - used, "%srank %d", count > 1 ? ", " : "", p);
        if (m > 0)
            used = used + (size_t)m < cap ? used + (size_t)m : cap - 1;
    }
    if (count > 8)
        snprintf(buf + used, cap - used, " and %d more", count - 8);
    return count;
}

/* Collects the notices that have arrived and compares them with this rank's own ops. */
static int fx__notices_poll(fx_comm *c, fx_comm_work *w)
{
    /* Every communicator of this process answers, whichever one it is waiting on. */
    for (fx_comm *o = fx__comm_live(); o; o = o->next_live)
        fx__serve_probes(o);
    if (!c->tracking)
        return FX_OK;
    int total = FX__NOTICE_SLOTS * c->size, outcount = 0;
    int rc = MPI_Testsome(total, c->nrecv, &outcount, c->idx_scratch, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        fx__mpi_string(rc, s, sizeof s);
        return fx__fail(c, w, FX_ECOMM, "arrival notices on communicator '%s' failed: %s", c->name, s);
    }
    if (outcount == MPI_UNDEFINED)
        return FX_OK;
    int bad = -1;
    for (int i = 0; i < outcount; i++) {
        int idx = c->idx_scratch[i], k = idx / c->size, p = idx % c->size;
        const fx__fingerprint *f = &c->nbuf[idx], *mine = &c->slots[k].mine;
        if (f->seq > c->last_seen[p])
            c->last_seen[p] = f->seq;
        if (bad < 0 && (f->seq != mine->seq || f->op != mine->op || f->bytes != mine->bytes ||
                        f->root != mine->root))
            bad = idx;
    }
    if (bad >= 0) {
        int k = bad / c->size, p = bad % c->size;
        char a[96], b[96], other_seq[48] = "";
        fx__describe_fp(&c->slots[k].mine, a, sizeof a);
        fx__describe_fp(&c->nbuf[bad], b, sizeof b);
        if (c->nbuf[bad].seq != c->slots[k].seq)
            snprintf(other_seq, sizeof other_seq, " as its seq %lld", (long long)c->nbuf[bad].seq);
        return fx__fail(c, w, FX_ECOMM,
                        "collective mismatch on communicator '%s' at seq %lld: rank %d called %s but rank %d "
                        "called %s%s",
                        c->name, (long long)c->slots[k].seq, c->rank, a, p, b, other_seq);
    }
    return FX_OK;
}

/* Frees slot k for op seq: its notices must have arrived and its sends completed. */
static int fx__slot_reclaim(fx_comm *c, int k, double deadline, const char *why)
{
    int spins = 0;
    fx__slot *s = &c->slots[k];
    if (s->seq < 0)
        return FX_OK;
    for (;;) {
        int rc = fx__notices_poll(c, NULL);
        if (rc != FX_OK)
            return rc;
        bool all = true;
        for (int p = 0; p < c->size; p++)
            all = all && fx__arrived(c, k, p);
        int sent = 0;
        rc = MPI_Testall(c->size, c->nsend + (size_t)k * (size_t)c->size, &sent, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) {
            char m[MPI_MAX_ERROR_STRING];
            fx__mpi_string(rc, m, sizeof m);
            return fx__fail(c, NULL, FX_ECOMM, "arrival notices on communicator '%s' failed: %s", c->name, m);
        }
        if (all && sent) {
            s->seq = -1;
            return FX_OK;
        }
        if (fx__seconds() > deadline) {
            char miss[400];
            if (fx__missing(c, s->seq, miss, sizeof miss) == 0)
                snprintf(miss, sizeof miss, "the notices to the peers were not delivered");
            return fx__fail(c, NULL, FX_ETIMEDOUT, "%s on communicator '%s' timed out waiting for seq %lld %s: "
                            "not arrived: %s", why, c->name, (long long)s->seq,
                            fx__op_name64(s->mine.op), miss);
        }
        fx__backoff(&spins);
    }
}

/* ---- works ---------------------------------------------------------------------------------- */

static void fx__unlink(fx_comm *c, fx_comm_work *w)
{
    for (fx_comm_work **pp = &c->inflight; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    w->next = NULL;
}

static void fx__release(fx_comm_work *w)
{
    fx_comm *c = w->c;
    fx__unlink(c, w);
    w->next = c->free_works;
    c->free_works = w;
}

/* The ranks whose notices must be in before op w counts as done: completing an all_reduce,
   all_gather, reduce_scatter or barrier means every rank entered it; a broadcast receiver
   knows only that the root did, and the root knows nothing. */
static bool fx__confirmed(const fx_comm *c, const fx_comm_work *w)
{
    if (!c->tracking)
        return true;
    int k = fx__slot_of(w->seq);
    if (c->slots[k].seq != w->seq)
        return true;
    if (w->op == FX_COMM_BROADCAST)
        return w->root == c->rank || fx__arrived(c, k, w->root);
    for (int p = 0; p < c->size; p++)
        if (!fx__arrived(c, k, p))
            return false;
    return true;
}

static int fx__timeout(fx_comm *c, fx_comm_work *w)
{
    char miss[400], quiet[200];
    double took = fx__seconds() - w->t0;
    const char *op = fx_comm_op_name(w->op);
    long long seq = (long long)w->seq, bytes = (long long)w->bytes;
    if (c->tracking && fx__missing(c, w->seq, miss, sizeof miss) > 0)
        return fx__fail(c, w, FX_ETIMEDOUT, "%s seq %lld on communicator '%s' (%lld bytes) timed out after %.3g s; "
                        "not arrived: %s", op, seq, c->name, bytes, took, miss);
    /* Everyone entered (or nobody tracks it): ask who is still alive. */
    const char *tracked = c->tracking ? "every rank arrived" : "arrivals are not tracked on this communicator";
    if (fx__probe_peers(c, fmin(1.0, c->timeout), quiet, sizeof quiet) > 0)
        return fx__fail(c, w, FX_ETIMEDOUT, "%s seq %lld on communicator '%s' (%lld bytes) timed out after %.3g s; "
                        "%s, but no answer from: %s (dead, exited, or busy outside communication calls)",
                        op, seq, c->name, bytes, took, tracked, quiet);
    return fx__fail(c, w, FX_ETIMEDOUT, "%s seq %lld on communicator '%s' (%lld bytes) timed out after %.3g s; "
                    "%s and every rank answers, but the collective did not complete (the network stalls?)",
                    op, seq, c->name, bytes, took, tracked);
}

/* An MPI error in w's collective: wait briefly for the peers' notices, since a mismatch
   explains the error better than MPI's message does. */
static int fx__data_error(fx_comm *c, fx_comm_work *w, int mpi_rc)
{
    double until = fmin(w->deadline, fx__seconds() + 0.5);
    int spins = 0;
    while (c->tracking && !fx__confirmed(c, w) && fx__seconds() < until) {
        int rc = fx__notices_poll(c, w);
        if (rc != FX_OK)
            return rc;
        fx__backoff(&spins);
    }
    char s[MPI_MAX_ERROR_STRING];
    fx__mpi_string(mpi_rc, s, sizeof s);
    return fx__fail(c, w, FX_ECOMM, "%s seq %lld on communicator '%s' failed: %s", fx_comm_op_name(w->op),
                    (long long)w->seq, c->name, s);
}

/* Advances w once. Returns its final status with *done = true, or FX_OK with *done = false. */
static int fx__work_step(fx_comm_work *w, double deadline, bool *done)
{
    fx_comm *c = w->c;
    *done = false;
    if (w->finished) {
        *done = true;
        if (w->status != FX_OK)
            return fx__error(w->status, "%s", c->fail_msg);
        return FX_OK;
    }
    fx__comm_serve_signal();
    if (c->failed != FX_OK) {
        *done = true;
        return fx__fail(c, w, FX_ECOMM, "unused");
    }
    if (!w->data_done) {
        int flag = 0;
        int rc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            *done = true;
            return fx__data_error(c, w, rc);
        }
        if (flag) {
            if (w->det)
                fx__pairwise_sum_rows(w->out, w->rows, w->n, c->size);
            w->data_done = true;
        }
    }
    int rc = fx__notices_poll(c, w);
    if (rc != FX_OK) {
        *done = true;
        return rc;
    }
    if (w->data_done && fx__confirmed(c, w)) {
        fx__work_finish(w, FX_OK);
        *done = true;
        return FX_OK;
    }
    if (fx__seconds() > deadline) {
        *done = true;
        return fx__timeout(c, w);
    }
    return FX_OK;
}

static int fx__work_wait(fx_comm_work *w, double deadline)
{
    int spins = 0;
    for (;;) {
        bool done;
        int rc = fx__work_step(w, deadline, &done);
        if (done)
            return rc;
        fx__backoff(&spins);
    }
}

/* Finishes what the caller let go of (fx_comm_work_free while in flight). */
static int fx__progress_detached(fx_comm *c)
{
    fx_comm_work *w = c->inflight;
    while (w) {
        fx_comm_work *next = w->next;
        if (w->detached) {
            bool done;
            int rc = fx__work_step(w, w->deadline, &done);
            if (done)
                fx__release(w);
            if (rc != FX_OK)
                return rc;
        }
        w = next;
    }
    return FX_OK;
}

/* Everything before the MPI call: a sequence number, the notices, the recorder entry. */
static int fx__begin(fx_comm *c, fx_comm_op op, int64_t n, int root, size_t scratch_floats, fx_comm_work **out)
{
    if (c->failed != FX_OK)
        return fx__unusable(c);
    fx__comm_serve_signal();
    int rc = fx__progress_detached(c);
    if (rc != FX_OK)
        return rc;
    int64_t seq = c->next_seq;
    int k = fx__slot_of(seq);
    char why[64];
    snprintf(why, sizeof why, "%s seq %lld", fx_comm_op_name(op), (long long)seq);
    rc = fx__slot_reclaim(c, k, fx__seconds() + c->timeout, why);
    if (rc != FX_OK)
        return rc;

    fx_comm_work *w = c->free_works;
    if (w) {
        c->free_works = w->next;
    } else {
        w = fx__calloc(1, sizeof *w);
        if (!w)
            return FX_ENOMEM;
    }
    if (scratch_floats > w->scratch_cap) {
        float *s = fx__alloc(scratch_floats * sizeof(float));
        if (!s) {
            w->next = c->free_works;
            c->free_works = w;
            return FX_ENOMEM;
        }
        fx__free(w->scratch);
        w->scratch = s;
        w->scratch_cap = scratch_floats;
    }
    w->c = c;
    w->seq = seq;
    w->op = op;
    w->n = n;
    w->root = root;
    w->det = false;
    w->out = NULL;
    w->req = MPI_REQUEST_NULL;
    w->t0 = fx__seconds();
    w->t0_wall = fx__wall_seconds();
    w->deadline = w->t0 + c->timeout;
    w->data_done = w->finished = w->detached = false;
    w->status = FX_OK;
    w->next = NULL;
    c->next_seq++;
    int64_t bytes = op == FX_COMM_BROADCAST ? n : op == FX_COMM_BARRIER ? 0 : n * 4;
    if (op == FX_COMM_REDUCE_SCATTER)
        bytes *= c->size;
    w->bytes = bytes;
    fx__comm_rec_start(c, w);
    /* Append: the in-flight list stays oldest first. */
    fx_comm_work **tail = &c->inflight;
    while (*tail)
        tail = &(*tail)->next;
    *tail = w;

    if (c->tracking) {
        fx__slot *s = &c->slots[k];
        s->seq = seq;
        s->mine = (fx__fingerprint){seq, op, bytes, op == FX_COMM_BROADCAST ? root : -1};
        int tag = (int)(seq % c->tag_mod);
        size_t base = (size_t)k * (size_t)c->size;
        for (int p = 0; p < c->size; p++) {
            if (p == c->rank)
                continue;
            int r1 = MPI_Irecv(&c->nbuf[base + (size_t)p], 4, MPI_INT64_T, p, tag, c->ctl, &c->nrecv[base + (size_t)p]);
            int r2 = MPI_Isend(&s->mine, 4, MPI_INT64_T, p, tag, c->ctl, &c->nsend[base + (size_t)p]);
            if (r1 != MPI_SUCCESS || r2 != MPI_SUCCESS) {
                char m[MPI_MAX_ERROR_STRING];
                fx__mpi_string(r1 != MPI_SUCCESS ? r1 : r2, m, sizeof m);
                rc = fx__fail(c, w, FX_ECOMM, "%s seq %lld on communicator '%s': arrival notice to rank %d failed: %s",
                              fx_comm_op_name(op), (long long)seq, c->name, p, m);
                fx__release(w);
                return rc;
            }
        }
    }
    *out = w;
    return FX_OK;
}

/* After the MPI call: hand the work out, or wait for it. */
static int fx__posted(fx_comm *c, fx_comm_work *w, int mpi_rc, fx_comm_work **work)
{
    if (mpi_rc != MPI_SUCCESS) {
        char m[MPI_MAX_ERROR_STRING];
        fx__mpi_string(mpi_rc, m, sizeof m);
        int rc = fx__fail(c, w, FX_ECOMM, "%s seq %lld on communicator '%s' could not start: %s",
                          fx_comm_op_name(w->op), (long long)w->seq, c->name, m);
        fx__release(w);
        return rc;
    }
    if (work) {
        *work = w;
        return FX_OK;
    }
    int rc = fx__work_wait(w, w->deadline);
    fx__release(w);
    return rc;
}

/* ---- argument checks ------------------------------------------------------------------------ */

/* The checks every collective starts with: a communicator, a count MPI can take, and the
   named buffers present when the count is not 0 (b_name NULL: one buffer). */
static int fx__check_call(const fx_comm *c, const char *count_name, int64_t n, const void *a, const char *a_name,
                          const void *b, const char *b_name)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    if (n < 0 || n > INT_MAX)
        return fx__error(FX_EINVAL, "%s = %lld is outside [0, %d] (the MPI count limit)", count_name, (long long)n,
                         INT_MAX);
    if (n > 0 && (!a || (b_name && !b)))
        return fx__error(FX_EINVAL, "%s is NULL with %s = %lld", !a ? a_name : b_name, count_name, (long long)n);
    return FX_OK;
}

static bool fx__overlap(const void *a, size_t abytes, const void *b, size_t bbytes)
{
    const char *pa = a, *pb = b;
    return abytes && bbytes && pa < pb + bbytes && pb < pa + abytes;
}

/* ---- collectives ---------------------------------------------------------------------------- */

int fx_comm_all_reduce(fx_comm *c, float *buf, int64_t n, fx_comm_work **work)
{
    int rc = fx__check_call(c, "n", n, buf, "buf", NULL, NULL);
    if (rc != FX_OK)
        return rc;
    bool det = c->deterministic && c->size > 1;
    fx_comm_work *w;
    rc = fx__begin(c, FX_COMM_ALL_REDUCE, n, -1, det ? (size_t)n * (size_t)c->size : 0, &w);
    if (rc != FX_OK)
        return rc;
    int mrc;
    if (det) {
        w->det = true;
        w->out = buf;
        w->rows = w->scratch;
        mrc = MPI_Iallgather(buf, (int)n, MPI_FLOAT, w->scratch, (int)n, MPI_FLOAT, c->comm, &w->req);
    } else {
        mrc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->comm, &w->req);
    }
    return fx__posted(c, w, mrc, work);
}

int fx_comm_all_gather_single(fx_comm *c, float *out, const float *in, int64_t n, fx_comm_work **work)
{
    int rc = fx__check_call(c, "n", n, out, "out", in, "in");
    if (rc != FX_OK)
        return rc;
    size_t nb = (size_t)n * sizeof(float);
    bool in_place = n > 0 && in == out + (int64_t)c->rank * n;
    if (!in_place && fx__overlap(in, nb, out, nb * (size_t)c->size))
        return fx__error(FX_EINVAL, "in overlaps out but is not out + rank * n (rank %d, n = %lld)", c->rank,
                         (long long)n);
    fx_comm_work *w;
    rc = fx__begin(c, FX_COMM_ALL_GATHER, n, -1, 0, &w);
    if (rc != FX_OK)
        return rc;
    int mrc = MPI_Iallgather(in_place ? MPI_IN_PLACE : in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c->comm,
                             &w->req);
    return fx__posted(c, w, mrc, work);
}

int fx_comm_reduce_scatter_single(fx_comm *c, float *out, const float *in, int64_t n, fx_comm_work **work)
{
    int rc = fx__check_call(c, "n", n, out, "out", in, "in");
    if (rc != FX_OK)
        return rc;
    size_t nb = (size_t)n * sizeof(float);
    bool in_place = n > 0 && out == in;
    if (!in_place && fx__overlap(out, nb, in, nb * (size_t)c->size))
        return fx__error(FX_EINVAL, "out overlaps in but is not in (n = %lld)", (long long)n);
    /* All-to-all plus a local sum: rank r receives block r of every rank, then adds them in
       the fixed tree order. Deterministic mode needs the order; in place it is also the
       cheaper algorithm (one exchange round, every rank receiving (N-1)/N of the buffer,
       no temporary buffers of the full size inside MPI; Open MPI's non-blocking
       reduce-scatter reduces at one root and scatters from it). */
    bool det = c->deterministic && c->size > 1, a2a = det || (in_place && c->size > 1);
    fx_comm_work *w;
    rc = fx__begin(c, FX_COMM_REDUCE_SCATTER, n, -1, det && !in_place ? (size_t)n * (size_t)c->size : 0, &w);
    if (rc != FX_OK)
        return rc;
    int mrc;
    if (a2a && in_place) {
        w->det = true;
        w->out = out;
        w->rows = out; /* the blocks arrive in place of the ones sent */
        mrc = MPI_Ialltoall(MPI_IN_PLACE, 0, MPI_FLOAT, out, (int)n, MPI_FLOAT, c->comm, &w->req);
    } else if (a2a) {
        w->det = true;
        w->out = out;
        w->rows = w->scratch;
        mrc = MPI_Ialltoall(in, (int)n, MPI_FLOAT, w->scratch, (int)n, MPI_FLOAT, c->comm, &w->req);
    } else {
        mrc = MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : in, out, (int)n, MPI_FLOAT, MPI_SUM, c->comm,
                                        &w->req);
    }
    return fx__posted(c, w, mrc, work);
}

int fx_comm_broadcast(fx_comm *c, void *buf, int64_t bytes, int root, fx_comm_work **work)
{
    int rc = fx__check_call(c, "bytes", bytes, buf, "buf", NULL, NULL);
    if (rc != FX_OK)
        return rc;
    if (root < 0 || root >= c->size)
        return fx__error(FX_EINVAL, "root = %d is outside [0, %d)", root, c->size);
    fx_comm_work *w;
    rc = fx__begin(c, FX_COMM_BROADCAST, bytes, root, 0, &w);
    if (rc != FX_OK)
        return rc;
    int mrc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, c->comm, &w->req);
    return fx__posted(c, w, mrc, work);
}

int fx_comm_barrier(fx_comm *c, fx_comm_work **work)
{
    int rc = fx__check_call(c, "n", 0, NULL, NULL, NULL, NULL);
    if (rc != FX_OK)
        return rc;
    fx_comm_work *w;
    rc = fx__begin(c, FX_COMM_BARRIER, 0, -1, 0, &w);
    if (rc != FX_OK)
        return rc;
    return fx__posted(c, w, MPI_Ibarrier(c->comm, &w->req), work);
}

/* ---- works ---------------------------------------------------------------------------------- */

int fx_comm_work_wait(fx_comm_work *w, double timeout)
{
    if (!w)
        return fx__error(FX_EINVAL, "work is NULL");
    if (!(timeout > 0.0) && !(timeout < 0.0))
        return fx__error(FX_EINVAL, "timeout = %g must be > 0, or < 0 for the op's deadline", timeout);
    double deadline = w->deadline;
    if (timeout > 0.0)
        deadline = fmin(deadline, fx__seconds() + timeout);
    return fx__work_wait(w, deadline);
}

int fx_comm_work_test(fx_comm_work *w, bool *done)
{
    if (!w || !done)
        return fx__error(FX_EINVAL, "%s is NULL", !w ? "work" : "done");
    return fx__work_step(w, w->deadline, done);
}

int64_t fx_comm_work_seq(const fx_comm_work *w) { return w ? w->seq : -1; }

void fx_comm_work_free(fx_comm_work *w)
{
    if (!w)
        return;
    if (w->finished)
        fx__release(w);
    else
        w->detached = true;
}

/* ---- communicators -------------------------------------------------------------------------- */

static int fx__wait_request(MPI_Request *req, double deadline, const char *what, double timeout)
{
    int spins = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            char m[MPI_MAX_ERROR_STRING];
            fx__mpi_string(rc, m, sizeof m);
            return fx__error(FX_ECOMM, "%s failed: %s", what, m);
        }
        if (flag)
            return FX_OK;
        if (fx__seconds() > deadline) {
            fx__comm_note_failure();
            return fx__error(FX_ETIMEDOUT, "%s did not complete within %.3g s: a rank did not take part", what,
                             timeout);
        }
        fx__backoff(&spins);
    }
}

static void fx__comm_release(fx_comm *c)
{
    while (c->free_works) {
        fx_comm_work *w = c->free_works;
        c->free_works = w->next;
        fx__free(w->scratch);
        fx__free(w);
    }
    fx__free(c->nrecv);
    fx__free(c->nsend);
    fx__free(c->nbuf);
    fx__free(c->last_seen);
    fx__free(c->idx_scratch);
    fx__free(c->rec);
    fx__free(c->probe_send);
    fx__free(c->answer_recv);
    fx__free(c->answer_in);
    fx__free(c);
}

/* A communicator over parent's processes: two duplicates (collectives, notices). */
static int fx__create(fx_comm **out, MPI_Comm parent, const char *name, double timeout, bool det, bool tracking)
{
    fx_comm *c = fx__calloc(1, sizeof *c);
    if (!c)
        return FX_ENOMEM;
    snprintf(c->name, sizeof c->name, "%s", name);
    c->timeout = timeout;
    c->deterministic = det;
    c->tracking = tracking;
    c->comm = c->ctl = MPI_COMM_NULL;
    char what[96];
    snprintf(what, sizeof what, "creating communicator '%s'", c->name);
    double deadline = fx__seconds() + timeout;
    MPI_Request req;
    int rc = MPI_Comm_idup(parent, &c->comm, &req);
    if (rc == MPI_SUCCESS) {
        rc = fx__wait_request(&req, deadline, what, timeout);
    } else {
        char m[MPI_MAX_ERROR_STRING];
        fx__mpi_string(rc, m, sizeof m);
        rc = fx__error(FX_ECOMM, "%s failed: %s", what, m);
    }
    if (rc == FX_OK) {
        MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
        int mrc = MPI_Comm_idup(c->comm, &c->ctl, &req);
        if (mrc == MPI_SUCCESS) {
            rc = fx__wait_request(&req, deadline, what, timeout);
        } else {
            char m[MPI_MAX_ERROR_STRING];
            fx__mpi_string(mrc, m, sizeof m);
            rc = fx__error(FX_ECOMM, "%s failed: %s", what, m);
        }
    }
    if (rc != FX_OK) {
        /* A dup that timed out may still be in flight: leave its MPI objects to process exit. */
        fx__comm_release(c);
        return rc;
    }
    MPI_Comm_set_errhandler(c->ctl, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    int *tag_ub = NULL, flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
    int ub = flag && tag_ub && *tag_ub >= 32767 ? *tag_ub : 32767; /* MPI guarantees 32767 */
    c->tag_mod = ub - 1 < (1 << 30) ? ub - 1 : (1 << 30);

    size_t slots = (size_t)FX__NOTICE_SLOTS * (size_t)c->size;
    c->nrecv = fx__alloc(slots * sizeof *c->nrecv);
    c->nsend = fx__alloc(slots * sizeof *c->nsend);
    c->nbuf = fx__calloc(slots, sizeof *c->nbuf);
    c->last_seen = fx__alloc((size_t)c->size * sizeof *c->last_seen);
    c->idx_scratch = fx__alloc(slots * sizeof *c->idx_scratch);
    c->rec_cap = fx__comm_recorder_size();
    c->rec = fx__alloc((size_t)c->rec_cap * sizeof *c->rec);
    c->probe_send = fx__alloc((size_t)c->size * sizeof *c->probe_send);
    c->answer_recv = fx__alloc((size_t)c->size * sizeof *c->answer_recv);
    c->answer_in = fx__alloc((size_t)c->size * sizeof *c->answer_in);
    if (!c->nrecv || !c->nsend || !c->nbuf || !c->last_seen || !c->idx_scratch || !c->rec || !c->probe_send ||
        !c->answer_recv || !c->answer_in) {
        MPI_Comm_free(&c->ctl);
        MPI_Comm_free(&c->comm);
        fx__comm_release(c);
        return FX_ENOMEM;
    }
    for (size_t i = 0; i < slots; i++)
        c->nrecv[i] = c->nsend[i] = MPI_REQUEST_NULL;
    for (int p = 0; p < c->size; p++) {
        c->last_seen[p] = -1;
        c->probe_send[p] = c->answer_recv[p] = MPI_REQUEST_NULL;
    }
    if (MPI_Irecv(&c->probe_in, 1, MPI_INT64_T, MPI_ANY_SOURCE, c->tag_mod, c->ctl, &c->probe_recv) != MPI_SUCCESS)
        c->probe_recv = MPI_REQUEST_NULL;
    for (int k = 0; k < FX__NOTICE_SLOTS; k++)
        c->slots[k].seq = -1;
    for (int64_t i = 0; i < c->rec_cap; i++)
        c->rec[i].seq = -1;
    fx__comm_register(c);
    *out = c;
    return FX_OK;
}

int fx_comm_init(fx_comm **out, int *argc, char ***argv)
{
    if (!out)
        return fx__error(FX_EINVAL, "out is NULL");
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return fx__error(FX_EINVAL, "MPI was already finalised in this process");
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS)
            return fx__error(FX_ECOMM, "MPI_Init_thread failed (error %d)", rc);
        fx__we_initialised = true;
        /* MPI owned by us: its errors come back as codes, never as an abort. */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    return fx__create(out, MPI_COMM_WORLD, "world", FX_COMM_DEFAULT_TIMEOUT, false, true);
}

int fx_comm_dup(fx_comm **out, fx_comm *parent, const char *name)
{
    if (!out || !parent)
        return fx__error(FX_EINVAL, "%s is NULL", !out ? "out" : "parent");
    if (parent->failed != FX_OK)
        return fx__unusable(parent);
    char auto_name[FX__NAME_CAP];
    if (name) {
        /* Names go into JSON and messages unescaped. */
        size_t len = strlen(name);
        if (len >= FX__NAME_CAP)
            return fx__error(FX_EINVAL, "name \"%.40s\" is longer than %d characters", name, FX__NAME_CAP - 1);
        for (size_t i = 0; i < len; i++) {
            char ch = name[i];
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                  ch == '-' || ch == '.'))
                return fx__error(FX_EINVAL, "name \"%s\": character %zu is not a letter, digit, '_', '-' or '.'",
                                 name, i);
        }
    }
    if (!name || !name[0]) {
        snprintf(auto_name, sizeof auto_name, "%.16s.dup", parent->name);
        name = auto_name;
    }
    return fx__create(out, parent->comm, name, parent->timeout, parent->deterministic, parent->tracking);
}

void fx_comm_free(fx_comm *c)
{
    if (!c)
        return;
    /* Finish what is in flight, then collect the peers' outstanding notices, all within the
       deadlines. */
    while (c->failed == FX_OK && c->inflight) {
        fx_comm_work *w = c->inflight;
        fx__work_wait(w, w->deadline);
        fx__release(w);
    }
    if (c->failed == FX_OK && c->tracking) {
        double deadline = fx__seconds() + c->timeout;
        for (int k = 0; k < FX__NOTICE_SLOTS && c->failed == FX_OK; k++)
            fx__slot_reclaim(c, k, deadline, "freeing");
    }
    fx__comm_unregister(c);
    /* Withdraw the receives still posted (a cancelled receive completes locally), and give
       the small sends a moment to leave. */
    size_t slots = (size_t)FX__NOTICE_SLOTS * (size_t)c->size;
    for (size_t i = 0; i < slots; i++) {
        if (c->nrecv[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&c->nrecv[i]);
            MPI_Wait(&c->nrecv[i], MPI_STATUS_IGNORE);
        }
    }
    if (c->probe_recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&c->probe_recv);
        MPI_Wait(&c->probe_recv, MPI_STATUS_IGNORE);
    }
    int sent = 0, probes_sent = 0, spins = 0;
    double until = fx__seconds() + 1.0;
    for (;;) {
        if (MPI_Testall((int)slots, c->nsend, &sent, MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
            MPI_Testall(c->size, c->probe_send, &probes_sent, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            sent = probes_sent = 0;
        if ((sent && probes_sent) || fx__seconds() > until)
            break;
        fx__backoff(&spins);
    }
    if (c->failed == FX_OK) {
        MPI_Comm_free(&c->ctl);
        MPI_Comm_free(&c->comm);
    }
    /* After a failure the MPI communicators are left to process exit, and so is whatever MPI
       may still touch: the scratch of a collective that never completed, and the whole
       communicator if a small send from it is still pending. */
    while (c->inflight) {
        fx_comm_work *w = c->inflight;
        c->inflight = w->next;
        int flag = 0;
        if (w->req != MPI_REQUEST_NULL && (MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag))
            w->scratch = NULL;
        fx__free(w->scratch);
        fx__free(w);
    }
    if (sent && probes_sent)
        fx__comm_release(c);
}

int fx_comm_finalize(void)
{
    if (fx__comm_any_failure())
        return fx__error(FX_ECOMM, "not finalising MPI after a communication failure (it could hang on the lost "
                         "peer): exit the process instead");
    if (!fx__we_initialised)
        return FX_OK;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return FX_OK;
    int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS)
        return fx__error(FX_ECOMM, "MPI_Finalize failed (error %d)", rc);
    return FX_OK;
}

int fx_comm_rank(const fx_comm *c) { return c ? c->rank : -1; }
int fx_comm_size(const fx_comm *c) { return c ? c->size : 0; }
const char *fx_comm_name(const fx_comm *c) { return c ? c->name : ""; }
void *fx_comm_mpi_handle(fx_comm *c) { return c ? (void *)&c->comm : NULL; }
int fx_comm_status(const fx_comm *c) { return c ? c->failed : FX_EINVAL; }

int fx_comm_set_timeout(fx_comm *c, double seconds)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    if (!(seconds > 0.0) || !isfinite(seconds))
        return fx__error(FX_EINVAL, "timeout = %g s must be > 0 and finite", seconds);
    c->timeout = seconds;
    return FX_OK;
}

double fx_comm_timeout(const fx_comm *c) { return c ? c->timeout : 0.0; }

int fx_comm_set_deterministic(fx_comm *c, bool on)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    c->deterministic = on;
    return FX_OK;
}

int fx_comm_set_tracking(fx_comm *c, bool on)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    if (c->inflight)
        return fx__error(FX_EINVAL, "tracking cannot change with operations in flight on communicator '%s'",
                         c->name);
    if (!on && c->tracking && c->failed == FX_OK) {
        /* The notices already on their way must be collected before the slots are forgotten. */
        double deadline = fx__seconds() + c->timeout;
        for (int k = 0; k < FX__NOTICE_SLOTS; k++) {
            int rc = fx__slot_reclaim(c, k, deadline, "turning tracking off");
            if (rc != FX_OK)
                return rc;
        }
    }
    c->tracking = on;
    return FX_OK;
}

int fx_comm_check(fx_comm *c)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    if (c->failed != FX_OK)
        return fx__unusable(c);
    int rc = fx__progress_detached(c);
    if (rc != FX_OK || !c->tracking)
        return rc;
    double deadline = fx__seconds() + c->timeout;
    for (int k = 0; k < FX__NOTICE_SLOTS; k++) {
        /* A slot of an op still in flight keeps its notices until the op completes. */
        bool busy = false;
        for (fx_comm_work *w = c->inflight; w; w = w->next)
            busy = busy || fx__slot_of(w->seq) == k;
        if (busy)
            continue;
        rc = fx__slot_reclaim(c, k, deadline, "fingerprint check");
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

int fx_comm_progress(fx_comm *c)
{
    if (!c)
        return fx__error(FX_EINVAL, "communicator is NULL");
    fx__comm_serve_signal();
    if (c->failed != FX_OK)
        return fx__unusable(c);
    for (fx_comm_work *w = c->inflight; w; w = w->next) {
        if (!w->data_done && !w->finished) {
            int flag = 0;
            /* Testing drives MPI's progress engine; completion is recorded by test/wait. */
            int mrc = MPI_Test(&w->req, &flag, MPI_STATUS_IGNORE);
            if (mrc != MPI_SUCCESS)
                return fx__data_error(c, w, mrc);
            if (flag) {
                if (w->det)
                    fx__pairwise_sum_rows(w->out, w->rows, w->n, c->size);
                w->data_done = true;
            }
        }
    }
    int rc = fx__notices_poll(c, NULL);
    if (rc != FX_OK)
        return rc;
    return fx__progress_detached(c);
}
