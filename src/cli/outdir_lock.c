/* The output directory's lock (flexc train --out, flexc export --to). Two runs writing one
   directory interleave metrics.jsonl and overwrite each other's checkpoints; flock(2) on
   DIR/.lock makes the second refuse at once. The lock belongs to the open file, so it goes away
   with the process however it ends, and a stale .lock file left by a killed run is simply
   locked again. The holder writes its pid into the file so that the refusal can name it.

   A save killed midway (SIGKILL, SIGXFSZ, preemption) leaves its temporary file behind, as
   large as the checkpoint; with the lock held no other flexc writer is live in the directory,
   so the one that takes it removes them. */
#include "outdir_lock.h"

#include "cli.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static int lock_fd = -1;
static char lock_path[4200];

/* The pid the holder wrote, or 0 when there is none yet. */
static long holder_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    long pid = strtol(buf, NULL, 10);
    return pid > 0 ? pid : 0;
}

/* The holder's subcommand ("train", "export") from its command line, else "process". */
static const char *holder_command(long pid, char *buf, size_t n)
{
    char path[64], cmd[4352];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    ssize_t len = fd >= 0 ? read(fd, cmd, sizeof cmd - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (len > 0) {
        cmd[len] = '\0';
        const char *sub = cmd + strlen(cmd) + 1; /* argv[1] */
        if (sub < cmd + len && (!strcmp(sub, "train") || !strcmp(sub, "export"))) {
            snprintf(buf, n, "%s", sub);
            return buf;
        }
    }
    return "process";
}

int outdir_lock_opt(const char *dir, const char *opt)
{
    if (snprintf(lock_path, sizeof lock_path, "%s/.lock", dir) >= (int)sizeof lock_path) {
        cli_error("%s %s: the path is too long", opt, dir);
        return CLI_EXIT_FAIL;
    }
    /* A run that ends removes the file while holding the lock; a process that opened the old
       file just before must not lock that orphan: after locking, the path must still name the
       file locked, else try again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
            cli_error("%s %s: cannot create the lock file %s: %s", opt, dir, lock_path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            long pid = holder_pid(fd);
            close(fd);
            char cmd[16];
            if (e == EWOULDBLOCK && pid)
                cli_error("%s %s is in use by another flexc %s (pid %ld): one writer per directory; wait for it "
                          "to end or pass another %s", opt, dir, holder_command(pid, cmd, sizeof cmd), pid, opt);
            else if (e == EWOULDBLOCK)
                cli_error("%s %s is in use by another flexc process: one writer per directory; wait for it to "
                          "end or pass another %s", opt, dir, opt);
            else
                cli_error("%s %s: cannot lock %s: %s", opt, dir, lock_path, strerror(e));
            return CLI_EXIT_FAIL;
        }
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(lock_path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
            int e = errno;
            close(fd);
            cli_error("%s %s: cannot write the lock file %s: %s", opt, dir, lock_path, strerror(e));
            return CLI_EXIT_FAIL;
        }
        lock_fd = fd;
        return CLI_EXIT_OK;
    }
    cli_error("%s %s: the lock file %s keeps changing", opt, dir, lock_path);
    return CLI_EXIT_FAIL;
}

int outdir_lock(const char *dir)
{
    int rc = outdir_lock_opt(dir, "--out");
    if (rc == CLI_EXIT_OK)
        outdir_sweep(dir);
    return rc;
}

void outdir_unlock(void)
{
    if (lock_fd < 0)
        return;
    unlink(lock_path);
    close(lock_fd);
    lock_fd = -1;
}

/* ---- temporary files of interrupted saves ---- */

/* s[0..n) is 1 to max digits of the given base (lowercase hex), none of them a leading zero
   unless it is the only one. */
static bool is_number(const char *s, size_t n, size_t max, bool hex)
{
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isdigit((unsigned char)s[i]) || (hex && s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return hex || n == 1 || s[0] != '0';
}

/* The pid in name when it is a flexc save's temporary file: "." NAME ".safetensors.tmp-" PID
   then "-" COUNTER "-" HEX (src/safetensors/write.c) or "-check" (save_check.c). Else 0. */
static long temp_file_pid(const char *name)
{
    static const char ext[] = ".safetensors";
    const char *tmp = NULL;
    for (const char *p = strstr(name, ".tmp-"); p; p = strstr(p + 1, ".tmp-"))
        tmp = p;
    if (name[0] != '.' || !tmp || (size_t)(tmp - name) < 1 + 1 + strlen(ext) ||
        memcmp(tmp - strlen(ext), ext, strlen(ext)) != 0)
        return 0;
    const char *pid = tmp + strlen(".tmp-");
    const char *dash = strchr(pid, '-');
    if (!dash || !is_number(pid, (size_t)(dash - pid), 10, false))
        return 0;
    const char *rest = dash + 1;
    if (strcmp(rest, "check") != 0) {
        const char *dash2 = strchr(rest, '-');
        if (!dash2 || !is_number(rest, (size_t)(dash2 - rest), 10, false) ||
            !is_number(dash2 + 1, strlen(dash2 + 1), 16, true))
            return 0;
    }
    long v = strtol(pid, NULL, 10);
    return v > 0 && v <= INT_MAX ? v : 0;
}

/* A process of that pid exists on this host (EPERM: it does, and is someone else's). */
static bool pid_alive(long pid)
{
    return pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/* "512 bytes", "3.0 MB", "306 MB" (powers of 1000). */
static void format_bytes(char *buf, size_t n, unsigned long long bytes)
{
    static const char *const units[] = {"kB", "MB", "GB", "TB", "PB"};
    if (bytes < 1000) {
        snprintf(buf, n, "%llu byte%s", bytes, cli_s(bytes));
        return;
    }
    double v = (double)bytes / 1000;
    size_t u = 0;
    while (v >= 999.5 && u + 1 < sizeof units / sizeof units[0])
        v /= 1000, u++;
    snprintf(buf, n, v < 9.95 ? "%.1f %s" : "%.0f %s", v, units[u]);
}

void outdir_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    const int dfd = dirfd(d);
    unsigned long long files = 0, bytes = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = temp_file_pid(e->d_name);
        struct stat st;
        /* Regular files with one link only: flexc makes nothing else under these names. */
        if (!pid || pid_alive(pid) || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) || st.st_nlink != 1)
            continue;
        if (unlinkat(dfd, e->d_name, 0) != 0) {
            fprintf(stderr, "flexc: warning: cannot remove %s/%s, left by an interrupted save: %s\n", dir,
                    e->d_name, strerror(errno));
            continue;
        }
        files++;
        bytes += (unsigned long long)st.st_size;
    }
    closedir(d);
    if (files) {
        char size[32];
        format_bytes(size, sizeof size, bytes);
        fprintf(stderr, "flexc: removed %llu temporary file%s (%s) left by interrupted saves in %s\n", files,
                cli_s(files), size, dir);
    }
}

/* ---- what makes a directory a training run's ---- */

static bool exists_in(const char *dir, const char *name)
{
    char path[4300];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

const char *outdir_run_marker(const char *dir)
{
    /* What train writes there (its .lock is held while it runs, and goes when it ends); a flexc
       model.safetensors is what fx_model_load finds in a directory without config.json. */
    if (exists_in(dir, "checkpoint.safetensors"))
        return "checkpoint.safetensors";
    if (exists_in(dir, "metrics.jsonl"))
        return "metrics.jsonl";
    if (exists_in(dir, "model.safetensors") && !exists_in(dir, "config.json"))
        return "model.safetensors and no config.json";
    return NULL;
}
