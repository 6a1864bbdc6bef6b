/* The --out lock of flexc train. Two runs writing one directory interleave metrics.jsonl and
   overwrite each other's checkpoints; flock(2) on OUT/.lock makes the second refuse at once.
   The lock belongs to the open file, so it goes away with the process however it ends, and a
   stale .lock file left by a killed run is simply locked again. The holder writes its pid
   into the file so that the refusal can name it. */
#include "outdir_lock.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
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

int outdir_lock(const char *dir)
{
    if (snprintf(lock_path, sizeof lock_path, "%s/.lock", dir) >= (int)sizeof lock_path) {
        cli_error("--out %s: the path is too long", dir);
        return CLI_EXIT_FAIL;
    }
    /* A run that ends removes the file while holding the lock; a process that opened the old
       file just before must not lock that orphan: after locking, the path must still name the
       file locked, else try again. */
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0) {
            cli_error("--out %s: cannot create the lock file %s: %s", dir, lock_path, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            long pid = holder_pid(fd);
            close(fd);
            if (e == EWOULDBLOCK) {
                if (pid)
                    cli_error("--out %s is in use by another flexc train (pid %ld): one run per directory; wait "
                              "for it to end or pass another --out", dir, pid);
                else
                    cli_error("--out %s is in use by another flexc train: one run per directory; wait for it to "
                              "end or pass another --out", dir);
            } else {
                cli_error("--out %s: cannot lock %s: %s", dir, lock_path, strerror(e));
            }
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
            cli_error("--out %s: cannot write the lock file %s: %s", dir, lock_path, strerror(e));
            return CLI_EXIT_FAIL;
        }
        lock_fd = fd;
        return CLI_EXIT_OK;
    }
    cli_error("--out %s: the lock file %s keeps changing", dir, lock_path);
    return CLI_EXIT_FAIL;
}

void outdir_unlock(void)
{
    if (lock_fd < 0)
        return;
    unlink(lock_path);
    close(lock_fd);
    lock_fd = -1;
}
