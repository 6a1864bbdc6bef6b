/*
 * safetensors: validated zero-copy loading, atomic saving, sharded checkpoints (docs/safetensors.md).
 * See docs/safetensors.md for the rules a file must follow.
 *
 * Reading. The file is memory-mapped read-only and validated completely before any pointer is
 * handed out; a file that breaks a rule is FX_EFORMAT and fx_last_error() names the rule and
 * the tensor. Views point straight into the mapping and live until fx_safetensors_free().
 *
 *     fx_safetensors *f;
 *     int rc = fx_safetensors_open(&f, "model.safetensors");
 *     if (rc != FX_OK) { fprintf(stderr, "%s\n", fx_last_error()); return 1; }
 *     const fx_tensor_view *w = fx_safetensors_find(f, "wte");      // NULL if absent
 *     float *buf = malloc(fx_tensor_numel(w) * sizeof(float));
 *     rc = fx_tensor_to_f32(buf, fx_tensor_numel(w), w);           // F32/F16/BF16/F64/F8 -> f32
 *     const char *step = fx_safetensors_metadata(f, "step");        // NULL if absent
 *     fx_safetensors_free(f);
 *
 * Data pointers need not be aligned for their dtype (a file written by another tool may have a
 * header of any length); fx_tensor_to_f32() copies whatever the alignment. Files written by
 * fx_safetensors_save() have every tensor aligned for its dtype (the mapping is page aligned).
 *
 * Writing. fx_safetensors_save() writes a temporary file in the same directory, fsyncs it,
 * renames it over `path` and fsyncs the directory, so `path` holds either the old or the new
 * checkpoint, never a torn one. Invalid input is FX_EINVAL and no file is touched.
 *
 *     uint16_t *half = malloc(n * 2);
 *     fx_f32_to_dtype(half, FX_DT_BF16, weights, n);                // round to nearest even
 *     fx_tensor_view t[2] = {
 *         {.name = "w", .dtype = FX_DT_BF16, .ndim = 2, .shape = {rows, cols}, .data = half, .nbytes = n * 2},
 *         {.name = "b", .dtype = FX_DT_F32, .ndim = 1, .shape = {cols}, .data = bias, .nbytes = cols * 4},
 *     };
 *     const char *meta[] = {"step", "1000", "format", "pt", NULL};
 *     rc = fx_safetensors_save("ckpt.safetensors", t, 2, meta);
 *
 * Sharded checkpoints. fx_safetensors_index_open() reads a Hugging Face
 * `model.safetensors.index.json` ({"weight_map": {tensor: shard file}}), opens and validates
 * every shard it names (shard names must stay inside the index's directory), and finds a
 * tensor across the shards.
 *
 * All functions are thread-safe on distinct objects; an opened file or index is read-only and
 * may be read from any number of threads at once.
 */
#ifndef FLEXC_SAFETENSORS_H
#define FLEXC_SAFETENSORS_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FX_MAX_DIMS 8
typedef struct fx_tensor_view {
    const char *name;
    fx_dtype dtype;
    int ndim;                    /* 0 (a scalar) .. FX_MAX_DIMS */
    int64_t shape[FX_MAX_DIMS];  /* shape[0..ndim), each >= 0 */
    const void *data;            /* little-endian, row-major; any alignment */
    size_t nbytes;               /* product(shape) * fx_dtype_size(dtype) */
} fx_tensor_view;

/* ---- dtypes -------------------------------------------------------------------------------- */

/* fx_dtype, fx_dtype_size, fx_dtype_name and fx_dtype_from_name are declared in flexc.h (the
   element types are shared with attention and lce). */
/* Product of shape[0..ndim) (1 for a scalar); -1 when ndim or a dimension is out of range or
   the product overflows int64_t. */
FX_API int64_t fx_tensor_numel(const fx_tensor_view *t);

/* ---- conversions ----------------------------------------------------------------------------- */

/* dst[0..n) = t's elements as float32. n must equal fx_tensor_numel(t). F32, F64, F16, BF16,
   F8_E4M3 and F8_E5M2 are converted (F64 rounds to nearest even; the others are exact);
   other dtypes are FX_EUNSUPPORTED. t->data may have any alignment; dst must not overlap it
   (FX_EINVAL). */
FX_API int fx_tensor_to_f32(float *dst, size_t n, const fx_tensor_view *t);
/* dst = src[0..n) converted to dtype (F32, F64, F16 or BF16), n elements, little-endian, any
   alignment of dst, which must not overlap src (FX_EINVAL). F16 and BF16 round to nearest even; overflow
   gives infinity; NaN stays NaN (quiet, sign kept). Other dtypes are FX_EUNSUPPORTED. */
FX_API int fx_f32_to_dtype(void *dst, fx_dtype dtype, const float *src, size_t n);
/* One value at a time, the same rules. */
FX_API uint16_t fx_f32_to_bf16(float x);
FX_API uint16_t fx_f32_to_f16(float x);
FX_API float fx_bf16_to_f32(uint16_t h);
FX_API float fx_f16_to_f32(uint16_t h);

/* ---- one file ---------------------------------------------------------------------------------- */

typedef struct fx_safetensors fx_safetensors;
/* Maps and validates `path`. FX_EIO when it cannot be opened or mapped, FX_EFORMAT when it
   breaks a rule of the format (docs/safetensors.md). *out is set only on success. */
FX_API int fx_safetensors_open(fx_safetensors **out, const char *path);
/* Reads one `__metadata__` value without opening the file for use: a cheap way for a caller
   that wants one kind of file to refuse another before paying for its tensor table. Only the
   header's bytes, its UTF-8 and its JSON syntax are checked, and nothing of the file's size is
   allocated (it is mapped, not read). value[0..cap) receives the value, NUL-terminated, and *found is
   set; *found is false (and value "") when the file has no such key. FX_ERANGE when the value
   does not fit in cap - 1 bytes; FX_EIO / FX_EFORMAT as fx_safetensors_open. A file this
   accepts may still be refused by fx_safetensors_open.

       char fmt[32];
       bool found;
       int rc = fx_safetensors_peek_metadata("m.safetensors", "format", fmt, sizeof fmt, &found);
       if (rc == FX_OK && (!found || strcmp(fmt, "pt") != 0)) ... not a file for us ... */
FX_API int fx_safetensors_peek_metadata(const char *path, const char *key, char *value, size_t cap, bool *found);
FX_API size_t fx_safetensors_count(const fx_safetensors *f);
/* Tensors in file order: by position of their data (zero-size tensors at the same position
   keep header order). NULL when i >= count. */
FX_API const fx_tensor_view *fx_safetensors_tensor(const fx_safetensors *f, size_t i); /* file order */
/* O(log n); NULL when absent. */
FX_API const fx_tensor_view *fx_safetensors_find(const fx_safetensors *f, const char *name);
FX_API const char *fx_safetensors_metadata(const fx_safetensors *f, const char *key); /* NULL if absent */
/* The i-th `__metadata__` key in header order; NULL when i is past the last. */
FX_API const char *fx_safetensors_metadata_key(const fx_safetensors *f, size_t i);
/* The data buffer (after the header) and its length; a view's offset in the file's
   data_offsets is (const char *)view->data - (const char *)buffer. */
FX_API const void *fx_safetensors_buffer(const fx_safetensors *f, size_t *nbytes);
/* The header length N stored in the first 8 bytes (the buffer starts at 8 + N). */
FX_API size_t fx_safetensors_header_size(const fx_safetensors *f);
/* Unmaps the file and frees f (NULL: nothing); its views die with it. */
FX_API void fx_safetensors_free(fx_safetensors *f);
/* Deprecated: the former name of fx_safetensors_free, the same function, exported so that
   callers linked against it keep working. New code calls fx_safetensors_free. */
FX_API void fx_safetensors_close(fx_safetensors *f);

/* Writes atomically (temporary file, fsync, rename). metadata: key, value, ..., NULL; may be NULL. */
FX_API int fx_safetensors_save(const char *path, const fx_tensor_view *tensors, size_t n,
                               const char *const *metadata);

/* ---- sharded checkpoints ---------------------------------------------------------------------- */

typedef struct fx_safetensors_index fx_safetensors_index;
/* Reads the index JSON at `path` and opens every shard its weight_map names, relative to the
   index's directory. FX_EFORMAT when the index is malformed, a shard name leaves the
   directory (absolute, "..", "."), a shard breaks a rule, or a listed tensor is missing from
   its shard; FX_EIO when a file cannot be read. */
FX_API int fx_safetensors_index_open(fx_safetensors_index **out, const char *path);
/* Tensors listed in weight_map, in the index's order. */
FX_API size_t fx_safetensors_index_count(const fx_safetensors_index *x);
/* The i-th tensor; *shard (may be NULL) receives the number of its shard. NULL past the end. */
FX_API const fx_tensor_view *fx_safetensors_index_tensor(const fx_safetensors_index *x, size_t i,
                                                         size_t *shard);
/* Looks `name` up in weight_map and returns its view in its shard; NULL when absent. */
FX_API const fx_tensor_view *fx_safetensors_index_find(const fx_safetensors_index *x, const char *name);
/* Distinct shards, sorted by name; their names are as written in the index. */
FX_API size_t fx_safetensors_index_shard_count(const fx_safetensors_index *x);
FX_API const fx_safetensors *fx_safetensors_index_shard(const fx_safetensors_index *x, size_t i);
FX_API const char *fx_safetensors_index_shard_name(const fx_safetensors_index *x, size_t i);
/* Frees x and every shard it opened (NULL: nothing). */
FX_API void fx_safetensors_index_free(fx_safetensors_index *x);
/* Deprecated: the former name of fx_safetensors_index_free, kept exported for compatibility. */
FX_API void fx_safetensors_index_close(fx_safetensors_index *x);

#ifdef __cplusplus
}
#endif
#endif
