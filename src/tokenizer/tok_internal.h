/* Tokenizer internals: the loaded pipeline (normalizers, pre-tokenizers, BPE model, added
   tokens, decoders), the per-call scratch, and the UTF-8 helpers they share. */
#ifndef FX_TOK_INTERNAL_H
#define FX_TOK_INTERNAL_H

#include "core/core.h"
#include "core/file.h"
#include "flexc/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

/* ---- growing buffers ---------------------------------------------------------------------- */

/* Bytes. Grows by doubling through fx__alloc; the hot loops reuse one across calls. */
typedef struct fx__buf {
    char *p;
    size_t n, cap;
} fx__buf;
int fx__buf_reserve(fx__buf *b, size_t extra);
int fx__buf_put(fx__buf *b, const void *s, size_t n);
void fx__buf_free(fx__buf *b);

/* A piece of text: bytes [off, off + len) of some buffer. orig0: it starts where the input
   text (or the part of it between added tokens) starts; Metaspace's "first" scheme asks. */
typedef struct fx__piece {
    size_t off, len;
    int32_t token; /* >= 0: already a token (an added token), no more work */
    bool orig0;
} fx__piece;
typedef struct fx__pieces {
    fx__piece *p;
    size_t n, cap;
} fx__pieces;
int fx__pieces_push(fx__pieces *v, fx__piece piece);
void fx__pieces_free(fx__pieces *v);

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

/* Length of the character starting at a valid UTF-8 lead byte. */
static inline size_t fx__utf8_len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
}
/* The code point at s (valid UTF-8), *n set to its length. */
static inline int32_t fx__utf8_get(const char *s, size_t *n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80) {
        *n = 1;
        return u[0];
    }
    if (u[0] < 0xe0) {
        *n = 2;
        return ((u[0] & 0x1f) << 6) | (u[1] & 0x3f);
    }
    if (u[0] < 0xf0) {
        *n = 3;
        return ((u[0] & 0x0f) << 12) | ((u[1] & 0x3f) << 6) | (u[2] & 0x3f);
    }
    *n = 4;
    return ((u[0] & 0x07) << 18) | ((u[1] & 0x3f) << 12) | ((u[2] & 0x3f) << 6) | (u[3] & 0x3f);
}
/* Writes code point c as UTF-8 into out (4 bytes room), returns its length. */
size_t fx__utf8_put(char *out, int32_t c);
/* Length of the longest valid UTF-8 prefix of s[0 .. n). */
size_t fx__utf8_valid_prefix(const char *s, size_t n);
/* Appends s[0 .. n) to b with each maximal invalid subpart replaced by U+FFFD. */
int fx__utf8_lossy(fx__buf *b, const char *s, size_t n);
/* Unicode White_Space (Rust's char::is_whitespace). */
bool fx__uni_is_space(int32_t c);
/* A word character as the regex crate's \\w (Unicode Perl class: Alphabetic, marks, decimal
   digits, connector punctuation, joiners): single_word added tokens need one on neither side. */
bool fx__uni_is_word(int32_t c);

/* ---- regular expressions ---------------------------------------------------------------- */

typedef struct fx__regex {
    pcre2_code *code; /* NULL: a literal string pattern */
    char *lit;        /* the literal (for String patterns) */
    size_t lit_len;
    char *field;      /* where the pattern is in the tokenizer.json, for messages */
} fx__regex;

/* The regexes' work budget of one encoding or decoding: FX__RE_WORK_BASE steps, plus
   FX__RE_WORK_PER_BYTE for each byte of text a pattern is run over (each stage's pieces; a
   text that two stages split counts twice). A step is one automatic callout (a pattern item
   tried, forward or after backtracking) plus each character the matcher moved over since the
   last one, so a step is a bounded amount of time (about 5 ns): the budget bounds the time
   by a multiple of the text's length however the pattern backtracks. The patterns of the
   supported families take 4 to 6 steps a byte on mixed text and at most 20 on texts made to
   slow them (tests/test_tokenizer.c); they run uncounted (counting costs them up to 70% more
   time) but under PCRE2's match limit at the budget left and the depth limit. */
#define FX__RE_WORK_BASE 4096
#define FX__RE_WORK_PER_BYTE 256
/* The split patterns of the supported families: GPT-2's (ByteLevel's), Llama 3's, Qwen2's, and
   Digits' \p{N}. None matches across "\n" followed by an ASCII letter (safe cuts), and
   their cost is linear in the text's length (no nested repeats; tests/test_tokenizer.c and
   the fuzz target measure it), so that they run uncounted (fx__regex_init). */
enum { FX__FAMILY_PATTERNS = 4 };
extern const char *const fx__family_patterns[FX__FAMILY_PATTERNS];
/* The interpreter's backtracking depth (JIT ignores it, and has its own stack instead: a match
   that exhausts it is run again by the interpreter); real patterns need under 10. */
#define FX__RE_DEPTH_LIMIT 10000
/* The interpreter's backtracking memory, KiB. */
#define FX__RE_HEAP_LIMIT_KIB 65536

/* Matching state of one scratch: PCRE2's match data and match context (its limits and the
   callout that counts work), and the current call's work against its budget. */
typedef struct fx__matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    const char *source; /* the tokenizer.json's path for messages; NULL: none known */
    uint64_t work, budget;
    size_t len;         /* bytes of text run over so far */
    size_t at;          /* the subject offset the last callout saw */
} fx__matcher;
int fx__matcher_init(fx__matcher *m);
void fx__matcher_free(fx__matcher *m);
/* Starts a call (an encoding, a decoding): no work done, a budget of FX__RE_WORK_BASE. */
void fx__matcher_reset(fx__matcher *m);
/* A pattern is about to run over n bytes: the budget grows by FX__RE_WORK_PER_BYTE * n. */
void fx__matcher_add(fx__matcher *m, size_t n);

/* Compiles a Regex pattern (UTF, UCP, JIT; counted: with the automatic callouts that count its
   work) or keeps a literal String pattern; field names it in messages. */
int fx__regex_init(fx__regex *re, const char *pattern, size_t len, bool literal, bool counted, const char *field);
void fx__regex_free(fx__regex *re);
/* Finds the next match in s[0 .. n) starting at byte `from`: FX_OK with [*ms, *me), or 1 when
   there is none, or an error: FX_EFORMAT naming the tokenizer file and the pattern when the
   call exceeds its work budget, or a match its depth or memory limit. m: the calling
   scratch's matcher, fx__matcher_add(m, n) done before the first match in s. */
int fx__regex_next(const fx__regex *re, fx__matcher *m, const char *s, size_t n, size_t from, size_t *ms, size_t *me);

/* ---- the pipeline --------------------------------------------------------------------------- */

typedef enum fx__norm_kind {
    FX__NORM_NFC, FX__NORM_NFD, FX__NORM_NFKC, FX__NORM_NFKD, FX__NORM_LOWERCASE, FX__NORM_STRIP,
    FX__NORM_REPLACE, FX__NORM_PREPEND
} fx__norm_kind;
typedef struct fx__norm {
    fx__norm_kind kind;
    bool strip_left, strip_right;
    fx__regex pattern;   /* REPLACE */
    char *content;       /* REPLACE: the replacement; PREPEND: the prefix */
    size_t content_len;
} fx__norm;

typedef enum fx__split_behavior {
    FX__SPLIT_REMOVED, FX__SPLIT_ISOLATED, FX__SPLIT_MERGED_PREV, FX__SPLIT_MERGED_NEXT, FX__SPLIT_CONTIGUOUS
} fx__split_behavior;
typedef enum fx__pre_kind { FX__PRE_SPLIT, FX__PRE_BYTELEVEL, FX__PRE_METASPACE } fx__pre_kind;
typedef enum fx__prepend { FX__PREPEND_ALWAYS, FX__PREPEND_FIRST, FX__PREPEND_NEVER } fx__prepend;
typedef struct fx__pre {
    fx__pre_kind kind;
    fx__regex pattern;          /* SPLIT; BYTELEVEL with use_regex: the GPT-2 pattern */
    fx__split_behavior behavior;
    bool invert;
    bool add_prefix_space, use_regex; /* BYTELEVEL */
    int32_t replacement;        /* METASPACE */
    fx__prepend prepend;        /* METASPACE */
    bool split;                 /* METASPACE */
    bool known_pattern;         /* SPLIT: one of the GPT-2, Llama 3, Qwen2 patterns */
} fx__pre;

typedef enum fx__dec_kind {
    FX__DEC_BYTELEVEL, FX__DEC_REPLACE, FX__DEC_BYTEFALLBACK, FX__DEC_FUSE, FX__DEC_STRIP, FX__DEC_METASPACE
} fx__dec_kind;
typedef struct fx__dec {
    fx__dec_kind kind;
    fx__regex pattern; /* REPLACE */
    char *content;     /* REPLACE */
    size_t content_len;
    int32_t strip_char; /* STRIP: the character; METASPACE: the replacement */
    int64_t strip_start, strip_stop;
    fx__prepend prepend; /* METASPACE */
} fx__dec;

typedef struct fx__added {
    int32_t id;
    char *content;
    size_t len;
    bool special, lstrip, rstrip, single_word, normalized;
    char *norm;      /* content after the normalizers (normalized tokens) */
    size_t norm_len;
} fx__added;

/* String -> id, open addressing over indices into a table of strings. */
typedef struct fx__strmap {
    int32_t *slot; /* [cap]: id + 1, 0 empty */
    size_t cap;
} fx__strmap;

/* (left id, right id) -> (rank, new id). */
typedef struct fx__merge_slot {
    uint64_t key; /* (uint64)left << 32 | right, UINT64_MAX empty */
    uint32_t rank;
    int32_t id;
} fx__merge_slot;

/* Word cache: model-space word bytes -> ids, bounded; full means no more inserts (as HF). */
typedef struct fx__cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len; /* in keys */
    uint32_t ids_off, ids_len; /* in ids */
} fx__cache_slot;
typedef struct fx__cache {
    fx__cache_slot *slot; /* [cap], hash 0 empty */
    size_t cap, used;
    fx__buf keys;
    int32_t *ids;
    size_t nids, ids_cap;
} fx__cache;

typedef struct fx__sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len;
} fx__sym;
typedef struct fx__heap_item {
    uint32_t rank, pos;
    int32_t id;
} fx__heap_item;

/* Per-call scratch: one lives in the tokenizer (with the cache) for whoever holds its lock. */
typedef struct fx__scratch {
    fx__buf in;      /* the input made valid UTF-8 when it was not */
    fx__buf norm[2]; /* normalizer ping-pong */
    fx__buf arena;   /* bytes of pre-tokenized pieces */
    fx__buf word;    /* a word with prefix/suffix attached */
    fx__pieces seg, nseg, sub, pieces[2];
    fx__sym *syms;
    size_t syms_cap;
    fx__heap_item *heap;
    size_t heap_cap;
    fx__matcher m;
    fx__cache *cache; /* NULL: no caching */
    fx__buf dec[2];   /* decoder ping-pong */
    fx__pieces dpieces[2];
} fx__scratch;

struct fx_tokenizer {
    /* model */
    int64_t n_ids;       /* one past the largest id */
    char **tok;          /* [n_ids] id -> string (NULL: no token), into strings */
    uint32_t *tok_len;   /* [n_ids] */
    bool *special;       /* [n_ids] */
    fx__buf strings;
    fx__strmap vocab;    /* the model's vocabulary */
    char **vocab_str;    /* [n_ids] the model's strings (for its map) */
    uint32_t *vocab_len;
    fx__merge_slot *merges;
    size_t merges_cap;
    int32_t unk_id;      /* -1: none */
    bool unk_missing;    /* unk_token names no token: an error once it is needed */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256]; /* <0xXX> ids for byte fallback, -1 absent */
    char *prefix, *suffix; /* continuing_subword_prefix, end_of_word_suffix (NULL: none) */
    size_t prefix_len, suffix_len;
    /* pipeline */
    fx__norm *norms;
    size_t n_norms;
    fx__pre *pres;
    size_t n_pres;
    fx__dec *decs;
    size_t n_decs;
    bool has_decoder;
    fx__added *added;
    size_t n_added;
    int32_t *added_by_byte[256]; /* indices into added, by first byte of content; -1 ended */
    int32_t *nadded_by_byte[256]; /* the same for normalized contents */
    bool safe_cut;
    bool has_nadded; /* some added token is matched on normalized text */
    char *path;      /* the file it was loaded from (NULL: from memory), for messages */
    /* the shared scratch and cache */
    pthread_mutex_t lock;
    bool lock_ready;
    fx__scratch scratch;
    fx__cache cache;
};

int fx__strmap_build(fx__strmap *m, char *const *str, const uint32_t *len, int64_t n);
int32_t fx__strmap_get(const fx__strmap *m, char *const *str, const uint32_t *len, const char *s, size_t n);
uint64_t fx__hash_bytes(const void *s, size_t n);

/* The byte-level alphabet: byte -> UTF-8 of its printable stand-in (GPT-2's bytes_to_unicode),
   filled by fx__bytelevel_init() (idempotent, thread-safe). */
extern char fx__bl_utf8[256][2];
extern uint8_t fx__bl_len[256];
void fx__bytelevel_init(void);
/* Code point -> byte, -1 when the code point is not a stand-in. */
int fx__bytelevel_byte(int32_t c);

int fx__scratch_init(fx__scratch *s, fx__cache *cache);
void fx__scratch_free(fx__scratch *s);
/* The scratch one encode or decode call works in: the tokenizer's own when no other thread
   holds it (*s = &t->scratch, locked), else `own`, made here (*s = own); either way with the
   regexes' work budget of a new call. Whatever it returns, fx__scratch_release(t, own, *s)
   ends the call's use of it. */
int fx__scratch_acquire(const fx_tokenizer *t, fx__scratch *own, fx__scratch **s);
void fx__scratch_release(const fx_tokenizer *t, fx__scratch *own, fx__scratch *s);
void fx__cache_free(fx__cache *c);

/* Opens a tokenizer.json or token file for reading: a regular file only (FX_EIO otherwise). */
int fx__tok_fopen(FILE **f, const char *path);

/* Runs the normalizers on in[0 .. n), result in *out (which may be one of s->norm). */
int fx__normalize(const fx_tokenizer *t, fx__scratch *s, const char *in, size_t n, const char **out, size_t *out_n);

#endif
