/* Opening files for reading: a FIFO, a socket or a character device given where a file is
   expected would block an open or a read forever (or return endless bytes); every reader of
   the library and the command opens through here and refuses them at once. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

int fx__open_regular(const char *path, bool *not_regular)
{
    if (not_regular)
        *not_regular = false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (not_regular)
            *not_regular = true;
        errno = EINVAL;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

FILE *fx__fopen_regular(const char *path, bool *not_regular)
{
    int fd = fx__open_regular(path, not_regular);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}
