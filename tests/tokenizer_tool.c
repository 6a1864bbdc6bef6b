/* The C side of the Python tokenizer scripts (bench/tokenizer_parity.py, bench/tokenizer_vs_hf.py):
     tokenizer_tool encode TOKENIZER.json IN.json OUT.json
         IN: {"texts": [...], "hex": [...]} (hex: byte strings, may be invalid UTF-8)
         OUT: {"ids": [[...], ...], "decoded": [...], "hex_ids": [[...], ...]}
     tokenizer_tool time TOKENIZER.json DOCS
         encodes each document of DOCS (separated by the byte 0x1e) once, prints
         {"seconds": s, "bytes": b, "tokens": n} (loading not included) */
#include <flexc.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void die(const char *what)
{
    fprintf(stderr, "tokenizer_tool: %s: %s\n", what, fx_last_error());
    exit(1);
}

static json_t *ids_json(const fx_ids *ids)
{
    json_t *a = json_array();
    for (int64_t i = 0; i < ids->n; i++)
        json_array_append_new(a, json_integer(ids->ids[i]));
    return a;
}

static int cmd_encode(const fx_tokenizer *t, const char *in_path, const char *out_path)
{
    json_error_t e;
    json_t *in = json_load_file(in_path, JSON_ALLOW_NUL, &e);
    if (!in) {
        fprintf(stderr, "tokenizer_tool: %s: %s\n", in_path, e.text);
        return 1;
    }
    json_t *out = json_object(), *all = json_array(), *dec = json_array(), *hex_ids = json_array();
    const json_t *texts = json_object_get(in, "texts"), *hex = json_object_get(in, "hex");
    for (size_t i = 0; i < json_array_size(texts); i++) {
        const json_t *s = json_array_get(texts, i);
        fx_ids ids = {0};
        fx_text text = {0};
        if (fx_tokenizer_encode(t, &ids, json_string_value(s), json_string_length(s)) != FX_OK)
            die("encode");
        if (fx_tokenizer_decode(t, &text, ids.ids, ids.n) != FX_OK)
            die("decode");
        json_array_append_new(all, ids_json(&ids));
        json_array_append_new(dec, json_stringn(text.data ? text.data : "", text.len));
        fx_ids_free(&ids);
        fx_text_free(&text);
    }
    for (size_t i = 0; i < json_array_size(hex); i++) {
        const char *h = json_string_value(json_array_get(hex, i));
        size_t n = strlen(h) / 2;
        char *b = malloc(n + 1);
        for (size_t k = 0; k < n; k++) {
            unsigned v;
            sscanf(h + 2 * k, "%2x", &v);
            b[k] = (char)v;
        }
        fx_ids ids = {0};
        if (fx_tokenizer_encode(t, &ids, b, n) != FX_OK)
            die("encode");
        json_array_append_new(hex_ids, ids_json(&ids));
        fx_ids_free(&ids);
        free(b);
    }
    json_object_set_new(out, "ids", all);
    json_object_set_new(out, "decoded", dec);
    json_object_set_new(out, "hex_ids", hex_ids);
    int rc = json_dump_file(out, out_path, JSON_COMPACT);
    json_decref(out);
    json_decref(in);
    return rc ? 1 : 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmd_time(const fx_tokenizer *t, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "tokenizer_tool: cannot read %s\n", path);
        return 1;
    }
    fclose(f);
    fx_ids ids = {0};
    int64_t tokens = 0;
    double t0 = now_s();
    for (long i = 0; i < n;) {
        char *end = memchr(buf + i, 0x1e, (size_t)(n - i));
        long j = end ? (long)(end - buf) : n;
        ids.n = 0;
        if (fx_tokenizer_encode(t, &ids, buf + i, (size_t)(j - i)) != FX_OK)
            die("encode");
        tokens += ids.n;
        i = j + 1;
    }
    double dt = now_s() - t0;
    printf("{\"seconds\": %.6f, \"bytes\": %ld, \"tokens\": %lld}\n", dt, n, (long long)tokens);
    fx_ids_free(&ids);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "encode") && strcmp(argv[1], "time")) || (!strcmp(argv[1], "encode") && argc < 5)) {
        fprintf(stderr, "usage: tokenizer_tool encode TOKENIZER.json IN.json OUT.json | time TOKENIZER.json DOCS\n");
        return 2;
    }
    fx_tokenizer *t;
    if (fx_tokenizer_load(&t, argv[2]) != FX_OK)
        die("load");
    int rc = !strcmp(argv[1], "encode") ? cmd_encode(t, argv[3], argv[4]) : cmd_time(t, argv[3]);
    fx_tokenizer_free(t);
    return rc;
}
