/* flexc bench <case>: dispatch. */
#include "cli/cli.h"

#include <string.h>

typedef struct bench_case {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} bench_case;

static const bench_case cases[] = {
    {"attention", bench_attention, "flex attention vs. dense flash SDPA on the standard cases"},
    {"lce", bench_lce, "fused linear cross-entropy vs. materialised logits"},
    {"train", bench_train, "training tokens/s and peak memory"},
    {"generate", bench_generate, "prefill and decode tokens/s and peak memory with the KV cache"},
    {"safetensors", bench_safetensors, "open + validate a 1 GiB checkpoint vs. reading it from the page cache"},
    {"machine", bench_machine, "this machine's fp32 FMA peak, triad bandwidth and sgemm"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: flexc bench <case> [options] [--json]\n\ncases:\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        fprintf(out, "  %-12s %s\n", cases[i].name, cases[i].help);
}

int cmd_bench(int argc, char **argv)
{
    if (argc < 1) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!strcmp(argv[0], cases[i].name))
            return cases[i].run(argc - 1, argv + 1);
    cli_error("bench: unknown case '%s'", argv[0]);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
