/* Opening files for reading: a FIFO, a socket or a character device given where a file is
   expected would block an open or a read forever (or return endless bytes); every reader of
   the library and the command opens through here and refuses them at once. */
#include "core/file.h"

#include "core/core.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool fx__is_regular(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

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

int fx__read_regular(char **out, size_t *len, const char *path, size_t max)
{
    bool not_regular;
    int fd = fx__open_regular(path, &not_regular);
    if (fd < 0)
        return not_regular ? fx__error(FX_EIO, "not a regular file")
                           : fx__error(FX_EIO, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fx__error(FX_EIO, "cannot stat: %s", strerror(e));
    }
    if ((unsigned long long)st.st_size > (unsigned long long)max) {
        close(fd);
        return fx__error(FX_EFORMAT, "%lld bytes, more than the %zu-byte limit", (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = fx__alloc(n + 1);
    if (!buf) {
        close(fd);
        return FX_ENOMEM;
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) { /* 0: the file shrank since fstat */
            int e = errno;
            close(fd);
            fx__free(buf);
            return fx__error(FX_EIO, "cannot read: %s", r < 0 ? strerror(e) : "the file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return FX_OK;
}
