/* Opening files for reading without hanging on special files. */
#ifndef FX_CORE_FILE_H
#define FX_CORE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Opens `path` read-only (close-on-exec) and checks that it is a regular file before a byte
   is read: the open itself uses O_NONBLOCK, so a FIFO with no writer, or a device, cannot
   block it; the flag is cleared again for ordinary blocking reads. Returns the descriptor,
   or -1 with errno set; *not_regular (may be NULL) is set when the path exists but is not a
   regular file (errno is then EINVAL), so the caller can say "not a regular file". Never
   prints. */
int fx__open_regular(const char *path, bool *not_regular);
/* The same as a stdio stream ("rb"); NULL with errno and *not_regular as above. */
FILE *fx__fopen_regular(const char *path, bool *not_regular);
/* Whether path names a regular file (stat follows symbolic links). */
bool fx__is_regular(const char *path);
/* Reads the whole regular file `path` (opened as above) into a new fx__alloc buffer with a
   NUL after the last byte: *out [*len + 1], for the caller to fx__free. FX_EIO when it
   cannot be opened, is not a regular file or cannot be read whole; FX_EFORMAT when it holds
   more than `max` bytes (checked before anything is allocated). The message does not name
   the path: callers add it (fx__error_context). Outputs are untouched on failure. */
int fx__read_regular(char **out, size_t *len, const char *path, size_t max);

#endif
