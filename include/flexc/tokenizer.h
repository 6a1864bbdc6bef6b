/*
 * tokenizer: BPE tokenizers read from a Hugging Face tokenizer.json, giving the same ids as the
 * `tokenizers` library, and llm.c's token files. See docs/tokenizers.md for what is supported.
 *
 * Encoding and decoding. A tokenizer.json is loaded whole and checked; a model, normalizer,
 * pre-tokenizer, decoder or post-processor this library does not implement is FX_EUNSUPPORTED
 * and fx_last_error() names the field ("pre_tokenizer.type 'Whitespace' is not supported").
 *
 *     fx_tokenizer *tok;
 *     int rc = fx_tokenizer_load(&tok, "model/tokenizer.json");
 *     if (rc != FX_OK) { fprintf(stderr, "%s\n", fx_last_error()); return 1; }
 *     fx_ids ids = {0};                                 // grows as needed; appended to
 *     rc = fx_tokenizer_encode(tok, &ids, text, strlen(text));
 *     // ids.ids[0 .. ids.n): as encode(text, add_special_tokens=False) in `tokenizers`
 *     fx_text out = {0};
 *     rc = fx_tokenizer_decode(tok, &out, ids.ids, ids.n); // out.data: NUL-terminated UTF-8
 *     int32_t eos = fx_tokenizer_token_to_id(tok, "</s>", 4);   // -1 when absent
 *     fx_ids_free(&ids);
 *     fx_text_free(&out);
 *     fx_tokenizer_free(tok);
 *
 * Text is UTF-8. Bytes that are not valid UTF-8 are replaced by U+FFFD, one per maximal
 * invalid subpart (as Python's bytes.decode("utf-8", errors="replace") and Rust's
 * String::from_utf8_lossy do), so encoding such bytes gives the ids `tokenizers` gives for
 * the text Python would decode from them. Decoding follows decode(ids,
 * skip_special_tokens=False); an id outside [0, fx_tokenizer_vocab_size()) or one no token
 * has is FX_ERANGE.
 *
 * A tokenizer is read-only once loaded. Any number of threads may encode and decode with it at
 * once; one of them at a time uses its word cache and scratch, the others their own scratch.
 * Results do not depend on which.
 *
 * Token files. llm.c's format: a header of 256 int32 (magic 20240520, version 1, token count)
 * then the tokens as uint16; or magic 20240801, version 7 and uint32 tokens when the
 * vocabulary has more than 65536 ids. fx_tokens_load() checks the header, that the file size
 * matches the count, and that every token is below vocab_size (when given): FX_EFORMAT names
 * what is wrong.
 *
 *     fx_token_writer *w;
 *     rc = fx_token_writer_open(&w, "tokens.bin", fx_tokenizer_vocab_size(tok));
 *     rc = fx_token_writer_append(w, ids.ids, ids.n);   // any number of times
 *     rc = fx_token_writer_close(w);                     // the file appears whole, or not at all
 *     fx_ids all = {0};
 *     rc = fx_tokens_load(&all, "tokens.bin", fx_tokenizer_vocab_size(tok));
 */
#ifndef FLEXC_TOKENIZER_H
#define FLEXC_TOKENIZER_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A growing array of token ids; zero-initialise, then functions append to it. */
typedef struct fx_ids {
    int32_t *ids; /* [n] */
    int64_t n;
    int64_t cap;
} fx_ids;
FX_API void fx_ids_free(fx_ids *ids);

/* A growing UTF-8 string, always NUL-terminated once written to; zero-initialise. */
typedef struct fx_text {
    char *data; /* [len + 1] */
    size_t len;
    size_t cap;
} fx_text;
FX_API void fx_text_free(fx_text *text);

typedef struct fx_tokenizer fx_tokenizer;

/* Loads a tokenizer.json file (FX_EIO when it cannot be read, FX_EFORMAT when it is not a
   valid tokenizer.json or holds more than 256 MiB, refused from its size before it is read,
   FX_EUNSUPPORTED naming the field this library does not implement). */
FX_API int fx_tokenizer_load(fx_tokenizer **out, const char *path);
/* The same from a tokenizer.json held in memory (json[0 .. len), need not be NUL-terminated). */
FX_API int fx_tokenizer_load_json(fx_tokenizer **out, const char *json, size_t len);
FX_API void fx_tokenizer_free(fx_tokenizer *tok);

/* One past the largest id of the vocabulary and added tokens: the size an embedding needs. */
FX_API int64_t fx_tokenizer_vocab_size(const fx_tokenizer *tok);

/* Appends the ids of text[0 .. len) to out (no special tokens added). On failure out->n is
   unchanged. FX_EFORMAT when a regex of the tokenizer.json (a normalizer's, pre-tokenizer's
   or decoder's pattern) exceeds its work budget on this text, 4096 + 256 steps a byte, or its
   backtracking depth: fx_last_error() names the file and the pattern. A pattern that
   backtracks catastrophically fails in time proportional to the text's length instead of
   running for hours; the patterns of the supported families never come near the budget. */
FX_API int fx_tokenizer_encode(const fx_tokenizer *tok, fx_ids *out, const char *text, size_t len);
/* Appends the decoded text of ids[0 .. n) to out (special tokens kept); the same FX_EFORMAT
   for a decoder's pattern over its work budget. */
FX_API int fx_tokenizer_decode(const fx_tokenizer *tok, fx_text *out, const int32_t *ids, int64_t n);

/* The id of a token given by its string (added tokens first, then the model's vocabulary);
   -1 when there is none. */
FX_API int32_t fx_tokenizer_token_to_id(const fx_tokenizer *tok, const char *token, size_t len);
/* The string of an id (not NUL-terminated; *len set), NULL when no token has that id. */
FX_API const char *fx_tokenizer_id_to_token(const fx_tokenizer *tok, int32_t id, size_t *len);
/* True when id is an added token marked "special" (<|endoftext|>, <s>, ...). */
FX_API bool fx_tokenizer_is_special(const fx_tokenizer *tok, int32_t id);

/* For encoding a long text in pieces: the largest cut c <= len such that encoding text[0 .. c)
   and then what follows gives the same ids as encoding the whole, for any continuation; 0 when
   this tokenizer offers no such point in text[0 .. len) (encode it whole then). Cuts are
   placed after a line feed followed by an ASCII letter, and only for tokenizers whose
   pre-tokenizer splits there (the GPT-2, Llama 3 and Qwen2 patterns). */
FX_API size_t fx_tokenizer_safe_cut(const fx_tokenizer *tok, const char *text, size_t len);

/* ---- token files ----------------------------------------------------------------------- */

typedef struct fx_token_writer fx_token_writer;
/* Starts a token file for ids in [0, vocab_size); the format (uint16 or uint32 tokens) follows
   from vocab_size. Writes to a temporary file next to path. */
FX_API int fx_token_writer_open(fx_token_writer **out, const char *path, int64_t vocab_size);
/* FX_ERANGE for an id outside [0, vocab_size) or past 2^31-1 tokens in all. */
FX_API int fx_token_writer_append(fx_token_writer *w, const int32_t *ids, int64_t n);
/* Writes the header, syncs and renames the file into place; frees w whatever happens. */
FX_API int fx_token_writer_close(fx_token_writer *w);
/* Removes the temporary file and frees w. */
FX_API void fx_token_writer_abort(fx_token_writer *w);
/* The tokens written so far. */
FX_API int64_t fx_token_writer_count(const fx_token_writer *w);

/* Appends the tokens of a token file to out. vocab_size > 0: a token >= vocab_size is
   FX_EFORMAT. */
FX_API int fx_tokens_load(fx_ids *out, const char *path, int64_t vocab_size);

#ifdef __cplusplus
}
#endif

#endif
