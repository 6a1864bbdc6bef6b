/* Error reporting and option parsing shared by the subcommands. */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("flexc: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int cli_fail(int status, const char *what)
{
    const char *msg = fx_last_error();
    cli_error("%s: %s", what, msg[0] ? msg : fx_strerror(status));
    return CLI_EXIT_FAIL;
}

int cli_not_yet(const char *what)
{
    cli_error("'%s' is not available in this version of flexc yet", what);
    return CLI_EXIT_USAGE;
}

int cli_cores(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 && n < INT_MAX ? (int)n : 0;
}

int cli_device(const char *name, bool *cuda)
{
    *cuda = false;
    if (!name || strcmp(name, "cpu") == 0)
        return CLI_EXIT_OK;
    if (strcmp(name, "cuda") != 0) {
        cli_error("--device %s: expected cpu or cuda", name);
        return CLI_EXIT_USAGE;
    }
#ifndef FLEXC_HAVE_CUDA
    cli_error("--device cuda: this build of flexc has no CUDA backend (configure with -DFLEXC_CUDA=ON and a CUDA "
              "toolkit); use --device cpu");
    return CLI_EXIT_FAIL;
#else
    if (fx_cuda_device_count() < 1) {
        cli_error("--device cuda: no CUDA device is visible (no GPU, or no driver); use --device cpu");
        return CLI_EXIT_FAIL;
    }
    *cuda = true;
    return CLI_EXIT_OK;
#endif
}

int cli_threads(const char *cmd, int64_t n)
{
    if (n == 0)
        return CLI_EXIT_OK;
    if (n < 0 || n > INT_MAX) {
        cli_error("%s --threads %lld is outside [1, %d] (0: all cores)", cmd, (long long)n, INT_MAX);
        return CLI_EXIT_USAGE;
    }
    if (fx_set_num_threads((int)n) != FX_OK) {
        cli_error("%s --threads %lld: %s", cmd, (long long)n, fx_last_error());
        return CLI_EXIT_USAGE;
    }
    /* More threads than cores is allowed (it can help hide memory stalls) but is usually a
       mistake, so it is said once; the count in effect may also have been lowered. */
    int cores = cli_cores(), now = fx_get_num_threads();
    if (cores > 0 && n > cores) {
        if (now != n)
            fprintf(stderr, "flexc: warning: %s --threads %lld is more than the %d cores of this machine; running "
                    "%d threads (the most this build allows)\n", cmd, (long long)n, cores, now);
        else
            fprintf(stderr, "flexc: warning: %s --threads %lld is more than the %d cores of this machine\n", cmd,
                    (long long)n, cores);
    }
    return CLI_EXIT_OK;
}

void cli_usage(FILE *out, const char *cmd, const char *synopsis, const cli_opt *opts, size_t nopts)
{
    fprintf(out, "usage: flexc %s %s\n", cmd, synopsis);
    if (nopts)
        fprintf(out, "\noptions:\n");
    for (size_t i = 0; i < nopts; i++) {
        if (!opts[i].help)
            continue;
        const char *arg = opts[i].kind == CLI_INT ? " N" : opts[i].kind == CLI_FLOAT ? " X"
                        : opts[i].kind == CLI_STRING ? " S" : "";
        char left[64];
        snprintf(left, sizeof left, "%s%s", opts[i].name, arg);
        fprintf(out, "  %-22s %s\n", left, opts[i].help);
    }
}

static int parse_value(const char *cmd, const cli_opt *o, const char *val)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case CLI_INT: {
        long long x = strtoll(val, &end, 10);
        if (errno || end == val || *end) {
            cli_error("%s %s: '%s' is not an integer", cmd, o->name, val);
            return CLI_EXIT_USAGE;
        }
        *(int64_t *)o->dst = x;
        return CLI_PARSE_OK;
    }
    case CLI_FLOAT: {
        double x = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(x)) {
            cli_error("%s %s: '%s' is not a finite number", cmd, o->name, val);
            return CLI_EXIT_USAGE;
        }
        *(double *)o->dst = x;
        return CLI_PARSE_OK;
    }
    case CLI_STRING:
        *(const char **)o->dst = val;
        return CLI_PARSE_OK;
    case CLI_FLAG:
        break;
    }
    return CLI_EXIT_USAGE;
}

int cli_parse(const char *cmd, const char *synopsis, int argc, char **argv, const cli_opt *opts,
              size_t nopts, const char **pos, int max_pos, int *npos)
{
    int np = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            cli_usage(stdout, cmd, synopsis, opts, nopts);
            return CLI_PARSE_HELP;
        }
        if (strncmp(arg, "--", 2) != 0 || !strcmp(arg, "--")) {
            if (!strcmp(arg, "--") && i + 1 < argc)
                arg = argv[++i];
            if (np >= max_pos) {
                cli_error("%s: unexpected argument '%s'", cmd, arg);
                return CLI_EXIT_USAGE;
            }
            pos[np++] = arg;
            continue;
        }
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const cli_opt *o = NULL;
        for (size_t k = 0; k < nopts && !o; k++)
            if (strlen(opts[k].name) == len && !strncmp(opts[k].name, arg, len))
                o = &opts[k];
        if (!o) {
            cli_error("%s: unknown option '%.*s' (see flexc %s --help)", cmd, (int)len, arg, cmd);
            return CLI_EXIT_USAGE;
        }
        if (o->kind == CLI_FLAG) {
            if (eq) {
                cli_error("%s: %s takes no value", cmd, o->name);
                return CLI_EXIT_USAGE;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            cli_error("%s: %s needs a value", cmd, o->name);
            return CLI_EXIT_USAGE;
        }
        int rc = parse_value(cmd, o, val);
        if (rc != CLI_PARSE_OK)
            return rc;
    }
    if (npos)
        *npos = np;
    return CLI_PARSE_OK;
}
