"""ctypes bindings of libflexc: the C declarations this package calls, and its errors.

The library is the one bundled with the package (libflexc.so beside this file), or the file
named by the environment variable FLEXC_LIBRARY (a build tree's build/libflexc.so).
"""
import ctypes
import glob
import os

c_i64 = ctypes.c_int64
c_f32p = ctypes.POINTER(ctypes.c_float)
c_i64p = ctypes.POINTER(ctypes.c_int64)

FX_OK, FX_EINVAL, FX_ENOMEM, FX_ERANGE, FX_EUNSUPPORTED = 0, -1, -2, -5, -6


def _find():
    path = os.environ.get("FLEXC_LIBRARY")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libflexc.so*")))
    if not found:
        raise ImportError(f"flexc: libflexc.so is not in {here} (install the package with `pip install ./python`, "
                          "or set FLEXC_LIBRARY to a built libflexc.so)")
    return found[0]


lib = ctypes.CDLL(_find())

# ---- declarations ---------------------------------------------------------------------------

# The structures below mirror the C structs named by their _c_name_; tests/python/test_abi.py
# checks each one's size and field offsets against the library's own table (fx_abi_layout).
# A field's ctypes type must have the C field's size: the dtype fields (fx_dtype, an enum) are
# c_int, and 0 there means float32 (FX_DT_F32) as it does in C.

MASK_FN = ctypes.CFUNCTYPE(ctypes.c_bool, c_i64, c_i64, c_i64, c_i64, ctypes.c_void_p)
SCORE_FN = ctypes.CFUNCTYPE(None, c_f32p, c_i64, c_i64, c_i64, c_i64, c_i64, c_i64, c_i64, ctypes.c_void_p)
SCORE_GRAD_FN = ctypes.CFUNCTYPE(None, c_f32p, c_f32p, c_i64, c_i64, c_i64, c_i64, c_i64, c_i64, c_i64,
                                 ctypes.c_void_p)
MASK_ROWS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), c_i64, c_i64, c_i64, c_i64, c_i64,
                                ctypes.c_void_p)


class SlidingWindowCtx(ctypes.Structure):
    _c_name_ = "fx_mask_sliding_window_ctx"
    _fields_ = [("window", c_i64)]


class PrefixLmCtx(ctypes.Structure):
    _c_name_ = "fx_mask_prefix_lm_ctx"
    _fields_ = [("prefix_len", c_i64p), ("n", c_i64)]


class DocumentCtx(ctypes.Structure):
    _c_name_ = "fx_mask_document_ctx"
    _fields_ = [("doc_ids", c_i64p), ("len", c_i64), ("batch_stride", c_i64)]


class PairCtx(ctypes.Structure):
    _c_name_ = "fx_mask_pair_ctx"
    _fields_ = [("a", ctypes.c_void_p), ("a_ctx", ctypes.c_void_p), ("b", ctypes.c_void_p), ("b_ctx", ctypes.c_void_p)]


class AlibiCtx(ctypes.Structure):
    _c_name_ = "fx_score_alibi_ctx"
    _fields_ = [("slopes", c_f32p)]


class SoftcapCtx(ctypes.Structure):
    _c_name_ = "fx_score_softcap_ctx"
    _fields_ = [("cap", ctypes.c_float)]


class RelBiasCtx(ctypes.Structure):
    _c_name_ = "fx_score_rel_bias_ctx"
    _fields_ = [("table", c_f32p), ("grad_table", c_f32p), ("size", c_i64), ("zero", c_i64), ("heads", c_i64)]


class ModTensor(ctypes.Structure):
    _c_name_ = "fx_mod_tensor"
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", c_i64 * 4),
                ("data", ctypes.c_void_p), ("grad", c_f32p)]


class Attention(ctypes.Structure):
    _c_name_ = "fx_attention"
    _fields_ = [("B", c_i64), ("Hq", c_i64), ("Hkv", c_i64), ("Lq", c_i64), ("Lkv", c_i64), ("D", c_i64),
                ("Dv", c_i64), ("scale", ctypes.c_float), ("q_offset", c_i64), ("mask", ctypes.c_void_p),
                ("score_mod", ctypes.c_void_p), ("score_mod_grad", ctypes.c_void_p), ("score_ctx", ctypes.c_void_p),
                # where the call runs: all zero is the CPU and float32 (docs/cuda.md)
                ("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("dtype", ctypes.c_int)]


class Lce(ctypes.Structure):
    _c_name_ = "fx_lce"
    _fields_ = [("N", c_i64), ("D", c_i64), ("V", c_i64), ("ignore_index", c_i64), ("reduction", ctypes.c_int),
                ("label_smoothing", ctypes.c_float), ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float),
                ("chunk", c_i64), ("vocab_chunk", c_i64),
                ("device", ctypes.c_int), ("stream", ctypes.c_void_p), ("dtype", ctypes.c_int)]


def _decl(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


vp = ctypes.c_void_p
fx_version = _decl("fx_version", ctypes.c_char_p)
fx_last_error = _decl("fx_last_error", ctypes.c_char_p)
fx_strerror = _decl("fx_strerror", ctypes.c_char_p, ctypes.c_int)
fx_set_num_threads = _decl("fx_set_num_threads", ctypes.c_int, ctypes.c_int)
fx_get_num_threads = _decl("fx_get_num_threads", ctypes.c_int)
fx_block_mask_create = _decl("fx_block_mask_create", ctypes.c_int, ctypes.POINTER(vp), vp, vp, c_i64, c_i64, c_i64,
                             c_i64, c_i64, c_i64)
fx_block_mask_create_rows = _decl("fx_block_mask_create_rows", ctypes.c_int, ctypes.POINTER(vp), MASK_ROWS_FN, vp,
                                  c_i64, c_i64, c_i64, c_i64, c_i64, c_i64)
fx_block_mask_free = _decl("fx_block_mask_free", None, vp)
fx_block_mask_density = _decl("fx_block_mask_density", ctypes.c_double, vp)
fx_block_mask_bytes = _decl("fx_block_mask_bytes", ctypes.c_size_t, vp)
fx_flex_attention = _decl("fx_flex_attention", ctypes.c_int, ctypes.POINTER(Attention), vp, vp, vp, vp, vp)
fx_flex_attention_backward = _decl("fx_flex_attention_backward", ctypes.c_int, ctypes.POINTER(Attention), vp, vp, vp,
                                   vp, vp, vp, vp, vp, vp)
fx_linear_cross_entropy = _decl("fx_linear_cross_entropy", ctypes.c_int, ctypes.POINTER(Lce), vp, vp, vp, vp, vp,
                                vp, vp, vp, vp)
fx_abi_layout = _decl("fx_abi_layout", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                      ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
fx_abi_field = _decl("fx_abi_field", ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
fx_abi_struct = _decl("fx_abi_struct", ctypes.c_char_p, ctypes.c_size_t)
fx_linear_cross_entropy_backward = _decl("fx_linear_cross_entropy_backward", ctypes.c_int, ctypes.POINTER(Lce), vp,
                                         vp, vp, vp, vp, vp, vp, vp, vp)
fx_mod_compile = _decl("fx_mod_compile", ctypes.c_int, ctypes.POINTER(vp), ctypes.c_char_p, ctypes.POINTER(ModTensor),
                        ctypes.c_int)
fx_mod_free = _decl("fx_mod_free", None, vp)
fx_mod_is_mask = _decl("fx_mod_is_mask", ctypes.c_bool, vp)
fx_block_mask_create_mod = _decl("fx_block_mask_create_mod", ctypes.c_int, ctypes.POINTER(vp), vp, c_i64, c_i64,
                                 c_i64, c_i64, c_i64, c_i64)


def addr(name):
    """The address of a public function (built-in masks and score mods are recognised by it)."""
    return ctypes.cast(getattr(lib, name), vp).value


# ---- errors ---------------------------------------------------------------------------------


class Error(RuntimeError):
    """A flexc call failed; .status is its fx_status code."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def check(rc, what):
    """Raises for a failed call: ValueError for invalid arguments, IndexError for an index out
    of range, MemoryError, NotImplementedError for unsupported, flexc.Error otherwise."""
    if rc == FX_OK:
        return
    msg = f"{what}: {fx_last_error().decode(errors='replace')}"
    if rc == FX_EINVAL:
        raise ValueError(msg)
    if rc == FX_ERANGE:
        raise IndexError(msg)
    if rc == FX_ENOMEM:
        raise MemoryError(msg)
    if rc == FX_EUNSUPPORTED:
        raise NotImplementedError(msg)
    raise Error(rc, f"{msg} ({fx_strerror(rc).decode()})")
