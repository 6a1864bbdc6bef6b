/* flexc inspect FILE.safetensors|INDEX.json [--json]: validates a checkpoint and prints its
   metadata, a table of its tensors (name, dtype, shape, bytes, offset) and totals. A name
   ending in .json is read as a sharded checkpoint's index. */
#include "cli.h"

#include "core/finite.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Names and metadata come from the file: print control bytes escaped so that a file cannot
   drive the terminal, and Unicode's bidirectional controls (U+200E, U+200F, U+202A-U+202E,
   U+2066-U+2069) escaped as \uXXXX so that a name cannot display as another (a right-to-left
   override turns "wte.gnp" into "pgn.etw" on screen). */
static unsigned bidi_at(const unsigned char *p)
{
    if (p[0] != 0xe2 || (p[1] != 0x80 && p[1] != 0x81) || !p[2])
        return 0;
    unsigned cp = 0x2000u | (unsigned)(p[1] & 0x3f) << 6 | (unsigned)(p[2] & 0x3f);
    bool bidi = cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
    return bidi ? cp : 0;
}

static void put_safe(FILE *out, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned cp = bidi_at(p);
        if (cp) {
            fprintf(out, "\\u%04x", cp);
            p += 2;
        } else if (*p < 0x20 || *p == 0x7f) {
            fprintf(out, "\\x%02x", *p);
        } else {
            fputc(*p, out);
        }
    }
}

static int safe_width(const char *s)
{
    int w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (bidi_at(p)) {
            w += 6;
            p += 2;
        } else {
            w += *p < 0x20 || *p == 0x7f ? 4 : (*p & 0xc0) != 0x80; /* count code points */
        }
    }
    return w;
}

static void shape_str(char *buf, size_t cap, const fx_tensor_view *v)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int d = 0; d < v->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)v->shape[d]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

typedef struct row {
    const fx_tensor_view *v;
    size_t offset;
    const char *shard; /* NULL for a single file */
} row;

static size_t view_offset(const fx_safetensors *f, const fx_tensor_view *v)
{
    return (size_t)((const char *)v->data - (const char *)fx_safetensors_buffer(f, NULL));
}

static void print_metadata_text(const fx_safetensors *f, const char *indent)
{
    for (size_t i = 0; fx_safetensors_metadata_key(f, i); i++) {
        const char *k = fx_safetensors_metadata_key(f, i);
        fputs(indent, stdout);
        put_safe(stdout, k);
        fputs(": ", stdout);
        put_safe(stdout, fx_safetensors_metadata(f, k));
        fputc('\n', stdout);
    }
}

static void print_table(const row *rows, size_t n)
{
    int wn = 4, wd = 5, ws = 5, wsh = 5;
    char sh[256];
    for (size_t i = 0; i < n; i++) {
        int w = safe_width(rows[i].v->name);
        wn = w > wn ? (w < 60 ? w : 60) : wn;
        shape_str(sh, sizeof sh, rows[i].v);
        ws = (int)strlen(sh) > ws ? (int)strlen(sh) : ws;
        if (rows[i].shard && (int)strlen(rows[i].shard) > wsh)
            wsh = (int)strlen(rows[i].shard);
    }
    bool sharded = n > 0 && rows[0].shard;
    printf("%-*s  %-*s  %-*s  %14s  %14s", wn, "name", wd + 2, "dtype", ws, "shape", "bytes", "offset");
    if (sharded)
        printf("  %s", "shard");
    putchar('\n');
    for (size_t i = 0; i < n; i++) {
        const fx_tensor_view *v = rows[i].v;
        put_safe(stdout, v->name);
        int pad = wn - safe_width(v->name);
        printf("%*s  %-*s  ", pad > 0 ? pad : 0, "", wd + 2, fx_dtype_name(v->dtype));
        shape_str(sh, sizeof sh, v);
        printf("%-*s  %14zu  %14zu", ws, sh, v->nbytes, rows[i].offset);
        if (sharded) {
            fputs("  ", stdout);
            put_safe(stdout, rows[i].shard);
        }
        putchar('\n');
    }
}

/* Non-finite values (NaN, +-Inf) in float tensors: a model holding one cannot be used, and
   generate or --resume refuse it; inspect says where (every value is read once). */
static int64_t first_bad(const fx_tensor_view *v)
{
    int64_t n = fx_tensor_numel(v);
    return n > 0 ? fx__first_nonfinite(v->data, v->dtype, (size_t)n) : -1;
}

static size_t print_nonfinite(const row *rows, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t at = first_bad(rows[i].v);
        if (at < 0)
            continue;
        printf("non-finite: tensor ");
        put_safe(stdout, rows[i].v->name);
        printf(" holds %s at index %lld\n", fx__nonfinite_name(rows[i].v->data, rows[i].v->dtype, (size_t)at),
               (long long)at);
        bad++;
    }
    return bad;
}

static json_t *metadata_json(const fx_safetensors *f)
{
    json_t *m = json_object();
    for (size_t i = 0; fx_safetensors_metadata_key(f, i); i++) {
        const char *k = fx_safetensors_metadata_key(f, i);
        json_object_set_new(m, k, json_string(fx_safetensors_metadata(f, k)));
    }
    return m;
}

static json_t *rows_json(const row *rows, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        const fx_tensor_view *v = rows[i].v;
        json_t *shape = json_array();
        for (int d = 0; d < v->ndim; d++)
            json_array_append_new(shape, json_integer(v->shape[d]));
        json_t *t = json_pack("{s:s, s:s, s:o, s:I, s:I}", "name", v->name, "dtype", fx_dtype_name(v->dtype),
                              "shape", shape, "bytes", (json_int_t)v->nbytes, "offset", (json_int_t)rows[i].offset);
        if (rows[i].shard)
            json_object_set_new(t, "shard", json_string(rows[i].shard));
        int64_t at = first_bad(v);
        if (at >= 0)
            json_object_set_new(t, "first_nonfinite",
                                json_pack("{s:I, s:s}", "index", (json_int_t)at, "value",
                                          fx__nonfinite_name(v->data, v->dtype, (size_t)at)));
        json_array_append_new(a, t);
    }
    return a;
}

static void totals(const row *rows, size_t n, int64_t *params, uint64_t *bytes)
{
    *params = 0;
    *bytes = 0;
    for (size_t i = 0; i < n; i++) {
        *params += fx_tensor_numel(rows[i].v);
        *bytes += rows[i].v->nbytes;
    }
}

/* A command-line path need not be UTF-8; JSON strings must be. */
static json_t *path_json(const char *path)
{
    json_t *s = json_string(path);
    if (s)
        return s;
    char *copy = strdup(path);
    if (!copy)
        return json_string("?");
    for (char *p = copy; *p; p++)
        if ((unsigned char)*p >= 0x80)
            *p = '?';
    s = json_string(copy);
    free(copy);
    return s;
}

static int emit_json(json_t *doc)
{
    if (!doc) {
        cli_error("inspect: cannot build the JSON output");
        return CLI_EXIT_FAIL;
    }
    int rc = json_dumpf(doc, stdout, JSON_COMPACT | JSON_ENSURE_ASCII) == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    putchar('\n');
    json_decref(doc);
    if (rc != CLI_EXIT_OK)
        cli_error("inspect: cannot write the JSON output");
    return rc;
}

static int inspect_file(const char *path, bool as_json)
{
    fx_safetensors *f;
    int rc = fx_safetensors_open(&f, path);
    if (rc != FX_OK) {
        cli_error("%s", fx_last_error()); /* the message starts with the file name */
        return CLI_EXIT_FAIL;
    }
    size_t n = fx_safetensors_count(f);
    row *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows) {
        fx_safetensors_free(f);
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].v = fx_safetensors_tensor(f, i);
        rows[i].offset = view_offset(f, rows[i].v);
    }
    int64_t params;
    uint64_t bytes;
    totals(rows, n, &params, &bytes);
    if (as_json) {
        json_t *doc = json_pack("{s:o, s:I, s:o, s:o, s:{s:I, s:I, s:I}}", "file", path_json(path), "header_bytes",
                                (json_int_t)fx_safetensors_header_size(f), "metadata", metadata_json(f),
                                "tensors", rows_json(rows, n), "totals", "tensors", (json_int_t)n,
                                "parameters", (json_int_t)params, "bytes", (json_int_t)bytes);
        rc = emit_json(doc);
    } else {
        printf("file: ");
        put_safe(stdout, path);
        printf("\nmetadata:%s\n", fx_safetensors_metadata_key(f, 0) ? "" : " (none)");
        print_metadata_text(f, "  ");
        print_table(rows, n);
        print_nonfinite(rows, n);
        printf("total: %zu tensor%s, %lld parameter%s, %llu byte%s of data, %zu byte%s of header\n", n, cli_s(n),
               (long long)params, cli_s((uint64_t)params), (unsigned long long)bytes, cli_s(bytes),
               fx_safetensors_header_size(f), cli_s(fx_safetensors_header_size(f)));
        rc = CLI_EXIT_OK;
    }
    free(rows);
    fx_safetensors_free(f);
    return rc;
}

static int inspect_index(const char *path, bool as_json)
{
    fx_safetensors_index *x;
    int rc = fx_safetensors_index_open(&x, path);
    if (rc != FX_OK) {
        cli_error("%s", fx_last_error());
        return CLI_EXIT_FAIL;
    }
    size_t n = fx_safetensors_index_count(x), ns = fx_safetensors_index_shard_count(x);
    row *rows = calloc(n ? n : 1, sizeof *rows);
    if (!rows) {
        fx_safetensors_index_free(x);
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t s;
        rows[i].v = fx_safetensors_index_tensor(x, i, &s);
        rows[i].offset = view_offset(fx_safetensors_index_shard(x, s), rows[i].v);
        rows[i].shard = fx_safetensors_index_shard_name(x, s);
    }
    int64_t params;
    uint64_t bytes;
    totals(rows, n, &params, &bytes);
    if (as_json) {
        json_t *shards = json_array();
        for (size_t s = 0; s < ns; s++) {
            const fx_safetensors *f = fx_safetensors_index_shard(x, s);
            json_array_append_new(shards, json_pack("{s:s, s:I, s:o}", "name", fx_safetensors_index_shard_name(x, s),
                                                    "tensors", (json_int_t)fx_safetensors_count(f),
                                                    "metadata", metadata_json(f)));
        }
        json_t *doc = json_pack("{s:o, s:o, s:o, s:{s:I, s:I, s:I, s:I}}", "index", path_json(path), "shards", shards,
                                "tensors", rows_json(rows, n), "totals", "tensors", (json_int_t)n, "shards",
                                (json_int_t)ns, "parameters", (json_int_t)params, "bytes", (json_int_t)bytes);
        rc = emit_json(doc);
    } else {
        printf("index: ");
        put_safe(stdout, path);
        putchar('\n');
        for (size_t s = 0; s < ns; s++) {
            const fx_safetensors *f = fx_safetensors_index_shard(x, s);
            printf("shard: ");
            put_safe(stdout, fx_safetensors_index_shard_name(x, s));
            printf(" (%zu tensor%s)\n", fx_safetensors_count(f), cli_s(fx_safetensors_count(f)));
            print_metadata_text(f, "  ");
        }
        print_table(rows, n);
        print_nonfinite(rows, n);
        printf("total: %zu tensor%s in %zu shard%s, %lld parameter%s, %llu byte%s of data\n", n, cli_s(n), ns,
               cli_s(ns), (long long)params, cli_s((uint64_t)params), (unsigned long long)bytes, cli_s(bytes));
        rc = CLI_EXIT_OK;
    }
    free(rows);
    fx_safetensors_index_free(x);
    return rc;
}

int cmd_inspect(int argc, char **argv)
{
    bool as_json = false;
    const cli_opt opts[] = {
        {"--json", CLI_FLAG, &as_json, "machine-readable output (one JSON document)"},
    };
    const char *pos[1];
    int npos = 0;
    const char *synopsis = "FILE.safetensors|INDEX.json [--json]";
    int rc = cli_parse("inspect", synopsis, argc, argv, opts, 1, pos, 1, &npos);
    if (rc == CLI_PARSE_HELP)
        return CLI_EXIT_OK;
    if (rc != CLI_PARSE_OK)
        return rc;
    if (npos != 1) {
        cli_error("inspect: expected one file");
        cli_usage(stderr, "inspect", synopsis, opts, 1);
        return CLI_EXIT_USAGE;
    }
    size_t len = strlen(pos[0]);
    bool is_index = len >= 5 && !strcmp(pos[0] + len - 5, ".json");
    return is_index ? inspect_index(pos[0], as_json) : inspect_file(pos[0], as_json);
}
