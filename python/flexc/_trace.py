"""Tracing a user's score_mod / mask_mod into flexc's mod expressions (docs/python.md).

A function written with torch operations, score_mod(score, b, h, q_idx, kv_idx) or
mask_mod(b, h, q_idx, kv_idx), is run once on stand-in 0-d tensors under a TorchFunctionMode
that records every operation: each value it produces becomes an expression of flexc's mod
language (docs/attention.md, "Mods as expressions"), and every tensor the function reads that
is not one of its arguments (a closure's or a global's: a learned bias, document ids) becomes
a captured tensor, named t0, t1, ... in the order first read. The stand-ins never take part in
the result: indexing a captured tensor does not read it, so a function may index with any
expression of the positions.

What cannot become an expression raises a TypeError naming the operation: Python control flow
on a traced value (bool(), int(), float(), .item()), an operation outside the language, a
captured tensor used without indexing, a keyword the lowering does not know.
"""
import math

import torch
from torch.overrides import TorchFunctionMode

# Value kinds, as the language types them.
_F, _I, _B = "float", "int", "bool"


class _TraceError(Exception):
    """Raised inside the tracer; trace() turns it into the TypeError the caller sees (a TypeError
    raised inside a Python operator would be taken for NotImplemented and lose its message)."""


class _Node:
    """One traced value: its expression text and kind."""
    __slots__ = ("expr", "kind")

    def __init__(self, expr, kind):
        self.expr, self.kind = expr, kind


def _kind_of_dtype(dtype):
    if dtype == torch.bool:
        return _B
    if dtype.is_floating_point:
        return _F
    if dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return _I
    raise _TraceError(f"flexc mod: a value of dtype {dtype} (only float, integer and bool values can be traced)")


def _const(x):
    if isinstance(x, bool):
        return _Node("(1 == 1)" if x else "(1 == 0)", _B)
    if isinstance(x, int):
        return _Node(f"({x})" if x < 0 else str(x), _I)
    if isinstance(x, float):
        if not math.isfinite(x):
            raise _TraceError(f"flexc mod: the constant {x!r} (only finite constants)")
        r = repr(x)
        if "e" not in r and "." not in r:
            r += ".0"
        return _Node(f"({r})" if x < 0 else r, _F)
    raise _TraceError(f"flexc mod: a constant of type {type(x).__name__}")


def _promote(*kinds):
    if _F in kinds:
        return _F
    if _I in kinds:
        return _I
    return _B


# Operations by the name torch gives the function (torch.add, Tensor.add, Tensor.__add__ all
# say "add" or "__add__"): how many tensor operands, and how their expressions combine.
_BINARY = {
    "add": "+", "__add__": "+", "__radd__": "+",
    "sub": "-", "subtract": "-", "__sub__": "-", "__rsub__": "-",
    "mul": "*", "multiply": "*", "__mul__": "*", "__rmul__": "*",
    "true_divide": "/", "__truediv__": "/", "__rtruediv__": "/", "__div__": "/", "__rdiv__": "/",
    "floor_divide": "//", "__floordiv__": "//", "__rfloordiv__": "//",
    "remainder": "%", "__mod__": "%", "__rmod__": "%",
    "lt": "<", "__lt__": "<", "less": "<", "le": "<=", "__le__": "<=", "less_equal": "<=",
    "gt": ">", "__gt__": ">", "greater": ">", "ge": ">=", "__ge__": ">=", "greater_equal": ">=",
    "eq": "==", "__eq__": "==", "ne": "!=", "__ne__": "!=", "not_equal": "!=",
    "logical_and": "&&", "__and__": "&&", "__rand__": "&&", "bitwise_and": "&&",
    "logical_or": "||", "__or__": "||", "__ror__": "||", "bitwise_or": "||",
}
_REVERSED = {"__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rdiv__", "__rfloordiv__", "__rmod__", "__rand__", "__ror__",
             "__rpow__"}
_UNARY_FN = {"exp": "exp", "log": "log", "log1p": "log1p", "sqrt": "sqrt", "tanh": "tanh", "sigmoid": "sigmoid",
             "abs": "abs", "__abs__": "abs", "absolute": "abs", "floor": "floor"}
_PASS = {"__get__", "__set__", "dtype", "shape", "device", "ndim", "dim", "size", "requires_grad", "is_floating_point",
         "__format__", "__repr__", "__hash__", "numel", "is_complex", "__len__", "layout", "is_sparse", "grad_fn",
         "_is_view", "data_ptr", "storage_offset", "stride", "is_contiguous", "element_size"}
_CASTS = {"float": _F, "double": _F, "half": _F, "bfloat16": _F, "long": _I, "int": _I, "short": _I, "bool": _B}


class _Tracer(TorchFunctionMode):
    def __init__(self, args):
        super().__init__()
        self.nodes = {}  # id(tensor) -> _Node
        self.keep = []   # the traced tensors, alive so that ids are not reused
        self.captured = []  # tensors read from outside, in order
        for t, name in args:
            self._bind(t, _Node(name, _kind_of_dtype(t.dtype)))

    def _bind(self, t, node):
        self.nodes[id(t)] = node
        self.keep.append(t)
        return t

    def _capture(self, t):
        for i, c in enumerate(self.captured):
            if c is t:
                return i
        if t.ndim > 4:
            raise _TraceError(f"flexc mod: a captured tensor of {t.ndim} dimensions (at most 4)")
        _kind_of_dtype(t.dtype)
        self.captured.append(t)
        return len(self.captured) - 1

    def _node(self, x, what):
        if isinstance(x, torch.Tensor):
            n = self.nodes.get(id(x))
            if n is not None:
                return n
            if x.ndim == 0:  # a 0-d tensor read from outside (a learned scalar): t[0] of a [1] view
                i = self._capture(x)
                return _Node(f"t{i}[0]", _kind_of_dtype(x.dtype))
            raise _TraceError(f"flexc mod: {what} uses a captured tensor of shape {tuple(x.shape)} without indexing it "
                            "(index it with the positions, e.g. bias[h, q_idx - kv_idx])")
        return _const(x)

    def _out(self, node, dtype):
        return self._bind(torch.zeros((), dtype=dtype), node)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        if name in _PASS:
            return func(*args, **kwargs)
        if name in ("__bool__", "item", "__int__", "__float__", "__index__", "tolist", "__nonzero__"):
            raise _TraceError(f"flexc mod: Python control flow or conversion on a traced value ({name}); "
                            "use torch.where instead of if, and keep values as tensors")
        if name == "__getitem__":
            return self._index(args[0], args[1])
        if name in _BINARY:
            return self._binary(name, args, kwargs)
        if name in ("div", "divide"):
            mode = kwargs.pop("rounding_mode", None)
            if mode == "floor":
                return self._binary("floor_divide", args, kwargs)
            if mode is not None:
                raise _TraceError(f"flexc mod: {name} with rounding_mode={mode!r} (only None and 'floor')")
            return self._binary("true_divide", args, kwargs)
        if name in ("pow", "__pow__", "__rpow__", "float_power"):
            a, b = (args[1], args[0]) if name == "__rpow__" else (args[0], args[1])
            na, nb = self._node(a, name), self._node(b, name)
            return self._out(_Node(f"pow({na.expr}, {nb.expr})", _F), torch.float32)
        if name in ("neg", "__neg__", "negative"):
            n = self._node(args[0], name)
            return self._out(_Node(f"(-{n.expr})", n.kind), self._dtype(n.kind))
        if name in ("logical_not", "__invert__", "bitwise_not"):
            n = self._node(args[0], name)
            if n.kind != _B:
                raise _TraceError(f"flexc mod: {name} of a non-bool value")
            return self._out(_Node(f"(!{n.expr})", _B), torch.bool)
        if name in _UNARY_FN:
            if kwargs:
                raise _TraceError(f"flexc mod: {name} with {sorted(kwargs)}")
            n = self._node(args[0], name)
            kind = n.kind if name in ("abs", "__abs__", "absolute") else _F
            if name == "floor":
                kind = n.kind if n.kind != _B else _I
            return self._out(_Node(f"{_UNARY_FN[name]}({n.expr})", kind), self._dtype(kind))
        if name in ("clamp", "clip"):
            return self._clamp(name, args, kwargs)
        if name in ("minimum", "maximum", "min", "max", "fmin", "fmax"):
            if len(args) != 2 or kwargs or not isinstance(args[1], torch.Tensor):
                raise _TraceError(f"flexc mod: {name} of one tensor (a reduction); use torch.minimum / maximum of two")
            na, nb = self._node(args[0], name), self._node(args[1], name)
            fn = "min" if "min" in name else "max"
            kind = _promote(na.kind, nb.kind)
            return self._out(_Node(f"{fn}({na.expr}, {nb.expr})", kind), self._dtype(kind))
        if name == "where":
            if len(args) != 3:
                raise _TraceError("flexc mod: where(condition) with one argument (use where(c, a, b))")
            c, a, b = (self._node(x, name) for x in args)
            kind = _promote(a.kind, b.kind)
            return self._out(_Node(f"where({c.expr}, {a.expr}, {b.expr})", kind), self._dtype(kind))
        if name in _CASTS or name in ("to", "type"):
            return self._cast(name, args, kwargs)
        if name in ("tensor", "as_tensor", "scalar_tensor"):
            if len(args) != 1 or not isinstance(args[0], (int, float, bool)):
                raise _TraceError(f"flexc mod: torch.{name} of anything but a number")
            n = _const(args[0])
            dtype = kwargs.get("dtype")
            if dtype is not None:
                n = self._convert(n, _kind_of_dtype(dtype))
            return self._out(n, self._dtype(n.kind))
        if name in ("clone", "detach", "contiguous", "squeeze", "unsqueeze", "view_as", "reshape", "expand_as",
                    "broadcast_to"):
            n = self._node(args[0], name)
            return self._out(n, self._dtype(n.kind))
        raise _TraceError(f"flexc mod: the operation {name} is not in flexc's mod language (docs/attention.md)")

    @staticmethod
    def _dtype(kind):
        return {_F: torch.float32, _I: torch.int64, _B: torch.bool}[kind]

    def _convert(self, n, kind):
        if n.kind == kind:
            return n
        if kind == _F:
            return _Node(f"float({n.expr})", _F)
        if kind == _I:
            return _Node(f"int({n.expr})", _I)
        return _Node(f"({n.expr} != 0)", _B)

    def _cast(self, name, args, kwargs):
        n = self._node(args[0], name)
        if name in _CASTS:
            return self._out(self._convert(n, _CASTS[name]), self._dtype(_CASTS[name]))
        dtype = kwargs.get("dtype")
        for a in args[1:]:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, torch.Tensor):
                dtype = a.dtype
            elif isinstance(a, (str, torch.device)):
                continue
        if dtype is None:
            return self._out(n, self._dtype(n.kind))
        kind = _kind_of_dtype(dtype)
        return self._out(self._convert(n, kind), self._dtype(kind))

    def _binary(self, name, args, kwargs):
        alpha = kwargs.pop("alpha", 1)
        if kwargs:
            raise _TraceError(f"flexc mod: {name} with {sorted(kwargs)}")
        a, b = args[0], args[1]
        if name in _REVERSED:
            a, b = b, a
        na, nb = self._node(a, name), self._node(b, name)
        if alpha != 1:
            nb = _Node(f"({nb.expr} * {_const(alpha).expr})", _promote(nb.kind, _const(alpha).kind))
        op = _BINARY[name]
        if op in ("&&", "||"):
            if na.kind != _B or nb.kind != _B:
                raise _TraceError(f"flexc mod: {name} of non-bool values (bitwise operations on integers)")
            kind = _B
        elif op in ("<", "<=", ">", ">=", "==", "!="):
            kind = _B
        elif op == "/":
            kind = _F
        else:
            kind = _promote(na.kind, nb.kind)
            if kind == _B:  # True + True: torch gives an integer for + and * of bools
                kind = _I
        return self._out(_Node(f"({na.expr} {op} {nb.expr})", kind), self._dtype(kind))

    def _clamp(self, name, args, kwargs):
        n = self._node(args[0], name)
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        if lo is None and hi is None:
            raise _TraceError(f"flexc mod: {name} without bounds")
        kinds = [n.kind]
        expr = n.expr
        if lo is not None and hi is not None:
            nl, nh = self._node(lo, name), self._node(hi, name)
            kinds += [nl.kind, nh.kind]
            expr = f"clamp({expr}, {nl.expr}, {nh.expr})"
        elif lo is not None:
            nl = self._node(lo, name)
            kinds.append(nl.kind)
            expr = f"max({expr}, {nl.expr})"
        else:
            nh = self._node(hi, name)
            kinds.append(nh.kind)
            expr = f"min({expr}, {nh.expr})"
        kind = _promote(*kinds)
        return self._out(_Node(expr, kind), self._dtype(kind))

    def _index(self, t, idx):
        if not isinstance(t, torch.Tensor) or id(t) in self.nodes:
            raise _TraceError("flexc mod: indexing a traced value (only captured tensors can be indexed)")
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != t.ndim:
            raise _TraceError(f"flexc mod: a captured tensor of shape {tuple(t.shape)} indexed with {len(idx)} "
                            f"indices (give one per dimension)")
        parts = []
        for j, x in enumerate(idx):
            if isinstance(x, slice) or x is None or x is Ellipsis:
                raise _TraceError("flexc mod: slicing a captured tensor (index every dimension with a position)")
            n = self._node(x, "an index")
            if n.kind == _F:
                raise _TraceError(f"flexc mod: index {j} of a captured tensor is a float (use .long() or //)")
            parts.append(n.expr)
        i = self._capture(t)
        return self._out(_Node(f"t{i}[{', '.join(parts)}]", _kind_of_dtype(t.dtype)), t.dtype if
                         t.dtype in (torch.float32, torch.int64, torch.bool) else self._dtype(_kind_of_dtype(t.dtype)))


class Traced:
    """A traced mod: its expression, its kind ('score' or 'mask') and its captured tensors."""

    def __init__(self, expr, kind, captured):
        self.expr, self.kind, self.captured = expr, kind, captured

    def __repr__(self):
        return f"Traced({self.kind}: {self.expr}, captured {[tuple(t.shape) for t in self.captured]})"


def trace(fn, kind):
    """fn traced into a Traced; kind 'score' (fn(score, b, h, q_idx, kv_idx) -> float) or 'mask'
    (fn(b, h, q_idx, kv_idx) -> bool). Traced at every call (a hundred microseconds or so for a
    few operations): a function reads its captured tensors anew each time, as PyTorch's does,
    so a closure that now holds another tensor is never run with the old one."""
    ints = [torch.zeros((), dtype=torch.int64) for _ in range(4)]
    names = ["b", "h", "q_idx", "kv_idx"]
    args = list(zip(ints, names))
    if kind == "score":
        args.insert(0, (torch.zeros((), dtype=torch.float32), "score"))
    tracer = _Tracer(args)
    try:
        with torch.no_grad(), tracer:
            out = fn(*[t for t, _ in args])
        return _finish(kind, tracer, out)
    except _TraceError as e:
        raise TypeError(str(e)) from None


def _finish(kind, tracer, out):
    what = "score_mod" if kind == "score" else "mask_mod"
    if not isinstance(out, torch.Tensor):
        raise _TraceError(f"flexc mod: {what} returned {type(out).__name__}, not a tensor")
    node = tracer._node(out, f"{what}'s result")
    if kind == "score":
        if node.kind == _B:
            raise _TraceError("flexc mod: score_mod returned a bool value (a mask_mod?)")
        expr = node.expr if node.kind == _F else f"float({node.expr})"
    else:
        if node.kind != _B:
            raise _TraceError(f"flexc mod: mask_mod returned a {node.kind} value, not a bool")
        expr = node.expr
    return Traced(expr, kind, tracer.captured)
