/* Scratch directories for tests that write files: one per test program, removed at the end. */
#ifndef FLEXC_TEST_TMPDIR_H
#define FLEXC_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* dir [n] <- $TMPDIR (or /tmp)/PREFIX-XXXXXX, created; exits 2 when it cannot be. */
static inline void fxt_make_tmpdir(char *dir, size_t n, const char *prefix)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, n, "%s/%s-XXXXXX", base, prefix);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(2);
    }
}

/* Removes dir and everything under it (symbolic links are removed, not followed). */
static inline void fxt_rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue; /* no test makes such paths */
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            fxt_rm_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

#endif
