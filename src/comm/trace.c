/* Observability of the collectives: the per-communicator flight recorder, the JSON-lines
   log, dumps (on failure, on request, on SIGUSR1) and the registry of live communicators. */
#include "comm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Process-wide state. Calls are serialised (MPI_THREAD_SERIALIZED), but the lock keeps the
   registry sound should two threads create communicators. */
static atomic_int fx__lock;
static fx_comm *fx__live;
static int fx__log_fd = -1;
static int fx__dump_fd = -1;
static int64_t fx__rec_size = 256;
static atomic_bool fx__failure_seen;
static volatile sig_atomic_t fx__dump_requested;

static void fx__lock_take(void)
{
    while (atomic_exchange(&fx__lock, 1)) {
    }
}
static void fx__lock_drop(void) { atomic_store(&fx__lock, 0); }

void fx__comm_register(fx_comm *c)
{
    fx__lock_take();
    c->next_live = fx__live;
    fx__live = c;
    fx__lock_drop();
}

fx_comm *fx__comm_live(void) { return fx__live; }

void fx__comm_unregister(fx_comm *c)
{
    fx__lock_take();
    for (fx_comm **pp = &fx__live; *pp; pp = &(*pp)->next_live) {
        if (*pp == c) {
            *pp = c->next_live;
            break;
        }
    }
    fx__lock_drop();
}

int64_t fx__comm_recorder_size(void) { return fx__rec_size; }

int fx_comm_set_recorder_size(int64_t n)
{
    if (n < 1 || n > (1 << 24))
        return fx__error(FX_EINVAL, "recorder size = %lld is outside [1, %d]", (long long)n, 1 << 24);
    fx__rec_size = n;
    return FX_OK;
}

void fx__comm_note_failure(void) { atomic_store(&fx__failure_seen, true); }
bool fx__comm_any_failure(void) { return atomic_load(&fx__failure_seen); }

/* ---- records ------------------------------------------------------------------------------- */

void fx__comm_rec_start(fx_comm *c, const fx_comm_work *w)
{
    fx__rec *r = &c->rec[w->seq % c->rec_cap];
    *r = (fx__rec){.seq = w->seq, .op = w->op, .bytes = w->bytes, .root = w->op == FX_COMM_BROADCAST ? w->root : -1,
                   .start_wall = w->t0_wall, .duration = 0.0, .status = FX_OK, .state = FX__REC_PENDING};
}

static const char *fx__state_name(fx__rec_state s)
{
    return s == FX__REC_DONE ? "done" : s == FX__REC_FAILED ? "failed" : "pending";
}

/* One JSON object, no newline. The name is ours (no quotes or backslashes can reach it
   unescaped: fx_comm_dup filters them). */
static int fx__rec_json(char *buf, size_t cap, const fx_comm *c, const fx__rec *r, double now_wall)
{
    double dur = r->state == FX__REC_PENDING ? now_wall - r->start_wall : r->duration;
    return snprintf(buf, cap,
                    "{\"rank\":%d,\"comm\":\"%s\",\"seq\":%lld,\"op\":\"%s\",\"bytes\":%lld,\"root\":%d,"
                    "\"start\":%.6f,\"duration\":%.6f,\"status\":\"%s\",\"state\":\"%s\"}",
                    c->rank, c->name, (long long)r->seq, fx_comm_op_name(r->op), (long long)r->bytes, r->root,
                    r->start_wall, dur, fx_status_name(r->status), fx__state_name(r->state));
}

/* 0, or the errno of the write that failed (EIO for a write of nothing). */
static int fx__write_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t m = write(fd, s, n);
        if (m < 0 && errno == EINTR)
            continue;
        if (m <= 0)
            return m < 0 ? errno : EIO;
        s += m;
        n -= (size_t)m;
    }
    return 0;
}

void fx__comm_rec_finish(fx_comm *c, const fx_comm_work *w)
{
    fx__rec *r = &c->rec[w->seq % c->rec_cap];
    if (r->seq != w->seq)
        return;
    r->duration = fx__seconds() - w->t0;
    r->status = w->status;
    r->state = w->status == FX_OK ? FX__REC_DONE : FX__REC_FAILED;
    if (fx__log_fd >= 0) {
        char line[512];
        int n = fx__rec_json(line, sizeof line - 1, c, r, 0.0);
        if (n > 0 && (size_t)n < sizeof line - 1) {
            line[n++] = '\n';
            (void)fx__write_all(fx__log_fd, line, (size_t)n); /* a lost log line does not fail the collective */
        }
    }
}

/* ---- the log ------------------------------------------------------------------------------ */

int fx_comm_log_open(const char *path)
{
    if (!path) {
        fx_comm_log_close();
        return FX_OK;
    }
    int rank = 0, inited = 0;
    MPI_Initialized(&inited);
    if (inited)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char full[4096];
    const char *hole = strstr(path, "{rank}");
    int n = hole ? snprintf(full, sizeof full, "%.*s%d%s", (int)(hole - path), path, rank, hole + 6)
                 : snprintf(full, sizeof full, "%s", path);
    if (n < 0 || (size_t)n >= sizeof full)
        return fx__error(FX_EINVAL, "log path is longer than %zu bytes", sizeof full - 1);
    int fd = open(full, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return fx__error(FX_EIO, "%s: cannot open the communication log: %s", full, strerror(errno));
    fx_comm_log_close();
    fx__log_fd = fd;
    return FX_OK;
}

void fx_comm_log_close(void)
{
    if (fx__log_fd >= 0)
        close(fx__log_fd);
    fx__log_fd = -1;
}

/* ---- dumps -------------------------------------------------------------------------------- */

void fx_comm_set_dump_fd(int fd) { fx__dump_fd = fd < 0 ? -1 : fd; }

/* Stops at the first failed write and returns its errno (0: all written). */
static int fx__dump_one(int fd, const fx_comm *c, double now_wall)
{
    char line[1024];
    int err = 0;
    int n = snprintf(line, sizeof line,
                     "{\"flight_recorder\":\"%s\",\"rank\":%d,\"size\":%d,\"next_seq\":%lld,\"timeout\":%.3f,"
                     "\"status\":\"%s\"}\n",
                     c->name, c->rank, c->size, (long long)c->next_seq, c->timeout, fx_status_name(c->failed));
    if (n > 0)
        err = fx__write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    int64_t first = c->next_seq - c->rec_cap;
    for (int64_t s = first < 0 ? 0 : first; s < c->next_seq && !err; s++) {
        const fx__rec *r = &c->rec[s % c->rec_cap];
        if (r->seq != s)
            continue;
        n = fx__rec_json(line, sizeof line - 1, c, r, now_wall);
        if (n > 0 && (size_t)n < sizeof line - 1) {
            line[n++] = '\n';
            err = fx__write_all(fd, line, (size_t)n);
        }
    }
    return err;
}

int fx_comm_dump(int fd)
{
    if (fd < 0)
        return fx__error(FX_EINVAL, "fd = %d is not a file descriptor", fd);
    double now_wall = fx__wall_seconds();
    int err = 0;
    fx__lock_take();
    for (const fx_comm *c = fx__live; c && !err; c = c->next_live)
        err = fx__dump_one(fd, c, now_wall);
    fx__lock_drop();
    if (err)
        return fx__error(FX_EIO, "cannot write the flight recorder to fd %d: %s", fd, strerror(err));
    return FX_OK;
}

void fx__comm_dump_auto(void)
{
    if (fx__dump_fd >= 0)
        fx_comm_dump(fx__dump_fd);
}

/* ---- SIGUSR1 ------------------------------------------------------------------------------- */

/* Only a flag: formatting is not async-signal-safe, so the dump happens in the next call that
   polls, which a stuck wait does continuously. */
static void fx__on_sigusr1(int sig)
{
    (void)sig;
    fx__dump_requested = 1;
}

int fx_comm_install_sigusr1(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fx__on_sigusr1;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGUSR1, &sa, NULL) != 0)
        return fx__error(FX_EIO, "cannot install the SIGUSR1 handler: %s", strerror(errno));
    return FX_OK;
}

void fx__comm_serve_signal(void)
{
    if (!fx__dump_requested)
        return;
    fx__dump_requested = 0;
    fx_comm_dump(fx__dump_fd >= 0 ? fx__dump_fd : 2);
}
