/* The save of a training run happens at its end (or every --save-every steps): a directory
   sitting where the checkpoint goes, a read-only or full file system would be discovered only
   after all the work. This looks before the first step. */
#include "save_check.h"

#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

int save_check(const char *dir, uint64_t need_bytes)
{
    static const char *const files[] = {"checkpoint.safetensors", "model.safetensors"};
    char path[4300];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            cli_error("%s is a directory: the run could not save its %s there (remove it, or pass another --out)",
                      path, i == 0 ? "checkpoint" : "model");
            return CLI_EXIT_FAIL;
        }
    }
    /* The temporary file the save begins with (write.c names it after the target). */
    snprintf(path, sizeof path, "%s/.checkpoint.safetensors.tmp-%ld-check", dir, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        cli_error("--out %s: cannot create the checkpoint's temporary file %s: %s", dir, path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    close(fd);
    unlink(path);
    struct statvfs vs;
    if (statvfs(dir, &vs) == 0 && vs.f_frsize > 0) {
        uint64_t avail = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
        if (avail < need_bytes)
            fprintf(stderr, "flexc: warning: --out %s has %llu bytes free, but saving the checkpoint and the model "
                    "takes about %llu bytes\n", dir, (unsigned long long)avail, (unsigned long long)need_bytes);
    }
    return CLI_EXIT_OK;
}
