/*
 * flexc — training kernels of modern language models in plain C.
 *
 * This umbrella header declares what every module shares: status codes, the error
 * message of the last failure, the version, the logging hook, threads and the CPU path, the
 * element types (fx_dtype) and the layouts of the public structs bindings mirror.
 * It then includes every module header, so `#include <flexc.h>` is all a program needs.
 *
 *     #include <flexc.h>
 *
 *     int rc = fx_safetensors_open(&f, "model.safetensors");
 *     if (rc != FX_OK) {
 *         fprintf(stderr, "%s: %s\n", fx_strerror(rc), fx_last_error());
 *         return 1;
 *     }
 *
 * Conventions (see docs/api.md):
 *   - a function that can fail returns FX_OK (0) or a negative fx_status, and never prints,
 *     exits or aborts on bad input; fx_last_error() then says what was wrong;
 *   - arguments are checked before any work, so outputs stay untouched on such errors;
 *   - tensors are contiguous row-major float32 with int64_t sizes;
 *   - results are bitwise identical for any thread count;
 *   - a destructor, which only releases an object, is named _free (fx_safetensors_close and
 *     fx_safetensors_index_close are its deprecated aliases); fx_token_writer_close (commits
 *     a file, returns a status) and fx_comm_log_close (ends a process-wide log) are no
 *     destructors and keep _close.
 */
#ifndef FLEXC_H
#define FLEXC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLEXC_BUILDING) && defined(__GNUC__)
#define FX_API __attribute__((visibility("default")))
#else
#define FX_API
#endif

#define FX_VERSION_MAJOR 0
#define FX_VERSION_MINOR 1
#define FX_VERSION_PATCH 0
#define FX_VERSION_STRING "0.1.0"
/* Single number for compile-time comparisons: 0.1.0 -> 100. */
#define FX_VERSION (FX_VERSION_MAJOR * 10000 + FX_VERSION_MINOR * 100 + FX_VERSION_PATCH)

/* ---- status codes -------------------------------------------------------------------- */

/* X(name, value, message): the one list the enum, fx_strerror and fx_status_name come from. */
#define FX_STATUS_LIST(X)                                                        \
    X(FX_OK, 0, "success")                                                       \
    X(FX_EINVAL, -1, "invalid argument")                                         \
    X(FX_ENOMEM, -2, "out of memory")                                            \
    X(FX_EIO, -3, "input/output error")                                          \
    X(FX_EFORMAT, -4, "malformed or unsafe file")                                \
    X(FX_ERANGE, -5, "index out of range")                                       \
    X(FX_EUNSUPPORTED, -6, "not supported")                                      \
    X(FX_ETIMEDOUT, -7, "timed out")                                             \
    X(FX_ECOMM, -8, "communication failure")                                     \
    X(FX_EDEVICE, -9, "CUDA device error")

typedef enum fx_status {
#define FX_STATUS_ENUM_(name, value, msg) name = value,
    FX_STATUS_LIST(FX_STATUS_ENUM_)
#undef FX_STATUS_ENUM_
} fx_status;

/* A short description of a status code ("invalid argument"); "unknown status" otherwise. */
FX_API const char *fx_strerror(int code);
/* The enum name of a status code ("FX_EINVAL"); "FX_UNKNOWN" otherwise. */
FX_API const char *fx_status_name(int code);
/* What was wrong in the last failed call on this thread ("target[17] = 50300 is outside
   [0, 50257)"); "" when nothing has failed. The pointer is valid until the next flexc call
   on this thread. */
FX_API const char *fx_last_error(void);
FX_API void fx_clear_error(void);

/* ---- version --------------------------------------------------------------------------- */

/* The version of the library that is linked, "MAJOR.MINOR.PATCH". */
FX_API const char *fx_version(void);

/* ---- logging ----------------------------------------------------------------------------- */

typedef enum fx_log_level { FX_LOG_DEBUG = 0, FX_LOG_INFO = 1, FX_LOG_WARN = 2, FX_LOG_ERROR = 3 } fx_log_level;
/* The library logs only through this hook; by default nothing is logged. msg has no newline. */
typedef void (*fx_log_fn)(fx_log_level level, const char *msg, void *user);
/* fn == NULL turns logging off. Messages below min_level are dropped before formatting. */
FX_API void fx_set_log_callback(fx_log_fn fn, void *user, fx_log_level min_level);

/* ---- threads ----------------------------------------------------------------------------- */

/* Threads used by flexc's kernels and matrix products (OpenMP). 1 <= n <= a bound: the larger
   of 4 x the cores online and 256, never above what the process may create (RLIMIT_NPROC,
   kernel.threads-max); a larger n returns FX_EINVAL, fx_last_error() naming n and the bound,
   and the count stays as it was. The default follows OMP_NUM_THREADS, else the number of
   cores; fx_get_num_threads() returns the count in effect. A build without OpenMP checks n
   the same way and runs on one thread. */
FX_API int fx_set_num_threads(int n);
FX_API int fx_get_num_threads(void);

/* ---- CPU path ---------------------------------------------------------------------------- */

/* Kernels pick a path at run time: the best the CPU supports, capped by the environment
   variable FLEXC_ISA (scalar|avx2|avx512) or by fx_set_isa(). The scalar path is the
   reference that the others are tested against. */
typedef enum fx_isa { FX_ISA_SCALAR = 0, FX_ISA_AVX2 = 1, FX_ISA_AVX512 = 2 } fx_isa;
FX_API fx_isa fx_get_isa(void);
/* FX_EUNSUPPORTED when this CPU (or this build) cannot run that path. */
FX_API int fx_set_isa(fx_isa isa);
FX_API const char *fx_isa_name(fx_isa isa);

/* ---- element types ----------------------------------------------------------------------- */

/* The element types of tensors: those of the safetensors format (docs/safetensors.md), and the
   dtype of an attention or loss call (fx_attention.dtype, fx_lce.dtype). FX_DT_BOOL is 0, so a
   zero-initialised call struct reads 0 there; those calls take 0 as float32 (see their
   headers). */
typedef enum fx_dtype {
    FX_DT_BOOL, FX_DT_U8, FX_DT_I8, FX_DT_I16, FX_DT_U16, FX_DT_F16, FX_DT_BF16,
    FX_DT_I32, FX_DT_U32, FX_DT_F32, FX_DT_F64, FX_DT_I64, FX_DT_U64,
    FX_DT_F8_E4M3, FX_DT_F8_E5M2 /* more may follow */
} fx_dtype;
/* The number of dtypes above: valid values are 0 .. FX_DT_COUNT-1. */
#define FX_DT_COUNT 15

/* Bytes per element (1, 2, 4 or 8); 0 when dt is not a dtype. */
FX_API size_t fx_dtype_size(fx_dtype dt);
/* The name the safetensors format uses ("F32", "BF16", "F8_E4M3", ...); NULL when dt is not a
   dtype. */
FX_API const char *fx_dtype_name(fx_dtype dt);
/* The dtype spelled `name` exactly (upper case, as in files); FX_EINVAL otherwise. */
FX_API int fx_dtype_from_name(fx_dtype *out, const char *name);

/* ---- CUDA devices ------------------------------------------------------------------------ */

/* CUDA devices this process can use (docs/cuda.md): 0 when the library was built without
   CUDA, when no driver is installed, or when no GPU is visible. Calls name device k - 1 with
   device = k in their parameters (fx_attention, fx_lce); device = 0 is the CPU. */
FX_API int fx_cuda_device_count(void);

/* ---- memory accounting ------------------------------------------------------------------- */

/* Bytes the library holds now, and the most it held since the last reset (this counts the
   library's own scratch and objects, not the caller's tensors). */
FX_API void fx_mem_stats(size_t *current, size_t *peak);
FX_API void fx_mem_reset_peak(void);

/* ---- struct layouts ---------------------------------------------------------------------- */

/* The layout this library was compiled with of a public struct that callers allocate and that
   bindings in other languages mirror (the Python package's ctypes structures): the call
   structs fx_attention and fx_lce and the built-in mods' contexts (fx_mask_*_ctx,
   fx_score_*_ctx). With field NULL, *size is sizeof(struct_name) and *offset 0; else the
   field's offsetof and sizeof. Either output may be NULL. FX_EINVAL for a struct or field the
   table does not hold (fx_last_error() names it).

       size_t off, size;
       fx_abi_layout("fx_attention", "dtype", &off, &size);    // offsetof, sizeof the field */
FX_API int fx_abi_layout(const char *struct_name, const char *field, size_t *offset, size_t *size);
/* The i-th field of struct_name in declaration order; NULL past the last or for an unknown
   struct. */
FX_API const char *fx_abi_field(const char *struct_name, size_t i);
/* The i-th struct the table holds ("fx_attention", ...); NULL past the last. */
FX_API const char *fx_abi_struct(size_t i);

#ifdef __cplusplus
}
#endif

#include "flexc/rng.h"
#include "flexc/safetensors.h"
#include "flexc/attention.h"
#include "flexc/mod.h"
#include "flexc/lce.h"
#include "flexc/comm.h"
#include "flexc/model.h"
#include "flexc/tokenizer.h"

#endif /* FLEXC_H */
