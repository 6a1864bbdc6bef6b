/* Tokenizer tests: ids and decodes against Hugging Face `tokenizers` for the fixture tokenizers
   (tests/fixtures/tokenizers, made by scripts/fixtures_tokenizers.py), invalid UTF-8, refused
   configurations, safe cuts, thread safety, the regexes' work budget, and the token file
   format. */
#include "harness.h"
#include "tmpdir.h"
#include "tokenizer/tok_internal.h"

#include <flexc/tokenizer.h>
#include <jansson.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static const char *const NAMES[] = {"gpt2", "llama3", "qwen2", "llama2", "mistral", "smollm", "metaspace"};
enum { NTOK = 7 };

static char fixture_dir[4096];

static void fixture_path(char *out, size_t cap, const char *name, const char *file)
{
    if (name)
        snprintf(out, cap, "%s/%s/%s", fixture_dir, name, file);
    else
        snprintf(out, cap, "%s/%s", fixture_dir, file);
}

static json_t *load_json(const char *path)
{
    json_error_t e;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &e);
    if (!j) {
        fprintf(stderr, "cannot read %s: %s\n", path, e.text);
        exit(1);
    }
    return j;
}

static fx_tokenizer *load_tok(const char *name)
{
    char path[4200];
    fixture_path(path, sizeof path, name, "tokenizer.json");
    fx_tokenizer *t = NULL;
    int rc = fx_tokenizer_load(&t, path);
    if (rc != FX_OK) {
        fprintf(stderr, "load %s: %s\n", path, fx_last_error());
        exit(1);
    }
    return t;
}

static size_t unhex(char *out, const char *hex)
{
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return n;
}

/* Compares got[0..n) with the json array ref; prints the first mismatch. */
static bool same_ids(const char *what, const char *name, size_t idx, const int32_t *got, int64_t n, const json_t *ref)
{
    int64_t m = (int64_t)json_array_size(ref);
    int64_t k = 0;
    while (k < n && k < m && got[k] == (int32_t)json_integer_value(json_array_get(ref, (size_t)k)))
        k++;
    if (k == n && n == m)
        return true;
    FXT_FAIL("%s: %s text %zu: %lld ids vs %lld expected; first mismatch at index %lld: %d vs %d", name, what, idx,
             (long long)n, (long long)m, (long long)k, k < n ? got[k] : -1,
             k < m ? (int)json_integer_value(json_array_get(ref, (size_t)k)) : -1);
    return false;
}

static void check_text(const char *name, size_t idx, const char *got, size_t got_len, const json_t *ref)
{
    const char *r = json_string_value(ref);
    size_t rn = json_string_length(ref);
    if (got_len == rn && !memcmp(got, r, rn))
        return;
    size_t k = 0;
    while (k < got_len && k < rn && got[k] == r[k])
        k++;
    FXT_FAIL("%s: decode %zu: %zu bytes vs %zu expected, first difference at byte %zu", name, idx, got_len, rn, k);
}

/* Every fixture text: ids equal to HF's, decode(encode(x)) equal to HF's. */
static void test_parity(void)
{
    char path[4200];
    fixture_path(path, sizeof path, NULL, "texts.json");
    json_t *texts = load_json(path);
    const json_t *tx = json_object_get(texts, "texts"), *inv = json_object_get(texts, "invalid_utf8_hex");
    FXT_CHECK(json_array_size(tx) > 300);
    for (int k = 0; k < NTOK; k++) {
        fx_tokenizer *t = load_tok(NAMES[k]);
        fixture_path(path, sizeof path, NAMES[k], "reference.json");
        json_t *ref = load_json(path);
        FXT_EQ_INT(fx_tokenizer_vocab_size(t), json_integer_value(json_object_get(ref, "vocab_size")));
        const json_t *rids = json_object_get(ref, "ids"), *rdec = json_object_get(ref, "decoded");
        int bad = 0;
        for (size_t i = 0; i < json_array_size(tx); i++) {
            const json_t *s = json_array_get(tx, i);
            fx_ids ids = {0};
            int rc = fx_tokenizer_encode(t, &ids, json_string_value(s), json_string_length(s));
            if (rc != FX_OK) {
                FXT_FAIL("%s: encode %zu: %s", NAMES[k], i, fx_last_error());
                continue;
            }
            if (!same_ids("encode", NAMES[k], i, ids.ids, ids.n, json_array_get(rids, i)))
                bad++;
            fx_text dec = {0};
            rc = fx_tokenizer_decode(t, &dec, ids.ids, ids.n);
            if (rc != FX_OK)
                FXT_FAIL("%s: decode %zu: %s", NAMES[k], i, fx_last_error());
            else
                check_text(NAMES[k], i, dec.data, dec.len, json_array_get(rdec, i));
            fx_ids_free(&ids);
            fx_text_free(&dec);
        }
        /* invalid UTF-8: as HF on bytes.decode("utf-8", "replace") */
        const json_t *rinv = json_object_get(ref, "invalid_ids");
        for (size_t i = 0; i < json_array_size(inv); i++) {
            char buf[256];
            size_t n = unhex(buf, json_string_value(json_array_get(inv, i)));
            fx_ids ids = {0};
            FXT_EQ_INT(fx_tokenizer_encode(t, &ids, buf, n), FX_OK);
            if (!same_ids("invalid utf-8", NAMES[k], i, ids.ids, ids.n, json_array_get(rinv, i)))
                bad++;
            fx_ids_free(&ids);
        }
        /* random id sequences */
        const json_t *rr = json_object_get(ref, "random_ids"), *rrd = json_object_get(ref, "random_decoded");
        for (size_t i = 0; i < json_array_size(rr); i++) {
            const json_t *a = json_array_get(rr, i);
            int32_t ids[64];
            size_t n = json_array_size(a);
            for (size_t j = 0; j < n && j < 64; j++)
                ids[j] = (int32_t)json_integer_value(json_array_get(a, j));
            fx_text dec = {0};
            if (fx_tokenizer_decode(t, &dec, ids, (int64_t)n) != FX_OK)
                FXT_FAIL("%s: decode random %zu: %s", NAMES[k], i, fx_last_error());
            else
                check_text(NAMES[k], 10000 + i, dec.data, dec.len, json_array_get(rrd, i));
            fx_text_free(&dec);
        }
        if (bad)
            fprintf(stderr, "%s: %d texts differ\n", NAMES[k], bad);
        json_decref(ref);
        fx_tokenizer_free(t);
    }
    json_decref(texts);
}

/* Encoding appends; a failure leaves the output as it was; out-of-range ids are refused. */
static void test_api(void)
{
    fx_tokenizer *t = load_tok("gpt2");
    fx_ids ids = {0};
    FXT_EQ_INT(fx_tokenizer_encode(t, &ids, "Hello", 5), FX_OK);
    int64_t n1 = ids.n;
    FXT_CHECK(n1 > 0);
    FXT_EQ_INT(fx_tokenizer_encode(t, &ids, "Hello", 5), FX_OK);
    FXT_EQ_INT(ids.n, 2 * n1);
    for (int64_t i = 0; i < n1; i++)
        FXT_EQ_INT(ids.ids[i], ids.ids[n1 + i]);
    FXT_EQ_INT(fx_tokenizer_encode(t, &ids, NULL, 0), FX_OK);
    FXT_EQ_INT(ids.n, 2 * n1);
    FXT_EQ_INT(fx_tokenizer_encode(t, NULL, "x", 1), FX_EINVAL);

    int32_t eot = fx_tokenizer_token_to_id(t, "<|endoftext|>", 13);
    FXT_EQ_INT(eot, 0);
    FXT_CHECK(fx_tokenizer_is_special(t, eot));
    FXT_CHECK(!fx_tokenizer_is_special(t, ids.ids[0]));
    size_t len = 0;
    const char *s = fx_tokenizer_id_to_token(t, eot, &len);
    FXT_CHECK(s && len == 13 && !memcmp(s, "<|endoftext|>", 13));
    FXT_CHECK(fx_tokenizer_id_to_token(t, -1, &len) == NULL);
    FXT_CHECK(fx_tokenizer_id_to_token(t, (int32_t)fx_tokenizer_vocab_size(t), &len) == NULL);
    FXT_EQ_INT(fx_tokenizer_token_to_id(t, "no such token here", 18), -1);

    fx_text out = {0};
    FXT_EQ_INT(fx_tokenizer_decode(t, &out, ids.ids, n1), FX_OK);
    FXT_EQ_STR(out.data, "Hello");
    int32_t bad[2] = {ids.ids[0], (int32_t)fx_tokenizer_vocab_size(t)};
    FXT_EQ_INT(fx_tokenizer_decode(t, &out, bad, 2), FX_ERANGE);
    FXT_EQ_STR(out.data, "Hello"); /* unchanged */
    FXT_HAS_STR(fx_last_error(), "is not a token");
    fx_text_free(&out);
    fx_ids_free(&ids);
    fx_tokenizer_free(t);
}

/* Byte-level BPE (Llama 3's ignore_merges): whole words in the vocabulary are one id. */
static void test_ignore_merges(void)
{
    fx_tokenizer *t = load_tok("llama3");
    size_t len;
    for (int32_t id = 300; id < 1500; id++) {
        const char *tok = fx_tokenizer_id_to_token(t, id, &len);
        if (!tok || len < 4 || fx_tokenizer_is_special(t, id))
            continue;
        /* a token that is itself a pre-tokenized word: " the" -> "Ġthe" */
        if (strncmp(tok, "\xc4\xa0", 2) || len < 5)
            continue;
        char word[64];
        if (len - 2 >= sizeof word - 1)
            continue;
        word[0] = ' ';
        memcpy(word + 1, tok + 2, len - 2);
        bool ascii_letters = true;
        for (size_t i = 1; i < len - 1; i++)
            ascii_letters &= (word[i] | 0x20) >= 'a' && (word[i] | 0x20) <= 'z';
        if (!ascii_letters)
            continue;
        fx_ids ids = {0};
        FXT_EQ_INT(fx_tokenizer_encode(t, &ids, word, len - 1), FX_OK);
        FXT_EQ_INT(ids.n, 1);
        FXT_EQ_INT(ids.ids[0], id);
        fx_ids_free(&ids);
    }
    fx_tokenizer_free(t);
}

static int load_str(const char *json)
{
    fx_tokenizer *t = NULL;
    int rc = fx_tokenizer_load_json(&t, json, strlen(json));
    fx_tokenizer_free(t);
    return rc;
}

/* What is refused, and that the message names the field. */
static void test_refused(void)
{
    const char *base_model = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\"]}";
    char buf[1024];
    snprintf(buf, sizeof buf, "{%s}", base_model);
    FXT_EQ_INT(load_str(buf), FX_OK);
    FXT_EQ_INT(load_str("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}"), FX_EUNSUPPORTED);
    FXT_HAS_STR(fx_last_error(), "model.type 'Unigram'");
    FXT_EQ_INT(load_str("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}"), FX_EUNSUPPORTED);
    /* The base model and one member more: the status, and what the message must name. */
    static const struct {
        const char *member;
        int status;
        const char *msg;
    } cases[] = {
        {"\"normalizer\":{\"type\":\"BertNormalizer\"}", FX_EUNSUPPORTED, "normalizer.type 'BertNormalizer'"},
        {"\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"Precompiled\"}]}",
         FX_EUNSUPPORTED, "normalizer.normalizers[1].type 'Precompiled'"},
        {"\"pre_tokenizer\":{\"type\":\"Whitespace\"}", FX_EUNSUPPORTED, "pre_tokenizer.type 'Whitespace'"},
        {"\"decoder\":{\"type\":\"WordPiece\"}", FX_EUNSUPPORTED, "decoder.type 'WordPiece'"},
        {"\"post_processor\":{\"type\":\"Mystery\"}", FX_EUNSUPPORTED, "post_processor.type 'Mystery'"},
        {"\"post_processor\":{\"type\":\"TemplateProcessing\"}", FX_OK, ""},
        {"\"truncation\":{\"max_length\":5}", FX_EUNSUPPORTED, "truncation"},
        {"\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\",\"invert\":false}",
         FX_EUNSUPPORTED, "pre_tokenizer.pattern"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(buf, sizeof buf, "{%s,%s}", base_model, cases[i].member);
        fx_clear_error();
        int rc = load_str(buf);
        if (rc != cases[i].status || !strstr(fx_last_error(), cases[i].msg))
            FXT_FAIL("case %zu (%s): %s \"%s\", expected %s naming \"%s\"", i, cases[i].member, fx_status_name(rc),
                     fx_last_error(), fx_status_name(cases[i].status), cases[i].msg);
    }
    /* A model of its own (vocabulary, merges, added tokens): the status, and what the message
       must name. */
    static const struct {
        const char *vocab, *merges, *added;
        int status;
        const char *msg;
    } models[] = {
        {"\"a\":0,\"b\":1,\"ab\":2", "[\"a b\",[\"a\",\"b\"]]", "[]", FX_OK, ""},
        {"\"a\":0", "[\"a b\"]", "[]", FX_EFORMAT, "model.merges[0]: a token of the pair is not in the vocabulary"},
        {"\"a\":0,\"b\":1", "[\"a b\"]", "[]", FX_EFORMAT, "model.merges[0]: the merged token is not in"},
        {"\"a\":0,\"b\":1,\"ab\":2", "[\"a b\",\"ab\"]", "[]", FX_EFORMAT,
         "model.merges[1] must be two tokens separated by one space"},
        {"\"a\":0,\"b\":1,\"ab\":2", "[\"a  b\"]", "[]", FX_EFORMAT, "model.merges[0] must be two tokens"},
        {"\"a\":0,\"b\":1,\"ab\":2", "[[\"a\"]]", "[]", FX_EFORMAT, "model.merges[0] must be \"a b\" or"},
        {"\"a\":0,\"b\":1,\"ab\":2", "[[\"a\",1]]", "[]", FX_EFORMAT, "model.merges[0] must be \"a b\" or"},
        {"\"a\":0,\"b\":0", "[]", "[]", FX_EFORMAT, "model.vocab: id 0 is given to two tokens"},
        {"\"a\":-1", "[]", "[]", FX_EFORMAT, "model.vocab: the id of a token must be an integer"},
        {"\"a\":0", "[]", "{}", FX_EFORMAT, "added_tokens must be an array"},
        {"\"a\":0", "[]", "[{\"id\":\"1\",\"content\":\"x\"}]", FX_EFORMAT, "added_tokens[0].id must be"},
        {"\"a\":0", "[]", "[{\"id\":1,\"content\":2}]", FX_EFORMAT, "added_tokens[0].content must be a string"},
        {"\"a\":0", "[]", "[{\"id\":1,\"content\":\"x\",\"special\":1}]", FX_EFORMAT, "added_tokens[0]"},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        snprintf(buf, sizeof buf, "{\"model\":{\"type\":\"BPE\",\"vocab\":{%s},\"merges\":%s},\"added_tokens\":%s}",
                 models[i].vocab, models[i].merges, models[i].added);
        fx_clear_error();
        int rc = load_str(buf);
        if (rc != models[i].status || !strstr(fx_last_error(), models[i].msg))
            FXT_FAIL("model %zu (%s): %s \"%s\", expected %s naming \"%s\"", i, buf, fx_status_name(rc),
                     fx_last_error(), fx_status_name(models[i].status), models[i].msg);
    }
    FXT_EQ_INT(load_str("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[],\"dropout\":0.1}}"),
               FX_EUNSUPPORTED);
    FXT_EQ_INT(load_str("not json"), FX_EFORMAT);
    FXT_EQ_INT(load_str("[]"), FX_EFORMAT);
    fx_tokenizer *t = NULL;
    FXT_EQ_INT(fx_tokenizer_load(&t, "/nonexistent/tokenizer.json"), FX_EIO);
    FXT_CHECK(t == NULL);
}

/* A tokenizer.json above the 256 MiB limit is refused from its size (a sparse file: nothing
   is written or read), naming the file, the size and the limit. */
static void test_too_large(void)
{
    char dir[512], path[600];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-tok");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    FXT_CHECK(f != NULL);
    if (f)
        fclose(f);
    FXT_CHECK(truncate(path, (off_t)300 << 20) == 0);
    fx_tokenizer *t = NULL;
    char want[700];
    snprintf(want, sizeof want, "%s: 314572800 bytes, more than the 268435456-byte (256 MiB) limit", path);
    FXT_STATUS(fx_tokenizer_load(&t, path), FX_EFORMAT, want);
    FXT_CHECK(t == NULL);
    /* One byte past the limit is enough; a small file passes the check and its contents
       decide (zero bytes: not JSON). */
    FXT_CHECK(truncate(path, ((off_t)256 << 20) + 1) == 0);
    FXT_STATUS(fx_tokenizer_load(&t, path), FX_EFORMAT, "268435457 bytes, more than the 268435456-byte");
    FXT_CHECK(truncate(path, 16) == 0);
    FXT_STATUS(fx_tokenizer_load(&t, path), FX_EFORMAT, "not valid JSON");
    FXT_CHECK(t == NULL);
    fxt_rm_tree(dir);
}

/* A hand-made tokenizer: merges in the pair encoding, lstrip/rstrip, unk fusing, byte fallback
   flushing order, and Strip/Lowercase normalizers. */
static void test_small(void)
{
    const char *json =
        "{\"added_tokens\":[{\"id\":6,\"content\":\"[M]\",\"lstrip\":true,\"rstrip\":true,\"special\":true,"
        "\"normalized\":false,\"single_word\":false}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Strip\",\"strip_left\":true,"
        "\"strip_right\":true},{\"type\":\"Lowercase\"}]},"
        "\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"String\":\" \"},\"behavior\":\"Removed\",\"invert\":false},"
        "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
        "\"vocab\":{\"<unk>\":0,\"a\":1,\"b\":2,\"ab\":3,\"c\":4,\"abc\":5},\"merges\":[[\"a\",\"b\"],[\"ab\",\"c\"]]}}";
    fx_tokenizer *t = NULL;
    FXT_EQ_INT(fx_tokenizer_load_json(&t, json, strlen(json)), FX_OK);
    if (!t)
        return;
    fx_ids ids = {0};
    const char *text = "  ABC abx  [M]  xyz ab ";
    FXT_EQ_INT(fx_tokenizer_encode(t, &ids, text, strlen(text)), FX_OK);
    /* "abc" -> abc; "abx" -> ab <unk>; [M] eats the spaces on both sides; "xyz" -> one fused
       <unk>; "ab" -> ab */
    const int32_t want[] = {5, 3, 0, 6, 0, 3};
    FXT_EQ_INT(ids.n, 6);
    for (int i = 0; i < 6 && i < ids.n; i++)
        FXT_EQ_INT(ids.ids[i], want[i]);
    fx_text out = {0};
    FXT_EQ_INT(fx_tokenizer_decode(t, &out, ids.ids, ids.n), FX_OK);
    FXT_EQ_STR(out.data, "abc ab <unk> [M] <unk> ab"); /* no decoder: joined by spaces */
    fx_text_free(&out);
    fx_ids_free(&ids);
    fx_tokenizer_free(t);
}

/* Encoding in pieces cut where fx_tokenizer_safe_cut() says gives the ids of the whole. */
static void test_safe_cut(void)
{
    char path[4200];
    fixture_path(path, sizeof path, NULL, "texts.json");
    json_t *texts = load_json(path);
    const json_t *tx = json_object_get(texts, "texts");
    size_t cap = 1 << 20, n = 0;
    char *all = malloc(cap);
    for (size_t i = 0; i < json_array_size(tx) && n + 8192 < cap; i++) {
        const json_t *s = json_array_get(tx, i);
        size_t len = json_string_length(s);
        if (len > 4000)
            continue;
        memcpy(all + n, json_string_value(s), len);
        n += len;
        const char *sep = (i % 3 == 0) ? ".\nA" : (i % 3 == 1) ? " \n\nb" : "x\nZ";
        memcpy(all + n, sep, strlen(sep));
        n += strlen(sep);
    }
    for (int k = 0; k < NTOK; k++) {
        fx_tokenizer *t = load_tok(NAMES[k]);
        fx_ids whole = {0}, parts = {0};
        FXT_EQ_INT(fx_tokenizer_encode(t, &whole, all, n), FX_OK);
        size_t done = 0, cuts = 0;
        while (done < n) {
            size_t want = n - done > 997 ? 997 : n - done;
            size_t c = want == n - done ? want : fx_tokenizer_safe_cut(t, all + done, want);
            if (c == 0)
                c = n - done; /* no cut: the rest whole */
            else if (c < want || want < n - done)
                cuts++;
            FXT_EQ_INT(fx_tokenizer_encode(t, &parts, all + done, c), FX_OK);
            done += c;
        }
        /* Llama 3, Qwen2 and SmolLM cut; GPT-2's fixture has an lstrip token (<mask>) and the
           SentencePiece-style ones prepend, so they never do. */
        if (k == 1 || k == 2 || k == 5)
            FXT_CHECK(cuts > 5);
        else
            FXT_EQ_INT(cuts, 0);
        int64_t i = 0;
        while (i < whole.n && i < parts.n && whole.ids[i] == parts.ids[i])
            i++;
        if (i != whole.n || whole.n != parts.n)
            FXT_FAIL("%s: cut encoding differs at id %lld (%lld vs %lld ids)", NAMES[k], (long long)i,
                     (long long)parts.n, (long long)whole.n);
        fx_ids_free(&whole);
        fx_ids_free(&parts);
        fx_tokenizer_free(t);
    }
    free(all);
    json_decref(texts);
}

/* Threads sharing one tokenizer get the ids a lone caller gets. */
typedef struct thread_arg {
    fx_tokenizer *t;
    const char *text;
    size_t len;
    const fx_ids *want;
    int bad;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    for (int r = 0; r < 20; r++) {
        fx_ids ids = {0};
        if (fx_tokenizer_encode(a->t, &ids, a->text, a->len) != FX_OK || ids.n != a->want->n ||
            memcmp(ids.ids, a->want->ids, (size_t)ids.n * 4))
            a->bad++;
        fx_ids_free(&ids);
    }
    return NULL;
}

static void test_threads(void)
{
    fx_tokenizer *t = load_tok("qwen2");
    char text[8192];
    size_t n = 0;
    const char *words[] = {"Hello ", "wörld ", "数据 ", "<|im_end|>", "\n\n", "123456 ", "  x"};
    for (int i = 0; n + 32 < sizeof text; i++) {
        const char *w = words[(i * 7 + i / 3) % 7];
        memcpy(text + n, w, strlen(w));
        n += strlen(w);
    }
    fx_ids want = {0};
    FXT_EQ_INT(fx_tokenizer_encode(t, &want, text, n), FX_OK);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, text, n, &want, 0};
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        FXT_EQ_INT(args[i].bad, 0);
    }
    fx_ids_free(&want);
    fx_tokenizer_free(t);
}

/* ---- token files ------------------------------------------------------------------------------ */

static void tmp_path(char *out, size_t cap, const char *name)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(out, cap, "%s/fx_tok_%d_%s", base, (int)getpid(), name);
}

static void write_raw(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void test_token_file(void)
{
    char path[512];
    tmp_path(path, sizeof path, "tokens.bin");
    for (int wide = 0; wide < 2; wide++) {
        int64_t vocab = wide ? 128256 : 50257;
        fx_token_writer *w = NULL;
        FXT_EQ_INT(fx_token_writer_open(&w, path, vocab), FX_OK);
        int32_t ids[1000];
        for (int i = 0; i < 1000; i++)
            ids[i] = (int32_t)((i * 7919LL) % vocab);
        ids[999] = (int32_t)vocab - 1;
        for (int r = 0; r < 70; r++)
            FXT_EQ_INT(fx_token_writer_append(w, ids, 1000), FX_OK);
        int32_t bad = (int32_t)vocab;
        FXT_EQ_INT(fx_token_writer_append(w, &bad, 1), FX_ERANGE);
        FXT_EQ_INT(fx_token_writer_count(w), 70000);
        FXT_EQ_INT(fx_token_writer_close(w), FX_OK);

        FILE *f = fopen(path, "rb");
        int32_t head[256];
        FXT_CHECK(fread(head, 4, 256, f) == 256);
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        fclose(f);
        FXT_EQ_INT(head[0], wide ? 20240801 : 20240520);
        FXT_EQ_INT(head[1], wide ? 7 : 1);
        FXT_EQ_INT(head[2], 70000);
        FXT_EQ_INT(size, 1024 + 70000 * (wide ? 4 : 2));

        fx_ids got = {0};
        FXT_EQ_INT(fx_tokens_load(&got, path, vocab), FX_OK);
        FXT_EQ_INT(got.n, 70000);
        int mism = -1;
        for (int64_t i = 0; i < got.n && mism < 0; i++)
            if (got.ids[i] != ids[i % 1000])
                mism = (int)i;
        FXT_EQ_INT(mism, -1);
        /* a smaller vocabulary than the file's tokens */
        FXT_EQ_INT(fx_tokens_load(&got, path, vocab - 1), FX_EFORMAT);
        FXT_HAS_STR(fx_last_error(), "outside the vocabulary");
        FXT_EQ_INT(got.n, 70000); /* unchanged */
        fx_ids_free(&got);
    }
    /* malformed files: a good 3-token file, then changes to it; a failed load keeps `got` */
    static const struct {
        int32_t magic, version, count;
        size_t size;
        int status;
        const char *msg;
    } files[] = {
        {20240520, 1, 3, 1024 + 6, FX_OK, ""},
        {20240520, 1, 3, 1024 + 5, FX_EFORMAT, "header says 3 tokens"},
        {12345, 1, 3, 1024 + 6, FX_EFORMAT, "magic 12345"},
        {20240520, 7, 3, 1024 + 6, FX_EFORMAT, "version 7"},
        {20240520, 1, -1, 1024 + 6, FX_EFORMAT, ""},
        {20240520, 1, -1, 100, FX_EFORMAT, "header"},
    };
    unsigned char file[1024 + 6] = {0};
    fx_ids got = {0};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const int32_t head[256] = {files[i].magic, files[i].version, files[i].count};
        memcpy(file, head, 1024);
        write_raw(path, file, files[i].size);
        fx_clear_error();
        int rc = fx_tokens_load(&got, path, 0);
        if (rc != files[i].status || !strstr(fx_last_error(), files[i].msg))
            FXT_FAIL("file %zu: %s \"%s\", expected %s naming \"%s\"", i, fx_status_name(rc), fx_last_error(),
                     fx_status_name(files[i].status), files[i].msg);
        FXT_EQ_INT(got.n, 3);
    }
    fx_ids_free(&got);
    unlink(path);
    FXT_EQ_INT(fx_tokens_load(&got, path, 0), FX_EIO);
    /* an aborted writer leaves nothing */
    fx_token_writer *w = NULL;
    FXT_EQ_INT(fx_token_writer_open(&w, path, 100), FX_OK);
    fx_token_writer_abort(w);
    FXT_CHECK(access(path, F_OK) != 0);
    FXT_EQ_INT(fx_token_writer_open(&w, path, 0), FX_EINVAL);
}

/* ---- the regexes' work budget ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The fixture texts joined and repeated to n bytes (cut at a character boundary). */
static char *mixed_text(size_t n)
{
    char path[4200];
    fixture_path(path, sizeof path, NULL, "texts.json");
    json_t *texts = load_json(path);
    const json_t *tx = json_object_get(texts, "texts");
    char *out = malloc(n + 1);
    size_t k = 0;
    while (k < n) {
        for (size_t i = 0; i < json_array_size(tx) && k < n; i++) {
            const json_t *t = json_array_get(tx, i);
            size_t len = json_string_length(t);
            size_t take = len < n - k ? len : n - k;
            memcpy(out + k, json_string_value(t), take);
            k += take;
        }
    }
    while (k > 0 && ((unsigned char)out[k - 1] & 0xc0) == 0x80)
        k--; /* a cut character: drop its start too */
    if (k > 0 && (unsigned char)out[k - 1] >= 0xc0)
        k--;
    memset(out + k, ' ', n - k);
    out[n] = '\0';
    json_decref(texts);
    return out;
}

/* Texts the family patterns backtrack on most: long runs of one class, whitespace before a
   letter or line feeds, punctuation before line feeds, apostrophes, digits, random characters. */
static const char *const EDGE_UNITS[] = {
    " ", "\n", " \n", "\t \r\n", "  \n \n a", "!!", "!\n", "'s", "'", "1", "12345 ", "a", "a ", " !",
    "\xc3\xa9", "e\xcc\x81", "\xe6\x95\xb0", " \xe2\x80\x83", "\r",
};

static char *edge_text(size_t unit, size_t n, unsigned seed)
{
    char *out = malloc(n + 1);
    size_t k = 0;
    if (unit < sizeof EDGE_UNITS / sizeof *EDGE_UNITS) {
        const char *u = EDGE_UNITS[unit];
        size_t ul = strlen(u);
        while (k + ul <= n) {
            memcpy(out + k, u, ul);
            k += ul;
        }
    } else { /* random units, runs of random length */
        while (k < n) {
            seed = seed * 1103515245u + 12345u;
            const char *u = EDGE_UNITS[(seed >> 16) % (sizeof EDGE_UNITS / sizeof *EDGE_UNITS)];
            size_t ul = strlen(u), reps = 1 + ((seed >> 8) & 0xff) * ((seed & 1) ? 64 : 1);
            for (size_t r = 0; r < reps && k + ul <= n; r++, k += ul)
                memcpy(out + k, u, ul);
            if (k + ul > n)
                break;
        }
    }
    memset(out + k, 'x', n - k);
    out[n] = '\0';
    return out;
}

/* One pass of a pattern over s[0 .. n), as the pre-tokenizer splits: its status and work. */
static int regex_pass(const fx__regex *re, fx__matcher *m, const char *s, size_t n, uint64_t *work)
{
    fx__matcher_reset(m);
    fx__matcher_add(m, n);
    size_t pos = 0, ms, me;
    int rc;
    while ((rc = fx__regex_next(re, m, s, n, pos, &ms, &me)) == FX_OK) {
        if (me > ms)
            pos = me;
        else if (me < n)
            pos = me + fx__utf8_len((unsigned char)s[me]);
        else
            break;
    }
    *work = m->work;
    return rc == 1 ? FX_OK : rc;
}

/* The family patterns (fx__family_patterns, which run uncounted), counted: their work stays
   within 32 steps a byte on long texts of every kind (20 at most today), far below the budget
   of 256 a byte, so that the budget would never refuse a real text. Llama 3's and Qwen2's are
   those of the fixtures. */
static void test_regex_cost(void)
{
    for (int k = 0; k < 2; k++) {
        char path[4200];
        fixture_path(path, sizeof path, k ? "qwen2" : "llama3", "tokenizer.json");
        json_t *doc = load_json(path);
        const json_t *pres = json_object_get(json_object_get(doc, "pre_tokenizer"), "pretokenizers");
        const json_t *rx = json_object_get(json_object_get(json_array_get(pres, 0), "pattern"), "Regex");
        FXT_CHECK(rx && !strcmp(json_string_value(rx), fx__family_patterns[1 + k]));
        json_decref(doc);
    }
    fx__matcher m;
    FXT_OK(fx__matcher_init(&m));
    const size_t n = (size_t)1 << 18, nunits = sizeof EDGE_UNITS / sizeof *EDGE_UNITS;
    for (int p = 0; p < FX__FAMILY_PATTERNS; p++) {
        const char *pat = fx__family_patterns[p];
        fx__regex re;
        FXT_OK(fx__regex_init(&re, pat, strlen(pat), false, true, "test"));
        double mixed = 0, worst = 0;
        size_t worst_u = 0;
        for (size_t u = 0; u <= nunits + 3; u++) {
            size_t len = u == 0 ? (size_t)1 << 20 : n; /* (the fixture texts hold NUL bytes) */
            char *s = u == 0 ? mixed_text(len) : edge_text(u - 1, n, (unsigned)u);
            uint64_t work = 0;
            FXT_OK(regex_pass(&re, &m, s, len, &work));
            double per_byte = (double)work / (double)len;
            if (u == 0)
                mixed = per_byte;
            else if (per_byte > worst)
                worst = per_byte, worst_u = u - 1;
            if (per_byte > 32)
                FXT_FAIL("pattern %d on text %zu: %.2f steps a byte", p, u, per_byte);
            free(s);
        }
        fprintf(stderr, "    family pattern %d: %.2f steps a byte on mixed text, at most %.2f (edge text %zu)\n", p,
                mixed, worst, worst_u);
        fx__regex_free(&re);
    }
    fx__matcher_free(&m);
}

/* A copy of fixture `name` whose first Split pattern (or ByteLevel's built-in one, made a
   Split) starts with "(?:)": the same matches, but not a known pattern, so its work is counted. */
static fx_tokenizer *counted_variant(const char *name)
{
    char path[4200];
    fixture_path(path, sizeof path, name, "tokenizer.json");
    json_t *doc = load_json(path);
    json_t *pre = json_object_get(doc, "pre_tokenizer");
    json_t *list = json_object_get(pre, "pretokenizers");
    json_t *first = list ? json_array_get(list, 0) : pre;
    json_t *bl = !strcmp(json_string_value(json_object_get(first, "type")), "ByteLevel") ? first : NULL;
    if (list && !bl)
        bl = json_array_get(list, 1);
    char pat[512];
    if (json_is_true(json_object_get(bl, "use_regex"))) { /* GPT-2, SmolLM */
        snprintf(pat, sizeof pat, "(?:)%s", fx__family_patterns[0]);
        json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", pat, "behavior",
                                  "Isolated", "invert", 0);
        json_object_set_new(bl, "use_regex", json_false());
        if (list) {
            json_array_insert_new(list, 1, split);
        } else {
            json_t *seq = json_pack("{s:s, s:[o, O]}", "type", "Sequence", "pretokenizers", split, bl);
            json_object_set_new(doc, "pre_tokenizer", seq);
        }
    } else {
        json_t *rx = json_object_get(json_object_get(first, "pattern"), "Regex");
        snprintf(pat, sizeof pat, "(?:)%s", json_string_value(rx));
        json_string_set(rx, pat);
    }
    char *text = json_dumps(doc, JSON_COMPACT);
    fx_tokenizer *t = NULL;
    if (fx_tokenizer_load_json(&t, text, strlen(text)) != FX_OK)
        FXT_FAIL("%s variant: %s", name, fx_last_error());
    free(text);
    json_decref(doc);
    return t;
}

/* 1 MB of mixed text and 256 KB of each edge text encode quickly with every fixture; with the
   family patterns counted, the ids are the same (counting changes no match) and no budget is
   exceeded. */
static void test_long_inputs(void)
{
    const size_t nunits = sizeof EDGE_UNITS / sizeof *EDGE_UNITS;
    char *texts[32];
    size_t lens[32], ntexts = nunits + 2;
    lens[0] = (size_t)1 << 20;
    texts[0] = mixed_text(lens[0]);
    for (size_t u = 0; u <= nunits; u++) {
        lens[1 + u] = (size_t)1 << 18;
        texts[1 + u] = edge_text(u, lens[1 + u], 7);
    }
    for (int k = 0; k < NTOK; k++) {
        fx_tokenizer *t = load_tok(NAMES[k]);
        bool variant = k == 0 || k == 1 || k == 2 || k == 5; /* the Split and ByteLevel patterns */
        fx_tokenizer *v = variant ? counted_variant(NAMES[k]) : NULL;
        double t0 = now_s();
        for (size_t i = 0; i < ntexts; i++) {
            fx_ids a = {0}, b = {0};
            size_t len = lens[i];
            int rc = fx_tokenizer_encode(t, &a, texts[i], len);
            if (rc != FX_OK)
                FXT_FAIL("%s: long text %zu: %s", NAMES[k], i, fx_last_error());
            if (v && (rc = fx_tokenizer_encode(v, &b, texts[i], len)) != FX_OK)
                FXT_FAIL("%s counted: long text %zu: %s", NAMES[k], i, fx_last_error());
            if (v && rc == FX_OK && (a.n != b.n || memcmp(a.ids, b.ids, (size_t)a.n * sizeof *a.ids)))
                FXT_FAIL("%s: long text %zu: %lld ids, %lld counted, or different", NAMES[k], i, (long long)a.n,
                         (long long)b.n);
            fx_ids_free(&a);
            fx_ids_free(&b);
        }
        double dt = now_s() - t0;
        if (dt > 10)
            FXT_FAIL("%s: the long texts took %.1f s", NAMES[k], dt);
        fx_tokenizer_free(v);
        fx_tokenizer_free(t);
    }
    for (size_t i = 0; i < ntexts; i++)
        free(texts[i]);
}

/* A tokenizer.json whose `where` ("pre_tokenizer": a Split, "normalizer": a Replace) has the
   given regex (JSON-escaped), over a small vocabulary. */
static void hostile_json(char *out, size_t cap, const char *where, const char *regex)
{
    char comp[512];
    snprintf(comp, sizeof comp, "{\"type\":\"%s\",\"pattern\":{\"Regex\":\"%s\"}%s}",
             !strcmp(where, "pre_tokenizer") ? "Split" : "Replace", regex,
             !strcmp(where, "pre_tokenizer") ? ",\"behavior\":\"Isolated\",\"invert\":false" : ",\"content\":\"b\"");
    snprintf(out, cap,
             "{\"%s\":%s,\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"!\":2,\" \":3,\"w\":4,\"o\":5,"
             "\"r\":6,\"d\":7},\"merges\":[]}}",
             where, comp);
}

/* Catastrophic patterns (exponential backtracking, a scan to the end at every position, each
   start position just under PCRE2's own match limit) fail with FX_EFORMAT naming the file and
   the pattern, in well under a second, instead of running for seconds to hours; the output is
   unchanged. Their outcome on each text: 0 encodes, 1 over the work budget, 2 over the
   backtracking depth limit. */
static void test_regex_budget(void)
{
    static const struct {
        const char *regex; /* as JSON */
        int want[2];       /* on the a's, on the runs */
    } cases[] = {
        {"(a+)+$", {1, 1}},                      /* runs: 7 s before */
        {"(\\\\w+\\\\s?)*$", {1, 2}},
        {"\\\\w(?=\\\\w*$)|\\\\s", {1, 0}},      /* a's: more than a minute before */
        {"(a|aa)*\\\\d|.", {2, 1}},
    };
    const size_t n = 100000;
    char *as = malloc(n + 2), *runs = malloc(n + 1);
    memset(as, 'a', n);
    memcpy(as + n, "!", 2);
    for (size_t i = 0; i < n; i++)
        runs[i] = i % 19 == 18 ? ' ' : 'a'; /* runs of 18 a's */
    runs[n] = '\0';
    char dir[512], path[600], json[1024], want[800];
    fxt_make_tmpdir(dir, sizeof dir, "flexc-tok");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    for (size_t r = 0; r < sizeof cases / sizeof *cases; r++) {
        hostile_json(json, sizeof json, "pre_tokenizer", cases[r].regex);
        write_raw(path, json, strlen(json));
        fx_tokenizer *t = NULL;
        FXT_OK(fx_tokenizer_load(&t, path));
        if (!t)
            continue;
        fx_ids ids = {0};
        FXT_OK(fx_tokenizer_encode(t, &ids, "a a!", 4)); /* a short text is fine */
        int64_t n0 = ids.n;
        for (int which = 0; which < 2; which++) {
            const char *text = which ? runs : as;
            size_t len = strlen(text);
            int w = cases[r].want[which];
            snprintf(want, sizeof want, "%s: pre_tokenizer.pattern: the regex exceeded its %s on %zu bytes of text",
                     path, w == 1 ? "work budget" : "backtracking limit", len);
            double t0 = now_s();
            if (w == 0)
                FXT_OK(fx_tokenizer_encode(t, &ids, text, len));
            else
                FXT_STATUS(fx_tokenizer_encode(t, &ids, text, len), FX_EFORMAT, want);
            double dt = now_s() - t0;
            if (w)
                FXT_EQ_INT(ids.n, n0);
            if (dt > 5)
                FXT_FAIL("regex %zu on text %d: %.2f s", r, which, dt);
            ids.n = n0;
        }
        fx_ids_free(&ids);
        fx_tokenizer_free(t);
    }
    /* A normalizer's and a decoder's pattern too; loaded from memory, named by its field. */
    fx_tokenizer *t = NULL;
    hostile_json(json, sizeof json, "normalizer", "(a+)+$");
    FXT_OK(fx_tokenizer_load_json(&t, json, strlen(json)));
    fx_ids ids = {0};
    FXT_STATUS(fx_tokenizer_encode(t, &ids, as, n + 1), FX_EFORMAT,
               "normalizer.pattern: the regex exceeded its work budget on 100001 bytes of text");
    FXT_EQ_INT(ids.n, 0);
    fx_tokenizer_free(t);
    hostile_json(json, sizeof json, "pre_tokenizer", "(a+)+$");
    FXT_OK(fx_tokenizer_load_json(&t, json, strlen(json)));
    FXT_STATUS(fx_tokenizer_encode(t, &ids, as, n + 1), FX_EFORMAT,
               "pre_tokenizer.pattern: the regex exceeded its work budget on 100001 bytes of text (25604352 steps: "
               "4096 + 256 a byte");
    fx_tokenizer_free(t);
    snprintf(json, sizeof json,
             "{\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Replace\","
             "\"pattern\":{\"Regex\":\"(a+)+$\"},\"content\":\"b\"}]},\"model\":{\"type\":\"BPE\","
             "\"vocab\":{\"a\":0,\"!\":1},\"merges\":[]}}");
    FXT_OK(fx_tokenizer_load_json(&t, json, strlen(json)));
    int32_t *many = malloc(20001 * sizeof *many);
    for (int i = 0; i < 20001; i++)
        many[i] = i < 20000 ? 0 : 1;
    fx_text out = {0};
    double t0 = now_s();
    FXT_STATUS(fx_tokenizer_decode(t, &out, many, 20001), FX_EFORMAT,
               "decoder.decoders[1].pattern: the regex exceeded its work budget on 20001 bytes of text");
    FXT_CHECK(now_s() - t0 < 2);
    fx_text_free(&out);
    free(many);
    fx_tokenizer_free(t);
    free(as);
    free(runs);
    fxt_rm_tree(dir);
}

int main(int argc, char **argv)
{
    const char *src = getenv("FLEXC_SOURCE_DIR");
    snprintf(fixture_dir, sizeof fixture_dir, "%s/tests/fixtures/tokenizers", src ? src : ".");
    FXT_INIT(argc, argv);
    FXT_RUN(test_parity);
    FXT_RUN(test_api);
    FXT_RUN(test_ignore_merges);
    FXT_RUN(test_refused);
    FXT_RUN(test_too_large);
    FXT_RUN(test_small);
    FXT_RUN(test_safe_cut);
    FXT_RUN(test_threads);
    FXT_RUN(test_regex_cost);
    FXT_RUN(test_long_inputs);
    FXT_RUN(test_regex_budget);
    FXT_RUN(test_token_file);
    return fxt_finish();
}
