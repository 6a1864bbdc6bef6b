/* flexc tokenize --model DIR (FILE -o tokens.bin | --text S): encodes text with the tokenizer.json
   in DIR. --text prints the ids as a JSON array; FILE ("-": standard input) is written as an
   llm.c token file, read in pieces cut where the tokenizer allows (the ids are those of the
   whole file encoded at once), with progress on standard error. See docs/tokenizers.md. */
#include "cli.h"
#include "core/core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char SYNOPSIS[] = "--model DIR (FILE -o tokens.bin | --text S)";

enum { READ_CHUNK = 4 << 20, PROGRESS_MIN = 8 << 20 };

static int load(fx_tokenizer **tok, const char *model)
{
    struct stat st;
    char path[4096];
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(path, sizeof path, "%s/tokenizer.json", model);
    else
        snprintf(path, sizeof path, "%s", model);
    int rc = fx_tokenizer_load(tok, path);
    if (rc != FX_OK) {
        cli_error("tokenize: %s", fx_last_error());
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

static int print_ids(const fx_tokenizer *tok, const char *text)
{
    fx_ids ids = {0};
    int rc = fx_tokenizer_encode(tok, &ids, text, strlen(text));
    if (rc != FX_OK) {
        fx_ids_free(&ids);
        return cli_fail(rc, "tokenize");
    }
    putchar('[');
    for (int64_t i = 0; i < ids.n; i++)
        printf(i ? ",%d" : "%d", ids.ids[i]);
    printf("]\n");
    fx_ids_free(&ids);
    return CLI_EXIT_OK;
}

typedef struct progress {
    bool on, tty;
    double t0, last;
    long long total; /* bytes; -1 unknown */
    int last_decile;
} progress;

static void progress_show(progress *p, long long done, int64_t tokens, bool final)
{
    if (!p->on)
        return;
    double t = fx__seconds();
    double mb = (double)done / 1e6, rate = mb / (t - p->t0 > 1e-9 ? t - p->t0 : 1e-9);
    if (p->tty) {
        if (!final && t - p->last < 0.2)
            return;
        p->last = t;
        if (p->total > 0)
            fprintf(stderr, "\r\033[Ktokenize: %.1f/%.1f MB (%.0f%%) | %lld tokens | %.1f MB/s", mb,
                    (double)p->total / 1e6, 100.0 * (double)done / (double)p->total, (long long)tokens, rate);
        else
            fprintf(stderr, "\r\033[Ktokenize: %.1f MB | %lld tokens | %.1f MB/s", mb, (long long)tokens, rate);
        if (final)
            fputc('\n', stderr);
        return;
    }
    /* Not a terminal: a line at each tenth (or each 64 MB when the size is unknown). */
    int decile = p->total > 0 ? (int)(10 * done / p->total) : (int)(done >> 26);
    if (decile == p->last_decile && !final)
        return;
    p->last_decile = decile;
    fprintf(stderr, "tokenize: %.1f MB | %lld tokens | %.1f MB/s\n", mb, (long long)tokens, rate);
}

static int write_file(const fx_tokenizer *tok, const char *in_path, const char *out_path, bool quiet)
{
    FILE *in = strcmp(in_path, "-") ? fopen(in_path, "rb") : stdin;
    if (!in) {
        cli_error("tokenize: %s: %s", in_path, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    progress pr = {.t0 = fx__seconds(), .total = -1, .last_decile = -1, .tty = isatty(STDERR_FILENO)};
    struct stat st;
    if (fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode))
        pr.total = (long long)st.st_size;
    pr.on = !quiet && (pr.total < 0 || pr.total >= PROGRESS_MIN);

    fx_token_writer *w = NULL;
    int rc = fx_token_writer_open(&w, out_path, fx_tokenizer_vocab_size(tok));
    if (rc != FX_OK) {
        if (in != stdin)
            fclose(in);
        return cli_fail(rc, "tokenize");
    }
    /* buf[0 .. len): read, not yet encoded. Encoded up to a safe cut; the rest waits for more. */
    size_t cap = 2 * (size_t)READ_CHUNK, len = 0;
    char *buf = malloc(cap);
    fx_ids ids = {0};
    long long done = 0;
    bool eof = false;
    if (!buf) {
        rc = FX_ENOMEM;
        cli_error("tokenize: out of memory");
    }
    while (rc == FX_OK && !eof) {
        if (cap - len < READ_CHUNK) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                cli_error("tokenize: out of memory");
                rc = FX_ENOMEM;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, READ_CHUNK, in);
        if (got < READ_CHUNK) {
            if (ferror(in)) {
                cli_error("tokenize: %s: read failed: %s", in_path, strerror(errno));
                rc = FX_EIO;
                break;
            }
            eof = true;
        }
        len += got;
        size_t cut = eof ? len : fx_tokenizer_safe_cut(tok, buf, len);
        if (cut == 0)
            continue; /* no place to cut yet: read more */
        ids.n = 0;
        rc = fx_tokenizer_encode(tok, &ids, buf, cut);
        if (rc == FX_OK)
            rc = fx_token_writer_append(w, ids.ids, ids.n);
        if (rc != FX_OK) {
            cli_fail(rc, "tokenize");
            break;
        }
        memmove(buf, buf + cut, len - cut);
        len -= cut;
        done += (long long)cut;
        progress_show(&pr, done, fx_token_writer_count(w), false);
    }
    free(buf);
    fx_ids_free(&ids);
    if (in != stdin)
        fclose(in);
    if (rc != FX_OK) {
        fx_token_writer_abort(w);
        return CLI_EXIT_FAIL;
    }
    int64_t count = fx_token_writer_count(w);
    progress_show(&pr, done, count, true);
    rc = fx_token_writer_close(w);
    if (rc != FX_OK)
        return cli_fail(rc, "tokenize");
    printf("tokenize: %lld tokens from %lld bytes written to %s\n", (long long)count, done, out_path);
    return CLI_EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *out = NULL;
    bool quiet = false;
    cli_opt opts[] = {
        {"--model", CLI_STRING, &model, "directory holding tokenizer.json (or the file itself)"},
        {"--text", CLI_STRING, &text, "encode this text and print its ids as a JSON array"},
        {"--out", CLI_STRING, &out, "the token file to write (also -o)"},
        {"--quiet", CLI_FLAG, &quiet, "no progress output"},
    };
    /* -o is --out */
    char **args = malloc((size_t)(argc + 1) * sizeof *args);
    if (!args) {
        cli_error("tokenize: out of memory");
        return CLI_EXIT_FAIL;
    }
    for (int i = 0; i < argc; i++)
        args[i] = strcmp(argv[i], "-o") ? argv[i] : (char *)"--out";
    const char *pos[1];
    int npos = 0;
    int rc = cli_parse("tokenize", SYNOPSIS, argc, args, opts, sizeof opts / sizeof *opts, pos, 1, &npos);
    free(args);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if (!model) {
        cli_error("tokenize: --model DIR is required");
        return CLI_EXIT_USAGE;
    }
    if ((text != NULL) == (npos == 1)) {
        cli_error("tokenize: give either FILE -o tokens.bin or --text S");
        return CLI_EXIT_USAGE;
    }
    if (text && out) {
        cli_error("tokenize: --text prints the ids; -o goes with FILE");
        return CLI_EXIT_USAGE;
    }
    if (!text && !out) {
        cli_error("tokenize: FILE needs -o tokens.bin");
        return CLI_EXIT_USAGE;
    }
    fx_tokenizer *tok = NULL;
    if ((rc = load(&tok, model)) != CLI_EXIT_OK)
        return rc;
    rc = text ? print_ids(tok, text) : write_file(tok, pos[0], out, quiet);
    fx_tokenizer_free(tok);
    return rc;
}
