"""flexc for PyTorch: FlexAttention and the fused linear + cross-entropy loss as autograd-capable
`torch.library` custom ops on CPU, with PyTorch 2.15's names and signatures.

    import flexc.torch as ft
    mask = ft.create_block_mask(ft.causal_mask, None, None, L, L)        # analytic, O(blocks)
    out = ft.flex_attention(q, k, v, block_mask=mask, score_mod=ft.softcap(30.0))
    loss = ft.linear_cross_entropy(h, lm_head.weight, target)          # no [N, V] logits

Every parameter of PyTorch's functions is accepted; a value flexc does not support raises
NotImplementedError naming it. Tensors are computed in float32 on the CPU (bfloat16 and
float16 inputs are computed in float32 and returned in their dtype); results and gradients
are bitwise the same for any thread count. See docs/python.md.
"""
import ctypes
import math
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _lib, _trace

__all__ = [
    "flex_attention", "create_block_mask", "BlockMask", "from_torch_block_mask", "and_masks", "or_masks",
    "noop_mask", "causal_mask", "sliding_window_mask", "prefix_lm_mask", "document_mask", "alibi", "softcap",
    "rel_bias", "linear_cross_entropy", "LinearCrossEntropyLoss", "block_mask_max_bytes", "set_block_mask_max_bytes",
]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)

# ---- threads ----------------------------------------------------------------------------------

class _flexc_threads:
    """Runs a call on flexc's thread count (flexc.set_num_threads) and puts the OpenMP count
    back afterwards: flexc and PyTorch share one OpenMP runtime in a process, and each keeps
    its own setting."""

    def __enter__(self):
        from . import _state
        self.saved = None
        n = _state["threads"]
        if n is not None:
            saved = _lib.fx_get_num_threads()
            if n != saved:
                _lib.fx_set_num_threads(n)
                self.saved = saved
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            _lib.fx_set_num_threads(self.saved)
        return False


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else None


# ---- argument checks --------------------------------------------------------------------------


def _check_tensor(t, name, ndim=None, dtypes=_FLOATS):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}: flexc runs on the CPU only (move it with .cpu())")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; flexc takes {names}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")


def _unsupported(name, value, why=""):
    raise NotImplementedError(f"flexc does not support {name}={value!r}{': ' + why if why else ''}")


# ---- masks ------------------------------------------------------------------------------------


class _Mask:
    """A built-in mask_mod: callable as PyTorch's mask_mod(b, h, q_idx, kv_idx) (torch ops, so
    it also works with PyTorch's create_block_mask), and known to flexc's C library, which
    classifies its blocks analytically."""

    def __init__(self, name, fn, ctx, keep, torch_fn):
        self._name, self._fn, self._ctx, self._keep, self._torch_fn = name, fn, ctx, keep, torch_fn

    def __call__(self, b, h, q_idx, kv_idx):
        return self._torch_fn(b, h, q_idx, kv_idx)

    def __repr__(self):
        return self._name

    @property
    def _ctx_ptr(self):
        return ctypes.cast(ctypes.pointer(self._ctx), ctypes.c_void_p).value if self._ctx is not None else None


def noop_mask(b, h, q_idx, kv_idx):
    """Every key visible (PyTorch's noop_mask)."""
    return b.new_ones(size=(), dtype=torch.bool)


causal_mask = _Mask("causal_mask", _lib.addr("fx_mask_causal"), None, (), lambda b, h, q, kv: q >= kv)


def sliding_window_mask(window):
    """Causal with a window: kv_idx <= q_idx and q_idx - kv_idx < window."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window_mask: window must be an int >= 1, got {window!r}")
    ctx = _lib.SlidingWindowCtx(window)
    return _Mask(f"sliding_window_mask({window})", _lib.addr("fx_mask_sliding_window"), ctx, (),
                 lambda b, h, q, kv: (q >= kv) & (q - kv < window))


def _as_i64(x, name):
    t = torch.as_tensor(x)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must hold integers, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}: flexc runs on the CPU only")
    return t.to(torch.int64).contiguous()


def prefix_lm_mask(lengths):
    """Bidirectional over each batch row's prefix, causal after it: kv_idx < lengths[b] or
    kv_idx <= q_idx. lengths: an int or one per batch row ([B]; rows past its end use the last)."""
    t = _as_i64(lengths, "prefix_lm_mask: lengths").reshape(-1)
    if t.numel() < 1:
        raise ValueError("prefix_lm_mask: lengths is empty")
    ctx = _lib.PrefixLmCtx(ctypes.cast(t.data_ptr(), _lib.c_i64p), t.numel())
    n = t.numel()
    return _Mask(f"prefix_lm_mask({t.tolist()})", _lib.addr("fx_mask_prefix_lm"), ctx, (t,),
                 lambda b, h, q, kv: (kv < t[b.clamp(max=n - 1)]) | (q >= kv))


def document_mask(doc_ids):
    """Causal within a document: doc_ids[q_idx] == doc_ids[kv_idx] and kv_idx <= q_idx. doc_ids:
    [L] (every batch row) or [B, L]."""
    t = _as_i64(doc_ids, "document_mask: doc_ids")
    if t.dim() not in (1, 2) or t.shape[-1] < 1:
        raise ValueError(f"document_mask: doc_ids must be [L] or [B, L], got shape {tuple(t.shape)}")
    t2 = t.reshape(-1, t.shape[-1])
    ctx = _lib.DocumentCtx(ctypes.cast(t2.data_ptr(), _lib.c_i64p), t2.shape[1], t2.shape[1] if t.dim() == 2 else 0)
    if t.dim() == 1:
        fn = lambda b, h, q, kv: (t[q] == t[kv]) & (q >= kv)  # noqa: E731
    else:
        fn = lambda b, h, q, kv: (t2[b, q] == t2[b, kv]) & (q >= kv)  # noqa: E731
    m = _Mask(f"document_mask(shape={tuple(t.shape)})", _lib.addr("fx_mask_document"), ctx, (t2,), fn)
    m._batch_rows = t2.shape[0] if t.dim() == 2 else None
    return m


def _combine(kind, mask_mods):
    name = "and_masks" if kind == "and" else "or_masks"
    for i, m in enumerate(mask_mods):
        if not callable(m):
            raise TypeError(f"{name}: argument {i} is not callable ({type(m).__name__})")

    def torch_fn(b, h, q, kv):
        r = mask_mods[0](b, h, q, kv)
        for m in mask_mods[1:]:
            r = (r & m(b, h, q, kv)) if kind == "and" else (r | m(b, h, q, kv))
        return r

    if not mask_mods:
        empty = (lambda b, h, q, kv: b.new_ones(size=(), dtype=torch.bool)) if kind == "and" else \
            (lambda b, h, q, kv: b.new_zeros(size=(), dtype=torch.bool))
        return empty
    if len(mask_mods) == 1:
        return mask_mods[0]
    if not all(isinstance(m, _Mask) for m in mask_mods):
        return torch_fn
    # Built-ins only: a chain of C pairs, classified analytically.
    fn = _lib.addr("fx_mask_and" if kind == "and" else "fx_mask_or")
    acc = mask_mods[0]
    for m in mask_mods[1:]:
        ctx = _lib.PairCtx(acc._fn, acc._ctx_ptr, m._fn, m._ctx_ptr)
        acc = _Mask(f"{name}({acc!r}, {m!r})", fn, ctx, (acc, m), torch_fn)
    acc._torch_fn = torch_fn
    return acc


def and_masks(*mask_mods):
    """A mask_mod visible where every one of mask_mods is (PyTorch's and_masks)."""
    return _combine("and", mask_mods)


def or_masks(*mask_mods):
    """A mask_mod visible where any one of mask_mods is (PyTorch's or_masks)."""
    return _combine("or", mask_mods)


# Live block masks by handle: the custom ops take the handle (an int), so a compiled graph holds
# no Python object; the graph's autograd context keeps the mask alive until its backward ran.
_masks = weakref.WeakValueDictionary()
_next_handle = [1]


def _free_block_mask(free, ptr):
    if ptr:
        free(ptr)


class BlockMask:
    """A block-sparse mask built by flexc (create_block_mask or from_torch_block_mask): each
    BLOCK_SIZE block of each (b, h) is empty (skipped), full (no masking) or partial (a bitmap).
    B or H equal to 1 means the same for every batch row / head."""

    def __init__(self, ptr, shape, block_size, mask_mod):
        self._ptr = ptr
        self.shape = tuple(shape)
        self.seq_lengths = (shape[2], shape[3])
        self.BLOCK_SIZE = tuple(block_size)
        self.mask_mod = mask_mod
        self._handle = _next_handle[0]
        _next_handle[0] += 1
        _masks[self._handle] = self
        # Not __del__: at interpreter exit module globals (_lib) may already be None when the
        # mask is collected. finalize holds the free function itself, runs at most once (at
        # exit before modules are torn down, or when the mask is collected) and never after.
        self._free = weakref.finalize(self, _free_block_mask, _lib.fx_block_mask_free, ptr)

    def density(self):
        """Visited blocks / all blocks."""
        return _lib.fx_block_mask_density(self._ptr)

    def sparsity(self):
        """Percentage of blocks skipped (as PyTorch's BlockMask.sparsity)."""
        return 100.0 * (1.0 - self.density())

    def nbytes(self):
        """Bytes the mask holds in the C library."""
        return _lib.fx_block_mask_bytes(self._ptr)

    def __repr__(self):
        return (f"flexc.torch.BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={self.sparsity():.2f}%, mask_mod={getattr(self.mask_mod, '__name__', self.mask_mod)!r})")


def _block_size(BLOCK_SIZE):
    bs = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) and not isinstance(BLOCK_SIZE, bool) else BLOCK_SIZE
    if (not isinstance(bs, (tuple, list)) or len(bs) != 2 or
            not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 4096 for x in bs)):
        raise ValueError(f"BLOCK_SIZE must be an int or a pair of ints in [1, 4096], got {BLOCK_SIZE!r}")
    return tuple(bs)


# ---- the size bound -----------------------------------------------------------------------------

_max_bytes = _lib._decl("fx_block_mask_max_bytes", ctypes.c_size_t)
_set_max_bytes = _lib._decl("fx_block_mask_set_max_bytes", None, ctypes.c_size_t)


def block_mask_max_bytes():
    """The most bytes one block mask may take (4 GiB unless set): its block tables, visit lists
    and bitmaps, and the block row a Python mask_mod is evaluated on (8 bytes a position)."""
    return _max_bytes()


def set_block_mask_max_bytes(nbytes):
    """Sets the bound of block_mask_max_bytes for the process (the C library's too); 0 or None
    restores the default. A larger mask is refused with a ValueError before anything is
    allocated."""
    nbytes = 0 if nbytes is None else nbytes
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes < 2 ** 64:
        raise ValueError(f"set_block_mask_max_bytes: nbytes must be an int in [0, 2**64), got {nbytes!r}")
    _set_max_bytes(nbytes)


def _check_mask(rc):
    """_lib.check for the mask builders: a mask over the bound names this module's setter."""
    try:
        _lib.check(rc, "create_block_mask")
    except ValueError as e:
        raise ValueError(str(e).replace("(fx_block_mask_set_max_bytes)", "(flexc.torch.set_block_mask_max_bytes)")) \
            from None


def _check_row_bytes(bq, KV_LEN):
    """A Python mask_mod sees a block row, [BLOCK_SIZE, KV_LEN] positions (int64 indices, a bool
    result): refused, before it is evaluated, when that alone passes the bound."""
    need, limit = 8 * bq * KV_LEN, block_mask_max_bytes()
    if need > limit:
        raise ValueError(f"create_block_mask: mask_mod would be evaluated on block rows of {bq} x {KV_LEN} positions, "
                         f"about {need} bytes each, above the limit of {limit} bytes "
                         "(flexc.torch.set_block_mask_max_bytes)")


_BIT_WEIGHTS = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)


def _pack_rows(bits_ptr, words, rows):
    """Copies rows [nq, kv_len] (bool) into the C row bitmap: bit j % 64 of word j / 64."""
    nq, kv_len = rows.shape
    pad = words * 64 - kv_len
    if pad:
        rows = torch.nn.functional.pad(rows, (0, pad))
    packed = (rows.reshape(nq, words * 8, 8).to(torch.uint8) * _BIT_WEIGHTS).sum(-1, dtype=torch.uint8).contiguous()
    ctypes.memmove(bits_ptr, packed.data_ptr(), nq * words * 8)


def _rows_builder(fill_rows, B, H, Q_LEN, KV_LEN, bq, bk):
    """Runs fx_block_mask_create_rows with a Python fill_rows(b, h, q0, nq) -> bool [nq, KV_LEN];
    an exception raised inside is raised again here."""
    failure = []

    def fill(bits, words, b, h, q0, nq, ctx):
        try:
            _pack_rows(ctypes.cast(bits, ctypes.c_void_p).value, words, fill_rows(b, h, q0, nq))
            return 0
        except BaseException as e:  # noqa: BLE001 - raised again below, after C has cleaned up
            failure.append(e)
            return -1

    cb = _lib.MASK_ROWS_FN(fill)
    out = ctypes.c_void_p()
    rc = _lib.fx_block_mask_create_rows(ctypes.byref(out), cb, None, B, H, Q_LEN, KV_LEN, bq, bk)
    if failure:
        raise failure[0]
    _check_mask(rc)
    return out.value


def _eval_mask_mod(mask_mod, B, H, KV_LEN):
    kv_cache = []  # made at the first row: the C library checks the sizes before it asks for one

    def rows(b, h, q0, nq):
        if not kv_cache:
            kv_cache.append(torch.arange(KV_LEN, dtype=torch.int64).unsqueeze(0))
        kv = kv_cache[0]
        q = torch.arange(q0, q0 + nq, dtype=torch.int64).unsqueeze(1)
        with torch.no_grad():
            r = mask_mod(torch.tensor(b, dtype=torch.int64), torch.tensor(h, dtype=torch.int64), q, kv)
        if not isinstance(r, Tensor):
            raise TypeError(f"mask_mod must return a torch.Tensor of dtype bool, got {type(r).__name__}")
        if r.dtype != torch.bool:
            raise TypeError(f"mask_mod must return a bool tensor, got dtype {r.dtype}")
        try:
            return torch.broadcast_to(r, (nq, KV_LEN))
        except RuntimeError:
            raise ValueError(f"mask_mod returned shape {tuple(r.shape)}, which does not broadcast to the "
                             f"(q_idx, kv_idx) shape ({nq}, {KV_LEN})") from None

    return rows


def _dims(B, H, Q_LEN, KV_LEN):
    def pos(x, name, none_ok):
        if x is None and none_ok:
            return 1
        if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x < 2 ** 63:
            raise ValueError(f"create_block_mask: {name} must be an int in [1, 2**63){' or None' if none_ok else ''}, "
                             f"got {x!r}")
        return x
    return pos(B, "B", True), pos(H, "H", True), pos(Q_LEN, "Q_LEN", False), pos(KV_LEN, "KV_LEN", False)


def _check_batch_rows(mask, B):
    """A [rows, L] document_mask (anywhere in an and/or tree) needs rows >= B."""
    rows = getattr(mask, "_batch_rows", None)
    if rows is not None and rows < B:
        raise ValueError(f"create_block_mask: document_mask has doc_ids for {rows} batch rows; B = {B}")
    for part in mask._keep:
        if isinstance(part, _Mask):
            _check_batch_rows(part, B)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False,
                      separate_full_blocks=True, compute_dq_write_order=False, dq_kv_order=True):
    """PyTorch's create_block_mask. A flexc built-in mask_mod (causal_mask, sliding_window_mask,
    prefix_lm_mask, document_mask and their and_masks / or_masks) is classified analytically in
    O(blocks); any other mask_mod(b, h, q_idx, kv_idx) written with torch ops is traced into a
    mask expression the C library builds (blocks its index arithmetic decides are never
    evaluated); one that cannot be traced is, with a warning, evaluated one block row at a time
    ([BLOCK_SIZE, KV_LEN] per call, never [Q_LEN, KV_LEN]). B or H None: the
    mask is the same for every batch row / head. _compile is accepted and has no effect."""
    if not callable(mask_mod):
        raise TypeError(f"create_block_mask: mask_mod must be callable, got {type(mask_mod).__name__}")
    B, H, Q_LEN, KV_LEN = _dims(B, H, Q_LEN, KV_LEN)
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"create_block_mask: device={device!r}: flexc runs on the CPU only")
    if separate_full_blocks is not True:
        _unsupported("separate_full_blocks", separate_full_blocks, "full blocks are always kept apart")
    if compute_dq_write_order is not False:
        _unsupported("compute_dq_write_order", compute_dq_write_order)
    if dq_kv_order is not True:
        _unsupported("dq_kv_order", dq_kv_order)
    bq, bk = _block_size(BLOCK_SIZE)
    if isinstance(mask_mod, _Mask):
        _check_batch_rows(mask_mod, B)
        out = ctypes.c_void_p()
        rc = _lib.fx_block_mask_create(ctypes.byref(out), mask_mod._fn, mask_mod._ctx_ptr, B, H, Q_LEN, KV_LEN, bq, bk)
        _check_mask(rc)
        ptr = out.value
    else:
        ptr = _traced_mask(mask_mod, B, H, Q_LEN, KV_LEN, bq, bk)
        if ptr is None:
            _check_row_bytes(bq, KV_LEN)
            ptr = _rows_builder(_eval_mask_mod(mask_mod, B, H, KV_LEN), B, H, Q_LEN, KV_LEN, bq, bk)
    return BlockMask(ptr, (B, H, Q_LEN, KV_LEN), (bq, bk), mask_mod)


def _traced_mask(mask_mod, B, H, Q_LEN, KV_LEN, bq, bk):
    """A user's mask_mod traced into a mask expression and built by the C library (blocks whose
    value the expression's index arithmetic decides are never evaluated); None, with a warning
    naming why, when it cannot be traced: the mask is then evaluated by calling the function on
    block rows, which gives the same mask, slowly."""
    try:
        traced = _trace.trace(mask_mod, "mask")
    except TypeError as e:
        import warnings
        warnings.warn(f"create_block_mask: {e}; evaluating mask_mod in Python one block row at a time",
                      stacklevel=3)
        return None
    out = ctypes.c_void_p()
    with _CompiledMod(traced.expr, _mod_inputs(traced.captured)) as mod:
        rc = _lib.fx_block_mask_create_mod(ctypes.byref(out), mod.ptr, B, H, Q_LEN, KV_LEN, bq, bk)
    _check_mask(rc)
    return out.value


def from_torch_block_mask(block_mask):
    """A flexc BlockMask equal to a PyTorch BlockMask: the same blocks visited (full blocks
    unmasked, the others through its mask_mod, evaluated block by block)."""
    from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
    if not isinstance(block_mask, TorchBlockMask):
        raise TypeError(f"from_torch_block_mask: expected a torch BlockMask, got {type(block_mask).__name__}")
    if block_mask.kv_num_blocks.device.type != "cpu":
        block_mask = block_mask.to("cpu")
    Q_LEN, KV_LEN = block_mask.seq_lengths
    bq, bk = _block_size(tuple(block_mask.BLOCK_SIZE))
    kv_num, kv_idx = block_mask.kv_num_blocks, block_mask.kv_indices
    full_num, full_idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    B, H = kv_num.shape[0], kv_num.shape[1]
    mask_mod = block_mask.mask_mod
    _check_row_bytes(bq, KV_LEN)
    kv = torch.arange(KV_LEN, dtype=torch.int64).unsqueeze(0)

    def rows(b, h, q0, nq):
        out = torch.zeros(nq, KV_LEN, dtype=torch.bool)
        qb = q0 // bq
        q = torch.arange(q0, q0 + nq, dtype=torch.int64).unsqueeze(1)
        bt, ht = torch.tensor(b), torch.tensor(h)
        for j in kv_idx[b, h, qb, :int(kv_num[b, h, qb])].tolist():
            k0, k1 = j * bk, min((j + 1) * bk, KV_LEN)
            if k0 < KV_LEN:
                with torch.no_grad():
                    r = mask_mod(bt, ht, q, kv[:, k0:k1])
                out[:, k0:k1] = torch.broadcast_to(r.to(torch.bool), (nq, k1 - k0))
        if full_num is not None:
            for j in full_idx[b, h, qb, :int(full_num[b, h, qb])].tolist():
                out[:, j * bk:min((j + 1) * bk, KV_LEN)] = True
        return out

    ptr = _rows_builder(rows, B, H, Q_LEN, KV_LEN, bq, bk)
    return BlockMask(ptr, (B, H, Q_LEN, KV_LEN), (bq, bk), mask_mod)


# ---- score mods -------------------------------------------------------------------------------

_SCORE_NONE, _SCORE_ALIBI, _SCORE_SOFTCAP, _SCORE_REL_BIAS = 0, 1, 2, 3


class _ScoreMod:
    """A built-in score_mod: callable as PyTorch's score_mod(score, b, h, q_idx, kv_idx)."""

    def __init__(self, name, kind, tensor, f, i, torch_fn):
        self._name, self._kind, self._tensor, self._f, self._i, self._torch_fn = name, kind, tensor, f, i, torch_fn

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self._torch_fn(score, b, h, q_idx, kv_idx)

    def __repr__(self):
        return self._name


def alibi(slopes):
    """score + slopes[h] * (kv_idx - q_idx); slopes [Hq] (constants: they receive no gradient)."""
    _check_tensor(slopes, "alibi: slopes", ndim=1)
    return _ScoreMod("alibi", _SCORE_ALIBI, slopes, 0.0, 0,
                     lambda s, b, h, q, kv: s + slopes[h].to(s.dtype) * (kv - q).to(s.dtype))


def softcap(cap):
    """cap * tanh(score / cap)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"softcap: cap must be a finite number > 0, got {cap!r}")
    cap = float(cap)
    return _ScoreMod(f"softcap({cap})", _SCORE_SOFTCAP, None, cap, 0, lambda s, b, h, q, kv: cap * torch.tanh(s / cap))


def rel_bias(table, zero):
    """score + table[hh, clamp(q_idx - kv_idx + zero, 0, size - 1)], table [heads, size] with heads
    1 (shared) or Hq (hh = h); the table receives its gradient."""
    _check_tensor(table, "rel_bias: table", ndim=2)
    if isinstance(zero, bool) or not isinstance(zero, int):
        raise TypeError(f"rel_bias: zero must be an int, got {type(zero).__name__}")
    size = table.shape[1]

    def fn(s, b, h, q, kv):
        hh = h if table.shape[0] > 1 else torch.zeros_like(h)
        return s + table[hh, (q - kv + zero).clamp(0, size - 1)].to(s.dtype)

    return _ScoreMod(f"rel_bias(zero={zero})", _SCORE_REL_BIAS, table, 0.0, zero, fn)


# ---- mods written by the user ------------------------------------------------------------------

# fx_dtype values of the tensors a mod may read (flexc.h).
_DT_BOOL, _DT_I32, _DT_F32, _DT_I64 = 0, 7, 9, 11
_MOD_DTYPES = {torch.float32: _DT_F32, torch.int64: _DT_I64, torch.int32: _DT_I32, torch.bool: _DT_BOOL}


def _mod_inputs(captured):
    """The captured tensors as the C library reads them: contiguous, float32 / int64 / int32 /
    bool, at least one dimension (a 0-d tensor is read as t[0] of a [1] view). Autograd links
    are kept, so gradients reach the user's tensors."""
    out = []
    for t in captured:
        if t.is_floating_point():
            t = t.to(torch.float32)
        elif t.dtype not in _MOD_DTYPES:
            t = t.to(torch.int64)
        if t.device.type != "cpu":
            raise ValueError(f"a mod's captured tensor is on {t.device}; flexc runs on the CPU")
        out.append(t.reshape(1) if t.ndim == 0 else t)
    return out


class _CompiledMod:
    """An fx_mod compiled from expr over tensors (kept alive with it); grads: float32 buffers the
    backward adds the tensors' gradients into, or None each."""

    def __init__(self, expr, tensors, grads=None):
        self.tensors = [t.contiguous() for t in tensors]
        self.names = [f"t{i}".encode() for i in range(len(tensors))]
        descs = (_lib.ModTensor * max(1, len(tensors)))()
        for i, t in enumerate(self.tensors):
            g = grads[i] if grads is not None else None
            descs[i] = _lib.ModTensor(self.names[i], _MOD_DTYPES[t.dtype], t.ndim, (_lib.c_i64 * 4)(*t.shape),
                                      t.data_ptr(), ctypes.cast(g.data_ptr(), _lib.c_f32p) if g is not None else None)
        self.descs = descs
        ptr = ctypes.c_void_p()
        rc = _lib.fx_mod_compile(ctypes.byref(ptr), expr.encode(), descs, len(tensors))
        _lib.check(rc, f"mod {expr!r}")
        self.ptr = ptr.value

    def close(self):
        if self.ptr:
            _lib.fx_mod_free(self.ptr)
            self.ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- attention op -----------------------------------------------------------------------------


def _attention_struct(q, k, v, mask_ptr, kind, score_t, score_f, score_i, scale, q_offset, grad_table=None):
    B, Hq, Lq, D = q.shape
    Hkv, Lkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    a = _lib.Attention(B, Hq, Hkv, Lq, Lkv, D, Dv, scale, q_offset, mask_ptr, None, None, None)
    keep = None
    if kind == _SCORE_ALIBI:
        keep = _lib.AlibiCtx(ctypes.cast(score_t.data_ptr(), _lib.c_f32p))
        a.score_mod, a.score_mod_grad = _lib.addr("fx_score_alibi"), _lib.addr("fx_score_alibi_grad")
    elif kind == _SCORE_SOFTCAP:
        keep = _lib.SoftcapCtx(score_f)
        a.score_mod, a.score_mod_grad = _lib.addr("fx_score_softcap"), _lib.addr("fx_score_softcap_grad")
    elif kind == _SCORE_REL_BIAS:
        gt = ctypes.cast(grad_table.data_ptr(), _lib.c_f32p) if grad_table is not None else None
        keep = _lib.RelBiasCtx(ctypes.cast(score_t.data_ptr(), _lib.c_f32p), gt, score_t.shape[1], score_i,
                               score_t.shape[0])
        a.score_mod, a.score_mod_grad = _lib.addr("fx_score_rel_bias"), _lib.addr("fx_score_rel_bias_grad")
    if keep is not None:
        a.score_ctx = ctypes.cast(ctypes.pointer(keep), ctypes.c_void_p)
    return a, keep


def _mask_ptr(handle):
    if handle == 0:
        return None
    m = _masks.get(handle)
    if m is None or not m._ptr:
        raise RuntimeError(f"flexc block mask #{handle} no longer exists (keep the BlockMask alive while it is used)")
    return m._ptr


@torch.library.custom_op("flexc::flex_attention", mutates_args=(), device_types="cpu")
def _flex_attention_op(q: Tensor, k: Tensor, v: Tensor, mask: int, score_kind: int, score_t: Optional[Tensor],
                       score_f: float, score_i: int, scale: float, q_offset: int,
                       need_lse: bool = True) -> Tuple[Tensor, Tensor]:
    # need_lse=False (no gradient and no lse asked for): lse comes back empty and the kernel
    # skips computing and writing it.
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    score_t = score_t.contiguous() if score_t is not None else None
    B, Hq, Lq, _ = q.shape
    out = q.new_empty(B, Hq, Lq, v.shape[3])
    lse = q.new_empty(B, Hq, Lq) if need_lse else q.new_empty(0)
    a, keep = _attention_struct(q, k, v, _mask_ptr(mask), score_kind, score_t, score_f, score_i, scale, q_offset)
    with _flexc_threads():
        rc = _lib.fx_flex_attention(ctypes.byref(a), _ptr(q), _ptr(k), _ptr(v), _ptr(out),
                                    _ptr(lse) if need_lse else None)
    del keep
    _lib.check(rc, "flex_attention")
    return out, lse


@_flex_attention_op.register_fake
def _(q, k, v, mask, score_kind, score_t, score_f, score_i, scale, q_offset, need_lse=True):
    B, Hq, Lq, _ = q.shape
    return q.new_empty(B, Hq, Lq, v.shape[3]), (q.new_empty(B, Hq, Lq) if need_lse else q.new_empty(0))


@torch.library.custom_op("flexc::flex_attention_backward", mutates_args=(), device_types="cpu")
def _flex_attention_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, mask: int,
                                score_kind: int, score_t: Optional[Tensor], score_f: float, score_i: int,
                                scale: float, q_offset: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    q, k, v, out, lse, dout = (t.contiguous() for t in (q, k, v, out, lse, dout))
    score_t = score_t.contiguous() if score_t is not None else None
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dtable = torch.zeros_like(score_t) if score_kind == _SCORE_REL_BIAS else q.new_zeros(0)
    a, keep = _attention_struct(q, k, v, _mask_ptr(mask), score_kind, score_t, score_f, score_i, scale, q_offset,
                                dtable if score_kind == _SCORE_REL_BIAS else None)
    with _flexc_threads():
        rc = _lib.fx_flex_attention_backward(ctypes.byref(a), _ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse),
                                             _ptr(dout), _ptr(dq), _ptr(dk), _ptr(dv))
    del keep
    _lib.check(rc, "flex_attention backward")
    return dq, dk, dv, dtable


@_flex_attention_backward_op.register_fake
def _(q, k, v, out, lse, dout, mask, score_kind, score_t, score_f, score_i, scale, q_offset):
    # Contiguous, as the real kernel's outputs are (compiled graphs check the strides).
    dtable = score_t.new_empty(score_t.shape) if score_kind == _SCORE_REL_BIAS else q.new_empty(0)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dtable


def _save_attention(ctx, q, k, v, mask, output, params, extra):
    """The attention ops' autograd context: the inputs, the output and lse, and what else the
    backward reads; the block mask is kept alive until the backward ran."""
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *extra)
    ctx.params = params
    ctx.block_mask = _masks.get(mask) if mask else None
    ctx.set_materialize_grads(False)


def _no_lse_grad(dlse):
    if dlse is not None:
        raise NotImplementedError("flexc's flex_attention has no gradient through the returned lse "
                                  "(return_lse / return_aux); use the lse as a constant (.detach())")


def _fa_setup_context(ctx, inputs, output):
    q, k, v, mask, score_kind, score_t, score_f, score_i, scale, q_offset, need_lse = inputs
    _save_attention(ctx, q, k, v, mask, output, (mask, score_kind, score_f, score_i, scale, q_offset), (score_t,))


def _fa_backward(ctx, dout, dlse):
    _no_lse_grad(dlse)
    q, k, v, out, lse, score_t = ctx.saved_tensors
    mask, score_kind, score_f, score_i, scale, q_offset = ctx.params
    if dout is None:
        return (None,) * 11
    if lse.numel() == 0:
        raise RuntimeError("flex_attention ran without a gradient in view (need_lse=False): it kept no lse "
                           "to differentiate with")
    dq, dk, dv, dtable = _flex_attention_backward_op(q, k, v, out, lse, dout, mask, score_kind, score_t, score_f,
                                                     score_i, scale, q_offset)
    return dq, dk, dv, None, None, (dtable if score_kind == _SCORE_REL_BIAS else None), None, None, None, None, None


torch.library.register_autograd("flexc::flex_attention", _fa_backward, setup_context=_fa_setup_context)


def _mod_attention_struct(q, k, v, mask_ptr, mod, scale, q_offset):
    B, Hq, Lq, D = q.shape
    a = _lib.Attention(B, Hq, k.shape[1], Lq, k.shape[2], D, v.shape[3], scale, q_offset, mask_ptr, None, None, None)
    a.score_mod, a.score_mod_grad = _lib.addr("fx_mod_score"), _lib.addr("fx_mod_score_grad")
    a.score_ctx = mod.ptr
    return a


@torch.library.custom_op("flexc::flex_attention_mod", mutates_args=(), device_types="cpu")
def _flex_attention_mod_op(q: Tensor, k: Tensor, v: Tensor, mask: int, expr: str, captured: List[Tensor],
                           scale: float, q_offset: int, need_lse: bool = True) -> Tuple[Tensor, Tensor]:
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    B, Hq, Lq, _ = q.shape
    out = q.new_empty(B, Hq, Lq, v.shape[3])
    lse = q.new_empty(B, Hq, Lq) if need_lse else q.new_empty(0)
    with _CompiledMod(expr, captured) as mod:
        a = _mod_attention_struct(q, k, v, _mask_ptr(mask), mod, scale, q_offset)
        with _flexc_threads():
            rc = _lib.fx_flex_attention(ctypes.byref(a), _ptr(q), _ptr(k), _ptr(v), _ptr(out),
                                        _ptr(lse) if need_lse else None)
    _lib.check(rc, "flex_attention")
    return out, lse


@_flex_attention_mod_op.register_fake
def _(q, k, v, mask, expr, captured, scale, q_offset, need_lse=True):
    B, Hq, Lq, _ = q.shape
    return q.new_empty(B, Hq, Lq, v.shape[3]), (q.new_empty(B, Hq, Lq) if need_lse else q.new_empty(0))


@torch.library.custom_op("flexc::flex_attention_mod_backward", mutates_args=(), device_types="cpu")
def _flex_attention_mod_backward_op(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                                    mask: int, expr: str, captured: List[Tensor], scale: float,
                                    q_offset: int) -> List[Tensor]:
    """[dq, dk, dv, then the gradient of each captured tensor (empty for an integer one)]."""
    q, k, v, out, lse, dout = (t.contiguous() for t in (q, k, v, out, lse, dout))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads = [torch.zeros(t.shape, dtype=torch.float32) if t.dtype == torch.float32 else None for t in captured]
    with _CompiledMod(expr, captured, grads) as mod:
        a = _mod_attention_struct(q, k, v, _mask_ptr(mask), mod, scale, q_offset)
        with _flexc_threads():
            rc = _lib.fx_flex_attention_backward(ctypes.byref(a), _ptr(q), _ptr(k), _ptr(v), _ptr(out), _ptr(lse),
                                                 _ptr(dout), _ptr(dq), _ptr(dk), _ptr(dv))
    _lib.check(rc, "flex_attention backward")
    return [dq, dk, dv] + [g if g is not None else q.new_empty(0) for g in grads]


@_flex_attention_mod_backward_op.register_fake
def _(q, k, v, out, lse, dout, mask, expr, captured, scale, q_offset):
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)] + [
        t.new_empty(t.shape, dtype=torch.float32) if t.dtype == torch.float32 else q.new_empty(0) for t in captured]


def _fam_setup_context(ctx, inputs, output):
    q, k, v, mask, expr, captured, scale, q_offset, need_lse = inputs
    _save_attention(ctx, q, k, v, mask, output, (mask, expr, scale, q_offset), captured)


def _fam_backward(ctx, dout, dlse):
    _no_lse_grad(dlse)
    mask, expr, scale, q_offset = ctx.params
    q, k, v, out, lse, *captured = ctx.saved_tensors
    if dout is None:
        return (None,) * 9
    if lse.numel() == 0:
        raise RuntimeError("flex_attention ran without a gradient in view (need_lse=False): it kept no lse "
                           "to differentiate with")
    g = _flex_attention_mod_backward_op(q, k, v, out, lse, dout, mask, expr, captured, scale, q_offset)
    dcap = [gi if t.dtype == torch.float32 else None for gi, t in zip(g[3:], captured)]
    return g[0], g[1], g[2], None, None, dcap, None, None, None


torch.library.register_autograd("flexc::flex_attention_mod", _fam_backward, setup_context=_fam_setup_context)

_torch_mask_cache = weakref.WeakKeyDictionary()


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None, q_offset=0):
    """PyTorch's flex_attention on flexc's kernels: query [B, Hq, L, E], key [B, Hkv, S, E],
    value [B, Hkv, S, Ev] -> [B, Hq, L, Ev] (and the natural-log lse [B, Hq, L] with
    return_lse=True or return_aux=AuxRequest(lse=True)). score_mod: None, a flexc built-in
    (alibi, softcap, rel_bias), or any score_mod(score, b, h, q_idx, kv_idx) written with torch
    operations, traced into flexc's mod expressions (docs/python.md; TypeError naming what
    cannot be traced; captured tensors that require grad receive their gradient). block_mask: a flexc BlockMask, or a PyTorch one (converted once
    and cached). q_offset (flexc's): the absolute position of query row 0, for decoding with a
    KV cache. Gradients flow to query, key, value, a rel_bias table and a traced score_mod's
    captured float tensors."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _check_tensor(t, name, ndim=4)
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must have one dtype, got {query.dtype}, {key.dtype}, {value.dtype}")
    B, Hq, L, E = query.shape
    if key.shape[0] != B or value.shape[0] != B:
        raise ValueError(f"batch sizes differ: query {B}, key {key.shape[0]}, value {value.shape[0]}")
    if key.shape[3] != E:
        raise ValueError(f"key's last dimension {key.shape[3]} must equal query's {E}")
    if value.shape[1] != key.shape[1] or value.shape[2] != key.shape[2]:
        raise ValueError(f"value {tuple(value.shape)} must have key's heads and length {tuple(key.shape[1:3])}")
    if min(query.shape) < 1 or min(key.shape) < 1 or value.shape[3] < 1:
        raise ValueError(f"empty query, key or value: {tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
    Hkv = key.shape[1]
    if Hq != Hkv:
        if not enable_gqa:
            raise ValueError(f"query has {Hq} heads and key {Hkv}: pass enable_gqa=True for grouped-query attention")
        if Hq % Hkv:
            raise ValueError(f"enable_gqa: query heads {Hq} must be a multiple of key heads {Hkv}")
    if kernel_options is not None:
        _unsupported("kernel_options", kernel_options, "flexc picks its own kernels")
    want_lse = bool(return_lse)
    if return_aux is not None:
        if return_lse:
            raise ValueError("pass return_lse or return_aux, not both")
        if getattr(return_aux, "max_scores", False):
            _unsupported("return_aux", return_aux, "max_scores is not computed")
        want_lse = bool(getattr(return_aux, "lse", False))
    if isinstance(q_offset, bool) or not isinstance(q_offset, int) or q_offset < 0:
        raise ValueError(f"q_offset must be an int >= 0, got {q_offset!r}")
    if scale is None:
        scale_f = 0.0
    else:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale == 0:
            raise ValueError(f"scale must be a finite non-zero number or None, got {scale!r}")
        scale_f = float(scale)

    kind, score_t, score_f, score_i = _SCORE_NONE, None, 0.0, 0
    traced = None
    if score_mod is not None and not isinstance(score_mod, _ScoreMod):
        if not callable(score_mod):
            raise TypeError(f"score_mod must be callable, got {type(score_mod).__name__}")
        traced = _trace.trace(score_mod, "score")
    elif score_mod is not None:
        kind, score_t, score_f, score_i = score_mod._kind, score_mod._tensor, score_mod._f, score_mod._i
        if kind == _SCORE_ALIBI:
            if score_t.shape[0] != Hq:
                raise ValueError(f"alibi: slopes has {score_t.shape[0]} entries, query has {Hq} heads")
            if score_t.requires_grad and torch.is_grad_enabled():
                _unsupported("alibi(slopes) with slopes.requires_grad", True, "slopes receive no gradient; detach them")
        if kind == _SCORE_REL_BIAS and score_t.shape[0] not in (1, Hq):
            raise ValueError(f"rel_bias: table has {score_t.shape[0]} heads; it must have 1 or Hq = {Hq}")
        if score_t is not None:
            score_t = score_t.to(torch.float32)

    handle = 0
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
            if not isinstance(block_mask, TorchBlockMask):
                raise TypeError(f"block_mask must be a flexc or PyTorch BlockMask, got {type(block_mask).__name__}")
            converted = _torch_mask_cache.get(block_mask)
            if converted is None:
                converted = from_torch_block_mask(block_mask)
                _torch_mask_cache[block_mask] = converted
            block_mask = converted
        mB, mH, mQ, mK = block_mask.shape
        if mB not in (1, B) or mH not in (1, Hq):
            raise ValueError(f"block_mask is for B = {mB}, H = {mH}; the call has B = {B}, Hq = {Hq}")
        if mQ < q_offset + L or mK < key.shape[2]:
            raise ValueError(f"block_mask covers {mQ} x {mK} positions; the call needs {q_offset + L} x {key.shape[2]}")
        handle = block_mask._handle

    dtype = query.dtype
    q32, k32, v32 = (t.to(torch.float32) for t in (query, key, value))
    if traced is not None:
        captured = _mod_inputs(traced.captured)
        need_lse = want_lse or (torch.is_grad_enabled() and
                                any(t.requires_grad for t in [query, key, value] + captured))
        out, lse = _flex_attention_mod_op(q32, k32, v32, handle, traced.expr, captured, scale_f, q_offset, need_lse)
        out = out.to(dtype)
        if return_aux is not None:
            from torch.nn.attention.flex_attention import AuxOutput
            return out, AuxOutput(lse=lse if want_lse else None, max_scores=None)
        return (out, lse) if want_lse else out
    # Without a gradient to take or an lse to return, the kernel need not compute the lse.
    need_lse = want_lse or (torch.is_grad_enabled() and
                            any(t is not None and t.requires_grad for t in (query, key, value, score_t)))
    out, lse = _flex_attention_op(q32, k32, v32, handle, kind, score_t, score_f, score_i, scale_f, q_offset,
                                  need_lse)
    out = out.to(dtype)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse if want_lse else None, max_scores=None)
    return (out, lse) if want_lse else out


# ---- fused linear + cross-entropy --------------------------------------------------------------

_REDUCTIONS = {"mean": 0, "sum": 1, "none": 2}


def _lce_struct(h, w, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk):
    return _lib.Lce(h.shape[0], h.shape[1], w.shape[0], ignore_index, reduction, label_smoothing, z_loss, softcap_,
                    chunk, 0)


@torch.library.custom_op("flexc::linear_cross_entropy", mutates_args=(), device_types="cpu")
def _lce_op(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, reduction: int, ignore_index: int,
            label_smoothing: float, z_loss: float, softcap_: float, chunk: int, with_grad: bool,
            retain: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    h, w, target = h.contiguous(), w.contiguous(), target.contiguous()
    bias = bias.contiguous() if bias is not None else None
    N = h.shape[0]
    loss = h.new_empty(N if reduction == 2 else ())
    lse = h.new_empty(N)
    dh = torch.empty_like(h) if with_grad else h.new_empty(0)
    dw = torch.zeros_like(w) if with_grad else h.new_empty(0)
    db = torch.zeros_like(bias) if with_grad and bias is not None else h.new_empty(0)
    p = _lce_struct(h, w, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk)
    with _flexc_threads():
        rc = _lib.fx_linear_cross_entropy(ctypes.byref(p), _ptr(h), _ptr(w), _ptr(bias), _ptr(target), _ptr(loss),
                                          _ptr(lse), _ptr(dh) if with_grad else None, _ptr(dw) if with_grad else None,
                                          _ptr(db) if with_grad and bias is not None else None)
    _lib.check(rc, "linear_cross_entropy")
    return loss, lse, dh, dw, db


@_lce_op.register_fake
def _(h, w, bias, target, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk, with_grad, retain):
    N = h.shape[0]
    loss = h.new_empty(N if reduction == 2 else ())
    dh = h.new_empty(h.shape) if with_grad else h.new_empty(0)
    dw = w.new_empty(w.shape) if with_grad else h.new_empty(0)
    db = bias.new_empty(bias.shape) if with_grad and bias is not None else h.new_empty(0)
    return loss, h.new_empty(N), dh, dw, db


@torch.library.custom_op("flexc::linear_cross_entropy_backward", mutates_args=(), device_types="cpu")
def _lce_backward_op(h: Tensor, w: Tensor, bias: Optional[Tensor], target: Tensor, lse: Tensor, grad_loss: Tensor,
                     reduction: int, ignore_index: int, label_smoothing: float, z_loss: float, softcap_: float,
                     chunk: int) -> Tuple[Tensor, Tensor, Tensor]:
    h, w, target, lse = h.contiguous(), w.contiguous(), target.contiguous(), lse.contiguous()
    bias = bias.contiguous() if bias is not None else None
    g = grad_loss.to(torch.float32).contiguous()
    dh, dw = torch.empty_like(h), torch.zeros_like(w)
    db = torch.zeros_like(bias) if bias is not None else h.new_empty(0)
    p = _lce_struct(h, w, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk)
    with _flexc_threads():
        rc = _lib.fx_linear_cross_entropy_backward(ctypes.byref(p), _ptr(h), _ptr(w), _ptr(bias), _ptr(target),
                                                   _ptr(lse), _ptr(g), _ptr(dh), _ptr(dw),
                                                   _ptr(db) if bias is not None else None)
    _lib.check(rc, "linear_cross_entropy backward")
    return dh, dw, db


@_lce_backward_op.register_fake
def _(h, w, bias, target, lse, grad_loss, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk):
    db = bias.new_empty(bias.shape) if bias is not None else h.new_empty(0)
    return h.new_empty(h.shape), w.new_empty(w.shape), db


def _lce_setup_context(ctx, inputs, output):
    h, w, bias, target, reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk, with_grad, retain = inputs
    loss, lse, dh, dw, db = output
    ctx.has_bias = bias is not None
    ctx.with_grad, ctx.retain = with_grad, retain
    ctx.params = (reduction, ignore_index, label_smoothing, z_loss, softcap_, chunk)
    if with_grad:
        # The gradients of the reduced loss, from the forward pass (detached: they are returned as
        # gradients, which carry no graph).
        ctx.save_for_backward(dh.detach(), dw.detach(), db.detach())
    else:
        ctx.save_for_backward(h, w, bias, target, lse)
    ctx.set_materialize_grads(False)


def _lce_backward(ctx, gloss, glse, gdh, gdw, gdb):
    if glse is not None or gdh is not None or gdw is not None or gdb is not None:
        raise RuntimeError("flexc's linear_cross_entropy: only the loss is differentiable")
    if gloss is None:
        return (None,) * 12
    reduction = ctx.params[0]
    if ctx.with_grad:
        dh, dw, db = ctx.saved_tensors
        g = gloss.to(dh.dtype)
        if ctx.retain:
            dh, dw, db = dh * g, dw * g, db * g
        else:
            # Scaled in place: no second gradient-sized buffer. A second backward through this
            # graph then fails autograd's saved-tensor version check, as PyTorch's chunked path
            # does unless LinearCrossEntropyOptions(allow_retain_graph=True).
            dh.mul_(g), dw.mul_(g), db.mul_(g)
        db = db if ctx.has_bias else None
    else:
        h, w, bias, target, lse = ctx.saved_tensors
        g = gloss if reduction == 2 else gloss.reshape(1)
        dh, dw, db = _lce_backward_op(h, w, bias, target, lse, g, *ctx.params)
        db = db if ctx.has_bias else None
    return dh, dw, db, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("flexc::linear_cross_entropy", _lce_backward, setup_context=_lce_setup_context)


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=None, label_smoothing=0.0, options=None, z_loss=0.0, softcap=0.0):
    """PyTorch's F.linear_cross_entropy on flexc's fused kernel: cross_entropy(input @ W^T + bias,
    target) without the [N, V] logits. input [N, D] or [D], linear_weight [V, D], target [N] or []
    of class indices (int64). ignore_index None means -100. flexc's z_loss adds z_loss * lse^2
    per token; softcap > 0 caps the logits at softcap * tanh(logit / softcap). options: a
    LinearCrossEntropyOptions, or None (flexc always runs chunked; batch_chunk_size sets its
    chunk). Gradients flow to input, linear_weight and linear_bias."""
    _check_tensor(input, "input")
    _check_tensor(linear_weight, "linear_weight", ndim=2)
    if linear_bias is not None:
        _check_tensor(linear_bias, "linear_bias")
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype.is_floating_point:
        _unsupported("target", f"<{target.dtype} class probabilities>", "targets are class indices (int64)")
    _check_tensor(target, "target", dtypes=(torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8))
    if weight is not None:
        _unsupported("weight", "<tensor>", "per-class weights")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if ignore_index is None:
        ignore_index = -100
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int or None, got {type(ignore_index).__name__}")
    for name, val in (("label_smoothing", label_smoothing), ("z_loss", z_loss), ("softcap", softcap)):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
            raise ValueError(f"{name} must be a finite number, got {val!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    if softcap < 0 or z_loss < 0:
        raise ValueError(f"z_loss = {z_loss} and softcap = {softcap} must be >= 0")
    chunk, out_of_place = 0, False
    if options is not None:
        for field in ("batch_chunk_size", "acc_dtype", "allow_retain_graph"):
            if not hasattr(options, field):
                raise TypeError(f"options must be a LinearCrossEntropyOptions, got {type(options).__name__}")
        if options.acc_dtype not in (None, torch.float32):
            _unsupported("options.acc_dtype", options.acc_dtype, "flexc accumulates in float32")
        if options.batch_chunk_size is not None:
            chunk = int(options.batch_chunk_size)
        out_of_place = bool(options.allow_retain_graph)

    if input.dim() not in (1, 2):
        raise ValueError(f"input must be [N, D] or [D], got shape {tuple(input.shape)}")
    single = input.dim() == 1
    h = input.unsqueeze(0) if single else input
    N, D = h.shape
    V = linear_weight.shape[0]
    if linear_weight.shape[1] != D:
        raise ValueError(f"linear_weight is {tuple(linear_weight.shape)}; its second dimension must be input's D = {D}")
    if tuple(target.shape) != ((N,) if not single else ()):
        raise ValueError(f"target has shape {tuple(target.shape)}; expected {(N,) if not single else ()} for input "
                         f"{tuple(input.shape)}")
    if linear_bias is not None and tuple(linear_bias.shape) != (V,):
        raise ValueError(f"linear_bias has shape {tuple(linear_bias.shape)}; expected ({V},)")
    if N < 1 or D < 1 or V < 1:
        raise ValueError(f"empty input or linear_weight: input {tuple(input.shape)}, linear_weight {(V, D)}")

    dtype = input.dtype
    h32 = h.to(torch.float32)
    w32 = linear_weight.to(torch.float32)
    b32 = linear_bias.to(torch.float32) if linear_bias is not None else None
    t64 = target.reshape(N).to(torch.int64)
    red = _REDUCTIONS[reduction]
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (input, linear_weight, linear_bias))
    with_grad = needs_grad and red != 2
    loss, _, _, _, _ = _lce_op(h32, w32, b32, t64, red, ignore_index, float(label_smoothing), float(z_loss),
                               float(softcap), chunk, with_grad, out_of_place)
    if single and red == 2:
        loss = loss.reshape(())
    return loss.to(dtype)


class LinearCrossEntropyLoss(torch.nn.Module):
    """PyTorch's nn.LinearCrossEntropyLoss on flexc's fused kernel: owns `self.linear`
    (Linear(in_features, num_classes)) and returns linear_cross_entropy(input, linear.weight,
    target, ...). out_features (K-dimensional loss) and per-class weight are not supported."""

    def __init__(self, in_features, num_classes, *, out_features=(), bias=False, device=None, dtype=None,
                 reduction="mean", weight=None, ignore_index=None, label_smoothing=0.0, options=None):
        super().__init__()
        if tuple(out_features) != ():
            _unsupported("out_features", out_features, "K-dimensional losses")
        if weight is not None:
            _unsupported("weight", "<tensor>", "per-class weights")
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device={device!r}: flexc runs on the CPU only")
        self.num_classes = num_classes
        self.out_features = tuple(out_features)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.options = options
        self.register_buffer("weight", None)
        self.linear = torch.nn.Linear(in_features, num_classes, bias=bias, device=device, dtype=dtype)

    def forward(self, input, target):
        return linear_cross_entropy(input, self.linear.weight, target, linear_bias=self.linear.bias,
                                    reduction=self.reduction, ignore_index=self.ignore_index,
                                    label_smoothing=self.label_smoothing, options=self.options)

    def extra_repr(self):
        return (f"in_features={self.linear.in_features}, num_classes={self.num_classes}, "
                f"bias={self.linear.bias is not None}, reduction={self.reduction}, "
                f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}")
