/*
 * safetensors: validated zero-copy loading and atomic saving (DESIGN.md §5).
 * Implemented by the safetensors module; see docs/safetensors.md.
 */
#ifndef FLEXC_SAFETENSORS_H
#define FLEXC_SAFETENSORS_H

#include "../flexc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fx_dtype {
    FX_DT_BOOL, FX_DT_U8, FX_DT_I8, FX_DT_I16, FX_DT_U16, FX_DT_F16, FX_DT_BF16,
    FX_DT_I32, FX_DT_U32, FX_DT_F32, FX_DT_F64, FX_DT_I64, FX_DT_U64,
    FX_DT_F8_E4M3, FX_DT_F8_E5M2 /* more may follow */
} fx_dtype;

#define FX_MAX_DIMS 8
typedef struct fx_tensor_view {
    const char *name;
    fx_dtype dtype;
    int ndim;
    int64_t shape[FX_MAX_DIMS];
    const void *data;
    size_t nbytes;
} fx_tensor_view;

typedef struct fx_safetensors fx_safetensors;
FX_API int fx_safetensors_open(fx_safetensors **out, const char *path);
FX_API size_t fx_safetensors_count(const fx_safetensors *f);
FX_API const fx_tensor_view *fx_safetensors_tensor(const fx_safetensors *f, size_t i); /* file order */
FX_API const fx_tensor_view *fx_safetensors_find(const fx_safetensors *f, const char *name);
FX_API const char *fx_safetensors_metadata(const fx_safetensors *f, const char *key); /* NULL if absent */
FX_API void fx_safetensors_close(fx_safetensors *f);
/* Writes atomically (temporary file, fsync, rename). metadata: key, value, ..., NULL; may be NULL. */
FX_API int fx_safetensors_save(const char *path, const fx_tensor_view *tensors, size_t n,
                               const char *const *metadata);

#ifdef __cplusplus
}
#endif
#endif
