"""The ctypes structures of python/flexc/_lib.py against the layouts the library was compiled
with (fx_abi_layout, src/core/abi.c): every ctypes.Structure defined there must name a struct
the library knows (_c_name_), have its size, and have its fields in the same order at the same
offsets with the same sizes; and every struct in the library's table must have a mirror.

Needs only the library and the package's _lib (no torch): under pytest it runs in the python
suite (CTest's python_torch), and `python3 tests/python/test_abi.py` runs it alone, with
FLEXC_LIBRARY naming a built libflexc.so."""
import ctypes
import os
import sys

if not os.environ.get("FLEXC_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from flexc import _lib  # noqa: E402

FX_OK, FX_EINVAL = 0, -1


def mirrored():
    """The ctypes.Structure subclasses defined in _lib (not imported into it)."""
    return [v for v in vars(_lib).values()
            if isinstance(v, type) and issubclass(v, ctypes.Structure) and v.__module__ == _lib.__name__]


def layout(struct, field=None):
    off, size = ctypes.c_size_t(), ctypes.c_size_t()
    rc = _lib.fx_abi_layout(struct.encode(), None if field is None else field.encode(), ctypes.byref(off),
                            ctypes.byref(size))
    return rc, off.value, size.value


def lib_fields(struct):
    names, i = [], 0
    while True:
        f = _lib.fx_abi_field(struct.encode(), i)
        if f is None:
            return names
        names.append(f.decode())
        i += 1


def lib_structs():
    names, i = [], 0
    while True:
        s = _lib.fx_abi_struct(i)
        if s is None:
            return names
        names.append(s.decode())
        i += 1


def check_structure(cls):
    """A list of the differences between cls and the library's struct (empty: they agree)."""
    name = getattr(cls, "_c_name_", None)
    if not name:
        return [f"{cls.__name__}: no _c_name_ naming the C struct it mirrors"]
    rc, _, size = layout(name)
    if rc != FX_OK:
        return [f"{cls.__name__}: the library does not know a struct {name} "
                f"({_lib.fx_last_error().decode(errors='replace')})"]
    bad = []
    if ctypes.sizeof(cls) != size:
        bad.append(f"{cls.__name__}: ctypes.sizeof {ctypes.sizeof(cls)} != sizeof({name}) {size}")
    py_fields = [f[0] for f in cls._fields_]
    c_fields = lib_fields(name)
    if py_fields != c_fields:
        bad.append(f"{cls.__name__}: fields {py_fields} != {name}'s {c_fields}")
    for f in py_fields:
        rc, off, fsize = layout(name, f)
        if rc != FX_OK:
            bad.append(f"{cls.__name__}.{f}: {name} has no such field")
            continue
        d = getattr(cls, f)
        if (d.offset, d.size) != (off, fsize):
            bad.append(f"{cls.__name__}.{f}: offset {d.offset}, size {d.size} != {name}.{f}'s offset {off}, "
                       f"size {fsize}")
    return bad


def test_every_structure_matches_the_library():
    classes = mirrored()
    assert len(classes) >= 9, f"expected the package's structures, found {[c.__name__ for c in classes]}"
    bad = [msg for cls in classes for msg in check_structure(cls)]
    assert not bad, "\n".join(bad)


def test_every_library_struct_is_mirrored():
    names = {getattr(c, "_c_name_", None) for c in mirrored()}
    missing = [s for s in lib_structs() if s not in names]
    assert not missing, f"the library's table has structs _lib.py does not mirror: {missing}"


def test_a_wrong_mirror_is_caught():
    class Wrong(ctypes.Structure):  # fx_lce with dtype as a 1-byte field and a field too many
        _c_name_ = "fx_lce"
        _fields_ = [(n, t) for n, t in _lib.Lce._fields_[:-1]] + [("dtype", ctypes.c_uint8), ("extra", ctypes.c_int)]

    class Unknown(ctypes.Structure):
        _c_name_ = "fx_no_such_struct"
        _fields_ = [("x", ctypes.c_int)]

    class Unnamed(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]

    msgs = check_structure(Wrong)
    assert any("fields" in m for m in msgs) and any("Wrong.dtype" in m for m in msgs) and \
        any("Wrong.extra" in m for m in msgs), msgs
    assert any("does not know" in m for m in check_structure(Unknown))
    assert check_structure(Unnamed)


def test_unknown_names_are_refused():
    assert layout("fx_no_such_struct")[0] == FX_EINVAL
    assert layout("fx_attention", "no_such_field")[0] == FX_EINVAL
    assert _lib.fx_abi_field(b"fx_no_such_struct", 0) is None
    assert _lib.fx_abi_field(b"fx_attention", 1000) is None


if __name__ == "__main__":
    tests = [v for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]
    failed = 0
    for t in tests:
        try:
            t()
            print(f"ok   {t.__name__}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {t.__name__}: {e}")
    sys.exit(1 if failed else 0)
