/* flexc bench safetensors: opening and validating a large checkpoint (default 1 GiB in 1,000
   tensors) against reading the same file from the page cache with read(2), alternated in one
   run. Also reported: opening and touching every page of the mapping (what a first use of all
   weights costs), and the atomic save that wrote the file. */
#include "util.h"
#include "cli/cli.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The benchmark's file (a gigabyte by default) is removed when Ctrl-C or SIGTERM ends the
   run, not left in the temporary directory. */
static char bench_file[4096];

static void on_signal(int sig)
{
    unlink(bench_file);
    signal(sig, SIG_DFL);
    raise(sig);
}

typedef struct ctx {
    const char *path;
    unsigned char *buf; /* read target, the file's size */
    size_t size;
    size_t tensors;
    volatile unsigned long sink;
    int failed;
} ctx;

static void run_open(void *p)
{
    ctx *c = p;
    fx_safetensors *f;
    if (fx_safetensors_open(&f, c->path) != FX_OK) {
        c->failed = 1;
        return;
    }
    c->sink += fx_safetensors_count(f);
    fx_safetensors_free(f);
}

static void run_open_touch(void *p)
{
    ctx *c = p;
    fx_safetensors *f;
    if (fx_safetensors_open(&f, c->path) != FX_OK) {
        c->failed = 1;
        return;
    }
    size_t len;
    const unsigned char *b = fx_safetensors_buffer(f, &len);
    unsigned long s = 0;
    for (size_t i = 0; i < len; i += 4096)
        s += b[i];
    c->sink += s;
    fx_safetensors_free(f);
}

static void run_read(void *p)
{
    ctx *c = p;
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        c->failed = 1;
        return;
    }
    size_t got = 0;
    while (got < c->size) {
        ssize_t r = read(fd, c->buf + got, c->size - got);
        if (r <= 0) {
            c->failed = 1;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    c->sink += c->buf[c->size / 2];
}

typedef struct st_args {
    bool json, keep;
    int64_t size_mib, ntensors, reps;
    const char *dir;
    size_t per; /* bytes of each tensor */
} st_args;

/* a from the command line: CLI_PARSE_OK, CLI_PARSE_HELP (usage printed) or the exit status
   of an error (printed). */
static int st_args_parse(int argc, char **argv, st_args *a)
{
    *a = (st_args){.size_mib = 1024, .ntensors = 1000, .reps = 5};
    a->dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &a->json, "one JSON object per line"},
        {"--size-mib", CLI_INT, &a->size_mib, "file size in MiB (default 1024)"},
        {"--tensors", CLI_INT, &a->ntensors, "number of tensors (default 1000)"},
        {"--reps", CLI_INT, &a->reps, "alternating repetitions (default 5)"},
        {"--dir", CLI_STRING, &a->dir, "directory for the file (default $TMPDIR or /tmp)"},
        {"--keep", CLI_FLAG, &a->keep, "keep the file"},
    };
    const char *syn = "[--size-mib N] [--tensors N] [--reps N] [--dir D] [--keep] [--json]";
    int rc = cli_parse("bench safetensors", syn, argc, argv, opts, 6, NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc;
    /* (bench_pair times at most 64 pairs) */
    const struct { const char *name; int64_t v, lo, hi; } lim[] = {
        {"--size-mib", a->size_mib, 1, 65536}, {"--tensors", a->ntensors, 1, 1000000}, {"--reps", a->reps, 1, 64}};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v < lim[i].lo || lim[i].v > lim[i].hi) {
            cli_error("bench safetensors: %s %lld is outside [%lld, %lld]", lim[i].name, (long long)lim[i].v,
                      (long long)lim[i].lo, (long long)lim[i].hi);
            return CLI_EXIT_USAGE;
        }
    if (!a->dir[0]) {
        cli_error("bench safetensors: --dir is empty");
        return CLI_EXIT_USAGE;
    }
    /* Equal F32 tensors [rows, 256] that together fill the size. */
    a->per = ((size_t)a->size_mib << 20) / (size_t)a->ntensors / 1024 * 1024;
    if (a->per == 0) {
        cli_error("bench safetensors: %lld tensors do not fit in %lld MiB", (long long)a->ntensors,
                  (long long)a->size_mib);
        return CLI_EXIT_USAGE;
    }
    return CLI_PARSE_OK;
}

/* The tensors to save: they share one source buffer (the bench measures reading, not the
   contents). */
typedef struct st_views {
    float *src;
    fx_tensor_view *views;
    char (*names)[40];
} st_views;

static void st_views_free(st_views *v)
{
    free(v->views);
    free(v->names);
    free(v->src);
}

/* false (nothing held) without memory. */
static bool st_views_new(st_views *v, const st_args *a)
{
    v->src = malloc(a->per);
    v->views = calloc((size_t)a->ntensors, sizeof *v->views);
    v->names = calloc((size_t)a->ntensors, sizeof *v->names);
    if (!v->src || !v->views || !v->names) {
        st_views_free(v);
        return false;
    }
    for (size_t i = 0; i < a->per / 4; i++)
        v->src[i] = (float)i * 0.5f;
    for (int64_t i = 0; i < a->ntensors; i++) {
        snprintf(v->names[i], sizeof v->names[i], "layers.%lld.weight", (long long)i);
        v->views[i] = (fx_tensor_view){.name = v->names[i], .dtype = FX_DT_F32, .ndim = 2,
                                       .shape = {(int64_t)(a->per / 1024), 256}, .data = v->src, .nbytes = a->per};
    }
    return true;
}

/* The SIGINT and SIGTERM handlers in place before on_signal (SIG_DFL where it was not put in
   place). */
typedef struct st_handlers {
    void (*old_int)(int), (*old_term)(int);
} st_handlers;

/* Writes the checkpoint at path, timed into *save_s, and unless a->keep puts in place the
   handler that removes it. CLI_EXIT_OK, or the exit status with the error printed. */
static int st_save(const char *path, const st_args *a, double *save_s, st_handlers *h)
{
    st_views v;
    if (!st_views_new(&v, a)) {
        cli_error("bench safetensors: out of memory");
        return CLI_EXIT_FAIL;
    }
    /* Ctrl-C or SIGTERM waits while the file is saved and the handler that removes it is put
       in place: one arriving between the two would leave the file behind. */
    sigset_t stop, prev;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, &prev);
    double t0 = fx__seconds();
    int rc = fx_safetensors_save(path, v.views, (size_t)a->ntensors, (const char *const[]){"format", "pt", NULL});
    *save_s = fx__seconds() - t0;
    st_views_free(&v);
    *h = (st_handlers){SIG_DFL, SIG_DFL};
    if (rc == FX_OK && !a->keep) {
        memcpy(bench_file, path, sizeof bench_file);
        /* a signal the caller ignores stays ignored */
        if ((h->old_int = signal(SIGINT, on_signal)) == SIG_IGN)
            signal(SIGINT, SIG_IGN);
        if ((h->old_term = signal(SIGTERM, on_signal)) == SIG_IGN)
            signal(SIGTERM, SIG_IGN);
    }
    sigprocmask(SIG_SETMASK, &prev, NULL);
    return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "bench safetensors: save");
}

/* c->size and c->tensors from the saved file, and the read peer's buffer, faulted in. On an
   error (printed, its exit status returned) the file is removed. */
static int st_read_setup(ctx *c)
{
    fx_safetensors *f;
    int rc;
    if ((rc = fx_safetensors_open(&f, c->path)) != FX_OK) {
        unlink(c->path);
        return cli_fail(rc, "bench safetensors: open");
    }
    c->size = fx_safetensors_header_size(f) + 8;
    size_t blen;
    fx_safetensors_buffer(f, &blen);
    c->size += blen;
    c->tensors = fx_safetensors_count(f);
    fx_safetensors_free(f);
    c->buf = malloc(c->size);
    if (!c->buf) {
        unlink(c->path);
        cli_error("bench safetensors: out of memory");
        return CLI_EXIT_FAIL;
    }
    memset(c->buf, 1, c->size); /* fault the read buffer in before timing */
    return CLI_EXIT_OK;
}

/* Medians in seconds. */
typedef struct st_times {
    double open_s, read_s, touch_s, read2_s, save_s;
} st_times;

static void st_report(const st_args *a, const ctx *c, const st_times *t)
{
    double gib = (double)c->size / (1 << 30);
    if (a->json) {
        printf("{\"case\":\"safetensors\",\"threads\":%d,\"file_bytes\":%zu,\"tensors\":%zu,\"reps\":%lld,"
               "\"open_validate_s\":%.6f,\"read_s\":%.6f,\"read_over_open\":%.1f,"
               "\"open_touch_s\":%.6f,\"read2_s\":%.6f,\"read_over_open_touch\":%.3f,"
               "\"save_s\":%.3f,\"save_gibs\":%.3f}\n",
               fx_get_num_threads(), c->size, c->tensors, (long long)a->reps, t->open_s, t->read_s,
               t->read_s / t->open_s, t->touch_s, t->read2_s, t->read2_s / t->touch_s, t->save_s, gib / t->save_s);
    } else {
        printf("file %.3f GiB, %zu tensors, %lld alternating pairs (medians)\n", gib, c->tensors, (long long)a->reps);
        printf("  open + validate        %10.6f s\n", t->open_s);
        printf("  read(2), page cache    %10.6f s   (%.1fx the open)\n", t->read_s, t->read_s / t->open_s);
        printf("  open + touch all pages %10.6f s   (read is %.2fx this; %10.6f s in its pair)\n", t->touch_s,
               t->read2_s / t->touch_s, t->read2_s);
        printf("  atomic save (once)     %10.3f s   (%.2f GiB/s incl. fsync)\n", t->save_s, gib / t->save_s);
    }
}

int bench_safetensors(int argc, char **argv)
{
    st_args a;
    int rc = st_args_parse(argc, argv, &a);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : rc;
    char path[4096];
    snprintf(path, sizeof path, "%s/flexc-bench-%ld.safetensors", a.dir, (long)getpid());
    st_times t;
    st_handlers h;
    if ((rc = st_save(path, &a, &t.save_s, &h)) != CLI_EXIT_OK)
        return rc;
    ctx c = {.path = path};
    if ((rc = st_read_setup(&c)) != CLI_EXIT_OK)
        return rc;
    bench_pair(run_open, &c, run_read, &c, (int)a.reps, &t.open_s, &t.read_s);
    bench_pair(run_open_touch, &c, run_read, &c, (int)a.reps, &t.touch_s, &t.read2_s);
    free(c.buf);
    if (!a.keep) {
        signal(SIGINT, h.old_int);
        signal(SIGTERM, h.old_term);
        unlink(path);
    }
    if (c.failed) {
        cli_error("bench safetensors: a timed run failed");
        return CLI_EXIT_FAIL;
    }
    st_report(&a, &c, &t);
    return CLI_EXIT_OK;
}
