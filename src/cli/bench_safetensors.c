/* flexc bench safetensors: opening and validating a large checkpoint (default 1 GiB in 1,000
   tensors) against reading the same file from the page cache with read(2), alternated in one
   run. Also reported: opening and touching every page of the mapping (what a first use of all
   weights costs), and the atomic save that wrote the file. */
#include "bench_util.h"
#include "cli.h"

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
    fx_safetensors_close(f);
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
    fx_safetensors_close(f);
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

int bench_safetensors(int argc, char **argv)
{
    bool json = false, keep = false;
    int64_t size_mib = 1024, ntensors = 1000, reps = 5;
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &json, "one JSON object per line"},
        {"--size-mib", CLI_INT, &size_mib, "file size in MiB (default 1024)"},
        {"--tensors", CLI_INT, &ntensors, "number of tensors (default 1000)"},
        {"--reps", CLI_INT, &reps, "alternating repetitions (default 5)"},
        {"--dir", CLI_STRING, &dir, "directory for the file (default $TMPDIR or /tmp)"},
        {"--keep", CLI_FLAG, &keep, "keep the file"},
    };
    const char *syn = "[--size-mib N] [--tensors N] [--reps N] [--dir D] [--keep] [--json]";
    int rc = cli_parse("bench safetensors", syn, argc, argv, opts, 6, NULL, 0, NULL);
    if (rc != CLI_PARSE_OK)
        return rc == CLI_PARSE_HELP ? CLI_EXIT_OK : rc;
    /* (bench_pair times at most 64 pairs) */
    const struct { const char *name; int64_t v, lo, hi; } lim[] = {
        {"--size-mib", size_mib, 1, 65536}, {"--tensors", ntensors, 1, 1000000}, {"--reps", reps, 1, 64}};
    for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
        if (lim[i].v < lim[i].lo || lim[i].v > lim[i].hi) {
            cli_error("bench safetensors: %s %lld is outside [%lld, %lld]", lim[i].name, (long long)lim[i].v,
                      (long long)lim[i].lo, (long long)lim[i].hi);
            return CLI_EXIT_USAGE;
        }
    if (!dir[0]) {
        cli_error("bench safetensors: --dir is empty");
        return CLI_EXIT_USAGE;
    }
    /* Equal F32 tensors [rows, 256] that together fill the size; they share one source buffer
       (the bench measures reading, not the contents). */
    size_t total = (size_t)size_mib << 20, per = total / (size_t)ntensors / 1024 * 1024;
    if (per == 0) {
        cli_error("bench safetensors: %lld tensors do not fit in %lld MiB", (long long)ntensors, (long long)size_mib);
        return CLI_EXIT_USAGE;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/flexc-bench-%ld.safetensors", dir, (long)getpid());
    float *src = malloc(per);
    fx_tensor_view *views = calloc((size_t)ntensors, sizeof *views);
    char (*names)[40] = calloc((size_t)ntensors, sizeof *names);
    if (!src || !views || !names) {
        free(src), free(views), free(names);
        cli_error("bench safetensors: out of memory");
        return CLI_EXIT_FAIL;
    }
    for (size_t i = 0; i < per / 4; i++)
        src[i] = (float)i * 0.5f;
    for (int64_t i = 0; i < ntensors; i++) {
        snprintf(names[i], sizeof names[i], "layers.%lld.weight", (long long)i);
        views[i] = (fx_tensor_view){.name = names[i], .dtype = FX_DT_F32, .ndim = 2,
                                    .shape = {(int64_t)(per / 1024), 256}, .data = src, .nbytes = per};
    }
    /* Ctrl-C or SIGTERM waits while the file is saved and the handler that removes it is put
       in place: one arriving between the two would leave the file behind. */
    sigset_t stop, prev;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigprocmask(SIG_BLOCK, &stop, &prev);
    double t0 = fx__seconds();
    rc = fx_safetensors_save(path, views, (size_t)ntensors, (const char *const[]){"format", "pt", NULL});
    double save_s = fx__seconds() - t0;
    free(views);
    free(names);
    free(src);
    void (*old_int)(int) = SIG_DFL, (*old_term)(int) = SIG_DFL;
    if (rc == FX_OK && !keep) {
        memcpy(bench_file, path, sizeof bench_file);
        /* a signal the caller ignores stays ignored */
        if ((old_int = signal(SIGINT, on_signal)) == SIG_IGN)
            signal(SIGINT, SIG_IGN);
        if ((old_term = signal(SIGTERM, on_signal)) == SIG_IGN)
            signal(SIGTERM, SIG_IGN);
    }
    sigprocmask(SIG_SETMASK, &prev, NULL);
    if (rc != FX_OK)
        return cli_fail(rc, "bench safetensors: save");
    ctx c = {.path = path};
    fx_safetensors *f;
    if ((rc = fx_safetensors_open(&f, path)) != FX_OK) {
        unlink(path);
        return cli_fail(rc, "bench safetensors: open");
    }
    c.size = fx_safetensors_header_size(f) + 8;
    size_t blen;
    fx_safetensors_buffer(f, &blen);
    c.size += blen;
    c.tensors = fx_safetensors_count(f);
    fx_safetensors_close(f);
    c.buf = malloc(c.size);
    if (!c.buf) {
        unlink(path);
        cli_error("bench safetensors: out of memory");
        return CLI_EXIT_FAIL;
    }
    memset(c.buf, 1, c.size); /* fault the read buffer in before timing */

    double open_s, read_s, touch_s, read2_s;
    bench_pair(run_open, &c, run_read, &c, (int)reps, &open_s, &read_s);
    bench_pair(run_open_touch, &c, run_read, &c, (int)reps, &touch_s, &read2_s);
    free(c.buf);
    if (!keep) {
        signal(SIGINT, old_int);
        signal(SIGTERM, old_term);
        unlink(path);
    }
    if (c.failed) {
        cli_error("bench safetensors: a timed run failed");
        return CLI_EXIT_FAIL;
    }
    double gib = (double)c.size / (1 << 30);
    if (json) {
        printf("{\"case\":\"safetensors\",\"threads\":%d,\"file_bytes\":%zu,\"tensors\":%zu,\"reps\":%lld,"
               "\"open_validate_s\":%.6f,\"read_s\":%.6f,\"read_over_open\":%.1f,"
               "\"open_touch_s\":%.6f,\"read2_s\":%.6f,\"read_over_open_touch\":%.3f,"
               "\"save_s\":%.3f,\"save_gibs\":%.3f}\n",
               fx_get_num_threads(), c.size, c.tensors, (long long)reps, open_s, read_s, read_s / open_s,
               touch_s, read2_s, read2_s / touch_s, save_s, gib / save_s);
    } else {
        printf("file %.3f GiB, %zu tensors, %lld alternating pairs (medians)\n", gib, c.tensors, (long long)reps);
        printf("  open + validate        %10.6f s\n", open_s);
        printf("  read(2), page cache    %10.6f s   (%.1fx the open)\n", read_s, read_s / open_s);
        printf("  open + touch all pages %10.6f s   (read is %.2fx this; %10.6f s in its pair)\n", touch_s,
               read2_s / touch_s, read2_s);
        printf("  atomic save (once)     %10.3f s   (%.2f GiB/s incl. fsync)\n", save_s, gib / save_s);
    }
    return CLI_EXIT_OK;
}
