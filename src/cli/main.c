/* flexc: the command. Dispatches to the subcommands. */
#include "cli.h"
#include "attention/backward.h"
#include "attention/bf16.h"
#include "attention/internal.h"
#include "core/backend.h"
#include "core/finite.h"
#include "core/gemm_bf16.h"
#include "core/gemv.h"
#include "core/sgemm.h"
#include "lce/lce_internal.h"
#include "model/kernels.h"

#include <errno.h>
#include <string.h>

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} subcommand;

static const subcommand commands[] = {
    {"train", cmd_train, "train a GPT with FlexAttention and the fused loss"},
    {"generate", cmd_generate, "generate text from a trained checkpoint or a Hugging Face model"},
    {"bench", cmd_bench, "measure kernels against their baselines (attention, lce, train, generate, safetensors, machine)"},
    {"export", cmd_export, "write a model as a Hugging Face directory (config.json, model.safetensors, tokenizer)"},
    {"inspect", cmd_inspect, "validate a .safetensors file or index and list its tensors"},
    {"plot", cmd_plot, "draw the loss and tokens/s curves of training runs (SVG or PNG)"},
    {"tokenize", cmd_tokenize, "encode text with a Hugging Face tokenizer.json (ids, or an llm.c token file)"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: flexc <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "\n  flexc <command> --help   options of a command\n"
                 "  flexc --version          print the version and the kernels each module runs\n");
}

/* After the version, one line per module: the name of the kernel table it dispatches through
   now (docs/dispatch.md), which FLEXC_ISA and the CPU decide, and the device backend's. */
static void print_kernels(void)
{
    const fx__attn16_kernels *a16 = fx__attn16_kernels_now();
    const fx__gemm_bf16_kernels *g16 = fx__gemm_bf16_kernels_now();
    printf("attention: %s\n", fx__attn_fwd_kernels_now()->name);
    printf("attention backward: %s\n", fx__attn_bwd_kernels_now()->name);
    printf("attention bf16: %s\n", a16 ? a16->name : "float32");
    printf("mod: %s\n", fx__mod_kernels_name());
    printf("lce: %s (products: %s)\n", fx__lce_kernels_now()->name, fx__lce_f32_products());
    printf("gemm: %s\n", fx__gemm_kernels_now()->name);
    printf("gemv: %s\n", fx__gemv_kernels_now()->name);
    printf("bf16 conversion: %s\n", fx__bf16_kernels_now()->name);
    if (g16->kernel)
        printf("bf16 gemm: %s\n", g16->name);
    else /* the float32 route: the float32 GEMM's products of the bfloat16 values */
        printf("bf16 gemm: %s (%s)\n", g16->name, fx__gemm_kernels_now()->name);
    printf("rmsnorm: %s\n", fx__rmsnorm_kernels_now()->name);
    printf("swiglu: %s\n", fx__swiglu_kernels_now()->name);
    printf("optim: %s\n", fx__optim_kernels_now()->name);
    printf("finite: %s\n", fx__finite_kernels_now()->name);
    char dev[256];
    const char *name = fx__cuda_backend.device_name(dev, sizeof dev);
    printf("%s: %s\n", fx__cuda_backend.name, name ? name : "none");
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
        print_kernels();
        return finish(CLI_EXIT_OK);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return finish(commands[i].run(argc - 2, argv + 2));
    cli_error("unknown command '%s'", cmd);
    usage(stderr);
    return CLI_EXIT_USAGE;
}
