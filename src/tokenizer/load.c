/* Loading a tokenizer.json: the BPE model (vocabulary, merges in either encoding), added
   tokens, normalizers, pre-tokenizers, decoder; anything else is refused by name. */
#include "tok_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The pattern ByteLevel splits with when use_regex is set (GPT-2's). */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const fx__family_patterns[FX__FAMILY_PATTERNS] = {
    GPT2_PATTERN,
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    "\\p{N}",
};

/* ---- json helpers --------------------------------------------------------------------------- */

static const char *type_of(const json_t *o)
{
    const json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

/* A boolean member; absent or null: dflt. */
static int get_bool(bool *out, const json_t *o, const char *key, bool dflt, const char *where)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = dflt;
        return FX_OK;
    }
    if (!json_is_boolean(v))
        return fx__error(FX_EFORMAT, "%s.%s must be true or false", where, key);
    *out = json_is_true(v);
    return FX_OK;
}

/* A string member (may hold NUL bytes): *s points into the json, *n its length. */
static int get_str(const char **s, size_t *n, const json_t *o, const char *key, bool required, const char *where)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return fx__error(FX_EFORMAT, "%s.%s is missing", where, key);
        *s = NULL;
        *n = 0;
        return FX_OK;
    }
    if (!json_is_string(v))
        return fx__error(FX_EFORMAT, "%s.%s must be a string", where, key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return FX_OK;
}

static char *dup_bytes(const char *s, size_t n)
{
    char *d = fx__alloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* A required string member, copied (NUL-terminated, owned by the caller) into *out. */
static int get_str_copy(char **out, size_t *len, const json_t *o, const char *key, const char *where)
{
    const char *s;
    int rc = get_str(&s, len, o, key, true, where);
    if (rc == FX_OK && !(*out = dup_bytes(s, *len)))
        rc = FX_ENOMEM;
    return rc;
}

/* The index of s in names[0..n), or -1. */
static int name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

static bool known_pattern(const char *s, size_t n)
{
    for (size_t i = 0; i < FX__FAMILY_PATTERNS; i++)
        if (n == strlen(fx__family_patterns[i]) && !memcmp(s, fx__family_patterns[i], n))
            return true;
    return false;
}

/* {"String": s} or {"Regex": r} */
static int get_pattern(fx__regex *re, const json_t *o, const char *where)
{
    char field[96];
    snprintf(field, sizeof field, "%s.pattern", where);
    const json_t *p = json_object_get(o, "pattern");
    if (!json_is_object(p))
        return fx__error(FX_EFORMAT, "%s must be {\"String\": ...} or {\"Regex\": ...}", field);
    const json_t *str = json_object_get(p, "String"), *rx = json_object_get(p, "Regex");
    if (json_is_string(str))
        return fx__regex_init(re, json_string_value(str), json_string_length(str), true, false, field);
    if (json_is_string(rx))
        return fx__regex_init(re, json_string_value(rx), json_string_length(rx), false,
                              !known_pattern(json_string_value(rx), json_string_length(rx)), field);
    return fx__error(FX_EFORMAT, "%s must be {\"String\": ...} or {\"Regex\": ...}", field);
}

/* A single character (Metaspace's replacement, Strip's content). */
static int get_char(int32_t *c, const json_t *o, const char *key, const char *where)
{
    const char *s;
    size_t n;
    int rc = get_str(&s, &n, o, key, true, where);
    if (rc != FX_OK)
        return rc;
    size_t k;
    if (n == 0 || fx__utf8_valid_prefix(s, n) != n || (fx__utf8_get(s, &k), k != n))
        return fx__error(FX_EFORMAT, "%s.%s must be one character", where, key);
    *c = fx__utf8_get(s, &k);
    return FX_OK;
}

static int get_prepend_scheme(fx__prepend *p, const json_t *o, const char *where)
{
    const json_t *v = json_object_get(o, "prepend_scheme");
    if (json_is_string(v)) {
        static const char *const names[] = {"always", "first", "never"}; /* fx__prepend's order */
        const char *s = json_string_value(v);
        int k = name_index(names, 3, s);
        if (k < 0)
            return fx__error(FX_EUNSUPPORTED, "%s.prepend_scheme '%s' is not supported", where, s);
        *p = (fx__prepend)k;
        return FX_OK;
    }
    /* Older files: add_prefix_space (true: always). */
    bool add = true;
    int rc = get_bool(&add, o, "add_prefix_space", true, where);
    *p = add ? FX__PREPEND_ALWAYS : FX__PREPEND_NEVER;
    return rc;
}

/* ---- pipeline components ---------------------------------------------------------------------- */

/* Normalizers, pre-tokenizers, decoders and post-processors: each reads one component `o`
   into t, named `where` in messages (*cap: the capacity of t's array for that stage). */
typedef int (*component_fn)(fx_tokenizer *t, const json_t *o, const char *where, size_t *cap);

/* A "Sequence" component: each member of its array `key`, in order, read by add. */
static int add_sequence(fx_tokenizer *t, const json_t *o, const char *key, const char *where, size_t *cap,
                        component_fn add)
{
    const json_t *list = json_object_get(o, key);
    if (!json_is_array(list))
        return fx__error(FX_EFORMAT, "%s.%s must be an array", where, key);
    for (size_t i = 0; i < json_array_size(list); i++) {
        char sub[96];
        snprintf(sub, sizeof sub, "%s.%s[%zu]", where, key, i);
        int rc = add(t, json_array_get(list, i), sub, cap);
        if (rc != FX_OK)
            return rc;
    }
    return FX_OK;
}

/* Room for one more element in p, an array of n elements of `size` bytes and capacity *cap:
   p itself, or a copy twice as large (p freed), or NULL when out of memory. */
static void *reserve_one(void *p, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return p;
    size_t ncap = *cap ? *cap * 2 : 4;
    void *grown = fx__calloc(ncap, size);
    if (!grown)
        return NULL;
    if (n)
        memcpy(grown, p, n * size);
    fx__free(p);
    *cap = ncap;
    return grown;
}

/* A component must be an object with a "type". A "Sequence" (its members listed under `key`)
   is read whole here, each member through add, and *type comes back NULL. */
static int component_type(const char **type, fx_tokenizer *t, const json_t *o, const char *where, size_t *cap,
                          const char *key, component_fn add)
{
    if (!json_is_object(o))
        return fx__error(FX_EFORMAT, "%s must be an object", where);
    *type = type_of(o);
    if (!*type)
        return fx__error(FX_EFORMAT, "%s.type is missing", where);
    if (strcmp(*type, "Sequence"))
        return FX_OK;
    *type = NULL;
    return add_sequence(t, o, key, where, cap, add);
}

/* ---- normalizers ---------------------------------------------------------------------------- */

static int add_norm(fx_tokenizer *t, const json_t *o, const char *where, size_t *cap)
{
    const char *type;
    int rc = component_type(&type, t, o, where, cap, "normalizers", add_norm);
    if (rc != FX_OK || !type)
        return rc;
    fx__norm *norms = reserve_one(t->norms, t->n_norms, cap, sizeof *norms);
    if (!norms)
        return FX_ENOMEM;
    t->norms = norms;
    fx__norm *n = &t->norms[t->n_norms];
    *n = (fx__norm){0};
    if (!strcmp(type, "NFC")) {
        n->kind = FX__NORM_NFC;
    } else if (!strcmp(type, "NFD")) {
        n->kind = FX__NORM_NFD;
    } else if (!strcmp(type, "NFKC")) {
        n->kind = FX__NORM_NFKC;
    } else if (!strcmp(type, "NFKD")) {
        n->kind = FX__NORM_NFKD;
    } else if (!strcmp(type, "Lowercase")) {
        n->kind = FX__NORM_LOWERCASE;
    } else if (!strcmp(type, "Strip")) {
        n->kind = FX__NORM_STRIP;
        rc = get_bool(&n->strip_left, o, "strip_left", true, where);
        if (rc == FX_OK)
            rc = get_bool(&n->strip_right, o, "strip_right", true, where);
    } else if (!strcmp(type, "Replace") || !strcmp(type, "Prepend")) {
        bool replace = type[0] == 'R';
        n->kind = replace ? FX__NORM_REPLACE : FX__NORM_PREPEND;
        rc = get_str_copy(&n->content, &n->content_len, o, replace ? "content" : "prepend", where);
        t->n_norms++; /* owned from here on, freed with the tokenizer */
        if (rc == FX_OK && replace)
            rc = get_pattern(&n->pattern, o, where);
        return rc;
    } else {
        return fx__error(FX_EUNSUPPORTED, "%s.type '%s' is not supported", where, type);
    }
    if (rc == FX_OK)
        t->n_norms++;
    return rc;
}

/* ---- pre-tokenizers ----------------------------------------------------------------------- */

static int add_pre(fx_tokenizer *t, const json_t *o, const char *where, size_t *cap)
{
    const char *type;
    int rc = component_type(&type, t, o, where, cap, "pretokenizers", add_pre);
    if (rc != FX_OK || !type)
        return rc;
    if (strcmp(type, "Split") && strcmp(type, "ByteLevel") && strcmp(type, "Metaspace") && strcmp(type, "Digits"))
        return fx__error(FX_EUNSUPPORTED, "%s.type '%s' is not supported", where, type);
    fx__pre *pres = reserve_one(t->pres, t->n_pres, cap, sizeof *pres);
    if (!pres)
        return FX_ENOMEM;
    t->pres = pres;
    fx__pre *p = &t->pres[t->n_pres++];
    *p = (fx__pre){0};
    if (!strcmp(type, "Split")) {
        p->kind = FX__PRE_SPLIT;
        rc = get_pattern(&p->pattern, o, where);
        if (rc != FX_OK)
            return rc;
        const json_t *rx = json_object_get(json_object_get(o, "pattern"), "Regex");
        p->known_pattern = json_is_string(rx) && known_pattern(json_string_value(rx), json_string_length(rx));
        const json_t *b = json_object_get(o, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int k = name_index(names, 5, bs);
        if (k < 0)
            return fx__error(FX_EUNSUPPORTED, "%s.behavior '%s' is not supported", where, bs);
        p->behavior = (fx__split_behavior)k;
        return get_bool(&p->invert, o, "invert", false, where);
    }
    if (!strcmp(type, "Digits")) {
        /* Each numeric character (Rust's char::is_numeric: Nd, Nl, No) is a match: alone, or
           runs of them together. */
        p->kind = FX__PRE_SPLIT;
        bool individual = false;
        rc = get_bool(&individual, o, "individual_digits", false, where);
        char field[128];
        snprintf(field, sizeof field, "%s (Digits)", where);
        if (rc == FX_OK)
            rc = fx__regex_init(&p->pattern, fx__family_patterns[3], 5, false, false, field);
        p->behavior = individual ? FX__SPLIT_ISOLATED : FX__SPLIT_CONTIGUOUS;
        p->known_pattern = true; /* never spans a line feed */
        return rc;
    }
    if (!strcmp(type, "ByteLevel")) {
        p->kind = FX__PRE_BYTELEVEL;
        rc = get_bool(&p->add_prefix_space, o, "add_prefix_space", true, where);
        if (rc == FX_OK)
            rc = get_bool(&p->use_regex, o, "use_regex", true, where);
        char field[128];
        snprintf(field, sizeof field, "%s (ByteLevel's pattern)", where);
        if (rc == FX_OK && p->use_regex)
            rc = fx__regex_init(&p->pattern, GPT2_PATTERN, strlen(GPT2_PATTERN), false, false, field);
        return rc;
    }
    p->kind = FX__PRE_METASPACE;
    rc = get_char(&p->replacement, o, "replacement", where);
    if (rc == FX_OK)
        rc = get_prepend_scheme(&p->prepend, o, where);
    if (rc == FX_OK)
        rc = get_bool(&p->split, o, "split", true, where);
    return rc;
}

/* ---- decoders --------------------------------------------------------------------------------- */

static int add_dec(fx_tokenizer *t, const json_t *o, const char *where, size_t *cap)
{
    const char *type;
    int rc = component_type(&type, t, o, where, cap, "decoders", add_dec);
    if (rc != FX_OK || !type)
        return rc;
    static const char *const names[] = {"ByteLevel", "Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    int k = name_index(names, 6, type);
    if (k < 0)
        return fx__error(FX_EUNSUPPORTED, "%s.type '%s' is not supported", where, type);
    fx__dec *decs = reserve_one(t->decs, t->n_decs, cap, sizeof *decs);
    if (!decs)
        return FX_ENOMEM;
    t->decs = decs;
    fx__dec *d = &t->decs[t->n_decs++];
    *d = (fx__dec){0};
    d->kind = (fx__dec_kind)k;
    if (d->kind == FX__DEC_REPLACE) {
        rc = get_str_copy(&d->content, &d->content_len, o, "content", where);
        if (rc == FX_OK)
            rc = get_pattern(&d->pattern, o, where);
    } else if (d->kind == FX__DEC_STRIP) {
        rc = get_char(&d->strip_char, o, "content", where);
        const json_t *a = json_object_get(o, "start"), *b = json_object_get(o, "stop");
        if (rc == FX_OK && (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
                            json_integer_value(b) < 0))
            rc = fx__error(FX_EFORMAT, "%s.start and .stop must be integers >= 0", where);
        if (rc == FX_OK) {
            d->strip_start = json_integer_value(a);
            d->strip_stop = json_integer_value(b);
        }
    } else if (d->kind == FX__DEC_METASPACE) {
        rc = get_char(&d->strip_char, o, "replacement", where);
        if (rc == FX_OK)
            rc = get_prepend_scheme(&d->prepend, o, where);
    }
    return rc;
}

/* ---- post-processor, truncation, padding: accepted when encoding without special tokens does
   not depend on them ---------------------------------------------------------------------------- */

/* Checked only: t and cap are not used (the signature is a component_fn's, for Sequence). */
static int check_post(fx_tokenizer *t, const json_t *o, const char *where, size_t *cap)
{
    if (!o || json_is_null(o))
        return FX_OK;
    const char *type = json_is_object(o) ? type_of(o) : NULL;
    if (!type)
        return fx__error(FX_EFORMAT, "%s.type is missing", where);
    if (!strcmp(type, "Sequence"))
        return add_sequence(t, o, "processors", where, cap, check_post);
    if (strcmp(type, "TemplateProcessing") && strcmp(type, "ByteLevel") && strcmp(type, "RobertaProcessing") &&
        strcmp(type, "BertProcessing"))
        return fx__error(FX_EUNSUPPORTED, "%s.type '%s' is not supported", where, type);
    return FX_OK;
}

/* ---- the model ------------------------------------------------------------------------------ */

static int merges_put(fx_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = fx__hash_bytes(&key, 8) & (t->merges_cap - 1);
    while (t->merges[i].key != UINT64_MAX && t->merges[i].key != key)
        i = (i + 1) & (t->merges_cap - 1);
    /* A repeated pair takes its last rank, as a map built from the list would. */
    t->merges[i] = (fx__merge_slot){key, rank, id};
    return FX_OK;
}

static int32_t vocab_get(const fx_tokenizer *t, const char *s, size_t n)
{
    return fx__strmap_get(&t->vocab, t->vocab_str, t->vocab_len, s, n);
}

/* The largest id of the vocabulary and the added tokens, plus one, into t->n_ids, and the
   id-indexed tables allocated. */
static int load_ids(fx_tokenizer *t, const json_t *vocab, const json_t *added)
{
    int64_t n_ids = 0;
    const char *key;
    size_t key_len;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        (void)key, (void)key_len;
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= INT32_MAX)
            return fx__error(FX_EFORMAT, "model.vocab: the id of a token must be an integer in [0, 2^31-1)");
        if (json_integer_value(val) + 1 > n_ids)
            n_ids = json_integer_value(val) + 1;
    }
    for (size_t i = 0; added && i < json_array_size(added); i++) {
        const json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX)
            return fx__error(FX_EFORMAT, "added_tokens[%zu].id must be an integer in [0, 2^31-1)", i);
        if (json_integer_value(id) + 1 > n_ids)
            n_ids = json_integer_value(id) + 1;
    }
    if (n_ids > (int64_t)1 << 26)
        return fx__error(FX_EUNSUPPORTED, "a vocabulary of %lld ids is past this library's limit of 2^26",
                         (long long)n_ids);
    t->n_ids = n_ids;
    t->tok = fx__calloc((size_t)n_ids + 1, sizeof *t->tok);
    t->tok_len = fx__calloc((size_t)n_ids + 1, sizeof *t->tok_len);
    t->special = fx__calloc((size_t)n_ids + 1, sizeof *t->special);
    t->vocab_str = fx__calloc((size_t)n_ids + 1, sizeof *t->vocab_str);
    t->vocab_len = fx__calloc((size_t)n_ids + 1, sizeof *t->vocab_len);
    return t->tok && t->tok_len && t->special && t->vocab_str && t->vocab_len ? FX_OK : FX_ENOMEM;
}

/* The vocabulary's strings into one arena (room reserved for the added tokens' too, so it
   never moves), and the string -> id map. */
static int load_vocab(fx_tokenizer *t, const json_t *vocab, const json_t *added)
{
    const char *key;
    size_t key_len, total = 0;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        (void)key, (void)val;
        total += key_len + 1;
    }
    for (size_t i = 0; added && i < json_array_size(added); i++) {
        const json_t *c = json_object_get(json_array_get(added, i), "content");
        if (!json_is_string(c))
            return fx__error(FX_EFORMAT, "added_tokens[%zu].content must be a string", i);
        total += json_string_length(c) + 1;
    }
    int rc = fx__buf_reserve(&t->strings, total);
    if (rc != FX_OK)
        return rc;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, val) {
        int64_t id = json_integer_value(val);
        if (fx__utf8_valid_prefix(key, key_len) != key_len)
            return fx__error(FX_EFORMAT, "model.vocab: a token is not valid UTF-8");
        if (t->vocab_str[id])
            return fx__error(FX_EFORMAT, "model.vocab: id %lld is given to two tokens", (long long)id);
        char *s = t->strings.p + t->strings.n;
        fx__buf_put(&t->strings, key, key_len);
        fx__buf_put(&t->strings, "", 1);
        t->vocab_str[id] = t->tok[id] = s;
        t->vocab_len[id] = t->tok_len[id] = (uint32_t)key_len;
    }
    return fx__strmap_build(&t->vocab, t->vocab_str, t->vocab_len, t->n_ids);
}

/* Merge i's two tokens, from "a b" or ["a", "b"]. */
static int merge_pair(const json_t *e, size_t i, const char **a, size_t *na, const char **b, size_t *nb)
{
    if (json_is_string(e)) {
        const char *s = json_string_value(e);
        size_t n = json_string_length(e);
        const char *sp = memchr(s, ' ', n);
        if (!sp || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - s)))
            return fx__error(FX_EFORMAT, "model.merges[%zu] must be two tokens separated by one space", i);
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = n - *na - 1;
        return FX_OK;
    }
    if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
        json_is_string(json_array_get(e, 1))) {
        *a = json_string_value(json_array_get(e, 0)), *na = json_string_length(json_array_get(e, 0));
        *b = json_string_value(json_array_get(e, 1)), *nb = json_string_length(json_array_get(e, 1));
        return FX_OK;
    }
    return fx__error(FX_EFORMAT, "model.merges[%zu] must be \"a b\" or [\"a\", \"b\"]", i);
}

/* The merges: rank = position; each pair and its merged token in the vocabulary. */
static int load_merges(fx_tokenizer *t, const json_t *merges)
{
    const size_t nm = json_array_size(merges);
    if (nm >= UINT32_MAX / 4)
        return fx__error(FX_EUNSUPPORTED, "%zu merges are past this library's limit", nm);
    t->merges_cap = 16;
    while (t->merges_cap < nm * 2)
        t->merges_cap *= 2;
    t->merges = fx__alloc(t->merges_cap * sizeof *t->merges);
    if (!t->merges)
        return FX_ENOMEM;
    for (size_t i = 0; i < t->merges_cap; i++)
        t->merges[i].key = UINT64_MAX;
    fx__buf joined = {0};
    int rc = FX_OK;
    for (size_t i = 0; i < nm && rc == FX_OK; i++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if ((rc = merge_pair(json_array_get(merges, i), i, &a, &na, &b, &nb)) != FX_OK)
            break;
        const int32_t ia = vocab_get(t, a, na), ib = vocab_get(t, b, nb);
        if (ia < 0 || ib < 0 || nb < t->prefix_len) {
            rc = fx__error(FX_EFORMAT, "model.merges[%zu]: a token of the pair is not in the vocabulary", i);
            break;
        }
        joined.n = 0;
        if (fx__buf_put(&joined, a, na) != FX_OK || fx__buf_put(&joined, b + t->prefix_len, nb - t->prefix_len)) {
            rc = FX_ENOMEM;
            break;
        }
        const int32_t id = vocab_get(t, joined.p, joined.n);
        if (id < 0)
            rc = fx__error(FX_EFORMAT, "model.merges[%zu]: the merged token is not in the vocabulary", i);
        else
            merges_put(t, ia, ib, (uint32_t)i, id);
    }
    fx__buf_free(&joined);
    return rc;
}

/* The added tokens: their id's string wins over the model's for id -> token; a token the
   model knows keeps the model's id. Empty and repeated contents are dropped. */
static int load_added(fx_tokenizer *t, const json_t *added)
{
    const size_t na = added ? json_array_size(added) : 0;
    t->added = fx__calloc(na + 1, sizeof *t->added);
    if (!t->added)
        return FX_ENOMEM;
    for (size_t i = 0; i < na; i++) {
        const json_t *a = json_array_get(added, i);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        const char *c;
        size_t n;
        int rc = get_str(&c, &n, a, "content", true, where);
        if (rc != FX_OK)
            return rc;
        if (fx__utf8_valid_prefix(c, n) != n)
            return fx__error(FX_EFORMAT, "%s.content is not valid UTF-8", where);
        if (n == 0)
            continue; /* never matched (as in `tokenizers`) */
        bool dup = false;
        for (size_t j = 0; j < t->n_added; j++)
            dup |= t->added[j].len == n && !memcmp(t->added[j].content, c, n);
        if (dup)
            continue;
        fx__added *x = &t->added[t->n_added];
        *x = (fx__added){0};
        x->id = (int32_t)json_integer_value(json_object_get(a, "id"));
        const int32_t mid = vocab_get(t, c, n);
        if (mid >= 0)
            x->id = mid;
        char *s = t->strings.p + t->strings.n;
        fx__buf_put(&t->strings, c, n);
        fx__buf_put(&t->strings, "", 1);
        x->content = s;
        x->len = n;
        t->n_added++;
        if ((rc = get_bool(&x->special, a, "special", false, where)) != FX_OK ||
            (rc = get_bool(&x->lstrip, a, "lstrip", false, where)) != FX_OK ||
            (rc = get_bool(&x->rstrip, a, "rstrip", false, where)) != FX_OK ||
            (rc = get_bool(&x->single_word, a, "single_word", false, where)) != FX_OK ||
            (rc = get_bool(&x->normalized, a, "normalized", !x->special, where)) != FX_OK)
            return rc;
        t->tok[x->id] = s;
        t->tok_len[x->id] = (uint32_t)n;
        t->special[x->id] = x->special;
    }
    return FX_OK;
}

static int load_model(fx_tokenizer *t, const json_t *m, const json_t *added)
{
    if (!json_is_object(m))
        return fx__error(FX_EFORMAT, "model must be an object");
    const char *type = type_of(m);
    if (type && strcmp(type, "BPE"))
        return fx__error(FX_EUNSUPPORTED, "model.type '%s' is not supported (only BPE)", type);
    const json_t *vocab = json_object_get(m, "vocab"), *merges = json_object_get(m, "merges");
    if (!json_is_object(vocab))
        return fx__error(FX_EFORMAT, "model.vocab must be an object");
    if (!json_is_array(merges))
        return fx__error(FX_EFORMAT, "model.merges must be an array");
    const json_t *dropout = json_object_get(m, "dropout");
    if (dropout && !json_is_null(dropout) && (!json_is_number(dropout) || json_number_value(dropout) != 0.0))
        return fx__error(FX_EUNSUPPORTED, "model.dropout is not supported (it makes encoding random)");
    if (!json_is_array(added) && added && !json_is_null(added))
        return fx__error(FX_EFORMAT, "added_tokens must be an array");
    int rc;
    if ((rc = load_ids(t, vocab, added)) != FX_OK || (rc = load_vocab(t, vocab, added)) != FX_OK ||
        (rc = load_merges(t, merges)) != FX_OK || (rc = load_added(t, added)) != FX_OK)
        return rc;

    /* unk and byte fallback */
    const char *s;
    size_t n;
    t->unk_id = -1;
    if ((rc = get_str(&s, &n, m, "unk_token", false, "model")) != FX_OK)
        return rc;
    if (s) {
        t->unk_id = vocab_get(t, s, n);
        t->unk_missing = t->unk_id < 0;
    }
    if ((rc = get_bool(&t->fuse_unk, m, "fuse_unk", false, "model")) != FX_OK ||
        (rc = get_bool(&t->byte_fallback, m, "byte_fallback", false, "model")) != FX_OK ||
        (rc = get_bool(&t->ignore_merges, m, "ignore_merges", false, "model")) != FX_OK)
        return rc;
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = vocab_get(t, name, 6);
    }
    return FX_OK;
}

/* Prefix and suffix are read before the merges (a merge's right side loses the prefix). */
static int load_affixes(fx_tokenizer *t, const json_t *m)
{
    const char *s;
    size_t n;
    int rc = get_str(&s, &n, m, "continuing_subword_prefix", false, "model");
    if (rc != FX_OK)
        return rc;
    if (s && n && !(t->prefix = dup_bytes(s, n)))
        return FX_ENOMEM;
    t->prefix_len = t->prefix ? n : 0;
    rc = get_str(&s, &n, m, "end_of_word_suffix", false, "model");
    if (rc != FX_OK)
        return rc;
    if (s && n && !(t->suffix = dup_bytes(s, n)))
        return FX_ENOMEM;
    t->suffix_len = t->suffix ? n : 0;
    return FX_OK;
}

/* ---- added-token lookup tables -------------------------------------------------------------- */

/* By first byte, longest content first (leftmost-longest matching tries them in order). */
static int index_added(fx_tokenizer *t, bool normalized)
{
    int32_t **tab = normalized ? t->nadded_by_byte : t->added_by_byte;
    size_t count[256] = {0};
    for (size_t i = 0; i < t->n_added; i++) {
        const fx__added *a = &t->added[i];
        if (a->normalized != normalized)
            continue;
        size_t len = normalized ? a->norm_len : a->len;
        if (len)
            count[(unsigned char)(normalized ? a->norm : a->content)[0]]++;
    }
    for (int b = 0; b < 256; b++) {
        if (!count[b])
            continue;
        tab[b] = fx__alloc((count[b] + 1) * sizeof(int32_t));
        if (!tab[b])
            return FX_ENOMEM;
        size_t k = 0;
        for (size_t i = 0; i < t->n_added; i++) {
            const fx__added *a = &t->added[i];
            size_t len = normalized ? a->norm_len : a->len;
            if (a->normalized == normalized && len && (unsigned char)(normalized ? a->norm : a->content)[0] == b)
                tab[b][k++] = (int32_t)i;
        }
        tab[b][k] = -1;
        /* insertion sort by length, longest first; ties keep file order */
        for (size_t i = 1; i < k; i++) {
            int32_t v = tab[b][i];
            size_t lv = normalized ? t->added[v].norm_len : t->added[v].len;
            size_t j = i;
            while (j > 0) {
                int32_t u = tab[b][j - 1];
                size_t lu = normalized ? t->added[u].norm_len : t->added[u].len;
                if (lu >= lv)
                    break;
                tab[b][j] = u;
                j--;
            }
            tab[b][j] = v;
        }
    }
    return FX_OK;
}

static bool compute_safe_cut(const fx_tokenizer *t)
{
    for (size_t i = 0; i < t->n_norms; i++) {
        const fx__norm *n = &t->norms[i];
        if (n->kind == FX__NORM_STRIP || n->kind == FX__NORM_PREPEND)
            return false;
        if (n->kind == FX__NORM_REPLACE && (n->pattern.code || memchr(n->pattern.lit, '\n', n->pattern.lit_len)))
            return false;
    }
    if (t->n_pres == 0)
        return false;
    for (size_t i = 0; i < t->n_pres; i++) {
        const fx__pre *p = &t->pres[i];
        if (p->kind == FX__PRE_METASPACE || (p->kind == FX__PRE_BYTELEVEL && p->add_prefix_space))
            return false;
        if (p->kind == FX__PRE_BYTELEVEL && i == 0 && !p->use_regex)
            return false;
        if (p->kind == FX__PRE_SPLIT) {
            if (!p->known_pattern || p->invert ||
                (p->behavior != FX__SPLIT_ISOLATED && p->behavior != FX__SPLIT_CONTIGUOUS))
                return false;
        }
    }
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].lstrip || memchr(t->added[i].content, '\n', t->added[i].len))
            return false;
    return true;
}

/* ---- load and free ---------------------------------------------------------------------------- */

void fx_tokenizer_free(fx_tokenizer *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_norms; i++) {
        fx__regex_free(&t->norms[i].pattern);
        fx__free(t->norms[i].content);
    }
    for (size_t i = 0; i < t->n_pres; i++)
        fx__regex_free(&t->pres[i].pattern);
    for (size_t i = 0; i < t->n_decs; i++) {
        fx__regex_free(&t->decs[i].pattern);
        fx__free(t->decs[i].content);
    }
    for (size_t i = 0; t->added && i < t->n_added; i++)
        fx__free(t->added[i].norm);
    for (int b = 0; b < 256; b++) {
        fx__free(t->added_by_byte[b]);
        fx__free(t->nadded_by_byte[b]);
    }
    fx__free(t->norms);
    fx__free(t->pres);
    fx__free(t->decs);
    fx__free(t->added);
    fx__free(t->tok);
    fx__free(t->tok_len);
    fx__free(t->special);
    fx__free(t->vocab_str);
    fx__free(t->vocab_len);
    fx__free(t->vocab.slot);
    fx__free(t->merges);
    fx__free(t->prefix);
    fx__free(t->suffix);
    fx__free(t->path);
    fx__buf_free(&t->strings);
    if (t->lock_ready)
        pthread_mutex_destroy(&t->lock);
    fx__scratch_free(&t->scratch);
    fx__cache_free(&t->cache);
    fx__free(t);
}

static int load_root(fx_tokenizer *t, const json_t *root)
{
    if (!json_is_object(root))
        return fx__error(FX_EFORMAT, "a tokenizer.json must hold an object");
    const json_t *trunc = json_object_get(root, "truncation");
    if (trunc && !json_is_null(trunc))
        return fx__error(FX_EUNSUPPORTED, "truncation is not supported (it must be null)");
    const json_t *pad = json_object_get(root, "padding");
    if (pad && !json_is_null(pad)) {
        const json_t *st = json_object_get(pad, "strategy");
        if (!json_is_string(st) || strcmp(json_string_value(st), "BatchLongest"))
            return fx__error(FX_EUNSUPPORTED, "padding.strategy is not supported (only BatchLongest, which "
                                              "does not change one encoding)");
    }
    const json_t *model = json_object_get(root, "model");
    if (!model)
        return fx__error(FX_EFORMAT, "model is missing");
    int rc = json_is_object(model) ? load_affixes(t, model) : FX_OK;
    if (rc == FX_OK)
        rc = load_model(t, model, json_object_get(root, "added_tokens"));
    if (rc != FX_OK)
        return rc;
    size_t cap = 0;
    const json_t *o = json_object_get(root, "normalizer");
    if (o && !json_is_null(o) && (rc = add_norm(t, o, "normalizer", &cap)) != FX_OK)
        return rc;
    cap = 0;
    o = json_object_get(root, "pre_tokenizer");
    if (o && !json_is_null(o) && (rc = add_pre(t, o, "pre_tokenizer", &cap)) != FX_OK)
        return rc;
    cap = 0;
    o = json_object_get(root, "decoder");
    t->has_decoder = o && !json_is_null(o);
    if (t->has_decoder && (rc = add_dec(t, o, "decoder", &cap)) != FX_OK)
        return rc;
    cap = 0;
    if ((rc = check_post(t, json_object_get(root, "post_processor"), "post_processor", &cap)) != FX_OK)
        return rc;

    /* Normalized added tokens are matched in normalized text, by their normalized form. */
    for (size_t i = 0; i < t->n_added; i++) {
        fx__added *a = &t->added[i];
        if (!a->normalized)
            continue;
        const char *nout;
        size_t nn;
        fx__matcher_reset(&t->scratch.m);
        if ((rc = fx__normalize(t, &t->scratch, a->content, a->len, &nout, &nn)) != FX_OK)
            return rc;
        if (!(a->norm = dup_bytes(nout, nn)))
            return FX_ENOMEM;
        a->norm_len = nn;
        /* `tokenizers` gives such a token back (id -> token, decoding) in its normalized form. */
        t->tok[a->id] = a->norm;
        t->tok_len[a->id] = (uint32_t)nn;
    }
    if ((rc = index_added(t, false)) != FX_OK || (rc = index_added(t, true)) != FX_OK)
        return rc;
    t->safe_cut = compute_safe_cut(t);
    for (int b = 0; b < 256; b++)
        t->has_nadded |= t->nadded_by_byte[b] != NULL;
    return FX_OK;
}

int fx_tokenizer_load_json(fx_tokenizer **out, const char *json, size_t len)
{
    if (!out || (!json && len))
        return fx__error(FX_EINVAL, "out and json must not be NULL");
    *out = NULL;
    fx__bytelevel_init();
    json_error_t err;
    json_t *root = json_loadb(json ? json : "", len, JSON_ALLOW_NUL, &err);
    if (!root)
        return fx__error(FX_EFORMAT, "not valid JSON (line %d, column %d: %s)", err.line, err.column, err.text);
    fx_tokenizer *t = fx__calloc(1, sizeof *t);
    int rc = t ? fx__scratch_init(&t->scratch, &t->cache) : FX_ENOMEM;
    if (rc == FX_OK) {
        if (pthread_mutex_init(&t->lock, NULL) != 0)
            rc = fx__error(FX_ENOMEM, "cannot create a mutex");
        else
            t->lock_ready = true;
    }
    if (rc == FX_OK)
        rc = load_root(t, root);
    json_decref(root);
    if (rc != FX_OK) {
        fx_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return FX_OK;
}

int fx__tok_fopen(FILE **f, const char *path)
{
    bool not_regular;
    *f = fx__fopen_regular(path, &not_regular);
    if (!*f && not_regular)
        return fx__error(FX_EIO, "%s: not a regular file", path);
    if (!*f)
        return fx__error(FX_EIO, "%s: %s", path, strerror(errno));
    return FX_OK;
}

/* The largest tokenizer.json read: real ones are 10 to 20 MB at most; a larger file (a wrong
   path, a corrupt or sparse file) is refused from its size before a byte is read. */
#define FX__TOK_MAX_JSON ((long long)256 << 20)

int fx_tokenizer_load(fx_tokenizer **out, const char *path)
{
    if (!out || !path)
        return fx__error(FX_EINVAL, "out and path must not be NULL");
    *out = NULL;
    FILE *f;
    int rc = fx__tok_fopen(&f, path);
    if (rc != FX_OK)
        return rc;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        rc = fx__error(FX_EIO, "%s: cannot stat: %s", path, strerror(errno));
        fclose(f);
        return rc;
    }
    if ((long long)st.st_size > FX__TOK_MAX_JSON) {
        fclose(f);
        return fx__error(FX_EFORMAT, "%s: %lld bytes, more than the %lld-byte (256 MiB) limit of a tokenizer.json",
                         path, (long long)st.st_size, FX__TOK_MAX_JSON);
    }
    fx__buf b = {0};
    char chunk[65536];
    size_t got;
    while (rc == FX_OK && (got = fread(chunk, 1, sizeof chunk, f)) > 0)
        rc = fx__buf_put(&b, chunk, got);
    if (rc == FX_OK && ferror(f))
        rc = fx__error(FX_EIO, "%s: read failed", path);
    fclose(f);
    if (rc == FX_OK)
        rc = fx_tokenizer_load_json(out, b.p, b.n);
    fx__buf_free(&b);
    if (rc != FX_OK)
        return fx__error_context(rc, "%s", path);
    /* Named in the messages of encoding and decoding (a pattern over its work budget). */
    size_t pl = strlen(path);
    if (!((*out)->path = fx__alloc(pl + 1))) {
        fx_tokenizer_free(*out);
        *out = NULL;
        return FX_ENOMEM;
    }
    memcpy((*out)->path, path, pl + 1);
    return FX_OK;
}

/* ---- lookups ---------------------------------------------------------------------------------- */

int64_t fx_tokenizer_vocab_size(const fx_tokenizer *t) { return t ? t->n_ids : 0; }

int32_t fx_tokenizer_token_to_id(const fx_tokenizer *t, const char *s, size_t n)
{
    if (!t || (!s && n))
        return -1;
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, s, n))
            return t->added[i].id;
    return vocab_get(t, s ? s : "", n);
}

const char *fx_tokenizer_id_to_token(const fx_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || id >= t->n_ids || !t->tok[id])
        return NULL;
    if (len)
        *len = t->tok_len[id];
    return t->tok[id];
}

bool fx_tokenizer_is_special(const fx_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_ids && t->special[id];
}
