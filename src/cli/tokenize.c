/* flexc tokenize --model DIR (FILE -o tokens.bin | --text S | --chat FILE.jsonl [--labels]):
   encodes text with the tokenizer.json in DIR. --text prints the ids as a JSON array; FILE ("-":
   standard input) is written as an llm.c token file, read in pieces cut where the tokenizer allows
   (the ids are those of the whole file encoded at once), with progress on standard error. --chat
   renders each conversation with the model's chat template and prints its ids (with --labels, an
   object with ids and labels; --render, the text). See docs/tokenizers.md and docs/chat.md. */
#include "cli.h"
#include "core/core.h"
#include "tokenizer/chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char SYNOPSIS[] =
    "--model DIR (FILE -o tokens.bin | --text S) | --model DIR --chat FILE.jsonl [--labels | --render]";

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

/* As Python's json.dumps(s, ensure_ascii=False) writes a string. */
static void json_string(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (e)
            fputs(e, f);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void put_ids(FILE *f, const int32_t *v, int64_t n)
{
    fputc('[', f);
    for (int64_t i = 0; i < n; i++)
        fprintf(f, i ? ",%d" : "%d", v[i]);
    fputc(']', f);
}

/* --chat: every line is checked, every conversation rendered and encoded, then all printed. */
static int print_chat(const fx_tokenizer *tok, const char *model, const char *path, bool labels, bool render)
{
    struct stat st;
    if (stat(model, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cli_error("tokenize: --chat needs --model DIR (the chat template is in its tokenizer_config.json)");
        return CLI_EXIT_USAGE;
    }
    fx__chat_data data;
    int rc = fx__chat_data_load(&data, path);
    if (rc != FX_OK)
        return cli_fail(rc, "tokenize");
    fx__chat *chat = NULL;
    if ((rc = fx__chat_load(&chat, model, tok)) != FX_OK) {
        fx__chat_data_free(&data);
        return cli_fail(rc, "tokenize");
    }
    char *buf = NULL;
    size_t blen = 0;
    FILE *out = open_memstream(&buf, &blen);
    fx_ids ids = {0};
    int32_t *lab = NULL;
    for (size_t i = 0; out && rc == FX_OK && i < data.n; i++) {
        if (render) {
            char *text;
            size_t len;
            rc = fx__chat_render(chat, data.conv[i].msg, data.conv[i].n, false, &text, &len);
            if (rc == FX_OK) {
                json_string(out, text, len);
                fputc('\n', out);
                free(text);
            }
        } else if ((rc = fx__chat_encode(chat, &data.conv[i], &ids, &lab)) == FX_OK) {
            if (labels) {
                fputs("{\"ids\":", out);
                put_ids(out, ids.ids, ids.n);
                fputs(",\"labels\":", out);
                put_ids(out, lab, ids.n);
                fputs("}\n", out);
            } else {
                put_ids(out, ids.ids, ids.n);
                fputc('\n', out);
            }
        }
        if (rc != FX_OK)
            fx__error_context(rc, "%s:%lld", path, (long long)data.conv[i].line);
    }
    if (!out)
        rc = fx__error(FX_ENOMEM, "out of memory");
    else
        fclose(out);
    if (rc == FX_OK)
        fwrite(buf, 1, blen, stdout);
    free(buf);
    free(lab);
    fx_ids_free(&ids);
    fx__chat_free(chat);
    fx__chat_data_free(&data);
    return rc == FX_OK ? CLI_EXIT_OK : cli_fail(rc, "tokenize");
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
    const char *model = NULL, *text = NULL, *out = NULL, *chat = NULL;
    bool quiet = false, labels = false, render = false;
    cli_opt opts[] = {
        {"--model", CLI_STRING, &model, "directory holding tokenizer.json (or the file itself)"},
        {"--text", CLI_STRING, &text, "encode this text and print its ids as a JSON array"},
        {"--out", CLI_STRING, &out, "the token file to write (also -o)"},
        {"--quiet", CLI_FLAG, &quiet, "no progress output"},
        {"--chat", CLI_STRING, &chat, "render each conversation of this JSONL file with the chat template, print its ids"},
        {"--labels", CLI_FLAG, &labels, "with --chat: print {\"ids\": [...], \"labels\": [...]} (-100: no loss)"},
        {"--render", CLI_FLAG, &render, "with --chat: print the rendered text as a JSON string instead"},
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
    if ((labels || render) && !chat) {
        cli_error("tokenize: --labels and --render go with --chat");
        return CLI_EXIT_USAGE;
    }
    if (labels && render) {
        cli_error("tokenize: give --labels or --render, not both");
        return CLI_EXIT_USAGE;
    }
    if (chat && (text || out || npos)) {
        cli_error("tokenize: --chat FILE.jsonl prints ids; it takes no --text, FILE or -o");
        return CLI_EXIT_USAGE;
    }
    if (!chat && (text != NULL) == (npos == 1)) {
        cli_error("tokenize: give either FILE -o tokens.bin or --text S");
        return CLI_EXIT_USAGE;
    }
    if (text && out) {
        cli_error("tokenize: --text prints the ids; -o goes with FILE");
        return CLI_EXIT_USAGE;
    }
    if (!chat && !text && !out) {
        cli_error("tokenize: FILE needs -o tokens.bin");
        return CLI_EXIT_USAGE;
    }
    fx_tokenizer *tok = NULL;
    if ((rc = load(&tok, model)) != CLI_EXIT_OK)
        return rc;
    rc = chat ? print_chat(tok, model, chat, labels, render)
         : text ? print_ids(tok, text) : write_file(tok, pos[0], out, quiet);
    fx_tokenizer_free(tok);
    return rc;
}
