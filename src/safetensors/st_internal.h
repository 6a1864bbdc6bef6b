/* Internal pieces of the safetensors module shared by reading, writing, the index and the
   fuzz target. */
#ifndef FX_ST_INTERNAL_H
#define FX_ST_INTERNAL_H

#include "core/core.h"

/* The reference implementation's limit on the header length. */
#define FX__ST_MAX_HEADER 100000000ull
/* A valid header nests at most object > tensor object > shape array; one level more lets a
   misplaced array or object get a precise message instead of a depth error. */
#define FX__ST_MAX_DEPTH 4

struct fx_safetensors {
    const unsigned char *file;   /* the whole file: mapping, or caller memory */
    size_t file_len;
    void *map;                   /* munmap on close when set */
    size_t header_len;           /* N */
    const unsigned char *buffer; /* file + 8 + N */
    size_t buffer_len;
    size_t n;
    fx_tensor_view *views;       /* file order */
    const fx_tensor_view **by_name;
    size_t nmeta;
    const char **meta;           /* keys in header order; each value follows its key's NUL */
    char *strings;               /* every name, key and value */
};

/* Validates file[0..len) as a safetensors file and fills *f (views point into `file`, which
   must outlive f). Messages carry no file name. On error f holds nothing to free. */
int fx__st_parse(fx_safetensors *f, const unsigned char *file, size_t len);
/* Frees what fx__st_parse allocated (not the struct, not the mapping). */
void fx__st_release(fx_safetensors *f);

/* Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF). On failure *bad is the
   offset of the first invalid byte. */
bool fx__st_utf8_valid(const unsigned char *s, size_t n, size_t *bad);

/* Writes `s` into buf as a quoted, printable, length-capped string for messages:
   'name' with control bytes as \xNN. Returns buf. */
enum { FX__ST_QUOTE_CAP = 96 };
const char *fx__st_quote(char buf[FX__ST_QUOTE_CAP], const char *s);
/* The same without the quotes, for messages of other libraries. */
const char *fx__st_printable(char buf[FX__ST_QUOTE_CAP], const char *s);

/* The header a save of tensors[order[0..n)] with `metadata` writes: JSON padded with spaces
   to a multiple of 8, data laid out in that order from offset 0. Input must be validated.
   *out is fx__alloc'd. */
int fx__st_header_build(char **out, size_t *len, const fx_tensor_view *tensors, const size_t *order,
                        size_t n, const char *const *metadata);
/* Checks tensors/metadata as fx_safetensors_save does and computes the data order (dtype size
   descending, caller order within a size). order has room for n. */
int fx__st_save_check(const fx_tensor_view *tensors, size_t n, const char *const *metadata, size_t *order);

/* Parses an index JSON held in memory: validates the structure and the shard names. Used by
   fx_safetensors_index_open and the fuzz target. On success *root is a jansson object owned
   by the caller (json_decref), or NULL when the caller passes root == NULL. */
int fx__st_index_check(const char *text, size_t len, void **root);

#endif
