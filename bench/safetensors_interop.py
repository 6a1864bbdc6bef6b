#!/usr/bin/env python3
"""Round trips between flexc and the reference Python package `safetensors`.

    python3 bench/safetensors_interop.py build/safetensors_interop

1. flexc writes every dtype (plus a scalar, an empty tensor, a non-ASCII name and metadata);
   the package reads the file back and must see the same dtypes, shapes, bytes and metadata.
2. The package writes the same tensors (numpy's dtypes through safetensors.numpy, BF16 and F8
   through the raw serializer); flexc opens the files and checks them byte for byte.

Exit status 77 (skipped) when python3 lacks the `safetensors` or `numpy` package.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import safetensors
    import safetensors.numpy
except ImportError as e:
    print(f"skipped: {e} (pip install safetensors numpy)")
    sys.exit(77)

NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
         "F16": np.float16, "I32": np.int32, "U32": np.uint32, "F32": np.float32,
         "F64": np.float64, "I64": np.int64, "U64": np.uint64}
RAW_NAMES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def raw_serialize_file(specs, path):
    """The package's raw serializer: dicts of bytes in versions before 0.7, TensorSpec after."""
    keep = []
    if hasattr(safetensors, "TensorSpec"):
        import ctypes
        tensors = {}
        for t in specs:
            data = bytes.fromhex(t["hex"])
            buf = ctypes.create_string_buffer(data, max(len(data), 1))
            keep.append(buf)
            tensors[t["name"]] = safetensors.TensorSpec(
                dtype=RAW_NAMES[t["dtype"]], shape=t["shape"], data_ptr=ctypes.addressof(buf),
                data_len=len(data))
    else:
        tensors = {t["name"]: {"dtype": t["dtype"], "shape": t["shape"], "data": bytes.fromhex(t["hex"])}
                   for t in specs}
    safetensors.serialize_file(tensors, path)


def main():
    tool = sys.argv[1]
    spec = json.loads(subprocess.run([tool, "spec"], check=True, capture_output=True, text=True).stdout)
    tensors = spec["tensors"]
    fails = 0
    with tempfile.TemporaryDirectory() as d:
        # 1. flexc -> Python
        path = os.path.join(d, "flexc.safetensors")
        subprocess.run([tool, "write", path], check=True)
        with open(path, "rb") as fh:
            got = {name: info for name, info in safetensors.deserialize(fh.read())}
        for t in tensors:
            g = got.get(t["name"])
            if g is None or g["dtype"] != t["dtype"] or list(g["shape"]) != t["shape"] \
                    or bytes(g["data"]) != bytes.fromhex(t["hex"]):
                print(f"FAIL flexc->python: tensor {t['name']!r}: {g and (g['dtype'], g['shape'])}")
                fails += 1
        if len(got) != len(tensors):
            print(f"FAIL flexc->python: {len(got)} tensors, expected {len(tensors)}")
            fails += 1
        with safetensors.safe_open(path, framework="numpy") as f:
            if f.metadata() != spec["metadata"]:
                print(f"FAIL flexc->python: metadata {f.metadata()!r}")
                fails += 1
            for t in tensors:
                if t["dtype"] in NUMPY:
                    want = np.frombuffer(bytes.fromhex(t["hex"]), dtype=NUMPY[t["dtype"]]).reshape(t["shape"])
                    a = f.get_tensor(t["name"])
                    if a.dtype != want.dtype or a.shape != want.shape or a.tobytes() != want.tobytes():
                        print(f"FAIL flexc->python (numpy): tensor {t['name']!r}")
                        fails += 1

        # 2. Python -> flexc
        arrays = {t["name"]: np.frombuffer(bytes.fromhex(t["hex"]), dtype=NUMPY[t["dtype"]]).reshape(t["shape"])
                  for t in tensors if t["dtype"] in NUMPY}
        p1 = os.path.join(d, "numpy.safetensors")
        safetensors.numpy.save_file(arrays, p1, metadata=spec["metadata"])
        r = subprocess.run([tool, "check", p1, str(len(arrays))])
        fails += r.returncode != 0
        raw = [t for t in tensors if t["dtype"] not in NUMPY]
        p2 = os.path.join(d, "raw.safetensors")
        raw_serialize_file(raw, p2)
        r = subprocess.run([tool, "check", p2, str(len(raw))])
        fails += r.returncode != 0
    print(f"safetensors {safetensors.__version__}: {'OK' if not fails else f'{fails} failures'} "
          f"({len(tensors)} tensors each way)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
