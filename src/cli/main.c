/* flexc: the command. Dispatches to the subcommands. */
#include "cli.h"

#include <errno.h>
#include <string.h>

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand commands[] = {
    {"train", cmd_train, "train a GPT with FlexAttention and the fused loss"},
    {"generate", cmd_generate, "generate text from a trained checkpoint"},
    {"bench", cmd_bench, "measure kernels against their baselines (attention, lce, train, safetensors, machine)"},
    {"inspect", cmd_inspect, "validate a .safetensors file or index and list its tensors"},
    {"plot", cmd_plot, "draw the loss and tokens/s curves of training runs (SVG or PNG)"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: flexc <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n  flexc <command> --help   options of a command\n"
                 "  flexc --version          print the version\n");
}

/* Output that could not be written (a full disk, a closed descriptor) is a failure, not a
   success with the text lost: stdio only reports it when the buffer is flushed. */
static int finish(int rc)
{
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout))
        return rc;
    cli_error("cannot write the output: %s", errno ? strerror(errno) : "write error");
    return rc == CLI_EXIT_OK ? CLI_EXIT_FAIL : rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return finish(CLI_EXIT_OK);
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "-V")) {
        printf("flexc %s\n", fx_version());
        return finish(CLI_EXIT_OK);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return finish(commands[i].run(argc - 2, argv + 2));
    cli_error("unknown command '%s'", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
