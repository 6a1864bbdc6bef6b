/* The flexc command: shared helpers for subcommands (errors, option parsing) and their
   entry points. Each subcommand lives in its own file. */
#ifndef FX_CLI_H
#define FX_CLI_H

#include <flexc.h>

#include <stdio.h>

#if defined(__GNUC__)
#define CLI_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define CLI_PRINTF(fmt, args)
#endif

/* Exit statuses: 0 success, 1 the work failed (bad file, I/O), 2 the command line was wrong. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* "flexc: error: <message>" on stderr. */
void cli_error(const char *fmt, ...) CLI_PRINTF(1, 2);
/* Reports a failed library call: "flexc: error: <what>: <fx_last_error()>" and returns 1. */
int cli_fail(int status, const char *what);

typedef enum cli_kind { CLI_FLAG, CLI_INT, CLI_FLOAT, CLI_STRING } cli_kind;
typedef struct cli_opt {
    const char *name; /* "--steps" */
    cli_kind kind;
    void *dst;        /* bool *, int64_t *, double *, const char ** */
    const char *help; /* one line; NULL hides the option from usage */
} cli_opt;

enum { CLI_PARSE_OK = 0, CLI_PARSE_HELP = -1 };
/* Parses argv[0..argc) (argv[0] is the first argument after the subcommand). Options take
   "--name value" or "--name=value"; the rest are positional and go to pos[0..max_pos).
   Returns CLI_PARSE_OK, CLI_PARSE_HELP (usage printed to stdout) or CLI_EXIT_USAGE (error
   printed). */
int cli_parse(const char *cmd, const char *synopsis, int argc, char **argv, const cli_opt *opts,
              size_t nopts, const char **pos, int max_pos, int *npos);
void cli_usage(FILE *out, const char *cmd, const char *synopsis, const cli_opt *opts, size_t nopts);

/* Subcommands: argc/argv start after the subcommand's name. Return the exit status. */
int cmd_train(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_export(int argc, char **argv);

/* flexc bench <case>: each in its own file. */
int bench_machine(int argc, char **argv);
int bench_attention(int argc, char **argv);
int bench_lce(int argc, char **argv);
int bench_train(int argc, char **argv);
int bench_safetensors(int argc, char **argv);
int bench_generate(int argc, char **argv);

/* Applies --threads N (0: leave the default). N is checked whole before it is narrowed to
   an int, so that 4294967297 is refused rather than taken for 1. Returns CLI_EXIT_OK, or
   CLI_EXIT_USAGE with the error printed ("<cmd> --threads N: ..."). */
int cli_threads(const char *cmd, int64_t n);
/* --device NAME (train, generate): "cpu" (or NULL) leaves *cuda false; "cuda" sets it when
   this build has CUDA and a device is visible. Returns CLI_EXIT_OK, CLI_EXIT_USAGE for another
   name, or CLI_EXIT_FAIL naming what is missing (the error printed). */
int cli_device(const char *name, bool *cuda);
/* The cores this process may run on (its CPU affinity); 0 when unknown. */
int cli_cores(void);

/* The plural ending of a count: "" for 1, "s" otherwise ("1 tensor", "2 tensors"). */
static inline const char *cli_s(uint64_t n) { return n == 1 ? "" : "s"; }

/* --model NAME|DIR (train, generate, bench): a preset name fills *cfg and leaves *loaded
   NULL; a directory (Hugging Face when it holds config.json, else a flexc training
   directory) or a flexc .safetensors file is loaded into *loaded, and *cfg is its config.
   Returns CLI_EXIT_OK, or the exit status with the error printed ("<opt>: ..."). */
int cli_model_open(const char *opt, const char *name, fx_model_config *cfg, fx_model **loaded);
/* The same; with inference, a Hugging Face directory is loaded for generation only (its
   weights stay mapped in their dtype: fx_model_load_inference). */
int cli_model_open_for(const char *opt, const char *name, fx_model_config *cfg, fx_model **loaded, bool inference);

/* A subcommand whose feature has not landed yet: says so and returns 2. */
int cli_not_yet(const char *what);

#endif
