/* Reading the prompt of flexc generate. A prompt on the command line is limited by the
   kernel's argument size (about 128 KiB a string, 2 MiB in all); a file or a pipe is not. */
#include "prompt.h"

#include "cli.h"
#include "core/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* All of `in`, NUL-terminated. */
static int read_all(FILE *in, const char *what, char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            cli_error("%s: out of memory after %zu bytes", what, n);
            return CLI_EXIT_FAIL;
        }
        if (cap - n < 2) {
            char *b = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (!b)
                free(buf);
            buf = b, cap *= 2;
            continue;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, in);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(in)) {
        cli_error("%s: cannot read: %s", what, strerror(errno));
        free(buf);
        return CLI_EXIT_FAIL;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return CLI_EXIT_OK;
}

int cli_read_prompt(const char *text, const char *file, char **out, size_t *len)
{
    if (text && file) {
        cli_error("generate: --prompt and --prompt-file %s both give the prompt: pass one of them", file);
        return CLI_EXIT_USAGE;
    }
    if ((text && !strcmp(text, "-")) || (file && !strcmp(file, "-")))
        return read_all(stdin, text ? "--prompt - (standard input)" : "--prompt-file - (standard input)", out, len);
    if (file) {
        bool not_regular;
        FILE *f = fx__fopen_regular(file, &not_regular);
        if (!f) {
            if (not_regular)
                cli_error("--prompt-file %s: not a regular file", file);
            else
                cli_error("--prompt-file %s: cannot open: %s", file, strerror(errno));
            return CLI_EXIT_FAIL;
        }
        int rc = read_all(f, "--prompt-file", out, len);
        fclose(f);
        return rc;
    }
    size_t n = text ? strlen(text) : 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        cli_error("--prompt: out of memory");
        return CLI_EXIT_FAIL;
    }
    memcpy(buf, text ? text : "", n + 1);
    *out = buf;
    *len = n;
    return CLI_EXIT_OK;
}
